//! The "cpu" kernel environment: candidates compiled against the CUDA device model
//! ([`crate::cpu`]) and judged by the same correctness and timing protocols as on a GPU
//! ([`crate::verify`]), in worker processes with deadlines.
//!
//! - compile: the static rules, the launch plan validated against the task, then the host C++
//!   compiler as a child process with a deadline (the compiler never runs in the daemon).
//! - verify: a `kevin worker --role cpu` process loads the module and runs the correctness
//!   protocol on guard-paged host buffers. A crash (an out-of-bounds access hits a guard page), a
//!   hang or garbage kills and replaces that worker and becomes the candidate's outcome.
//! - profile: the same worker times the candidate against the baseline, interleaved, with the
//!   timing protocol. The baseline on the CPU is the fp64 reference interpreter (the trusted
//!   implementation of every op; a faster op-by-op C++ baseline is future work), so CPU speedups
//!   are not GPU speedups: every outcome says "cpu" timing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::candidate::{self, Limits, ResolvedPlan};
use crate::cpu::{self, CpuCompileError, LaunchFailure, Module};
use crate::env::{Compiled, KernelEnv};
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::buffer::TensorBuf;
use crate::verify::correctness::{self, CheckError, Executor, ProtocolConfig};
use crate::verify::timing::{self, Timer, TimingConfig, Which};
use crate::verify::ExecFailure;
use crate::worker::{PoolConfig, WorkerCommand, WorkerFailure, WorkerPool};

/// The environment variable that tells a `cpu` worker where the task suite is.
pub const TASKS_ENV: &str = "KEVIN_WORKER_TASKS";

/// Work for a `cpu` worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CpuRequest {
    /// Run the correctness protocol.
    Verify {
        /// The task.
        task: String,
        /// Its size preset.
        preset: Preset,
        /// The compiled module.
        module: PathBuf,
        /// The resolved launch plan.
        plan: ResolvedPlan,
        /// Trials (5 in the protocol).
        trials: u32,
    },
    /// Run the timing protocol against the baseline.
    Profile {
        /// The task.
        task: String,
        /// Its size preset.
        preset: Preset,
        /// The compiled module.
        module: PathBuf,
        /// The resolved launch plan.
        plan: ResolvedPlan,
    },
}

/// A `cpu` worker's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CpuResponse {
    /// The candidate's outcome (verify: `None` when it passed).
    Outcome(Option<Outcome>),
    /// The harness failed; the candidate was not judged.
    HarnessError(String),
}

/// Runs a compiled module's launch plan on host buffers: the CPU backend's [`Executor`].
pub struct CpuExecutor {
    module: Module,
    plan: ResolvedPlan,
    scratch: Vec<TensorBuf>,
    threads: usize,
}

impl CpuExecutor {
    /// Loads `module` and allocates the plan's scratch buffers (guard-paged too).
    pub fn new(
        module: &Path,
        plan: ResolvedPlan,
        threads: usize,
    ) -> Result<CpuExecutor, ExecFailure> {
        let module = Module::load(module).map_err(|e| ExecFailure::Harness(e.to_string()))?;
        let scratch = plan
            .scratch
            .iter()
            .map(|s| TensorBuf::new(s.name.clone(), scratch_dtype(s.dtype), s.elems as usize))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        Ok(CpuExecutor {
            module,
            plan,
            scratch,
            threads: threads.max(1),
        })
    }
}

/// Scratch buffers are raw bytes to the candidate; any dtype of the same width holds them.
fn scratch_dtype(d: candidate::Dtype) -> crate::ops::Dtype {
    use crate::ops::Dtype;
    match d.size_bytes() {
        8 => Dtype::I64,
        2 => Dtype::F16,
        _ => Dtype::F32,
    }
}

impl Executor for CpuExecutor {
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        let tensor_ptrs: Vec<*mut std::ffi::c_void> = tensors
            .iter_mut()
            .map(|t| t.as_bytes_mut().as_mut_ptr().cast())
            .collect();
        let scratch_ptrs: Vec<*mut std::ffi::c_void> = self
            .scratch
            .iter_mut()
            .map(|t| t.as_bytes_mut().as_mut_ptr().cast())
            .collect();
        for launch in &self.plan.launches {
            // SAFETY: every pointer is a live guard-paged buffer of the size the plan declares;
            // this runs only inside a `cpu` worker process (see the module docs).
            unsafe {
                self.module
                    .launch(launch, &tensor_ptrs, &scratch_ptrs, self.threads)
            }
            .map_err(|e| match e {
                LaunchFailure::Unsupported(m) => ExecFailure::Unsupported(m),
                LaunchFailure::Launch(m) => ExecFailure::Launch(format!(
                    "launch line {} (`{}`): {m}",
                    launch.line, launch.kernel
                )),
            })?;
        }
        Ok(())
    }
}

