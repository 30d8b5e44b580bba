// kevin's eager baseline kernels: one trusted kernel per operator of the op language, launched op
// by op as PyTorch eager launches them (src/baseline/mod.rs says how a program becomes launches).
//
// Conventions (src/baseline/launch.rs builds the launches and must agree):
// - every kernel is extern "C", named <op>[_<variant>]_<dtype> with dtype f32, f16, bf16 or f64;
// - element counts and extents are long long, flags int, scalar parameters the opmath type;
// - f32/f16/bf16 (the timing baseline): every value is loaded into float, computed in float
//   (PyTorch's "opmath") and rounded once, to nearest even, when stored; NaN propagates as in
//   PyTorch: max/min/maximum/minimum/clamp/relu keep a NaN, argmax/argmin pick the first NaN;
// - f64 (the correctness reference): buffers hold double and everything is computed in double,
//   with the definitions of the fp64 interpreter (src/ops/kernels.rs), NaN rules included: its
//   max/min ignore a NaN (Rust's f64::max, C's fmax), its argmax keeps a NaN only at index 0;
// - contiguous kernels use 16-byte vector accesses when their pointers are 16-byte aligned (a
//   uniform check at run time) and scalar accesses otherwise, so any alignment is correct;
// - elementwise kernels loop grid-stride; row kernels loop over rows, column kernels over blocks
//   of 32 columns, so any grid is correct and the launch only decides speed.
// The same text compiles with NVRTC (sm_90) and with g++ against kevin's CPU device model.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef long long i64;
#define KB_D __device__ __forceinline__
#define KB_INF __int_as_float(0x7f800000)
#define KB_FULL 0xffffffffu

namespace kb {

// ---------------------------------------------------------------------------------------------
// The opmath type, element conversions and 16-byte packs.

// What an element of T is computed in: float, except double for double.
template <class T>
struct Opmath {
    typedef float type;
};
template <>
struct Opmath<double> {
    typedef double type;
};
template <class T>
using op_t = typename Opmath<T>::type;

KB_D float to_op(float x) { return x; }
KB_D float to_op(__half x) { return __half2float(x); }
KB_D float to_op(__nv_bfloat16 x) { return __bfloat162float(x); }
KB_D double to_op(double x) { return x; }

template <class T>
KB_D T from_op(op_t<T> v);
template <>
KB_D float from_op<float>(float v) { return v; }
template <>
KB_D __half from_op<__half>(float v) { return __float2half_rn(v); }
template <>
KB_D __nv_bfloat16 from_op<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
KB_D double from_op<double>(double v) { return v; }

// Stores a reduction's result: floats are rounded to the element type, indices stored as is.
template <class O, class A>
KB_D void put(O* p, A v) { *p = from_op<O>(v); }
KB_D void put(i64* p, i64 v) { *p = v; }

template <class T>
struct __align__(16) Pack {
    T v[16 / sizeof(T)];
};

KB_D bool aligned16(const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0; }
KB_D i64 gtid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
KB_D i64 gstride() { return (i64)gridDim.x * blockDim.x; }

// The math functions the generic code calls, in each opmath type.
KB_D float m_exp(float x) { return expf(x); }
KB_D double m_exp(double x) { return exp(x); }
KB_D float m_log(float x) { return logf(x); }
KB_D double m_log(double x) { return log(x); }
KB_D float m_sqrt(float x) { return sqrtf(x); }
KB_D double m_sqrt(double x) { return sqrt(x); }
// The interpreter's 1 / sqrt(x), not the approximate double rsqrt.
KB_D float m_rsqrt(float x) { return rsqrtf(x); }
KB_D double m_rsqrt(double x) { return 1.0 / sqrt(x); }
KB_D float m_fmax(float a, float b) { return fmaxf(a, b); }
KB_D double m_fmax(double a, double b) { return fmax(a, b); }

// PyTorch's max/min with NaN propagation.
KB_D float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }
KB_D float nan_min(float a, float b) { return (a != a || a < b) ? a : b; }
// std::max / std::min as c10 uses them (a NaN in `a` survives); Rust's clamp keeps a NaN too.
template <class A>
KB_D A std_max(A a, A b) { return a < b ? b : a; }
template <class A>
KB_D A std_min(A a, A b) { return b < a ? b : a; }
// max / min of a reduction: PyTorch's (NaN wins) in float, the interpreter's (NaN loses) in double.
KB_D float red_max(float a, float b) { return nan_max(a, b); }
KB_D double red_max(double a, double b) { return fmax(a, b); }
KB_D float red_min(float a, float b) { return nan_min(a, b); }
KB_D double red_min(double a, double b) { return fmin(a, b); }

// ---------------------------------------------------------------------------------------------
// Elementwise functions (p0, p1: the op's scalar parameters, unused by most). The float overload
// is PyTorch's kernel; the double overload is the interpreter's definition (src/ops/kernels.rs),
// in the same order of operations.

// The interpreter's numerically stable sigmoid and softplus (no threshold).
KB_D double sigmoid_d(double x) {
    if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}
KB_D double softplus_d(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }

