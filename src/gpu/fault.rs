//! Sticky faults: once a candidate poisons this worker's CUDA context (illegal address, trap,
//! misaligned access) or outlives its run limit, every later answer says so and the parent
//! replaces the worker. Also how a GPU error becomes the candidate's failure.

use crate::verify::correctness::HarnessError;
use crate::verify::ExecFailure;

use super::device::GpuError;

/// Set once a sticky fault has poisoned this process's context: every later answer says so, and
/// the parent replaces the worker.
static POISONED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this worker's context is poisoned (it must be replaced).
pub fn poisoned() -> bool {
    POISONED.load(std::sync::atomic::Ordering::SeqCst)
}

/// A candidate's run outlived its limit: it is still on the GPU, so this worker must go.
pub(super) fn overran(limit: std::time::Duration) -> ExecFailure {
    POISONED.store(true, std::sync::atomic::Ordering::SeqCst);
    ExecFailure::Timeout {
        limit_ms: limit.as_millis() as u64,
    }
}

pub(super) fn note_fault(e: &GpuError) {
    if e.is_sticky() {
        POISONED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

pub(super) fn harness(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Backend(e.to_string())
}

/// A GPU error as the candidate's failure: a sticky fault is its crash (and poisons this worker);
/// anything else is what `otherwise` makes of it (a refused launch, or the harness's own error).
pub(super) fn fault_or(
    e: GpuError,
    otherwise: impl FnOnce(GpuError) -> ExecFailure,
) -> ExecFailure {
    note_fault(&e);
    if e.is_sticky() {
        ExecFailure::Crash(format!("the kernel faulted: {} (at {})", e.fault(), e.call))
    } else {
        otherwise(e)
    }
}

/// A GPU error during the harness's own work: a sticky one was caused by the candidate (the
/// harness's kernels are trusted and the context was fine before the candidate ran).
pub(super) fn exec_failure(e: GpuError) -> ExecFailure {
    fault_or(e, |e| ExecFailure::Harness(e.to_string()))
}
