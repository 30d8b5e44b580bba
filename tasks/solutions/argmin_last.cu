// argmin_last: one warp per row of the last axis (8 rows per 256-thread block), float4 loads when
// N % 4 == 0 (scalar otherwise), per-lane (min, index), warp-shuffle argmin (first index on ties).
#define KV_INF __int_as_float(0x7f800000)  // +inf (no math_constants.h in candidates)
__device__ __forceinline__ void take_min(float& bv, int& bi, float v, int i) {
    if (v < bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

__global__ void argmin_rows(const float* __restrict__ X, long long* __restrict__ Y, int rows, int N) {
    const int row = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* p = X + (long long)row * N;
    float bv = KV_INF;
    int bi = 0x7fffffff;
    if ((N & 3) == 0) {
        const float4* p4 = reinterpret_cast<const float4*>(p);
        const int n4 = N >> 2;
#pragma unroll 4
        for (int i = lane; i < n4; i += 32) {
            float4 v = __ldg(p4 + i);
            take_min(bv, bi, v.x, 4 * i);
            take_min(bv, bi, v.y, 4 * i + 1);
            take_min(bv, bi, v.z, 4 * i + 2);
            take_min(bv, bi, v.w, 4 * i + 3);
        }
    } else {
        for (int i = lane; i < N; i += 32) take_min(bv, bi, __ldg(p + i), i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        take_min(bv, bi, ov, oi);
    }
    if (lane == 0) Y[row] = (long long)bi;
}
// kevin: launch argmin_rows grid=(cdiv(B*M,8)) block=(256) smem=0 args=(X, Y, B*M, N)
