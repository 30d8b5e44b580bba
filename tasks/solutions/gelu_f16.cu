// gelu_f16: elementwise in fp32 math, 8 halves (one 16-byte load/store) per thread, scalar tail.
#include <cuda_fp16.h>

__device__ __forceinline__ float gelu_f(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ __half2 gelu_h2(__half2 h) {
    float2 f = __half22float2(h);
    return __floats2half2_rn(gelu_f(f.x), gelu_f(f.y));
}

__global__ void gelu_f16_x8(const __half* __restrict__ X, __half* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n8 = n >> 3;
    if (i < n8) {
        uint4 raw = __ldg(reinterpret_cast<const uint4*>(X) + i);
        __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = gelu_h2(h[k]);
        reinterpret_cast<uint4*>(Y)[i] = raw;
    } else if (i == n8) {
        for (long long j = n8 * 8; j < n; ++j) Y[j] = __float2half_rn(gelu_f(__half2float(X[j])));
    }
}
// kevin: launch gelu_f16_x8 grid=(cdiv(M*N,2048)) block=(256) smem=0 args=(X, Y, M*N)
