//! The actor pipeline of `kevin train`: one actor per box of the design's actor graph, their
//! messages, bounded mailboxes, blocking pools and the system that wires and stops them.
//!
//! ```text
//! TaskSampler --StartGroup--> Rollout --Generate--> Generator (policy thread, continuous batching)
//!                               |  <--Completion--
//!                               |--Compile--> Compiler --Verify--> Verifier --Profile--> Profiler
//!                               |  <------------------ Outcome (reply channel) -----------------
//!                               '--GroupDone--> ReplayQueue <--TakeBatch-- Learner --PublishWeights--> Generator
//! ReplayQueue --TaskFeedback (Recipient)--> TaskSampler
//! ```
//!
//! Invariants: every blocking call (policy, learner, environment, file writes with fsync) runs on
//! a dedicated thread ([`pool`]) or on an actor's own arbiter, never on the shared executor;
//! every mailbox is bounded by explicit credits ([`mailbox`]) and there is no cycle of bounded
//! sends (feedback to the sampler uses `do_send` through a `Recipient<TaskFeedback>`, so the
//! replay queue does not name the sampler's type, and is bounded by the in-flight bound).
//!
//! Dependency direction: the actor files import [`messages`], [`mailbox`], [`pool`], [`stage`]
//! and [`failures`] and the actors downstream of them; [`system`] wires them all. Nothing here
//! imports `crate::cmd` or `crate::cli`: the commands drive the pipeline through
//! [`system::train`], never the other way round.

pub mod compiler;
pub mod failures;
pub mod generator;
pub mod learner;
pub mod mailbox;
pub mod messages;
pub mod pool;
pub mod profiler;
pub mod replay_queue;
pub mod rollout;
pub mod stage;
pub mod system;
pub mod task_sampler;
pub mod telemetry;
pub mod verifier;
