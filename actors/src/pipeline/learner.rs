//! The Learner actor: takes batches from the replay queue, trains on them (on its own thread),
//! records each step, publishes the new weights to the generator and the new version to whoever
//! watches it, writes metrics, and checkpoints.
//!
//! Its loop runs as a task of the actor; the actor answers [`Finish`] by letting the current step
//! complete, writing the final checkpoint and stopping the loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use kevin::learner::Learner;
use kevin::metrics::StepMetrics;
use kevin::run_dir::{CheckpointState, Counters, RunDir, StepRecord};
use kevin::telemetry::{StatsSnapshot, TraceStats};
use tokio::sync::{oneshot, watch};

use crate::pipeline::failures::Failures;
use crate::pipeline::generator::Generator;
use crate::pipeline::mailbox::Mailbox;
use crate::pipeline::messages::{
    Finish, GetReplayStatus, GetSamplerState, PublishWeights, PutBack, RecordMetrics, TakeBatch,
};
use crate::pipeline::pool::BlockingPool;
use crate::pipeline::replay_queue::ReplayQueue;
use crate::pipeline::task_sampler::TaskSamplerActor;
use crate::pipeline::telemetry::Telemetry;

/// Why the learner's loop ended by itself.
#[derive(Debug, Clone, PartialEq)]
pub enum LearnerSignal {
    /// `run.max_steps` reached.
    MaxSteps,
    /// Training or checkpointing failed; the daemon must stop.
    Failed(String),
}

/// What the learner did in this session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LearnerSummary {
    /// Version at the end.
    pub version: u64,
    /// Steps taken in this session.
    pub steps: u64,
    /// The final checkpoint, when it was written.
    pub checkpoint: Option<std::path::PathBuf>,
    /// A fatal error, if the learner failed.
    pub error: Option<String>,
}

/// Everything the learner's loop needs.
pub struct LearnerCtx {
    /// The learner (locked only on the learner thread).
    pub learner: Arc<Mutex<Box<dyn Learner>>>,
    /// The run directory.
    pub run_dir: Arc<RunDir>,
    /// Source of batches.
    pub replay: Addr<ReplayQueue>,
    /// Where weights go.
    pub generator: Addr<Generator>,
    /// Asked for its state at checkpoints.
    pub sampler: Addr<TaskSamplerActor>,
    /// Where metrics go.
    pub telemetry: Addr<Telemetry>,
    /// Broadcasts the learner version (the sync-mode sampler waits on it).
    pub version_tx: watch::Sender<u64>,
    /// Stop after this version (0: never).
    pub max_steps: u64,
    /// Steps between checkpoints.
    pub checkpoint_every: u64,
    /// Counters carried over from the checkpoint resumed from.
    pub base_counters: Counters,
    /// Every mailbox, for depths and high-water marks.
    pub mailboxes: Vec<Arc<Mailbox>>,
    /// Failure counters.
    pub failures: Arc<Failures>,
    /// Live trace statistics (busy fractions), when tracing is on.
    pub trace_stats: Option<Arc<TraceStats>>,
    /// Turns finished in this session.
    pub turns_done: Arc<AtomicU64>,
    /// The evaluation environment, for its cache's counters.
    pub env: Arc<dyn kevin::env::KernelEnv>,
    /// Tells the system the loop ended by itself.
    pub signal: Option<oneshot::Sender<LearnerSignal>>,
}

/// The Learner actor.
pub struct LearnerActor {
    ctx: Option<LearnerCtx>,
    finishing: watch::Sender<bool>,
    done: Option<oneshot::Receiver<LearnerSummary>>,
}

impl LearnerActor {
    /// A learner actor; its loop starts with the actor.
    pub fn new(ctx: LearnerCtx) -> Self {
        LearnerActor {
            ctx: Some(ctx),
            finishing: watch::channel(false).0,
            done: None,
        }
    }
}

impl Actor for LearnerActor {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Context<Self>) {
        let (tx, rx) = oneshot::channel();
        self.done = Some(rx);
        let ctx = self.ctx.take().expect("started once");
        actix::spawn(learner_loop(ctx, self.finishing.subscribe(), tx));
    }
}

impl Handler<Finish> for LearnerActor {
    type Result = ResponseFuture<LearnerSummary>;

