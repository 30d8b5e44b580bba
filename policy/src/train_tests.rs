//! The trainer on the bigram test double: reported loss against `kevin::rl`, micro-batching
//! equivalence, a real learning signal, warm-up, optimizer state round trips and bad input.

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use kevin::config::{Correction, LearnerSection, SamplingSection};
use kevin::rl;
use kevin::rng::SplitMix64;

use super::*;
use crate::learner_testing::BigramTestLm;
use crate::loss::TokenBatch;
use crate::optim::{param_table, OPTIMIZER_FILE};

type Ad = Autodiff<NdArray>;
type Lm = BigramTestLm<Ad>;

const VOCAB: usize = 16;

fn config() -> TrainerConfig {
    TrainerConfig {
        max_tokens: 16,
        lr: 1e-2,
        warmup_steps: 0,
        optimizer_steps: 1,
        ..TrainerConfig::new(&LearnerSection::default(), &SamplingSection::default())
    }
}

fn lm() -> Lm {
    BigramTestLm::new(VOCAB, 8, 64, &Default::default())
}

fn trainer(model: Lm, config: TrainerConfig) -> Trainer<Ad, Lm> {
    let reference = (config.kl_coef > 0.0).then(|| lm().valid());
    Trainer::new(model, config, reference).unwrap()
}

/// Log-probs of one sample's response tokens under `model`, on the host.
fn logprobs<M: CausalLm<NdArray>>(model: &M, prompt: &[u32], response: &[u32]) -> Vec<f64> {
    let batch = TokenBatch::from_sequences([(prompt, response)]).unwrap();
    token_logprobs(model, &batch)
        .into_data()
        .iter::<f64>()
        .collect()
}

/// Random samples of 0 to 6 response tokens whose behaviour log-probs are the model's own plus
/// noise (so that some ratios leave the clip range).
fn samples(model: &Lm, n: usize, noise: f64, seed: u64) -> Vec<TrainSample> {
    let mut rng = SplitMix64::new(seed);
    let inner = model.valid();
    (0..n)
        .map(|i| {
            let prompt: Vec<u32> = (0..1 + rng.below(5))
                .map(|_| rng.below(VOCAB as u64) as u32)
                .collect();
            // Sample 1 has an empty response: it still counts in Dr. GRPO's normaliser.
            let len = if i == 1 { 0 } else { 1 + rng.below(6) };
            let response: Vec<u32> = (0..len).map(|_| rng.below(VOCAB as u64) as u32).collect();
            let behaviour = if response.is_empty() {
                Vec::new()
            } else {
                logprobs(&inner, &prompt, &response)
                    .into_iter()
                    .map(|l| (l + noise * rng.normal()) as f32)
                    .collect()
            };
            TrainSample {
                prompt_tokens: prompt,
                response_tokens: response,
                behaviour_logprobs: behaviour,
                advantage: rng.normal(),
            }
        })
        .collect()
}

