//! Wiring and lifecycle of a training run: open and recover the run directory, build the
//! components the config names, start every actor, run until the learner reaches `max_steps` or
//! the shutdown future resolves, then drain and stop in order.
//!
//! Shutdown, as mini-redis does it: the shutdown signal is a parameter of [`train`]. On it, the
//! task sampler starts nothing new, in-flight episodes finish (up to `run.drain_timeout_s`) and
//! their groups reach the write-ahead log, the learner finishes its step and writes the final
//! checkpoint, telemetry is flushed, and only then does `train` return.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use kevin::config::{Config, ConfigFile, LearnerKind, PolicyKind, TaskSource};
use kevin::env::{EnvSpec, KernelEnv};
use kevin::episode::EpisodeTask;
use kevin::replay::ReplayBuffer;
use kevin::run_dir::{Counters, RunDir, RunDirError};
use kevin::sampler::TaskSampler;
use kevin::sim::{SimLearner, SimPolicy};
use kevin::tasks::{Split, TaskSuite};
use kevin::telemetry::TraceStats;
use tokio::sync::{oneshot, watch, Semaphore};

use crate::pipeline::compiler::Compiler;
use crate::pipeline::failures::Failures;
use crate::pipeline::generator::Generator;
use crate::pipeline::learner::{LearnerActor, LearnerCtx, LearnerSignal};
use crate::pipeline::mailbox::{Handle, Mailbox};
use crate::pipeline::messages::{Finish, Flush, PublishWeights, StopSampling};
use crate::pipeline::profiler::Profiler;
use crate::pipeline::replay_queue::ReplayQueue;
use crate::pipeline::rollout::{Rollout, RolloutShared};
use crate::pipeline::task_sampler::TaskSamplerActor;
use crate::pipeline::telemetry::Telemetry;
use crate::pipeline::verifier::Verifier;

/// What `kevin train` runs.
pub struct TrainOptions {
    /// The validated configuration (with `--max-steps` applied).
    pub config: Config,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Live trace statistics, when the trace layer is installed.
    pub trace_stats: Option<Arc<TraceStats>>,
}

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum StopReason {
    /// `run.max_steps` reached.
    MaxSteps,
    /// The shutdown future resolved (SIGINT/SIGTERM).
    Signal,
    /// The run directory's disk ran low (below `run.min_free_disk_mb`): what was measured.
    DiskLow(String),
}

