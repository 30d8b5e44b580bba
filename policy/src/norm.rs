//! The learner's per-layer operations on burn's CUDA backend (issue 18): RMSNorm, the bias
//! additions, the rotary embedding (RoPE) and SwiGLU, and the global gradient norm's sum of
//! squares. A backend extension ([`NormKernels`], [`FusedNorm`]) at each of the backend's layers,
//! as [`crate::logprob`] is:
//! - `CubeBackend<CudaRuntime, ..>`: the kernels of `cuda/norm.cu`, queued in order with burn's
//!   ([`crate::kernels::in_order`]): RMSNorm's forward (one block per row, which also keeps the
//!   row's `1 / rms`), its backward (the input's gradient and the weight's, the latter summed
//!   over rows in f32), a bias's gradient (the column sums of the output's), RoPE (a projection's
//!   rows `[b, t, h * d]` rotated and written heads first, `[b, h, t, d]`, as attention reads
//!   them; its backward is the opposite rotation written back in rows), SwiGLU's
//!   `silu(gate) * up` and its two gradients, and the sum of the squares of many tensors at once
//!   (the global gradient norm's, [`squared_sum`]);
//! - `Fusion<..>`: custom operations (never fused);
//! - `Autodiff<..>`: RMSNorm keeps its input, weight and `1 / rms`; a bias addition keeps
//!   nothing; RoPE keeps its angles; SwiGLU keeps its two operands.
//!
//! The plain-burn reference is [`crate::qwen2`]'s own: RMSNorm as square, mean, root, reciprocal,
//! product, cast, product; `y + bias`; RoPE as two narrows, a negation, a concatenation, two
//! products and a sum after the heads' transpose; `silu(gate) * up`. Under autodiff the first
//! two's gradients are burn's reductions over the batch and sequence dimensions one dimension at
//! a time, 55 ms of the 0.5B shape's learner step on the H200 (2026-12-02), and RoPE's are 384
//! slices and slice-assigns a step (2026-12-05); [`crate::grad_norm`]'s row sums of every
//! gradient's squares are the squared sum's (about 18 ms a step there). `qwen2_gpu.rs` compares
//! the two, values and gradients.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ir::{CustomOpIr, HandleContainer};
use burn::backend::{Autodiff, Cuda};
use burn::cubecl::cuda::CudaRuntime;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, FloatDType, Int, Shape, Tensor, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_fusion::stream::Operation;
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use half::bf16;

use crate::cublas::{as_backend, from_backend, on_cuda, same};
use crate::kernels::{
    args, blocks, empty, in_order, packed, suffix, with_backward, Engine, Source,
};

/// The kernels' source (after [`crate::kernels::PRELUDE`]).
pub const SOURCE: Source = Source {
    name: "norm",
    text: include_str!("cuda/norm.cu"),
    kernels: kernel_names,
};

const KINDS: [&str; 9] = [
    "adamw",
    "rms_fwd",
    "rms_bwd",
    "col_sum",
    "sq_sum",
    "rope",
    "swiglu_fwd",
    "swiglu_bwd",
    "embed_bwd",
];

/// Every kernel symbol of [`SOURCE`].
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for kind in KINDS {
        for s in ["f32", "bf16"] {
            names.push(format!("kevin_{kind}_{s}"));
        }
    }
    names.push("kevin_embed_links".to_string());
    names
}

/// Threads per block, rows per block of the backward and of the column sums (`NORM_THREADS`,
/// `NORM_ROWS`, `COL_ROWS` in `norm.cu`).
const THREADS: u32 = 256;

/// Values a thread of the elementwise kernels (SwiGLU) takes (`EW_PER_THREAD`).
const EW_PER_THREAD: usize = 4;
const ROWS: usize = 16;
const COL_ROWS: usize = 256;

/// The widest row: the backward keeps one f32 per column in shared memory (48 KB).
pub const MAX_WIDTH: usize = 12 * 1024;

/// The most token positions [`embedding`]'s gradient takes: its links compare every position
/// with every other (n^2; estimated, not yet measured: tens of microseconds at 8,192 positions,
/// a few milliseconds at the 4M policy's 110,000); beyond this burn's op is used.
pub const MAX_EMBED_POSITIONS: usize = 1 << 18;

/// Whether this path is taken where it serves: this module's kernels (RMSNorm, the bias
/// additions, RoPE, SwiGLU, the squared sum, the embedding's gradient; burn's ops when off);
/// process-wide, on by default.
pub static SWITCH: crate::kernels::Switch = crate::kernels::Switch::on();

/// RMSNorm of `x [.., n]` with weight `w [n]` (transformers' rounding: the normalised row cast
/// to the dtype, then scaled), through this path when the backend is burn's CUDA backend (f32 or
/// bf16, with or without autodiff) and [`SWITCH`] is on; `Err` gives the operands back.
#[allow(clippy::type_complexity)]
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 1>,
    eps: f64,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, 1>)> {
    if !serves(&x, &w) {
        return Err((x, w));
    }
    let eps = eps as f32;
    let out = on_cuda!(X => {
        let (x, w) = (as_backend::<B, X, D>(x.clone())?, as_backend::<B, X, 1>(w.clone())?);
        Some(from_backend::<X, B, D>(X::fused_rms_norm(x, w, eps)))
    });
    out.ok_or((x, w))
}

/// `y [.., n] + b [n]`, through this path as [`rms_norm`] is (the gradient of `b` is one
/// kernel's column sums); `Err` gives the operands back.
#[allow(clippy::type_complexity)]
pub fn add_bias<B: Backend, const D: usize>(
    y: Tensor<B, D>,
    b: Tensor<B, 1>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, 1>)> {
    if !serves(&y, &b) {
        return Err((y, b));
    }
    let out = on_cuda!(X => {
        let (y, b) = (as_backend::<B, X, D>(y.clone())?, as_backend::<B, X, 1>(b.clone())?);
        Some(from_backend::<X, B, D>(X::fused_add_bias(y, b)))
    });
    out.ok_or((y, b))
}

/// RoPE on a projection's rows `x [b, t, heads * d]` with the angles `cos`, `sin` `[1 or b, 1,
/// t, d]` (each half of `d` repeating the other, as [`crate::qwen2`]'s `Rope` holds them), written
/// heads first: `[b, heads, t, d]`, packed. `x * cos + rotate_half(x) * sin` per head, in f32
/// arithmetic rounded once. Through this path as [`rms_norm`] is (the angles in `x`'s dtype);
/// `Err` gives `x` back.
pub fn rope_heads<B: Backend>(
    x: Tensor<B, 3>,
    heads: usize,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Result<Tensor<B, 4>, Tensor<B, 3>> {
    let [b, t, n] = x.dims();
    let [crows, one, ct, d] = cos.dims();
    let dt = x.dtype();
    let fits = heads > 0
        && n == heads * d
        && d % 2 == 0
        && one == 1
        && ct == t
        && (crows == 1 || crows == b)
        && sin.dims() == cos.dims()
        && cos.dtype() == dt
        && sin.dtype() == dt;
    if !fits || !on_gpu(&x) {
        return Err(x);
    }
    let out = on_cuda!(X => {
        let p = as_backend::<B, X, 3>(x.clone())?;
        let (c, s) = (as_backend::<B, X, 4>(cos.clone())?, as_backend::<B, X, 4>(sin.clone())?);
        Some(from_backend::<X, B, 4>(X::fused_rope(p, c, s, heads)))
    });
    out.ok_or(x)
}

/// The token embedding `w [vocab, hidden]` at `ids [b, t]`: `[b, t, hidden]`, burn's row gather
/// forward; under autodiff its gradient is kevin's (`kevin_embed_links`, `kevin_embed_bwd`): each
/// id's row summed in f32 in position order and rounded once, without atomics, where burn's
/// `select_assign` gives each of `hidden` threads every position in turn and rounds each sum to
/// the dtype (3.6 ms of a Qwen2-0.5B learner step on an H100, 2026-12-05, for 8,192 positions).
/// Through this path as [`rms_norm`] is, up to [`MAX_EMBED_POSITIONS`] positions and ids below
/// 2^24 (they travel as f32); `Err` gives the operands back.
#[allow(clippy::type_complexity)]
pub fn embedding<B: Backend>(
    w: Tensor<B, 2>,
    ids: Tensor<B, 2, Int>,
) -> Result<Tensor<B, 3>, (Tensor<B, 2>, Tensor<B, 2, Int>)> {
    let [vocab, hidden] = w.dims();
    let [b, t] = ids.dims();
    let n = b * t;
    if n == 0 || n > MAX_EMBED_POSITIONS || vocab >= 1 << 24 || hidden == 0 || !on_gpu(&w) {
        return Err((w, ids));
    }
    let out = on_cuda!(X => {
        let p = as_backend::<B, X, 2>(w.clone())?;
        let i = (std::any::TypeId::of::<B>() == std::any::TypeId::of::<X>())
            .then(|| same::<_, IntTensor<X>>(ids.clone().reshape([n]).into_primitive()))?;
        Some(from_backend::<X, B, 2>(X::fused_embedding(p, i)))
    });
    out.map(|rows| rows.reshape([b, t, hidden])).ok_or((w, ids))
}

/// SwiGLU's `silu(g) * u` (the activation rounded to the dtype before the product, as
/// transformers' `act_fn(gate) * up`), `g` and `u` of one shape and dtype, through this path as
/// [`rms_norm`] is; `Err` gives the operands back.
#[allow(clippy::type_complexity)]
pub fn swiglu<B: Backend, const D: usize>(
    g: Tensor<B, D>,
    u: Tensor<B, D>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    if g.dims() != u.dims() || g.dtype() != u.dtype() || !on_gpu(&g) {
        return Err((g, u));
    }
    let out = on_cuda!(X => {
        let (g, u) = (as_backend::<B, X, D>(g.clone())?, as_backend::<B, X, D>(u.clone())?);
        Some(from_backend::<X, B, D>(X::fused_swiglu(g, u)))
    });
    out.ok_or((g, u))
}

/// The sum of the squares of every value of `ts` (f32 or bf16 tensors of any shapes, on one
/// GPU), as a `[1]` f32 tensor of backend `B`, through one kernel launch per dtype when `B` is
/// burn's CUDA backend without autodiff and [`SWITCH`] is on; `Err` gives the tensors
/// back.
pub fn squared_sum<B: Backend>(
    ts: Vec<FloatTensor<B>>,
) -> Result<Tensor<B, 1>, Vec<FloatTensor<B>>> {
    let Some(first) = ts.first() else {
        return Err(ts);
    };
    if !takes::<B>(ts.iter().map(|t| t.dtype()), &B::float_device(first)) {
        return Err(ts);
    }
    squared_through::<B, Cuda<f32>>(ts).or_else(squared_through::<B, Cuda<bf16>>)
}

/// [`squared_sum`] on `X` when `B` is `X`.
fn squared_through<B: Backend, X: NormKernels>(
    ts: Vec<FloatTensor<B>>,
) -> Result<Tensor<B, 1>, Vec<FloatTensor<B>>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<X>() {
        return Err(ts);
    }
    let sum = X::sq_sum(ts.into_iter().map(same).collect());
    Ok(from_backend::<X, B, 1>(sum))
}

