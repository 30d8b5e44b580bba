// kevin_cuda_warp.h: warp operations and atomics of kevin's CPU device model (see kevin_cuda.h).
//
// Warp operations are warp-synchronous: each lane deposits its value and waits (switches to the
// scheduler) until every lane its mask names has arrived at the same kind of operation; the last
// lane computes every lane's result. A lane named by the mask that never arrives (it exited, or
// waits elsewhere) is divergence, reported as unsupported rather than guessed.
#pragma once

namespace kevin {

static inline unsigned existing_lanes(unsigned warp) {
    unsigned n = tls_block->launch->nthreads;
    unsigned first = warp * 32;
    unsigned count = n - first >= 32 ? 32 : n - first;
    return count == 32 ? 0xffffffffu : ((1u << count) - 1);
}

static inline void warp_fail(const char* what, int kind) {
    char m[128];
    snprintf(m, sizeof m, "%s in %s", what, warp_kind_name(kind));
    fail(KEVIN_UNSUPPORTED, m);
    to_scheduler(tls_fiber);
    __builtin_unreachable();
}

static inline void warp_compute(Warp& w) {
    const unsigned need = w.need;
    const int width = w.width;
    uint64_t acc = 0;
    bool first = true;
    if (w.kind == W_BALLOT) {
        for (unsigned l = 0; l < 32; ++l)
            if ((need >> l & 1) && w.val[l]) acc |= 1ull << l;
    } else if (w.kind >= W_RADD) {
        for (unsigned l = 0; l < 32; ++l) {
            if (!(need >> l & 1)) continue;
            uint64_t v = w.val[l];
            if (first) { acc = v; first = false; continue; }
            switch (w.kind) {
                case W_RADD: acc = uint32_t(acc + v); break;
                case W_RMIN: acc = int32_t(v) < int32_t(acc) ? v : acc; break;
                case W_RMAX: acc = int32_t(v) > int32_t(acc) ? v : acc; break;
                case W_RUMIN: acc = uint32_t(v) < uint32_t(acc) ? v : acc; break;
                case W_RUMAX: acc = uint32_t(v) > uint32_t(acc) ? v : acc; break;
                case W_RAND: acc &= v; break;
                case W_ROR: acc |= v; break;
                default: acc ^= v; break;
            }
        }
    }
    for (unsigned l = 0; l < 32; ++l) {
        if (!(need >> l & 1)) continue;
        if (w.kind == W_BALLOT || w.kind >= W_RADD) { w.res[l] = acc; continue; }
        if (w.kind == W_SYNC) continue;
        unsigned seg = l & ~unsigned(width - 1);
        unsigned arg = unsigned(w.arg[l]);
        unsigned src = l;
        switch (w.kind) {
            case W_SHFL: src = seg + (arg & unsigned(width - 1)); break;
            case W_UP: src = (arg <= l - seg) ? l - arg : l; break;
            case W_DOWN: src = (l + arg < seg + unsigned(width)) ? l + arg : l; break;
            default: src = l ^ arg; if (src >= seg + unsigned(width)) src = l; break;
        }
        // Reading a lane outside the mask is undefined in CUDA; kevin returns the lane's own value.
        w.res[l] = (src < 32 && (need >> src & 1)) ? w.val[src] : w.val[l];
    }
}

// The arrival protocol every warp operation shares: the lanes of `need` deposit `val` and `arg`
// and wait; they must meet at the same `kind` with the same `need` and `shape` (a shuffle's width,
// a PTX instruction's variant), else the warp diverged. The last lane to arrive runs `compute`,
// which fills `res` (or writes through the deposited pointers), and releases the others.
static inline uint64_t warp_arrive(int kind, unsigned need, int shape, uint64_t val, int arg, void (*compute)(Warp&)) {
    Fiber* f = tls_fiber;
    Block* b = f->blk;
    if (!b->launch->fibers) kevin_abandon(::kevin::KEVIN_LAUNCH_ERROR, "internal: warp operation in a kernel compiled without fibers");
    unsigned wi = f->linear >> 5, lane = f->linear & 31;
    Warp& w = b->warps[wi];
    if (!(need >> lane & 1)) warp_fail("calling lane outside the mask", kind);
    if (w.arrived == 0) {
        w.kind = kind;
        w.need = need;
        w.width = shape;
    } else if (w.kind != kind || w.need != need || w.width != shape) {
        warp_fail("divergent warp", w.kind);
    }
    w.val[lane] = val;
    w.arg[lane] = arg;
    w.arrived |= 1u << lane;
    if (w.arrived == need) {
        compute(w);
        w.arrived = 0;
        for (unsigned l = 0; l < 32; ++l)
            if ((need >> l & 1) && l != lane) tls_worker->fibers[wi * 32 + l].state = RUNNABLE;
        return w.res[lane];
    }
    f->state = AT_WARP;
    to_scheduler(f);
    return w.res[lane];
}

static inline uint64_t warp_op(int kind, unsigned mask, uint64_t val, int arg, int width) {
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) warp_fail("width not a power of two up to 32", kind);
    unsigned need = mask & existing_lanes(tls_fiber->linear >> 5);
    return warp_arrive(kind, need, width, val, arg, warp_compute);
}

