//! The warm start's data: corpus conversations as token ids, over-long examples cut or dropped,
//! and the length-bucketed batches of an epoch.

use kevin::corpus::Example;
use kevin::rng::SplitMix64;
use serde::{Deserialize, Serialize};

use crate::chat;
use crate::tokenizer::Tokenizer;
use crate::train::plan_micro_batches;

/// One training sequence: the generation prompt's ids and the completion's ids (which end with
/// `<|im_end|>` unless the example was truncated), exactly as [`chat::encode_pair`] gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// Context: no loss on these.
    pub prompt: Vec<u32>,
    /// The target: the loss covers exactly these.
    pub response: Vec<u32>,
}

impl SftExample {
    /// Prompt + response tokens.
    pub fn len(&self) -> usize {
        self.prompt.len() + self.response.len()
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What happens to an example longer than `max_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlong {
    /// Keep its first `max_len` tokens: the whole prompt and the start of the response (the
    /// response then has no `<|im_end|>`: it teaches how answers start, never where a cut one
    /// ends). An example whose prompt leaves no room for a response token is dropped.
    Truncate,
    /// Drop it.
    Drop,
}

/// The tokenised corpus and what the length limit did to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tokenized {
    /// The kept sequences.
    pub examples: Vec<SftExample>,
    /// For each kept sequence, the index of its corpus example.
    pub source: Vec<usize>,
    /// Examples cut to `max_len`.
    pub truncated: usize,
    /// Examples dropped for length.
    pub dropped: usize,
    /// Examples dropped because their response is longer than `max_response` tokens.
    pub long_responses: usize,
}

/// Tokenises the last turn of each of `examples[i]` for `i` in `indices` (the last response is
/// the target; earlier turns appear inside its prompt), with the chat template the sampler uses.
/// An example whose response (with its end token) is longer than `max_response` tokens is
/// dropped: the policy samples at most that many, so it could never finish such an answer.
/// Errors name the example (index, task, form).
pub fn tokenize(
    examples: &[Example],
    indices: &[usize],
    tokenizer: &Tokenizer,
    max_len: usize,
    overlong: Overlong,
    max_response: Option<usize>,
) -> Result<Tokenized, String> {
    let mut out = Tokenized {
        examples: Vec::new(),
        source: Vec::new(),
        truncated: 0,
        dropped: 0,
        long_responses: 0,
    };
    for &i in indices {
        let e = &examples[i];
        let name = || format!("corpus example {i} (task {}, form {})", e.task, e.form);
        let turn = e
            .turns
            .last()
            .ok_or_else(|| format!("{}: no turn", name()))?;
        let (mut ids, prompt_len) =
            chat::encode_pair(tokenizer, None, &turn.prompt, &turn.response)
                .map_err(|err| format!("{}: {err}", name()))?;
        if max_response.is_some_and(|m| ids.len() - prompt_len > m) {
            out.long_responses += 1;
            continue;
        }
        if ids.len() > max_len {
            if overlong == Overlong::Drop || prompt_len >= max_len {
                out.dropped += 1;
                continue;
            }
            ids.truncate(max_len);
            out.truncated += 1;
        }
        let response = ids.split_off(prompt_len);
        out.examples.push(SftExample {
            prompt: ids,
            response,
        });
        out.source.push(i);
    }
    Ok(out)
}

/// Sequences gathered into one length-sorted pool before packing, in batches' worth of tokens:
/// enough that neighbours in length sit together (little padding), few enough that batches
/// still mix lengths and change from epoch to epoch.
const POOL_BATCHES: usize = 8;

/// The batches of epoch `epoch`: indices into `lengths`, each batch at most `batch_tokens`
/// padded positions (rows * longest row; a longer sequence is a batch of its own). Every index
/// appears exactly once.
///
/// Deterministic given `seed` and `epoch`: the sequences are shuffled, cut into pools of about
/// [`POOL_BATCHES`] batches of tokens, each pool is packed longest first
/// ([`plan_micro_batches`]), and the batches are shuffled.
pub fn epoch_batches(
    lengths: &[usize],
    batch_tokens: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    let mut rng = SplitMix64::derive(seed, epoch);
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    shuffle(&mut order, &mut rng);
    let pool_tokens = batch_tokens.saturating_mul(POOL_BATCHES);
    let mut batches = Vec::new();
    let mut pool: Vec<(usize, usize)> = Vec::new();
    let mut pooled = 0;
    for (k, &i) in order.iter().enumerate() {
        pool.push((i, lengths[i]));
        pooled += lengths[i];
        if pooled >= pool_tokens || k + 1 == order.len() {
            batches.extend(plan_micro_batches(&pool, batch_tokens));
            pool.clear();
            pooled = 0;
        }
    }
    shuffle(&mut batches, &mut rng);
    batches
}

/// Fisher-Yates with kevin's serialisable generator (stable across Rust releases).
fn shuffle<T>(items: &mut [T], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}
