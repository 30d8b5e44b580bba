// The learner's RMSNorm and bias gradients (policy/src/norm.rs), in f32 arithmetic over f32 or
// bf16 tensors of rows of n values:
//   kevin_rms_fwd:  r = rsqrt(mean(x^2) + eps) per row; y = rnd(rnd(x * r) * w), rounded as
//                   transformers' RMSNorm rounds (the normalised row cast to T, then scaled in T);
//   kevin_rms_bwd:  dx = r * (dy * w) - x * r^3 * mean((dy * w) * x), and dw += the column sums
//                   of dy * rnd(x * r) (f32 atomics into a zeroed [n]);
//   kevin_col_sum:  out += the column sums of dy (a bias's gradient; f32 atomics, zeroed [n]).

#define NORM_THREADS 256
#define NORM_ROWS 16

struct NormArgs {
    long long rows, n;
    float eps;
};

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

template <typename T>
__device__ void rms_fwd(const T* x, const T* w, T* y, float* r, NormArgs a) {
    __shared__ float red[NORM_THREADS / 32];
    long long row = blockIdx.x, n = a.n, off = row * n;
    float ss = 0.0f;
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS) {
        float v = ld(x, off + j);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / (float)n + a.eps);
    if (threadIdx.x == 0) r[row] = inv;
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS)
        st(y, off + j, rnd<T>(ld(x, off + j) * inv) * ld(w, j));
}

// A block per NORM_ROWS rows; each thread keeps its columns' dw sums in shared memory (n floats).
template <typename T>
__device__ void rms_bwd(const T* x, const T* w, const float* r, const T* dy, T* dx, float* dw,
                        NormArgs a) {
    __shared__ float red[NORM_THREADS / 32];
    extern __shared__ float acc[];
    long long n = a.n;
    for (long long j = threadIdx.x; j < n; j += NORM_THREADS) acc[j] = 0.0f;
    long long first = (long long)blockIdx.x * NORM_ROWS;
    long long last = min(first + NORM_ROWS, a.rows);
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

// Blocks of NORM_THREADS columns by NORM_ROWS * 16 rows.
template <typename T> __device__ void col_sum(const T* dy, float* out, NormArgs a) {
    long long j = (long long)blockIdx.x * NORM_THREADS + threadIdx.x;
    if (j >= a.n) return;
    long long first = (long long)blockIdx.y * NORM_ROWS * 16;
    long long last = min(first + NORM_ROWS * 16, a.rows);
    float s = 0.0f;
    for (long long row = first; row < last; row++) s += ld(dy, row * a.n + j);
    atomicAdd(out + j, s);
}

#define KEVIN_NORM(T, S)                                                                        \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_rms_fwd_##S(const T* x, const T* w, T* y, float* r, NormArgs a) {                 \
        rms_fwd<T>(x, w, y, r, a);                                                              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_rms_bwd_##S(const T* x, const T* w, const float* r, const T* dy, T* dx,           \
                          float* dw, NormArgs a) {                                              \
        rms_bwd<T>(x, w, r, dy, dx, dw, a);                                                     \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(NORM_THREADS)                                  \
        kevin_col_sum_##S(const T* dy, float* out, NormArgs a) {                                \
        col_sum<T>(dy, out, a);                                                                 \
    }

#ifndef KEVIN_SELECTED
KEVIN_NORM(float, f32)
KEVIN_NORM(bf16, bf16)
#endif
