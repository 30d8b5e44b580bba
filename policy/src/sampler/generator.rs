//! The generation engine: continuous batching over the slots of a [`CausalLm`] cache.
//!
//! A [`Generator`] owns the model, a cache of `slots` sequences and a FIFO queue of waiting
//! requests. Each [`Generator::step`] is one forward pass: waiting requests take the free slots
//! (lowest first) and are prefilled, their whole prompt as one row, in the same pass as one-token
//! decode rows of the sequences already running; every row then samples one token. A sequence
//! that finishes leaves its slot at once, and the next waiting request takes it at the next step.
//!
//! Lengths: a slot holds at most `max_len` tokens (prompt + response, at most the model's
//! `max_positions`), so the learner can score the whole sequence in one `forward`. A response
//! therefore ends at `min(max_new_tokens, max_len - prompt)` tokens (finish reason `Length`); a
//! prompt of `max_len` tokens or more leaves no room and is rejected when submitted.
//!
//! What a finished sequence holds (the contract with the learner and the rollout):
//! - `token_ids` and `logprobs`: every sampled token, in order, up to and including the one that
//!   ended the response: the end-of-sequence token, or the token that completed a stop string.
//!   Both have the same length; nothing sampled is dropped, so the learner sees the token that
//!   stopped the response and the log-prob it was sampled with.
//! - `text`: the decoded `token_ids` (without a final end-of-sequence token), cut before the
//!   earliest occurrence of any stop string. It is a prefix of the decoded tokens, not their
//!   exact decoding, when a stop string (and whatever its last token carried after it) was cut.
//!
//! Randomness: each request owns a `StdRng` seeded from its seed and draws one uniform number per
//! sampled token (none when greedy), so its tokens depend on its seed and prompt only, not on the
//! batch around it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use kevin::policy::FinishReason;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::select::{select_tokens, RowChoice, SelectError, Selection};
use super::stop::{cut_at_stop, StopScanner};
use super::{ParamsError, SamplingParams};
use crate::gate::StepGate;
use crate::{CausalLm, DeviceDraw};

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Caller-chosen id, echoed in the output; unique among the requests in flight.
    pub id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Seed of this request's random numbers.
    pub seed: u64,
    /// Sampling rules, shared by the requests of a batch.
    pub params: Arc<SamplingParams>,
}

/// One finished response (see the module documentation for what it keeps).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceOutput {
    /// The request's id.
    pub id: u64,
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// Behaviour log-prob of each generated token (see [`select_tokens`](super::select_tokens)).
    pub logprobs: Vec<f32>,
    /// Decoded response, cut before the first stop string.
    pub text: String,
    /// End-of-sequence or stop string (`Stop`), or token limit (`Length`).
    pub finish: FinishReason,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (`token_ids.len()`).
    pub generated_tokens: usize,
}

impl SequenceOutput {
    /// The completion the actors pass on, stamped with the weights' version.
    pub fn into_completion(self, policy_version: u64) -> kevin::policy::Completion {
        kevin::policy::Completion {
            id: self.id,
            text: self.text,
            token_ids: self.token_ids,
            logprobs: self.logprobs,
            policy_version,
            finish: self.finish,
        }
    }
}

/// Why a request was refused before any forward pass (an expected outcome, not an engine error).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RejectReason {
    /// No prompt tokens: there is nothing to condition on.
    #[error("empty prompt")]
    EmptyPrompt,
    /// The prompt leaves no room for a response in a slot.
    #[error(
        "prompt of {prompt_tokens} tokens leaves no room for a response: a slot holds {max_len} \
         tokens (prompt + response)"
    )]
    PromptTooLong {
        /// Prompt length.
        prompt_tokens: usize,
        /// Tokens a slot holds.
        max_len: usize,
    },
    /// A prompt token the model does not know.
    #[error("prompt token {token} at position {position} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// Index in the prompt.
        position: usize,
        /// The token.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// Sampling parameters out of range.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// Another request with this id is waiting or running.
    #[error("another request with this id is in flight")]
    DuplicateId,
}

