//! The "nvrtc" kernel environment: everything up to a loadable module is real, the rest is not
//! yet. A candidate goes through the static rules ([`crate::candidate::rules`]), its launch plan
//! is parsed and validated against the task's tensors and sizes, and its source is compiled by
//! NVRTC in a pool of `kevin worker --role compile` processes (untrusted source can hang or crash
//! NVRTC; a worker that does is killed at its deadline and replaced, and the candidate gets the
//! outcome). Correctness and timing are decided by the simulated environment until an execution
//! backend lands, and their outcomes say "simulated".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::candidate::{Limits, ResolvedPlan};
use crate::compile::{self, CompileError, CompilePool, CompileRequest, ModuleImage, OutputKind};
use crate::config::SimEnvSection;
use crate::env::sim::{SimArtifact, SimEnv};
use crate::env::{Compiled, KernelEnv};
use crate::outcome::Outcome;
use crate::tasks::{Preset, TaskSuite};
use crate::verify::request::unanswered;
use crate::worker::WorkerCommand;

/// A compiled candidate: the module image, the kernels' symbols and the resolved launch plan.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// PTX or CUBIN.
    pub image: ModuleImage,
    /// Source kernel name -> symbol in the module.
    pub lowered_names: std::collections::BTreeMap<String, String>,
    /// Launches with evaluated grids and resolved arguments.
    pub plan: ResolvedPlan,
}

/// What [`NvrtcEnv`] stores in [`Compiled::artifact`].
#[derive(Debug)]
struct Artifact {
    kernel: CompiledKernel,
    sim: SimArtifact,
}

/// The compile stage shared by the nvrtc and cuda environments: rules, launch-plan validation,
/// then NVRTC in a pool of compile workers.
pub struct NvrtcCompiler {
    suite: Arc<TaskSuite>,
    preset: Preset,
    arch: String,
    output: OutputKind,
    limits: Limits,
    pool: CompilePool,
    timeout: Duration,
}

impl NvrtcCompiler {
    /// Starts `workers` compile workers (`worker` is the command that runs one) producing
    /// `output` for `arch` ("auto" resolves to the GPU's). Fails, with the install hint, when
    /// NVRTC is not available in this process either.
    pub fn new(
        suite: Arc<TaskSuite>,
        preset: Preset,
        arch: &str,
        output: OutputKind,
        worker: WorkerCommand,
        workers: usize,
        timeout_ms: u64,
    ) -> Result<NvrtcCompiler, String> {
        compile::locate_nvrtc().map_err(|e| e.to_string())?;
        let pool = compile::spawn_compile_pool(worker, workers)
            .map_err(|e| format!("compile workers: {e}"))?;
        Ok(NvrtcCompiler {
            suite,
            preset,
            arch: crate::machine::resolve_arch(arch),
            output,
            limits: Limits::default(),
            pool,
            timeout: Duration::from_millis(timeout_ms),
        })
    }

    /// The architecture compiled for.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Number of compile workers.
    pub fn workers(&self) -> usize {
        self.pool.workers()
    }

    /// The compile pool's counters.
    pub fn pool_stats(&self) -> crate::worker::PoolStats {
        self.pool.stats()
    }

    /// Admits and compiles one candidate; a rejection or a failed compile is its outcome.
    pub fn compile(&self, task_name: &str, source: &str) -> Result<CompiledKernel, Outcome> {
        let plan = super::admit_named(&self.suite, task_name, self.preset, &self.limits, source)?;
        self.compile_admitted(source, plan)
    }

    /// Compiles a candidate that was admitted already (its `plan` resolved); a failed compile is
    /// its outcome: NVRTC's log as a compile error, a rule on what was compiled as a format error,
    /// a hung or crashed compiler as the worker failure's outcome.
    pub fn compile_admitted(
        &self,
        source: &str,
        plan: ResolvedPlan,
    ) -> Result<CompiledKernel, Outcome> {
        match self.request(source, &plan)? {
            Ok(out) => Ok(CompiledKernel {
                image: out.image,
                lowered_names: out.lowered_names,
                plan,
            }),
            Err(e) => Err(compile_error_outcome(e)),
        }
    }

