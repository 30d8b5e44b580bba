//! The Qwen2 decoder (Hugging Face's `Qwen2ForCausalLM`) in burn, one model in one file as
//! candle writes them: the config.json struct, small modules each with `new` and a short
//! `forward`, and an explicit KV cache of fixed slots for batched generation.
//!
//! Shapes in comments use `b` batch rows, `t` new tokens, `s` attended keys, `h` query heads,
//! `kv` key/value heads, `d` head dimension, `g = h / kv` query heads per key/value head.
//!
//! Numerics follow transformers' eager code so that logits match it: RMSNorm in f32 and cast
//! back, RoPE tables computed in f32 with the `rotate_half` convention, softmax in f32.

use std::collections::BTreeMap;

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::{
    Bool, DType, Distribution, FloatDType, IndexingUpdateOp, Int, Tensor, TensorData,
};
use serde::{Deserialize, Serialize};

use crate::CausalLm;

/// A Hugging Face Qwen2 `config.json`. Field names are Hugging Face's; a missing field takes
/// transformers' default; keys this model does not use are kept in `extra` and written back, so
/// a checkpoint saved by kevin keeps the config it was loaded with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen2Config {
    /// Rows of the embedding and of the output layer.
    #[serde(default = "defaults::vocab_size")]
    pub vocab_size: usize,
    /// Width of the residual stream.
    #[serde(default = "defaults::hidden_size")]
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    #[serde(default = "defaults::intermediate_size")]
    pub intermediate_size: usize,
    /// Number of decoder layers.
    #[serde(default = "defaults::num_hidden_layers")]
    pub num_hidden_layers: usize,
    /// Query heads.
    #[serde(default = "defaults::num_attention_heads")]
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); divides `num_attention_heads`.
    #[serde(default = "defaults::num_key_value_heads")]
    pub num_key_value_heads: usize,
    /// Per-head width when it is not `hidden_size / num_attention_heads` (newer configs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Longest sequence the model was trained for.
    #[serde(default = "defaults::max_position_embeddings")]
    pub max_position_embeddings: usize,
    /// Epsilon of every RMSNorm.
    #[serde(default = "defaults::rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base as transformers 4 writes it (transformers 5 writes `rope_parameters`); read it
    /// through [`Qwen2Config::rope_base`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// RoPE scaling as transformers 4 writes it; only `null` (plain RoPE) is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// RoPE as transformers 5 writes it, `{"rope_type": "default", "rope_theta": ...}`; only
    /// the `default` type is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Value>,
    /// Whether the output layer reuses the token embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Activation of the MLP; Qwen2 uses `silu`, the only one supported.
    #[serde(default = "defaults::hidden_act")]
    pub hidden_act: String,
    /// Sliding-window attention; Qwen2 checkpoints ship with it off, the only mode supported.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Bias on q/k/v projections. Qwen2 always has it, so transformers' Qwen2 config has no such
    /// key (and transformers ignores it); an explicit `false`, as Llama-style configs write,
    /// builds the projections without it: a kevin extension that transformers' Qwen2 cannot open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Standard deviation of the random initialisation.
    #[serde(default = "defaults::initializer_range")]
    pub initializer_range: f64,
    /// The dtype the checkpoint is stored in (`float32`, `bfloat16`, ...); informative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    /// Beginning-of-sequence token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<TokenIds>,
    /// Must be `qwen2`.
    #[serde(default = "defaults::model_type")]
    pub model_type: String,
    /// Every other key of config.json (architectures, transformers_version, sliding_window, ...),
    /// unused here and written back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `eos_token_id` is one id or a list of ids in Hugging Face configs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(u32),
    /// Several ids, any of which ends a sequence.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// transformers' `Qwen2Config` defaults, used for keys missing from config.json.
mod defaults {
    pub fn vocab_size() -> usize {
        151936
    }
    pub fn hidden_size() -> usize {
        4096
    }
    pub fn intermediate_size() -> usize {
        22016
    }
    pub fn num_hidden_layers() -> usize {
        32
    }
    pub fn num_attention_heads() -> usize {
        32
    }
    pub fn num_key_value_heads() -> usize {
        32
    }
    pub fn max_position_embeddings() -> usize {
        32768
    }
    pub fn rms_norm_eps() -> f64 {
        1e-6
    }
    pub fn hidden_act() -> String {
        "silu".into()
    }
    pub fn initializer_range() -> f64 {
        0.02
    }
    pub fn model_type() -> String {
        "qwen2".into()
    }
}

/// A config.json this model cannot run with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not JSON of the expected types (serde_json's message: line and column).
    #[error("{0}")]
    Json(String),
    /// A value is out of range or unsupported, named by its key.
    #[error("{key}: {problem}")]
    Invalid {
        /// The config.json key at fault.
        key: &'static str,
        /// What is wrong with its value.
        problem: String,
    },
}

fn config_error(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
    }
}

