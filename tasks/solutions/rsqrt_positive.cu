// rsqrt_positive: elementwise, one float4 (16-byte load/store) per thread, scalar tail for n % 4 != 0.
__device__ __forceinline__ float rsqrt_op(float x) {
    return rsqrtf(x);
}

__global__ void rsqrt_f4(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n4 = n >> 2;
    if (i < n4) {
        float4 v = __ldg(reinterpret_cast<const float4*>(X) + i);
        v.x = rsqrt_op(v.x);
        v.y = rsqrt_op(v.y);
        v.z = rsqrt_op(v.z);
        v.w = rsqrt_op(v.w);
        reinterpret_cast<float4*>(Y)[i] = v;
    } else if (i == n4) {
        for (long long j = n4 * 4; j < n; ++j) Y[j] = rsqrt_op(X[j]);
    }
}
// kevin: launch rsqrt_f4 grid=(cdiv(M*N,1024)) block=(256) smem=0 args=(X, Y, M*N)
