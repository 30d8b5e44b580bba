// Floods device printf (4 lines per thread: 2.7e8 lines at the GPU preset, far beyond the 1 MiB
// printf FIFO) while computing the right result. The text starts with the frame magic "KVWK": it
// must never reach the worker's frame channel, and the flood must not stop the harness.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < 4; ++k) printf("KVWK flood %lld %d: the quick brown fox jumps over the lazy dog\n", i, k);
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
