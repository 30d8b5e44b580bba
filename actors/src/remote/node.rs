//! The worker node (`kevin worker-node`): pulls jobs from the fleet's consumer, evaluates each with
//! the local environment of its backend (compile, verify, profile: [`kevin::env::build`]),
//! publishes the result, and only once JetStream has stored it acknowledges the job.
//!
//! A node takes no more jobs than it has free slots (`--jobs`), so a job's `ack_wait` runs while
//! it is evaluated, not while it waits on the node; a job evaluated for longer (its deadlines are
//! the work's own time, moved on while a busy machine makes it wait for a CPU) is reported in
//! progress every third of `ack_wait`, so it is redelivered only when its node is gone. The task suite of a job is fetched from the
//! task bucket on a miss, each task file once by its content hash, into the cache folder; one
//! local environment (with its worker processes) is kept per suite, preset and deadlines.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, message::PublishMessage, AckKind};
use futures_util::StreamExt;
use tokio::sync::{Mutex, Semaphore};

use kevin::config::SimEnvSection;
use kevin::env::{EnvSpec, KernelEnv};
use kevin::outcome::Outcome;
use kevin::tasks::TaskSuite;

use super::{content_hash, now_unix_ms, Connection, Ended, Job, JobResult, Names, SuiteEntry};

/// A node's settings.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The bus.
    pub conn: Connection,
    /// The fleet's prefix.
    pub prefix: String,
    /// "cpu", "cuda" or "sim" (None: the machine's default).
    pub backend: Option<String>,
    /// Worker processes of the local environment.
    pub workers: usize,
    /// Jobs evaluated at once.
    pub jobs: usize,
    /// Where fetched task files and suites are kept.
    pub cache: PathBuf,
    /// This node's name in results and logs.
    pub name: String,
}

type Envs = Mutex<HashMap<String, Arc<dyn KernelEnv>>>;

/// `--backend sim`: simulated verdicts that cost nothing, so a node's answer time is the bus's.
pub fn sim_no_cost() -> SimEnvSection {
    SimEnvSection {
        compile_ms: 0.0,
        verify_ms: 0.0,
        profile_ms: 0.0,
        ..SimEnvSection::default()
    }
}

struct Node {
    opts: NodeOptions,
    js: jetstream::Context,
    kv: jetstream::kv::Store,
    envs: Envs,
    /// How often a job in evaluation is reported in progress: a third of the consumer's
    /// `ack_wait`, so a job that runs past it (its deadlines moved on by a busy machine) is not
    /// redelivered to another node while this one still works on it.
    progress_every: Duration,
}