/// A refused request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("request {id}: {reason}")]
pub struct Rejected {
    /// The request's id.
    pub id: u64,
    /// Why.
    pub reason: RejectReason,
}

/// What [`Generator::step`] hands back per request: its output, or why it was refused.
pub type Finished = Result<SequenceOutput, Rejected>;

/// A failure of the engine or the model (not of one request).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GeneratorError {
    /// Bad engine settings.
    #[error("generator: {0}")]
    Config(String),
    /// The forward pass failed or returned logits of the wrong shape. The sequences of that pass
    /// were aborted and their slots emptied; waiting requests stay queued.
    #[error("forward pass failed: {reason}; aborted requests {aborted:?}")]
    Forward {
        /// The model's message.
        reason: String,
        /// Ids of the aborted requests.
        aborted: Vec<u64>,
    },
    /// Token selection failed; the sequences of that pass were aborted as for `Forward`.
    #[error("token selection failed: {source}; aborted requests {aborted:?}")]
    Select {
        /// What failed.
        source: SelectError,
        /// Ids of the aborted requests.
        aborted: Vec<u64>,
    },
    /// [`Generator::generate_all`] needs a generator with nothing in flight.
    #[error("generate_all needs an idle generator, but {0} requests are in flight")]
    Busy(usize),
}

/// Counters for benchmarks: how full the forward passes were.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GeneratorStats {
    /// Forward passes run.
    pub forward_passes: u64,
    /// Rows over all passes (each row samples one token).
    pub rows: u64,
    /// Tokens fed over all passes (prompt tokens + one per decode row).
    pub tokens: u64,
    /// Prefill rows (new sequences) over all passes.
    pub prefill_rows: u64,
    /// Prompt tokens fed by prefill rows.
    pub prefill_tokens: u64,
    /// Most rows in one pass.
    pub max_rows: usize,
    /// Most tokens in one pass.
    pub max_tokens: usize,
    /// Sequences finished (stop or length).
    pub finished: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Sequences aborted by an engine error.
    pub aborted: u64,
    /// Milliseconds the forward passes waited for the GPU timing lease (see
    /// [`Generator::set_gate`]).
    pub lease_wait_ms: f64,
    /// Seconds of the passes that prefilled at least one prompt (the forward pass and the token
    /// choice, lease waits excluded).
    pub prefill_pass_s: f64,
    /// Seconds of the passes that only decoded.
    pub decode_pass_s: f64,
    /// Seconds the passes waited at their end for the device's queued work before releasing the
    /// timing lease ([`crate::gate::GateGuard`]; zero without a lease).
    pub fence_s: f64,
    /// Seconds of [`Generator::step`] outside the pass, the lease and the fence: admitting
    /// requests, drawing uniforms, recording tokens, stop strings, finishing sequences.
    pub host_s: f64,
}

impl GeneratorStats {
    /// Mean rows per forward pass.
    pub fn mean_rows(&self) -> f64 {
        self.rows as f64 / self.forward_passes.max(1) as f64
    }

    /// Mean tokens per forward pass.
    pub fn mean_tokens(&self) -> f64 {
        self.tokens as f64 / self.forward_passes.max(1) as f64
    }
}

/// Why a forward pass with its token selection failed.
enum PassError {
    Forward(String),
    Select(SelectError),
}

/// A request in a slot.
struct Sequence {
    id: u64,
    /// The prompt until the prefill row takes it.
    prompt: Vec<u32>,
    prompt_tokens: usize,
    params: Arc<SamplingParams>,
    rng: StdRng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// Most tokens this sequence may generate: `max_new_tokens` or what the slot has left.
    limit: usize,
    stop: StopScanner,
}

