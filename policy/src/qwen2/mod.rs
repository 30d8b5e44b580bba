//! The Qwen2 decoder (Hugging Face's `Qwen2ForCausalLM`) in burn, one model in one file as
//! candle writes them: the config.json struct, small modules each with `new` and a short
//! `forward`, and an explicit KV cache of fixed slots for batched generation.
//!
//! Shapes in comments use `b` batch rows, `t` new tokens, `s` attended keys, `h` query heads,
//! `kv` key/value heads, `d` head dimension, `g = h / kv` query heads per key/value head.
//!
//! Numerics follow transformers' eager code so that logits match it: RMSNorm in f32 and cast
//! back, RoPE tables computed in f32 with the `rotate_half` convention, softmax in f32.
//!
//! Files: `config` (the `config.json` struct and its checks), `weights` (Hugging Face weight
//! names, [`WeightSource`] and the visitor that saving uses), `layers` (RMSNorm, RoPE,
//! attention, MLP, decoder layer), `cache` (the KV cache of fixed slots), `model` ([`Qwen2`] and
//! its [`crate::CausalLm`] implementation), `fused` (the cached pass on burn's CUDA backend as
//! one backend extension: own kernels and cuBLAS; `fused.cu`). Everything public is re-exported here; callers use
//! `kevin_policy::qwen2::X`, never the submodules. This module imports only burn (and, for `fused`,
//! burn's CUDA backend layers, cudarc and kevin's NVRTC and cuBLAS wrappers), serde and the
//! crate's `CausalLm` trait: nothing from the sampler, the learner, training or checkpoints
//! (they build on it, not the other way round).

mod cache;
mod config;
pub mod fused;
mod layers;
mod model;
mod weights;

pub(crate) use cache::int_tensor;
pub use cache::{compiles_per_shape, Qwen2Cache, KEY_BUCKET, TOKEN_BUCKET};
pub use config::{ConfigError, Qwen2Config, TokenIds};
pub use layers::{Attention, DecoderLayer, Mlp, RmsNorm};
pub use model::Qwen2;
pub(crate) use weights::{WeightKind, WeightSource};

/// The float dtype of backend `B` (`B::FloatElem`), named where a model's tensors are made.
///
/// burn 0.21 otherwise takes the dtype from a per-device default that the first tensor made on
/// the device fixes for the whole process, whatever the backend type: `Cuda<f32>` and
/// `Cuda<bf16>` share `CudaDevice`. A process that made an f32 tensor first (a test binary
/// running f32 before bf16) then built "bf16" models in f32 without a word.
pub(crate) fn float_dtype<B: burn::tensor::backend::Backend>() -> burn::tensor::DType {
    <B::FloatElem as burn::tensor::Element>::dtype()
}
