// The fused extend path of kevin's Qwen2 policy on CUDA (policy/src/qwen2/fused.rs): the
// kernels between the cuBLAS products of one decoder pass. Each comes in two element types,
// f32 and bf16 (`_f32`, `_bf16`), and rounds where the burn reference rounds, so a bf16 pass
// matches the reference path within bf16 rounding:
//   embed       token rows of the embedding table
//   add_rmsnorm x += add (the residual, rounded), out = rmsnorm(x) * weight
//   qkv_rope    bias, rotary embedding, and the new keys and values written into the cache
//   attn        each query over its slot's cached keys 0..=position (online softmax, 4 warps),
//               in parts of the keys when there are few queries (attn_merge joins the parts)
//   silu_mul    silu(gate) * up
//   round_bf16  f32 logits rounded to bf16 (the reference computes them in bf16)
// Compiled once per process with NVRTC for the device's architecture.
// (policy/src/cuda/prelude.cuh comes first: ld, st, rnd, warp_sum.)

// The sum of `v` over the block, in every thread.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    v = warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    return warp_sum(lane < warps ? part[lane] : 0.0f);
}

// grid (N): x[n, :] = table[ids[n], :], the table's rows `ld` elements apart (burn's allocator
// may pad a row past `hidden`).
template <typename T>
__device__ void embed(const int* ids, const T* table, T* x, int hidden, int ld) {
    long long n = blockIdx.x;
    const T* src = table + (long long)ids[n] * ld;
    T* dst = x + n * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// grid (R): row r works on x row n = rows ? rows[r] : r. With `add`, x[n] += add[n] first (the
// residual, rounded to T). out[r] = T(T(x * 1/sqrt(mean(x^2) + eps)) * weight), the reference's
// order (normalised in f32, cast, then scaled).
template <typename T>
__device__ void add_rmsnorm(T* x, const T* add, const T* weight, T* out, const int* rows,
                            int hidden, float eps) {
    long long r = blockIdx.x;
    long long n = rows ? rows[r] : r;
    T* xr = x + n * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = ld(xr, i);
        if (add) {
            v = rnd<T>(v + ld(add, n * hidden + i));
            st(xr, i, v);
        }
        ss += v * v;
    }
    float inv = 1.0f / sqrtf(block_sum(ss) / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = ld(xr, i);
        st(out, r * hidden + i, rnd<T>(rnd<T>(v * inv) * ld(weight, i)));
    }
}

// grid (N): token n at position pos[n] of slot slot[n]. q, k, v are the projections without
// bias ([N, h*d], [N, kv*d], [N, kv*d]); the biases may be null. Writes q with RoPE to qo, and
// k (with RoPE) and v to the caches ([slots, kv, max_len, d]). RoPE as the reference computes
// it in T: x * cos + rotate_half(x) * sin, with the angle pos * inv_freq[i] in f32.
template <typename T>
__device__ void qkv_rope(const T* q, const T* k, const T* v, const T* bq, const T* bk,
                         const T* bv, const int* slot, const int* pos, const float* inv_freq,
                         T* qo, T* kc, T* vc, int h, int kv, int d, int max_len) {
    long long n = blockIdx.x;
    int p = pos[n];
    long long s = slot[n];
    int half = d / 2;
    for (int t = threadIdx.x; t < (h + kv) * half; t += blockDim.x) {
        int head = t / half, i = t % half;
        bool is_q = head < h;
        int hh = is_q ? head : head - h;
        const T* src = is_q ? q + n * h * d + hh * d : k + n * kv * d + hh * d;
        const T* b = is_q ? bq : bk;
        float x1 = ld(src, i), x2 = ld(src, i + half);
        if (b) {
            x1 = rnd<T>(x1 + ld(b, hh * d + i));
            x2 = rnd<T>(x2 + ld(b, hh * d + i + half));
        }
        float a = (float)p * inv_freq[i];
        float c = rnd<T>(cosf(a)), sn = rnd<T>(sinf(a));
        float o1 = rnd<T>(rnd<T>(x1 * c) + rnd<T>(-x2 * sn));
        float o2 = rnd<T>(rnd<T>(x2 * c) + rnd<T>(x1 * sn));
        T* dst = is_q ? qo + n * h * d + hh * d : kc + ((s * kv + hh) * max_len + p) * d;
        st(dst, i, o1);
        st(dst, i + half, o2);
    }
    for (int t = threadIdx.x; t < kv * d; t += blockDim.x) {
        int hh = t / d, i = t % d;
        float x = ld(v, n * kv * d + t);
        if (bv) x = rnd<T>(x + ld(bv, t));
        st(vc + ((s * kv + hh) * max_len + p) * d, i, x);
    }
}

