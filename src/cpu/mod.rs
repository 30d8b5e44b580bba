//! A CUDA device model for the CPU: candidate kernels compiled with the host C++ compiler
//! against `runtime/kevin_cuda.h` and run on CPU threads, so correctness can be checked without
//! a GPU. [`worker`] is the `kevin worker --role cpu` child that runs the evaluation protocols
//! of [`crate::verify`] on such modules; its parent side is `crate::env::cpu`. Nothing here
//! imports `env` (the environments import the devices, never the other way round).
//!
//! Steps: [`compile()`] turns a candidate's source and its [`ResolvedPlan`] into a shared
//! library (`g++`/`clang++`, with a deadline) that exports one launcher per launched kernel;
//! [`Module::load`] opens it and [`Module::launch`] runs one [`ResolvedLaunch`] over host
//! buffers (device pointers are host pointers here).
//!
//! # The model
//!
//! Each CUDA thread of a block is a fiber with a 64 KiB stack (plus a guard page); the fibers of
//! a block run cooperatively on one OS thread, switching only at `__syncthreads` and warp
//! operations, so `__shared__` is a `thread_local` static. Blocks are spread over `threads` OS
//! threads taking block indices from an atomic counter; atomics are real atomics. Warp operations
//! are warp-synchronous: the last lane of the mask to arrive computes every lane's result.
//! Kernels of a source with no barrier or warp operation run their threads as a plain loop.
//! Dynamic `extern __shared__` arrays are rewritten into pointers to a per-block buffer of the
//! launch's `smem` bytes.
//!
//! Inline PTX (`ptx.rs`, `runtime/kevin_cuda_ptx.h`): the `asm` statements of the instructions
//! tensor-core GEMMs use are rewritten into calls of the runtime before compiling.
//! `mma.sync.aligned.m16n8k{8,16}.row.col` (f16/bf16 inputs; f32, or for f16 also f16,
//! accumulators) and `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.b16` are warp-synchronous
//! like the shuffles, with the fragment layouts of the PTX ISA; an mma's elements are computed
//! exactly in double precision and rounded once. `cp.async.{ca,cg}.shared.global` copies at
//! once (legal: its data must only be visible after the wait), so `commit_group`/`wait_group`
//! are no-ops. Shared-memory addresses (`__cvta_generic_to_shared`, the operands of `.shared`
//! instructions) are offsets in a 32-bit window over the static `__shared__` variables (this
//! module's TLS block) and the dynamic buffer; one outside it fails the launch.
//!
//! # Safety
//!
//! [`Module::launch`] runs untrusted code in the calling process, with its memory and its
//! privileges: a wild pointer corrupts or crashes the caller, an endless loop never returns. Call
//! it only inside a worker child process with a deadline (see [`crate::worker`]); compiling
//! ([`compile()`]) is safe anywhere (it runs the compiler as a child process with a deadline).
//!
//! # Limits (what the model does not reproduce, and what happens instead)
//!
//! - Inline PTX other than the forms above (any other instruction, `{ .reg ... }` blocks,
//!   predicates, operand modifiers, `asm goto`, a template that is not a string literal), the
//!   `wmma` API (`mma.h`), `cuda_pipeline.h`, cooperative groups (including grid sync), libcu++
//!   (`cuda/`) headers, `cuda_fp8.h`, textures and surfaces: [`CpuCompileError::Unsupported`]
//!   before compiling, naming the instruction or feature. A recognised instruction written
//!   wrongly (operand count, constraint) is a [`CpuCompileError::Source`] naming the line, as
//!   `ptxas` would reject it.
//! - Tensor-core rounding: an mma here rounds once from the exact result; hardware accumulates
//!   with its own internal precision and rounding, which PTX does not specify, so the two can
//!   differ in the last bits of an f32 result (far inside any task tolerance).
//! - Divergent warp operations (a lane named by the mask never arrives, lanes meet at different
//!   kinds of warp operation or with different masks, the caller is outside its mask):
//!   [`LaunchFailure::Unsupported`] ("divergent warp in `__shfl_sync`"). `__activemask()` returns
//!   every existing lane of the warp.
//! - A `__syncthreads` that some threads of a block never reach (they exited): CUDA leaves it
//!   undefined; [`LaunchFailure::Launch`] ("not all threads of a block reached __syncthreads").
//! - Weak memory ordering: the fibers of a block run one at a time and see each other's writes at
//!   switch points, which is stronger than CUDA; code that is racy on a GPU may pass here. Legacy
//!   warp-synchronous code (implicit lock-step through `volatile` shared memory, without
//!   `__syncwarp`) runs lane after lane and may compute a wrong result: the one known gap where
//!   the model can give a wrong verdict instead of an unsupported one (it is undefined behaviour
//!   since Volta anyway).
//! - Spin-waiting on another thread of the same block (fibers are not preempted) or on a block
//!   that has not started never ends: the worker's deadline turns it into a timeout.
//! - `cp.async` data is visible before its `wait_group`: a kernel that reads a stage it has not
//!   waited for (a race on a GPU) may pass here, like the weak-ordering gap above.
//! - `printf` output is dropped (a worker's stdout is its protocol channel); `assert`,
//!   `__trap()` and `__brkpt()` fail the launch with [`LaunchFailure::Trap`] (a crash, as on a GPU).
//! - Shared memory is never zero by luck: when a launch starts, each OS thread fills its copy of
//!   every static `__shared__` variable (the module's thread-local storage) and its dynamic
//!   shared buffer with 0xff bytes (NaN, -1), so reading shared memory before writing it gives a
//!   wrong result (g++ runs with `-fno-ipa-reference-addressable`, or it would fold reads of a
//!   `__shared__` array nothing writes to zero). Later blocks on the same OS thread see what the
//!   previous block left, as on a GPU.
//! - `clock()`/`clock64()`/`%globaltimer` are already rejected by the candidate rules.
//! - Stack overflow (deep recursion, huge local arrays beyond 64 KiB per thread) hits a guard
//!   page: the process crashes, which the worker reports as a crash.
//! - Fast-math intrinsics (`__expf`, `__fdividef`, ...) are computed at full precision; fp16 and
//!   bf16 arithmetic is float arithmetic rounded to nearest even. `double` → half goes through
//!   float (double rounding, off by one ulp in rare ties).
//! - x86-64 only (the context switch is hand-written assembly; glibc's `swapcontext` makes a
//!   system call per switch).

