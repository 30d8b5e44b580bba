//! The "cuda" kernel environment, parent side: candidates compiled by NVRTC to a CUBIN for the
//! GPU's own architecture, then checked and timed on the GPU by `kevin worker --role cuda`
//! processes ([`crate::gpu::worker`]) with the protocols of [`crate::verify`].
//!
//! - compile: the static rules and launch-plan validation, then NVRTC in the compile pool
//!   ([`NvrtcCompiler`]); the image is written to the environment's work folder.
//! - verify: a cuda worker runs the correctness protocol on device memory (inputs drawn on the
//!   device, the eager baseline as the reference, masked; outputs compared on the device).
//! - profile: the same worker times candidate and baseline interleaved with CUDA events, the L2
//!   flushed before each run, input sets rotated, and re-checks the last timed output.
//!
//! Workers of one GPU share it: the environment holds that GPU's lock around each request, so one
//! candidate runs on a GPU at a time. With `env.timing = "exclusive"` it also holds the GPU-wide
//! timing lease ([`crate::gpu::lease`], across processes): exclusively around each timing run
//! (so the burn generator and learner, `kevin bench policy` and other kevin processes' checks
//! on that GPU pause between their steps), shared around each other request (so this
//! environment's checks never run during another process's timing run). Both are taken *before*
//! the request goes to a worker, so a request's deadline never includes waiting for the GPU (a
//! verification that waited behind a long timing run must not time out on the candidate's
//! account); the wait shows as the `<stage>.lease_wait` phase. A worker whose context a candidate
//! poisoned (illegal address, trap) answers with the crash and is replaced; a worker that hangs
//! is killed at its deadline and replaced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::compile::{self, OutputKind};
use crate::config::GpuTiming;
use crate::env::nvrtc::NvrtcCompiler;
use crate::env::{Compiled, CudaEnvConfig, KernelEnv};
use crate::gpu::lease::{GpuLease, Hold};
use crate::gpu::worker::{CudaReply, BASELINE_ENV, DEVICE_ENV, HARNESS_ENV};
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::request::{unanswered, BaselineCheck, EvalRequest, EvalResult, TASKS_ENV};

use super::artifact::{ModuleArtifact, Owned};
use crate::worker::{PoolConfig, WorkerCommand, WorkerFailure, WorkerPool};

/// The environment.
pub struct CudaEnv {
    compiler: NvrtcCompiler,
    pools: Vec<WorkerPool<EvalRequest, CudaReply>>,
    /// One per GPU, held by every request (verification and timing alike) from before a worker
    /// takes it until its answer or its worker's death: one candidate on a GPU at a time. With
    /// verifications sharing the GPU, a hung or faulting candidate in one worker slowed the
    /// checks of valid candidates in the others past their deadline (the H200 storm of
    /// 2026-11-30: 27 of 500 valid candidates timed out, every misaligned access timed out
    /// instead of crashing); each hang now holds the GPU for at most `RUN_LIMIT`.
    ///
    /// With `env.timing = "exclusive"` the lock also holds that GPU's timing lease handle.
    gpu_locks: Vec<std::sync::Mutex<Option<GpuLease>>>,
    next_pool: AtomicUsize,
    /// `env.timing`.
    timing: GpuTiming,
    preset: Preset,
    workdir: PathBuf,
    compiles: AtomicU64,
    verify_timeout: Duration,
    profile_timeout: Duration,
    /// Phase name -> (requests, total ms): where GPU requests spend their time.
    phases: std::sync::Mutex<BTreeMap<String, (u64, f64)>>,
    /// Tasks whose device-memory need does not fit the GPUs, with the reason: refused at
    /// admission as a harness error (never the candidate's).
    refused: BTreeMap<String, String>,
    /// The largest `peak_bytes` a worker reported.
    peak: AtomicU64,
}

