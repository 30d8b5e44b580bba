//! The Qwen2 model on NdArray without a checkpoint: config validation, the KV-cache path
//! against full recomputation, right-padded batches, and gradients under `Autodiff`.

mod common;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use common::max_abs_diff;
use kevin_policy::{CausalLm, Qwen2, Qwen2Config};

type B = NdArray<f32>;

/// A tiny config; `edit` changes the JSON before parsing.
fn config(tied: bool) -> Qwen2Config {
    let json = format!(
        r#"{{"vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": {tied}, "model_type": "qwen2", "initializer_range": 0.2}}"#
    );
    Qwen2Config::from_json(&json).unwrap()
}

fn model(tied: bool, seed: u64) -> Qwen2<B> {
    let device = Default::default();
    B::seed(&device, seed);
    Qwen2::new(&config(tied), &device).unwrap()
}

/// Logits of the last token of `seq`, by a full forward pass without a cache.
fn full_last_logits(model: &Qwen2<B>, seq: &[u32]) -> Vec<f32> {
    let ids: Vec<i64> = seq.iter().map(|&t| t as i64).collect();
    let tokens =
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, seq.len()]), &model.device());
    let logits = model.forward(tokens);
    let vocab = model.vocab_size();
    let last = logits.slice([0..1, seq.len() - 1..seq.len(), 0..vocab]);
    last.into_data().convert::<f32>().into_vec().unwrap()
}

/// One `extend` call (rows of slot + new tokens), preceded by clearing some slots.
struct Step {
    clear: &'static [usize],
    rows: &'static [(usize, &'static [u32])],
}

/// Runs `steps` through the cache and checks every returned row against a full forward pass
/// over that slot's whole sequence, within 1e-4: with the cache's shapes exact, and bucketed as
/// on the GPU (padding rows in untouched slots, masked extra keys, padded prefill tokens).
fn check_incremental(tied: bool, slots: usize, max_len: usize, steps: &[Step]) {
    for bucketed in [false, true] {
        check_incremental_with(tied, slots, max_len, steps, bucketed);
    }
}

fn check_incremental_with(
    tied: bool,
    slots: usize,
    max_len: usize,
    steps: &[Step],
    bucketed: bool,
) {
    let model = model(tied, 7);
    let mut cache = model.new_cache(slots, max_len);
    assert!(!cache.bucketed(), "NdArray compiles nothing per shape");
    cache.set_bucketed(bucketed);
    let mut history: Vec<Vec<u32>> = vec![Vec::new(); slots];
    for (n, step) in steps.iter().enumerate() {
        for &slot in step.clear {
            model.clear_slot(&mut cache, slot);
            history[slot].clear();
            assert_eq!(cache.len(slot), 0);
        }
        let slot_ids: Vec<usize> = step.rows.iter().map(|r| r.0).collect();
        let tokens: Vec<Vec<u32>> = step.rows.iter().map(|r| r.1.to_vec()).collect();
        let logits = model.extend(&mut cache, &slot_ids, &tokens).unwrap();
        assert_eq!(logits.dims(), [step.rows.len(), model.vocab_size()]);
        let logits: Vec<f32> = logits.into_data().convert::<f32>().into_vec().unwrap();
        for (row, &(slot, new)) in step.rows.iter().enumerate() {
            history[slot].extend_from_slice(new);
            assert_eq!(cache.len(slot), history[slot].len());
            let vocab = model.vocab_size();
            let got = &logits[row * vocab..(row + 1) * vocab];
            let want = full_last_logits(&model, &history[slot]);
            let diff = max_abs_diff(got, &want);
            assert!(
                diff <= 1e-4,
                "bucketed {bucketed}, step {n}, row {row} (slot {slot}): max |diff| = {diff}"
            );
        }
    }
}

const RAGGED: &[Step] = &[
    // Prefill of different lengths in one call, one slot left empty.
    Step {
        clear: &[],
        rows: &[(0, &[1, 2, 3, 4, 5]), (2, &[9, 8, 7]), (3, &[60])],
    },
    // One-token decode, rows in another order than the slots.
    Step {
        clear: &[],
        rows: &[(3, &[11]), (0, &[12]), (2, &[13])],
    },
    Step {
        clear: &[],
        rows: &[(0, &[14]), (2, &[15]), (3, &[16])],
    },
    // A new prompt next to one-token decodes (continuous batching).
    Step {
        clear: &[],
        rows: &[(2, &[17]), (1, &[20, 21, 22, 23, 24, 25]), (0, &[18])],
    },
    // Slot 0 finished: cleared and reused by a shorter prompt while others decode.
    Step {
        clear: &[0],
        rows: &[(1, &[26]), (0, &[30, 31]), (3, &[19])],
    },
    Step {
        clear: &[],
        rows: &[(0, &[32]), (1, &[27]), (2, &[28]), (3, &[29])],
    },
    // Several new tokens on a slot that already holds some (a second user turn).
    Step {
        clear: &[3],
        rows: &[(3, &[40, 41, 42]), (2, &[43, 44, 45, 46])],
    },
    Step {
        clear: &[],
        rows: &[(3, &[47])],
    },
];

