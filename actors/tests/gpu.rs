//! The GPU harness on a real GPU, with the real worker processes. Skipped unless
//! `KEVIN_GPU_TESTS=1` (there is no GPU in CI); run on the lent H200 as described in the README.
//!
//! - the eager baseline agrees with the fp64 interpreter on every task of the suite (small preset;
//!   GPU preset for every task without a matrix product, whose fp64 reference would take
//!   minutes), on every baseline fixture (tests/data/baseline: each operation and input
//!   distribution) and on the tasks of any folder in `KEVIN_GPU_TEST_TASKS` (small preset);
//! - a sample of reference solutions is correct, with CUDA timings (all of them: `kevin eval`);
//! - the protocol cases of tests/data/cpu get the right outcome on the GPU too (not the race: on
//!   a GPU whether a missing barrier shows is a matter of scheduling; tests/data/hacks has races
//!   built to show);
//! - a kernel that faults with an illegal address poisons only its worker, which is replaced, and
//!   the next evaluation succeeds; a kernel that never ends is timed out and replaced.

mod common;

use std::sync::Arc;

use kevin::env::cuda::CudaEnv;
use kevin::env::evaluate;
use kevin::env::CudaEnvConfig;
use kevin::outcome::Outcome;
use kevin::tasks::{Preset, TaskSuite};

use common::{bin, gpu_tests, root};

fn gpu_on() -> bool {
    let on = gpu_tests();
    if !on {
        eprintln!("skipping: set KEVIN_GPU_TESTS=1 on a machine with a GPU");
    }
    on
}

fn env(cfg: CudaEnvConfig) -> CudaEnv {
    env_over(&root().join("tasks"), cfg)
}

/// A cuda environment over the tasks of `dir`.
fn env_over(dir: &std::path::Path, cfg: CudaEnvConfig) -> CudaEnv {
    let suite = Arc::new(TaskSuite::load(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())));
    // KEVIN_BIN: the binary's path when the test runs on another machine than it was built on.
    let program = bin();
    CudaEnv::new(suite, dir, program, &cfg).expect("cuda environment")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap()
}

/// The folders whose tasks the baseline is checked on: the suite, the baseline fixtures (every
/// operation and input distribution of the op language, in each dtype), and any folders named in
/// `KEVIN_GPU_TEST_TASKS` (colon-separated, e.g. a `kevin tasks import-kernelbench` output). The
/// suite is checked at both presets (the GPU preset without matrix products, whose fp64 reference
/// would take minutes), the others at the small preset.
fn baseline_folders() -> Vec<(std::path::PathBuf, bool)> {
    let mut dirs = vec![
        (root().join("tasks"), true),
        (root().join("tests/data/baseline"), false),
    ];
    if let Ok(extra) = std::env::var("KEVIN_GPU_TEST_TASKS") {
        dirs.extend(
            extra
                .split(':')
                .filter(|d| !d.is_empty())
                .map(|d| (d.into(), false)),
        );
    }
    dirs
}

#[test]
fn baseline_matches_the_interpreter_on_every_task() {
    if !gpu_on() {
        return;
    }
    let workers = 8;
    let mut failures = Vec::new();
    let mut checked = 0;
    for (dir, gpu_preset) in baseline_folders() {
        let env = env_over(
            &dir,
            CudaEnvConfig {
                workers_per_gpu: workers,
                compile_workers: 1,
                verify_timeout_ms: 600_000,
                ..CudaEnvConfig::default()
            },
        );
        let suite = TaskSuite::load(&dir).unwrap();
        let mut jobs = Vec::new();
        for t in suite.tasks() {
            jobs.push((t.name.clone(), Preset::Small));
            if gpu_preset && !t.source.contains('@') {
                jobs.push((t.name.clone(), Preset::Gpu));
            }
        }
        checked += jobs.len();
        failures.extend(check_baselines(&env, &jobs, workers));
    }
    assert!(checked > 0, "no task was checked");
    assert!(
        failures.is_empty(),
        "baseline failures:\n{}",
        failures.join("\n")
    );
}

