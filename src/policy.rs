//! The policy interface: what the Generator actor needs from a language model.
//!
//! A policy generates a batch of responses in one call (the generator batches requests from many
//! episodes), reports the learner version of its weights and the per-token log-probabilities it
//! sampled with (the behaviour log-probs the off-policy correction needs), and accepts new
//! weights between batches. Calls block: the actors crate runs them on a dedicated thread.

use std::any::Any;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::SamplingSection;

/// One generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenRequest {
    /// Caller-chosen id, echoed in the completion.
    pub id: u64,
    /// The full prompt.
    pub prompt: String,
    /// Seed of this request's sampling.
    pub seed: u64,
}

/// Why a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// End-of-sequence token or a stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
}

/// One generated response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The request's id.
    pub id: u64,
    /// Decoded response text.
    pub text: String,
    /// Response token ids.
    pub token_ids: Vec<u32>,
    /// Behaviour log-probability of each response token.
    pub logprobs: Vec<f32>,
    /// Learner version of the weights that sampled it.
    pub policy_version: u64,
    /// Why it ended.
    pub finish: FinishReason,
}

/// Weights published by the learner. The payload's type belongs to the policy implementation
/// (a burn record, or nothing for the simulated policy); it is shared, never copied, on one device.
#[derive(Clone)]
pub struct Weights {
    /// Learner version these weights are.
    pub version: u64,
    /// Implementation-defined payload.
    pub payload: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Weights(v{})", self.version)
    }
}

/// A failure of the policy itself (not of a response).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Weights of the wrong kind or shape.
    #[error("policy {policy}: cannot load weights v{version}: {reason}")]
    Weights {
        /// The policy.
        policy: String,
        /// The weights' version.
        version: u64,
        /// Why.
        reason: String,
    },
    /// Generation failed (device error, out of memory, ...).
    #[error("policy {policy}: generation failed: {reason}")]
    Generate {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
}

/// A language model that writes kernels.
pub trait Policy: Send {
    /// One line describing the policy, for logs ("simulated policy: ...").
    fn describe(&self) -> String;
    /// Learner version of the current weights.
    fn version(&self) -> u64;
    /// Generates one completion per request, in request order.
    fn generate(
        &mut self,
        batch: &[GenRequest],
        sampling: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError>;
    /// Replaces the weights; called between batches only.
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError>;
}
