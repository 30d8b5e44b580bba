//! The ReplayQueue actor: accepts finished groups into the write-ahead log and the queue, feeds
//! the learner batches of fresh groups, and drops (and counts) stale ones.
//!
//! It runs on its own arbiter: the WAL's fsync blocks only this thread, deliberately, because a
//! group counts as accepted only once it is on disk.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use kevin::replay::{Batch, ReplayBuffer};
use tokio::sync::oneshot;

use crate::pipeline::failures::Failures;
use crate::pipeline::mailbox::{actix_capacity, Handle};
use crate::pipeline::messages::{
    GetReplayStatus, GroupDone, GroupSlot, PutBack, RecordGroup, ReplayStatus, TakeBatch,
    TaskFeedback,
};
use crate::pipeline::telemetry::Telemetry;

/// The ReplayQueue actor.
pub struct ReplayQueue {
    buffer: ReplayBuffer,
    /// In-flight slots of queued groups, released when a group is consumed or dropped.
    slots: HashMap<u64, GroupSlot>,
    waiting: Option<(u64, oneshot::Sender<Batch>)>,
    /// Where each finished group's correctness goes (the task sampler); a `Recipient`, so the
    /// queue does not depend on the sampler (which depends on the rollout, which sends here).
    feedback: Recipient<TaskFeedback>,
    telemetry: Handle<Telemetry>,
    credits: usize,
    failures: Arc<Failures>,
}

impl ReplayQueue {
    /// A queue around `buffer` (which holds any groups recovered from the WAL).
    pub fn new(
        buffer: ReplayBuffer,
        feedback: Recipient<TaskFeedback>,
        telemetry: Handle<Telemetry>,
        credits: usize,
        failures: Arc<Failures>,
    ) -> Self {
        ReplayQueue {
            buffer,
            slots: HashMap::new(),
            waiting: None,
            feedback,
            telemetry,
            credits,
            failures,
        }
    }

    fn try_fill(&mut self) {
        let Some((version, _)) = &self.waiting else {
            return;
        };
        let version = *version;
        // A stale group's slot is released at once, so the sampler can start a fresh group in
        // its place; the drop itself is recorded with the next batch.
        for seq in self.buffer.drop_stale(version) {
            self.slots.remove(&seq);
        }
        let Some(batch) = self.buffer.take_batch(version) else {
            return;
        };
        let (_, reply) = self.waiting.take().expect("checked above");
        let consumed: Vec<u64> = batch.groups.iter().map(|g| g.seq).collect();
        match reply.send(batch) {
            Ok(()) => {
                for seq in consumed {
                    self.slots.remove(&seq);
                }
            }
            // The learner stopped waiting (shutdown): nothing was consumed.
            Err(batch) => self.buffer.put_back(batch),
        }
    }
}

impl Actor for ReplayQueue {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(actix_capacity(self.credits));
    }
}

impl Handler<GroupDone> for ReplayQueue {
    type Result = Result<u64, String>;

    fn handle(&mut self, msg: GroupDone, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = tracing::info_span!("GroupDone", actor = "ReplayQueue", task = %msg.group.task)
            .entered();
        let (task, rate) = (msg.group.task.clone(), msg.group.correct_rate());
        let seq = self.buffer.accept(msg.group).map_err(|e| {
            if matches!(e, kevin::replay::ReplayError::Unjudged { .. }) {
                self.failures.count("ReplayQueue.unjudged");
                tracing::error!(actor = "ReplayQueue", error = %e, "a group with an unjudged turn was refused");
            } else {
                self.failures.count("ReplayQueue.wal_error");
                tracing::error!(actor = "ReplayQueue", error = %e, "a group could not be written to the log");
            }
            e.to_string()
        })?;
        self.slots.insert(seq, msg.slot);
        self.feedback.do_send(TaskFeedback {
            task,
            correct_rate: rate,
        });
        if let Some(scored) = self.buffer.last().cloned() {
            let telemetry = self.telemetry.clone();
            actix::spawn(async move {
                let _ = telemetry
                    .send(|ticket| RecordGroup {
                        group: scored,
                        ticket,
                    })
                    .await;
            });
        }
        self.try_fill();
        Ok(seq)
    }
}

impl Handler<TakeBatch> for ReplayQueue {
    type Result = ();

    fn handle(&mut self, msg: TakeBatch, _ctx: &mut Context<Self>) {
        let _span = tracing::info_span!("TakeBatch", actor = "ReplayQueue").entered();
        self.waiting = Some((msg.learner_version, msg.reply));
        self.try_fill();
    }
}

impl Handler<PutBack> for ReplayQueue {
    type Result = ();

    fn handle(&mut self, msg: PutBack, _ctx: &mut Context<Self>) {
        self.buffer.put_back(msg.0);
    }
}

impl Handler<GetReplayStatus> for ReplayQueue {
    type Result = MessageResult<GetReplayStatus>;

    fn handle(&mut self, _: GetReplayStatus, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(ReplayStatus {
            pending: self.buffer.pending_seqs(),
            waiting: self.buffer.len(),
            accepted: self.buffer.accepted_total(),
            dropped: self.buffer.dropped_total(),
        })
    }
}
