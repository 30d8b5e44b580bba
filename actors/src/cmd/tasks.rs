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

/// The device memory a `cuda` worker needs to evaluate `t` at `preset`
/// ([`kevin::gpu::buffers::memory_need`], the cuda environment's admission), as JSON: verify,
/// profile and peak bytes, and whether the peak fits `free` bytes (`null` when unknown).
fn memory_json(t: &kevin::tasks::Task, preset: Preset, free: Option<u64>) -> serde_json::Value {
    match kevin::gpu::buffers::memory_need(t, preset) {
        Ok(need) => json!({
            "verify_bytes": need.verify,
            "profile_bytes": need.profile,
            "peak_bytes": need.peak(),
            "fits_gpu0": free.map(|f| need.peak() <= f),
        }),
        Err(e) => json!({ "error": e }),
    }
}

/// The table's memory cell: the GPU preset's peak need in GiB, with " !" when GPU 0 (free
/// memory `free`) cannot hold it.
fn memory_cell(t: &kevin::tasks::Task, free: Option<u64>) -> String {
    match kevin::gpu::buffers::memory_need(t, Preset::Gpu) {
        Ok(need) => format!(
            "{:.2}{}",
            need.peak() as f64 / (1u64 << 30) as f64,
            if free.is_some_and(|f| need.peak() > f) {
                " !"
            } else {
                ""
            }
        ),
        Err(_) => "?".into(),
    }
}

/// Prints the suite in `dir` as a table, or as JSON for tools (`json` is "-"), or as a table
/// and also as JSON to the file `json`. Each task's device-memory need at both presets is
/// given; a GPU-preset need that does not fit GPU 0's free memory is marked (the cuda
/// environment refuses such a task).
pub fn list(dir: &Path, json: Option<&Path>) -> Result<(), String> {
    let suite = TaskSuite::load(dir).map_err(|e| e.to_string())?;
    let free = kevin::machine::gpu_free_bytes(0);
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
                    "device_memory": {
                        "gpu": memory_json(t, Preset::Gpu, free),
                        "small": memory_json(t, Preset::Small, free),
                    },
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
        "{:width$}  level  split    gpu GiB  gpu sizes                         small sizes",
        "name"
    );
    for t in suite.tasks() {
        let split = if t.split == Split::Train {
            "train"
        } else {
            "heldout"
        };
        println!(
            "{:width$}  {:>5}  {split:<7}  {:>7}  {:<32}  {}",
            t.name,
            t.level,
            memory_cell(t, free),
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
    println!(
        "gpu GiB: device memory a cuda worker needs for the task at the gpu preset{}",
        match free {
            Some(f) => format!(
                "; ! = more than GPU 0's {:.1} GiB free (the cuda environment refuses it)",
                f as f64 / (1u64 << 30) as f64
            ),
            None => String::new(),
        }
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
