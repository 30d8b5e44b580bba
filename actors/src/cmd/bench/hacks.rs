//! `kevin bench hacks`: the adversarial suite (`tests/data/hacks/`, [`kevin::hacks`]) through a
//! real environment. Every case must get the outcome its manifest entry expects on this backend,
//! and the reference solution of every task the cases use must be judged correct (no false
//! positives). One line per case, so a GPU run reads well in a log; the exit status says whether
//! everything matched.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kevin::env::KernelEnv;
use kevin::hacks::{first_line, Expectation, HackSuite};
use kevin::outcome::Outcome;
use kevin::par::par_map;
use serde::Serialize;

use super::EnvArgs;
use crate::cmd::{failure, name_width, passed, write_json, CmdResult};

/// The flags of `kevin bench hacks`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The environment.
    #[command(flatten)]
    pub env: EnvArgs,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the suite with the flags; exit 1 on any mismatch.
pub fn run_cmd(a: &Args) -> CmdResult {
    let env = a.env.env()?;
    let ok = main(
        env,
        &a.env.hacks,
        &a.env.dir,
        a.env.backend(),
        a.env.workers(),
        a.json.as_deref(),
    )
    .map_err(failure)?;
    Ok(passed(ok))
}

/// One evaluated candidate: a hack case, or a task's reference solution.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// The case's name, or "reference <task>".
    pub case: String,
    /// The task.
    pub task: String,
    /// The expected outcome kinds ("crash", "crash|wrong"; "correct" for a reference).
    pub expected: String,
    /// Why the backend cannot reproduce the fault, when the manifest says so.
    pub not_reproducible: Option<String>,
    /// What it got.
    pub outcome: Outcome,
    /// `None` when the outcome is the expected one, else what is wrong with it.
    pub mismatch: Option<String>,
    /// Wall time of the evaluation (ms).
    pub eval_ms: f64,
}

impl CaseResult {
    /// True when the outcome is the expected one.
    pub fn ok(&self) -> bool {
        self.mismatch.is_none()
    }
}

/// What to evaluate: (name, task, source, expectation).
struct Job {
    case: String,
    task: String,
    source: String,
    expect: Expectation,
}

/// The reference solution of `task` (`solutions/<task>.cu` in the first folder of `tasks_dir`
/// that has one).
pub fn reference_source(tasks_dir: &Path, task: &str) -> Result<String, String> {
    let file = Path::new("solutions").join(format!("{task}.cu"));
    let dirs = kevin::tasks::suite_dirs(tasks_dir);
    let path = dirs
        .iter()
        .map(|d| d.join(&file))
        .find(|p| p.exists())
        .unwrap_or_else(|| dirs.first().map_or(file.clone(), |d| d.join(&file)));
    std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Evaluates every case of `hacks` for `backend` and the reference solution of every task they
/// use, `parallel` at a time, with a progress line on stderr.
pub fn run(
    env: &Arc<dyn KernelEnv>,
    hacks: &HackSuite,
    tasks_dir: &Path,
    backend: &str,
    parallel: usize,
) -> Result<Vec<CaseResult>, String> {
    let mut jobs = Vec::new();
    for c in &hacks.cases {
        let expect = c
            .expectation(backend)
            .ok_or_else(|| format!("unknown backend `{backend}`"))?;
        jobs.push(Job {
            case: c.name.clone(),
            task: c.task.clone(),
            source: c.source.clone(),
            expect: expect.clone(),
        });
    }
    for task in hacks.tasks() {
        jobs.push(Job {
            case: format!("reference {task}"),
            source: reference_source(tasks_dir, &task)?,
            task,
            expect: Expectation {
                outcomes: vec!["correct".into()],
                reason: None,
                not_reproducible: None,
                note: None,
            },
        });
    }
    let started = Instant::now();
    let line = crate::cmd::ProgressLine::default();
    let total = jobs.len();
    let results = par_map(
        &jobs,
        parallel,
        |job| {
            let t0 = Instant::now();
            let outcome = kevin::env::evaluate(env.as_ref(), &job.task, &job.source);
            CaseResult {
                case: job.case.clone(),
                task: job.task.clone(),
                expected: job.expect.label(),
                not_reproducible: job.expect.not_reproducible.clone(),
                mismatch: job.expect.check(&outcome).err(),
                outcome,
                eval_ms: t0.elapsed().as_secs_f64() * 1e3,
            }
        },
        |n, job, _| {
            let text = format!(
                "[{n}/{total}] {:.1} s, last: {:<32}",
                started.elapsed().as_secs_f64(),
                job.case
            );
            line.show(n, total, &text);
        },
    );
    line.finish();
    Ok(results)
}

/// The report: one line per case (case, expected, got, ok, reason), then the footnotes for cases
/// the backend cannot reproduce, then a summary line.
pub fn render(results: &[CaseResult], backend: &str) -> String {
    let w = name_width(results.iter().map(|r| r.case.as_str()));
    let mut out = format!(
        "{:w$}  {:<20}  {:<14}  {:<8}  {:>8}  reason\n",
        "case", "expected", "got", "verdict", "ms"
    );
    for r in results {
        let expected = if r.not_reproducible.is_some() {
            format!("{}*", r.expected)
        } else {
            r.expected.clone()
        };
        out += &format!(
            "{:w$}  {expected:<20}  {:<14}  {:<8}  {:>8.0}  {}\n",
            r.case,
            r.outcome.kind(),
            if r.ok() { "ok" } else { "MISMATCH" },
            r.eval_ms,
            first_line(&r.outcome.feedback())
        );
    }
    let starred: Vec<&CaseResult> = results
        .iter()
        .filter(|r| r.not_reproducible.is_some())
        .collect();
    if !starred.is_empty() {
        out += &format!("\n* not reproducible on the {backend} backend:\n");
        for r in starred {
            out += &format!(
                "  {}: {}\n",
                r.case,
                r.not_reproducible.as_deref().unwrap_or("")
            );
        }
    }
    let bad: Vec<&CaseResult> = results.iter().filter(|r| !r.ok()).collect();
    out += &format!(
        "\n{} candidates on the {backend} backend: {} as expected, {} mismatched\n",
        results.len(),
        results.len() - bad.len(),
        bad.len()
    );
    for r in bad {
        out += &format!(
            "MISMATCH {}: {}\n",
            r.case,
            r.mismatch.as_deref().unwrap_or("")
        );
    }
    out
}

/// Runs the suite, prints the report, writes the JSON when asked; `Ok(true)` when every case
/// and every reference got its expected outcome. `Err` is a one-line message.
pub fn main(
    env: Arc<dyn KernelEnv>,
    hacks_dir: &Path,
    tasks_dir: &Path,
    backend: &str,
    parallel: usize,
    json: Option<&Path>,
) -> Result<bool, String> {
    let hacks = HackSuite::load(hacks_dir).map_err(|e| e.to_string())?;
    eprintln!(
        "kevin bench hacks: {} cases, {} reference solutions; {}",
        hacks.cases.len(),
        hacks.tasks().len(),
        env.describe()
    );
    let results = run(&env, &hacks, tasks_dir, backend, parallel)?;
    print!("{}", render(&results, backend));
    let passed = results.iter().all(CaseResult::ok);
    if let Some(path) = json {
        let value = serde_json::json!({
            "backend": backend,
            "environment": env.describe(),
            "passed": passed,
            "results": results,
        });
        write_json(path, &value)?;
    }
    Ok(passed)
}
