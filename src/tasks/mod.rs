//! The task suite: one TOML file per task under `tasks/` (format in `tasks/README.md`), each a
//! small op-language program ([`crate::ops`]) with size presets, input distributions and a
//! tolerance. [`TaskSuite::load`] reads and validates a directory; a [`Task`] then gives what the
//! rest of kevin needs: the signature of its tensors, deterministic inputs, the fp64 reference
//! outputs, the PyTorch module for the prompt and a rough GPU baseline estimate.
//!
//! Invariant: tasks of the [`Split::Heldout`] split are for evaluation only; samplers of training
//! tasks go through [`TaskSuite::split`] with [`Split::Train`].
//!
//! Dependency direction: this folder imports only `ops` and `candidate` (signatures); everything
//! that evaluates or trains on a task imports it, and it may import none of them.

mod estimate;
pub mod file;
mod inputs;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ops::interp::{self, InterpError};
use crate::ops::torch::{render_module_with, torch_dtype, RenderError};
use crate::ops::{Dtype, Program, Sizes};

pub use estimate::baseline_ms as estimate_baseline_ms;
pub use file::parse_task;
pub use inputs::InputDist;

/// Which tasks a task may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Sampled for training.
    Train,
    /// Evaluation only; never sampled for training.
    Heldout,
}

/// A size preset of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// Sizes for timing on a GPU (op-by-op baseline of at least 0.1 ms on an H200).
    Gpu,
    /// Tiny sizes for CPU runs and tests.
    Small,
}

impl Preset {
    /// Both presets, the small one first.
    pub const ALL: [Preset; 2] = [Preset::Small, Preset::Gpu];

    /// "gpu" or "small", as configs and file names spell a preset.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Gpu => "gpu",
            Preset::Small => "small",
        }
    }
}

/// Comparison tolerance: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Tolerance {
    /// The default for a dtype: fp32 1e-4, fp16/bf16 1e-2 (i64 compares exactly, tolerance 0).
    pub fn for_dtype(d: Dtype) -> Tolerance {
        let t = match d {
            Dtype::F32 => 1e-4,
            Dtype::F16 | Dtype::Bf16 => 1e-2,
            Dtype::I64 => 0.0,
        };
        Tolerance { atol: t, rtol: t }
    }
}

/// Whether a tensor of a signature is read or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An input, read-only for a kernel.
    Input,
    /// An output, written by a kernel.
    Output,
}

/// One tensor of a task's signature at a preset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name as in the program.
    pub name: String,
    /// Input or output.
    pub role: Role,
    /// Element type.
    pub dtype: Dtype,
    /// Concrete shape at the preset.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The tensors of a task (inputs then outputs, in declaration order) and its size symbols, at one
/// preset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Size symbols and their values, in order of first appearance.
    pub sizes: Vec<(String, usize)>,
    /// Inputs then outputs.
    pub tensors: Vec<TensorSpec>,
}

/// A validated task.
#[derive(Clone, Debug)]
pub struct Task {
    /// Unique name; equals the file stem.
    pub name: String,
    /// KernelBench level: 1 (single operator) or 2 (fused sequence).
    pub level: u8,
    /// Training or held-out.
    pub split: Split,
    /// One-line description.
    pub description: String,
    /// The program source, as written in the file.
    pub source: String,
    /// The parsed and checked program.
    pub program: Program,
    /// Sizes for the GPU preset.
    pub gpu_sizes: Sizes,
    /// Sizes for the small preset.
    pub small_sizes: Sizes,
    /// Distribution of each input, in the program's input order.
    pub inputs: Vec<InputDist>,
    /// Tolerance used to compare outputs with the reference.
    pub tolerance: Tolerance,
    /// The file it was loaded from.
    pub path: PathBuf,
}

impl Task {
    /// The sizes of a preset.
    pub fn sizes(&self, preset: Preset) -> &Sizes {
        match preset {
            Preset::Gpu => &self.gpu_sizes,
            Preset::Small => &self.small_sizes,
        }
    }

    /// The signature the candidate validator checks launch plans against, at `preset`.
    pub fn candidate_signature(&self, preset: Preset) -> crate::candidate::TaskSignature {
        use crate::candidate::{Dtype as C, TaskSignature, TensorParam};
        let sig = self.signature(preset);
        TaskSignature {
            tensors: sig
                .tensors
                .iter()
                .map(|t| TensorParam {
                    name: t.name.clone(),
                    dtype: match t.dtype {
                        Dtype::F32 => C::F32,
                        Dtype::F16 => C::F16,
                        Dtype::Bf16 => C::Bf16,
                        Dtype::I64 => C::I64,
                    },
                    elems: t.shape.iter().product::<usize>() as u64,
                    is_output: t.role == Role::Output,
                })
                .collect(),
            eager_intermediate_bytes: estimate::intermediate_bytes(
                &self.program,
                self.sizes(preset),
            ),
            sizes: sig.sizes.into_iter().map(|(k, v)| (k, v as i64)).collect(),
        }
    }

    /// Inputs then outputs with dtypes and concrete shapes, plus the size symbols, at `preset`.
    pub fn signature(&self, preset: Preset) -> Signature {
        let sizes = self.sizes(preset);
        let syms = self.program.size_symbols();
        let sizes_list = syms
            .iter()
            .map(|s| (s.clone(), sizes.get(s).copied().unwrap_or(0)))
            .collect();
        let decls = self.program.inputs.iter().map(|d| (d, Role::Input));
        let decls = decls.chain(self.program.outputs.iter().map(|d| (d, Role::Output)));
        let tensors = decls
            .map(|(d, role)| TensorSpec {
                name: d.name.clone(),
                role,
                dtype: d.ty.dtype,
                // Validation guarantees every symbol has a value in both presets.
                shape: d
                    .ty
                    .shape
                    .iter()
                    .map(|dim| dim.resolve(sizes).unwrap_or(0))
                    .collect(),
            })
            .collect();
        Signature {
            sizes: sizes_list,
            tensors,
        }
    }