impl Qwen2Config {
    /// Parses a config.json text (unknown keys kept in `extra`) and validates it.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let cfg: Self = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The RoPE base: `rope_parameters.rope_theta` (transformers 5), else `rope_theta`
    /// (transformers 4), else transformers' default 10000.
    pub fn rope_base(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .or(self.rope_theta)
            .unwrap_or(10000.0)
    }

    /// Whether q/k/v projections carry a bias (always, for Qwen2, unless `attention_bias` says no).
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(true)
    }

    /// Checks that the model can be built from this config; the error names the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(config_error(key, "must be at least 1, found 0"));
            }
        }
        if self.model_type != "qwen2" {
            return Err(config_error(
                "model_type",
                format!("expected \"qwen2\", found {:?}", self.model_type),
            ));
        }
        match self.head_dim {
            Some(0) => return Err(config_error("head_dim", "must be at least 1, found 0")),
            Some(_) => {}
            None if self.hidden_size % self.num_attention_heads != 0 => {
                return Err(config_error(
                    "hidden_size",
                    format!(
                        "{} is not divisible by num_attention_heads = {}",
                        self.hidden_size, self.num_attention_heads
                    ),
                ))
            }
            None => {}
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(config_error(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if self.head_dim() % 2 != 0 {
            let key = if self.head_dim.is_some() {
                "head_dim"
            } else {
                "hidden_size"
            };
            return Err(config_error(
                key,
                format!(
                    "RoPE needs an even head dimension, found {}",
                    self.head_dim()
                ),
            ));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return Err(config_error(
                "rms_norm_eps",
                format!("must be positive, found {}", self.rms_norm_eps),
            ));
        }
        if self.rope_base().is_nan() || self.rope_base() <= 0.0 {
            let key = match self.rope_parameters {
                Some(_) => "rope_parameters.rope_theta",
                None => "rope_theta",
            };
            return Err(config_error(
                key,
                format!("must be positive, found {}", self.rope_base()),
            ));
        }
        let plain_rope = |v: &serde_json::Value| {
            v.is_null() || v.get("rope_type").and_then(|t| t.as_str()) == Some("default")
        };
        if let Some(scaling) = self.rope_scaling.as_ref().filter(|v| !plain_rope(v)) {
            return Err(config_error(
                "rope_scaling",
                format!("only plain RoPE (null) is supported, found {scaling}"),
            ));
        }
        if let Some(params) = self.rope_parameters.as_ref().filter(|v| !plain_rope(v)) {
            return Err(config_error(
                "rope_parameters",
                format!("only rope_type \"default\" is supported, found {params}"),
            ));
        }
        if self.hidden_act != "silu" {
            return Err(config_error(
                "hidden_act",
                format!("only \"silu\" is supported, found {:?}", self.hidden_act),
            ));
        }
        if self.use_sliding_window {
            return Err(config_error(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        let layer_types = self.extra.get("layer_types").and_then(|v| v.as_array());
        if let Some(other) = layer_types
            .into_iter()
            .flatten()
            .find(|t| t.as_str() != Some("full_attention"))
        {
            return Err(config_error(
                "layer_types",
                format!("only \"full_attention\" layers are supported, found {other}"),
            ));
        }
        Ok(())
    }
}

/// How a weight is laid out and initialised. The checkpoint code transposes `Linear` weights:
/// torch stores them `[out, in]`, burn's `Linear` `[in, out]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WeightKind {
    /// A linear layer's weight, `[out, in]` in the checkpoint, `[in, out]` in burn.
    Linear,
    /// The token embedding `[vocab, hidden]`, the same in both.
    Embedding,
    /// A bias vector (zeros at random initialisation).
    Bias,
    /// An RMSNorm scale (ones at random initialisation).
    Norm,
}

/// Where the weights of a model being built come from: a checkpoint or a random initialisation.
/// Names and shapes are Hugging Face's (torch layout), so one naming scheme (this file's) serves
/// loading, saving and initialisation.
pub(crate) trait WeightSource<B: Backend> {
    /// The error of a missing or malformed tensor.
    type Error;
    /// The tensor `name` of torch shape `shape`, in burn's layout for `kind`.
    fn get<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        kind: WeightKind,
    ) -> Result<Tensor<B, D>, Self::Error>;
}

/// Random weights as transformers initialises Qwen2: normal(0, `initializer_range`) for
/// matrices, zeros for biases, ones for norms.
struct RandomInit<'a, B: Backend> {
    device: &'a B::Device,
    std: f64,
}

impl<B: Backend> WeightSource<B> for RandomInit<'_, B> {
    type Error = std::convert::Infallible;

    fn get<const D: usize>(
        &mut self,
        _name: &str,
        mut shape: [usize; D],
        kind: WeightKind,
    ) -> Result<Tensor<B, D>, Self::Error> {
        if kind == WeightKind::Linear {
            shape.reverse();
        }
        Ok(match kind {
            WeightKind::Linear | WeightKind::Embedding => {
                Tensor::random(shape, Distribution::Normal(0.0, self.std), self.device)
            }
            WeightKind::Bias => Tensor::zeros(shape, self.device),
            WeightKind::Norm => Tensor::ones(shape, self.device),
        })
    }
}

