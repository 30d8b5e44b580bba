//! The policy interface: what the Generator actor needs from a language model.
//!
//! A policy generates a batch of responses in one call (the generator batches requests from many
//! episodes), reports the learner version of its weights and the per-token log-probabilities it
//! sampled with (the behaviour log-probs the off-policy correction needs), and accepts new
//! weights between batches. Calls block: the actors crate runs them on a dedicated thread.
//!
//! A policy that can take new requests between its forward passes also offers a
//! [`PolicyStream`] ([`Policy::stream`]): continuous batching across calls, so a request that
//! arrives while others run joins them at the next pass instead of waiting for the whole batch
//! to finish. The Generator actor drives every policy as a stream; one without its own is driven
//! a batch at a time ([`BatchStream`]).

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
    /// Replaces the weights; called between batches only (with nothing in flight in the
    /// stream).
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError>;
    /// The policy's continuous batching, if it has one (default: none).
    fn stream(&mut self) -> Option<&mut dyn PolicyStream> {
        None
    }
}

/// Continuous batching across calls: requests are queued at any time and join the running ones
/// at the next forward pass; each [`PolicyStream::step`] runs one pass and hands back the
/// requests that finished in it. Completions carry the version of the weights they were
/// generated with: weights change only when nothing is in flight ([`Policy::set_weights`]).
pub trait PolicyStream {
    /// Queues `batch`. A request that cannot run (e.g. a prompt that leaves no room for a
    /// response) finishes at a later step with an empty completion, as in [`Policy::generate`];
    /// an error here names the request and queues none of the batch.
    fn submit(
        &mut self,
        batch: &[GenRequest],
        sampling: &SamplingSection,
    ) -> Result<(), PolicyError>;
    /// Runs one forward pass over the queued and running requests; the completions of those
    /// that finished. With nothing in flight it returns at once, with none.
    fn step(&mut self) -> Result<Vec<Completion>, StreamError>;
    /// Requests queued or running.
    fn in_flight(&self) -> usize;
}

/// A failed [`PolicyStream::step`]: the requests it dropped (the others stay queued).
#[derive(Debug)]
pub struct StreamError {
    /// What failed.
    pub error: PolicyError,
    /// The ids of the requests that will not complete.
    pub dropped: Vec<u64>,
}

/// [`PolicyStream`] over a policy without one: each step generates everything queued as one
/// batch ([`Policy::generate`]).
#[derive(Debug, Default)]
pub struct BatchStream {
    queued: Vec<GenRequest>,
    sampling: Option<SamplingSection>,
}

impl BatchStream {
    /// Queues `batch` (generated with the `sampling` of the latest submit).
    pub fn submit(&mut self, batch: &[GenRequest], sampling: &SamplingSection) {
        self.queued.extend_from_slice(batch);
        self.sampling = Some(sampling.clone());
    }

    /// Generates every queued request in one call of `policy`.
    pub fn step(&mut self, policy: &mut dyn Policy) -> Result<Vec<Completion>, StreamError> {
        if self.queued.is_empty() {
            return Ok(Vec::new());
        }
        let batch = std::mem::take(&mut self.queued);
        let sampling = self.sampling.clone().unwrap_or_default();
        policy
            .generate(&batch, &sampling)
            .map_err(|error| StreamError {
                error,
                dropped: batch.iter().map(|r| r.id).collect(),
            })
    }

    /// Requests queued.
    pub fn in_flight(&self) -> usize {
        self.queued.len()
    }
}
