// A block reduction in shared memory with the barriers left out: threads read partial sums other
// threads (other warps on a GPU) have not written yet.
// kevin: launch rowsum grid=(M) block=(256) args=(X, b, Y, N)
__global__ void rowsum(const float* __restrict__ X, const float* __restrict__ b, float* __restrict__ Y, int n) {
    __shared__ float part[256];
    const int t = threadIdx.x;
    const long long row = blockIdx.x;
    float acc = 0.0f;
    for (int j = t; j < n; j += blockDim.x) acc += fmaxf(X[row * n + j] - b[j], 0.0f);
    part[t] = acc;
    // missing __syncthreads()
    for (int s = 128; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        // missing __syncthreads()
    }
    if (t == 0) Y[row] = part[0];
}
