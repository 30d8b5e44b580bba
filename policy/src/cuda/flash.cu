// Causal attention for the learner (policy/src/flash.rs): the forward pass and its gradients
// without the [t, t] score matrix, FlashAttention-2's recurrence on CUDA cores in f32.
//   q [b, h, t, D], k and v [b, kv, t, D] (any strides but the last, given per tensor),
//   query head i reads key/value head i / (h / kv); scores scaled by `scale`; query i sees
//   keys 0..=i.
//   fwd   o [b, h, t, D] (packed) and lse [b, h, t] (f32, the log-sum-exp of the scaled scores)
//   dq    dq [b, h, t, D] and dd [b, h, t] = rowsum(do * o) (f32), from o, do (packed) and lse
//   dkdv  dk, dv [b, kv, t, D], summed over the query heads of each key/value head; after dq
// Each comes in f32 and bf16 (`_f32`, `_bf16`; bf16 loads and stores, f32 arithmetic) for
// D = 16, 32, 64 and 128. Blocks of FA_WARPS warps, FA_R rows per warp (64 rows a block), tiles
// of 32 rows in shared memory (rows padded to D + 4 floats: float4 reads without bank
// conflicts); in a tile each lane takes one key (or query) for the dot products, reading its
// row once for all of its warp's FA_R rows, and one dimension per 32 for the accumulations.
// (policy/src/cuda/prelude.cuh comes first: ld, st, rnd, warp_sum.)

#define FA_WARPS 8
#define FA_R 8
#define FA_ROWS (FA_WARPS * FA_R)
#define FA_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// out[r] = dot(own[0..D], rows[r][0..D]) for the FA_R rows of `rows` (shared memory, row
// pitch P, 16-byte aligned): `own` is the lane's row, read once; `rows` are read as broadcasts.
template <int D>
__device__ __forceinline__ void dots(const float* own, const float* rows, float* out) {
    constexpr int P = D + 4;
#pragma unroll
    for (int r = 0; r < FA_R; r++) out[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < D; c += 4) {
        float4 x = *reinterpret_cast<const float4*>(own + c);
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            float4 y = *reinterpret_cast<const float4*>(rows + r * P + c);
            out[r] += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
        }
    }
}

// acc[r][e] += sum over the tile's 32 rows jj of w[r] (as lane jj holds it) * tile[jj][lane + 32 e]
// (shared memory, row pitch D + 4): the probabilities (or score gradients) of a warp's FA_R
// rows against the tile's 32 rows, times the tile.
template <int D>
__device__ __forceinline__ void accumulate(float (&acc)[FA_R][(D + 31) / 32], const float* w,
                                           const float* tile) {
    constexpr int P = D + 4, E = (D + 31) / 32;
    int lane = threadIdx.x & 31;
#pragma unroll 4
    for (int jj = 0; jj < 32; jj++) {
        float x[E];
#pragma unroll
        for (int e = 0; e < E; e++) {
            int c = lane + 32 * e;
            x[e] = c < D ? tile[jj * P + c] : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            float wj = __shfl_sync(0xffffffffu, w[r], jj);
#pragma unroll
            for (int e = 0; e < E; e++) acc[r][e] += wj * x[e];
        }
    }
}

// dst[(row0 + first + r) * D + ..] = acc[r][..] * mul[r] for a warp's FA_R rows below t.
template <typename T, int D>
__device__ __forceinline__ void store_rows(T* dst, long long row0, int first, int t,
                                           const float (&acc)[FA_R][(D + 31) / 32],
                                           const float* mul) {
    constexpr int E = (D + 31) / 32;
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        if (first + r >= t) continue;
        long long row = row0 + first + r;
#pragma unroll
        for (int e = 0; e < E; e++) {
            int c = lane + 32 * e;
            if (c < D) st(dst, row * D + c, acc[r][e] * mul[r]);
        }
    }
}