impl Sequence {
    /// The row this sequence feeds to the next forward pass: its prompt, then its last token.
    fn next_row(&mut self) -> Vec<u32> {
        if self.tokens.is_empty() {
            std::mem::take(&mut self.prompt)
        } else {
            vec![self.tokens[self.tokens.len() - 1]]
        }
    }

    /// Records a sampled token; the finish reason when it ends the sequence.
    fn push(
        &mut self,
        token: u32,
        logprob: f32,
        decode: &dyn Fn(&[u32]) -> String,
    ) -> Option<FinishReason> {
        self.tokens.push(token);
        self.logprobs.push(logprob);
        if self.params.eos_token_ids.contains(&token) {
            return Some(FinishReason::Stop);
        }
        if !self.params.stop.is_empty() && self.stop.push(&self.tokens, &self.params.stop, decode) {
            return Some(FinishReason::Stop);
        }
        (self.tokens.len() >= self.limit).then_some(FinishReason::Length)
    }

    /// The output of a finished sequence: text decoded once from all tokens, then cut.
    fn finish(self, reason: FinishReason, decode: &dyn Fn(&[u32]) -> String) -> SequenceOutput {
        let ends_with_eos = reason == FinishReason::Stop
            && self
                .tokens
                .last()
                .is_some_and(|t| self.params.eos_token_ids.contains(t));
        let shown = if ends_with_eos {
            &self.tokens[..self.tokens.len() - 1]
        } else {
            &self.tokens[..]
        };
        let mut text = decode(shown);
        let mut finish = reason;
        if let Some(at) = cut_at_stop(&text, &self.params.stop) {
            text.truncate(at);
            finish = FinishReason::Stop;
        }
        SequenceOutput {
            id: self.id,
            generated_tokens: self.tokens.len(),
            token_ids: self.tokens,
            logprobs: self.logprobs,
            text,
            finish,
            prompt_tokens: self.prompt_tokens,
        }
    }
}

/// The batched generation engine (see the module documentation).
pub struct Generator<B: Backend, M: CausalLm<B>> {
    model: M,
    cache: M::Cache,
    /// `slots[i]`: the sequence held in cache slot `i`.
    slots: Vec<Option<Sequence>>,
    waiting: VecDeque<Request>,
    /// Refused at submission, handed back by the next step.
    rejected: Vec<Rejected>,
    /// Ids waiting or running, to refuse duplicates (outputs are matched to requests by id).
    in_flight: HashSet<u64>,
    max_len: usize,
    stats: GeneratorStats,
    /// Holds the GPU timing lease around each forward pass.
    gate: StepGate,
    _backend: PhantomData<B>,
}

impl<B: Backend, M: CausalLm<B>> Generator<B, M> {
    /// An engine of `slots` sequences of at most `max_len` tokens each (prompt + response;
    /// capped at the model's `max_positions`).
    pub fn new(model: M, slots: usize, max_len: usize) -> Result<Self, GeneratorError> {
        if slots == 0 {
            return Err(GeneratorError::Config(
                "slots = 0: at least one sequence must fit".to_string(),
            ));
        }
        let max_len = max_len.min(model.max_positions());
        if max_len < 2 {
            return Err(GeneratorError::Config(format!(
                "max_len = {max_len} (model max_positions {}): a slot needs room for one prompt \
                 token and one response token",
                model.max_positions()
            )));
        }
        let cache = model.new_cache(slots, max_len);
        Ok(Generator {
            model,
            cache,
            slots: (0..slots).map(|_| None).collect(),
            waiting: VecDeque::new(),
            rejected: Vec::new(),
            in_flight: HashSet::new(),
            max_len,
            stats: GeneratorStats::default(),
            gate: StepGate::open(),
            _backend: PhantomData,
        })
    }

    /// Makes every forward pass hold `gate`'s GPU timing lease (shared), from before its first
    /// kernel until its work on the device is done, and release it before the next pass: a
    /// candidate timed on the same GPU waits for at most the pass in progress, and no pass starts
    /// while it is timed ([`crate::gate`]).
    pub fn set_gate(&mut self, gate: StepGate) {
        self.gate = gate;
    }

