//! The tensor losses against `kevin::rl`'s scalar reference, their gradients, and token log-probs
//! against a log-softmax computed by hand on the host.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kevin::rl::{self, Clip};
use kevin::rng::SplitMix64;

use super::*;
use crate::learner_testing::BigramTestLm;

type Nd = NdArray;
type Ad = Autodiff<NdArray>;

/// |got - want| <= 1e-5 * max(1, |want|): the f32 tensor path against the f64 reference.
fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
        "{what}: tensor {got}, scalar {want}"
    );
}

fn host<B: Backend>(t: Tensor<B, 1>) -> Vec<f64> {
    t.into_data().iter::<f64>().collect()
}

fn host_bool<B: Backend>(t: Tensor<B, 1, burn::tensor::Bool>) -> Vec<bool> {
    t.into_data().iter::<bool>().collect()
}

/// Random per-token inputs, rounded to f32 so both paths see the same numbers: ratios spread over
/// and beyond the clip range, advantages of both signs, and proximal weights above the cap.
struct Tokens {
    new: Vec<f32>,
    prox: Vec<f32>,
    behaviour: Vec<f32>,
    advantage: Vec<f32>,
}

impl Tokens {
    /// Token `i` as f64: (new, prox, behaviour, advantage).
    fn at(&self, i: usize) -> (f64, f64, f64, f64) {
        (
            f64::from(self.new[i]),
            f64::from(self.prox[i]),
            f64::from(self.behaviour[i]),
            f64::from(self.advantage[i]),
        )
    }
}

fn random_tokens(n: usize, seed: u64) -> Tokens {
    let mut rng = SplitMix64::new(seed);
    let mut t = Tokens {
        new: Vec::new(),
        prox: Vec::new(),
        behaviour: Vec::new(),
        advantage: Vec::new(),
    };
    for _ in 0..n {
        let new = -4.0 * rng.next_f64();
        t.new.push(new as f32);
        t.prox.push((new + 0.4 * rng.normal()) as f32);
        t.behaviour.push((new + 0.8 * rng.normal()) as f32);
        t.advantage.push((2.0 * rng.normal()) as f32);
    }
    t
}

fn tensor<B: Backend>(v: &[f32]) -> Tensor<B, 1> {
    f32_tensor(v.to_vec(), &Default::default())
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Clipped,
    Decoupled { cap: f64 },
}

fn check_against_scalar(kind: Kind, clip: Clip, seed: u64) {
    let t = random_tokens(400, seed);
    let losses = match kind {
        Kind::Clipped => clipped_surrogate::<Nd>(
            tensor(&t.new),
            tensor(&t.behaviour),
            tensor(&t.advantage),
            clip,
        ),
        Kind::Decoupled { cap } => decoupled_surrogate::<Nd>(
            tensor(&t.new),
            tensor(&t.prox),
            tensor(&t.behaviour),
            tensor(&t.advantage),
            clip,
            cap,
        ),
    };
    let loss = host(losses.loss);
    let clipped = host_bool(losses.clipped);
    let (mut n_clipped, mut n_capped) = (0, 0);
    for i in 0..t.new.len() {
        let (new, prox, b, a) = t.at(i);
        let want = match kind {
            Kind::Clipped => rl::clipped_surrogate(new, b, a, clip),
            Kind::Decoupled { cap } => {
                n_capped += usize::from((prox - b).exp() > cap);
                rl::decoupled_surrogate(new, prox, b, a, clip, cap)
            }
        };
        assert_close(loss[i], want.loss, &format!("{kind:?} token {i} loss"));
        assert_eq!(clipped[i], want.clipped, "{kind:?} token {i} clipped flag");
        n_clipped += usize::from(want.clipped);
    }
    // The random inputs must exercise every branch, or the comparison proves little.
    assert!(
        n_clipped > 20 && n_clipped < 380,
        "{kind:?}: {n_clipped} clipped of 400"
    );
    if let Kind::Decoupled { .. } = kind {
        assert!(n_capped > 5, "decoupled: only {n_capped} capped weights");
    }
}

#[test]
fn clipped_surrogate_matches_the_scalar_reference() {
    check_against_scalar(Kind::Clipped, Clip::default(), 1);
    check_against_scalar(
        Kind::Clipped,
        Clip {
            eps_low: 0.1,
            eps_high: 0.5,
        },
        2,
    );
}

#[test]
fn decoupled_surrogate_matches_the_scalar_reference() {
    check_against_scalar(Kind::Decoupled { cap: 5.0 }, Clip::default(), 3);
    check_against_scalar(Kind::Decoupled { cap: 1.5 }, Clip::default(), 4);
}