/// The tasks of `suite` at `preset` whose need ([`crate::gpu::buffers::memory_need`]) exceeds
/// `available` bytes on GPU `gpu`, with a message naming the task, the preset and the bytes.
pub fn oversized_tasks(
    suite: &TaskSuite,
    preset: Preset,
    gpu: usize,
    available: u64,
) -> BTreeMap<String, String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut out = BTreeMap::new();
    for task in suite.tasks() {
        let reason = match crate::gpu::buffers::memory_need(task, preset) {
            Ok(need) if need.peak() > available => format!(
                "task `{}` at preset `{}` needs {} bytes ({:.2} GiB) of device memory (verify {:.2} GiB, \
                 profile {:.2} GiB, worker {:.2} GiB) but GPU {gpu} has {} bytes ({:.2} GiB) available \
                 for one request: it is not evaluated",
                task.name,
                preset.name(),
                need.peak(),
                gib(need.peak()),
                gib(need.verify),
                gib(need.profile),
                gib(crate::gpu::buffers::WORKER_FIXED_BYTES),
                available,
                gib(available)
            ),
            Ok(_) => continue,
            Err(e) => format!(
                "task `{}` at preset `{}`: its device-memory need cannot be computed: {e}",
                task.name,
                preset.name()
            ),
        };
        out.insert(task.name.clone(), reason);
    }
    out
}

/// FNV-1a: a stable 64-bit hash for cache keys (std's hasher may change between releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where compiled trusted modules are kept between runs: `$KEVIN_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/kevin`, else `~/.cache/kevin`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KEVIN_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("kevin"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kevin"))
}

/// The CUBIN of one of kevin's own sources for `arch`: from the cache when this exact source
/// was compiled before (the baseline takes NVRTC 12-18 s), else compiled here (trusted code, so
/// in-process) and cached. A cache that cannot be written only costs the next run the compile.
/// (Workers load a copy in the environment's own folder, which lives as long as they do.)
fn trusted_cubin(name: &str, source: &str, arch: &str) -> Result<Vec<u8>, String> {
    let key = fnv1a(&[
        source.as_bytes(),
        arch.as_bytes(),
        env!("CARGO_PKG_VERSION").as_bytes(),
    ]);
    let cached = cache_dir().map(|d| d.join(format!("{name}-{arch}-{key:016x}.cubin")));
    if let Some(bytes) = cached.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if bytes.starts_with(b"\x7fELF") {
            return Ok(bytes);
        }
    }
    let mut req = compile::CompileRequest::ptx(source, &[]);
    req.arch = arch.to_string();
    req.output = OutputKind::Cubin;
    let out = compile::compile(&req, &compile::find_cuda_include_dirs())
        .map_err(|e| format!("compiling kevin's {name} kernels: {e}"))?;
    let bytes = out.image.into_bytes();
    if let Some(path) = cached {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let stored = path
            .parent()
            .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, &bytes).is_ok()
            && std::fs::rename(&tmp, &path).is_ok();
        if !stored {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(bytes)
}

/// Folders that may hold libcublas (the CUDA toolkit's, or a pip wheel's), for the workers'
/// loader path.
fn cuda_lib_dirs() -> Vec<String> {
    let mut dirs = Vec::new();
    if let Ok(p) = std::env::var("CUDA_PATH") {
        dirs.push(format!("{p}/lib64"));
    }
    dirs.push("/usr/local/cuda/lib64".into());
    if let Some(nvrtc) = compile::nvrtc::pip_nvrtc_lib_dir() {
        // site-packages/nvidia/cuda_nvrtc/lib -> site-packages/nvidia/cublas/lib
        if let Some(nvidia) = nvrtc.parent().and_then(Path::parent) {
            dirs.push(nvidia.join("cublas/lib").display().to_string());
        }
    }
    dirs.retain(|d| Path::new(d).is_dir());
    dirs
}

