//! The burn policy: kevin's [`Policy`] over a [`Qwen2`] and the batched [`Generator`].
//!
//! One [`BurnPolicy::generate`] call runs a whole batch of requests through the generator's
//! continuous batching (`sampling.max_batch` slots), prompt by prompt in ChatML
//! ([`prompt_tokens`]), and hands back one completion per request in request order.
//!
//! # Rejected requests
//!
//! A request the generator refuses before any forward pass (its prompt leaves no room for a
//! response in a slot of `max_len` tokens, or holds an id outside the vocabulary) does not fail
//! the batch or the daemon: it becomes a completion with empty text, no tokens and finish
//! `Length` (the token budget is what ran out), and a `warn!` names the request and the reason.
//! The environment then scores the empty response as a format error, and the learner trains on
//! no token of it. An engine failure (a forward pass that fails) is a [`PolicyError::Generate`].
//!
//! # Weights
//!
//! The learner publishes its model as a `Qwen2<B>` on the inference backend (the learner's
//! `B::InnerBackend`, see [`crate::burn_learner`]): the tensors are reference-counted, so a
//! publication copies nothing. [`BurnPolicy::set_weights`] swaps the model in; it is only called
//! between batches, when the generator is idle, so a batch always finishes with the weights it
//! started with.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use kevin::config::SamplingSection;
use kevin::policy::{
    Completion, FinishReason, GenRequest, Policy, PolicyError, PolicyStream, StreamError, Weights,
};

use crate::chat;
use crate::qwen2::{Qwen2, Qwen2Config};
use crate::sampler::{
    Finished, Generator, GeneratorError, GeneratorStats, Request, SamplingParams,
};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// The token ids a kevin prompt is generated from (and trained on): the ChatML generation prompt
/// of one user message, no system message. The policy and the learner both call this, so the
/// learner's prompt tokens are exactly those the behaviour log-probs were sampled after.
pub fn prompt_tokens(tokenizer: &Tokenizer, prompt: &str) -> Result<Vec<u32>, TokenizerError> {
    tokenizer.encode(&chat::generation_prompt(None, prompt))
}

/// kevin's policy in burn: a Qwen2 model in a batched generator, with its tokenizer.
pub struct BurnPolicy<B: Backend> {
    generator: Generator<B, Qwen2<B>>,
    tokenizer: Arc<Tokenizer>,
    version: u64,
    describe: String,
    /// Stats and start of the stream's current busy stretch (for its debug line).
    round: Option<(GeneratorStats, std::time::Instant)>,
}

impl<B: Backend> BurnPolicy<B> {
    /// A policy at `version` over `model`: `slots` sequences per forward pass, each at most
    /// `max_len` tokens (prompt + response; capped at the model's `max_position_embeddings`).
    pub fn new(
        model: Qwen2<B>,
        tokenizer: Arc<Tokenizer>,
        slots: usize,
        max_len: usize,
        version: u64,
    ) -> Result<Self, GeneratorError> {
        let cfg = model.config();
        let describe = format!(
            "burn policy: Qwen2 {} layers, hidden {}, vocab {}; {} slots of {} tokens; backend {}",
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.vocab_size,
            slots,
            max_len.min(cfg.max_position_embeddings),
            B::name(&model_device(&model)),
        );
        let generator = Generator::new(model, slots, max_len)?;
        Ok(BurnPolicy {
            generator,
            tokenizer,
            version,
            describe,
            round: None,
        })
    }

    /// The generator (slots, length, counters, the model).
    pub fn generator(&self) -> &Generator<B, Qwen2<B>> {
        &self.generator
    }

