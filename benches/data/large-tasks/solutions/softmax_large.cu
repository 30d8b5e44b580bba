// softmax: one 1024-thread block per row; pass 1 online (max, sum exp) per thread (float4 loads when
// N % 4 == 0), warp-shuffle + shared-memory merge; pass 2 re-reads the row (L2-resident) and writes exp(x - max) / sum.
#define KV_INF __int_as_float(0x7f800000)  // +inf (no math_constants.h in candidates)

// Online (max, sum of exp) state; combine is exact up to rounding and handles empty (-inf) states.
struct MS { float m, s; };

__device__ __forceinline__ void ms_add(MS& a, float x) {
    if (x > a.m) { a.s = a.s * expf(a.m - x) + 1.0f; a.m = x; }
    else { a.s += expf(x - a.m); }
}

__device__ __forceinline__ MS ms_merge(MS a, MS b) {
    if (a.m == -KV_INF) return b;
    if (b.m == -KV_INF) return a;
    float m = fmaxf(a.m, b.m);
    MS r; r.m = m; r.s = a.s * expf(a.m - m) + b.s * expf(b.m - m);
    return r;
}

// Block-wide merge; every thread gets the result. blockDim.x is a multiple of 32, <= 1024.
__device__ MS block_ms(MS v) {
    __shared__ float sm[32], ss[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MS t; t.m = __shfl_xor_sync(0xffffffffu, v.m, o); t.s = __shfl_xor_sync(0xffffffffu, v.s, o);
        v = ms_merge(v, t);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) { sm[warp] = v.m; ss[warp] = v.s; }
    __syncthreads();
    MS r; r.m = -KV_INF; r.s = 0.0f;
    if (lane < nw) { r.m = sm[lane]; r.s = ss[lane]; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        MS t; t.m = __shfl_xor_sync(0xffffffffu, r.m, o); t.s = __shfl_xor_sync(0xffffffffu, r.s, o);
        r = ms_merge(r, t);
    }
    return r;
}

// Pass over one row: online max/sum, float4 loads when N % 4 == 0.
__device__ MS row_ms(const float* __restrict__ p, int N) {
    MS a; a.m = -KV_INF; a.s = 0.0f;
    if ((N & 3) == 0) {
        const float4* p4 = reinterpret_cast<const float4*>(p);
        for (int i = threadIdx.x; i < (N >> 2); i += blockDim.x) {
            float4 v = __ldg(p4 + i);
            float mx = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
            if (mx > a.m) { a.s *= expf(a.m - mx); a.m = mx; }
            a.s += (expf(v.x - a.m) + expf(v.y - a.m)) + (expf(v.z - a.m) + expf(v.w - a.m));
        }
    } else {
        for (int i = threadIdx.x; i < N; i += blockDim.x) ms_add(a, __ldg(p + i));
    }
    return block_ms(a);
}

__global__ void softmax_rows(const float* __restrict__ X, float* __restrict__ Y, int M, int N) {
    const long long off = (long long)blockIdx.x * N;
    const float* p = X + off;
    float* q = Y + off;
    MS r = row_ms(p, N);
    const float mx = r.m, inv = 1.0f / r.s;
    if ((N & 3) == 0) {
        const float4* p4 = reinterpret_cast<const float4*>(p);
        float4* q4 = reinterpret_cast<float4*>(q);
        for (int i = threadIdx.x; i < (N >> 2); i += blockDim.x) {
            float4 v = __ldg(p4 + i);
            float4 o;
            o.x = expf(v.x - mx) * inv;
            o.y = expf(v.y - mx) * inv;
            o.z = expf(v.z - mx) * inv;
            o.w = expf(v.w - mx) * inv;
            q4[i] = o;
        }
    } else {
        for (int i = threadIdx.x; i < N; i += blockDim.x) {
            float v = __ldg(p + i);
            q[i] = expf(v - mx) * inv;
        }
    }
}
// kevin: launch softmax_rows grid=(M) block=(1024) smem=0 args=(X, Y, M, N)
