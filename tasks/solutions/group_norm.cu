// group_norm: 8 groups over [N, C, H, W]; a group is C/8 channels x H*W contiguous elements.
// Pass 1 splits every group into S = 32 chunks; a 256-thread block computes its chunk's count,
// mean and M2 (per-thread Welford, merged with Chan's formula through warp shuffles and shared
// memory) into scratch. Pass 2: each block merges its group's 32 partials (exact: no
// E[x^2] - mean^2 cancellation), then writes (x - mean) * rstd * g[c] + b[c] over its chunk.

#define G 8
#define S 32
#define THREADS 256

struct Stat { float n, mean, m2; };

__device__ __forceinline__ Stat merge(Stat a, Stat b) {
    float n = a.n + b.n;
    if (n == 0.0f) return a;
    float d = b.mean - a.mean, f = b.n / n;
    Stat r;
    r.n = n;
    r.mean = a.mean + d * f;
    r.m2 = a.m2 + b.m2 + d * d * a.n * f;
    return r;
}

__device__ __forceinline__ Stat shfl(Stat s, int o) {
    Stat r;
    r.n = __shfl_xor_sync(0xffffffffu, s.n, o);
    r.mean = __shfl_xor_sync(0xffffffffu, s.mean, o);
    r.m2 = __shfl_xor_sync(0xffffffffu, s.m2, o);
    return r;
}

// Block-wide merge; thread 0 gets the result.
__device__ Stat block_merge(Stat s) {
    __shared__ Stat part[THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = merge(s, shfl(s, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < THREADS / 32 ? part[lane] : Stat{0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s = merge(s, shfl(s, o));
    }
    return s;
}

__global__ void __launch_bounds__(THREADS)
group_stats(const float* __restrict__ X, float* __restrict__ Part, long long group_len) {
    const long long chunk = (group_len + S - 1) / S;
    const long long lo = blockIdx.x * chunk, hi = min(group_len, lo + chunk);
    const float* xg = X + (long long)blockIdx.y * group_len;
    Stat s = {0.0f, 0.0f, 0.0f};
    for (long long i = lo + threadIdx.x; i < hi; i += THREADS) {
        float v = __ldg(xg + i);
        s.n += 1.0f;
        float d = v - s.mean;
        s.mean += d / s.n;
        s.m2 += d * (v - s.mean);
    }
    s = block_merge(s);
    if (threadIdx.x == 0) {
        float* p = Part + ((long long)blockIdx.y * S + blockIdx.x) * 3;
        p[0] = s.n;
        p[1] = s.mean;
        p[2] = s.m2;
    }
}

__global__ void __launch_bounds__(THREADS)
group_apply(const float* __restrict__ X, const float* __restrict__ Part, const float* __restrict__ g,
            const float* __restrict__ b, float* __restrict__ Y, int C, long long hw) {
    __shared__ float mean_rstd[2];
    const long long group_len = (long long)(C / G) * hw;
    if (threadIdx.x < 32) {
        const float* p = Part + (long long)blockIdx.y * S * 3;
        Stat s = threadIdx.x < S ? Stat{p[threadIdx.x * 3], p[threadIdx.x * 3 + 1], p[threadIdx.x * 3 + 2]}
                                 : Stat{0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s = merge(s, shfl(s, o));
        if (threadIdx.x == 0) {
            mean_rstd[0] = s.mean;
            mean_rstd[1] = rsqrtf(s.m2 / s.n + 1e-5f);
        }
    }
    __syncthreads();
    const float mean = mean_rstd[0], rstd = mean_rstd[1];
    const long long chunk = (group_len + S - 1) / S;
    const long long lo = blockIdx.x * chunk, hi = min(group_len, lo + chunk);
    const long long base = (long long)blockIdx.y * group_len;
    const int c0 = (blockIdx.y % G) * (C / G);
    for (long long i = lo + threadIdx.x; i < hi; i += THREADS) {
        const int c = c0 + (int)(i / hw);
        Y[base + i] = fmaf((__ldg(X + base + i) - mean) * rstd, __ldg(g + c), __ldg(b + c));
    }
}
// kevin: scratch Part f32[N*8*32*3]
// kevin: launch group_stats grid=(32, N*8) block=(256) smem=0 args=(X, Part, (C/8)*H*W)
// kevin: launch group_apply grid=(32, N*8) block=(256) smem=0 args=(X, Part, g, b, Y, C, H*W)
