// kevin_cuda_fp16.h: __half, __half2, __nv_bfloat16, __nv_bfloat162 for kevin's CPU device model.
// Conversions from float round to nearest even; arithmetic is done in float and rounded back,
// which is exact rounding of the true result for + - * / (float carries more than twice the bits
// of either format).
#pragma once

namespace kevin {
static inline unsigned short f2h(float f) {
    uint32_t x = bitcast<uint32_t>(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (unsigned short)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to infinity
    if (a < 0x38800000u) {
        // Subnormal half: a multiple of 2^-24; the scaling is exact and rint rounds to even.
        return (unsigned short)(sign | unsigned(nearbyintf(bitcast<float>(a) * 16777216.0f)));
    }
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a & 0x7fffffu) >> 13);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (unsigned short)(sign | h);
}
static inline float h2f(unsigned short h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = float(m) * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) return bitcast<float>(sign | 0x7f800000u | (m << 13));
    return bitcast<float>(sign | ((e + 112u) << 23) | (m << 13));
}
static inline unsigned short f2bf(float f) {
    uint32_t x = bitcast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float bf2f(unsigned short b) { return bitcast<float>(uint32_t(b) << 16); }
}  // namespace kevin

// The two 16-bit float types share everything but their conversions.
#define KEVIN_HALF_TYPE(H, H2, TOF, FROMF)                                                                  \
    struct __attribute__((aligned(2))) H {                                                                  \
        unsigned short __x;                                                                                 \
        H() = default;                                                                                      \
        H(float f) : __x(::kevin::FROMF(f)) {}                                                              \
        H(double f) : __x(::kevin::FROMF(float(f))) {}                                                      \
        H(int v) : __x(::kevin::FROMF(float(v))) {}                                                         \
        H(unsigned v) : __x(::kevin::FROMF(float(v))) {}                                                    \
        H(long long v) : __x(::kevin::FROMF(float(v))) {}                                                   \
        H(unsigned long long v) : __x(::kevin::FROMF(float(v))) {}                                          \
        operator float() const { return ::kevin::TOF(__x); }                                                \
        H& operator+=(const H& o) { return *this = H(float(*this) + float(o)); }                            \
        H& operator-=(const H& o) { return *this = H(float(*this) - float(o)); }                            \
        H& operator*=(const H& o) { return *this = H(float(*this) * float(o)); }                            \
        H& operator/=(const H& o) { return *this = H(float(*this) / float(o)); }                            \
    };                                                                                                      \
    static inline H operator+(const H& a, const H& b) { return H(float(a) + float(b)); }                   \
    static inline H operator-(const H& a, const H& b) { return H(float(a) - float(b)); }                   \
    static inline H operator*(const H& a, const H& b) { return H(float(a) * float(b)); }                   \
    static inline H operator/(const H& a, const H& b) { return H(float(a) / float(b)); }                   \
    static inline H operator-(const H& a) { H r; r.__x = (unsigned short)(a.__x ^ 0x8000u); return r; }    \
    static inline H operator+(const H& a) { return a; }                                                    \
    static inline bool operator==(const H& a, const H& b) { return float(a) == float(b); }                 \
    static inline bool operator!=(const H& a, const H& b) { return float(a) != float(b); }                 \
    static inline bool operator<(const H& a, const H& b) { return float(a) < float(b); }                   \
    static inline bool operator<=(const H& a, const H& b) { return float(a) <= float(b); }                 \
    static inline bool operator>(const H& a, const H& b) { return float(a) > float(b); }                   \
    static inline bool operator>=(const H& a, const H& b) { return float(a) >= float(b); }                 \
    struct __attribute__((aligned(4))) H2 {                                                                 \
        H x, y;                                                                                             \
        H2() = default;                                                                                     \
        H2(H a, H b) : x(a), y(b) {}                                                                        \
    };                                                                                                      \
    static inline H2 operator+(const H2& a, const H2& b) { return H2(a.x + b.x, a.y + b.y); }              \
    static inline H2 operator-(const H2& a, const H2& b) { return H2(a.x - b.x, a.y - b.y); }              \
    static inline H2 operator*(const H2& a, const H2& b) { return H2(a.x * b.x, a.y * b.y); }              \
    static inline H2 operator/(const H2& a, const H2& b) { return H2(a.x / b.x, a.y / b.y); }
