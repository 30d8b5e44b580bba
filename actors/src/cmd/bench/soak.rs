//! `kevin bench soak`: what a long run costs in disk, memory and restart time.
//!
//! One `kevin train` child on a fresh run directory (by default `configs/soak.toml`: the real
//! actor system, replay queue, write-ahead log, checkpoints and telemetry, with the simulated
//! policy answering real tasks at a high rate) runs until `--turns` turns or `--hours`, whichever
//! comes first, then gets SIGINT and drains. Every `--sample-s` the bench samples the daemon's
//! resident memory (`/proc/<pid>/status`), the run directory's size, the write-ahead log's size and
//! the turns done (accepted groups x trajectories x turns, from metrics.jsonl's last line).
//!
//! Restart time is the time from spawning `kevin train` to its "starting a new run" (the fresh
//! run) or "resuming" log line: opening the run directory, recovering the WAL and loading the
//! checkpoint. The first session is stopped after `--early-s` and restarted (the early restart);
//! the restarted daemon runs the rest of the soak, so its memory is what is sampled; after the
//! soak it is restarted once more (the late restart) and that one is stopped at once. A restart
//! time that does not grow with the run's length has late / early near 1.
//!
//! Those single restarts are noisy at a few milliseconds, so the bench then times
//! `--restart-pairs` alternating pairs on the stopped run directory: a fresh start (a new run
//! directory, to "starting a new run") and a restart (to "resuming"), each killed at its line
//! (a kill -9 loses nothing: the crash tests prove it), and reports their medians and ratio.
//!
//! Reports: turns per second; RSS after warm-up (`--warmup-frac` of the second session's
//! samples), at the end and at its highest after warm-up, and the growth; the run directory's size
//! at the end, its highest and the budget (`run.max_disk_gb`); the WAL at the end; the start and
//! restart times.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kevin::config::Config;
use kevin::telemetry::files;
use serde::Serialize;

use super::modes::{early_exit, interrupt, wait_or_kill};
use crate::cmd::{failure, CmdResult};

/// The flags of `kevin bench soak`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The config to soak. KEVIN__* variables apply.
    #[arg(long, default_value = "configs/soak.toml")]
    pub config: PathBuf,
    /// Stop after this many turns (accepted groups x trajectories x turns)...
    #[arg(long, default_value_t = 1_000_000)]
    pub turns: u64,
    /// ... or after this many hours, whichever comes first.
    #[arg(long, default_value_t = 1.0)]
    pub hours: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    pub sample_s: f64,
    /// Share of the samples that counts as warm-up for the memory growth (at least the first,
    /// taken as the restarted daemon starts).
    #[arg(long, default_value_t = 0.1)]
    pub warmup_frac: f64,
    /// Seconds of the first session, stopped and restarted (the early restart) before the rest.
    #[arg(long, default_value_t = 30.0)]
    pub early_s: f64,
    /// Alternating fresh starts and restarts timed after the soak (medians reported).
    #[arg(long, default_value_t = 9)]
    pub restart_pairs: usize,
    /// Folder of the run directory (`run/`) and the logs (replaced if present).
    #[arg(long, default_value = "runs/bench-soak")]
    pub dir: PathBuf,
    /// Also write the results as markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One sample.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t_s: f64,
    /// Turns done.
    pub turns: u64,
    /// The daemon's resident memory (MB).
    pub rss_mb: f64,
    /// The run directory's size (MB).
    pub run_dir_mb: f64,
    /// The write-ahead log's size (MB).
    pub wal_mb: f64,
}

