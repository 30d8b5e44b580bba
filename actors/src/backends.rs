//! Which kernel environment a command evaluates with.

use std::sync::Arc;

use kevin::env::KernelEnv;
use kevin::tasks::TaskSuite;

/// The environment `kevin eval --backend` names (default: cuda with a GPU, cpu without).
/// `kevin eval` never uses simulated verdicts: a backend that cannot really run kernels is an
/// error, not a fallback.
pub fn eval_env(backend: Option<&str>, _suite: &TaskSuite) -> Result<Arc<dyn KernelEnv>, String> {
    match backend.unwrap_or("cpu") {
        "cuda" => Err("`kevin eval --backend cuda` is not available yet: the GPU evaluation harness (issue 4) is not built. Nothing was evaluated.".into()),
        _ => Err("`kevin eval --backend cpu` is not available yet: the CPU execution backend (issue 5) is not built. Nothing was evaluated.".into()),
    }
}