struct Relu {
    KB_D float operator()(float x, float, float) const { return (x > 0.f || x != x) ? x : 0.f; }
    KB_D double operator()(double x, double, double) const { return fmax(x, 0.0); }
};
struct Gelu {
    KB_D float operator()(float x, float, float) const { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
    KB_D double operator()(double x, double, double) const { return 0.5 * x * (1.0 + erf(x / 1.4142135623730951)); }
};
struct GeluTanh {
    KB_D float operator()(float x, float, float) const {
        const float c = 0.79788456080286536f;  // sqrt(2 / pi)
        return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
    KB_D double operator()(double x, double, double) const {
        const double c = sqrt(2.0 / 3.141592653589793);
        return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
    }
};
struct Silu {
    KB_D float operator()(float x, float, float) const { return x / (1.f + expf(-x)); }
    KB_D double operator()(double x, double, double) const { return x * sigmoid_d(x); }
};
struct Sigmoid {
    KB_D float operator()(float x, float, float) const { return 1.f / (1.f + expf(-x)); }
    KB_D double operator()(double x, double, double) const { return sigmoid_d(x); }
};
struct Tanh {
    KB_D float operator()(float x, float, float) const { return tanhf(x); }
    KB_D double operator()(double x, double, double) const { return tanh(x); }
};
struct Exp {
    template <class A>
    KB_D A operator()(A x, A, A) const { return m_exp(x); }
};
struct Log {
    template <class A>
    KB_D A operator()(A x, A, A) const { return m_log(x); }
};
struct Abs {
    KB_D float operator()(float x, float, float) const { return fabsf(x); }
    KB_D double operator()(double x, double, double) const { return fabs(x); }
};
struct Neg {
    template <class A>
    KB_D A operator()(A x, A, A) const { return -x; }
};
struct Sqrt {
    template <class A>
    KB_D A operator()(A x, A, A) const { return m_sqrt(x); }
};
struct Rsqrt {
    template <class A>
    KB_D A operator()(A x, A, A) const { return m_rsqrt(x); }
};
struct Square {
    template <class A>
    KB_D A operator()(A x, A, A) const { return x * x; }
};
// PyTorch's softplus with beta = 1, threshold = 20; the interpreter's has no threshold.
struct Softplus {
    KB_D float operator()(float x, float, float) const { return x > 20.f ? x : log1pf(expf(x)); }
    KB_D double operator()(double x, double, double) const { return softplus_d(x); }
};
struct Mish {
    KB_D float operator()(float x, float, float) const { return x * tanhf(log1pf(expf(x))); }
    KB_D double operator()(double x, double, double) const { return x * tanh(softplus_d(x)); }
};
struct Hardsigmoid {
    template <class A>
    KB_D A operator()(A x, A, A) const { return std_min<A>(std_max<A>(x + (A)3, (A)0), (A)6) / (A)6; }
};
struct Hardswish {
    template <class A>
    KB_D A operator()(A x, A, A) const { return x * std_min<A>(std_max<A>(x + (A)3, (A)0), (A)6) / (A)6; }
};
struct LeakyRelu {
    template <class A>
    KB_D A operator()(A x, A slope, A) const { return x > (A)0 ? x : x * slope; }
};
struct Elu {
    KB_D float operator()(float x, float alpha, float) const { return x > 0.f ? x : alpha * expm1f(x); }
    KB_D double operator()(double x, double alpha, double) const { return x > 0.0 ? x : alpha * expm1(x); }
};
// The interpreter's clamp is x.max(lo).min(hi): a NaN becomes lo.
struct Clamp {
    KB_D float operator()(float x, float lo, float hi) const { return x != x ? x : fminf(fmaxf(x, lo), hi); }
    KB_D double operator()(double x, double lo, double hi) const { return fmin(fmax(x, lo), hi); }
};
// Steps of PyTorch's composites: F.normalize's clamp_min, `s / x`'s reciprocal, logsumexp's
// masked_fill_(abs(max) == inf, 0).
struct ClampMin {
    KB_D float operator()(float x, float lo, float) const { return x != x ? x : fmaxf(x, lo); }
    KB_D double operator()(double x, double lo, double) const { return fmax(x, lo); }
};
struct Reciprocal {
    template <class A>
    KB_D A operator()(A x, A, A) const { return (A)1 / x; }
};
struct InfToZero {
    KB_D float operator()(float x, float, float) const { return fabsf(x) == KB_INF ? 0.f : x; }
    KB_D double operator()(double x, double, double) const { return fabs(x) == (double)KB_INF ? 0.0 : x; }
};

template <class T, class F>
KB_D void unary(const T* __restrict__ x, T* __restrict__ y, i64 n, op_t<T> p0, op_t<T> p1) {
    constexpr int V = 16 / sizeof(T);
    F f;
    i64 start = gtid(), stride = gstride(), tail = 0;
    if (aligned16(x) && aligned16(y)) {
        i64 nv = n / V;
        const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
        Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
        for (i64 i = start; i < nv; i += stride) {
            Pack<T> a = xp[i], r;
#pragma unroll
            for (int j = 0; j < V; ++j) r.v[j] = from_op<T>(f(to_op(a.v[j]), p0, p1));
            yp[i] = r;
        }
        tail = nv * V;
    }
    for (i64 i = tail + start; i < n; i += stride) y[i] = from_op<T>(f(to_op(x[i]), p0, p1));
}

// ---------------------------------------------------------------------------------------------
// Binary operators: same shape (vectorised), tensor and scalar, and broadcasting by strides.

struct Add {
    template <class A>
    KB_D A operator()(A a, A b) const { return a + b; }
};
struct Sub {
    template <class A>
    KB_D A operator()(A a, A b) const { return a - b; }
};
struct Mul {
    template <class A>
    KB_D A operator()(A a, A b) const { return a * b; }
};
struct Div {
    template <class A>
    KB_D A operator()(A a, A b) const { return a / b; }
};
// PyTorch's maximum / minimum propagate a NaN; the interpreter's (f64::max / min) drop it.
struct Maximum {
    KB_D float operator()(float a, float b) const { return a != a ? a : (b != b ? b : fmaxf(a, b)); }
    KB_D double operator()(double a, double b) const { return fmax(a, b); }
};
struct Minimum {
    KB_D float operator()(float a, float b) const { return a != a ? a : (b != b ? b : fminf(a, b)); }
    KB_D double operator()(double a, double b) const { return fmin(a, b); }
};
struct Pow {
    KB_D float operator()(float a, float b) const { return powf(a, b); }
    KB_D double operator()(double a, double b) const { return pow(a, b); }
};

template <class T, class F>
KB_D void binary(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, i64 n) {
    constexpr int V = 16 / sizeof(T);
    F f;
    i64 start = gtid(), stride = gstride(), tail = 0;
    if (aligned16(a) && aligned16(b) && aligned16(y)) {
        i64 nv = n / V;
        const Pack<T>* ap = reinterpret_cast<const Pack<T>*>(a);
        const Pack<T>* bp = reinterpret_cast<const Pack<T>*>(b);
        Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
        for (i64 i = start; i < nv; i += stride) {
            Pack<T> u = ap[i], w = bp[i], r;
#pragma unroll
            for (int j = 0; j < V; ++j) r.v[j] = from_op<T>(f(to_op(u.v[j]), to_op(w.v[j])));
            yp[i] = r;
        }
        tail = nv * V;
    }
    for (i64 i = tail + start; i < n; i += stride) y[i] = from_op<T>(f(to_op(a[i]), to_op(b[i])));
}

// y = f(a, s), or f(s, a) when `scalar_first`.
template <class T, class F, bool FIRST>
KB_D void binary_scalar_impl(const T* __restrict__ a, op_t<T> s, T* __restrict__ y, i64 n) {
    constexpr int V = 16 / sizeof(T);
    F f;
    i64 start = gtid(), stride = gstride(), tail = 0;
    if (aligned16(a) && aligned16(y)) {
        i64 nv = n / V;
        const Pack<T>* ap = reinterpret_cast<const Pack<T>*>(a);
        Pack<T>* yp = reinterpret_cast<Pack<T>*>(y);
        for (i64 i = start; i < nv; i += stride) {
            Pack<T> u = ap[i], r;
#pragma unroll
            for (int j = 0; j < V; ++j) r.v[j] = from_op<T>(FIRST ? f(s, to_op(u.v[j])) : f(to_op(u.v[j]), s));
            yp[i] = r;
        }
        tail = nv * V;
    }
    for (i64 i = tail + start; i < n; i += stride) y[i] = from_op<T>(FIRST ? f(s, to_op(a[i])) : f(to_op(a[i]), s));
}

template <class F>
struct ScalarOp {
    template <class T>
    static KB_D void run(const T* a, op_t<T> s, T* y, i64 n, int scalar_first) {
        if (scalar_first) binary_scalar_impl<T, F, true>(a, s, y, n);
        else binary_scalar_impl<T, F, false>(a, s, y, n);
    }
};

// x ** s as PyTorch's pow with a scalar exponent computes it: 1 for 0 and x for 1 (a fill and a
// copy there), x*x for 2, x*x*x for 3, 1/(x*x) for -2, sqrt, rsqrt and the reciprocal for 0.5,
// -0.5 and -1 (kernels of their own there), pow otherwise; s ** x is pow.
struct PowOne {
    template <class A>
    KB_D A operator()(A, A) const { return (A)1; }
};
struct PowIdentity {
    template <class A>
    KB_D A operator()(A a, A) const { return a; }
};
struct PowSquare {
    template <class A>
    KB_D A operator()(A a, A) const { return a * a; }
};
struct PowCube {
    template <class A>
    KB_D A operator()(A a, A) const { return a * a * a; }
};
struct PowInvSquare {
    template <class A>
    KB_D A operator()(A a, A) const { return (A)1 / (a * a); }
};
struct PowSqrt {
    template <class A>
    KB_D A operator()(A a, A) const { return m_sqrt(a); }
};
struct PowRsqrt {
    KB_D float operator()(float a, float) const { return rsqrtf(a); }
    KB_D double operator()(double a, double) const { return 1.0 / sqrt(a); }
};
struct PowRecip {
    template <class A>
    KB_D A operator()(A a, A) const { return (A)1 / a; }
};
template <>
struct ScalarOp<Pow> {
    template <class T>
    static KB_D void run(const T* a, op_t<T> s, T* y, i64 n, int scalar_first) {
        if (scalar_first) binary_scalar_impl<T, Pow, true>(a, s, y, n);
        else if (s == 0) binary_scalar_impl<T, PowOne, false>(a, s, y, n);
        else if (s == 1) binary_scalar_impl<T, PowIdentity, false>(a, s, y, n);
        else if (s == 2) binary_scalar_impl<T, PowSquare, false>(a, s, y, n);
        else if (s == 3) binary_scalar_impl<T, PowCube, false>(a, s, y, n);
        else if (s == -2) binary_scalar_impl<T, PowInvSquare, false>(a, s, y, n);
        else if (s == (op_t<T>)0.5) binary_scalar_impl<T, PowSqrt, false>(a, s, y, n);
        else if (s == (op_t<T>)-0.5) binary_scalar_impl<T, PowRsqrt, false>(a, s, y, n);
        else if (s == -1) binary_scalar_impl<T, PowRecip, false>(a, s, y, n);
        else binary_scalar_impl<T, Pow, false>(a, s, y, n);
    }
};

template <class T, class F>
KB_D void binary_scalar(const T* a, op_t<T> s, T* y, i64 n, int scalar_first) {
    ScalarOp<F>::template run<T>(a, s, y, n, scalar_first);
}

// Strided access, as PyTorch's TensorIterator does it for broadcasts and non-contiguous copies:
// the output is contiguous with extents size[0..nd) (innermost last); operand element strides
// are 0 along broadcast dimensions; the launch merges dimensions first and computes, per
// dimension, the magic number of a division by its extent (Granlund-Montgomery: for n < 2^31,
// n / d = (umulhi(n, magic) + n) >> shift). Blocks of 128 threads, 2 elements per thread, one
// element at a time: PyTorch's elementwise_kernel<128, 2>.
#define KB_MAXD 6
struct Strided {
    i64 size[KB_MAXD], magic[KB_MAXD], sa[KB_MAXD], sb[KB_MAXD];  // magic: m | shift << 32
    int nd;
};

// Element offsets into a and b of output element i (I: 32-bit with magic division, or 64-bit).
template <class I>
KB_D void offsets(I i, const Strided& d, I& oa, I& ob) {
    I rem = i;
    oa = 0;
    ob = 0;
#pragma unroll
    for (int k = KB_MAXD - 1; k >= 0; --k) {
        if (k < d.nd) {
            I q;
            if (sizeof(I) == 4) {
                unsigned m = (unsigned)d.magic[k], sh = (unsigned)(d.magic[k] >> 32);
                q = (I)((__umulhi((unsigned)rem, m) + (unsigned)rem) >> sh);
            } else {
                q = rem / (I)d.size[k];
            }
            I idx = rem - q * (I)d.size[k];
            rem = q;
            oa += idx * (I)d.sa[k];
            ob += idx * (I)d.sb[k];
        }
    }
}

template <class T, class F, class I>
KB_D void bcast_loop(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, I n, const Strided& d) {
    F f;
    for (I base = (I)blockIdx.x * 256; base < n; base += (I)gridDim.x * 256) {
        I i0 = base + threadIdx.x, i1 = i0 + 128, a0 = 0, b0 = 0, a1 = 0, b1 = 0;
        if (i0 < n) offsets<I>(i0, d, a0, b0);
        if (i1 < n) offsets<I>(i1, d, a1, b1);
        if (i0 < n) y[i0] = from_op<T>(f(to_op(a[a0]), to_op(b[b0])));
        if (i1 < n) y[i1] = from_op<T>(f(to_op(a[a1]), to_op(b[b1])));
    }
}

template <class T, class F>
KB_D void bcast(const T* a, const T* b, T* y, i64 n, const Strided& d) {
    if (n < 0x7fffffffll) bcast_loop<T, F, unsigned>(a, b, y, (unsigned)n, d);
    else bcast_loop<T, F, unsigned long long>(a, b, y, (unsigned long long)n, d);
}

// y = x read through strides `sa` (a transpose made contiguous, as `.contiguous()` copies it).
template <class T, class I>
KB_D void strided_copy_loop(const T* __restrict__ x, T* __restrict__ y, I n, const Strided& d) {
    for (I base = (I)blockIdx.x * 256; base < n; base += (I)gridDim.x * 256) {
        I i0 = base + threadIdx.x, i1 = i0 + 128, o0 = 0, o1 = 0, unused;
        if (i0 < n) offsets<I>(i0, d, o0, unused);
        if (i1 < n) offsets<I>(i1, d, o1, unused);
        if (i0 < n) y[i0] = x[o0];
        if (i1 < n) y[i1] = x[o1];
    }
}

// n / d: by the magic number `m` of `d` (launch.rs's div_magic) in 32 bits, else dividing.
template <class I>
KB_D I div_by(I n, I d, i64 m) {
    if (sizeof(I) == 4) {
        unsigned mg = (unsigned)m, sh = (unsigned)(m >> 32);
        return (I)((__umulhi((unsigned)n, mg) + (unsigned)n) >> sh);
    }
    return n / d;
}

// f(i) for every i < n, as PyTorch's index kernels (flip, gather) launch: 128 threads, each
// 4 elements 128 apart, a block 512 elements.
template <class I, class F>
KB_D void each_4x128(I n, F f) {
    for (I base = (I)blockIdx.x * 512 + threadIdx.x; base < n; base += (I)gridDim.x * 512) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (base + k * 128 < n) f(base + k * 128);
    }
}

// flip: y[i] = x at i with its coordinate a along the axis (`extent` long, `inner` elements
// after it) replaced by extent - 1 - a.
template <class T, class I>
KB_D void flip_loop(const T* __restrict__ x, T* __restrict__ y, I n, I inner, I extent,
                    i64 m_inner, i64 m_extent) {
    each_4x128<I>(n, [&](I i) {
        I q = div_by<I>(i, inner, m_inner);
        I a = q - div_by<I>(q, extent, m_extent) * extent;
        y[i] = x[i - a * inner + (extent - 1 - a) * inner];
    });
}

template <class T>
KB_D void flip(const T* x, T* y, i64 n, i64 inner, i64 extent, i64 m_inner, i64 m_extent) {
    if (n < 0x7fffffffll)
        flip_loop<T, unsigned>(x, y, (unsigned)n, (unsigned)inner, (unsigned)extent, m_inner, m_extent);
    else
        flip_loop<T, unsigned long long>(x, y, (unsigned long long)n, (unsigned long long)inner,
                                         (unsigned long long)extent, 0, 0);
}

// gather along an axis: y[i] = x with i's coordinate a along the axis (`ka` long in the index,
// `kx` in x, `inner` elements after it) replaced by idx[i]; NaN for an index outside 0 .. kx
// (PyTorch stops at a device assertion).
template <class T>
KB_D void gather(const T* __restrict__ x, const long long* __restrict__ idx, T* __restrict__ y, i64 n, i64 ka,
                 i64 kx, i64 inner) {
    each_4x128<i64>(n, [&](i64 i) {
        i64 v = idx[i], o = i / (ka * inner), j = i % inner;
        y[i] = (v >= 0 && v < kx) ? x[(o * kx + v) * inner + j] : (T)(0.0f * KB_INF);
    });
}

template <class T>
KB_D void strided_copy(const T* x, T* y, i64 n, const Strided& d) {
    if (n < 0x7fffffffll) strided_copy_loop<T, unsigned>(x, y, (unsigned)n, d);
    else strided_copy_loop<T, unsigned long long>(x, y, (unsigned long long)n, d);
}

// ---------------------------------------------------------------------------------------------
// Reductions: an accumulator policy per kind, warp and block combines, row and column kernels.

// Accumulators, in the opmath type A.
template <class A>
struct F2 {
    A a, b;
};
template <class A>
struct VI {
    A v;
    int i;
};
template <class A>
struct W3 {
    A n, mean, m2;
};

KB_D float shfl(float v, int m) { return __shfl_xor_sync(KB_FULL, v, m); }
KB_D double shfl(double v, int m) { return __shfl_xor_sync(KB_FULL, v, m); }
KB_D int shfl(int v, int m) { return __shfl_xor_sync(KB_FULL, v, m); }
template <class A>
KB_D F2<A> shfl(F2<A> v, int m) { F2<A> r; r.a = shfl(v.a, m); r.b = shfl(v.b, m); return r; }
template <class A>
KB_D VI<A> shfl(VI<A> v, int m) { VI<A> r; r.v = shfl(v.v, m); r.i = shfl(v.i, m); return r; }
template <class A>
KB_D W3<A> shfl(W3<A> v, int m) {
    W3<A> r;
    r.n = shfl(v.n, m);
    r.mean = shfl(v.mean, m);
    r.m2 = shfl(v.m2, m);
    return r;
}

// A reduction policy R<A>: Acc, init, push (one element and its index), combine, finish.
template <class A>
struct RSum {
    typedef A Acc;
    static KB_D Acc init() { return (A)0; }
    static KB_D Acc push(Acc a, A v, int) { return a + v; }
    static KB_D Acc combine(Acc a, Acc b) { return a + b; }
    static KB_D A finish(Acc a, i64) { return a; }
};
template <class A>
struct RMean : RSum<A> {
    static KB_D A finish(A a, i64 n) { return a / (A)n; }
};
// torch.norm's 2-norm: the square root of the sum of squares.
template <class A>
struct RNorm : RSum<A> {
    static KB_D A push(A a, A v, int) { return a + v * v; }
    static KB_D A finish(A a, i64) { return m_sqrt(a); }
};
template <class A>
struct RProd {
    typedef A Acc;
    static KB_D Acc init() { return (A)1; }
    static KB_D Acc push(Acc a, A v, int) { return a * v; }
    static KB_D Acc combine(Acc a, Acc b) { return a * b; }
    static KB_D A finish(Acc a, i64) { return a; }
};
template <class A>
struct RMax {
    typedef A Acc;
    static KB_D Acc init() { return -(A)KB_INF; }
    static KB_D Acc push(Acc a, A v, int) { return red_max(a, v); }
    static KB_D Acc combine(Acc a, Acc b) { return red_max(a, b); }
    static KB_D A finish(Acc a, i64) { return a; }
};
template <class A>
struct RMin {
    typedef A Acc;
    static KB_D Acc init() { return (A)KB_INF; }
    static KB_D Acc push(Acc a, A v, int) { return red_min(a, v); }
    static KB_D Acc combine(Acc a, Acc b) { return red_min(a, b); }
    static KB_D A finish(Acc a, i64) { return a; }
};
// Online log-sum-exp: a = running maximum, b = sum of exp(x - a): softmax's statistics.
template <class A>
struct RLse {
    typedef F2<A> Acc;
    static KB_D Acc init() { Acc r; r.a = -(A)KB_INF; r.b = (A)0; return r; }
    static KB_D Acc push(Acc s, A v, int) {
        if (v == -(A)KB_INF) return s;
        Acc r;
        if (v > s.a) {
            r.a = v;
            r.b = s.b * m_exp(s.a - v) + (A)1;
        } else {
            r.a = s.a;
            r.b = s.b + m_exp(v - s.a);  // a NaN v lands here and poisons the sum
        }
        return r;
    }
    static KB_D Acc combine(Acc x, Acc y) {
        if (x.a == -(A)KB_INF) return y;
        if (y.a == -(A)KB_INF) return x;
        Acc r;
        r.a = m_fmax(x.a, y.a);
        r.b = x.b * m_exp(x.a - r.a) + y.b * m_exp(y.a - r.a);
        return r;
    }
    static KB_D A finish(Acc s, i64) {
        return (s.a == (A)KB_INF || s.a == -(A)KB_INF) ? s.a : s.a + m_log(s.b);
    }
};
// Where a NaN ranks in argmax/argmin: in float (PyTorch) above everything, so the first NaN wins;
// in double (the interpreter, `if x[k] > x[best] { best = k }` from best = 0) above everything
// at index 0, where nothing ever replaces it, and below everything elsewhere, where it is skipped.
KB_D int nan_rank(float v, int) { return v != v ? 1 : 0; }
KB_D int nan_rank(double v, int i) { return v != v ? (i == 0 ? 1 : -1) : 0; }
// Index of the first maximum (MAX) or minimum, NaN ranked by nan_rank.
template <class A, bool MAX>
struct RArg {
    typedef VI<A> Acc;
    static KB_D Acc init() { Acc r; r.v = MAX ? -(A)KB_INF : (A)KB_INF; r.i = 0x7fffffff; return r; }
    static KB_D Acc combine(Acc x, Acc y) {
        int rx = nan_rank(x.v, x.i), ry = nan_rank(y.v, y.i);
        if (rx != ry) return rx > ry ? x : y;
        if (rx == 0) {
            if (MAX ? x.v > y.v : x.v < y.v) return x;
            if (MAX ? y.v > x.v : y.v < x.v) return y;
        }
        return x.i < y.i ? x : y;
    }
    static KB_D Acc push(Acc a, A v, int i) { Acc e; e.v = v; e.i = i; return combine(a, e); }
    static KB_D i64 finish(Acc a, i64) { return (i64)a.i; }
};
template <class A>
using RArgmax = RArg<A, true>;
template <class A>
using RArgmin = RArg<A, false>;
// Welford's mean and sum of squared deviations, combined with Chan's formula.
template <class A>
struct RWelford {
    typedef W3<A> Acc;
    static KB_D Acc init() { Acc r; r.n = (A)0; r.mean = (A)0; r.m2 = (A)0; return r; }
    static KB_D Acc push(Acc a, A v, int) {
        Acc r;
        r.n = a.n + (A)1;
        A d = v - a.mean;
        r.mean = a.mean + d / r.n;
        r.m2 = a.m2 + d * (v - r.mean);
        return r;
    }
    static KB_D Acc combine(Acc x, Acc y) {
        if (x.n == (A)0) return y;
        if (y.n == (A)0) return x;
        Acc r;
        r.n = x.n + y.n;
        A d = y.mean - x.mean, f = y.n / r.n;
        r.mean = x.mean + d * f;
        r.m2 = x.m2 + y.m2 + d * d * x.n * f;
        return r;
    }
};

template <class R>
KB_D typename R::Acc warp_reduce(typename R::Acc a) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) a = R::combine(a, shfl(a, m));
    return a;
}