/// Receives every weight of a model, under its Hugging Face name, in burn's layout.
pub(crate) type WeightVisitor<'a> = dyn FnMut(&str, TensorData, WeightKind) + 'a;

fn linear_from<B: Backend, S: WeightSource<B>>(
    src: &mut S,
    name: &str,
    d_in: usize,
    d_out: usize,
    bias: bool,
) -> Result<Linear<B>, S::Error> {
    let weight = src.get(&format!("{name}.weight"), [d_out, d_in], WeightKind::Linear)?;
    let bias = if bias {
        Some(Param::from_tensor(src.get(
            &format!("{name}.bias"),
            [d_out],
            WeightKind::Bias,
        )?))
    } else {
        None
    };
    Ok(Linear {
        weight: Param::from_tensor(weight),
        bias,
    })
}

fn visit_linear<B: Backend>(layer: &Linear<B>, name: &str, f: &mut WeightVisitor<'_>) {
    f(
        &format!("{name}.weight"),
        layer.weight.val().into_data(),
        WeightKind::Linear,
    );
    if let Some(bias) = &layer.bias {
        f(
            &format!("{name}.bias"),
            bias.val().into_data(),
            WeightKind::Bias,
        );
    }
}

/// `a @ b` (batch dimensions broadcast). With `split` and f32 operands, each operand is split
/// into a bf16 head and its f32 remainder and the four partial products are summed: tensor-core
/// kernels that stage f32 through TF32 (burn's CUDA matmuls do, with no switch to turn it off)
/// then hold every product to about f32 accuracy, at four times the matmul work (the 3xTF32
/// technique of CUTLASS, with the small*small term kept). Casting to bf16 needs a backend that
/// has bf16 (CUDA does; NdArray does not, and computes f32 matmuls exactly anyway).
fn mm<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>, split: bool) -> Tensor<B, D> {
    if !split || a.dtype() != DType::F32 {
        return a.matmul(b);
    }
    let head = |x: Tensor<B, D>| x.cast(FloatDType::BF16).cast(FloatDType::F32);
    let (ah, bh) = (head(a.clone()), head(b.clone()));
    let (al, bl) = (a - ah.clone(), b - bh.clone());
    // Smallest terms first.
    al.clone().matmul(bl.clone()) + al.matmul(bh.clone()) + ah.clone().matmul(bl) + ah.matmul(bh)
}

/// `layer(x)`, through [`mm`] when `split`.
fn lin<B: Backend, const D: usize>(
    layer: &Linear<B>,
    x: Tensor<B, D>,
    split: bool,
) -> Tensor<B, D> {
    if !split {
        return layer.forward(x);
    }
    let y = mm(x, layer.weight.val().unsqueeze::<D>(), true);
    match &layer.bias {
        Some(bias) => y + bias.val().unsqueeze::<D>(),
        None => y,
    }
}

/// RMSNorm as transformers computes it: in f32, scaled after casting back.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    weight: Param<Tensor<B, 1>>,
    eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        dim: usize,
        eps: f64,
    ) -> Result<Self, S::Error> {
        let weight = src.get(&format!("{name}.weight"), [dim], WeightKind::Norm)?;
        Ok(Self {
            weight: Param::from_tensor(weight),
            eps,
        })
    }

    fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        f(
            &format!("{name}.weight"),
            self.weight.val().into_data(),
            WeightKind::Norm,
        );
    }

    /// `[.., hidden] -> [.., hidden]`
    fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let x = to_f32(x);
        let inv_rms = (x.clone().square().mean_dim(D - 1) + self.eps)
            .sqrt()
            .recip();
        (x * inv_rms).cast(dtype) * self.weight.val().unsqueeze()
    }
}

/// Casts to f32 unless already f32 (no cast node at all in the f32 path).
fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == DType::F32 {
        x
    } else {
        x.cast(DType::F32)
    }
}

/// The rotary-embedding angles of some positions: `cos` and `sin` of `[rows, 1, t, d]`, each
/// half of the last dimension repeating the other (transformers' `cat(freqs, freqs)`).
struct Rope<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
}

impl<B: Backend> Rope<B> {
    /// `positions` is `rows x t`, row-major. The angles are computed in f32 exactly as
    /// transformers does (`inv_freq` in f32, one f32 product per angle).
    fn new(cfg: &Qwen2Config, positions: &[usize], rows: usize, device: &B::Device) -> Self {
        let d = cfg.head_dim();
        let half = d / 2;
        let theta = cfg.rope_base() as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32))
            .collect();
        let mut cos = Vec::with_capacity(positions.len() * d);
        let mut sin = Vec::with_capacity(positions.len() * d);
        for &p in positions {
            let angles: Vec<f32> = inv_freq.iter().map(|f| p as f32 * f).collect();
            for _ in 0..2 {
                cos.extend(angles.iter().map(|a| a.cos()));
                sin.extend(angles.iter().map(|a| a.sin()));
            }
        }
        let shape = [rows, 1, positions.len() / rows, d];
        Self {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
        }
    }

    /// `[b, heads, t, d] -> [b, heads, t, d]`: `x * cos + rotate_half(x) * sin`.
    fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let half = x.dims()[3] / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

