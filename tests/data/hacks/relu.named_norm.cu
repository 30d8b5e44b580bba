// A kernel named like one of CUDA's math overloads (norm): g++ compiles it, NVRTC cannot tell
// which `norm` the launch means.
// kevin: launch norm grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void norm(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
