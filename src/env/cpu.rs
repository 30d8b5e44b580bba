//! The "cpu" kernel environment, parent side: candidates compiled against the CUDA device model
//! ([`crate::cpu`]) and judged by the same correctness and timing protocols as on a GPU
//! ([`crate::verify`]), in worker processes with deadlines.
//!
//! - compile: the static rules, the launch plan validated against the task, then NVRTC (the
//!   front-end, where it is available: [`CpuFrontEnd`]), then the host C++ compiler as a child
//!   process with a deadline and a memory limit (neither compiler ever runs in the daemon).
//!   NVRTC compiles with the GPU path's options for the architecture the GPU path would pick
//!   (`env.arch`, "auto": the GPU's, sm_90 without one) to PTX (the front-end and the PTX rules;
//!   no ptxas), in the same pool of `kevin worker --role compile` children as the GPU path, so a
//!   kernel the GPU toolchain rejects (`INFINITY` without a header, a kernel named `norm` like
//!   CUDA's math overloads) is the same compile error here, with NVRTC's log, and a timer register
//!   in the compiled PTX the same format error. `env.cpu_nvrtc` ("auto", "on", "off") says
//!   whether to; "auto" without NVRTC says once at startup (info) why the front-end is off.
//! - verify: a `kevin worker --role cpu` process ([`crate::cpu::worker`]) loads the module and
//!   runs the correctness protocol on guard-paged host buffers. A crash (an out-of-bounds access
//!   hits a guard page), a hang or garbage kills and replaces that worker and becomes the
//!   candidate's outcome. Before dying, a faulting worker writes the signal and the faulting
//!   address to stderr ([`FAULT_MARKER`]), so the crash's feedback says what kind of access it
//!   was (a forged low pointer, address 0 for a misaligned vector access, an address past a
//!   buffer).
//! - profile: the same worker times the candidate against the baseline, interleaved, with the
//!   timing protocol. The baseline on the CPU is the fp64 reference interpreter (the trusted
//!   implementation of every op; a faster op-by-op C++ baseline is future work), so CPU speedups
//!   are not GPU speedups: every outcome says "cpu" timing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::candidate::Limits;
use crate::compile::{CompileError, OutputKind};
use crate::config::CpuNvrtc;
use crate::cpu::{self, CpuCompileError};
use crate::env::nvrtc::{compile_error_outcome, NvrtcCompiler};
use crate::env::CpuFrontEnd;
use crate::env::{Compiled, Deadlines, KernelEnv};
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::request::{unanswered, EvalRequest, EvalResult, TASKS_ENV};

use super::artifact::{ModuleArtifact, Owned};
use crate::worker::{PoolConfig, PoolStats, WorkerCommand, WorkerFailure, WorkerPool};

use crate::cpu::executor::crash_reason;

/// The environment.
pub struct CpuEnv {
    /// NVRTC in compile workers, run before g++ (None: the front-end is off, `front_end_off`
    /// says why).
    front_end: Option<NvrtcCompiler>,
    front_end_off: Option<String>,
    suite: Arc<TaskSuite>,
    preset: Preset,
    limits: Limits,
    pool: WorkerPool<EvalRequest, EvalResult>,
    workdir: PathBuf,
    compiles: AtomicU64,
    deadlines: Deadlines,
}

impl CpuEnv {
    /// Starts `workers` `cpu` worker processes (`program` is the kevin binary); the suite is read
    /// from `tasks_dir` in the workers too. Each stage of an evaluation gets its deadline from
    /// `deadlines`. The NVRTC front-end is on where NVRTC is found ([`CpuFrontEnd::auto`]).
    pub fn new(
        suite: Arc<TaskSuite>,
        tasks_dir: &Path,
        preset: Preset,
        program: PathBuf,
        workers: usize,
        deadlines: Deadlines,
    ) -> Result<CpuEnv, String> {
        let front = CpuFrontEnd::auto(workers);
        Self::with_front_end(
            suite, tasks_dir, preset, program, workers, deadlines, &front,
        )
    }

    /// [`CpuEnv::new`] with the NVRTC front-end `front`. "on" without NVRTC is an error; "auto"
    /// without it logs once (info) that the front-end is off and why.
    pub fn with_front_end(
        suite: Arc<TaskSuite>,
        tasks_dir: &Path,
        preset: Preset,
        program: PathBuf,
        workers: usize,
        deadlines: Deadlines,
        front: &CpuFrontEnd,
    ) -> Result<CpuEnv, String> {
        cpu::find_compiler().map_err(|e| e.to_string())?;
        let (front_end, front_end_off) = match front.mode {
            CpuNvrtc::Off => (None, Some("env.cpu_nvrtc = \"off\"".to_string())),
            mode => match NvrtcCompiler::new(
                suite.clone(),
                preset,
                &front.arch,
                OutputKind::Ptx,
                WorkerCommand::kevin_role(program.clone(), "compile"),
                front.workers.max(1),
                deadlines.compile_ms,
            ) {
                Ok(c) => (Some(c), None),
                Err(e) if mode == CpuNvrtc::On => {
                    return Err(format!(
                        "env.cpu_nvrtc = \"on\" but NVRTC is unavailable: {e}"
                    ))
                }
                Err(e) => {
                    tracing::info!(
                        "cpu backend: the NVRTC front-end is off (candidates are compiled by g++ \
                         alone, so a kernel the GPU toolchain rejects may pass here): {e}"
                    );
                    (None, Some(e))
                }
            },
        };
        let tasks_dir = crate::tasks::canonical_suite_path(tasks_dir)?;
        let mut command = WorkerCommand::kevin_role(program, "cpu");
        command
            .env
            .push((TASKS_ENV.into(), tasks_dir.display().to_string()));
        let config = PoolConfig {
            workers,
            request_timeout: deadlines.verify(),
            ..PoolConfig::default()
        };
        let pool = WorkerPool::new(command, config).map_err(|e| format!("cpu workers: {e}"))?;
        // One folder per environment: several may live in one process (tests), and each removes
        // its own folder when dropped.
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let workdir =
            std::env::temp_dir().join(format!("kevin-cpu-{}-{instance}", std::process::id()));
        Ok(CpuEnv {
            front_end,
            front_end_off,
            suite,
            preset,
            limits: Limits::default(),
            pool,
            workdir,
            compiles: AtomicU64::new(0),
            deadlines,
        })
    }

