// Never finishes: a spin on a flag nobody clears.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    // Spins on a volatile read of the output, which the harness fills with NaN: a side effect
    // the compiler must keep (a spin on a local variable may be deleted as a loop without one).
    volatile float* flag = Y;
    while (flag[0] != 12345.0f) { }
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
