//! Token selection: one token per row of a `[rows, vocab]` logits tensor, and the behaviour
//! log-probability the learner's off-policy correction compares against.
//!
//! Each row follows its own [`TokenFilter`]: the logits are divided by the temperature, the
//! top-k most likely tokens are kept, then the smallest set of most likely tokens whose mass
//! reaches `top_p` of what top-k kept (top-k first, then nucleus over the renormalised rest, the
//! order of Hugging Face's warpers and vLLM). The token is drawn from that filtered, renormalised
//! distribution by inverting its CDF at the row's uniform number (see [`RowChoice::uniform`]),
//! so a row's token depends on its logits and its uniform only, never on the other rows.
//!
//! **The log-prob returned is that of the distribution actually sampled from**: log-softmax of
//! the temperature-scaled logits restricted to the kept tokens. With top-k or top-p this differs
//! from log-softmax over the whole vocabulary; it is what makes the importance ratio
//! pi_theta / pi_behaviour exact for the tokens that were drawn. Greedy decoding (temperature 0)
//! and any filter that keeps a single token sample from a point mass: log-prob 0.
//!
//! Where the work happens, for a vocabulary of ~152k and 64 rows:
//! - greedy rows: `argmax` on the device; one integer per row comes back;
//! - unfiltered rows (the training default, top_p = 1 and top_k = 0): scaling, log-softmax,
//!   the CDF and its inversion all on the device (in two levels, see `inverse_cdf`); one token
//!   and one log-prob per row come back;
//! - filtered rows: scaling and log-softmax on the device, then the row's log-probs come to the
//!   host, where the candidates are found in O(vocab) (a partial selection for top-k; for top-p a
//!   probability threshold lowered until the candidates hold the nucleus) and only the candidates
//!   are sorted. burn 0.21 sorts on the host on every backend anyway, so a device sort would copy
//!   the whole row too, and then sort all of it.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, Transaction};

/// The filtering and scaling rules of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFilter {
    /// Softmax temperature; 0 is greedy.
    pub temperature: f64,
    /// Keep the `top_k` most likely tokens; 0 (or at least the vocabulary) keeps all.
    pub top_k: usize,
    /// Nucleus mass in (0, 1]; 1 keeps all.
    pub top_p: f64,
}

impl TokenFilter {
    /// Temperature 0: the most likely token, no draw.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Neither top-k nor top-p removes a token from a vocabulary of `vocab`.
    pub fn keeps_all(&self, vocab: usize) -> bool {
        (self.top_k == 0 || self.top_k >= vocab) && self.top_p >= 1.0
    }
}

/// One row's rules and its uniform number in [0, 1) (ignored by greedy rows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowChoice {
    /// The row's filter.
    pub filter: TokenFilter,
    /// The row's random number: the token is the first whose CDF reaches `(1 - uniform)` times
    /// the total, a threshold in (0, total], so a token of probability 0 is never chosen.
    pub uniform: f64,
}

impl RowChoice {
    /// The same choice as the model draws it on the device ([`crate::CausalLm::extend_draw`];
    /// only for greedy rows and rows whose filter keeps every token).
    pub fn device_draw(&self) -> crate::DeviceDraw {
        crate::DeviceDraw {
            temperature: self.filter.temperature,
            uniform: self.uniform,
        }
    }
}

/// The chosen token of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    /// Token id.
    pub token: u32,
    /// Its log-probability under the filtered, temperature-scaled distribution it was drawn
    /// from (0 for greedy rows).
    pub logprob: f32,
}

/// Why token selection failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectError {
    /// The logits and the choices disagree on the number of rows.
    #[error("logits have {logits} rows but {choices} row choices were given")]
    RowCount {
        /// Rows of the logits.
        logits: usize,
        /// Row choices given.
        choices: usize,
    },
    /// Reading the results back from the device failed.
    #[error("reading sampled tokens from the device failed: {0}")]
    Device(String),
    /// A row's logits are NaN or all -inf, so no distribution can be sampled.
    #[error("logits row {row} is not a distribution (log-prob of the chosen token: {logprob})")]
    NonFinite {
        /// The row.
        row: usize,
        /// The log-prob found.
        logprob: f32,
    },
}

