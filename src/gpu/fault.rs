//! Sticky faults and who is at fault. Once a candidate poisons this worker's CUDA context
//! (illegal address, trap, misaligned access) or outlives its run limit, every later answer says
//! so and the parent replaces the worker.
//!
//! A GPU error is classified by *when* it happened, not by what it is ([`blame`]):
//! - anything before the current request's candidate first launched (creating the context,
//!   loading the harness, allocating the task's buffers, drawing inputs, computing the
//!   reference), and any error of a trusted step that is not a sticky context fault (an
//!   out-of-memory of `cuMemAllocAsync`, a failed copy), is the harness's: a
//!   [`HarnessError`](crate::verify::request::EvalResult::HarnessError), never the candidate's
//!   outcome;
//! - a sticky context fault after the candidate launched is the candidate's crash, wherever it
//!   surfaces (in its own synchronisation, or in a trusted kernel or copy that ran after it);
//! - a refused launch of the candidate's own kernels is its launch error.
//!
//! The module load of the candidate is the candidate's (a module with huge static `__device__`
//! arrays fails to load with out-of-memory by its own doing); its scratch buffers, sized by the
//! admitted launch plan, are the harness's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::verify::correctness::HarnessError;
use crate::verify::request::EvalResult;
use crate::verify::ExecFailure;

use super::device::GpuError;

/// Set once a sticky fault has poisoned this process's context: every later answer says so, and
/// the parent replaces the worker.
static POISONED: AtomicBool = AtomicBool::new(false);

/// Set when the current request's candidate issued its first launch ([`candidate_launches`]).
static LAUNCHED: AtomicBool = AtomicBool::new(false);

/// The first sticky fault seen during the current request.
static FAULT: Mutex<Option<String>> = Mutex::new(None);

/// Whether this worker's context is poisoned (it must be replaced).
pub fn poisoned() -> bool {
    POISONED.load(Ordering::SeqCst)
}

/// A new request starts: its candidate has not launched yet, and no fault was seen in it.
pub(super) fn request_starts() {
    LAUNCHED.store(false, Ordering::SeqCst);
    *FAULT.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The candidate is about to launch its first kernel of this request: from now on a sticky
/// fault is its doing.
pub(super) fn candidate_launches() {
    LAUNCHED.store(true, Ordering::SeqCst);
}

/// Whether the current request's candidate has launched.
pub(super) fn candidate_launched() -> bool {
    LAUNCHED.load(Ordering::SeqCst)
}

/// Who answers for a GPU error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The candidate: its outcome.
    Candidate,
    /// The harness: the candidate is not judged.
    Harness,
}

/// Who answers for an error: a sticky context fault after the candidate launched is the
/// candidate's; a sticky fault before its first launch, or any other error of a trusted step,
/// is the harness's.
pub fn blame(sticky: bool, launched: bool) -> Blame {
    if sticky && launched {
        Blame::Candidate
    } else {
        Blame::Harness
    }
}

/// A candidate's run outlived its limit: it is still on the GPU, so this worker must go.
pub(super) fn overran(limit: std::time::Duration) -> ExecFailure {
    POISONED.store(true, Ordering::SeqCst);
    ExecFailure::Timeout {
        limit_ms: limit.as_millis() as u64,
    }
}

/// Records a sticky fault: the worker is poisoned, and the request remembers the fault.
pub(super) fn note_fault(e: &GpuError) {
    if e.is_sticky() {
        POISONED.store(true, Ordering::SeqCst);
        let mut first = FAULT.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(format!("{} (at {})", e.fault(), e.call));
        }
    }
}

/// A GPU error of a trusted step as the harness's error (a sticky one is recorded, so the
/// worker retires, and [`settle`] charges it to the candidate when it had launched).
pub(super) fn harness(e: GpuError) -> HarnessError {
    note_fault(&e);
    HarnessError::Backend(e.to_string())
}

