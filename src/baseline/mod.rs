//! The eager baseline: every task's reference program run op by op on the GPU, the way PyTorch
//! eager runs the equivalent module. Its time is the denominator of every speedup, so it has to
//! be both right (checked against the fp64 interpreter) and as fast as PyTorch eager, no faster
//! through fusion and no slower through naive kernels.
//!
//! [`lower`] turns a task at a size preset into an [`EagerPlan`]: buffers (the task's tensors in
//! signature order, then one fresh buffer per intermediate, in the dtype PyTorch would give it)
//! and steps (kernel launches of [`SOURCE`] and row-major GEMMs for cuBLAS). One op node of the
//! program is one step, as one PyTorch call is one kernel (composites below), except where
//! PyTorch itself launches nothing: scalar arithmetic (`2 * s`) is folded, `transpose` feeding a
//! matmul becomes the GEMM's transpose flag (PyTorch hands cuBLAS a view), and `[B,M,K] @ [K,N]`
//! is one GEMM of `B*M` rows. The root of a statement writes straight into its output tensor.
//!
//! The kernels (`kernels.cu`) of a native plan compute in float and round once on store, like
//! PyTorch's opmath; elementwise kernels are vectorised and grid-stride; reductions, softmax and
//! norms take one warp or block per row when the reduced axis is the contiguous last one and a
//! coalesced thread-per-column loop otherwise; broadcasts and transposes (made contiguous) read through
//! strides with magic-number division, as PyTorch's TensorIterator does. `launch.rs` chooses every
//! grid and names every kernel; `strides.rs` merges dimensions for the strided kernels.
//!
//! Where PyTorch eager runs an op node as several kernels, so does the baseline (PyTorch 2.11 on
//! an H200, counted with its profiler): `logsumexp` is amax, the maxima with infinities zeroed,
//! subtract, exp, sum, log, add (seven launches; PyTorch's nine zero the infinities in three tiny
//! ones), `l2norm` is F.normalize's norm, clamp_min and divide, and `s / x` a reciprocal and a
//! multiply. `rms_norm` and `layer_norm` are one kernel each, as PyTorch's fused layer-norm kernel.
//! What differs: an operand of another dtype is converted by its own kernel first (PyTorch casts
//! inside the op; a matmul of mixed dtypes is an error there), and a transpose feeding anything
//! but a matmul is copied first (PyTorch would read the view in the next op).
//! `benches/results/baseline-h200-*.md` has the measured fidelity per task.
//!
//! Convolutions are [`Step::Conv`]: cuDNN on the GPU, as PyTorch eager calls it, except the
//! depthwise ones PyTorch runs with its own kernel (every f32 and bf16 one:
//! [`Conv::torch_native_depthwise`]), which are kevin's `conv_depthwise` kernel; so are the
//! training-mode batch norms PyTorch sends to cuDNN ([`Step::BatchNorm`]: f32 with weight and
//! bias). [`EagerPlan::with_kernel_steps`] replaces the GEMM and cuDNN steps by launches of a
//! plain tiled GEMM, a direct convolution and `chan_norm` of [`SOURCE`]: what the CPU device
//! model runs, and the GPU fallback when cuBLAS or cuDNN cannot be loaded.
//!
//! Rows of softmax and log_softmax longer than PyTorch keeps in shared memory are read three
//! times (maximum, sum of exponentials, map) as its `cunn_SoftMaxForward` reads them; shorter
//! ones once online, then mapped.
//!
//! [`lower_f64`] lowers the same program as a [`Precision::F64`] plan: the correctness
//! protocol's reference on the GPU, where the fp64 interpreter is too slow and the fp32 baseline
//! too inexact (cuBLAS sgemm at K = 4096 is ~3x off a 1e-4 tolerance against the exact result).
//! It has the native plan's buffers and steps one for one (`tests.rs` checks it on every task);
//! every float buffer is stored as f64, every float kernel is its `_f64` instantiation (the
//! kernels are templates over an "opmath" type, float or double), scalar parameters are
//! `double`, GEMMs are DGEMMs (f64 tiled kernel under `with_kernel_steps`), convolutions are always the
//! direct f64 kernel and a cast between
//! float dtypes is a copy, so nothing is ever rounded to f16/bf16. The double definitions are
//! the interpreter's (`ops/kernels.rs`), NaN rules included, so an F64 plan computes what
//! `Task::reference` computes, up to the order of operations and the libm: within 1e-9 relative
//! + 1e-12 absolute on every task and fixture (`cpu_tests.rs`), indices exactly.
//!
//! Dependency direction: this folder imports only `ops`, `tasks` and `candidate` (for the launch
//! plan types); the devices (`gpu`, the CPU model in tests) and the cuda environment import it.

