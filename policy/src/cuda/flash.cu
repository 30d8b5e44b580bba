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

// ---------------------------------------------------------------------------------------------
// The same three passes for bf16 on tensor cores (`kevin_fa_tc{fwd,dq,dkdv}{D}_bf16`): the tile
// products as mma.sync m16n8k16 (bf16 operands, f32 accumulation), everything else in f32 as
// above. Probabilities and score gradients are rounded to bf16 where they enter a product
// (FlashAttention-2 does the same). Blocks of 4 warps, 16 rows a warp (64 rows a block), tiles
// of 64 rows in shared memory as bf16 ([64][D + 8]: the 16-byte pad keeps the fragment reads
// free of bank conflicts). q, k, v rows and the head strides must be 16-byte aligned
// (flash.rs checks; it takes the kernels above otherwise).
// Fragments (lane = 4 g + c): A (16 x 16) holds rows g, g + 8 and columns 2c, 2c + 1, 2c + 8,
// 2c + 9; B (16 x 8) rows 2c, 2c + 1, 2c + 8, 2c + 9 and column g; the accumulator (16 x 8)
// rows g, g + 8 and columns 2c, 2c + 1.

#define TC_ROWS 64

__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// 64 rows of a [.., t, D] head (row stride rs elements) from row r0 into shared memory
// ([64][D + 8]), zeros past row t; 16-byte loads.
template <int D>
__device__ __forceinline__ void tc_load(bf16* dst, const bf16* src, long long rs, int r0, int t) {
    constexpr int P = D + 8, C = D / 8;
    for (int x = threadIdx.x; x < TC_ROWS * C; x += blockDim.x) {
        int r = x / C, c = (x % C) * 8, i = r0 + r;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (i < t) v = *reinterpret_cast<const uint4*>(src + (long long)i * rs + c);
        *reinterpret_cast<uint4*>(dst + r * P + c) = v;
    }
}

// The A fragment of rows r0.. and columns k0.. of a shared tile.
template <int D>
__device__ __forceinline__ void frag_a(unsigned (&a)[4], const bf16* s, int r0, int k0) {
    constexpr int P = D + 8;
    int lane = threadIdx.x & 31;
    const bf16* p = s + (r0 + (lane >> 2)) * P + k0 + (lane & 3) * 2;
    a[0] = *reinterpret_cast<const unsigned*>(p);
    a[1] = *reinterpret_cast<const unsigned*>(p + 8 * P);
    a[2] = *reinterpret_cast<const unsigned*>(p + 8);
    a[3] = *reinterpret_cast<const unsigned*>(p + 8 * P + 8);
}

// The B fragment of the transposed tile: column n of B is row n0 + n, rows k0.. its columns.
template <int D>
__device__ __forceinline__ void frag_bt(unsigned& b0, unsigned& b1, const bf16* s, int n0,
                                        int k0) {
    constexpr int P = D + 8;
    int lane = threadIdx.x & 31;
    const bf16* p = s + (n0 + (lane >> 2)) * P + k0 + (lane & 3) * 2;
    b0 = *reinterpret_cast<const unsigned*>(p);
    b1 = *reinterpret_cast<const unsigned*>(p + 8);
}

// The B fragments of the tile itself (rows k0..k0 + 15 are B's rows) for the column blocks n0..
// and n0 + 8..: b[0], b[1] and b[2], b[3] (ldmatrix with transposition).
template <int D>
__device__ __forceinline__ void frag_b2(unsigned (&b)[4], const bf16* s, int k0, int n0) {
    constexpr int P = D + 8;
    int lane = threadIdx.x & 31;
    const bf16* p = s + (k0 + (lane & 15)) * P + n0 + (lane >> 4) * 8;
    unsigned addr = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(addr));
}

template <int N> __device__ __forceinline__ void tc_zero(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
}

