//! `kevin inspect`: per-actor figures of a run from its trace files and metrics.jsonl
//! (`kevin::telemetry::inspect`), as tables or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{failure, write_json, CmdResult};

/// Per-actor busy/idle, message counts, latencies, mailbox high-water marks and the slowest
/// spans of a run, from its trace files and metrics.jsonl.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    pub run_dir: PathBuf,
    /// `--json FILE`: also write the figures as JSON to FILE; `--json` alone: print JSON
    /// instead of tables.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

/// Reads the run and prints the report.
pub fn run(args: Args) -> CmdResult {
    let report = kevin::telemetry::inspect(&args.run_dir).map_err(failure)?;
    match &args.json {
        Some(path) if path.as_os_str() == "-" => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serialises")
        ),
        Some(path) => {
            print!("{report}");
            write_json(path, &report).map_err(failure)?;
        }
        None => print!("{report}"),
    }
    Ok(ExitCode::SUCCESS)
}
