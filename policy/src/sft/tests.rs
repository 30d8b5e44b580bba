//! The warm start: the loss counts response tokens only and is the same however a batch is
//! split, training lowers it, a trained checkpoint reloads exactly, the data pipeline (length
//! limit, batches) and the whole command on a tiny model, and corpus errors.

use std::path::PathBuf;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor, TensorData};
use kevin::corpus::{Example, Kind, Turn};

use super::run::{self, ModelShape, SftArgs, SftDtype};
use super::*;
use crate::learner_testing::BigramTestLm;
use crate::qwen2::Qwen2;
use crate::tokenizer::{Tokenizer, SPECIAL_TOKENS};

type Ad = Autodiff<NdArray>;

fn settings(lr: f64, micro_batch_tokens: usize) -> SftConfig {
    SftConfig {
        lr,
        min_lr: lr,
        warmup_steps: 0,
        total_steps: 100,
        grad_clip: 1e6,
        adamw: AdamWSettings {
            weight_decay: 0.0,
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
        },
        micro_batch_tokens,
    }
}

fn seq(prompt: &[u32], response: &[u32]) -> SftExample {
    SftExample {
        prompt: prompt.to_vec(),
        response: response.to_vec(),
    }
}

/// A small corpus of short conversations in the real format (one repair with two turns).
fn corpus() -> Vec<Example> {
    let mut out =
        super::fixture::elementwise_first_turns(&["relu", "sigmoid", "tanh", "exp", "abs", "neg"]);
    out.push(Example {
        task: "relu_task".into(),
        kind: Kind::Repair,
        form: "reference+typo".into(),
        turns: vec![
            Turn {
                prompt: "Write relu.".into(),
                response: "```cuda\n__global__ void k( {}\n```".into(),
            },
            Turn {
                prompt: "Write relu. Your kernel did not compile: expected ')'.".into(),
                response: "Fixed the parenthesis.\n```cuda\n__global__ void k() {}\n```\nDone."
                    .into(),
            },
        ],
        outcomes: vec!["compile_error".into(), "correct".into()],
    });
    out
}

fn tokenizer() -> Tokenizer {
    let texts: Vec<String> = corpus()
        .iter()
        .flat_map(|e| e.turns.iter())
        .map(|t| crate::chat::training_text(None, &t.prompt, &t.response))
        .collect();
    Tokenizer::train_bpe(texts.iter(), 300, &SPECIAL_TOKENS).unwrap()
}

fn tiny_shape() -> ModelShape {
    ModelShape {
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 64,
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kevin-sft-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every float gradient of `module` in `grads`, flattened in visiting order.
struct Flat<'a> {
    grads: &'a GradientsParams,
    values: Vec<f64>,
}

impl ModuleVisitor<Ad> for Flat<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
        let g = self.grads.get::<NdArray, D>(param.id).expect("a gradient");
        self.values.extend(g.into_data().iter::<f64>());
    }
}

fn flat<M: Module<Ad>>(module: &M, grads: &GradientsParams) -> Vec<f64> {
    let mut v = Flat {
        grads,
        values: Vec::new(),
    };
    module.visit(&mut v);
    v.values
}

#[test]
fn only_response_tokens_count_in_the_loss() {
    // A bigram model: the logits at a position depend on that position's token alone, so a
    // prompt token other than the last one can only matter through the prompt's own targets.
    let lm = BigramTestLm::<NdArray>::new(16, 8, 64, &Default::default());
    let loss = |prompt: &[u32], response: &[u32]| -> f64 {
        let batch = TokenBatch::from_sequences([(prompt, response)]).unwrap();
        nll_loss(&lm, &batch, response.len())
            .into_data()
            .iter::<f64>()
            .next()
            .unwrap()
    };
    let base = loss(&[1, 2, 3, 4], &[5, 6, 7]);
    // Other prompt targets (positions 1..3), same last prompt token: the same loss, exactly.
    assert_eq!(loss(&[9, 11, 13, 4], &[5, 6, 7]), base);
    assert_eq!(loss(&[1, 2, 3, 4, 4, 4], &[5, 6, 7]), base);
    // A response target changes it.
    assert_ne!(loss(&[1, 2, 3, 4], &[5, 6, 8]), base);
    assert_ne!(loss(&[1, 2, 3, 4], &[10, 6, 7]), base);
    // And it is the mean NLL of the response tokens.
    let batch = TokenBatch::from_sequences([(&[1u32, 2, 3, 4][..], &[5u32, 6, 7][..])]).unwrap();
    let logp: Vec<f64> = token_logprobs(&lm, &batch)
        .into_data()
        .iter::<f64>()
        .collect();
    assert_eq!(logp.len(), 3);
    let mean = -logp.iter().sum::<f64>() / 3.0;
    assert!((mean - base).abs() < 1e-6, "{mean} vs {base}");
}

