//! Helpers shared by the checkpoint tests: the committed fixture, the expected logits that
//! tests/qwen2_parity.py wrote next to each model, and the parity check itself.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kevin_policy::{checkpoint, CausalLm, Qwen2};
use safetensors::{Dtype, SafeTensors};

/// tests/data/qwen2-tiny/<variant>: `untied` or `tied`, under the repository root (`KEVIN_ROOT`
/// when set: a test binary copied to the GPU machine runs outside its build tree).
pub fn tiny(variant: &str) -> PathBuf {
    let root = std::env::var_os("KEVIN_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    root.join("tests/data/qwen2-tiny").join(variant)
}

/// A fresh empty directory under the system's temporary directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kevin-policy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What `expected.safetensors` holds: ids `[batch, seq]`, logits `[batch, seq, vocab]` (f32),
/// and, for a dtype below f32, the f32 model's logits.
pub struct Expected {
    pub ids: Vec<i64>,
    pub batch: usize,
    pub seq: usize,
    pub vocab: usize,
    pub logits: Vec<f32>,
    pub logits_f32: Option<Vec<f32>>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn expected(dir: &Path) -> Expected {
    let path = dir.join("expected.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = st.tensor("input_ids").unwrap();
    assert_eq!(ids.dtype(), Dtype::I64);
    let logits = st.tensor("logits").unwrap();
    assert_eq!(logits.dtype(), Dtype::F32);
    let [batch, seq, vocab] = <[usize; 3]>::try_from(logits.shape()).unwrap();
    Expected {
        ids: ids
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        batch,
        seq,
        vocab,
        logits: f32s(logits.data()),
        logits_f32: st.tensor("logits_f32").ok().map(|t| f32s(t.data())),
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The model's logits on the expected ids, as f32.
pub fn logits<B: Backend>(model: &Qwen2<B>, exp: &Expected) -> Vec<f32> {
    let device = model.device();
    let ids = TensorData::new(exp.ids.clone(), [exp.batch, exp.seq]);
    let out = model.forward(Tensor::<B, 2, Int>::from_data(ids, &device));
    assert_eq!(out.dims(), [exp.batch, exp.seq, exp.vocab]);
    out.into_data().convert::<f32>().into_vec().unwrap()
}

/// Loads `dir` on `B` and returns max |kevin - transformers| over all logits of `forward`.
pub fn forward_diff<B: Backend>(dir: &Path, device: &B::Device) -> f32 {
    let (model, _) = checkpoint::load::<B>(dir, device).unwrap();
    let exp = expected(dir);
    max_abs_diff(&logits(&model, &exp), &exp.logits)
}

/// Feeds the expected ids through the KV cache (row `r` prefilled with its first `3 + 2r`
/// tokens in one ragged call, then one token a step) and returns max |kevin - transformers|
/// over every logit `extend` returned.
pub fn extend_diff<B: Backend>(dir: &Path, device: &B::Device) -> f32 {
    let (model, _) = checkpoint::load::<B>(dir, device).unwrap();
    let exp = expected(dir);
    let row = |r: usize| &exp.ids[r * exp.seq..(r + 1) * exp.seq];
    let hf = |r: usize, pos: usize| {
        let at = (r * exp.seq + pos) * exp.vocab;
        &exp.logits[at..at + exp.vocab]
    };
    // Slots in reverse order of rows, so that a row and its slot differ.
    let slot = |r: usize| exp.batch - 1 - r;
    let mut cache = model.new_cache(exp.batch, exp.seq);
    let mut done: Vec<usize> = (0..exp.batch).map(|r| (3 + 2 * r).min(exp.seq)).collect();
    let slots: Vec<usize> = (0..exp.batch).map(slot).collect();
    let tokens: Vec<Vec<u32>> = (0..exp.batch)
        .map(|r| row(r)[..done[r]].iter().map(|&t| t as u32).collect())
        .collect();
    let mut worst = 0f32;
    let mut compare = |rows: &[usize], out: Tensor<B, 2>, done: &[usize]| {
        let out: Vec<f32> = out.into_data().convert::<f32>().into_vec().unwrap();
        for (i, &r) in rows.iter().enumerate() {
            let got = &out[i * exp.vocab..(i + 1) * exp.vocab];
            worst = worst.max(max_abs_diff(got, hf(r, done[r] - 1)));
        }
    };
    let out = model.extend(&mut cache, &slots, &tokens).unwrap();
    compare(&(0..exp.batch).collect::<Vec<_>>(), out, &done);
    loop {
        let rows: Vec<usize> = (0..exp.batch).filter(|&r| done[r] < exp.seq).collect();
        if rows.is_empty() {
            break;
        }
        let slots: Vec<usize> = rows.iter().map(|&r| slot(r)).collect();
        let tokens: Vec<Vec<u32>> = rows.iter().map(|&r| vec![row(r)[done[r]] as u32]).collect();
        let out = model.extend(&mut cache, &slots, &tokens).unwrap();
        for &r in &rows {
            done[r] += 1;
        }
        compare(&rows, out, &done);
    }
    worst
}
