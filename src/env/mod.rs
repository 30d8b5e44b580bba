//! The kernel environments: compile, verify and profile one candidate.
//!
//! Here live the [`KernelEnv`] interface with its [`Deadlines`] and the admission every real
//! environment runs first ([`admit`]), the one factory that builds an environment from a run's
//! configuration or a command's `--backend` ([`build()`], [`EnvSpec`]), and the environments
//! themselves, parent side only: [`sim`] (everything simulated), [`nvrtc`] (real NVRTC
//! compilation, simulated verdicts), [`cpu`] (the CUDA device model in `cpu` workers) and
//! [`cuda`] (the GPU harness in `cuda` workers).
//!
//! Dependency direction: `env` imports the devices and their workers ([`crate::cpu`],
//! [`crate::gpu`]), [`crate::compile`], [`crate::verify`] and [`crate::worker`]; none of those
//! may import `env`. The messages between an environment and its workers, and the mapping of a
//! failed worker to the candidate's outcome, are [`crate::verify::request`] for that reason.
//!
//! The three stages are separate calls because separate actors (and worker pools) run them:
//! compilation is CPU-bound and parallel, verification and timing need the device. A failure of
//! the candidate at any stage is an [`Outcome`] (data), returned as `Err` so the pipeline stops
//! there. Calls block; the actors crate runs them on dedicated threads.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::candidate::{self, Candidate, Limits, ResolvedPlan};
use crate::outcome::{busy_retry, Outcome};
use crate::tasks::{Preset, Task, TaskSuite};
use crate::worker::PoolStats;

#[cfg(unix)]
mod artifact;
mod build;
pub mod cache;
#[cfg(unix)]
pub mod cpu;
#[cfg(unix)]
pub mod cuda;
pub mod nvrtc;
pub mod sim;

pub use build::{build, CpuFrontEnd, CudaEnvConfig, EnvSpec, CPU_NVRTC_ENV};
pub use cache::{cached, CacheStats};

/// A compiled candidate, ready to verify. The artifact's type belongs to the environment (PTX and
/// a resolved launch plan for the CUDA harness; nothing much for the simulated one).
#[derive(Clone)]
pub struct Compiled {
    /// The task it was compiled for.
    pub task: String,
    /// Environment-defined artifact.
    pub artifact: Arc<dyn Any + Send + Sync>,
    /// Compile time (ms).
    pub compile_ms: f64,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Compiled({}, {:.1} ms)", self.task, self.compile_ms)
    }
}

/// How long each stage of one evaluation may take before the candidate is stopped (the compiler
/// or the worker killed) and its outcome is a timeout. Every real environment takes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadlines {
    /// Compiling one candidate (ms).
    pub compile_ms: u64,
    /// The correctness protocol of one candidate (ms).
    pub verify_ms: u64,
    /// The timing protocol of one candidate (ms).
    pub profile_ms: u64,
}

impl Default for Deadlines {
    /// Generous deadlines for `kevin eval` on either backend: the small preset on a CPU and the
    /// GPU preset on a GPU both finish far inside them.
    fn default() -> Self {
        Deadlines {
            compile_ms: 60_000,
            verify_ms: 30_000,
            profile_ms: 60_000,
        }
    }
}

impl Deadlines {
    /// The compile deadline as a [`Duration`].
    pub fn compile(&self) -> Duration {
        Duration::from_millis(self.compile_ms)
    }
    /// The verify deadline as a [`Duration`].
    pub fn verify(&self) -> Duration {
        Duration::from_millis(self.verify_ms)
    }
    /// The profile deadline as a [`Duration`].
    pub fn profile(&self) -> Duration {
        Duration::from_millis(self.profile_ms)
    }
}

