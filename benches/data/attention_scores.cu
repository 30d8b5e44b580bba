// kernels: attention_scores
// S = (Q @ K^T) * scale for one head, Q [L, D], K [L, D], 16x16 tiles, causal mask to -inf.
#define TS 16
extern "C" __global__ void attention_scores(const float* __restrict__ q, const float* __restrict__ k,
                                            float* __restrict__ s, int L, int D, float scale) {
    __shared__ float qs[TS][TS], ks[TS][TS + 1];
    int row = blockIdx.y * TS + threadIdx.y, col = blockIdx.x * TS + threadIdx.x;
    float acc = 0.0f;
    for (int d0 = 0; d0 < D; d0 += TS) {
        qs[threadIdx.y][threadIdx.x] = (row < L && d0 + threadIdx.x < D) ? q[row * D + d0 + threadIdx.x] : 0.0f;
        int krow = blockIdx.x * TS + threadIdx.y;
        ks[threadIdx.y][threadIdx.x] = (krow < L && d0 + threadIdx.x < D) ? k[krow * D + d0 + threadIdx.x] : 0.0f;
        __syncthreads();
        for (int d = 0; d < TS; ++d) acc += qs[threadIdx.y][d] * ks[threadIdx.x][d];
        __syncthreads();
    }
    if (row < L && col < L) s[row * L + col] = col > row ? __int_as_float(0xff800000) : acc * scale;
}
