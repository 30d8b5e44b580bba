//! The executor: the process in which a candidate's CPU module runs (`kevin worker --role
//! cpu-exec`), started by the trusted `cpu` worker ([`super::executor`]) for one evaluation.
//!
//! It holds nothing but the module and the buffers the trusted worker shares with it (one memfd
//! arena, fd 3): no reference, no task suite, no environment, no other file descriptor. Before it
//! answers `Ready`, and before any candidate code runs, it puts itself in a sandbox, layer by
//! layer; each layer that the machine refuses is reported, never silently skipped:
//!
//! 1. **Module gate** ([`super::elf`]): checked when the module is built ([`super::compile()`]:
//!    imports on an allowlist, no load-time code), so `dlopen` runs none of the candidate's code.
//! 2. **Nothing inherited**: started with an empty environment; every descriptor but 0 (commands),
//!    1 (replies), 2 (the fault line) and 3 (the arena) is closed.
//! 3. **Namespaces**: new network, IPC and UTS namespaces (as root), or a new user namespace with
//!    them (as anyone else, where the kernel allows unprivileged user namespaces); then `chroot`
//!    into an empty directory, so not even the file system's names are reachable.
//! 4. **An unprivileged user**: started as root, it becomes `nobody` (uid and gid 65534, no
//!    supplementary groups), after which it cannot signal, trace or open anything of the daemon's.
//! 5. **Resource limits**: no file writes (`RLIMIT_FSIZE` 0), no new descriptors
//!    (`RLIMIT_NOFILE` 4), a bounded address space and CPU time, no core dumps; the parent-death
//!    signal is SIGKILL, so the executor never outlives its worker.
//! 6. **No clock**: `PR_SET_TSC` makes `rdtsc` fault (the vDSO clocks with it), and the filter
//!    below has no clock system call.
//! 7. **seccomp** ([`super::seccomp`]): after loading, only the system calls running a launch
//!    needs; anything else kills the process (SIGSYS). Where the kernel has no seccomp, the layers
//!    above still stand and the report says the filter is off.
//!
//! The trusted worker freezes this process (SIGSTOP) whenever no run is in progress, so a thread
//! the candidate left behind cannot write an output while it is being compared, nor precompute
//! between runs. Replies from here are untrusted input to the worker: a forged one can only make
//! its own candidate's outcome worse (see [`super::executor`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::candidate::ResolvedPlan;
use crate::verify::buffer::GuardedBuffer;
use crate::worker::protocol::{read_frame, write_frame};

use super::{LaunchFailure, Module};

/// The descriptor of the shared arena in the executor.
pub const ARENA_FD: i32 = 3;
/// Largest frame either side sends (a plan, a reply with a launch's message).
pub const MAX_FRAME: u32 = 1 << 20;
/// The uid and gid the executor takes when started as root.
pub const NOBODY: u32 = 65534;

/// The executor's first message: what to load and how to confine itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    /// The compiled module (its gate, [`super::elf::check_module`], passed when it was built).
    pub module: PathBuf,
    /// The launch sequence.
    pub plan: ResolvedPlan,
    /// OS threads per launch.
    pub threads: usize,
    /// An empty directory to `chroot` into.
    pub empty_dir: PathBuf,
    /// Address space the executor may map beyond what it has mapped once its module is loaded
    /// (the arena's views, fiber and thread stacks, the candidate's own allocations), in bytes;
    /// the total is its `RLIMIT_AS`.
    pub address_space: u64,
    /// CPU-time limit in seconds (`RLIMIT_CPU`), a backstop behind the worker's deadline.
    pub cpu_seconds: u64,
    /// The worker's pid: the executor exits at once if its parent is already another process.
    pub parent: u32,
    /// Install the system-call filter (always, except in the tests of the other layers).
    pub seccomp: bool,
}

/// A buffer in the arena: its data pages start at `offset` and it holds `bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Span {
    /// Page-aligned offset in the arena.
    pub offset: u64,
    /// The buffer's length in bytes.
    pub bytes: usize,
}

/// Worker → executor, after the setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Command {
    /// Run the plan once on these buffers (task tensors in signature order, then scratch).
    Run {
        /// Task tensors.
        tensors: Vec<Span>,
        /// Scratch buffers, in the plan's order.
        scratch: Vec<Span>,
    },
}