/// Grouped-query self-attention with RoPE; q/k/v with bias, o without.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    /// Split f32 matmuls (see [`Qwen2::set_split_f32_matmul`]).
    split: bool,
}

impl<B: Backend> Attention<B> {
    fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        cfg: &Qwen2Config,
    ) -> Result<Self, S::Error> {
        let (h, kv, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim(),
        );
        let hidden = cfg.hidden_size;
        let bias = cfg.qkv_bias();
        Ok(Self {
            q_proj: linear_from(src, &format!("{name}.q_proj"), hidden, h * d, bias)?,
            k_proj: linear_from(src, &format!("{name}.k_proj"), hidden, kv * d, bias)?,
            v_proj: linear_from(src, &format!("{name}.v_proj"), hidden, kv * d, bias)?,
            o_proj: linear_from(src, &format!("{name}.o_proj"), h * d, hidden, false)?,
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            split: false,
        })
    }

    fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        visit_linear(&self.q_proj, &format!("{name}.q_proj"), f);
        visit_linear(&self.k_proj, &format!("{name}.k_proj"), f);
        visit_linear(&self.v_proj, &format!("{name}.v_proj"), f);
        visit_linear(&self.o_proj, &format!("{name}.o_proj"), f);
    }

    /// `[b, t, hidden] -> q [b, h, t, d], k [b, kv, t, d], v [b, kv, t, d]`, RoPE applied.
    fn qkv(&self, x: Tensor<B, 3>, rope: &Rope<B>) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let [b, t, _] = x.dims();
        let (h, kv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = lin(&self.q_proj, x.clone(), self.split)
            .reshape([b, t, h, d])
            .swap_dims(1, 2);
        let k = lin(&self.k_proj, x.clone(), self.split)
            .reshape([b, t, kv, d])
            .swap_dims(1, 2);
        let v = lin(&self.v_proj, x, self.split)
            .reshape([b, t, kv, d])
            .swap_dims(1, 2);
        (rope.apply(q), rope.apply(k), v)
    }

    /// `q [b, h, t, d]`, `k, v [b, kv, s, d]`, `masked [b|1, 1, t, s]` (true: may not attend)
    /// `-> [b, t, h * d]` after `o_proj`. Query heads are grouped onto their key/value head by a
    /// reshape (transformers' `repeat_kv` without the copy): head `i` reads kv head `i / g`.
    fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        masked: Tensor<B, 4, Bool>,
    ) -> Tensor<B, 3> {
        let [b, h, t, d] = q.dims();
        let (kv, s) = (self.num_kv_heads, k.dims()[2]);
        let g = h / kv;
        let scale = (d as f64).powf(-0.5);
        // [b, kv, g * t, d] @ [b, kv, d, s] -> [b, kv, g * t, s] -> [b, h, t, s]
        let scores = mm(q.reshape([b, kv, g * t, d]), k.swap_dims(2, 3), self.split) * scale;
        let scores = scores.reshape([b, h, t, s]);
        let dtype = scores.dtype();
        let scores = to_f32(scores).mask_fill(masked.expand([b, h, t, s]), f32::NEG_INFINITY);
        let probs = softmax(scores, 3).cast(dtype);
        // [b, kv, g * t, s] @ [b, kv, s, d] -> [b, h, t, d] -> [b, t, h * d]
        let out = mm(probs.reshape([b, kv, g * t, s]), v, self.split).reshape([b, h, t, d]);
        lin(
            &self.o_proj,
            out.swap_dims(1, 2).reshape([b, t, h * d]),
            self.split,
        )
    }

    /// Full causal attention over `x [b, t, hidden]` without a cache.
    fn forward(&self, x: Tensor<B, 3>, rope: &Rope<B>, masked: Tensor<B, 4, Bool>) -> Tensor<B, 3> {
        let (q, k, v) = self.qkv(x, rope);
        self.attend(q, k, v, masked)
    }

    /// Attention of new tokens `x [rows, t, hidden]` over their slots' cached keys and their own:
    /// writes the new keys and values into `kv` first, then attends over the first `plan.keys`
    /// positions of each row's slot.
    fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        plan: &ExtendPlan<B>,
        kv: LayerKv<B>,
    ) -> (Tensor<B, 3>, LayerKv<B>) {
        let (q, k, v) = self.qkv(x, &plan.rope);
        let kv = LayerKv {
            k: plan.write(kv.k, k),
            v: plan.write(kv.v, v),
        };
        // [slots * kv * max_len, d] -> [rows, kv, keys, d]
        let rows = q.dims()[0];
        let shape = [rows, self.num_kv_heads, plan.keys, self.head_dim];
        let keys = |cache: &Tensor<B, 2>| cache.clone().select(0, plan.read.clone()).reshape(shape);
        let out = self.attend(q, keys(&kv.k), keys(&kv.v), plan.masked.clone());
        (out, kv)
    }
}