/// Times the candidate (the executor on fixed inputs) against the baseline (the interpreter).
struct CpuTimer<'a> {
    exec: &'a mut CpuExecutor,
    tensors: Vec<TensorBuf>,
    task: &'a crate::tasks::Task,
    preset: Preset,
    inputs: Vec<Vec<f64>>,
}

impl Timer for CpuTimer<'_> {
    fn time_once(&mut self, which: Which) -> Result<f64, ExecFailure> {
        let t0 = Instant::now();
        match which {
            Which::Candidate => self.exec.run(&mut self.tensors)?,
            Which::Baseline => {
                self.task
                    .reference(self.preset, &self.inputs)
                    .map_err(|e| ExecFailure::Harness(e.to_string()))?;
            }
        }
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    }
}

/// Task tensors for timed runs: inputs written, outputs NaN (their values are not checked here;
/// the correctness protocol did that, and the profiler re-checks nothing on the CPU).
fn timing_tensors(
    task: &crate::tasks::Task,
    preset: Preset,
    inputs: &[Vec<f64>],
) -> Result<Vec<TensorBuf>, String> {
    let sig = task.signature(preset);
    let mut out = Vec::with_capacity(sig.tensors.len());
    for (i, t) in sig.tensors.iter().enumerate() {
        let mut buf = TensorBuf::new(t.name.clone(), t.dtype, t.shape.iter().product())
            .map_err(|e| e.to_string())?;
        match inputs.get(i) {
            Some(values) => buf.write_f64(values).map_err(|e| e.to_string())?,
            None => buf.fill_nan(),
        }
        out.push(buf);
    }
    Ok(out)
}

fn outcome_of(f: ExecFailure, stage: &str) -> CpuResponse {
    match f.into_outcome(stage) {
        Ok(o) => CpuResponse::Outcome(Some(o)),
        Err(harness) => CpuResponse::HarnessError(harness),
    }
}

fn handle(suite: &TaskSuite, req: CpuRequest) -> CpuResponse {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    match req {
        CpuRequest::Verify {
            task,
            preset,
            module,
            plan,
            trials,
        } => {
            let Some(task) = suite.get(&task) else {
                return CpuResponse::HarnessError(format!("unknown task `{task}`"));
            };
            let mut exec = match CpuExecutor::new(&module, plan, threads) {
                Ok(e) => e,
                Err(f) => return outcome_of(f, "verify"),
            };
            let cfg = ProtocolConfig { trials, seed: None };
            match correctness::check(task, preset, &mut exec, &cfg) {
                Ok(_) => CpuResponse::Outcome(None),
                Err(CheckError::Candidate(o)) => CpuResponse::Outcome(Some(o)),
                Err(CheckError::Harness(e)) => CpuResponse::HarnessError(e.to_string()),
            }
        }
        CpuRequest::Profile {
            task,
            preset,
            module,
            plan,
        } => {
            let Some(task) = suite.get(&task) else {
                return CpuResponse::HarnessError(format!("unknown task `{task}`"));
            };
            let mut exec = match CpuExecutor::new(&module, plan, threads) {
                Ok(e) => e,
                Err(f) => return outcome_of(f, "profile"),
            };
            let inputs = task.generate_inputs(preset, correctness::os_seed().unwrap_or(1));
            let tensors = match timing_tensors(task, preset, &inputs) {
                Ok(t) => t,
                Err(e) => return CpuResponse::HarnessError(e),
            };
            let mut timer = CpuTimer {
                exec: &mut exec,
                tensors,
                task,
                preset,
                inputs,
            };
            match timing::measure(&mut timer, &TimingConfig::default()) {
                Ok(t) => CpuResponse::Outcome(Some(timing::correct_outcome(&t, "cpu"))),
                Err(f) => outcome_of(f, "profile"),
            }
        }
    }
}

/// The `cpu` worker's main loop (`kevin worker --role cpu`); the task suite's folder comes from
/// [`TASKS_ENV`].
pub fn worker_main() -> Result<(), String> {
    let dir = std::env::var(TASKS_ENV).map_err(|_| format!("{TASKS_ENV} is not set"))?;
    let suite = TaskSuite::load(&dir).map_err(|e| format!("task suite {dir}: {e}"))?;
    crate::worker::serve("cpu", crate::worker::DEFAULT_MAX_FRAME_BYTES, |req| {
        handle(&suite, req)
    })
    .map_err(|e| e.to_string())
}

