// A compile bomb: a template recursing 40 levels deep, each level forcing two inlined copies of
// the next, so fully inlined code would hold 2^40 copies of the leaf.
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)
template <int D> __device__ __forceinline__ float grow(float x) {
    return grow<D - 1>(x * 1.0001f) + grow<D - 1>(x + 1.0f);
}
template <> __device__ __forceinline__ float grow<0>(float x) { return x; }

__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f) + 0.0f * grow<40>(X[i]);
}
