// gelu: elementwise, one float4 (16-byte load/store) per thread, scalar tail for n % 4 != 0.
__device__ __forceinline__ float gelu_op(float x) {
    // exact GELU: 0.5 x (1 + erf(x / sqrt(2)))
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

__global__ void gelu_f4(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n4 = n >> 2;
    if (i < n4) {
        float4 v = __ldg(reinterpret_cast<const float4*>(X) + i);
        v.x = gelu_op(v.x);
        v.y = gelu_op(v.y);
        v.z = gelu_op(v.z);
        v.w = gelu_op(v.w);
        reinterpret_cast<float4*>(Y)[i] = v;
    } else if (i == n4) {
        for (long long j = n4 * 4; j < n; ++j) Y[j] = gelu_op(X[j]);
    }
}
// kevin: launch gelu_f4 grid=(cdiv(M*N,1024)) block=(256) smem=0 args=(X, Y, M*N)