#[test]
fn micro_batches_give_the_batch_loss_and_gradient() {
    let lm = BigramTestLm::<Ad>::new(16, 8, 64, &Default::default());
    // burn initialises parameters lazily, and a clone of a parameter not yet read initialises
    // on its own: read them once so every trainer below starts from the same weights.
    let _ = lm.forward(Tensor::<Ad, 2, Int>::from_data(
        TensorData::new(vec![0i64], [1, 1]),
        &Default::default(),
    ));
    let batch = [
        seq(&[1, 2, 3], &[4, 5, 6, 7, 8]),
        seq(&[9], &[10]),
        seq(&[2, 2, 2, 2, 2, 2], &[3, 3]),
        seq(&[7, 1], &[]),
        seq(&[5, 4, 3], &[2, 1, 0, 15]),
    ];
    let refs: Vec<&SftExample> = batch.iter().collect();
    let gradients = |micro: usize| {
        let t = SftTrainer::new(lm.clone(), settings(1e-2, micro)).unwrap();
        let g = t.batch_gradients(&refs).unwrap().unwrap();
        (g.loss, flat(&lm, &g.grads))
    };
    let (whole, g_whole) = gradients(1 << 20);
    // Every micro-batch size from one sequence each to everything at once.
    for micro in [1, 8, 12, 20] {
        let (loss, g) = gradients(micro);
        assert!(
            (loss - whole).abs() < 1e-6,
            "micro {micro}: {loss} vs {whole}"
        );
        assert_eq!(g.len(), g_whole.len());
        let worst = g
            .iter()
            .zip(&g_whole)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-6, "micro {micro}: gradients differ by {worst}");
    }
    // The batch loss is the mean over all 12 response tokens, not a mean of per-row means.
    let inner = lm.valid();
    let mut sum = 0.0;
    for e in batch.iter().filter(|e| !e.response.is_empty()) {
        let tb = TokenBatch::from_sequences([(&e.prompt[..], &e.response[..])]).unwrap();
        sum -= token_logprobs(&inner, &tb)
            .into_data()
            .iter::<f64>()
            .sum::<f64>();
    }
    assert!(
        (whole - sum / 12.0).abs() < 1e-6,
        "{whole} vs {}",
        sum / 12.0
    );
}