/// A compiled module on disk; its folder is removed when the last reference goes.
#[derive(Debug)]
struct Artifact {
    dir: PathBuf,
    module: PathBuf,
    plan: ResolvedPlan,
}

impl Drop for Artifact {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The environment.
pub struct CpuEnv {
    suite: Arc<TaskSuite>,
    preset: Preset,
    limits: Limits,
    pool: WorkerPool<CpuRequest, CpuResponse>,
    workdir: PathBuf,
    compiles: AtomicU64,
    verify_timeout: Duration,
    profile_timeout: Duration,
}

impl CpuEnv {
    /// Starts `workers` `cpu` worker processes (`program` is the kevin binary); the suite is read
    /// from `tasks_dir` in the workers too.
    pub fn new(
        suite: Arc<TaskSuite>,
        tasks_dir: &Path,
        preset: Preset,
        program: PathBuf,
        workers: usize,
        verify_timeout_ms: u64,
        profile_timeout_ms: u64,
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
            request_timeout: Duration::from_millis(verify_timeout_ms),
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
            verify_timeout: Duration::from_millis(verify_timeout_ms),
            profile_timeout: Duration::from_millis(profile_timeout_ms),
        })
    }

    fn request(
        &self,
        req: &CpuRequest,
        stage: &str,
        limit: Duration,
    ) -> Result<Option<Outcome>, Outcome> {
        match self.pool.request_with_timeout(req, limit) {
            Ok(CpuResponse::Outcome(o)) => Ok(o),
            Ok(CpuResponse::HarnessError(e)) => Err(Outcome::Crash { reason: format!("the CPU harness failed: {e}") }),
            Err(WorkerFailure::Timeout { .. }) => Err(Outcome::Timeout { stage: stage.into(), limit_ms: limit.as_millis() as u64 }),
            Err(WorkerFailure::Crashed { exit, .. }) => Err(Outcome::Crash {
                reason: format!(
                    "the kernel crashed its worker ({exit}); on the CPU backend an out-of-bounds access hits a guard page"
                ),
            }),
            Err(other) => Err(Outcome::Crash { reason: format!("the CPU worker failed: {other}") }),
        }
    }

    fn artifact(compiled: &Compiled) -> Option<&Artifact> {
        compiled.artifact.downcast_ref::<Artifact>()
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
        let plan =
            crate::env::admit_named(&self.suite, task_name, self.preset, &self.limits, source)?;
        let dir = self.workdir.join(format!(
            "{}-{}",
            task_name,
            self.compiles.fetch_add(1, Ordering::Relaxed)
        ));
        let module = cpu::compile(source, &plan, &dir).map_err(|e| match e {
            CpuCompileError::Source { log } => Outcome::CompileError { log },
            CpuCompileError::Unsupported { feature } => Outcome::Unsupported { feature },
            CpuCompileError::Toolchain { reason } if reason.contains("deadline") => {
                Outcome::Timeout {
                    stage: "compile".into(),
                    limit_ms: cpu::COMPILE_DEADLINE.as_millis() as u64,
                }
            }
            CpuCompileError::Toolchain { reason } => Outcome::CompileError {
                log: format!("the CPU toolchain failed: {reason}"),
            },
        })?;
        Ok(Compiled {
            task: task_name.to_string(),
            artifact: Arc::new(Artifact { dir, module, plan }),
            compile_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        let a = Self::artifact(compiled).ok_or_else(|| Outcome::Crash {
            reason: "not a CPU module".into(),
        })?;
        let req = CpuRequest::Verify {
            task: compiled.task.clone(),
            preset: self.preset,
            module: a.module.clone(),
            plan: a.plan.clone(),
            trials: 5,
        };
        match self.request(&req, "verify", self.verify_timeout)? {
            None => Ok(()),
            Some(o) => Err(o),
        }
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        let Some(a) = Self::artifact(compiled) else {
            return Outcome::Crash {
                reason: "not a CPU module".into(),
            };
        };
        let req = CpuRequest::Profile {
            task: compiled.task.clone(),
            preset: self.preset,
            module: a.module.clone(),
            plan: a.plan.clone(),
        };
        match self.request(&req, "profile", self.profile_timeout) {
            Ok(Some(o)) => o,
            Ok(None) => Outcome::Crash {
                reason: "the CPU worker returned no timing".into(),
            },
            Err(o) => o,
        }
    }
}
