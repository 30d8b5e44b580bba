//! kevin's actor system: one actor per box of the design's actor graph, their wiring and
//! lifecycle ([`system`]), the command line ([`cli`]) and the `kevin` binary's entry point.
//!
//! ```text
//! TaskSampler --StartGroup--> Rollout --Generate--> Generator (policy thread, batched)
//!                               |  <--Completion--
//!                               |--Compile--> Compiler --Verify--> Verifier --Profile--> Profiler
//!                               |  <------------------ Outcome (reply channel) -----------------
//!                               '--GroupDone--> ReplayQueue <--TakeBatch-- Learner --PublishWeights--> Generator
//! ```
//!
//! Invariants: every blocking call (policy, learner, environment, file writes with fsync) runs on
//! a dedicated thread ([`pool`]) or on an actor's own arbiter, never on the shared executor;
//! every mailbox is bounded by explicit credits ([`mailbox`]) and there is no cycle of bounded
//! sends (feedback to the sampler uses `do_send` and is bounded by the in-flight bound); this
//! crate knows nothing of CUDA: it sees the policy, the learner and the environment only through
//! the traits of the core library.

pub mod backends;
pub mod bench;
pub mod bench_gpu;
pub mod bench_policy;
pub mod cli;
pub mod compiler;
pub mod eval_cmd;
pub mod eval_policy_cmd;
pub mod failures;
pub mod faults_bench;
pub mod generator;
pub mod hacks_cmd;
pub mod learner;
pub mod mailbox;
pub mod messages;
pub mod modes_bench;
pub mod pool;
pub mod profiler;
pub mod replay_queue;
pub mod report;
pub mod rollout;
pub mod sft_cmd;
pub mod stage;
pub mod system;
pub mod task_sampler;
pub mod tasks_cmd;
pub mod telemetry;
pub mod verifier;
