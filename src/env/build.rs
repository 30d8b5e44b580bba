//! The one environment factory: what to build ([`EnvSpec`], from a run's configuration or from a
//! command's `--backend`) and [`build`], which starts it. `kevin train` and every command that
//! evaluates kernels go through it, so a backend is set up the same way everywhere.

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, CpuNvrtc, EnvKind, GpuTiming, RemoteEnvSection, SimEnvSection};
use crate::env::{Deadlines, KernelEnv};
use crate::tasks::{Preset, TaskSuite};

/// GPU worker processes per GPU for commands (verifications share the GPU, timing runs take it
/// in turn).
const CUDA_WORKERS_PER_GPU: usize = 4;

/// Settings of a [`CudaEnv`].
#[derive(Debug, Clone)]
pub struct CudaEnvConfig {
    /// Size preset of evaluations (the GPU preset normally).
    pub preset: Preset,
    /// `sm_XX` or "auto".
    pub arch: String,
    /// GPU ordinals to use.
    pub gpus: Vec<usize>,
    /// Worker processes per GPU.
    pub workers_per_gpu: usize,
    /// Compile worker processes.
    pub compile_workers: usize,
    /// Compile deadline.
    pub compile_timeout_ms: u64,
    /// Verify deadline.
    pub verify_timeout_ms: u64,
    /// Profile deadline.
    pub profile_timeout_ms: u64,
    /// Whether timing runs take the GPU-wide timing lease (and checks hold it shared).
    pub timing: GpuTiming,
}

impl Default for CudaEnvConfig {
    fn default() -> Self {
        CudaEnvConfig {
            preset: Preset::Gpu,
            arch: "auto".into(),
            gpus: vec![0],
            workers_per_gpu: 2,
            compile_workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            compile_timeout_ms: 30_000,
            verify_timeout_ms: 60_000,
            profile_timeout_ms: 60_000,
            timing: GpuTiming::Exclusive,
        }
    }
}

/// The NVRTC front-end of the cpu environment: whether to run it, for which architecture, with
/// how many compile workers.
#[derive(Debug, Clone)]
pub struct CpuFrontEnd {
    /// "auto", "on" or "off" (`env.cpu_nvrtc`).
    pub mode: CpuNvrtc,
    /// `sm_XX` or "auto" (as the GPU path resolves it).
    pub arch: String,
    /// Compile worker processes.
    pub workers: usize,
}

impl CpuFrontEnd {
    /// "auto" for the GPU path's default architecture, with `workers` compile workers.
    pub fn auto(workers: usize) -> CpuFrontEnd {
        CpuFrontEnd {
            mode: CpuNvrtc::Auto,
            arch: "auto".into(),
            workers,
        }
    }
}

/// Environment variable that sets a command's `--backend cpu` NVRTC front-end: "auto" (the
/// default), "on" or "off" (`env.cpu_nvrtc` of a run's configuration).
pub const CPU_NVRTC_ENV: &str = "KEVIN_CPU_NVRTC";

/// The front-end mode [`CPU_NVRTC_ENV`] asks for ("auto" when unset); another value is an error.
fn cpu_nvrtc_from_env() -> Result<CpuNvrtc, String> {
    match std::env::var(CPU_NVRTC_ENV).as_deref() {
        Err(_) | Ok("") | Ok("auto") => Ok(CpuNvrtc::Auto),
        Ok("on") => Ok(CpuNvrtc::On),
        Ok("off") => Ok(CpuNvrtc::Off),
        Ok(other) => Err(format!(
            "{CPU_NVRTC_ENV}={other:?}: expected \"auto\", \"on\" or \"off\""
        )),
    }
}

