//! The burn policy and learner together on NdArray with the committed tiny model
//! (models/kevin-tiny): generation, a rejected request, one training step, and the weights
//! crossing from the learner to the policy.

use std::path::PathBuf;
use std::sync::Arc;

use burn::backend::{Autodiff, NdArray};
use kevin::config::{LearnerSection, SamplingSection};
use kevin::episode::Group;
use kevin::learner::Learner;
use kevin::outcome::Outcome;
use kevin::policy::{Completion, FinishReason, GenRequest, Policy, Weights};
use kevin::replay::{Batch, ScoredGroup};
use kevin::turn::TurnRecord;

use crate::burn_learner::{open_model, BurnLearner};
use crate::burn_policy::{prompt_tokens, BurnPolicy};
use crate::loss::{token_logprobs, TokenBatch};
use crate::qwen2::Qwen2;
use crate::tokenizer::Tokenizer;

type Inner = NdArray<f32>;
type Train = Autodiff<Inner>;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/kevin-tiny")
}

fn sampling() -> SamplingSection {
    SamplingSection {
        max_new_tokens: 12,
        max_batch: 4,
        ..SamplingSection::default()
    }
}

/// A learner and a policy built as the daemon builds them: the policy from the learner's model.
fn pair(lr: f64) -> (BurnPolicy<Inner>, BurnLearner<Train>, Arc<Tokenizer>) {
    let dir = tiny_dir();
    let tokenizer = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap());
    let (model, _) = open_model::<Train>(&dir, 7, &Default::default()).unwrap();
    let learner_cfg = LearnerSection {
        lr,
        warmup_steps: 0,
        optimizer_steps: 1,
        // A random model's gradient is large; clip at 1 so the step is lr-sized, not tiny.
        grad_clip: 1.0,
        ..LearnerSection::default()
    };
    let learner = BurnLearner::new(model, tokenizer.clone(), &learner_cfg, &sampling()).unwrap();
    let policy = BurnPolicy::new(learner.inference_model(), tokenizer.clone(), 4, 160, 0).unwrap();
    (policy, learner, tokenizer)
}

/// The log-probs of `completion`'s tokens after `prompt` under `model` (no temperature).
fn logprobs_under(model: &Qwen2<Inner>, prompt: &[u32], completion: &Completion) -> Vec<f32> {
    let batch = TokenBatch::from_sequences([(prompt, completion.token_ids.as_slice())]).unwrap();
    token_logprobs(model, &batch)
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

fn turn(prompt: &str, c: &Completion) -> TurnRecord {
    TurnRecord {
        turn: 0,
        prompt: prompt.to_string(),
        response: c.text.clone(),
        kernel: None,
        summary: None,
        outcome: Outcome::FormatError {
            reason: "no kernel".into(),
        },
        score: 0.0,
        policy_version: c.policy_version,
        response_tokens: c.token_ids.clone(),
        behaviour_logprobs: c.logprobs.clone(),
        generate_ms: 0.0,
        evaluate_ms: 0.0,
    }
}

#[test]
fn policy_generates_learner_trains_and_weights_cross_over() {
    let (mut policy, mut learner, tokenizer) = pair(1e-3);
    let prompts = ["Write a relu kernel.", "Write a softmax kernel."];
    let too_long = "kernel ".repeat(400);
    let requests: Vec<GenRequest> = prompts
        .iter()
        .chain([&too_long.as_str()])
        .enumerate()
        .map(|(i, p)| GenRequest {
            id: 10 + i as u64,
            prompt: p.to_string(),
            seed: i as u64,
        })
        .collect();
    let out = policy.generate(&requests, &sampling()).unwrap();

    // One completion per request, in request order; the too-long prompt is answered empty.
    assert_eq!(
        out.iter().map(|c| c.id).collect::<Vec<_>>(),
        vec![10, 11, 12]
    );
    for c in &out[..2] {
        assert!(
            !c.token_ids.is_empty(),
            "request {} generated nothing",
            c.id
        );
        assert_eq!(c.token_ids.len(), c.logprobs.len());
        assert!(c.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
        assert_eq!(c.policy_version, 0);
        // The text is the decoded tokens (no stop strings are configured; an EOS is not shown).
        let shown: Vec<u32> = c
            .token_ids
            .iter()
            .copied()
            .filter(|t| !tokenizer.eos_ids().contains(t))
            .collect();
        assert_eq!(c.text, tokenizer.decode(&shown).unwrap());
    }
    let rejected = &out[2];
    assert_eq!(
        (
            rejected.text.as_str(),
            rejected.token_ids.len(),
            rejected.finish
        ),
        ("", 0, FinishReason::Length)
    );

    // The policy's log-probs of the generated tokens before training.
    let prompt_ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| prompt_tokens(&tokenizer, p).unwrap())
        .collect();
    let before: Vec<Vec<f32>> = (0..2)
        .map(|i| logprobs_under(policy.generator().model(), &prompt_ids[i], &out[i]))
        .collect();

    // One group: the two completions plus the rejected one (whose prompt is longer than the
    // policy's slots: the learner must not fail on it), with non-zero advantages.
    let group = Group {
        id: 1,
        task: "t".into(),
        trajectories: vec![
            vec![turn(prompts[0], &out[0])],
            vec![turn(prompts[1], &out[1])],
            vec![turn(&too_long, &out[2])],
        ],
    };
    let batch = Batch {
        learner_version: 0,
        groups: vec![ScoredGroup {
            seq: 0,
            group,
            returns: vec![vec![1.0], vec![-1.0], vec![0.0]],
            advantages: vec![vec![1.0], vec![-1.0], vec![0.0]],
        }],
        dropped: Vec::new(),
        staleness: vec![0],
    };
    let stats = learner.train(&batch).unwrap();
    assert_eq!(learner.version(), 1);
    assert_eq!(stats.samples, 3);
    assert_eq!(
        stats.tokens as usize,
        out[0].token_ids.len() + out[1].token_ids.len()
    );
    assert!(stats.loss.is_finite() && stats.grad_norm > 0.0);

    policy.set_weights(&learner.weights()).unwrap();
    assert_eq!(policy.version(), 1);
    for i in 0..2 {
        let after = logprobs_under(policy.generator().model(), &prompt_ids[i], &out[i]);
        let moved = before[i]
            .iter()
            .zip(&after)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            moved > 1e-4,
            "completion {i}: log-probs moved by at most {moved}"
        );
    }
    // The step went up the objective: the advantage-weighted change of the completions'
    // log-likelihoods (+1 for the first, -1 for the second) is positive.
    let total = |v: &[f32]| v.iter().sum::<f32>();
    let after0 = logprobs_under(policy.generator().model(), &prompt_ids[0], &out[0]);
    let after1 = logprobs_under(policy.generator().model(), &prompt_ids[1], &out[1]);
    let gain = (total(&after0) - total(&before[0])) - (total(&after1) - total(&before[1]));
    assert!(
        gain > 0.0,
        "advantage-weighted log-likelihood change {gain}"
    );
}

