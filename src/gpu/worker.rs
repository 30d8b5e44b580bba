//! The `cuda` worker's side (`kevin worker --role cuda`): one process per GPU slot that holds a
//! [`Harness`] on its GPU and answers the evaluation requests of [`crate::verify::request`]
//! with the protocols on device memory. The parent side is [`crate::env::cuda`]; a worker whose
//! context a candidate poisoned answers with the crash and `retire`, and is replaced.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::candidate::ResolvedPlan;
use crate::outcome::Outcome;
use crate::tasks::{Role, TaskSuite};
use crate::verify::correctness::{self, ProtocolConfig};
use crate::verify::request::{self, EvalRequest, EvalResult, ModuleJob};
use crate::verify::timing::{self, TimingConfig};
use crate::verify::ExecFailure;

use super::baseline_check::check_baseline;
use super::buffers::TaskBuffers;
use super::candidate::Candidate;
use super::fault::{note_fault, poisoned, request_starts, settle};
use super::harness::Harness;
use super::timer::GpuTimer;
use super::trials::GpuTrials;

/// Environment variables that configure a `cuda` worker.
pub const HARNESS_ENV: &str = "KEVIN_CUDA_HARNESS";
/// Path of the compiled baseline module.
pub const BASELINE_ENV: &str = "KEVIN_CUDA_BASELINE";
/// The GPU ordinal a worker serves.
pub const DEVICE_ENV: &str = "KEVIN_CUDA_DEVICE";

/// A `cuda` worker's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CudaReply {
    /// The result.
    pub result: EvalResult,
    /// The worker's context is poisoned: it must be replaced.
    pub retire: bool,
    /// Where the worker's time went: (phase, ms) in order (see [`crate::env::KernelEnv::phase_stats`]).
    #[serde(default)]
    pub phases: Vec<(String, f64)>,
    /// The most device memory the worker's pool had allocated at once during the request (the
    /// harness's buffers, the worker's fixed ones and the candidate's scratch), in bytes.
    #[serde(default)]
    pub peak_bytes: u64,
}

/// Idle pool memory a worker keeps between requests (more goes back to the driver): enough for
/// the next request of an ordinary task without new mappings, little enough that a worker that
/// just ran a large task does not keep its memory from the other workers of its GPU.
pub const POOL_KEEP_BYTES: usize = 2 << 30;

/// Wall-clock phases of one request inside a worker.
#[derive(Debug)]
struct Phases {
    last: Instant,
    done: Vec<(String, f64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            last: Instant::now(),
            done: Vec::new(),
        }
    }

    /// Ends the current phase, split into `parts` measured inside it (`<prefix>.<part>`); what
    /// they do not cover goes to `<prefix>.other`.
    fn split(&mut self, prefix: &str, parts: &[(&str, f64)]) {
        let total = self.last.elapsed().as_secs_f64() * 1e3;
        let covered: f64 = parts.iter().map(|p| p.1).sum();
        for (name, ms) in parts {
            self.done.push((format!("{prefix}.{name}"), *ms));
        }
        self.done
            .push((format!("{prefix}.other"), (total - covered).max(0.0)));
        self.last = Instant::now();
    }

    /// Ends the current phase under `name`.
    fn mark(&mut self, name: &str) {
        let now = Instant::now();
        self.done
            .push((name.to_string(), (now - self.last).as_secs_f64() * 1e3));
        self.last = now;
    }
}

/// The candidate loaded and the task's device buffers allocated; a failure is the answer
/// (the candidate's outcome in `stage`, or the harness's error).
fn prepare<'t>(
    h: &mut Harness,
    task: &'t crate::tasks::Task,
    job: &ModuleJob,
    stage: &str,
) -> Result<(Candidate, TaskBuffers<'t>), EvalResult> {
    let cand = load(h, &job.module, &job.symbols, &job.plan)
        .map_err(|f| EvalResult::of_failure(f, stage))?;
    let bufs = TaskBuffers::new(h, task, job.preset)
        .map_err(|e| EvalResult::HarnessError(e.to_string()))?;
    Ok((cand, bufs))
}

fn load(
    h: &Harness,
    module: &Path,
    symbols: &BTreeMap<String, String>,
    plan: &ResolvedPlan,
) -> Result<Candidate, ExecFailure> {
    let image = std::fs::read(module)
        .map_err(|e| ExecFailure::Harness(format!("{}: {e}", module.display())))?;
    Candidate::load(h, &image, symbols, plan)
}

