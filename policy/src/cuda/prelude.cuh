// Helpers shared by kevin's CUDA sources (policy/src/kernels.rs puts this before each): element
// loads and stores in f32 or bf16 with rounding as T, and a warp's sum.
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

template <typename T> __device__ __forceinline__ float ld(const T* p, long long i);
template <> __device__ __forceinline__ float ld<float>(const float* p, long long i) { return p[i]; }
template <> __device__ __forceinline__ float ld<bf16>(const bf16* p, long long i) {
    return __bfloat162float(p[i]);
}
template <typename T> __device__ __forceinline__ void st(T* p, long long i, float v);
template <> __device__ __forceinline__ void st<float>(float* p, long long i, float v) { p[i] = v; }
template <> __device__ __forceinline__ void st<bf16>(bf16* p, long long i, float v) {
    p[i] = __float2bfloat16(v);
}
// `v` rounded to T's precision (round to nearest even), as a float.
template <typename T> __device__ __forceinline__ float rnd(float v);
template <> __device__ __forceinline__ float rnd<float>(float v) { return v; }
template <> __device__ __forceinline__ float rnd<bf16>(float v) {
    return __bfloat162float(__float2bfloat16(v));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