/// Executor → worker (untrusted once candidate code has run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Loaded and confined; `layers` says which sandbox layers hold.
    Ready {
        /// One line per layer: what it is and whether it is on.
        layers: Vec<String>,
    },
    /// The module could not be loaded (`dlopen`'s message).
    LoadFailed {
        /// Why.
        reason: String,
    },
    /// The sandbox could not be set up (the harness's problem).
    SetupFailed {
        /// Why.
        reason: String,
    },
    /// A run finished.
    Done {
        /// `None` when every launch completed.
        failure: Option<RunFailure>,
    },
}

/// How a run failed, as the executor saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunFailure {
    /// [`LaunchFailure::Unsupported`].
    Unsupported(String),
    /// [`LaunchFailure::Launch`].
    Launch(String),
    /// [`LaunchFailure::Trap`].
    Trap(String),
    /// A span could not be mapped.
    Map(String),
}

/// `kevin worker --role cpu-exec`.
pub fn exec_main() -> Result<(), String> {
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let setup: Setup = read_frame(&mut input, MAX_FRAME)
        .map_err(|e| format!("reading the setup: {e}"))?
        .ok_or("no setup before end of input")?;
    let reply = |r: &Reply, out: &mut std::io::StdoutLock<'_>| {
        write_frame(out, r, MAX_FRAME)
            .map_err(|e| e.to_string())
            .and_then(|()| out.flush().map_err(|e| e.to_string()))
    };
    let (module, layers) = match confine(&setup) {
        Ok(ok) => ok,
        Err(failed) => {
            let _ = reply(&failed, &mut output);
            return Err(format!("{failed:?}"));
        }
    };
    super::worker::report_faults();
    reply(&Reply::Ready { layers }, &mut output)?;
    let mut views: HashMap<Span, GuardedBuffer> = HashMap::new();
    loop {
        let cmd: Command = match read_frame(&mut input, MAX_FRAME) {
            Ok(Some(cmd)) => cmd,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        let Command::Run { tensors, scratch } = cmd;
        let failure = run(&module, &setup, &mut views, &tensors, &scratch).err();
        reply(&Reply::Done { failure }, &mut output)?;
    }
}

fn run(
    module: &Module,
    setup: &Setup,
    views: &mut HashMap<Span, GuardedBuffer>,
    tensors: &[Span],
    scratch: &[Span],
) -> Result<(), RunFailure> {
    let mut ptr = |span: &Span| -> Result<*mut c_void, RunFailure> {
        if !views.contains_key(span) {
            let view = GuardedBuffer::shared(ARENA_FD, span.offset, span.bytes, false)
                .map_err(|e| RunFailure::Map(e.to_string()))?;
            views.insert(*span, view);
        }
        Ok(views[span].as_ptr() as *mut c_void)
    };
    let t: Vec<*mut c_void> = tensors.iter().map(&mut ptr).collect::<Result<_, _>>()?;
    let s: Vec<*mut c_void> = scratch.iter().map(&mut ptr).collect::<Result<_, _>>()?;
    for launch in &setup.plan.launches {
        // SAFETY: every pointer is a live guard-paged view of the span the worker sized for
        // it; this is the executor process, which exists to run candidate code.
        unsafe { module.launch(launch, &t, &s, setup.threads) }.map_err(|e| match e {
            LaunchFailure::Unsupported(m) => RunFailure::Unsupported(m),
            LaunchFailure::Launch(m) => RunFailure::Launch(format!(
                "launch line {} (`{}`): {m}",
                launch.line, launch.kernel
            )),
            LaunchFailure::Trap(m) => RunFailure::Trap(format!(
                "launch line {} (`{}`): {m}",
                launch.line, launch.kernel
            )),
        })?;
    }
    Ok(())
}

/// Loads the module and applies every layer; returns the module and the layer report.
fn confine(setup: &Setup) -> Result<(Module, Vec<String>), Reply> {
    let setup_failed = |reason: String| Reply::SetupFailed { reason };
    let mut layers = Vec::new();
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } as u32 != setup.parent {
        return Err(setup_failed(
            "the worker that started this executor is gone".into(),
        ));
    }
    close_inherited();
    layers.push("descriptors: 0-3 only; environment: empty".to_string());
    // Fault in the math and C++ runtimes now, while files can still be opened.
    let module = Module::load(&setup.module).map_err(|e| Reply::LoadFailed {
        reason: e.to_string(),
    })?;
    let mapped = mapped_bytes();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    layers.push(namespaces(root));
    layers.push(chroot(&setup.empty_dir));
    if root {
        drop_to_nobody().map_err(setup_failed)?;
        layers.push(format!("user: nobody ({NOBODY})"));
    } else {
        layers.push("user: unchanged (not started as root)".to_string());
    }
    // SAFETY: prctl with integer arguments; getppid has no preconditions.
    unsafe {
        // Changing credentials cleared the parent-death signal: set it again, then make sure the
        // parent did not die in between.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() as u32 != setup.parent {
            return Err(setup_failed(
                "the worker that started this executor is gone".into(),
            ));
        }
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let address_space = mapped.saturating_add(setup.address_space);
    limits(setup, address_space).map_err(setup_failed)?;
    layers.push(format!(
        "limits: no file writes, 4 descriptors, {} MiB address space, {} s CPU",
        address_space >> 20,
        setup.cpu_seconds
    ));
    layers.push(no_clock());
    layers.push(if setup.seccomp {
        filter()
    } else {
        "seccomp: off (turned off by the caller, a test of the other layers)".into()
    });
    Ok((module, layers))
}

