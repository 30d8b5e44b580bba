//! Compiling a candidate for the CPU model: source checks, the inline-PTX and `extern __shared__`
//! rewrites, one generated launcher per launched kernel, and the host C++ compiler run with a
//! deadline.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::{ptx, scan, HEADERS};
use crate::candidate::ResolvedPlan;
use crate::worker::sched::{Expiry, WorkDeadline};

/// How long one compile may run before the compiler is killed (the default of [`compile`]).
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(60);

/// The compiler's address-space limit (`RLIMIT_AS`): a compile bomb that allocates (exponential
/// macro expansion, constant evaluation that caches every step) dies with "out of memory" instead
/// of taking the machine's memory before its deadline. An ordinary candidate needs a few hundred
/// MiB.
pub const COMPILE_MEMORY_LIMIT: u64 = 4 << 30;

/// Longest compiler log kept in [`CpuCompileError::Source`], in bytes.
const MAX_LOG: usize = 4000;

/// Why a candidate did not become a loadable module.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CpuCompileError {
    /// The compiler rejected the source; `log` holds its diagnostics, trimmed, naming
    /// `candidate.cu:LINE` for lines of the candidate.
    #[error("compile error:\n{log}")]
    Source {
        /// The diagnostics.
        log: String,
    },
    /// The source uses something the CPU model cannot run (see the module docs' limits).
    #[error("not supported by the CPU device model: {feature}")]
    Unsupported {
        /// What, e.g. "inline PTX assembly".
        feature: String,
    },
    /// The compiler ran past its deadline and was killed (a compile bomb). Its waits for a CPU
    /// are not counted against the deadline.
    #[error("the compiler ran past its {}s deadline and was killed", .limit.as_secs_f64())]
    Timeout {
        /// The deadline.
        limit: Duration,
    },
    /// The machine was too busy to finish the compile: by the backstop the compiler had waited
    /// for a CPU so long that it had had less than its deadline. Not the candidate's fault.
    #[error(
        "the machine is too busy: the compiler waited {starved:.1?} for a CPU in {elapsed:.1?} \
         and had not had its {limit:?} when it was stopped"
    )]
    Starved {
        /// The deadline.
        limit: Duration,
        /// From starting the compiler to stopping it.
        elapsed: Duration,
        /// How long it waited, runnable, for a CPU.
        starved: Duration,
    },
    /// No usable compiler, or it could not be run.
    #[error("CPU toolchain: {reason}")]
    Toolchain {
        /// What went wrong and what to do about it.
        reason: String,
    },
}