KEVIN_HALF_TYPE(__half, __half2, h2f, f2h)
KEVIN_HALF_TYPE(__nv_bfloat16, __nv_bfloat162, bf2f, f2bf)
#undef KEVIN_HALF_TYPE
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
typedef __half __half_raw_kevin;

// Functions, generated for both types: P is the name part (half / bfloat16), H, H2 the types.
#define KEVIN_HALF_FNS(H, H2, P, P2)                                                                       \
    static inline H __float2##P(float f) { return H(f); }                                                  \
    static inline H __float2##P##_rn(float f) { return H(f); }                                             \
    static inline H __double2##P(double f) { return H(f); }                                                \
    static inline float __##P##2float(H h) { return float(h); }                                            \
    static inline H2 __floats2##P2##_rn(float a, float b) { return H2(H(a), H(b)); }                       \
    static inline H2 __float22##P2##_rn(float2 f) { return H2(H(f.x), H(f.y)); }                           \
    static inline H2 __float2##P2##_rn(float a) { return H2(H(a), H(a)); }                                 \
    static inline float2 __##P2##2float2(H2 h) { return make_float2(float(h.x), float(h.y)); }             \
    static inline float __low2float(H2 h) { return float(h.x); }                                          \
    static inline float __high2float(H2 h) { return float(h.y); }                                         \
    static inline H __low2##P(H2 h) { return h.x; }                                                        \
    static inline H __high2##P(H2 h) { return h.y; }                                                       \
    static inline H2 __##P##2##P2(H h) { return H2(h, h); }                                               \
    static inline H2 __halves2##P2(H a, H b) { return H2(a, b); }                                          \
    static inline H2 __lows2##P2(H2 a, H2 b) { return H2(a.x, b.x); }                                      \
    static inline H2 __highs2##P2(H2 a, H2 b) { return H2(a.y, b.y); }                                     \
    static inline H2 __low2##P2(H2 a) { return H2(a.x, a.x); }                                             \
    static inline H2 __high2##P2(H2 a) { return H2(a.y, a.y); }                                            \
    static inline H2 __lowhigh2highlow(H2 a) { return H2(a.y, a.x); }                                      \
    static inline int __##P##2int_rn(H h) { return __float2int_rn(float(h)); }                              \
    static inline int __##P##2int_rz(H h) { return int(float(h)); }                                        \
    static inline H __int2##P##_rn(int v) { return H(float(v)); }                                          \
    static inline H __hadd(H a, H b) { return a + b; }                                                     \
    static inline H __hsub(H a, H b) { return a - b; }                                                     \
    static inline H __hmul(H a, H b) { return a * b; }                                                     \
    static inline H __hdiv(H a, H b) { return a / b; }                                                     \
    static inline H __hfma(H a, H b, H c) { return H(fmaf(float(a), float(b), float(c))); }                \
    static inline H __hneg(H a) { return -a; }                                                             \
    static inline H __habs(H a) { H r; r.__x = (unsigned short)(a.__x & 0x7fffu); return r; }              \
    static inline H __hmax(H a, H b) { return H(fmaxf(float(a), float(b))); }                              \
    static inline H __hmin(H a, H b) { return H(fminf(float(a), float(b))); }                              \
    static inline bool __heq(H a, H b) { return a == b; }                                                  \
    static inline bool __hne(H a, H b) { return a != b; }                                                  \
    static inline bool __hlt(H a, H b) { return a < b; }                                                   \
    static inline bool __hle(H a, H b) { return a <= b; }                                                  \
    static inline bool __hgt(H a, H b) { return a > b; }                                                   \
    static inline bool __hge(H a, H b) { return a >= b; }                                                  \
    static inline bool __hisnan(H a) { return std::isnan(float(a)); }                                      \
    static inline int __hisinf(H a) { float f = float(a); return std::isinf(f) ? (f < 0 ? -1 : 1) : 0; }   \
    static inline H2 __hadd2(H2 a, H2 b) { return a + b; }                                                 \
    static inline H2 __hsub2(H2 a, H2 b) { return a - b; }                                                 \
    static inline H2 __hmul2(H2 a, H2 b) { return a * b; }                                                 \
    static inline H2 __h2div(H2 a, H2 b) { return a / b; }                                                 \
    static inline H2 __hfma2(H2 a, H2 b, H2 c) { return H2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); } \
    static inline H2 __hneg2(H2 a) { return H2(-a.x, -a.y); }                                              \
    static inline H2 __habs2(H2 a) { return H2(__habs(a.x), __habs(a.y)); }                                \
    static inline H2 __hmax2(H2 a, H2 b) { return H2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }                \
    static inline H2 __hmin2(H2 a, H2 b) { return H2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }                \
    static inline H hexp(H a) { return H(expf(float(a))); }                                                \
    static inline H hexp2(H a) { return H(exp2f(float(a))); }                                              \
    static inline H hlog(H a) { return H(logf(float(a))); }                                                \
    static inline H hlog2(H a) { return H(log2f(float(a))); }                                              \
    static inline H hsqrt(H a) { return H(sqrtf(float(a))); }                                              \
    static inline H hrsqrt(H a) { return H(1.0f / sqrtf(float(a))); }                                      \
    static inline H hrcp(H a) { return H(1.0f / float(a)); }                                               \
    static inline H hsin(H a) { return H(sinf(float(a))); }                                                \
    static inline H hcos(H a) { return H(cosf(float(a))); }                                                \
    static inline H htanh(H a) { return H(tanhf(float(a))); }                                              \
    static inline H hfloor(H a) { return H(floorf(float(a))); }                                            \
    static inline H hceil(H a) { return H(ceilf(float(a))); }                                              \
    static inline H2 h2exp(H2 a) { return H2(hexp(a.x), hexp(a.y)); }                                      \
    static inline H2 h2log(H2 a) { return H2(hlog(a.x), hlog(a.y)); }                                      \
    static inline H2 h2sqrt(H2 a) { return H2(hsqrt(a.x), hsqrt(a.y)); }                                   \
    static inline H2 h2rsqrt(H2 a) { return H2(hrsqrt(a.x), hrsqrt(a.y)); }                                \
    static inline H2 h2tanh(H2 a) { return H2(htanh(a.x), htanh(a.y)); }
