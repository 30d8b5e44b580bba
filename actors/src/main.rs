//! The `kevin` binary: parse the command line, set up telemetry, call the library.

fn main() -> std::process::ExitCode {
    kevin_actors::cli::main()
}
