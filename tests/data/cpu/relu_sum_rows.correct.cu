// The same reduction with its barriers.
// kevin: launch rowsum grid=(M) block=(128) args=(X, b, Y, M, N)
__global__ void rowsum(const float* __restrict__ X, const float* __restrict__ b, float* __restrict__ Y, int m, int n) {
    __shared__ float part[128];
    int row = blockIdx.x;
    float acc = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) acc += fmaxf(X[row * n + j] - b[j], 0.0f);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = 64; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) Y[row] = part[0];
}
