//! What the three evaluation stages (Compiler, Verifier, Profiler) share: running one blocking
//! environment call on the stage's pool under a deadline, and turning a component failure into
//! the candidate's outcome.

use std::time::Duration;

use actix::prelude::*;
use kevin::outcome::Outcome;
use tracing::Span;

use crate::pipeline::messages::Restart;
use crate::pipeline::pool::BlockingPool;

/// Extra time the actor grants beyond the environment's own deadline before it gives up on the
/// call: the environment enforces deadlines in its worker processes; this is the safety net for
/// an environment that does not.
const GRACE: Duration = Duration::from_secs(5);

/// How a stage call ended when it did not return normally.
pub enum StageFailure {
    /// The component panicked: the candidate gets a crash outcome and the actor restarts.
    Panicked(Outcome),
    /// No answer within the deadline: the candidate gets a timeout outcome.
    TimedOut(Outcome),
}

impl StageFailure {
    /// The outcome the candidate receives.
    pub fn into_outcome(self) -> Outcome {
        match self {
            StageFailure::Panicked(o) | StageFailure::TimedOut(o) => o,
        }
    }
}

/// Runs `f` on `pool` inside the span `make_span` creates, waiting at most `limit_ms` + grace.
/// The span is created on the pool thread when the work starts, so the trace shows work, not
/// queueing (queueing shows as mailbox depth).
pub async fn run_stage<T, F, S>(
    pool: &BlockingPool,
    make_span: S,
    stage: &'static str,
    limit_ms: u64,
    f: F,
) -> Result<T, StageFailure>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
    S: FnOnce() -> Span + Send + 'static,
{
    let rx = pool.run(move || {
        let span = make_span();
        let _entered = span.enter();
        f()
    });
    match tokio::time::timeout(Duration::from_millis(limit_ms) + GRACE, rx).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(panic))) => Err(StageFailure::Panicked(Outcome::Crash {
            reason: format!(
                "the evaluation environment failed during {stage}: {}",
                panic.0
            ),
        })),
        // The pool dropped the job: only when its threads are gone.
        Ok(Err(_)) => Err(StageFailure::Panicked(Outcome::Crash {
            reason: format!("the {stage} pool is gone"),
        })),
        Err(_) => {
            tracing::error!(
                stage,
                limit_ms,
                "an environment call outlived its deadline and the grace period"
            );
            Err(StageFailure::TimedOut(Outcome::Timeout {
                stage: stage.to_string(),
                limit_ms,
            }))
        }
    }
}

impl StageFailure {
    /// The candidate's outcome; a panic also asks the stage actor `me` to restart (a component
    /// that panicked may be in a bad state).
    pub fn handle<A>(self, me: &Addr<A>) -> Outcome
    where
        A: Handler<Restart>,
        A::Context: actix::dev::ToEnvelope<A, Restart>,
    {
        if matches!(self, StageFailure::Panicked(_)) {
            me.do_send(Restart);
        }
        self.into_outcome()
    }
}

/// The parts of a stage actor that do not depend on the stage: the actix capacity above its
/// credits, supervision (a restart replaces the pool's threads and is counted), and the
/// [`Restart`] message. The actor needs fields `credits`, `workers`, `pool` and `failures`.
macro_rules! stage_actor {
    ($actor:ident, $name:literal, $pool:literal) => {
        impl actix::Actor for $actor {
            type Context = actix::Context<Self>;

            fn started(&mut self, ctx: &mut actix::Context<Self>) {
                ctx.set_mailbox_capacity(crate::pipeline::mailbox::actix_capacity(self.credits));
            }
        }

        impl actix::Supervised for $actor {
            fn restarting(&mut self, _ctx: &mut actix::Context<Self>) {
                self.pool = crate::pipeline::pool::BlockingPool::new($pool, self.workers);
                self.failures.count(concat!($name, ".restart"));
                tracing::warn!(actor = $name, "restarted after a component failure");
            }
        }

        impl actix::Handler<crate::pipeline::messages::Restart> for $actor {
            type Result = ();

            fn handle(
                &mut self,
                _: crate::pipeline::messages::Restart,
                ctx: &mut actix::Context<Self>,
            ) {
                use actix::ActorContext;
                ctx.stop();
            }
        }
    };
}
pub(crate) use stage_actor;