// Combines the accumulators of a row's threads; every thread gets the result. A row is one
// warp (blockDim.x == 32, several rows per block) or the whole block (blockDim.y == 1).
template <class R>
KB_D typename R::Acc row_reduce(typename R::Acc a) {
    __shared__ typename R::Acc part[32];
    a = warp_reduce<R>(a);
    if (blockDim.x <= 32) return a;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) part[w] = a;
    __syncthreads();
    a = warp_reduce<R>(lane < nw ? part[lane] : R::init());
    __syncthreads();  // `part` is reused by the next call
    return a;
}

// Combines the accumulators of one column's threads (blockDim = (32, <= 32)); every thread gets
// the result, combined in the same order.
template <class R>
KB_D typename R::Acc col_reduce(typename R::Acc a) {
    if (blockDim.y == 1) return a;  // a column a thread: nothing to combine
    __shared__ typename R::Acc part[32][32];
    part[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    typename R::Acc r = R::init();
    for (int j = 0; j < (int)blockDim.y; ++j) r = R::combine(r, part[j][threadIdx.x]);
    __syncthreads();
    return r;
}

// Elements before p's first 16-byte boundary (p is element-aligned): a row's head.
template <class T>
KB_D i64 head16(const T* p) {
    return (i64)((16 - (reinterpret_cast<unsigned long long>(p) & 15ull)) & 15ull) / (i64)sizeof(T);
}

// Calls f(i, x[i]) for the elements of a row this thread owns: the head up to the row's first
// 16-byte boundary one at a time, then 16-byte loads, then the tail, as PyTorch's vectorised
// reductions shift a row that does not start aligned (a row of odd length starts so every
// other time).
template <class T, class F>
KB_D void visit_row(const T* row, i64 n, F&& f) {
    constexpr int V = 16 / sizeof(T);
    const i64 t = threadIdx.x, s = blockDim.x, head = min(head16(row), n);
    for (i64 i = t; i < head; i += s) f(i, to_op(row[i]));
    const i64 nv = (n - head) / V, tail = head + nv * V;
    const Pack<T>* p = reinterpret_cast<const Pack<T>*>(row + head);
    for (i64 c = t; c < nv; c += s) {
        Pack<T> q = p[c];
#pragma unroll
        for (int j = 0; j < V; ++j) f(head + c * V + j, to_op(q.v[j]));
    }
    for (i64 i = tail + t; i < n; i += s) f(i, to_op(row[i]));
}

// yr[i] = f(i, xr[i]) for the elements of a row this thread owns; vectorised as visit_row where
// xr and yr are as far from a 16-byte boundary, one at a time otherwise.
template <class T, class F>
KB_D void map_row(const T* xr, T* yr, i64 n, F&& f) {
    constexpr int V = 16 / sizeof(T);
    const i64 t = threadIdx.x, s = blockDim.x;
    i64 head = n, nv = 0;
    if (head16(xr) == head16(yr)) {
        head = min(head16(xr), n);
        nv = (n - head) / V;
    }
    for (i64 i = t; i < head; i += s) yr[i] = from_op<T>(f(i, to_op(xr[i])));
    const Pack<T>* p = reinterpret_cast<const Pack<T>*>(xr + head);
    Pack<T>* o = reinterpret_cast<Pack<T>*>(yr + head);
    for (i64 c = t; c < nv; c += s) {
        Pack<T> q = p[c], r;
#pragma unroll
        for (int j = 0; j < V; ++j) r.v[j] = from_op<T>(f(head + c * V + j, to_op(q.v[j])));
        o[c] = r;
    }
    for (i64 i = head + nv * V + t; i < n; i += s) yr[i] = from_op<T>(f(i, to_op(xr[i])));
}

#define KB_FOR_ROWS(r, rows) \
    for (i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y; r < (rows); r += (i64)gridDim.x * blockDim.y)

// Columns: block (w, ty) handles w adjacent columns of one outer index (w <= 32 where ty > 1,
// for col_reduce); its threads along y split the reduced axis.
#define KB_FOR_COLS(o, c, outer, inner)                                                              \
    for (i64 kb_w = blockDim.x, kb_cb = ((inner) + kb_w - 1) / kb_w, kb_b = blockIdx.x; kb_b < (outer) * kb_cb; \
         kb_b += gridDim.x)                                                                          \
        for (i64 o = kb_b / kb_cb, c = (kb_b % kb_cb) * kb_w + threadIdx.x, kb_once = 0; kb_once < 1; ++kb_once)

template <class T, class O, class R>
KB_D void reduce_rows(const T* __restrict__ x, O* __restrict__ y, i64 rows, i64 n) {
    KB_FOR_ROWS(r, rows) {
        typename R::Acc a = R::init();
        visit_row(x + r * n, n, [&](i64 i, op_t<T> v) { a = R::push(a, v, (int)i); });
        a = row_reduce<R>(a);
        if (threadIdx.x == 0) put(y + r, R::finish(a, n));
    }
}

// Pushes x[k * inner] for k = threadIdx.y, + blockDim.y, ... < n into `a`, four independent
// loads at a time (a column's elements are a stride apart: nothing to vectorise, so the
// parallelism in flight comes from here).
template <class T, class R>
KB_D typename R::Acc push_column(typename R::Acc a, const T* xc, i64 n, i64 inner) {
    i64 ty = blockDim.y, k = threadIdx.y;
    for (; k + 3 * ty < n; k += 4 * ty) {
        op_t<T> v0 = to_op(xc[k * inner]), v1 = to_op(xc[(k + ty) * inner]);
        op_t<T> v2 = to_op(xc[(k + 2 * ty) * inner]), v3 = to_op(xc[(k + 3 * ty) * inner]);
        a = R::push(a, v0, (int)k);
        a = R::push(a, v1, (int)(k + ty));
        a = R::push(a, v2, (int)(k + 2 * ty));
        a = R::push(a, v3, (int)(k + 3 * ty));
    }
    for (; k < n; k += ty) a = R::push(a, to_op(xc[k * inner]), (int)k);
    return a;
}

template <class T, int V>
struct alignas(sizeof(T) * V) Vec {
    T v[V];
};

// V adjacent columns a thread (one V-wide load per element of the axis; V = 1: push_column's
// four loads in flight), as PyTorch's reduce kernel vectorises the outputs of a reduction over a
// strided axis. A block covers blockDim.x * V columns of one outer index; its blockDim.y rows
// split the axis (then blockDim.x <= 32, for col_reduce) or, with one row, each thread reduces
// its columns whole. inner is a multiple of V and x and y are V-element aligned.
template <class T, class O, class R, int V>
KB_D void reduce_cols_vec(const T* __restrict__ x, O* __restrict__ y, i64 outer, i64 n, i64 inner) {
    const i64 groups = inner / V, per = blockDim.x, cb = (groups + per - 1) / per;
    for (i64 b = blockIdx.x; b < outer * cb; b += gridDim.x) {
        const i64 o = b / cb, g = (b % cb) * per + threadIdx.x;
        typename R::Acc a[V];
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] = R::init();
        if (g < groups && V == 1) {
            a[0] = push_column<T, R>(a[0], x + o * n * inner + g, n, inner);
        } else if (g < groups) {
            const Vec<T, V>* xc = reinterpret_cast<const Vec<T, V>*>(x + o * n * inner) + g;
            for (i64 k = threadIdx.y; k < n; k += blockDim.y) {
                const Vec<T, V> q = xc[k * groups];
#pragma unroll
                for (int j = 0; j < V; ++j) a[j] = R::push(a[j], to_op(q.v[j]), (int)k);
            }
        }
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] = col_reduce<R>(a[j]);
        if (threadIdx.y == 0 && g < groups) {
#pragma unroll
            for (int j = 0; j < V; ++j) put(y + o * inner + g * V + j, R::finish(a[j], n));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// softmax and log_softmax along an axis: the lane's maximum and sum of exponentials in one
// online pass, then the map.

// The map's constants are computed once per lane: softmax multiplies by 1 / sum, log_softmax
// subtracts max + log(sum).
struct LSoftmax {
    template <class A>
    static KB_D F2<A> prepare(F2<A> s) { F2<A> p; p.a = s.a; p.b = (A)1 / s.b; return p; }
    template <class A>
    static KB_D A apply(A v, F2<A> p) { return m_exp(v - p.a) * p.b; }
};
struct LLogSoftmax {
    template <class A>
    static KB_D F2<A> prepare(F2<A> s) { F2<A> p; p.a = s.a + m_log(s.b); p.b = (A)0; return p; }
    template <class A>
    static KB_D A apply(A v, F2<A> p) { return v - p.a; }
};

// `separate_max`: the maximum in a pass of its own, then the sum of exponentials, then the map
// (three reads of the row), as PyTorch's cunn_SoftMaxForward runs rows too long for its
// shared-memory kernel; otherwise one online pass, then the map.
template <class T, class L>
KB_D void lanes_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 n, int separate_max) {
    typedef op_t<T> A;
    typedef RLse<A> R;
    KB_FOR_ROWS(r, rows) {
        const T* xr = x + r * n;
        F2<A> st;
        if (separate_max) {
            A m = RMax<A>::init(), sum = (A)0;
            visit_row(xr, n, [&](i64, A v) { m = RMax<A>::push(m, v, 0); });
            m = row_reduce<RMax<A>>(m);
            visit_row(xr, n, [&](i64, A v) { sum += m_exp(v - m); });
            st.a = m;
            st.b = row_reduce<RSum<A>>(sum);
        } else {
            typename R::Acc a = R::init();
            visit_row(xr, n, [&](i64, A v) { a = R::push(a, v, 0); });
            st = row_reduce<R>(a);
        }
        F2<A> p = L::prepare(st);
        map_row(xr, y + r * n, n, [&](i64, A v) { return L::apply(v, p); });
    }
}

template <class T, class L>
KB_D void lanes_cols(const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 n, i64 inner) {
    typedef RLse<op_t<T>> R;
    KB_FOR_COLS(o, c, outer, inner) {
        typename R::Acc a = R::init();
        const T* xc = x + o * n * inner + c;
        T* yc = y + o * n * inner + c;
        if (c < inner) a = push_column<T, R>(a, xc, n, inner);
        F2<op_t<T>> p = L::prepare(col_reduce<R>(a));
        if (c < inner)
            for (i64 k = threadIdx.y; k < n; k += blockDim.y)
                yc[k * inner] = from_op<T>(L::apply(to_op(xc[k * inner]), p));
    }
}

// ---------------------------------------------------------------------------------------------
// Norms over the last axis, with optional weight and bias (pointers not read when absent).

// One kernel for both norms, as PyTorch runs rms_norm through its layer-norm kernel: Welford
// statistics of the row, then the map. RMS: the mean square is m2 / n + mean^2.
template <class T, bool RMS>
KB_D void norm_rows(const T* __restrict__ x, const T* w, const T* b, T* __restrict__ y, i64 rows, i64 n,
                    op_t<T> eps, int has_w, int has_b) {
    typedef op_t<T> A;
    typedef RWelford<A> R;
    KB_FOR_ROWS(r, rows) {
        typename R::Acc a = R::init();
        visit_row(x + r * n, n, [&](i64, A v) { a = R::push(a, v, 0); });
        a = row_reduce<R>(a);
        A var = a.m2 / (A)n, mean = RMS ? (A)0 : a.mean;
        A rstd = m_rsqrt((RMS ? var + a.mean * a.mean : var) + eps);
        map_row(x + r * n, y + r * n, n, [&](i64 i, A v) {
            A o = (v - mean) * rstd;
            if (has_w) o *= to_op(w[i]);
            if (has_b) o += to_op(b[i]);
            return o;
        });
    }
}

// Group, instance and batch norm of x [n, c, s]: one row (a warp or a block) per set. groups > 0:
// set (i, j) holds channels j*c/groups.. of sample i, contiguous; groups == 0 (batch norm in
// training mode): set ch holds channel ch of every sample. Welford statistics, biased variance.
// A set is `segs` segments of s contiguous elements (its channels, or the channel in each sample),
// `seg_stride` apart: when a segment is at least a row's width of threads, each is read and
// written as a row (16-byte accesses, no division per element); otherwise element by element
// over the whole set, in 32-bit index arithmetic where the set allows.
template <class T, class I>
KB_D void chan_norm_in(const T* __restrict__ x, const T* w, const T* b, T* __restrict__ y, i64 n, i64 c,
                       i64 s, i64 groups, op_t<T> eps, int has_w, int has_b) {
    typedef op_t<T> A;
    typedef RWelford<A> R;
    const bool batch = groups == 0;
    const i64 sets = batch ? c : n * groups, cpg = batch ? 1 : c / groups;
    const i64 per = batch ? n * s : cpg * s;
    const i64 segs = batch ? n : cpg, seg_stride = batch ? c * s : s;
    const bool by_segment = s >= (i64)blockDim.x;
    const I si = (I)s, cs = (I)(c * s);
    KB_FOR_ROWS(r, sets) {
        // Group (i, j) starts at ((i * c) + j * cpg) * s = r * per; channel r at r * s.
        const i64 base = batch ? r * s : r * per;
        const T* xs = x + base;
        T* ys = y + base;
        // Element k of the set, for the element-by-element form.
        auto at = [&](I k) -> I { return batch ? (k / si) * cs + k % si : k; };
        auto channel = [&](i64 q) -> i64 { return batch ? r : (r % groups) * cpg + q; };
        typename R::Acc a = R::init();
        if (by_segment) {
            for (i64 q = 0; q < segs; ++q)
                visit_row(xs + q * seg_stride, s, [&](i64, A v) { a = R::push(a, v, 0); });
        } else {
            for (I k = threadIdx.x; k < (I)per; k += blockDim.x) a = R::push(a, to_op(xs[at(k)]), 0);
        }
        a = row_reduce<R>(a);
        const A mean = a.mean, rstd = m_rsqrt(a.m2 / (A)per + eps);
        auto norm = [&](A v, i64 ch) {
            A o = (v - mean) * rstd;
            if (has_w) o *= to_op(w[ch]);
            if (has_b) o += to_op(b[ch]);
            return o;
        };
        if (by_segment) {
            for (i64 q = 0; q < segs; ++q) {
                const i64 ch = channel(q);
                map_row(xs + q * seg_stride, ys + q * seg_stride, s, [&](i64, A v) { return norm(v, ch); });
            }
        } else {
            for (I k = threadIdx.x; k < (I)per; k += blockDim.x) {
                const I i = at(k);
                ys[i] = from_op<T>(norm(to_op(xs[i]), channel(batch ? 0 : k / si)));
            }
        }
    }
}

template <class T>
KB_D void chan_norm(const T* __restrict__ x, const T* w, const T* b, T* __restrict__ y, i64 n, i64 c, i64 s,
                    i64 groups, op_t<T> eps, int has_w, int has_b) {
    // Offsets within a set: below n * c * s for a batch norm's channel, below its size for a group.
    const i64 span = groups == 0 ? n * c * s : c / groups * s;
    if (span + (i64)blockDim.x < 0x7fffffffLL)
        chan_norm_in<T, int>(x, w, b, y, n, c, s, groups, eps, has_w, has_b);
    else
        chan_norm_in<T, i64>(x, w, b, y, n, c, s, groups, eps, has_w, has_b);
}

// ---------------------------------------------------------------------------------------------
// Inclusive scans (cumsum, PROD: cumprod).

template <bool PROD, class A>
KB_D A scan_op(A a, A b) { return PROD ? a * b : a + b; }

// Rows as PyTorch's tensor_kernel_scan_innermost_dim scans them: blockDim.y rows a block,
// blockDim.x (a power of two; x * y = 512) threads a row, each row in chunks of 2 * blockDim.x
// elements through shared memory: the chunk's first element takes the total of the chunks before
// it, then a Sklansky tree of log2(blockDim.x) + 1 levels, a barrier after each. Accumulated in
// the opmath type (PyTorch scans half in half).
template <class T, bool PROD>
KB_D void scan_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 n) {
    typedef op_t<T> A;
    __shared__ A buf[1024];
    const A id = PROD ? (A)1 : (A)0;
    const unsigned tx = threadIdx.x, nx = blockDim.x;
    int lx = 0;
    while ((1u << lx) < nx) ++lx;
    A* rb = buf + threadIdx.y * 2 * nx;
    for (i64 first = (i64)blockIdx.x * blockDim.y; first < rows; first += (i64)blockDim.y * gridDim.x) {
        const i64 r = first + threadIdx.y;
        const bool live = r < rows;
        A total = id;
        for (i64 c0 = 0; c0 < n; c0 += 2 * (i64)nx) {
            const i64 c1 = c0 + tx, c2 = c0 + nx + tx;
            if (live) {
                rb[tx] = c1 < n ? to_op(x[r * n + c1]) : id;
                rb[nx + tx] = c2 < n ? to_op(x[r * n + c2]) : id;
                if (tx == 0) rb[0] = scan_op<PROD>(rb[0], total);
            }
            __syncthreads();
            for (int m = 0; m <= lx; ++m) {
                if (live) {
                    const unsigned s = 1u << m, a = ((tx >> m) << (m + 1)) | s;
                    const unsigned ti = a + (tx % s), si = a - 1;
                    rb[ti] = scan_op<PROD>(rb[ti], rb[si]);
                }
                __syncthreads();
            }
            if (live) {
                if (c1 < n) y[r * n + c1] = from_op<T>(rb[tx]);
                if (c2 < n) y[r * n + c2] = from_op<T>(rb[nx + tx]);
                total = rb[2 * nx - 1];
            }
            __syncthreads();
        }
    }
}

