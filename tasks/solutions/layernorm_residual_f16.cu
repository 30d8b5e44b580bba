// Fused row kernel in fp32 arithmetic on fp16 data: X + R, then LayerNorm (eps 1e-5, two-pass from an fp32 shared-memory row cache), rounded to fp16 once at the store.
#include <cuda_fp16.h>
// kevin: launch layernorm_residual_f16 grid=(M) block=(256) smem=N*4 args=(X, R, g, b, Y, N)

#define NEG_INF __int_as_float(0xff800000)
// ---- block reductions (blockDim.x a multiple of 32, at most 1024)
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Every thread gets the block total. red: __shared__ float[32].
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();                 // red may still be read from a previous call
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : NEG_INF;
    return warp_max(v);
}

// Row access in steps of 4 (one float4, vec = N % 4 == 0) or 1 (scalar; v[1..3] = 0).
__device__ __forceinline__ void ldrow(const float* __restrict__ p, int i, bool vec, float v[4]) {
    if (vec) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(p + i));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
        v[0] = __ldg(p + i); v[1] = v[2] = v[3] = 0.f;
    }
}
__device__ __forceinline__ void ldsrow(const float* p, int i, bool vec, float v[4]) {
    if (vec) {
        const float4 t = *reinterpret_cast<const float4*>(p + i);
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
        v[0] = p[i]; v[1] = v[2] = v[3] = 0.f;
    }
}
__device__ __forceinline__ void strow(float* p, int i, bool vec, const float v[4]) {
    if (vec) *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    else p[i] = v[0];
}

// Half-precision row access in steps of 4 (8 bytes: two __half2, vec = N % 4 == 0) or 1.
__device__ __forceinline__ void ldrow_h(const __half* __restrict__ p, int i, bool vec, float v[4]) {
    if (vec) {
        const uint2 u = __ldg(reinterpret_cast<const uint2*>(p + i));
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        v[0] = a.x; v[1] = a.y; v[2] = c.x; v[3] = c.y;
    } else {
        v[0] = __half2float(p[i]); v[1] = v[2] = v[3] = 0.f;
    }
}
__device__ __forceinline__ void strow_h(__half* p, int i, bool vec, const float v[4]) {
    if (vec) {
        const __half2 a = __floats2half2_rn(v[0], v[1]);
        const __half2 c = __floats2half2_rn(v[2], v[3]);
        uint2 u;
        u.x = *reinterpret_cast<const unsigned*>(&a);
        u.y = *reinterpret_cast<const unsigned*>(&c);
        *reinterpret_cast<uint2*>(p + i) = u;
    } else {
        p[i] = __float2half_rn(v[0]);
    }
}

// One block per row; the pre-norm row is cached in dynamic shared memory (N floats; each thread
// re-reads only the elements it wrote), two-pass mean / variance from it.
__global__ void __launch_bounds__(256) layernorm_residual_f16(const __half* __restrict__ X, const __half* __restrict__ R, const __half* __restrict__ g, const __half* __restrict__ b, __half* __restrict__ Y, int N) {
    extern __shared__ float4 srow4[];
    float* srow = reinterpret_cast<float*>(srow4);
    __shared__ float red[32];
    const size_t ro = (size_t)blockIdx.x * N;
    const bool vec = (N & 3) == 0;
    const int step = vec ? 4 : 1;
    float s = 0.f;
    for (int i = threadIdx.x * step; i < N; i += blockDim.x * step) {
        float xv[4], rv[4];
        ldrow_h(X + ro, i, vec, xv); ldrow_h(R + ro, i, vec, rv);
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float v = xv[e] + rv[e];
            pv[e] = v;
            if (e < step) { s += v; }
        }
        strow(srow, i, vec, pv);
    }
    const float mean = block_sum(s, red) / (float)N;
    float ss = 0.f;
    for (int i = threadIdx.x * step; i < N; i += blockDim.x * step) {
        float v[4];
        ldsrow(srow, i, vec, v);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (e < step) { const float d = v[e] - mean; ss = fmaf(d, d, ss); }
    }
    const float rstd = 1.f / sqrtf(block_sum(ss, red) / (float)N + 1e-5f);
    for (int i = threadIdx.x * step; i < N; i += blockDim.x * step) {
        float gv[4], bv[4];
        ldrow_h(g, i, vec, gv); ldrow_h(b, i, vec, bv);
        float pv[4], o[4];
        ldsrow(srow, i, vec, pv);
#pragma unroll
        for (int e = 0; e < 4; ++e) { const float v = (pv[e] - mean) * rstd; o[e] = v * gv[e] + bv[e]; }
        strow_h(Y + ro, i, vec, o);
    }
}