/// A failure of the harness that is not a GPU error (a plan that does not lower, ...).
pub(super) fn harness_text(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Backend(e.to_string())
}

/// A GPU error as the candidate's failure: a sticky fault after its first launch is its crash
/// (and poisons this worker); a sticky fault before it is the harness's (the context was broken
/// before the candidate ran); anything else is what `otherwise` makes of it (a refused launch,
/// or the harness's own error).
pub(super) fn fault_or(
    e: GpuError,
    otherwise: impl FnOnce(GpuError) -> ExecFailure,
) -> ExecFailure {
    note_fault(&e);
    if !e.is_sticky() {
        return otherwise(e);
    }
    match blame(true, candidate_launched()) {
        Blame::Candidate => {
            ExecFailure::Crash(format!("the kernel faulted: {} (at {})", e.fault(), e.call))
        }
        Blame::Harness => ExecFailure::Harness(format!(
            "the GPU context failed before the candidate ran: {} (at {})",
            e.fault(),
            e.call
        )),
    }
}

/// A GPU error during the harness's own work: a sticky one after the candidate launched was
/// caused by the candidate (the harness's kernels are trusted and the context was fine before
/// the candidate ran); anything else is the harness's.
pub(super) fn exec_failure(e: GpuError) -> ExecFailure {
    fault_or(e, |e| ExecFailure::Harness(e.to_string()))
}

/// The request's answer once it is over, with the blame settled by when the fault happened: a
/// harness error that followed a sticky fault after the candidate's first launch (a trusted
/// kernel or copy that found the context dead) is the candidate's crash.
pub(super) fn settle(result: EvalResult) -> EvalResult {
    let fault = FAULT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    settle_with(result, fault.as_deref(), candidate_launched())
}

/// [`settle`] on explicit facts: `fault` is the request's first sticky fault, `launched` whether
/// the candidate had launched.
pub fn settle_with(result: EvalResult, fault: Option<&str>, launched: bool) -> EvalResult {
    match (result, fault) {
        (EvalResult::HarnessError(e), Some(fault))
            if blame(true, launched) == Blame::Candidate =>
        {
            EvalResult::Outcome(Some(crate::outcome::Outcome::Crash {
                reason: format!(
                    "the kernel faulted: {fault}; the harness found the context dead afterwards ({e})"
                ),
            }))
        }
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;

    #[test]
    fn blame_goes_by_when_the_fault_happened() {
        assert_eq!(blame(true, true), Blame::Candidate);
        assert_eq!(blame(true, false), Blame::Harness);
        assert_eq!(blame(false, true), Blame::Harness);
        assert_eq!(blame(false, false), Blame::Harness);
    }

    #[test]
    fn a_harness_error_after_the_candidates_fault_is_its_crash() {
        let oom = || EvalResult::HarnessError("cuMemAllocAsync: CUDA_ERROR_OUT_OF_MEMORY".into());
        // Out of memory before the candidate ran, no fault: the harness's.
        assert!(matches!(
            settle_with(oom(), None, false),
            EvalResult::HarnessError(_)
        ));
        // Nor is a non-sticky harness failure after the launch the candidate's.
        assert!(matches!(
            settle_with(oom(), None, true),
            EvalResult::HarnessError(_)
        ));
        // A sticky fault before the first launch (a broken context): the harness's.
        assert!(matches!(
            settle_with(oom(), Some("CUDA_ERROR_ILLEGAL_ADDRESS"), false),
            EvalResult::HarnessError(_)
        ));
        // The same fault after the launch: the candidate's crash, naming the fault.
        match settle_with(oom(), Some("CUDA_ERROR_ILLEGAL_ADDRESS"), true) {
            EvalResult::Outcome(Some(Outcome::Crash { reason })) => {
                assert!(reason.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // Answers that are not harness errors are left alone.
        assert!(matches!(
            settle_with(EvalResult::Outcome(None), Some("x"), true),
            EvalResult::Outcome(None)
        ));
    }
}
