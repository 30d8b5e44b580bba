//! `kevin bench gpu`: the GPU harness's own figures on one machine (issue 4):
//!
//! - compile latency: NVRTC to a CUBIN in the compile pool, per reference solution (compare with
//!   torch's `load_inline`, timed by benches/torch_eager.py in the same device call);
//! - evaluation throughput: level-1 reference solutions evaluated end to end (compile, verify,
//!   profile) one at a time and by concurrent clients for a fixed time, through the pools the
//!   daemon uses, with the mean time of every phase of a GPU request;
//! - timing repeatability: one kernel evaluated `repeat` times; coefficient of variation of its
//!   speedup;
//! - worker replacement: kernels that fault with an illegal address, each followed by a valid
//!   evaluation that must succeed; the replacement latency from the pool's statistics.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kevin::env::cuda::CudaEnv;
use kevin::env::CudaEnvConfig;
use kevin::env::{evaluate, KernelEnv};
use kevin::outcome::Outcome;
use kevin::tasks::TaskSuite;

use crate::cmd::{failure, write_json, CmdResult};

/// The flags of `kevin bench gpu`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds of the throughput run.
    #[arg(long, default_value_t = 30.0)]
    pub seconds: f64,
    /// Evaluations of the repeatability kernel.
    #[arg(long, default_value_t = 10)]
    pub repeat: usize,
    /// Task whose reference solution is evaluated repeatedly.
    #[arg(long, default_value = "softmax")]
    pub task: String,
    /// GPU worker processes.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Concurrent evaluations in the throughput run.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Illegal-address faults to inject.
    #[arg(long, default_value_t = 5)]
    pub faults: usize,
    /// The task suite's folder, or several joined by `:` (e.g. `tasks:/data/gen`).
    #[arg(long, default_value = "tasks")]
    pub dir: PathBuf,
    /// Also write the results as markdown to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark with the flags.
pub fn run(args: &Args) -> CmdResult {
    bench(args).map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}

const ILLEGAL: &str = "// Writes through a forged pointer: an illegal address.\n\
// kevin: launch relu grid=(cdiv(M*N,256)) block=(256) args=(X, Y, M*N)\n\
__global__ void relu(const float* __restrict__ X, float* __restrict__ Y, int n) {\n\
    int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
    if (i < n) ((float*)0x10)[i] = X[i];\n\
}\n";

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn speedup(o: &Outcome) -> Option<f64> {
    match o {
        Outcome::Correct {
            kernel_ms,
            baseline_ms,
            ..
        } => Some(baseline_ms / kernel_ms),
        _ => None,
    }
}

