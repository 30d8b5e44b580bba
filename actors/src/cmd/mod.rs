//! The `kevin` commands, one module per command: each owns its `#[derive(clap::Args)]` struct
//! (the very type clap parses, no copy) and a `run(args) -> CmdResult`; `bench/` holds the
//! benchmarks, `eval/` the two evaluations, `report/` the run report (one run, or several side
//! by side), `sweep/` the variants of one config. This file holds what the commands share: the
//! exit-code error type, the logging set-up (one default level for every command, colour only
//! on a terminal), the default config and small helpers.
//!
//! Dependency direction: `cli.rs` imports `cmd`; a command may import `crate::pipeline` (train,
//! bench pipeline) and the core crates; nothing in `crate::pipeline` imports from `cmd`, and no
//! command imports `crate::cli` or another command's module except through this file's helpers
//! (`bench/faults` reusing `bench/hacks`' reference lookup is the one sibling import).

use std::fmt::Display;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::prelude::*;

pub mod backends;
pub mod bench;
pub mod eval;
pub mod inspect;
pub mod policy;
pub mod report;
pub mod sft;
pub mod signals;
pub mod sweep;
pub mod tasks;
pub mod train;
pub mod worker_node;

/// A progress line on stderr for long work: redrawn in place on a terminal; in a log (stderr
/// not a terminal) one line at every tenth of the way, so logs stay readable.
pub struct ProgressLine {
    tty: bool,
    /// Tenths already printed (logs only).
    shown: std::sync::atomic::AtomicUsize,
}

impl Default for ProgressLine {
    fn default() -> Self {
        ProgressLine {
            tty: std::io::stderr().is_terminal(),
            shown: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl ProgressLine {
    /// Shows `line`, `done` of `total` being finished.
    pub fn show(&self, done: usize, total: usize, line: &str) {
        use std::io::Write;
        if self.tty {
            eprint!("\r{line}   ");
            let _ = std::io::stderr().flush();
            return;
        }
        let tenth = done * 10 / total.max(1);
        if self
            .shown
            .fetch_max(tenth, std::sync::atomic::Ordering::Relaxed)
            < tenth
        {
            eprintln!("{line}");
        }
    }

    /// Ends the redrawn line (a terminal only).
    pub fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// The default config of `kevin train`, relative to the repository root.
pub const DEFAULT_CONFIG: &str = "configs/quickstart.toml";

/// The log filter of every command when neither `--log` nor `RUST_LOG` is given (`kevin train`:
/// the config's `telemetry.log_level`, whose default is this same level).
pub const DEFAULT_LOG: &str = "info";

/// A failure of a command, by exit code.
#[derive(Debug, Clone, PartialEq)]
pub enum CmdError {
    /// Bad arguments or configuration (exit 2).
    Usage(String),
    /// Something failed while running (exit 1).
    Failure(String),
}

/// What a command's `run` returns: its exit code, or a one-line error.
pub type CmdResult = Result<ExitCode, CmdError>;

/// A usage error (exit 2) from any message.
pub fn usage(msg: impl Display) -> CmdError {
    CmdError::Usage(msg.to_string())
}

/// A failure (exit 1) from any message.
pub fn failure(msg: impl Display) -> CmdError {
    CmdError::Failure(msg.to_string())
}

/// Exit 0 when a pass/fail suite passed, else 1.
pub fn passed(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Prints a command's error as one line on stderr and gives its exit code.
pub fn exit_code(result: CmdResult) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(CmdError::Usage(m)) => {
            eprintln!("kevin: {m}");
            ExitCode::from(2)
        }
        Err(CmdError::Failure(m)) => {
            eprintln!("kevin: {m}");
            ExitCode::from(1)
        }
    }
}

/// The process environment, for the `KEVIN__SECTION__KEY` config layer.
pub fn env_vars() -> Vec<(String, String)> {
    std::env::vars().collect()
}

/// `workers`, or one per CPU core; at least 1.
pub fn workers_or_cores(workers: Option<usize>) -> usize {
    workers.unwrap_or_else(cores).max(1)
}

/// The CPU cores available to this process (at least 1).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The width of a table's first column: its longest name, at least 4 (the header "task" or
/// "case").
pub fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(str::len).max().unwrap_or(4).max(4)
}

/// Prints a report's markdown `text`, and writes it to `out` and `value` as JSON to `json` where
/// given (a benchmark's `--out` and `--json`).
pub fn emit_report(
    text: &str,
    out: Option<&Path>,
    json: Option<&Path>,
    value: &impl serde::Serialize,
) -> Result<(), String> {
    println!("{text}");
    if let Some(path) = out {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = json {
        let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Writes `value` as pretty JSON to `path`; the error names the file.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Sets up logging on stderr: `RUST_LOG` when set and valid, else `filter`; ANSI colour only
/// when stderr is a terminal. With `trace_file` (a path and the size at which it rotates, 0:
/// never), also a Chrome trace of every kevin span, whatever the log level; its guard must be
/// finished at the end of the run.
pub fn init_logging(
    filter: &str,
    trace_file: Option<(&Path, u64)>,
) -> Result<Option<kevin::telemetry::TraceGuard>, String> {
    let env_filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .map_or_else(
            || EnvFilter::try_new(filter).map_err(|e| format!("log filter {filter:?}: {e}")),
            Ok,
        )?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(env_filter);
    match trace_file {
        Some((path, rotate_bytes)) => {
            let (chrome, guard) = kevin::telemetry::chrome_layer_rotating(path, rotate_bytes)
                .map_err(|e| format!("trace file {}: {e}", path.display()))?;
            // Per-layer filter: the trace gets every kevin span and counter whatever the log level.
            let chrome = chrome.with_filter(filter_fn(|m| m.target().starts_with("kevin")));
            tracing_subscriber::registry()
                .with(fmt)
                .with(chrome)
                .try_init()
                .map_err(|e| e.to_string())?;
            Ok(Some(guard))
        }
        None => {
            tracing_subscriber::registry()
                .with(fmt)
                .try_init()
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
    }
}