/// Chooses one token per row of `logits` (`[rows, vocab]`), following `rows[i]` for row `i`.
pub fn select_tokens<B: Backend>(
    logits: Tensor<B, 2>,
    rows: &[RowChoice],
) -> Result<Vec<Selection>, SelectError> {
    let [n, vocab] = logits.dims();
    if n != rows.len() {
        return Err(SelectError::RowCount {
            logits: n,
            choices: rows.len(),
        });
    }
    let device = logits.device();
    let (mut greedy, mut plain, mut filtered) = (Vec::new(), Vec::new(), Vec::new());
    for (i, row) in rows.iter().enumerate() {
        if row.filter.is_greedy() {
            greedy.push(i);
        } else if row.filter.keeps_all(vocab) {
            plain.push(i);
        } else {
            filtered.push(i);
        }
    }

    // Everything is enqueued first and read back in one transaction: one synchronisation.
    let mut tx = Transaction::<B>::default();
    if !greedy.is_empty() {
        let g = subset(&logits, &greedy, &device);
        let token = g.clone().argmax(1);
        // The chosen logit comes back too, only to refuse a row of NaN.
        let logit = g.gather(1, token.clone());
        tx = tx.register(token).register(logit);
    }
    if !plain.is_empty() {
        let logp = scaled_log_softmax(subset(&logits, &plain, &device), &plain, rows, &device);
        // 1 - u is uniform on (0, 1]; a rand f64 is a multiple of 2^-53, so it stays > 0 in f32.
        let uniforms: Vec<f32> = plain
            .iter()
            .map(|&i| (1.0 - rows[i].uniform) as f32)
            .collect();
        let token = inverse_cdf(logp.clone().exp(), &uniforms, &device);
        let logprob = logp.gather(1, token.clone());
        tx = tx.register(token).register(logprob);
    }
    if !filtered.is_empty() {
        let logp = scaled_log_softmax(
            subset(&logits, &filtered, &device),
            &filtered,
            rows,
            &device,
        );
        tx = tx.register(logp);
    }
    let mut data = tx
        .try_execute()
        .map_err(|e| SelectError::Device(e.to_string()))?
        .into_iter();

    let mut out = vec![
        Selection {
            token: 0,
            logprob: 0.0
        };
        n
    ];
    if !greedy.is_empty() {
        let tokens = next_data(&mut data)?;
        let logits = next_data(&mut data)?;
        for ((&row, token), logit) in greedy
            .iter()
            .zip(tokens.iter::<i64>())
            .zip(logits.iter::<f32>())
        {
            out[row] = Selection {
                token: token as u32,
                // A point mass; a NaN logit is carried so the check below refuses the row.
                logprob: if logit.is_nan() { logit } else { 0.0 },
            };
        }
    }
    if !plain.is_empty() {
        let tokens = next_data(&mut data)?;
        let logprobs = next_data(&mut data)?;
        for ((&row, token), logprob) in plain
            .iter()
            .zip(tokens.iter::<i64>())
            .zip(logprobs.iter::<f32>())
        {
            out[row] = Selection {
                token: token as u32,
                logprob,
            };
        }
    }
    if !filtered.is_empty() {
        let logp: Vec<f32> = next_data(&mut data)?.iter::<f32>().collect();
        for (&row, logp) in filtered.iter().zip(logp.chunks_exact(vocab)) {
            out[row] = select_filtered(logp, rows[row].filter, rows[row].uniform);
        }
    }
    for (row, s) in out.iter().enumerate() {
        if !s.logprob.is_finite() {
            return Err(SelectError::NonFinite {
                row,
                logprob: s.logprob,
            });
        }
    }
    Ok(out)
}

