//! `kevin tasks`: list the task suite, print it as JSON, show a task's exact first-turn prompt,
//! or generate procedural training tasks (`kevin tasks generate`, [`kevin::taskgen`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use kevin::tasks::{Preset, Split, TaskSuite};
use serde_json::json;

use super::{failure, name_width, write_json, CmdResult};

/// List the task suite (name, level, split, sizes), or show a task's first-turn prompt.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The task suite's folder, or several joined by `:` (e.g. `tasks:/data/gen`).
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
    /// Generate procedural training tasks (random op-language programs, each type-checked,
    /// deduplicated, kept apart from the held-out tasks of `--dir` and checked for sound
    /// numerics) into an empty folder, with `generated.json` saying how they were made.
    Generate {
        /// Tasks to generate (at least 1).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: u64,
        /// Seed: the same seed writes the same files.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The folder to write (new or empty).
        #[arg(long)]
        out: PathBuf,
        /// Most operations in a program (1 to 6 by default).
        #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=12))]
        max_ops: u64,
        /// Families to draw from, comma-separated (default: all of elementwise, reduce, row,
        /// matmul, transpose and conv: convolutions with norms, pooling and epilogues,
        /// KernelBench level 2's shape). The default was the first five before conv joined
        /// it: name them to get a seed's tasks of that time.
        #[arg(long, value_delimiter = ',')]
        families: Vec<String>,
        /// Most device memory (GiB) a task's evaluation on a cuda worker may need.
        #[arg(long, default_value_t = 16.0)]
        max_gpu_gib: f64,
        /// Threads vetting drafts (default: every core).
        #[arg(long)]
        threads: Option<usize>,
        /// "varied" (the default: half the programs rename their sizes, a third give a tensor
        /// a letter that reads like a size (B, K, M, N, D, S), three in five of those with a
        /// scalar operand of + - * / name it as a constant) or "fixed" (sizes by role, scalars as literals: a seed's tasks before
        /// 2026-12-06). A seed gives the same programs under both.
        #[arg(long, default_value = "varied", value_parser = ["varied", "fixed"])]
        naming: String,
        /// "composite" (the default: besides each family's own shape, some programs chain a
        /// product's row operation into a second product (attention), combine a softmax or
        /// l2norm of two inputs, or reduce a row operation's result) or "simple" (a seed's
        /// programs before 2026-12-06).
        #[arg(long, default_value = "composite", value_parser = ["composite", "simple"])]
        shapes: String,
        /// "plain" (the default: refuse a program whose tolerance a correct kernel adding its
        /// long sums in order in an f32 accumulator cannot meet, e.g. a sum of 100,000 values
        /// that cancel; such a kernel would be judged wrong) or "any" (no such check: a seed's
        /// programs before this check, late on 2026-12-06, corpus v3's among them).
        #[arg(long, default_value = "plain", value_parser = ["plain", "any"])]
        sums: String,
        /// Independent draws of the inputs, at the small preset and at the probe (the small
        /// sizes with every reduced, normalised or contracted axis at its GPU size), on which
        /// no output may be (nearly) constant and every input must move the output. 1 gives a
        /// seed's programs of before 2026-12-07, which checked one draw and once let through
        /// an argmax whose answer a long column normalisation left to one input.
        #[arg(long, default_value_t = kevin::taskgen::DRAWS, value_parser = clap::value_parser!(u32).range(1..=16))]
        draws: u32,
    },
    /// Write a task's inputs (drawn as the harness draws them) and its fp64 reference outputs
    /// at a preset as JSON, for checks outside kevin (e.g. scripts/kernelbench_crosscheck.py).
    Dump {
        /// The task's name.
        name: String,
        /// "small" (default) or "gpu".
        #[arg(long, default_value = "small", value_parser = ["gpu", "small"])]
        preset: String,
        /// Seed of the inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The JSON file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Time each task's eager baseline (what candidates are timed against) on GPU 0 through the
    /// cuda workers: cuBLAS GEMMs, cuDNN convolutions and batch norms, kevin's kernels for the
    /// rest; the median of `--reps` runs, L2 flushed before each, one task at a time. For
    /// comparing the baseline with PyTorch eager (scripts/baseline_gpu.py --time-only writes
    /// eager's times). With --check, first compares the baseline and its fp64 reference plan
    /// with the fp64 interpreter on one input set (use --preset small: the interpreter is slow
    /// at the gpu sizes) and fails if either is outside the task's tolerance.
    Baseline {
        /// Tasks to time, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        tasks: Vec<String>,
        /// "gpu" (default) or "small".
        #[arg(long, default_value = "gpu", value_parser = ["gpu", "small"])]
        preset: String,
        /// Timed runs per task (at least 1).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
        reps: u32,
        /// Also check each baseline and its fp64 reference plan against the fp64 interpreter.
        #[arg(long)]
        check: bool,
        /// Also write the times as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Time nothing: write each task's plans at both presets (`<task>.<preset>.json`: the
        /// plan, its PyTorch module, tolerance, inputs and outputs) and `kernels.cu` into this
        /// folder (new or without `.json` files), for `scripts/baseline_gpu.py` (checks the plans
        /// against PyTorch in float64 and times them against eager). Needs no GPU.
        #[arg(long, conflicts_with_all = ["check", "json"])]
        plans: Option<PathBuf>,
    },
    /// Write the naive writer's kernel for each task as `OUT/<task>.cu`, for `kevin eval
    /// --kernels OUT`: a simple correct kernel per problem (unverified here: the evaluation
    /// compiles, checks and times it). A task the writer does not take gets a line saying so.
    Naive {
        /// The folder to write (new or without `.cu` files).
        #[arg(long)]
        out: PathBuf,
        /// Tasks, comma-separated (default: all, both splits).
        #[arg(long, value_delimiter = ',')]
        tasks: Vec<String>,
        /// Which of the writer's forms: "fast" (its last: tiled products, block, warp or split
        /// reductions, chosen by the GPU preset's sizes) or "simple" (its first: a thread per
        /// output everywhere).
        #[arg(long, default_value = "fast", value_parser = ["fast", "simple"])]
        form: String,
    },
    /// Import KernelBench problem files as kevin tasks (held out by default): every `*.py` of
    /// SRC's `level1/`, `level2/` ... folders (or of SRC itself, at `--level`). A problem that
    /// does not import gets one line naming the construct that stopped it and its line.
    ImportKernelbench {
        /// KernelBench's `KernelBench/` folder (with `level1/`, `level2/`), or a folder of
        /// problem files.
        src: PathBuf,
        /// The folder to write the tasks to (new or without task files).
        #[arg(long)]
        out: PathBuf,
        /// Levels to import, comma-separated, where SRC has `levelN/` folders.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        levels: Vec<u8>,
        /// The level of the files when SRC has no `levelN/` folders (1 or 2).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        level: u8,
        /// "heldout" (evaluation only, the default) or "train".
        #[arg(long, default_value = "heldout", value_parser = ["heldout", "train"])]
        split: String,
        /// Also write the imports and refusals as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// The preset of a `--preset` value (clap admits only "gpu" and "small").
fn preset_named(name: &str) -> Preset {
    if name == "small" {
        Preset::Small
    } else {
        Preset::Gpu
    }
}

/// Lists the suite or shows a prompt.
pub fn run(args: Args) -> CmdResult {
    match args.show {
        None => list(&args.dir, args.json.as_deref()),
        Some(TasksCommand::Show { name, preset }) => {
            let preset = preset_named(&preset);
            show(&args.dir, &name, preset)
        }
        Some(TasksCommand::Generate {
            count,
            seed,
            out,
            max_ops,
            families,
            max_gpu_gib,
            threads,
            naming,
            shapes,
            sums,
            draws,
        }) => {
            let mut opts = kevin::taskgen::GenOptions::new(count as usize, seed);
            opts.max_ops = max_ops as usize;
            // clap admits only the two names.
            opts.naming = kevin::taskgen::Naming::from_name(&naming).unwrap_or_default();
            opts.composite = shapes == "composite";
            opts.plain_sums = sums == "plain";
            opts.draws = draws;
            opts.families = families
                .iter()
                .map(|f| {
                    kevin::taskgen::Family::from_name(f.trim()).ok_or_else(|| {
                        let all: Vec<&str> = kevin::taskgen::Family::ALL
                            .iter()
                            .map(|f| f.name())
                            .collect();
                        format!("--families: no family `{f}` (families: {})", all.join(", "))
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(failure)?;
            if !(max_gpu_gib > 0.0 && max_gpu_gib.is_finite()) {
                return Err(failure(format!(
                    "--max-gpu-gib must be a positive number, not {max_gpu_gib}"
                )));
            }
            opts.max_gpu_bytes = (max_gpu_gib * (1u64 << 30) as f64) as u64;
            if let Some(t) = threads {
                opts.threads = t.max(1);
            }
            generate(&args.dir, &out, &opts)
        }
        Some(TasksCommand::Dump {
            name,
            preset,
            seed,
            out,
        }) => {
            let preset = preset_named(&preset);
            dump(&args.dir, &name, preset, seed, &out)
        }
        Some(TasksCommand::Baseline {
            tasks,
            preset,
            reps,
            check,
            json,
            plans: None,
        }) => {
            let preset = preset_named(&preset);
            time_baselines(&args.dir, &tasks, preset, (reps, check), json.as_deref())
        }
        Some(TasksCommand::Baseline {
            tasks,
            plans: Some(out),
            ..
        }) => write_plans(&args.dir, &out, &tasks),
        Some(TasksCommand::Naive { out, tasks, form }) => {
            naive_kernels(&args.dir, &out, &tasks, form == "fast")
        }
        Some(TasksCommand::ImportKernelbench {
            src,
            out,
            levels,
            level,
            split,
            json,
        }) => {
            let split = if split == "train" {
                Split::Train
            } else {
                Split::Heldout
            };
            import_kernelbench(&src, &out, &levels, level, split, json.as_deref())
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

/// Generates `opts.count` tasks into `out` (see [`kevin::taskgen`]), with a progress line on
/// stderr, a summary on stdout and `out/generated.json`.
fn generate(suite_dir: &Path, out: &Path, opts: &kevin::taskgen::GenOptions) -> Result<(), String> {
    let suite = TaskSuite::load(suite_dir).map_err(|e| {
        format!("{e} (the hand-written suite, whose held-out tasks generation keeps out: --dir)")
    })?;
    if out.is_dir() {
        // Refuse before the work, not after it.
        kevin::taskgen::write(out, &[]).map_err(|e| e.to_string())?;
    }
    let started = std::time::Instant::now();
    let progress = super::ProgressLine::default();
    let (tasks, stats) = kevin::taskgen::generate(opts, &suite, |s| {
        let line = format!(
            "generated {}/{} tasks from {} drafts ({:.0}s)",
            s.accepted,
            opts.count,
            s.drafted,
            started.elapsed().as_secs_f64()
        );
        progress.show(s.accepted, opts.count, &line);
    })
    .map_err(|e| {
        progress.finish();
        e.to_string()
    })?;
    progress.finish();
    kevin::taskgen::write(out, &tasks).map_err(|e| e.to_string())?;
    let fingerprint = kevin::taskgen::fingerprint(&tasks);
    let manifest = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "kevin_version": env!("CARGO_PKG_VERSION"),
        "seed": opts.seed,
        "count": opts.count,
        "max_ops": opts.max_ops,
        "naming": opts.naming.name(),
        "shapes": if opts.composite { "composite" } else { "simple" },
        "sums": if opts.plain_sums { "plain" } else { "any" },
        "draws": opts.draws,
        "families": opts.families.iter().map(|f| f.name()).collect::<Vec<_>>(),
        "max_gpu_bytes": opts.max_gpu_bytes,
        "suite": suite_dir.display().to_string(),
        "fingerprint": fingerprint,
        "stats": stats,
        "tasks": tasks.iter().map(|g| json!({
            "name": g.task.name,
            "family": g.family.name(),
            "level": g.task.level,
            "canonical": g.canonical,
        })).collect::<Vec<_>>(),
    });
    write_json(&out.join("generated.json"), &manifest)?;
    let counts = |m: &std::collections::BTreeMap<String, usize>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "wrote {} tasks to {} in {:.1}s (fingerprint {fingerprint})",
        tasks.len(),
        out.display(),
        started.elapsed().as_secs_f64()
    );
    println!("families: {}", counts(&stats.by_family));
    println!("dtypes:   {}", counts(&stats.by_dtype));
    let levels: Vec<String> = stats
        .by_level
        .iter()
        .map(|(k, v)| format!("level {k} {v}"))
        .collect();
    println!("levels:   {}", levels.join(", "));
    let ops: Vec<String> = stats
        .by_ops
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    println!("ops:      {}", ops.join(", "));
    println!(
        "drafts:   {} drawn; refused: {}",
        stats.drafted,
        counts(&stats.rejected)
    );
    println!(
        "every task is split = \"train\"; list them with `kevin tasks --dir {0}`, train on them \
         with `[tasks] dir = \"{0}\"`",
        out.display()
    );
    Ok(())
}

/// The problem files under `src`: (origin such as `level1/23_Softmax.py`, level, path), in
/// level order, then by their leading number, then by name.
fn kernelbench_files(
    src: &Path,
    levels: &[u8],
    level: u8,
) -> Result<Vec<(String, u8, PathBuf)>, String> {
    let read = |dir: &Path| -> Result<Vec<PathBuf>, String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "py") && p.is_file())
            .collect();
        let key = |p: &PathBuf| {
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            let num: u64 = stem
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(u64::MAX);
            (num, stem)
        };
        files.sort_by_key(key);
        Ok(files)
    };
    let name = |p: &Path| {
        p.file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let has_levels = levels
        .iter()
        .any(|l| src.join(format!("level{l}")).is_dir());
    let mut out = Vec::new();
    if has_levels {
        for l in levels {
            let dir = src.join(format!("level{l}"));
            if !dir.is_dir() {
                continue;
            }
            for p in read(&dir)? {
                out.push((format!("level{l}/{}", name(&p)), (*l).clamp(1, 2), p));
            }
        }
    } else {
        for p in read(src)? {
            out.push((name(&p), level, p));
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{}: no problem files (*.py here or in level{{{}}}/)",
            src.display(),
            levels
                .iter()
                .map(u8::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    Ok(out)
}

/// `kevin tasks import-kernelbench`: imports every problem file, writes the tasks and
/// `imported.json`, prints a line per refusal and the totals.
/// An error when the folder `out` already holds files ending in `.{ext}` (`what`, for the
/// message): the commands that write such files `verb` into a new or empty folder only, so
/// nothing of an earlier run is overwritten or mixed in.
fn refuse_written(flag: &str, out: &Path, ext: &str, what: &str, verb: &str) -> Result<(), String> {
    if !out.is_dir() {
        return Ok(());
    }
    let existing = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == ext))
        .count();
    if existing > 0 {
        return Err(format!(
            "{flag} {} already holds {existing} {what}: {verb} into a new or empty folder",
            out.display()
        ));
    }
    Ok(())
}

/// The tasks named by `--tasks` (all when none), each checked to be in the suite.
fn chosen_tasks<'a>(
    suite: &'a TaskSuite,
    dir: &Path,
    tasks: &[String],
) -> Result<Vec<&'a kevin::tasks::Task>, String> {
    if tasks.is_empty() {
        return Ok(suite.tasks().iter().collect());
    }
    tasks
        .iter()
        .map(|n| {
            suite
                .get(n)
                .ok_or_else(|| format!("--tasks: no task `{n}` in {}", dir.display()))
        })
        .collect()
}

/// `kevin tasks baseline --plans OUT`: every chosen task's plans at both presets and the
/// kernels' source, for scripts/baseline_gpu.py.
fn write_plans(dir: &Path, out: &Path, tasks: &[String]) -> Result<(), String> {
    let suite = TaskSuite::load(dir).map_err(|e| e.to_string())?;
    let chosen = chosen_tasks(&suite, dir, tasks)?;
    refuse_written("--plans", out, "json", "plans", "write")?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let write = |name: &str, text: &str| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    write("kernels.cu", kevin::baseline::SOURCE)?;
    let mut failed = 0;
    for t in &chosen {
        let mut ok = true;
        for preset in Preset::ALL {
            let name = preset.name();
            match kevin::baseline::plan_record(t, preset) {
                Ok(record) => write(&format!("{}.{name}.json", t.name), &record.to_string())?,
                Err(e) => {
                    println!("{}  {name}: no plan: {e}", t.name);
                    ok = false;
                }
            }
        }
        failed += usize::from(!ok);
    }
    println!(
        "wrote the plans of {} of {} tasks and kernels.cu to {}; run them with `python3 scripts/baseline_gpu.py {}`",
        chosen.len() - failed,
        chosen.len(),
        out.display(),
        out.display()
    );
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} tasks have no plan"))
    }
}

/// `kevin tasks naive`: the naive writer's fast (or simple) form of every task in `tasks` (all
/// when empty) into `out/<task>.cu`; one line per task (the form, or why none).
fn naive_kernels(dir: &Path, out: &Path, tasks: &[String], fast: bool) -> Result<(), String> {
    let suite = TaskSuite::load(dir).map_err(|e| e.to_string())?;
    let chosen = chosen_tasks(&suite, dir, tasks)?;
    refuse_written("--out", out, "cu", ".cu files", "write")?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let width = name_width(chosen.iter().map(|t| t.name.as_str()));
    let mut written = 0;
    for t in &chosen {
        let forms = kevin::corpus::naive::generate(t);
        let pick = if fast { forms.last() } else { forms.first() };
        match pick {
            Some(g) => {
                let path = out.join(format!("{}.cu", t.name));
                std::fs::write(&path, &g.source).map_err(|e| format!("{}: {e}", path.display()))?;
                println!("{:width$}  {}", t.name, g.form);
                written += 1;
            }
            None => println!(
                "{:width$}  no naive kernel: the writer does not take this program",
                t.name
            ),
        }
    }
    println!(
        "wrote {written} of {} kernels to {} ({} forms); check and time them with `kevin eval --kernels {} --dir {}`",
        chosen.len(),
        out.display(),
        if fast { "fast" } else { "simple" },
        out.display(),
        dir.display()
    );
    Ok(())
}

fn import_kernelbench(
    src: &Path,
    out: &Path,
    levels: &[u8],
    level: u8,
    split: Split,
    json_path: Option<&Path>,
) -> Result<(), String> {
    let files = kernelbench_files(src, levels, level)?;
    refuse_written("--out", out, "toml", "task files", "import")?;
    let mut imported = Vec::new();
    let mut refused = Vec::new();
    let mut per_level: std::collections::BTreeMap<u8, (usize, usize)> = Default::default();
    for (origin, lvl, path) in &files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let entry = per_level.entry(*lvl).or_default();
        entry.1 += 1;
        match kevin::kbimport::import(origin, *lvl, &text, split) {
            Ok(t) => {
                entry.0 += 1;
                imported.push((origin.clone(), t));
            }
            Err(r) => {
                println!("{origin}: not imported ({r})");
                refused.push((origin.clone(), r));
            }
        }
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut names = std::collections::BTreeSet::new();
    for (origin, t) in &imported {
        if !names.insert(t.name.clone()) {
            return Err(format!(
                "{origin}: a second problem named {} (rename one file)",
                t.name
            ));
        }
        let path = out.join(format!("{}.toml", t.name));
        std::fs::write(&path, &t.text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    // What was written loads as a suite (the importer type-checked every task; this is the
    // same check the trainer and the evaluator make).
    if !imported.is_empty() {
        TaskSuite::load(out).map_err(|e| format!("the imported tasks do not load: {e}"))?;
    }
    // Refusals grouped by what stopped them (the words after `nn.X: ` or `` `f`: ``).
    let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, r) in &refused {
        let key = match r.reason.split_once(": ") {
            Some((head, tail)) if head.starts_with("nn.") || head.starts_with('`') => tail,
            _ => r.reason.as_str(),
        };
        *reasons
            .entry(key.lines().next().unwrap_or("").to_string())
            .or_default() += 1;
    }
    let mut by_count: Vec<(&String, &usize)> = reasons.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (l, (ok, all)) in &per_level {
        println!("level {l}: imported {ok} of {all} problems");
    }
    println!("wrote {} tasks to {}", imported.len(), out.display());
    if !by_count.is_empty() {
        println!("not imported, by reason:");
        for (r, n) in &by_count {
            println!("  {n:>4}  {r}");
        }
    }
    if let Some(path) = json_path {
        let record = json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "src": src.display().to_string(),
            "out": out.display().to_string(),
            "levels": per_level.iter().map(|(l, (ok, all))| json!({"level": l, "imported": ok, "problems": all})).collect::<Vec<_>>(),
            "imported": imported.iter().map(|(o, t)| json!({"file": o, "task": t.name})).collect::<Vec<_>>(),
            "refused": refused.iter().map(|(o, r)| json!({"file": o, "line": r.line, "reason": r.reason})).collect::<Vec<_>>(),
            "reasons": by_count.iter().map(|(r, n)| json!({"reason": r, "count": n})).collect::<Vec<_>>(),
        });
        write_json(path, &record)?;
    }
    Ok(())
}