/// SwiGLU: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    gate_proj: Linear<B>,
    up_proj: Linear<B>,
    down_proj: Linear<B>,
    /// Split f32 matmuls (see [`Qwen2::set_split_f32_matmul`]).
    split: bool,
}

impl<B: Backend> Mlp<B> {
    fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        cfg: &Qwen2Config,
    ) -> Result<Self, S::Error> {
        let (hidden, inter) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            gate_proj: linear_from(src, &format!("{name}.gate_proj"), hidden, inter, false)?,
            up_proj: linear_from(src, &format!("{name}.up_proj"), hidden, inter, false)?,
            down_proj: linear_from(src, &format!("{name}.down_proj"), inter, hidden, false)?,
            split: false,
        })
    }

    fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        visit_linear(&self.gate_proj, &format!("{name}.gate_proj"), f);
        visit_linear(&self.up_proj, &format!("{name}.up_proj"), f);
        visit_linear(&self.down_proj, &format!("{name}.down_proj"), f);
    }

    /// `[b, t, hidden] -> [b, t, hidden]`
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gate = silu(lin(&self.gate_proj, x.clone(), self.split));
        let up = lin(&self.up_proj, x, self.split);
        lin(&self.down_proj, gate * up, self.split)
    }
}

/// Pre-norm decoder layer: `x + attn(norm(x))`, then `h + mlp(norm(h))`.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    self_attn: Attention<B>,
    mlp: Mlp<B>,
    input_layernorm: RmsNorm<B>,
    post_attention_layernorm: RmsNorm<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn new<S: WeightSource<B>>(
        src: &mut S,
        name: &str,
        cfg: &Qwen2Config,
    ) -> Result<Self, S::Error> {
        let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            self_attn: Attention::new(src, &format!("{name}.self_attn"), cfg)?,
            mlp: Mlp::new(src, &format!("{name}.mlp"), cfg)?,
            input_layernorm: RmsNorm::new(src, &format!("{name}.input_layernorm"), hidden, eps)?,
            post_attention_layernorm: RmsNorm::new(
                src,
                &format!("{name}.post_attention_layernorm"),
                hidden,
                eps,
            )?,
        })
    }

    fn visit(&self, name: &str, f: &mut WeightVisitor<'_>) {
        self.self_attn.visit(&format!("{name}.self_attn"), f);
        self.mlp.visit(&format!("{name}.mlp"), f);
        self.input_layernorm
            .visit(&format!("{name}.input_layernorm"), f);
        self.post_attention_layernorm
            .visit(&format!("{name}.post_attention_layernorm"), f);
    }

    /// `[b, t, hidden] -> [b, t, hidden]`, `attn` being the attention path (cached or not).
    fn forward(
        &self,
        x: Tensor<B, 3>,
        attn: impl FnOnce(&Attention<B>, Tensor<B, 3>) -> Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let h = x.clone() + attn(&self.self_attn, self.input_layernorm.forward(x));
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

/// The Qwen2 causal language model (transformers' `Qwen2ForCausalLM`).
#[derive(Module, Debug)]
pub struct Qwen2<B: Backend> {
    embed_tokens: Embedding<B>,
    layers: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Linear<B>>,
    /// The architecture, kept for RoPE and the cache; not a parameter.
    #[module(skip)]
    config: Qwen2Config,
    /// Split f32 matmuls (see [`Qwen2::set_split_f32_matmul`]).
    split: bool,
}

impl<B: Backend> Qwen2<B> {
    /// A randomly initialised model (as transformers initialises one) on `device`.
    pub fn new(cfg: &Qwen2Config, device: &B::Device) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let mut init = RandomInit {
            device,
            std: cfg.initializer_range,
        };
        match Self::from_weights(cfg, &mut init) {
            Ok(model) => Ok(model),
            Err(never) => match never {},
        }
    }

    /// Builds the model from `src` under Hugging Face's names; `cfg` must be valid.
    pub(crate) fn from_weights<S: WeightSource<B>>(
        cfg: &Qwen2Config,
        src: &mut S,
    ) -> Result<Self, S::Error> {
        let (vocab, hidden) = (cfg.vocab_size, cfg.hidden_size);
        let embed = src.get(
            "model.embed_tokens.weight",
            [vocab, hidden],
            WeightKind::Embedding,
        )?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(src, &format!("model.layers.{i}"), cfg))
            .collect::<Result<_, _>>()?;
        let norm = RmsNorm::new(src, "model.norm", hidden, cfg.rms_norm_eps)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(linear_from(src, "lm_head", hidden, vocab, false)?)
        };
        Ok(Self {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm,
            lm_head,
            config: cfg.clone(),
            split: false,
        })
    }

    /// Calls `f` with every weight (Hugging Face name, data in burn's layout, kind), in the
    /// order of the checkpoint's names; `lm_head.weight` only when untied.
    pub(crate) fn visit_weights(&self, f: &mut WeightVisitor<'_>) {
        f(
            "model.embed_tokens.weight",
            self.embed_tokens.weight.val().into_data(),
            WeightKind::Embedding,
        );
        for (i, layer) in self.layers.iter().enumerate() {
            layer.visit(&format!("model.layers.{i}"), f);
        }
        self.norm.visit("model.norm", f);
        if let Some(head) = &self.lm_head {
            visit_linear(head, "lm_head", f);
        }
    }

    /// The architecture this model was built with.
    pub fn config(&self) -> &Qwen2Config {
        &self.config
    }

    /// Computes every f32 matmul as four bf16-split products (see `mm`): about f32 accuracy on
    /// burn's CUDA backend, whose matmuls otherwise round f32 operands to TF32 (10-bit
    /// mantissa; logits move by about 7e-3 on the parity model), at four times the matmul cost.
    /// Off by default; `kevin policy parity` turns it on for f32 on CUDA. No effect in bf16.
    /// Needs a backend with bf16 casts (not NdArray, whose f32 matmuls are exact anyway).
    pub fn set_split_f32_matmul(&mut self, on: bool) {
        self.split = on;
        for layer in &mut self.layers {
            layer.self_attn.split = on;
            layer.mlp.split = on;
        }
    }

    /// `[.., hidden] -> [.., vocab]`
    fn logits<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match &self.lm_head {
            Some(head) => lin(head, x, self.split),
            None if self.split => mm(
                x,
                self.embed_tokens.weight.val().transpose().unsqueeze::<D>(),
                true,
            ),
            None => linear(x, self.embed_tokens.weight.val().transpose(), None),
        }
    }
}