    /// The compile worker's answer for an admitted candidate; a worker that does not answer (a
    /// hung or crashed compiler) is the candidate's outcome.
    pub fn request(
        &self,
        source: &str,
        plan: &ResolvedPlan,
    ) -> Result<compile::CompileResponse, Outcome> {
        let mut names: Vec<&str> = plan.launches.iter().map(|l| l.kernel.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let mut request = CompileRequest::ptx(source, &names);
        request.arch = self.arch.clone();
        request.output = self.output;
        self.pool
            .request_with_timeout(&request, self.timeout)
            .map_err(|failure| {
                unanswered(failure, "compile", self.timeout, |f| {
                    format!("the compiler failed on this kernel: {f}")
                })
            })
    }
}

/// The outcome of a compile that produced no module: NVRTC's log as a compile error, a rule on
/// what was compiled as a format error, anything else as a compile error saying what failed.
pub fn compile_error_outcome(e: CompileError) -> Outcome {
    match e {
        CompileError::Source { log } => Outcome::CompileError { log },
        CompileError::Rule { reason } => Outcome::FormatError { reason },
        e => Outcome::CompileError { log: e.to_string() },
    }
}

/// The environment.
pub struct NvrtcEnv {
    compiler: NvrtcCompiler,
    sim: SimEnv,
    /// Evaluations so far: salts the simulated verdicts, so an unchanged kernel submitted again
    /// (by another trajectory or a later turn) is judged afresh rather than identically.
    evaluations: AtomicU64,
}

impl NvrtcEnv {
    /// Starts `workers` compile workers (`worker` is the command that runs one). Fails, with the
    /// install hint, when NVRTC is not available in this process either.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        suite: Arc<TaskSuite>,
        preset: Preset,
        arch: &str,
        worker: WorkerCommand,
        workers: usize,
        timeout_ms: u64,
        sim: SimEnvSection,
    ) -> Result<NvrtcEnv, String> {
        let compiler = NvrtcCompiler::new(
            suite,
            preset,
            arch,
            OutputKind::Ptx,
            worker,
            workers,
            timeout_ms,
        )?;
        Ok(NvrtcEnv {
            compiler,
            sim: SimEnv::new(sim),
            evaluations: AtomicU64::new(0),
        })
    }

    fn sim_compiled(compiled: &Compiled) -> Compiled {
        let sim = compiled
            .artifact
            .downcast_ref::<Artifact>()
            .map_or(SimArtifact::of(""), |a| a.sim);
        Compiled {
            task: compiled.task.clone(),
            artifact: Arc::new(sim),
            compile_ms: compiled.compile_ms,
        }
    }

    /// The compiled kernel inside an artifact this environment made.
    pub fn kernel(compiled: &Compiled) -> Option<&CompiledKernel> {
        compiled
            .artifact
            .downcast_ref::<Artifact>()
            .map(|a| &a.kernel)
    }
}

impl KernelEnv for NvrtcEnv {
    fn describe(&self) -> String {
        format!(
            "nvrtc environment: real rules, launch-plan validation and NVRTC compilation for {} in {} worker \
             process(es); correctness and timing simulated",
            self.compiler.arch(),
            self.compiler.workers()
        )
    }

    fn compile(&self, task_name: &str, source: &str) -> Result<Compiled, Outcome> {
        let started = Instant::now();
        let kernel = self.compiler.compile(task_name, source)?;
        Ok(Compiled {
            task: task_name.to_string(),
            artifact: Arc::new(Artifact {
                kernel,
                sim: SimArtifact::of(source)
                    .salted(self.evaluations.fetch_add(1, Ordering::Relaxed)),
            }),
            compile_ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        self.sim.verify(&Self::sim_compiled(compiled))
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        self.sim.profile(&Self::sim_compiled(compiled))
    }
}
