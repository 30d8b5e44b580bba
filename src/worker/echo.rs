//! The "echo" worker role: a child that misbehaves on request, so the pool's timeout, crash,
//! garbage and respawn paths are tested against real processes. Harmless in production (it
//! touches nothing), and it doubles as a smoke test of the worker entry point.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::protocol::DEFAULT_MAX_FRAME_BYTES;
use super::serve::{serve, ServeError, FRAME_FD};

/// What the echo worker should do with a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum EchoRequest {
    /// Answer with the same text.
    Echo {
        /// The text.
        text: String,
    },
    /// Sleep, then answer (a slow request, or a hang when longer than the deadline).
    Sleep {
        /// Milliseconds.
        ms: u64,
    },
    /// Compute until this thread has used `ms` of CPU time, then answer (work that a busy
    /// machine stretches in wall time, unlike a sleep).
    Spin {
        /// Milliseconds of CPU time.
        ms: u64,
    },
    /// Write `text` to stderr, then abort (SIGABRT).
    Abort {
        /// The last words, expected in the crash report.
        text: String,
    },
    /// Raise SIGSEGV.
    Segfault,
    /// Exit with this status without answering.
    Exit {
        /// Exit status.
        code: i32,
    },
    /// Write these bytes onto the frame channel instead of an answer.
    Raw {
        /// The garbage.
        bytes: Vec<u8>,
    },
    /// Write a well-formed reply frame for request `id` carrying `text` (a forgery, as
    /// untrusted code in a worker could write one), then exit at once without reading again:
    /// the parent's next write to this worker meets a closed pipe.
    ForgeAndDie {
        /// The request id the forged reply claims to answer.
        id: u64,
        /// Its text.
        text: String,
    },
    /// Print to stdout (which a worker must not do) and answer normally.
    PrintToStdout {
        /// The text printed.
        text: String,
    },
}

/// The echo worker's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EchoResponse {
    /// Answer to [`EchoRequest::Echo`] or [`EchoRequest::PrintToStdout`].
    Text(String),
    /// Answer to [`EchoRequest::Sleep`].
    Slept(u64),
    /// Answer to [`EchoRequest::Spin`].
    Spun(u64),
}

/// Environment variable: milliseconds the echo worker waits before it says `Ready` (a stand-in
/// for a slow start, such as creating a CUDA context, in the pool's tests).
pub const START_DELAY_ENV: &str = "KEVIN_ECHO_START_DELAY_MS";

/// Runs the echo role's serve loop on stdin/stdout.
pub fn echo_main() -> Result<(), ServeError> {
    if let Some(ms) = std::env::var(START_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
    serve("echo", DEFAULT_MAX_FRAME_BYTES, handle)
}

fn handle(req: EchoRequest) -> EchoResponse {
    match req {
        EchoRequest::Echo { text } => EchoResponse::Text(text),
        EchoRequest::Sleep { ms } => {
            std::thread::sleep(Duration::from_millis(ms));
            EchoResponse::Slept(ms)
        }
        EchoRequest::Spin { ms } => {
            let until = thread_cpu() + Duration::from_millis(ms);
            let mut x = 1u64;
            while thread_cpu() < until {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            EchoResponse::Spun(ms)
        }
        EchoRequest::Abort { text } => {
            eprintln!("{text}");
            std::process::abort()
        }
        EchoRequest::Segfault => {
            #[cfg(unix)]
            // SAFETY: resetting a handler and raising a signal have no memory-safety
            // preconditions. The reset matters: Rust's stack-overflow handler would otherwise
            // swallow a raised (not faulting) SIGSEGV.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                libc::raise(libc::SIGSEGV);
            }
            std::process::abort()
        }
        EchoRequest::Exit { code } => std::process::exit(code),
        EchoRequest::Raw { bytes } => {
            write_raw(&bytes);
            // Then hang: the parent must act on the garbage, not on a later valid frame.
            std::thread::sleep(Duration::from_secs(3600));
            EchoResponse::Text(String::new())
        }
        EchoRequest::ForgeAndDie { id, text } => {
            let forged: super::protocol::FromChild<EchoResponse> =
                super::protocol::FromChild::Response {
                    id,
                    body: EchoResponse::Text(text),
                };
            if let Ok(frame) = super::protocol::encode_frame(&forged, DEFAULT_MAX_FRAME_BYTES) {
                write_raw(&frame);
            }
            // SAFETY: `_exit` ends the process at once (no destructors, no flush): the forger
            // dies before the serve loop can answer for real.
            #[cfg(unix)]
            unsafe {
                libc::_exit(0)
            };
            #[cfg(not(unix))]
            std::process::exit(0)
        }
        EchoRequest::PrintToStdout { text } => {
            println!("{text}");
            EchoResponse::Text(text)
        }
    }
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    #[cfg(unix)]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec for clock_gettime to fill.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
        }
    }
    // No thread clock: wall time since the first call stands in.
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(unix)]
fn write_raw(bytes: &[u8]) {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let fd = FRAME_FD.load(std::sync::atomic::Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    // SAFETY: `fd` is the live frame descriptor set by `serve`; ManuallyDrop keeps this
    // temporary File from closing it.
    let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let _ = file.write_all(bytes);
    let _ = file.flush();
}

#[cfg(not(unix))]
fn write_raw(bytes: &[u8]) {
    use std::io::Write;
    let _ = FRAME_FD.load(std::sync::atomic::Ordering::SeqCst);
    let _ = std::io::stdout().write_all(bytes);
}
