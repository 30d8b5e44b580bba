//! The Rollout actor: owns the episodes. For each group it runs m trajectories concurrently; each
//! trajectory is an [`Episode`] state machine driven turn by turn: build the prompt, ask the
//! Generator, parse the response, send the candidate through Compiler -> Verifier -> Profiler,
//! record the outcome and its score. A finished group goes to the ReplayQueue. A candidate the
//! machine was too busy to judge ([`Outcome::is_busy`]) is sent again, a few times
//! (`Rollout.harness_busy`). A turn the harness could not judge ([`Outcome::HarnessError`])
//! abandons its group: counted as `Rollout.harness_error`, logged, never scored or trained on.
//!
//! The actor itself only starts groups; their turns run as tasks on its arbiter, which do no
//! blocking work (prompts and parsing are microseconds; everything slow is in another actor).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kevin::config::RolloutSection;
use kevin::episode::{Episode, EpisodeTask, Group};
use kevin::outcome::{busy_retry, Outcome};
use kevin::turn::{Responded, TurnRecord};
use tokio::sync::oneshot;

use crate::pipeline::compiler::Compiler;
use crate::pipeline::failures::Failures;
use crate::pipeline::generator::Generator;
use crate::pipeline::mailbox::{actix_capacity, Handle};
use crate::pipeline::messages::{Compile, Generate, GroupDone, GroupSlot, StartGroup};
use crate::pipeline::replay_queue::ReplayQueue;

/// Attempts at generating one turn before the group is abandoned (a policy failure is not the
/// candidate's fault, so it is retried rather than scored).
const GENERATE_ATTEMPTS: u32 = 3;

/// What every episode task of this actor shares.
pub struct RolloutShared {
    /// Episode shape.
    pub cfg: RolloutSection,
    /// Base seed of sampling seeds.
    pub seed: u64,
    /// The generator.
    pub generator: Handle<Generator>,
    /// The first evaluation stage.
    pub compiler: Handle<Compiler>,
    /// Where finished groups go.
    pub replay: Handle<ReplayQueue>,
    /// Groups running now (the shutdown drain waits for 0).
    pub inflight: Arc<AtomicUsize>,
    /// Turns finished in this session.
    pub turns_done: Arc<AtomicU64>,
    /// Failure counters.
    pub failures: Arc<Failures>,
}

/// The Rollout actor.
pub struct Rollout {
    shared: Arc<RolloutShared>,
    credits: usize,
}

impl Rollout {
    /// A rollout actor.
    pub fn new(shared: Arc<RolloutShared>, credits: usize) -> Self {
        Rollout { shared, credits }
    }
}

impl Actor for Rollout {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(actix_capacity(self.credits));
    }
}

impl Handler<StartGroup> for Rollout {
    type Result = ();

    fn handle(&mut self, msg: StartGroup, _ctx: &mut Context<Self>) {
        let _span = tracing::info_span!("StartGroup", actor = "Rollout", task = %msg.task.name, group = msg.group_id).entered();
        self.shared.inflight.fetch_add(1, Ordering::SeqCst);
        actix::spawn(run_group(
            self.shared.clone(),
            msg.task,
            msg.group_id,
            msg.slot,
        ));
        // The group runs on; this message is handled: its credit returns now. The group's own
        // bound is its slot.
        drop(msg.ticket);
    }
}

async fn run_group(
    shared: Arc<RolloutShared>,
    task: Arc<EpisodeTask>,
    group_id: u64,
    slot: GroupSlot,
) {
    let handles: Vec<_> = (0..shared.cfg.trajectories)
        .map(|i| actix::spawn(run_trajectory(shared.clone(), task.clone(), group_id, i)))
        .collect();
    let mut trajectories = Vec::with_capacity(handles.len());
    let mut failed = None;
    for h in handles {
        match h.await {
            Ok(Ok(turns)) => trajectories.push(turns),
            Ok(Err(e)) => failed = Some(e),
            Err(e) => failed = Some(format!("trajectory task failed: {e}")),
        }
    }
    if let Some(reason) = failed {
        shared.failures.count("Rollout.group_abandoned");
        tracing::error!(actor = "Rollout", task = %task.name, group = group_id, %reason, "group abandoned");
    } else {
        let group = Group {
            id: group_id,
            task: task.name.clone(),
            trajectories,
        };
        match shared
            .replay
            .send(|ticket| GroupDone {
                group,
                slot,
                ticket,
            })
            .await
        {
            Ok(Ok(_seq)) => {}
            Ok(Err(e)) => {
                shared.failures.count("ReplayQueue.rejected");
                tracing::error!(actor = "Rollout", error = %e, "the replay queue could not accept a group");
            }
            Err(e) => tracing::error!(actor = "Rollout", error = %e, "the replay queue is gone"),
        }
    }
    shared.inflight.fetch_sub(1, Ordering::SeqCst);
}