fn check_reported_loss(correction: Correction, kl_coef: f64) {
    let model = lm();
    let batch = samples(&model, 7, 0.3, 11);
    let cfg = TrainerConfig {
        correction,
        kl_coef,
        ..config()
    };
    let mut t = trainer(model.clone(), cfg.clone());
    let current = model.valid();
    let reference = t.reference.clone();

    // The scalar reference, token by token, on the weights before the step.
    let mut per_sample = Vec::new();
    let mut clipped = 0;
    for s in &batch {
        if s.response_tokens.is_empty() {
            per_sample.push(Vec::new());
            continue;
        }
        let new = logprobs(&current, &s.prompt_tokens, &s.response_tokens);
        let refs = reference
            .as_ref()
            .map(|r| logprobs(r, &s.prompt_tokens, &s.response_tokens));
        let mut losses = Vec::new();
        for (k, &lp) in new.iter().enumerate() {
            let b = f64::from(s.behaviour_logprobs[k]);
            let token = match correction {
                Correction::Clipped => rl::clipped_surrogate(lp, b, s.advantage, cfg.clip),
                // Before the first step the proximal policy is the current one.
                Correction::Decoupled => rl::decoupled_surrogate(
                    lp,
                    lp,
                    b,
                    s.advantage,
                    cfg.clip,
                    cfg.decoupled_weight_cap,
                ),
            };
            clipped += usize::from(token.clipped);
            let kl = refs.as_ref().map_or(0.0, |r| {
                let d = r[k] - lp;
                d.exp() - d - 1.0
            });
            losses.push(token.loss + kl_coef * kl);
        }
        per_sample.push(losses);
    }
    let want = rl::drgrpo_loss(&per_sample, cfg.max_tokens);
    let tokens: usize = per_sample.iter().map(Vec::len).sum();

    let stats = t.train_batch(&batch).unwrap();
    let what = format!("{correction:?}, kl_coef {kl_coef}");
    assert!(
        (stats.loss - want).abs() <= 1e-5 * want.abs().max(1.0),
        "{what}: trainer loss {}, scalar {want}",
        stats.loss
    );
    assert_eq!(stats.tokens, tokens as u64, "{what}");
    assert_eq!(stats.samples, 7, "{what}");
    assert_eq!(stats.optimizer_steps, 1, "{what}");
    assert!(
        (stats.clip_fraction - clipped as f64 / tokens as f64).abs() < 1e-12,
        "{what}: clip fraction {} vs {clipped}/{tokens}",
        stats.clip_fraction
    );
    if correction == Correction::Clipped {
        assert!(clipped > 0, "{what}: the noise should clip some tokens");
    }
    assert!(
        stats.grad_norm > 0.0 && stats.grad_norm.is_finite(),
        "{what}"
    );
    assert_eq!((t.version(), t.optimizer_steps()), (1, 1), "{what}");
}

#[test]
fn reported_loss_equals_the_scalar_reference() {
    check_reported_loss(Correction::Clipped, 0.0);
    check_reported_loss(Correction::Decoupled, 0.0);
    check_reported_loss(Correction::Clipped, 0.5);
    check_reported_loss(Correction::Decoupled, 0.1);
}

/// The summed gradients of a batch as host vectors, parameter by parameter.
fn gradients(
    t: &Trainer<Ad, Lm>,
    batch: &[TrainSample],
) -> (Vec<(String, Vec<f64>)>, f64, u64, usize) {
    gradients_normalised_by(t, batch, batch.len())
}

/// [`gradients`] of `batch` normalised as a batch of `samples` samples.
fn gradients_normalised_by(
    t: &Trainer<Ad, Lm>,
    batch: &[TrainSample],
    samples: usize,
) -> (Vec<(String, Vec<f64>)>, f64, u64, usize) {
    let mbs = t.prepare(batch).unwrap();
    let n = mbs.len();
    let g = t.batch_gradients(&mbs, samples);
    let grads = param_table::<Ad, Lm>(t.model())
        .into_iter()
        .map(|(id, path, dims)| {
            let values = match dims.len() {
                1 => g.grads.get::<NdArray, 1>(id).map(|t| t.into_data()),
                _ => g.grads.get::<NdArray, 2>(id).map(|t| t.into_data()),
            };
            (
                path,
                values
                    .expect("every parameter has a gradient")
                    .iter::<f64>()
                    .collect(),
            )
        })
        .collect();
    (grads, g.loss, g.clipped, n)
}

fn check_micro_batching(correction: Correction, kl_coef: f64) {
    let model = lm();
    let batch = samples(&model, 9, 0.3, 21);
    let cfg = TrainerConfig {
        correction,
        kl_coef,
        ..config()
    };
    let reference = (kl_coef > 0.0).then(|| lm().valid());
    let run = |micro_batch_tokens| {
        let cfg = TrainerConfig {
            micro_batch_tokens,
            ..cfg.clone()
        };
        gradients(
            &Trainer::new(model.clone(), cfg, reference.clone()).unwrap(),
            &batch,
        )
    };
    let (whole, loss, clipped, n) = run(100_000);
    assert_eq!(n, 1);
    for micro_batch_tokens in [1, 12, 25] {
        let (parts, part_loss, part_clipped, parts_n) = run(micro_batch_tokens);
        let what =
            format!("{correction:?} kl {kl_coef}, micro-batches of {micro_batch_tokens} tokens");
        assert!(parts_n > 1, "{what}: {parts_n} micro-batches");
        assert_same_gradients(
            &what,
            (&whole, loss, clipped),
            (&parts, part_loss, part_clipped),
        );
    }
}