/// AdamW's constants for one step of one parameter (`kevin_adamw` in `cuda/norm.cu`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// The gradient's factor (the global norm's clip; 1 when not clipped).
    pub scale: f32,
    /// `1 - lr * weight_decay`.
    pub decay: f32,
    /// The learning rate.
    pub lr: f32,
    /// beta_1.
    pub beta_1: f32,
    /// beta_2.
    pub beta_2: f32,
    /// `1 / (1 - beta_1^t)` at the parameter's step `t`.
    pub c1: f32,
    /// `1 / (1 - beta_2^t)`.
    pub c2: f32,
    /// epsilon.
    pub eps: f32,
}

impl AdamStep {
    /// The step of a parameter at its `time`-th step (from 1) with `settings` at learning rate
    /// `lr`, its gradient scaled by `scale`.
    pub fn at(settings: &crate::optim::AdamWSettings, lr: f64, time: u64, scale: f64) -> AdamStep {
        let power = |beta: f64| beta.powi(time.min(i32::MAX as u64) as i32);
        AdamStep {
            scale: scale as f32,
            decay: (1.0 - lr * settings.weight_decay) as f32,
            lr: lr as f32,
            beta_1: settings.beta_1 as f32,
            beta_2: settings.beta_2 as f32,
            c1: (1.0 / (1.0 - power(settings.beta_1))) as f32,
            c2: (1.0 / (1.0 - power(settings.beta_2))) as f32,
            eps: settings.epsilon as f32,
        }
    }

    /// The kernel's float arguments, in its order.
    pub fn scalars(&self) -> [f32; 8] {
        let s = self;
        [
            s.scale, s.decay, s.lr, s.beta_1, s.beta_2, s.c1, s.c2, s.eps,
        ]
    }
}

/// What [`adamw`] gives: the f32 weights, first and second moments after the step, and the
/// weights rounded to the gradient's dtype when that is not f32 (a bf16 model's parameter).
pub type AdamOut<B> = (
    Tensor<B, 1>,
    Tensor<B, 1>,
    Tensor<B, 1>,
    Option<Tensor<B, 1>>,
);

/// One AdamW step of a parameter of `n` values, [`adamw_many`] of one.
pub fn adamw<B: Backend>(
    g: Tensor<B, 1>,
    w: Tensor<B, 1>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    step: AdamStep,
) -> Result<AdamOut<B>, [Tensor<B, 1>; 4]> {
    match adamw_many(vec![[g, w, m, v]], vec![step]) {
        Ok(mut outs) => Ok(outs.pop().expect("one step")),
        Err(mut ins) => Err(ins.pop().expect("one parameter")),
    }
}

/// AdamW steps of many parameters through one kernel launch per gradient dtype, when `B` is
/// burn's CUDA backend without autodiff and [`SWITCH`] is on: each `[g, w, m, v]` (all `[n]`)
/// with its [`AdamStep`], `g` the gradient (f32, or bf16 for a bf16 model), `w` the f32 weights
/// (the master copy of a bf16 parameter), `m` and `v` the f32 moments. A launch per parameter
/// costs the host more than the GPU for a model's many small parameters (biases, norms: 290
/// parameters at Qwen2-0.5B). `Err` gives the operands back.
pub fn adamw_many<B: Backend>(
    items: Vec<[Tensor<B, 1>; 4]>,
    steps: Vec<AdamStep>,
) -> Result<Vec<AdamOut<B>>, Vec<[Tensor<B, 1>; 4]>> {
    let fits = |ins: &[Tensor<B, 1>; 4]| {
        let n = ins[0].dims();
        ins[1..].iter().all(|t| t.dtype() == DType::F32) && ins.iter().all(|t| t.dims() == n)
    };
    if items.is_empty()
        || items.len() != steps.len()
        || !items.iter().all(fits)
        || !takes::<B>(items.iter().map(|i| i[0].dtype()), &items[0][0].device())
    {
        return Err(items);
    }
    adam_through::<B, Cuda<f32>>(items, &steps)
        .or_else(|items| adam_through::<B, Cuda<bf16>>(items, &steps))
}

/// [`adamw_many`] on `X` when `B` is `X`.
#[allow(clippy::type_complexity)]
fn adam_through<B: Backend, X: NormKernels>(
    items: Vec<[Tensor<B, 1>; 4]>,
    steps: &[AdamStep],
) -> Result<Vec<AdamOut<B>>, Vec<[Tensor<B, 1>; 4]>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<X>() {
        return Err(items);
    }
    let rounded: Vec<bool> = items.iter().map(|i| i[0].dtype() != DType::F32).collect();
    let ins = items
        .into_iter()
        .map(|i| i.map(|t| same(t.into_primitive().tensor())))
        .collect();
    let mut outs = X::adamw(ins, steps.to_vec())
        .into_iter()
        .map(from_backend::<X, B, 1>);
    let mut next = || {
        outs.next()
            .expect("AdamW's outputs, three or four a parameter")
    };
    Ok(rounded
        .into_iter()
        .map(|r| (next(), next(), next(), r.then(&mut next)))
        .collect())
}

/// Whether this path takes `x [.., n]` with `v [n]` (backend, dtypes, shapes, kernels).
fn serves<B: Backend, const D: usize>(x: &Tensor<B, D>, v: &Tensor<B, 1>) -> bool {
    let n = x.dims()[D - 1];
    if v.dtype() != x.dtype() || v.dims()[0] != n || n == 0 || n > MAX_WIDTH {
        return false;
    }
    on_gpu(x)
}

/// Whether this path takes `x` at all ([`takes`]).
fn on_gpu<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    takes::<B>([x.dtype()], &x.device())
}

/// Whether this path takes tensors of `dtypes` on `device` of backend `B`: switched on, burn's
/// CUDA backend, every dtype f32 or bf16, the kernels compiled for the device.
fn takes<B: Backend>(dtypes: impl IntoIterator<Item = DType>, device: &B::Device) -> bool {
    SWITCH.get()
        && crate::cublas::is_cuda::<B>()
        && dtypes
            .into_iter()
            .all(|d| matches!(d, DType::F32 | DType::BF16))
        && crate::kernels::usable(&SOURCE, device, "fused norms")
}

/// A backend with the kernels.
pub trait NormKernels: Backend {
    /// `(y [.., n], 1 / rms [rows] in f32)` of `x [.., n]` and `w [n]`.
    fn rms_forward(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> [FloatTensor<Self>; 2];

    /// `(dx, dw)` from the forward's operands, its `1 / rms` and the output's gradient.
    fn rms_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];

