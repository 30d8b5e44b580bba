//! Which kernel environment a command evaluates with.

use std::path::Path;
use std::sync::Arc;

use kevin::cpu_env::CpuEnv;
use kevin::cuda_env::{CudaEnv, CudaEnvConfig};
use kevin::env::KernelEnv;
use kevin::tasks::{Preset, TaskSuite};

/// Deadline of one correctness check on the CPU backend (5 trials, two runs each).
const CPU_VERIFY_TIMEOUT_MS: u64 = 30_000;
/// Deadline of one timing run on the CPU backend.
const CPU_PROFILE_TIMEOUT_MS: u64 = 60_000;

/// The backend `kevin eval` uses without `--backend`: cuda where nvidia-smi lists a GPU, else
/// cpu.
pub fn default_backend() -> &'static str {
    if kevin::compile::gpu_count() > 0 {
        "cuda"
    } else {
        "cpu"
    }
}

/// The environment `kevin eval --backend` names (default: [`default_backend`]). The cpu backend
/// runs the small size preset, cuda the GPU preset on every GPU nvidia-smi lists. `kevin eval`
/// never uses simulated verdicts: a backend that cannot really run kernels is an error, not a
/// fallback.
pub fn eval_env(
    backend: Option<&str>,
    suite: TaskSuite,
    dir: &Path,
    workers: usize,
) -> Result<Arc<dyn KernelEnv>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the kevin binary: {e}"))?;
    let backend = backend.unwrap_or_else(|| default_backend());
    match backend {
        "cuda" => {
            let gpus = kevin::compile::gpu_count();
            if gpus == 0 {
                return Err(
                    "--backend cuda: nvidia-smi lists no GPU on this machine. Use --backend cpu. \
                            Nothing was evaluated."
                        .into(),
                );
            }
            let cfg = CudaEnvConfig {
                gpus: (0..gpus).collect(),
                compile_workers: workers,
                ..CudaEnvConfig::default()
            };
            Ok(Arc::new(CudaEnv::new(Arc::new(suite), dir, exe, &cfg)?))
        }
        _ => {
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
