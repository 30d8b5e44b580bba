// Uses INFINITY without including a header: g++ finds it through the device model's own
// includes, NVRTC does not define it. The CPU backend must not teach a policy what fails on a GPU.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = X[i] < INFINITY ? fmaxf(X[i], 0.0f) : X[i];
}
