// kevin's GPU harness kernels: trusted code that generates trial inputs, fills outputs with
// their NaN patterns, masks references with a per-trial secret, checks inputs against the
// generator, and compares.
// Compiled once per environment with NVRTC; loaded by every `kevin worker --role cuda`.
//
// Masking: a reference stays in device memory XORed with a key stream h(key, i) whose 64-bit key
// exists only on the host and in the parameters of these kernels, so a candidate scanning device
// memory finds bytes it cannot decode. h must equal
// `kevin::gpu::mask::stream` bit for bit.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ u64 kv_mix(u64 z) {
    z ^= z >> 33; z *= 0xff51afd7ed558ccdULL;
    z ^= z >> 33; z *= 0xc4ceb9fe1a85ec53ULL;
    z ^= z >> 33;
    return z;
}
__device__ __forceinline__ u64 kv_stream(u64 key, u64 i) {
    return kv_mix(key ^ (i * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL));
}

// Element access as bits of the element's width.
template <int W> struct Bits;
template <> struct Bits<2> { typedef u16 T; };
template <> struct Bits<4> { typedef u32 T; };
template <> struct Bits<8> { typedef u64 T; };

template <int W>
__device__ void mask_impl(void* p, u64 n, u64 key) {
    typedef typename Bits<W>::T B;
    B* q = (B*)p;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        q[i] ^= (B)kv_stream(key, i);
}
extern "C" __global__ void kevin_mask2(void* p, u64 n, u64 key) { mask_impl<2>(p, n, key); }
extern "C" __global__ void kevin_mask4(void* p, u64 n, u64 key) { mask_impl<4>(p, n, key); }
extern "C" __global__ void kevin_mask8(void* p, u64 n, u64 key) { mask_impl<8>(p, n, key); }

// Inputs: kind 0 normal(a = mean, b = std), 1 uniform[a, b), 2 positive a + |N(0, b)|, 3 grid
// a + b * k with k uniform in 0 .. c - 1, 4 uniform[a, b) times one factor uniform in [0, 1) per
// tensor (drawn at index 2^64 - 1, which no element has), 5 / 6 / 7 uniform[a, b) in c x c
// matrices, zero below / above the diagonal, or symmetric (below it, the mirrored element's
// draw); dtype 0 f32, 1 f16, 2 bf16, 3 i64 (the draw rounded to the nearest integer, ties to
// even, as the CPU generator rounds an i64 input).
// Counter-based: element i depends only on (seed, i).
__device__ __forceinline__ float kv_unit(u64 bits) {  // in [0, 1)
    return (float)(bits >> 40) * (1.0f / 16777216.0f);
}
// One 64-bit draw per element: its top 24 bits are u1, bits 16..39 u2. Box-Muller with the fast
// intrinsics: the accurate logf and cospif cost twice the whole draw (a 64M-element normal input
// took 298 us with them, 148 us without, on an H200; writing it takes 68 us), and this runs ~30
// times per candidate (inputs, references, input checks, timing sets). The intrinsics' absolute
// error (~2^-21) moves a value by < 1e-3 at worst; the clamp keeps -2 log(u1) >= 0 for u1 near 1,
// and the cosine's argument stays in [-pi, pi), where __cosf is accurate.
__device__ __forceinline__ float kv_draw(u64 seed, u64 i, int kind, float a, float b, float c) {
    u64 r = kv_stream(seed, i);
    if (kind == 1) return a + (b - a) * kv_unit(r);
    if (kind == 3) return a + b * fminf(floorf(kv_unit(r) * c), c - 1.0f);
    if (kind == 4) return (a + (b - a) * kv_unit(r)) * kv_unit(kv_stream(seed, ~0ULL));
    if (kind >= 5) {  // the c x c matrices of the last two axes: upper, lower, symmetric
        u64 n = (u64)c, col = i % n, row = (i / n) % n;
        if (kind == 5 && col < row) return 0.0f;
        if (kind == 6 && col > row) return 0.0f;
        if (kind == 7 && col < row) r = kv_stream(seed, i - row * n - col + col * n + row);
        return a + (b - a) * kv_unit(r);
    }
    float u1 = 1.0f - kv_unit(r);  // (0, 1]
    float u2 = (float)((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
    float z = sqrtf(fmaxf(-2.0f * __logf(u1), 0.0f)) * __cosf(6.28318530718f * u2);
    return kind == 0 ? a + b * z : a + b * fabsf(z);
}
extern "C" __global__ void kevin_generate(void* out, u64 n, u64 seed, int kind, float a, float b, float c,
                                          int dtype) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float v = kv_draw(seed, i, kind, a, b, c);
        if (dtype == 0) ((float*)out)[i] = v;
        else if (dtype == 1) ((__half*)out)[i] = __float2half_rn(v);
        else if (dtype == 3) ((long long*)out)[i] = (long long)rintf(v);
        else ((__nv_bfloat16*)out)[i] = __float2bfloat16_rn(v);
    }
}

