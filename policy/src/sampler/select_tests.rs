//! Tests of token selection: hand-computed log-probs, frequencies, the device inverse CDF.

use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::select::*;

type B = NdArray;

fn device() -> burn::tensor::Device<B> {
    Default::default()
}

fn logits(rows: &[&[f32]]) -> Tensor<B, 2> {
    let v = rows[0].len();
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), v]), &device())
}

fn choice(temperature: f64, top_k: usize, top_p: f64, uniform: f64) -> RowChoice {
    RowChoice {
        filter: TokenFilter {
            temperature,
            top_k,
            top_p,
        },
        uniform,
    }
}

/// Hand-computed cases on the logits [2, 1, 0, -1]:
/// - T = 0.5 scales them to [4, 2, 0, -2]; log-softmax = [-0.14508, -2.14508, -4.14508, ...];
/// - T = 0.5, top-k 2 keeps [4, 2]: log-probs [-ln(1 + e^-2), -2 - ln(1 + e^-2)]
///   = [-0.12693, -2.12693];
/// - T = 1, top-p 0.8: probabilities [0.644, 0.237, 0.087, 0.032]; two tokens reach 0.8:
///   log-probs [-ln(1 + e^-1), -1 - ln(1 + e^-1)] = [-0.31326, -1.31326];
/// - T = 1, top-k 3 then top-p 0.89: renormalised over the top 3, two tokens hold 0.910 >= 0.89
///   (unrenormalised they would hold 0.881 < 0.89 and a third token would be kept), so the CDF
///   inverted at 0.999 (u = 0.001) picks token 1, not token 2;
/// - one token kept (greedy, top-k 1, tiny top-p): a point mass, log-prob 0.
#[test]
fn logprobs_are_those_of_the_scaled_filtered_distribution() {
    let row: &[f32] = &[2.0, 1.0, 0.0, -1.0];
    // The CDF is inverted at 1 - u: u = 0.5 picks token 0 everywhere, u = 0 the last kept one.
    let cases: &[(RowChoice, u32, f32)] = &[
        (choice(0.5, 0, 1.0, 0.5), 0, -0.145_077_94),
        (choice(0.5, 0, 1.0, 0.0), 3, -6.145_077_9),
        (choice(0.5, 2, 1.0, 0.5), 0, -0.126_928_01),
        (choice(0.5, 2, 1.0, 0.05), 1, -2.126_928),
        (choice(0.5, 2, 1.0, 0.0), 1, -2.126_928),
        (choice(1.0, 0, 0.8, 0.5), 0, -0.313_261_7),
        (choice(1.0, 0, 0.8, 0.1), 1, -1.313_261_7),
        (choice(1.0, 3, 0.89, 0.001), 1, -1.313_261_7),
        (choice(0.0, 0, 1.0, 0.7), 0, 0.0),
        (choice(0.9, 1, 1.0, 0.7), 0, 0.0),
        (choice(0.9, 0, 1e-6, 0.7), 0, 0.0),
    ];
    // All cases in one call (greedy, device-sampled and host-filtered rows mixed), then each
    // alone: a row's answer must not depend on the others.
    let rows: Vec<&[f32]> = cases.iter().map(|_| row).collect();
    let choices: Vec<RowChoice> = cases.iter().map(|c| c.0).collect();
    let together = select_tokens(logits(&rows), &choices).unwrap();
    for (i, &(c, token, logprob)) in cases.iter().enumerate() {
        let alone = select_tokens(logits(&[row]), &[c]).unwrap()[0];
        assert_eq!(together[i], alone, "case {i}: {c:?}");
        assert_eq!(alone.token, token, "case {i}: {c:?}");
        assert!(
            (alone.logprob - logprob).abs() < 1e-5,
            "case {i}: {c:?}: log-prob {} != {logprob}",
            alone.logprob
        );
    }
}

#[test]
fn select_refuses_mismatched_rows_and_non_finite_logits() {
    let err = select_tokens(logits(&[&[0.0, 1.0]]), &[]).unwrap_err();
    assert_eq!(
        err,
        SelectError::RowCount {
            logits: 1,
            choices: 0
        }
    );
    let nan: &[f32] = &[f32::NAN, 0.0];
    for c in [
        choice(1.0, 0, 1.0, 0.5),
        choice(1.0, 1, 1.0, 0.5),
        choice(0.0, 0, 1.0, 0.5),
    ] {
        let err = select_tokens(logits(&[&[0.0, 0.0], nan]), &[c, c]).unwrap_err();
        assert!(
            matches!(err, SelectError::NonFinite { row: 1, .. }),
            "{c:?}: {err}"
        );
    }
}

