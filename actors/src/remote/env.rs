//! The daemon's side: [`RemoteEnv`], a [`KernelEnv`] whose evaluations are jobs on the bus.
//!
//! `compile` admits the candidate locally (the static rules and the launch plan: a format error
//! needs no node), publishes the job and blocks until its result comes back, so one call holds
//! one job in flight; the Compiler stage runs `env.remote.max_inflight` of them at once (see
//! `pipeline::system`). The node's final outcome travels in the [`Compiled`] artifact; `verify`
//! and `profile` read it back and end the evaluation at the stage where it ended on the node.
//! The NATS client runs on a tokio runtime of its own, driven by one thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, message::PublishMessage};
use tokio::sync::oneshot;

use kevin::candidate::Limits;
use kevin::config::RemoteEnvSection;
use kevin::env::{Compiled, Deadlines, KernelEnv};
use kevin::outcome::Outcome;
use kevin::tasks::{Preset, TaskSuite};
use kevin::worker::PoolStats;

use super::{
    declare_queue, now_unix_ms, read_suite_files, Connection, Ended, Job, JobResult, Names,
};

/// Counters of a [`RemoteEnv`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Jobs published.
    pub jobs: u64,
    /// Results matched to a waiting evaluation.
    pub results: u64,
    /// Results dropped: a second result for an id, or one for an evaluation no longer waiting.
    pub duplicates: u64,
    /// Jobs given up after `max_deliver` deliveries.
    pub gave_up: u64,
    /// Evaluations that heard nothing within `job_timeout_ms`.
    pub timed_out: u64,
}

#[derive(Default)]
struct Shared {
    /// Evaluations waiting for their result, by job id.
    pending: Mutex<HashMap<String, mpsc::SyncSender<JobResult>>>,
    /// Job id by the job's sequence in the jobs stream (for the max-deliveries advisory).
    by_seq: Mutex<HashMap<u64, String>>,
    jobs: AtomicU64,
    results: AtomicU64,
    duplicates: AtomicU64,
    gave_up: AtomicU64,
    timed_out: AtomicU64,
}

impl Shared {
    /// Hands `result` to the evaluation waiting for it, counting it in `counter` first (so the
    /// count is there once the evaluation returns); false when none waits (a duplicate).
    fn deliver(&self, result: JobResult, counter: &AtomicU64) -> bool {
        let waiting = self.pending.lock().unwrap().remove(&result.id);
        match waiting {
            Some(tx) => {
                counter.fetch_add(1, Ordering::Relaxed);
                let _ = tx.try_send(result);
                true
            }
            None => false,
        }
    }
}

/// The node's outcome, carried from `compile` to `verify` and `profile`.
struct RemoteArtifact {
    outcome: Outcome,
    ended: Ended,
}

/// Evaluation by worker nodes over NATS JetStream.
pub struct RemoteEnv {
    handle: tokio::runtime::Handle,
    /// Dropping it stops the runtime's thread.
    _stop: oneshot::Sender<()>,
    js: jetstream::Context,
    shared: Arc<Shared>,
    names: Names,
    daemon: String,
    suite_hash: String,
    suite: Arc<TaskSuite>,
    preset: Preset,
    limits: Limits,
    deadlines: Deadlines,
    job_timeout: Duration,
    next: AtomicU64,
    describe: String,
}

/// A short id for this daemon (process id and start time), unique enough among a fleet's daemons.
fn daemon_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:x}{:08x}", std::process::id(), nanos & 0xffff_ffff)
}

impl RemoteEnv {
    /// Connects to the bus `remote` names, declares the queue, publishes the suite's task files
    /// (those not stored yet) and starts listening for results. Errors are one line.
    pub fn start(
        remote: &RemoteEnvSection,
        preset: Preset,
        deadlines: Deadlines,
        suite: Arc<TaskSuite>,
        tasks_dir: &std::path::Path,
    ) -> Result<RemoteEnv, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the NATS client's runtime: {e}"))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("nats".into())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })
            .map_err(|e| format!("starting the NATS client's thread: {e}"))?;

