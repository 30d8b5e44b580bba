// A host function (neither __device__ nor __global__) next to the kernel: g++ compiles it as
// ordinary code and NVRTC as device code, so the format (device code only) rejects it.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
static int host_helper(int x) { return x + 1; }
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