#[test]
fn training_lowers_the_loss_and_the_checkpoint_reloads_exactly() {
    let tok = tokenizer();
    let examples = corpus();
    let all: Vec<usize> = (0..examples.len()).collect();
    let data = tokenize(&examples, &all, &tok, 4096, Overlong::Drop, None).unwrap();
    assert_eq!(data.examples.len(), examples.len());
    let cfg = run::fresh_config(&tiny_shape(), &tok, 256).unwrap();
    let device = Default::default();
    let model = Qwen2::<Ad>::new(&cfg, &device).unwrap();
    let mut t = SftTrainer::new(model, settings(1e-2, 1 << 20)).unwrap();
    let refs: Vec<&SftExample> = data.examples.iter().collect();
    let mut losses = Vec::new();
    for _ in 0..5 {
        losses.push(t.step(&refs).unwrap().loss);
    }
    // Adam at 1e-2 from random weights (drawn from burn's process-wide generator, so they vary
    // with the tests running beside this one) may overshoot on one step: ask for a clear fall
    // overall, not a monotone one.
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(
        losses[4] < losses[0] * 0.98,
        "loss did not fall: {losses:?}"
    );
    let (after, n) = t.evaluate(&refs, 64).unwrap();
    assert!(
        after < losses[0] * 0.98,
        "{after} after 5 steps, {losses:?}"
    );
    assert_eq!(n, refs.iter().map(|e| e.response.len()).sum::<usize>());

    let dir = temp_dir("reload");
    let model = t.into_model().valid();
    crate::checkpoint::save(&model, model.config(), &dir, crate::SaveDtype::F32).unwrap();
    let (loaded, random) = crate::burn_learner::open_model::<NdArray>(&dir, 0, &device).unwrap();
    assert!(!random);
    let ids: Vec<i64> = data.examples[6].prompt.iter().map(|&t| t as i64).collect();
    let tokens = crate::qwen2::int_tensor::<NdArray, 2>(ids.clone(), [1, ids.len()], &device);
    let a: Vec<f32> = crate::CausalLm::forward(&model, tokens.clone())
        .into_data()
        .to_vec()
        .unwrap();
    let b: Vec<f32> = crate::CausalLm::forward(&loaded, tokens)
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(a, b, "logits after reloading");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn responses_longer_than_the_sampling_limit_are_dropped_and_counted() {
    let tok = tokenizer();
    let examples = corpus();
    let all: Vec<usize> = (0..examples.len()).collect();
    let full = tokenize(&examples, &all, &tok, usize::MAX, Overlong::Drop, None).unwrap();
    assert_eq!(full.long_responses, 0);
    let mut lens: Vec<usize> = full.examples.iter().map(|e| e.response.len()).collect();
    lens.sort_unstable();
    let limit = lens[lens.len() / 2];
    let over = lens.iter().filter(|&&l| l > limit).count();
    assert!(over > 0 && over < lens.len());
    // Whatever --max-len does, an answer the sampler could not finish never becomes a target.
    for overlong in [Overlong::Drop, Overlong::Truncate] {
        let kept = tokenize(&examples, &all, &tok, usize::MAX, overlong, Some(limit)).unwrap();
        assert_eq!(kept.long_responses, over);
        assert_eq!(kept.examples.len() + over, examples.len());
        for (e, &src) in kept.examples.iter().zip(&kept.source) {
            assert!(e.response.len() <= limit);
            assert_eq!(e, &full.examples[src]);
        }
    }
}

#[test]
fn over_long_examples_are_cut_or_dropped_and_counted() {
    let tok = tokenizer();
    let examples = corpus();
    let all: Vec<usize> = (0..examples.len()).collect();
    let full = tokenize(&examples, &all, &tok, usize::MAX, Overlong::Drop, None).unwrap();
    let lens: Vec<usize> = full.examples.iter().map(SftExample::len).collect();
    // The repair's target is its last turn, and the completion ends with <|im_end|>.
    let repair = full.examples.last().unwrap();
    let im_end = tok.eos_ids()[0];
    assert_eq!(repair.response.last(), Some(&im_end));
    assert!(tok
        .decode(&repair.prompt)
        .unwrap()
        .contains("did not compile"));
    let shortest_prompt = full.examples.iter().map(|e| e.prompt.len()).min().unwrap();
    let max_len = lens.iter().min().unwrap() + 1;
    assert!(max_len > shortest_prompt);
    let over = lens.iter().filter(|&&l| l > max_len).count();
    let dropped = tokenize(&examples, &all, &tok, max_len, Overlong::Drop, None).unwrap();
    assert_eq!(dropped.dropped, over);
    assert_eq!(dropped.examples.len() + over, examples.len());
    let cut = tokenize(&examples, &all, &tok, max_len, Overlong::Truncate, None).unwrap();
    let no_room = full
        .examples
        .iter()
        .filter(|e| e.prompt.len() >= max_len)
        .count();
    assert_eq!(cut.truncated + no_room, over);
    assert_eq!(cut.dropped, no_room);
    for (e, &src) in cut.examples.iter().zip(&cut.source) {
        assert!(e.len() <= max_len);
        assert_eq!(e.prompt, full.examples[src].prompt);
        assert!(full.examples[src].response.starts_with(&e.response));
    }
}

#[test]
fn epoch_batches_cover_every_sequence_once_within_the_budget() {
    let lengths: Vec<usize> = (0..200).map(|i| 10 + (i * 37) % 90).collect();
    let budget = 400;
    let a = epoch_batches(&lengths, budget, 7, 0);
    let mut seen: Vec<usize> = a.iter().flatten().copied().collect();
    seen.sort();
    assert_eq!(seen, (0..200).collect::<Vec<_>>());
    for b in &a {
        let longest = b.iter().map(|&i| lengths[i]).max().unwrap();
        assert!(longest * b.len() <= budget, "{b:?}");
    }
    let padded: usize = a
        .iter()
        .map(|b| b.iter().map(|&i| lengths[i]).max().unwrap() * b.len())
        .sum();
    let real: usize = lengths.iter().sum();
    assert!(
        (padded as f64) < 1.25 * real as f64,
        "padding {padded} for {real}"
    );
    assert_eq!(a, epoch_batches(&lengths, budget, 7, 0), "deterministic");
    assert_ne!(
        a,
        epoch_batches(&lengths, budget, 7, 1),
        "each epoch its own order"
    );
    assert_ne!(a, epoch_batches(&lengths, budget, 8, 0), "the seed matters");
    // A sequence longer than the budget is a batch of its own.
    assert_eq!(epoch_batches(&[5, 1000, 5], 100, 0, 0).len(), 2);
}

#[test]
fn learning_rate_warms_up_then_decays_to_the_floor() {
    let lr = |step| warmup_cosine_lr(1.0, 0.1, 4, 24, step);
    assert_eq!(lr(0), 0.25);
    assert_eq!(lr(3), 1.0);
    assert!((lr(4) - 1.0).abs() < 1e-12);
    assert!((lr(23) - 0.1).abs() < 1e-12);
    assert!((lr(100) - 0.1).abs() < 1e-12);
    let mid = lr(4 + 19 / 2);
    assert!(mid > 0.5 && mid < 0.6, "{mid}");
    for s in 4..23 {
        assert!(lr(s + 1) <= lr(s));
    }
}

fn args(corpus: PathBuf, tokenizer: PathBuf, out: PathBuf) -> SftArgs {
    SftArgs {
        corpus,
        tokenizer,
        out,
        init: None,
        shape: tiny_shape(),
        epochs: 2,
        lr: 3e-3,
        min_lr_ratio: 0.1,
        warmup_steps: None,
        batch_tokens: 256,
        micro_batch_tokens: None,
        max_len: 256,
        overlong: Overlong::Truncate,
        max_response: None,
        val_fraction: 0.2,
        val_split: kevin::corpus::split::SplitBy::Form,
        grad_clip: 1.0,
        weight_decay: 0.1,
        seed: 0,
        dtype: SftDtype::F32,
        save_every_epoch: true,
        max_steps: None,
        command: vec!["kevin".into(), "sft".into(), "train".into()],
    }
}

#[test]
fn the_command_writes_a_checkpoint_the_policy_opens() {
    let dir = temp_dir("run");
    let corpus_path = dir.join("corpus.jsonl");
    kevin::corpus::write_jsonl(&corpus_path, &corpus()).unwrap();
    let tok_path = dir.join("tok.json");
    tokenizer().save(&tok_path).unwrap();
    let out = dir.join("out");
    let a = args(corpus_path.clone(), tok_path, out.clone());
    let mut steps = Vec::new();
    let mut epochs = 0;
    let record = run::run::<Ad>(
        &a,
        &Default::default(),
        &mut |p| steps.push(p.step),
        &mut |_| epochs += 1,
    )
    .unwrap();
    assert_eq!(epochs, 2);
    assert_eq!(record.epochs.len(), 2);
    assert_eq!(steps.len() as u64, record.steps);
    assert!(record
        .epochs
        .iter()
        .all(|e| e.val_loss.is_some_and(f64::is_finite)));
    assert!(!record.corpus.held_out_forms.is_empty());
    assert_eq!(record.corpus.train + record.corpus.validation, 7);
    assert_eq!(record.corpus.sha256.len(), 64);
    assert_eq!(record.model.vocab_size, 300);
    assert!(record.model.tie_word_embeddings);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "sft.json",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    assert!(out.join("epoch-002/model.safetensors").exists());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sft.json")).unwrap()).unwrap();
    assert_eq!(json["command"][1], "sft");
    assert_eq!(json["epochs"].as_array().unwrap().len(), 2);
    // What `kevin train` does with `policy.burn.checkpoint = out`.
    let config = kevin::config::Config::load(
        None,
        &[
            ("KEVIN__POLICY__KIND".into(), "burn".into()),
            (
                "KEVIN__POLICY__BURN__CHECKPOINT".into(),
                out.display().to_string(),
            ),
            ("KEVIN__POLICY__BURN__DEVICE".into(), "cpu".into()),
            ("KEVIN__LEARNER__KIND".into(), "burn".into()),
        ],
    )
    .unwrap();
    let (policy, _learner) = crate::runtime::build(&config).unwrap();
    let described = policy.describe();
    assert!(
        described.contains("Qwen2 2 layers, hidden 32, vocab 300"),
        "{described}"
    );

    // --max-steps stops early and says so.
    let mut short = args(corpus_path, dir.join("tok.json"), dir.join("short"));
    short.max_steps = Some(1);
    short.save_every_epoch = false;
    let r = run::run::<Ad>(&short, &Default::default(), &mut |_| {}, &mut |_| {}).unwrap();
    assert_eq!(r.steps, 1);
    assert!(r.stopped_early);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_corpus_line_is_named_by_file_and_line() {
    let dir = temp_dir("bad");
    let corpus_path = dir.join("corpus.jsonl");
    kevin::corpus::write_jsonl(&corpus_path, &corpus()[..2]).unwrap();
    let mut text = std::fs::read_to_string(&corpus_path).unwrap();
    text.push_str("{\"task\": \"relu_task\", oops\n");
    std::fs::write(&corpus_path, text).unwrap();
    let tok_path = dir.join("tok.json");
    tokenizer().save(&tok_path).unwrap();
    let a = args(corpus_path.clone(), tok_path, dir.join("out"));
    let err = run::run::<Ad>(&a, &Default::default(), &mut |_| {}, &mut |_| {}).unwrap_err();
    assert!(
        err.contains(&format!("{} line 3", corpus_path.display())),
        "{err}"
    );
    assert!(!dir.join("out").exists(), "nothing written on a bad corpus");
    std::fs::remove_dir_all(&dir).unwrap();
}
