//! The Verifier actor: fronts the verification pool (the correctness protocol). A correct
//! candidate goes on to the Profiler; any other gets its outcome straight back to its episode.

use std::sync::Arc;

use actix::prelude::*;
use kevin::env::KernelEnv;

use crate::pipeline::failures::Failures;
use crate::pipeline::mailbox::Handle;
use crate::pipeline::messages::{Profile, Verify};
use crate::pipeline::pool::BlockingPool;
use crate::pipeline::profiler::Profiler;
use crate::pipeline::stage::{run_stage, stage_actor};

/// The Verifier actor.
pub struct Verifier {
    env: Arc<dyn KernelEnv>,
    workers: usize,
    pool: BlockingPool,
    profiler: Handle<Profiler>,
    timeout_ms: u64,
    credits: usize,
    failures: Arc<Failures>,
}

impl Verifier {
    /// A verifier with `workers` threads in front of `env`.
    pub fn new(
        env: Arc<dyn KernelEnv>,
        workers: usize,
        profiler: Handle<Profiler>,
        timeout_ms: u64,
        credits: usize,
        failures: Arc<Failures>,
    ) -> Self {
        Verifier {
            pool: BlockingPool::new("verify", workers),
            env,
            workers,
            profiler,
            timeout_ms,
            credits,
            failures,
        }
    }
}

stage_actor!(Verifier, "Verifier", "verify");

impl Handler<Verify> for Verifier {
    type Result = ();

    fn handle(&mut self, msg: Verify, ctx: &mut Context<Self>) {
        let task_name = msg.compiled.task.clone();
        let span = move || tracing::info_span!("Verify", actor = "Verifier", task = %task_name);
        let (env, pool, profiler, limit) = (
            self.env.clone(),
            self.pool.clone(),
            self.profiler.clone(),
            self.timeout_ms,
        );
        let me = ctx.address();
        let Verify {
            compiled,
            reply,
            ticket,
        } = msg;
        actix::spawn(async move {
            let c = compiled.clone();
            match run_stage(&pool, span, "verify", limit, move || env.verify(&c)).await {
                Ok(Ok(())) => {
                    if profiler
                        .send(|t| Profile {
                            compiled,
                            reply,
                            ticket: t,
                        })
                        .await
                        .is_err()
                    {
                        tracing::error!("the Profiler is gone; a candidate was not timed");
                    }
                }
                Ok(Err(outcome)) => {
                    let _ = reply.send(outcome);
                }
                Err(failure) => {
                    let _ = reply.send(failure.handle(&me));
                }
            }
            drop(ticket);
        });
    }
}