// Columns: each thread along y scans a contiguous stretch of the axis, after the totals of the
// stretches before it.
template <class T, bool PROD>
KB_D void scan_cols(const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 n, i64 inner) {
    typedef op_t<T> A;
    __shared__ A part[32][32];
    const A id = PROD ? (A)1 : (A)0;
    KB_FOR_COLS(o, c, outer, inner) {
        i64 len = (n + blockDim.y - 1) / blockDim.y, k0 = threadIdx.y * len;
        i64 k1 = k0 + len < n ? k0 + len : n;
        const T* xc = x + o * n * inner + c;
        T* yc = y + o * n * inner + c;
        A acc = id;
        if (c < inner)
            for (i64 k = k0; k < k1; ++k) acc = scan_op<PROD>(acc, to_op(xc[k * inner]));
        part[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        A pre = id;
        for (int j = 0; j < (int)threadIdx.y; ++j) pre = scan_op<PROD>(pre, part[j][threadIdx.x]);
        if (c < inner)
            for (i64 k = k0; k < k1; ++k) {
                pre = scan_op<PROD>(pre, to_op(xc[k * inner]));
                yc[k * inner] = from_op<T>(pre);
            }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// Dtype conversions.

template <class S, class D>
KB_D void convert(const S* __restrict__ x, D* __restrict__ y, i64 n) {
    for (i64 i = gtid(); i < n; i += gstride()) y[i] = from_op<D>(to_op(x[i]));
}

// ---------------------------------------------------------------------------------------------
// Reference GEMM (the CPU path, and the GPU fallback without cuBLAS): row-major, batched,
// optional transposes, 16x16 tiles, accumulation in the opmath type; block (16, 16).

template <class T>
KB_D void gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, i64 m, i64 n, i64 k, i64 batch,
               int trans_a, int trans_b, i64 stride_a, i64 stride_b, i64 stride_c) {
    typedef op_t<T> Op;
    __shared__ Op as[16][17], bs[16][17];
    int tx = threadIdx.x, ty = threadIdx.y;
    for (i64 z = blockIdx.z; z < batch; z += gridDim.z) {
        const T* a = A + z * stride_a;
        const T* b = B + z * stride_b;
        T* c = C + z * stride_c;
        for (i64 row0 = (i64)blockIdx.y * 16; row0 < m; row0 += (i64)gridDim.y * 16)
            for (i64 col0 = (i64)blockIdx.x * 16; col0 < n; col0 += (i64)gridDim.x * 16) {
                i64 row = row0 + ty, col = col0 + tx;
                Op acc = (Op)0;
                for (i64 k0 = 0; k0 < k; k0 += 16) {
                    i64 ka = k0 + tx, kb = k0 + ty;
                    as[ty][tx] = (row < m && ka < k) ? to_op(trans_a ? a[ka * m + row] : a[row * k + ka]) : (Op)0;
                    bs[ty][tx] = (kb < k && col < n) ? to_op(trans_b ? b[col * k + kb] : b[kb * n + col]) : (Op)0;
                    __syncthreads();
#pragma unroll
                    for (int kk = 0; kk < 16; ++kk) acc += as[ty][kk] * bs[kk][tx];
                    __syncthreads();
                }
                if (row < m && col < n) c[row * n + col] = from_op<T>(acc);
            }
    }
}

// ---------------------------------------------------------------------------------------------
// Convolution and pooling over up to three spatial axes (1-D and 2-D run as 3-D with unit
// leading axes): one thread per output element, grid-stride, as a direct loop over the window.

// Geometry of a window sliding over [D, H, W]: extents, output extents, and the window's size,
// stride, padding and dilation per axis, in index type I (pooling uses 32-bit indices where the
// tensors allow, as PyTorch's pooling kernels do; a 64-bit division costs several 32-bit ones).
template <class I>
struct WinPosT {
    I rest, d, h, w;
};
template <class I>
struct WinT {
    I d, h, w, kd, kh, kw, od, oh, ow, sd, sh, sw, pd, ph, pw, dd, dh, dw;
    template <class J>
    KB_D WinT<J> as() const {
        return WinT<J>{(J)d,  (J)h,  (J)w,  (J)kd, (J)kh, (J)kw, (J)od, (J)oh, (J)ow,
                       (J)sd, (J)sh, (J)sw, (J)pd, (J)ph, (J)pw, (J)dd, (J)dh, (J)dw};
    }
    // Output element i as its position (d, h, w) and the index over the leading dims.
    KB_D WinPosT<I> pos(I i) const {
        WinPosT<I> p;
        p.w = i % ow;
        i /= ow;
        p.h = i % oh;
        i /= oh;
        p.d = i % od;
        p.rest = i / od;
        return p;
    }
    // The same over a plane (od == 1): two divisions, d = 0.
    KB_D WinPosT<I> plane_pos(I i) const {
        WinPosT<I> p;
        p.w = i % ow;
        i /= ow;
        p.h = i % oh;
        p.rest = i / oh;
        p.d = 0;
        return p;
    }
};
typedef WinT<i64> Win;
typedef WinPosT<i64> WinPos;

// Calls f(input offset, window offset) for every window position of output position o that lies
// inside the input (the padding reads nothing).
template <class I, class F>
KB_D void visit_window(const WinT<I>& g, const WinPosT<I>& o, F f) {
    for (I kd = 0; kd < g.kd; ++kd) {
        const I id = o.d * g.sd - g.pd + kd * g.dd;
        if (id < 0 || id >= g.d) continue;
        for (I kh = 0; kh < g.kh; ++kh) {
            const I ih = o.h * g.sh - g.ph + kh * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            for (I kw = 0; kw < g.kw; ++kw) {
                const I iw = o.w * g.sw - g.pw + kw * g.dw;
                if (iw < 0 || iw >= g.w) continue;
                f((id * g.h + ih) * g.w + iw, (kd * g.kh + kh) * g.kw + kw);
            }
        }
    }
}

template <class T>
KB_D void conv3(const T* __restrict__ x, const T* __restrict__ w, const T* b, T* __restrict__ y, i64 n,
                i64 c, i64 f, i64 groups, Win g, int has_b) {
    typedef op_t<T> A;
    const i64 cg = c / groups, fg = f / groups, outs = g.od * g.oh * g.ow;
    const i64 total = n * f * outs, plane = g.d * g.h * g.w, ks = g.kd * g.kh * g.kw;
    for (i64 i = gtid(); i < total; i += gstride()) {
        const WinPos o = g.pos(i);
        const i64 oc = o.rest % f, b0 = o.rest / f, grp = oc / fg;
        A acc = has_b ? to_op(b[oc]) : (A)0;
        for (i64 ic = 0; ic < cg; ++ic) {
            const T* xc = x + (b0 * c + grp * cg + ic) * plane;
            const T* wc = w + (oc * cg + ic) * ks;
            visit_window(g, o, [&](i64 xi, i64 wi) { acc += to_op(xc[xi]) * to_op(wc[wi]); });
        }
        y[i] = from_op<T>(acc);
    }
}

// The window positions k < n of one axis whose input position start + k * dil lies in [0, len):
// [lo, hi), computed once instead of tested per position; a division only at an edge, as
// PyTorch's conv_depthwise2d_forward_kernel_generic bounds its loops.
template <class I>
KB_D void window_span(I start, I dil, I len, I n, I& lo, I& hi) {
    lo = start < 0 ? (-start + dil - 1) / dil : 0;
    const I over = start + (n - 1) * dil - len + 1;
    hi = over > 0 ? n - (over + dil - 1) / dil : n;
}

// A depthwise convolution (groups = C > 1, F a multiple of C) as PyTorch's own CUDA kernels run
// it where it does not call cuDNN (conv_depthwise2d / 3d: every f32 and bf16 one): a thread per
// output element, output channel oc reading input channel oc / (F / C) (no division when F = C).
// A 1x1, 3x3 or 5x5 window over a plane (KS) has its loops fixed at compile time, its position
// found by three divisions, and tests each position; any other window has its span on each axis
// computed first. Indices of type I. Each form is its own kernel (the launch picks it, as
// PyTorch's templates are picked on the host), so none pays the registers of the others.
template <class T, class I, int KS, bool PLANE = KS != 0>
KB_D void depthwise_in(const T* __restrict__ x, const T* __restrict__ w, const T* b, T* __restrict__ y,
                       I n, I c, I f, const WinT<I>& g, int has_b) {
    typedef op_t<T> A;
    const I mult = f / c, total = n * f * g.od * g.oh * g.ow, plane = g.d * g.h * g.w;
    const I ks = g.kd * g.kh * g.kw;
    // The loop counter in 64 bits (the last stride may pass 2^31), the indices in I.
    for (i64 li = gtid(); li < (i64)total; li += gstride()) {
        const I i = (I)li;
        const WinPosT<I> o = PLANE ? g.plane_pos(i) : g.pos(i);
        const I oc = o.rest % f;
        const I xc = mult == 1 ? o.rest : o.rest / f * c + oc / mult;
        const T* xp = x + (i64)xc * plane;
        const T* wp = w + (i64)oc * ks;
        const I d0 = o.d * g.sd - g.pd, h0 = o.h * g.sh - g.ph, w0 = o.w * g.sw - g.pw;
        A acc = has_b ? to_op(b[oc]) : (A)0;
        if (KS) {
#pragma unroll
            for (int kh = 0; kh < KS; ++kh) {
                const I ih = h0 + kh * g.dh;
#pragma unroll
                for (int kw = 0; kw < KS; ++kw) {
                    const I iw = w0 + kw * g.dw;
                    if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
                        acc += to_op(wp[kh * KS + kw]) * to_op(xp[ih * g.w + iw]);
                }
            }
        } else {
            I dlo = 0, dhi = 1, hlo, hhi, wlo, whi;
            if (!PLANE) window_span(d0, g.dd, g.d, g.kd, dlo, dhi);
            window_span(h0, g.dh, g.h, g.kh, hlo, hhi);
            window_span(w0, g.dw, g.w, g.kw, wlo, whi);
            for (I kd = dlo; kd < dhi; ++kd)
                for (I kh = hlo; kh < hhi; ++kh) {
                    const I row = ((d0 + kd * g.dd) * g.h + h0 + kh * g.dh) * g.w + w0;
                    const T* wr = wp + (kd * g.kh + kh) * g.kw;
                    for (I kw = wlo; kw < whi; ++kw) acc += to_op(wr[kw]) * to_op(xp[row + kw * g.dw]);
                }
        }
        y[i] = from_op<T>(acc);
    }
}

// The 32-bit forms (the launch checks that x's and y's indices fit an int, as PyTorch's kernels
// require): KS 1, 3 or 5 for a square window over a plane, 0 for any other.
template <class T, int KS, bool PLANE>
KB_D void depthwise(const T* __restrict__ x, const T* __restrict__ w, const T* b, T* __restrict__ y, i64 n,
                    i64 c, i64 f, Win g, int has_b) {
    depthwise_in<T, int, KS, PLANE>(x, w, b, y, (int)n, (int)c, (int)f, g.as<int>(), has_b);
}

// The transposed convolution as a gather: output position o reads input position
// (o + padding - k*dilation) / stride where that divides exactly; weight [C, F/groups, kernel].
template <class T>
KB_D void conv_t3(const T* __restrict__ x, const T* __restrict__ w, const T* b, T* __restrict__ y, i64 n,
                  i64 c, i64 f, i64 groups, Win g, int has_b) {
    typedef op_t<T> A;
    const i64 cg = c / groups, fg = f / groups, outs = g.od * g.oh * g.ow;
    const i64 total = n * f * outs, plane = g.d * g.h * g.w, ks = g.kd * g.kh * g.kw;
    for (i64 i = gtid(); i < total; i += gstride()) {
        const WinPos o = g.pos(i);
        const i64 od = o.d, oh = o.h, ow = o.w, oc = o.rest % f, b0 = o.rest / f;
        const i64 grp = oc / fg, ocl = oc % fg;
        A acc = has_b ? to_op(b[oc]) : (A)0;
        for (i64 kd = 0; kd < g.kd; ++kd) {
            const i64 nd = od + g.pd - kd * g.dd;
            if (nd < 0 || nd % g.sd != 0 || nd / g.sd >= g.d) continue;
            for (i64 kh = 0; kh < g.kh; ++kh) {
                const i64 nh = oh + g.ph - kh * g.dh;
                if (nh < 0 || nh % g.sh != 0 || nh / g.sh >= g.h) continue;
                for (i64 kw = 0; kw < g.kw; ++kw) {
                    const i64 nw = ow + g.pw - kw * g.dw;
                    if (nw < 0 || nw % g.sw != 0 || nw / g.sw >= g.w) continue;
                    const i64 xi = ((nd / g.sd) * g.h + nh / g.sh) * g.w + nw / g.sw;
                    const i64 wi = (kd * g.kh + kh) * g.kw + kw;
                    for (i64 ic = grp * cg; ic < (grp + 1) * cg; ++ic)
                        acc += to_op(x[(b0 * c + ic) * plane + xi]) * to_op(w[(ic * fg + ocl) * ks + wi]);
                }
            }
        }
        y[i] = from_op<T>(acc);
    }
}

// Whether v replaces the window's maximum so far: PyTorch's `val > maxval || isnan(val)` in float
// (a NaN wins, the last one), the interpreter's max in double (a NaN never wins).
KB_D bool pool_beats(float v, float best) { return v > best || v != v; }
KB_D bool pool_beats(double v, double best) { return v > best; }

// One output of a pooling at position (d, h, w) of plane `plane` (index `i`), as PyTorch's
// pooling kernels compute it. MAX: the window's positions inside x, stepped by the dilation from
// the first one inside, the maximum (the first, or the last NaN: `val > max || isnan(val)` in
// float) and its position in the plane into `idx` (the first position inside when no value
// beats -inf), as max_pool*d_with_indices writes it. Otherwise the mean of the window clipped to
// the input, divided by the window clipped to the padded input (count_pad) or to x.
template <class T, bool MAX, class I>
KB_D void pool_one(const T* __restrict__ x, T* __restrict__ y, i64* __restrict__ idx, I plane, I d, I h,
                   I w, I i, const WinT<I>& g, int count_pad) {
    typedef op_t<T> A;
    const T* xp = x + (i64)plane * (g.d * g.h * g.w);
    I d0 = d * g.sd - g.pd, h0 = h * g.sh - g.ph, w0 = w * g.sw - g.pw;
    if (MAX) {
        const I d1 = min(d0 + (g.kd - 1) * g.dd + 1, g.d), h1 = min(h0 + (g.kh - 1) * g.dh + 1, g.h);
        const I w1 = min(w0 + (g.kw - 1) * g.dw + 1, g.w);
        while (d0 < 0) d0 += g.dd;
        while (h0 < 0) h0 += g.dh;
        while (w0 < 0) w0 += g.dw;
        A best = -(A)KB_INF;
        I at = (d0 * g.h + h0) * g.w + w0;
        for (I a = d0; a < d1; a += g.dd)
            for (I b = h0; b < h1; b += g.dh)
                for (I c = w0; c < w1; c += g.dw) {
                    const I xi = (a * g.h + b) * g.w + c;
                    const A v = to_op(xp[xi]);
                    if (pool_beats(v, best)) {
                        best = v;
                        at = xi;
                    }
                }
        y[i] = from_op<T>(best);
        idx[i] = (i64)at;
    } else {
        I d1 = min(d0 + g.kd, g.d + g.pd), h1 = min(h0 + g.kh, g.h + g.ph), w1 = min(w0 + g.kw, g.w + g.pw);
        const I padded = (d1 - d0) * (h1 - h0) * (w1 - w0);
        d0 = max(d0, (I)0), h0 = max(h0, (I)0), w0 = max(w0, (I)0);
        d1 = min(d1, g.d), h1 = min(h1, g.h), w1 = min(w1, g.w);
        if (d0 >= d1 || h0 >= h1 || w0 >= w1) {
            y[i] = from_op<T>((A)0);
            return;
        }
        A sum = 0;
        for (I a = d0; a < d1; ++a)
            for (I b = h0; b < h1; ++b)
                for (I c = w0; c < w1; ++c) sum += to_op(xp[(a * g.h + b) * g.w + c]);
        const I count = count_pad ? padded : (d1 - d0) * (h1 - h0) * (w1 - w0);
        y[i] = from_op<T>(sum / (A)count);
    }
}

// A pooling over planes of one or two axes as PyTorch's max_pool_forward_nchw and
// avg_pool2d_out_cuda_frame run it: a thread per output on a 1-D grid (the launch sets blocks of
// 256 or 1024), every output visited whatever the launch (a strided loop), in indices of type I.
template <class T, bool MAX, class I>
KB_D void pool_planes(const T* __restrict__ x, T* __restrict__ y, i64* __restrict__ idx, I planes,
                      const WinT<I>& g, int count_pad) {
    const I total = planes * g.od * g.oh * g.ow;
    for (i64 li = gtid(); li < (i64)total; li += gstride()) {
        const I i = (I)li;
        const WinPosT<I> o = g.pos(i);
        pool_one<T, MAX, I>(x, y, idx, o.rest, o.d, o.h, o.w, i, g, count_pad);
    }
}

// A pooling over three axes as PyTorch's max_pool3d / avg_pool3d kernels run it: blocks of
// (32, 8) over the output's width and height, planes and depths along the grid's z.
template <class T, bool MAX, class I>
KB_D void pool_volume(const T* __restrict__ x, T* __restrict__ y, i64* __restrict__ idx, I planes,
                      const WinT<I>& g, int count_pad) {
    const I frames = planes * g.od;
    for (I z = blockIdx.z; z < frames; z += gridDim.z) {
        const I plane = z / g.od, d = z % g.od;
        for (I h = blockIdx.y * blockDim.y + threadIdx.y; h < g.oh; h += gridDim.y * blockDim.y)
            for (I w = blockIdx.x * blockDim.x + threadIdx.x; w < g.ow; w += gridDim.x * blockDim.x)
                pool_one<T, MAX, I>(x, y, idx, plane, d, h, w, (z * g.oh + h) * g.ow + w, g, count_pad);
    }
}

// The pooling kernels' three forms, each its own kernel (the launch picks it, so none pays the
// registers of the others): planes or volumes in 32-bit indices (the launch checks that every
// index of x and y fits an int), and either in 64-bit indices by the launch's shape.
template <class T, bool MAX>
KB_D void pool_plane32(const T* __restrict__ x, T* __restrict__ y, i64* idx, i64 planes, Win g, int count_pad) {
    pool_planes<T, MAX, int>(x, y, idx, (int)planes, g.as<int>(), count_pad);
}
template <class T, bool MAX>
KB_D void pool_volume32(const T* __restrict__ x, T* __restrict__ y, i64* idx, i64 planes, Win g, int count_pad) {
    pool_volume<T, MAX, int>(x, y, idx, (int)planes, g.as<int>(), count_pad);
}
template <class T, bool MAX>
KB_D void pool_wide(const T* __restrict__ x, T* __restrict__ y, i64* idx, i64 planes, Win g, int count_pad) {
    if (gridDim.y == 1 && gridDim.z == 1 && blockDim.y == 1)
        pool_planes<T, MAX, i64>(x, y, idx, planes, g, count_pad);
    else
        pool_volume<T, MAX, i64>(x, y, idx, planes, g, count_pad);
}

}  // namespace kb

// =============================================================================================
// The extern "C" entry points.

// The Strided description as 24 parameters: sizes, magics, strides of a, strides of b.
#define KB_DIMS_PARAMS                                                                             \
    i64 s0, i64 s1, i64 s2, i64 s3, i64 s4, i64 s5, i64 m0, i64 m1, i64 m2, i64 m3, i64 m4, i64 m5, \
        i64 a0, i64 a1, i64 a2, i64 a3, i64 a4, i64 a5, i64 b0, i64 b1, i64 b2, i64 b3, i64 b4, i64 b5
#define KB_DIMS(nd)                                                                                 \
    kb::Strided {                                                                                   \
        {s0, s1, s2, s3, s4, s5}, {m0, m1, m2, m3, m4, m5}, {a0, a1, a2, a3, a4, a5},               \
            {b0, b1, b2, b3, b4, b5}, nd                                                            \
    }

// Every kernel family in each storage type: the task dtypes, and f64 for the reference plans.
#define KB_EACH(M, ...)                                                                                   \
    M(f32, float, __VA_ARGS__)                                                                            \
    M(f16, __half, __VA_ARGS__) M(bf16, __nv_bfloat16, __VA_ARGS__) M(f64, double, __VA_ARGS__)

#define KB_UNARY(dt, T, name, F)                                                                          \
    extern "C" __global__ void unary_##name##_##dt(const T* x, T* y, i64 n, kb::op_t<T> p0,               \
                                                   kb::op_t<T> p1) {                                      \
        kb::unary<T, kb::F>(x, y, n, p0, p1);                                                             \
    }
