//! `kevin eval --kernels DIR`: evaluates `<task>.cu` files through a kernel environment and
//! prints a table per task and a summary (correct rate, fast_p, mean and geometric-mean speedup),
//! also as JSON for tools.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kevin::env::KernelEnv;
use kevin::eval::{summarize, Summary, TaskResult};
use kevin::outcome::Outcome;
use kevin::par::par_map;
use kevin::tasks::TaskSuite;

use crate::cmd::{name_width, write_json};

/// What to evaluate: the `<task>.cu` files in `kernels` whose stem is a task (optionally only
/// `only`), evaluated `parallel` at a time.
pub fn run(
    env: Arc<dyn KernelEnv>,
    suite: &TaskSuite,
    kernels: &Path,
    only: &[String],
    parallel: usize,
) -> Result<Vec<TaskResult>, String> {
    let mut jobs = Vec::new();
    let entries = std::fs::read_dir(kernels).map_err(|e| format!("{}: {e}", kernels.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "cu") {
            continue;
        }
        let stem = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if !only.is_empty() && !only.contains(&stem) {
            continue;
        }
        let task = suite
            .get(&stem)
            .ok_or_else(|| format!("{}: no task named `{stem}` in the suite", path.display()))?;
        let source =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        jobs.push((task.name.clone(), task.level, source));
    }
    if let Some(missing) = only.iter().find(|t| !jobs.iter().any(|(n, _, _)| n == *t)) {
        return Err(format!("no {missing}.cu in {}", kernels.display()));
    }
    jobs.sort_by(|a, b| a.0.cmp(&b.0));
    let total = jobs.len();
    let started = Instant::now();
    let line = crate::cmd::ProgressLine::default();
    let mut results = par_map(
        &jobs,
        parallel,
        |(task, level, source)| {
            let t0 = Instant::now();
            let outcome = kevin::env::evaluate(env.as_ref(), task, source);
            TaskResult {
                task: task.clone(),
                level: *level,
                outcome,
                eval_ms: t0.elapsed().as_secs_f64() * 1e3,
            }
        },
        |n, (task, _, _), _| {
            let text = format!(
                "[{n}/{total}] {:.1} s, last: {task:<28}",
                started.elapsed().as_secs_f64()
            );
            line.show(n, total, &text);
        },
    );
    line.finish();
    results.sort_by(|a, b| a.task.cmp(&b.task));
    Ok(results)
}

fn cell(o: &Outcome) -> (String, String, String, String, String) {
    match o {
        Outcome::Correct {
            kernel_ms,
            baseline_ms,
            spread,
            timing,
        } => (
            if o.flagged() {
                "correct (flagged)".into()
            } else {
                "correct".into()
            },
            format!("{:.2}x", o.speedup().unwrap_or(0.0)),
            format!("{baseline_ms:.4}"),
            format!("{kernel_ms:.4}"),
            format!("{:.1}% {timing}", spread * 100.0),
        ),
        other => (
            other.kind().to_string(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ),
    }
}

/// The report as text: one line per task, then the summary.
pub fn render(results: &[TaskResult], summary: &Summary) -> String {
    let w = name_width(results.iter().map(|r| r.task.as_str()));
    let mut out = format!(
        "{:w$}  {:<17}  {:>8}  {:>11}  {:>10}  spread\n",
        "task", "outcome", "speedup", "baseline ms", "kernel ms"
    );
    for r in results {
        let (kind, speedup, base, kern, spread) = cell(&r.outcome);
        out += &format!(
            "{:w$}  {kind:<17}  {speedup:>8}  {base:>11}  {kern:>10}  {spread}\n",
            r.task
        );
    }
    out += &format!(
        "\n{} tasks: correct {:.1}%; fast_p {}; mean speedup {:.3}x (incorrect = 0); geometric mean {}\n",
        summary.tasks,
        summary.correct_rate * 100.0,
        summary.fast_p.iter().map(|(p, f)| format!("fast_{p}={:.1}%", f * 100.0)).collect::<Vec<_>>().join(" "),
        summary.mean_speedup,
        summary.geomean_speedup.map_or("n/a".to_string(), |g| format!("{g:.3}x")),
    );
    let failures: Vec<String> = summary
        .outcomes
        .iter()
        .filter(|(k, _)| *k != "correct")
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    if !failures.is_empty() {
        out += &format!("not correct: {}\n", failures.join(", "));
    }
    if summary.harness_errors > 0 {
        out += &format!(
            "{} task(s) not judged: the harness failed (not the kernels' fault; in no rate above)\n",
            summary.harness_errors
        );
    }
    if summary.flagged > 0 {
        out += &format!(
            "{} speedup(s) over 10x flagged for review\n",
            summary.flagged
        );
    }
    out
}

/// The JSON written by `--json`.
pub fn to_json(results: &[TaskResult], summary: &Summary) -> serde_json::Value {
    serde_json::json!({ "results": results, "summary": summary })
}

/// Runs everything and prints; `Err` is a one-line message.
pub fn main(
    env: Arc<dyn KernelEnv>,
    suite: &TaskSuite,
    kernels: &Path,
    only: &[String],
    parallel: usize,
    json: Option<&Path>,
) -> Result<(), String> {
    eprintln!("kevin eval: {}", env.describe());
    let results = run(env.clone(), suite, kernels, only, parallel)?;
    if results.is_empty() {
        return Err(format!("no <task>.cu files in {}", kernels.display()));
    }
    let summary = summarize(&results);
    print!("{}", render(&results, &summary));
    // The most device memory one request took (the harness's buffers, the worker's own and the
    // candidate's scratch): what benches/harness_memory.py compares with torch eager's peak.
    let peak = env.device_memory_peak().filter(|&p| p > 0);
    if let Some(p) = peak {
        println!(
            "harness peak device memory: {p} bytes ({:.2} GiB) in one request",
            p as f64 / (1u64 << 30) as f64
        );
    }
    if let Some(path) = json {
        let mut out = to_json(&results, &summary);
        out["device_memory_peak_bytes"] = serde_json::json!(peak);
        write_json(path, &out)?;
    }
    Ok(())
}
