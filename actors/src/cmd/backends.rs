//! Which kernel environment a command evaluates with.

use std::path::Path;
use std::sync::Arc;

use kevin::env::{Deadlines, EnvSpec, KernelEnv};
use kevin::tasks::TaskSuite;

/// The backends `--backend` accepts.
pub const BACKENDS: [&str; 2] = ["cpu", "cuda"];

/// The environment `--backend` names (default: [`kevin::machine::default_backend`]), with `workers` worker
/// processes and `deadlines` for each stage: [`EnvSpec::for_command`] built by the core's one
/// factory.
pub fn eval_env(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
    deadlines: Deadlines,
) -> Result<Arc<dyn KernelEnv>, String> {
    let spec = EnvSpec::for_command(backend, workers, deadlines)?;
    kevin::env::build(spec, Some(&Arc::new(suite)), dir)
}
