// kevin_cuda_math.h: CUDA's math API, bit casts, __ldg, and fp16/bf16 types for kevin's CPU
// device model (see kevin_cuda.h). Fast intrinsics (__expf, __fdividef, ...) are computed at full
// precision: they are allowed to be less accurate on a GPU, never required to be.
#pragma once

template <class T>
static inline T __ldg(const T* p) { return *p; }
template <class T>
static inline T __ldcg(const T* p) { return *p; }
template <class T>
static inline T __ldca(const T* p) { return *p; }
template <class T>
static inline T __ldcs(const T* p) { return *p; }
template <class T>
static inline T __ldlu(const T* p) { return *p; }
template <class T>
static inline void __stcg(T* p, T v) { *p = v; }
template <class T>
static inline void __stcs(T* p, T v) { *p = v; }
template <class T>
static inline void __stwt(T* p, T v) { *p = v; }

namespace kevin {
template <class To, class From>
static inline To bitcast(From f) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between sizes");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
}  // namespace kevin
static inline float __int_as_float(int x) { return ::kevin::bitcast<float>(x); }
static inline int __float_as_int(float x) { return ::kevin::bitcast<int>(x); }
static inline float __uint_as_float(unsigned x) { return ::kevin::bitcast<float>(x); }
static inline unsigned __float_as_uint(float x) { return ::kevin::bitcast<unsigned>(x); }
static inline double __longlong_as_double(long long x) { return ::kevin::bitcast<double>(x); }
static inline long long __double_as_longlong(double x) { return ::kevin::bitcast<long long>(x); }
static inline int __double2hiint(double x) { return int(::kevin::bitcast<unsigned long long>(x) >> 32); }
static inline int __double2loint(double x) { return int(::kevin::bitcast<unsigned long long>(x)); }

// min/max as CUDA overloads them: floating point like fmin/fmax (NaN-ignoring), integers by the
// usual arithmetic conversions.
template <class A, class B>
static inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if (std::is_floating_point<C>::value) return C(std::fmin(C(a), C(b)));
    return C(a) < C(b) ? C(a) : C(b);
}
template <class A, class B>
static inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if (std::is_floating_point<C>::value) return C(std::fmax(C(a), C(b)));
    return C(a) > C(b) ? C(a) : C(b);
}
static inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long llmin(long long a, long long b) { return a < b ? a : b; }
static inline long long llmax(long long a, long long b) { return a > b ? a : b; }

// Single-precision intrinsics and functions that glibc lacks.
// glibc declares __expf & co. itself (as its internal names), so the CUDA names are macros.
static inline float kevin_expf(float x) { return expf(x); }
static inline float kevin_exp10f(float x) { return exp10f(x); }
static inline float kevin_logf(float x) { return logf(x); }
static inline float kevin_log2f(float x) { return log2f(x); }
static inline float kevin_log10f(float x) { return log10f(x); }
static inline float kevin_sinf(float x) { return sinf(x); }
static inline float kevin_cosf(float x) { return cosf(x); }
static inline float kevin_tanf(float x) { return tanf(x); }
static inline void kevin_sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
static inline float kevin_powf(float x, float y) { return powf(x, y); }
#define __expf kevin_expf
#define __exp10f kevin_exp10f
#define __logf kevin_logf
#define __log2f kevin_log2f
#define __log10f kevin_log10f
#define __sinf kevin_sinf
#define __cosf kevin_cosf
#define __tanf kevin_tanf
#define __sincosf kevin_sincosf
#define __powf kevin_powf
static inline float __fdividef(float x, float y) { return x / y; }
static inline float fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }
static inline float saturate(float x) { return __saturatef(x); }
static inline float sinpif(float x) { return sinf(float(M_PI) * x); }
static inline float cospif(float x) { return cosf(float(M_PI) * x); }
static inline void sincospif(float x, float* s, float* c) { *s = sinpif(x); *c = cospif(x); }
static inline float normcdff(float x) { return 0.5f * erfcf(-x * float(M_SQRT1_2)); }
static inline double normcdf(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }
#define KEVIN_ROUNDED(op, expr)                                         \
    static inline float __f##op##_rn(float a, float b) { return expr; } \
    static inline float __f##op##_rz(float a, float b) { return expr; } \
    static inline float __f##op##_ru(float a, float b) { return expr; } \
    static inline float __f##op##_rd(float a, float b) { return expr; } \
    static inline double __d##op##_rn(double a, double b) { return expr; }