#[test]
fn drgrpo_loss_matches_the_scalar_reference() {
    let mut rng = SplitMix64::new(5);
    for (samples, max_tokens) in [(1, 4), (5, 16), (9, 4096)] {
        let per_sample: Vec<Vec<f64>> = (0..samples)
            .map(|_| {
                let len = rng.below(12) as usize; // empty samples included
                (0..len)
                    .map(|_| f64::from((3.0 * rng.normal()) as f32))
                    .collect()
            })
            .collect();
        let flat: Vec<f32> = per_sample.iter().flatten().map(|&v| v as f32).collect();
        if flat.is_empty() {
            continue;
        }
        let got = host(drgrpo_loss::<Nd>(tensor(&flat), max_tokens, samples))[0];
        assert_close(
            got,
            rl::drgrpo_loss(&per_sample, max_tokens),
            &format!("{samples} samples, max_tokens {max_tokens}"),
        );
    }
}

#[test]
fn kl_k3_matches_the_formula_and_is_never_negative() {
    let t = random_tokens(100, 6);
    let got = host(kl_k3::<Nd>(tensor(&t.new), tensor(&t.prox)));
    for (i, &k3) in got.iter().enumerate() {
        let d = f64::from(t.prox[i]) - f64::from(t.new[i]);
        assert_close(k3, d.exp() - d - 1.0, &format!("token {i}"));
        assert!(k3 >= 0.0, "token {i}: k3 {k3}");
    }
}

/// d(loss_i)/d(logp_new_i) of every token, through autodiff.
fn token_grads(
    losses: impl FnOnce(Tensor<Ad, 1>) -> TokenLosses<Ad>,
    new: &[f32],
) -> (Vec<f64>, Vec<bool>) {
    let logp = tensor::<Ad>(new).require_grad();
    let out = losses(logp.clone());
    let clipped = host_bool(out.clipped);
    let grads = out.loss.sum().backward();
    let g = logp
        .grad(&grads)
        .expect("logp is a leaf that requires grad");
    (g.into_data().iter::<f64>().collect(), clipped)
}

#[test]
fn clipped_tokens_have_zero_gradient_and_the_others_minus_a_times_r() {
    // (log ratio, advantage): clipped above with A > 0, clipped below with A < 0, kept outside the
    // range because min picks the unclipped side, kept inside the range, and random tokens.
    let mut cases = vec![
        (1.5f64.ln(), 2.0),
        (0.5f64.ln(), -2.0),
        (1.5f64.ln(), -2.0),
        (0.5f64.ln(), 2.0),
        (1.1f64.ln(), 1.0),
    ];
    let mut rng = SplitMix64::new(7);
    cases.extend((0..50).map(|_| (0.6 * rng.normal(), rng.normal())));
    let behaviour: Vec<f32> = (0..cases.len()).map(|i| -1.0 - 0.01 * i as f32).collect();
    let new: Vec<f32> = cases
        .iter()
        .zip(&behaviour)
        .map(|((lr, _), b)| (f64::from(*b) + lr) as f32)
        .collect();
    let adv: Vec<f32> = cases.iter().map(|(_, a)| *a as f32).collect();
    let (grad, clipped) = token_grads(
        |logp| clipped_surrogate(logp, tensor(&behaviour), tensor(&adv), Clip::default()),
        &new,
    );
    assert_eq!(&clipped[..5], &[true, true, false, false, false]);
    assert!(clipped.iter().filter(|c| **c).count() > 5);
    for i in 0..new.len() {
        let ratio = (f64::from(new[i]) - f64::from(behaviour[i])).exp();
        let want = if clipped[i] {
            0.0
        } else {
            -f64::from(adv[i]) * ratio
        };
        if clipped[i] {
            assert_eq!(
                grad[i], 0.0,
                "token {i}: clipped, gradient must be exactly 0"
            );
        } else {
            assert_close(grad[i], want, &format!("token {i} gradient"));
        }
    }

    // Decoupled: the same with the capped weight pi_prox / pi_behaviour as a factor.
    let t = random_tokens(200, 8);
    let cap = 5.0;
    let (grad, clipped) = token_grads(
        |logp| {
            decoupled_surrogate(
                logp,
                tensor(&t.prox),
                tensor(&t.behaviour),
                tensor(&t.advantage),
                Clip::default(),
                cap,
            )
        },
        &t.new,
    );
    assert!(clipped.iter().any(|c| *c) && clipped.iter().any(|c| !*c));
    for i in 0..t.new.len() {
        let (new, prox, b, a) = t.at(i);
        if clipped[i] {
            assert_eq!(grad[i], 0.0, "decoupled token {i}: clipped");
        } else {
            let want = -(prox - b).exp().min(cap) * a * (new - prox).exp();
            assert_close(grad[i], want, &format!("decoupled token {i} gradient"));
        }
    }
}

/// log_softmax(logits)[target] in f64 on the host.
fn host_logprob(logits: &[f64], target: usize) -> f64 {
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln() + max;
    logits[target] - lse
}