    /// Queues a request. A request that can never run (empty or too long prompt, unknown
    /// token, bad parameters, an id already in flight) comes back from the next
    /// [`step`](Self::step) as [`Rejected`], without a forward pass and without touching the
    /// others.
    pub fn submit(&mut self, request: Request) {
        match self.check(&request) {
            Ok(()) => {
                self.in_flight.insert(request.id);
                self.waiting.push_back(request);
            }
            Err(reason) => {
                self.stats.rejected += 1;
                self.rejected.push(Rejected {
                    id: request.id,
                    reason,
                });
            }
        }
    }

    fn check(&self, request: &Request) -> Result<(), RejectReason> {
        request.params.validate()?;
        if self.in_flight.contains(&request.id) {
            return Err(RejectReason::DuplicateId);
        }
        if request.prompt.is_empty() {
            return Err(RejectReason::EmptyPrompt);
        }
        if request.prompt.len() >= self.max_len {
            return Err(RejectReason::PromptTooLong {
                prompt_tokens: request.prompt.len(),
                max_len: self.max_len,
            });
        }
        let vocab = self.model.vocab_size();
        if let Some((position, &token)) = request
            .prompt
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(RejectReason::TokenOutOfVocab {
                position,
                token,
                vocab,
            });
        }
        Ok(())
    }

    /// Runs one forward pass: admits waiting requests into free slots (prefill rows), advances
    /// the running sequences by one token (decode rows), and returns the sequences that finished
    /// plus the requests refused since the last step. With nothing to run it returns at once.
    ///
    /// `decode` turns token ids into text (the tokenizer, skipping special tokens); it is called
    /// for stop strings and once per finished sequence.
    pub fn step(
        &mut self,
        decode: &dyn Fn(&[u32]) -> String,
    ) -> Result<Vec<Finished>, GeneratorError> {
        let step_started = std::time::Instant::now();
        let mut done: Vec<Finished> = self.rejected.drain(..).map(Err).collect();
        self.admit();

        let mut row_slots = Vec::new();
        let mut rows = Vec::new();
        let mut prefill = (0u64, 0u64);
        for (slot, seq) in self.slots.iter_mut().enumerate() {
            if let Some(seq) = seq {
                let row = seq.next_row();
                if seq.tokens.is_empty() {
                    prefill.0 += 1;
                    prefill.1 += row.len() as u64;
                }
                row_slots.push(slot);
                rows.push(row);
            }
        }
        if rows.is_empty() {
            return Ok(done);
        }
        let tokens: usize = rows.iter().map(Vec::len).sum();
        let s = &mut self.stats;
        s.forward_passes += 1;
        s.rows += rows.len() as u64;
        s.tokens += tokens as u64;
        s.prefill_rows += prefill.0;
        s.prefill_tokens += prefill.1;
        s.max_rows = s.max_rows.max(rows.len());
        s.max_tokens = s.max_tokens.max(tokens);

        // Held until this pass's work on the device is done (the guard syncs when it drops, at
        // the end of the pass or at an early return; a pass drawn on the device is done when it
        // returns, and releases it without the sync).
        let gate = self.gate.enter::<B>(&self.model.device());
        let lease_wait = gate.waited().as_secs_f64();
        self.stats.lease_wait_ms += lease_wait * 1e3;
        // Each row's rules and uniform number (greedy rows draw nothing, so their seed's stream
        // is not consumed).
        let choices: Vec<RowChoice> = row_slots
            .iter()
            .map(|&slot| {
                let seq = self.slots[slot].as_mut().expect("row of an occupied slot");
                let filter = seq.params.filter();
                let uniform = if filter.is_greedy() {
                    0.0
                } else {
                    seq.rng.random::<f64>()
                };
                RowChoice { filter, uniform }
            })
            .collect();
        let started = std::time::Instant::now();
        let selected = self.forward_and_select(&row_slots, &rows, &choices);
        let took = started.elapsed().as_secs_f64();
        if prefill.0 > 0 {
            self.stats.prefill_pass_s += took;
        } else {
            self.stats.decode_pass_s += took;
        }
        let (selections, settled) = match selected {
            Ok(selected) => selected,
            Err(err) => {
                let aborted = self.abort(&row_slots);
                return Err(match err {
                    PassError::Forward(reason) => GeneratorError::Forward { reason, aborted },
                    PassError::Select(source) => GeneratorError::Select { source, aborted },
                });
            }
        };

        for (&slot, sel) in row_slots.iter().zip(selections) {
            let seq = self.slots[slot].as_mut().expect("row of an occupied slot");
            if let Some(reason) = seq.push(sel.token, sel.logprob, decode) {
                let seq = self.slots[slot].take().expect("row of an occupied slot");
                self.model.clear_slot(&mut self.cache, slot);
                self.in_flight.remove(&seq.id);
                self.stats.finished += 1;
                done.push(Ok(seq.finish(reason, decode)));
            }
        }
        let fence = std::time::Instant::now();
        if settled {
            gate.settled();
        } else {
            drop(gate);
        }
        let fence = fence.elapsed().as_secs_f64();
        let s = &mut self.stats;
        s.fence_s += fence;
        s.host_s += (step_started.elapsed().as_secs_f64() - fence - took - lease_wait).max(0.0);
        Ok(done)
    }

    /// The forward pass over `rows` and one token per row: on the device in one call where the
    /// model draws there ([`CausalLm::extend_draw`]: greedy or unfiltered rows), otherwise the
    /// logits and [`select_tokens`]. True with the selections when the pass was drawn on the
    /// device, so its device work is done.
    fn forward_and_select(
        &mut self,
        row_slots: &[usize],
        rows: &[Vec<u32>],
        choices: &[RowChoice],
    ) -> Result<(Vec<Selection>, bool), PassError> {
        let vocab = self.model.vocab_size();
        if choices
            .iter()
            .all(|c| c.filter.is_greedy() || c.filter.keeps_all(vocab))
        {
            let draws: Vec<DeviceDraw> = choices.iter().map(RowChoice::device_draw).collect();
            let drawn = self
                .model
                .extend_draw(&mut self.cache, row_slots, rows, &draws)
                .map_err(PassError::Forward)?;
            if let Some(drawn) = drawn {
                if drawn.len() != rows.len() {
                    return Err(PassError::Forward(format!(
                        "{} tokens drawn for {} rows",
                        drawn.len(),
                        rows.len()
                    )));
                }
                let mut out = Vec::with_capacity(drawn.len());
                for (row, (token, logprob)) in drawn.into_iter().enumerate() {
                    if !logprob.is_finite() || token as usize >= vocab {
                        return Err(PassError::Select(SelectError::NonFinite { row, logprob }));
                    }
                    out.push(Selection { token, logprob });
                }
                return Ok((out, true));
            }
        }
        let logits = self
            .model
            .extend(&mut self.cache, row_slots, rows)
            .map_err(PassError::Forward)?;
        let expected = [rows.len(), vocab];
        if logits.dims() != expected {
            return Err(PassError::Forward(format!(
                "logits {:?}, expected {expected:?}",
                logits.dims()
            )));
        }
        select_tokens(logits, choices)
            .map(|selected| (selected, false))
            .map_err(PassError::Select)
    }

    /// Moves waiting requests into free slots, lowest slot first.
    fn admit(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                continue;
            }
            let Some(req) = self.waiting.pop_front() else {
                break;
            };
            let limit = req
                .params
                .max_new_tokens
                .min(self.max_len - req.prompt.len());
            self.slots[slot] = Some(Sequence {
                id: req.id,
                prompt_tokens: req.prompt.len(),
                prompt: req.prompt,
                rng: StdRng::seed_from_u64(req.seed),
                params: req.params,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                limit,
                stop: StopScanner::default(),
            });
        }
    }

    /// Drops the sequences in `slots` after a failed pass; their ids.
    fn abort(&mut self, slots: &[usize]) -> Vec<u64> {
        let mut ids = Vec::with_capacity(slots.len());
        for &slot in slots {
            if let Some(seq) = self.slots[slot].take() {
                self.model.clear_slot(&mut self.cache, slot);
                self.in_flight.remove(&seq.id);
                ids.push(seq.id);
            }
        }
        self.stats.aborted += ids.len() as u64;
        ids
    }

    /// Drops every waiting and running request (and the refusals not yet handed back) and
    /// empties the slots, e.g. before loading weights without waiting; the ids dropped.
    pub fn abort_all(&mut self) -> Vec<u64> {
        let occupied: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect();
        let mut ids = self.abort(&occupied);
        let waiting: Vec<u64> = self.waiting.drain(..).map(|r| r.id).collect();
        self.stats.aborted += waiting.len() as u64;
        ids.extend(waiting);
        self.in_flight.clear();
        self.rejected.clear();
        ids
    }

    /// Runs `requests` to completion on an idle generator; one result per request, in request
    /// order. A repeated id is refused (outputs are matched to requests by id). On an engine
    /// error every request of the call is dropped (the error lists them) and the generator is
    /// idle again.
    pub fn generate_all(
        &mut self,
        requests: Vec<Request>,
        decode: &dyn Fn(&[u32]) -> String,
    ) -> Result<Vec<Finished>, GeneratorError> {
        let busy = self.in_flight.len() + self.rejected.len();
        if busy > 0 {
            return Err(GeneratorError::Busy(busy));
        }
        let mut results: Vec<Option<Finished>> = Vec::with_capacity(requests.len());
        let mut position = HashMap::with_capacity(requests.len());
        for (i, request) in requests.into_iter().enumerate() {
            if position.contains_key(&request.id) {
                self.stats.rejected += 1;
                results.push(Some(Err(Rejected {
                    id: request.id,
                    reason: RejectReason::DuplicateId,
                })));
                continue;
            }
            position.insert(request.id, i);
            results.push(None);
            self.submit(request);
        }
        while !self.is_idle() {
            let finished = match self.step(decode) {
                Ok(finished) => finished,
                // Leave the generator idle: the caller gets one error for the whole call.
                Err(mut err) => {
                    let rest = self.abort_all();
                    if let GeneratorError::Forward { aborted, .. }
                    | GeneratorError::Select { aborted, .. } = &mut err
                    {
                        aborted.extend(rest);
                    }
                    return Err(err);
                }
            };
            for finished in finished {
                let id = match &finished {
                    Ok(out) => out.id,
                    Err(rejected) => rejected.id,
                };
                results[position[&id]] = Some(finished);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every submitted request finishes"))
            .collect())
    }

    /// Nothing waiting, running, or refused and not yet handed back.
    pub fn is_idle(&self) -> bool {
        self.in_flight.is_empty() && self.rejected.is_empty()
    }

    /// Requests submitted and not yet handed back by [`step`](Self::step) (waiting, running
    /// or refused).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.rejected.len()
    }

    /// Requests queued for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences in slots.
    pub fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Tokens one slot holds (prompt + response).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Counters since creation.
    pub fn stats(&self) -> &GeneratorStats {
        &self.stats
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model, to load new weights. Running sequences continue with whatever weights the
    /// model holds at the next step; to finish them with the weights they started with, load
    /// only when [`is_idle`](Self::is_idle) (or no longer admit requests until it is).
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// The cache, for inspection (tests, memory reports).
    pub fn cache(&self) -> &M::Cache {
        &self.cache
    }

    /// Gives the model back.
    pub fn into_model(self) -> M {
        self.model
    }
}
