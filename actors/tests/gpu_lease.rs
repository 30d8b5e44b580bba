//! The GPU-wide timing lease on a real GPU (issue 17, item 7), with the real worker processes.
//! Skipped unless `KEVIN_GPU_TESTS=1`.
//!
//! This test holds the lease of GPU 0 the way the burn generator and learner do (a step, shared)
//! or the way another process's timing run does (exclusive), and checks that the cuda
//! environment's timing run waits for a step in progress, that its checks wait for another
//! timing run, that the waits are reported as phases, and that `env.timing = "shared"` takes no
//! lease.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kevin::config::GpuTiming;
use kevin::env::cuda::CudaEnv;
use kevin::env::{CudaEnvConfig, KernelEnv};
use kevin::gpu::lease::{gpu_key, GpuLease, Hold, LOCK_DIR_ENV};
use kevin::outcome::Outcome;
use kevin::tasks::TaskSuite;

use common::{bin, gpu_tests, root};

const HOLD: Duration = Duration::from_millis(1500);

fn env(timing: GpuTiming) -> CudaEnv {
    let suite = Arc::new(TaskSuite::load(root().join("tasks")).unwrap());
    let cfg = CudaEnvConfig {
        compile_workers: 2,
        timing,
        ..CudaEnvConfig::default()
    };
    CudaEnv::new(suite, &root().join("tasks"), bin(), &cfg).expect("cuda environment")
}

/// Holds `hold` on GPU 0's lease from another thread for [`HOLD`]; returns once it is held.
fn hold_for_a_while(hold: Hold) -> std::thread::JoinHandle<()> {
    let lease = GpuLease::for_gpu(0, "test").expect("the lease of GPU 0");
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let held = lease.take(hold).unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(HOLD);
        drop(held);
    });
    rx.recv().unwrap();
    t
}

fn phase(env: &CudaEnv, name: &str) -> Option<f64> {
    env.phase_stats()
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, _, mean)| mean)
}

#[test]
fn timing_waits_for_steps_and_checks_wait_for_timing_on_the_gpu() {
    if !gpu_tests() {
        eprintln!("skipping: set KEVIN_GPU_TESTS=1 on a machine with a GPU");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kevin-gpu-lease-test-{}", std::process::id()));
    std::env::set_var(LOCK_DIR_ENV, &dir);
    let key = gpu_key(0).expect("GPU 0's PCI bus id");
    assert!(key.starts_with("gpu-") && key.len() > 8, "{key}");

    let source = std::fs::read_to_string(root().join("tasks/solutions/softmax.cu")).unwrap();
    let leased = env(GpuTiming::Exclusive);
    let compiled = leased.compile("softmax", &source).expect("compiles");
    leased.verify(&compiled).expect("correct");
    assert!(leased
        .describe()
        .contains("under the GPU-wide timing lease"));

    // A step (a generator's forward pass) in progress: the timing run waits for its end.
    leased.reset_phase_stats();
    let step = hold_for_a_while(Hold::Step);
    let t = Instant::now();
    let outcome = leased.profile(&compiled);
    assert!(matches!(outcome, Outcome::Correct { .. }), "{outcome:?}");
    assert!(t.elapsed() >= HOLD - Duration::from_millis(100));
    step.join().unwrap();
    let waited = phase(&leased, "profile.lease_wait").expect("a profile.lease_wait phase");
    assert!(waited >= 1_000.0, "the timing run waited {waited} ms");

    // Another process's timing run in progress: a check waits for its end.
    leased.reset_phase_stats();
    let timing = hold_for_a_while(Hold::Timing);
    leased.verify(&compiled).expect("still correct");
    timing.join().unwrap();
    let waited = phase(&leased, "verify.lease_wait").expect("a verify.lease_wait phase");
    assert!(waited >= 1_000.0, "the check waited {waited} ms");
    drop(leased);

    // "shared": no lease at all, so a held timing lease delays nothing.
    let shared = env(GpuTiming::Shared);
    let compiled = shared.compile("softmax", &source).expect("compiles");
    let timing = hold_for_a_while(Hold::Timing);
    shared.verify(&compiled).expect("correct");
    assert!(matches!(shared.profile(&compiled), Outcome::Correct { .. }));
    assert!(phase(&shared, "profile.lease_wait").is_none());
    assert!(phase(&shared, "verify.lease_wait").is_none());
    timing.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