/// `phases` as one line: `name mean_ms (requests)`, the costliest in total first.
fn phase_line(phases: &[(String, u64, f64)]) -> String {
    let mut sorted: Vec<&(String, u64, f64)> = phases.iter().collect();
    sorted.sort_by(|a, b| (b.1 as f64 * b.2).total_cmp(&(a.1 as f64 * a.2)));
    sorted
        .iter()
        .map(|(name, n, ms)| format!("{name} {ms:.1} ({n})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a training session did.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Learner version resumed from (None: a fresh run).
    pub resumed_from: Option<u64>,
    /// Groups recovered from the write-ahead log into the queue.
    pub recovered_groups: usize,
    /// Learner version at the end.
    pub version: u64,
    /// Learner steps in this session.
    pub steps: u64,
    /// Turns generated and evaluated in this session.
    pub turns: u64,
    /// Groups still running when the drain timed out (their work is lost; nothing accepted is).
    pub abandoned_groups: usize,
    /// Why it stopped.
    pub reason: StopReason,
    /// The final checkpoint.
    pub checkpoint: Option<PathBuf>,
}

/// A training session that could not start or failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The run directory could not be opened, read or written.
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    /// The run directory was started with a different configuration.
    #[error("run directory {dir} was started with a different config ({key} differs); resume it with the same config or choose another --run-dir")]
    ConfigMismatch {
        /// The run directory.
        dir: String,
        /// The first differing key.
        key: String,
    },
    /// A component could not be set up (task suite, compiler, ...).
    #[error("{0}")]
    Setup(String),
    /// A component failed fatally during the run.
    #[error("training failed: {0}")]
    Failed(String),
}

/// The first dotted key whose value differs between two configs, ignoring `run.max_steps` (which
/// a resumed run may raise): what makes [`train`] refuse to resume a run directory, and what
/// `kevin sweep` checks before it launches anything.
pub fn first_difference(a: &ConfigFile, b: &ConfigFile) -> Option<String> {
    fn walk(a: &toml::Value, b: &toml::Value, prefix: &str) -> Option<String> {
        match (a, b) {
            (toml::Value::Table(ta), toml::Value::Table(tb)) => {
                let keys: std::collections::BTreeSet<_> = ta.keys().chain(tb.keys()).collect();
                keys.into_iter().find_map(|k| {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    match (ta.get(k), tb.get(k)) {
                        (Some(x), Some(y)) => walk(x, y, &key),
                        _ => Some(key),
                    }
                })
            }
            _ if a == b => None,
            _ => Some(prefix.to_string()),
        }
    }
    let mut a = a.clone();
    let mut b = b.clone();
    // What may change when a run resumes: how far it goes, and how its files are kept.
    for c in [&mut a, &mut b] {
        c.run.max_steps = 0;
        c.replay.wal_segment_kb = 0;
        c.run.max_disk_gb = 0.0;
        c.run.min_free_disk_mb = 0;
        c.telemetry.rotate_kb = 0;
    }
    walk(
        &toml::Value::try_from(&a).ok()?,
        &toml::Value::try_from(&b).ok()?,
        "",
    )
}

/// The task suite (None for simulated tasks).
fn load_suite(config: &Config) -> Result<Option<Arc<TaskSuite>>, TrainError> {
    match config.tasks.source {
        TaskSource::Simulated => Ok(None),
        TaskSource::Suite => TaskSuite::load(&config.tasks.dir)
            .map(|s| Some(Arc::new(s)))
            .map_err(|e| {
                TrainError::Setup(format!(
                    "task suite (tasks.dir = {:?}): {e}",
                    config.tasks.dir
                ))
            }),
    }
}

/// The tasks episodes are sampled from: the train split only.
fn build_tasks(
    config: &Config,
    suite: Option<&TaskSuite>,
) -> Result<Vec<Arc<EpisodeTask>>, TrainError> {
    if let Some(suite) = suite {
        return suite
            .split(Split::Train)
            .map(|t| {
                let statement = kevin::prompt::first_turn(t, config.tasks.preset)
                    .map_err(|e| TrainError::Setup(format!("task {}: {e}", t.name)))?;
                Ok(Arc::new(EpisodeTask {
                    name: t.name.clone(),
                    level: t.level,
                    statement,
                }))
            })
            .collect();
    }
    Ok(match config.tasks.source {
        TaskSource::Suite => Vec::new(),
        TaskSource::Simulated => (0..config.tasks.simulated_count)
            .map(|i| {
                Arc::new(EpisodeTask {
                    name: format!("sim-{i:03}"),
                    level: 1 + (i % 2) as u8,
                    statement: format!(
                        "Simulated task {i} (no real kernel is asked for: the simulated environment scores \
                         responses by chance).\nAnswer with a ```cuda block and a summary."
                    ),
                })
            })
            .collect(),
    })
}

/// `tasks.prior`'s correct-turn rate of each task (None without one): an error when a file is
/// not an evaluation's JSON or covers none of `tasks`.
fn read_prior(
    config: &Config,
    tasks: &[Arc<EpisodeTask>],
) -> Result<Option<std::collections::BTreeMap<String, f64>>, TrainError> {
    if config.tasks.prior.is_empty() {
        return Ok(None);
    }
    // Several files joined as `tasks.dir`'s folders are: a later file's rate of a task wins.
    let mut rates = std::collections::BTreeMap::new();
    for path in kevin::tasks::suite_dirs(std::path::Path::new(&config.tasks.prior)) {
        let more = kevin::policy_eval::compare::task_correct_rates(&path)
            .map_err(|e| TrainError::Setup(format!("tasks.prior: {e}")))?;
        if !tasks.iter().any(|t| more.contains_key(&t.name)) {
            return Err(TrainError::Setup(format!(
                "tasks.prior: {} covers none of the run's {} training tasks (evaluate the \
                 starting policy on them: kevin eval --split train --dir DIR --json FILE)",
                path.display(),
                tasks.len()
            )));
        }
        rates.extend(more);
    }
    Ok(Some(rates))
}

/// The policy and the learner the config names. The burn pair is built together, on the backend
/// `[policy.burn].device` picks at run time, so that both start from the same weights (see
/// `kevin_policy::runtime`); the burn types are `Send`, so they move to the policy and learner
/// threads like the simulated ones.
fn build_policy_and_learner(
    config: &Config,
) -> Result<kevin_policy::runtime::PolicyAndLearner, TrainError> {
    match (config.policy.kind, config.learner.kind) {
        (PolicyKind::Burn, LearnerKind::Burn) => {
            kevin_policy::runtime::build(config).map_err(TrainError::Setup)
        }
        (PolicyKind::Simulated, LearnerKind::Simulated) => Ok((
            Box::new(SimPolicy::new(config.policy.simulated.clone())),
            Box::new(SimLearner::from_config(
                &config.learner,
                config.sampling.max_new_tokens,
            )),
        )),
        // Config validation refuses these: the burn learner and policy come as a pair.
        (policy, learner) => Err(TrainError::Setup(format!(
            "policy.kind = {policy:?} with learner.kind = {learner:?}: the burn policy and learner \
             come as a pair"
        ))),
    }
}

fn build_env(
    config: &Config,
    suite: Option<&Arc<TaskSuite>>,
) -> Result<Arc<dyn KernelEnv>, TrainError> {
    let tasks_dir = std::path::Path::new(&config.tasks.dir);
    let spec = EnvSpec::from_config(config);
    // The evaluation cache stands in front of real verdicts only: the simulated environments
    // draw theirs per candidate, and a cache would change their statistics.
    let cache = match spec {
        EnvSpec::Simulated(_) | EnvSpec::Nvrtc { .. } => 0,
        _ => config.env.cache_entries as usize,
    };
    let env = match spec {
        // The core has no NATS client: the remote environment is this crate's.
        EnvSpec::Remote {
            preset,
            deadlines,
            remote,
        } => {
            let suite = suite
                .ok_or_else(|| {
                    TrainError::Setup("env.kind = \"remote\" needs the task suite".into())
                })?
                .clone();
            crate::remote::RemoteEnv::start(&remote, preset, deadlines, suite, tasks_dir)
                .map(|env| Arc::new(env) as Arc<dyn KernelEnv>)
                .map_err(TrainError::Setup)?
        }
        spec => kevin::env::build(spec, suite, tasks_dir).map_err(TrainError::Setup)?,
    };
    Ok(kevin::env::cached(env, cache))
}

/// The Compiler stage's concurrency and deadline. A remote environment's `compile` holds one job
/// on the bus until its node's final outcome is back, so the stage runs `env.remote.max_inflight`
/// of them at once and waits up to `env.remote.job_timeout_ms` (the environment answers a harness
/// error by then itself).
fn compile_stage(config: &Config) -> (usize, u64) {
    if config.env.kind == kevin::config::EnvKind::Remote {
        (
            config.env.remote.max_inflight as usize,
            config.env.remote.job_timeout_ms,
        )
    } else {
        (
            config.env.compile_workers as usize,
            config.env.compile_timeout_ms,
        )
    }
}

/// Runs a training session until `max_steps` or `shutdown`. Blocks the calling thread (it runs
/// its own actix system).
pub fn train(
    opts: TrainOptions,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<TrainSummary, TrainError> {
    let config = opts.config;
    let run_dir = Arc::new(RunDir::open(&opts.run_dir)?);
    if let Some(stored) = run_dir.stored_config()? {
        if let Some(key) = first_difference(&stored, &config.file) {
            return Err(TrainError::ConfigMismatch {
                dir: opts.run_dir.display().to_string(),
                key,
            });
        }
    }
    run_dir.write_config(&config.to_toml())?;
    // Recovery (the WAL's pending groups, the learner's record) runs on a thread of its own while
    // this one loads the suite, the policy and the environment, which a fresh start does too: a
    // restart then costs about what the longer of the two costs, not their sum. Its errors come
    // first, as when it ran alone.
    let segment_bytes = config.replay.wal_segment_kb.saturating_mul(1 << 10);
    let recover = || {
        let started = Instant::now();
        let recovery = run_dir.recover(segment_bytes);
        (recovery, started.elapsed().as_secs_f64() * 1e3)
    };
    let (recovered, setup) = std::thread::scope(|scope| {
        let recovering = std::thread::Builder::new()
            .name("recovery".into())
            .spawn_scoped(scope, recover);
        let setup = (|| {
            let suite = load_suite(&config)?;
            let tasks = build_tasks(&config, suite.as_deref())?;
            if tasks.is_empty() {
                return Err(TrainError::Setup(
                    "no training tasks: the suite's train split is empty".into(),
                ));
            }
            // Read before the policy loads, so that a bad prior costs no model load. Not where
            // checkpoints exist: a resumed run uses its checkpoint's sampler state and may no
            // longer have the file, which is read only if recovery finds nothing to resume.
            let prior = if kevin::run_dir::has_checkpoint_dirs(&opts.run_dir) {
                None
            } else {
                Some(read_prior(&config, &tasks)?)
            };
            let (policy, learner) = build_policy_and_learner(&config)?;
            let env = build_env(&config, suite.as_ref())?;
            Ok((tasks, prior, policy, learner, env))
        })();
        let recovered = match recovering {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: recover on this one.
            Err(_) => recover(),
        };
        (recovered, setup)
    });
    let (recovery, recovery_ms) = recovered;
    let recovery = recovery?;
    let (tasks, prior, policy, mut learner, env) = setup?;
    if recovery.wal_compaction.deleted > 0 {
        tracing::info!(
            segments = recovery.wal_compaction.deleted,
            bytes = recovery.wal_compaction.bytes,
            "deleted write-ahead log segments the checkpoint covers"
        );
    }
    for skipped in &recovery.skipped {
        tracing::warn!(checkpoint = %skipped.display(), "skipped an incomplete checkpoint; using the previous one");
    }
    if recovery.record_lines_cut > 0 {
        tracing::warn!(
            lines = recovery.record_lines_cut,
            "learner steps after the last checkpoint will be redone"
        );
    }

    let mut sampler = TaskSampler::new(
        tasks.iter().map(|t| t.name.clone()).collect(),
        config.run.seed,
    )
    .with_floor(config.tasks.floor);
    // A fresh start only: a checkpoint's sampler state is what the run learned since.
    let prior = match (&recovery.checkpoint, prior) {
        (Some(_), _) => None,
        (None, Some(read)) => read,
        (None, None) => read_prior(&config, &tasks)?,
    };
    if let Some(rates) = &prior {
        let set = sampler.set_prior(rates);
        let never = tasks
            .iter()
            .filter(|t| rates.get(&t.name) == Some(&0.0))
            .count();
        tracing::info!(
            prior = %config.tasks.prior,
            tasks = set,
            of = tasks.len(),
            never_solved = never,
            floor = config.tasks.floor,
            "sampler: averages start at the prior's correct-turn rates"
        );
    }
    let mut base_counters = Default::default();
    let resumed_from = match &recovery.checkpoint {
        Some((path, state)) => {
            learner
                .load(&path.join("learner"))
                .map_err(RunDirError::from)?;
            if let Some(s) = &state.sampler {
                sampler.restore(s.clone());
            }
            base_counters = state.counters.clone();
            Some(state.learner_version)
        }
        None => None,
    };
    // Sequence numbers are given out from 0 without gaps, so the groups accepted before this
    // session are exactly `next_seq`, including those accepted after the checkpoint (a kill -9
    // leaves them in the log, uncounted by the checkpoint's counters).
    let base_counters = Counters {
        groups_accepted: recovery.next_seq,
        ..base_counters
    };
    tracing::info!(policy = %policy.describe(), env = %env.describe(), learner = %learner.describe(), "components");
    match resumed_from {
        Some(v) => {
            tracing::info!(run_dir = %opts.run_dir.display(), version = v, recovered_groups = recovery.pending.len(), wal_records_read = recovery.wal_records_read, recovery_ms = format_args!("{recovery_ms:.1}"), "resuming")
        }
        None => tracing::info!(run_dir = %opts.run_dir.display(), "starting a new run"),
    }
    let recovered_groups = recovery.pending.len();
    // `/metrics` for Prometheus, bound before any actor starts: an address that cannot be bound
    // stops the daemon here, naming it. The server lives as long as this function.
    let (exporter, _prometheus) = match config.telemetry.prometheus.as_str() {
        "" => (None, None),
        addr => {
            let pools_env = env.clone();
            let exporter = Arc::new(kevin::prometheus::Exporter::with_pools(Box::new(
                move || pools_env.pool_stats(),
            )));
            let server = kevin::prometheus::Server::start(addr, exporter.clone()).map_err(|e| {
                TrainError::Setup(format!(
                    "telemetry.prometheus = {addr:?}: cannot listen there: {e}"
                ))
            })?;
            tracing::info!(addr = %server.addr(), "serving Prometheus metrics at /metrics");
            (Some(exporter), Some(server))
        }
    };
    let buffer = ReplayBuffer::new(
        config.replay.clone(),
        config
            .replay
            .wal
            .then(|| Box::new(recovery.wal) as Box<dyn kevin::replay::GroupLog>),
        recovery.pending,
        recovery.next_seq,
    );

    let phases_env = env.clone();
    let system = actix::System::new();
    let result = system.block_on(async move {
        let failures = Arc::new(Failures::default());
        let m = config.rollout.trajectories as usize;
        let inflight_groups = config.rollout.max_inflight_groups as usize;
        let mb_rollout = Mailbox::new("Rollout", 4);
        let mb_generator = Mailbox::new("Generator", inflight_groups * m);
        let (compile_threads, compile_limit_ms) = compile_stage(&config);
        let mb_compiler = Mailbox::new("Compiler", 2 * compile_threads);
        let mb_verifier = Mailbox::new("Verifier", 2 * config.env.verify_workers as usize);
        let mb_profiler = Mailbox::new("Profiler", 2 * config.env.profile_workers as usize);
        let mb_replay = Mailbox::new("ReplayQueue", 8);
        let mb_telemetry = Mailbox::new("Telemetry", 64);
        let mailboxes =
            vec![&mb_rollout, &mb_generator, &mb_compiler, &mb_verifier, &mb_profiler, &mb_replay, &mb_telemetry]
                .into_iter()
                .cloned()
                .collect();

        // File I/O actors get their own arbiters (threads): their blocking writes stall nobody else.
        let io_arbiter = Arbiter::new();
        let replay_arbiter = Arbiter::new();
        let telemetry = Telemetry::open(run_dir.path(), config.telemetry.episodes, config.telemetry.rotate_kb.saturating_mul(1 << 10), mb_telemetry.capacity(), exporter)
            .map_err(|e| TrainError::Failed(format!("{}: {e}", run_dir.path().display())))?;
        let telemetry = Handle { addr: Telemetry::start_in_arbiter(&io_arbiter.handle(), |_| telemetry), mailbox: mb_telemetry };

        let profiler = {
            let (env, f) = (env.clone(), failures.clone());
            let (w, t, c) = (config.env.profile_workers as usize, config.env.profile_timeout_ms, mb_profiler.capacity());
            Handle { addr: Supervisor::start(move |_| Profiler::new(env, w, t, c, f)), mailbox: mb_profiler }
        };
        let verifier = {
            let (env, f, p) = (env.clone(), failures.clone(), profiler.clone());
            let (w, t, c) = (config.env.verify_workers as usize, config.env.verify_timeout_ms, mb_verifier.capacity());
            Handle { addr: Supervisor::start(move |_| Verifier::new(env, w, p, t, c, f)), mailbox: mb_verifier }
        };
        let compiler = {
            let (env, f, v) = (env.clone(), failures.clone(), verifier.clone());
            let (w, t, c) = (compile_threads, compile_limit_ms, mb_compiler.capacity());
            Handle { addr: Supervisor::start(move |_| Compiler::new(env, w, v, t, c, f)), mailbox: mb_compiler }
        };
        let generator = Handle {
            addr: Generator::new(policy, config.sampling.clone(), mb_generator.capacity(), failures.clone()).start(),
            mailbox: mb_generator,
        };
        // The generator starts with the learner's weights, so versions agree from the first turn.
        generator.addr.do_send(PublishWeights(learner.weights()));

        // The replay queue sends feedback to the sampler through a recipient (by do_send, which
        // never blocks): create the sampler's context first to get its address.
        let sampler_ctx = Context::<TaskSamplerActor>::new();
        let sampler_addr = sampler_ctx.address();
        let replay = {
            let (s, t, f, c) = (sampler_addr.clone().recipient(), telemetry.clone(), failures.clone(), mb_replay.capacity());
            Handle { addr: ReplayQueue::start_in_arbiter(&replay_arbiter.handle(), move |_| ReplayQueue::new(buffer, s, t, c, f)), mailbox: mb_replay }
        };
        let inflight = Arc::new(AtomicUsize::new(0));
        let turns_done = Arc::new(AtomicU64::new(0));
        let rollout = Handle {
            addr: Rollout::new(
                Arc::new(RolloutShared {
                    cfg: config.rollout.clone(),
                    seed: config.run.seed,
                    generator: generator.clone(),
                    compiler: compiler.clone(),
                    replay: replay.clone(),
                    inflight: inflight.clone(),
                    turns_done: turns_done.clone(),
                    failures: failures.clone(),
                }),
                mb_rollout.capacity(),
            )
            .start(),
            mailbox: mb_rollout,
        };
        let version0 = learner.version();
        let (version_tx, version_rx) = watch::channel(version0);
        let (signal_tx, signal_rx) = oneshot::channel();
        let learner = LearnerActor::new(LearnerCtx {
            learner: Arc::new(Mutex::new(learner)),
            run_dir: run_dir.clone(),
            replay: replay.addr.clone(),
            generator: generator.addr.clone(),
            sampler: sampler_addr.clone(),
            telemetry: telemetry.addr.clone(),
            version_tx,
            max_steps: config.run.max_steps,
            checkpoint_every: config.run.checkpoint_every,
            base_counters,
            mailboxes,
            failures: failures.clone(),
            trace_stats: opts.trace_stats.clone(),
            turns_done: turns_done.clone(),
            env: env.clone(),
            signal: Some(signal_tx),
        })
        .start();
        sampler_ctx.run(TaskSamplerActor::new(
            sampler,
            tasks,
            rollout,
            Arc::new(Semaphore::new(inflight_groups)),
            config.run.mode,
            config.replay.tasks_per_batch,
            version_rx,
        ));

        // Run until the learner is done or we are told to stop.
        let mut failed = None;
        let watch = watch_disk(run_dir.path().to_path_buf(), (config.run.max_disk_gb * 1e9) as u64, config.run.min_free_disk_mb.saturating_mul(1 << 20));
        let reason = tokio::select! {
            _ = shutdown => StopReason::Signal,
            low = watch => StopReason::DiskLow(low),
            s = signal_rx => match s {
                Ok(LearnerSignal::MaxSteps) => StopReason::MaxSteps,
                Ok(LearnerSignal::Failed(e)) => { failed = Some(e); StopReason::Signal }
                Err(_) => { failed = Some("the learner stopped unexpectedly".into()); StopReason::Signal }
            },
        };
        tracing::info!(?reason, "stopping: no new groups; draining in-flight episodes");
        let _ = sampler_addr.send(StopSampling).await;
        let deadline = Instant::now() + Duration::from_secs_f64(config.run.drain_timeout_s);
        while inflight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let abandoned_groups = inflight.load(Ordering::SeqCst);
        if abandoned_groups > 0 {
            tracing::warn!(groups = abandoned_groups, "drain timed out: these groups were never accepted and are lost");
        }
        let phases = phases_env.phase_stats();
        if !phases.is_empty() {
            tracing::info!(phases = %phase_line(&phases), "evaluation requests' time (mean ms a request, requests)");
        }
        if let Some(c) = phases_env.cache_stats() {
            tracing::info!(cache = %c.line(), "evaluation cache");
        }
        let summary = learner.send(Finish).await.map_err(|e| TrainError::Failed(format!("learner: {e}")))?;
        let _ = telemetry.addr.send(Flush).await;
        io_arbiter.stop();
        replay_arbiter.stop();
        if let Some(e) = failed.or(summary.error.clone()) {
            return Err(TrainError::Failed(e));
        }
        Ok(TrainSummary {
            run_dir: opts.run_dir.clone(),
            resumed_from,
            recovered_groups,
            version: summary.version,
            steps: summary.steps,
            turns: turns_done.load(Ordering::Relaxed),
            abandoned_groups,
            reason,
            checkpoint: summary.checkpoint,
        })
    });
    result
}

/// How often [`watch_disk`] looks.
const DISK_CHECK_EVERY: Duration = Duration::from_secs(2);

/// Keeps the run directory within `budget` bytes (0: none) by removing its oldest rotated
/// archives, and resolves, naming what it measured, once the disk holding it has less than
/// `min_free` bytes free: the run then stops as on a signal (drain, checkpoint) while there is
/// still room to do so, and exits non-zero.
async fn watch_disk(dir: PathBuf, budget: u64, min_free: u64) -> String {
    use kevin::telemetry::files;
    let mut warned_over = false;
    loop {
        let d = dir.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let budget_check = (budget > 0).then(|| files::enforce_budget(&d, budget));
            (budget_check, files::free_bytes(&d))
        })
        .await;
        if let Ok((budget_check, free)) = checked {
            match budget_check {
                Some(Ok(c)) => {
                    if !c.removed.is_empty() {
                        tracing::info!(
                            removed = c.removed.len(),
                            bytes_before = c.before,
                            bytes_after = c.after,
                            "run directory over run.max_disk_gb: removed its oldest archives"
                        );
                    }
                    if c.over(budget) && !warned_over {
                        tracing::warn!(bytes = c.after, budget, "run directory over run.max_disk_gb with no archive left to remove (the write-ahead log, checkpoints and metrics stay)");
                    }
                    warned_over = c.over(budget);
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "could not keep the run directory within run.max_disk_gb")
                }
                None => {}
            }
            match free {
                Ok(free) if free < min_free => {
                    return format!(
                        "{} MB free on the disk of {}, below run.min_free_disk_mb ({} MB)",
                        free >> 20,
                        dir.display(),
                        min_free >> 20
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not measure the free disk space"),
            }
        }
        tokio::time::sleep(DISK_CHECK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_line_puts_the_costliest_phase_first() {
        let phases = vec![
            ("profile.load".to_string(), 10, 1.0),
            ("verify.lock_wait".to_string(), 4, 50.0),
            ("profile.timing".to_string(), 100, 12.345),
        ];
        assert_eq!(
            phase_line(&phases),
            "profile.timing 12.3 (100), verify.lock_wait 50.0 (4), profile.load 1.0 (10)"
        );
        assert_eq!(phase_line(&[]), "");
    }

    #[test]
    fn config_differences_name_the_key() {
        let a = ConfigFile::default();
        let mut b = a.clone();
        b.run.max_steps = 99;
        assert_eq!(
            first_difference(&a, &b),
            None,
            "max_steps may change on resume"
        );
        b.rollout.turns = 7;
        assert_eq!(first_difference(&a, &b).as_deref(), Some("rollout.turns"));
    }
}
