// kevin_cuda.h: a CUDA device model for the CPU (kevin's `cpu` module).
//
// Candidate device code is compiled as C++17 against this header. Each CUDA thread of a block is
// a fiber (a small stack and a saved stack pointer); the fibers of one block run cooperatively on
// one OS thread, so `__shared__` can be `static thread_local` (a block never migrates, and an OS
// thread runs one block at a time). `__syncthreads` and the warp operations switch back to the
// block's scheduler; the blocks of a grid are spread over several OS threads that take block
// indices from an atomic counter, so atomics are real atomics.
//
// Failures are reported, never guessed: a feature this model cannot reproduce faithfully
// (divergent warp operations, ...) sets the launch status to KEVIN_UNSUPPORTED, a kernel bug that
// CUDA leaves undefined (a barrier some threads never reach) to KEVIN_LAUNCH_ERROR, a device-side
// abort (__trap, assert) to KEVIN_TRAP; the block is abandoned and no further blocks start.
//
// Shared memory starts as garbage, as on a GPU, never as zeros: each OS thread fills its copy of
// the module's thread-local storage (every static __shared__ variable) and its dynamic shared
// buffer with 0xff bytes (NaN as a float, -1 as an integer) when a launch starts, so a kernel that
// reads shared memory it never wrote computes NaN instead of passing by luck.
#pragma once
#ifndef KEVIN_CUDA_H
#define KEVIN_CUDA_H

#include <math.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmath>
#include <cstdint>
#include <atomic>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#include <link.h>

// ---------------------------------------------------------------------------------------------
// Qualifiers. Kernels and device functions are ordinary C++ functions.
#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline
#define __inline__ inline
#define __launch_bounds__(...)
#define __constant__
#define __managed__
// One OS thread runs one block at a time and a block never changes OS thread, so a thread-local
// static is exactly "one copy per block". Its content at block start is 0xff bytes for the first
// block of a launch on that OS thread (poison_shared), then whatever the previous block left, which
// CUDA allows (shared memory is uninitialised). No `static` here: thread_local implies it at block
// scope, and `static __shared__` stays valid.
#define __shared__ thread_local
// GNU attributes may sit anywhere among decl-specifiers (alignas may not, e.g. after thread_local).
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __CUDACC__ 1
#define __CUDA_ARCH__ 900
#define __NVCC__ 1
#define warpSize 32

// ---------------------------------------------------------------------------------------------
// Vector types (alignment as in CUDA's vector_types.h).
#define KEVIN_VEC2(T, N, A) struct __attribute__((aligned(A))) N { T x, y; };
#define KEVIN_VEC3(T, N) struct N { T x, y, z; };
#define KEVIN_VEC4(T, N, A) struct __attribute__((aligned(A))) N { T x, y, z, w; };
KEVIN_VEC2(signed char, char2, 2) KEVIN_VEC4(signed char, char4, 4)
KEVIN_VEC2(unsigned char, uchar2, 2) KEVIN_VEC4(unsigned char, uchar4, 4)
KEVIN_VEC2(short, short2, 4) KEVIN_VEC4(short, short4, 8)
KEVIN_VEC2(unsigned short, ushort2, 4) KEVIN_VEC4(unsigned short, ushort4, 8)
KEVIN_VEC2(int, int2, 8) KEVIN_VEC3(int, int3) KEVIN_VEC4(int, int4, 16)
KEVIN_VEC2(unsigned int, uint2, 8) KEVIN_VEC3(unsigned int, uint3) KEVIN_VEC4(unsigned int, uint4, 16)
KEVIN_VEC2(long long, longlong2, 16) KEVIN_VEC2(unsigned long long, ulonglong2, 16)
KEVIN_VEC2(float, float2, 8) KEVIN_VEC3(float, float3) KEVIN_VEC4(float, float4, 16)
KEVIN_VEC2(double, double2, 16) KEVIN_VEC3(double, double3)
#undef KEVIN_VEC2
#undef KEVIN_VEC3
#undef KEVIN_VEC4
#define KEVIN_MAKE2(T, N) static inline N make_##N(T x, T y) { N r; r.x = x; r.y = y; return r; }
#define KEVIN_MAKE3(T, N) static inline N make_##N(T x, T y, T z) { N r; r.x = x; r.y = y; r.z = z; return r; }
#define KEVIN_MAKE4(T, N) static inline N make_##N(T x, T y, T z, T w) { N r; r.x = x; r.y = y; r.z = z; r.w = w; return r; }
KEVIN_MAKE2(signed char, char2) KEVIN_MAKE4(signed char, char4)
KEVIN_MAKE2(unsigned char, uchar2) KEVIN_MAKE4(unsigned char, uchar4)
KEVIN_MAKE2(short, short2) KEVIN_MAKE4(short, short4)
KEVIN_MAKE2(unsigned short, ushort2) KEVIN_MAKE4(unsigned short, ushort4)
KEVIN_MAKE2(int, int2) KEVIN_MAKE3(int, int3) KEVIN_MAKE4(int, int4)
KEVIN_MAKE2(unsigned int, uint2) KEVIN_MAKE3(unsigned int, uint3) KEVIN_MAKE4(unsigned int, uint4)
KEVIN_MAKE2(long long, longlong2) KEVIN_MAKE2(unsigned long long, ulonglong2)
KEVIN_MAKE2(float, float2) KEVIN_MAKE3(float, float3) KEVIN_MAKE4(float, float4)
KEVIN_MAKE2(double, double2) KEVIN_MAKE3(double, double3)
#undef KEVIN_MAKE2
#undef KEVIN_MAKE3
#undef KEVIN_MAKE4

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

