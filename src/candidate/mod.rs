//! Candidates: what a policy's response becomes before anything touches a GPU.
//!
//! A response is free reasoning, then one ```` ```cuda ```` block of device code only, then a
//! one-paragraph summary. Launches are declared in `// kevin:` comments inside the block, so the
//! block stays valid CUDA:
//!
//! ```text
//! // kevin: scratch T f32[M*N]
//! // kevin: launch gemm_bias grid=(cdiv(N,64), cdiv(M,64)) block=(16,16) smem=0 args=(A, W, b, T, M, N, K)
//! // kevin: launch relu_inplace grid=(cdiv(M*N,256)) block=(256) args=(T, Y, M*N)
//! ```
//!
//! Two steps, both pure functions whose failures are data ([`CandidateError`], whose `Display`
//! is the feedback the next turn sees):
//!
//! 1. [`parse_response`] extracts the block and the summary ([`extract`]) and parses the launch
//!    plan ([`plan`]) into a [`Candidate`] with unevaluated expressions. It needs no task.
//! 2. [`validate()`] checks the candidate against a task ([`TaskSignature`]) and [`Limits`]: the
//!    source size, the static rules ([`rules`]: no host code, no timer reads, an `#include`
//!    allowlist), the `__global__` signatures of the launched kernels ([`signature`]), and every
//!    launch's dimensions and arguments. It returns a [`ResolvedPlan`]: numbers, indices and
//!    typed scalars that a worker can launch without parsing anything.
//!
//! Invariant: nothing here panics on any input, and every step is linear (or close) in the
//! input's length, with recursion bounded by [`expr::MAX_DEPTH`]. The fuzz test in
//! `tests/fuzz.rs` holds it to that.
//!
//! Dependency direction: this folder imports nothing else of the crate; the environments, the
//! devices, the protocol, the turn step and the corpus import it.

pub mod error;
pub mod expr;
pub mod extract;
mod host_fns;
pub(crate) mod lex;
pub mod plan;
pub mod rules;
pub mod signature;
pub mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use error::{CandidateError, DirectiveError};
pub use expr::{BinOp, EvalError, Expr, SyntaxError};
pub use extract::FormatError;
pub use plan::{Arg, LaunchDecl, LaunchPlan, ScratchDecl};
pub use rules::RuleViolation;
pub use validate::{validate, ResolvedArg, ResolvedLaunch, ResolvedPlan, Scalar, ScratchBuffer};

/// Element type of a task tensor or a scratch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE half (`__half`).
    F16,
    /// bfloat16 (`__nv_bfloat16`).
    Bf16,
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// `int8_t` / `signed char`.
    I8,
    /// `uint8_t` / `unsigned char`.
    U8,
    /// `int`.
    I32,
    /// `long long` / `int64_t`.
    I64,
    /// `bool`, one byte.
    Bool,
}

impl Dtype {
    /// All dtypes, in the order error messages list them.
    pub const ALL: [Dtype; 9] = [
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F32,
        Dtype::F64,
        Dtype::I8,
        Dtype::U8,
        Dtype::I32,
        Dtype::I64,
        Dtype::Bool,
    ];

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> u64 {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::Bool => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    /// The name used in plans and messages: `f32`, `bf16`, ...
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::Bool => "bool",
        }
    }

    /// Parses a name as [`Dtype::name`] writes it.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a task, as a kernel sees it: a flat buffer of `elems` elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorParam {
    /// The name the prompt and the launch plan use (`A`, `Y`).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Number of elements.
    pub elems: u64,
    /// True for outputs (written by the candidate), false for inputs (must stay unchanged).
    pub is_output: bool,
}

/// What [`validate()`] needs to know about a task: its tensors and sizes. The task suite builds
/// one per task and size preset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSignature {
    /// Tensors in the order the task declares them; [`ResolvedArg::Tensor`] indexes this.
    pub tensors: Vec<TensorParam>,
    /// Size symbols and their values (`M` -> 512).
    pub sizes: BTreeMap<String, i64>,
    /// Bytes of the intermediates PyTorch eager allocates for the task's program (0 when
    /// unknown): a candidate may always use that much scratch.
    #[serde(default)]
    pub eager_intermediate_bytes: u64,
}

impl TaskSignature {
    /// Total bytes of all tensors (saturating).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().fold(0u64, |acc, t| {
            acc.saturating_add(t.elems.saturating_mul(t.dtype.size_bytes()))
        })
    }

    /// Index of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<usize> {
        self.tensors.iter().position(|t| t.name == name)
    }
}

/// Bounds a candidate must stay within. Defaults are the H200's hardware limits where one
/// exists, and kevin's own choices otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest cuda block in bytes (64 KiB).
    pub max_source_bytes: usize,
    /// Most launch lines (16).
    pub max_launches: usize,
    /// Largest gridDim.x (2^31 - 1).
    pub max_grid_x: i64,
    /// Largest gridDim.y and gridDim.z (65535).
    pub max_grid_yz: i64,
    /// Largest blockDim.x and blockDim.y (1024).
    pub max_block_xy: i64,
    /// Largest blockDim.z (64).
    pub max_block_z: i64,
    /// Most threads per block (1024).
    pub max_threads_per_block: i64,
    /// Most dynamic shared memory per block in bytes (227 KiB, the H200's opt-in maximum; the
    /// worker must raise `MAX_DYNAMIC_SHARED_SIZE_BYTES` for launches above 48 KiB).
    pub max_smem_bytes: i64,
    /// Scratch may total this many times the task's tensor bytes (4) ...
    pub scratch_factor: u64,
    /// ... but never less than this (1 MiB, so tiny tasks can still reduce in scratch) ...
    pub min_scratch_bytes: u64,
    /// ... and never more than this (1 GiB).
    pub max_scratch_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_source_bytes: 64 * 1024,
            max_launches: 16,
            max_grid_x: (1 << 31) - 1,
            max_grid_yz: 65535,
            max_block_xy: 1024,
            max_block_z: 64,
            max_threads_per_block: 1024,
            max_smem_bytes: 227 * 1024,
            scratch_factor: 4,
            min_scratch_bytes: 1 << 20,
            max_scratch_bytes: 1 << 30,
        }
    }
}

impl Limits {
    /// The scratch cap for `sig`: `clamp(factor * tensor bytes, min, max)`, and never less than
    /// the intermediates PyTorch eager allocates for the same program (a kernel computed in
    /// stages may hold what eager holds between its ops, at KernelBench's sizes gigabytes).
    pub fn scratch_cap(&self, sig: &TaskSignature) -> u64 {
        sig.tensor_bytes()
            .saturating_mul(self.scratch_factor)
            .max(self.min_scratch_bytes)
            .min(self.max_scratch_bytes)
            .max(sig.eager_intermediate_bytes)
    }
}

/// A parsed response: the device code, the summary, and the launch plan (not yet checked
/// against any task).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The contents of the last ```` ```cuda ```` block, without the fences.
    pub source: String,
    /// The text after the block, trimmed: the summary the next turn sees.
    pub summary: String,
    /// The `// kevin:` directives of the block.
    pub plan: LaunchPlan,
}

/// Extracts the cuda block and the summary from `response` and parses its launch plan.
///
/// Errors are format errors: no block, an unclosed block, no summary, or a malformed
/// `// kevin:` line (named by its line in the block).
pub fn parse_response(response: &str) -> Result<Candidate, CandidateError> {
    let extracted = extract::extract(response)?;
    let plan = plan::parse_plan(extracted.source)?;
    Ok(Candidate {
        source: extracted.source.to_string(),
        summary: extracted.summary.to_string(),
        plan,
    })
}