#[cfg(test)]
mod buffer;
mod compile;
pub mod elf;
#[cfg(unix)]
pub mod executor;
mod module;
mod ptx;
#[cfg(unix)]
pub mod sandbox;
mod scan;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod seccomp;
#[cfg(test)]
mod tests;
#[cfg(unix)]
mod timer;
#[cfg(unix)]
pub mod worker;

#[cfg(test)]
use buffer::HostBuffer;
pub use compile::{
    compile, compile_with_deadline, find_compiler, CpuCompileError, COMPILE_DEADLINE,
    COMPILE_MEMORY_LIMIT,
};
pub use module::{LaunchFailure, Module};

#[cfg(doc)]
use crate::candidate::{ResolvedLaunch, ResolvedPlan};

/// The runtime headers, embedded in the binary and written next to each compile: file name and
/// contents. The stubs make `#include <cuda_fp16.h>` and friends resolve to the model.
pub const HEADERS: [(&str, &str); 10] = [
    ("kevin_cuda.h", include_str!("runtime/kevin_cuda.h")),
    (
        "kevin_cuda_warp.h",
        include_str!("runtime/kevin_cuda_warp.h"),
    ),
    (
        "kevin_cuda_math.h",
        include_str!("runtime/kevin_cuda_math.h"),
    ),
    (
        "kevin_cuda_fp16.h",
        include_str!("runtime/kevin_cuda_fp16.h"),
    ),
    ("kevin_cuda_ptx.h", include_str!("runtime/kevin_cuda_ptx.h")),
    ("cuda_fp16.h", STUB),
    ("cuda_bf16.h", STUB),
    ("cuda_runtime.h", STUB),
    ("cuda.h", STUB),
    ("math_constants.h", STUB),
];

const STUB: &str = "#pragma once\n#include \"kevin_cuda.h\"\n";
