//! `kevin bench faults`: a fault storm. N evaluations mixing the adversarial suite's faulty
//! candidates (crashes, hangs, compile bombs, wrong answers) with valid reference solutions,
//! shuffled with a seed and submitted concurrently to one environment, through its worker pools,
//! from several threads as the Compiler, Verifier and Profiler actors do. It measures what the
//! daemon must guarantee while candidates misbehave:
//!
//! - the process survives (this report exists; the CI test also checks the exit status);
//! - no result is lost (every submitted evaluation comes back exactly once, even one whose call
//!   panicked) and none is misattributed (each comes back to the job that submitted it, with the
//!   verdict its candidate deserves: a faulty one gets the outcome the suite's manifest expects
//!   on this backend, a valid one is correct);
//! - valid candidates keep the verdict of a clean run (each evaluated once, before any fault) and
//!   their speedup drifts only as much as timing noise allows (CPU timings on a loaded machine
//!   are noisy: the drift is reported, not asserted);
//! - crashed and hung workers are respawned, how often and how fast (from detecting the failure
//!   to the replacement answering its health check, [`kevin::worker::PoolStats`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kevin::env::{Deadlines, KernelEnv};
use kevin::hacks::{first_line, Expectation, HackSuite};
use kevin::outcome::Outcome;
use kevin::par::par_map;
use kevin::rng::SplitMix64;
use kevin::worker::PoolStats;
use serde::Serialize;

use super::hacks::reference_source;
use super::median;
use super::EnvArgs;
use crate::cmd::{failure, passed, usage, write_json, CmdResult};

/// The flags of `kevin bench faults`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The environment.
    #[command(flatten)]
    pub env: EnvArgs,
    /// Evaluations to submit.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Threads submitting at once (default: twice the workers).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Share of faulty candidates among the evaluations.
    #[arg(long, default_value_t = 0.5)]
    pub faulty_share: f64,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop submitting after this many seconds: the evaluations in flight finish and the
    /// report covers those submitted (it says so), so a run under a time limit still reports.
    #[arg(long)]
    pub max_seconds: Option<f64>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the storm with the flags; exit 1 when anything was lost or misattributed.
pub fn run_cmd(a: &Args) -> CmdResult {
    if !(0.0..=1.0).contains(&a.faulty_share) {
        return Err(usage(format!(
            "--faulty-share {}: must be between 0 and 1",
            a.faulty_share
        )));
    }
    let env = a.env.env()?;
    let opts = FaultOptions {
        count: a.count,
        concurrency: a.concurrency.unwrap_or(2 * a.env.workers()).max(1),
        seed: a.seed,
        faulty_share: a.faulty_share,
        max_seconds: a.max_seconds,
    };
    let ok = main(
        env,
        &a.env.hacks,
        &a.env.dir,
        a.env.backend(),
        a.env.deadlines(),
        &opts,
        a.json.as_deref(),
    )
    .map_err(failure)?;
    Ok(passed(ok))
}

