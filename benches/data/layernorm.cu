// kernels: layernorm
// LayerNorm over the last dimension with Welford statistics; one warp per row.
struct Welford { float mean, m2, count; };

__device__ Welford merge(Welford a, Welford b) {
    float count = a.count + b.count;
    if (count == 0.0f) return a;
    float delta = b.mean - a.mean;
    float mean = a.mean + delta * b.count / count;
    float m2 = a.m2 + b.m2 + delta * delta * a.count * b.count / count;
    return {mean, m2, count};
}

extern "C" __global__ void layernorm(const float* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, float* __restrict__ y,
                                     int rows, int n, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* xr = x + (long long)row * n;
    Welford w = {0.0f, 0.0f, 0.0f};
    for (int i = lane; i < n; i += 32) w = merge(w, Welford{xr[i], 0.0f, 1.0f});
    for (int o = 16; o > 0; o >>= 1) {
        Welford other = {__shfl_xor_sync(0xffffffffu, w.mean, o), __shfl_xor_sync(0xffffffffu, w.m2, o),
                         __shfl_xor_sync(0xffffffffu, w.count, o)};
        w = merge(w, other);
    }
    float rstd = rsqrtf(w.m2 / n + eps);
    for (int i = lane; i < n; i += 32) y[(long long)row * n + i] = (xr[i] - w.mean) * rstd * gamma[i] + beta[i];
}
