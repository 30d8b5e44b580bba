// A tree reduction written for 256 threads but launched with 128: its first step adds
// part[128..255], which no thread ever writes (uninitialised shared memory).
// kevin: launch rowsum grid=(M) block=(128) args=(X, b, Y, N)
__global__ void rowsum(const float* __restrict__ X, const float* __restrict__ b, float* __restrict__ Y, int n) {
    __shared__ float part[256];
    const int t = threadIdx.x;
    const long long row = blockIdx.x;
    float acc = 0.0f;
    for (int j = t; j < n; j += blockDim.x) acc += fmaxf(X[row * n + j] - b[j], 0.0f);
    part[t] = acc;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        __syncthreads();
    }
    if (t == 0) Y[row] = part[0];
}