impl CudaEnv {
    /// Compiles the harness and the baseline for the GPU, starts the compile pool and
    /// `workers_per_gpu` cuda workers per GPU (`program` is the kevin binary); the task suite is
    /// read from `tasks_dir` in the workers too.
    pub fn new(
        suite: Arc<TaskSuite>,
        tasks_dir: &Path,
        program: PathBuf,
        cfg: &CudaEnvConfig,
    ) -> Result<CudaEnv, String> {
        let suite_for_admission = suite.clone();
        let compiler = NvrtcCompiler::new(
            suite,
            cfg.preset,
            &cfg.arch,
            OutputKind::Cubin,
            WorkerCommand::kevin_role(program.clone(), "compile"),
            cfg.compile_workers.max(1),
            cfg.compile_timeout_ms,
        )?;
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let workdir =
            std::env::temp_dir().join(format!("kevin-cuda-{}-{instance}", std::process::id()));
        std::fs::create_dir_all(&workdir).map_err(|e| format!("{}: {e}", workdir.display()))?;
        let trusted = |name: &str, source: &str| -> Result<PathBuf, String> {
            let path = workdir.join(format!("{name}.cubin"));
            let bytes = trusted_cubin(name, source, compiler.arch())?;
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        };
        let harness = trusted("harness", crate::gpu::HARNESS_SOURCE)?;
        let baseline = trusted("baseline", crate::baseline::SOURCE)?;
        let tasks_dir = crate::tasks::canonical_suite_path(tasks_dir)?;
        let mut lib_path = cuda_lib_dirs();
        if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
            lib_path.push(old);
        }
        let mut pools = Vec::new();
        for &gpu in &cfg.gpus {
            let mut command = WorkerCommand::kevin_role(program.clone(), "cuda");
            command.env.extend([
                (TASKS_ENV.to_string(), tasks_dir.display().to_string()),
                (HARNESS_ENV.to_string(), harness.display().to_string()),
                (BASELINE_ENV.to_string(), baseline.display().to_string()),
                (DEVICE_ENV.to_string(), gpu.to_string()),
                ("LD_LIBRARY_PATH".to_string(), lib_path.join(":")),
            ]);
            let config = PoolConfig {
                workers: cfg.workers_per_gpu.max(1),
                request_timeout: Duration::from_millis(cfg.verify_timeout_ms),
                spawn_timeout: Duration::from_secs(30),
                ..PoolConfig::default()
            };
            let pool = WorkerPool::new(command, config)
                .map_err(|e| format!("cuda workers for GPU {gpu}: {e}"))?
                .retire_when(|r: &CudaReply| r.retire);
            pools.push(pool);
        }
        if pools.is_empty() {
            return Err("env.gpus is empty: no GPU to evaluate on".into());
        }
        // Admission by memory: with the workers (and their contexts) up, what one request may
        // take is the GPU's free memory less what the other workers of the GPU may keep idle.
        let mut refused = BTreeMap::new();
        for &gpu in &cfg.gpus {
            let Some(free) = crate::machine::gpu_free_bytes(gpu) else {
                tracing::warn!(gpu, "nvidia-smi did not report the GPU's free memory; tasks are not checked against it");
                continue;
            };
            let others = (cfg.workers_per_gpu.max(1) - 1) as u64
                * crate::gpu::worker::POOL_KEEP_BYTES as u64;
            let available = free.saturating_sub(others);
            for (task, reason) in oversized_tasks(&suite_for_admission, cfg.preset, gpu, available)
            {
                tracing::warn!(%reason, "task refused");
                refused.entry(task).or_insert(reason);
            }
        }
        let mut gpu_locks = Vec::new();
        for &gpu in &cfg.gpus {
            let lease = if cfg.timing.leased() {
                let lease = GpuLease::for_gpu(gpu, "evaluation")
                    .map_err(|e| format!("env.timing = \"exclusive\": {e}"))?;
                tracing::debug!(gpu, lock = %lease.path().display(), "timing under the GPU lease");
                Some(lease)
            } else {
                None
            };
            gpu_locks.push(std::sync::Mutex::new(lease));
        }
        Ok(CudaEnv {
            compiler,
            gpu_locks,
            timing: cfg.timing,
            pools,
            next_pool: AtomicUsize::new(0),
            preset: cfg.preset,
            workdir,
            compiles: AtomicU64::new(0),
            verify_timeout: Duration::from_millis(cfg.verify_timeout_ms),
            profile_timeout: Duration::from_millis(cfg.profile_timeout_ms),
            phases: Default::default(),
            refused,
            peak: AtomicU64::new(0),
        })
    }

    /// Tasks refused because their device-memory need does not fit a GPU, with the reason.
    pub fn refused_tasks(&self) -> &BTreeMap<String, String> {
        &self.refused
    }

    /// Sends one request to the next GPU's pool, holding that GPU's lock (and its timing lease:
    /// exclusive for a timing run, shared otherwise) from before a worker takes it until the
    /// answer (the deadline never includes the wait; the worker has waited for its work on the
    /// GPU before it answers); a worker failure becomes the candidate's outcome, a lease that
    /// cannot be taken a harness error.
    pub fn request(
        &self,
        req: &EvalRequest,
        stage: &str,
        limit: Duration,
    ) -> Result<EvalResult, Outcome> {
        let i = self.next_pool.fetch_add(1, Ordering::Relaxed) % self.pools.len();
        let waiting = Instant::now();
        let gpu = self.gpu_locks[i].lock().unwrap_or_else(|e| e.into_inner());
        let waited = waiting.elapsed();
        let hold = match req {
            EvalRequest::Profile { .. } => Hold::Timing,
            _ => Hold::Step,
        };
        // Held until the answer (or the worker's death) below, then released when it drops.
        let leased = match gpu.as_ref().map(|lease| lease.take(hold)).transpose() {
            Ok(held) => held,
            Err(e) => return Ok(EvalResult::HarnessError(e.to_string())),
        };
        let lease_wait = leased
            .as_ref()
            .map_or(0.0, |h| h.waited().as_secs_f64() * 1e3);
        let sent = Instant::now();
        match self.pools[i].request_with_timeout(req, limit) {
            Ok(reply) => {
                self.peak.fetch_max(reply.peak_bytes, Ordering::Relaxed);
                let round_trip = sent.elapsed();
                let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
                let mut add = |name: String, ms: f64| {
                    let e = phases.entry(name).or_insert((0, 0.0));
                    e.0 += 1;
                    e.1 += ms;
                };
                let worker_ms: f64 = reply.phases.iter().map(|p| p.1).sum();
                add(format!("{stage}.lock_wait"), waited.as_secs_f64() * 1e3);
                if gpu.is_some() {
                    add(format!("{stage}.lease_wait"), lease_wait);
                }
                add(
                    format!("{stage}.transport"),
                    (round_trip.as_secs_f64() * 1e3 - worker_ms).max(0.0),
                );
                for (name, ms) in reply.phases {
                    add(name, ms);
                }
                Ok(reply.result)
            }
            Err(failure) => Err(unanswered(failure, stage, limit, |f| match f {
                WorkerFailure::Crashed { exit, .. } => {
                    format!("the kernel crashed its GPU worker ({exit})")
                }
                other => format!("the GPU worker failed: {other}"),
            })),
        }
    }

    /// Checks the baseline of `task` against the fp64 interpreter (GPU tests).
    pub fn check_baseline(
        &self,
        task: &str,
        preset: Preset,
        seed: u64,
    ) -> Result<BaselineCheck, String> {
        self.baseline_request(task, preset, seed, 0, false)
    }

    /// Times the baseline of `task` at `preset` (`reps` runs, L2 flushed before each; the
    /// median in [`BaselineCheck::median_ms`]) and, with `check`, also compares it and its fp64
    /// reference plan with the interpreter, in one request: `kevin tasks baseline`.
    pub fn time_baseline(
        &self,
        task: &str,
        preset: Preset,
        reps: u32,
        check: bool,
    ) -> Result<BaselineCheck, String> {
        self.baseline_request(task, preset, 7, reps.max(1), !check)
    }

    fn baseline_request(
        &self,
        task: &str,
        preset: Preset,
        seed: u64,
        time_reps: u32,
        time_only: bool,
    ) -> Result<BaselineCheck, String> {
        let req = EvalRequest::CheckBaseline {
            task: task.to_string(),
            preset,
            seed,
            time_reps,
            time_only,
        };
        match self.request(&req, "verify", self.verify_timeout) {
            Ok(EvalResult::Baseline(c)) => Ok(c),
            Ok(EvalResult::HarnessError(e)) => Err(e),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(o) => Err(o.feedback()),
        }
    }

    /// Forgets the phases seen so far.
    pub fn reset_phase_stats(&self) {
        self.phases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Worker statistics of every GPU's pool, in GPU order.
    pub fn gpu_pool_stats(&self) -> Vec<crate::worker::PoolStats> {
        self.pools.iter().map(WorkerPool::stats).collect()
    }
}

