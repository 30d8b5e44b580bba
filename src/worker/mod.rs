//! Worker child processes: the only place untrusted input (policy-written CUDA) is processed.
//!
//! The daemon never compiles or runs a candidate itself. It sends the work to a child process
//! (`kevin worker --role <role>`) over a framed, versioned protocol on the child's stdin/stdout
//! ([`protocol`]); a [`WorkerPool`] owns N such children, gives every request a deadline, and
//! turns a hang, a crash or garbage on the wire into a [`WorkerFailure`] for that request alone,
//! killing and respawning the child. The child runs [`serve()`] with a handler for its role.
//!
//! Roles: `compile` ([`crate::compile::worker_main`]) and `echo` (a test worker that misbehaves on
//! request, [`echo`]). A new role (the GPU evaluation workers) is one more arm in
//! [`child_main_from_args`] and a request/response type pair; the pool and protocol are reused
//! unchanged.

mod child;
pub mod echo;
pub mod pool;
pub mod protocol;
pub mod serve;

pub use pool::{ExitReport, PoolConfig, PoolStats, WorkerCommand, WorkerFailure, WorkerPool};
pub use protocol::{FrameError, FromChild, ToChild, DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION};
pub use serve::{serve, serve_on, ServeError};

/// Entry point of a worker child: `args` are the arguments after `worker`, i.e.
/// `--role <role>`. Returns the process exit status (0 after a clean shutdown, 1 when the serve
/// loop failed, 2 for bad arguments). The `kevin` binary calls this for `kevin worker ...`.
pub fn child_main_from_args(args: &[String]) -> i32 {
    let role = match parse_role(args) {
        Ok(role) => role,
        Err(msg) => {
            eprintln!("kevin worker: {msg}\nusage: kevin worker --role <compile|cpu|cuda|echo>");
            return 2;
        }
    };
    let result = match role.as_str() {
        "compile" => crate::compile::worker_main().map_err(|e| e.to_string()),
        #[cfg(unix)]
        "cpu" => crate::cpu_env::worker_main(),
        #[cfg(unix)]
        "cuda" => crate::cuda_env::worker_main(),
        "echo" => echo::echo_main().map_err(|e| e.to_string()),
        other => {
            eprintln!("kevin worker: unknown role {other:?} (known: compile, cpu, cuda, echo)");
            return 2;
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("kevin worker --role {role}: {e}");
            1
        }
    }
}

fn parse_role(args: &[String]) -> Result<String, String> {
    let mut iter = args.iter();
    let mut role = None;
    while let Some(arg) = iter.next() {
        if let Some(value) = arg.strip_prefix("--role=") {
            role = Some(value.to_string());
        } else if arg == "--role" {
            role = Some(iter.next().ok_or("--role needs a value")?.clone());
        } else {
            return Err(format!("unexpected argument {arg:?}"));
        }
    }
    role.ok_or_else(|| "missing --role".to_string())
}

#[cfg(test)]
mod tests {
    use super::parse_role;

    #[test]
    fn role_parsing() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_role(&args(&["--role", "echo"])), Ok("echo".into()));
        assert_eq!(parse_role(&args(&["--role=compile"])), Ok("compile".into()));
        assert!(parse_role(&args(&[])).is_err());
        assert!(parse_role(&args(&["--role"])).is_err());
        assert!(parse_role(&args(&["--gpu", "0"])).is_err());
    }
}
