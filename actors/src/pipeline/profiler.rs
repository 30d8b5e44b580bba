//! The Profiler actor: fronts the timing pool. Its outcome (correct with times, or a failure
//! found while timing) is the candidate's final outcome.

use std::sync::Arc;

use actix::prelude::*;
use kevin::env::KernelEnv;

use crate::pipeline::failures::Failures;
use crate::pipeline::messages::Profile;
use crate::pipeline::pool::BlockingPool;
use crate::pipeline::stage::{run_stage, stage_actor};

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

stage_actor!(Profiler, "Profiler", "profile");

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
                Err(failure) => failure.handle(&me),
            };
            let _ = reply.send(outcome);
            drop(ticket);
        });
    }
}