impl Drop for CudaEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

impl KernelEnv for CudaEnv {
    fn pool_stats(&self) -> Vec<(String, crate::worker::PoolStats)> {
        let mut out = vec![("compile".to_string(), self.compiler.pool_stats())];
        out.extend(
            self.gpu_pool_stats()
                .into_iter()
                .enumerate()
                .map(|(i, s)| (format!("cuda:{i}"), s)),
        );
        out
    }

    fn describe(&self) -> String {
        format!(
            "cuda environment: NVRTC CUBINs for {} ({} compile workers), {} GPU worker(s) on {} GPU(s); CUDA-event \
             timings against kevin's eager baseline{}",
            self.compiler.arch(),
            self.compiler.workers(),
            self.pools.iter().map(WorkerPool::workers).sum::<usize>(),
            self.pools.len(),
            if self.timing.leased() {
                ", under the GPU-wide timing lease"
            } else {
                ", without a timing lease (env.timing = \"shared\")"
            }
        )
    }

    fn device_memory_peak(&self) -> Option<u64> {
        Some(self.peak.load(Ordering::Relaxed))
    }

    /// Mean milliseconds per request of every phase seen so far, with its request count:
    /// `<stage>.lock_wait` (waiting for the GPU lock), `<stage>.lease_wait` (waiting for the
    /// GPU-wide timing lease, with `env.timing = "exclusive"`), `<stage>.transport` (round trip
    /// minus the worker's own time), and the worker's phases (`verify.load`,
    /// `verify.begin|run|tampering|compare|other`, `profile.load`, `profile.inputs`,
    /// `profile.timing`, `profile.recheck`, `release`).
    fn phase_stats(&self) -> Vec<(String, u64, f64)> {
        let phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        phases
            .iter()
            .map(|(k, &(n, total))| (k.clone(), n, total / n.max(1) as f64))
            .collect()
    }