/// What the soak measured.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// The config soaked.
    pub config: PathBuf,
    /// Seconds of the first session (before the early restart).
    pub early_s: f64,
    /// Turns done.
    pub turns: u64,
    /// Seconds the daemon ran before SIGINT.
    pub seconds: f64,
    /// Turns per second.
    pub turns_per_s: f64,
    /// RSS at the end of warm-up (MB).
    pub rss_warm_mb: f64,
    /// RSS at the last sample (MB).
    pub rss_last_mb: f64,
    /// Highest RSS after warm-up (MB).
    pub rss_max_mb: f64,
    /// `rss_max_mb / rss_warm_mb - 1`, in percent: the highest point, working set included.
    pub rss_growth_pct: f64,
    /// Mean RSS of the last quarter of the samples after warm-up over that of the first quarter,
    /// minus 1, in percent: the trend, which a leak shows and a moving working set does not.
    pub rss_trend_pct: f64,
    /// The run directory at the end (MB).
    pub run_dir_mb: f64,
    /// Its highest sample (MB).
    pub run_dir_max_mb: f64,
    /// The budget, `run.max_disk_gb` (MB; 0: none).
    pub budget_mb: f64,
    /// The write-ahead log at the end (MB).
    pub wal_mb: f64,
    /// WAL segments at the end.
    pub wal_segments: usize,
    /// Rotated archives at the end.
    pub archives: usize,
    /// Seconds to the "starting a new run" line of the fresh run.
    pub start_fresh_s: f64,
    /// Seconds to the "resuming" line of the restart after `--early-s`.
    pub restart_early_s: f64,
    /// Seconds to the "resuming" line of the restart after the soak.
    pub restart_s: f64,
    /// The late restart's log line (groups recovered, WAL records read).
    pub restart_line: String,
    /// Milliseconds the early restart spent in recovery (the run directory's WAL, record and
    /// checkpoint), as the daemon measured it: start-up without the process's own start.
    pub recovery_early_ms: f64,
    /// The same for the late restart.
    pub recovery_ms: f64,
    /// Medians of the `--restart-pairs` fresh starts and restarts (s), and restart / fresh.
    pub pairs_fresh_s: f64,
    /// See `pairs_fresh_s`.
    pub pairs_restart_s: f64,
    /// See `pairs_fresh_s`.
    pub pairs_ratio: f64,
    /// Every pair's (fresh, restart) seconds.
    pub pairs: Vec<(f64, f64)>,
    /// How the soak's daemon ended after SIGINT.
    pub ended: String,
    /// Every sample.
    pub samples: Vec<Sample>,
}