    /// The sums of `dy [.., n]` over every dimension but the last, `[n]` in `dy`'s dtype.
    fn col_sum(dy: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The sum of the squares of every value of `ts` (at least one tensor), `[1]` in f32.
    fn sq_sum(ts: Vec<FloatTensor<Self>>) -> FloatTensor<Self>;

    /// RoPE (see [`rope_heads`]) of `x [b, t, heads * d]` to `[b, heads, t, d]`; `back`: its
    /// gradient, `x` being the output's gradient `[b, heads, t, d]`, to `[b, t, heads * d]`.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        heads: usize,
        back: bool,
    ) -> FloatTensor<Self>;

    /// `silu(g) * u` (see [`swiglu`]).
    fn swiglu_forward(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `(dg, du)` of [`NormKernels::swiglu_forward`] from its operands and the output's gradient.
    fn swiglu_backward(
        g: FloatTensor<Self>,
        u: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];

    /// AdamW's steps ([`adamw_many`]): each `[g, w, m, v]`, all `[n]`, with its step, to
    /// `[w', m', v']` and, when `g` is not f32, the weights in `g`'s dtype, one parameter's
    /// after another's.
    fn adamw(ins: Vec<[FloatTensor<Self>; 4]>, steps: Vec<AdamStep>) -> Vec<FloatTensor<Self>>;

    /// The gradient `[vocab, hidden]` (`dy`'s dtype) of an embedding of `vocab` rows gathered at
    /// `ids [n]` (f32, exact integers below `vocab`), from the rows' gradient `dy [n, hidden]`.
    fn embed_backward(
        ids: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        vocab: usize,
    ) -> FloatTensor<Self>;
}

/// A backend whose RMSNorm and bias additions can take this path.
pub trait FusedNorm: Backend {
    /// See [`rms_norm`].
    fn fused_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self>;

    /// See [`add_bias`].
    fn fused_add_bias(y: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;

    /// See [`rope_heads`].
    fn fused_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self>;

    /// See [`swiglu`].
    fn fused_swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self>;

    /// See [`embedding`]: `w [vocab, hidden]` at `ids [n]`, `[n, hidden]`.
    fn fused_embedding(w: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self>;
}

/// `b [n]` as `[1, .., 1, n]` of `y`'s rank.
fn bias_shape<B: Backend>(y: &FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
    let rank = y.shape().num_dims();
    let n = b.shape().num_elements();
    let mut dims = vec![1; rank - 1];
    dims.push(n);
    B::float_reshape(b, Shape::from(dims))
}

/// Without autodiff: the forward only.
impl<B: NormKernels> FusedNorm for B {
    fn fused_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let [y, _] = Self::rms_forward(x, w, eps);
        y
    }

    fn fused_add_bias(y: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let b = bias_shape::<Self>(&y, b);
        Self::float_add(y, b)
    }

    fn fused_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        Self::rope(x, cos, sin, heads, false)
    }

    fn fused_swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::swiglu_forward(g, u)
    }

    fn fused_embedding(w: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        Self::float_select(w, 0, ids)
    }
}

