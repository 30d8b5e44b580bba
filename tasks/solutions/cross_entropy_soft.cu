// Fused row reduction, one pass: online (max, sum exp) of X plus sum(T*X) and sum(T);
// L = (max + log(sum exp)) * sum(T) - sum(T*X)  ( = -sum(log_softmax(X) * T) ).
// kevin: launch cross_entropy_soft grid=(M) block=(256) smem=0 args=(X, T, L, N)

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

// ---- online log-sum-exp state (m = running max, s = sum of exp(x - m)); empty: (-inf, 0)
__device__ __forceinline__ void lse_push(float& m, float& s, float x) {
    if (x > m) { s = s * expf(m - x) + 1.f; m = x; }
    else       { s += expf(x - m); }
}
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    if (mn == NEG_INF) return;
    s = (m == NEG_INF ? 0.f : s * expf(m - mn)) + (m2 == NEG_INF ? 0.f : s2 * expf(m2 - mn));
    m = mn;
}
// Every thread gets the block's (m, s). red: __shared__ float[64].
__device__ __forceinline__ void block_lse(float& m, float& s, float* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    __syncthreads();
    if (lane == 0) { red[w] = m; red[32 + w] = s; }
    __syncthreads();
    m = lane < nw ? red[lane] : NEG_INF;
    s = lane < nw ? red[32 + lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
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

// One block per row: each thread walks the row in float4 steps (scalar when N % 4 != 0),
// then a warp-shuffle + shared-memory tree reduction in fp32.
__global__ void __launch_bounds__(256) cross_entropy_soft(const float* __restrict__ X, const float* __restrict__ T,
                                                          float* __restrict__ L, int N) {
    __shared__ float red[64];
    const size_t ro = (size_t)blockIdx.x * N;
    const bool vec = (N & 3) == 0;
    const int step = vec ? 4 : 1;
    float m = NEG_INF, s = 0.f, tx = 0.f, ts = 0.f;
    for (int i = threadIdx.x * step; i < N; i += blockDim.x * step) {
        float xv[4], tv[4];
        ldrow(X + ro, i, vec, xv); ldrow(T + ro, i, vec, tv);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (e < step) lse_push(m, s, xv[e]);
            tx = fmaf(tv[e], xv[e], tx);   // scalar path: padding is 0
            ts += tv[e];
        }
    }
    block_lse(m, s, red);
    tx = block_sum(tx, red);
    ts = block_sum(ts, red);
    if (threadIdx.x == 0) L[blockIdx.x] = (m + logf(s)) * ts - tx;
}
