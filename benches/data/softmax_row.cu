// kernels: softmax_row
// Row-wise softmax of X[M,N]: one block per row, max and sum by block reduction.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float buf[32];
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) / 32;
    v = lane < warps ? buf[lane] : (is_max ? __int_as_float(0xff800000) : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    return v;
}

extern "C" __global__ void softmax_row(const float* __restrict__ x, float* __restrict__ y, int n) {
    const float* row = x + (long long)blockIdx.x * n;
    float* out = y + (long long)blockIdx.x * n;
    float m = __int_as_float(0xff800000);
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += expf(row[i] - m);
    s = block_reduce(s, false);
    float inv = 1.0f / s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = expf(row[i] - m) * inv;
}