/// How the storm is made.
#[derive(Debug, Clone)]
pub struct FaultOptions {
    /// Evaluations submitted.
    pub count: usize,
    /// Threads submitting at once.
    pub concurrency: usize,
    /// Seed of the shuffle.
    pub seed: u64,
    /// Share of the evaluations that are faulty candidates (0..=1).
    pub faulty_share: f64,
    /// Stop submitting after this many seconds (the ones in flight finish).
    pub max_seconds: Option<f64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// After this long without a result, the storm names the evaluations in flight the longest.
const STALL_REPORT: Duration = Duration::from_secs(10);

/// A candidate of the storm.
struct Candidate {
    /// The hack case's name, or "valid <task>".
    label: String,
    task: String,
    source: String,
    /// None for a valid candidate (its verdict must be that of the clean run).
    expect: Option<Expectation>,
}

/// A valid candidate's verdict before the storm.
#[derive(Debug, Clone, Serialize)]
pub struct CleanRun {
    /// The task.
    pub task: String,
    /// The outcome kind.
    pub kind: String,
    /// Its speedup, when correct.
    pub speedup: Option<f64>,
}

/// What came back for one submitted evaluation.
struct Received {
    job: usize,
    task: String,
    outcome: Result<Outcome, String>,
    /// Seconds from submission to result (queueing for workers and the GPU included).
    seconds: f64,
}

/// The storm's figures.
#[derive(Debug, Clone, Serialize)]
pub struct FaultReport {
    /// "cpu" or "cuda".
    pub backend: String,
    /// The environment's own description.
    pub environment: String,
    /// Evaluations asked for (`--count`).
    pub requested: usize,
    /// Evaluations submitted (fewer than requested only when `--max-seconds` stopped it).
    pub submitted: usize,
    /// Of which faulty candidates.
    pub faulty: usize,
    /// Of which valid candidates.
    pub valid: usize,
    /// Threads submitting at once.
    pub concurrency: usize,
    /// Shuffle seed.
    pub seed: u64,
    /// Stage deadlines.
    pub deadlines: Deadlines,
    /// Crashes of this process (the daemon's stand-in): had there been one, there would be no
    /// report; the CI test checks the exit status.
    pub daemon_crashes: u64,
    /// Distinct evaluations that came back.
    pub received: usize,
    /// Submitted minus received.
    pub lost: usize,
    /// Results that came back twice.
    pub duplicates: usize,
    /// Results for the wrong task, faulty candidates without their expected outcome, valid ones
    /// not correct.
    pub misattributed: usize,
    /// The first few misattributions, one line each.
    pub misattributed_examples: Vec<String>,
    /// Valid candidates whose verdict differs from their clean run.
    pub verdict_changes: usize,
    /// Median of storm speedup / clean speedup over the valid, correct results.
    pub speedup_ratio_median: Option<f64>,
    /// Largest drift, max(ratio, 1/ratio), over the same results.
    pub speedup_drift_max: Option<f64>,
    /// Workers respawned during the storm.
    pub respawns: u64,
    /// Median respawn latency during the storm (ms).
    pub respawn_median_ms: Option<f64>,
    /// Longest respawn latency during the storm (ms).
    pub respawn_max_ms: Option<f64>,
    /// The pools' counters after the storm.
    pub pools: Vec<(String, PoolStats)>,
    /// Wall time of the storm (s).
    pub elapsed_s: f64,
    /// Evaluations per second.
    pub throughput_per_s: f64,
    /// Outcome kinds over all results.
    pub outcomes: BTreeMap<String, usize>,
    /// Outcome kinds per candidate.
    pub per_candidate: BTreeMap<String, BTreeMap<String, usize>>,
    /// Seconds from submission to result per candidate: (median, max). Where the storm's time
    /// goes: a candidate that holds a worker or the GPU long shows here.
    pub latency_s: BTreeMap<String, (f64, f64)>,
    /// The clean runs of the valid candidates.
    pub clean: Vec<CleanRun>,
}

impl FaultReport {
    /// True when nothing was lost, duplicated or misattributed and no valid verdict changed.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.duplicates == 0
            && self.misattributed == 0
            && self.verdict_changes == 0
    }
}

fn candidates(
    hacks: &HackSuite,
    tasks_dir: &Path,
    backend: &str,
) -> Result<(Vec<Candidate>, Vec<Candidate>), String> {
    let mut faulty = Vec::new();
    for c in &hacks.cases {
        let expect = c
            .expectation(backend)
            .ok_or_else(|| format!("unknown backend `{backend}`"))?;
        faulty.push(Candidate {
            label: c.name.clone(),
            task: c.task.clone(),
            source: c.source.clone(),
            expect: Some(expect.clone()),
        });
    }
    let mut valid = Vec::new();
    for task in hacks.tasks() {
        valid.push(Candidate {
            label: format!("valid {task}"),
            source: reference_source(tasks_dir, &task)?,
            task,
            expect: None,
        });
    }
    Ok((faulty, valid))
}

