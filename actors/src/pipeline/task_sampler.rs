//! The TaskSampler actor: starts groups, one at a time, as long as the system's in-flight bound
//! allows, on tasks chosen by [`kevin::sampler::TaskSampler`].
//!
//! In async mode it starts a group whenever a slot is free. In sync mode it starts exactly one
//! batch of groups per learner version and waits for the next version before starting more:
//! generation pauses while the learner trains (the on-policy baseline).

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use kevin::config::Mode;
use kevin::episode::EpisodeTask;
use kevin::sampler::{SamplerState, TaskSampler};
use tokio::sync::{watch, Semaphore};

use crate::pipeline::mailbox::Handle;
use crate::pipeline::messages::{GetSamplerState, StartGroup, StopSampling, TaskFeedback};
use crate::pipeline::rollout::Rollout;

/// Drives the loop: one tick starts (at most) one group.
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

/// The TaskSampler actor.
pub struct TaskSamplerActor {
    sampler: TaskSampler,
    tasks: HashMap<String, Arc<EpisodeTask>>,
    rollout: Handle<Rollout>,
    /// The global in-flight bound: one permit per group being generated or waiting for the
    /// learner.
    inflight: Arc<Semaphore>,
    mode: Mode,
    batch: u32,
    started_this_round: u32,
    /// Learner version when this round's first group started (sync mode).
    round_version: u64,
    version: watch::Receiver<u64>,
    stopped: bool,
}

impl TaskSamplerActor {
    /// A sampler actor over `tasks` (train split only).
    pub fn new(
        sampler: TaskSampler,
        tasks: Vec<Arc<EpisodeTask>>,
        rollout: Handle<Rollout>,
        inflight: Arc<Semaphore>,
        mode: Mode,
        batch: u32,
        version: watch::Receiver<u64>,
    ) -> Self {
        let tasks = tasks.into_iter().map(|t| (t.name.clone(), t)).collect();
        TaskSamplerActor {
            sampler,
            tasks,
            rollout,
            inflight,
            mode,
            batch,
            started_this_round: 0,
            round_version: 0,
            version,
            stopped: false,
        }
    }
}

impl Actor for TaskSamplerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Feedback arrives with do_send (never blocks the replay queue): room for plenty.
        ctx.set_mailbox_capacity(4096);
        ctx.notify(Tick);
    }
}

impl Handler<Tick> for TaskSamplerActor {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        if self.stopped {
            return;
        }
        if self.mode == Mode::Sync && self.started_this_round >= self.batch {
            // Wait for the learner to publish the version trained on this round's groups.
            let mut version = self.version.clone();
            let current = self.round_version;
            ctx.spawn(
                actix::fut::wrap_future::<_, Self>(async move {
                    while *version.borrow() <= current {
                        if version.changed().await.is_err() {
                            break;
                        }
                    }
                })
                .map(|_, act, ctx| {
                    act.started_this_round = 0;
                    ctx.notify(Tick);
                }),
            );
            return;
        }
        // Waiting for a slot must not block this actor: it still answers GetSamplerState (the
        // learner's checkpoint needs it while all slots are taken).
        let inflight = self.inflight.clone();
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(inflight.acquire_owned()).map(|permit, act, ctx| {
                let Ok(slot) = permit else { return };
                if act.stopped {
                    return;
                }
                let _span = tracing::info_span!("PickTask", actor = "TaskSampler").entered();
                if act.started_this_round == 0 {
                    act.round_version = *act.version.borrow();
                }
                let (name, group_id) = act.sampler.pick();
                let task = act.tasks[&name].clone();
                act.started_this_round += 1;
                let rollout = act.rollout.clone();
                ctx.spawn(
                    actix::fut::wrap_future::<_, Self>(async move {
                        rollout
                            .send(|ticket| StartGroup {
                                task,
                                group_id,
                                slot,
                                ticket,
                            })
                            .await
                    })
                    .map(|sent, _act, ctx| {
                        if sent.is_ok() {
                            ctx.notify(Tick);
                        } else {
                            tracing::error!(
                                actor = "TaskSampler",
                                "the rollout actor is gone; sampling stops"
                            );
                        }
                    }),
                );
            }),
        );
    }
}

impl Handler<TaskFeedback> for TaskSamplerActor {
    type Result = ();

    fn handle(&mut self, msg: TaskFeedback, _ctx: &mut Context<Self>) {
        self.sampler.feedback(&msg.task, msg.correct_rate);
    }
}

impl Handler<GetSamplerState> for TaskSamplerActor {
    type Result = MessageResult<GetSamplerState>;

    fn handle(&mut self, _: GetSamplerState, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult::<GetSamplerState>(self.sampler.state().clone())
    }
}

impl Handler<StopSampling> for TaskSamplerActor {
    type Result = ();

    fn handle(&mut self, _: StopSampling, _ctx: &mut Context<Self>) {
        self.stopped = true;
    }
}

/// For tests and checkpoints: the state type.
pub type State = SamplerState;