/// Which environment to build, with its settings.
#[derive(Debug, Clone)]
pub enum EnvSpec {
    /// Everything simulated ([`super::sim::SimEnv`]).
    Simulated(SimEnvSection),
    /// Real rules and NVRTC compilation, simulated verdicts ([`super::nvrtc::NvrtcEnv`]).
    Nvrtc {
        /// Size preset of evaluations.
        preset: Preset,
        /// `sm_XX` or "auto".
        arch: String,
        /// Compile worker processes.
        compile_workers: usize,
        /// Compile deadline (ms).
        compile_timeout_ms: u64,
        /// The simulated part's parameters.
        simulated: SimEnvSection,
    },
    /// The CPU execution backend (`super::cpu::CpuEnv`).
    Cpu {
        /// Size preset of evaluations.
        preset: Preset,
        /// Worker processes.
        workers: usize,
        /// The NVRTC front-end (`env.cpu_nvrtc`, `env.arch`, `env.compile_workers`).
        front_end: CpuFrontEnd,
        /// Each stage's deadline.
        deadlines: Deadlines,
    },
    /// The GPU harness (`super::cuda::CudaEnv`).
    Cuda(CudaEnvConfig),
    /// Remote evaluation through NATS JetStream: built by the actors crate (`kevin_actors::remote`),
    /// since the core has no async runtime or NATS client; [`build`] refuses it.
    Remote {
        /// Size preset the nodes evaluate at.
        preset: Preset,
        /// Each stage's deadline, which the nodes' environments enforce.
        deadlines: Deadlines,
        /// The bus, the queue and the credentials.
        remote: RemoteEnvSection,
    },
}

impl EnvSpec {
    /// The environment `[env]` of `config` describes (`kevin train`).
    pub fn from_config(config: &Config) -> EnvSpec {
        let env = &config.env;
        match env.kind {
            EnvKind::Simulated => EnvSpec::Simulated(env.simulated.clone()),
            EnvKind::Nvrtc => EnvSpec::Nvrtc {
                preset: config.tasks.preset,
                arch: env.arch.clone(),
                compile_workers: env.compile_workers as usize,
                compile_timeout_ms: env.compile_timeout_ms,
                simulated: env.simulated.clone(),
            },
            EnvKind::Cuda => EnvSpec::Cuda(CudaEnvConfig {
                preset: config.tasks.preset,
                arch: env.arch.clone(),
                gpus: env.gpus.iter().map(|&g| g as usize).collect(),
                workers_per_gpu: env.verify_workers as usize,
                compile_workers: env.compile_workers as usize,
                compile_timeout_ms: env.compile_timeout_ms,
                verify_timeout_ms: env.verify_timeout_ms,
                profile_timeout_ms: env.profile_timeout_ms,
                timing: env.timing,
            }),
            EnvKind::Cpu => EnvSpec::Cpu {
                preset: config.tasks.preset,
                workers: env.verify_workers as usize,
                front_end: CpuFrontEnd {
                    mode: env.cpu_nvrtc,
                    arch: env.arch.clone(),
                    workers: env.compile_workers as usize,
                },
                deadlines: Deadlines {
                    compile_ms: env.compile_timeout_ms,
                    verify_ms: env.verify_timeout_ms,
                    profile_ms: env.profile_timeout_ms,
                },
            },
            EnvKind::Remote => EnvSpec::Remote {
                preset: config.tasks.preset,
                deadlines: Deadlines {
                    compile_ms: env.compile_timeout_ms,
                    verify_ms: env.verify_timeout_ms,
                    profile_ms: env.profile_timeout_ms,
                },
                remote: env.remote.clone(),
            },
        }
    }

