//! Which kernel environment a command evaluates with.

use std::path::Path;
use std::sync::Arc;

use kevin::config::GpuTiming;
use kevin::env::{Deadlines, EnvSpec, KernelEnv};
use kevin::tasks::TaskSuite;

/// The backends `--backend` accepts.
pub const BACKENDS: [&str; 2] = ["cpu", "cuda"];

/// The environment `--backend` names (default: [`kevin::machine::default_backend`]), with `workers` worker
/// processes and `deadlines` for each stage: [`EnvSpec::for_command`] built by the core's one
/// factory.
/// The cuda backend times under the GPU-wide timing lease (`env.timing = "exclusive"`).
pub fn eval_env(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
    deadlines: Deadlines,
) -> Result<Arc<dyn KernelEnv>, String> {
    eval_env_timed(
        backend,
        suite,
        dir,
        workers,
        deadlines,
        GpuTiming::Exclusive,
    )
}

/// [`eval_env`] with the cuda backend's `timing` (a command's `--timing`).
pub fn eval_env_timed(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
    deadlines: Deadlines,
    timing: GpuTiming,
) -> Result<Arc<dyn KernelEnv>, String> {
    let spec = EnvSpec::for_command(backend, workers, deadlines)?.with_timing(timing);
    kevin::env::build(spec, Some(&Arc::new(suite)), dir)
}