/// Sends `source` through Compiler -> Verifier -> Profiler and waits for its outcome. A
/// candidate the machine was too busy to judge ([`Outcome::is_busy`]) is sent again, as often and
/// as far apart as [`busy_retry`] says (each counted as `Rollout.harness_busy`), before its busy
/// verdict stands and abandons the group.
async fn judge(
    shared: &RolloutShared,
    task: &str,
    source: &str,
    group_id: u64,
) -> Result<Outcome, String> {
    let mut attempt = 0;
    loop {
        let (tx, rx) = oneshot::channel();
        let (t, s) = (task.to_string(), source.to_string());
        if shared
            .compiler
            .send(|ticket| Compile {
                task: t,
                source: s,
                reply: tx,
                ticket,
            })
            .await
            .is_err()
        {
            return Err("the compiler is gone".into());
        }
        let verdict = rx.await.unwrap_or_else(|_| Outcome::Crash {
            reason: "the evaluation pipeline dropped the candidate".into(),
        });
        let Some(wait) = busy_retry(verdict.is_busy(), attempt) else {
            return Ok(verdict);
        };
        shared.failures.count("Rollout.harness_busy");
        tracing::warn!(
            actor = "Rollout",
            task,
            group = group_id,
            attempt,
            ?wait,
            "the machine was too busy to judge the candidate; it is sent again"
        );
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

async fn run_trajectory(
    shared: Arc<RolloutShared>,
    task: Arc<EpisodeTask>,
    group_id: u64,
    index: u32,
) -> Result<Vec<TurnRecord>, String> {
    let mut episode = Episode::new(
        task.clone(),
        shared.cfg.turns,
        shared.cfg.prompt_budget_chars as usize,
    );
    while !episode.is_done() {
        let turn = episode.next_turn();
        let request = {
            let _s = tracing::info_span!("BuildPrompt", actor = "Rollout", turn).entered();
            // The id is unique per turn of the run: group, trajectory and turn.
            let id = (group_id << 20) | ((index as u64) << 10) | turn as u64;
            episode.request(id, shared.seed, group_id, index)
        };
        let prompt = request.prompt.clone();
        let started = Instant::now();
        let mut completion = Err(String::new());
        for attempt in 0..GENERATE_ATTEMPTS {
            let (tx, rx) = oneshot::channel();
            let req = request.clone();
            if shared
                .generator
                .send(|ticket| Generate {
                    request: req,
                    reply: tx,
                    ticket,
                })
                .await
                .is_err()
            {
                return Err("the generator is gone".into());
            }
            completion = rx
                .await
                .unwrap_or_else(|_| Err("the generator dropped the request".into()));
            if completion.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
        }
        let completion =
            completion.map_err(|e| format!("generation failed {GENERATE_ATTEMPTS} times: {e}"))?;
        let generate_ms = started.elapsed().as_secs_f64() * 1e3;
        let evaluated = Instant::now();
        let responded = {
            let _s = tracing::info_span!("ParseResponse", actor = "Rollout", turn).entered();
            Responded::new(turn, prompt, completion, generate_ms)
        };
        let verdict = match responded.candidate() {
            None => None,
            Some(source) => Some(judge(&shared, &task.name, source, group_id).await?),
        };
        if let Some(Outcome::HarnessError { reason, .. }) = &verdict {
            // Not the policy's doing: no reward, not trained on. The group is abandoned (its
            // other trajectories' advantages would be computed against a missing one).
            shared.failures.count("Rollout.harness_error");
            tracing::error!(actor = "Rollout", task = %task.name, group = group_id, trajectory = index, turn, %reason, "the harness failed; the candidate was not judged");
            return Err(format!("harness error at turn {turn}: {reason}"));
        }
        episode.record(responded.record(verdict, evaluated.elapsed().as_secs_f64() * 1e3));
        shared.turns_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(episode.into_turns())
}