/// The job list: `count` indices into `faulty` then `valid` (valid ones offset by
/// `faulty.len()`), each list cycled so every candidate appears, then shuffled (Fisher-Yates).
fn jobs(count: usize, share: f64, n_faulty: usize, n_valid: usize, seed: u64) -> Vec<usize> {
    let faulty = ((count as f64 * share.clamp(0.0, 1.0)).round() as usize).min(count);
    let mut jobs: Vec<usize> = (0..faulty)
        .map(|i| i % n_faulty.max(1))
        .chain((0..count - faulty).map(|i| n_faulty + i % n_valid.max(1)))
        .collect();
    let mut rng = SplitMix64::derive(seed, 0xFA17);
    for i in (1..jobs.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        jobs.swap(i, j);
    }
    jobs
}

fn respawns(pools: &[(String, PoolStats)]) -> u64 {
    pools.iter().map(|(_, s)| s.respawns).sum()
}

/// Respawn latencies recorded after `before` (per pool, the newest entries of the window).
fn new_latencies(before: &[(String, PoolStats)], after: &[(String, PoolStats)]) -> Vec<f64> {
    let mut out = Vec::new();
    for (name, a) in after {
        let old = before
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, s)| s.respawns);
        let new = (a.respawns - old.min(a.respawns)) as usize;
        let recent = &a.respawn_latency_recent;
        out.extend(
            recent
                .iter()
                .skip(recent.len().saturating_sub(new))
                .map(|d| d.as_secs_f64() * 1e3),
        );
    }
    out
}

/// Runs the clean run and the storm and returns the figures.
pub fn run(
    env: Arc<dyn KernelEnv>,
    hacks: &HackSuite,
    tasks_dir: &Path,
    backend: &str,
    deadlines: Deadlines,
    opts: &FaultOptions,
) -> Result<FaultReport, String> {
    let (faulty, valid) = candidates(hacks, tasks_dir, backend)?;
    eprintln!("clean run: {} valid candidates, one at a time", valid.len());
    let clean: Vec<CleanRun> = valid
        .iter()
        .map(|c| {
            let o = kevin::env::evaluate(env.as_ref(), &c.task, &c.source);
            eprintln!("  {}: {}", c.label, first_line(&o.feedback()));
            CleanRun {
                task: c.task.clone(),
                kind: o.kind().to_string(),
                speedup: o.speedup(),
            }
        })
        .collect();
    let all: Vec<Candidate> = faulty.into_iter().chain(valid).collect();
    let n_faulty = all.iter().filter(|c| c.expect.is_some()).count();
    let list = jobs(
        opts.count,
        opts.faulty_share,
        n_faulty,
        all.len() - n_faulty,
        opts.seed,
    );
    let before = env.pool_stats();
    eprintln!(
        "storm: {} evaluations ({} faulty), {} at a time",
        list.len(),
        list.iter().filter(|&&i| i < n_faulty).count(),
        opts.concurrency
    );
    let started = Instant::now();
    let line = crate::cmd::ProgressLine::default();
    let budget = opts.max_seconds.map(Duration::from_secs_f64);
    // Job -> (label, start) of the evaluations in flight, to name them when results stall.
    let in_flight: Mutex<HashMap<usize, (String, Instant)>> = Mutex::new(HashMap::new());
    // When the last result came (or the last stall was reported).
    let last_news = Mutex::new(Instant::now());
    let storm_over = AtomicBool::new(false);
    let jobs: Vec<usize> = (0..list.len()).collect();
    let received = AtomicUsize::new(0);
    let (results, elapsed): (Vec<Option<Received>>, Duration) = std::thread::scope(|s| {
        s.spawn(|| stall_watch(&in_flight, &last_news, &storm_over));
        let results = par_map(
            &jobs,
            opts.concurrency,
            |&job| {
                // Past --max-seconds a job is not submitted at all.
                if budget.is_some_and(|b| started.elapsed() >= b) {
                    return None;
                }
                let c = &all[list[job]];
                let submitted = Instant::now();
                lock(&in_flight).insert(job, (c.label.clone(), submitted));
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    kevin::env::evaluate(env.as_ref(), &c.task, &c.source)
                }))
                .map_err(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into())
                });
                lock(&in_flight).remove(&job);
                Some(Received {
                    job,
                    task: c.task.clone(),
                    outcome,
                    seconds: submitted.elapsed().as_secs_f64(),
                })
            },
            |_, _, r| {
                if r.is_none() {
                    return;
                }
                let n = received.fetch_add(1, Ordering::SeqCst) + 1;
                *lock(&last_news) = Instant::now();
                let secs = started.elapsed().as_secs_f64();
                let text = format!(
                    "[{n}/{}] {secs:.0} s, {:.2} eval/s, respawns {}",
                    list.len(),
                    n as f64 / secs.max(1e-9),
                    respawns(&env.pool_stats()) - respawns(&before)
                );
                line.show(n, list.len(), &text);
            },
        );
        let elapsed = started.elapsed();
        storm_over.store(true, Ordering::SeqCst);
        (results, elapsed)
    });
    // Only the jobs submitted count (all of them without --max-seconds), numbered in order.
    let mut submitted = Vec::with_capacity(list.len());
    let mut got: Vec<Received> = Vec::with_capacity(list.len());
    for r in results.into_iter().flatten() {
        got.push(Received {
            job: submitted.len(),
            ..r
        });
        submitted.push(list[r.job]);
    }
    let taken = submitted.len();
    if taken < list.len() {
        eprintln!(
            "\nstopped submitting after {:.0} s (--max-seconds): {taken} of {} submitted",
            started.elapsed().as_secs_f64(),
            list.len()
        );
    }
    let list = &submitted[..];
    line.finish();
    let after = env.pool_stats();
    Ok(judge(
        &env, backend, deadlines, opts, &all, list, n_faulty, clean, got, elapsed, &before, after,
    ))
}