// acc[n] (16 x 8 blocks of a warp's 16 rows) = A rows r0.. of tile `a` times the transpose of
// tile `b`'s 64 rows, over D columns.
template <int D>
__device__ __forceinline__ void tc_scores(float (&acc)[8][4], const bf16* a, int r0,
                                          const bf16* b) {
    tc_zero(acc);
#pragma unroll
    for (int kk = 0; kk < D; kk += 16) {
        unsigned fa[4];
        frag_a<D>(fa, a, r0, kk);
#pragma unroll
        for (int n = 0; n < 8; n++) {
            unsigned b0, b1;
            frag_bt<D>(b0, b1, b, n * 8, kk);
            mma16816(acc[n], fa, b0, b1);
        }
    }
}

// out[D / 8] += w (a warp's 16 x 64 weights, as accumulators) times tile `b` ([64][D]).
template <int D>
__device__ __forceinline__ void tc_accumulate(float (&out)[D / 8][4], const float (&w)[8][4],
                                              const bf16* b) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        unsigned fa[4] = {pack_bf16(w[2 * j][0], w[2 * j][1]),
                          pack_bf16(w[2 * j][2], w[2 * j][3]),
                          pack_bf16(w[2 * j + 1][0], w[2 * j + 1][1]),
                          pack_bf16(w[2 * j + 1][2], w[2 * j + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            unsigned fb[4];
            frag_b2<D>(fb, b, j * 16, n * 8);
            mma16816(out[n], fa, fb[0], fb[1]);
            mma16816(out[n + 1], fa, fb[2], fb[3]);
        }
    }
}

// Two neighbouring values of a row, as the row's type.
__device__ __forceinline__ void put2(bf16* p, float a, float b) {
    *reinterpret_cast<unsigned*>(p) = pack_bf16(a, b);
}
__device__ __forceinline__ void put2(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// Rows `row[0]`, `row[1]` (below t) of a warp's accumulators, times mul[.], into dst ([.., D]
// packed, bf16 or f32, from row `base`).
template <int D, typename O>
__device__ __forceinline__ void tc_store(O* dst, long long base, const int (&row)[2], int t,
                                         const float (&acc)[D / 8][4], const float (&mul)[2]) {
    int c = (threadIdx.x & 3) * 2;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row[r] >= t) continue;
        O* p = dst + (base + row[r]) * D + c;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            put2(p + n * 8, acc[n][2 * r] * mul[r], acc[n][2 * r + 1] * mul[r]);
    }
}