/// RoPE's output shape: `[b, t, heads * d] -> [b, heads, t, d]`, or back.
fn rope_shape(x: &[usize], heads: usize, back: bool) -> Result<Vec<usize>, String> {
    match (x, back) {
        (&[b, t, n], false) if heads > 0 && n % heads == 0 => Ok(vec![b, heads, t, n / heads]),
        (&[b, h, t, d], true) if h == heads => Ok(vec![b, t, h * d]),
        _ => Err(format!(
            "{x:?} for {heads} heads ({})",
            if back {
                "[b, heads, t, d]"
            } else {
                "[b, t, heads * d]"
            }
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// CubeBackend: the kernels.

type Ct = CubeTensor<CudaRuntime>;

/// `(rows, n)` of `x [.., n]` with `v [n]`, or why not.
fn rows_and_width(x: &Ct, v: &Ct) -> Result<(usize, usize), String> {
    let s = x.meta.shape();
    let n = *s.last().ok_or("a 0-d tensor")?;
    if v.meta.shape()[..] != [n] || v.dtype != x.dtype {
        return Err(format!(
            "{:?} {:?} with {:?} {:?}",
            s,
            x.dtype,
            v.meta.shape(),
            v.dtype
        ));
    }
    if n == 0 || n > MAX_WIDTH {
        return Err(format!("rows of {n} (1 to {MAX_WIDTH})"));
    }
    Ok((s.iter().product::<usize>() / n, n))
}

/// `t` (f32) in `dtype`.
fn cast_to(t: Ct, dtype: DType) -> Ct {
    if dtype == DType::F32 {
        t
    } else {
        burn_cubecl::kernel::cast(t, dtype)
    }
}

/// A new `[n]` f32 sum on `like`'s device: zeroed on the kernels' stream, then, unless `inputs`
/// is empty (nothing to sum: it stays zero), summed into by `launch`, run in order after the
/// zeroing with the sum's address and those of `inputs`.
fn sum_into(
    like: &Ct,
    n: usize,
    inputs: &[&Ct],
    launch: impl FnOnce(&Engine, u64, &[u64]) -> Result<(), String>,
) -> Result<Ct, String> {
    let sum = empty(like, vec![n], DType::F32);
    let mut all = vec![&sum];
    all.extend_from_slice(inputs);
    in_order(&SOURCE, &all, |e, p| {
        e.zero(p[0], n * 4)?;
        if inputs.is_empty() {
            return Ok(());
        }
        launch(e, p[0], &p[1..])
    })?;
    Ok(sum)
}

fn cube_rms_forward(x: Ct, w: Ct, eps: f32) -> Result<[Ct; 2], String> {
    let (x, w) = (packed(x), packed(w));
    let (rows, n) = rows_and_width(&x, &w)?;
    let s = suffix(&x)?;
    let y = empty(&x, x.meta.shape().to_vec(), x.dtype);
    let r = empty(&x, vec![rows], DType::F32);
    if rows > 0 {
        in_order(&SOURCE, &[&x, &w, &y, &r], |e, p| {
            let mut a = args(p, &[&(n as i64).to_ne_bytes(), &eps.to_ne_bytes()]);
            e.launch(
                &format!("kevin_rms_fwd_{s}"),
                blocks(rows, 1)?,
                THREADS,
                0,
                &mut a,
            )
        })?;
    }
    Ok([y, r])
}

fn cube_rms_backward(x: Ct, w: Ct, r: Ct, dy: Ct) -> Result<[Ct; 2], String> {
    let (x, w, r, dy) = (packed(x), packed(w), packed(r), packed(dy));
    let (rows, n) = rows_and_width(&x, &w)?;
    let s = suffix(&x)?;
    if dy.meta.shape() != x.meta.shape() || dy.dtype != x.dtype || r.dtype != DType::F32 {
        return Err(format!(
            "gradient {:?} {:?} and 1/rms {:?} for {:?} {:?}",
            dy.meta.shape(),
            dy.dtype,
            r.dtype,
            x.meta.shape(),
            x.dtype
        ));
    }
    let dx = empty(&x, x.meta.shape().to_vec(), x.dtype);
    let inputs: &[&Ct] = if rows > 0 {
        &[&x, &w, &r, &dy, &dx]
    } else {
        &[]
    };
    let dw = sum_into(&x, n, inputs, |e, dw, p| {
        let dims = [(rows as i64).to_ne_bytes(), (n as i64).to_ne_bytes()];
        let mut a = args(&[p[0], p[1], p[2], p[3], p[4], dw], &[&dims[0], &dims[1]]);
        let grid = blocks(rows.div_ceil(ROWS), 1)?;
        e.launch(
            &format!("kevin_rms_bwd_{s}"),
            grid,
            THREADS,
            n as u32 * 4,
            &mut a,
        )
    })?;
    Ok([dx, cast_to(dw, w.dtype)])
}

fn cube_col_sum(dy: Ct) -> Result<Ct, String> {
    let dy = packed(dy);
    let s = suffix(&dy)?;
    let n = *dy.meta.shape().last().ok_or("a 0-d gradient")?;
    if n == 0 {
        return Ok(empty(&dy, vec![0], dy.dtype));
    }
    let rows = dy.meta.shape().iter().product::<usize>() / n;
    let inputs: &[&Ct] = if rows > 0 { &[&dy] } else { &[] };
    let out = sum_into(&dy, n, inputs, |e, out, p| {
        let dims = [(rows as i64).to_ne_bytes(), (n as i64).to_ne_bytes()];
        let mut a = args(&[p[0], out], &[&dims[0], &dims[1]]);
        let grid = blocks(n.div_ceil(THREADS as usize), rows.div_ceil(COL_ROWS))?;
        e.launch(&format!("kevin_col_sum_{s}"), grid, THREADS, 0, &mut a)
    })?;
    Ok(cast_to(out, dy.dtype))
}

fn cube_rope(x: Ct, c: Ct, s: Ct, heads: usize, back: bool) -> Result<Ct, String> {
    let (x, c, s) = (packed(x), packed(c), packed(s));
    let sfx = suffix(&x)?;
    let shape = x.meta.shape().to_vec();
    let out = rope_shape(&shape, heads, back)?;
    // The rows' shape [b, t, heads * d]: the input's forward, the output's back.
    let rows = if back { &out } else { &shape };
    let (b, t, d) = (rows[0], rows[1], rows[2] / heads);
    let angles = c.meta.shape().to_vec();
    let crows = angles[0];
    if angles != [crows, 1, t, d]
        || s.meta.shape() != c.meta.shape()
        || (crows != 1 && crows != b)
        || d % 2 != 0
        || c.dtype != x.dtype
        || s.dtype != x.dtype
    {
        return Err(format!(
            "angles {angles:?} {:?} / {:?} for {:?} {:?} ({heads} heads; [1 or b, 1, t, d], d even)",
            c.dtype,
            s.dtype,
            x.meta.shape(),
            x.dtype
        ));
    }
    let y = empty(&x, out, x.dtype);
    let pairs = b * heads * t * (d / 2);
    if pairs > 0 {
        in_order(&SOURCE, &[&x, &c, &s, &y], |e, p| {
            let dims = [b, t, heads, d, crows].map(|v| (v as i64).to_ne_bytes());
            let back = (back as i32).to_ne_bytes();
            let mut a = args(
                p,
                &[&dims[0], &dims[1], &dims[2], &dims[3], &dims[4], &back],
            );
            let grid = blocks(pairs.div_ceil(THREADS as usize), 1)?;
            e.launch(&format!("kevin_rope_{sfx}"), grid, THREADS, 0, &mut a)
        })?;
    }
    Ok(y)
}

/// The elementwise kernel `kevin_{kind}_{dtype}` over `ins` (one shape and dtype) into `outs`
/// new tensors like them: `(ins.., outs.., n)`.
fn cube_elementwise(kind: &str, ins: Vec<Ct>, outs: usize) -> Result<Vec<Ct>, String> {
    let ins: Vec<Ct> = ins.into_iter().map(packed).collect();
    let first = ins.first().ok_or("no operands")?;
    let (shape, dtype) = (first.meta.shape().to_vec(), first.dtype);
    if let Some(t) = ins
        .iter()
        .find(|t| t.meta.shape()[..] != shape[..] || t.dtype != dtype)
    {
        return Err(format!(
            "operands {shape:?} {dtype:?} and {:?} {:?}",
            t.meta.shape(),
            t.dtype
        ));
    }
    let s = suffix(first)?;
    let ys: Vec<Ct> = (0..outs)
        .map(|_| empty(first, shape.clone(), dtype))
        .collect();
    let n = shape.iter().product::<usize>();
    if n > 0 {
        let all: Vec<&Ct> = ins.iter().chain(&ys).collect();
        in_order(&SOURCE, &all, |e, p| {
            let mut a = args(p, &[&(n as i64).to_ne_bytes()]);
            let grid = blocks(n.div_ceil(THREADS as usize * EW_PER_THREAD), 1)?;
            e.launch(&format!("kevin_{kind}_{s}"), grid, THREADS, 0, &mut a)
        })?;
    }
    Ok(ys)
}

/// The positions of `ts` grouped by their kernels' dtype suffix, in order of first appearance:
/// a table-driven kernel takes one dtype a launch.
fn by_suffix<'a>(
    ts: impl Iterator<Item = &'a Ct>,
) -> Result<Vec<(&'static str, Vec<usize>)>, String> {
    let mut groups: Vec<(&'static str, Vec<usize>)> = Vec::new();
    for (i, t) in ts.enumerate() {
        let s = suffix(t)?;
        match groups.iter_mut().find(|(g, _)| *g == s) {
            Some((_, members)) => members.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    Ok(groups)
}

/// Values a block of `kevin_sq_sum` takes (`SQ_CHUNK`).
const SQ_CHUNK: usize = THREADS as usize * 16;

/// One launch per dtype over every tensor of it: the table of (address, length, first block)
/// goes to the GPU on the kernels' stream first.
fn cube_sq_sum(ts: Vec<Ct>) -> Result<Ct, String> {
    let ts: Vec<Ct> = ts.into_iter().map(packed).collect();
    let first = ts.first().ok_or("no tensors")?;
    let groups = by_suffix(ts.iter())?;
    let tables: Vec<Ct> = groups
        .iter()
        .map(|(_, members)| empty(first, vec![3 * members.len()], DType::I64))
        .collect();
    let inputs: Vec<&Ct> = ts.iter().chain(&tables).collect();
    sum_into(first, 1, &inputs, |e, out, p| {
        for (g, (s, members)) in groups.iter().enumerate() {
            let mut table: Vec<i64> = Vec::with_capacity(3 * members.len());
            let mut total = 0usize;
            for &i in members {
                let n = ts[i].meta.shape().iter().product::<usize>();
                if n > 0 {
                    table.extend([p[i] as i64, n as i64, total as i64]);
                    total += n.div_ceil(SQ_CHUNK);
                }
            }
            if total == 0 {
                continue;
            }
            let at = p[ts.len() + g];
            e.upload(at, &table)?;
            let mut a = args(&[at, out], &[&(table.len() as i64 / 3).to_ne_bytes()]);
            e.launch(
                &format!("kevin_sq_sum_{s}"),
                blocks(total, 1)?,
                THREADS,
                0,
                &mut a,
            )?;
        }
        Ok(())
    })
}

/// Values a block of `kevin_adamw` takes and table entries a parameter (`ADAM_CHUNK`,
/// `ADAM_SLOTS`).
const ADAM_CHUNK: usize = THREADS as usize * 4;
const ADAM_SLOTS: usize = 14;

/// A parameter's entry of `kevin_adamw`'s table: the eight addresses (`p'` 0 when none), the
/// length, the first block, the step's constants two to a slot.
fn adam_entry(ptrs: [u64; 8], n: usize, first: usize, step: &AdamStep) -> [i64; ADAM_SLOTS] {
    let mut e = [0i64; ADAM_SLOTS];
    for (slot, p) in e.iter_mut().zip(ptrs) {
        *slot = p as i64;
    }
    e[8] = n as i64;
    e[9] = first as i64;
    for (k, pair) in step.scalars().chunks_exact(2).enumerate() {
        // Little-endian: the first of the pair is the slot's low half (kevin_adamw's k[2 j]).
        e[10 + k] = (u64::from(pair[0].to_bits()) | (u64::from(pair[1].to_bits()) << 32)) as i64;
    }
    e
}

fn cube_adamw(items: Vec<[Ct; 4]>, steps: &[AdamStep]) -> Result<Vec<Ct>, String> {
    let items: Vec<[Ct; 4]> = items.into_iter().map(|i| i.map(packed)).collect();
    let mut outs: Vec<Vec<Ct>> = Vec::with_capacity(items.len());
    for [g, w, m, v] in &items {
        let n = g.meta.shape().iter().product::<usize>();
        for t in [g, w, m, v] {
            if t.meta.shape()[..] != [n] {
                return Err(format!(
                    "operands {:?} and {:?}",
                    g.meta.shape(),
                    t.meta.shape()
                ));
            }
        }
        if [w, m, v].iter().any(|t| t.dtype != DType::F32) {
            return Err(format!(
                "state {:?} {:?} {:?} (f32)",
                w.dtype, m.dtype, v.dtype
            ));
        }
        // In place where the state is the caller's alone (each value is read, then written,
        // by one thread); else into new tensors.
        let mut out: Vec<Ct> = [w, m, v]
            .map(|t| {
                if t.can_mut() {
                    t.clone()
                } else {
                    empty(g, vec![n], DType::F32)
                }
            })
            .into();
        if g.dtype != DType::F32 {
            out.push(empty(g, vec![n], g.dtype));
        }
        outs.push(out);
    }
    let groups = by_suffix(items.iter().map(|[g, ..]| g))?;
    let first = &items.first().ok_or("no parameters")?[0];
    let tables: Vec<Ct> = groups
        .iter()
        .map(|(_, members)| empty(first, vec![ADAM_SLOTS * members.len()], DType::I64))
        .collect();
    // The tensors in order: each parameter's four inputs and its outputs, then the tables.
    let mut all: Vec<&Ct> = Vec::new();
    let mut at = Vec::with_capacity(items.len());
    for (ins, out) in items.iter().zip(&outs) {
        at.push(all.len());
        all.extend(ins.iter());
        all.extend(out.iter());
    }
    let tables_at = all.len();
    all.extend(tables.iter());
    in_order(&SOURCE, &all, |e, p| {
        for (k, (s, members)) in groups.iter().enumerate() {
            let mut table: Vec<i64> = Vec::with_capacity(ADAM_SLOTS * members.len());
            let mut total = 0usize;
            for &i in members {
                let n = items[i][0].meta.shape().iter().product::<usize>();
                if n == 0 {
                    continue;
                }
                let mut ptrs = [0u64; 8];
                ptrs[..outs[i].len() + 4].copy_from_slice(&p[at[i]..at[i] + outs[i].len() + 4]);
                table.extend(adam_entry(ptrs, n, total, &steps[i]));
                total += n.div_ceil(ADAM_CHUNK);
            }
            if total == 0 {
                continue;
            }
            let t = p[tables_at + k];
            e.upload(t, &table)?;
            let count = (table.len() / ADAM_SLOTS) as i64;
            let mut a = args(&[t], &[&count.to_ne_bytes()]);
            e.launch(
                &format!("kevin_adamw_{s}"),
                blocks(total, 1)?,
                THREADS,
                0,
                &mut a,
            )?;
        }
        Ok(())
    })?;
    Ok(outs.into_iter().flatten().collect())
}

fn cube_embed_backward(ids: Ct, dy: Ct, vocab: usize) -> Result<Ct, String> {
    let (ids, dy) = (packed(ids), packed(dy));
    let n = ids.meta.shape().iter().product::<usize>();
    let dims = dy.meta.shape().to_vec();
    let hidden = dims.last().copied().unwrap_or(0);
    if ids.dtype != DType::F32 || dims.iter().product::<usize>() != n * hidden {
        return Err(format!(
            "ids {:?} {:?} (f32) and rows' gradient {dims:?}",
            ids.dtype,
            ids.meta.shape()
        ));
    }
    let s = suffix(&dy)?;
    let dw = empty(&dy, vec![vocab, hidden], dy.dtype);
    let next = empty(&dy, vec![n], DType::I32);
    let lead = empty(&dy, vec![n], DType::I32);
    let bytes = vocab * hidden * dy.dtype.size();
    in_order(&SOURCE, &[&ids, &dy, &dw, &next, &lead], |e, p| {
        e.zero(p[2], bytes)?;
        if n == 0 || hidden == 0 {
            return Ok(());
        }
        let count = (n as i64).to_ne_bytes();
        let mut a = args(&[p[0], p[3], p[4]], &[&count]);
        let grid = blocks(n.div_ceil(THREADS as usize), 1)?;
        e.launch("kevin_embed_links", grid, THREADS, 0, &mut a)?;
        let mut a = args(
            &[p[0], p[3], p[4], p[1], p[2]],
            &[
                &count,
                &(hidden as i64).to_ne_bytes(),
                &(vocab as i64).to_ne_bytes(),
            ],
        );
        e.launch(
            &format!("kevin_embed_bwd_{s}"),
            blocks(n, 1)?,
            THREADS,
            0,
            &mut a,
        )
    })?;
    Ok(dw)
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> NormKernels
    for CubeBackend<CudaRuntime, F, I, BT>
{
    fn rms_forward(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> [FloatTensor<Self>; 2] {
        cube_rms_forward(x, w, eps).unwrap_or_else(|e| panic!("RMSNorm, forward: {e}"))
    }

    fn rms_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        cube_rms_backward(x, w, r, dy).unwrap_or_else(|e| panic!("RMSNorm, backward: {e}"))
    }

    fn col_sum(dy: FloatTensor<Self>) -> FloatTensor<Self> {
        cube_col_sum(dy).unwrap_or_else(|e| panic!("bias gradient: {e}"))
    }

    fn sq_sum(ts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        cube_sq_sum(ts).unwrap_or_else(|e| panic!("sum of squares: {e}"))
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        heads: usize,
        back: bool,
    ) -> FloatTensor<Self> {
        cube_rope(x, cos, sin, heads, back).unwrap_or_else(|e| panic!("RoPE: {e}"))
    }

    fn swiglu_forward(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        let [y] = one_of(
            cube_elementwise("swiglu_fwd", vec![g, u], 1),
            "SwiGLU, forward",
        );
        y
    }

    fn swiglu_backward(
        g: FloatTensor<Self>,
        u: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        one_of(
            cube_elementwise("swiglu_bwd", vec![g, u, dy], 2),
            "SwiGLU, backward",
        )
    }

    fn adamw(ins: Vec<[FloatTensor<Self>; 4]>, steps: Vec<AdamStep>) -> Vec<FloatTensor<Self>> {
        cube_adamw(ins, &steps).unwrap_or_else(|e| panic!("AdamW: {e}"))
    }

    fn embed_backward(
        ids: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        vocab: usize,
    ) -> FloatTensor<Self> {
        cube_embed_backward(ids, dy, vocab)
            .unwrap_or_else(|e| panic!("the embedding's gradient: {e}"))
    }
}

/// `N` tensors from `r`, or a panic naming `what`.
fn one_of<const N: usize>(r: Result<Vec<Ct>, String>, what: &str) -> [Ct; N] {
    r.and_then(|v| {
        v.try_into()
            .map_err(|v: Vec<Ct>| format!("{} outputs", v.len()))
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Fusion: custom operations on the inner backend's tensors.

#[derive(Debug, Clone)]
enum Pass {
    /// Inputs x, w; outputs y, 1 / rms.
    Forward(f32),
    /// Inputs x, w, 1 / rms, dy; outputs dx, dw.
    Backward,
    /// Input dy; output its column sums.
    ColSum,
    /// Any number of inputs; output the sum of their squares.
    SqSum,
    /// Inputs x, cos, sin; output x rotated (heads first), or its gradient (rows) when `back`.
    Rope { heads: usize, back: bool },
    /// Inputs g, u; output silu(g) * u.
    SwigluForward,
    /// Inputs g, u, dy; outputs dg, du.
    SwigluBackward,
    /// Inputs g, w, m, v of each parameter; outputs w', m', v' and, for a g not in f32, w' in
    /// g's dtype, of each, with each's step.
    Adamw(Vec<AdamStep>),
    /// Inputs ids (f32), dy; output the gradient of an embedding of this many rows.
    EmbedBackward(usize),
}

#[derive(Debug)]
struct FusedPass<B> {
    desc: CustomOpIr,
    pass: Pass,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + NormKernels> Operation<B::FusionRuntime> for FusedPass<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ins: Vec<FloatTensor<B>> = self
            .desc
            .inputs
            .iter()
            .map(|t| handles.get_float_tensor::<B>(t))
            .collect();
        fn take<T, const N: usize>(v: Vec<T>) -> [T; N] {
            v.try_into()
                .unwrap_or_else(|_| panic!("a pass of {N} inputs"))
        }
        let outs: Vec<FloatTensor<B>> = match self.pass.clone() {
            Pass::Forward(eps) => {
                let [x, w] = take(ins);
                B::rms_forward(x, w, eps).into()
            }
            Pass::Backward => {
                let [x, w, r, dy] = take(ins);
                B::rms_backward(x, w, r, dy).into()
            }
            Pass::ColSum => {
                let [dy] = take(ins);
                vec![B::col_sum(dy)]
            }
            Pass::SqSum => vec![B::sq_sum(ins)],
            Pass::Rope { heads, back } => {
                let [x, c, s] = take(ins);
                vec![B::rope(x, c, s, heads, back)]
            }
            Pass::SwigluForward => {
                let [g, u] = take(ins);
                vec![B::swiglu_forward(g, u)]
            }
            Pass::SwigluBackward => {
                let [g, u, dy] = take(ins);
                B::swiglu_backward(g, u, dy).into()
            }
            Pass::Adamw(steps) => {
                let mut ins = ins.into_iter();
                let items = steps
                    .iter()
                    .map(|_| std::array::from_fn(|_| ins.next().expect("four inputs a parameter")))
                    .collect();
                B::adamw(items, steps)
            }
            Pass::EmbedBackward(vocab) => {
                let [ids, dy] = take(ins);
                vec![B::embed_backward(ids, dy, vocab)]
            }
        };
        for (ir, t) in self.desc.outputs.iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, t);
        }
    }
}

fn fused_pass<B: FusionBackend + NormKernels, const N: usize>(
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: [(Shape, DType); N],
    pass: Pass,
) -> [FloatTensor<Fusion<B>>; N] {
    fused_pass_vec::<B>(inputs, outputs.into(), pass)
        .try_into()
        .unwrap_or_else(|_| panic!("a pass of {N} outputs"))
}

/// [`fused_pass`] with any number of outputs.
fn fused_pass_vec<B: FusionBackend + NormKernels>(
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: Vec<(Shape, DType)>,
    pass: Pass,
) -> Vec<FloatTensor<Fusion<B>>> {
    let name = match pass {
        Pass::Forward(_) => "kevin_rms_forward",
        Pass::Backward => "kevin_rms_backward",
        Pass::ColSum => "kevin_col_sum",
        Pass::SqSum => "kevin_sq_sum",
        Pass::Rope { back: false, .. } => "kevin_rope",
        Pass::Rope { back: true, .. } => "kevin_rope_backward",
        Pass::SwigluForward => "kevin_swiglu_forward",
        Pass::SwigluBackward => "kevin_swiglu_backward",
        Pass::Adamw(_) => "kevin_adamw",
        Pass::EmbedBackward(_) => "kevin_embed_backward",
    };
    crate::kernels::custom_op_vec(name, inputs, outputs, |desc| FusedPass::<B> {
        desc,
        pass,
        _b: std::marker::PhantomData,
    })
}

impl<B: FusionBackend + NormKernels> NormKernels for Fusion<B> {
    fn rms_forward(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> [FloatTensor<Self>; 2] {
        let n = x.shape.to_vec().last().copied().unwrap_or(1).max(1);
        let rows = x.shape.num_elements() / n;
        let outs = [
            (x.shape.clone(), x.dtype),
            (Shape::from(vec![rows]), DType::F32),
        ];
        fused_pass::<B, 2>(vec![x, w], outs, Pass::Forward(eps))
    }

    fn rms_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let outs = [(x.shape.clone(), x.dtype), (w.shape.clone(), w.dtype)];
        fused_pass::<B, 2>(vec![x, w, r, dy], outs, Pass::Backward)
    }

    fn col_sum(dy: FloatTensor<Self>) -> FloatTensor<Self> {
        let n = dy.shape.to_vec().last().copied().unwrap_or(1);
        let out = (Shape::from(vec![n]), dy.dtype);
        let [s] = fused_pass::<B, 1>(vec![dy], [out], Pass::ColSum);
        s
    }

    fn sq_sum(ts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        let out = (Shape::from(vec![1]), DType::F32);
        let [s] = fused_pass::<B, 1>(ts, [out], Pass::SqSum);
        s
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        heads: usize,
        back: bool,
    ) -> FloatTensor<Self> {
        let shape =
            rope_shape(&x.shape.to_vec(), heads, back).unwrap_or_else(|e| panic!("RoPE: {e}"));
        let out = (Shape::from(shape), x.dtype);
        let [y] = fused_pass::<B, 1>(vec![x, cos, sin], [out], Pass::Rope { heads, back });
        y
    }

    fn swiglu_forward(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (g.shape.clone(), g.dtype);
        let [y] = fused_pass::<B, 1>(vec![g, u], [out], Pass::SwigluForward);
        y
    }

    fn swiglu_backward(
        g: FloatTensor<Self>,
        u: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let outs = [(g.shape.clone(), g.dtype), (u.shape.clone(), u.dtype)];
        fused_pass::<B, 2>(vec![g, u, dy], outs, Pass::SwigluBackward)
    }

    fn adamw(ins: Vec<[FloatTensor<Self>; 4]>, steps: Vec<AdamStep>) -> Vec<FloatTensor<Self>> {
        let mut outs = Vec::new();
        for [g, ..] in &ins {
            let state = (g.shape.clone(), DType::F32);
            outs.extend([state.clone(), state.clone(), state]);
            if g.dtype != DType::F32 {
                outs.push((g.shape.clone(), g.dtype));
            }
        }
        let inputs = ins.into_iter().flatten().collect();
        fused_pass_vec::<B>(inputs, outs, Pass::Adamw(steps))
    }

    fn embed_backward(
        ids: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        vocab: usize,
    ) -> FloatTensor<Self> {
        let hidden = dy.shape.to_vec().last().copied().unwrap_or(0);
        let out = (Shape::from(vec![vocab, hidden]), dy.dtype);
        let [dw] = fused_pass::<B, 1>(vec![ids, dy], [out], Pass::EmbedBackward(vocab));
        dw
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: RMSNorm keeps what its backward kernel reads; a bias addition keeps nothing; RoPE
// keeps its angles; SwiGLU its operands.

impl<B: NormKernels, C: CheckpointStrategy> FusedNorm for Autodiff<B, C> {
    fn fused_rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f32) -> FloatTensor<Self> {
        let [y, r] = B::rms_forward(x.primitive.clone(), w.primitive.clone(), eps);
        // Kept: x, w and 1 / rms.
        let state = [x.primitive.clone(), w.primitive.clone(), r];
        with_backward::<B, C, _, 2>([&x, &w], y, state, |[x, w, r], dy| {
            B::rms_backward(x, w, r, dy)
        })
    }

    fn fused_add_bias(y: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct AddBias;
        impl<B: NormKernels> Backward<B, 2> for AddBias {
            type State = ();

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let dy = grads.consume::<B>(&ops.node);
                let [py, pb] = ops.parents;
                if let Some(node) = pb {
                    grads.register::<B>(node.id, B::col_sum(dy.clone()));
                }
                if let Some(node) = py {
                    grads.register::<B>(node.id, dy);
                }
            }
        }
        let out = B::fused_add_bias(y.primitive.clone(), b.primitive.clone());
        AddBias
            .prepare::<C>([y.node.clone(), b.node.clone()])
            .compute_bound()
            .stateless(out)
    }

    fn fused_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        let (cos, sin) = (cos.primitive, sin.primitive);
        let y = B::rope(x.primitive.clone(), cos.clone(), sin.clone(), heads, false);
        with_backward::<B, C, _, 1>([&x], y, (cos, sin, heads), |(cos, sin, heads), dy| {
            [B::rope(dy, cos, sin, heads, true)]
        })
    }

    fn fused_swiglu(g: FloatTensor<Self>, u: FloatTensor<Self>) -> FloatTensor<Self> {
        let y = B::swiglu_forward(g.primitive.clone(), u.primitive.clone());
        let state = [g.primitive.clone(), u.primitive.clone()];
        with_backward::<B, C, _, 2>([&g, &u], y, state, |[g, u], dy| {
            B::swiglu_backward(g, u, dy)
        })
    }

    fn fused_embedding(w: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        let vocab = w.primitive.shape()[0];
        let y = B::float_select(w.primitive.clone(), 0, ids.clone());
        // Kept: the ids as f32 (what the gradient's kernels read), not the table.
        let ids = B::int_into_float(ids, FloatDType::F32);
        with_backward::<B, C, _, 1>([&w], y, (ids, vocab), |(ids, vocab), dy| {
            [B::embed_backward(ids, dy, vocab)]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kevin_adamw` run on the CPU device model against [`crate::optim::reference_step`] (burn's
    /// ops on NdArray) on the same values: two parameters of one table in one launch, one into
    /// new buffers and one in place, each over blocks with a partial last one; f32 (no rounded
    /// weights) and bf16 (gradient in bf16, the weights also written rounded to bf16).
    #[test]
    fn adamw_kernel_matches_burns_ops_on_the_cpu_device_model() {
        use burn::backend::NdArray;
        use kevin::candidate::{ResolvedArg as A, Scalar};
        // Two parameters in one launch: the first at its third step, its gradient scaled by
        // 0.3, into new buffers; the second (several blocks, a partial last one) at its first
        // step, in place (its outputs are its state's buffers).
        let params = [
            (
                3 * 256 + 17,
                AdamStep::at(&crate::optim::TEST_SETTINGS, 1e-3, 3, 0.3),
            ),
            (
                2 * ADAM_CHUNK + 5,
                AdamStep::at(&crate::optim::TEST_SETTINGS, 2e-3, 1, 1.0),
            ),
        ];
        for bf16_grad in [false, true] {
            let name = if bf16_grad {
                "kevin_adamw_bf16"
            } else {
                "kevin_adamw_f32"
            };
            let mut inputs = Vec::new();
            let mut bufs: Vec<Vec<u8>> = Vec::new();
            for (k, &(n, _)) in params.iter().enumerate() {
                let mut g = wave(n, 0.37 + k as f64, 2.0);
                if bf16_grad {
                    g.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32());
                }
                let (w, m) = (wave(n, 0.11, 0.5), wave(n, 0.23 + k as f64, 0.1));
                let v: Vec<f32> = wave(n, 0.05, 0.1).iter().map(|x| x * x).collect();
                bufs.push(if bf16_grad {
                    g.iter()
                        .flat_map(|&x| bf16::from_f32(x).to_bits().to_ne_bytes())
                        .collect()
                } else {
                    f32_bytes(&g)
                });
                bufs.extend([f32_bytes(&w), f32_bytes(&m), f32_bytes(&v)]);
                if k == 0 {
                    bufs.extend([vec![0; 4 * n], vec![0; 4 * n], vec![0; 4 * n]]);
                }
                bufs.push(vec![0; 2 * n]);
                inputs.push([g, w, m, v]);
            }
            // Buffer indices: the first's g w m v w' m' v' p' (0..8), the second's g w m v p'.
            let outputs = [[4usize, 5, 6, 7], [9, 10, 11, 12]];
            let mut table = Vec::new();
            let mut total = 0;
            for (k, &(n, step)) in params.iter().enumerate() {
                let b = |i: usize| bufs[i].as_ptr() as u64;
                let base = if k == 0 { 0 } else { 8 };
                let p2 = if bf16_grad { b(outputs[k][3]) } else { 0 };
                let ptrs = [
                    b(base),
                    b(base + 1),
                    b(base + 2),
                    b(base + 3),
                    b(outputs[k][0]),
                    b(outputs[k][1]),
                    b(outputs[k][2]),
                    p2,
                ];
                table.extend(adam_entry(ptrs, n, total, &step));
                total += n.div_ceil(ADAM_CHUNK);
            }
            bufs.push(table.iter().flat_map(|v| v.to_ne_bytes()).collect());
            let args = vec![
                A::Tensor(bufs.len() - 1),
                A::Scalar(Scalar::I64(params.len() as i64)),
            ];
            if !run_blocks(name, total, args, &mut bufs) {
                return;
            }
            for (k, (&(n, step), [g, w, m, v])) in params.iter().zip(&inputs).enumerate() {
                let host = |x: &[f32]| {
                    Tensor::<NdArray, 1>::from_data(
                        burn::tensor::TensorData::new(x.to_vec(), [n]),
                        &Default::default(),
                    )
                };
                let (ww, wm, wv, _) =
                    crate::optim::reference_step(host(g), host(w), host(m), host(v), step);
                let out = outputs[k];
                for (what, got, want) in [
                    ("w", &bufs[out[0]], ww),
                    ("m", &bufs[out[1]], wm),
                    ("v", &bufs[out[2]], wv),
                ] {
                    let want = want.into_data().to_vec::<f32>().unwrap();
                    let got = f32_values(got);
                    let top = want.iter().fold(1e-30f32, |a, x| a.max(x.abs()));
                    let diff = got
                        .iter()
                        .zip(&want)
                        .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
                    assert!(diff <= 1e-6 * top, "{name} {k} {what}: {diff} of {top}");
                }
                let p2 = &bufs[out[3]];
                let w2 = f32_values(&bufs[out[0]]);
                for (i, c) in p2.chunks_exact(2).enumerate() {
                    let got = bf16::from_bits(u16::from_ne_bytes([c[0], c[1]]));
                    let want = if bf16_grad {
                        bf16::from_f32(w2[i])
                    } else {
                        bf16::from_bits(0)
                    };
                    assert_eq!(
                        got, want,
                        "{name} {k}: weight {i} (rounded w' or untouched)"
                    );
                }
            }
        }
    }

    fn f32_bytes(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    fn f32_values(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Kernel `name` of [`SOURCE`] on the CPU device model over `blocks` blocks of [`THREADS`]
    /// threads, no dynamic shared memory; false without a host compiler.
    fn run_blocks(
        name: &str,
        blocks: usize,
        args: Vec<kevin::candidate::ResolvedArg>,
        bufs: &mut [Vec<u8>],
    ) -> bool {
        let grid = [u32::try_from(blocks).expect("blocks"), 1, 1];
        crate::kernels::run_on_cpu_model(&SOURCE, name, grid, [THREADS, 1, 1], 0, args, bufs)
    }

    /// Deterministic values in about [-a, a].
    fn wave(n: usize, k: f64, a: f64) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f64 * k + 0.3).sin() * a) as f32)
            .collect()
    }

    /// `kernel_f32` on the CPU device model over `inputs` then `outputs` zeroed buffers of these
    /// element counts (f32), with the dims as i64 and `tail` after them; the outputs, or `None`
    /// without a host compiler.
    fn on_cpu_model(
        kernel: &str,
        grid: [u32; 3],
        smem: u32,
        inputs: &[&[f32]],
        outputs: &[usize],
        tail: &[kevin::candidate::Scalar],
    ) -> Option<Vec<Vec<f32>>> {
        use kevin::candidate::ResolvedArg as A;
        let mut bufs: Vec<Vec<u8>> = inputs.iter().map(|x| f32_bytes(x)).collect();
        bufs.extend(outputs.iter().map(|&n| vec![0u8; 4 * n]));
        let mut args: Vec<A> = (0..bufs.len()).map(A::Tensor).collect();
        args.extend(tail.iter().map(|&s| A::Scalar(s)));
        let name = format!("kevin_{kernel}_f32");
        crate::kernels::run_on_cpu_model(
            &SOURCE,
            &name,
            grid,
            [THREADS, 1, 1],
            smem,
            args,
            &mut bufs,
        )
        .then(|| bufs[inputs.len()..].iter().map(|b| f32_values(b)).collect())
    }

    /// The largest difference between `got` and `want`, relative to `want`'s largest value.
    fn rel(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        let top = want.iter().fold(1e-30f64, |a, x| a.max(x.abs()));
        got.iter()
            .zip(want)
            .fold(0f64, |a, (&g, w)| a.max((g as f64 - w).abs()))
            / top
    }

    /// RMSNorm forward and backward, the column sums and the sum of squares (f32) on the CPU
    /// device model against f64 arithmetic by hand: rows that do not fill a block of the
    /// backward, a width that does not fill a block's threads.
    #[test]
    fn norm_kernels_match_f64_on_the_cpu_device_model() {
        use kevin::candidate::Scalar::{F32, I64};
        let (rows, n, eps) = (ROWS + 3, 300, 1e-6f32);
        let x = wave(rows * n, 0.37, 2.0);
        let w = wave(n, 0.11, 1.0);
        let dy = wave(rows * n, 0.23, 1.5);
        let Some(out) = on_cpu_model(
            "rms_fwd",
            [rows as u32, 1, 1],
            0,
            &[&x, &w],
            &[rows * n, rows],
            &[I64(n as i64), F32(eps)],
        ) else {
            return;
        };
        let (mut want_y, mut want_r) = (vec![], vec![]);
        for row in 0..rows {
            let xs = &x[row * n..(row + 1) * n];
            let ms = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            want_r.push(r);
            want_y.extend(xs.iter().zip(&w).map(|(&v, &wj)| v as f64 * r * wj as f64));
        }
        assert!(
            rel(&out[0], &want_y) < 1e-6,
            "RMSNorm y: {}",
            rel(&out[0], &want_y)
        );
        assert!(
            rel(&out[1], &want_r) < 1e-6,
            "RMSNorm 1/rms: {}",
            rel(&out[1], &want_r)
        );

        let r = out[1].clone();
        let blocks = rows.div_ceil(ROWS) as u32;
        let out = on_cpu_model(
            "rms_bwd",
            [blocks, 1, 1],
            4 * n as u32,
            &[&x, &w, &r, &dy],
            &[rows * n, n],
            &[I64(rows as i64), I64(n as i64)],
        )
        .expect("the compiler was there a moment ago");
        let (mut want_dx, mut want_dw) = (vec![], vec![0f64; n]);
        for row in 0..rows {
            let (xs, gs, ri) = (&x[row * n..][..n], &dy[row * n..][..n], r[row] as f64);
            let dot = (0..n)
                .map(|j| gs[j] as f64 * w[j] as f64 * xs[j] as f64)
                .sum::<f64>()
                / n as f64;
            for j in 0..n {
                let (xv, g) = (xs[j] as f64, gs[j] as f64);
                want_dx.push(ri * g * w[j] as f64 - xv * ri.powi(3) * dot);
                want_dw[j] += g * xv * ri;
            }
        }
        assert!(
            rel(&out[0], &want_dx) < 1e-5,
            "RMSNorm dx: {}",
            rel(&out[0], &want_dx)
        );
        assert!(
            rel(&out[1], &want_dw) < 1e-5,
            "RMSNorm dw: {}",
            rel(&out[1], &want_dw)
        );

        let grid = [
            n.div_ceil(THREADS as usize) as u32,
            rows.div_ceil(COL_ROWS) as u32,
            1,
        ];
        let out = on_cpu_model(
            "col_sum",
            grid,
            0,
            &[&dy],
            &[n],
            &[I64(rows as i64), I64(n as i64)],
        )
        .expect("the compiler was there a moment ago");
        let want: Vec<f64> = (0..n)
            .map(|j| (0..rows).map(|row| dy[row * n + j] as f64).sum())
            .collect();
        assert!(
            rel(&out[0], &want) < 1e-6,
            "column sums: {}",
            rel(&out[0], &want)
        );

        // The sum of squares of several tensors in one launch: lengths of one value, part of a
        // block's chunk, several chunks with a partial last one, and none (left out).
        let parts: Vec<Vec<f32>> = [1usize, 300, 3 * SQ_CHUNK + 7, 0, SQ_CHUNK]
            .iter()
            .enumerate()
            .map(|(i, &m)| wave(m, 0.07 + i as f64 * 0.01, 1.5))
            .collect();
        let mut bufs: Vec<Vec<u8>> = parts.iter().map(|x| f32_bytes(x)).collect();
        let (mut table, mut total) = (Vec::new(), 0usize);
        for (b, x) in bufs.iter().zip(&parts) {
            if !x.is_empty() {
                table.extend([b.as_ptr() as i64, x.len() as i64, total as i64]);
                total += x.len().div_ceil(SQ_CHUNK);
            }
        }
        let count = table.len() / 3;
        bufs.push(table.iter().flat_map(|v| v.to_ne_bytes()).collect());
        bufs.push(vec![0u8; 4]);
        use kevin::candidate::ResolvedArg as A;
        let args = vec![
            A::Tensor(parts.len()),
            A::Tensor(parts.len() + 1),
            A::Scalar(I64(count as i64)),
        ];
        assert!(run_blocks("kevin_sq_sum_f32", total, args, &mut bufs));
        let got = f32_values(&bufs[parts.len() + 1]);
        let want = parts
            .iter()
            .flatten()
            .map(|&v| v as f64 * v as f64)
            .sum::<f64>();
        assert!(
            rel(&got, &[want]) < 1e-6,
            "sum of squares: {} for {want}",
            got[0]
        );
    }

    /// RoPE both ways and SwiGLU both ways (f32) on the CPU device model against f64 arithmetic
    /// by hand: angles per row (crows = b) and shared, heads first and back to rows.
    #[test]
    fn rope_and_swiglu_kernels_match_f64_on_the_cpu_device_model() {
        use kevin::candidate::Scalar::{I32, I64};
        let (b, t, h, d) = (2, 5, 3, 8);
        let k = d / 2;
        let x = wave(b * t * h * d, 0.31, 1.0);
        for crows in [1, b] {
            let c = wave(crows * t * d, 0.17, 1.0);
            let s = wave(crows * t * d, 0.29, 1.0);
            let pairs = b * h * t * k;
            let grid = [pairs.div_ceil(THREADS as usize) as u32, 1, 1];
            let dims = [b, t, h, d, crows].map(|v| I64(v as i64));
            for back in [0, 1] {
                let mut tail = dims.to_vec();
                tail.push(I32(back));
                let Some(out) = on_cpu_model("rope", grid, 0, &[&x, &c, &s], &[x.len()], &tail)
                else {
                    return;
                };
                let mut want = vec![0f64; x.len()];
                for (bi, hi, ti, j) in (0..b).flat_map(|bi| {
                    (0..h).flat_map(move |hi| {
                        (0..t).flat_map(move |ti| (0..k).map(move |j| (bi, hi, ti, j)))
                    })
                }) {
                    let heads = ((bi * h + hi) * t + ti) * d + j;
                    let rows = ((bi * t + ti) * h + hi) * d + j;
                    let ci = ((bi % crows) * t + ti) * d + j;
                    let (cj, ck, sj, sk) = (
                        c[ci] as f64,
                        c[ci + k] as f64,
                        s[ci] as f64,
                        s[ci + k] as f64,
                    );
                    let (from, to) = if back == 1 {
                        (heads, rows)
                    } else {
                        (rows, heads)
                    };
                    let (a, z) = (x[from] as f64, x[from + k] as f64);
                    if back == 1 {
                        want[to] = a * cj + z * sk;
                        want[to + k] = z * ck - a * sj;
                    } else {
                        want[to] = a * cj - z * sj;
                        want[to + k] = z * ck + a * sk;
                    }
                }
                assert!(
                    rel(&out[0], &want) < 1e-6,
                    "RoPE crows {crows} back {back}: {}",
                    rel(&out[0], &want)
                );
            }
        }

        // Two whole blocks of values and a part of a third.
        let n = 2 * THREADS as usize * EW_PER_THREAD + 3 * THREADS as usize + 5;
        let (g, u, dy) = (wave(n, 0.41, 4.0), wave(n, 0.13, 2.0), wave(n, 0.07, 1.0));
        let grid = [n.div_ceil(THREADS as usize * EW_PER_THREAD) as u32, 1, 1];
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let out = on_cpu_model("swiglu_fwd", grid, 0, &[&g, &u], &[n], &[I64(n as i64)])
            .expect("the compiler was there a moment ago");
        let want: Vec<f64> = (0..n)
            .map(|i| g[i] as f64 * sig(g[i] as f64) * u[i] as f64)
            .collect();
        assert!(
            rel(&out[0], &want) < 1e-6,
            "SwiGLU y: {}",
            rel(&out[0], &want)
        );
        let out = on_cpu_model(
            "swiglu_bwd",
            grid,
            0,
            &[&g, &u, &dy],
            &[n, n],
            &[I64(n as i64)],
        )
        .expect("the compiler was there a moment ago");
        let (mut want_dg, mut want_du) = (vec![], vec![]);
        for i in 0..n {
            let (gv, sg, dv) = (g[i] as f64, sig(g[i] as f64), dy[i] as f64);
            want_du.push(dv * gv * sg);
            want_dg.push(dv * u[i] as f64 * sg * (1.0 + gv * (1.0 - sg)));
        }
        assert!(
            rel(&out[0], &want_dg) < 1e-6,
            "SwiGLU dg: {}",
            rel(&out[0], &want_dg)
        );
        assert!(
            rel(&out[1], &want_du) < 1e-6,
            "SwiGLU du: {}",
            rel(&out[1], &want_du)
        );
    }

    #[test]
    fn norm_kernels_compile_for_sm_90() {
        crate::kernels::assert_compiles(&super::SOURCE);
        assert_eq!(super::kernel_names().len(), 19);
    }

    /// The embedding's gradient on the CPU device model (f32): the links over more positions
    /// than a tile of ids, with ids repeated near and far apart and ids that never occur, then
    /// the rows summed per id, against f64 sums by hand; ids that do not occur stay zero.
    #[test]
    fn embedding_gradient_kernels_match_f64_on_the_cpu_device_model() {
        use kevin::candidate::ResolvedArg as A;
        use kevin::candidate::Scalar::I64;
        let (n, hidden, vocab) = (1_100usize, 300usize, 150usize);
        // Positions share ids within a tile and across tiles (1,024 ids a tile); ids 97.. never occur.
        let ids: Vec<f32> = (0..n)
            .map(|p| match p % 7 {
                0 => 3.0,
                1 => (p % 13) as f32,
                _ => ((p * 31) % 97) as f32,
            })
            .collect();
        let dy = wave(n * hidden, 0.13, 1.0);
        let i32_values = |b: &[u8]| -> Vec<i32> {
            b.chunks_exact(4)
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let mut bufs = vec![f32_bytes(&ids), vec![0u8; 4 * n], vec![0u8; 4 * n]];
        let args = vec![
            A::Tensor(0),
            A::Tensor(1),
            A::Tensor(2),
            A::Scalar(I64(n as i64)),
        ];
        let blocks = n.div_ceil(THREADS as usize);
        if !run_blocks("kevin_embed_links", blocks, args, &mut bufs) {
            return;
        }
        let (next, lead) = (i32_values(&bufs[1]), i32_values(&bufs[2]));
        for p in 0..n {
            let want_next = (p + 1..n)
                .find(|&q| ids[q] == ids[p])
                .map_or(-1, |q| q as i32);
            assert_eq!(next[p], want_next, "next[{p}]");
            let want_lead = !(0..p).any(|q| ids[q] == ids[p]);
            assert_eq!(lead[p] == 1, want_lead, "lead[{p}]");
        }
        // The rows, with the links just made.
        let mut bufs = vec![
            f32_bytes(&ids),
            bufs[1].clone(),
            bufs[2].clone(),
            f32_bytes(&dy),
            vec![0u8; 4 * vocab * hidden],
        ];
        let mut args: Vec<A> = (0..5).map(A::Tensor).collect();
        args.extend([n, hidden, vocab].map(|v| A::Scalar(I64(v as i64))));
        assert!(run_blocks("kevin_embed_bwd_f32", n, args, &mut bufs));
        let got = f32_values(&bufs[4]);
        let mut want = vec![0f64; vocab * hidden];
        for (p, &id) in ids.iter().enumerate() {
            let row = id as usize;
            for c in 0..hidden {
                want[row * hidden + c] += dy[p * hidden + c] as f64;
            }
        }
        // f32 sums of up to 178 rows (id 3) against f64: about 2e-6 of the largest.
        assert!(rel(&got, &want) < 1e-5, "dw: {}", rel(&got, &want));
        let unused = (0..vocab).filter(|&r| !ids.contains(&(r as f32)));
        let mut seen = 0;
        for r in unused {
            seen += 1;
            let row = &got[r * hidden..(r + 1) * hidden];
            assert!(row.iter().all(|&v| v == 0.0), "row {r} of an absent id");
        }
        assert!(seen > 0, "the case has ids that never occur");
    }
}
