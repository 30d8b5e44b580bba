//! Worker child processes: the only place untrusted input (policy-written CUDA) is processed.
//!
//! The daemon never compiles or runs a candidate itself. It sends the work to a child process
//! (`kevin worker --role <role>`) over a framed, versioned protocol on the child's stdin/stdout
//! ([`protocol`]); a [`WorkerPool`] owns N such children, gives every request a deadline, and
//! turns a hang, a crash or garbage on the wire into a [`WorkerFailure`] for that request alone,
//! killing and respawning the child. The child runs [`serve()`] with a handler for its role.
//!
//! The pool knows no roles: which handler a `--role` runs is the role table of [`crate::roles`],
//! which the binary's entry calls. A new role is one more arm there and a request/response type
//! pair; the pool and protocol are reused unchanged. Nothing here may import the roles' modules
//! (`compile`, `cpu`, `gpu`, `env`); they import this. [`echo`] is the test role that misbehaves
//! on request.

mod child;
pub mod echo;
pub mod pool;
pub mod protocol;
pub mod sched;
pub mod serve;

pub(crate) use child::TailBuffer;
pub use pool::{ExitReport, PoolConfig, PoolStats, WorkerCommand, WorkerFailure, WorkerPool};
pub use protocol::{FrameError, FromChild, ToChild, DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION};
pub use serve::{serve, serve_on, ServeError};

/// The program that starts this very binary again as a worker: `/proc/self/exe` where the
/// kernel provides it, which opens the running executable's own file even after the path it was
/// started from has been replaced or removed (a rebuild or an upgrade in place during a long
/// run, which left every later worker start failing with "No such file or directory"); so a
/// worker is always the parent's own build, speaking its protocol. Elsewhere, `current_exe`.
pub fn own_binary() -> std::io::Result<std::path::PathBuf> {
    let proc = std::path::Path::new("/proc/self/exe");
    if cfg!(target_os = "linux") && proc.exists() {
        return Ok(proc.to_path_buf());
    }
    std::env::current_exe()
}
