//! The Profiler actor: fronts the timing pool. Its outcome (correct with times, or a failure
//! found while timing) is the candidate's final outcome.

use std::sync::Arc;

use actix::prelude::*;
use kevin::env::KernelEnv;

use crate::failures::Failures;
use crate::mailbox::actix_capacity;
use crate::messages::{Profile, Restart};
use crate::pool::BlockingPool;
use crate::stage::{run_stage, StageFailure};

/// The Profiler actor.
pub struct Profiler {
    env: Arc<dyn KernelEnv>,
    workers: usize,
    pool: BlockingPool,
    timeout_ms: u64,
    credits: usize,
    failures: Arc<Failures>,
}

impl Profiler {
    /// A profiler with `workers` threads (one per device: timings must not share one).
    pub fn new(
        env: Arc<dyn KernelEnv>,
        workers: usize,
        timeout_ms: u64,
        credits: usize,
        failures: Arc<Failures>,
    ) -> Self {
        Profiler {
            pool: BlockingPool::new("profile", workers),
            env,
            workers,
            timeout_ms,
            credits,
            failures,
        }
    }
}

impl Actor for Profiler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(actix_capacity(self.credits));
    }
}

impl Supervised for Profiler {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.pool = BlockingPool::new("profile", self.workers);
        self.failures.count("Profiler.restart");
        tracing::warn!(actor = "Profiler", "restarted after a component failure");
    }
}

impl Handler<Profile> for Profiler {
    type Result = ();

    fn handle(&mut self, msg: Profile, ctx: &mut Context<Self>) {
        let task_name = msg.compiled.task.clone();
        let span = move || tracing::info_span!("Profile", actor = "Profiler", task = %task_name);
        let (env, pool, limit) = (self.env.clone(), self.pool.clone(), self.timeout_ms);
        let me = ctx.address();
        let Profile {
            compiled,
            reply,
            ticket,
        } = msg;
        actix::spawn(async move {
            let outcome = match run_stage(&pool, span, "profile", limit, move || {
                env.profile(&compiled)
            })
            .await
            {
                Ok(outcome) => outcome,
                Err(failure) => {
                    if matches!(failure, StageFailure::Panicked(_)) {
                        me.do_send(Restart);
                    }
                    failure.into_outcome()
                }
            };
            let _ = reply.send(outcome);
            drop(ticket);
        });
    }
}

impl Handler<Restart> for Profiler {
    type Result = ();

    fn handle(&mut self, _: Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
