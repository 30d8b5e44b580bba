//! The `kevin` binary: parse the command line, set up telemetry, call the library.

fn main() -> std::process::ExitCode {
    // A worker child speaks frames on stdout: it must take over before clap or tracing could
    // print anything there.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        std::process::exit(kevin::roles::child_main_from_args(&args[2..]));
    }
    // Listing commands die quietly when their reader goes away (`kevin tasks | head`), as Unix
    // tools do; every command that talks to worker processes ignores SIGPIPE, so a worker that
    // dies mid-write is the candidate's outcome, not kevin's death (kevin::roles::dies_on_sigpipe).
    kevin::roles::set_sigpipe_for(args.get(1).map(String::as_str));
    kevin_actors::cli::main()
}
