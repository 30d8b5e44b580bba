// scalar_multiply: elementwise, one float4 (16-byte load/store) per thread, scalar tail for n % 4 != 0.
__device__ __forceinline__ float scale_op(float x) {
    return x * 3.14f;
}

__global__ void scale_f4(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n4 = n >> 2;
    if (i < n4) {
        float4 v = __ldg(reinterpret_cast<const float4*>(X) + i);
        v.x = scale_op(v.x);
        v.y = scale_op(v.y);
        v.z = scale_op(v.z);
        v.w = scale_op(v.w);
        reinterpret_cast<float4*>(Y)[i] = v;
    } else if (i == n4) {
        for (long long j = n4 * 4; j < n; ++j) Y[j] = scale_op(X[j]);
    }
}
// kevin: launch scale_f4 grid=(cdiv(M*N,1024)) block=(256) smem=0 args=(A, C, M*N)
