// kevin_cuda_ptx.h: the inline PTX kevin's CPU device model emulates (see kevin_cuda.h), and
// shared-memory addresses.
//
// kevin's compile step (src/cpu/ptx.rs) rewrites each `asm` statement whose instructions it
// recognises into calls of the functions below, with every operand read once into a local and
// every output written back through ptx_set; any other inline PTX is rejected before compiling.
//
// - mma.sync.aligned.m16n8k{8,16}.row.col with f16/bf16 A and B, f32 (or, for f16, f16) C and D:
//   warp-synchronous like the shuffles (kevin_cuda_warp.h). Each lane deposits a pointer to its
//   fragments; the last lane to arrive assembles A, B and C from the fragment layouts of the PTX
//   ISA, computes every D element exactly in double precision (the products of 16-bit floats are
//   exact) rounded once to D's type, and writes every lane's D fragment.
// - ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared}.b16: warp-synchronous; lanes 8i..8i+7
//   supply the row addresses of matrix i (16 bytes each, 16-byte aligned); lane l receives row
//   l/4, columns 2(l%4) and 2(l%4)+1 of each matrix (of its transpose with .trans).
// - cp.async.{ca,cg}.shared.global: copied at once (src-size bytes, the rest of cp-size zeroed).
//   That is a legal schedule: the data must only be visible after the matching wait_group, and
//   it is visible earlier. commit_group, wait_group and wait_all have nothing left to do.
//
// Shared-memory addresses (what __cvta_generic_to_shared returns and .shared instructions take):
// static __shared__ variables are thread_locals of this module (one TLS block per OS thread, see
// kevin_cuda.h) and dynamic shared memory is a per-worker buffer, so the model gives the two a
// 32-bit window like a GPU's: [0, 2^31) is the TLS block, as an offset from its base rounded
// down to 4 KiB (offsets keep their alignment), [2^31, 2^31 + smem) the dynamic buffer. Any
// address outside them, misaligned, or a pointer outside them converted, fails the launch, as
// an illegal address would on a GPU.
#pragma once

#include <link.h>

namespace kevin {

static constexpr uint64_t kDynamicShared = 0x80000000ull;

struct TlsSearch {
    const char* probe;
    char* lo;
    size_t size;
};

static int find_tls_window(struct dl_phdr_info* info, size_t, void* data) {
    TlsSearch* s = static_cast<TlsSearch*>(data);
    if (!info->dlpi_tls_data) return 0;
    char* lo = static_cast<char*>(info->dlpi_tls_data);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_TLS && s->probe >= lo && s->probe < lo + ph.p_memsz) {
            s->lo = lo;
            s->size = ph.p_memsz;
            return 1;
        }
    }
    return 0;
}

// The worker's view of shared memory, the TLS block looked up once per OS thread: the block
// that holds tls_worker (a thread_local of this module) is this module's.
static inline Worker& shared_window() {
    Worker& w = *tls_worker;
    if (!w.tls_lo) {
        TlsSearch s{reinterpret_cast<const char*>(&tls_worker), nullptr, 0};
        dl_iterate_phdr(find_tls_window, &s);
        if (!s.lo || s.size >= (1u << 30)) kevin_trap("internal: the static shared memory (TLS block) was not found");
        w.tls_lo = s.lo;
        w.tls_size = s.size;
    }
    return w;
}

static inline char* tls_base(const Worker& w) {
    return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(w.tls_lo) & ~uintptr_t(4095));
}

// True (with its shared address in *addr) when p points into shared memory or one past it.
static inline bool shared_addr_of(const void* p, uint64_t* addr) {
    Worker& w = shared_window();
    const char* c = static_cast<const char*>(p);
    if (w.smem && c >= w.smem && c <= w.smem + w.smem_size) {
        *addr = kDynamicShared + uint64_t(c - w.smem);
        return true;
    }
    if (c >= w.tls_lo && c <= w.tls_lo + w.tls_size) {
        *addr = uint64_t(c - tls_base(w));
        return true;
    }
    return false;
}

