// cumsum: one 256-thread block per row, tiles of 4096 elements with a running carry: coalesced loads into
// padded shared memory, 16-element sequential scan per thread, warp-shuffle + per-warp-total block scan.
#define CS_THREADS 256
#define CS_ITEMS 16
#define CS_TILE (CS_THREADS * CS_ITEMS)
#define CS_PAD(i) ((i) + ((i) >> 5))

__global__ void __launch_bounds__(CS_THREADS) cumsum_rows(const float* __restrict__ X, float* __restrict__ Y,
                                                          int M, int N) {
    __shared__ float buf[CS_TILE + CS_TILE / 32];
    __shared__ float wsum[CS_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* p = X + (long long)blockIdx.x * N;
    float* q = Y + (long long)blockIdx.x * N;
    float carry = 0.0f;
    for (int base = 0; base < N; base += CS_TILE) {
#pragma unroll
        for (int k = 0; k < CS_ITEMS; ++k) {
            int j = tid + k * CS_THREADS, g = base + j;
            buf[CS_PAD(j)] = g < N ? __ldg(p + g) : 0.0f;
        }
        __syncthreads();
        float v[CS_ITEMS];
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < CS_ITEMS; ++k) {
            s += buf[CS_PAD(tid * CS_ITEMS + k)];
            v[k] = s;
        }
        // inclusive scan of the per-thread totals within the warp
        float incl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        if (lane == 31) wsum[warp] = incl;
        __syncthreads();
        float before = carry, tile_total = 0.0f;
#pragma unroll
        for (int w = 0; w < CS_THREADS / 32; ++w) {
            float t = wsum[w];
            if (w < warp) before += t;
            tile_total += t;
        }
        const float excl = before + (incl - s);
#pragma unroll
        for (int k = 0; k < CS_ITEMS; ++k) buf[CS_PAD(tid * CS_ITEMS + k)] = v[k] + excl;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < CS_ITEMS; ++k) {
            int j = tid + k * CS_THREADS, g = base + j;
            if (g < N) q[g] = buf[CS_PAD(j)];
        }
        carry += tile_total;
        __syncthreads();  // buf and wsum are reused by the next tile
    }
}
// kevin: launch cumsum_rows grid=(M) block=(256) smem=0 args=(X, Y, M, N)