    /// Sends `req` for `stage` to a worker; a worker that does not answer makes the outcome.
    fn request(
        &self,
        req: &EvalRequest,
        stage: &str,
        limit: Duration,
    ) -> Result<EvalResult, Outcome> {
        self.pool
            .request_with_timeout(req, limit)
            .map_err(|failure| {
                unanswered(failure, stage, limit, |f| match f {
                    WorkerFailure::Crashed { exit, stderr_tail } => {
                        crash_reason(&exit, &stderr_tail)
                    }
                    other => format!("the CPU worker failed: {other}"),
                })
            })
    }
}

impl Drop for CpuEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

impl KernelEnv for CpuEnv {
    fn describe(&self) -> String {
        let front = match (&self.front_end, &self.front_end_off) {
            (Some(c), _) => format!(
                "NVRTC for {} ({} compile workers), then ",
                c.arch(),
                c.workers()
            ),
            (None, Some(why)) => format!("no NVRTC front-end ({why}); "),
            (None, None) => String::new(),
        };
        format!(
            "cpu environment: candidates compiled by {front}the host C++ compiler against kevin's CUDA device model and \
             run in {} worker process(es); CPU timings against the fp64 interpreter",
            self.pool.workers()
        )
    }

    fn compile(&self, task_name: &str, source: &str) -> Result<Compiled, Outcome> {
        let started = Instant::now();
        let plan = super::admit_named(&self.suite, task_name, self.preset, &self.limits, source)?;
        if let Some(front_end) = &self.front_end {
            match front_end.request(source, &plan)? {
                Ok(_) => {}
                // This installation's fault (NVRTC or the CUDA headers went missing), not the
                // candidate's: g++ decides alone, and the log says so.
                Err(CompileError::Unavailable { reason }) => {
                    tracing::warn!("cpu backend: the NVRTC front-end was skipped: {reason}")
                }
                Err(e) => return Err(compile_error_outcome(e)),
            }
        }
        let dir = self.workdir.join(format!(
            "{}-{}",
            task_name,
            self.compiles.fetch_add(1, Ordering::Relaxed)
        ));
        let deadline = self.deadlines.compile();
        let module =
            cpu::compile_with_deadline(source, &plan, &dir, deadline).map_err(|e| match e {
                CpuCompileError::Source { log } => Outcome::CompileError { log },
                CpuCompileError::Unsupported { feature } => Outcome::Unsupported { feature },
                CpuCompileError::Timeout { limit } => Outcome::Timeout {
                    stage: "compile".into(),
                    limit_ms: limit.as_millis() as u64,
                },
                starved @ CpuCompileError::Starved { .. } => {
                    tracing::warn!(stage = "compile", error = %starved, "the candidate was not judged");
                    Outcome::busy(format!("compile: {starved}"))
                }
                // No compiler, a workdir that cannot be written, a compiler that died silently:
                // this installation's failure, never the candidate's.
                CpuCompileError::Toolchain { reason } => {
                    tracing::warn!(stage = "compile", %reason, "the CPU toolchain failed; the candidate was not judged");
                    Outcome::harness(format!("compile: the CPU toolchain failed: {reason}"))
                }
            })?;
        Ok(Compiled {
            task: task_name.to_string(),
            artifact: Arc::new(ModuleArtifact {
                owned: Owned::Dir(dir),
                module,
                symbols: Default::default(),
                plan,
            }),
            compile_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        let req = ModuleArtifact::verify_request(compiled, "CPU", self.preset)?;
        self.request(&req, "verify", self.deadlines.verify())?
            .verified("CPU")
    }

    fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        let mut out = vec![("cpu".to_string(), self.pool.stats())];
        out.extend(
            self.front_end
                .as_ref()
                .map(|c| ("compile".to_string(), c.pool_stats())),
        );
        out
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        let req = match ModuleArtifact::profile_request(compiled, "CPU", self.preset) {
            Ok(req) => req,
            Err(o) => return o,
        };
        match self.request(&req, "profile", self.deadlines.profile()) {
            Ok(answer) => answer.timed("CPU"),
            Err(o) => o,
        }
    }
}
