// The learner's RMSNorm and bias gradients (policy/src/norm.rs), in f32 arithmetic over f32 or
// bf16 tensors of `rows` rows of `n` values:
//   kevin_rms_fwd:  r = rsqrt(mean(x^2) + eps) per row; y = rnd(rnd(x * r) * w), rounded as
//                   transformers' RMSNorm rounds (the normalised row cast to T, then scaled in T);
//   kevin_rms_bwd:  dx = r * (dy * w) - x * r^3 * mean((dy * w) * x), and dw += the column sums
//                   of dy * rnd(x * r) (f32 atomics into a zeroed [n]);
//   kevin_col_sum:  out += the column sums of dy (a bias's gradient; f32 atomics, zeroed [n]);
//   kevin_sq_sum:   out[0] += the sum of the squares of every value of `count` tensors at once
//                   (the global gradient norm's), described by table[3 i .. 3 i + 3] = (address,
//                   length, first block): SQ_CHUNK values a block, f32 atomics, one per block,
//                   into a zeroed [1];
// and the attention's rotary embedding and the MLP's SwiGLU, elementwise:
//   kevin_rope:     x [b, t, h, d] (the projection's rows) -> y [b, h, t, d] (heads first), with
//                   k = d / 2: y[j] = x[j] c[j] - x[j+k] s[j], y[j+k] = x[j+k] c[j+k] + x[j] s[j+k]
//                   (transformers' x * cos + rotate_half(x) * sin), cos and sin [crows, t, d],
//                   crows 1 (shared) or b; back = 1: its gradient, g [b, h, t, d] -> dx
//                   [b, t, h, d]: dx[j] = g[j] c[j] + g[j+k] s[j+k], dx[j+k] = g[j+k] c[j+k] -
//                   g[j] s[j];
//   kevin_swiglu_fwd: y = rnd(silu(g)) * u (the activation rounded to T, as transformers' act_fn
//                   returns it, then the product);
//   kevin_swiglu_bwd: du = dy * rnd(silu(g)), dg = dy * u * silu'(g) with silu'(g) =
//                   sigmoid(g) * (1 + g * (1 - sigmoid(g))).
// And the optimizer's step on `count` parameters at once, f32 state (PyTorch's AdamW), each
// described by ADAM_SLOTS values of table (the addresses of g, w, m, v, w', m', v', p' (0: none),
// its length n, its first block, then its eight f32 constants two by two: scale, decay, lr, b1,
// b2, c1, c2, eps), ADAM_CHUNK values a block:
//   kevin_adamw:    with gs = g * scale (the global norm's clip), m' = b1 m + (1 - b1) gs,
//                   v' = b2 v + (1 - b2) gs^2, w' = w decay - lr (m' c1) / (sqrt(v' c2) + eps),
//                   where decay = 1 - lr * weight_decay, c1 = 1 / (1 - b1^t), c2 = 1 / (1 - b2^t);
//                   w is the f32 master (the parameter itself when it is f32); p', when not
//                   null, is w' rounded to T (the parameter of a bf16 model).
// And the token embedding's gradient, without atomics (the same sums in the same order every
// run), for n token ids held as f32 (exact integers below 2^24):
//   kevin_embed_links: next[p] = the first later position with p's id (-1: none) and lead[p] = 1
//                   where no earlier position has it (every thread compares its id with all n,
//                   from shared-memory tiles: n^2 comparisons);
//   kevin_embed_bwd: for each leading p, dw[id][..] = the sum of dy's rows at p, next[p],
//                   next[next[p]], ... in f32, in position order, rounded once to T (dw zeroed
//                   first: the rows of ids that do not occur stay zero; an id outside
//                   [0, vocab) writes nothing).

#define NORM_THREADS 256
#define NORM_ROWS 16
#define COL_ROWS 256

// The sum of `v` over the block (every thread gets it); `red` holds NORM_THREADS / 32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < NORM_THREADS / 32 ? red[lane] : 0.0f;
    return warp_sum(s);
}

