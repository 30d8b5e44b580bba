//! kevin's actor system and its command line: [`pipeline`] holds the actors of `kevin train`
//! and their wiring; [`cmd`] holds one module per command (arguments and `run`); [`cli`] is the
//! command enum and the dispatch that the `kevin` binary's entry point calls; [`remote`] is
//! remote evaluation over NATS JetStream (the `remote` environment and `kevin worker-node`).
//!
//! Dependency direction: `cli -> cmd -> pipeline -> remote -> kevin (core)`; never backwards. This crate
//! knows nothing of CUDA: it sees the policy, the learner and the environment only through the
//! traits of the core library.

pub mod cli;
pub mod cmd;
pub mod pipeline;
pub mod remote;