/// Checks the baseline of each (task, preset) against the fp64 interpreter with `workers`
/// requests in flight; the failures, one line each.
fn check_baselines(env: &CudaEnv, jobs: &[(String, Preset)], workers: usize) -> Vec<String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some((task, preset)) = jobs.get(i) else {
                    break;
                };
                let r = env.check_baseline(task, *preset, 7 + i as u64);
                let line = match &r {
                    Ok(c) => format!(
                        "{task:28} {preset:?}: {} steps, cublas {}, cudnn steps {}, max error/tolerance {:.3}, fp64 reference {:.1e}{}{}",
                        c.steps,
                        c.cublas,
                        c.cudnn_steps,
                        c.max_error_ratio,
                        c.reference_max_error_ratio,
                        c.reference_first_failure
                            .as_deref()
                            .map(|f| format!(", REFERENCE FAIL {f}"))
                            .unwrap_or_default(),
                        c.first_failure
                            .as_deref()
                            .map(|f| format!(", FAIL {f}"))
                            .unwrap_or_default()
                    ),
                    Err(e) => format!("{task:28} {preset:?}: ERROR {e}"),
                };
                eprintln!("{line}");
                // The fp64 reference must be far inside the tolerance; the baseline within it.
                let ok = matches!(&r, Ok(c) if c.first_failure.is_none()
                    && c.reference_first_failure.is_none()
                    && c.reference_max_error_ratio < 0.01);
                if !ok {
                    failures.lock().unwrap().push(line);
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

#[test]
fn reference_solutions_are_correct_with_cuda_timings() {
    if !gpu_on() {
        return;
    }
    let env = env(CudaEnvConfig::default());
    for task in [
        "relu",
        "softmax",
        "matmul",
        "layer_norm",
        "gemm_bias_gelu",
        "attention",
        "argmax_dim1",
        "layernorm_residual_f16",
    ] {
        let outcome = evaluate(&env, task, &read(&format!("tasks/solutions/{task}.cu")));
        eprintln!(
            "{task:28} {}",
            outcome.feedback().lines().next().unwrap_or("")
        );
        assert!(
            matches!(&outcome, Outcome::Correct { timing, .. } if timing == "cuda"),
            "{task}: {outcome:?} (correct, with CUDA timings)"
        );
    }
}

#[test]
fn protocol_cases_get_the_right_outcome_on_the_gpu() {
    if !gpu_on() {
        return;
    }
    let env = env(CudaEnvConfig {
        verify_timeout_ms: 10_000,
        ..CudaEnvConfig::default()
    });
    let cases = [
        ("relu.correct", "correct", "speedup"),
        ("relu.wrong", "wrong", ""),
        ("relu.unwritten", "wrong", "not fully written"),
        ("relu.clobber", "wrong", "was modified"),
        (
            "relu.out_of_bounds",
            "crash",
            "the kernel faulted: CUDA_ERROR_",
        ),
        ("relu_sum_rows.correct", "correct", "speedup"),
        ("relu.infinite_loop", "timeout", ""),
        ("relu.correct", "correct", "speedup"),
    ];
    for (case, kind, says) in cases {
        let task = case.split('.').next().unwrap();
        let outcome = evaluate(&env, task, &read(&format!("tests/data/cpu/{case}.cu")));
        let feedback = outcome.feedback();
        eprintln!(
            "{case:28} {kind:8} -> {}: {}",
            outcome.kind(),
            feedback.lines().next().unwrap_or("")
        );
        assert_eq!(outcome.kind(), kind, "{case}: {outcome:?}");
        assert!(
            feedback.contains(says),
            "{case}: {feedback:?} should mention {says:?}"
        );
    }
    let stats = env.gpu_pool_stats();
    eprintln!("pool: {stats:?}");
    assert!(
        stats[0].retired + stats[0].respawns >= 2,
        "the faulted and the hung worker were replaced"
    );
}

/// Issue 17, item 5: a task whose buffers cannot fit the GPU is refused at admission as a
/// harness error naming the task and the bytes (never the candidate's crash), and a task at
/// KernelBench's current sizes (1.6e9 elements) is evaluated within 3x of the bytes its inputs
/// and outputs take (torch eager's floor), by the worker's own high-water mark.
#[test]
fn oversized_tasks_are_harness_errors_and_large_tasks_fit() {
    if !gpu_on() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kevin-gpu-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let large = root().join("benches/data/large-tasks");
    let relu = std::fs::read_to_string(large.join("relu_large.toml")).unwrap();
    std::fs::write(dir.join("relu_large.toml"), &relu).unwrap();
    // 64 x 1.6e9 elements: terabytes.
    let huge = relu
        .replace("name = \"relu_large\"", "name = \"relu_huge\"")
        .replace("M = 4096", "M = 262144");
    std::fs::write(dir.join("relu_huge.toml"), huge).unwrap();
    let suite = Arc::new(TaskSuite::load(&dir).unwrap());
    let env = CudaEnv::new(
        suite,
        &dir,
        bin(),
        &CudaEnvConfig {
            workers_per_gpu: 1,
            compile_workers: 1,
            verify_timeout_ms: 600_000,
            profile_timeout_ms: 600_000,
            ..CudaEnvConfig::default()
        },
    )
    .expect("cuda environment");
    assert!(env.refused_tasks().contains_key("relu_huge"));
    assert!(
        !env.refused_tasks().contains_key("relu_large"),
        "{:?}",
        env.refused_tasks()
    );
    let source = std::fs::read_to_string(large.join("solutions/relu_large.cu")).unwrap();
    match evaluate(&env, "relu_huge", &source) {
        Outcome::HarnessError { reason, .. } => {
            assert!(
                reason.contains("task `relu_huge` at preset `gpu` needs"),
                "{reason}"
            )
        }
        other => panic!("an oversized task must be the harness's: {other:?}"),
    }
    let outcome = evaluate(&env, "relu_large", &source);
    assert!(outcome.is_correct(), "{outcome:?}");
    let peak = kevin::env::KernelEnv::device_memory_peak(&env).unwrap();
    let io_bytes = 2 * 4096u64 * 393216 * 4;
    assert!(
        peak <= 3 * io_bytes,
        "harness peak {peak} bytes > 3x the task's {io_bytes} bytes of inputs and outputs"
    );
    std::fs::remove_dir_all(&dir).ok();
}