/// The host C++ compiler: `$KEVIN_CXX` if set, else the first of `g++`, `clang++` on `PATH`.
pub fn find_compiler() -> Result<PathBuf, CpuCompileError> {
    if let Some(cxx) = std::env::var_os("KEVIN_CXX") {
        return Ok(PathBuf::from(cxx));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["g++", "clang++"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(CpuCompileError::Toolchain {
        reason: "no C++ compiler (g++ or clang++) on PATH; install one (Debian/Ubuntu: \
                 `apt-get install g++`) or set KEVIN_CXX"
            .into(),
    })
}

/// Compiles `source` (a candidate's device code) with launchers for every kernel `plan`
/// launches, in `workdir` (created if missing), and returns the path of the shared library.
///
/// `workdir` receives the runtime headers, `module.cpp`, the compiler log and `module.so`; use a
/// fresh directory per candidate (a loaded library is cached by path).
pub fn compile(
    source: &str,
    plan: &ResolvedPlan,
    workdir: &Path,
) -> Result<PathBuf, CpuCompileError> {
    compile_with_deadline(source, plan, workdir, COMPILE_DEADLINE)
}

/// [`compile`] with an explicit deadline for the compiler.
pub fn compile_with_deadline(
    source: &str,
    plan: &ResolvedPlan,
    workdir: &Path,
    deadline: Duration,
) -> Result<PathBuf, CpuCompileError> {
    if let Some(feature) = scan::unsupported_feature(source) {
        return Err(CpuCompileError::Unsupported { feature });
    }
    let rewritten = ptx::rewrite(source)?;
    let cxx = find_compiler()?;
    let io = |what: &str, e: std::io::Error| CpuCompileError::Toolchain {
        reason: format!("{what}: {e}"),
    };
    let include = workdir.join("include");
    std::fs::create_dir_all(&include).map_err(|e| io("creating the include directory", e))?;
    for (name, text) in HEADERS {
        std::fs::write(include.join(name), text).map_err(|e| io("writing a runtime header", e))?;
    }
    let fibers = rewritten.collective || scan::needs_fibers(source);
    let unit = translation_unit(&rewritten.source, plan, fibers)?;
    let cpp = workdir.join("module.cpp");
    std::fs::write(&cpp, unit).map_err(|e| io("writing module.cpp", e))?;
    let so = workdir.join("module.so");
    let log_path = workdir.join("compile.log");
    let log_file = std::fs::File::create(&log_path).map_err(|e| io("creating compile.log", e))?;
    let mut command = Command::new(&cxx);
    contain(&mut command);
    if !cxx.to_string_lossy().contains("clang") {
        // g++ folds reads of a static that nothing writes to its zero initialiser; a __shared__
        // array is such a static here, and must read as the model's 0xff garbage instead.
        command.arg("-fno-ipa-reference-addressable");
    }
    let mut child = command
        .args([
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-shared",
            // No C runtime start files: no _init/_fini and no init/fini arrays of our own, so
            // the module gate (`elf`) can refuse any code that would run at load time.
            "-nostartfiles",
            "-pthread",
            // Kernels have no exceptions, and none may unwind across a fiber switch.
            "-fno-exceptions",
            "-fno-rtti",
            // CUDA code type-puns freely (float4 over float, __half2 over uint4).
            "-fno-strict-aliasing",
            "-fno-math-errno",
            "-fvisibility=hidden",
            "-Wno-unknown-pragmas",
            "-w",
            "-I",
        ])
        .arg(&include)
        .args(["-x", "c++"])
        .arg(&cpp)
        .arg("-o")
        .arg(&so)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map_err(|e| CpuCompileError::Toolchain {
            reason: format!("running {}: {e}", cxx.display()),
        })?;
    // The deadline is the compiler's own time: on a machine busier than its cores it also waits
    // for a CPU, and that wait moves the deadline on, up to a backstop (`WorkDeadline`).
    let mut limit = WorkDeadline::start(child.id(), deadline);
    let mut due = limit.first();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= due => match limit.extend() {
                Some(next) => due = next,
                None => {
                    kill_group(&mut child);
                    return Err(match limit.expiry() {
                        Expiry::Timeout => CpuCompileError::Timeout { limit: deadline },
                        Expiry::Starved { elapsed, starved } => CpuCompileError::Starved {
                            limit: deadline,
                            elapsed,
                            starved,
                        },
                    });
                }
            },
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(io("waiting for the compiler", e)),
        }
    };
    if status.success() {
        return match super::elf::check_module(&so) {
            Ok(()) => Ok(so),
            Err(super::elf::ModuleCheckError::Refused(log)) => Err(CpuCompileError::Source { log }),
            Err(e) => Err(CpuCompileError::Toolchain {
                reason: e.to_string(),
            }),
        };
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    if log.trim().is_empty() {
        // No diagnostics: the compiler died (a signal, a full disk) rather than rejecting the code.
        return Err(CpuCompileError::Toolchain {
            reason: format!("{} exited with {status} and printed nothing", cxx.display()),
        });
    }
    Err(CpuCompileError::Source {
        log: trim_log(&log, workdir),
    })
}

/// Puts the compiler in a process group of its own (so [`kill_group`] reaches `cc1plus` and the
/// assembler, not just the `g++` driver that started them) and sets [`COMPILE_MEMORY_LIMIT`] on
/// it (Unix; elsewhere nothing).
fn contain(command: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only calls setrlimit,
        // which is async-signal-safe; it allocates nothing.
        unsafe {
            command.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: COMPILE_MEMORY_LIMIT as libc::rlim_t,
                    rlim_max: COMPILE_MEMORY_LIMIT as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// Kills the compiler's whole process group (SIGKILL) and reaps the driver. Killing only the
/// driver would leave a compile bomb's `cc1plus` running, orphaned, to its end.
fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill() with a negative pid signals the process group the child leads (it was
        // started with process_group(0)); no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The translation unit: the model, the candidate (numbered as `candidate.cu`), the launchers.
/// `fibers`: the kernels use barriers or warp operations.
fn translation_unit(
    source: &str,
    plan: &ResolvedPlan,
    fibers: bool,
) -> Result<String, CpuCompileError> {
    let mut unit = String::with_capacity(source.len() + 1024);
    unit.push_str("#include \"kevin_cuda.h\"\n#line 1 \"candidate.cu\"\n");
    unit.push_str(&scan::rewrite_extern_shared(source));
    unit.push_str("\n#line 1 \"kevin_launchers\"\n");
    let mut done: Vec<&str> = Vec::new();
    for launch in &plan.launches {
        let name = launch.kernel.as_str();
        if done.contains(&name) {
            continue;
        }
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(CpuCompileError::Unsupported {
                feature: format!("kernel name `{name}`"),
            });
        }
        done.push(name);
        let _ = writeln!(
            unit,
            "extern \"C\" __attribute__((visibility(\"default\"))) int kevin_launch_{name}(void** a, \
             const unsigned* g, const unsigned* b, unsigned s, int t, char* e, int el) \
             {{ return ::kevin::launch(&{name}, a, g, b, s, t, {fibers}, e, el); }}\n\
             extern \"C\" __attribute__((visibility(\"default\"))) int kevin_nparams_{name}() \
             {{ return ::kevin::nparams(&{name}); }}"
        );
    }
    Ok(unit)
}

/// Keeps the diagnostics readable: work-directory paths removed, at most [`MAX_LOG`] bytes, cut
/// at a line boundary.
fn trim_log(log: &str, workdir: &Path) -> String {
    let dir = format!("{}/", workdir.display());
    let mut out = String::new();
    for line in log.lines() {
        let line = line.replace(&dir, "");
        if out.len() + line.len() + 1 > MAX_LOG {
            out.push_str("[... log truncated]\n");
            break;
        }
        out.push_str(&line);
        out.push('\n');
    }
    out.trim_end().to_string()
}