#define KB_UNARY_ALL(name, F) KB_EACH(KB_UNARY, name, F)
KB_UNARY_ALL(relu, Relu)
KB_UNARY_ALL(gelu, Gelu)
KB_UNARY_ALL(gelu_tanh, GeluTanh)
KB_UNARY_ALL(silu, Silu)
KB_UNARY_ALL(sigmoid, Sigmoid)
KB_UNARY_ALL(tanh, Tanh)
KB_UNARY_ALL(exp, Exp)
KB_UNARY_ALL(log, Log)
KB_UNARY_ALL(abs, Abs)
KB_UNARY_ALL(neg, Neg)
KB_UNARY_ALL(sqrt, Sqrt)
KB_UNARY_ALL(rsqrt, Rsqrt)
KB_UNARY_ALL(square, Square)
KB_UNARY_ALL(softplus, Softplus)
KB_UNARY_ALL(mish, Mish)
KB_UNARY_ALL(hardsigmoid, Hardsigmoid)
KB_UNARY_ALL(hardswish, Hardswish)
KB_UNARY_ALL(leaky_relu, LeakyRelu)
KB_UNARY_ALL(elu, Elu)
KB_UNARY_ALL(clamp, Clamp)
KB_UNARY_ALL(clamp_min, ClampMin)
KB_UNARY_ALL(reciprocal, Reciprocal)
KB_UNARY_ALL(inf_to_zero, InfToZero)