/// Runs the soak with the flags.
pub fn run_cmd(args: &Args) -> CmdResult {
    run(args).map_err(failure)?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// The daemon's resident memory (bytes), from /proc.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `accepted_total` of metrics.jsonl's last complete line (read from the live file's tail; 0
/// when it has none, as just after a rotation).
fn accepted_groups(metrics: &Path) -> u64 {
    let Ok(mut f) = std::fs::File::open(metrics) else {
        return 0;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(256 << 10);
    if f.seek(SeekFrom::Start(from)).is_err() {
        return 0;
    }
    let mut text = String::new();
    if f.read_to_string(&mut text).is_err() {
        return 0;
    }
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .and_then(|v| v["accepted_total"].as_u64())
        .unwrap_or(0)
}

/// Spawns `kevin train` on `run_dir` (with `config`, or the stored one) logging to `log`.
fn spawn(exe: &Path, config: Option<&Path>, run_dir: &Path, log: &Path) -> Result<Child, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("train").arg("--run-dir").arg(run_dir);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{}: {e}", exe.display()))
}

/// Waits for a log line containing `needle`; returns the seconds since `t0` and the line.
fn wait_for_line(
    child: &mut Child,
    log: &Path,
    needle: &str,
    t0: Instant,
) -> Result<(f64, String), String> {
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return Ok((t0.elapsed().as_secs_f64(), line.to_owned()));
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(early_exit(status, log)
                .map(|s| format!("kevin train {s} before logging {needle:?}"))
                .unwrap_or_else(|e| e));
        }
        if t0.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            return Err(format!(
                "no {needle:?} line in {} after 600 s",
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The `recovery_ms=` figure of a "resuming" line (0 when absent).
fn recovery_ms(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("recovery_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Seconds from spawning `kevin train` to the line `needle`; the process is then killed.
fn time_start(
    exe: &Path,
    config: Option<&Path>,
    run_dir: &Path,
    log: &Path,
    needle: &str,
) -> Result<f64, String> {
    let t = Instant::now();
    let mut child = spawn(exe, config, run_dir, log)?;
    let got = wait_for_line(&mut child, log, needle, t);
    let _ = child.kill();
    let _ = child.wait();
    Ok(got?.0)
}

/// `pairs` alternating (fresh start, restart) times: the fresh one on a new run directory beside
/// the logs, the restart on `run_dir`.
fn restart_pairs(
    exe: &Path,
    config: &Path,
    run_dir: &Path,
    dir: &Path,
    pairs: usize,
) -> Result<Vec<(f64, f64)>, String> {
    let fresh_dir = dir.join("fresh");
    let mut out = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        if fresh_dir.exists() {
            std::fs::remove_dir_all(&fresh_dir)
                .map_err(|e| format!("{}: {e}", fresh_dir.display()))?;
        }
        let fresh = time_start(
            exe,
            Some(config),
            &fresh_dir,
            &dir.join("pair-fresh.log"),
            "starting a new run",
        )?;
        let restart = time_start(
            exe,
            None,
            run_dir,
            &dir.join("pair-restart.log"),
            "resuming",
        )?;
        out.push((fresh, restart));
    }
    let _ = std::fs::remove_dir_all(&fresh_dir);
    Ok(out)
}

/// Runs the soak; see the module docs.
pub fn run(args: &Args) -> Result<SoakReport, String> {
    if !(args.sample_s.is_finite() && args.sample_s > 0.0) {
        return Err(format!("--sample-s {}: must be above 0", args.sample_s));
    }
    if !(args.hours.is_finite() && args.hours > 0.0) {
        return Err(format!("--hours {}: must be above 0", args.hours));
    }
    if !(0.0..1.0).contains(&args.warmup_frac) {
        return Err(format!(
            "--warmup-frac {}: must be at least 0 and below 1",
            args.warmup_frac
        ));
    }
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let config = Config::load(Some(&args.config), &vars).map_err(|e| e.to_string())?;
    let per_group = u64::from(config.rollout.trajectories) * u64::from(config.rollout.turns);
    let budget_mb = config.run.max_disk_gb * 1e3;
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let run_dir = args.dir.join("run");
    let exe = kevin::worker::own_binary().map_err(|e| format!("the kevin binary: {e}"))?;

    let log = args.dir.join("train.log");
    let t0 = Instant::now();
    let mut first = spawn(&exe, Some(&args.config), &run_dir, &log)?;
    let (start_fresh_s, _) = wait_for_line(&mut first, &log, "starting a new run", t0)?;
    eprintln!(
        "soak: {} turns or {} h, a sample every {} s, in {}; restarting after {} s",
        args.turns,
        args.hours,
        args.sample_s,
        run_dir.display(),
        args.early_s
    );
    let early = Duration::from_secs_f64(args.early_s.max(0.0));
    while t0.elapsed() < early {
        if let Some(status) = first.try_wait().map_err(|e| e.to_string())? {
            early_exit(status, &log)?;
            return Err(format!("kevin train exited early; see {}", log.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    interrupt(&first);
    wait_or_kill(&mut first, Duration::from_secs(600));
    let log = args.dir.join("train-2.log");
    let t1 = Instant::now();
    let mut child = spawn(&exe, None, &run_dir, &log)?;
    let (restart_early_s, early_line) = wait_for_line(&mut child, &log, "resuming", t1)?;

    let deadline = args.hours * 3600.0;
    let metrics = run_dir.join(crate::cmd::report::METRICS_FILE);
    let wal_dir = run_dir.join(kevin::wal::WAL_DIR);
    let mut samples: Vec<Sample> = Vec::new();
    let mut next = 0.0;
    let mut next_progress = 0.0;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            early_exit(status, &log)?;
            return Err(format!(
                "kevin train exited before the soak ended; see {}",
                log.display()
            ));
        }
        let t = t0.elapsed().as_secs_f64();
        if t >= next {
            // Just after metrics.jsonl rotates its live file has no line yet: keep the last count.
            let last = samples.last().map_or(0, |s| s.turns);
            let turns = (accepted_groups(&metrics) * per_group).max(last);
            let sample = Sample {
                t_s: t,
                turns,
                rss_mb: mb(rss_bytes(child.id()).unwrap_or(0)),
                run_dir_mb: mb(files::dir_bytes(&run_dir).unwrap_or(0)),
                wal_mb: mb(files::dir_bytes(&wal_dir).unwrap_or(0)),
            };
            if t >= next_progress {
                eprintln!(
                    "soak: {:.0} s, {} turns, RSS {:.0} MB, run directory {:.0} MB (WAL {:.1} MB)",
                    sample.t_s, sample.turns, sample.rss_mb, sample.run_dir_mb, sample.wal_mb
                );
                let _ = std::io::stderr().flush();
                next_progress = t + 60.0;
            }
            samples.push(sample);
            next = t + args.sample_s;
            if turns >= args.turns || t >= deadline {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let seconds = t0.elapsed().as_secs_f64();
    interrupt(&child);
    let ended = wait_or_kill(&mut child, Duration::from_secs(600));
    eprintln!("soak: stopped ({ended}); restarting on the same run directory");

    let relog = args.dir.join("restart.log");
    let t1 = Instant::now();
    let mut again = spawn(&exe, None, &run_dir, &relog)?;
    let (restart_s, restart_line) = wait_for_line(&mut again, &relog, "resuming", t1)?;
    interrupt(&again);
    wait_or_kill(&mut again, Duration::from_secs(600));
    if args.restart_pairs > 0 {
        eprintln!(
            "soak: timing {} alternating fresh starts and restarts",
            args.restart_pairs
        );
    }
    let pairs = restart_pairs(&exe, &args.config, &run_dir, &args.dir, args.restart_pairs)?;
    let median_of = |pick: fn(&(f64, f64)) -> f64| {
        super::median(&mut pairs.iter().map(pick).collect::<Vec<_>>()).unwrap_or(0.0)
    };
    let (pairs_fresh_s, pairs_restart_s) = (median_of(|p| p.0), median_of(|p| p.1));

    let last = samples.last().cloned().ok_or("no sample was taken")?;
    // The first sample is taken as the restarted daemon logs "resuming", before it has done any
    // work: warm-up always excludes it.
    let warm = ((samples.len() as f64 * args.warmup_frac) as usize)
        .max(1)
        .min(samples.len() - 1);
    let rss_warm_mb = samples[warm].rss_mb;
    let rss_max_mb = samples[warm..].iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let after = &samples[warm..];
    let quarter = (after.len() / 4).max(1);
    let mean = |xs: &[Sample]| xs.iter().map(|s| s.rss_mb).sum::<f64>() / xs.len().max(1) as f64;
    let (first_q, last_q) = (
        mean(&after[..quarter]),
        mean(&after[after.len() - quarter..]),
    );
    let report = SoakReport {
        config: args.config.clone(),
        early_s: args.early_s,
        turns: last.turns,
        seconds,
        turns_per_s: last.turns as f64 / seconds,
        rss_warm_mb,
        rss_last_mb: last.rss_mb,
        rss_max_mb,
        rss_growth_pct: if rss_warm_mb > 0.0 {
            (rss_max_mb / rss_warm_mb - 1.0) * 100.0
        } else {
            0.0
        },
        rss_trend_pct: if first_q > 0.0 {
            (last_q / first_q - 1.0) * 100.0
        } else {
            0.0
        },
        run_dir_mb: mb(files::dir_bytes(&run_dir).unwrap_or(0)),
        run_dir_max_mb: samples.iter().map(|s| s.run_dir_mb).fold(0.0, f64::max),
        budget_mb,
        wal_mb: mb(files::dir_bytes(&wal_dir).unwrap_or(0)),
        wal_segments: kevin::wal::segments(&wal_dir).map(|s| s.len()).unwrap_or(0),
        archives: files::archives(&run_dir).map(|a| a.len()).unwrap_or(0),
        start_fresh_s,
        restart_early_s,
        restart_s,
        recovery_early_ms: recovery_ms(&early_line),
        recovery_ms: recovery_ms(&restart_line),
        restart_line: restart_line
            .split_once("resuming")
            .map_or(restart_line.clone(), |(_, rest)| rest.trim().to_owned()),
        pairs_fresh_s,
        pairs_restart_s,
        pairs_ratio: pairs_restart_s / pairs_fresh_s.max(1e-9),
        pairs,
        ended,
        samples,
    };
    crate::cmd::emit_report(
        &markdown(&report),
        args.out.as_deref(),
        args.json.as_deref(),
        &report,
    )?;
    Ok(report)
}

/// The report as markdown: the summary, then about twenty samples.
pub fn markdown(r: &SoakReport) -> String {
    let mut s = format!(
        "## Soak: {}\n\n\
         | measurement | value |\n|---|---|\n\
         | turns | {} in {:.0} s ({:.0} turns/s) |\n\
         | RSS after warm-up / last / highest after warm-up | {:.0} / {:.0} / {:.0} MB ({:+.1}%) |\n\
         | RSS trend after warm-up (last quarter's mean over the first's) | {:+.1}% |\n\
         | run directory at the end / highest sample / budget | {:.0} / {:.0} / {} MB |\n\
         | write-ahead log at the end | {:.1} MB in {} segments |\n\
         | rotated archives at the end | {} |\n\
         | start of the fresh run / restart after {:.0} s / restart after the soak | {:.3} s / {:.3} s / {:.3} s (late / early {:.2}x) |\n\
         | recovery inside the daemon, after {:.0} s / after the soak | {:.1} ms / {:.1} ms |\n\
         | the restart's recovery | {} |\n\
         | {} alternating fresh starts / restarts (medians) | {:.4} s / {:.4} s (restart / fresh {:.2}x) |\n\n\
         | t (s) | turns | RSS (MB) | run directory (MB) | WAL (MB) |\n|---|---|---|---|---|\n",
        r.config.display(),
        r.turns,
        r.seconds,
        r.turns_per_s,
        r.rss_warm_mb,
        r.rss_last_mb,
        r.rss_max_mb,
        r.rss_growth_pct,
        r.rss_trend_pct,
        r.run_dir_mb,
        r.run_dir_max_mb,
        if r.budget_mb > 0.0 {
            format!("{:.0}", r.budget_mb)
        } else {
            "none".to_owned()
        },
        r.wal_mb,
        r.wal_segments,
        r.archives,
        r.early_s,
        r.start_fresh_s,
        r.restart_early_s,
        r.restart_s,
        r.restart_s / r.restart_early_s.max(1e-9),
        r.early_s,
        r.recovery_early_ms,
        r.recovery_ms,
        r.restart_line,
        r.pairs.len(),
        r.pairs_fresh_s,
        r.pairs_restart_s,
        r.pairs_ratio,
    );
    let every = r.samples.len().div_ceil(20).max(1);
    for (i, x) in r.samples.iter().enumerate() {
        if i % every == 0 || i + 1 == r.samples.len() {
            s += &format!(
                "| {:.0} | {} | {:.0} | {:.1} | {:.2} |\n",
                x.t_s, x.turns, x.rss_mb, x.run_dir_mb, x.wal_mb
            );
        }
    }
    s
}
