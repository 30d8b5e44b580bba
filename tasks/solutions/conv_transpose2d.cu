// conv_transpose2d: 4x4 kernel, stride 2, padding 1, so output (oy, ox) gathers the inputs at
// iy = (oy + 1 - ky) / 2 for the two ky of oy + 1's parity (and likewise in x): 4 of the 16 taps.
// A 16x16 block computes a 16x16 output tile for 8 output channels; for each input channel it
// stages the tile's 10x10 input window (zero outside the image) and the 8 x 16 weights
// Wt[c, k, :, :] in shared memory.

#define TILE 16
#define KB 8
#define IN_T (TILE / 2 + 2)

__global__ void __launch_bounds__(TILE * TILE)
conv_transpose2d_s2(const float* __restrict__ X, const float* __restrict__ Wt,
                    const float* __restrict__ b, float* __restrict__ Y, int N, int C, int K, int H,
                    int W) {
    __shared__ float xs[IN_T][IN_T];
    __shared__ float ws[KB][16];
    const int Ho = 2 * H, Wo = 2 * W;
    const int kgroups = (K + KB - 1) / KB;
    const int n = blockIdx.z / kgroups, k0 = (blockIdx.z % kgroups) * KB;
    const int ox = blockIdx.x * TILE + threadIdx.x, oy = blockIdx.y * TILE + threadIdx.y;
    const int ix0 = blockIdx.x * (TILE / 2) - 1, iy0 = blockIdx.y * (TILE / 2) - 1;
    const int tid = threadIdx.y * TILE + threadIdx.x;
    // Taps: ky in {ky_a, ky_a + 2} with ky_a = (oy + 1) & 1, input row (oy + 1 - ky) / 2.
    const int kya = (oy + 1) & 1, kxa = (ox + 1) & 1;
    const int ra = (oy + 1 - kya) / 2 - iy0, qa = (ox + 1 - kxa) / 2 - ix0;  // ky + 2: row ra - 1
    float acc[KB];
#pragma unroll
    for (int j = 0; j < KB; ++j) acc[j] = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float* xc = X + ((long long)n * C + c) * H * W;
        for (int i = tid; i < IN_T * IN_T; i += TILE * TILE) {
            int r = i / IN_T, q = i % IN_T, iy = iy0 + r, ix = ix0 + q;
            xs[r][q] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? __ldg(xc + (long long)iy * W + ix) : 0.0f;
        }
        if (tid < KB * 16) {
            int j = tid / 16, t = tid % 16;
            ws[j][t] = k0 + j < K ? __ldg(Wt + ((long long)c * K + k0 + j) * 16 + t) : 0.0f;
        }
        __syncthreads();
        float x00 = xs[ra][qa], x01 = xs[ra][qa - 1], x10 = xs[ra - 1][qa], x11 = xs[ra - 1][qa - 1];
#pragma unroll
        for (int j = 0; j < KB; ++j) {
            const float* w = ws[j];
            float s = x00 * w[kya * 4 + kxa];
            s = fmaf(x01, w[kya * 4 + kxa + 2], s);
            s = fmaf(x10, w[(kya + 2) * 4 + kxa], s);
            s = fmaf(x11, w[(kya + 2) * 4 + kxa + 2], s);
            acc[j] += s;
        }
        __syncthreads();
    }
    if (ox < Wo && oy < Ho) {
#pragma unroll
        for (int j = 0; j < KB; ++j)
            if (k0 + j < K)
                Y[(((long long)n * K + k0 + j) * Ho + oy) * Wo + ox] = acc[j] + __ldg(b + k0 + j);
    }
}
// kevin: launch conv_transpose2d_s2 grid=(cdiv(2*W,16), cdiv(2*H,16), N*cdiv(K,8)) block=(16,16) smem=0 args=(X, Wt, b, Y, N, C, K, H, W)
