// The log-probabilities of chosen tokens for the learner (policy/src/logprob.rs): a softmax over
// the vocabulary per selected row of the logits, in f32 arithmetic, without the [N, V]
// intermediates of the tensor-op version (a copy in f32, shifted, exponentiated).
//   x [M, V] (f32 or bf16, rows packed), rows [N] and targets [N] (i32; rows distinct).
//   fwd  lse[n] = log sum_v exp(x[rows[n], v]) and logp[n] = x[rows[n], targets[n]] - lse[n]
//        (f32; NaN for a target outside 0..V)
//   bwd  dx[rows[n], v] = g[n] * ((v == targets[n]) - exp(x[rows[n], v] - lse[n])), in x's
//        type; rows not selected are left as they are (the caller zeroes dx)
// One block of LP_THREADS threads per selected row.
// (policy/src/cuda/prelude.cuh comes first: ld, st, warp_sum.)

#define LP_THREADS 512
#define LP_NEG_INF __int_as_float(0xff800000)

// (m, s) with s = sum exp(x - m), joined with (m2, s2).
__device__ __forceinline__ void lp_join(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    if (mn == LP_NEG_INF) return;
    s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
    m = mn;
}

template <typename T>
__device__ void lp_fwd(const T* x, const int* rows, const int* targets, float* logp, float* lse,
                       int v) {
    __shared__ float sm[LP_THREADS / 32], ss[LP_THREADS / 32];
    int n = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const T* row = x + (long long)rows[n] * v;
    float m = LP_NEG_INF, s = 0.0f;
    for (int i = threadIdx.x; i < v; i += LP_THREADS) lp_join(m, s, ld(row, i), 1.0f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lp_join(m, s, m2, s2);
    }
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < LP_THREADS / 32; w++) lp_join(m, s, sm[w], ss[w]);
        float l = m + logf(s);
        int tg = targets[n];
        lse[n] = l;
        logp[n] = tg >= 0 && tg < v ? ld(row, tg) - l : __int_as_float(0x7fc00000);
    }
}

template <typename T>
__device__ void lp_bwd(const T* x, const int* rows, const int* targets, const float* lse,
                       const float* g, T* dx, int v) {
    int n = blockIdx.x, tg = targets[n];
    long long off = (long long)rows[n] * v;
    float l = lse[n], gn = g[n];
    for (int i = threadIdx.x; i < v; i += LP_THREADS)
        st(dx, off + i, gn * ((i == tg ? 1.0f : 0.0f) - __expf(ld(x, off + i) - l)));
}

#define KEVIN_LOGPROB(T, S)                                                                     \
    extern "C" __global__ void __launch_bounds__(LP_THREADS)                                    \
        kevin_lp_fwd_##S(const T* x, const int* rows, const int* targets, float* logp,          \
                         float* lse, int v) {                                                   \
        lp_fwd<T>(x, rows, targets, logp, lse, v);                                              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(LP_THREADS)                                    \
        kevin_lp_bwd_##S(const T* x, const int* rows, const int* targets, const float* lse,     \
                         const float* g, T* dx, int v) {                                        \
        lp_bwd<T>(x, rows, targets, lse, g, dx, v);                                             \
    }

KEVIN_LOGPROB(float, f32)
KEVIN_LOGPROB(bf16, bf16)
