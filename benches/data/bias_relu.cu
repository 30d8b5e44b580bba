// kernels: bias_relu
// Y = relu(X + b), X is [M, N] row-major, b is [N]; grid-stride loop.
__global__ void bias_relu(const float* __restrict__ x, const float* __restrict__ b,
                          float* __restrict__ y, int m, int n) {
    long long total = (long long)m * n;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = x[i] + b[i % n];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
