//! The Generator actor: feeds generation requests from many episodes to the policy as they
//! arrive (continuous batching), and swaps in new weights when nothing is in flight.
//!
//! The policy runs on a thread of its own, in a loop that lasts while there is work: before each
//! forward pass it takes every request that arrived meanwhile and queues it in the policy's
//! stream ([`PolicyStream`]), so a request joins the running ones at the next pass instead of
//! waiting for a whole batch to finish; each completion goes back to its episode as soon as its
//! pass ends. A policy without a stream of its own is driven a batch at a time
//! ([`BatchStream`]: everything that arrived, in one call).
//!
//! Weights published by the learner wait until nothing is in flight: from their arrival the loop
//! admits no new request, lets the running ones finish, then applies them. So every completion
//! was generated with one version of the weights, the one it reports, and the generator never
//! waits for the learner. Each stretch between two such points is one `generate_round` span
//! (its requests, and the version it ran).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use kevin::config::SamplingSection;
use kevin::policy::{BatchStream, Completion, Policy, StreamError, Weights};

use crate::pipeline::failures::Failures;
use crate::pipeline::mailbox::actix_capacity;
use crate::pipeline::messages::{Generate, PublishWeights};
use crate::pipeline::pool::BlockingPool;

/// What the actor and the policy loop share.
#[derive(Default)]
struct Shared {
    /// Requests not yet handed to the policy.
    inbox: VecDeque<Generate>,
    /// Weights to apply once nothing is in flight.
    next_weights: Option<Weights>,
    /// Whether the policy loop is running (it clears this, under the lock, when it leaves).
    running: bool,
}

