// Column mean of hardswish(X) in two deterministic passes: 16 row-chunks x 32-column blocks write
// partial column sums (coalesced 128-byte row segments), then a tiny kernel sums the 16 partials and divides by M.
// kevin: scratch Part f32[16*N]
// kevin: launch hardswish_colsum_partial grid=(cdiv(N,32), 16) block=(32, 8) smem=0 args=(X, Part, M, N)
// kevin: launch hardswish_colmean_final grid=(cdiv(N,256)) block=(256) smem=0 args=(Part, Y, M, N)

#define NPART 16   // must equal gridDim.y of the first launch

__device__ __forceinline__ float hardswish(float x) {
    return x * fminf(fmaxf(x + 3.f, 0.f), 6.f) / 6.f;
}

__global__ void __launch_bounds__(256) hardswish_colsum_partial(const float* __restrict__ X, float* __restrict__ Part,
                                                                int M, int N) {
    __shared__ float sh[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int chunk = (M + NPART - 1) / NPART;
    const int r0 = blockIdx.y * chunk;
    const int r1 = min(M, r0 + chunk);
    float s = 0.f;
    if (col < N) {
#pragma unroll 4
        for (int r = r0 + threadIdx.y; r < r1; r += 8) s += hardswish(__ldg(X + (size_t)r * N + col));
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < N) {
        float t = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += sh[k][threadIdx.x];
        Part[(size_t)blockIdx.y * N + col] = t;
    }
}

__global__ void __launch_bounds__(256) hardswish_colmean_final(const float* __restrict__ Part, float* __restrict__ Y,
                                                               int M, int N) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N) return;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < NPART; ++p) s += Part[(size_t)p * N + c];
    Y[c] = s / (float)M;
}
