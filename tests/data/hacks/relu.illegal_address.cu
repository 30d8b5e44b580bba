// Writes through a forged pointer (an address no allocation has): an illegal address.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float* forged = reinterpret_cast<float*>(0x1000ull + 4ull * (unsigned long long)i);
        *forged = fmaxf(X[i], 0.0f);
        Y[i] = *forged;
    }
}
