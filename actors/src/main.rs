//! The `kevin` binary: parse the command line, set up telemetry, call the library.

fn main() -> std::process::ExitCode {
    // A worker child speaks frames on stdout: it must take over before clap or tracing could
    // print anything there.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        std::process::exit(kevin::roles::child_main_from_args(&args[2..]));
    }
    // Listing commands die quietly when their reader goes away (`kevin tasks | head`), as Unix
    // tools do; the training daemon keeps Rust's default (a failed write is an error, not death).
    if args.get(1).map(String::as_str) != Some("train") {
        // SAFETY: restoring the default disposition of a signal, before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    kevin_actors::cli::main()
}