#define MAXG 8
#define NEG_INF __int_as_float(0xff800000)

// grid (N, kv, S), block 32 * W: the g = h / kv query heads of token n that share key/value head
// blockIdx.y, over part z = blockIdx.z of keys 0..=pos[n] of the token's slot (S parts of
// ceil(keys / S) keys; S = 1 at prefill, more when few tokens would leave the GPU idle). Each
// warp takes every W-th key of the part and keeps an online softmax per head (lane l holds
// dimensions l*E .. l*E+E-1; d = 32 * E, or d < 32 with E = 1 and lanes d.. idle); the warps are
// merged through shared memory (W * MAXG * (d + 2) floats). With S = 1 the result goes to
// out [N, h*d]; otherwise part [N, h, S, d + 2] gets each part's unnormalised sum, its
// normaliser and its maximum, and attn_merge combines them.
template <typename T, int E>
__device__ void attn(const T* q, const T* kc, const T* vc, const int* slot, const int* pos,
                     T* out, float* part, int h, int kv, int d, int max_len, float scale) {
    long long n = blockIdx.x;
    int hk = blockIdx.y;
    int g = h / kv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    long long base = ((long long)slot[n] * kv + hk) * max_len * d;
    const T* K = kc + base;
    const T* V = vc + base;
    int keys = pos[n] + 1;
    int parts = gridDim.z, z = blockIdx.z;
    int chunk = (keys + parts - 1) / parts;
    int lo = z * chunk, hi = min(keys, lo + chunk);

    const bool on = lane * E < d;
    float qr[MAXG][E], acc[MAXG][E], m[MAXG], l[MAXG];
#pragma unroll
    for (int gi = 0; gi < MAXG; gi++) {
        m[gi] = NEG_INF;
        l[gi] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            qr[gi][e] = gi < g && on ? ld(q, n * h * d + (hk * g + gi) * d + lane * E + e) : 0.0f;
            acc[gi][e] = 0.0f;
        }
    }
    for (int j = lo + warp; j < hi; j += warps) {
        float kr[E], vr[E];
#pragma unroll
        for (int e = 0; e < E; e++) {
            kr[e] = on ? ld(K, (long long)j * d + lane * E + e) : 0.0f;
            vr[e] = on ? ld(V, (long long)j * d + lane * E + e) : 0.0f;
        }
#pragma unroll
        for (int gi = 0; gi < MAXG; gi++) {
            if (gi < g) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++) s += qr[gi][e] * kr[e];
                s = warp_sum(s) * scale;
                float mn = fmaxf(m[gi], s);
                float corr = expf(m[gi] - mn);
                float p = expf(s - mn);
                l[gi] = l[gi] * corr + p;
#pragma unroll
                for (int e = 0; e < E; e++) acc[gi][e] = acc[gi][e] * corr + p * vr[e];
                m[gi] = mn;
            }
        }
    }
    extern __shared__ float sm[];
    float* sacc = sm;                         // [W][MAXG][d]
    float* sm_m = sm + warps * MAXG * d;      // [W][MAXG]
    float* sm_l = sm_m + warps * MAXG;        // [W][MAXG]
