//! The Generator actor: batches generation requests from many episodes into one call of the
//! policy (autobatching), and swaps in new weights between batches.
//!
//! Requests wait in arrival order; whenever the policy thread is idle, everything waiting (up to
//! `max_batch`) goes out as one batch. Weights published by the learner are applied just before
//! the next batch starts, so a batch in flight finishes with the weights it started with, and the
//! generator never waits for the learner.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use kevin::config::SamplingSection;
use kevin::policy::{Completion, Policy, Weights};

use crate::pipeline::failures::Failures;
use crate::pipeline::mailbox::actix_capacity;
use crate::pipeline::messages::{Generate, PublishWeights};
use crate::pipeline::pool::BlockingPool;

/// The Generator actor.
pub struct Generator {
    // A std mutex: only the one policy thread ever locks it, the actor never does.
    policy: Arc<Mutex<Box<dyn Policy>>>,
    pool: BlockingPool,
    sampling: SamplingSection,
    pending: VecDeque<Generate>,
    busy: bool,
    next_weights: Option<Weights>,
    credits: usize,
    failures: Arc<Failures>,
}

impl Generator {
    /// A generator in front of `policy`.
    pub fn new(
        policy: Box<dyn Policy>,
        sampling: SamplingSection,
        credits: usize,
        failures: Arc<Failures>,
    ) -> Self {
        Generator {
            policy: Arc::new(Mutex::new(policy)),
            pool: BlockingPool::new("policy", 1),
            sampling,
            pending: VecDeque::new(),
            busy: false,
            next_weights: None,
            credits,
            failures,
        }
    }

    fn dispatch(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.pending.is_empty() {
            return;
        }
        let n = self.pending.len().min(self.sampling.max_batch as usize);
        let batch: Vec<Generate> = self.pending.drain(..n).collect();
        let requests: Vec<_> = batch.iter().map(|g| g.request.clone()).collect();
        let weights = self.next_weights.take();
        let (policy, sampling) = (self.policy.clone(), self.sampling.clone());
        self.busy = true;
        let rx = self.pool.run(move || -> Result<Vec<Completion>, String> {
            let span = tracing::info_span!(
                "generate_batch",
                actor = "Generator",
                batch = requests.len()
            );
            let _entered = span.enter();
            let mut policy = policy
                .lock()
                .map_err(|_| "the policy is poisoned by an earlier panic".to_string())?;
            if let Some(w) = weights {
                policy.set_weights(&w).map_err(|e| e.to_string())?;
            }
            policy
                .generate(&requests, &sampling)
                .map_err(|e| e.to_string())
        });
        ctx.spawn(actix::fut::wrap_future::<_, Self>(rx).map(move |result, act, ctx| {
            let result = match result {
                Ok(Ok(r)) => r,
                Ok(Err(panic)) => Err(format!("the policy panicked: {}", panic.0)),
                Err(_) => Err("the policy thread is gone".to_string()),
            };
            match result {
                Ok(completions) if completions.len() == batch.len() => {
                    for (g, c) in batch.into_iter().zip(completions) {
                        let _ = g.reply.send(Ok(c));
                    }
                }
                Ok(completions) => {
                    act.failures.count("Generator.policy_error");
                    let msg = format!("the policy returned {} completions for {} requests", completions.len(), batch.len());
                    for g in batch {
                        let _ = g.reply.send(Err(msg.clone()));
                    }
                }
                Err(msg) => {
                    act.failures.count("Generator.policy_error");
                    tracing::error!(actor = "Generator", error = %msg, "a generation batch failed");
                    for g in batch {
                        let _ = g.reply.send(Err(msg.clone()));
                    }
                }
            }
            act.busy = false;
            act.dispatch(ctx);
        }));
    }
}

impl Actor for Generator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(actix_capacity(self.credits));
    }
}

impl Handler<Generate> for Generator {
    type Result = ();

    fn handle(&mut self, msg: Generate, ctx: &mut Context<Self>) {
        self.pending.push_back(msg);
        self.dispatch(ctx);
    }
}

impl Handler<PublishWeights> for Generator {
    type Result = ();

    fn handle(&mut self, msg: PublishWeights, _ctx: &mut Context<Self>) {
        // A newer publication replaces one that was not applied yet.
        self.next_weights = Some(msg.0);
    }
}