#[cfg(test)]
mod cpu_tests;
mod launch;
mod lower;
mod strides;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::ops::Dtype;
use crate::tasks::{Preset, Task};

pub use launch::kernel_names;

/// CUDA C++ source of every trusted kernel (extern "C" __global__ functions, no includes except
/// <cuda_fp16.h> and <cuda_bf16.h>), compiled once per worker with NVRTC.
pub const SOURCE: &str = include_str!("kernels.cu");

/// How the float buffers of a plan are stored and computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Precision {
    /// The task's dtypes (f32/f16/bf16), float opmath: the timing baseline.
    Native,
    /// Every float buffer holds f64 and every float op computes in double: the reference.
    F64,
}

/// A task's program as a sequence of launches over device buffers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EagerPlan {
    /// Every buffer: first the task tensors in signature order (index = index in
    /// `Task::signature(preset).tensors`), then intermediates.
    pub buffers: Vec<BufferDecl>,
    /// The launches, in order, all on one stream.
    pub steps: Vec<Step>,
    /// How float buffers are stored and computed; GEMM steps of an F64 plan are DGEMMs.
    pub precision: Precision,
}

/// One device buffer of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferDecl {
    /// The tensor's name for task tensors and named intermediates; `<statement>.<k>` for the
    /// unnamed intermediate of the k-th op node of a statement.
    pub name: String,
    /// Element type in the task (an F64 plan stores float buffers as f64 all the same).
    #[serde(with = "dtype_serde")]
    pub dtype: Dtype,
    /// Number of elements.
    pub elems: usize,
}

impl BufferDecl {
    /// Bytes of this buffer in a plan of `precision` (8 per element for float buffers in F64;
    /// i64 stays 8; otherwise the dtype's size).
    pub fn stored_bytes(&self, precision: Precision) -> usize {
        self.elems * launch::Elem::new(self.dtype, precision).size_bytes()
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Step {
    /// One launch of an extern "C" kernel of SOURCE.
    Kernel {
        /// The kernel's name.
        kernel: String,
        /// Grid dimensions (x, y, z), each at least 1.
        grid: [u32; 3],
        /// Block dimensions (x, y, z).
        block: [u32; 3],
        /// Dynamic shared memory (the kernels use static shared memory only: always 0).
        smem_bytes: u32,
        /// The kernel's parameters, in order.
        args: Vec<StepArg>,
    },
    /// Row-major strided-batched GEMM: for each b < batch: C_b[m x n] = op(A_b) @ op(B_b) with
    /// op(A_b) m x k, op(B_b) k x n; `trans_a` means A_b is stored k x m (row-major) and used
    /// transposed; same for B. Element strides between batches (0 = broadcast). In a native
    /// plan f32 runs as plain fp32 sgemm (no TF32, like torch's default) and f16/bf16 accumulate
    /// in f32; in an F64 plan every GEMM is a DGEMM, whatever its `dtype`.
    Gemm(Gemm),
    /// A convolution, or a transposed one, as PyTorch eager runs it: cuDNN in a native plan
    /// where the worker loads libcudnn (a forward or backward-data convolution, then the bias
    /// added by `cudnnAddTensor`); the direct `conv_<dtype>` / `conv_transpose_<dtype>` kernel of
    /// [`SOURCE`] in an F64 plan, on the CPU device model and where cuDNN is missing.
    Conv(Conv),
    /// A training-mode batch norm as PyTorch eager runs it where it calls cuDNN (f32, weight and
    /// bias present, x of rank 3 or more, fewer than 2^31 elements, at most 880,801 samples,
    /// eps of at least cuDNN's minimum): `cudnnBatchNormalizationForwardTraining` in spatial
    /// mode in a native plan where the worker loads libcudnn; the `chan_norm_<dtype>` kernel of
    /// [`SOURCE`] in an F64 plan, on the CPU device model and where cuDNN is missing. Every
    /// other batch norm is that kernel from the start, as PyTorch's own kernel runs it.
    BatchNorm(BatchNorm),
}

/// A batch-norm step; see [`Step::BatchNorm`]. x and y are `[n, c, s]` (s: the spatial extents'
/// product); w and b are `[c]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchNorm {
    /// Buffer index of x.
    pub x: usize,
    /// Buffer index of the weight.
    pub w: usize,
    /// Buffer index of the bias.
    pub b: usize,
    /// Buffer index of y.
    pub y: usize,
    /// Batch.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// Elements of one channel of one sample.
    pub s: usize,
    /// The variance's epsilon.
    pub eps: f64,
}

impl BatchNorm {
    /// The smallest epsilon cuDNN's batch norm takes (`CUDNN_BN_MIN_EPSILON` of cuDNN 8; PyTorch
    /// sends a smaller one to its own kernel).
    pub const MIN_EPS: f64 = 1e-5;
    /// Where PyTorch (2.11, `_select_batch_norm_backend`) calls cuDNN for a training-mode batch
    /// norm of x `[n, c, *spatial]` (`rank` axes) of dtype `d` with weight and bias present.
    pub fn cudnn_takes(d: Dtype, rank: usize, (n, c, s): (usize, usize, usize), eps: f64) -> bool {
        d == Dtype::F32
            && rank >= 3
            && n <= 880_801
            && n.saturating_mul(c).saturating_mul(s) < i32::MAX as usize
            && eps >= Self::MIN_EPS
    }
}

/// A convolution step; see [`Step::Conv`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conv {
    /// Element type of x, w, bias and y in the task (stored as f64 in an F64 plan).
    #[serde(with = "dtype_serde")]
    pub dtype: Dtype,
    /// A transposed convolution (PyTorch's `conv_transpose*d`; w is `[c, f / groups, *kernel]`),
    /// else w is `[f, c / groups, *kernel]`.
    pub transposed: bool,
    /// Buffer index of x: `[n, c, *spatial]`.
    pub x: usize,
    /// Buffer index of the weight.
    pub w: usize,
    /// Buffer index of the bias `[f]`, if any.
    pub bias: Option<usize>,
    /// Buffer index of y: `[n, f, *out]`.
    pub y: usize,
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Output channels.
    pub f: usize,
    /// Channel groups.
    pub groups: usize,
    /// Extents, window, stride, padding and dilation.
    #[serde(flatten)]
    pub window: Window,
}