    fn compile(&self, task_name: &str, source: &str) -> Result<Compiled, Outcome> {
        if let Some(reason) = self.refused.get(task_name) {
            return Err(Outcome::harness(reason.clone()));
        }
        let started = Instant::now();
        let kernel = self.compiler.compile(task_name, source)?;
        let n = self.compiles.fetch_add(1, Ordering::Relaxed);
        let module = self.workdir.join(format!("{task_name}-{n}.cubin"));
        let bytes = kernel.image.into_bytes();
        std::fs::write(&module, bytes).map_err(|e| {
            Outcome::harness(format!("the harness could not store the module: {e}"))
        })?;
        Ok(Compiled {
            task: task_name.to_string(),
            artifact: Arc::new(ModuleArtifact {
                owned: Owned::File,
                module,
                symbols: kernel.lowered_names,
                plan: kernel.plan,
            }),
            compile_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        let req = ModuleArtifact::verify_request(compiled, "CUDA", self.preset)?;
        self.request(&req, "verify", self.verify_timeout)?
            .verified("GPU")
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        let req = match ModuleArtifact::profile_request(compiled, "CUDA", self.preset) {
            Ok(req) => req,
            Err(o) => return o,
        };
        match self.request(&req, "profile", self.profile_timeout) {
            Ok(answer) => answer.timed("GPU"),
            Err(o) => o,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_that_does_not_fit_the_gpu_is_refused_by_name_and_bytes() {
        let suite = TaskSuite::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tasks")).unwrap();
        let none = oversized_tasks(&suite, Preset::Gpu, 0, u64::MAX);
        assert!(none.is_empty(), "{none:?}");
        let relu = crate::gpu::buffers::memory_need(suite.get("relu").unwrap(), Preset::Gpu)
            .unwrap()
            .peak();
        let refused = oversized_tasks(&suite, Preset::Gpu, 3, relu - 1);
        let reason = &refused["relu"];
        assert!(reason.contains("task `relu` at preset `gpu`"), "{reason}");
        assert!(reason.contains(&format!("needs {relu} bytes")), "{reason}");
        assert!(
            reason.contains(&format!("GPU 3 has {} bytes", relu - 1)),
            "{reason}"
        );
        let fits = oversized_tasks(&suite, Preset::Gpu, 3, relu);
        assert!(!fits.contains_key("relu"));
    }
}
