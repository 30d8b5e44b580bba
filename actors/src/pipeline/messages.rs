//! Every message that crosses between actors, in one place so the graph is readable.
//!
//! Requests that need an answer carry their reply channel (a tokio oneshot); messages that occupy
//! a bounded mailbox carry the [`Ticket`] that returns the credit when the receiver is done.

use std::sync::Arc;

use actix::prelude::*;
use kevin::env::Compiled;
use kevin::episode::{EpisodeTask, Group};
use kevin::metrics::StepMetrics;
use kevin::outcome::Outcome;
use kevin::policy::{Completion, GenRequest, Weights};
use kevin::replay::{Batch, ScoredGroup};
use kevin::sampler::SamplerState;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::pipeline::mailbox::Ticket;

/// A group's place in the system's global in-flight bound: taken by the TaskSampler, released
/// when the learner consumes the group or the replay queue drops it as stale.
pub type GroupSlot = OwnedSemaphorePermit;

/// Where an evaluation's final outcome goes.
pub type OutcomeReply = oneshot::Sender<Outcome>;

/// TaskSampler -> Rollout: run m trajectories on this task.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartGroup {
    /// The task.
    pub task: Arc<EpisodeTask>,
    /// The group's id.
    pub group_id: u64,
    /// The group's in-flight slot.
    pub slot: GroupSlot,
    /// Rollout mailbox credit.
    pub ticket: Ticket,
}

/// Rollout -> Generator: sample one response.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Generate {
    /// The request.
    pub request: GenRequest,
    /// Where the completion goes (Err: the policy failed, not the response).
    pub reply: oneshot::Sender<Result<Completion, String>>,
    /// Generator mailbox credit, held until the completion is delivered.
    pub ticket: Ticket,
}

/// Learner -> Generator: new weights, applied before the next batch.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishWeights(pub Weights);

/// Rollout -> Compiler.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Compile {
    /// The task.
    pub task: String,
    /// The ```cuda block.
    pub source: String,
    /// Final outcome.
    pub reply: OutcomeReply,
    /// Compiler mailbox credit.
    pub ticket: Ticket,
}

/// Compiler -> Verifier.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Verify {
    /// The compiled candidate.
    pub compiled: Compiled,
    /// Final outcome.
    pub reply: OutcomeReply,
    /// Verifier mailbox credit.
    pub ticket: Ticket,
}

/// Verifier -> Profiler.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Profile {
    /// The verified candidate.
    pub compiled: Compiled,
    /// Final outcome.
    pub reply: OutcomeReply,
    /// Profiler mailbox credit.
    pub ticket: Ticket,
}

/// A supervised actor asks itself to restart after a component failure.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Restart;

/// Rollout -> ReplayQueue: a finished group. Answers with its sequence number once it is in
/// the write-ahead log.
#[derive(Message)]
#[rtype(result = "Result<u64, String>")]
pub struct GroupDone {
    /// The group.
    pub group: Group,
    /// Its in-flight slot (kept by the queue until the group is consumed).
    pub slot: GroupSlot,
    /// ReplayQueue mailbox credit.
    pub ticket: Ticket,
}

/// Learner -> ReplayQueue: the next batch, when there is one. Not ticketed: the learner has at
/// most one outstanding.
#[derive(Message)]
#[rtype(result = "()")]
pub struct TakeBatch {
    /// The learner's version (for the staleness rule).
    pub learner_version: u64,
    /// Where the batch goes.
    pub reply: oneshot::Sender<Batch>,
}

/// Learner -> ReplayQueue: a batch the learner took but will not train (the run stopped while
/// it was on its way): its groups wait again and its stale drops are recorded with the next
/// batch, so the final checkpoint lists them as pending.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PutBack(pub Batch);

/// What the replay queue holds and has counted.
#[derive(Debug, Clone, Default)]
pub struct ReplayStatus {
    /// Sequence numbers accepted but not yet consumed by a learner step's record.
    pub pending: Vec<u64>,
    /// Groups waiting for the learner.
    pub waiting: usize,
    /// Accepted in this session.
    pub accepted: u64,
    /// Dropped as stale in this session.
    pub dropped: u64,
}

/// -> ReplayQueue: report status.
#[derive(Message)]
#[rtype(result = "ReplayStatus")]
pub struct GetReplayStatus;

/// ReplayQueue -> TaskSampler (do_send: feedback must never block the queue; at most one per
/// group, so it is bounded by the in-flight bound).
#[derive(Message)]
#[rtype(result = "()")]
pub struct TaskFeedback {
    /// The task.
    pub task: String,
    /// Its group's correctness rate.
    pub correct_rate: f64,
}

/// -> TaskSampler: its state, for a checkpoint.
#[derive(Message)]
#[rtype(result = "SamplerState")]
pub struct GetSamplerState;

/// -> TaskSampler: start no new group.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopSampling;

/// ReplayQueue -> Telemetry: an accepted group, for episodes.jsonl and the best kernels.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RecordGroup {
    /// The group with returns and advantages.
    pub group: ScoredGroup,
    /// Telemetry mailbox credit.
    pub ticket: Ticket,
}

/// Learner -> Telemetry: one metrics.jsonl line.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RecordMetrics(pub StepMetrics);

/// -> Telemetry: flush files (at shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Flush;

/// -> Learner: finish the current step, write the final checkpoint, stop.
#[derive(Message)]
#[rtype(result = "crate::pipeline::learner::LearnerSummary")]
pub struct Finish;
