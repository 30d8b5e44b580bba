// A grid of 2^31 - 1 blocks of 1024 threads (2.2e12 threads, each spinning 256 iterations): legal
// launch dimensions, but minutes of device time per launch.
// kevin: launch relu grid=(2147483647) block=(1024) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (int k = 0; k < 256; ++k) acc = acc * 0.5f + (float)k;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f) + 0.0f * acc;
}