#pragma unroll
    for (int gi = 0; gi < MAXG; gi++) {
        if (gi < g) {
            if (on) {
#pragma unroll
                for (int e = 0; e < E; e++) sacc[(warp * MAXG + gi) * d + lane * E + e] = acc[gi][e];
            }
            if (lane == 0) {
                sm_m[warp * MAXG + gi] = m[gi];
                sm_l[warp * MAXG + gi] = l[gi];
            }
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < g * d; t += blockDim.x) {
        int gi = t / d, i = t % d;
        float mx = NEG_INF;
        for (int w = 0; w < warps; w++) mx = fmaxf(mx, sm_m[w * MAXG + gi]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < warps; w++) {
            float mw = sm_m[w * MAXG + gi];
            // A warp (or a whole part) without keys adds nothing.
            float f = mw == NEG_INF ? 0.0f : expf(mw - mx);
            L += sm_l[w * MAXG + gi] * f;
            O += sacc[(w * MAXG + gi) * d + i] * f;
        }
        int head = hk * g + gi;
        if (parts == 1) {
            st(out, n * h * d + head * d + i, O / L);
        } else {
            float* pp = part + ((n * h + head) * parts + z) * (d + 2);
            pp[i] = O;
            if (i == 0) {
                pp[d] = L;
                pp[d + 1] = mx;
            }
        }
    }
}

// grid (N, h), block >= d: out[n, head] from the S parts attn wrote to part [N, h, S, d + 2].
template <typename T>
__device__ void attn_merge(const float* part, T* out, int h, int d, int parts) {
    long long n = blockIdx.x;
    int head = blockIdx.y, i = threadIdx.x;
    if (i >= d) return;
    const float* pp = part + (n * h + head) * parts * (d + 2);
    float mx = NEG_INF;
    for (int z = 0; z < parts; z++) mx = fmaxf(mx, pp[z * (d + 2) + d + 1]);
    float L = 0.0f, O = 0.0f;
    for (int z = 0; z < parts; z++) {
        float mz = pp[z * (d + 2) + d + 1];
        float f = mz == NEG_INF ? 0.0f : expf(mz - mx);
        L += pp[z * (d + 2) + d] * f;
        O += pp[z * (d + 2) + i] * f;
    }
    st(out, n * h * d + head * d + i, O / L);
}

// out[i] = T(T(silu(gate[i])) * up[i]), n elements.
template <typename T>
__device__ void silu_mul(const T* gate, const T* up, T* out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = ld(gate, i);
        float sg = rnd<T>(1.0f / (1.0f + expf(-x)));
        st(out, i, rnd<T>(rnd<T>(x * sg) * ld(up, i)));
    }
}

#define KEVIN_ATTN(T, S, E)                                                                     \
    extern "C" __global__ void kevin_attn##E##_##S(const T* q, const T* kc, const T* vc,        \
                                                   const int* slot, const int* pos, T* out,     \
                                                   float* part, int h, int kv, int d,           \
                                                   int max_len, float scale) {                  \
        attn<T, E>(q, kc, vc, slot, pos, out, part, h, kv, d, max_len, scale);                  \
    }

#define KEVIN_TYPED(T, S)                                                                       \
    extern "C" __global__ void kevin_embed_##S(const int* ids, const T* table, T* x, int hidden, \
                                               int ld) {                                        \
        embed<T>(ids, table, x, hidden, ld);                                                    \
    }                                                                                           \
    extern "C" __global__ void kevin_add_rmsnorm_##S(T* x, const T* add, const T* w, T* out,    \
                                                     const int* rows, int hidden, float eps) {  \
        add_rmsnorm<T>(x, add, w, out, rows, hidden, eps);                                      \
    }                                                                                           \
    extern "C" __global__ void kevin_qkv_rope_##S(                                              \
        const T* q, const T* k, const T* v, const T* bq, const T* bk, const T* bv,              \
        const int* slot, const int* pos, const float* inv_freq, T* qo, T* kc, T* vc, int h,     \
        int kv, int d, int max_len) {                                                           \
        qkv_rope<T>(q, k, v, bq, bk, bv, slot, pos, inv_freq, qo, kc, vc, h, kv, d, max_len);   \
    }                                                                                           \
    KEVIN_ATTN(T, S, 1)                                                                         \
    KEVIN_ATTN(T, S, 2)                                                                         \
    KEVIN_ATTN(T, S, 4)                                                                         \
    extern "C" __global__ void kevin_attn_merge_##S(const float* part, T* out, int h, int d,     \
                                                    int parts) {                                \
        attn_merge<T>(part, out, h, d, parts);                                                  \
    }                                                                                           \
    extern "C" __global__ void kevin_silu_mul_##S(const T* gate, const T* up, T* out,           \
                                                  long long n) {                                \
        silu_mul<T>(gate, up, out, n);                                                          \
    }

