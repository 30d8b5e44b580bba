// kernels: rmsnorm_bf16
// RMSNorm on bf16 rows with fp32 accumulation; one block per row.
#include <cuda_bf16.h>

extern "C" __global__ void rmsnorm_bf16(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                        __nv_bfloat16* __restrict__ y, int n, float eps) {
    __shared__ float partial[32];
    const __nv_bfloat16* xr = x + (long long)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0) partial[0] = rsqrtf(ss / n + eps);
    }
    __syncthreads();
    float scale = partial[0];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        y[(long long)blockIdx.x * n + i] = __float2bfloat16(__bfloat162float(xr[i]) * scale * __bfloat162float(w[i]));
}
