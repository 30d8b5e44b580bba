//! Hugging Face checkpoints on NdArray: parity with transformers' logits on the committed
//! fixture (tests/data/qwen2-tiny, written by tests/qwen2_parity.py), save -> load round trips,
//! the dtypes read, sharded checkpoints, and errors that name the file and the tensor.

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use burn::backend::NdArray;
use common::{expected, extend_diff, forward_diff, logits, scratch, tiny};
use half::{bf16, f16};
use kevin_policy::checkpoint::{self, CheckpointError, SaveDtype};
use safetensors::{Dtype, SafeTensors};

type B = NdArray<f32>;

fn check_parity(variant: &str) {
    let dir = tiny(variant);
    let device = Default::default();
    let diff = forward_diff::<B>(&dir, &device);
    eprintln!("{variant}: forward: max |kevin - transformers| = {diff:.3e}");
    assert!(
        diff <= 1e-4,
        "{variant}: forward: max |kevin - transformers| = {diff}"
    );
    let diff = extend_diff::<B>(&dir, &device);
    eprintln!("{variant}: extend: max |kevin - transformers| = {diff:.3e}");
    assert!(
        diff <= 1e-4,
        "{variant}: extend: max |kevin - transformers| = {diff}"
    );
}

#[test]
fn logits_match_transformers_untied() {
    check_parity("untied");
}

#[test]
fn logits_match_transformers_tied() {
    check_parity("tied");
}

/// Every tensor of a safetensors file: name -> (dtype, shape, bytes).
fn tensors(path: &Path) -> HashMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(name, t)| {
            (
                name.to_string(),
                (t.dtype(), t.shape().to_vec(), t.data().to_vec()),
            )
        })
        .collect()
}

fn write_tensors(path: &Path, tensors: &HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, (dtype, shape, bytes))| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

/// Saving in f32 writes the very bytes transformers wrote, and loading that gives the very
/// same logits.
fn check_f32_round_trip(variant: &str) {
    let src = tiny(variant);
    let out = scratch(&format!("roundtrip-{variant}"));
    let device = Default::default();
    let (model, cfg) = checkpoint::load::<B>(&src, &device).unwrap();
    checkpoint::save(&model, &cfg, &out, SaveDtype::F32).unwrap();

    let (original, saved) = (
        tensors(&src.join("model.safetensors")),
        tensors(&out.join("model.safetensors")),
    );
    let mut names: Vec<_> = original.keys().collect();
    names.sort();
    let mut saved_names: Vec<_> = saved.keys().collect();
    saved_names.sort();
    assert_eq!(names, saved_names, "{variant}: tensor names");
    for name in names {
        assert!(
            original[name] == saved[name],
            "{variant}: {name} differs after save"
        );
    }

    let (again, cfg_again) = checkpoint::load::<B>(&out, &device).unwrap();
    let exp = expected(&src);
    assert_eq!(
        logits(&model, &exp),
        logits(&again, &exp),
        "{variant}: logits after reload"
    );
    let mut cfg_with_dtype = cfg.clone();
    cfg_with_dtype
        .extra
        .insert("dtype".into(), "float32".into());
    cfg_with_dtype.torch_dtype = Some("float32".into());
    assert_eq!(
        cfg_again, cfg_with_dtype,
        "{variant}: config.json after save"
    );
    fs::remove_dir_all(out).unwrap();
}

#[test]
fn f32_save_load_is_bit_exact_untied() {
    check_f32_round_trip("untied");
}

#[test]
fn f32_save_load_is_bit_exact_tied() {
    check_f32_round_trip("tied");
}