/// `masked [rows, 1, t, s]`: true where key position `k` comes after the query's position, i.e.
/// where a query (at `query_pos [rows, t]`) may not look.
fn causal_mask<B: Backend>(query_pos: Tensor<B, 2, Int>, keys: usize) -> Tensor<B, 4, Bool> {
    let [rows, t] = query_pos.dims();
    let device = query_pos.device();
    let key_pos = Tensor::<B, 1, Int>::arange(0..keys as i64, &device).reshape([1, 1, 1, keys]);
    let query_pos = query_pos.reshape([rows, 1, t, 1]);
    key_pos
        .expand([rows, 1, t, keys])
        .greater(query_pos.expand([rows, 1, t, keys]))
}

/// Keys and values of one layer for every slot, flattened: `[slots * kv * max_len, d]` each
/// (slot-major, then head, then position).
///
/// Flat, so that no step reshapes the whole cache: burn-ndarray copies on every reshape, which
/// made each decoded token copy the cache twice per layer (a 4M-parameter model decoded at
/// minutes per 2048 tokens on a CPU). Writes are an indexed add into it and reads a gather.
///
/// Invariant: positions at or past a slot's length hold zeros, because new entries are written
/// with an indexed *add* (burn 0.21's only indexed update on every backend). `clear_slot`
/// restores the zeros.
#[derive(Debug, Clone)]
struct LayerKv<B: Backend> {
    k: Tensor<B, 2>,
    v: Tensor<B, 2>,
}

/// The KV cache of [`Qwen2`]: fixed slots, each holding one sequence of at most `max_len` tokens.
///
/// `max_len` is the caller's choice and is not bounded by `max_position_embeddings` (RoPE goes on
/// past it; the model was not trained there). Slot indices out of range are an error in
/// `extend` and a panic in `clear_slot` (a caller's bug, not data).
#[derive(Debug, Clone)]
pub struct Qwen2Cache<B: Backend> {
    layers: Vec<LayerKv<B>>,
    /// Tokens held by each slot.
    lens: Vec<usize>,
    max_len: usize,
    /// Whether `extend` rounds its shapes up (see [`Qwen2Cache::set_bucketed`]).
    bucketed: bool,
}

/// Attended keys are rounded up to a multiple of this when shapes are bucketed.
pub const KEY_BUCKET: usize = 128;
/// New tokens per row are rounded up to a multiple of this (prefill only) when bucketed.
pub const TOKEN_BUCKET: usize = 16;

/// True for backends that compile kernels for the shapes they meet (burn's cubecl backends:
/// CUDA, wgpu, ...), where [`Qwen2Cache`] buckets its shapes by default.
pub fn compiles_per_shape<B: Backend>(device: &B::Device) -> bool {
    B::name(device).contains("cubecl")
}

/// `n` rounded up to a multiple of `bucket`, at most `cap` (and at least `n`).
fn round_up(n: usize, bucket: usize, cap: usize) -> usize {
    n.div_ceil(bucket).saturating_mul(bucket).min(cap).max(n)
}

impl<B: Backend> Qwen2Cache<B> {
    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Tokens each slot can hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Tokens held by `slot` (0 when empty).
    pub fn len(&self, slot: usize) -> usize {
        self.lens[slot]
    }

