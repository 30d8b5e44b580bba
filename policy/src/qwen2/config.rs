//! The Hugging Face `config.json` of a Qwen2 model: the struct, transformers' defaults and the
//! checks a model this crate can build must pass.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