#define KB_BINARY(dt, T, name, F)                                                                         \
    extern "C" __global__ void binary_##name##_##dt(const T* a, const T* b, T* y, i64 n) {                \
        kb::binary<T, kb::F>(a, b, y, n);                                                                 \
    }                                                                                                     \
    extern "C" __global__ void binary_##name##_scalar_##dt(const T* a, kb::op_t<T> s, T* y, i64 n,        \
                                                         int first) {                                     \
        kb::binary_scalar<T, kb::F>(a, s, y, n, first);                                                   \
    }                                                                                                     \
    extern "C" __global__ void binary_##name##_bcast_##dt(                                                \
        const T* a, const T* b, T* y, i64 n, int nd, KB_DIMS_PARAMS) {                                    \
        kb::bcast<T, kb::F>(a, b, y, n, KB_DIMS(nd));                                                     \
    }
#define KB_BINARY_ALL(name, F) KB_EACH(KB_BINARY, name, F)
KB_BINARY_ALL(add, Add)
KB_BINARY_ALL(sub, Sub)
KB_BINARY_ALL(mul, Mul)
KB_BINARY_ALL(div, Div)
KB_BINARY_ALL(maximum, Maximum)
KB_BINARY_ALL(minimum, Minimum)
KB_BINARY_ALL(pow, Pow)