    /// Whether `extend` rounds the shapes it computes with up to a few buckets: attended keys
    /// to a multiple of [`KEY_BUCKET`] (the extra keys are masked), rows to a power of two
    /// (padding rows sit in slots the call does not touch; nothing is written for them and
    /// their logits are dropped) and, when a row brings more than one token, tokens per row to
    /// a multiple of [`TOKEN_BUCKET`] (padding queries, dropped). Results are the same either
    /// way (tested); on a backend that compiles kernels per shape, a decode step then meets a
    /// handful of shapes instead of a new one every token. On by default exactly where
    /// [`compiles_per_shape`].
    pub fn set_bucketed(&mut self, on: bool) {
        self.bucketed = on;
    }

    /// See [`Qwen2Cache::set_bucketed`].
    pub fn bucketed(&self) -> bool {
        self.bucketed
    }
}

/// What every layer of one `extend` call shares: where the new keys go, which slots each row
/// reads, the mask and the RoPE angles.
struct ExtendPlan<B: Backend> {
    /// `[rows * kv * keys]`: the cache rows each row attends, as `[rows, kv, keys]` flattened.
    read: Tensor<B, 1, Int>,
    /// `[written]`: indices into the new keys flattened as `[rows * kv * t, d]`; padding skipped.
    src: Tensor<B, 1, Int>,
    /// `[written]`: where each goes in the cache flattened as `[slots * kv * max_len, d]`.
    dst: Tensor<B, 1, Int>,
    /// Keys attended: the longest slot after the write.
    keys: usize,
    /// `[rows, 1, t, keys]`, true where a query may not look.
    masked: Tensor<B, 4, Bool>,
    rope: Rope<B>,
}

impl<B: Backend> ExtendPlan<B> {
    /// `cache [slots * kv * max_len, d]`, `new [rows, kv, t, d]` -> cache with the new entries.
    fn write(&self, cache: Tensor<B, 2>, new: Tensor<B, 4>) -> Tensor<B, 2> {
        let [rows, kv, t, d] = new.dims();
        let new = new.reshape([rows * kv * t, d]).select(0, self.src.clone());
        cache.select_assign(0, self.dst.clone(), new, IndexingUpdateOp::Add)
    }
}

/// An integer tensor of `shape` from host values (token ids, positions, indices).
pub(crate) fn int_tensor<B: Backend, const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

impl<B: Backend> CausalLm<B> for Qwen2<B> {
    type Cache = Qwen2Cache<B>;

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn device(&self) -> B::Device {
        self.embed_tokens.weight.device()
    }

    fn new_cache(&self, slots: usize, max_len: usize) -> Qwen2Cache<B> {
        let cfg = &self.config;
        let shape = [slots * cfg.num_key_value_heads * max_len, cfg.head_dim()];
        let device = self.device();
        let layers = (0..cfg.num_hidden_layers)
            .map(|_| LayerKv {
                k: Tensor::zeros(shape, &device),
                v: Tensor::zeros(shape, &device),
            })
            .collect();
        Qwen2Cache {
            layers,
            lens: vec![0; slots],
            max_len,
            bucketed: compiles_per_shape::<B>(&device),
        }
    }

