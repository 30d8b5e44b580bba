//! `kevin bench remote`: what evaluating through NATS JetStream costs, against the local pool
//! on the same machine, measured side by side in one run.
//!
//! The same reference solutions (of the suite's tasks with one in `solutions/`) are evaluated by
//! the local environment of `--backend` and by the `remote` environment with `--nodes`
//! `kevin worker-node` processes of that backend on this machine: first `--sequential` one at a
//! time (each evaluation's latency), then `--jobs` with `--concurrency` at once (throughput).
//! Both get `--workers` worker processes in all (split over the nodes). With `--backend sim` an
//! evaluation costs nothing on either side, so the remote latency is the bus's own: publish,
//! delivery to a node, the node's result stored, then delivered back. Without `--nats` the
//! bench starts a nats-server of its own on loopback ([`crate::remote::server`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use kevin::config::RemoteEnvSection;
use kevin::env::{evaluate, Deadlines, EnvSpec, KernelEnv};
use kevin::tasks::{Preset, TaskSuite};

use crate::cmd::{failure, workers_or_cores, CmdResult};
use crate::remote::node::sim_no_cost;
use crate::remote::server::{self, LocalNatsServer};
use crate::remote::RemoteEnv;

/// `kevin bench remote` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// "cpu" (the CPU execution backend on both sides) or "sim" (simulated verdicts at no cost:
    /// the bus alone).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "sim"])]
    pub backend: String,
    /// NATS server URL (no credentials); default: a nats-server of the bench's own on loopback.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// Worker nodes (`kevin worker-node` processes on this machine).
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Worker processes in all: the local pool's, and the nodes' together (default: the cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Evaluations one at a time, for the latency.
    #[arg(long, default_value_t = 20)]
    pub sequential: usize,
    /// Evaluations of the throughput run.
    #[arg(long, default_value_t = 40)]
    pub jobs: usize,
    /// Evaluations at once in the throughput run.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// The task suite's folder (reference solutions in its `solutions/`).
    #[arg(long, default_value = "tasks")]
    pub dir: PathBuf,
    /// Also write the results as markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One side's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Latency of the sequential evaluations (ms): median, 90th percentile, mean.
    pub latency_median_ms: f64,
    /// 90th percentile (ms).
    pub latency_p90_ms: f64,
    /// Mean (ms).
    pub latency_mean_ms: f64,
    /// Evaluations per second with `concurrency` at once.
    pub jobs_per_s: f64,
    /// Outcome kinds of the sequential evaluations, in order.
    pub outcomes: Vec<String>,
}

/// What `kevin bench remote` measured.
#[derive(Debug, Clone, Serialize)]
pub struct RemoteReport {
    /// The backend on both sides.
    pub backend: String,
    /// Worker nodes.
    pub nodes: usize,
    /// Worker processes in all.
    pub workers: usize,
    /// Sequential evaluations per side.
    pub sequential: usize,
    /// Throughput evaluations per side, and how many at once.
    pub jobs: usize,
    /// At once.
    pub concurrency: usize,
    /// The local pool.
    pub local: Side,
    /// Through the bus.
    pub remote: Side,
    /// Remote minus local median latency (ms): what the bus adds to one evaluation.
    pub added_latency_ms: f64,
    /// Remote over local throughput.
    pub throughput_ratio: f64,
    /// Sequential evaluations whose outcome kind differed between the sides (cpu only; the
    /// simulated verdicts are random).
    pub outcome_mismatches: usize,
    /// The remote environment's counters at the end.
    pub remote_stats: String,
}

