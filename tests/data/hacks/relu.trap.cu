// Calls __trap() (a device-side abort) from one thread.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == n / 2) __trap();
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