/// The expected log-probs of one (prompt, response) row: the model run on the row alone, each
/// response token scored by a host log-softmax of the logits one position earlier.
fn reference_logprobs<B: Backend>(
    lm: &BigramTestLm<B>,
    prompt: &[u32],
    response: &[u32],
) -> Vec<f64> {
    let ids: Vec<i64> = prompt
        .iter()
        .chain(response)
        .map(|&t| i64::from(t))
        .collect();
    let len = ids.len();
    let logits = lm.forward(Tensor::from_data(
        TensorData::new(ids, [1, len]),
        &lm.device(),
    ));
    let vocab = lm.vocab_size();
    let flat: Vec<f64> = logits.into_data().iter::<f64>().collect();
    response
        .iter()
        .enumerate()
        .map(|(k, &tok)| {
            let pos = prompt.len() + k - 1;
            host_logprob(&flat[pos * vocab..(pos + 1) * vocab], tok as usize)
        })
        .collect()
}

#[test]
fn token_logprobs_match_a_host_log_softmax_row_by_row() {
    let device = Default::default();
    let lm = BigramTestLm::<Nd>::new(13, 6, 64, &device);
    let rows: Vec<(Vec<u32>, Vec<u32>)> = vec![
        (vec![1, 2, 3], vec![4, 5]),
        (vec![7], vec![8, 9, 10, 11, 12]),
        (vec![2, 2], vec![]),
        (vec![0, 12, 6, 6], vec![1]),
    ];
    let want: Vec<f64> = rows
        .iter()
        .flat_map(|(p, r)| reference_logprobs(&lm, p, r))
        .collect();
    let batch =
        TokenBatch::from_sequences(rows.iter().map(|(p, r)| (p.as_slice(), r.as_slice()))).unwrap();
    assert_eq!(
        (batch.rows(), batch.seq_len(), batch.response_tokens()),
        (4, 6, 8)
    );
    let got = host(token_logprobs(&lm, &batch));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(*g, *w, &format!("response token {i}"));
    }
    // Under autodiff the values are the same.
    let ad = BigramTestLm::<Ad>::from_weights(
        Tensor::from_inner(lm.weights().0),
        Tensor::from_inner(lm.weights().1),
        Tensor::from_inner(lm.weights().2),
        64,
    );
    let got_ad = host(token_logprobs(&ad, &batch));
    for (i, (g, w)) in got_ad.iter().zip(&want).enumerate() {
        assert_close(*g, *w, &format!("autodiff response token {i}"));
    }
}

#[test]
fn a_mask_selects_the_same_tokens_as_prompt_and_response_rows() {
    let from_rows =
        TokenBatch::from_sequences([(&[5u32, 6][..], &[7u32, 8][..]), (&[9][..], &[1][..])])
            .unwrap();
    let tokens = [5, 6, 7, 8, 9, 1, PAD, PAD];
    let mask = [false, false, true, true, false, true, false, false];
    let from_mask = TokenBatch::from_mask(&tokens, 2, 4, &mask).unwrap();
    assert_eq!(from_rows, from_mask);
    assert_eq!(from_mask.padded_tokens(), 8);
}

#[test]
fn padding_to_a_multiple_keeps_every_prediction_at_its_token() {
    // Rows of length 3 padded to 4 are the batch built from a 4-wide mask directly.
    let rows = TokenBatch::from_sequences([(&[5u32, 6][..], &[7u32][..]), (&[9][..], &[1, 2][..])])
        .unwrap();
    assert_eq!(rows.seq_len(), 3);
    let tokens = [5, 6, 7, PAD, 9, 1, 2, PAD];
    let mask = [false, false, true, false, false, true, true, false];
    let wide = TokenBatch::from_mask(&tokens, 2, 4, &mask).unwrap();
    assert_eq!(rows.clone().padded_to_multiple(4), wide);
    assert_eq!(rows.clone().padded_to_multiple(2), wide);
    assert_eq!(rows.clone().padded_to_multiple(3), rows);
    assert_eq!(rows.clone().padded_to_multiple(1), rows);
}

#[test]
fn malformed_token_batches_are_rejected_by_name() {
    let check = |got: Result<TokenBatch, BatchError>, want: &str| {
        let msg = got.expect_err(want).to_string();
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    };
    check(
        TokenBatch::from_mask(&[1, 2, 3], 2, 2, &[false; 4]),
        "tokens has 3 entries, expected rows 2 x seq 2 = 4",
    );
    check(
        TokenBatch::from_mask(&[1, 2, 3, 4], 2, 2, &[false, true, true, false]),
        "row 1: token 0 is marked as a response token",
    );
    check(
        TokenBatch::from_sequences([(&[1u32][..], &[][..])]),
        "has no response token",
    );
    check(
        TokenBatch::from_sequences([(&[][..], &[3u32][..])]),
        "row 0: token 0",
    );
    let batch =
        TokenBatch::from_sequences([(&[1u32][..], &[2u32][..]), (&[3][..], &[20][..])]).unwrap();
    assert!(batch.check_vocab(21).is_ok());
    let msg = batch.check_vocab(20).unwrap_err().to_string();
    assert!(
        msg.contains("row 1, position 1: token id 20 is outside the vocabulary of 20"),
        "{msg}"
    );
}