/// A parameter table of gradients with its batch's loss and clip count.
type GradientsOf<'a> = (&'a [(String, Vec<f64>)], f64, u64);

/// The same loss (to 1e-6), clip count and gradients (to 1e-6 of each parameter's largest,
/// every parameter having one) from two computations of one batch's update.
fn assert_same_gradients(
    what: &str,
    (whole, loss, clipped): GradientsOf,
    (parts, part_loss, part_clipped): GradientsOf,
) {
    assert!(
        (loss - part_loss).abs() < 1e-6,
        "{what}: loss {loss} vs {part_loss}"
    );
    assert_eq!(clipped, part_clipped, "{what}");
    for ((path, w), (_, p)) in whole.iter().zip(parts) {
        let max = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(max > 0.0, "{what}: {path} has no gradient");
        for (i, (a, b)) in w.iter().zip(p).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * max.max(1e-3),
                "{what}: {path}[{i}] {a} vs {b}"
            );
        }
    }
}

/// Samples whose advantage is zero are left out of the forward and backward passes without a
/// KL term, and the gradient, loss and clip count are those of the whole batch; a batch with no
/// other runs one token, whose gradient is the whole batch's zero for every weight.
#[test]
fn samples_without_advantage_do_not_run_and_the_gradient_is_unchanged() {
    let model = lm();
    let mut batch = samples(&model, 9, 0.3, 21);
    for i in [0, 3, 4, 7] {
        batch[i].advantage = 0.0;
    }
    // No sample with an advantage: one token of one sample runs, and its gradient is the whole
    // batch's, zero for every weight (so the optimizer step is unchanged), as is the loss.
    let flat: Vec<TrainSample> = batch
        .iter()
        .map(|s| TrainSample {
            advantage: 0.0,
            ..s.clone()
        })
        .collect();
    for correction in [Correction::Clipped, Correction::Decoupled] {
        let t = trainer(
            model.clone(),
            TrainerConfig {
                correction,
                ..config()
            },
        );
        let kept = t.gradient_samples(&batch);
        // Sample 1 has no response token; 0, 3, 4 and 7 no advantage.
        assert_eq!(kept.len(), 4, "{correction:?}");
        assert!(kept
            .iter()
            .all(|s| s.advantage != 0.0 && !s.response_tokens.is_empty()));
        let (whole, loss, clipped, _) = gradients(&t, &batch);
        let (part, part_loss, part_clipped, _) = gradients_normalised_by(&t, &kept, batch.len());
        assert_same_gradients(
            &format!("{correction:?}, informative samples only"),
            (&whole, loss, clipped),
            (&part, part_loss, part_clipped),
        );
        let one = t.gradient_samples(&flat);
        assert_eq!(one.len(), 1);
        assert_eq!(
            (one[0].prompt_tokens.len(), one[0].response_tokens.len()),
            (1, 1)
        );
        let (whole, loss, clipped, _) = gradients(&t, &flat);
        let (tiny, tiny_loss, tiny_clipped, _) = gradients_normalised_by(&t, &one, flat.len());
        assert_eq!((loss, clipped), (0.0, 0), "{correction:?}");
        assert_eq!((tiny_loss, tiny_clipped), (0.0, 0), "{correction:?}");
        assert_eq!(whole.len(), tiny.len());
        for ((path, w), (_, p)) in whole.iter().zip(&tiny) {
            assert!(
                w.iter().chain(p).all(|v| *v == 0.0),
                "{correction:?}: {path} is not zero"
            );
            assert_eq!(w.len(), p.len(), "{path}");
        }
    }
    // A KL term pulls every token: all run.
    let t = trainer(
        model.clone(),
        TrainerConfig {
            kl_coef: 0.2,
            ..config()
        },
    );
    assert_eq!(t.gradient_samples(&batch).len(), batch.len());
    // Without any response token there is nothing to run and no step.
    let empty: Vec<TrainSample> = flat
        .iter()
        .map(|s| TrainSample {
            response_tokens: vec![],
            behaviour_logprobs: vec![],
            ..s.clone()
        })
        .collect();
    let t = trainer(model.clone(), config());
    assert_eq!(t.gradient_samples(&empty).len(), empty.len());
    // Training on the batch counts every sample and token in its stats.
    let mut t = trainer(model, config());
    let stats = t.train_batch(&batch).unwrap();
    assert_eq!(stats.samples, batch.len() as u64);
    assert_eq!(
        stats.tokens,
        batch
            .iter()
            .map(|s| s.response_tokens.len() as u64)
            .sum::<u64>()
    );
}