    fn handle(&mut self, _: Finish, _ctx: &mut Context<Self>) -> Self::Result {
        let _ = self.finishing.send(true);
        let done = self.done.take();
        Box::pin(async move {
            match done {
                Some(rx) => rx.await.unwrap_or_else(|_| LearnerSummary {
                    error: Some("the learner loop ended without a summary".into()),
                    ..Default::default()
                }),
                None => LearnerSummary {
                    error: Some("Finish was sent twice".into()),
                    ..Default::default()
                },
            }
        })
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

async fn learner_loop(
    mut c: LearnerCtx,
    mut finishing: watch::Receiver<bool>,
    done: oneshot::Sender<LearnerSummary>,
) {
    let pool = BlockingPool::new("learner", 1);
    let session_start = Instant::now();
    let mut version = c.learner.lock().map(|l| l.version()).unwrap_or(0);
    let mut last_checkpoint = version;
    let mut steps = 0u64;
    let mut trained = 0u64;
    let mut error = None;
    let mut prev_stats: Option<StatsSnapshot> = c.trace_stats.as_ref().map(|s| s.snapshot());
    loop {
        if *finishing.borrow() {
            break;
        }
        if c.max_steps > 0 && version >= c.max_steps {
            if let Some(s) = c.signal.take() {
                let _ = s.send(LearnerSignal::MaxSteps);
            }
            // Wait for the system to drain before the final checkpoint.
            while !*finishing.borrow() {
                if finishing.changed().await.is_err() {
                    break;
                }
            }
            break;
        }
        let (tx, mut rx) = oneshot::channel();
        if c.replay
            .send(TakeBatch {
                learner_version: version,
                reply: tx,
            })
            .await
            .is_err()
        {
            error = Some("the replay queue is gone".to_string());
            break;
        }
        let batch = tokio::select! {
            biased;
            b = &mut rx => match b { Ok(b) => b, Err(_) => break },
            _ = finishing.changed() => {
                // Stopping while waiting. A batch the queue sent in the meantime was taken off
                // its pending list: it goes back, or the final checkpoint would list neither
                // its groups nor its stale drops (recovery would still find them in the WAL).
                rx.close();
                if let Ok(b) = rx.try_recv() {
                    let _ = c.replay.send(PutBack(b)).await;
                }
                break;
            }
        };
        let started = Instant::now();
        let (learner, run_dir) = (c.learner.clone(), c.run_dir.clone());
        let span = tracing::info_span!(
            "train_step",
            actor = "Learner",
            step = version + 1,
            groups = batch.groups.len()
        );
        let batch = Arc::new(batch);
        let b = batch.clone();
        let result = pool
            .run(move || -> Result<_, String> {
                let _entered = span.enter();
                let mut l = learner
                    .lock()
                    .map_err(|_| "the learner is poisoned by an earlier panic".to_string())?;
                let stats = l.train(&b).map_err(|e| e.to_string())?;
                let record = StepRecord {
                    version: l.version(),
                    trained: b.groups.iter().map(|g| g.seq).collect(),
                    dropped: b.dropped.clone(),
                    stats: stats.clone(),
                };
                run_dir.append_step(&record).map_err(|e| e.to_string())?;
                Ok((l.version(), stats, l.weights()))
            })
            .await;
        let (new_version, stats, weights) = match result {
            Ok(Ok(Ok(v))) => v,
            Ok(Ok(Err(e))) => {
                error = Some(e);
                break;
            }
            Ok(Err(panic)) => {
                c.failures.count("Learner.panic");
                error = Some(format!("the learner panicked: {}", panic.0));
                break;
            }
            Err(_) => {
                error = Some("the learner thread is gone".into());
                break;
            }
        };
        version = new_version;
        steps += 1;
        trained += batch.groups.len() as u64;
        let _ = c.generator.send(PublishWeights(weights)).await;
        let _ = c.version_tx.send(version);

        let status = c.replay.send(GetReplayStatus).await.unwrap_or_default();
        let mut m = StepMetrics::from_batch(version, &batch);
        m.elapsed_s = session_start.elapsed().as_secs_f64();
        m.unix_s = unix_now();
        m.dropped_total = c.base_counters.groups_dropped + status.dropped;
        m.accepted_total = c.base_counters.groups_accepted + status.accepted;
        m.turns_per_s = c.turns_done.load(Ordering::Relaxed) as f64 / m.elapsed_s.max(1e-9);
        m.replay_pending = status.waiting as u64;
        for mb in &c.mailboxes {
            m.mailbox_depth
                .insert(mb.name().to_string(), mb.depth() as u64);
            m.mailbox_high_water
                .insert(mb.name().to_string(), mb.high_water() as u64);
        }
        if let Some(stats) = &c.trace_stats {
            let now = stats.snapshot();
            if let Some(prev) = &prev_stats {
                m.busy = now.busy_fractions_since(prev);
            }
            prev_stats = Some(now);
        }
        m.failures = c.failures.snapshot();
        m.loss = stats.loss;
        m.clip_fraction = stats.clip_fraction;
        m.grad_norm = stats.grad_norm;
        m.tokens = stats.tokens;
        m.train_s = started.elapsed().as_secs_f64();
        if let Some(cache) = c.env.cache_stats() {
            m.eval_cache = cache.counters();
        }
        m.lease_wait_ms = kevin::gpu::lease::wait_totals()
            .into_iter()
            .map(|(k, w)| (k, w.waited_ms))
            .collect();
        tracing::info!(
            step = version,
            reward = format_args!("{:.3}", m.reward_mean),
            correct = format_args!("{:.2}", m.correct_rate),
            dropped = m.dropped,
            pending = m.replay_pending,
            "learner step"
        );
        let _ = c.telemetry.send(RecordMetrics(m)).await;

        if version - last_checkpoint >= c.checkpoint_every {
            match checkpoint(&c, &pool, version, trained).await {
                Ok(_) => last_checkpoint = version,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
    }
    if let (Some(e), Some(s)) = (&error, c.signal.take()) {
        let _ = s.send(LearnerSignal::Failed(e.clone()));
    }
    // Wait until the system asks us to finish (it drains episodes first), then checkpoint.
    while !*finishing.borrow() {
        if finishing.changed().await.is_err() {
            break;
        }
    }
    let checkpoint_path = match checkpoint(&c, &pool, version, trained).await {
        Ok(p) => Some(p),
        Err(e) => {
            error.get_or_insert(e);
            None
        }
    };
    let _ = done.send(LearnerSummary {
        version,
        steps,
        checkpoint: checkpoint_path,
        error,
    });
}

async fn checkpoint(
    c: &LearnerCtx,
    pool: &BlockingPool,
    version: u64,
    trained: u64,
) -> Result<std::path::PathBuf, String> {
    let sampler = c.sampler.send(GetSamplerState).await.ok();
    let status = c.replay.send(GetReplayStatus).await.unwrap_or_default();
    let state = CheckpointState {
        learner_version: version,
        sampler,
        replay_pending: status.pending,
        counters: Counters {
            groups_accepted: c.base_counters.groups_accepted + status.accepted,
            groups_dropped: c.base_counters.groups_dropped + status.dropped,
            groups_trained: c.base_counters.groups_trained + trained,
            turns: c.base_counters.turns + c.turns_done.load(Ordering::Relaxed),
        },
        written_unix: unix_now() as u64,
    };
    let (learner, run_dir) = (c.learner.clone(), c.run_dir.clone());
    let span = tracing::info_span!("checkpoint", actor = "Learner", version);
    match pool
        .run(move || {
            let _entered = span.enter();
            let l = learner
                .lock()
                .map_err(|_| "the learner is poisoned".to_string())?;
            let path = run_dir
                .write_checkpoint(l.as_ref(), &state)
                .map_err(|e| e.to_string())?;
            drop(l);
            // The checkpoint is on disk: the log's segments it covers are no longer needed.
            // Failing to delete them costs disk, not correctness.
            match run_dir.compact_wal(state.learner_version) {
                Ok(c) if c.deleted > 0 => tracing::info!(
                    segments = c.deleted,
                    bytes = c.bytes,
                    kept = c.kept,
                    "deleted write-ahead log segments the checkpoint covers"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not delete covered write-ahead log segments")
                }
            }
            Ok(path)
        })
        .await
    {
        Ok(Ok(r)) => r.inspect(|p| tracing::info!(checkpoint = %p.display(), "checkpoint written")),
        Ok(Err(p)) => Err(format!("checkpoint panicked: {}", p.0)),
        Err(_) => Err("the learner thread is gone".into()),
    }
}