#[test]
fn incremental_decoding_matches_forward_untied() {
    check_incremental(false, 4, 16, RAGGED);
}

#[test]
fn incremental_decoding_matches_forward_tied() {
    check_incremental(true, 4, 16, RAGGED);
}

#[test]
fn bucketed_rows_pad_into_free_slots_only() {
    // Five slots: three rows round up to four, so one padding row goes to a free slot, and a
    // padding row must never land on a slot the call writes (or the write would be doubled).
    check_incremental(false, 5, 24, RAGGED);
}

#[test]
fn a_slot_filled_to_max_len_exactly() {
    check_incremental(
        false,
        2,
        4,
        &[
            Step {
                clear: &[],
                rows: &[(1, &[1, 2, 3])],
            },
            Step {
                clear: &[],
                rows: &[(1, &[4]), (0, &[5, 6, 7, 8])],
            },
            Step {
                clear: &[1, 0],
                rows: &[(0, &[9]), (1, &[10, 11, 12, 13])],
            },
        ],
    );
}

/// `extend` rejects `rows` and the error contains `needle`; the cache is left untouched.
fn check_extend_error(rows: &[(usize, Vec<u32>)], needle: &str) {
    let model = model(false, 1);
    let mut cache = model.new_cache(2, 4);
    model.extend(&mut cache, &[0], &[vec![1, 2]]).unwrap();
    let slots: Vec<usize> = rows.iter().map(|r| r.0).collect();
    let tokens: Vec<Vec<u32>> = rows.iter().map(|r| r.1.clone()).collect();
    let err = model.extend(&mut cache, &slots, &tokens).unwrap_err();
    assert!(
        err.contains(needle),
        "error {err:?} does not contain {needle:?}"
    );
    assert_eq!((cache.len(0), cache.len(1)), (2, 0));
}

#[test]
fn extend_past_max_len_names_the_slot() {
    check_extend_error(
        &[(1, vec![1]), (0, vec![3, 4, 5])],
        "slot 0: 2 cached + 3 new tokens pass the slot's max_len 4",
    );
}

#[test]
fn extend_rejects_bad_rows() {
    check_extend_error(
        &[(0, vec![1]), (0, vec![2])],
        "slot 0 (row 1): appears twice",
    );
    check_extend_error(&[(2, vec![1])], "slot 2 (row 0): the cache has 2 slots");
    check_extend_error(&[(1, vec![])], "slot 1 (row 0): no new tokens");
    check_extend_error(
        &[(1, vec![3, 61])],
        "slot 1 (row 0): token 61 is outside the vocabulary of 61",
    );
}

#[test]
fn right_padded_forward_matches_each_row_alone() {
    let model = model(false, 3);
    let rows: [&[u32]; 3] = [&[5, 6, 7, 8, 9], &[1, 2], &[40, 41, 42]];
    let t = 5;
    let mut ids = Vec::new();
    for row in rows {
        ids.extend((0..t).map(|j| row.get(j).map_or(0, |&x| x as i64)));
    }
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [3, t]), &model.device());
    let logits = model.forward(tokens);
    let vocab = model.vocab_size();
    for (r, row) in rows.iter().enumerate() {
        for j in 1..=row.len() {
            let got: Vec<f32> = logits
                .clone()
                .slice([r..r + 1, j - 1..j, 0..vocab])
                .into_data()
                .into_vec()
                .unwrap();
            let diff = max_abs_diff(&got, &full_last_logits(&model, &row[..j]));
            assert!(
                diff <= 1e-5,
                "row {r}, position {}: max |diff| = {diff}",
                j - 1
            );
        }
    }
}

#[test]
fn forward_under_autodiff_gives_the_same_logits_and_gradients() {
    type A = Autodiff<B>;
    let device = Default::default();
    A::seed(&device, 5);
    let model: Qwen2<A> = Qwen2::new(&config(false), &device).unwrap();
    let ids = TensorData::new(vec![3i64, 1, 4, 1, 5, 9, 2, 6], [2, 4]);
    let logits = model.forward(Tensor::<A, 2, Int>::from_data(ids.clone(), &device));
    let plain = burn::module::AutodiffModule::valid(&model)
        .forward(Tensor::<B, 2, Int>::from_data(ids, &device));
    let diff = max_abs_diff(
        &logits
            .clone()
            .inner()
            .into_data()
            .into_vec::<f32>()
            .unwrap(),
        &plain.into_data().into_vec::<f32>().unwrap(),
    );
    assert!(diff == 0.0, "autodiff changed the logits by {diff}");

    // The gradient of one log-probability reaches the embedding and every layer.
    let logp = burn::tensor::activation::log_softmax(logits, 2);
    let loss = logp.slice([1..2, 2..3, 7..8]).sum();
    let grads = loss.backward();
    let mut seen = 0;
    let mut finite_nonzero = 0;
    struct Grads<'a> {
        grads: &'a <A as burn::tensor::backend::AutodiffBackend>::Gradients,
        seen: &'a mut usize,
        finite_nonzero: &'a mut usize,
    }
    impl burn::module::ModuleVisitor<A> for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<A, D>>) {
            *self.seen += 1;
            if let Some(g) = param.val().grad(self.grads) {
                let g: Vec<f32> = g.into_data().into_vec().unwrap();
                if g.iter().all(|x| x.is_finite()) && g.iter().any(|&x| x != 0.0) {
                    *self.finite_nonzero += 1;
                }
            }
        }
    }
    burn::module::Module::visit(
        &model,
        &mut Grads {
            grads: &grads,
            seen: &mut seen,
            finite_nonzero: &mut finite_nonzero,
        },
    );
    // embed, 2 x (q,k,v weights+biases, o, gate, up, down, 2 norms), norm, lm_head
    assert_eq!(seen, 1 + 2 * 12 + 2);
    assert_eq!(
        finite_nonzero, seen,
        "some parameter got no (finite, nonzero) gradient"
    );
}

