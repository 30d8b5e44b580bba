//! kevin's core library: everything about multi-turn RL for CUDA kernels that is not an actor,
//! not a CLI and not a GPU detail.
//!
//! It holds the typed experiment configuration ([`config`]), the RL math ([`rl`]), the types that
//! flow between actors (tasks, episodes, candidates, outcomes), the replay queue with its
//! write-ahead log ([`replay`], [`wal`]), the run directory and its checkpoints ([`run_dir`]), telemetry
//! (trace file, metrics, inspection: [`telemetry`]), and the simulated components that let the
//! whole system run before (and beside) the real policy and kernel environment ([`sim`]).
//! Untrusted candidate code is handled only in worker child processes ([`worker`]: protocol,
//! pool, child serve loop); [`compile`] is the NVRTC compile step those workers run, and [`cpu`]
//! a CUDA device model that compiles and runs candidates on the CPU (inside workers only).
//! [`corpus`] builds the supervised warm-start corpus from the train split, verified on a real
//! kernel environment; [`taskgen`] generates procedural training tasks for it. [`policy_eval`] runs a policy's K x N episodes on held-out tasks and
//! computes the paper's evaluation figures ([`scripted`] is its test double policy). [`baseline`] lowers a task's program to the op-by-op launches (trusted kernels and GEMMs) whose
//! time is the denominator of every speedup.
//!
//! Invariant: nothing here depends on actix, tokio or the CLI. The actors crate drives this
//! library; it never reaches around it.
#![warn(missing_docs)]

pub mod baseline;
pub mod candidate;
pub mod clock;
pub mod compile;
pub mod config;
pub mod corpus;
pub mod cpu;
pub mod env;
pub mod episode;
pub mod eval;
#[cfg(unix)]
pub mod gpu;
pub mod hacks;
pub mod kbimport;
pub mod learner;
pub mod machine;
pub mod metrics;
pub mod ops;
pub mod outcome;
pub mod packed;
pub mod par;
pub mod policy;
pub mod policy_eval;
pub mod prometheus;
pub mod prompt;
pub mod replay;
pub mod rl;
pub mod rng;
pub mod roles;
pub mod run_dir;
pub mod sampler;
pub mod scripted;
pub mod sim;
pub mod taskgen;
pub mod tasks;
pub mod telemetry;
pub mod turn;
pub mod verify;
pub mod wal;
pub mod worker;
