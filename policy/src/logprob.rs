//! The learner's log-probabilities of the chosen tokens on burn's CUDA backend (issue 18): a
//! backend extension ([`LogprobKernels`], [`ChosenLogprobs`]) at each of the backend's layers,
//! as [`crate::flash`] is:
//! - `CubeBackend<CudaRuntime, ..>`: the kernels of `cuda/logprob.cu`, one block per chosen row:
//!   the forward pass reads the row's logits once and writes the log-probability of its target
//!   and the row's log-sum-exp; the backward pass writes the row's gradient
//!   `g * (onehot(target) - softmax)` in the logits' dtype (the other rows zero);
//! - `Fusion<..>`: custom operations (never fused);
//! - `Autodiff<..>`: the forward keeps the logits, the indices and the log-sum-exp.
//!
//! The plain-burn reference ([`crate::loss::token_logprobs`]'s own ops: a copy of the chosen
//! rows in f32, the shifted logits, their exponentials) keeps several `[N, V]` tensors in f32
//! and their gradients; at Qwen2's 151,936-token vocabulary and 8,192 chosen rows each is 5 GB,
//! and on the H200 they took 70 ms of a learner step. `qwen2_gpu.rs` compares the two, values
//! and gradients.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::ir::{CustomOpIr, HandleContainer};
use burn::backend::Autodiff;
use burn::cubecl::cuda::CudaRuntime;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Shape, Tensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_fusion::stream::Operation;
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};

use crate::cublas::{as_backend, from_backend, same};
use crate::kernels::{args, blocks, empty, in_order, packed, suffix, with_backward, Source};

/// The kernels' source (after [`crate::kernels::PRELUDE`]).
pub const SOURCE: Source = Source {
    name: "logprob",
    text: include_str!("cuda/logprob.cu"),
    kernels: kernel_names,
};

/// Every kernel symbol of [`SOURCE`].
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for kind in ["fwd", "bwd"] {
        for s in ["f32", "bf16"] {
            names.push(format!("kevin_lp_{kind}_{s}"));
        }
    }
    names
}

/// Threads per block (`LP_THREADS` in `logprob.cu`).
const THREADS: u32 = 512;

/// Whether this path is taken where it serves: the fused log-probabilities (burn's ops when
/// off); process-wide, on by default.
pub static SWITCH: crate::kernels::Switch = crate::kernels::Switch::on();

/// `log_softmax(logits[rows[n]])[targets[n]]` for each `n`, `-> [N]` in f32, of `logits [.., V]`
/// taken as `[M, V]` (M rows: the product of the leading dimensions, in order) with `rows` and
/// `targets` `[N]` (`rows` distinct, each below `M`; a target outside `0..V` gives NaN), through this path when the backend is burn's CUDA backend (f32 or bf16 logits,
/// i32 indices, with or without autodiff) and [`SWITCH`] is on; `Err` gives the operands back
/// untouched otherwise.
#[allow(clippy::type_complexity)]
///
/// The logits are taken as they are, not reshaped: a reshape alone between the model's last
/// product and this operation makes burn's fusion (0.21) generate a kernel that indexes past its
/// inputs.
pub fn chosen_logprobs<B: Backend, const D: usize>(
    logits: Tensor<B, D>,
    rows: Tensor<B, 1, Int>,
    targets: Tensor<B, 1, Int>,
) -> Result<Tensor<B, 1>, (Tensor<B, D>, Tensor<B, 1, Int>, Tensor<B, 1, Int>)> {
    if !serves(&logits, &rows, &targets) {
        return Err((logits, rows, targets));
    }
    let out = crate::cublas::on_cuda!(X => through::<B, X, D>(&logits, &rows, &targets));
    out.ok_or((logits, rows, targets))
}

fn serves<B: Backend, const D: usize>(
    logits: &Tensor<B, D>,
    rows: &Tensor<B, 1, Int>,
    targets: &Tensor<B, 1, Int>,
) -> bool {
    if !SWITCH.get() || !crate::cublas::is_cuda::<B>() {
        return false;
    }
    if !matches!(logits.dtype(), DType::F32 | DType::BF16)
        || rows.dtype() != DType::I32
        || targets.dtype() != DType::I32
        || rows.dims() != targets.dims()
        || D < 2
        || i32::try_from(logits.dims()[D - 1]).is_err()
    {
        return false;
    }
    crate::kernels::usable(&SOURCE, &logits.device(), "fused log-probabilities")
}