/// Draws one token per row of `probs` (`[rows, vocab]`, each row summing to about 1) by
/// inverting its CDF at `uniforms[row]` in (0, 1], on the device; `[rows, 1]` token ids.
///
/// Two levels, because burn 0.21's cubecl `cumsum` computes every prefix from scratch (O(n^2)
/// per row: 10^10 reads for one row of 152k): the vocabulary is cut into ~sqrt(vocab) blocks of
/// ~sqrt(vocab) tokens; the block is chosen on the CDF of the block masses, then the token on the
/// CDF inside that block. At each level the chosen entry is the first whose CDF reaches the
/// threshold, and the threshold is kept in (0, total]: then the entry before it lies below the
/// threshold, so the chosen block and token have mass > 0 (never a padding entry or a token of
/// probability 0), even where the two levels' f32 sums disagree by a rounding error.
fn inverse_cdf<B: Backend>(
    probs: Tensor<B, 2>,
    uniforms: &[f32],
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let [rows, vocab] = probs.dims();
    let width = (vocab as f64).sqrt().ceil() as usize;
    let blocks = vocab.div_ceil(width);
    let pad = blocks * width - vocab;
    // Every tensor made here takes the dtype of `probs` (f32 from the model's `extend`), not the
    // device's default float (bf16 on a bf16 backend): burn refuses mixed dtypes in one op.
    let dtype = probs.dtype();
    let probs = if pad > 0 {
        Tensor::cat(vec![probs, Tensor::zeros([rows, pad], (device, dtype))], 1)
    } else {
        probs
    };
    let probs = probs.reshape([rows, blocks, width]);

    // Level 1: the block.
    let block_mass = probs.clone().sum_dim(2).reshape([rows, blocks]);
    let block_cdf = block_mass.clone().cumsum(1);
    let total = block_cdf.clone().slice([0..rows, blocks - 1..blocks]);
    let u = Tensor::<B, 2>::from_data(
        TensorData::new(uniforms.to_vec(), [rows, 1]),
        (device, dtype),
    );
    let threshold = total * u;
    let block = first_reaching(block_cdf.clone(), threshold.clone());
    let mass = block_mass.gather(1, block.clone());
    let before = block_cdf.gather(1, block.clone()) - mass.clone();
    // Where the threshold falls inside the block, as a fraction of its mass; the floor (a bias
    // of at most 1e-7 of the block's mass) keeps the level-2 threshold above 0.
    let frac = ((threshold - before) / mass).clamp(f32::EPSILON, 1.0);

    // Level 2: the token inside the block.
    let inner = probs
        .gather(
            1,
            block.clone().reshape([rows, 1, 1]).expand([rows, 1, width]),
        )
        .reshape([rows, width]);
    let inner_cdf = inner.cumsum(1);
    let inner_total = inner_cdf.clone().slice([0..rows, width - 1..width]);
    let offset = first_reaching(inner_cdf, frac * inner_total);
    (block.mul_scalar(width as i64) + offset).clamp_max(vocab as i64 - 1)
}

/// Per row, the first index whose `cdf` (`[rows, n]`) reaches `threshold` (`[rows, 1]`): the
/// number of entries below it (at most n - 1 when the threshold is at most the row's total).
fn first_reaching<B: Backend>(cdf: Tensor<B, 2>, threshold: Tensor<B, 2>) -> Tensor<B, 2, Int> {
    let [rows, n] = cdf.dims();
    cdf.lower(threshold.expand([rows, n]))
        .int()
        .sum_dim(1)
        .clamp_max(n as i64 - 1)
}

/// The next tensor of a transaction's answer.
fn next_data(data: &mut impl Iterator<Item = TensorData>) -> Result<TensorData, SelectError> {
    data.next()
        .ok_or_else(|| SelectError::Device("transaction returned fewer tensors".to_string()))
}

/// The rows `idx` of `logits` (no copy when that is all of them).
fn subset<B: Backend>(logits: &Tensor<B, 2>, idx: &[usize], device: &B::Device) -> Tensor<B, 2> {
    if idx.len() == logits.dims()[0] {
        return logits.clone();
    }
    let idx: Vec<i64> = idx.iter().map(|&i| i as i64).collect();
    let n = idx.len();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [n]), device);
    logits.clone().select(0, idx)
}