/// Until `over`, names the evaluations in flight (the longest first) whenever no result came
/// for [`STALL_REPORT`] (`last_news`: when the last result came, or the last report).
fn stall_watch(
    in_flight: &Mutex<HashMap<usize, (String, Instant)>>,
    last_news: &Mutex<Instant>,
    over: &AtomicBool,
) {
    while !over.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if lock(last_news).elapsed() < STALL_REPORT {
            continue;
        }
        *lock(last_news) = Instant::now();
        let mut oldest: Vec<(String, f64)> = lock(in_flight)
            .values()
            .map(|(label, t)| (label.clone(), t.elapsed().as_secs_f64()))
            .collect();
        oldest.sort_by(|a, b| b.1.total_cmp(&a.1));
        let names: Vec<String> = oldest
            .iter()
            .take(8)
            .map(|(l, secs)| format!("{l} ({secs:.0} s)"))
            .collect();
        eprintln!(
            "\nno result for {} s; {} in flight, longest: {}",
            STALL_REPORT.as_secs(),
            oldest.len(),
            names.join(", ")
        );
    }
}

/// Turns what came back into the figures.
#[allow(clippy::too_many_arguments)]
fn judge(
    env: &Arc<dyn KernelEnv>,
    backend: &str,
    deadlines: Deadlines,
    opts: &FaultOptions,
    all: &[Candidate],
    list: &[usize],
    n_faulty: usize,
    clean: Vec<CleanRun>,
    got: Vec<Received>,
    elapsed: Duration,
    before: &[(String, PoolStats)],
    after: Vec<(String, PoolStats)>,
) -> FaultReport {
    let mut seen = HashSet::new();
    let (mut duplicates, mut misattributed, mut verdict_changes) = (0, 0, 0);
    let mut examples = Vec::new();
    let mut ratios = Vec::new();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_candidate: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let mut to_result: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let note = |examples: &mut Vec<String>, line: String| {
        if examples.len() < 10 {
            examples.push(line);
        }
    };
    for r in &got {
        if !seen.insert(r.job) {
            duplicates += 1;
            continue;
        }
        let c = &all[list[r.job]];
        let outcome = match &r.outcome {
            Ok(o) => o,
            Err(panic) => {
                // The call panicked: its result is lost (counted below), not misattributed.
                seen.remove(&r.job);
                note(
                    &mut examples,
                    format!(
                        "job {} ({}): the evaluation panicked: {panic}",
                        r.job, c.label
                    ),
                );
                continue;
            }
        };
        to_result
            .entry(c.label.clone())
            .or_default()
            .push(r.seconds);
        let kind = outcome.kind().to_string();
        *outcomes.entry(kind.clone()).or_default() += 1;
        *per_candidate
            .entry(c.label.clone())
            .or_default()
            .entry(kind.clone())
            .or_default() += 1;
        if r.task != c.task {
            misattributed += 1;
            note(
                &mut examples,
                format!("job {} ({}): came back for task {}", r.job, c.label, r.task),
            );
            continue;
        }
        match &c.expect {
            Some(expect) => {
                if let Err(why) = expect.check(outcome) {
                    misattributed += 1;
                    note(&mut examples, format!("job {} ({}): {why}", r.job, c.label));
                }
            }
            None => {
                let base = &clean[list[r.job] - n_faulty];
                if !outcome.is_correct() {
                    misattributed += 1;
                    note(
                        &mut examples,
                        format!(
                            "job {} ({}): {}",
                            r.job,
                            c.label,
                            first_line(&outcome.feedback())
                        ),
                    );
                }
                if kind != base.kind {
                    verdict_changes += 1;
                }
                if let (Some(now), Some(then)) = (outcome.speedup(), base.speedup) {
                    ratios.push(now / then);
                }
            }
        }
    }
    let mut drifts: Vec<f64> = ratios.iter().map(|r| r.max(1.0 / r)).collect();
    let mut latencies = new_latencies(before, &after);
    let received = seen.len();
    let valid = list.iter().filter(|&&i| i >= n_faulty).count();
    FaultReport {
        backend: backend.to_string(),
        environment: env.describe(),
        requested: opts.count,
        submitted: list.len(),
        faulty: list.len() - valid,
        valid,
        concurrency: opts.concurrency,
        seed: opts.seed,
        deadlines,
        daemon_crashes: 0,
        received,
        lost: list.len() - received,
        duplicates,
        misattributed,
        misattributed_examples: examples,
        verdict_changes,
        speedup_ratio_median: median(&mut ratios),
        speedup_drift_max: drifts.iter_mut().map(|d| *d).reduce(f64::max),
        respawns: respawns(&after) - respawns(before),
        respawn_median_ms: median(&mut latencies),
        respawn_max_ms: latencies.iter().copied().reduce(f64::max),
        pools: after,
        elapsed_s: elapsed.as_secs_f64(),
        throughput_per_s: list.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        outcomes,
        per_candidate,
        latency_s: to_result
            .into_iter()
            .map(|(label, mut v)| {
                v.sort_by(f64::total_cmp);
                let max = v.last().copied().unwrap_or(0.0);
                (label, (v[v.len() / 2], max))
            })
            .collect(),
        clean,
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.digits$}"))
}

