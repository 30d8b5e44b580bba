//! The "cpu" kernel environment: candidates compiled against the CUDA device model
//! ([`crate::cpu`]) and judged by the same correctness and timing protocols as on a GPU
//! ([`crate::verify`]), in worker processes with deadlines.
//!
//! - compile: the static rules, the launch plan validated against the task, then the host C++
//!   compiler as a child process with a deadline and a memory limit (the compiler never runs in
//!   the daemon).
//! - verify: a `kevin worker --role cpu` process loads the module and runs the correctness
//!   protocol on guard-paged host buffers. A crash (an out-of-bounds access hits a guard page), a
//!   hang or garbage kills and replaces that worker and becomes the candidate's outcome. Before
//!   dying, a faulting worker writes the signal and the faulting address to stderr
//!   ([`FAULT_MARKER`]), so the crash's feedback says what kind of access it was (a forged low
//!   pointer, address 0 for a misaligned vector access, an address past a buffer).
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
use crate::env::{Compiled, Deadlines, KernelEnv};
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::buffer::TensorBuf;
use crate::verify::correctness::{self, CheckError, Executor, ProtocolConfig};
use crate::verify::timing::{self, Timer, TimingConfig, Which};
use crate::verify::ExecFailure;
use crate::worker::{PoolConfig, PoolStats, WorkerCommand, WorkerFailure, WorkerPool};

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
                LaunchFailure::Trap(m) => ExecFailure::Crash(format!(
                    "launch line {} (`{}`): {m}",
                    launch.line, launch.kernel
                )),
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
    report_faults();
    let dir = std::env::var(TASKS_ENV).map_err(|_| format!("{TASKS_ENV} is not set"))?;
    let suite = TaskSuite::load(&dir).map_err(|e| format!("task suite {dir}: {e}"))?;
    crate::worker::serve("cpu", crate::worker::DEFAULT_MAX_FRAME_BYTES, |req| {
        handle(&suite, req)
    })
    .map_err(|e| e.to_string())
}

/// What the fault handler writes to stderr before the worker dies: the daemon finds this line in
/// the crash report's stderr tail and tells the policy where its kernel faulted.
pub const FAULT_MARKER: &str = "kevin-cpu-fault: ";

/// Installs a handler for the signals a faulting kernel raises (SIGSEGV, SIGBUS, SIGILL, SIGFPE)
/// that writes one line to stderr, [`FAULT_MARKER`] then the signal and the faulting address, and
/// returns; the handler resets itself, so the faulting instruction runs again and the default
/// action ends the process with the same signal. Only `write` is called (async-signal-safe). A
/// fault on an overflowed stack cannot run the handler: the process dies without the line.
#[cfg(unix)]
fn report_faults() {
    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let mut line = [0u8; 80];
        let mut n = 0;
        let mut put = |bytes: &[u8]| {
            for &b in bytes {
                if n < line.len() {
                    line[n] = b;
                    n += 1;
                }
            }
        };
        put(FAULT_MARKER.as_bytes());
        put(match sig {
            libc::SIGSEGV => b"SIGSEGV",
            libc::SIGBUS => b"SIGBUS",
            libc::SIGILL => b"SIGILL",
            _ => b"SIGFPE",
        });
        put(b" at address 0x");
        // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
        let addr = if info.is_null() {
            0
        } else {
            unsafe { (*info).si_addr() as usize }
        };
        let digits = (usize::BITS - addr.leading_zeros()).div_ceil(4).max(1);
        for i in (0..digits).rev() {
            put(&[b"0123456789abcdef"[(addr >> (4 * i)) & 0xf]]);
        }
        put(b"\n");
        // SAFETY: writing a stack buffer to fd 2; nothing else is touched.
        unsafe {
            libc::write(2, line.as_ptr().cast(), n);
        }
    }
    // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn of the SA_SIGINFO type.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_fault as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

#[cfg(not(unix))]
fn report_faults() {}

/// The crash reason for a worker that died: the signal, and where the kernel faulted with what
/// that address usually means (from the fault handler's line in `stderr_tail`, when there is one).
fn crash_reason(exit: &crate::worker::ExitReport, stderr_tail: &str) -> String {
    let fault = stderr_tail
        .lines()
        .rev()
        .find_map(|l| l.split_once(FAULT_MARKER).map(|(_, rest)| rest.trim()));
    let Some(fault) = fault else {
        return format!(
            "the kernel crashed its worker ({exit}); on the CPU backend an out-of-bounds access hits a guard page"
        );
    };
    let addr = fault
        .rsplit_once("0x")
        .and_then(|(_, hex)| u64::from_str_radix(hex, 16).ok());
    let meaning = match addr {
        Some(0) => {
            "a null pointer, or a general-protection fault: a misaligned vector access (float4 and \
             friends need 16-byte alignment) or a non-canonical pointer"
        }
        Some(a) if a < 1 << 16 => "a null or forged pointer (no memory is mapped that low)",
        _ => {
            "an access outside the kernel's buffers (on the CPU backend a guard page follows every \
             buffer) or through a forged pointer"
        }
    };
    format!("the kernel crashed its worker ({exit}): {fault}, {meaning}")
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

    fn request(
        &self,
        req: &CpuRequest,
        stage: &str,
        limit: Duration,
    ) -> Result<Option<Outcome>, Outcome> {
        match self.pool.request_with_timeout(req, limit) {
            Ok(CpuResponse::Outcome(o)) => Ok(o),
            Ok(CpuResponse::HarnessError(e)) => Err(Outcome::Crash {
                reason: format!("the CPU harness failed: {e}"),
            }),
            Err(WorkerFailure::Timeout { .. }) => Err(Outcome::Timeout {
                stage: stage.into(),
                limit_ms: limit.as_millis() as u64,
            }),
            Err(WorkerFailure::Crashed { exit, stderr_tail }) => Err(Outcome::Crash {
                reason: crash_reason(&exit, &stderr_tail),
            }),
            Err(other) => Err(Outcome::Crash {
                reason: format!("the CPU worker failed: {other}"),
            }),
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
        match self.request(&req, "verify", self.deadlines.verify())? {
            None => Ok(()),
            Some(o) => Err(o),
        }
    }

    fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        vec![("cpu".to_string(), self.pool.stats())]
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
        match self.request(&req, "profile", self.deadlines.profile()) {
            Ok(Some(o)) => o,
            Ok(None) => Outcome::Crash {
                reason: "the CPU worker returned no timing".into(),
            },
            Err(o) => o,
        }
    }
}
