//! The `cpu` worker's side (`kevin worker --role cpu`): it loads a compiled module of the CUDA
//! device model ([`crate::cpu`]) and runs the correctness and timing protocols of
//! [`crate::verify`] on guard-paged host buffers. Untrusted code runs here, in the child process
//! only; the parent side is [`crate::env::cpu`], the messages are [`crate::verify::request`].
//!
//! A crash (an out-of-bounds access hits a guard page), a hang or garbage kills and replaces the
//! worker and becomes the candidate's outcome. Before dying, a faulting worker writes the signal
//! and the faulting address to stderr ([`FAULT_MARKER`]), so the crash's feedback says what kind
//! of access it was. The baseline on the CPU is the fp64 reference interpreter.

use std::path::Path;
use std::time::Instant;

use crate::candidate::{self, ResolvedPlan};
use crate::cpu::{LaunchFailure, Module};
use crate::tasks::{Preset, TaskSuite};
use crate::verify::buffer::TensorBuf;
use crate::verify::correctness::{self, Executor, ProtocolConfig};
use crate::verify::request::{self, EvalRequest, EvalResult, ModuleJob};
use crate::verify::timing::{self, Timer, TimingConfig, Which};
use crate::verify::ExecFailure;

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

/// The candidate's module loaded for `stage`; a failure is the answer.
fn load(job: ModuleJob, stage: &str) -> Result<(CpuExecutor, Preset), EvalResult> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    CpuExecutor::new(&job.module, job.plan, threads)
        .map(|exec| (exec, job.preset))
        .map_err(|f| EvalResult::of_failure(f, stage))
}

fn handle(suite: &TaskSuite, req: EvalRequest) -> EvalResult {
    let Some(task) = suite.get(req.task()) else {
        return EvalResult::HarnessError(format!("unknown task `{}`", req.task()));
    };
    match req {
        EvalRequest::Verify { job, trials } => {
            let (mut exec, preset) = match load(job, "verify") {
                Ok(loaded) => loaded,
                Err(answer) => return answer,
            };
            let cfg = ProtocolConfig { trials, seed: None };
            EvalResult::of_check(correctness::check(task, preset, &mut exec, &cfg))
        }
        EvalRequest::Profile { job } => {
            let (mut exec, preset) = match load(job, "profile") {
                Ok(loaded) => loaded,
                Err(answer) => return answer,
            };
            let inputs = task.generate_inputs(preset, correctness::os_seed().unwrap_or(1));
            let tensors = match timing_tensors(task, preset, &inputs) {
                Ok(t) => t,
                Err(e) => return EvalResult::HarnessError(e),
            };
            let mut timer = CpuTimer {
                exec: &mut exec,
                tensors,
                task,
                preset,
                inputs,
            };
            match timing::measure(&mut timer, &TimingConfig::default()) {
                Ok(t) => EvalResult::Outcome(Some(timing::correct_outcome(&t, "cpu"))),
                Err(f) => EvalResult::of_failure(f, "profile"),
            }
        }
        EvalRequest::CheckBaseline { .. } => {
            EvalResult::HarnessError("the cpu worker does not check baselines".into())
        }
    }
}

/// The `cpu` worker's main loop (`kevin worker --role cpu`); the task suite's folder comes from
/// [`request::TASKS_ENV`].
pub fn worker_main() -> Result<(), String> {
    report_faults();
    let suite = request::suite_from_env()?;
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