    /// Rough time of the op-by-op (PyTorch eager) baseline at the GPU preset on an H200, in
    /// milliseconds; see `estimate.rs` for the model.
    pub fn estimate_gpu_baseline_ms(&self) -> f64 {
        estimate::baseline_ms(&self.program, &self.gpu_sizes)
    }

    /// Deterministic inputs for `preset` from `seed`, one row-major vector per input, already
    /// rounded to each input's dtype.
    pub fn generate_inputs(&self, preset: Preset, seed: u64) -> Vec<Vec<f64>> {
        inputs::generate(&self.program, &self.inputs, self.sizes(preset), seed)
    }

    /// Reference outputs (fp64, unrounded) for `inputs` at `preset`.
    pub fn reference(
        &self,
        preset: Preset,
        inputs: &[Vec<f64>],
    ) -> Result<Vec<Vec<f64>>, InterpError> {
        let outs = interp::run(&self.program, self.sizes(preset), inputs)?;
        Ok(outs.into_iter().map(|t| t.data).collect())
    }

    /// The equivalent PyTorch module (KernelBench style) with the sizes of `preset`, the
    /// description as its docstring, and `get_inputs()` drawing from each input's distribution.
    pub fn torch_module(&self, preset: Preset) -> Result<String, RenderError> {
        let init = |d: &crate::ops::Decl, dims: &str| {
            let i = self.program.inputs.iter().position(|x| x.name == d.name)?;
            self.inputs
                .get(i)
                .and_then(|dist| dist.torch_expr(dims, torch_dtype(d.ty.dtype)))
        };
        render_module_with(
            &self.program,
            self.sizes(preset),
            Some(&self.description),
            &init,
        )
    }
}

/// Why a task directory or file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid TOML or does not match the task format.
    #[error("{}: {message}", file.display())]
    Toml {
        /// The file.
        file: PathBuf,
        /// The decoder's message (it names the offending key).
        message: String,
    },
    /// A key has an invalid value.
    #[error("{}: key `{key}`: {message}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The dotted key, e.g. `sizes.gpu.M`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The directory has no task files.
    #[error("no task files (*.toml) in {}", dir.display())]
    Empty {
        /// The directory.
        dir: PathBuf,
    },
}

/// The folders of a suite path: one folder, or several joined like `PATH` (`:` on Unix), so
/// that `[tasks] dir`, `--dir` and the path handed to worker processes can name the hand-written
/// suite and generated folders together. Empty parts are skipped.
pub fn suite_dirs(dir: &Path) -> Vec<PathBuf> {
    std::env::split_paths(dir.as_os_str())
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

/// A suite path with every folder made absolute, for processes that start elsewhere; the error
/// names the folder that does not resolve.
pub fn canonical_suite_path(dir: &Path) -> Result<PathBuf, String> {
    let dirs = suite_dirs(dir)
        .into_iter()
        .map(|d| {
            d.canonicalize()
                .map_err(|e| format!("{}: {e}", d.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if dirs.is_empty() {
        return Err(format!("{:?}: names no folder", dir.display().to_string()));
    }
    std::env::join_paths(dirs)
        .map(PathBuf::from)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// All tasks of a directory (or of several, [`suite_dirs`]), sorted by name.
#[derive(Clone, Debug)]
pub struct TaskSuite {
    tasks: Vec<Task>,
}

impl TaskSuite {
    /// Loads every `*.toml` file of `dir` (not recursively) as a task. `dir` may name several
    /// folders joined like `PATH` ([`suite_dirs`]: `tasks:/data/generated`); each must hold a
    /// task, and a name defined in two of them is an error.
    pub fn load(dir: impl AsRef<Path>) -> Result<TaskSuite, TaskError> {
        let mut paths = Vec::new();
        for dir in suite_dirs(dir.as_ref()) {
            let io = |source| TaskError::Io {
                path: dir.clone(),
                source,
            };
            let before = paths.len();
            for entry in std::fs::read_dir(&dir).map_err(io)? {
                let path = entry.map_err(io)?.path();
                if path.extension().is_some_and(|e| e == "toml") {
                    paths.push(path);
                }
            }
            if paths.len() == before {
                return Err(TaskError::Empty { dir });
            }
        }
        paths.sort();
        let mut tasks: Vec<Task> = Vec::with_capacity(paths.len());
        let mut by_name: BTreeMap<String, PathBuf> = BTreeMap::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|source| TaskError::Io {
                path: path.clone(),
                source,
            })?;
            let task = file::parse_task(&path, &text)?;
            if let Some(other) = by_name.insert(task.name.clone(), path.clone()) {
                let message = format!(
                    "task `{}` is also defined in {}",
                    task.name,
                    other.display()
                );
                return Err(TaskError::Invalid {
                    file: path,
                    key: "name".into(),
                    message,
                });
            }
            tasks.push(task);
        }
        tasks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(TaskSuite { tasks })
    }

    /// Every task, sorted by name.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// The task called `name`.
    pub fn get(&self, name: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.name == name)
    }

    /// The tasks of one split.
    pub fn split(&self, split: Split) -> impl Iterator<Item = &Task> {
        self.tasks.iter().filter(move |t| t.split == split)
    }

    /// The tasks of one level.
    pub fn level(&self, level: u8) -> impl Iterator<Item = &Task> {
        self.tasks.iter().filter(move |t| t.level == level)
    }
}