#define KB_REDUCE(dt, T, name, O, R)                                                                      \
    extern "C" __global__ void reduce_##name##_rows_##dt(const T* x, O* y, i64 rows, i64 n) {             \
        kb::reduce_rows<T, O, kb::R<kb::op_t<T>>>(x, y, rows, n);                                         \
    }                                                                                                     \
    KB_REDUCE_COLS(dt, T, name, O, R, , 1)
// A column reduction V columns a thread, each width its own kernel (the launch picks it: V
// divides the columns; buffers are whole allocations, so the V-wide loads are aligned), so the
// one-column form keeps its registers (40 with the wider forms in one kernel, against 28).
#define KB_REDUCE_COLS(dt, T, name, O, R, form, V)                                                        \
    extern "C" __global__ void reduce_##name##_cols##form##_##dt(const T* x, O* y, i64 outer, i64 n,       \
                                                                 i64 inner) {                              \
        kb::reduce_cols_vec<T, O, kb::R<kb::op_t<T>>, V>(x, y, outer, n, inner);                          \
    }
#define KB_REDUCE_SAME(dt, T, name, R)                                                                    \
    KB_REDUCE(dt, T, name, T, R)                                                                          \
    KB_REDUCE_COLS(dt, T, name, T, R, _v2, 2)                                                             \
    KB_REDUCE_COLS(dt, T, name, T, R, _v4, 4)