        let names = Names::new(&remote.prefix);
        let daemon = daemon_id();
        let conn = Connection::from_section(remote, &format!("kevin-daemon-{daemon}"));
        let (entries, texts) = read_suite_files(tasks_dir)?;
        let manifest = serde_json::to_vec(&entries).map_err(|e| e.to_string())?;
        let suite_hash = super::content_hash(&manifest);
        let shared = Arc::new(Shared::default());
        let setup = {
            let (names, remote, shared, daemon, suite_hash) = (
                names.clone(),
                remote.clone(),
                shared.clone(),
                daemon.clone(),
                suite_hash.clone(),
            );
            async move {
                let client = conn.connect().await?;
                let js = jetstream::new(client.clone());
                let jobs = declare_queue(&js, &names, &remote).await?;
                // The suite: each task file once by its hash, then the manifest.
                let kv = js
                    .get_key_value(names.tasks_bucket())
                    .await
                    .map_err(|e| format!("opening the bucket {}: {e}", names.tasks_bucket()))?;
                let mut uploaded = 0;
                for (hash, text) in texts {
                    let key = format!("task.{hash}");
                    if kv.get(&key).await.ok().flatten().is_none() {
                        kv.put(&key, text.into_bytes().into())
                            .await
                            .map_err(|e| format!("storing task {key}: {e}"))?;
                        uploaded += 1;
                    }
                }
                kv.put(format!("suite.{suite_hash}"), manifest.into())
                    .await
                    .map_err(|e| format!("storing the suite manifest: {e}"))?;
                tracing::info!(suite = %suite_hash, uploaded, "remote: task suite published");
                // This daemon's results.
                let results_stream = js
                    .get_stream(names.results_stream())
                    .await
                    .map_err(|e| format!("opening {}: {e}", names.results_stream()))?;
                let results = results_stream
                    .create_consumer(consumer::pull::Config {
                        durable_name: Some(names.results_consumer(&daemon)),
                        filter_subject: names.results_subject(&daemon),
                        ack_policy: consumer::AckPolicy::Explicit,
                        // Removed by the server an hour after this daemon is gone.
                        inactive_threshold: Duration::from_secs(3600),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("creating this daemon's results consumer: {e}"))?;
                let mut messages = results
                    .messages()
                    .await
                    .map_err(|e| format!("reading results: {e}"))?;
                let listener = shared.clone();
                tokio::spawn(async move {
                    use futures_util::StreamExt;
                    while let Some(m) = messages.next().await {
                        let m = match m {
                            Ok(m) => m,
                            // This daemon's consumer removed (its environment dropped).
                            Err(e)
                                if e.kind()
                                    == consumer::pull::MessagesErrorKind::ConsumerDeleted =>
                            {
                                break
                            }
                            Err(e) => {
                                tracing::warn!("remote: reading results: {e}");
                                continue;
                            }
                        };
                        match serde_json::from_slice::<JobResult>(&m.payload) {
                            Ok(r) => {
                                let (id, node) = (r.id.clone(), r.node.clone());
                                if !listener.deliver(r, &listener.results) {
                                    listener.duplicates.fetch_add(1, Ordering::Relaxed);
                                    tracing::info!(job = %id, node = %node, "remote: dropped a duplicate result");
                                }
                            }
                            Err(e) => tracing::warn!("remote: an unreadable result: {e}"),
                        }
                        let _ = m.ack().await;
                    }
                });
                // Jobs no node finished after max_deliver deliveries.
                let mut advisories = client
                    .subscribe(names.max_deliveries_advisory())
                    .await
                    .map_err(|e| format!("subscribing to max-deliveries advisories: {e}"))?;
                let listener = shared.clone();
                let max_deliver = remote.max_deliver;
                tokio::spawn(async move {
                    use futures_util::StreamExt;
                    while let Some(m) = advisories.next().await {
                        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&m.payload) else {
                            continue;
                        };
                        let Some(seq) = v["stream_seq"].as_u64() else {
                            continue;
                        };
                        let id = listener.by_seq.lock().unwrap().remove(&seq);
                        let Some(id) = id else { continue };
                        let given_up = listener.deliver(
                            JobResult {
                                id: id.clone(),
                                node: String::new(),
                                outcome: Outcome::harness(format!(
                                    "no worker node finished the evaluation in {max_deliver} \
                                     deliveries (env.remote.max_deliver): the nodes died or \
                                     stalled on it"
                                )),
                                ended: Ended::Compile,
                                compile_ms: 0.0,
                                eval_ms: 0.0,
                            },
                            &listener.gave_up,
                        );
                        if given_up {
                            tracing::warn!(job = %id, "remote: a job reached max_deliver; a harness error");
                        }
                        // It would stay in the work queue, undeliverable.
                        let _ = jobs.delete_message(seq).await;
                    }
                });
                Ok::<_, String>(js)
            }
        };
        let js = handle.block_on(setup)?;
        let describe = format!(
            "remote environment: jobs on NATS JetStream at {} (prefix {:?}, {}; at most {} in \
             flight, ack_wait {} ms, max_deliver {}), evaluated by `kevin worker-node` processes",
            remote.url,
            remote.prefix,
            Connection::from_section(remote, "").auth_kind(),
            remote.max_inflight,
            remote.ack_wait_ms,
            remote.max_deliver
        );
        Ok(RemoteEnv {
            handle,
            _stop: stop,
            js,
            shared,
            names,
            daemon,
            suite_hash,
            suite,
            preset,
            limits: Limits::default(),
            deadlines,
            job_timeout: Duration::from_millis(remote.job_timeout_ms),
            next: AtomicU64::new(0),
            describe,
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> RemoteStats {
        let s = &self.shared;
        RemoteStats {
            jobs: s.jobs.load(Ordering::Relaxed),
            results: s.results.load(Ordering::Relaxed),
            duplicates: s.duplicates.load(Ordering::Relaxed),
            gave_up: s.gave_up.load(Ordering::Relaxed),
            timed_out: s.timed_out.load(Ordering::Relaxed),
        }
    }

    /// Publishes `job` until JetStream stores it (the same `Nats-Msg-Id` each time, so a retry
    /// after a lost acknowledgement is stored once) or `deadline` passes; the stream sequence.
    fn publish(&self, job: &Job, deadline: Instant) -> Result<u64, String> {
        let payload = serde_json::to_vec(job).map_err(|e| e.to_string())?;
        let (js, subject, id) = (self.js.clone(), self.names.jobs_subject(), job.id.clone());
        self.handle.block_on(async move {
            loop {
                let attempt = async {
                    let publish = PublishMessage::build()
                        .payload(payload.clone().into())
                        .message_id(&id);
                    js.send_publish(subject.clone(), publish)
                        .await
                        .map_err(|e| e.to_string())?
                        .await
                        .map_err(|e| e.to_string())
                };
                match attempt.await {
                    Ok(ack) => return Ok(ack.sequence),
                    Err(e) if Instant::now() + Duration::from_secs(1) < deadline => {
                        tracing::warn!(job = %id, "remote: publishing a job failed ({e}); retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        })
    }

    /// One evaluation on a node: the node's result, or a harness error.
    fn evaluate_remotely(&self, task: &str, source: &str) -> JobResult {
        let started = Instant::now();
        let deadline = started + self.job_timeout;
        let id = format!(
            "{}-{}",
            self.daemon,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let job = Job {
            id: id.clone(),
            reply: self.names.results_subject(&self.daemon),
            suite: self.suite_hash.clone(),
            task: task.to_string(),
            preset: self.preset,
            deadlines: self.deadlines,
            source: source.to_string(),
            expires_unix_ms: now_unix_ms() + self.job_timeout.as_millis() as u64,
        };
        let harness = |reason: String| JobResult {
            id: id.clone(),
            node: String::new(),
            outcome: Outcome::harness(reason),
            ended: Ended::Compile,
            compile_ms: 0.0,
            eval_ms: 0.0,
        };
        let (tx, rx) = mpsc::sync_channel(1);
        self.shared.pending.lock().unwrap().insert(id.clone(), tx);
        let seq = match self.publish(&job, deadline) {
            Ok(seq) => seq,
            Err(e) => {
                self.shared.pending.lock().unwrap().remove(&id);
                return harness(format!("publishing the job to NATS failed: {e}"));
            }
        };
        self.shared.jobs.fetch_add(1, Ordering::Relaxed);
        self.shared.by_seq.lock().unwrap().insert(seq, id.clone());
        let wait = deadline.saturating_duration_since(Instant::now());
        let result = rx.recv_timeout(wait);
        self.shared.pending.lock().unwrap().remove(&id);
        self.shared.by_seq.lock().unwrap().remove(&seq);
        match result {
            Ok(r) => r,
            Err(_) => {
                self.shared.timed_out.fetch_add(1, Ordering::Relaxed);
                harness(format!(
                    "no worker node answered within env.remote.job_timeout_ms ({} ms): are \
                     `kevin worker-node` processes running against this NATS server?",
                    self.job_timeout.as_millis()
                ))
            }
        }
    }
}

impl Drop for RemoteEnv {
    fn drop(&mut self) {
        // Best effort (the server removes the consumer an hour later anyway), from a thread of
        // its own: the last reference may go inside another runtime (the actix system's).
        let (handle, js, stream, name) = (
            self.handle.clone(),
            self.js.clone(),
            self.names.results_stream(),
            self.names.results_consumer(&self.daemon),
        );
        let _ = std::thread::spawn(move || {
            handle.block_on(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), async move {
                    if let Ok(s) = js.get_stream(stream).await {
                        let _ = s.delete_consumer(&name).await;
                    }
                })
                .await;
            })
        })
        .join();
    }
}

impl KernelEnv for RemoteEnv {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    /// The bus as one pool, "remote" (what Prometheus and the benches read): requests are the
    /// jobs published, successes the results received, timeouts the jobs no node answered within
    /// `job_timeout_ms`, crashes the jobs given up after `max_deliver` deliveries (their nodes
    /// died or stalled); a duplicate result dropped is a protocol error.
    fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        let s = self.stats();
        let stats = PoolStats {
            requests: s.jobs,
            succeeded: s.results,
            timeouts: s.timed_out,
            crashes: s.gave_up,
            protocol_errors: s.duplicates,
            ..PoolStats::default()
        };
        vec![("remote".into(), stats)]
    }

    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome> {
        // Cheap and local: a format or launch-plan error needs no node.
        kevin::env::admit_named(&self.suite, task, self.preset, &self.limits, source)?;
        let r = self.evaluate_remotely(task, source);
        if r.ended == Ended::Compile {
            return Err(r.outcome);
        }
        Ok(Compiled {
            task: task.to_string(),
            artifact: Arc::new(RemoteArtifact {
                outcome: r.outcome,
                ended: r.ended,
            }),
            compile_ms: r.compile_ms,
        })
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        match compiled.artifact.downcast_ref::<RemoteArtifact>() {
            Some(a) if a.ended == Ended::Verify => Err(a.outcome.clone()),
            Some(_) => Ok(()),
            // kevin's own mistake, never the candidate's.
            None => Err(Outcome::harness(
                "the remote environment got an artifact it did not make",
            )),
        }
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        match compiled.artifact.downcast_ref::<RemoteArtifact>() {
            Some(a) => a.outcome.clone(),
            None => Outcome::harness("the remote environment got an artifact it did not make"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str) -> JobResult {
        JobResult {
            id: id.into(),
            node: "n".into(),
            outcome: Outcome::harness("x"),
            ended: Ended::Compile,
            compile_ms: 0.0,
            eval_ms: 0.0,
        }
    }

    #[test]
    fn a_second_result_for_a_job_is_dropped() {
        let shared = Shared::default();
        let (tx, rx) = mpsc::sync_channel(1);
        shared.pending.lock().unwrap().insert("d-1".into(), tx);
        assert!(shared.deliver(result("d-1"), &shared.results));
        // The redone job's result, and one for a job nobody waits for.
        assert!(!shared.deliver(result("d-1"), &shared.results));
        assert!(!shared.deliver(result("d-2"), &shared.results));
        assert_eq!(shared.results.load(Ordering::Relaxed), 1);
        assert_eq!(rx.recv().unwrap().id, "d-1");
        assert!(rx.try_recv().is_err());
    }
}