/// Compiles, verifies and times candidates.
pub trait KernelEnv: Send + Sync {
    /// One line describing the environment ("simulated environment: ...").
    fn describe(&self) -> String;
    /// Compiles the ```cuda block `source` (launch lines included) for `task`.
    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome>;
    /// Runs the correctness protocol.
    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome>;
    /// Times the kernel against the baseline; returns the final outcome.
    fn profile(&self, compiled: &Compiled) -> Outcome;
    /// The counters of the worker pools behind this environment, by name ("cpu", "compile",
    /// ...): requests, failures, respawns and their latencies. Empty for an environment without
    /// worker processes.
    fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        Vec::new()
    }
    /// The most device memory one evaluation request took so far (the harness's buffers and
    /// the candidate's scratch, from the worker's memory pool), in bytes; `None` for an
    /// environment without device memory.
    fn device_memory_peak(&self) -> Option<u64> {
        None
    }
    /// Where evaluation requests spent their time so far: `(phase, requests, mean ms a
    /// request)` (the GPU workers' phases, the waits for the GPU lock and the timing lease; see
    /// the CUDA environment's). Empty for an environment that does not measure them.
    fn phase_stats(&self) -> Vec<(String, u64, f64)> {
        Vec::new()
    }
    /// How often repeated candidates were answered from the evaluation cache
    /// ([`cache::CachedEnv`]); `None` for an environment without one.
    fn cache_stats(&self) -> Option<cache::CacheStats> {
        None
    }
}

/// What every real environment checks before it compiles anything: the static rules, the launch
/// plan's syntax, and the plan against the task's tensors and sizes at `preset`. A violation of
/// the rules or the syntax is a format error; a plan that does not fit the task is a launch
/// error; either way the message tells the policy what to fix.
pub fn admit(
    task: &Task,
    preset: Preset,
    limits: &Limits,
    source: &str,
) -> Result<ResolvedPlan, Outcome> {
    if let Err((line, violation)) = candidate::rules::check(source) {
        return Err(Outcome::FormatError {
            reason: format!("line {line} of the cuda block: {violation}"),
        });
    }
    let plan = candidate::plan::parse_plan(source).map_err(|e| Outcome::FormatError {
        reason: e.to_string(),
    })?;
    let cand = Candidate {
        source: source.to_string(),
        summary: String::new(),
        plan,
    };
    candidate::validate(&cand, &task.candidate_signature(preset), limits).map_err(|e| {
        Outcome::LaunchError {
            reason: e.to_string(),
        }
    })
}

/// [`admit`] for the task named `task` in `suite`; an unknown name is a launch error.
pub fn admit_named(
    suite: &TaskSuite,
    task: &str,
    preset: Preset,
    limits: &Limits,
    source: &str,
) -> Result<ResolvedPlan, Outcome> {
    let t = suite.get(task).ok_or_else(|| Outcome::LaunchError {
        reason: format!("unknown task `{task}`"),
    })?;
    admit(t, preset, limits, source)
}

/// One candidate through all three stages: compile, verify, then profile; the first failure is
/// the outcome. A candidate the machine was too busy to judge is judged again ([`patiently`]).
/// (The actor system runs the stages in separate actors and asks again itself; `kevin eval` and
/// tests run them in sequence with this.)
pub fn evaluate(env: &dyn KernelEnv, task: &str, source: &str) -> Outcome {
    patiently(|| evaluate_once(env, task, source), Outcome::is_busy)
}

/// Runs `judge` again while `busy` says its answer is a busy harness error
/// ([`Outcome::is_busy`]: the machine did not give the harness its time, nothing is broken), as
/// often and as far apart as [`busy_retry`] says; the last answer stands. Blocks the calling
/// thread while it waits.
pub fn patiently<T>(mut judge: impl FnMut() -> T, busy: impl Fn(&T) -> bool) -> T {
    let mut attempt = 0;
    loop {
        let verdict = judge();
        let Some(wait) = busy_retry(busy(&verdict), attempt) else {
            return verdict;
        };
        tracing::warn!(
            attempt,
            ?wait,
            "the machine was too busy to judge a candidate; it is judged again"
        );
        std::thread::sleep(wait);
        attempt += 1;
    }
}

fn evaluate_once(env: &dyn KernelEnv, task: &str, source: &str) -> Outcome {
    let compiled = match env.compile(task, source) {
        Ok(c) => c,
        Err(o) => return o,
    };
    if let Err(o) = env.verify(&compiled) {
        return o;
    }
    env.profile(&compiled)
}