/// The report as markdown.
pub fn render(r: &FaultReport) -> String {
    let mut out = format!(
        "## Fault storm ({} backend)\n\n{}\n\n\
         {} evaluations ({} faulty, {} valid), {} submitting threads, seed {}; deadlines: compile {} ms, \
         verify {} ms, profile {} ms.\n\n\
         | figure | value |\n|---|---|\n",
        r.backend,
        r.environment,
        r.submitted,
        r.faulty,
        r.valid,
        r.concurrency,
        r.seed,
        r.deadlines.compile_ms,
        r.deadlines.verify_ms,
        r.deadlines.profile_ms
    );
    if r.submitted < r.requested {
        out = out.replace(
            "\n\n| figure",
            &format!(
                " **Stopped by --max-seconds: {} of {} requested evaluations submitted.**\n\n| figure",
                r.submitted, r.requested
            ),
        );
    }
    let rows: Vec<(&str, String)> = vec![
        ("daemon crashes", r.daemon_crashes.to_string()),
        ("lost results (submitted - received)", r.lost.to_string()),
        ("duplicated results", r.duplicates.to_string()),
        ("misattributed results", r.misattributed.to_string()),
        (
            "valid candidates whose verdict changed vs the clean run",
            r.verdict_changes.to_string(),
        ),
        (
            "valid speedup, storm / clean: median ratio",
            opt(r.speedup_ratio_median, 3),
        ),
        (
            "valid speedup drift: max(ratio, 1/ratio)",
            opt(r.speedup_drift_max, 2),
        ),
        ("worker respawns", r.respawns.to_string()),
        (
            "respawn latency median (ms; failure detected -> health check answered)",
            opt(r.respawn_median_ms, 1),
        ),
        ("respawn latency max (ms)", opt(r.respawn_max_ms, 1)),
        ("wall time (s)", format!("{:.1}", r.elapsed_s)),
        (
            "throughput (evaluations/s)",
            format!("{:.2}", r.throughput_per_s),
        ),
    ];
    for (k, v) in rows {
        out += &format!("| {k} | {v} |\n");
    }
    out += "\nOutcomes: ";
    out += &r
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    out += "\n\n| candidate | outcomes | seconds to result: median, max |\n|---|---|---|\n";
    for (c, kinds) in &r.per_candidate {
        let ks: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let latency = r
            .latency_s
            .get(c)
            .map_or(String::from("-"), |(m, x)| format!("{m:.2}, {x:.2}"));
        out += &format!("| {c} | {} | {latency} |\n", ks.join(", "));
    }
    out += "\nClean run: ";
    out += &r
        .clean
        .iter()
        .map(|c| format!("{} {} ({}x)", c.task, c.kind, opt(c.speedup, 4)))
        .collect::<Vec<_>>()
        .join(", ");
    out += "\n";
    if r.backend == "cpu" {
        out += "\nCPU timings on a machine running the storm are noisy: the speedup drift measures that \
                noise as much as any interference.\n";
    }
    for e in &r.misattributed_examples {
        out += &format!("\n- {e}");
    }
    if !r.misattributed_examples.is_empty() {
        out += "\n";
    }
    out
}

