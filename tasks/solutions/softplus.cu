// softplus: elementwise, one float4 (16-byte load/store) per thread, scalar tail for n % 4 != 0.
__device__ __forceinline__ float softplus_op(float x) {
    // stable: max(x, 0) + log1p(exp(-|x|))
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

__global__ void softplus_f4(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n4 = n >> 2;
    if (i < n4) {
        float4 v = __ldg(reinterpret_cast<const float4*>(X) + i);
        v.x = softplus_op(v.x);
        v.y = softplus_op(v.y);
        v.z = softplus_op(v.z);
        v.w = softplus_op(v.w);
        reinterpret_cast<float4*>(Y)[i] = v;
    } else if (i == n4) {
        for (long long j = n4 * 4; j < n; ++j) Y[j] = softplus_op(X[j]);
    }
}
// kevin: launch softplus_f4 grid=(cdiv(M*N,1024)) block=(256) smem=0 args=(X, Y, M*N)