KEVIN_ROUNDED(add, a + b)
KEVIN_ROUNDED(sub, a - b)
KEVIN_ROUNDED(mul, a * b)
KEVIN_ROUNDED(div, a / b)
#undef KEVIN_ROUNDED
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmaf_rz(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

// Conversions.
static inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
static inline int __float2int_rz(float x) { return int(x); }
static inline int __float2int_rd(float x) { return int(floorf(x)); }
static inline int __float2int_ru(float x) { return int(ceilf(x)); }
static inline unsigned __float2uint_rn(float x) { return unsigned(nearbyintf(x)); }
static inline unsigned __float2uint_rz(float x) { return unsigned(x); }
static inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
static inline long long __float2ll_rz(float x) { return (long long)x; }
static inline float __int2float_rn(int x) { return float(x); }
static inline float __uint2float_rn(unsigned x) { return float(x); }
static inline float __ll2float_rn(long long x) { return float(x); }
static inline float __double2float_rn(double x) { return float(x); }
static inline int __double2int_rn(double x) { return int(nearbyint(x)); }
static inline int __double2int_rz(double x) { return int(x); }
static inline double __int2double_rn(int x) { return double(x); }

// Integer intrinsics.
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
static inline unsigned long long __brevll(unsigned long long x) {
    return (unsigned long long)__brev(unsigned(x)) << 32 | __brev(unsigned(x >> 32));
}
static inline int __mul24(int a, int b) { return int((long long)(a << 8 >> 8) * (b << 8 >> 8)); }
static inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
static inline int __mulhi(int a, int b) { return int(((long long)a * b) >> 32); }
static inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned(((unsigned long long)a * b) >> 32); }
static inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline int __rhadd(int a, int b) { return int(((long long)a + b + 1) >> 1); }
static inline unsigned __urhadd(unsigned a, unsigned b) { return unsigned(((unsigned long long)a + b + 1) >> 1); }
static inline unsigned __uhadd(unsigned a, unsigned b) { return unsigned(((unsigned long long)a + b) >> 1); }
static inline unsigned __sad(int a, int b, unsigned c) { return c + unsigned(a > b ? a - b : b - a); }
static inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return c + (a > b ? a - b : b - a); }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= unsigned((v >> (((s >> (4 * i)) & 7) * 8)) & 0xff) << (8 * i);
    return r;
}
static inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return unsigned((v << (s & 31)) >> 32);
}
static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return unsigned(v >> (s & 31));
}

// math_constants.h (also available without the include, harmlessly).
#define CUDART_INF_F __int_as_float(0x7f800000)
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_MIN_DENORM_F __int_as_float(0x00000001)
#define CUDART_MAX_NORMAL_F __int_as_float(0x7f7fffff)
#define CUDART_NEG_ZERO_F __int_as_float(0x80000000)
#define CUDART_ZERO_F 0.0f
#define CUDART_ONE_F 1.0f
#define CUDART_PI_F 3.141592654f
#define CUDART_PIO2_F 1.570796327f
#define CUDART_SQRT_HALF_F 0.707106781f
#define CUDART_SQRT_2_F 1.414213562f
#define CUDART_L2E_F 1.442695041f
#define CUDART_L2T_F 3.321928094f
#define CUDART_LN2_F 0.693147181f
#define CUDART_INF __longlong_as_double(0x7ff0000000000000LL)
#define CUDART_NAN __longlong_as_double(0xfff8000000000000LL)
#define CUDART_PI 3.1415926535897931e+0
#define CUDART_LN2 6.9314718055994529e-1
#define CUDART_SQRT_HALF 7.0710678118654757e-1

#include "kevin_cuda_fp16.h"