namespace kevin {

enum Status : int { KEVIN_OK = 0, KEVIN_UNSUPPORTED = 1, KEVIN_LAUNCH_ERROR = 2, KEVIN_TRAP = 3 };
enum FiberState : int { RUNNABLE = 0, AT_BARRIER = 1, AT_WARP = 2, DONE = 3 };
enum WarpKind : int { W_SHFL, W_UP, W_DOWN, W_XOR, W_BALLOT, W_SYNC, W_RADD, W_RMIN, W_RMAX, W_RAND, W_ROR, W_RXOR, W_RUMIN, W_RUMAX,
                      W_MMA, W_LDMATRIX };

static inline const char* warp_kind_name(int k) {
    static const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                  "__ballot_sync/__any_sync/__all_sync", "__syncwarp", "__reduce_add_sync",
                                  "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync",
                                  "__reduce_or_sync", "__reduce_xor_sync", "__reduce_min_sync", "__reduce_max_sync",
                                  "mma.sync", "ldmatrix"};
    return (k >= 0 && k <= W_LDMATRIX) ? names[k] : "a warp operation";
}

// One launch: what every block shares.
struct Launch {
    void (*body)(void*);  // runs the kernel for the current thread
    void* ctx;
    uint3 grid, block;
    unsigned smem;
    unsigned nthreads;    // threads per block
    bool fibers;          // false: the source has no barrier or warp op; threads run as a loop
    uint64_t nblocks;
    std::atomic<uint64_t> next{0};
    std::atomic<int> status{KEVIN_OK};
    char msg[256];
};

struct Block;
struct Fiber {
    void* sp;          // saved stack pointer while switched out
    uint3 tid;
    unsigned linear;
    int state;
    Block* blk;
};

struct Warp {
    int kind;
    unsigned need;     // lanes that must arrive (the mask of the first arrival, within the block)
    unsigned arrived;
    int width;         // a shuffle's width, or the variant of a PTX instruction (kevin_cuda_ptx.h)
    uint64_t val[32];
    int arg[32];
    uint64_t res[32];
};

struct Block {
    Launch* launch;
    uint3 idx;
    unsigned arrived;          // at __syncthreads
    int count_acc, count_res;  // __syncthreads_count/and/or
    bool failed;
    Warp warps[32];
};

// Per OS thread: the scheduler's context, the fibers and their stacks (reused across blocks).
struct Worker {
    void* sched_sp = nullptr;
    std::vector<Fiber> fibers;
    char* stacks = nullptr;
    size_t stack_count = 0;
    char* smem = nullptr;
    size_t smem_size = 0;
    // This module's TLS block on this OS thread (where the static __shared__ variables live),
    // found on first use by kevin_cuda_ptx.h to translate shared-memory addresses.
    char* tls_lo = nullptr;
    size_t tls_size = 0;
    Block block;
    ~Worker() {
        if (stacks) munmap(stacks, stack_count * kStride);
        free(smem);
    }
    // 64 KiB of stack per CUDA thread plus one guard page below it, so an overflow faults
    // (the worker process crashes) instead of corrupting a neighbour's stack.
    static constexpr size_t kStack = 64 * 1024;
    static constexpr size_t kGuard = 4096;
    static constexpr size_t kStride = kStack + kGuard;
};