impl Conv {
    /// A depthwise convolution that PyTorch eager runs with its own CUDA kernel
    /// (`conv_depthwise2d` / `3d`), not cuDNN: not transposed, groups = C > 1, F a multiple of
    /// C, and not f16 on a plane with at least 32 channels, no dilation and equal strides (those
    /// it may send to cuDNN, after a workload check kevin does not copy). The baseline then runs
    /// kevin's kernel of the same form (`conv_depthwise`) in place of cuDNN.
    pub fn torch_native_depthwise(&self) -> bool {
        let depthwise =
            !self.transposed && self.groups > 1 && self.groups == self.c && self.f % self.c == 0;
        let w = &self.window;
        let plane = w.spatial.len() <= 2;
        let cudnn_f16 = self.dtype == Dtype::F16
            && plane
            && self.c >= 32
            && w.dilation.iter().all(|&d| d == 1)
            && (w.stride.windows(2).all(|s| s[0] == s[1]) || w.spatial.len() == 1);
        depthwise && !cudnn_f16
    }
}

/// A window over one to three spatial axes (a convolution's or a pooling's), one entry per
/// axis in the task's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Input extents.
    pub spatial: Vec<usize>,
    /// Window extents.
    pub kernel: Vec<usize>,
    /// Output extents.
    pub out: Vec<usize>,
    /// Stride per axis.
    pub stride: Vec<usize>,
    /// Padding per axis (both sides).
    pub padding: Vec<usize>,
    /// Dilation per axis.
    pub dilation: Vec<usize>,
}

/// A row-major strided-batched GEMM; see [`Step::Gemm`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gemm {
    /// Element type of A, B and C in the task (stored as f64 in an F64 plan).
    #[serde(with = "dtype_serde")]
    pub dtype: Dtype,
    /// Buffer index of A.
    pub a: usize,
    /// Buffer index of B.
    pub b: usize,
    /// Buffer index of C.
    pub c: usize,
    /// Rows of C.
    pub m: u32,
    /// Columns of C.
    pub n: u32,
    /// The contracted extent.
    pub k: u32,
    /// Number of products.
    pub batch: u32,
    /// A_b is stored k x m and used transposed.
    pub trans_a: bool,
    /// B_b is stored n x k and used transposed.
    pub trans_b: bool,
    /// Elements between consecutive A_b.
    pub stride_a: i64,
    /// Elements between consecutive B_b.
    pub stride_b: i64,
    /// Elements between consecutive C_b.
    pub stride_c: i64,
}

/// One kernel parameter, in the parameter's C type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum StepArg {
    /// Device pointer to the buffer at this index of [`EagerPlan::buffers`].
    Buffer(usize),
    /// `int`.
    I32(i32),
    /// `long long`.
    I64(i64),
    /// `float`: a scalar parameter of a native plan's kernel.
    F32(f32),
    /// `double`: a scalar parameter of an F64 plan's kernel.
    F64(f64),
}

