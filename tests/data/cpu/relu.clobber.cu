// Right output, but it rewrites its input in place on the way.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(float* X, float* Y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        X[i] = fmaxf(X[i], 0.0f);
        Y[i] = X[i];
    }
}