KEVIN_TYPED(float, f32)
KEVIN_TYPED(bf16, bf16)

// f32 logits rounded to bf16 in place (n elements).
extern "C" __global__ void kevin_round_bf16(float* x, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] = rnd<bf16>(x[i]);
}

// grid (R), block 1024: one token per row of f32 logits [R, vocab] on the device. temp[r] = 0:
// greedy (the first index of the maximum; log-prob 0). Otherwise a draw from
// softmax(logits / temp[r]) over the whole vocabulary at thr[r] in (0, 1]: the first token whose
// CDF reaches thr * total (never a token of probability 0), as `select_tokens` draws; its
// log-prob under that distribution. A row with a NaN (or no finite logit) gets a NaN log-prob,
// which the host refuses. The CDF is walked by one thread over per-thread chunk sums, so the
// chosen token does not depend on a parallel scan's rounding.
extern "C" __global__ void kevin_sample(const float* logits, int vocab, const float* temp,
                                        const float* thr, int* tok, float* lp) {
    __shared__ float sval[32];
    __shared__ int sidx[32];
    __shared__ float chunk_sum[1024];
    const float* l = logits + (long long)blockIdx.x * vocab;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    bool nan = false;
    for (int i = tid; i < vocab; i += blockDim.x) {
        float v = l[i];
        if (v != v) nan = true;
        else if (v > best) { best = v; bi = i; }
    }
    nan = __syncthreads_or(nan);
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) { sval[warp] = best; sidx[warp] = bi; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < warps; w++)
            if (sval[w] > best || (sval[w] == best && sidx[w] < bi)) { best = sval[w]; bi = sidx[w]; }
        sval[0] = best;
        sidx[0] = bi;
    }
    __syncthreads();
    best = sval[0];
    bi = sidx[0];
    float t = temp[blockIdx.x];
    if (t == 0.0f) {
        if (tid == 0) {
            tok[blockIdx.x] = bi < vocab ? bi : 0;
            lp[blockIdx.x] = nan || best == NEG_INF ? __int_as_float(0x7fc00000) : 0.0f;
        }
        return;
    }
    float m = best / t;
    int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    int begin = tid * chunk, end = min(begin + chunk, vocab);
    float cs = 0.0f;
    for (int i = begin; i < end; i++) cs += expf(l[i] / t - m);
    chunk_sum[tid] = cs;
    __syncthreads();
    if (tid != 0) return;
    float total = 0.0f;
    for (int c = 0; c < blockDim.x; c++) total += chunk_sum[c];
    float target = thr[blockIdx.x] * total;
    float acc = 0.0f;
    int pick = -1, last_chunk = -1;
    for (int c = 0; c < blockDim.x; c++) {
        float s = chunk_sum[c];
        if (s > 0.0f) last_chunk = c;
        if (s > 0.0f && acc + s >= target) { pick = c; break; }
        acc += s;
    }
    if (pick < 0) pick = last_chunk;  // rounding: the threshold passed the last mass
    int token = -1, last_tok = -1;
    if (pick >= 0) {
        int b = pick * chunk, e = min(b + chunk, vocab);
        for (int i = b; i < e; i++) {
            float p = expf(l[i] / t - m);
            if (p > 0.0f) last_tok = i;
            acc += p;
            if (p > 0.0f && acc >= target) { token = i; break; }
        }
        if (token < 0) token = last_tok;
    }
    if (nan || token < 0) {
        tok[blockIdx.x] = 0;
        lp[blockIdx.x] = __int_as_float(0x7fc00000);
        return;
    }
    tok[blockIdx.x] = token;
    lp[blockIdx.x] = l[token] / t - m - logf(total);
}
