// Row scan, one block per row: tiles of 4*blockDim elements (float4 per thread when N % 4 == 0),
// thread-local scan + warp-shuffle scan + shared per-warp totals, carried across tiles; writes the exclusive sum directly.
// kevin: launch exclusive_cumsum grid=(M) block=(256) smem=0 args=(X, Y, N)

__global__ void __launch_bounds__(256) exclusive_cumsum(const float* __restrict__ X, float* __restrict__ Y, int N) {
    __shared__ float wsum[32];
    const size_t ro = (size_t)blockIdx.x * N;
    const bool vec = (N & 3) == 0;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    float carry = 0.f;
    for (int base = 0; base < N; base += blockDim.x * 4) {     // uniform trip count: barriers are safe
        const int i = base + threadIdx.x * 4;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        if (i < N) {
            if (vec) {
                const float4 t = __ldg(reinterpret_cast<const float4*>(X + ro + i));
                v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) if (i + e < N) v[e] = __ldg(X + ro + i + e);
            }
        }
        const float t0 = v[0], t1 = t0 + v[1], t2 = t1 + v[2], t3 = t2 + v[3];   // local inclusive
        float incl = t3;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += n;
        }
        float excl = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane == 0) excl = 0.f;
        if (lane == 31) wsum[w] = incl;
        __syncthreads();
        float wpre = 0.f, tot = 0.f;
        for (int k = 0; k < nw; ++k) {
            const float x = wsum[k];
            if (k < w) wpre += x;
            tot += x;
        }
        const float pre = carry + (wpre + excl);
        if (i < N) {
            const float o[4] = {pre, pre + t0, pre + t1, pre + t2};
            if (vec) {
                *reinterpret_cast<float4*>(Y + ro + i) = make_float4(o[0], o[1], o[2], o[3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) if (i + e < N) Y[ro + i + e] = o[e];
            }
        }
        carry += tot;
        __syncthreads();     // wsum is rewritten by the next tile
    }
}
