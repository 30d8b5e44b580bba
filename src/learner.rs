//! The learner interface: what the Learner actor needs from an optimiser of the policy.
//!
//! A learner trains on a batch of scored groups (one call may take several optimizer steps), bumps
//! its version, publishes its weights for the generators, and saves and loads its state (model,
//! optimizer, version) in a checkpoint folder. Calls block; the actors crate runs them on a
//! dedicated thread.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::policy::Weights;
use crate::replay::Batch;

/// What one training call measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainStats {
    /// Mean loss over the optimizer steps.
    pub loss: f64,
    /// Fraction of tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Global gradient norm before clipping (last step).
    pub grad_norm: f64,
    /// Response tokens trained on.
    pub tokens: u64,
    /// Turn-samples trained on.
    pub samples: u64,
    /// Optimizer steps taken.
    pub optimizer_steps: u32,
}

/// A failure of the learner.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// Training failed.
    #[error("learner {learner}: training failed at version {version}: {reason}")]
    Train {
        /// The learner.
        learner: String,
        /// Its version.
        version: u64,
        /// Why.
        reason: String,
    },
    /// Saving or loading state failed.
    #[error("learner {learner}: checkpoint {path}: {reason}")]
    Checkpoint {
        /// The learner.
        learner: String,
        /// The checkpoint folder.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Optimises the policy from batches of scored groups.
pub trait Learner: Send {
    /// One line describing the learner.
    fn describe(&self) -> String;
    /// Number of completed training calls: the version of the current weights.
    fn version(&self) -> u64;
    /// Trains on one batch; on success the version has advanced by one.
    fn train(&mut self, batch: &Batch) -> Result<TrainStats, LearnerError>;
    /// The current weights, to publish to generators.
    fn weights(&self) -> Weights;
    /// Writes model, optimizer and version into `dir` (which exists and is empty).
    fn save(&self, dir: &Path) -> Result<(), LearnerError>;
    /// Restores what [`Learner::save`] wrote.
    fn load(&mut self, dir: &Path) -> Result<(), LearnerError>;
}
