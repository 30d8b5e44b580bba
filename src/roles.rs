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