/// Runs the storm, prints the report (stdout) and writes the JSON when asked; `Ok(true)` when
/// nothing was lost or misattributed and no valid verdict changed.
pub fn main(
    env: Arc<dyn KernelEnv>,
    hacks_dir: &Path,
    tasks_dir: &Path,
    backend: &str,
    deadlines: Deadlines,
    opts: &FaultOptions,
    json: Option<&Path>,
) -> Result<bool, String> {
    let hacks = HackSuite::load(hacks_dir).map_err(|e| e.to_string())?;
    eprintln!("kevin bench faults: {}", env.describe());
    let report = run(env, &hacks, tasks_dir, backend, deadlines, opts)?;
    print!("{}", render(&report));
    if let Some(path) = json {
        write_json(path, &report)?;
    }
    Ok(report.passed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_mix_every_candidate_and_shuffle_reproducibly() {
        let a = jobs(100, 0.5, 19, 3, 1);
        assert_eq!(a.len(), 100);
        assert_eq!(a.iter().filter(|&&i| i < 19).count(), 50);
        for c in 0..22 {
            assert!(a.contains(&c), "candidate {c} missing");
        }
        assert_eq!(a, jobs(100, 0.5, 19, 3, 1));
        assert_ne!(a, jobs(100, 0.5, 19, 3, 2));
        assert_ne!(a[..10], (0..10).collect::<Vec<_>>()[..], "not shuffled");
    }
}