/// The Generator actor.
pub struct Generator {
    // A std mutex: only the one policy thread ever locks it, the actor never does.
    policy: Arc<Mutex<Box<dyn Policy>>>,
    pool: BlockingPool,
    sampling: SamplingSection,
    shared: Arc<Mutex<Shared>>,
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
            shared: Arc::new(Mutex::new(Shared::default())),
            credits,
            failures,
        }
    }

    /// Starts the policy loop unless it runs (it takes whatever is in the inbox).
    fn wake(&mut self, ctx: &mut Context<Self>) {
        {
            let mut shared = lock(&self.shared);
            if shared.running || (shared.inbox.is_empty() && shared.next_weights.is_none()) {
                return;
            }
            shared.running = true;
        }
        let mut run = PolicyLoop {
            policy: self.policy.clone(),
            shared: self.shared.clone(),
            sampling: self.sampling.clone(),
            failures: self.failures.clone(),
            waiting: HashMap::new(),
            batch: BatchStream::default(),
        };
        let rx = self.pool.run(move || run.run());
        ctx.spawn(actix::fut::wrap_future::<_, Self>(rx).map(|result, act, ctx| {
            match result {
                Ok(Ok(())) => act.wake(ctx),
                Ok(Err(panic)) => {
                    // The loop's drop answered what it held; start again for what is left.
                    act.failures.count("Generator.policy_error");
                    tracing::error!(actor = "Generator", panic = %panic.0, "the policy loop panicked");
                    lock(&act.shared).running = false;
                    act.wake(ctx);
                }
                Err(_) => {
                    // No thread to run on: answer everything waiting, and stay stopped.
                    act.failures.count("Generator.policy_error");
                    let mut shared = lock(&act.shared);
                    for g in shared.inbox.drain(..) {
                        let _ = g.reply.send(Err("the policy thread is gone".to_string()));
                    }
                }
            }
        }));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The policy thread's loop (see the module documentation).
struct PolicyLoop {
    policy: Arc<Mutex<Box<dyn Policy>>>,
    shared: Arc<Mutex<Shared>>,
    sampling: SamplingSection,
    failures: Arc<Failures>,
    /// Requests handed to the policy and not yet answered, by id.
    waiting: HashMap<u64, Generate>,
    /// The batch-at-a-time stream of a policy without its own.
    batch: BatchStream,
}

/// What the loop does next.
enum Next {
    /// Queue these requests, then run a pass.
    Run(Vec<Generate>),
    /// Nothing in flight and weights waiting: apply them.
    Swap(Weights),
    /// Nothing to do: the loop ends (`running` is cleared).
    Stop,
}

impl PolicyLoop {
    fn run(&mut self) {
        let handle = self.policy.clone();
        let Ok(mut policy) = handle.lock() else {
            // An earlier panic left the policy in an unknown state: refuse, as it stays.
            let mut shared = lock(&self.shared);
            for g in shared.inbox.drain(..) {
                let _ = g
                    .reply
                    .send(Err("the policy is poisoned by an earlier panic".to_string()));
            }
            shared.next_weights = None;
            shared.running = false;
            return;
        };
        // The current round's span, opened by its first request.
        let mut round: Option<Round> = None;
        loop {
            let in_flight = self.waiting.len();
            let next = {
                let mut shared = lock(&self.shared);
                if shared.next_weights.is_some() {
                    // Admit nothing new until the weights are in.
                    match (in_flight, shared.next_weights.take()) {
                        (0, Some(w)) => Next::Swap(w),
                        (_, w) => {
                            shared.next_weights = w;
                            Next::Run(Vec::new())
                        }
                    }
                } else if in_flight == 0 && shared.inbox.is_empty() {
                    shared.running = false;
                    Next::Stop
                } else {
                    Next::Run(shared.inbox.drain(..).collect())
                }
            };
            match next {
                Next::Stop => break,
                Next::Swap(w) => {
                    if let Some(mut r) = round.take() {
                        r.end();
                    }
                    if let Err(e) = policy.set_weights(&w) {
                        // Generation goes on with the weights it has; the learner's next
                        // publication may load.
                        self.failures.count("Generator.weights_error");
                        tracing::error!(actor = "Generator", version = w.version, error = %e, "new weights were not applied");
                    }
                }
                Next::Run(new) => {
                    self.admit(&mut **policy, new);
                    let admitted = self.waiting.len().saturating_sub(in_flight);
                    if admitted > 0 {
                        round
                            .get_or_insert_with(|| Round::start(policy.version()))
                            .requests += admitted;
                    }
                    let stepped = match policy.stream() {
                        Some(stream) => stream.step(),
                        None => self.batch.step(&mut **policy),
                    };
                    self.deliver(stepped);
                    let left = match policy.stream() {
                        Some(stream) => stream.in_flight(),
                        None => self.batch.in_flight(),
                    };
                    if left == 0 && !self.waiting.is_empty() {
                        // The policy has nothing left, yet these were never answered.
                        self.failures.count("Generator.policy_error");
                        let n = self.waiting.len();
                        self.fail_all(&format!(
                            "the policy returned no completion for {n} request(s)"
                        ));
                    }
                }
            }
        }
        if let Some(mut r) = round.take() {
            r.end();
        }
    }

    /// Hands `new` to the policy; a request it cannot take is answered with the error.
    fn admit(&mut self, policy: &mut dyn Policy, new: Vec<Generate>) {
        let mut batch = Vec::with_capacity(new.len());
        for g in new {
            if self.waiting.contains_key(&g.request.id) {
                let _ = g.reply.send(Err(format!(
                    "request id {} is already in flight",
                    g.request.id
                )));
                continue;
            }
            batch.push(g.request.clone());
            self.waiting.insert(g.request.id, g);
        }
        if batch.is_empty() {
            return;
        }
        let submitted = match policy.stream() {
            Some(stream) => stream.submit(&batch, &self.sampling),
            None => {
                self.batch.submit(&batch, &self.sampling);
                Ok(())
            }
        };
        if let Err(e) = submitted {
            self.failures.count("Generator.policy_error");
            let msg = e.to_string();
            tracing::error!(actor = "Generator", error = %msg, "requests refused by the policy");
            for r in &batch {
                if let Some(g) = self.waiting.remove(&r.id) {
                    let _ = g.reply.send(Err(msg.clone()));
                }
            }
        }
    }

    /// Sends a step's completions (or its failure) to their episodes.
    fn deliver(&mut self, stepped: Result<Vec<Completion>, StreamError>) {
        match stepped {
            Ok(done) => {
                for c in done {
                    match self.waiting.remove(&c.id) {
                        Some(g) => {
                            let _ = g.reply.send(Ok(c));
                        }
                        None => {
                            self.failures.count("Generator.policy_error");
                            tracing::error!(
                                actor = "Generator",
                                id = c.id,
                                "the policy completed a request it was not given"
                            );
                        }
                    }
                }
            }
            Err(StreamError { error, dropped }) => {
                self.failures.count("Generator.policy_error");
                let msg = error.to_string();
                tracing::error!(actor = "Generator", error = %msg, requests = dropped.len(), "a generation step failed");
                for id in dropped {
                    if let Some(g) = self.waiting.remove(&id) {
                        let _ = g.reply.send(Err(msg.clone()));
                    }
                }
            }
        }
    }

    fn fail_all(&mut self, msg: &str) {
        for (_, g) in self.waiting.drain() {
            let _ = g.reply.send(Err(msg.to_string()));
        }
    }
}

impl Drop for PolicyLoop {
    /// A loop that unwinds (a panic in the policy) answers what it held, so no episode waits
    /// forever.
    fn drop(&mut self) {
        if !self.waiting.is_empty() {
            self.fail_all("the policy panicked");
        }
    }
}

/// One `generate_round` span: the requests generated with one version of the weights, from the
/// first request after the loop's start or a swap to the next swap or the loop's end.
struct Round {
    span: Option<tracing::span::EnteredSpan>,
    requests: usize,
}

impl Round {
    fn start(version: u64) -> Round {
        Round {
            span: Some(
                tracing::info_span!(
                    "generate_round",
                    actor = "Generator",
                    version,
                    requests = tracing::field::Empty
                )
                .entered(),
            ),
            requests: 0,
        }
    }

    fn end(&mut self) {
        if let Some(span) = self.span.take() {
            span.record("requests", self.requests);
        }
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
        lock(&self.shared).inbox.push_back(msg);
        self.wake(ctx);
    }
}

impl Handler<PublishWeights> for Generator {
    type Result = ();

    fn handle(&mut self, msg: PublishWeights, ctx: &mut Context<Self>) {
        // A newer publication replaces one that was not applied yet.
        lock(&self.shared).next_weights = Some(msg.0);
        self.wake(ctx);
    }
}

#[cfg(test)]
#[path = "generator_tests.rs"]
mod tests;
