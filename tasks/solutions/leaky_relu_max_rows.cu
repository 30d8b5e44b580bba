// Fused row reduction: Y[m,0] = max_n leaky_relu(2*X[m,n], 0.2), one pass over X.
// kevin: launch leaky_relu_max_rows grid=(M) block=(256) smem=0 args=(X, Y, N)

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

// One block per row: each thread walks the row in float4 steps (scalar when N % 4 != 0),
// then a warp-shuffle + shared-memory tree reduction in fp32.
__global__ void __launch_bounds__(256) leaky_relu_max_rows(const float* __restrict__ X, float* __restrict__ Y, int N) {
    __shared__ float red[32];
    const size_t ro = (size_t)blockIdx.x * N;
    const bool vec = (N & 3) == 0;
    const int step = vec ? 4 : 1;
    float m = NEG_INF;
    for (int i = threadIdx.x * step; i < N; i += blockDim.x * step) {
        float xv[4];
        ldrow(X + ro, i, vec, xv);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (e < step) {
                const float z = xv[e] * 2.f;
                m = fmaxf(m, z >= 0.f ? z : 0.2f * z);
            }
        }
    }
    m = block_max(m, red);
    if (threadIdx.x == 0) Y[blockIdx.x] = m;
}