// The 64 keys and values from row k0 into sk and sv, between barriers (the whole block calls
// it).
template <int D>
__device__ __forceinline__ void tc_kv_tile(bf16* sk, bf16* sv, const bf16* K, const bf16* V,
                                           long long kt, long long vt, int k0, int t) {
    __syncthreads();
    tc_load<D>(sk, K, kt, k0, t);
    tc_load<D>(sv, V, vt, k0, t);
    __syncthreads();
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// grid (b * h, ceil(t / 64)), block 128; y counts query blocks from the last: under the causal
// mask a block's work grows with its rows, so the heaviest blocks are dispatched first.
template <int D>
__device__ void tc_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, int h,
                       int kv, int t, long long qb, long long qh, long long qt, long long kb,
                       long long kh, long long kt_, long long vb, long long vh, long long vt,
                       float scale) {
    constexpr int P = D + 8, N = D / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16* sq = reinterpret_cast<bf16*>(smraw);  // [64][P]
    bf16* sk = sq + TC_ROWS * P;                 // [64][P]
    bf16* sv = sk + TC_ROWS * P;                 // [64][P]
    int bh = blockIdx.x, bi = bh / h, hi = bh % h, hk = hi / (h / kv);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = (lane & 3) * 2;
    int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS;  // the last (heaviest) rows first
    const bf16* K = k + bi * kb + hk * kh;
    const bf16* V = v + bi * vb + hk * vh;
    tc_load<D>(sq, q + bi * qb + hi * qh, qt, q0, t);
    int row[2] = {q0 + warp * 16 + (lane >> 2), q0 + warp * 16 + (lane >> 2) + 8};
    float m[2] = {FA_NEG_INF, FA_NEG_INF}, l[2] = {0.0f, 0.0f}, acc[N][4];
    tc_zero(acc);
    int kend = min(q0 + TC_ROWS, t);
    for (int k0 = 0; k0 < kend; k0 += TC_ROWS) {
        tc_kv_tile<D>(sk, sv, K, V, kt_, vt, k0, t);
        float s[8][4];
        tc_scores<D>(s, sq, warp * 16, sk);
        float mx[2] = {FA_NEG_INF, FA_NEG_INF};
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = k0 + n * 8 + c + (e & 1), r = e >> 1;
                float x = j <= row[r] && j < t ? s[n][e] * scale : FA_NEG_INF;
                s[n][e] = x;
                mx[r] = fmaxf(mx[r], x);
            }
        float corr[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mn = fmaxf(m[r], quad_max(mx[r]));
            // A row with no key yet (past t) keeps adding nothing.
            base[r] = mn == FA_NEG_INF ? 0.0f : mn;
            corr[r] = __expf(m[r] - base[r]);
            m[r] = mn;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = __expf(s[n][e] - base[e >> 1]);
                l[e >> 1] += s[n][e];
            }
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[n][e] *= corr[e >> 1];
        tc_accumulate<D>(acc, s, sv);
    }
    float inv[2];
    long long head = (long long)bh * t;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
        inv[r] = 1.0f / l[r];
        if (row[r] < t && c == 0) lse[head + row[r]] = m[r] + logf(l[r]);
    }
    tc_store<D>(o, head, row, t, acc, inv);
}

// grid (b * h, ceil(t / 64)), block 128, the last query block first (as tc_fwd). o, dout packed
// [b, h, t, D].
template <int D>
__device__ void tc_dq(const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                      const bf16* dout, const float* lse, float* dd, bf16* dq, int h, int kv,
                      int t, long long qb, long long qh, long long qt, long long kb, long long kh,
                      long long kt_, long long vb, long long vh, long long vt, float scale) {
    constexpr int P = D + 8, N = D / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16* sq = reinterpret_cast<bf16*>(smraw);  // [64][P]
    bf16* sdo = sq + TC_ROWS * P;                // [64][P]
    bf16* sk = sdo + TC_ROWS * P;                // [64][P]
    bf16* sv = sk + TC_ROWS * P;                 // [64][P]
    float* sl = reinterpret_cast<float*>(sv + TC_ROWS * P);  // [64] lse
    float* sd = sl + TC_ROWS;                                 // [64] rowsum(do * o)
    int bh = blockIdx.x, bi = bh / h, hi = bh % h, hk = hi / (h / kv);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = (lane & 3) * 2;
    int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS;  // the last (heaviest) rows first
    const bf16* K = k + bi * kb + hk * kh;
    const bf16* V = v + bi * vb + hk * vh;
    long long head = (long long)bh * t;
    tc_load<D>(sq, q + bi * qb + hi * qh, qt, q0, t);
    tc_load<D>(sdo, dout + head * D, D, q0, t);
    for (int r = warp; r < TC_ROWS; r += 4) {
        int i = q0 + r;
        float x = 0.0f;
        if (i < t)
            for (int e = lane; e < D; e += 32)
                x += ld(o, (head + i) * D + e) * ld(dout, (head + i) * D + e);
        x = warp_sum(x);
        if (lane == 0) {
            sd[r] = x;
            sl[r] = i < t ? lse[head + i] : 0.0f;
            if (i < t) dd[head + i] = x;
        }
    }
    __syncthreads();
    int rr[2] = {warp * 16 + (lane >> 2), warp * 16 + (lane >> 2) + 8};
    int row[2] = {q0 + rr[0], q0 + rr[1]};
    float L[2] = {sl[rr[0]], sl[rr[1]]}, Dr[2] = {sd[rr[0]], sd[rr[1]]}, acc[N][4];
    tc_zero(acc);
    int kend = min(q0 + TC_ROWS, t);
    for (int k0 = 0; k0 < kend; k0 += TC_ROWS) {
        tc_kv_tile<D>(sk, sv, K, V, kt_, vt, k0, t);
        float s[8][4], dp[8][4];
        tc_scores<D>(s, sq, warp * 16, sk);
        tc_scores<D>(dp, sdo, warp * 16, sv);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = k0 + n * 8 + c + (e & 1), r = e >> 1;
                float p = j <= row[r] && row[r] < t ? __expf(s[n][e] * scale - L[r]) : 0.0f;
                s[n][e] = p * (dp[n][e] - Dr[r]);
            }
        tc_accumulate<D>(acc, s, sk);
    }
    float mul[2] = {scale, scale};
    tc_store<D>(dq, head, row, t, acc, mul);
}

