// Computes the right answer, and writes past the end of its own scratch buffer: on the GPU the
// bytes would land in another allocation of the pool (the harness's, or a task tensor) unnoticed.
// kevin: scratch T f32[256]
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, T, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, float* T, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
    if (i < 256) T[i] = 1.0f;
    else if (i < 320) T[i] = 2.0f;  // 64 floats past the end of T
}