// The value kevin_generate stores, rounded to dtype, as its bits (zero-extended).
__device__ __forceinline__ u64 kv_generated_bits(float v, int dtype) {
    if (dtype == 0) return __float_as_uint(v);
    if (dtype == 1) return __half_as_ushort(__float2half_rn(v));
    if (dtype == 3) return (u64)(long long)rintf(v);
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ double kv_generated_value(float v, int dtype) {
    if (dtype == 0) return (double)v;
    if (dtype == 1) return (double)__half2float(__float2half_rn(v));
    return (double)__bfloat162float(__float2bfloat16_rn(v));
}

// kevin_generate's elements offset .. offset + n as the fp64 reference plan stores them: a float
// dtype's rounded value as f64 (the same values as kevin_generate + kevin_widen, without a
// task-dtype copy); an i64 (dtype 3) as itself, since the reference plan keeps i64 buffers i64.
extern "C" __global__ void kevin_generate_wide(double* out, u64 n, u64 offset, u64 seed, int kind, float a, float b,
                                               float c, int dtype) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float v = kv_draw(seed, offset + i, kind, a, b, c);
        if (dtype == 3)
            ((u64*)out)[i] = kv_generated_bits(v, dtype);
        else
            out[i] = kv_generated_value(v, dtype);
    }
}

// first[0] = smallest index i where input p differs from what kevin_generate wrote there (an input
// the candidate modified): the input check without a copy of the input.
extern "C" __global__ void kevin_regen_diff(const void* p, u64 n, u64 seed, int kind, float a, float b, float c,
                                            int dtype, u64* first) {
    u64 mine = ~0ULL;  // one atomic per thread, not per changed element
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 want = kv_generated_bits(kv_draw(seed, i, kind, a, b, c), dtype);
        u64 got = dtype == 3   ? ((const u64*)p)[i]
                  : dtype == 0 ? (u64)((const u32*)p)[i]
                               : (u64)((const u16*)p)[i];
        if (got != want) { mine = i; break; }
    }
    if (mine != ~0ULL) atomicMin(first, mine);
}

// f64 -> f32 (round to nearest), masked with the key stream of `key` (as kevin_mask4 would): a
// float output's reference kept in 4 bytes, not 8 (the rounding, 2^-24 relative, is far below
// every task's tolerance), never stored unmasked.
extern "C" __global__ void kevin_narrow(const double* src, u32* dst, u64 n, u64 key) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        dst[i] = __float_as_uint((float)src[i]) ^ (u32)kv_stream(key, i);
}

extern "C" __global__ void kevin_fill64(u64* p, u64 n, u64 v) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        p[i] = v;
}

