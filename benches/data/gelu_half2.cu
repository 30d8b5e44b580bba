// kernels: gelu_half2
// GELU (tanh approximation) on fp16, two elements per thread with half2.
#include <cuda_fp16.h>

__device__ __forceinline__ float gelu(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

extern "C" __global__ void gelu_half2(const __half2* __restrict__ x, __half2* __restrict__ y, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) {
        float2 v = __half22float2(x[i]);
        y[i] = __floats2half2_rn(gelu(v.x), gelu(v.y));
    }
}
