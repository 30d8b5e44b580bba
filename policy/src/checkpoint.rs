//! Hugging Face checkpoint directories: `config.json` and `model.safetensors` (or shards listed
//! by `model.safetensors.index.json`), read into a [`Qwen2`] on any backend and written back so
//! that transformers' `from_pretrained` opens them.
//!
//! Tensors keep Hugging Face's names and torch's layout on disk; the one layout difference,
//! `Linear` weights (`[out, in]` in torch, `[in, out]` in burn), is transposed here, on the host,
//! so that parameters arrive on the device contiguous. f32, f16 and bf16 are read; f32 or bf16
//! is written. Copying `tokenizer.json` is the caller's business.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors, View};

use crate::qwen2::{ConfigError, Qwen2, Qwen2Config, WeightKind, WeightSource};

/// The file names transformers uses.
const CONFIG_FILE: &str = "config.json";
const WEIGHTS_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// The dtype tensors are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    /// 32-bit floats: a bit-exact copy of an f32 model.
    F32,
    /// bfloat16 (round to nearest even): half the size, what Qwen2 checkpoints ship in.
    Bf16,
}

impl SaveDtype {
    fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::Bf16 => "bfloat16",
        }
    }
}

/// What went wrong reading or writing a checkpoint; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A JSON file (config or shard index) does not parse.
    #[error("{path}: {message}", path = path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's message (with line and column).
        message: String,
    },
    /// config.json parses but describes a model this crate cannot build.
    #[error("{path}: {source}", path = path.display())]
    Config {
        /// The config file.
        path: PathBuf,
        /// The bad key and why.
        source: ConfigError,
    },
    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{dir}: no {WEIGHTS_FILE} or {INDEX_FILE}", dir = dir.display())]
    NoWeights {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A safetensors file is malformed.
    #[error("{path}: {message}", path = path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The safetensors crate's message.
        message: String,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("{path}: missing tensor {name}", path = path.display())]
    MissingTensor {
        /// The weights file (or shard index) searched.
        path: PathBuf,
        /// Hugging Face's name of the tensor.
        name: String,
    },
    /// A tensor's shape is not the one config.json implies.
    #[error("{path}: {name}: expected {expected:?}, found {found:?}", path = path.display())]
    Shape {
        /// The file holding the tensor.
        path: PathBuf,
        /// Hugging Face's name of the tensor.
        name: String,
        /// The shape the config implies (torch layout).
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype this loader does not read.
    #[error("{path}: {name}: dtype {dtype} is not supported (F32, F16 and BF16 are)", path = path.display())]
    Dtype {
        /// The file holding the tensor.
        path: PathBuf,
        /// Hugging Face's name of the tensor.
        name: String,
        /// The stored dtype.
        dtype: String,
    },
    /// `save` was given a config that does not describe the model.
    #[error("{dir}: config key {key} is {config} but the model has {model}", dir = dir.display())]
    ConfigMismatch {
        /// The directory being written.
        dir: PathBuf,
        /// The config key that differs.
        key: &'static str,
        /// Its value in the given config.
        config: String,
        /// The model's value.
        model: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads `dir/config.json`, validated.
pub fn load_config(dir: &Path) -> Result<Qwen2Config, CheckpointError> {
    let path = dir.join(CONFIG_FILE);
    let text = fs::read_to_string(&path).map_err(io_error(&path))?;
    Qwen2Config::from_json(&text).map_err(|e| match e {
        ConfigError::Json(message) => CheckpointError::Json { path, message },
        source => CheckpointError::Config { path, source },
    })
}

/// Loads a Hugging Face Qwen2 directory (config.json + model.safetensors, or shards) onto
/// `device`.
pub fn load<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(Qwen2<B>, Qwen2Config), CheckpointError> {
    let cfg = load_config(dir)?;
    let mut source = CheckpointSource::<B>::read(dir, device)?;
    let model = Qwen2::from_weights(&cfg, &mut source)?;
    for name in source.tensors.keys() {
        // transformers ignores these too (a tied lm_head, rotary buffers of old exports).
        tracing::debug!(dir = %dir.display(), tensor = %name, "unused checkpoint tensor");
    }
    Ok((model, cfg))
}

/// A tensor read from a file, in torch layout, in its stored dtype (converted to the backend's
/// float type on upload, so a bf16 checkpoint on a bf16 backend is never widened).
struct Stored {
    file: PathBuf,
    shape: Vec<usize>,
    data: Result<TensorData, Dtype>,
}

/// The tensors of a checkpoint directory, handed out once each to the model being built.
struct CheckpointSource<'a, B: Backend> {
    device: &'a B::Device,
    tensors: HashMap<String, Stored>,
    /// Named in "missing tensor" errors: the weights file, or the index of a sharded checkpoint.
    listing: PathBuf,
}

impl<'a, B: Backend> CheckpointSource<'a, B> {
    fn read(dir: &Path, device: &'a B::Device) -> Result<Self, CheckpointError> {
        let single = dir.join(WEIGHTS_FILE);
        let index = dir.join(INDEX_FILE);
        let (files, listing) = if single.is_file() {
            (vec![single.clone()], single)
        } else if index.is_file() {
            (shard_files(dir, &index)?, index)
        } else {
            return Err(CheckpointError::NoWeights {
                dir: dir.to_path_buf(),
            });
        };
        let mut tensors = HashMap::new();
        // One file in memory at a time; the decoded tensors are all that stays.
        for file in files {
            let bytes = fs::read(&file).map_err(io_error(&file))?;
            let st =
                SafeTensors::deserialize(&bytes).map_err(|e| CheckpointError::Safetensors {
                    path: file.clone(),
                    message: e.to_string(),
                })?;
            for (name, view) in st.iter() {
                let shape = view.shape().to_vec();
                let data = decode(view.dtype(), view.data(), &shape);
                tensors.insert(
                    name.to_string(),
                    Stored {
                        file: file.clone(),
                        shape,
                        data,
                    },
                );
            }
        }
        Ok(Self {
            device,
            tensors,
            listing,
        })
    }
}

/// The shard files named by `model.safetensors.index.json`'s `weight_map`, each once.
fn shard_files(dir: &Path, index: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let text = fs::read_to_string(index).map_err(io_error(index))?;
    let parsed: Index = serde_json::from_str(&text).map_err(|e| CheckpointError::Json {
        path: index.to_path_buf(),
        message: e.to_string(),
    })?;
    let names: BTreeSet<String> = parsed.weight_map.into_values().collect();
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}

/// Little-endian bytes of a float dtype -> TensorData of that dtype; other dtypes are kept as
/// an error for the loader to report if the model asks for that tensor.
pub(crate) fn decode(dtype: Dtype, bytes: &[u8], shape: &[usize]) -> Result<TensorData, Dtype> {
    Ok(match dtype {
        Dtype::F32 => TensorData::new(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>(),
            shape.to_vec(),
        ),
        Dtype::BF16 => TensorData::new(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect::<Vec<_>>(),
            shape.to_vec(),
        ),
        Dtype::F16 => TensorData::new(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect::<Vec<_>>(),
            shape.to_vec(),
        ),
        other => return Err(other),
    })
}

/// `[rows, cols]` row-major -> `[cols, rows]` row-major.
fn transpose<T: Copy>(values: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(values.len());
    for c in 0..cols {
        out.extend((0..rows).map(|r| values[r * cols + c]));
    }
    out
}

/// Transposes a 2-d TensorData of any float dtype this module handles.
fn transpose_data(data: TensorData) -> TensorData {
    let [rows, cols] = [data.shape[0], data.shape[1]];
    macro_rules! typed {
        ($t:ty) => {
            TensorData::new(
                transpose(data.as_slice::<$t>().expect("dtype checked"), rows, cols),
                [cols, rows],
            )
        };
    }
    match data.dtype {
        burn::tensor::DType::F32 => typed!(f32),
        burn::tensor::DType::BF16 => typed!(bf16),
        burn::tensor::DType::F16 => typed!(f16),
        burn::tensor::DType::F64 => typed!(f64),
        other => unreachable!("checkpoint tensors are floats, found {other:?}"),
    }
}

impl<B: Backend> WeightSource<B> for CheckpointSource<'_, B> {
    type Error = CheckpointError;

    fn get<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        kind: WeightKind,
    ) -> Result<Tensor<B, D>, CheckpointError> {
        let stored = self
            .tensors
            .remove(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                path: self.listing.clone(),
                name: name.to_string(),
            })?;
        if stored.shape != shape {
            return Err(CheckpointError::Shape {
                path: stored.file,
                name: name.to_string(),
                expected: shape.to_vec(),
                found: stored.shape,
            });
        }
        let data = stored.data.map_err(|dtype| CheckpointError::Dtype {
            path: stored.file.clone(),
            name: name.to_string(),
            dtype: format!("{dtype:?}"),
        })?;
        let data = if kind == WeightKind::Linear {
            transpose_data(data)
        } else {
            data
        };
        Ok(Tensor::from_data(
            data,
            (self.device, crate::qwen2::float_dtype::<B>()),
        ))
    }
}