// A block per row.
template <typename T>
__device__ void rms_fwd(const T* x, const T* w, T* y, float* r, long long n, float eps) {
    __shared__ float red[NORM_THREADS / 32];
    long long row = blockIdx.x, off = row * n;
    float ss = 0.0f;
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS) {
        float v = ld(x, off + j);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / (float)n + eps);
    if (threadIdx.x == 0) r[row] = inv;
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS)
        st(y, off + j, rnd<T>(ld(x, off + j) * inv) * ld(w, j));
}

// A block per NORM_ROWS rows; each thread keeps its columns' dw sums in shared memory (n floats).
template <typename T>
__device__ void rms_bwd(const T* x, const T* w, const float* r, const T* dy, T* dx, float* dw,
                        long long rows, long long n) {
    __shared__ float red[NORM_THREADS / 32];
    extern __shared__ float acc[];
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS) acc[j] = 0.0f;
    long long first = (long long)blockIdx.x * NORM_ROWS;
    long long last = min(first + NORM_ROWS, rows);
    for (long long row = first; row < last; row++) {
        long long off = row * n;
        float inv = r[row], s = 0.0f;
        for (long long j = threadIdx.x; j < n; j += NORM_THREADS) {
            float xv = ld(x, off + j), g = ld(dy, off + j);
            s += g * ld(w, j) * xv;
            acc[j] += g * rnd<T>(xv * inv);
        }
        float c = block_sum(s, red) / (float)n * inv * inv * inv;
        for (long long j = threadIdx.x; j < n; j += NORM_THREADS) {
            float xv = ld(x, off + j);
            st(dx, off + j, inv * ld(dy, off + j) * ld(w, j) - xv * c);
        }
    }
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS) atomicAdd(dw + j, acc[j]);
}

// Blocks of NORM_THREADS columns by COL_ROWS rows.
template <typename T>
__device__ void col_sum(const T* dy, float* out, long long rows, long long n) {
    long long j = (long long)blockIdx.x * NORM_THREADS + threadIdx.x;
    if (j >= n) return;
    long long first = (long long)blockIdx.y * COL_ROWS;
    long long last = min(first + COL_ROWS, rows);
    float s = 0.0f;
    for (long long row = first; row < last; row++) s += ld(dy, row * n + j);
    atomicAdd(out + j, s);
}

#define SQ_CHUNK (NORM_THREADS * 16)

// Block b finds its tensor (the last whose first block is at most b: a binary search over the
// table) and sums the squares of its part, SQ_CHUNK values; the block's sum is added once.
template <typename T> __device__ void sq_sum(const long long* table, float* out, long long count) {
    __shared__ float red[NORM_THREADS / 32];
    long long b = blockIdx.x, lo = 0, hi = count - 1;
    while (lo < hi) {
        long long mid = (lo + hi + 1) / 2;
        if (table[3 * mid + 2] <= b) lo = mid;
        else hi = mid - 1;
    }
    const T* x = (const T*)table[3 * lo];
    long long n = table[3 * lo + 1];
    long long start = (b - table[3 * lo + 2]) * SQ_CHUNK;
    long long end = start + SQ_CHUNK < n ? start + SQ_CHUNK : n;
    float s = 0.0f;
    for (long long i = start + threadIdx.x; i < end; i += NORM_THREADS) {
        float v = ld(x, i);
        s += v * v;
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) atomicAdd(out, s);
}