/// Log-softmax of `logits / temperature`, each row with its own temperature.
fn scaled_log_softmax<B: Backend>(
    logits: Tensor<B, 2>,
    idx: &[usize],
    rows: &[RowChoice],
    device: &B::Device,
) -> Tensor<B, 2> {
    let inv: Vec<f32> = idx
        .iter()
        .map(|&i| (1.0 / rows[i].filter.temperature) as f32)
        .collect();
    let dtype = logits.dtype();
    let inv = Tensor::<B, 2>::from_data(TensorData::new(inv, [idx.len(), 1]), (device, dtype));
    log_softmax(logits * inv, 1)
}

/// Top-k, then top-p, then one draw, on one row of log-probs (already temperature-scaled and
/// normalised over the whole vocabulary). Sums are in f64.
pub(crate) fn select_filtered(logp: &[f32], filter: TokenFilter, uniform: f64) -> Selection {
    let vocab = logp.len();
    // Descending log-prob, ties by token id, so the order (and the draw) is deterministic.
    let desc = |a: &u32, b: &u32| {
        logp[*b as usize]
            .total_cmp(&logp[*a as usize])
            .then(a.cmp(b))
    };
    let top_k = if filter.top_k == 0 {
        vocab
    } else {
        filter.top_k.min(vocab)
    };
    let mut candidates: Vec<u32> = if top_k < vocab {
        let mut all: Vec<u32> = (0..vocab as u32).collect();
        all.select_nth_unstable_by(top_k - 1, desc);
        all.truncate(top_k);
        all
    } else {
        nucleus_candidates(logp, filter.top_p)
    };
    candidates.sort_unstable_by(desc);

    let probs: Vec<f64> = candidates
        .iter()
        .map(|&t| f64::from(logp[t as usize]).exp())
        .collect();
    // Top-p is taken of what top-k kept (renormalised); without top-k that is everything, whose
    // mass is 1 by construction (the candidates may hold less).
    let kept_by_k: f64 = if top_k < vocab {
        probs.iter().sum()
    } else {
        1.0
    };
    let target = filter.top_p.min(1.0) * kept_by_k;
    let mut keep = probs.len();
    let mut mass = 0.0;
    for (i, p) in probs.iter().enumerate() {
        mass += p;
        if mass >= target {
            keep = i + 1;
            break;
        }
    }
    let kept = &probs[..keep];
    let total: f64 = kept.iter().sum();

    // Inverse CDF at (1 - u) * total, as on the device (see `RowChoice::uniform`).
    let x = (1.0 - uniform) * total;
    let mut chosen = keep - 1;
    let mut cum = 0.0;
    for (i, p) in kept.iter().enumerate() {
        cum += p;
        if cum >= x {
            chosen = i;
            break;
        }
    }
    let token = candidates[chosen];
    let logprob = if !logp[token as usize].is_finite() {
        // NaN logits (or a row of -inf): carried so the caller refuses the row.
        logp[token as usize]
    } else if keep == 1 {
        0.0
    } else {
        (f64::from(logp[token as usize]) - total.ln()) as f32
    };
    Selection { token, logprob }
}

/// Tokens that certainly contain the nucleus of mass `top_p`: all tokens of probability at least
/// a threshold, lowered until their mass reaches `top_p` (any set of the most likely tokens with
/// that mass contains the nucleus). One O(vocab) scan per threshold; the last one takes all.
fn nucleus_candidates(logp: &[f32], top_p: f64) -> Vec<u32> {
    for threshold in [1e-3f64, 1e-5, 1e-7] {
        let log_t = threshold.ln() as f32;
        let candidates: Vec<u32> = (0..logp.len() as u32)
            .filter(|&t| logp[t as usize] >= log_t)
            .collect();
        let mass: f64 = candidates
            .iter()
            .map(|&t| f64::from(logp[t as usize]).exp())
            .sum();
        if mass >= top_p {
            return candidates;
        }
    }
    (0..logp.len() as u32).collect()
}