/// A config.json text is rejected with an error that names `key`.
fn check_config_error(edit: (&str, &str), key_and_problem: &str) {
    let mut value: serde_json::Value = serde_json::to_value(config(false)).unwrap();
    value[edit.0] = serde_json::from_str(edit.1).unwrap();
    let err = Qwen2Config::from_json(&value.to_string())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(key_and_problem),
        "error {err:?} does not contain {key_and_problem:?}"
    );
}

#[test]
fn config_errors_name_the_key() {
    check_config_error(
        ("hidden_size", "30"),
        "hidden_size: 30 is not divisible by num_attention_heads = 4",
    );
    check_config_error(
        ("num_key_value_heads", "3"),
        "num_key_value_heads: 3 does not divide num_attention_heads = 4",
    );
    check_config_error(
        ("hidden_size", "20"),
        "hidden_size: RoPE needs an even head dimension, found 5",
    );
    check_config_error(
        ("head_dim", "5"),
        "head_dim: RoPE needs an even head dimension, found 5",
    );
    check_config_error(
        ("num_hidden_layers", "0"),
        "num_hidden_layers: must be at least 1",
    );
    check_config_error(
        ("model_type", "\"llama\""),
        "model_type: expected \"qwen2\", found \"llama\"",
    );
    check_config_error(
        ("hidden_act", "\"gelu\""),
        "hidden_act: only \"silu\" is supported",
    );
    check_config_error(
        ("use_sliding_window", "true"),
        "use_sliding_window: sliding-window attention is not supported",
    );
    check_config_error(
        ("rope_scaling", r#"{"type": "yarn", "factor": 4.0}"#),
        "rope_scaling: only plain RoPE",
    );
    check_config_error(("rms_norm_eps", "0.0"), "rms_norm_eps: must be positive");
    check_config_error(
        (
            "rope_parameters",
            r#"{"rope_type": "yarn", "rope_theta": 1e6}"#,
        ),
        "rope_parameters: only rope_type",
    );
    check_config_error(
        ("layer_types", r#"["full_attention", "sliding_attention"]"#),
        "layer_types: only \"full_attention\" layers",
    );
}

#[test]
fn config_defaults_and_unknown_keys_follow_transformers() {
    let cfg = Qwen2Config::from_json(
        r#"{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
            "eos_token_id": [151645, 151643], "bos_token_id": 151643}"#,
    )
    .unwrap();
    assert_eq!(
        (
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers
        ),
        (151936, 4096, 22016, 32)
    );
    assert_eq!(
        (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim()
        ),
        (32, 32, 128)
    );
    assert_eq!(
        (
            cfg.rms_norm_eps,
            cfg.rope_base(),
            cfg.max_position_embeddings
        ),
        (1e-6, 10000.0, 32768)
    );
    assert!(!cfg.tie_word_embeddings && cfg.qkv_bias());
    assert_eq!(
        cfg.eos_token_id.as_ref().unwrap().to_vec(),
        vec![151645, 151643]
    );
    // Unknown keys survive a round trip through JSON.
    let again: serde_json::Value = serde_json::to_value(&cfg).unwrap();
    assert_eq!(again["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(again["sliding_window"], 4096);
    assert_eq!(Qwen2Config::from_json(&again.to_string()).unwrap(), cfg);
}

#[test]
fn rope_base_is_read_from_either_transformers_format() {
    let v4 = Qwen2Config::from_json(r#"{"rope_theta": 1000000.0, "rope_scaling": null}"#).unwrap();
    let v5 = Qwen2Config::from_json(
        r#"{"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}"#,
    )
    .unwrap();
    assert_eq!((v4.rope_base(), v5.rope_base()), (1e6, 1e6));
    // Each is written back in the format it was read in.
    let v5_json = serde_json::to_value(&v5).unwrap();
    assert!(v5_json.get("rope_theta").is_none());
    assert_eq!(serde_json::to_value(&v4).unwrap()["rope_theta"], 1e6);
}
