//! `kevin tasks`: list the task suite, print it as JSON, or show a task's exact first-turn prompt.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use kevin::tasks::{Preset, Split, TaskSuite};
use serde_json::json;

use super::{failure, name_width, write_json, CmdResult};

/// List the task suite (name, level, split, sizes), or show a task's first-turn prompt.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The task suite's folder.
    #[arg(long, default_value = "tasks", global = true)]
    pub dir: PathBuf,
    /// `--json FILE`: also write the suite as JSON to FILE; `--json` alone: print JSON (for
    /// tools) instead of the table.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// `show NAME`: print the exact first-turn prompt of a task.
    #[command(subcommand)]
    pub show: Option<TasksCommand>,
}

/// `kevin tasks` subcommands.
#[derive(Subcommand, Debug)]
pub enum TasksCommand {
    /// Print the exact first-turn prompt a policy sees for a task.
    Show {
        /// The task's name.
        name: String,
        /// Size preset shown in the prompt: "gpu" or "small".
        #[arg(long, default_value = "gpu", value_parser = ["gpu", "small"])]
        preset: String,
    },
}

/// Lists the suite or shows a prompt.
pub fn run(args: Args) -> CmdResult {
    match args.show {
        None => list(&args.dir, args.json.as_deref()),
        Some(TasksCommand::Show { name, preset }) => {
            let preset = if preset == "small" {
                Preset::Small
            } else {
                Preset::Gpu
            };
            show(&args.dir, &name, preset)
        }
    }
    .map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}

fn dims(sizes: &kevin::ops::Sizes) -> String {
    sizes
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints the suite in `dir` as a table, or as JSON for tools (`json` is "-"), or as a table
/// and also as JSON to the file `json`.
pub fn list(dir: &Path, json: Option<&Path>) -> Result<(), String> {
    let suite = TaskSuite::load(dir).map_err(|e| e.to_string())?;
    if let Some(path) = json {
        let tasks: Vec<_> = suite
            .tasks()
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "level": t.level,
                    "split": if t.split == Split::Train { "train" } else { "heldout" },
                    "description": t.description,
                    "program": t.source,
                    "sizes": { "gpu": t.gpu_sizes, "small": t.small_sizes },
                    "tolerance": { "atol": t.tolerance.atol, "rtol": t.tolerance.rtol },
                    "estimated_gpu_baseline_ms": t.estimate_gpu_baseline_ms(),
                    // The KernelBench-style PyTorch module at the GPU preset (what
                    // benches/torch_eager.py times with torch eager).
                    "torch_gpu": t.torch_module(Preset::Gpu).ok(),
                })
            })
            .collect();
        if path.as_os_str() == "-" {
            println!(
                "{}",
                serde_json::to_string_pretty(&tasks).map_err(|e| e.to_string())?
            );
            return Ok(());
        }
        write_json(path, &tasks)?;
    }
    let width = name_width(suite.tasks().iter().map(|t| t.name.as_str()));
    println!(
        "{:width$}  level  split    gpu sizes                         small sizes",
        "name"
    );
    for t in suite.tasks() {
        let split = if t.split == Split::Train {
            "train"
        } else {
            "heldout"
        };
        println!(
            "{:width$}  {:>5}  {split:<7}  {:<32}  {}",
            t.name,
            t.level,
            dims(&t.gpu_sizes),
            dims(&t.small_sizes)
        );
    }
    let n = suite.tasks().len();
    let held = suite.split(Split::Heldout).count();
    let l1 = suite.tasks().iter().filter(|t| t.level == 1).count();
    println!(
        "\n{n} tasks: {l1} of level 1, {} of level 2; {held} held out (never trained on)",
        n - l1
    );
    Ok(())
}

/// Prints the exact first-turn prompt of `name` at `preset`.
pub fn show(dir: &Path, name: &str, preset: Preset) -> Result<(), String> {
    let suite = TaskSuite::load(dir).map_err(|e| e.to_string())?;
    let task = suite.get(name).ok_or_else(|| {
        let mut names: Vec<&str> = suite.tasks().iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        format!(
            "no task named `{name}` in {}; tasks: {}",
            dir.display(),
            names.join(", ")
        )
    })?;
    print!(
        "{}",
        kevin::prompt::first_turn(task, preset).map_err(|e| format!("task {name}: {e}"))?
    );
    Ok(())
}
