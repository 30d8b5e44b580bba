//! Parity with Hugging Face transformers: kevin's logits against the ones transformers computed
//! for the same checkpoint and tokens.
//!
//! `python tests/qwen2_parity.py` writes a model directory with `expected.safetensors` next to
//! it: `input_ids` `[batch, seq]` (i64), `logits` `[batch, seq, vocab]` (f32) and, for a model
//! saved below f32, `logits_f32` (the f32 model's logits, which tells how far the dtype's rounding
//! alone moves them). [`check`] loads the directory, runs the tokens through the full forward
//! pass and through the KV cache (ragged prefill, then one token a step), and reports the largest
//! difference. It backs the CPU fixture test, the GPU test and `kevin policy parity`.

use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use crate::{checkpoint, CausalLm, Qwen2};

/// What `expected.safetensors` holds.
#[derive(Debug, Clone)]
pub struct Expected {
    /// Token ids, row-major `[batch, seq]`.
    pub ids: Vec<i64>,
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// Vocabulary size (the logits' last dimension).
    pub vocab: usize,
    /// transformers' logits in the checkpoint's dtype, as f32.
    pub logits: Vec<f32>,
    /// transformers' logits of the f32 model, when the checkpoint is below f32.
    pub logits_f32: Option<Vec<f32>>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Reads `dir/expected.safetensors`; errors name the file and what is wrong.
pub fn expected(dir: &Path) -> Result<Expected, String> {
    let path = dir.join("expected.safetensors");
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let bytes = std::fs::read(&path).map_err(|e| at(&e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| at(&e))?;
    let ids = st.tensor("input_ids").map_err(|e| at(&e))?;
    let logits = st.tensor("logits").map_err(|e| at(&e))?;
    if ids.dtype() != Dtype::I64 || logits.dtype() != Dtype::F32 {
        return Err(at(&format!(
            "expected input_ids as I64 and logits as F32, found {:?} and {:?}",
            ids.dtype(),
            logits.dtype()
        )));
    }
    let [batch, seq, vocab] = <[usize; 3]>::try_from(logits.shape())
        .map_err(|_| at(&format!("logits shape {:?} is not 3-d", logits.shape())))?;
    if ids.shape() != [batch, seq] {
        return Err(at(&format!(
            "input_ids shape {:?} does not match logits {:?}",
            ids.shape(),
            logits.shape()
        )));
    }
    Ok(Expected {
        ids: ids
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        batch,
        seq,
        vocab,
        logits: f32s(logits.data()),
        logits_f32: st.tensor("logits_f32").ok().map(|t| f32s(t.data())),
    })
}

/// Largest |a - b| over two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared logits differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The model's full-forward logits on the expected ids, as f32.
pub fn logits<B: Backend>(model: &Qwen2<B>, exp: &Expected) -> Result<Vec<f32>, String> {
    let device = model.device();
    let ids = TensorData::new(exp.ids.clone(), [exp.batch, exp.seq]);
    let out = model.forward(Tensor::<B, 2, Int>::from_data(ids, &device));
    if out.dims() != [exp.batch, exp.seq, exp.vocab] {
        return Err(format!(
            "logits {:?}, transformers wrote {:?}",
            out.dims(),
            [exp.batch, exp.seq, exp.vocab]
        ));
    }
    out.into_data()
        .convert::<f32>()
        .into_vec()
        .map_err(|e| format!("{e:?}"))
}

/// Max |kevin - transformers| over every logit `extend` returns when the expected ids go through
/// the KV cache: row `r` prefilled with its first `3 + 2r` tokens in one ragged call, then one
/// token a step, with slots in reverse order of rows so that a row and its slot differ.
pub fn extend_diff<B: Backend>(model: &Qwen2<B>, exp: &Expected) -> Result<f32, String> {
    extend_diffs(model, exp, &[&exp.logits]).map(|d| d[0])
}

/// [`extend_diff`] against each of `references` (logits laid out as `exp.logits`) in one pass.
pub fn extend_diffs<B: Backend>(
    model: &Qwen2<B>,
    exp: &Expected,
    references: &[&[f32]],
) -> Result<Vec<f32>, String> {
    let row = |r: usize| &exp.ids[r * exp.seq..(r + 1) * exp.seq];
    let at = |r: usize, pos: usize| (r * exp.seq + pos) * exp.vocab;
    let slot = |r: usize| exp.batch - 1 - r;
    let mut cache = model.new_cache(exp.batch, exp.seq);
    let mut done: Vec<usize> = (0..exp.batch).map(|r| (3 + 2 * r).min(exp.seq)).collect();
    let mut worst = vec![0f32; references.len()];
    let mut rows: Vec<usize> = (0..exp.batch).collect();
    let mut tokens: Vec<Vec<u32>> = rows
        .iter()
        .map(|&r| row(r)[..done[r]].iter().map(|&t| t as u32).collect())
        .collect();
    while !rows.is_empty() {
        let slots: Vec<usize> = rows.iter().map(|&r| slot(r)).collect();
        let out = model
            .extend(&mut cache, &slots, &tokens)
            .map_err(|e| e.to_string())?;
        let out: Vec<f32> = out
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| format!("{e:?}"))?;
        for (i, &r) in rows.iter().enumerate() {
            let got = &out[i * exp.vocab..(i + 1) * exp.vocab];
            let a = at(r, done[r] - 1);
            for (w, reference) in worst.iter_mut().zip(references) {
                *w = w.max(max_abs_diff(got, &reference[a..a + exp.vocab]));
            }
        }
        rows.retain(|&r| done[r] < exp.seq);
        tokens = rows.iter().map(|&r| vec![row(r)[done[r]] as u32]).collect();
        for &r in &rows {
            done[r] += 1;
        }
    }
    Ok(worst)
}

/// The outcome of [`check`].
#[derive(Debug, Clone, PartialEq)]
pub struct Parity {
    /// Max |kevin - transformers| over the full forward pass's logits.
    pub forward: f32,
    /// The same through the KV cache.
    pub extend: f32,
    /// How far transformers' own logits in this dtype are from its f32 ones (0 for f32).
    pub dtype_rounding: f32,
    /// Below f32: max |kevin - transformers' f32 model| through the forward pass and the cache,
    /// i.e. kevin's own rounding error, to compare with `dtype_rounding`.
    pub to_f32: Option<(f32, f32)>,
    /// The bound: `f32_bound` for an f32 checkpoint; below f32, `low_bound` or, if larger,
    /// `dtype_rounding`.
    pub bound: f32,
}

impl Parity {
    /// In f32: both differences within the bound. Below f32, kevin and transformers round at
    /// different points, so two correct bf16 models differ by up to about twice the rounding
    /// error of either; the check is then that kevin's logits are as close to the f32 model's
    /// as transformers' own are: kevin vs transformers' f32 logits within the bound (which is
    /// at least transformers' bf16 vs f32 difference). Both comparisons are reported.
    pub fn holds(&self) -> bool {
        let (forward, extend) = self.to_f32.unwrap_or((self.forward, self.extend));
        forward <= self.bound && extend <= self.bound
    }
}

/// Loads `dir` on `B` and compares with its `expected.safetensors` (see the module docs).
pub fn check<B: Backend>(
    dir: &Path,
    device: &B::Device,
    f32_bound: f32,
    low_bound: f32,
    split_f32: bool,
) -> Result<Parity, String> {
    let (mut model, _) = checkpoint::load::<B>(dir, device).map_err(|e| e.to_string())?;
    model.set_split_f32_matmul(split_f32);
    let exp = expected(dir)?;
    let ours = logits(&model, &exp)?;
    let forward = max_abs_diff(&ours, &exp.logits);
    let mut references: Vec<&[f32]> = vec![&exp.logits];
    references.extend(exp.logits_f32.as_deref());
    let extends = extend_diffs(&model, &exp, &references)?;
    let extend = extends[0];
    let to_f32 = exp
        .logits_f32
        .as_ref()
        .map(|f| (max_abs_diff(&ours, f), extends[1]));
    let dtype_rounding = exp
        .logits_f32
        .as_ref()
        .map_or(0.0, |f| max_abs_diff(&exp.logits, f));
    let bound = if exp.logits_f32.is_some() {
        low_bound.max(dtype_rounding)
    } else {
        f32_bound
    };
    Ok(Parity {
        forward,
        extend,
        dtype_rounding,
        to_f32,
        bound,
    })
}

/// [`check`] on a backend named at run time: `device` "cuda" (GPU 0) or "cpu" (NdArray),
/// `dtype` "f32" or "bf16" (cuda only). The bounds: 1e-4 in f32, 2e-2 in bf16. f32 on
/// CUDA splits its matmuls unless `tf32` (see [`Qwen2::set_split_f32_matmul`]).
pub fn check_named(dir: &Path, device: &str, dtype: &str, tf32: bool) -> Result<Parity, String> {
    use crate::cuda_setup::cuda_device;
    use burn::backend::{Cuda, NdArray};
    if device == "cuda" {
        crate::cuda_setup::require_gpu("--device cuda")?;
    }
    match (device, dtype) {
        ("cuda", "f32") => check::<Cuda<f32>>(dir, &cuda_device(0), 1e-4, 2e-2, !tf32),
        ("cuda", "bf16") => check::<Cuda<half::bf16>>(dir, &cuda_device(0), 1e-4, 2e-2, false),
        ("cpu", "f32") => check::<NdArray<f32>>(dir, &Default::default(), 1e-4, 2e-2, false),
        (d, t) => Err(format!(
            "--device {d} --dtype {t}: expected cuda with f32 or bf16, or cpu with f32"
        )),
    }
}
