//! The trusted side of a CPU evaluation's candidate runs: [`SandboxedExecutor`] starts one
//! executor process ([`super::sandbox`]) per evaluation, shares the task tensors and scratch
//! buffers with it through a memfd arena, and keeps everything else (the reference, the
//! comparisons, the clock, the reply to the daemon) to itself.
//!
//! Per run: the executor is resumed (SIGCONT), sent `Run`, its `Done` read, and frozen again
//! (SIGSTOP, waited for) before the caller looks at an output. Its replies are parsed as untrusted
//! input: a forged `Done` only ends the run early (the outputs are then incomplete and judged
//! wrong), a forged failure only gives its own candidate that failure, and anything unreadable
//! is the candidate's crash. A dead executor is the candidate's crash, with the signal and the
//! fault line it wrote; this process survives it and answers the daemon itself.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::candidate::{self, ResolvedPlan};
use crate::ops::Dtype;
use crate::verify::buffer::{BufferError, GuardedBuffer, TensorBuf};
use crate::verify::correctness::Executor;
use crate::verify::ExecFailure;
use crate::worker::protocol::{read_frame, write_frame};
use crate::worker::{ExitReport, TailBuffer};

use super::sandbox::{Command as ExecCommand, Reply, RunFailure, Setup, Span, ARENA_FD, MAX_FRAME};
use super::worker::FAULT_MARKER;

/// Address space an executor may map beyond its loaded image and the arena: fiber stacks (68 KiB
/// per CUDA thread per OS thread), thread stacks and the candidate's own allocations.
pub const EXTRA_ADDRESS_SPACE: u64 = 8 << 30;
/// CPU seconds an executor may use in all (a backstop: the daemon's deadline comes first).
pub const CPU_SECONDS: u64 = 600;

/// Memory shared with the executor: one memfd, carved into page-aligned spans.
struct Arena {
    fd: OwnedFd,
    end: u64,
}

impl Arena {
    fn new() -> Result<Arena, String> {
        // SAFETY: memfd_create with a static name; the descriptor is owned by the result.
        let fd = unsafe { libc::memfd_create(c"kevin-arena".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        Ok(Arena {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            end: 0,
        })
    }

    /// A tensor of `numel` elements of `dtype` in the arena, and its span.
    fn tensor(
        &mut self,
        name: &str,
        dtype: Dtype,
        numel: usize,
    ) -> Result<(TensorBuf, Span), BufferError> {
        let (buf, span) = self.alloc(TensorBuf::bytes_for(dtype, numel)?)?;
        Ok((TensorBuf::from_buffer(name, dtype, numel, buf)?, span))
    }

    fn alloc(&mut self, bytes: usize) -> Result<(GuardedBuffer, Span), BufferError> {
        let too_large = || BufferError::TooLarge {
            elems: bytes,
            elem_size: 1,
        };
        let span = GuardedBuffer::file_span(bytes).ok_or_else(too_large)? as u64;
        let offset = self.end;
        let end = offset.checked_add(span).ok_or_else(too_large)?;
        // SAFETY: ftruncate on our own memfd.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), end as libc::off_t) } != 0 {
            return Err(BufferError::Map {
                bytes,
                reason: std::io::Error::last_os_error().to_string(),
            });
        }
        self.end = end;
        let buf = GuardedBuffer::shared(self.fd.as_raw_fd(), offset, bytes, true)?;
        Ok((buf, Span { offset, bytes }))
    }
}

/// One executor process.
struct Process {
    pid: i32,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
    stopped: bool,
    exited: Option<ExitReport>,
}

/// The executor's empty root directory: `<tmp>/kevin-exec-root-<uid>`, made once (mode 0555) and
/// shared by every worker of this user; one that is not an empty directory owned by this user
/// (a symlink, someone else's, with files in it) is not used, and a fresh per-process one is made
/// instead.
fn empty_dir() -> Result<PathBuf, String> {
    static DIR: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let usable = |dir: &Path| {
            std::fs::symlink_metadata(dir)
                .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0)
                && std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
        };
        let make = |dir: &Path| -> Result<(), String> {
            match std::fs::create_dir(dir) {
                Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
                    .map_err(|e| format!("{}: {e}", dir.display())),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(format!("{}: {e}", dir.display())),
            }
        };
        let shared = std::env::temp_dir().join(format!("kevin-exec-root-{uid}"));
        make(&shared)?;
        if usable(&shared) {
            return Ok(shared);
        }
        let own =
            std::env::temp_dir().join(format!("kevin-exec-root-{uid}-{}", std::process::id()));
        make(&own)?;
        if usable(&own) {
            Ok(own)
        } else {
            Err(format!(
                "no usable empty directory for the executor's chroot ({})",
                own.display()
            ))
        }
    })
    .clone()
}

