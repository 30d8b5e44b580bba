//! Which kernel environment a command evaluates with.

use std::path::Path;
use std::sync::Arc;

use kevin::cpu_env::CpuEnv;
use kevin::env::KernelEnv;
use kevin::tasks::{Preset, TaskSuite};

/// Deadline of one correctness check on the CPU backend (5 trials, two runs each).
const CPU_VERIFY_TIMEOUT_MS: u64 = 30_000;
/// Deadline of one timing run on the CPU backend.
const CPU_PROFILE_TIMEOUT_MS: u64 = 60_000;

/// The environment `kevin eval --backend` names (default: cpu; cuda lands with the GPU harness).
/// `kevin eval` never uses simulated verdicts: a backend that cannot really run kernels is an
/// error, not a fallback.
pub fn eval_env(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
) -> Result<Arc<dyn KernelEnv>, String> {
    match backend.unwrap_or("cpu") {
        "cuda" => Err("`kevin eval --backend cuda` is not available yet: the GPU evaluation harness (issue 4) is not \
                       built. Use --backend cpu. Nothing was evaluated."
            .into()),
        _ => {
            let exe = std::env::current_exe().map_err(|e| format!("locating the kevin binary: {e}"))?;
            let env = CpuEnv::new(
                Arc::new(suite),
                dir,
                Preset::Small,
                exe,
                workers,
                CPU_VERIFY_TIMEOUT_MS,
                CPU_PROFILE_TIMEOUT_MS,
            )?;
            Ok(Arc::new(env))
        }
    }
}
