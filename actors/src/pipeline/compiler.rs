//! The Compiler actor: fronts the compile pool. A candidate that compiles goes on to the Verifier;
//! one that does not gets its compile-error outcome straight back to its episode.

use std::sync::Arc;

use actix::prelude::*;
use kevin::env::KernelEnv;

use crate::pipeline::failures::Failures;
use crate::pipeline::mailbox::Handle;
use crate::pipeline::messages::{Compile, Verify};
use crate::pipeline::pool::BlockingPool;
use crate::pipeline::stage::{run_stage, stage_actor};
use crate::pipeline::verifier::Verifier;

/// The Compiler actor.
pub struct Compiler {
    env: Arc<dyn KernelEnv>,
    workers: usize,
    pool: BlockingPool,
    verifier: Handle<Verifier>,
    timeout_ms: u64,
    credits: usize,
    failures: Arc<Failures>,
}

impl Compiler {
    /// A compiler with `workers` threads in front of `env`.
    pub fn new(
        env: Arc<dyn KernelEnv>,
        workers: usize,
        verifier: Handle<Verifier>,
        timeout_ms: u64,
        credits: usize,
        failures: Arc<Failures>,
    ) -> Self {
        Compiler {
            pool: BlockingPool::new("compile", workers),
            env,
            workers,
            verifier,
            timeout_ms,
            credits,
            failures,
        }
    }
}

stage_actor!(Compiler, "Compiler", "compile");

impl Handler<Compile> for Compiler {
    type Result = ();

    fn handle(&mut self, msg: Compile, ctx: &mut Context<Self>) {
        let task_name = msg.task.clone();
        let span = move || tracing::info_span!("Compile", actor = "Compiler", task = %task_name);
        let (env, pool, verifier, limit) = (
            self.env.clone(),
            self.pool.clone(),
            self.verifier.clone(),
            self.timeout_ms,
        );
        let me = ctx.address();
        let Compile {
            task,
            source,
            reply,
            ticket,
        } = msg;
        actix::spawn(async move {
            match run_stage(&pool, span, "compile", limit, move || {
                env.compile(&task, &source)
            })
            .await
            {
                // Keep this stage's credit until the next stage has accepted the work: that is
                // what carries backpressure from the Profiler back to the Rollout.
                Ok(Ok(compiled)) => {
                    if verifier
                        .send(|t| Verify {
                            compiled,
                            reply,
                            ticket: t,
                        })
                        .await
                        .is_err()
                    {
                        tracing::error!("the Verifier is gone; a candidate was not verified");
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