KEVIN_HALF_FNS(__half, __half2, half, half2)
KEVIN_HALF_FNS(__nv_bfloat16, __nv_bfloat162, bfloat16, bfloat162)
#undef KEVIN_HALF_FNS
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline short __half_as_short(__half h) { return short(h.__x); }
static inline __half __ushort_as_half(unsigned short x) { __half h; h.__x = x; return h; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline short __bfloat16_as_short(__nv_bfloat16 h) { return short(h.__x); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { __nv_bfloat16 h; h.__x = x; return h; }
static inline __half2 make_half2(__half a, __half b) { return __half2(a, b); }
static inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
static inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    return __ushort_as_bfloat16((unsigned short)(__float_as_uint(f) >> 16));
}
static inline __half atomicAdd(__half* p, __half v) {
    // 16-bit CAS on the containing aligned 32-bit word would be needed for real atomicity of
    // neighbours; a 16-bit compare-exchange is what the hardware offers and GCC supports it.
    unsigned short* q = reinterpret_cast<unsigned short*>(p);
    unsigned short old = __atomic_load_n(q, __ATOMIC_SEQ_CST);
    for (;;) {
        unsigned short n = (__ushort_as_half(old) + v).__x;
        if (__atomic_compare_exchange_n(q, &old, n, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return __ushort_as_half(old);
    }
}
