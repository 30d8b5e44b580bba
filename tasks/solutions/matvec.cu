// matvec: one warp per row of A (8 rows per 256-thread block), float4 loads of A and x when K % 4 == 0
// (scalar otherwise), x stays in L1/L2, fp32 per-lane FMA accumulation, warp-shuffle tree.
__global__ void matvec_rows(const float* __restrict__ A, const float* __restrict__ x,
                            float* __restrict__ y, int M, int K) {
    const int row = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= M) return;
    const float* a = A + (long long)row * K;
    float acc0 = 0.0f, acc1 = 0.0f;
    if ((K & 3) == 0) {
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const int k4 = K >> 2;
        int i = lane;
        for (; i + 32 < k4; i += 64) {
            float4 u = __ldg(a4 + i), v = __ldg(x4 + i);
            float4 u2 = __ldg(a4 + i + 32), v2 = __ldg(x4 + i + 32);
            acc0 = fmaf(u.x, v.x, acc0); acc0 = fmaf(u.y, v.y, acc0);
            acc0 = fmaf(u.z, v.z, acc0); acc0 = fmaf(u.w, v.w, acc0);
            acc1 = fmaf(u2.x, v2.x, acc1); acc1 = fmaf(u2.y, v2.y, acc1);
            acc1 = fmaf(u2.z, v2.z, acc1); acc1 = fmaf(u2.w, v2.w, acc1);
        }
        for (; i < k4; i += 32) {
            float4 u = __ldg(a4 + i), v = __ldg(x4 + i);
            acc0 = fmaf(u.x, v.x, acc0); acc0 = fmaf(u.y, v.y, acc0);
            acc0 = fmaf(u.z, v.z, acc0); acc0 = fmaf(u.w, v.w, acc0);
        }
    } else {
        for (int i = lane; i < K; i += 32) acc0 = fmaf(__ldg(a + i), __ldg(x + i), acc0);
    }
    float acc = acc0 + acc1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = acc;
}
// kevin: launch matvec_rows grid=(cdiv(M,8)) block=(256) smem=0 args=(A, x, y, M, K)
