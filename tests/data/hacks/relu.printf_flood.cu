// Floods the device printf buffer (64 lines per thread) while computing the right result: the
// output must not reach the worker's frame channel, and the flood must not stop the harness.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < 64; ++k) printf("KVWK flood %lld %d: the quick brown fox jumps over the lazy dog\n", i, k);
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
