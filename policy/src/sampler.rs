//! Batched sampling: the generation engine the Generator actor runs.
//!
//! - [`SamplingParams`]: one request's sampling rules, built from the `[sampling]` config section
//!   and the tokenizer's end-of-sequence ids.
//! - [`select_tokens`] (`select.rs`): one token per row of a `[rows, vocab]` logits tensor, with
//!   temperature, top-k and top-p, and its behaviour log-probability.
//! - [`Generator`] (`generator.rs`): continuous batching over the slots of a [`crate::CausalLm`]
//!   cache; requests join at step boundaries and leave when they finish.
//! - `stop.rs`: stop strings, found on incrementally decoded text.
//!
//! Dependencies: the sampler knows a model only through [`crate::CausalLm`] and takes its rules
//! from kevin's `[sampling]` config; it may not import a concrete model (`qwen2`), the learner,
//! training or checkpoints. Callers use the re-exports here, not the submodules.

mod generator;
#[cfg(test)]
mod generator_tests;
mod select;
#[cfg(test)]
mod select_tests;
mod stop;

pub use generator::{
    Finished, Generator, GeneratorError, GeneratorStats, RejectReason, Rejected, Request,
    SequenceOutput,
};
pub use select::{select_tokens, RowChoice, SelectError, Selection, TokenFilter};

use kevin::config::SamplingSection;

/// How one request samples and when it stops: `[sampling]` of the config plus the tokenizer's
/// end-of-sequence ids. (`max_batch` of that section is not a per-request rule: it is the number
/// of slots of the [`Generator`].)
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (the most likely token, log-prob 0).
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 keeps every token.
    pub top_k: usize,
    /// Most tokens generated for the request (a slot's length may stop it earlier).
    pub max_new_tokens: usize,
    /// Strings that end the response; the first one found and everything after it are cut from
    /// the text.
    pub stop: Vec<String>,
    /// Token ids that end the response (the tokenizer's end-of-sequence tokens).
    pub eos_token_ids: Vec<u32>,
}

/// A sampling parameter outside its range, named by its config key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    /// Temperature negative or not finite.
    #[error("sampling.temperature = {0}: must be finite and >= 0 (0 is greedy)")]
    Temperature(f64),
    /// top_p outside (0, 1].
    #[error("sampling.top_p = {0}: must be in (0, 1]")]
    TopP(f64),
    /// max_new_tokens of 0.
    #[error("sampling.max_new_tokens = 0: a response needs at least one token")]
    MaxNewTokens,
    /// An empty stop string (it would match before the first token).
    #[error("sampling.stop[{0}] is empty")]
    EmptyStop(usize),
}

impl SamplingParams {
    /// The rules of the `[sampling]` section with the tokenizer's end-of-sequence ids.
    pub fn from_config(section: &SamplingSection, eos_token_ids: &[u32]) -> Self {
        SamplingParams {
            temperature: section.temperature,
            top_p: section.top_p,
            top_k: section.top_k as usize,
            max_new_tokens: section.max_new_tokens as usize,
            stop: section.stop.clone(),
            eos_token_ids: eos_token_ids.to_vec(),
        }
    }

    /// Greedy decoding of at most `max_new_tokens`, no stop strings.
    pub fn greedy(max_new_tokens: usize, eos_token_ids: &[u32]) -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens,
            stop: Vec::new(),
            eos_token_ids: eos_token_ids.to_vec(),
        }
    }

    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), ParamsError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(ParamsError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ParamsError::TopP(self.top_p));
        }
        if self.max_new_tokens == 0 {
            return Err(ParamsError::MaxNewTokens);
        }
        if let Some(i) = self.stop.iter().position(String::is_empty) {
            return Err(ParamsError::EmptyStop(i));
        }
        Ok(())
    }

    /// The part of the rules that token selection needs.
    pub fn filter(&self) -> TokenFilter {
        TokenFilter {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }
}