// The bytes [a, a + n) of shared memory; fails the launch when they are not all shared.
static inline char* shared_ptr(uint64_t a, uint64_t n, const char* what) {
    Worker& w = shared_window();
    if (a >= kDynamicShared) {
        uint64_t off = a - kDynamicShared;
        if (w.smem && off <= w.smem_size && n <= w.smem_size - off) return w.smem + off;
    } else {
        uint64_t lo = uint64_t(w.tls_lo - tls_base(w));
        if (a >= lo && a - lo <= w.tls_size && n <= w.tls_size - (a - lo)) return tls_base(w) + a;
    }
    char m[160];
    snprintf(m, sizeof m, "%s: shared address 0x%llx (%llu bytes) is outside the block's shared memory", what,
             (unsigned long long)a, (unsigned long long)n);
    kevin_trap(m);
    return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Operands: the bits of a C++ value bound to an asm operand, and the write-back of an output.
template <class T>
static inline uint32_t ptx_b32(const T& v) {
    if constexpr (std::is_integral<T>::value || std::is_enum<T>::value) {
        return uint32_t(v);
    } else {
        static_assert(sizeof(T) == 4, "kevin: an inline PTX operand with constraint r or f must be 32 bits");
        uint32_t r;
        memcpy(&r, &v, 4);
        return r;
    }
}
template <class T>
static inline uint64_t ptx_b64(const T& v) {
    if constexpr (std::is_pointer<T>::value) {
        return uint64_t(reinterpret_cast<uintptr_t>(v));
    } else if constexpr (std::is_integral<T>::value || std::is_enum<T>::value) {
        return uint64_t(v);
    } else {
        static_assert(sizeof(T) == 8, "kevin: an inline PTX operand with constraint l or d must be 64 bits");
        uint64_t r;
        memcpy(&r, &v, 8);
        return r;
    }
}
template <class T>
static inline void ptx_set(T& out, uint32_t bits) {
    if constexpr (std::is_integral<T>::value) {
        out = T(bits);
    } else {
        static_assert(sizeof(T) == 4, "kevin: an inline PTX output with constraint r or f must be 32 bits");
        memcpy(&out, &bits, 4);
    }
}

// ---------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k{8,16}.row.col: D (16x8) = A (16xK) * B (Kx8) + C.
enum PtxType : int { PTX_F16 = 0, PTX_BF16 = 1, PTX_F32 = 2 };

struct MmaLane {
    const uint32_t* a;  // K/4 registers of two A elements
    const uint32_t* b;  // K/8 registers of two B elements
    const uint32_t* c;  // 4 f32 or 2 f16x2 registers
    uint32_t* d;        // as c
};

static inline double ptx_half(uint32_t reg, int h, int type) {
    unsigned short v = (unsigned short)(reg >> (16 * h));
    return type == PTX_BF16 ? double(bf2f(v)) : double(h2f(v));
}

// The variant packs K (bits 0-4), the A/B type (8-9), C's (10-11) and D's (12-13).
static void mma_compute(Warp& w) {
    const int k = w.width & 31, ab = (w.width >> 8) & 3, ct = (w.width >> 10) & 3, dt = (w.width >> 12) & 3;
    double A[16][16], B[16][8], D[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        const MmaLane& m = *reinterpret_cast<const MmaLane*>(uintptr_t(w.val[l]));
        const int g = int(l >> 2), t = int(l & 3);
        // A: register i holds row g + 8(i%2), columns 2t + 8(i/2) and the next.
        for (int i = 0; i < k / 4; ++i)
            for (int h = 0; h < 2; ++h) A[g + 8 * (i & 1)][2 * t + h + 8 * (i >> 1)] = ptx_half(m.a[i], h, ab);
        // B: register i holds rows 2t + 8i and the next, column g.
        for (int i = 0; i < k / 8; ++i)
            for (int h = 0; h < 2; ++h) B[2 * t + h + 8 * i][g] = ptx_half(m.b[i], h, ab);
        // C: f32 register i is row g + 8(i/2), column 2t + i%2; f16x2 register i is row g + 8i,
        // columns 2t and 2t + 1.
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            D[row][col] = ct == PTX_F32 ? double(bitcast<float>(m.c[i])) : ptx_half(m.c[i >> 1], i & 1, PTX_F16);
        }
    }
    for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n)
            for (int i = 0; i < k; ++i) D[r][n] += A[r][i] * B[i][n];
    for (unsigned l = 0; l < 32; ++l) {
        const MmaLane& m = *reinterpret_cast<const MmaLane*>(uintptr_t(w.val[l]));
        const int g = int(l >> 2), t = int(l & 3);
        if (dt == PTX_F32) {
            for (int i = 0; i < 4; ++i) m.d[i] = bitcast<uint32_t>(float(D[g + 8 * (i >> 1)][2 * t + (i & 1)]));
        } else {
            for (int i = 0; i < 2; ++i)
                m.d[i] = uint32_t(f2h(float(D[g + 8 * i][2 * t]))) | uint32_t(f2h(float(D[g + 8 * i][2 * t + 1]))) << 16;
        }
    }
}

// The .sync.aligned instructions need the whole warp, with every lane at the same instruction.
static inline void ptx_warp_collective(int kind, int variant, void* lane_data, void (*compute)(Warp&)) {
    if (existing_lanes(tls_fiber->linear >> 5) != 0xffffffffu) warp_fail("a warp of fewer than 32 threads", kind);
    warp_arrive(kind, 0xffffffffu, variant, uint64_t(reinterpret_cast<uintptr_t>(lane_data)), 0, compute);
}

static inline void ptx_mma(int k, int ab, int ct, int dt, const uint32_t* a, const uint32_t* b, const uint32_t* c,
                           uint32_t* d) {
    MmaLane m{a, b, c, d};
    ptx_warp_collective(W_MMA, k | ab << 8 | ct << 10 | dt << 12, &m, mma_compute);
}

