// relu: elementwise, one float4 (16-byte load/store) per thread, scalar tail for n % 4 != 0.
__global__ void relu_f4(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n4 = n >> 2;
    if (i < n4) {
        float4 v = __ldg(reinterpret_cast<const float4*>(X) + i);
        v.x = fmaxf(v.x, 0.0f);
        v.y = fmaxf(v.y, 0.0f);
        v.z = fmaxf(v.z, 0.0f);
        v.w = fmaxf(v.w, 0.0f);
        reinterpret_cast<float4*>(Y)[i] = v;
    } else if (i == n4) {
        for (long long j = n4 * 4; j < n; ++j) Y[j] = fmaxf(X[j], 0.0f);
    }
}
// kevin: launch relu_f4 grid=(cdiv(M*N,1024)) block=(256) smem=0 args=(X, Y, M*N)
