// kernels: conv1d
// y[b, o, t] = sum_{c,k} w[o, c, k] * x[b, c, t + k - K/2] (same padding), input tile in smem.
#define TILE_T 128
#define MAX_K 15
extern "C" __global__ void conv1d(const float* __restrict__ x, const float* __restrict__ w,
                                  float* __restrict__ y, int C, int O, int L, int K) {
    __shared__ float xs[TILE_T + MAX_K - 1];
    int b = blockIdx.z, o = blockIdx.y, t0 = blockIdx.x * TILE_T;
    int half = K / 2;
    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float* xc = x + ((long long)b * C + c) * L;
        for (int i = threadIdx.x; i < TILE_T + K - 1; i += blockDim.x) {
            int t = t0 + i - half;
            xs[i] = (t >= 0 && t < L) ? xc[t] : 0.0f;
        }
        __syncthreads();
        const float* wk = w + ((long long)o * C + c) * K;
        for (int k = 0; k < K; ++k) acc += wk[k] * xs[threadIdx.x + k];
        __syncthreads();
    }
    int t = t0 + threadIdx.x;
    if (t < L) y[((long long)b * O + o) * L + t] = acc;
}