static thread_local Worker* tls_worker = nullptr;
static thread_local Fiber* tls_fiber = nullptr;
static thread_local Block* tls_block = nullptr;

static inline void fail(int code, const char* what) {
    Block* b = tls_block;
    Launch* l = b->launch;
    int expected = KEVIN_OK;
    if (l->status.compare_exchange_strong(expected, code)) {
        snprintf(l->msg, sizeof l->msg, "%s (block (%u,%u,%u))", what, b->idx.x, b->idx.y, b->idx.z);
    }
    b->failed = true;
}

// ---------------------------------------------------------------------------------------------
// Context switch. x86-64: save the callee-saved registers on the old stack, swap stack pointers.
// Hand-written because glibc's swapcontext makes a sigprocmask system call per switch, which
// would dominate barrier-heavy kernels.
#if defined(__x86_64__)
extern "C" void kevin_ctx_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.p2align 4
.hidden kevin_ctx_switch
.type kevin_ctx_switch,@function
kevin_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size kevin_ctx_switch,.-kevin_ctx_switch
)");
static inline void* init_stack(char* top, void (*entry)()) {
    uintptr_t sp = reinterpret_cast<uintptr_t>(top) & ~uintptr_t(15);
    uint64_t* p = reinterpret_cast<uint64_t*>(sp);
    *--p = 0;                                      // fake return address of entry (never used)
    *--p = reinterpret_cast<uint64_t>(entry);      // `ret` of the first switch jumps here
    for (int i = 0; i < 6; ++i) *--p = 0;          // rbp rbx r12-r15
    uint32_t csr[2];
    __asm__ volatile("stmxcsr %0" : "=m"(csr[0]));
    __asm__ volatile("fnstcw %0" : "=m"(*reinterpret_cast<uint16_t*>(&csr[1])));
    *--p = (uint64_t(csr[1]) << 32) | csr[0];
    return p;
}
#else
#error "kevin's CPU device model has a context switch for x86-64 only"
#endif

static void fiber_entry();

static inline void to_scheduler(Fiber* f) {
    kevin_ctx_switch(&f->sp, tls_worker->sched_sp);
}

static void fiber_entry() {
    Fiber* f = tls_fiber;
    Launch* l = f->blk->launch;
    if (l->fibers) {
        l->body(l->ctx);
    } else {
        // No barrier or warp operation in the source: one fiber runs every thread in turn.
        Block* b = f->blk;
        for (unsigned z = 0; z < l->block.z; ++z)
            for (unsigned y = 0; y < l->block.y; ++y)
                for (unsigned x = 0; x < l->block.x; ++x) {
                    f->tid = uint3{x, y, z};
                    f->linear = x + l->block.x * (y + l->block.y * z);
                    l->body(l->ctx);
                    if (b->failed) break;
                }
    }
    f->state = DONE;
    to_scheduler(f);
    __builtin_unreachable();
}

// Runs one block to completion (or failure) on this OS thread.
static inline void run_block(Worker& w, Launch& l, uint3 idx) {
    Block& b = w.block;
    b.launch = &l;
    b.idx = idx;
    b.arrived = 0;
    b.count_acc = 0;
    b.failed = false;
    for (auto& wp : b.warps) wp.arrived = 0;
    tls_block = &b;
    unsigned n = l.fibers ? l.nthreads : 1;
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = w.fibers[i];
        f.linear = i;
        f.tid = uint3{i % l.block.x, (i / l.block.x) % l.block.y, i / (l.block.x * l.block.y)};
        f.state = RUNNABLE;
        f.blk = &b;
        char* base = w.stacks + i * Worker::kStride + Worker::kGuard;
        f.sp = init_stack(base + Worker::kStack, fiber_entry);
    }
    for (;;) {
        bool ran = false;
        unsigned done = 0;
        for (unsigned i = 0; i < n; ++i) {
            Fiber& f = w.fibers[i];
            if (f.state == RUNNABLE) {
                tls_fiber = &f;
                kevin_ctx_switch(&w.sched_sp, f.sp);
                ran = true;
                if (b.failed) return;
            }
            if (f.state == DONE) ++done;
        }
        if (done == n) return;
        if (ran) continue;
        // Nothing can run: diagnose the stall.
        for (unsigned i = 0; i < n; ++i) {
            Fiber& f = w.fibers[i];
            if (f.state == AT_WARP) {
                char m[128];
                snprintf(m, sizeof m, "divergent warp in %s", warp_kind_name(b.warps[i >> 5].kind));
                fail(KEVIN_UNSUPPORTED, m);
                return;
            }
        }
        fail(KEVIN_LAUNCH_ERROR, "not all threads of a block reached __syncthreads");
        return;
    }
}