/// Runs the benchmark and prints (and writes) its report.
pub fn run_cmd(args: &Args) -> CmdResult {
    run(args).map_err(failure)?;
    Ok(std::process::ExitCode::SUCCESS)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// `sequential` evaluations one at a time, then `jobs` with `concurrency` at once.
fn measure(env: &Arc<dyn KernelEnv>, cases: &[(String, String)], args: &Args) -> Side {
    let mut lat = Vec::with_capacity(args.sequential);
    let mut outcomes = Vec::with_capacity(args.sequential);
    for i in 0..args.sequential {
        let (task, source) = &cases[i % cases.len()];
        let t0 = Instant::now();
        let o = evaluate(env.as_ref(), task, source);
        lat.push(t0.elapsed().as_secs_f64() * 1e3);
        outcomes.push(o.kind().to_string());
    }
    let mean = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    lat.sort_by(f64::total_cmp);
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..args.concurrency.max(1) {
            let next = next.clone();
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.jobs {
                    break;
                }
                let (task, source) = &cases[i % cases.len()];
                evaluate(env.as_ref(), task, source);
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    Side {
        latency_median_ms: percentile(&lat, 0.5),
        latency_p90_ms: percentile(&lat, 0.9),
        latency_mean_ms: mean,
        jobs_per_s: args.jobs as f64 / wall.max(1e-9),
        outcomes,
    }
}

/// The worker nodes, killed when dropped.
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the benchmark.
pub fn run(args: &Args) -> Result<RemoteReport, String> {
    let workers = workers_or_cores(args.workers).max(args.nodes).max(1);
    let nodes = args.nodes.max(1);
    let suite =
        Arc::new(TaskSuite::load(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?);
    let solutions = args.dir.join("solutions");
    let mut cases = Vec::new();
    for task in suite.tasks() {
        if let Ok(source) = std::fs::read_to_string(solutions.join(format!("{}.cu", task.name))) {
            cases.push((task.name.clone(), source));
        }
    }
    if cases.is_empty() {
        return Err(format!("no reference solution in {}", solutions.display()));
    }
    cases.sort();
    let deadlines = Deadlines::default();
    let tmp = std::env::temp_dir().join(format!("kevin-bench-remote-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let local_nats;
    let url = match &args.nats {
        Some(url) => url.clone(),
        None => {
            if let Some(why) = server::missing() {
                return Err(format!("{why}; or give --nats URL"));
            }
            local_nats = LocalNatsServer::start(&tmp.join("nats"), "")?;
            local_nats.url()
        }
    };
    let spec = match args.backend.as_str() {
        "sim" => EnvSpec::Simulated(sim_no_cost()),
        b => EnvSpec::for_command(Some(b), workers, deadlines)?,
    };
    eprintln!(
        "bench remote: {} backend, {} worker processes; the local pool, then {nodes} node(s) \
         through {url}",
        args.backend, workers
    );
    let local: Arc<dyn KernelEnv> = kevin::env::build(spec, Some(&suite), &args.dir)?;
    // Warm: every task's first evaluation builds what the pools keep.
    for (task, source) in &cases {
        evaluate(local.as_ref(), task, source);
    }
    let local_side = measure(&local, &cases, args);
    drop(local);
    eprintln!(
        "bench remote: local {:.1} ms median, {:.2} jobs/s",
        local_side.latency_median_ms, local_side.jobs_per_s
    );

    let exe = kevin::worker::own_binary().map_err(|e| format!("the kevin binary: {e}"))?;
    let prefix = format!("bench{}", std::process::id());
    let per_node = workers.div_ceil(nodes);
    let mut children = Nodes(Vec::new());
    for i in 0..nodes {
        let log_path = tmp.join(format!("node-{i}.log"));
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(&exe)
            .args(["worker-node", "--nats", &url, "--prefix", &prefix])
            .args(["--backend", &args.backend, "--name", &format!("bench-{i}")])
            .args(["--workers", &per_node.to_string()])
            .arg("--cache")
            .arg(tmp.join(format!("cache-{i}")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting kevin worker-node: {e}"))?;
        children.0.push(child);
    }
    let section = RemoteEnvSection {
        url: url.clone(),
        prefix,
        max_inflight: (args.concurrency.max(workers) as u32).max(1),
        job_timeout_ms: 300_000,
        ack_wait_ms: 120_000,
        ..RemoteEnvSection::default()
    };
    let remote = Arc::new(RemoteEnv::start(
        &section,
        Preset::Small,
        deadlines,
        suite.clone(),
        &args.dir,
    )?);
    let env: Arc<dyn KernelEnv> = remote.clone();
    // Warm: the nodes fetch the suite and build their pools; every node gets work.
    std::thread::scope(|s| {
        for i in 0..cases.len().max(2 * nodes) {
            let (env, case) = (env.clone(), &cases[i % cases.len()]);
            s.spawn(move || evaluate(env.as_ref(), &case.0, &case.1));
        }
    });
    let remote_side = measure(&env, &cases, args);
    drop(children);
    let outcome_mismatches = match args.backend.as_str() {
        "sim" => 0,
        _ => (local_side.outcomes.iter())
            .zip(&remote_side.outcomes)
            .filter(|(a, b)| a != b)
            .count(),
    };
    let report = RemoteReport {
        backend: args.backend.clone(),
        nodes,
        workers,
        sequential: args.sequential,
        jobs: args.jobs,
        concurrency: args.concurrency,
        added_latency_ms: remote_side.latency_median_ms - local_side.latency_median_ms,
        throughput_ratio: remote_side.jobs_per_s / local_side.jobs_per_s.max(1e-12),
        local: local_side,
        remote: remote_side,
        outcome_mismatches,
        remote_stats: format!("{:?}", remote.stats()),
    };
    drop(env);
    drop(remote);
    let _ = std::fs::remove_dir_all(&tmp);
    crate::cmd::emit_report(
        &markdown(&report),
        args.out.as_deref(),
        args.json.as_deref(),
        &report,
    )?;
    if report.outcome_mismatches > 0 {
        return Err(format!(
            "{} of {} evaluations judged differently through the bus",
            report.outcome_mismatches, report.sequential
        ));
    }
    Ok(report)
}

/// The report as markdown.
pub fn markdown(r: &RemoteReport) -> String {
    format!(
        "## Remote evaluation against the local pool ({} backend)\n\n\
         {} worker processes on each side ({} node(s)); {} evaluations one at a time, then {} \
         with {} at once.\n\n\
         | measurement | local pool | through NATS | remote - local |\n|---|---|---|---|\n\
         | latency median (ms) | {:.2} | {:.2} | {:+.2} |\n\
         | latency p90 (ms) | {:.2} | {:.2} | {:+.2} |\n\
         | latency mean (ms) | {:.2} | {:.2} | {:+.2} |\n\
         | throughput (evaluations/s) | {:.2} | {:.2} | {:.2}x |\n\n\
         Outcome kinds that differed: {}. Remote counters: {}.\n",
        r.backend,
        r.workers,
        r.nodes,
        r.sequential,
        r.jobs,
        r.concurrency,
        r.local.latency_median_ms,
        r.remote.latency_median_ms,
        r.added_latency_ms,
        r.local.latency_p90_ms,
        r.remote.latency_p90_ms,
        r.remote.latency_p90_ms - r.local.latency_p90_ms,
        r.local.latency_mean_ms,
        r.remote.latency_mean_ms,
        r.remote.latency_mean_ms - r.local.latency_mean_ms,
        r.local.jobs_per_s,
        r.remote.jobs_per_s,
        r.throughput_ratio,
        r.outcome_mismatches,
        r.remote_stats,
    )
}
