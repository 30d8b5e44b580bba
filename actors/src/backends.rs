//! Which kernel environment a command evaluates with.

use std::path::Path;
use std::sync::Arc;

use kevin::cpu_env::CpuEnv;
use kevin::env::{Deadlines, KernelEnv};
use kevin::tasks::{Preset, TaskSuite};

/// The backends `--backend` accepts.
pub const BACKENDS: [&str; 2] = ["cpu", "cuda"];

/// The environment `--backend` names (default: cpu; cuda lands with the GPU harness), with
/// `workers` worker processes and `deadlines` for each stage. Commands never use simulated
/// verdicts: a backend that cannot really run kernels is an error, not a fallback.
pub fn eval_env(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
    deadlines: Deadlines,
) -> Result<Arc<dyn KernelEnv>, String> {
    match backend.unwrap_or("cpu") {
        "cuda" => Err(
            "`--backend cuda` is not available yet: the GPU evaluation harness (issue 4) is not \
                       built. Use --backend cpu. Nothing was evaluated."
                .into(),
        ),
        _ => {
            let exe =
                std::env::current_exe().map_err(|e| format!("locating the kevin binary: {e}"))?;
            let env = CpuEnv::new(Arc::new(suite), dir, Preset::Small, exe, workers, deadlines)?;
            Ok(Arc::new(env))
        }
    }
}
