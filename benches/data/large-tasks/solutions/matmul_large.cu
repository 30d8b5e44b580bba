// matmul: shared-memory tiled SGEMM, 128x128x8 block tiles, 8x8 outputs per thread, fp32 FFMA.

#define BM 128
#define BN 128
#define BK 8
#define PADS 4
#define FLUSH 8  // k-tiles summed in a short partial before joining the long accumulator (64 k)

// C[z] = A[z] @ B[z] for z = blockIdx.z; A: MxK, B: KxN, C: MxN, row-major, fp32 FFMA (no TF32).
// 256 threads; thread (tx, ty) = (t % 16, t / 16) owns rows {ty*4+i, 64+ty*4+i} and columns
// {tx*4+j, 64+tx*4+j} (conflict-free float4 fragment reads). Double-buffered shared tiles with register
// prefetch, one __syncthreads per k-tile. Two-level accumulation (partials over 64 k, then added to the
// total) keeps fp32 rounding error ~8x below plain sequential FMA for K in the thousands.
__global__ void __launch_bounds__(256) sgemm_128x128(const float* __restrict__ A, const float* __restrict__ B,
                                                     float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[2][BK][BM + PADS];
    __shared__ __align__(16) float Bs[2][BK][BN + PADS];
    const int t = threadIdx.x, tx = t & 15, ty = t >> 4;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const long long z = blockIdx.z;
    A += z * (long long)M * K;
    B += z * (long long)K * N;
    C += z * (long long)M * N;
    const bool avec = (K & 3) == 0, bvec = (N & 3) == 0;

    // this thread's global-load coordinates
    const int a_r = t >> 1, a_c = (t & 1) * 4;    // A tile: 128 rows x 8 k
    const int b_r = t >> 5, b_c = (t & 31) * 4;   // B tile: 8 k x 128 cols
    float4 ra, rb;

    auto load_a = [&](int k0) {
        const int r = m0 + a_r, c = k0 + a_c;
        if (avec && r < M && c + 3 < K) {
            ra = __ldg(reinterpret_cast<const float4*>(A + (long long)r * K + c));
        } else {
            const float* p = A + (long long)r * K;
            ra.x = (r < M && c + 0 < K) ? __ldg(p + c + 0) : 0.0f;
            ra.y = (r < M && c + 1 < K) ? __ldg(p + c + 1) : 0.0f;
            ra.z = (r < M && c + 2 < K) ? __ldg(p + c + 2) : 0.0f;
            ra.w = (r < M && c + 3 < K) ? __ldg(p + c + 3) : 0.0f;
        }
    };
    auto load_b = [&](int k0) {
        const int r = k0 + b_r, c = n0 + b_c;
        if (bvec && r < K && c + 3 < N) {
            rb = __ldg(reinterpret_cast<const float4*>(B + (long long)r * N + c));
        } else {
            const float* p = B + (long long)r * N;
            rb.x = (r < K && c + 0 < N) ? __ldg(p + c + 0) : 0.0f;
            rb.y = (r < K && c + 1 < N) ? __ldg(p + c + 1) : 0.0f;
            rb.z = (r < K && c + 2 < N) ? __ldg(p + c + 2) : 0.0f;
            rb.w = (r < K && c + 3 < N) ? __ldg(p + c + 3) : 0.0f;
        }
    };
    auto store = [&](int buf) {
        As[buf][a_c + 0][a_r] = ra.x;
        As[buf][a_c + 1][a_r] = ra.y;
        As[buf][a_c + 2][a_r] = ra.z;
        As[buf][a_c + 3][a_r] = ra.w;
        *reinterpret_cast<float4*>(&Bs[buf][b_r][b_c]) = rb;
    };

    float acc[8][8], part[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) { acc[i][j] = 0.0f; part[i][j] = 0.0f; }

    const int ktiles = (K + BK - 1) / BK;
    load_a(0);
    load_b(0);
    store(0);
    __syncthreads();
    int cur = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
        const bool more = kt + 1 < ktiles;
        if (more) { load_a((kt + 1) * BK); load_b((kt + 1) * BK); }
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[8], b[8];
            float4 a0 = *reinterpret_cast<const float4*>(&As[cur][k][ty * 4]);
            float4 a1 = *reinterpret_cast<const float4*>(&As[cur][k][64 + ty * 4]);
            float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][k][tx * 4]);
            float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][k][64 + tx * 4]);
            a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
            a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
            b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
            b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) part[i][j] = fmaf(a[i], b[j], part[i][j]);
        }
        if ((kt % FLUSH) == FLUSH - 1 || !more) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) { acc[i][j] += part[i][j]; part[i][j] = 0.0f; }
        }
        if (more) store(cur ^ 1);
        __syncthreads();
        cur ^= 1;
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (r >= M) continue;
        float* crow = C + (long long)r * N;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = n0 + h * 64 + tx * 4;
            if (bvec && c + 3 < N) {
                *reinterpret_cast<float4*>(crow + c) =
                    make_float4(acc[i][h * 4 + 0], acc[i][h * 4 + 1], acc[i][h * 4 + 2], acc[i][h * 4 + 3]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (c + j < N) crow[c + j] = acc[i][h * 4 + j];
            }
        }
    }
}
// kevin: launch sgemm_128x128 grid=(cdiv(N,128), cdiv(M,128), 1) block=(256) smem=0 args=(A, B, C, M, N, K)