// Poisoning shared memory: this module's thread-local storage block of the calling thread holds
// every static __shared__ variable (and the three tls_* pointers above, which worker_main sets
// afterwards). Its module id and size come from the module's PT_TLS program header; its address
// from __tls_get_addr at offset 0, the same call the compiler emits for a TLS access.
extern "C" void* __tls_get_addr(void*);
struct TlsBlock {
    uintptr_t inside;  // an address in this module's code
    size_t modid;
    size_t size;
};
static int find_tls_block(struct dl_phdr_info* info, size_t, void* data) {
    TlsBlock* t = static_cast<TlsBlock*>(data);
    bool mine = false;
    size_t size = 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && t->inside >= lo && t->inside < lo + ph.p_memsz) mine = true;
        if (ph.p_type == PT_TLS) size = ph.p_memsz;
    }
    if (!mine) return 0;
    t->modid = info->dlpi_tls_modid;
    t->size = size;
    return 1;
}
static inline void poison_shared() {
    TlsBlock t{reinterpret_cast<uintptr_t>(&find_tls_block), 0, 0};
    dl_iterate_phdr(find_tls_block, &t);
    if (t.modid == 0 || t.size == 0) return;
    size_t index[2] = {t.modid, 0};
    memset(__tls_get_addr(index), 0xff, t.size);
}

static inline void worker_main(Launch* l) {
    poison_shared();
    Worker w;
    tls_worker = &w;
    unsigned n = l->fibers ? l->nthreads : 1;
    w.fibers.resize(n);
    w.stack_count = n;
    void* mem = mmap(nullptr, n * Worker::kStride, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        int e = KEVIN_OK;
        if (l->status.compare_exchange_strong(e, KEVIN_LAUNCH_ERROR)) snprintf(l->msg, sizeof l->msg, "out of memory for fiber stacks");
        w.stack_count = 0;
        tls_worker = nullptr;
        return;
    }
    w.stacks = static_cast<char*>(mem);
    for (size_t i = 0; i < n; ++i) mprotect(w.stacks + i * Worker::kStride, Worker::kGuard, PROT_NONE);
    if (l->smem) {
        // Garbage like CUDA's (see the poisoning above); 128-byte aligned (CUDA guarantees 16).
        size_t bytes = (l->smem + 127) / 128 * 128;
        w.smem = static_cast<char*>(aligned_alloc(128, bytes));
        if (w.smem) memset(w.smem, 0xff, bytes);
        w.smem_size = l->smem;
    }
    for (;;) {
        if (l->status.load(std::memory_order_relaxed) != KEVIN_OK) break;
        uint64_t i = l->next.fetch_add(1);
        if (i >= l->nblocks) break;
        uint3 idx{unsigned(i % l->grid.x), unsigned((i / l->grid.x) % l->grid.y), unsigned(i / (uint64_t(l->grid.x) * l->grid.y))};
        run_block(w, *l, idx);
    }
    tls_worker = nullptr;
    tls_block = nullptr;
    tls_fiber = nullptr;
}

static inline int run_grid(Launch& l, int threads, char* err, int errlen) {
    l.nthreads = l.block.x * l.block.y * l.block.z;
    l.nblocks = uint64_t(l.grid.x) * l.grid.y * l.grid.z;
    l.msg[0] = 0;
    if (threads < 1) threads = 1;
    if (uint64_t(threads) > l.nblocks) threads = int(l.nblocks);
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker_main, &l);
    worker_main(&l);
    for (auto& t : pool) t.join();
    int s = l.status.load();
    if (s != KEVIN_OK && err && errlen > 0) snprintf(err, size_t(errlen), "%s", l.msg);
    return s;
}

