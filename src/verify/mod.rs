//! The evaluation protocol, independent of where a candidate runs: how a kernel is checked
//! ([`correctness`]) and timed ([`timing`]), on host buffers fenced by guard pages ([`buffer`]).
//!
//! An execution backend (the CPU device model, later the GPU worker) implements two small traits:
//! [`correctness::Executor`] runs the candidate's launch sequence once on given tensors, and
//! [`timing::Timer`] times one run of the candidate or of the baseline. Everything that decides a
//! verdict (fresh secret inputs, the NaN fill, the input copy, the double run, tolerances, the
//! stopping rule of timing) lives here, once, so the backends cannot drift apart and each rule is
//! tested without a device.
//!
//! Flow: `check` gives a [`correctness::CorrectnessReport`] or the failing
//! [`crate::outcome::Outcome`]; a correct candidate is then `measure`d and
//! [`timing::correct_outcome`] builds `Outcome::Correct` with the timing label ("cpu", "cuda").
//!
//! [`request`] holds the messages between an environment and its evaluation workers and the
//! mapping of a failed worker to the candidate's outcome, shared by both devices.
//!
//! Dependency direction: this folder imports `tasks`, `ops`, `candidate`, `outcome`, `rng` and the
//! worker protocol; the devices (`cpu`, `gpu`) and the environments import it, never the other
//! way round (`tests/layering.rs`).

#[cfg(unix)]
pub mod buffer;
#[cfg(unix)]
pub mod correctness;
pub mod request;
pub mod timing;

#[cfg(all(test, unix))]
mod doubles;
#[cfg(all(test, unix))]
mod tests;

use crate::outcome::Outcome;

/// Why an execution backend could not run (or time) the candidate. All but the last are the
/// candidate's fault and become its outcome; [`ExecFailure::Harness`] is the backend's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecFailure {
    /// The candidate crashed (illegal address, trap, a fault on a guard page, ...).
    #[error("crash: {0}")]
    Crash(String),
    /// The candidate ran past its deadline.
    #[error("timeout after {limit_ms} ms")]
    Timeout {
        /// The deadline in milliseconds.
        limit_ms: u64,
    },
    /// The launch sequence could not be started (bad configuration, too many resources).
    #[error("launch failed: {0}")]
    Launch(String),
    /// The candidate uses something the backend cannot reproduce faithfully.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A timed run's output was wrong (the timer checks them): the candidate is not correct
    /// after all.
    #[error("wrong: {0}")]
    Wrong(String),
    /// The backend itself failed (a device copy, an allocation, a broken timer): not the
    /// candidate's fault, so it never becomes the candidate's outcome.
    #[error("execution backend failed: {0}")]
    Harness(String),
}

impl ExecFailure {
    /// The candidate's outcome for this failure during `stage` ("verify", "profile"); the
    /// backend's own failure ([`ExecFailure::Harness`]) is returned as its message instead.
    pub fn into_outcome(self, stage: &str) -> Result<Outcome, String> {
        Ok(match self {
            ExecFailure::Crash(reason) => Outcome::Crash { reason },
            ExecFailure::Timeout { limit_ms } => Outcome::Timeout {
                stage: stage.to_string(),
                limit_ms,
            },
            ExecFailure::Launch(reason) => Outcome::LaunchError { reason },
            ExecFailure::Unsupported(feature) => Outcome::Unsupported { feature },
            ExecFailure::Wrong(reason) => Outcome::Wrong {
                reason,
                mismatch: None,
            },
            ExecFailure::Harness(what) => return Err(what),
        })
    }
}

/// Settings of a whole evaluation: the correctness protocol, the timing protocol and the label
/// of the times ("cpu", "cuda").
#[cfg(unix)]
#[derive(Debug, Clone, PartialEq)]
pub struct EvalConfig {
    /// Correctness protocol settings.
    pub protocol: correctness::ProtocolConfig,
    /// Timing protocol settings.
    pub timing: timing::TimingConfig,
    /// Where the times come from; becomes `Outcome::Correct::timing`.
    pub label: String,
}

/// Checks a candidate and, when it is correct, times it: the candidate's [`Outcome`] (a failure
/// while timing is reported in the "profile" stage), or the harness error that kept it from
/// being judged.
#[cfg(unix)]
pub fn evaluate(
    task: &crate::tasks::Task,
    preset: crate::tasks::Preset,
    exec: &mut dyn correctness::Executor,
    timer: &mut dyn timing::Timer,
    cfg: &EvalConfig,
) -> Result<Outcome, correctness::HarnessError> {
    if let Err(e) = correctness::check(task, preset, exec, &cfg.protocol) {
        return e.into_outcome();
    }
    match timing::measure(timer, &cfg.timing) {
        Ok(t) => Ok(timing::correct_outcome(&t, &cfg.label)),
        Err(f) => f
            .into_outcome("profile")
            .map_err(correctness::HarnessError::Backend),
    }
}