// grid (b * h, ceil(t / 64)), block 128: 64 keys of one query head's key/value head, over that
// query head's queries from the block's first key on. One block a query head (not a key/value
// head) and the key blocks on y, so the heaviest blocks (the first keys, which every later query
// sees) are dispatched first: with grouped queries a block a key/value head was a single wave
// of very uneven blocks (Qwen2-0.5B: 256 blocks, 14% of the SMs' issue slots). With h == kv
// the block writes dk, dv; otherwise its part, f32, to pk, pv ([b, h, t, D]), which
// kevin_fa_gqa_sum adds up over each group in order. dout packed; lse, dd as tc_fwd and tc_dq
// wrote them.
template <int D>
__device__ void tc_dkdv(const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                        const float* lse, const float* dd, bf16* dk, bf16* dv, float* pk,
                        float* pv, int h, int kv, int t, long long qb, long long qh,
                        long long qt, long long kb, long long kh, long long kt_, long long vb,
                        long long vh, long long vt, float scale) {
    constexpr int P = D + 8, N = D / 8;
    extern __shared__ __align__(16) unsigned char smraw[];
    bf16* sk = reinterpret_cast<bf16*>(smraw);  // [64][P]
    bf16* sv = sk + TC_ROWS * P;                 // [64][P]
    bf16* sq = sv + TC_ROWS * P;                 // [64][P]
    bf16* sdo = sq + TC_ROWS * P;                // [64][P]
    float* sl = reinterpret_cast<float*>(sdo + TC_ROWS * P);  // [64] lse
    float* sd = sl + TC_ROWS;                                  // [64] dd
    int bh = blockIdx.x, bi = bh / h, hq = bh % h, hk = hq / (h / kv);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = (lane & 3) * 2;
    int k0 = blockIdx.y * TC_ROWS;
    tc_load<D>(sk, k + bi * kb + hk * kh, kt_, k0, t);
    tc_load<D>(sv, v + bi * vb + hk * vh, vt, k0, t);
    int key[2] = {k0 + warp * 16 + (lane >> 2), k0 + warp * 16 + (lane >> 2) + 8};
    float gk[N][4], gv[N][4];
    tc_zero(gk);
    tc_zero(gv);
    long long head = (long long)bh * t;
    const bf16* Q = q + bi * qb + hq * qh;
    for (int i0 = k0; i0 < t; i0 += TC_ROWS) {
        __syncthreads();
        tc_load<D>(sq, Q, qt, i0, t);
        tc_load<D>(sdo, dout + head * D, D, i0, t);
        if (threadIdx.x < TC_ROWS) {
            int i = i0 + threadIdx.x;
            sl[threadIdx.x] = i < t ? lse[head + i] : 0.0f;
            sd[threadIdx.x] = i < t ? dd[head + i] : 0.0f;
        }
        __syncthreads();
        float p[8][4], ds[8][4];
        tc_scores<D>(p, sk, warp * 16, sq);
        tc_scores<D>(ds, sv, warp * 16, sdo);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int jj = n * 8 + c + (e & 1), i = i0 + jj, r = e >> 1;
                float x = i >= key[r] && i < t ? __expf(p[n][e] * scale - sl[jj]) : 0.0f;
                p[n][e] = x;
                ds[n][e] = x * (ds[n][e] - sd[jj]);
            }
        tc_accumulate<D>(gv, p, sdo);
        tc_accumulate<D>(gk, ds, sq);
    }
    float mk[2] = {scale, scale}, one[2] = {1.0f, 1.0f};
    if (pk == nullptr) {
        tc_store<D>(dk, head, key, t, gk, mk);
        tc_store<D>(dv, head, key, t, gv, one);
    } else {
        tc_store<D>(pk, head, key, t, gk, mk);
        tc_store<D>(pv, head, key, t, gv, one);
    }
}

