//! Helpers shared by the model tests: the committed fixture, the expected logits that
//! tests/qwen2_parity.py wrote next to each model, and the parity check itself (with its largest
//! difference of two lists of logits).
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use kevin_policy::{checkpoint, parity, Qwen2};

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

pub use kevin_policy::parity::{max_abs_diff, Expected};

/// `dir/expected.safetensors` (see `kevin_policy::parity`).
pub fn expected(dir: &Path) -> Expected {
    parity::expected(dir).unwrap()
}

/// The model's logits on the expected ids, as f32.
pub fn logits<B: Backend>(model: &Qwen2<B>, exp: &Expected) -> Vec<f32> {
    parity::logits(model, exp).unwrap()
}

/// Loads `dir` on `B` and returns max |kevin - transformers| over all logits of `forward`.
pub fn forward_diff<B: Backend>(dir: &Path, device: &B::Device) -> f32 {
    let (model, _) = checkpoint::load::<B>(dir, device).unwrap();
    let exp = expected(dir);
    max_abs_diff(&logits(&model, &exp), &exp.logits)
}

/// Loads `dir` on `B` and returns max |kevin - transformers| through the KV cache.
pub fn extend_diff<B: Backend>(dir: &Path, device: &B::Device) -> f32 {
    let (model, _) = checkpoint::load::<B>(dir, device).unwrap();
    parity::extend_diff(&model, &expected(dir)).unwrap()
}
