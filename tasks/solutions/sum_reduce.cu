// sum_reduce: column reduction over axis 1 of [B,M,N]; block (32,16): 32 adjacent columns (coalesced
// 128-byte rows per warp) x 16 row-slices, per-thread fp64 sums (free: memory-bound; keeps the error far
// below atol for sums near 0), then a shared-memory tree over slices, rounded to fp32 once.
__global__ void sum_axis1(const float* __restrict__ X, float* __restrict__ Y, int B, int M, int N) {
    __shared__ double part[16][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int n = blockIdx.x * 32 + tx;
    const int b = blockIdx.y;
    double acc = 0.0;
    if (n < N) {
        const float* p = X + (long long)b * M * N + n;
        int m = ty;
#pragma unroll 4
        for (; m < M; m += 16) acc += (double)__ldg(p + (long long)m * N);
    }
    part[ty][tx] = acc;
    __syncthreads();
#pragma unroll
    for (int s = 8; s > 0; s >>= 1) {
        if (ty < s) part[ty][tx] += part[ty + s][tx];
        __syncthreads();
    }
    if (ty == 0 && n < N) Y[(long long)b * N + n] = (float)part[0][tx];
}
// kevin: launch sum_axis1 grid=(cdiv(N,32), B) block=(32,16) smem=0 args=(X, Y, B, M, N)