    /// The environment a command's `--backend` names (default:
    /// [`crate::machine::default_backend`]), with `workers` worker processes (cuda: compile
    /// workers; the GPU workers are a few per GPU) and `deadlines` for each stage. The cpu
    /// backend runs the small size preset, cuda the GPU preset on every GPU nvidia-smi lists.
    /// Commands never use simulated verdicts: a backend that cannot really run kernels is an
    /// error, not a fallback.
    pub fn for_command(
        backend: Option<&str>,
        workers: usize,
        deadlines: Deadlines,
    ) -> Result<EnvSpec, String> {
        // Asked once (it runs nvidia-smi): it decides the default and the GPUs to use.
        let gpus = crate::machine::gpu_count();
        match backend.unwrap_or(crate::machine::default_backend_for(gpus)) {
            "cuda" => {
                if gpus == 0 {
                    return Err(
                        "--backend cuda: nvidia-smi lists no GPU on this machine. Use --backend cpu. \
                            Nothing was evaluated."
                            .into(),
                    );
                }
                Ok(EnvSpec::Cuda(CudaEnvConfig {
                    gpus: (0..gpus).collect(),
                    workers_per_gpu: CUDA_WORKERS_PER_GPU,
                    compile_workers: workers,
                    compile_timeout_ms: deadlines.compile_ms,
                    verify_timeout_ms: deadlines.verify_ms,
                    profile_timeout_ms: deadlines.profile_ms,
                    ..CudaEnvConfig::default()
                }))
            }
            _ => Ok(EnvSpec::Cpu {
                preset: Preset::Small,
                workers,
                front_end: CpuFrontEnd {
                    mode: cpu_nvrtc_from_env()?,
                    ..CpuFrontEnd::auto(workers)
                },
                deadlines,
            }),
        }
    }

    /// This spec with `timing` for a cuda environment (the others time on no shared GPU).
    pub fn with_timing(self, timing: GpuTiming) -> EnvSpec {
        match self {
            EnvSpec::Cuda(cfg) => EnvSpec::Cuda(CudaEnvConfig { timing, ..cfg }),
            other => other,
        }
    }

    /// The `env.kind` spelling of this environment.
    fn kind(&self) -> &'static str {
        match self {
            EnvSpec::Simulated(_) => "simulated",
            EnvSpec::Nvrtc { .. } => "nvrtc",
            EnvSpec::Cpu { .. } => "cpu",
            EnvSpec::Cuda(_) => "cuda",
            EnvSpec::Remote { .. } => "remote",
        }
    }
}

/// Starts the environment `spec` describes. Every environment but the simulated one needs the
/// task `suite` (read again by the workers from `tasks_dir`) and starts worker processes of this
/// very binary (`kevin worker --role ...`). Errors are one line.
pub fn build(
    spec: EnvSpec,
    suite: Option<&Arc<TaskSuite>>,
    tasks_dir: &Path,
) -> Result<Arc<dyn KernelEnv>, String> {
    if let EnvSpec::Simulated(sim) = spec {
        return Ok(Arc::new(super::sim::SimEnv::new(sim)));
    }
    if let EnvSpec::Remote { .. } = spec {
        return Err(
            "env.kind = \"remote\" is built by the kevin binary's actors crate (remote \
             evaluation needs its NATS client), not by kevin::env::build"
                .into(),
        );
    }
    let suite = suite
        .ok_or_else(|| format!("env.kind = \"{}\" needs the task suite", spec.kind()))?
        .clone();
    // Workers are this very binary, started as `kevin worker --role <role>`.
    let exe = crate::worker::own_binary().map_err(|e| format!("locating the kevin binary: {e}"))?;
    match spec {
        EnvSpec::Simulated(_) | EnvSpec::Remote { .. } => unreachable!("handled above"),
        EnvSpec::Nvrtc {
            preset,
            arch,
            compile_workers,
            compile_timeout_ms,
            simulated,
        } => Ok(Arc::new(super::nvrtc::NvrtcEnv::new(
            suite,
            preset,
            &arch,
            crate::worker::WorkerCommand::kevin_role(exe, "compile"),
            compile_workers,
            compile_timeout_ms,
            simulated,
        )?)),
        #[cfg(unix)]
        EnvSpec::Cpu {
            preset,
            workers,
            front_end,
            deadlines,
        } => Ok(Arc::new(super::cpu::CpuEnv::with_front_end(
            suite, tasks_dir, preset, exe, workers, deadlines, &front_end,
        )?)),
        #[cfg(unix)]
        EnvSpec::Cuda(cfg) => Ok(Arc::new(super::cuda::CudaEnv::new(
            suite, tasks_dir, exe, &cfg,
        )?)),
        #[cfg(not(unix))]
        other => Err(format!(
            "env.kind = \"{}\" needs a unix system (its workers are separate processes)",
            other.kind()
        )),
    }
}