/// `fixture` converted to `dtype` (each f32 rounded to nearest even), loaded and saved back as
/// f32, gives exactly the rounded values: the loader reads f16 and bf16, the saver writes bf16.
fn check_half_dtype(dtype: Dtype) {
    let src = tiny("untied");
    let dir = scratch(&format!("half-{dtype:?}"));
    fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let round = |v: f32| -> (u16, f32) {
        match dtype {
            Dtype::BF16 => (bf16::from_f32(v).to_bits(), bf16::from_f32(v).to_f32()),
            Dtype::F16 => (f16::from_f32(v).to_bits(), f16::from_f32(v).to_f32()),
            _ => unreachable!(),
        }
    };
    let original = tensors(&src.join("model.safetensors"));
    let mut half = HashMap::new();
    let mut rounded = HashMap::new();
    for (name, (_, shape, bytes)) in &original {
        let values = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
        let (bits, back): (Vec<u16>, Vec<f32>) = values.map(round).unzip();
        half.insert(
            name.clone(),
            (
                dtype,
                shape.clone(),
                bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            ),
        );
        rounded.insert(name.clone(), back);
    }
    write_tensors(&dir.join("model.safetensors"), &half);

    let device = Default::default();
    let (model, cfg) = checkpoint::load::<B>(&dir, &device).unwrap();
    let out = dir.join("saved");
    checkpoint::save(&model, &cfg, &out, SaveDtype::F32).unwrap();
    for (name, (saved_dtype, shape, bytes)) in tensors(&out.join("model.safetensors")) {
        assert_eq!(
            (saved_dtype, &shape),
            (Dtype::F32, &original[&name].1),
            "{name}"
        );
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            values == rounded[&name],
            "{name}: {dtype:?} values not read exactly"
        );
    }

    if dtype == Dtype::BF16 {
        // Saving bf16 from the f32 model writes the same rounded bits.
        let (model, cfg) = checkpoint::load::<B>(&src, &device).unwrap();
        let out = dir.join("bf16");
        checkpoint::save(&model, &cfg, &out, SaveDtype::Bf16).unwrap();
        assert_eq!(tensors(&out.join("model.safetensors")), half);
        let written: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(
            (&written["dtype"], &written["torch_dtype"]),
            (&"bfloat16".into(), &"bfloat16".into())
        );
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bf16_is_read_and_written_exactly() {
    check_half_dtype(Dtype::BF16);
}

#[test]
fn f16_is_read_exactly() {
    check_half_dtype(Dtype::F16);
}

#[test]
fn sharded_checkpoints_load() {
    let src = tiny("untied");
    let dir = scratch("sharded");
    fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let all = tensors(&src.join("model.safetensors"));
    let mut shards = [HashMap::new(), HashMap::new()];
    let mut weight_map = serde_json::Map::new();
    for (name, tensor) in all {
        let i = usize::from(name.contains("layers.1") || name.starts_with("lm_head"));
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        weight_map.insert(name.clone(), file.into());
        shards[i].insert(name, tensor);
    }
    for (i, shard) in shards.iter().enumerate() {
        write_tensors(
            &dir.join(format!("model-{:05}-of-00002.safetensors", i + 1)),
            shard,
        );
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    fs::copy(
        src.join("expected.safetensors"),
        dir.join("expected.safetensors"),
    )
    .unwrap();
    let diff = forward_diff::<B>(&dir, &Default::default());
    assert!(diff <= 1e-4, "sharded: max |kevin - transformers| = {diff}");
    fs::remove_dir_all(dir).unwrap();
}

/// The fixture, changed by `edit` (on its config and tensors), fails to load with an error
/// whose message is `message` once `DIR` stands for the scratch directory (or starts with it,
/// when it ends with `...`).
fn check_load_error(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value, &mut HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>),
    message: &str,
) {
    let src = tiny("untied");
    let dir = scratch(name);
    let mut config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let mut all = tensors(&src.join("model.safetensors"));
    edit(&mut config, &mut all);
    fs::write(dir.join("config.json"), config.to_string()).unwrap();
    if !all.is_empty() {
        write_tensors(&dir.join("model.safetensors"), &all);
    }
    let err = match checkpoint::load::<B>(&dir, &Default::default()) {
        Ok(_) => panic!("{name}: loaded"),
        Err(err) => err,
    };
    let (got, want) = (
        err.to_string(),
        message.replace("DIR", &dir.display().to_string()),
    );
    match want.strip_suffix("...") {
        Some(prefix) => assert!(got.starts_with(prefix), "{name}: {got:?}"),
        None => assert_eq!(got, want, "{name}"),
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn load_errors_name_the_file_and_the_tensor() {
    check_load_error(
        "missing",
        |_, t| {
            t.remove("model.layers.1.mlp.up_proj.weight");
        },
        "DIR/model.safetensors: missing tensor model.layers.1.mlp.up_proj.weight",
    );
    check_load_error(
        "untied-without-head",
        |c, t| {
            t.remove("lm_head.weight");
            c["tie_word_embeddings"] = false.into();
        },
        "DIR/model.safetensors: missing tensor lm_head.weight",
    );
    check_load_error(
        "shape",
        |c, _| c["intermediate_size"] = 48.into(),
        "DIR/model.safetensors: model.layers.0.mlp.gate_proj.weight: expected [48, 32], found [64, 32]",
    );
    check_load_error(
        "dtype",
        |_, t| t.get_mut("model.norm.weight").unwrap().0 = Dtype::I32,
        "DIR/model.safetensors: model.norm.weight: dtype I32 is not supported (F32, F16 and BF16 are)",
    );
    check_load_error(
        "config",
        |c, _| c["num_key_value_heads"] = 3.into(),
        "DIR/config.json: num_key_value_heads: 3 does not divide num_attention_heads = 4",
    );
    check_load_error(
        "config-type",
        |c, _| c["hidden_size"] = "32".into(),
        "DIR/config.json: invalid type: string \"32\", expected usize at line 1 column ...",
    );
    check_load_error(
        "no-weights",
        |_, t| t.clear(),
        "DIR: no model.safetensors or model.safetensors.index.json",
    );
}

#[test]
fn save_rejects_a_config_of_another_architecture() {
    let device = Default::default();
    let (model, mut cfg) = checkpoint::load::<B>(&tiny("tied"), &device).unwrap();
    cfg.tie_word_embeddings = false;
    let dir = scratch("mismatch");
    let err = checkpoint::save(&model, &cfg, &dir, SaveDtype::F32).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::ConfigMismatch {
                key: "tie_word_embeddings",
                ..
            }
        ),
        "{err}"
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unused_tensors_are_ignored_like_transformers_does() {
    // A tied checkpoint that still carries lm_head.weight (some exports do) loads, tied.
    let src = tiny("tied");
    let dir = scratch("tied-with-head");
    fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    fs::copy(
        src.join("expected.safetensors"),
        dir.join("expected.safetensors"),
    )
    .unwrap();
    let mut all = tensors(&src.join("model.safetensors"));
    let mut junk = all["model.embed_tokens.weight"].clone();
    junk.2.iter_mut().for_each(|b| *b = 0);
    all.insert("lm_head.weight".into(), junk);
    write_tensors(&dir.join("model.safetensors"), &all);
    let diff = forward_diff::<B>(&dir, &Default::default());
    assert!(diff <= 1e-4, "max |kevin - transformers| = {diff}");
    fs::remove_dir_all(dir).unwrap();
}