// ---------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared}.b16.
struct LdmatrixLane {
    uint64_t addr;  // a shared address, or a generic one without .shared
    uint32_t* d;    // one register per matrix
};

// The variant packs the number of matrices (bits 0-2), .trans (4) and generic addressing (5).
static void ldmatrix_compute(Warp& w) {
    const int num = w.width & 7;
    const bool trans = (w.width >> 4) & 1, generic = (w.width >> 5) & 1;
    uint16_t M[4][8][8];
    for (int i = 0; i < num; ++i)
        for (int r = 0; r < 8; ++r) {
            const int lane = 8 * i + r;
            uint64_t a = reinterpret_cast<const LdmatrixLane*>(uintptr_t(w.val[lane]))->addr;
            char m[160];
            if (generic && !shared_addr_of(reinterpret_cast<const void*>(uintptr_t(a)), &a)) {
                snprintf(m, sizeof m, "ldmatrix: the row address of lane %d is not in shared memory", lane);
                kevin_trap(m);
            }
            if (a % 16 != 0) {
                snprintf(m, sizeof m, "ldmatrix: the row address 0x%llx of lane %d is not 16-byte aligned",
                         (unsigned long long)a, lane);
                kevin_trap(m);
            }
            memcpy(M[i][r], shared_ptr(a, 16, "ldmatrix"), 16);
        }
    for (unsigned l = 0; l < 32; ++l) {
        const LdmatrixLane& x = *reinterpret_cast<const LdmatrixLane*>(uintptr_t(w.val[l]));
        const int g = int(l >> 2), t = int(l & 3);
        for (int i = 0; i < num; ++i) {
            const uint16_t lo = trans ? M[i][2 * t][g] : M[i][g][2 * t];
            const uint16_t hi = trans ? M[i][2 * t + 1][g] : M[i][g][2 * t + 1];
            x.d[i] = uint32_t(lo) | uint32_t(hi) << 16;
        }
    }
}

static inline void ptx_ldmatrix(int num, bool trans, bool shared, uint64_t addr, uint32_t* d) {
    LdmatrixLane x{addr, d};
    ptx_warp_collective(W_LDMATRIX, num | int(trans) << 4 | int(!shared) << 5, &x, ldmatrix_compute);
}

// ---------------------------------------------------------------------------------------------
// cp.async.{ca,cg}.shared.global [dst], [src], cp-size{, src-size}.
static inline void ptx_cp_async(bool cg, uint64_t dst, uint64_t src, uint64_t cp_size, uint64_t src_size) {
    char m[160];
    const char* op = cg ? "cp.async.cg" : "cp.async.ca";
    if (!(cp_size == 16 || (!cg && (cp_size == 4 || cp_size == 8)))) {
        snprintf(m, sizeof m, "%s: cp-size %llu (must be %s)", op, (unsigned long long)cp_size, cg ? "16" : "4, 8 or 16");
        kevin_trap(m);
    }
    if (src_size > cp_size) {
        snprintf(m, sizeof m, "%s: src-size %llu exceeds cp-size %llu", op, (unsigned long long)src_size,
                 (unsigned long long)cp_size);
        kevin_trap(m);
    }
    if (dst % cp_size != 0 || src % cp_size != 0) {
        snprintf(m, sizeof m, "%s: misaligned address (shared 0x%llx, global %p, %llu-byte copy)", op,
                 (unsigned long long)dst, reinterpret_cast<void*>(uintptr_t(src)), (unsigned long long)cp_size);
        kevin_trap(m);
    }
    char* d = shared_ptr(dst, cp_size, op);
    if (src_size) memcpy(d, reinterpret_cast<const void*>(uintptr_t(src)), src_size);
    memset(d + src_size, 0, cp_size - src_size);
}
static inline void ptx_cp_async_commit_group() {}
static inline void ptx_cp_async_wait_group(uint64_t) {}
static inline void ptx_cp_async_wait_all() {}

}  // namespace kevin

static inline size_t __cvta_generic_to_shared(const void* p) {
    uint64_t a = 0;
    if (!::kevin::shared_addr_of(p, &a)) kevin_trap("__cvta_generic_to_shared of a pointer outside shared memory");
    return size_t(a);
}
static inline void* __cvta_shared_to_generic(size_t a) {
    return ::kevin::shared_ptr(a, 0, "__cvta_shared_to_generic");
}
static inline size_t __cvta_generic_to_global(const void* p) { return reinterpret_cast<size_t>(p); }
static inline void* __cvta_global_to_generic(size_t a) { return reinterpret_cast<void*>(a); }
static inline bool __isShared(const void* p) {
    uint64_t a;
    return ::kevin::shared_addr_of(p, &a);
}
static inline bool __isGlobal(const void* p) { return !__isShared(p); }
