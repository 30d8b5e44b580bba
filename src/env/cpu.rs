//! The "cpu" kernel environment, parent side: candidates compiled against the CUDA device model
//! ([`crate::cpu`]) and judged by the same correctness and timing protocols as on a GPU
//! ([`crate::verify`]), in worker processes with deadlines.
//!
//! - compile: the static rules, the launch plan validated against the task, then the host C++
//!   compiler as a child process with a deadline and a memory limit (the compiler never runs in
//!   the daemon).
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
use crate::cpu::{self, CpuCompileError};
use crate::env::{Compiled, Deadlines, KernelEnv};
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::request::{unanswered, EvalRequest, EvalResult, TASKS_ENV};

use super::artifact::{ModuleArtifact, Owned};
use crate::worker::{PoolConfig, PoolStats, WorkerCommand, WorkerFailure, WorkerPool};

use crate::cpu::executor::crash_reason;

/// The environment.
pub struct CpuEnv {
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
    /// `deadlines`.
    pub fn new(
        suite: Arc<TaskSuite>,
        tasks_dir: &Path,
        preset: Preset,
        program: PathBuf,
        workers: usize,
        deadlines: Deadlines,
    ) -> Result<CpuEnv, String> {
        cpu::find_compiler().map_err(|e| e.to_string())?;
        let tasks_dir = tasks_dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", tasks_dir.display()))?;
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
        format!(
            "cpu environment: candidates compiled with the host C++ compiler against kevin's CUDA device model and \
             run in {} worker process(es); CPU timings against the fp64 interpreter",
            self.pool.workers()
        )
    }

    fn compile(&self, task_name: &str, source: &str) -> Result<Compiled, Outcome> {
        let started = Instant::now();
        let plan = super::admit_named(&self.suite, task_name, self.preset, &self.limits, source)?;
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
                CpuCompileError::Toolchain { reason } => Outcome::CompileError {
                    log: format!("the CPU toolchain failed: {reason}"),
                },
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
        vec![("cpu".to_string(), self.pool.stats())]
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