/// A tensor ready to be written: torch layout, encoded bytes.
pub(crate) struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn encode(data: TensorData, kind: WeightKind, dtype: SaveDtype) -> Encoded {
    let data = data.convert::<f32>();
    let mut shape = data.shape.to_vec();
    let values = data.into_vec::<f32>().expect("converted to f32");
    let values = if kind == WeightKind::Linear {
        let [rows, cols] = [shape[0], shape[1]];
        shape.reverse();
        transpose(&values, rows, cols)
    } else {
        values
    };
    encoded(&values, shape, dtype)
}

/// `values` of `shape` (row-major) as safetensors bytes in `dtype`.
pub(crate) fn encoded(values: &[f32], shape: Vec<usize>, dtype: SaveDtype) -> Encoded {
    let (dtype, bytes) = match dtype {
        SaveDtype::F32 => (
            Dtype::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        SaveDtype::Bf16 => (
            Dtype::BF16,
            values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        ),
    };
    Encoded {
        dtype,
        shape,
        bytes,
    }
}

/// Checks that `cfg` describes `model`'s architecture, key by key.
fn check_same_architecture(
    dir: &Path,
    cfg: &Qwen2Config,
    model: &Qwen2Config,
) -> Result<(), CheckpointError> {
    let keys: [(&'static str, String, String); 9] = [
        (
            "vocab_size",
            cfg.vocab_size.to_string(),
            model.vocab_size.to_string(),
        ),
        (
            "hidden_size",
            cfg.hidden_size.to_string(),
            model.hidden_size.to_string(),
        ),
        (
            "intermediate_size",
            cfg.intermediate_size.to_string(),
            model.intermediate_size.to_string(),
        ),
        (
            "num_hidden_layers",
            cfg.num_hidden_layers.to_string(),
            model.num_hidden_layers.to_string(),
        ),
        (
            "num_attention_heads",
            cfg.num_attention_heads.to_string(),
            model.num_attention_heads.to_string(),
        ),
        (
            "num_key_value_heads",
            cfg.num_key_value_heads.to_string(),
            model.num_key_value_heads.to_string(),
        ),
        (
            "head_dim",
            cfg.head_dim().to_string(),
            model.head_dim().to_string(),
        ),
        (
            "tie_word_embeddings",
            cfg.tie_word_embeddings.to_string(),
            model.tie_word_embeddings.to_string(),
        ),
        (
            "attention_bias",
            cfg.qkv_bias().to_string(),
            model.qkv_bias().to_string(),
        ),
    ];
    for (key, config, model) in keys {
        if config != model {
            return Err(CheckpointError::ConfigMismatch {
                dir: dir.to_path_buf(),
                key,
                config,
                model,
            });
        }
    }
    Ok(())
}

/// Writes `model` as a Hugging Face directory: `config.json` (`cfg`, with `torch_dtype` set to
/// `dtype`) and `model.safetensors` (tensors in `dtype`, `lm_head.weight` only when untied).
/// Each file is written under a temporary name and renamed, so a crash leaves no torn file.
pub fn save<B: Backend>(
    model: &Qwen2<B>,
    cfg: &Qwen2Config,
    dir: &Path,
    dtype: SaveDtype,
) -> Result<(), CheckpointError> {
    cfg.validate().map_err(|source| CheckpointError::Config {
        path: dir.join(CONFIG_FILE),
        source,
    })?;
    check_same_architecture(dir, cfg, model.config())?;
    fs::create_dir_all(dir).map_err(io_error(dir))?;

    let mut tensors: Vec<(String, Encoded)> = Vec::new();
    model.visit_weights(&mut |name, data, kind| {
        tensors.push((name.to_string(), encode(data, kind, dtype)));
    });
    let weights = dir.join(WEIGHTS_FILE);
    let tmp = dir.join(format!("{WEIGHTS_FILE}.tmp"));
    // transformers refuses a safetensors file without `format` metadata.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(
        tensors.iter().map(|(name, t)| (name.as_str(), t)),
        Some(metadata),
        &tmp,
    )
    .map_err(|e| CheckpointError::Safetensors {
        path: tmp.clone(),
        message: e.to_string(),
    })?;
    fs::rename(&tmp, &weights).map_err(io_error(&weights))?;

    let mut cfg = cfg.clone();
    cfg.torch_dtype = Some(dtype.torch_name().to_string());
    // Newer transformers write `dtype` instead of `torch_dtype`; keep both in step.
    if let Some(value) = cfg.extra.get_mut("dtype") {
        *value = serde_json::Value::String(dtype.torch_name().to_string());
    }
    let path = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(&cfg).expect("a config serialises");
    let tmp = dir.join(format!("{CONFIG_FILE}.tmp"));
    fs::write(&tmp, text + "\n").map_err(io_error(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_error(&path))?;
    Ok(())
}
