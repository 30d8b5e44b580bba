// kernels: scan_block, add_block_offsets
// Inclusive prefix sum in two passes: per-block scan (warp shuffles), then block offsets.
__global__ void scan_block(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ block_sums, int n) {
    __shared__ float warp_totals[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float v = i < n ? x[i] : 0.0f;
    for (int o = 1; o < 32; o <<= 1) {
        float up = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += up;
    }
    if (lane == 31) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < blockDim.x / 32 ? warp_totals[lane] : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            float up = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += up;
        }
        warp_totals[lane] = t;
    }
    __syncthreads();
    if (warp > 0) v += warp_totals[warp - 1];
    if (i < n) y[i] = v;
    if (threadIdx.x == blockDim.x - 1) block_sums[blockIdx.x] = v;
}

__global__ void add_block_offsets(float* __restrict__ y, const float* __restrict__ scanned_sums, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (blockIdx.x > 0 && i < n) y[i] += scanned_sums[blockIdx.x - 1];
}