// `rows` rows of a [.., t, D] head (row stride `rs`) from row `r0` into shared memory
// ([rows][D + 4], times `mul`), zeros past row t.
template <typename T, int D>
__device__ __forceinline__ void load_rows(float* dst, const T* src, long long rs, int r0, int rows,
                                          int t, float mul) {
    constexpr int P = D + 4;
    for (int x = threadIdx.x; x < rows * D; x += blockDim.x) {
        int r = x / D, c = x % D, i = r0 + r;
        dst[r * P + c] = i < t ? ld(src, (long long)i * rs + c) * mul : 0.0f;
    }
}

// The 32 keys and values from row k0 into sk and sv, between barriers (the whole block calls
// it).
template <typename T, int D>
__device__ __forceinline__ void kv_tile(float* sk, float* sv, const T* K, const T* V, long long kt,
                                        long long vt, int k0, int t) {
    __syncthreads();
    load_rows<T, D>(sk, K, kt, k0, 32, t, 1.0f);
    load_rows<T, D>(sv, V, vt, k0, 32, t, 1.0f);
    __syncthreads();
}

// grid (ceil(t / FA_ROWS), b * h), block 32 * FA_WARPS.
template <typename T, int D>
__device__ void fa_fwd(const T* q, const T* k, const T* v, T* o, float* lse, int h, int kv, int t,
                       long long qb, long long qh, long long qt, long long kb, long long kh,
                       long long kt_, long long vb, long long vh, long long vt, float scale) {
    constexpr int P = D + 4, E = (D + 31) / 32;
    extern __shared__ __align__(16) float sm[];
    float* sk = sm;               // [32][P]
    float* sv = sk + 32 * P;      // [32][P]
    float* sq = sv + 32 * P;      // [FA_ROWS][P], scaled
    int bh = blockIdx.y, bi = bh / h, hi = bh % h, hk = hi / (h / kv);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int q0 = blockIdx.x * FA_ROWS;
    const T* Q = q + bi * qb + hi * qh;
    const T* K = k + bi * kb + hk * kh;
    const T* V = v + bi * vb + hk * vh;
    load_rows<T, D>(sq, Q, qt, q0, FA_ROWS, t, scale);

    float m[FA_R], l[FA_R], acc[FA_R][E];
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        m[r] = FA_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) acc[r][e] = 0.0f;
    }
    int kend = min(q0 + FA_ROWS, t);
    for (int k0 = 0; k0 < kend; k0 += 32) {
        kv_tile<T, D>(sk, sv, K, V, kt_, vt, k0, t);
        // A warp whose rows all come before the tile (or past t) has nothing in it.
        if (k0 > min(q0 + warp * FA_R + FA_R - 1, t - 1)) continue;
        int j = k0 + lane;
        float p[FA_R], sc[FA_R];
        dots<D>(sk + lane * P, sq + warp * FA_R * P, sc);
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            int i = q0 + warp * FA_R + r;
            float s = j <= i && i < t ? sc[r] : FA_NEG_INF;
            float mn = fmaxf(m[r], warp_max(s));
            // A row past t (or a tile wholly after its query) adds nothing.
            p[r] = mn == FA_NEG_INF ? 0.0f : __expf(s - mn);
            float corr = m[r] == FA_NEG_INF ? 0.0f : __expf(m[r] - mn);
            l[r] = l[r] * corr + warp_sum(p[r]);
#pragma unroll
            for (int e = 0; e < E; e++) acc[r][e] *= corr;
            m[r] = mn;
        }
        accumulate<D>(acc, p, sv);
    }
    float inv[FA_R];
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        int i = q0 + warp * FA_R + r;
        inv[r] = 1.0f / l[r];
        if (i < t && lane == 0) lse[(long long)bh * t + i] = m[r] + logf(l[r]);
    }
    store_rows<T, D>(o, (long long)bh * t, q0 + warp * FA_R, t, acc, inv);
}