fn through<B: Backend, X: ChosenLogprobs, const D: usize>(
    logits: &Tensor<B, D>,
    rows: &Tensor<B, 1, Int>,
    targets: &Tensor<B, 1, Int>,
) -> Option<Tensor<B, 1>> {
    // `as_backend` checks that `B` is `X`; the indices' primitives are then `X`'s too.
    let x = as_backend::<B, X, D>(logits.clone())?;
    let rows: IntTensor<X> = same(rows.clone().into_primitive());
    let targets: IntTensor<X> = same(targets.clone().into_primitive());
    Some(from_backend::<X, B, 1>(X::chosen_logprobs(
        x, rows, targets,
    )))
}

/// A backend with the kernels: the forward pass with each row's log-sum-exp, and the logits'
/// gradient from it.
pub trait LogprobKernels: Backend {
    /// `(logp [N], lse [N])`, both f32, of `x [.., V]` (as `[M, V]`), `rows`, `targets [N]`.
    fn logprob_forward(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
    ) -> [FloatTensor<Self>; 2];

    /// The gradient of `x` (its shape and dtype) given the gradient `g [N]` of the forward's
    /// `logp`.
    fn logprob_backward(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        g: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// A backend whose chosen-token log-probabilities can take this path (see
/// [`chosen_logprobs`]).
pub trait ChosenLogprobs: Backend {
    /// `logp [N]` in f32.
    fn chosen_logprobs(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self>;
}

// ---------------------------------------------------------------------------------------------
// CubeBackend: the kernels.

type Ct = CubeTensor<CudaRuntime>;

fn index_checks(x: &Ct, rows: &Ct, targets: &Ct) -> Result<(usize, usize, usize), String> {
    let (xs, n) = (x.meta.shape(), rows.meta.shape()[0]);
    if xs.len() < 2 || rows.dtype != DType::I32 || targets.dtype != DType::I32 {
        return Err(format!(
            "logits {xs:?}, indices {:?} and {:?} (logits of 2 or more dimensions, i32 \
             indices)",
            rows.dtype, targets.dtype
        ));
    }
    if targets.meta.shape()[0] != n {
        return Err(format!("{n} rows and {} targets", targets.meta.shape()[0]));
    }
    let v = xs[xs.len() - 1];
    Ok((xs[..xs.len() - 1].iter().product(), v, n))
}

fn cube_forward(x: Ct, rows: Ct, targets: Ct) -> Result<[Ct; 2], String> {
    let (x, rows, targets) = (packed(x), packed(rows), packed(targets));
    let (_, v, n) = index_checks(&x, &rows, &targets)?;
    let s = suffix(&x)?;
    let (logp, lse) = (
        empty(&x, vec![n], DType::F32),
        empty(&x, vec![n], DType::F32),
    );
    if n == 0 {
        return Ok([logp, lse]);
    }
    in_order(&SOURCE, &[&x, &rows, &targets, &logp, &lse], |e, p| {
        let mut a = args(p, &[&(v as i32).to_ne_bytes()]);
        e.launch(
            &format!("kevin_lp_fwd_{s}"),
            blocks(n, 1)?,
            THREADS,
            0,
            &mut a,
        )
    })?;
    Ok([logp, lse])
}

fn cube_backward(x: Ct, rows: Ct, targets: Ct, lse: Ct, g: Ct) -> Result<Ct, String> {
    let (x, rows, targets) = (packed(x), packed(rows), packed(targets));
    let (lse, mut g) = (packed(lse), packed(g));
    let (m, v, n) = index_checks(&x, &rows, &targets)?;
    let s = suffix(&x)?;
    if lse.dtype != DType::F32 {
        return Err(format!("log-sum-exp of dtype {:?} (f32)", lse.dtype));
    }
    if g.dtype != DType::F32 {
        g = burn_cubecl::kernel::cast(g, DType::F32);
    }
    let dx = empty(&x, x.meta.shape().to_vec(), x.dtype);
    if m * v == 0 {
        return Ok(dx);
    }
    in_order(&SOURCE, &[&x, &rows, &targets, &lse, &g, &dx], |e, p| {
        // Zeros first, on the same stream: the rows no token is predicted from.
        e.zero(p[5], m * v * x.dtype.size())?;
        if n == 0 {
            return Ok(());
        }
        let mut a = args(p, &[&(v as i32).to_ne_bytes()]);
        e.launch(
            &format!("kevin_lp_bwd_{s}"),
            blocks(n, 1)?,
            THREADS,
            0,
            &mut a,
        )
    })?;
    Ok(dx)
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> LogprobKernels
    for CubeBackend<CudaRuntime, F, I, BT>
{
    fn logprob_forward(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        cube_forward(x, rows, targets).unwrap_or_else(|e| panic!("log-probabilities: {e}"))
    }

    fn logprob_backward(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        g: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        cube_backward(x, rows, targets, lse, g)
            .unwrap_or_else(|e| panic!("log-probabilities, backward: {e}"))
    }
}

/// Without autodiff: the forward's log-probabilities.
impl<B: LogprobKernels> ChosenLogprobs for B {
    fn chosen_logprobs(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let [logp, _] = Self::logprob_forward(x, rows, targets);
        logp
    }
}

// ---------------------------------------------------------------------------------------------
// Fusion: custom operations on the inner backend's tensors.

/// The forward (inputs x, rows, targets; outputs logp, lse) or the backward (inputs x, rows,
/// targets, lse, g; output dx) as a fusion custom operation.
#[derive(Debug)]
struct FusedPass<B> {
    desc: CustomOpIr,
    backward: bool,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + LogprobKernels> Operation<B::FusionRuntime> for FusedPass<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ins = &self.desc.inputs;
        let x = handles.get_float_tensor::<B>(&ins[0]);
        let rows = handles.get_int_tensor::<B>(&ins[1]);
        let targets = handles.get_int_tensor::<B>(&ins[2]);
        let outs: Vec<FloatTensor<B>> = if self.backward {
            let lse = handles.get_float_tensor::<B>(&ins[3]);
            let g = handles.get_float_tensor::<B>(&ins[4]);
            vec![B::logprob_backward(x, rows, targets, lse, g)]
        } else {
            B::logprob_forward(x, rows, targets).into()
        };
        for (ir, t) in self.desc.outputs.iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, t);
        }
    }
}

fn fused_pass<B: FusionBackend + LogprobKernels, const N: usize>(
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: [(Shape, DType); N],
    backward: bool,
) -> [FloatTensor<Fusion<B>>; N] {
    let name = if backward {
        "kevin_logprob_backward"
    } else {
        "kevin_logprob_forward"
    };
    crate::kernels::custom_op(name, inputs, outputs, |desc| FusedPass::<B> {
        desc,
        backward,
        _b: std::marker::PhantomData,
    })
}

impl<B: FusionBackend + LogprobKernels> LogprobKernels for Fusion<B> {
    fn logprob_forward(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let n = Shape::from(vec![rows.shape[0]]);
        let outs = [(n.clone(), DType::F32), (n, DType::F32)];
        fused_pass::<B, 2>(vec![x, rows, targets], outs, false)
    }

    fn logprob_backward(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        g: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let like = (x.shape.clone(), x.dtype);
        let [dx] = fused_pass::<B, 1>(vec![x, rows, targets, lse, g], [like], true);
        dx
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: the forward keeps what the backward kernel reads.

impl<B: LogprobKernels, C: CheckpointStrategy> ChosenLogprobs for Autodiff<B, C> {
    fn chosen_logprobs(
        x: FloatTensor<Self>,
        rows: IntTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        let [logp, lse] = B::logprob_forward(x.primitive.clone(), rows.clone(), targets.clone());
        // Kept: the logits, the rows, the targets and the log-sum-exp.
        let state = (x.primitive.clone(), rows, targets, lse);
        with_backward::<B, C, _, 1>([&x], logp, state, |(x, rows, targets, lse), g| {
            [B::logprob_backward(x, rows, targets, lse, g)]
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn logprob_kernels_compile_for_sm_90() {
        crate::kernels::assert_compiles(&super::SOURCE);
        assert_eq!(super::kernel_names().len(), 4);
    }
}
