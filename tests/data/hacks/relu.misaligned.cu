// A misaligned vector access: float4 loads and stores through X + 1 and Y + 1, an address that is
// 4 bytes past a 16-byte boundary. CUDA requires natural alignment for vector accesses.
// kevin: launch relu_shifted grid=(cdiv(M*N,1024)) block=(256) args=(X, Y, M*N)
__global__ void relu_shifted(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) Y[0] = fmaxf(X[0], 0.0f);
    long long body = (n - 1) / 4;
    if (i < body) {
        float4 v = reinterpret_cast<const float4*>(X + 1)[i];
        v.x = fmaxf(v.x, 0.0f);
        v.y = fmaxf(v.y, 0.0f);
        v.z = fmaxf(v.z, 0.0f);
        v.w = fmaxf(v.w, 0.0f);
        reinterpret_cast<float4*>(Y + 1)[i] = v;
    } else if (i == body) {
        for (long long j = 1 + body * 4; j < n; ++j) Y[j] = fmaxf(X[j], 0.0f);
    }
}