fn handle(h: &mut Harness, suite: &TaskSuite, req: EvalRequest, ph: &mut Phases) -> EvalResult {
    let Some(task) = suite.get(req.task()) else {
        return EvalResult::HarnessError(format!("unknown task `{}`", req.task()));
    };
    match req {
        EvalRequest::Verify { job, trials } => {
            let (cand, bufs) = match prepare(h, task, &job, "verify") {
                Ok(p) => p,
                Err(answer) => return answer,
            };
            ph.mark("verify.load");
            let tensors = match bufs.alloc_tensors(h, Role::Input).and_then(|mut t| {
                t.extend(bufs.alloc_tensors(h, Role::Output)?);
                Ok(t)
            }) {
                Ok(t) => t,
                Err(e) => return EvalResult::HarnessError(e.to_string()),
            };
            let limit = match bufs.run_limit(h, &tensors) {
                Ok(l) => l,
                Err(e) => return EvalResult::HarnessError(e.to_string()),
            };
            ph.mark("verify.limit");
            let mut trials_impl = match GpuTrials::new(h, &bufs, &cand, limit, tensors) {
                Ok(t) => t,
                Err(e) => return EvalResult::HarnessError(e.to_string()),
            };
            let cfg = ProtocolConfig { trials, seed: None };
            let verdict = correctness::run_protocol(&mut trials_impl, &cfg);
            ph.split("verify", &trials_impl.spent());
            EvalResult::of_check(verdict)
        }
        EvalRequest::Profile { job } => {
            let (cand, bufs) = match prepare(h, task, &job, "profile") {
                Ok(p) => p,
                Err(answer) => return answer,
            };
            ph.mark("profile.load");
            let mut timer = match GpuTimer::new(h, &bufs, &cand) {
                Ok(t) => t,
                Err(e) => return EvalResult::HarnessError(e.to_string()),
            };
            ph.mark("profile.inputs");
            let t = match timing::measure(&mut timer, &TimingConfig::default()) {
                Ok(t) => t,
                Err(f) => return EvalResult::of_failure(f, "profile"),
            };
            ph.mark("profile.timing");
            let rechecked = timer.recheck();
            ph.mark("profile.recheck");
            match rechecked {
                Ok(None) => EvalResult::Outcome(Some(timing::correct_outcome(&t, "cuda"))),
                Ok(Some(reason)) => EvalResult::Outcome(Some(Outcome::Wrong {
                    reason,
                    mismatch: None,
                })),
                Err(e) => EvalResult::HarnessError(e.to_string()),
            }
        }
        EvalRequest::CheckBaseline {
            preset,
            seed,
            time_reps,
            time_only,
            ..
        } => match check_baseline(h, task, preset, seed, time_reps, time_only) {
            Ok(c) => EvalResult::Baseline(c),
            Err(e) => EvalResult::HarnessError(e),
        },
    }
}

/// The `cuda` worker's main loop (`kevin worker --role cuda`): the task suite's folder comes
/// from [`request::TASKS_ENV`], the harness's and the baseline's CUBINs from [`HARNESS_ENV`]
/// and [`BASELINE_ENV`], the GPU from [`DEVICE_ENV`].
pub fn worker_main() -> Result<(), String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let suite = request::suite_from_env()?;
    let ordinal: usize = std::env::var(DEVICE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let read = |k: &str| -> Result<Vec<u8>, String> {
        let p = var(k)?;
        std::fs::read(&p).map_err(|e| format!("{p}: {e}"))
    };
    let (himg, bimg) = (read(HARNESS_ENV)?, read(BASELINE_ENV)?);
    let mut h = Harness::new(ordinal, &himg, &bimg).map_err(|e| format!("GPU {ordinal}: {e}"))?;
    crate::worker::serve("cuda", crate::worker::DEFAULT_MAX_FRAME_BYTES, |req| {
        let mut ph = Phases::start();
        request_starts();
        let _ = h.gpu().reset_peak();
        let result = settle(handle(&mut h, &suite, req, &mut ph));
        // Buffers are freed on the stream: wait for the frees so the next request's
        // phases do not pay for this one's. Not in a poisoned worker: its candidate may
        // still be running, and this wait held the answer (and the GPU's lock) until the
        // request's deadline killed the worker (the 5 s holders of the H200 storms).
        // A sticky fault found here retires the worker (its context is dead).
        let mut peak_bytes = 0;
        if !poisoned() {
            if let Err(e) = h.gpu().sync() {
                note_fault(&e);
            }
            peak_bytes = h.gpu().peak_bytes().unwrap_or(0);
            let _ = h.gpu().trim_pool(POOL_KEEP_BYTES);
        }
        ph.mark("release");
        CudaReply {
            result,
            retire: poisoned(),
            phases: ph.done,
            peak_bytes,
        }
    })
    .map_err(|e| e.to_string())
}