impl Process {
    fn spawn(arena: &Arena, setup: &Setup) -> Result<(Process, Vec<String>), ExecFailure> {
        let harness = |what: &str, e: &dyn std::fmt::Display| {
            ExecFailure::Harness(format!("starting the CPU executor: {what}: {e}"))
        };
        let program =
            crate::worker::own_binary().map_err(|e| harness("locating the kevin binary", &e))?;
        let arena_fd = arena.fd.as_raw_fd();
        let mut command = Command::new(program);
        command
            .args(["worker", "--role", "cpu-exec"])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls (dup2, fcntl, prctl) between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let ok = if arena_fd == ARENA_FD {
                        libc::fcntl(ARENA_FD, libc::F_SETFD, 0) == 0
                    } else {
                        libc::dup2(arena_fd, ARENA_FD) == ARENA_FD
                    };
                    if !ok || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().map_err(|e| harness("spawn", &e))?;
        let take = |what: &str| harness(what, &"no pipe");
        let mut proc = Process {
            pid: child.id() as i32,
            stdin: child.stdin.take().ok_or_else(|| take("stdin"))?,
            stdout: child.stdout.take().ok_or_else(|| take("stdout"))?,
            stderr: child.stderr.take().ok_or_else(|| take("stderr"))?,
            stopped: false,
            exited: None,
        };
        // The pipes and the pid are all we keep; waiting is done with waitpid below.
        drop(child);
        if write_frame(&mut proc.stdin, setup, MAX_FRAME).is_err() {
            return Err(proc.died("while starting"));
        }
        match read_frame::<_, Reply>(&mut proc.stdout, MAX_FRAME) {
            Ok(Some(Reply::Ready { layers })) => Ok((proc, layers)),
            Ok(Some(Reply::LoadFailed { reason })) => Err(ExecFailure::Launch(format!(
                "the compiled module failed to load: {reason}"
            ))),
            Ok(Some(Reply::SetupFailed { reason })) => Err(ExecFailure::Harness(format!(
                "the CPU executor could not confine itself: {reason}"
            ))),
            Ok(Some(other)) => Err(ExecFailure::Harness(format!(
                "the CPU executor said {other:?} before it was ready"
            ))),
            Ok(None) | Err(_) => Err(proc.died("while loading the module")),
        }
    }

    /// Runs the plan once; the time from sending the command to reading the reply.
    fn run(&mut self, tensors: Vec<Span>, scratch: Vec<Span>) -> Result<Duration, ExecFailure> {
        if let Some(exit) = &self.exited {
            return Err(ExecFailure::Crash(format!(
                "the executor had already ended ({exit})"
            )));
        }
        self.resume();
        let cmd = ExecCommand::Run { tensors, scratch };
        let start = Instant::now();
        if write_frame(&mut self.stdin, &cmd, MAX_FRAME).is_err() {
            return Err(self.died("before the run"));
        }
        let reply = read_frame::<_, Reply>(&mut self.stdout, MAX_FRAME);
        let elapsed = start.elapsed();
        self.freeze();
        match reply {
            Ok(Some(Reply::Done { failure: None })) => Ok(elapsed),
            Ok(Some(Reply::Done {
                failure: Some(failure),
            })) => Err(match failure {
                RunFailure::Unsupported(m) => ExecFailure::Unsupported(m),
                RunFailure::Launch(m) => ExecFailure::Launch(m),
                RunFailure::Trap(m) => ExecFailure::Crash(m),
                RunFailure::Map(m) => {
                    ExecFailure::Crash(format!("the executor could not map a buffer: {m}"))
                }
            }),
            Ok(Some(other)) => Err(ExecFailure::Crash(format!(
                "the executor sent {other:?} instead of a run's result (did the kernel write to \
                 its pipe?)"
            ))),
            Ok(None) => Err(self.died("during the run")),
            Err(e) => {
                self.kill();
                Err(ExecFailure::Crash(format!(
                    "the executor's reply was unreadable ({e}); a kernel wrote to its pipe?"
                )))
            }
        }
    }