template <class T>
static inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffle of a type wider than 8 bytes");
    uint64_t r = 0;
    memcpy(&r, &v, sizeof(T));
    return r;
}
template <class T>
static inline T from_bits(uint64_t r) {
    T v;
    memcpy(&v, &r, sizeof(T));
    return v;
}

}  // namespace kevin

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ::kevin::from_bits<T>(::kevin::warp_op(::kevin::W_SHFL, mask, ::kevin::to_bits(v), src, width));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::kevin::from_bits<T>(::kevin::warp_op(::kevin::W_UP, mask, ::kevin::to_bits(v), int(delta), width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::kevin::from_bits<T>(::kevin::warp_op(::kevin::W_DOWN, mask, ::kevin::to_bits(v), int(delta), width));
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ::kevin::from_bits<T>(::kevin::warp_op(::kevin::W_XOR, mask, ::kevin::to_bits(v), lane_mask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return unsigned(::kevin::warp_op(::kevin::W_BALLOT, mask, pred != 0, 0, 32));
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == (mask & ::kevin::existing_lanes(::kevin::tls_fiber->linear >> 5));
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { ::kevin::warp_op(::kevin::W_SYNC, mask, 0, 0, 32); }
// Without divergence tracking, every existing lane of the warp counts as active.
static inline unsigned __activemask() { return ::kevin::existing_lanes(::kevin::tls_fiber->linear >> 5); }
static inline unsigned __lanemask_lt() { return (1u << (::kevin::tls_fiber->linear & 31)) - 1; }
#define KEVIN_REDUCE(name, kind, T) \
    static inline T name(unsigned mask, T v) { return T(::kevin::warp_op(::kevin::kind, mask, uint32_t(v), 0, 32)); }
KEVIN_REDUCE(__reduce_add_sync, W_RADD, int)
KEVIN_REDUCE(__reduce_add_sync, W_RADD, unsigned)
KEVIN_REDUCE(__reduce_min_sync, W_RMIN, int)
KEVIN_REDUCE(__reduce_min_sync, W_RUMIN, unsigned)
KEVIN_REDUCE(__reduce_max_sync, W_RMAX, int)
KEVIN_REDUCE(__reduce_max_sync, W_RUMAX, unsigned)
KEVIN_REDUCE(__reduce_and_sync, W_RAND, unsigned)
KEVIN_REDUCE(__reduce_or_sync, W_ROR, unsigned)
KEVIN_REDUCE(__reduce_xor_sync, W_RXOR, unsigned)
#undef KEVIN_REDUCE

// ---------------------------------------------------------------------------------------------
// Atomics: blocks run on several OS threads, so these are real (sequentially consistent) atomics.
#define KEVIN_ATOMIC_INT(T)                                                                              \
    static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }        \
    static inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }        \
    static inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }        \
    static inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }          \
    static inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }        \
    static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }      \
    static inline T atomicCAS(T* p, T cmp, T v) {                                                      \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
        return cmp;                                                                                    \
    }                                                                                                  \
    static inline T atomicMax(T* p, T v) {                                                             \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                  \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
        return old;                                                                                    \
    }                                                                                                  \
    static inline T atomicMin(T* p, T v) {                                                             \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                  \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
        return old;                                                                                    \
    }
KEVIN_ATOMIC_INT(int)
KEVIN_ATOMIC_INT(unsigned int)
KEVIN_ATOMIC_INT(unsigned long long)
KEVIN_ATOMIC_INT(long long)
#undef KEVIN_ATOMIC_INT

#define KEVIN_ATOMIC_FLOAT(T, U)                                                                         \
    static inline T kevin_atomic_update(T* p, T v, int op) {                                           \
        U* q = reinterpret_cast<U*>(p);                                                                \
        U old = __atomic_load_n(q, __ATOMIC_SEQ_CST);                                                  \
        for (;;) {                                                                                     \
            T o;                                                                                       \
            memcpy(&o, &old, sizeof o);                                                                \
            T n = op == 0 ? o + v : op == 1 ? (o < v ? v : o) : op == 2 ? (o > v ? v : o) : v;         \
            U nb;                                                                                      \
            memcpy(&nb, &n, sizeof nb);                                                                \
            if (__atomic_compare_exchange_n(q, &old, nb, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))    \
                return o;                                                                              \
        }                                                                                              \
    }                                                                                                  \
    static inline T atomicAdd(T* p, T v) { return kevin_atomic_update(p, v, 0); }                      \
    static inline T atomicSub(T* p, T v) { return kevin_atomic_update(p, -v, 0); }                     \
    static inline T atomicMax(T* p, T v) { return kevin_atomic_update(p, v, 1); }                      \
    static inline T atomicMin(T* p, T v) { return kevin_atomic_update(p, v, 2); }                      \
    static inline T atomicExch(T* p, T v) { return kevin_atomic_update(p, v, 3); }
KEVIN_ATOMIC_FLOAT(float, uint32_t)
KEVIN_ATOMIC_FLOAT(double, uint64_t)
#undef KEVIN_ATOMIC_FLOAT

static inline unsigned atomicInc(unsigned* p, unsigned limit) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0 : old + 1, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline unsigned atomicDec(unsigned* p, unsigned limit) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(p, &old, (old == 0 || old > limit) ? limit : old - 1, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
// Scoped variants: every scope is the whole process here.
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicCAS_block atomicCAS
#define atomicExch_block atomicExch