#define KB_REDUCE_INDEX(dt, T, name, R) KB_REDUCE(dt, T, name, i64, R)
KB_EACH(KB_REDUCE_SAME, sum, RSum)
KB_EACH(KB_REDUCE_SAME, mean, RMean)
KB_EACH(KB_REDUCE_SAME, max, RMax)
KB_EACH(KB_REDUCE_SAME, min, RMin)
KB_EACH(KB_REDUCE_SAME, prod, RProd)
KB_EACH(KB_REDUCE_SAME, norm, RNorm)
KB_EACH(KB_REDUCE_INDEX, argmax, RArgmax)
KB_EACH(KB_REDUCE_INDEX, argmin, RArgmin)

#define KB_LANES(dt, T, name, L)                                                                          \
    extern "C" __global__ void name##_rows_##dt(const T* x, T* y, i64 rows, i64 n, int separate_max) {    \
        kb::lanes_rows<T, kb::L>(x, y, rows, n, separate_max);                                            \
    }                                                                                                     \
    extern "C" __global__ void name##_cols_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner) {          \
        kb::lanes_cols<T, kb::L>(x, y, outer, n, inner);                                                  \
    }
KB_EACH(KB_LANES, softmax, LSoftmax)
KB_EACH(KB_LANES, log_softmax, LLogSoftmax)

#define KB_GATHER(dt, T, unused)                                                                          \
    extern "C" __global__ void gather_##dt(const T* x, const long long* idx, T* y, i64 n, i64 ka, i64 kx,    \
                                           i64 inner) {                                                   \
        kb::gather<T>(x, idx, y, n, ka, kx, inner);                                                       \
    }
KB_EACH(KB_GATHER, 0)

#define KB_SCAN(dt, T, name, PROD)                                                                        \
    extern "C" __global__ void name##_rows_##dt(const T* x, T* y, i64 rows, i64 n) {                      \
        kb::scan_rows<T, PROD>(x, y, rows, n);                                                            \
    }                                                                                                     \
    extern "C" __global__ void name##_cols_##dt(const T* x, T* y, i64 outer, i64 n, i64 inner) {          \
        kb::scan_cols<T, PROD>(x, y, outer, n, inner);                                                    \
    }
KB_EACH(KB_SCAN, cumsum, false)
KB_EACH(KB_SCAN, cumprod, true)

#define KB_NORMS(dt, T, unused)                                                                           \
    extern "C" __global__ void layer_norm_##dt(const T* x, const T* w, const T* b, T* y, i64 rows, i64 n, \
                                               kb::op_t<T> eps, int has_w, int has_b) {                   \
        kb::norm_rows<T, false>(x, w, b, y, rows, n, eps, has_w, has_b);                                  \
    }                                                                                                     \
    extern "C" __global__ void chan_norm_##dt(const T* x, const T* w, const T* b, T* y, i64 n, i64 c, i64 s,  \
                                              i64 groups, kb::op_t<T> eps, int has_w, int has_b) {        \
        kb::chan_norm<T>(x, w, b, y, n, c, s, groups, eps, has_w, has_b);                                 \
    }                                                                                                     \
    extern "C" __global__ void rms_norm_##dt(const T* x, const T* w, T* y, i64 rows, i64 n,               \
                                             kb::op_t<T> eps, int has_w) {                                \
        kb::norm_rows<T, true>(x, w, w, y, rows, n, eps, has_w, 0);                                       \
    }                                                                                                     \
    extern "C" __global__ void gemm_##dt(const T* a, const T* b, T* c, i64 m, i64 n, i64 k, i64 batch,    \
                                         int trans_a, int trans_b, i64 sa, i64 sb, i64 sc) {              \
        kb::gemm<T>(a, b, c, m, n, k, batch, trans_a, trans_b, sa, sb, sc);                               \
    }
KB_EACH(KB_NORMS, 0)

#define KB_WIN_PARAMS                                                                                     \
    i64 d, i64 h, i64 w, i64 kd, i64 kh, i64 kw, i64 od, i64 oh, i64 ow, i64 sd, i64 sh, i64 sw, i64 pd,  \
        i64 ph, i64 pw, i64 dd, i64 dh, i64 dw
#define KB_WIN                                                                                            \
    kb::Win { d, h, w, kd, kh, kw, od, oh, ow, sd, sh, sw, pd, ph, pw, dd, dh, dw }
#define KB_DEPTHWISE(dt, T, form, F)                                                                      \
    extern "C" __global__ void conv_depthwise##form##_##dt(const T* x, const T* wt, const T* b, T* y, i64 n,  \
                                                          i64 c, i64 f, i64 groups, KB_WIN_PARAMS, int has_b) { \
        F(x, wt, b, y, n, c, f, KB_WIN, has_b);                                                           \
    }
#define KB_POOL(dt, T, form, F)                                                                           \
    extern "C" __global__ void max_pool##form##_##dt(const T* x, T* y, i64* idx, i64 planes, KB_WIN_PARAMS, \
                                                    int unused1) {                                        \
        kb::F<T, true>(x, y, idx, planes, KB_WIN, 0);                                                     \
    }                                                                                                     \
    extern "C" __global__ void avg_pool##form##_##dt(const T* x, T* y, i64 planes, KB_WIN_PARAMS,           \
                                                    int count_pad) {                                      \
        kb::F<T, false>(x, y, nullptr, planes, KB_WIN, count_pad);                                        \
    }
#define KB_WINDOWED(dt, T, unused)                                                                        \
    extern "C" __global__ void conv_##dt(const T* x, const T* wt, const T* b, T* y, i64 n, i64 c, i64 f,  \
                                         i64 groups, KB_WIN_PARAMS, int has_b) {                          \
        kb::conv3<T>(x, wt, b, y, n, c, f, groups, KB_WIN, has_b);                                        \
    }                                                                                                     \
    KB_DEPTHWISE(dt, T, , (kb::depthwise<T, 0, true>))                                                 \
    KB_DEPTHWISE(dt, T, _vol, (kb::depthwise<T, 0, false>))                                            \
    KB_DEPTHWISE(dt, T, _k1, (kb::depthwise<T, 1, true>))                                              \
    KB_DEPTHWISE(dt, T, _k3, (kb::depthwise<T, 3, true>))                                              \
    KB_DEPTHWISE(dt, T, _k5, (kb::depthwise<T, 5, true>))                                              \
    KB_DEPTHWISE(dt, T, _wide, (kb::depthwise_in<T, i64, 0>))                                          \
    extern "C" __global__ void conv_transpose_##dt(const T* x, const T* wt, const T* b, T* y, i64 n, i64 c, \
                                                   i64 f, i64 groups, KB_WIN_PARAMS, int has_b) {         \
        kb::conv_t3<T>(x, wt, b, y, n, c, f, groups, KB_WIN, has_b);                                      \
    }                                                                                                     \
    KB_POOL(dt, T, , pool_plane32)                                                                     \
    KB_POOL(dt, T, _vol, pool_volume32)                                                                \
    KB_POOL(dt, T, _wide, pool_wide)
KB_EACH(KB_WINDOWED, 0)

#define KB_CONVERT(S, SN, D, DN)                                                                          \
    extern "C" __global__ void cast_##SN##_##DN(const S* x, D* y, i64 n) { kb::convert<S, D>(x, y, n); }
KB_CONVERT(float, f32, __half, f16)
KB_CONVERT(float, f32, __nv_bfloat16, bf16)
KB_CONVERT(__half, f16, float, f32)
KB_CONVERT(__half, f16, __nv_bfloat16, bf16)
KB_CONVERT(__nv_bfloat16, bf16, float, f32)
KB_CONVERT(__nv_bfloat16, bf16, __half, f16)

// Transposes (and any strided copy) by element size; the b strides are unused.
#define KB_STRIDED_COPY(T, bits)                                                                          \
    extern "C" __global__ void copy_strided_b##bits(const T* x, T* y, i64 n, int nd, KB_DIMS_PARAMS) {    \
        kb::strided_copy<T>(x, y, n, KB_DIMS(nd));                                                        \
    }
KB_STRIDED_COPY(unsigned short, 16)
KB_STRIDED_COPY(unsigned int, 32)
KB_STRIDED_COPY(unsigned long long, 64)

#define KB_FLIP(T, bits)                                                                                 \
    extern "C" __global__ void copy_flip_b##bits(const T* x, T* y, i64 n, i64 inner, i64 extent, i64 m_inner, \
                                                 i64 m_extent) {                                         \
        kb::flip<T>(x, y, n, inner, extent, m_inner, m_extent);                                           \
    }
KB_FLIP(unsigned short, 16)
KB_FLIP(unsigned int, 32)
KB_FLIP(unsigned long long, 64)

// triu / tril: y = x where col - row is at least (upper) or at most `diag`, else zero, over the
// rows x cols matrices of the last two axes.
#define KB_TRIANGLE(T, bits)                                                                             \
    extern "C" __global__ void copy_triangle_b##bits(const T* x, T* y, i64 n, i64 rows, i64 cols, i64 diag,  \
                                                int upper) {                                            \
        for (i64 i = kb::gtid(); i < n; i += kb::gstride()) {                                            \
            i64 off = i % cols - (i / cols) % rows;                                                      \
            bool keep = upper ? off >= diag : off <= diag;                                               \
            y[i] = keep ? x[i] : (T)0;                                                                   \
        }                                                                                                \
    }
KB_TRIANGLE(unsigned short, 16)
KB_TRIANGLE(unsigned int, 32)
KB_TRIANGLE(unsigned long long, 64)

// Any tensor, as bytes: 16-byte chunks when both ends allow, else byte by byte.
extern "C" __global__ void copy_bytes(const unsigned char* x, unsigned char* y, i64 nbytes) {
    i64 start = kb::gtid(), stride = kb::gstride(), tail = 0;
    if (kb::aligned16(x) && kb::aligned16(y)) {
        i64 nv = nbytes / 16;
        const uint4* xp = reinterpret_cast<const uint4*>(x);
        uint4* yp = reinterpret_cast<uint4*>(y);
        for (i64 i = start; i < nv; i += stride) yp[i] = xp[i];
        tail = nv * 16;
    }
    for (i64 i = tail + start; i < nbytes; i += stride) y[i] = x[i];
}
