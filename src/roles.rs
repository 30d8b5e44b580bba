//! The role table of worker child processes: which handler `kevin worker --role <role>` runs.
//! `compile` is NVRTC ([`crate::compile::worker_main`]), `cpu` the CUDA device model
//! ([`crate::cpu::worker`]), `cuda` the GPU harness ([`crate::gpu::worker`]) and `echo` the
//! test worker ([`crate::worker::echo`]).
//!
//! It is the only module that knows every role, so the generic pool ([`crate::worker`]) knows
//! none; the binary's entry (and the test binaries that act as workers) call
//! [`child_main_from_args`]. Nothing in the core imports this module.

/// Entry point of a worker child: `args` are the arguments after `worker`, i.e.
/// `--role <role>`. Returns the process exit status (0 after a clean shutdown, 1 when the serve
/// loop failed, 2 for bad arguments). The `kevin` binary calls this for `kevin worker ...`.
pub fn child_main_from_args(args: &[String]) -> i32 {
    let role = match parse_role(args) {
        Ok(role) => role,
        Err(msg) => {
            eprintln!(
                "kevin worker: {msg}\nusage: kevin worker --role <compile|cpu|cpu-exec|cuda|echo>"
            );
            return 2;
        }
    };
    let result = match role.as_str() {
        "compile" => crate::compile::worker_main().map_err(|e| e.to_string()),
        #[cfg(unix)]
        "cpu" => crate::cpu::worker::worker_main(),
        #[cfg(unix)]
        "cpu-exec" => crate::cpu::sandbox::exec_main(),
        #[cfg(unix)]
        "cuda" => crate::gpu::worker::worker_main(),
        "echo" => crate::worker::echo::echo_main().map_err(|e| e.to_string()),
        other => {
            eprintln!(
                "kevin worker: unknown role {other:?} (known: compile, cpu, cpu-exec, cuda, echo)"
            );
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

/// Commands that only read files and print (`kevin tasks | head`): they die quietly when their
/// reader goes away, as Unix tools do. They never start worker processes.
pub const DIE_ON_SIGPIPE: [&str; 3] = ["tasks", "inspect", "report"];

/// Whether `kevin <command>` should die of SIGPIPE (the default disposition) instead of
/// ignoring it. Every command that talks to worker processes (`eval`, every `bench`, `train`,
/// `sft`, and `worker` itself) must ignore it: a worker that dies mid-write (a candidate that
/// forged a reply and killed its worker, say) would otherwise kill kevin itself before it
/// prints anything, where the failure must become the candidate's outcome (EPIPE on the pipe,
/// then the worker's death, then a respawn).
pub fn dies_on_sigpipe(command: Option<&str>) -> bool {
    command.is_some_and(|c| DIE_ON_SIGPIPE.contains(&c))
}

/// Sets this process's SIGPIPE disposition for `kevin <command>` ([`dies_on_sigpipe`]):
/// default for the listing commands, ignored for everything else. Call it before any thread
/// starts.
#[cfg(unix)]
pub fn set_sigpipe_for(command: Option<&str>) {
    let disposition = if dies_on_sigpipe(command) {
        libc::SIG_DFL
    } else {
        libc::SIG_IGN
    };
    // SAFETY: setting a signal's disposition to default or ignore has no memory-safety
    // preconditions; called before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, disposition);
    }
}

/// No signals to set off Unix.
#[cfg(not(unix))]
pub fn set_sigpipe_for(_command: Option<&str>) {}

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
    fn only_the_listing_commands_die_of_sigpipe() {
        use super::dies_on_sigpipe;
        for c in ["tasks", "inspect", "report"] {
            assert!(dies_on_sigpipe(Some(c)), "{c}");
        }
        for c in ["eval", "bench", "train", "sft", "policy", "worker"] {
            assert!(!dies_on_sigpipe(Some(c)), "{c}");
        }
        assert!(!dies_on_sigpipe(None));
    }

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