// A thread per pair (j, j + k) of a head's row, in y's order for the forward (x's for back).
template <typename T>
__device__ void rope(const T* x, const T* c, const T* s, T* y, long long b, long long t,
                     long long h, long long d, long long crows, int back) {
    long long k = d / 2;
    long long i = (long long)blockIdx.x * NORM_THREADS + threadIdx.x;
    if (i >= b * h * t * k) return;
    long long j = i % k, r = i / k;
    long long ti = r % t;
    r /= t;
    long long hi = r % h, bi = r / h;
    long long heads_first = ((bi * h + hi) * t + ti) * d + j;
    long long rows_first = ((bi * t + ti) * h + hi) * d + j;
    long long ci = ((bi % crows) * t + ti) * d + j;
    long long in = back ? heads_first : rows_first, out = back ? rows_first : heads_first;
    float a = ld(x, in), z = ld(x, in + k);
    float c0 = ld(c, ci), c1 = ld(c, ci + k), s0 = ld(s, ci), s1 = ld(s, ci + k);
    if (back) {
        st(y, out, a * c0 + z * s1);
        st(y, out + k, z * c1 - a * s0);
    } else {
        st(y, out, a * c0 - z * s0);
        st(y, out + k, z * c1 + a * s1);
    }
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// EW_PER_THREAD values a thread, NORM_THREADS apart (each load coalesced), all loaded before
// any is used: one 2-byte value a thread kept too few loads in flight (35% of the H100's DRAM
// bandwidth at Qwen2-0.5B's [8192, 4864]).
#define EW_PER_THREAD 4

template <typename T> __device__ void swiglu_fwd(const T* g, const T* u, T* y, long long n) {
    long long base = (long long)blockIdx.x * NORM_THREADS * EW_PER_THREAD + threadIdx.x;
    float gv[EW_PER_THREAD], uv[EW_PER_THREAD];
#pragma unroll
    for (int k = 0; k < EW_PER_THREAD; k++) {
        long long i = base + k * NORM_THREADS;
        gv[k] = i < n ? ld(g, i) : 0.0f;
        uv[k] = i < n ? ld(u, i) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < EW_PER_THREAD; k++) {
        long long i = base + k * NORM_THREADS;
        if (i < n) st(y, i, rnd<T>(gv[k] * sigmoid(gv[k])) * uv[k]);
    }
}

template <typename T>
__device__ void swiglu_bwd(const T* g, const T* u, const T* dy, T* dg, T* du, long long n) {
    long long base = (long long)blockIdx.x * NORM_THREADS * EW_PER_THREAD + threadIdx.x;
    float gv[EW_PER_THREAD], uv[EW_PER_THREAD], dv[EW_PER_THREAD];
#pragma unroll
    for (int k = 0; k < EW_PER_THREAD; k++) {
        long long i = base + k * NORM_THREADS;
        gv[k] = i < n ? ld(g, i) : 0.0f;
        uv[k] = i < n ? ld(u, i) : 0.0f;
        dv[k] = i < n ? ld(dy, i) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < EW_PER_THREAD; k++) {
        long long i = base + k * NORM_THREADS;
        if (i >= n) continue;
        float sg = sigmoid(gv[k]);
        st(du, i, dv[k] * rnd<T>(gv[k] * sg));
        st(dg, i, dv[k] * uv[k] * sg * (1.0f + gv[k] * (1.0f - sg)));
    }
}

#define ADAM_CHUNK (NORM_THREADS * 4)
#define ADAM_SLOTS 14

// Block b finds its parameter (the last whose first block is at most b) and steps its part;
// every input and output is [n], packed.
template <typename T> __device__ void adamw(const long long* table, long long count) {
    long long b = blockIdx.x, lo = 0, hi = count - 1;
    while (lo < hi) {
        long long mid = (lo + hi + 1) / 2;
        if (table[ADAM_SLOTS * mid + 9] <= b) lo = mid;
        else hi = mid - 1;
    }
    const long long* e = table + ADAM_SLOTS * lo;
    const T* g = (const T*)e[0];
    const float* w = (const float*)e[1];
    const float* m = (const float*)e[2];
    const float* v = (const float*)e[3];
    float* w2 = (float*)e[4];
    float* m2 = (float*)e[5];
    float* v2 = (float*)e[6];
    T* p2 = (T*)e[7];
    long long n = e[8];
    const float* k = (const float*)(e + 10);
    float scale = k[0], decay = k[1], lr = k[2], b1 = k[3], b2 = k[4], c1 = k[5], c2 = k[6];
    float eps = k[7];
    long long start = (b - e[9]) * ADAM_CHUNK;
    long long end = start + ADAM_CHUNK < n ? start + ADAM_CHUNK : n;
    for (long long i = start + threadIdx.x; i < end; i += NORM_THREADS) {
        float gs = ld(g, i) * scale;
        float mi = b1 * m[i] + (1.0f - b1) * gs;
        float vi = b2 * v[i] + (1.0f - b2) * (gs * gs);
        float wi = w[i] * decay - lr * ((mi * c1) / (sqrtf(vi * c2) + eps));
        m2[i] = mi;
        v2[i] = vi;
        w2[i] = wi;
        if (p2) st(p2, i, wi);
    }
}

#define LINK_TILE 1024

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    kevin_embed_links(const float* ids, int* next, int* lead, long long n) {
    __shared__ float tile[LINK_TILE];
    long long p = (long long)blockIdx.x * NORM_THREADS + threadIdx.x;
    float id = p < n ? ids[p] : -1.0f;
    long long nx = -1;
    int earlier = 0;
    for (long long t0 = 0; t0 < n; t0 += LINK_TILE) {
        __syncthreads();
        for (int j = threadIdx.x; j < LINK_TILE; j += NORM_THREADS)
            tile[j] = t0 + j < n ? ids[t0 + j] : -2.0f;
        __syncthreads();
        if (p >= n) continue;
        long long m = n - t0 < LINK_TILE ? n - t0 : LINK_TILE;
        for (long long j = 0; j < m; ++j) {
            if (tile[j] != id) continue;
            long long q = t0 + j;
            if (q < p) earlier = 1;
            else if (q > p && nx < 0) nx = q;
        }
    }
    if (p < n) {
        next[p] = (int)nx;
        lead[p] = earlier ? 0 : 1;
    }
}

// A block per position; only leading positions write (their id's whole row).
template <typename T>
__device__ void embed_bwd(const float* ids, const int* next, const int* lead, const T* dy, T* dw,
                          long long n, long long h, long long vocab) {
    long long p = blockIdx.x;
    if (p >= n || !lead[p]) return;
    long long row = (long long)ids[p];
    if (row < 0 || row >= vocab) return;  // never written outside the table
    for (long long c = threadIdx.x; c < h; c += NORM_THREADS) {
        float acc = 0.0f;
        for (long long q = p; q >= 0; q = next[q]) acc += ld(dy, q * h + c);
        st(dw, row * h + c, acc);
    }
}

#define KEVIN_NORM(T, S)                                                                        \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_rms_fwd_##S(const T* x, const T* w, T* y, float* r, long long n, float eps) {     \
        rms_fwd<T>(x, w, y, r, n, eps);                                                         \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_rms_bwd_##S(const T* x, const T* w, const float* r, const T* dy, T* dx,           \
                          float* dw, long long rows, long long n) {                             \
        rms_bwd<T>(x, w, r, dy, dx, dw, rows, n);                                               \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_col_sum_##S(const T* dy, float* out, long long rows, long long n) {              \
        col_sum<T>(dy, out, rows, n);                                                           \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_sq_sum_##S(const long long* table, float* out, long long count) {                 \
        sq_sum<T>(table, out, count);                                                           \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_rope_##S(const T* x, const T* c, const T* s, T* y, long long b, long long t,      \
                       long long h, long long d, long long crows, int back) {                   \
        rope<T>(x, c, s, y, b, t, h, d, crows, back);                                           \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_swiglu_fwd_##S(const T* g, const T* u, T* y, long long n) {                       \
        swiglu_fwd<T>(g, u, y, n);                                                              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_swiglu_bwd_##S(const T* g, const T* u, const T* dy, T* dg, T* du, long long n) {  \
        swiglu_bwd<T>(g, u, dy, dg, du, n);                                                     \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_adamw_##S(const long long* table, long long count) {                              \
        adamw<T>(table, count);                                                                 \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_embed_bwd_##S(const float* ids, const int* next, const int* lead, const T* dy,    \
                            T* dw, long long n, long long h, long long vocab) {                 \
        embed_bwd<T>(ids, next, lead, dy, dw, n, h, vocab);                                     \
    }

KEVIN_NORM(float, f32)
KEVIN_NORM(bf16, bf16)