/// Pearson's chi-square of observed counts against probabilities.
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// Frequencies of 20,000 draws from fixed logits match the probabilities: chi-square below
/// 16.27, the 0.1% quantile for 3 degrees of freedom. The seed is fixed, so this cannot flake;
/// a biased sampler (off by one in the CDF, a wrong temperature) fails it by far.
#[test]
fn sampling_frequencies_match_probabilities() {
    let probs = [0.1f64, 0.2, 0.3, 0.4];
    let row: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    // (filter, expected distribution): device path, host top-k path, host top-p path, and a
    // temperature of 0.5 (probabilities squared, renormalised: 1, 4, 9, 16 over 30).
    let top3 = [0.0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9];
    let cases: Vec<(TokenFilter, Vec<f64>)> = vec![
        (filter(1.0, 0, 1.0), probs.to_vec()),
        (filter(1.0, 3, 1.0), top3.to_vec()),
        (filter(1.0, 0, 0.85), top3.to_vec()),
        (
            filter(0.5, 0, 1.0),
            [1.0, 4.0, 9.0, 16.0].iter().map(|x| x / 30.0).collect(),
        ),
    ];
    for (f, expected) in cases {
        let mut rng = StdRng::seed_from_u64(2024);
        let mut counts = [0u64; 4];
        let rows: Vec<&[f32]> = vec![&row; 100];
        for _ in 0..200 {
            let choices: Vec<RowChoice> = (0..100)
                .map(|_| RowChoice {
                    filter: f,
                    uniform: rng.random(),
                })
                .collect();
            for s in select_tokens(logits(&rows), &choices).unwrap() {
                counts[s.token as usize] += 1;
            }
        }
        let (kept_counts, kept_probs): (Vec<u64>, Vec<f64>) = counts
            .iter()
            .zip(&expected)
            .filter(|(_, &p)| p > 0.0)
            .map(|(&c, &p)| (c, p))
            .unzip();
        assert_eq!(
            kept_counts.iter().sum::<u64>(),
            20_000,
            "{f:?}: filtered token drawn: {counts:?}"
        );
        let chi2 = chi_square(&kept_counts, &kept_probs);
        assert!(chi2 < 16.27, "{f:?}: counts {counts:?}, chi-square {chi2}");
    }
}

/// The device draws (two-level inverse CDF) against an f64 CDF on the host: for every uniform u,
/// the token t drawn must satisfy CDF(t - 1) <= 1 - u <= CDF(t) up to f32 rounding, and tokens of
/// probability 0 (at block edges, at the end, in the padding) are never drawn, even at u = 0 and
/// u close to 1.
#[test]
fn device_inverse_cdf_is_exact_up_to_rounding() {
    let mut rng = StdRng::seed_from_u64(5);
    for vocab in [1usize, 2, 9, 10, 97, 1000] {
        let mut row: Vec<f32> = (0..vocab)
            .map(|_| rng.random::<f32>() * 8.0 - 4.0)
            .collect();
        // Zero-probability tokens: the first and last of the row and every seventh.
        if vocab > 2 {
            for t in (0..vocab).filter(|t| t % 7 == 0 || *t == vocab - 1) {
                row[t] = f32::NEG_INFINITY;
            }
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let p: Vec<f64> = row.iter().map(|&l| f64::from(l - max).exp()).collect();
        let z: f64 = p.iter().sum();
        let cdf: Vec<f64> = p
            .iter()
            .scan(0.0, |c, &x| {
                *c += x / z;
                Some(*c)
            })
            .collect();
        let mut uniforms: Vec<f64> = (0..300).map(|_| rng.random()).collect();
        uniforms.extend([0.0, 1e-12, 0.5, 1.0 - 1e-12, 1.0 - f64::EPSILON]);
        let choices: Vec<RowChoice> = uniforms.iter().map(|&u| choice(1.0, 0, 1.0, u)).collect();
        let rows: Vec<&[f32]> = vec![&row; choices.len()];
        let got = select_tokens(logits(&rows), &choices).unwrap();
        for (u, s) in uniforms.iter().zip(got) {
            let t = s.token as usize;
            let v = 1.0 - u;
            let lo = if t == 0 { 0.0 } else { cdf[t - 1] };
            assert!(
                p[t] > 0.0,
                "vocab {vocab}, u {u}: token {t} has probability 0"
            );
            assert!(
                lo - 1e-5 <= v && v <= cdf[t] + 1e-5,
                "vocab {vocab}, u {u}: token {t} covers [{lo}, {}]",
                cdf[t]
            );
            let expected = (p[t] / z).ln() as f32;
            assert!((s.logprob - expected).abs() < 1e-4, "vocab {vocab}, u {u}");
        }
    }
}

fn filter(temperature: f64, top_k: usize, top_p: f64) -> TokenFilter {
    TokenFilter {
        temperature,
        top_k,
        top_p,
    }
}