// grid (ceil(t / FA_ROWS), b * h), block 32 * FA_WARPS. o, dout packed [b, h, t, D].
template <typename T, int D>
__device__ void fa_dq(const T* q, const T* k, const T* v, const T* o, const T* dout,
                      const float* lse, float* dd, T* dq, int h, int kv, int t, long long qb,
                      long long qh, long long qt, long long kb, long long kh, long long kt_,
                      long long vb, long long vh, long long vt, float scale) {
    constexpr int P = D + 4, E = (D + 31) / 32;
    extern __shared__ __align__(16) float sm[];
    float* sk = sm;                 // [32][P]
    float* sv = sk + 32 * P;        // [32][P]
    float* sq = sv + 32 * P;        // [FA_ROWS][P], scaled
    float* sdo = sq + FA_ROWS * P;  // [FA_ROWS][P]
    int bh = blockIdx.y, bi = bh / h, hi = bh % h, hk = hi / (h / kv);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int q0 = blockIdx.x * FA_ROWS;
    const T* K = k + bi * kb + hk * kh;
    const T* V = v + bi * vb + hk * vh;
    long long head = (long long)bh * t;
    load_rows<T, D>(sq, q + bi * qb + hi * qh, qt, q0, FA_ROWS, t, scale);
    load_rows<T, D>(sdo, dout + head * D, D, q0, FA_ROWS, t, 1.0f);

    float L[FA_R], Dr[FA_R], g[FA_R][E];
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
        int i = q0 + warp * FA_R + r;
        float s = 0.0f;
        if (i < t) {
            for (int c = lane; c < D; c += 32)
                s += ld(o, (head + i) * D + c) * ld(dout, (head + i) * D + c);
        }
        Dr[r] = warp_sum(s);
        L[r] = i < t ? lse[head + i] : 0.0f;
        if (i < t && lane == 0) dd[head + i] = Dr[r];
#pragma unroll
        for (int e = 0; e < E; e++) g[r][e] = 0.0f;
    }
    int kend = min(q0 + FA_ROWS, t);
    for (int k0 = 0; k0 < kend; k0 += 32) {
        kv_tile<T, D>(sk, sv, K, V, kt_, vt, k0, t);
        if (k0 > min(q0 + warp * FA_R + FA_R - 1, t - 1)) continue;
        int j = k0 + lane;
        float ds[FA_R], sc[FA_R], dp[FA_R];
        dots<D>(sk + lane * P, sq + warp * FA_R * P, sc);
        dots<D>(sv + lane * P, sdo + warp * FA_R * P, dp);
#pragma unroll
        for (int r = 0; r < FA_R; r++) {
            int i = q0 + warp * FA_R + r;
            float p = j <= i && i < t ? __expf(sc[r] - L[r]) : 0.0f;
            ds[r] = p * (dp[r] - Dr[r]);
        }
        accumulate<D>(g, ds, sk);
    }
    float sc[FA_R];
#pragma unroll
    for (int r = 0; r < FA_R; r++) sc[r] = scale;
    store_rows<T, D>(dq, head, q0 + warp * FA_R, t, g, sc);
}

