//! Which kernel environment a command evaluates with.

use std::path::Path;
use std::sync::Arc;

use kevin::cpu_env::CpuEnv;
use kevin::cuda_env::{CudaEnv, CudaEnvConfig};
use kevin::env::{Deadlines, KernelEnv};
use kevin::tasks::{Preset, TaskSuite};

/// The backends `--backend` accepts.
pub const BACKENDS: [&str; 2] = ["cpu", "cuda"];

/// GPU worker processes per GPU for commands (verifications share the GPU, timing runs take it
/// in turn).
const CUDA_WORKERS_PER_GPU: usize = 4;

/// The backend commands use without `--backend`: cuda where nvidia-smi lists a GPU, else cpu.
pub fn default_backend() -> &'static str {
    if kevin::compile::gpu_count() > 0 {
        "cuda"
    } else {
        "cpu"
    }
}

/// The environment `--backend` names (default: [`default_backend`]), with `workers` worker
/// processes (cuda: compile workers; the GPU workers are a few per GPU) and `deadlines` for each
/// stage. The cpu backend runs the small size preset, cuda the GPU preset on every GPU
/// nvidia-smi lists. Commands never use simulated verdicts: a backend that cannot really run
/// kernels is an error, not a fallback.
pub fn eval_env(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
    deadlines: Deadlines,
) -> Result<Arc<dyn KernelEnv>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the kevin binary: {e}"))?;
    // Asked once (it runs nvidia-smi): it decides the default and the GPUs to use.
    let gpus = kevin::compile::gpu_count();
    let default = if gpus > 0 { "cuda" } else { "cpu" };
    match backend.unwrap_or(default) {
        "cuda" => {
            if gpus == 0 {
                return Err(
                    "--backend cuda: nvidia-smi lists no GPU on this machine. Use --backend cpu. \
                            Nothing was evaluated."
                        .into(),
                );
            }
            let cfg = CudaEnvConfig {
                gpus: (0..gpus).collect(),
                workers_per_gpu: CUDA_WORKERS_PER_GPU,
                compile_workers: workers,
                compile_timeout_ms: deadlines.compile_ms,
                verify_timeout_ms: deadlines.verify_ms,
                profile_timeout_ms: deadlines.profile_ms,
                ..CudaEnvConfig::default()
            };
            Ok(Arc::new(CudaEnv::new(Arc::new(suite), dir, exe, &cfg)?))
        }
        _ => {
            let env = CpuEnv::new(Arc::new(suite), dir, Preset::Small, exe, workers, deadlines)?;
            Ok(Arc::new(env))
        }
    }
}