    fn extend(
        &self,
        cache: &mut Qwen2Cache<B>,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Tensor<B, 2>, String> {
        let cfg = &self.config;
        if slots.len() != tokens.len() {
            return Err(format!(
                "extend: {} slots for {} token rows",
                slots.len(),
                tokens.len()
            ));
        }
        if slots.is_empty() {
            return Err("extend: no rows".into());
        }
        let mut seen = vec![false; cache.slots()];
        for (row, (&slot, toks)) in slots.iter().zip(tokens).enumerate() {
            if slot >= cache.slots() {
                return Err(format!(
                    "slot {slot} (row {row}): the cache has {} slots",
                    cache.slots()
                ));
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(format!(
                    "slot {slot} (row {row}): appears twice in one extend"
                ));
            }
            if toks.is_empty() {
                return Err(format!("slot {slot} (row {row}): no new tokens"));
            }
            if cache.lens[slot] + toks.len() > cache.max_len {
                return Err(format!(
                    "slot {slot}: {} cached + {} new tokens pass the slot's max_len {}",
                    cache.lens[slot],
                    toks.len(),
                    cache.max_len
                ));
            }
            if let Some(&bad) = toks.iter().find(|&&tok| tok as usize >= cfg.vocab_size) {
                return Err(format!(
                    "slot {slot} (row {row}): token {bad} is outside the vocabulary of {}",
                    cfg.vocab_size
                ));
            }
        }

        let device = self.device();
        let real_rows = slots.len();
        let (kv, max_len) = (cfg.num_key_value_heads, cache.max_len);
        let mut t = tokens.iter().map(Vec::len).max().unwrap_or(1);
        let mut keys = slots
            .iter()
            .zip(tokens)
            .map(|(&s, toks)| cache.lens[s] + toks.len())
            .max()
            .unwrap_or(1);
        // Padding rows (bucketed shapes only): one query each, in a slot this call does not
        // touch, at that slot's length; nothing is written for them and their logits dropped.
        let mut all_slots = slots.to_vec();
        if cache.bucketed {
            let rows = real_rows.next_power_of_two().min(cache.slots());
            all_slots.extend(
                (0..cache.slots())
                    .filter(|&s| !seen[s])
                    .take(rows - real_rows),
            );
            if t > 1 {
                t = round_up(t, TOKEN_BUCKET, usize::MAX);
            }
            keys = round_up(keys, KEY_BUCKET, max_len);
        }
        let rows = all_slots.len();
        // Rows are right-padded to `t` with token 0; a padded query sits at the position after
        // its row's last token, sees only keys up to there (never a fully masked row, so no NaN)
        // and its output is dropped. Real queries never see a padded key: it comes after them.
        let mut ids = Vec::with_capacity(rows * t);
        let mut positions = Vec::with_capacity(rows * t);
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for (row, &slot) in all_slots.iter().enumerate() {
            let toks: &[u32] = tokens.get(row).map_or(&[], Vec::as_slice);
            let start = cache.lens[slot];
            for j in 0..t {
                ids.push(toks.get(j).map_or(0, |&tok| tok as i64));
                positions.push(start + j);
            }
            for head in 0..kv {
                for j in 0..toks.len() {
                    src.push(((row * kv + head) * t + j) as i64);
                    dst.push(((slot * kv + head) * max_len + start + j) as i64);
                }
            }
        }
        let written = src.len();
        let query_pos = int_tensor::<B, 2>(
            positions.iter().map(|&p| p as i64).collect(),
            [rows, t],
            &device,
        );
        // Cache row of (row, head, key) = (slot * kv + head) * max_len + key: each (row, head)'s
        // base plus 0..keys, added on the device.
        let bases = all_slots
            .iter()
            .flat_map(|&slot| (0..kv).map(move |head| ((slot * kv + head) * max_len) as i64))
            .collect();
        let read = int_tensor::<B, 2>(bases, [rows * kv, 1], &device)
            + Tensor::<B, 1, Int>::arange(0..keys as i64, &device).reshape([1, keys]);
        let plan = ExtendPlan {
            read: read.reshape([rows * kv * keys]),
            src: int_tensor(src, [written], &device),
            dst: int_tensor(dst, [written], &device),
            keys,
            masked: causal_mask(query_pos, keys),
            rope: Rope::new(cfg, &positions, rows, &device),
        };

        let mut x = self
            .embed_tokens
            .forward(int_tensor(ids, [rows, t], &device));
        let old = std::mem::take(&mut cache.layers);
        for (layer, kv) in self.layers.iter().zip(old) {
            let mut updated = None;
            x = layer.forward(x, |attn, x| {
                let (out, kv) = attn.forward_cached(x, &plan, kv);
                updated = Some(kv);
                out
            });
            cache.layers.extend(updated);
        }
        for (&slot, toks) in slots.iter().zip(tokens) {
            cache.lens[slot] += toks.len();
        }

        // The hidden state of each real row's last token: [rows * t, hidden] -> [real, hidden].
        let last: Vec<i64> = tokens
            .iter()
            .enumerate()
            .map(|(row, toks)| (row * t + toks.len() - 1) as i64)
            .collect();
        let [_, _, hidden] = x.dims();
        let x = x
            .reshape([rows * t, hidden])
            .select(0, int_tensor(last, [real_rows], &device));
        Ok(to_f32(self.logits(self.norm.forward(x))))
    }

    fn clear_slot(&self, cache: &mut Qwen2Cache<B>, slot: usize) {
        let len = std::mem::replace(&mut cache.lens[slot], 0);
        if len == 0 {
            return;
        }
        // Restore the zeros that the indexed-add write relies on (see `LayerKv`): the first
        // `len` positions of each of the slot's heads. The tensors are moved, not cloned, so a
        // backend may fill them in place.
        let (kv, max_len) = (self.config.num_key_value_heads, cache.max_len);
        let d = self.config.head_dim();
        cache.layers = std::mem::take(&mut cache.layers)
            .into_iter()
            .map(|mut layer| {
                for head in 0..kv {
                    let start = (slot * kv + head) * max_len;
                    let region = [start..start + len, 0..d];
                    layer.k = layer.k.slice_fill(region.clone(), 0.0);
                    layer.v = layer.v.slice_fill(region, 0.0);
                }
                layer
            })
            .collect();
    }

    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let device = tokens.device();
        let positions: Vec<usize> = (0..t).collect();
        let rope = Rope::new(&self.config, &positions, 1, &device);
        let query_pos = Tensor::<B, 1, Int>::arange(0..t as i64, &device).reshape([1, t]);
        let masked = causal_mask(query_pos, t);
        let mut x = self.embed_tokens.forward(tokens);
        for layer in &self.layers {
            x = layer.forward(x, |attn, x| attn.forward(x, &rope, masked.clone()));
        }
        debug_assert_eq!(x.dims()[0], b);
        self.logits(self.norm.forward(x))
    }
}
