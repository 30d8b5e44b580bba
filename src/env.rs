//! The kernel environment interface: compile, verify and profile one candidate.
//!
//! The three stages are separate calls because separate actors (and worker pools) run them:
//! compilation is CPU-bound and parallel, verification and timing need the device. A failure of
//! the candidate at any stage is an [`Outcome`] (data), returned as `Err` so the pipeline stops
//! there. Calls block; the actors crate runs them on dedicated threads.

use std::any::Any;
use std::sync::Arc;

use crate::outcome::Outcome;

/// A compiled candidate, ready to verify. The artifact's type belongs to the environment (PTX and
/// a resolved launch plan for the CUDA harness; nothing much for the simulated one).
#[derive(Clone)]
pub struct Compiled {
    /// The task it was compiled for.
    pub task: String,
    /// Environment-defined artifact.
    pub artifact: Arc<dyn Any + Send + Sync>,
    /// Compile time (ms).
    pub compile_ms: f64,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Compiled({}, {:.1} ms)", self.task, self.compile_ms)
    }
}

/// Compiles, verifies and times candidates.
pub trait KernelEnv: Send + Sync {
    /// One line describing the environment ("simulated environment: ...").
    fn describe(&self) -> String;
    /// Compiles the ```cuda block `source` (launch lines included) for `task`.
    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome>;
    /// Runs the correctness protocol.
    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome>;
    /// Times the kernel against the baseline; returns the final outcome.
    fn profile(&self, compiled: &Compiled) -> Outcome;
}