/// Why a task could not be lowered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BaselineError {
    /// The preset leaves a size symbol without a value.
    #[error("task `{task}`: size `{symbol}` has no value at this preset")]
    MissingSize {
        /// The task.
        task: String,
        /// The size symbol.
        symbol: String,
    },
    /// A statement cannot be lowered (a bug, or an extent beyond what a kernel indexes).
    #[error("task `{task}`, line {line}, statement `{target}`: {message}")]
    Statement {
        /// The task.
        task: String,
        /// Line of the statement.
        line: usize,
        /// Its target.
        target: String,
        /// What is wrong.
        message: String,
    },
}

/// `task`'s plan at `preset` as `scripts/baseline_gpu.py` reads it: the plan, the task's PyTorch
/// module, its tolerance, its number of inputs and its outputs' names (`kevin tasks baseline
/// --plans`, which also writes [`SOURCE`] as `kernels.cu` beside them).
pub fn plan_record(task: &Task, preset: Preset) -> Result<serde_json::Value, String> {
    let plan = lower(task, preset).map_err(|e| format!("{}: {e}", task.name))?;
    let module = task
        .torch_module(preset)
        .map_err(|e| format!("{}: {e}", task.name))?;
    Ok(serde_json::json!({
        "task": task.name,
        "preset": preset.name(),
        "plan": plan,
        "module": module,
        "tolerance": {"atol": task.tolerance.atol, "rtol": task.tolerance.rtol},
        "inputs": task.program.inputs.len(),
        "outputs": task.program.outputs.iter().map(|d| &d.name).collect::<Vec<_>>(),
    }))
}

/// Lowers `task` at `preset` into its eager plan (the timing baseline, [`Precision::Native`]).
pub fn lower(task: &Task, preset: Preset) -> Result<EagerPlan, BaselineError> {
    lower::lower_program(
        &task.name,
        &task.program,
        task.sizes(preset),
        Precision::Native,
    )
}

/// The same program as [`lower`], in double precision: the correctness reference. Same buffers
/// in the same order (`BufferDecl::dtype` keeps the task's dtype, as information; every float
/// buffer is stored as f64), every float kernel its `_f64` instantiation computing in double
/// with the interpreter's definitions, scalar parameters as `double`, GEMM steps DGEMMs, casts
/// between float dtypes plain copies. Nothing is rounded to f16/bf16: the result is what
/// `Task::reference` (the fp64 interpreter) computes from the same dtype-rounded inputs, up to
/// the order of floating-point operations.
pub fn lower_f64(task: &Task, preset: Preset) -> Result<EagerPlan, BaselineError> {
    lower::lower_program(
        &task.name,
        &task.program,
        task.sizes(preset),
        Precision::F64,
    )
}

impl EagerPlan {
    /// The same plan with its library steps replaced by kevin's own kernels of [`SOURCE`]:
    /// every [`Step::Gemm`] (if `gemm`) by one launch of the tiled `gemm_<dtype>` kernel
    /// (`gemm_f64` in an F64 plan), every cuDNN step (if `dnn`) by one launch of kevin's kernel:
    /// the direct convolution for a [`Step::Conv`], `chan_norm` for a [`Step::BatchNorm`]. Both:
    /// what the CPU device model runs; either: the GPU's fallback without cuBLAS or cuDNN.
    pub fn with_kernel_steps(&self, gemm: bool, dnn: bool) -> EagerPlan {
        let steps = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Gemm(g) if gemm => launch::gemm_kernel(g, self.precision),
                Step::Conv(c) if dnn => launch::conv_kernel(c, self.precision),
                Step::BatchNorm(b) if dnn => launch::batch_norm_kernel(b, self.precision),
                other => other.clone(),
            })
            .collect();
        EagerPlan {
            buffers: self.buffers.clone(),
            steps,
            precision: self.precision,
        }
    }

    /// Number of launches (kernels and GEMMs): what PyTorch eager's kernel count compares with.
    pub fn launches(&self) -> usize {
        self.steps.len()
    }
}

/// Dtypes travel by their program spelling (`"f32"`, `"bf16"`, ...).
mod dtype_serde {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::ops::Dtype;

    pub fn serialize<S: Serializer>(d: &Dtype, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Dtype, D::Error> {
        let name = String::deserialize(d)?;
        Dtype::from_name(&name).ok_or_else(|| D::Error::custom(format!("unknown dtype `{name}`")))
    }
}