fn close_inherited() {
    // SAFETY: closing descriptors this process does not use; close_range is one system call, the
    // loop its fallback on kernels before 5.9.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
            for fd in 4..1024 {
                libc::close(fd);
            }
        }
    }
}

fn namespaces(root: bool) -> String {
    let base = libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    let flags = if root {
        base
    } else {
        base | libc::CLONE_NEWUSER
    };
    // SAFETY: unshare with flags only.
    if unsafe { libc::unshare(flags) } == 0 {
        let kind = if root { "" } else { "user, " };
        format!("namespaces: new {kind}network, IPC and UTS namespaces")
    } else {
        format!(
            "namespaces: off ({}; unprivileged user namespaces may be disabled)",
            std::io::Error::last_os_error()
        )
    }
}

fn chroot(dir: &std::path::Path) -> String {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return "chroot: off (the directory's name has a NUL byte)".into();
    };
    // SAFETY: chroot and chdir with valid C strings.
    let ok = unsafe { libc::chroot(c.as_ptr()) == 0 && libc::chdir(c"/".as_ptr()) == 0 };
    if ok {
        "file system: chroot into an empty directory".into()
    } else {
        format!(
            "file system: chroot off ({})",
            std::io::Error::last_os_error()
        )
    }
}

fn drop_to_nobody() -> Result<(), String> {
    // SAFETY: credential system calls with integer arguments; their results are checked.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
            || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0
        {
            return Err(format!(
                "could not become nobody: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// This process's mapped bytes (the first field of /proc/self/statm, in pages); 1 GiB when it
/// cannot be read.
fn mapped_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(1 << 30, |pages| {
            pages * crate::verify::buffer::page_size() as u64
        })
}

fn limits(setup: &Setup, address_space: u64) -> Result<(), String> {
    let set = |what: &str, resource, value: u64| -> Result<(), String> {
        let limit = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: setrlimit with a valid struct.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(format!(
                "setting {what}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    };
    set("RLIMIT_FSIZE", libc::RLIMIT_FSIZE, 0)?;
    set("RLIMIT_CORE", libc::RLIMIT_CORE, 0)?;
    set("RLIMIT_NOFILE", libc::RLIMIT_NOFILE, 4)?;
    set("RLIMIT_CPU", libc::RLIMIT_CPU, setup.cpu_seconds.max(1))?;
    set("RLIMIT_AS", libc::RLIMIT_AS, address_space)?;
    Ok(())
}

fn no_clock() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_TSC, libc::PR_TSC_SIGSEGV, 0, 0, 0) } == 0 {
            return "clock: rdtsc faults".into();
        }
        format!("clock: rdtsc allowed ({})", std::io::Error::last_os_error())
    }
    #[cfg(not(target_arch = "x86_64"))]
    "clock: no rdtsc control on this architecture".into()
}

fn filter() -> String {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        // The C library's malloc, on the first contention between threads, sizes its arena
        // limit from the number of CPUs, which some versions of glibc read from
        // /sys/devices/system/cpu/online: an `openat` the filter forbids, made by the harness's
        // own allocator inside a block worker (seen on a 16-core host). A fixed limit set now is
        // used instead, so that count is never taken once the filter is on.
        #[cfg(target_env = "gnu")]
        // SAFETY: mallopt with integer arguments, before any thread of the module runs.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 8);
        }
        match super::seccomp::install() {
            Ok(()) => format!(
                "seccomp: on ({} system calls allowed)",
                super::seccomp::allowed_names().len()
            ),
            Err(e) => format!("seccomp: off ({e})"),
        }
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    "seccomp: off (x86-64 Linux only)".into()
}
