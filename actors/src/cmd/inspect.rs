//! `kevin inspect`: per-actor figures of a run from its trace files and metrics.jsonl
//! (`kevin::telemetry::inspect`), as tables or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{failure, CmdResult};

/// Per-actor busy/idle, message counts, latencies, mailbox high-water marks and the slowest
/// spans of a run, from its trace files and metrics.jsonl.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Reads the run and prints the report.
pub fn run(args: Args) -> CmdResult {
    let report = kevin::telemetry::inspect(&args.run_dir).map_err(failure)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serialises")
        );
    } else {
        print!("{report}");
    }
    Ok(ExitCode::SUCCESS)
}