    fn resume(&mut self) {
        if self.stopped {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.pid, libc::SIGCONT) };
            self.stopped = false;
        }
    }

    /// Stops every thread of the executor and waits until they are stopped.
    fn freeze(&mut self) {
        if self.exited.is_some() {
            return;
        }
        // SAFETY: signalling and waiting for our own child.
        unsafe { libc::kill(self.pid, libc::SIGSTOP) };
        loop {
            let mut status = 0;
            // SAFETY: as above.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WUNTRACED) };
            if rc == self.pid && libc::WIFSTOPPED(status) {
                self.stopped = true;
                return;
            }
            if rc == self.pid && (libc::WIFEXITED(status) || libc::WIFSIGNALED(status)) {
                self.exited = Some(report(status));
                return;
            }
            if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                self.exited = Some(ExitReport::default());
                return;
            }
        }
    }

    /// Kills the executor (if it still runs) and reaps it.
    fn kill(&mut self) -> ExitReport {
        if let Some(exit) = &self.exited {
            return exit.clone();
        }
        let mut status = 0;
        // SAFETY: signalling and reaping our own child.
        let exit = unsafe {
            // Give a dying process a moment to finish dying on its own, so its own signal is
            // what gets reported.
            let mut rc = 0;
            for _ in 0..50 {
                rc = libc::waitpid(self.pid, &mut status, libc::WNOHANG);
                if rc != 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if rc == 0 {
                libc::kill(self.pid, libc::SIGKILL);
                libc::kill(self.pid, libc::SIGCONT);
                libc::waitpid(self.pid, &mut status, 0);
            }
            report(status)
        };
        self.exited = Some(exit.clone());
        exit
    }

    /// The candidate's crash for an executor that stopped answering.
    fn died(&mut self, when: &str) -> ExecFailure {
        let exit = self.kill();
        // The last 8 KB the executor wrote (its fault line is its last words), read to the end
        // of the stream: the process is gone, so the read ends.
        let mut tail = TailBuffer::new(8192);
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = self.stderr.read(&mut chunk) {
            tail.push(&chunk[..n]);
        }
        let tail = tail.to_string_lossy();
        ExecFailure::Crash(format!("{} ({when})", crash_reason(&exit, &tail)))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

fn report(status: i32) -> ExitReport {
    if libc::WIFEXITED(status) {
        ExitReport {
            code: Some(libc::WEXITSTATUS(status)),
            signal: None,
        }
    } else if libc::WIFSIGNALED(status) {
        ExitReport {
            code: None,
            signal: Some(libc::WTERMSIG(status)),
        }
    } else {
        ExitReport::default()
    }
}

/// Names of the x86-64 system calls a kernel (or a library it calls) is likeliest to try.
fn syscall_name(nr: i64) -> Option<&'static str> {
    Some(match nr {
        2 => "open",
        4 => "stat",
        5 => "fstat",
        16 => "ioctl",
        35 => "nanosleep",
        41 => "socket",
        42 => "connect",
        56 => "clone (a process, not a thread)",
        57 => "fork",
        59 => "execve",
        62 => "kill",
        63 => "uname",
        89 => "readlink",
        96 => "gettimeofday",
        99 => "sysinfo",
        102 => "getuid",
        110 => "getppid",
        157 => "prctl",
        200 => "tkill",
        201 => "time",
        228 => "clock_gettime",
        230 => "clock_nanosleep",
        234 => "tgkill",
        257 => "openat",
        262 => "newfstatat",
        302 => "prlimit64",
        309 => "getcpu",
        324 => "membarrier",
        332 => "statx",
        _ => return None,
    })
}

/// The crash reason for an executor that died: the signal, and where the kernel faulted with what
/// that address usually means (from the fault handler's line in `stderr_tail`, when there is one).
pub fn crash_reason(exit: &ExitReport, stderr_tail: &str) -> String {
    // The fault handler's line, the last one when there are several.
    let fault = stderr_tail
        .lines()
        .rev()
        .find_map(|l| l.split_once(FAULT_MARKER).map(|(_, rest)| rest.trim()));
    match exit.signal {
        Some(libc::SIGSYS) => {
            let call = fault
                .and_then(|f| f.strip_prefix("SIGSYS system call "))
                .and_then(|nr| nr.parse::<i64>().ok())
                .map_or(String::new(), |nr| match syscall_name(nr) {
                    Some(name) => format!(" {nr} ({name})"),
                    None => format!(" {nr}"),
                });
            return format!(
                "the kernel made a system call{call}, which the sandbox forbids ({exit}); device \
                 code cannot call the operating system"
            );
        }
        Some(libc::SIGXCPU) => {
            return format!("the kernel used up the executor's CPU time ({exit})")
        }
        _ => {}
    }
    let Some(fault) = fault else {
        return format!(
            "the kernel crashed its process ({exit}); on the CPU backend an out-of-bounds access \
             hits a guard page"
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
    format!("the kernel crashed its process ({exit}): {fault}, {meaning}")
}

/// Runs a compiled module's launch plan in a sandboxed executor process, on buffers shared with
/// it: the CPU backend's [`Executor`]. Task tensors must come from [`Executor::alloc`].
pub struct SandboxedExecutor {
    arena: Arena,
    proc: Process,
    /// The layers the executor reported.
    layers: Vec<String>,
    scratch: Vec<(TensorBuf, Span)>,
    /// Arena span of each tensor handed out, by its data address.
    spans: HashMap<usize, Span>,
}

impl SandboxedExecutor {
    /// Starts the executor of `module` (which [`super::compile()`] built and its module gate
    /// passed) and allocates the plan's scratch buffers.
    pub fn new(
        module: &Path,
        plan: ResolvedPlan,
        threads: usize,
    ) -> Result<SandboxedExecutor, ExecFailure> {
        SandboxedExecutor::start(module, plan, threads, true)
    }

    /// [`SandboxedExecutor::new`], with the system-call filter on or off. Off is for the tests
    /// of the layers beneath the filter (each layer must hold on its own); evaluation never
    /// turns it off.
    pub fn start(
        module: &Path,
        plan: ResolvedPlan,
        threads: usize,
        seccomp: bool,
    ) -> Result<SandboxedExecutor, ExecFailure> {
        let mut arena = Arena::new().map_err(ExecFailure::Harness)?;
        let mut scratch = Vec::with_capacity(plan.scratch.len());
        for s in &plan.scratch {
            let (t, span) = arena
                .tensor(&s.name, scratch_dtype(s.dtype), s.elems as usize)
                .map_err(|e| ExecFailure::Harness(e.to_string()))?;
            scratch.push((t, span));
        }
        let setup = Setup {
            module: module.to_path_buf(),
            plan,
            threads: threads.max(1),
            empty_dir: empty_dir().map_err(ExecFailure::Harness)?,
            address_space: arena.end.saturating_add(EXTRA_ADDRESS_SPACE),
            cpu_seconds: CPU_SECONDS,
            parent: std::process::id(),
            seccomp,
        };
        let (proc, layers) = Process::spawn(&arena, &setup)?;
        Ok(SandboxedExecutor {
            arena,
            proc,
            layers,
            scratch,
            spans: HashMap::new(),
        })
    }

    /// The sandbox layers the executor reported when it started.
    pub fn layers(&self) -> &[String] {
        &self.layers
    }

    /// Runs the plan once on `tensors`; the executor's time from command to reply.
    pub fn run_timed(&mut self, tensors: &mut [TensorBuf]) -> Result<Duration, ExecFailure> {
        let spans = tensors
            .iter()
            .map(|t| {
                self.spans
                    .get(&(t.as_bytes().as_ptr() as usize))
                    .copied()
                    .ok_or_else(|| {
                        ExecFailure::Harness(format!(
                            "tensor {} is not in the executor's shared memory",
                            t.name()
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let scratch = self.scratch.iter().map(|(_, s)| *s).collect();
        self.proc.run(spans, scratch)
    }
}

/// Scratch buffers are raw bytes to the candidate; any dtype of the same width holds them.
fn scratch_dtype(d: candidate::Dtype) -> Dtype {
    match d.size_bytes() {
        8 => Dtype::I64,
        2 => Dtype::F16,
        _ => Dtype::F32,
    }
}

impl Executor for SandboxedExecutor {
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        self.run_timed(tensors).map(|_| ())
    }

    fn alloc(&mut self, name: &str, dtype: Dtype, numel: usize) -> Result<TensorBuf, BufferError> {
        let (t, span) = self.arena.tensor(name, dtype, numel)?;
        self.spans.insert(t.as_bytes().as_ptr() as usize, span);
        Ok(t)
    }

    fn tampering(&self) -> Option<String> {
        self.scratch
            .iter()
            .find(|(t, _)| !t.buffer().slack_intact())
            .map(|(t, _)| {
                format!(
                    "the kernel wrote past the end of scratch buffer {}",
                    t.name()
                )
            })
    }
}