// Compare an output with its masked reference: the rule of kevin::verify::correctness::judge.
// dtype codes: 0 f32, 1 f16, 2 bf16, 3 i64, 4 f64 (the fp64 reference of a float output).
// stats[0] = failures, stats[1] = first failing index (init ~0), stats[2] = max error ratio of
// the passing finite elements as float bits (non-negative floats order like their bits).
__device__ __forceinline__ double kv_value(const void* p, u64 i, int dtype, u64 key, bool masked, u64* raw) {
    if (dtype == 0) {
        u32 b = ((const u32*)p)[i]; if (masked) b ^= (u32)kv_stream(key, i);
        *raw = b; return (double)__uint_as_float(b);
    } else if (dtype == 1) {
        u16 b = ((const u16*)p)[i]; if (masked) b ^= (u16)kv_stream(key, i);
        *raw = b; return (double)__half2float(__ushort_as_half(b));
    } else if (dtype == 2) {
        u16 b = ((const u16*)p)[i]; if (masked) b ^= (u16)kv_stream(key, i);
        *raw = b; return (double)__uint_as_float(((u32)b) << 16);
    } else if (dtype == 3) {
        u64 b = ((const u64*)p)[i]; if (masked) b ^= kv_stream(key, i);
        *raw = b; return (double)(long long)b;
    } else {
        u64 b = ((const u64*)p)[i]; if (masked) b ^= kv_stream(key, i);
        *raw = b; return __longlong_as_double((long long)b);
    }
}
extern "C" __global__ void kevin_compare(const void* got, const void* want_masked, u64 n, int dtype, int want_dtype,
                                         u64 key, u64 fill, double atol, double rtol, u64* stats) {
    // Counted per thread and reduced per warp: one atomic per warp, not one per element (every
    // element of a correct float output has a small non-zero error, and 64M atomics on one
    // address serialise in L2). Launched with whole warps (blockDim a multiple of 32).
    u64 failures = 0, first = ~0ULL;
    u32 worst = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 graw, wraw;
        double g = kv_value(got, i, dtype, 0, false, &graw);
        double w = kv_value(want_masked, i, want_dtype, key, true, &wraw);
        bool fail;
        float ratio = 0.0f;
        if (graw == fill) fail = true;
        else if (dtype == 3) fail = graw != wraw;
        else if (isnan(w)) fail = !isnan(g);
        else if (isinf(w)) fail = g != w;
        else if (!isfinite(g)) fail = true;
        else {
            double err = fabs(g - w), bound = atol + rtol * fabs(w);
            fail = err > bound;
            if (!fail && err > 0.0) ratio = (float)(err / bound);
        }
        if (fail) {
            failures += 1;
            if (i < first) first = i;
        } else if (ratio > 0.0f) {
            // Positive floats order as their bit patterns.
            u32 bits = __float_as_uint(ratio);
            if (bits > worst) worst = bits;
        }
    }
    for (int lane = 16; lane > 0; lane >>= 1) {
        failures += __shfl_xor_sync(0xffffffffu, failures, lane);
        u64 f = __shfl_xor_sync(0xffffffffu, first, lane);
        if (f < first) first = f;
        u32 r = __shfl_xor_sync(0xffffffffu, worst, lane);
        if (r > worst) worst = r;
    }
    if ((threadIdx.x & 31) == 0) {
        if (failures) {
            atomicAdd(&stats[0], failures);
            atomicMin(&stats[1], first);
        }
        if (worst) atomicMax((u32*)&stats[2], worst);
    }
}

// Widens a tensor to f64 (the reference computes on exact copies of the candidate's inputs).
extern "C" __global__ void kevin_widen(const void* src, double* dst, u64 n, int dtype) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 raw;
        dst[i] = kv_value(src, i, dtype, 0, false, &raw);
    }
}

// Fills the shared memory of every SM with 0xff bytes (NaN as float, -1 as int) before a verified
// run, so a kernel that reads shared memory before writing it gets garbage, not whatever an
// earlier kernel left (often zeros, which can pass by luck). Launched with one block per SM and
// all the shared memory a block may have.
extern "C" __global__ void kevin_scribble_smem(u32 words) {
    extern __shared__ u32 kv_smem[];
    for (u32 i = threadIdx.x; i < words; i += blockDim.x) kv_smem[i] = 0xffffffffu;
}