/// Runs the node until `stop()` turns true (checked between pulls); jobs in hand are finished
/// first. Errors (the server unreachable, the credentials refused) are one line.
pub async fn run(opts: NodeOptions, stop: impl Fn() -> bool) -> Result<(), String> {
    let names = Names::new(&opts.prefix);
    let client = opts.conn.connect().await?;
    tracing::info!(
        node = %opts.name,
        server = ?opts.conn,
        "worker node connected"
    );
    let js = jetstream::new(client);
    // The daemon declares the queue; a node started first waits for it.
    let mut said = false;
    let (consumer, kv) = loop {
        let found = async {
            let stream = js.get_stream(names.jobs_stream()).await.ok()?;
            let consumer: consumer::PullConsumer =
                stream.get_consumer(&names.nodes_consumer()).await.ok()?;
            let kv = js.get_key_value(names.tasks_bucket()).await.ok()?;
            Some((consumer, kv))
        };
        if let Some(found) = found.await {
            break found;
        }
        if stop() {
            return Ok(());
        }
        if !said {
            tracing::info!(
                stream = %names.jobs_stream(),
                "waiting for a daemon (env.kind = \"remote\") to declare the job queue"
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    std::fs::create_dir_all(opts.cache.join("tasks"))
        .map_err(|e| format!("{}: {e}", opts.cache.display()))?;
    let slots = Arc::new(Semaphore::new(opts.jobs.max(1)));
    let progress_every =
        (consumer.cached_info().config.ack_wait / 3).max(Duration::from_millis(500));
    let node = Arc::new(Node {
        opts,
        js,
        kv,
        envs: Mutex::new(HashMap::new()),
        progress_every,
    });
    tracing::info!(node = %node.opts.name, jobs = node.opts.jobs, "pulling jobs");
    while !stop() {
        // One slot at least, then every free one: never more jobs than can start now.
        let Ok(first) = slots.clone().acquire_owned().await else {
            break;
        };
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let batch = consumer
            .batch()
            .max_messages(permits.len())
            .expires(Duration::from_secs(1))
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("pulling jobs: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(m) = batch.next().await {
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!("pulling jobs: {e}");
                    continue;
                }
            };
            let Some(permit) = permits.pop() else {
                // More than asked for: leave it to another pull.
                let _ = m.ack_with(AckKind::Nak(None)).await;
                continue;
            };
            let node = node.clone();
            tokio::spawn(async move {
                node.handle(m).await;
                drop(permit);
            });
        }
    }
    // Finish the jobs in hand.
    let _ = slots.acquire_many(node.opts.jobs.max(1) as u32).await;
    Ok(())
}

impl Node {
    /// One job: evaluate, publish the result, then acknowledge.
    async fn handle(&self, m: jetstream::Message) {
        let delivered = m.info().map_or(1, |i| i.delivered);
        let job: Job = match serde_json::from_slice(&m.payload) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!("an unreadable job (dropped): {e}");
                let _ = m.ack_with(AckKind::Term).await;
                return;
            }
        };
        if job.expires_unix_ms < now_unix_ms() {
            tracing::info!(job = %job.id, "the daemon no longer waits for this job: dropped");
            let _ = m.ack().await;
            return;
        }
        let env = match self.env_for(&job).await {
            Ok(env) => env,
            Err(e) => {
                // This node's fault: another node may do better.
                tracing::error!(job = %job.id, "cannot evaluate here: {e}");
                let _ = m.ack_with(AckKind::Nak(Some(Duration::from_secs(5)))).await;
                return;
            }
        };
        tracing::info!(job = %job.id, task = %job.task, delivered, "job started");
        let started = Instant::now();
        let (task, source) = (job.task.clone(), job.source.clone());
        let mut evaluation = tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            match env.compile(&task, &source) {
                Err(o) => (o, Ended::Compile, t0.elapsed().as_secs_f64() * 1e3),
                Ok(c) => match env.verify(&c) {
                    Err(o) => (o, Ended::Verify, c.compile_ms),
                    Ok(()) => (env.profile(&c), Ended::Profile, c.compile_ms),
                },
            }
        });
        let mut progress = tokio::time::interval(self.progress_every);
        progress.tick().await;
        let evaluated = loop {
            tokio::select! {
                done = &mut evaluation => break done,
                _ = progress.tick() => {
                    if let Err(e) = m.ack_with(AckKind::Progress).await {
                        tracing::debug!(job = %job.id, "reporting progress failed: {e}");
                    }
                }
            }
        };
        let (outcome, ended, compile_ms) = match evaluated {
            Ok(r) => r,
            Err(e) => (
                Outcome::harness(format!("the worker node's environment failed: {e}")),
                Ended::Compile,
                0.0,
            ),
        };
        let eval_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(job = %job.id, outcome = outcome.kind(), eval_ms, "job done");
        let result = JobResult {
            id: job.id.clone(),
            node: self.opts.name.clone(),
            outcome,
            ended,
            compile_ms,
            eval_ms,
        };
        let payload = match serde_json::to_vec(&result) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(job = %job.id, "encoding the result: {e}");
                return;
            }
        };
        // Stored before the job is acknowledged: a node that dies in between has its job redone,
        // and the second result is dropped (by JetStream's duplicate window, else by the daemon).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let publish = PublishMessage::build()
                .payload(payload.clone().into())
                .message_id(&job.id);
            let stored = match self.js.send_publish(job.reply.clone(), publish).await {
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match stored {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(job = %job.id, "publishing the result failed ({e}); retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    tracing::error!(job = %job.id, "publishing the result failed ({e}); the job will be redelivered");
                    return;
                }
            }
        }
        if let Err(e) = m.double_ack().await {
            tracing::warn!(job = %job.id, "acknowledging the job failed ({e}); it may be redone, its second result dropped");
        }
    }

    /// The local environment for `job`'s suite, preset and deadlines, built on first use.
    async fn env_for(&self, job: &Job) -> Result<Arc<dyn KernelEnv>, String> {
        let key = format!("{}/{:?}/{:?}", job.suite, job.preset, job.deadlines);
        let mut envs = self.envs.lock().await;
        if let Some(env) = envs.get(&key) {
            return Ok(env.clone());
        }
        let dir = self.fetch_suite(&job.suite).await?;
        let spec = match self.opts.backend.as_deref() {
            Some("sim") => EnvSpec::Simulated(sim_no_cost()),
            backend => EnvSpec::for_command(backend, self.opts.workers, job.deadlines)?,
        };
        let spec = match spec {
            EnvSpec::Cpu {
                workers,
                front_end,
                deadlines,
                ..
            } => EnvSpec::Cpu {
                preset: job.preset,
                workers,
                front_end,
                deadlines,
            },
            EnvSpec::Cuda(cfg) => EnvSpec::Cuda(kevin::env::CudaEnvConfig {
                preset: job.preset,
                ..cfg
            }),
            other => other,
        };
        let env = tokio::task::spawn_blocking(move || {
            let suite = Arc::new(TaskSuite::load(&dir).map_err(|e| e.to_string())?);
            kevin::env::build(spec, Some(&suite), &dir)
        })
        .await
        .map_err(|e| e.to_string())??;
        tracing::info!(suite = %job.suite, env = %env.describe(), "local environment ready");
        envs.insert(key, env.clone());
        Ok(env)
    }

    /// The folder of suite `hash` in the cache, fetched from the task bucket on a miss: each task
    /// file is fetched once by its content hash and checked against it.
    async fn fetch_suite(&self, hash: &str) -> Result<PathBuf, String> {
        let dir = self.opts.cache.join("suites").join(hash);
        if dir.is_dir() {
            return Ok(dir);
        }
        let manifest = self
            .kv
            .get(format!("suite.{hash}"))
            .await
            .map_err(|e| format!("fetching suite {hash}: {e}"))?
            .ok_or_else(|| format!("suite {hash} is not in the task bucket"))?;
        if content_hash(&manifest) != hash {
            return Err(format!(
                "suite {hash}: the manifest does not match its hash"
            ));
        }
        let entries: Vec<SuiteEntry> =
            serde_json::from_slice(&manifest).map_err(|e| format!("suite {hash}: {e}"))?;
        let tmp = self
            .opts
            .cache
            .join("suites")
            .join(format!(".{hash}.{}", std::process::id()));
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let mut fetched = 0;
        for entry in &entries {
            if entry.name.contains(['/', '\\']) || entry.name.starts_with('.') {
                return Err(format!("suite {hash}: a task named {:?}", entry.name));
            }
            let stored = self
                .opts
                .cache
                .join("tasks")
                .join(format!("{}.toml", entry.hash));
            if !stored.is_file() {
                let text = self
                    .kv
                    .get(format!("task.{}", entry.hash))
                    .await
                    .map_err(|e| format!("fetching task {}: {e}", entry.name))?
                    .ok_or_else(|| format!("task {} is not in the task bucket", entry.name))?;
                if content_hash(&text) != entry.hash {
                    return Err(format!(
                        "task {}: the file does not match its hash",
                        entry.name
                    ));
                }
                write_atomically(&stored, &text)?;
                fetched += 1;
            }
            std::fs::copy(&stored, tmp.join(format!("{}.toml", entry.name)))
                .map_err(|e| format!("{}: {e}", stored.display()))?;
        }
        if std::fs::rename(&tmp, &dir).is_err() && !dir.is_dir() {
            return Err(format!("cannot create {}", dir.display()));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        tracing::info!(
            suite = %hash,
            tasks = entries.len(),
            fetched,
            "task suite fetched"
        );
        Ok(dir)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}