/// `kevin tasks dump`: inputs and reference outputs of one task at `preset` as JSON.
fn dump(dir: &Path, name: &str, preset: Preset, seed: u64, out: &Path) -> Result<(), String> {
    let suite = TaskSuite::load(dir).map_err(|e| e.to_string())?;
    let task = suite
        .get(name)
        .ok_or_else(|| format!("no task `{name}` in {}", dir.display()))?;
    let sizes = task.sizes(preset);
    let inputs = task.generate_inputs(preset, seed);
    let outputs = task
        .reference(preset, &inputs)
        .map_err(|e| format!("{name}: the reference failed: {e}"))?;
    let tensor = |d: &kevin::ops::Decl, data: &[f64]| {
        let shape: Vec<usize> =
            d.ty.shape
                .iter()
                .map(|x| x.resolve(sizes).unwrap_or(1))
                .collect();
        json!({"name": d.name, "dtype": d.ty.dtype.name(), "shape": shape, "data": data})
    };
    let record = json!({
        "task": name,
        "preset": if preset == Preset::Gpu { "gpu" } else { "small" },
        "seed": seed,
        "sizes": sizes,
        "tolerance": {"atol": task.tolerance.atol, "rtol": task.tolerance.rtol},
        "description": task.description,
        "inputs": task.program.inputs.iter().zip(&inputs).map(|(d, x)| tensor(d, x)).collect::<Vec<_>>(),
        "outputs": task.program.outputs.iter().zip(&outputs).map(|(d, x)| tensor(d, x)).collect::<Vec<_>>(),
    });
    write_json(out, &record)
}

