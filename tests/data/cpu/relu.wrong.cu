// Leaky where it should be exact: negative inputs come out as 0.01 x instead of 0.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = X[i] > 0.0f ? X[i] : 0.01f * X[i];
}