template <class F>
static void call_body(void* ctx) { (*static_cast<F*>(ctx))(); }

template <class... P, size_t... I>
static int launch_impl(void (*k)(P...), void** args, std::index_sequence<I...>, const unsigned* grid,
                       const unsigned* block, unsigned smem, int threads, bool fibers, char* err, int errlen) {
    // Copies of the argument values, as cudaLaunchKernel makes; each thread gets its own copy
    // when the body passes them by value.
    std::tuple<typename std::decay<P>::type...> vals{*static_cast<typename std::decay<P>::type*>(args[I])...};
    (void)vals;
    auto body = [&]() { k(std::get<I>(vals)...); };
    Launch l;
    l.body = &call_body<decltype(body)>;
    l.ctx = &body;
    l.grid = uint3{grid[0], grid[1], grid[2]};
    l.block = uint3{block[0], block[1], block[2]};
    l.smem = smem;
    l.fibers = fibers;
    return run_grid(l, threads, err, errlen);
}

template <class... P>
static int nparams(void (*)(P...)) { return int(sizeof...(P)); }

template <class... P>
static int launch(void (*k)(P...), void** args, const unsigned* grid, const unsigned* block, unsigned smem,
                  int threads, bool fibers, char* err, int errlen) {
    return launch_impl(k, args, std::index_sequence_for<P...>{}, grid, block, smem, threads, fibers, err, errlen);
}

}  // namespace kevin

// ---------------------------------------------------------------------------------------------
// Built-in variables: values of the running fiber and block.
#define threadIdx (::kevin::tls_fiber->tid)
#define blockIdx (::kevin::tls_block->idx)
#define blockDim (::kevin::tls_block->launch->block)
#define gridDim (::kevin::tls_block->launch->grid)

static inline void* kevin_dynamic_smem() { return ::kevin::tls_worker->smem; }

// Fail the launch with `code` and abandon the block: KEVIN_TRAP for a device-side abort (assert,
// __trap; on a GPU the context dies and the worker with it), KEVIN_LAUNCH_ERROR for the model's own
// consistency checks.
static inline void kevin_abandon(int code, const char* what) {
    ::kevin::fail(code, what);
    ::kevin::to_scheduler(::kevin::tls_fiber);
    __builtin_unreachable();
}
static inline void kevin_trap(const char* what) { kevin_abandon(::kevin::KEVIN_TRAP, what); }
#define __trap() kevin_trap("__trap() called")
#define __brkpt() kevin_trap("__brkpt() called")
#undef assert
#define assert(c) ((c) ? (void)0 : kevin_trap("device assertion failed: " #c))
// Device printf output is dropped: a worker's stdout is its protocol channel.
#define printf(...) (0)

// ---------------------------------------------------------------------------------------------
// Barriers.
static inline int kevin_barrier(int pred) {
    using namespace ::kevin;
    Fiber* f = tls_fiber;
    Block* b = f->blk;
    if (!b->launch->fibers) {
        kevin_abandon(KEVIN_LAUNCH_ERROR, "internal: barrier in a kernel compiled without fibers");
    }
    b->count_acc += pred ? 1 : 0;
    if (++b->arrived == b->launch->nthreads) {
        // Last to arrive releases everyone and carries on without a switch.
        b->arrived = 0;
        b->count_res = b->count_acc;
        b->count_acc = 0;
        for (unsigned i = 0; i < b->launch->nthreads; ++i) {
            Fiber& o = tls_worker->fibers[i];
            if (o.state == AT_BARRIER) o.state = RUNNABLE;
        }
        return b->count_res;
    }
    f->state = AT_BARRIER;
    to_scheduler(f);
    return b->count_res;
}
static inline void __syncthreads() { kevin_barrier(0); }
static inline int __syncthreads_count(int p) { return kevin_barrier(p); }
static inline int __syncthreads_and(int p) { return kevin_barrier(p) == int(::kevin::tls_block->launch->nthreads); }
static inline int __syncthreads_or(int p) { return kevin_barrier(p) != 0; }

static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __nanosleep(unsigned) {}

#include "kevin_cuda_warp.h"
#include "kevin_cuda_math.h"
#include "kevin_cuda_ptx.h"

#endif  // KEVIN_CUDA_H