#[test]
fn micro_batching_does_not_change_the_gradient() {
    check_micro_batching(Correction::Clipped, 0.0);
    check_micro_batching(Correction::Decoupled, 0.2);
}

#[test]
fn micro_batch_plans() {
    let check = |lengths: &[(usize, usize)], max: usize, want: &[&[usize]]| {
        let got = plan_micro_batches(lengths, max);
        let want: Vec<Vec<usize>> = want.iter().map(|w| w.to_vec()).collect();
        assert_eq!(got, want, "lengths {lengths:?}, max {max}");
    };
    // Longest first; 3 rows of 4 fit in 12, a fourth does not.
    check(&[(0, 4), (1, 4), (2, 4), (3, 4)], 12, &[&[0, 1, 2], &[3]]);
    // A sequence longer than the limit runs alone; padding counts (2 rows x 10 > 15).
    check(
        &[(0, 3), (1, 20), (2, 10), (3, 5)],
        15,
        &[&[1], &[2], &[3, 0]],
    );
    check(&[], 8, &[]);
}

#[test]
fn warmup_is_linear_then_constant() {
    let schedule: Vec<f64> = (0..6).map(|s| warmup_lr(1.0, 4, s)).collect();
    assert_eq!(schedule, vec![0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
    assert_eq!(warmup_lr(3e-6, 0, 0), 3e-6);
    assert_eq!(warmup_lr(2.0, 1, 0), 2.0);
}

#[test]
fn positive_advantage_raises_its_response_and_negative_lowers_its() {
    let prompt = vec![1u32, 2];
    let (good, bad) = (vec![3u32, 4, 5], vec![6u32, 7]);
    let mut t = trainer(lm(), config());
    let sum = |t: &Trainer<Ad, Lm>, r: &[u32]| {
        logprobs(&t.model().valid(), &prompt, r).iter().sum::<f64>()
    };
    let (good_before, bad_before) = (sum(&t, &good), sum(&t, &bad));
    for _ in 0..10 {
        // On-policy: the behaviour log-probs are the current model's.
        let inner = t.model().valid();
        let sample = |response: &Vec<u32>, advantage| TrainSample {
            prompt_tokens: prompt.clone(),
            response_tokens: response.clone(),
            behaviour_logprobs: logprobs(&inner, &prompt, response)
                .iter()
                .map(|&l| l as f32)
                .collect(),
            advantage,
        };
        t.train_batch(&[sample(&good, 1.0), sample(&bad, -1.0)])
            .unwrap();
    }
    let (good_after, bad_after) = (sum(&t, &good), sum(&t, &bad));
    assert!(
        good_after > good_before + 0.1,
        "good response: {good_before} -> {good_after}"
    );
    assert!(
        bad_after < bad_before - 0.1,
        "bad response: {bad_before} -> {bad_after}"
    );
    assert_eq!((t.version(), t.optimizer_steps()), (10, 10));
}

#[test]
fn optimizer_state_round_trip_continues_identically() {
    let dir = std::env::temp_dir().join(format!("kevin-policy-optim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = TrainerConfig {
        optimizer_steps: 2,
        warmup_steps: 5,
        ..config()
    };
    let mut a = trainer(lm(), cfg.clone());
    let first = samples(a.model(), 6, 0.2, 31);
    a.train_batch(&first).unwrap();
    a.save_optimizer(&dir).unwrap();
    assert!(dir.join(OPTIMIZER_FILE).is_file());

    let mut b = trainer(a.model().reloaded(), cfg.clone());
    b.load_optimizer(&dir).unwrap();
    assert_eq!((b.version(), b.optimizer_steps()), (1, 2));
    // Without the saved state the same weights would take a different step: the control that
    // shows the comparison below can fail.
    let mut fresh = trainer(a.model().reloaded(), cfg.clone());

    let second = samples(a.model(), 6, 0.2, 32);
    a.train_batch(&second).unwrap();
    b.train_batch(&second).unwrap();
    fresh.train_batch(&second).unwrap();
    assert_eq!(
        a.model().weight_values(),
        b.model().weight_values(),
        "resumed trainer diverged"
    );
    let drift = a
        .model()
        .weight_values()
        .iter()
        .zip(fresh.model().weight_values())
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        drift > 1e-4,
        "a fresh optimizer should step differently (max diff {drift})"
    );

    // A model of another shape is refused, naming the parameter.
    let mut other = trainer(
        BigramTestLm::new(VOCAB + 1, 8, 64, &Default::default()),
        cfg,
    );
    let msg = other.load_optimizer(&dir).unwrap_err().to_string();
    assert!(
        msg.contains(
            "parameter 0 was saved as embed.weight [16, 8], the model has embed.weight [17, 8]"
        ),
        "{msg}"
    );
    let msg = other
        .load_optimizer(&dir.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("missing/learner_optimizer.safetensors"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_samples_are_refused_by_index_and_reason() {
    let mut t = trainer(lm(), config());
    let ok = TrainSample {
        prompt_tokens: vec![1, 2],
        response_tokens: vec![3, 4],
        behaviour_logprobs: vec![-1.0, -2.0],
        advantage: 0.5,
    };
    let check = |t: &mut Trainer<Ad, Lm>, bad: TrainSample, want: &str| {
        let msg = t.train_batch(&[ok.clone(), bad]).unwrap_err().to_string();
        assert!(msg.starts_with("train sample 1: "), "{msg}");
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    };
    check(
        &mut t,
        TrainSample {
            behaviour_logprobs: vec![-1.0],
            ..ok.clone()
        },
        "1 behaviour log-probs for 2 response tokens",
    );
    check(
        &mut t,
        TrainSample {
            prompt_tokens: vec![],
            ..ok.clone()
        },
        "empty prompt",
    );
    check(
        &mut t,
        TrainSample {
            behaviour_logprobs: vec![-1.0, f32::NAN],
            ..ok.clone()
        },
        "behaviour log-prob of response token 1 is NaN",
    );
    check(
        &mut t,
        TrainSample {
            advantage: f64::INFINITY,
            ..ok.clone()
        },
        "advantage is inf",
    );
    check(
        &mut t,
        TrainSample {
            response_tokens: vec![3, 16],
            ..ok.clone()
        },
        "token 16 at position 3 is outside the vocabulary of 16",
    );
    check(
        &mut t,
        TrainSample {
            prompt_tokens: vec![1; 63],
            ..ok.clone()
        },
        "prompt 63 + response 2 tokens pass the model's 64 positions",
    );
    // Nothing was trained.
    assert_eq!((t.version(), t.optimizer_steps()), (0, 0));
}

#[test]
fn settings_are_checked_by_key() {
    let check = |cfg: TrainerConfig, reference: Option<BigramTestLm<NdArray>>, want: &str| {
        let msg = match Trainer::<Ad, Lm>::new(lm(), cfg, reference) {
            Ok(_) => panic!("expected an error containing {want:?}"),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    };
    check(
        TrainerConfig {
            kl_coef: 0.1,
            ..config()
        },
        None,
        "learner.kl_coef = 0.1 needs a reference model",
    );
    check(
        TrainerConfig {
            optimizer_steps: 0,
            ..config()
        },
        None,
        "learner.optimizer_steps = 0",
    );
    check(
        TrainerConfig {
            grad_clip: -1.0,
            ..config()
        },
        None,
        "learner.grad_clip = -1: must be > 0",
    );
}

#[test]
fn a_batch_without_response_tokens_takes_no_step() {
    let mut t = trainer(lm(), config());
    let before = t.model().weight_values();
    let stats = t
        .train_batch(&[TrainSample {
            prompt_tokens: vec![1],
            response_tokens: vec![],
            behaviour_logprobs: vec![],
            advantage: 1.0,
        }])
        .unwrap();
    assert_eq!(
        (stats.optimizer_steps, stats.tokens, stats.samples),
        (0, 0, 1)
    );
    assert_eq!(t.version(), 1);
    assert_eq!(t.model().weight_values(), before);
}

#[test]
fn replay_batches_become_samples_turn_by_turn() {
    use kevin::episode::Group;
    use kevin::outcome::Outcome;
    use kevin::replay::ScoredGroup;
    use kevin::turn::TurnRecord;

    let turn = |k: u32, prompt: &str, response: Vec<u32>| TurnRecord {
        turn: k,
        prompt: prompt.into(),
        response: String::new(),
        kernel: None,
        summary: None,
        outcome: Outcome::CompileError { log: String::new() },
        score: 0.0,
        policy_version: 0,
        behaviour_logprobs: vec![-0.5; response.len()],
        response_tokens: response,
        generate_ms: 0.0,
        evaluate_ms: 0.0,
    };
    let batch = Batch {
        learner_version: 0,
        groups: vec![ScoredGroup {
            seq: 7,
            group: Group {
                id: 0,
                task: "t".into(),
                trajectories: vec![
                    vec![turn(0, "ab", vec![1]), turn(1, "abc", vec![2, 3])],
                    vec![turn(0, "ab", vec![4])],
                ],
            },
            returns: vec![vec![0.0, 0.0], vec![0.0]],
            advantages: vec![vec![0.5, -0.25], vec![1.5]],
        }],
        dropped: vec![],
        staleness: vec![0],
    };
    let bytes = |s: &str| Ok(s.bytes().map(u32::from).collect());
    let got = train_samples(&batch, bytes).unwrap();
    let summary: Vec<(Vec<u32>, Vec<u32>, f64)> = got
        .iter()
        .map(|s| {
            (
                s.prompt_tokens.clone(),
                s.response_tokens.clone(),
                s.advantage,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (vec![97, 98], vec![1], 0.5),
            (vec![97, 98, 99], vec![2, 3], -0.25),
            (vec![97, 98], vec![4], 1.5),
        ]
    );
    let refuse_c = |s: &str| {
        if s.contains('c') {
            Err("no c".to_string())
        } else {
            bytes(s)
        }
    };
    let msg = train_samples(&batch, refuse_c).unwrap_err().to_string();
    assert_eq!(
        msg,
        "train sample 1: group 7 trajectory 0 turn 1: tokenising the prompt: no c"
    );
}

#[test]
fn the_tensor_helpers_agree_with_the_trainer_on_a_single_token() {
    // One token, advantage 1, on-policy: the loss is -1 / (max_tokens * samples) exactly.
    let mut t = trainer(lm(), config());
    let inner = t.model().valid();
    let lp = logprobs(&inner, &[1], &[2])[0] as f32;
    let stats = t
        .train_batch(&[TrainSample {
            prompt_tokens: vec![1],
            response_tokens: vec![2],
            behaviour_logprobs: vec![lp],
            advantage: 1.0,
        }])
        .unwrap();
    assert!(
        (stats.loss + 1.0 / 16.0).abs() < 1e-6,
        "loss {}",
        stats.loss
    );
    assert_eq!(stats.clip_fraction, 0.0);
}
