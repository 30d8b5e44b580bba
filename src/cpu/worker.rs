//! The `cpu` worker (`kevin worker --role cpu`): the trusted half of a CPU evaluation. It runs
//! the correctness and timing protocols of [`crate::verify`] (inputs, the fp64 reference, the
//! comparisons, the clock) and answers the daemon; the candidate's module runs in a sandboxed
//! executor process it starts per evaluation ([`super::executor`], [`super::sandbox`]), on
//! guard-paged buffers the two share. The parent side is [`crate::env::cpu`], the messages are
//! [`crate::verify::request`].
//!
//! A crash of the executor (an out-of-bounds access hits a guard page, a forbidden system call)
//! is the candidate's outcome and this worker survives it; before dying, a faulting executor
//! writes the signal and the faulting address to stderr ([`FAULT_MARKER`]), so the crash's
//! feedback says what kind of access it was. A hang is ended by the daemon's deadline, which
//! kills this worker (the executor dies with it). The baseline on the CPU is the fp64 reference
//! interpreter.

use crate::tasks::TaskSuite;
use crate::verify::correctness::{self, ProtocolConfig};
use crate::verify::request::{self, EvalRequest, EvalResult, ModuleJob};
use crate::verify::timing::{self, TimingConfig};

use super::executor::SandboxedExecutor;
use super::timer::CpuTimer;

/// The candidate's executor for `stage`, started; a failure is the answer.
fn start(job: &ModuleJob, stage: &str) -> Result<SandboxedExecutor, EvalResult> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let exec = SandboxedExecutor::new(&job.module, job.plan.clone(), threads)
        .map_err(|f| EvalResult::of_failure(f, stage))?;
    static REPORTED: std::sync::Once = std::sync::Once::new();
    REPORTED.call_once(|| {
        tracing::debug!(layers = ?exec.layers(), "cpu executor sandbox");
    });
    Ok(exec)
}

fn handle(suite: &TaskSuite, req: EvalRequest) -> EvalResult {
    let Some(task) = suite.get(req.task()) else {
        return EvalResult::HarnessError(format!("unknown task `{}`", req.task()));
    };
    match req {
        EvalRequest::Verify { job, trials } => {
            let mut exec = match start(&job, "verify") {
                Ok(exec) => exec,
                Err(answer) => return answer,
            };
            let cfg = ProtocolConfig { trials, seed: None };
            EvalResult::of_check(correctness::check(task, job.preset, &mut exec, &cfg))
        }
        EvalRequest::Profile { job } => {
            let mut exec = match start(&job, "profile") {
                Ok(exec) => exec,
                Err(answer) => return answer,
            };
            let mut timer = match CpuTimer::new(&mut exec, task, job.preset) {
                Ok(timer) => timer,
                Err(f) => return EvalResult::of_failure(f, "profile"),
            };
            let timed = timing::measure(&mut timer, &TimingConfig::default())
                .and_then(|t| timer.finish().map(|()| t));
            match timed {
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
/// that writes one line to stderr, [`FAULT_MARKER`] then the signal and the faulting address,
/// restores the signal's default action and returns, so the faulting instruction runs again and
/// the default action ends the process with the same signal. For SIGSYS (a system call the
/// seccomp filter traps) the line names the call's number and the process ends by SIGSYS at once.
/// Only the first faulting thread writes; a thread that faults meanwhile waits for that line
/// before it returns, so a kernel faulting in every thread at once is still reported (with the
/// handler reset on delivery, a second thread's fault could end the process before the first
/// one's line was written). Only `write` and `sigaction` are called (async-signal-safe). A fault
/// on an overflowed stack cannot run the handler: the process dies without the line.
#[cfg(unix)]
pub(crate) fn report_faults() {
    /// `v` in base `radix` (at most 16), without leading zeros, into the end of `buf`; no
    /// allocation, so a signal handler may call it.
    fn digits(mut v: usize, radix: usize, buf: &mut [u8; 24]) -> &[u8] {
        let mut k = buf.len();
        loop {
            k -= 1;
            buf[k] = b"0123456789abcdef"[v % radix];
            v /= radix;
            if v == 0 {
                return &buf[k..];
            }
        }
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    /// A thread has begun writing the fault's line; it has written it.
    static CLAIMED: AtomicBool = AtomicBool::new(false);
    static WRITTEN: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        if CLAIMED.swap(true, Ordering::AcqRel) {
            // Another thread's fault is being reported: let it finish the line first (it only
            // formats and writes), then end the process as it does.
            while !WRITTEN.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        } else {
            write_line(sig, info);
            WRITTEN.store(true, Ordering::Release);
        }
        // SAFETY: restoring a signal's default action (sigaction, async-signal-safe).
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
        if sig == libc::SIGSYS {
            // One more forbidden call: with the default action back, the filter's trap ends the
            // process by SIGSYS instead of returning into code whose system call did not run.
            // SAFETY: a system call without arguments.
            unsafe {
                libc::syscall(libc::SYS_getppid);
            }
        }
    }
    /// The fault's line, [`FAULT_MARKER`] then the signal and the address (or the system call's
    /// number), written to fd 2 from a stack buffer.
    fn write_line(sig: libc::c_int, info: *mut libc::siginfo_t) {
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
        let mut buf = [0u8; 24];
        put(FAULT_MARKER.as_bytes());
        if sig == libc::SIGSYS {
            put(b"SIGSYS system call ");
            if !info.is_null() {
                // SAFETY: the kernel passes a valid siginfo_t; for a seccomp trap the int after
                // `si_call_addr` (offset 24) is `si_syscall`, the call's number.
                let nr = unsafe { *info.cast::<u8>().add(24).cast::<u32>() };
                put(digits(nr as usize, 10, &mut buf));
            }
        } else {
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
            put(digits(addr, 16, &mut buf));
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
        action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGSYS,
        ] {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

#[cfg(not(unix))]
pub(crate) fn report_faults() {}