/// `kevin tasks baseline`: times the eager baseline of each task in `dir` (or of `only`) on
/// GPU 0, one at a time, printing a line per task as it comes and a summary; a task that
/// cannot be timed gets its error on its line and the command exits non-zero at the end.
fn time_baselines(
    dir: &Path,
    only: &[String],
    preset: Preset,
    (reps, check): (u32, bool),
    json: Option<&Path>,
) -> Result<(), String> {
    use kevin::env::cuda::CudaEnv;
    use kevin::env::{CudaEnvConfig, KernelEnv};
    use std::sync::Arc;

    let suite = TaskSuite::load(dir).map_err(|e| format!("task suite: {e}"))?;
    let names: Vec<String> = chosen_tasks(&suite, dir, only)?
        .iter()
        .map(|t| t.name.clone())
        .collect();
    let exe = kevin::worker::own_binary().map_err(|e| format!("locating the kevin binary: {e}"))?;
    let cfg = CudaEnvConfig {
        workers_per_gpu: 1,
        compile_workers: 1,
        verify_timeout_ms: 600_000,
        ..CudaEnvConfig::default()
    };
    let env = CudaEnv::new(Arc::new(suite.clone()), dir, exe, &cfg)?;
    eprintln!(
        "kevin tasks baseline: {} tasks, {preset:?} preset, median of {reps} runs{}: {}",
        names.len(),
        if check {
            ", checked against the fp64 interpreter"
        } else {
            ""
        },
        env.describe()
    );
    let width = name_width(names.iter().map(String::as_str));
    let mut rows = Vec::new();
    let mut failed = 0;
    for (i, name) in names.iter().enumerate() {
        match env.time_baseline(name, preset, reps, check) {
            Ok(c) => {
                let ms = c.median_ms.unwrap_or(f64::NAN);
                let verdict = match (&c.first_failure, &c.reference_first_failure) {
                    _ if !check => String::new(),
                    (None, None) => format!(
                        "  ok: error/tolerance {:.3}, reference {:.3}",
                        c.max_error_ratio, c.reference_max_error_ratio
                    ),
                    (f, r) => {
                        failed += 1;
                        format!(
                            "  WRONG: baseline {}, reference {}",
                            f.as_deref().unwrap_or("within tolerance"),
                            r.as_deref().unwrap_or("within tolerance")
                        )
                    }
                };
                println!(
                    "{name:width$}  {ms:10.4} ms  {:3} steps  cublas {}  cudnn steps {}{verdict}   [{}/{}]",
                    c.steps,
                    c.cublas,
                    c.cudnn_steps,
                    i + 1,
                    names.len()
                );
                let mut row = json!({"task": name, "median_ms": c.median_ms, "steps": c.steps,
                    "cublas": c.cublas, "cudnn_steps": c.cudnn_steps});
                if check {
                    row["check"] = json!({
                        "max_error_ratio": c.max_error_ratio,
                        "first_failure": c.first_failure,
                        "reference_max_error_ratio": c.reference_max_error_ratio,
                        "reference_first_failure": c.reference_first_failure,
                    });
                }
                rows.push(row);
            }
            Err(e) => {
                failed += 1;
                println!("{name:width$}  ERROR {e}   [{}/{}]", i + 1, names.len());
                rows.push(json!({"task": name, "error": e}));
            }
        }
    }
    let what = if check {
        "could not be timed or are wrong"
    } else {
        "could not be timed"
    };
    println!(
        "{} of {} timed{}, {failed} {what}",
        names.len() - failed,
        names.len(),
        if check { " and right" } else { "" }
    );
    if let Some(path) = json {
        let doc = json!({"preset": format!("{preset:?}").to_lowercase(), "reps": reps,
            "checked": check, "device": env.describe(), "tasks": rows});
        write_json(path, &doc)?;
    }
    if failed > 0 {
        return Err(format!("{failed} of {} baselines {what}", names.len()));
    }
    Ok(())
}