    /// Makes the generator's forward passes honour `gate`'s GPU timing lease
    /// ([`Generator::set_gate`]).
    pub fn set_gate(&mut self, gate: crate::gate::StepGate) {
        self.generator.set_gate(gate);
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn error(&self, reason: String) -> PolicyError {
        PolicyError::Generate {
            policy: "burn".into(),
            reason,
        }
    }

    /// The generator's requests for `batch`: each prompt in ChatML, tokenised.
    fn requests(
        &self,
        batch: &[GenRequest],
        sampling: &SamplingSection,
    ) -> Result<Vec<Request>, PolicyError> {
        let params = Arc::new(SamplingParams::from_config(
            sampling,
            self.tokenizer.eos_ids(),
        ));
        batch
            .iter()
            .map(|r| {
                let prompt = prompt_tokens(&self.tokenizer, &r.prompt).map_err(|e| {
                    self.error(format!("request {}: tokenising the prompt: {e}", r.id))
                })?;
                Ok(Request {
                    id: r.id,
                    prompt,
                    seed: r.seed,
                    params: params.clone(),
                })
            })
            .collect()
    }

    /// The completion of a finished (or refused) request.
    fn completion(&self, finished: Finished) -> Completion {
        match finished {
            Ok(out) => out.into_completion(self.version),
            Err(rejected) => {
                tracing::warn!(
                    request = rejected.id,
                    reason = %rejected.reason,
                    "generation request rejected: answering with an empty completion"
                );
                Completion {
                    id: rejected.id,
                    text: String::new(),
                    token_ids: Vec::new(),
                    logprobs: Vec::new(),
                    policy_version: self.version,
                    finish: FinishReason::Length,
                }
            }
        }
    }

    /// Where the time since `before` went (the per-pass figures of `kevin bench policy`, for
    /// real traffic): prefill against decode passes, waits for the timing lease, the fences
    /// after passes, and the generator's host work between passes.
    fn log_stats(&self, before: &GeneratorStats, started: std::time::Instant, what: &str) {
        let after = self.generator.stats();
        tracing::debug!(
            wall_s = started.elapsed().as_secs_f64(),
            lease_wait_s = (after.lease_wait_ms - before.lease_wait_ms) / 1e3,
            requests = (after.finished + after.rejected + after.aborted)
                - (before.finished + before.rejected + before.aborted),
            passes = after.forward_passes - before.forward_passes,
            prefill_tokens = after.prefill_tokens - before.prefill_tokens,
            generated = after.rows - before.rows,
            prefill_s = after.prefill_pass_s - before.prefill_pass_s,
            decode_s = after.decode_pass_s - before.decode_pass_s,
            fence_s = after.fence_s - before.fence_s,
            host_s = after.host_s - before.host_s,
            "{what}"
        );
    }
}

/// The text of generated `ids`. A token the tokenizer cannot decode is a model/tokenizer
/// mismatch the config check missed; it shows in the text rather than failing the batch.
fn decode_shown(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    tokenizer
        .decode(ids)
        .unwrap_or_else(|e| format!("<undecodable: {e}>"))
}

/// Continuous batching: requests join the generator's running sequences at its next pass.
impl<B: Backend> PolicyStream for BurnPolicy<B> {
    fn submit(
        &mut self,
        batch: &[GenRequest],
        sampling: &SamplingSection,
    ) -> Result<(), PolicyError> {
        let requests = self.requests(batch, sampling)?;
        if self.generator.is_idle() {
            self.round = Some((self.generator.stats().clone(), std::time::Instant::now()));
        }
        for r in requests {
            self.generator.submit(r);
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<Completion>, StreamError> {
        let tokenizer = &self.tokenizer;
        let decode = |ids: &[u32]| decode_shown(tokenizer, ids);
        let result = self.generator.step(&decode);
        if self.generator.is_idle() {
            if let Some((before, started)) = self.round.take() {
                self.log_stats(&before, started, "generated until idle");
            }
        }
        match result {
            Ok(finished) => Ok(finished.into_iter().map(|f| self.completion(f)).collect()),
            Err(e) => {
                let dropped = match &e {
                    GeneratorError::Forward { aborted, .. }
                    | GeneratorError::Select { aborted, .. } => aborted.clone(),
                    _ => Vec::new(),
                };
                Err(StreamError {
                    error: self.error(e.to_string()),
                    dropped,
                })
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.generator.in_flight()
    }
}

/// What fixes a model's parameter shapes and cache: (vocab, hidden, intermediate, layers, heads,
/// kv heads, head dim, tied embeddings).
fn architecture(c: &Qwen2Config) -> [usize; 8] {
    [
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim(),
        usize::from(c.tie_word_embeddings),
    ]
}

fn model_device<B: Backend>(model: &Qwen2<B>) -> B::Device {
    crate::CausalLm::device(model)
}

impl<B: Backend> Policy for BurnPolicy<B> {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn generate(
        &mut self,
        batch: &[GenRequest],
        sampling: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError> {
        let requests = self.requests(batch, sampling)?;
        let tokenizer = &self.tokenizer;
        let decode = |ids: &[u32]| decode_shown(tokenizer, ids);
        let before = self.generator.stats().clone();
        let started = std::time::Instant::now();
        let finished = self
            .generator
            .generate_all(requests, &decode)
            .map_err(|e| self.error(e.to_string()))?;
        self.log_stats(&before, started, "generated a batch");
        Ok(finished.into_iter().map(|f| self.completion(f)).collect())
    }

    fn stream(&mut self) -> Option<&mut dyn PolicyStream> {
        Some(self)
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        let fail = |reason: String| PolicyError::Weights {
            policy: "burn".into(),
            version: weights.version,
            reason,
        };
        let model = weights.payload.downcast_ref::<Qwen2<B>>().ok_or_else(|| {
            fail(format!(
                "the payload is not a {} (the burn learner's published model on this backend)",
                std::any::type_name::<Qwen2<B>>()
            ))
        })?;
        // The cache was sized for the current architecture: a different one cannot run in it.
        // (Only the shape matters: `torch_dtype` and unknown keys may differ between checkpoints.)
        let (new, current) = (
            architecture(model.config()),
            architecture(self.generator.model().config()),
        );
        if new != current {
            return Err(fail(format!(
                "architecture {new:?} differs from the policy's {current:?}"
            )));
        }
        if !self.generator.is_idle() {
            return Err(fail(
                "the generator has requests in flight; weights change between batches only".into(),
            ));
        }
        *self.generator.model_mut() = model.clone();
        self.version = weights.version;
        Ok(())
    }
}