#[test]
fn wrong_weights_payload_names_the_expected_type() {
    let (mut policy, _learner, _) = pair(1e-4);
    let err = policy
        .set_weights(&Weights {
            version: 3,
            payload: Arc::new(()),
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("v3") && err.contains("Qwen2"), "{err}");
    assert_eq!(policy.version(), 0);
}

#[test]
fn save_then_load_restores_weights_optimizer_and_version() {
    let (mut policy, mut learner, _) = pair(1e-2);
    let prompt = "Write relu.";
    let out = policy
        .generate(
            &[GenRequest {
                id: 1,
                prompt: prompt.into(),
                seed: 1,
            }],
            &sampling(),
        )
        .unwrap();
    let batch = Batch {
        learner_version: 0,
        groups: vec![ScoredGroup {
            seq: 0,
            group: Group {
                id: 1,
                task: "t".into(),
                trajectories: vec![vec![turn(prompt, &out[0])]],
            },
            returns: vec![vec![1.0]],
            advantages: vec![vec![1.0]],
        }],
        dropped: Vec::new(),
        staleness: vec![0],
    };
    learner.train(&batch).unwrap();
    let dir = std::env::temp_dir().join(format!("kevin-burn-learner-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    learner.save(&dir).unwrap();
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "learner_optimizer.safetensors",
    ] {
        assert!(dir.join(file).is_file(), "{file} not written");
    }

    // A fresh learner (at version 0, fresh optimizer) loads the checkpoint and then trains
    // exactly as the saved one does.
    let (_, mut resumed) = {
        let (p, l, _) = pair(1e-2);
        (p, l)
    };
    resumed.load(&dir).unwrap();
    assert_eq!(resumed.version(), 1);
    assert_eq!(resumed.trainer().optimizer_steps(), 1);
    let a = learner.train(&batch).unwrap();
    let b = resumed.train(&batch).unwrap();
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_request_streamed_in_mid_flight_gets_what_a_batch_call_gives_it() {
    let (mut policy, _, _) = pair(1e-3);
    let requests: Vec<GenRequest> = ["Write a relu kernel.", "Write a softmax kernel.", "sum"]
        .iter()
        .enumerate()
        .map(|(i, p)| GenRequest {
            id: 20 + i as u64,
            prompt: p.to_string(),
            seed: 3 + i as u64,
        })
        .collect();
    let batch = policy.generate(&requests, &sampling()).unwrap();

    // The same requests through the stream: the first alone, the others joining after two
    // passes, one of them on a later step again.
    let stream = policy
        .stream()
        .expect("the burn policy batches continuously");
    stream.submit(&requests[..1], &sampling()).unwrap();
    let mut streamed = Vec::new();
    for pass in 0.. {
        match pass {
            2 => stream.submit(&requests[1..2], &sampling()).unwrap(),
            3 => stream.submit(&requests[2..], &sampling()).unwrap(),
            _ => {}
        }
        streamed.extend(stream.step().unwrap());
        if pass >= 3 && stream.in_flight() == 0 {
            break;
        }
        assert!(pass < 100, "the stream never emptied");
    }
    assert_eq!(
        stream.step().unwrap(),
        Vec::new(),
        "an idle stream returns at once"
    );
    streamed.sort_by_key(|c| c.id);
    assert_eq!(streamed.len(), 3);
    for (s, b) in streamed.iter().zip(&batch) {
        assert_eq!((s.id, &s.token_ids, &s.text), (b.id, &b.token_ids, &b.text));
        // Sharing passes with other rows moves a log-prob by rounding at most.
        for (x, y) in s.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "request {}: {x} vs {y}", s.id);
        }
    }
}

/// Micro-batches grow with the memory a position takes only where flash attention serves (burn's
/// CUDA backend and the model's heads): the 4M policy gets about 110,000 positions, Qwen2-0.5B
/// (whose logits alone fill the budget) and every other backend the default 8,192. A type check:
/// no GPU is touched.
#[test]
fn micro_batches_grow_only_where_attention_keeps_no_scores() {
    use crate::bench::Shape;
    use crate::burn_learner::micro_batch_tokens;
    use crate::train::DEFAULT_MICRO_BATCH_TOKENS;
    use burn::backend::Cuda;
    let small = Shape::Kevin4m.config();
    let cuda = micro_batch_tokens::<Autodiff<Cuda<f32>>>(&small);
    assert!((100_000..120_000).contains(&cuda), "{cuda}");
    assert_eq!(
        micro_batch_tokens::<Autodiff<Cuda<half::bf16>>>(&small),
        cuda
    );
    assert_eq!(
        micro_batch_tokens::<Train>(&small),
        DEFAULT_MICRO_BATCH_TOKENS
    );
    let qwen = Shape::Qwen2_05b.config();
    assert_eq!(
        micro_batch_tokens::<Autodiff<Cuda<f32>>>(&qwen),
        DEFAULT_MICRO_BATCH_TOKENS
    );
    // A head dimension the kernels are not built for keeps the default.
    let mut odd = small.clone();
    odd.head_dim = Some(48);
    assert_eq!(
        micro_batch_tokens::<Autodiff<Cuda<f32>>>(&odd),
        DEFAULT_MICRO_BATCH_TOKENS
    );
}

/// A model takes its backend's float type even where the device's default dtype was fixed
/// otherwise: `NdArray<f32>` and `NdArray<f64>` share one device, as `Cuda<f32>` and
/// `Cuda<bf16>` do, and burn fixes that device's default dtype at the first tensor made on it.
/// Before the model named its dtype, a bf16 model built after an f32 one in the same process was
/// f32 (the bf16 SFT GPU test trained f32 twice, 2026-12-06).
#[test]
fn a_model_takes_its_backends_float_type_whatever_the_device_default() {
    use crate::CausalLm;
    use burn::tensor::{DType, Int, Tensor, TensorData};
    type Wide = NdArray<f64>;
    let device = Default::default();
    // Fixes the shared device's default to f32 (if no earlier test has).
    let _ = Tensor::<Inner, 1>::zeros([1], &device);
    let (narrow, cfg) = crate::checkpoint::load::<Inner>(&tiny_dir(), &device).unwrap();
    assert_eq!(narrow.dtype(), DType::F32);
    let (loaded, _) = crate::checkpoint::load::<Wide>(&tiny_dir(), &device).unwrap();
    assert_eq!(
        loaded.dtype(),
        DType::F64,
        "a checkpoint loads in the backend's type"
    );
    let fresh = Qwen2::<Wide>::new(&cfg, &device).unwrap();
    assert_eq!(
        fresh.dtype(),
        DType::F64,
        "a fresh model is made in the backend's type"
    );
    // Its forward pass (RoPE tables, the cache) runs in that type too, and matches f32's.
    fn logits<B: burn::tensor::backend::Backend>(model: &Qwen2<B>, device: &B::Device) -> Vec<f32> {
        let ids = TensorData::new(vec![1i64, 5, 9, 2], [1, 4]);
        model
            .forward(Tensor::<B, 2, Int>::from_data(ids, device))
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap()
    }
    let diff = crate::parity::max_abs_diff(&logits(&loaded, &device), &logits(&narrow, &device));
    assert!(diff < 1e-3, "f64 and f32 logits differ by {diff}");
}
