//! The messages between a real environment (the parent, [`crate::env`]) and its evaluation
//! workers (`kevin worker --role cpu|cuda`, [`crate::cpu::worker`], [`crate::gpu::worker`]), and
//! how an answer, or its absence, becomes the candidate's [`Outcome`]. Written once for both
//! devices, so the CPU and the GPU backends send the same requests and judge a failed worker
//! the same way.
//!
//! These types live here, not in `env`, because both sides need them: the environments import
//! the devices' workers, never the other way round.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::candidate::ResolvedPlan;
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::ExecFailure;
use crate::worker::WorkerFailure;

/// The environment variable that tells an evaluation worker (`cpu` or `cuda`) where the task
/// suite is.
pub const TASKS_ENV: &str = "KEVIN_WORKER_TASKS";

/// The task suite an evaluation worker serves, from the folder in [`TASKS_ENV`].
pub fn suite_from_env() -> Result<TaskSuite, String> {
    let dir = std::env::var(TASKS_ENV).map_err(|_| format!("{TASKS_ENV} is not set"))?;
    TaskSuite::load(&dir).map_err(|e| format!("task suite {dir}: {e}"))
}

/// A compiled candidate on disk, as a worker loads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModuleJob {
    /// The task.
    pub task: String,
    /// Its size preset.
    pub preset: Preset,
    /// The compiled module (a shared library on the CPU, a CUBIN on the GPU).
    pub module: PathBuf,
    /// Source kernel name -> symbol in the module (empty on the CPU).
    pub symbols: BTreeMap<String, String>,
    /// The resolved launch plan.
    pub plan: ResolvedPlan,
}

/// Work for an evaluation worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EvalRequest {
    /// Run the correctness protocol.
    Verify {
        /// The candidate.
        job: ModuleJob,
        /// Trials (5 in the protocol).
        trials: u32,
    },
    /// Run the timing protocol against the baseline.
    Profile {
        /// The candidate.
        job: ModuleJob,
    },
    /// Check the baseline against the fp64 interpreter on one input set (GPU tests; only the
    /// `cuda` worker answers it).
    CheckBaseline {
        /// The task.
        task: String,
        /// Its size preset.
        preset: Preset,
        /// Input seed.
        seed: u64,
        /// Timed runs of the baseline after the check (0: none): L2 flushed before each, CUDA
        /// events around it; the median goes to [`BaselineCheck::median_ms`].
        #[serde(default)]
        time_reps: u32,
        /// Skip the comparisons with the fp64 interpreter and the reference plan (a task at
        /// sizes whose fp64 interpretation would take minutes): time only.
        #[serde(default)]
        time_only: bool,
    },
}

impl EvalRequest {
    /// The task the request is about.
    pub fn task(&self) -> &str {
        match self {
            EvalRequest::Verify { job, .. } | EvalRequest::Profile { job } => &job.task,
            EvalRequest::CheckBaseline { task, .. } => task,
        }
    }
}

/// What a baseline check found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineCheck {
    /// Launches (kernels and GEMMs) of the eager plan.
    pub steps: usize,
    /// Whether GEMMs went through cuBLAS.
    pub cublas: bool,
    /// Steps of the plan that went through cuDNN: convolutions and batch norms (the rest ran
    /// kevin's kernels).
    #[serde(default, alias = "cudnn_convs")]
    pub cudnn_steps: usize,
    /// Median milliseconds of the timed runs, when some were asked for.
    #[serde(default)]
    pub median_ms: Option<f64>,
    /// Largest error / tolerance bound over all outputs (at most 1 when within tolerance).
    pub max_error_ratio: f64,
    /// The first element out of tolerance, if any: "Y[12]: expected 1.5, got 1.7".
    pub first_failure: Option<String>,
    /// The same for the fp64 reference plan (the correctness protocol's reference).
    pub reference_max_error_ratio: f64,
    /// Its first element out of tolerance, if any.
    pub reference_first_failure: Option<String>,
}

/// An evaluation worker's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum EvalResult {
    /// The candidate's outcome (verify: `None` when it passed).
    Outcome(Option<Outcome>),
    /// A baseline check.
    Baseline(BaselineCheck),
    /// The harness failed; the candidate was not judged.
    HarnessError(String),
}

impl EvalResult {
    /// The answer for a failure of the candidate's run during `stage` ("verify", "profile"):
    /// its outcome, or the harness's error.
    pub fn of_failure(f: ExecFailure, stage: &str) -> EvalResult {
        match f.into_outcome(stage) {
            Ok(o) => EvalResult::Outcome(Some(o)),
            Err(harness) => EvalResult::HarnessError(harness),
        }
    }

    /// The answer for the correctness protocol's verdict.
    #[cfg(unix)]
    pub fn of_check<T>(verdict: Result<T, crate::verify::correctness::CheckError>) -> EvalResult {
        use crate::verify::correctness::CheckError;
        match verdict {
            Ok(_) => EvalResult::Outcome(None),
            Err(CheckError::Candidate(o)) => EvalResult::Outcome(Some(o)),
            Err(CheckError::Harness(e)) => EvalResult::HarnessError(e.to_string()),
        }
    }

    /// The parent's reading of a `device` ("CPU", "GPU") worker's answer to a verification:
    /// `Ok` when the candidate passed, else the outcome that ends its evaluation (its failure,
    /// the harness's, or an answer to another request).
    pub fn verified(self, device: &str) -> Result<(), Outcome> {
        match self {
            EvalResult::Outcome(None) => Ok(()),
            other => Err(other.timed(device)),
        }
    }

    /// The parent's reading of a `device` ("CPU", "GPU") worker's answer to a timing run: the
    /// candidate's final outcome, or [`Outcome::HarnessError`] when the harness failed (never
    /// charged to the candidate).
    pub fn timed(self, device: &str) -> Outcome {
        match self {
            EvalResult::Outcome(Some(o)) => o,
            EvalResult::Outcome(None) => Outcome::Crash {
                reason: format!("the {device} worker returned no timing"),
            },
            EvalResult::HarnessError(e) => {
                tracing::warn!(device, error = %e, "the harness failed; the candidate was not judged");
                Outcome::harness(format!("the {device} harness failed: {e}"))
            }
            EvalResult::Baseline(_) => Outcome::Crash {
                reason: format!("the {device} worker answered another request"),
            },
        }
    }
}

/// The candidate's outcome when the worker serving its `stage` did not answer: a timeout at
/// `limit` is a timeout of that stage; a worker that could not be started never saw the
/// candidate, and one the machine starved of CPU past the backstop was never given its time, so
/// both are a [`Outcome::HarnessError`]; anything else (a crash, a broken protocol,
/// a worker that died mid-reply) is a crash whose reason `reason` writes. Used by every
/// environment that sends candidates to workers (compile, cpu, cuda).
pub fn unanswered(
    failure: WorkerFailure,
    stage: &str,
    limit: Duration,
    reason: impl FnOnce(WorkerFailure) -> String,
) -> Outcome {
    match failure {
        WorkerFailure::Timeout { .. } => Outcome::Timeout {
            stage: stage.into(),
            limit_ms: limit.as_millis() as u64,
        },
        spawn @ WorkerFailure::Spawn { .. } => {
            tracing::warn!(stage, error = %spawn, "no worker could be started; the candidate was not judged");
            Outcome::harness(format!("{stage}: {spawn}"))
        }
        starved @ WorkerFailure::Starved { .. } => {
            tracing::warn!(stage, error = %starved, "the candidate was not judged");
            Outcome::busy(format!("{stage}: {starved}"))
        }
        other => Outcome::Crash {
            reason: reason(other),
        },
    }
}
