//! kevin's core library: everything about multi-turn RL for CUDA kernels that is not an actor,
//! not a CLI and not a GPU detail.
//!
//! It holds the typed experiment configuration ([`config`]), the RL math ([`rl`]), the types that
//! flow between actors (tasks, episodes, candidates, outcomes), the replay queue with its
//! write-ahead log ([`replay`]), the run directory and its checkpoints ([`run_dir`]), telemetry
//! (trace file, metrics, inspection: [`telemetry`]), and the simulated components that let the
//! whole system run before (and beside) the real policy and kernel environment ([`sim`]).
//!
//! Invariant: nothing here depends on actix, tokio or the CLI. The actors crate drives this
//! library; it never reaches around it.
#![warn(missing_docs)]
pub mod candidate;