// dk, dv [b, kv, rows] (bf16, n = b * kv * rows elements; rows = t * D, a multiple of 4) = the
// sums of pk, pv [b, h, rows] (f32) over each key/value head's h / kv query heads, in head order;
// 4 elements a thread.
extern "C" __global__ void kevin_fa_gqa_sum_bf16(const float* pk, const float* pv, bf16* dk,
                                                 bf16* dv, int h, int kv, long long rows,
                                                 long long n) {
    long long e = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    long long per_b = (long long)kv * rows;
    if (e >= n) return;
    long long bi = e / per_b, hk = (e / rows) % kv, x = e % rows;
    int grp = h / kv;
    const float* a = pk + (bi * h + hk * grp) * rows + x;
    const float* b = pv + (bi * h + hk * grp) * rows + x;
    float4 sk = make_float4(0.f, 0.f, 0.f, 0.f), sv = sk;
    for (int g = 0; g < grp; g++) {
        float4 u = *reinterpret_cast<const float4*>(a + g * rows);
        float4 w = *reinterpret_cast<const float4*>(b + g * rows);
        sk.x += u.x; sk.y += u.y; sk.z += u.z; sk.w += u.w;
        sv.x += w.x; sv.y += w.y; sv.z += w.z; sv.w += w.w;
    }
    unsigned* ok = reinterpret_cast<unsigned*>(dk + e);
    unsigned* ov = reinterpret_cast<unsigned*>(dv + e);
    ok[0] = pack_bf16(sk.x, sk.y);
    ok[1] = pack_bf16(sk.z, sk.w);
    ov[0] = pack_bf16(sv.x, sv.y);
    ov[1] = pack_bf16(sv.z, sv.w);
}

#define KEVIN_FLASH_TC(D)                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                           \
        kevin_fa_tcfwd##D##_bf16(const bf16* q, const bf16* k, const bf16* v, bf16* o,          \
                                 float* lse, FA_STRIDES) {                                      \
        tc_fwd<D>(q, k, v, o, lse, FA_STRIDE_ARGS);                                             \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                           \
        kevin_fa_tcdq##D##_bf16(const bf16* q, const bf16* k, const bf16* v, const bf16* o,     \
                                const bf16* dout, const float* lse, float* dd, bf16* dq,        \
                                FA_STRIDES) {                                                   \
        tc_dq<D>(q, k, v, o, dout, lse, dd, dq, FA_STRIDE_ARGS);                                \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                           \
        kevin_fa_tcdkdv##D##_bf16(const bf16* q, const bf16* k, const bf16* v,                  \
                                  const bf16* dout, const float* lse, const float* dd,          \
                                  bf16* dk, bf16* dv, float* pk, float* pv, FA_STRIDES) {       \
        tc_dkdv<D>(q, k, v, dout, lse, dd, dk, dv, pk, pv, FA_STRIDE_ARGS);                     \
    }

KEVIN_FLASH_TC(16)
KEVIN_FLASH_TC(32)
KEVIN_FLASH_TC(64)
KEVIN_FLASH_TC(128)