// grid (ceil(t / FA_ROWS), b * kv), block 32 * FA_WARPS: FA_ROWS keys of one key/value head,
// over the queries of its h / kv query heads from the block's first key on. dout packed; lse,
// dd as fa_fwd and fa_dq wrote them.
template <typename T, int D>
__device__ void fa_dkdv(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                        const float* dd, T* dk, T* dv, int h, int kv, int t, long long qb,
                        long long qh, long long qt, long long kb, long long kh, long long kt_,
                        long long vb, long long vh, long long vt, float scale) {
    constexpr int P = D + 4, E = (D + 31) / 32;
    extern __shared__ __align__(16) float sm[];
    float* sq = sm;                 // [32][P], scaled
    float* sdo = sq + 32 * P;       // [32][P]
    float* sk = sdo + 32 * P;       // [FA_ROWS][P]
    float* sv = sk + FA_ROWS * P;   // [FA_ROWS][P]
    float* sl = sv + FA_ROWS * P;   // [32] lse
    float* sd = sl + 32;            // [32] dd
    int bk = blockIdx.y, bi = bk / kv, hk = bk % kv, grp = h / kv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int k0 = blockIdx.x * FA_ROWS;
    load_rows<T, D>(sk, k + bi * kb + hk * kh, kt_, k0, FA_ROWS, t, 1.0f);
    load_rows<T, D>(sv, v + bi * vb + hk * vh, vt, k0, FA_ROWS, t, 1.0f);

    float gk[FA_R][E], gv[FA_R][E];
#pragma unroll
    for (int r = 0; r < FA_R; r++) {
#pragma unroll
        for (int e = 0; e < E; e++) {
            gk[r][e] = 0.0f;
            gv[r][e] = 0.0f;
        }
    }
    for (int hq = hk * grp; hq < (hk + 1) * grp; hq++) {
        long long head = ((long long)bi * h + hq) * t;
        const T* Q = q + bi * qb + hq * qh;
        for (int i0 = k0; i0 < t; i0 += 32) {
            __syncthreads();
            load_rows<T, D>(sq, Q, qt, i0, 32, t, scale);
            load_rows<T, D>(sdo, dout + head * D, D, i0, 32, t, 1.0f);
            if (threadIdx.x < 32) {
                int i = i0 + threadIdx.x;
                sl[threadIdx.x] = i < t ? lse[head + i] : 0.0f;
                sd[threadIdx.x] = i < t ? dd[head + i] : 0.0f;
            }
            __syncthreads();
            // A warp whose keys all come after the tile's queries (or past t) has nothing in it.
            if (k0 + warp * FA_R > min(i0 + 31, t - 1)) continue;
            int i = i0 + lane;
            float p[FA_R], ds[FA_R], sc[FA_R], dp[FA_R];
            dots<D>(sq + lane * P, sk + warp * FA_R * P, sc);
            dots<D>(sdo + lane * P, sv + warp * FA_R * P, dp);
#pragma unroll
            for (int r = 0; r < FA_R; r++) {
                int j = k0 + warp * FA_R + r;
                p[r] = j <= i && i < t ? __expf(sc[r] - sl[lane]) : 0.0f;
                ds[r] = p[r] * (dp[r] - sd[lane]);
            }
            accumulate<D>(gk, ds, sq);
            accumulate<D>(gv, p, sdo);
        }
    }
    float one[FA_R];
#pragma unroll
    for (int r = 0; r < FA_R; r++) one[r] = 1.0f;
    store_rows<T, D>(dk, (long long)bk * t, k0 + warp * FA_R, t, gk, one);
    store_rows<T, D>(dv, (long long)bk * t, k0 + warp * FA_R, t, gv, one);
}

#define FA_STRIDES                                                                              \
    int h, int kv, int t, long long qb, long long qh, long long qt, long long kb, long long kh,  \
        long long kt_, long long vb, long long vh, long long vt, float scale
#define FA_STRIDE_ARGS h, kv, t, qb, qh, qt, kb, kh, kt_, vb, vh, vt, scale

#define KEVIN_FLASH(T, S, D)                                                                    \
    extern "C" __global__ void kevin_fa_fwd##D##_##S(const T* q, const T* k, const T* v, T* o,  \
                                                     float* lse, FA_STRIDES) {                  \
        fa_fwd<T, D>(q, k, v, o, lse, FA_STRIDE_ARGS);                                          \
    }                                                                                           \
    extern "C" __global__ void kevin_fa_dq##D##_##S(const T* q, const T* k, const T* v,         \
                                                    const T* o, const T* dout,                  \
                                                    const float* lse, float* dd, T* dq,         \
                                                    FA_STRIDES) {                               \
        fa_dq<T, D>(q, k, v, o, dout, lse, dd, dq, FA_STRIDE_ARGS);                             \
    }                                                                                           \
    extern "C" __global__ void kevin_fa_dkdv##D##_##S(const T* q, const T* k, const T* v,       \
                                                      const T* dout, const float* lse,          \
                                                      const float* dd, T* dk, T* dv,            \
                                                      FA_STRIDES) {                             \
        fa_dkdv<T, D>(q, k, v, dout, lse, dd, dk, dv, FA_STRIDE_ARGS);                          \
    }

KEVIN_FLASH(float, f32, 16)
KEVIN_FLASH(float, f32, 32)
KEVIN_FLASH(float, f32, 64)
KEVIN_FLASH(float, f32, 128)
KEVIN_FLASH(bf16, bf16, 16)
KEVIN_FLASH(bf16, bf16, 32)
KEVIN_FLASH(bf16, bf16, 64)
KEVIN_FLASH(bf16, bf16, 128)