/// Runs the benchmark and prints (and optionally writes) the report.
pub fn bench(args: &Args) -> Result<(), String> {
    let suite = TaskSuite::load(&args.dir).map_err(|e| format!("task suite: {e}"))?;
    let exe = kevin::worker::own_binary().map_err(|e| format!("locating the kevin binary: {e}"))?;
    let cfg = CudaEnvConfig {
        workers_per_gpu: args.workers,
        ..CudaEnvConfig::default()
    };
    let started = Instant::now();
    let env = CudaEnv::new(Arc::new(suite.clone()), &args.dir, exe, &cfg)?;
    let setup_s = started.elapsed().as_secs_f64();
    eprintln!(
        "kevin bench gpu: {} (set-up {setup_s:.1} s)",
        env.describe()
    );
    let solution = |task: &str| -> Result<String, String> {
        let p = args.dir.join("solutions").join(format!("{task}.cu"));
        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let level1: Vec<(String, String)> = suite
        .level(1)
        .filter_map(|t| solution(&t.name).ok().map(|s| (t.name.clone(), s)))
        .collect();

    // 1. Compile latency over every level-1 solution.
    let mut compile_ms = Vec::new();
    for (task, src) in &level1 {
        match env.compile(task, src) {
            Ok(c) => compile_ms.push(c.compile_ms),
            Err(o) => return Err(format!("{task} does not compile: {}", o.feedback())),
        }
    }
    let compile_median = median(&mut compile_ms.clone());
    let compile_max = compile_ms.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "compile: median {compile_median:.1} ms over {} kernels",
        compile_ms.len()
    );

    // 2a. Where one evaluation's time goes: every level-1 solution once, one at a time.
    env.reset_phase_stats();
    let t_serial = Instant::now();
    for (task, src) in &level1 {
        let o = evaluate(&env, task, src);
        if !o.is_correct() {
            return Err(format!("{task}: {}", o.feedback()));
        }
    }
    let serial_per_s = level1.len() as f64 / t_serial.elapsed().as_secs_f64();
    let serial_phases = env.phase_stats();
    eprintln!("serial: {serial_per_s:.1} candidates/s");

    // 2b. Throughput: clients evaluate level-1 solutions round-robin for `seconds`.
    env.reset_phase_stats();
    let stop = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let wrong = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..args.clients.max(1) {
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst) % level1.len();
                    let (task, src) = &level1[i];
                    let o = evaluate(&env, task, src);
                    if !o.is_correct() {
                        wrong
                            .lock()
                            .expect("wrong")
                            .push(format!("{task}: {}", o.feedback()));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        while t0.elapsed().as_secs_f64() < args.seconds {
            std::thread::sleep(Duration::from_millis(500));
            eprint!(
                "\rthroughput: {} evaluations in {:.0} s",
                done.load(Ordering::SeqCst),
                t0.elapsed().as_secs_f64()
            );
        }
        stop.store(true, Ordering::SeqCst);
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let evaluations = done.load(Ordering::SeqCst);
    let per_s = evaluations as f64 / elapsed;
    eprintln!();
    let wrong = wrong.into_inner().expect("wrong");
    let busy_phases = env.phase_stats();

    // 3. Repeatability of one kernel's speedup.
    let src = solution(&args.task)?;
    let mut speedups = Vec::new();
    for i in 0..args.repeat {
        let o = evaluate(&env, &args.task, &src);
        match speedup(&o) {
            Some(s) => speedups.push(s),
            None => return Err(format!("{} evaluation {i}: {}", args.task, o.feedback())),
        }
    }
    let mean = speedups.iter().sum::<f64>() / speedups.len().max(1) as f64;
    let sd = (speedups.iter().map(|s| (s - mean).powi(2)).sum::<f64>()
        / (speedups.len().max(2) - 1) as f64)
        .sqrt();
    let cv = sd / mean;

    // 4. Faults and replacement.
    let before = env.gpu_pool_stats()[0].clone();
    let relu = solution("relu")?;
    let mut fault_kinds = Vec::new();
    let mut after_ok = 0;
    for _ in 0..args.faults {
        let o = evaluate(&env, "relu", ILLEGAL);
        fault_kinds.push(o.kind());
        if evaluate(&env, "relu", &relu).is_correct() {
            after_ok += 1;
        }
    }
    let after = env.gpu_pool_stats()[0].clone();
    let replaced = (after.respawns - before.respawns) as u32;
    let respawn_mean_ms = if replaced > 0 {
        (after.respawn_latency_total - before.respawn_latency_total).as_secs_f64() * 1e3
            / f64::from(replaced)
    } else {
        f64::NAN
    };
    let crashes = fault_kinds.iter().filter(|k| **k == "crash").count();

    let mut report = String::new();
    report += "| figure | value |\n| --- | --- |\n";
    report += &format!("| GPU environment set-up (compile harness + baseline, start {} workers) | {setup_s:.1} s |\n", args.workers);
    report += &format!("| NVRTC compile to CUBIN, level-1 solutions (median / max) | {compile_median:.1} ms / {compile_max:.1} ms |\n");
    report += &format!(
        "| throughput, level-1 solutions end to end ({} clients, {:.0} s) | {per_s:.1} candidates/s ({evaluations} evaluations, {} not correct) |\n",
        args.clients,
        elapsed,
        wrong.len()
    );
    report += &format!(
        "| repeatability: `{}` evaluated {} times, speedup mean / CV | {mean:.3}x / {:.2}% |\n",
        args.task,
        speedups.len(),
        cv * 100.0
    );
    report += &format!(
        "| illegal-address faults: crash outcomes / next evaluation correct | {crashes}/{} / {after_ok}/{} |\n",
        args.faults, args.faults
    );
    report += &format!(
        "| workers replaced, mean replacement time | {replaced}, {respawn_mean_ms:.0} ms |\n"
    );
    report += &format!(
        "| level-1 solutions one at a time (1 client) | {serial_per_s:.1} candidates/s |\n"
    );
    report += "\nMean ms per request and phase (`lock_wait`: waiting for the GPU lock; `transport`: the round trip minus the worker's own time; `release`: freeing the request's buffers):\n\n";
    report += "| phase | one at a time | throughput run |\n| --- | --- | --- |\n";
    for (name, n, ms) in &serial_phases {
        let busy = busy_phases
            .iter()
            .find(|p| &p.0 == name)
            .map_or("-".to_string(), |p| format!("{:.2} ms ({}x)", p.2, p.1));
        report += &format!("| {name} | {ms:.2} ms ({n}x) | {busy} |\n");
    }
    println!("{report}");
    for w in wrong.iter().take(5) {
        println!("not correct during the throughput run: {w}");
    }
    if let Some(out) = &args.out {
        let text = format!(
            "# kevin bench gpu\n\nCommand: `kevin bench gpu --seconds {} --repeat {} --task {} --workers {} --clients {} --faults {}`\n\
             Date: {}\nDevice: {}\n\n{report}",
            args.seconds,
            args.repeat,
            args.task,
            args.workers,
            args.clients,
            args.faults,
            kevin::clock::utc_minute(),
            env.describe()
        );
        std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    if let Some(path) = &args.json {
        let phases = |p: &[(String, u64, f64)]| -> Vec<serde_json::Value> {
            p.iter()
                .map(
                    |(name, n, ms)| serde_json::json!({ "phase": name, "count": n, "mean_ms": ms }),
                )
                .collect()
        };
        let figures = serde_json::json!({
            "device": env.describe(),
            "date": kevin::clock::utc_minute(),
            "setup_s": setup_s,
            "workers": args.workers,
            "compile_ms_median": compile_median,
            "compile_ms_max": compile_max,
            "throughput": {
                "clients": args.clients,
                "seconds": elapsed,
                "evaluations": evaluations,
                "candidates_per_s": per_s,
                "not_correct": wrong.len(),
            },
            "serial_candidates_per_s": serial_per_s,
            "repeatability": {
                "task": args.task,
                "evaluations": speedups.len(),
                "speedup_mean": mean,
                "speedup_cv": cv,
            },
            "faults": {
                "injected": args.faults,
                "crash_outcomes": crashes,
                "next_correct": after_ok,
                "workers_replaced": replaced,
                "replacement_mean_ms": respawn_mean_ms,
            },
            "phases_serial": phases(&serial_phases),
            "phases_throughput": phases(&busy_phases),
        });
        write_json(path, &figures)?;
    }
    if crashes != args.faults || after_ok != args.faults {
        return Err("a fault was not reported as a crash or a replacement worker failed".into());
    }
    Ok(())
}
