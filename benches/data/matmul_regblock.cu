// kernels: matmul_regblock
// 64x64 block tile, 16x16 threads, each computing a 4x4 register tile; BK = 8.
constexpr int BM = 64, BN = 64, BK = 8, TM = 4, TN = 4;

extern "C" __global__ void __launch_bounds__(256)
matmul_regblock(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                int M, int N, int K) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[TM][TN] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
            int r = i / BK, c = i % BK;
            As[c][r] = (row0 + r < M && k0 + c < K) ? A[(row0 + r) * K + k0 + c] : 0.0f;
        }
        for (int i = threadIdx.x; i < BK * BN; i += blockDim.x) {
            int r = i / BN, c = i % BN;
            Bs[r][c] = (k0 + r < K && col0 + c < N) ? B[(k0 + r) * N + col0 + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < TN; ++j) {
            int r = row0 + ty * TM + i, c = col0 + tx * TN + j;
            if (r < M && c < N) C[r * N + c] = acc[i][j];
        }
}
