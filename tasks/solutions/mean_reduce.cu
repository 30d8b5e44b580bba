// mean_reduce: one warp per row of the last axis (8 rows per 256-thread block), float4 loads when
// N % 4 == 0 (scalar otherwise), fp32 per-lane sums, warp-shuffle tree, divide by N.
__global__ void mean_rows(const float* __restrict__ X, float* __restrict__ Y, int rows, int N) {
    const int row = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* p = X + (long long)row * N;
    float acc = 0.0f;
    if ((N & 3) == 0) {
        const float4* p4 = reinterpret_cast<const float4*>(p);
        const int n4 = N >> 2;
#pragma unroll 4
        for (int i = lane; i < n4; i += 32) {
            float4 v = __ldg(p4 + i);
            acc += (v.x + v.y) + (v.z + v.w);
        }
    } else {
        for (int i = lane; i < N; i += 32) acc += __ldg(p + i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) Y[row] = acc / (float)N;
}
// kevin: launch mean_rows grid=(cdiv(B*M,8)) block=(256) smem=0 args=(X, Y, B*M, N)
