//! Causal self-attention without the score matrix, for the learner on burn's CUDA backend
//! (issue 18): a backend extension ([`FlashKernels`], [`FlashAttention`]) at each of the
//! backend's layers:
//! - `CubeBackend<CudaRuntime, ..>`: the kernels of `cuda/flash.cu` (FlashAttention-2's
//!   recurrence, f32 arithmetic; bf16 tensors on tensor cores where their rows start on 16 bytes,
//!   f32 tensors and the rest on CUDA cores) on the tensors' device memory: the forward pass writes the output and each row's log-sum-exp; the backward pass
//!   recomputes the probabilities from them, tile by tile;
//! - `Fusion<..>`: custom operations (never fused);
//! - `Autodiff<..>`: the forward keeps q, k, v, the output and the log-sum-exp; the backward is
//!   the two gradient kernels.
//!
//! burn's attention in [`crate::qwen2`] materialises `[b, h, t, t]` scores in f32 and keeps
//! several copies of them for the backward pass: at the RL loop's 2,560-token sequences that is
//! 100 MB per sequence and head per layer, and its time and memory grow with `t^2` per
//! sequence. Here memory is `O(t)` per row and no score leaves the chip.
//!
//! The plain-burn reference is [`crate::qwen2`]'s own attention (matmul, mask, softmax, matmul),
//! used on every other backend, when [`SWITCH`] turns this off, or when this path cannot
//! serve (no NVRTC; a head dimension other than 16, 32, 64 or 128; query heads not a multiple of
//! the key/value heads). `qwen2_gpu.rs` compares the two, values and gradients.
//!
//! Streams: the kernels are ordered against burn's as [`crate::cublas`]'s products are: on
//! cubecl's own stream where it is found, fenced on both sides otherwise
//! ([`crate::kernels::in_order`]).

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::ir::{CustomOpIr, HandleContainer};
use burn::backend::Autodiff;
use burn::cubecl::cuda::CudaRuntime;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_fusion::stream::Operation;
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use kevin::gpu::device::ArgPack;

use crate::cublas::{as_backend, from_backend};
use crate::kernels::{empty, in_order, suffix, with_backward, Engine, Source};

/// The kernels' source (after [`crate::kernels::PRELUDE`]).
pub const SOURCE: Source = Source {
    name: "flash",
    text: include_str!("cuda/flash.cu"),
    kernels: kernel_names,
};

/// Head dimensions the kernels are built for.
pub const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

const KINDS: [&str; 3] = ["fwd", "dq", "dkdv"];

/// Every kernel symbol of [`SOURCE`]: the CUDA-core kernels in f32 and bf16, and the
/// tensor-core ones (`tc` before the kind) in bf16.
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for kind in KINDS {
        for d in HEAD_DIMS {
            for s in ["f32", "bf16"] {
                names.push(format!("kevin_fa_{kind}{d}_{s}"));
            }
            names.push(format!("kevin_fa_tc{kind}{d}_bf16"));
        }
    }
    names.push(GQA_SUM.to_string());
    names
}

/// The tensor cores' dk/dv with grouped queries: each query head's part summed over its group.
const GQA_SUM: &str = "kevin_fa_gqa_sum_bf16";
/// [`GQA_SUM`]'s threads a block; each thread sums 4 values.
const GQA_SUM_THREADS: u32 = 256;

/// [`GQA_SUM`]'s blocks for `n` values of dk (and as many of dv).
fn gqa_sum_blocks(n: usize) -> usize {
    n.div_ceil(4 * GQA_SUM_THREADS as usize)
}

/// Rows (queries or keys) per block of every kernel (`FA_ROWS`, `TC_ROWS`).
const ROWS: usize = 64;

/// Threads per block of kernel `kind`: 8 warps of 8 rows on CUDA cores (`FA_WARPS`), 4 warps of
/// 16 rows on tensor cores.
fn block_threads(kind: &str) -> u32 {
    if kind.starts_with("tc") {
        128
    } else {
        256
    }
}

/// Shared memory of kernel `kind` for head dimension `d`, in bytes (`flash.cu`'s layouts).
fn smem_bytes(kind: &str, d: usize) -> u32 {
    let (p, tc) = (d + 4, d + 8);
    let bytes = match kind {
        "fwd" => (64 + ROWS) * p * 4,
        "dq" => (64 + 2 * ROWS) * p * 4,
        "dkdv" => ((64 + 2 * ROWS) * p + 64) * 4,
        "tcfwd" => 3 * ROWS * tc * 2,
        _ => 4 * ROWS * tc * 2 + 2 * ROWS * 4,
    };
    bytes as u32
}

/// The kernel family for operands of suffix `s` at these device addresses: the tensor cores'
/// (`"tc"`) for bf16 when every row starts on 16 bytes (they read rows as 16-byte vectors),
/// the CUDA cores' (`""`) otherwise.
fn family(s: &str, ptrs: &[u64], strides: &[Vec<usize>]) -> &'static str {
    let aligned = ptrs.iter().all(|p| p % 16 == 0)
        && strides.iter().all(|st| st[..3].iter().all(|x| x % 8 == 0));
    if s == "bf16" && aligned {
        "tc"
    } else {
        ""
    }
}

/// Whether this path is taken where it serves: flash attention (burn's attention when off);
/// process-wide, on by default.
pub static SWITCH: crate::kernels::Switch = crate::kernels::Switch::on();

/// Why `q [b, h, t, d]` over `k [b, kv, t, d]` is outside what the kernels cover, if it is.
pub fn unsupported(q: [usize; 4], k: [usize; 4]) -> Option<String> {
    let (h, kv, d) = (q[1], k[1], q[3]);
    if !HEAD_DIMS.contains(&d) {
        return Some(format!("head dimension {d} (one of {HEAD_DIMS:?})"));
    }
    if kv == 0 || h % kv != 0 {
        return Some(format!("{h} query heads over {kv} key/value heads"));
    }
    if k[0] != q[0] || k[2] != q[2] || k[3] != d {
        return Some(format!("keys {k:?} for queries {q:?}"));
    }
    None
}

/// Causal attention `softmax(q k^T / sqrt(d) + causal mask) v` of `q [b, h, t, d]` over
/// `k, v [b, kv, t, d]` (query head `i` reads key/value head `i / (h / kv)`), `-> [b, h, t, d]`,
/// through this path when the backend is burn's CUDA backend (f32 or bf16, with or without
/// autodiff), [`SWITCH`] is on and it serves the shapes; `Err` gives the operands back untouched
/// otherwise.
#[allow(clippy::type_complexity)]
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Result<Tensor<B, 4>, (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>)> {
    if !serves(&q, &k, &v) {
        return Err((q, k, v));
    }
    let out = crate::cublas::on_cuda!(X => through::<B, X>(&q, &k, &v));
    out.ok_or((q, k, v))
}

/// Whether [`causal_attention`] takes these operands (backend, dtypes, shapes, kernels).
fn serves<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>) -> bool {
    if !SWITCH.get() || !crate::cublas::is_cuda::<B>() {
        return false;
    }
    let dt = q.dtype();
    if !matches!(dt, DType::F32 | DType::BF16) || k.dtype() != dt || v.dtype() != dt {
        return false;
    }
    if k.dims() != v.dims() || unsupported(q.dims(), k.dims()).is_some() {
        return false;
    }
    crate::kernels::usable(&SOURCE, &q.device(), "flash attention")
}

fn through<B: Backend, X: FlashAttention>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
) -> Option<Tensor<B, 4>> {
    let q = as_backend::<B, X, 4>(q.clone())?;
    let k = as_backend::<B, X, 4>(k.clone())?;
    let v = as_backend::<B, X, 4>(v.clone())?;
    Some(from_backend::<X, B, 4>(X::flash_attention(q, k, v)))
}

/// A backend with the attention kernels: the forward pass with each row's log-sum-exp, and the
/// gradients from them.
pub trait FlashKernels: Backend {
    /// `(out [b, h, t, d], lse [b, h, t] in f32)` of `q [b, h, t, d]`, `k, v [b, kv, t, d]`.
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];

    /// `(dq, dk, dv)` from the forward's operands and results and the output's gradient.
    fn flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3];
}

/// A backend whose causal attention can take this path (see [`causal_attention`]).
pub trait FlashAttention: Backend {
    /// The attention's output, `[b, h, t, d]`.
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

// ---------------------------------------------------------------------------------------------
// CubeBackend: the kernels.

impl<F: FloatElement, I: IntElement, BT: BoolElement> FlashKernels
    for CubeBackend<CudaRuntime, F, I, BT>
{
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        cube_forward(q, k, v).unwrap_or_else(|e| panic!("flash attention, forward: {e}"))
    }

    fn flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        cube_backward(q, k, v, out, lse, dout)
            .unwrap_or_else(|e| panic!("flash attention, backward: {e}"))
    }
}

/// Without autodiff: the forward's output.
impl<B: FlashKernels> FlashAttention for B {
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [out, _] = Self::flash_forward(q, k, v);
        out
    }
}

type Ct = CubeTensor<CudaRuntime>;

/// `t` with its last dimension packed (a copy when it is not).
fn last_packed(t: Ct) -> Ct {
    if t.meta.strides()[3] == 1 || t.meta.shape()[3] == 1 {
        t
    } else {
        burn_cubecl::kernel::into_contiguous(t)
    }
}

fn dims4(t: &Ct) -> Result<[usize; 4], String> {
    let s = t.meta.shape();
    <[usize; 4]>::try_from(&s[..]).map_err(|_| format!("shape {s:?} is not 4-d"))
}

/// The strides the kernels take for q, k, v: (batch, head, row) of each.
fn strides(ts: [&Ct; 3], args: &mut ArgPack) {
    for t in ts {
        for i in 0..3 {
            args.push(&(t.meta.strides()[i] as i64).to_ne_bytes());
        }
    }
}

fn cube_forward(q: Ct, k: Ct, v: Ct) -> Result<[Ct; 2], String> {
    let (q, k, v) = (last_packed(q), last_packed(k), last_packed(v));
    let ([b, h, t, d], kd) = (dims4(&q)?, dims4(&k)?);
    if let Some(why) = unsupported([b, h, t, d], kd) {
        return Err(why);
    }
    let s = suffix(&q)?;
    let out = empty(&q, vec![b, h, t, d], q.dtype);
    let lse = empty(&q, vec![b, h, t], DType::F32);
    if b * h * t == 0 {
        return Ok([out, lse]);
    }
    let st = [&q, &k, &v].map(|t| t.meta.strides().to_vec());
    in_order(&SOURCE, &[&q, &k, &v, &out, &lse], |e, p| {
        let mut a = ArgPack::default();
        p.iter().for_each(|&x| a.ptr(x));
        push_dims(&mut a, h, kd[1], t);
        strides([&q, &k, &v], &mut a);
        a.push(&((d as f32).powf(-0.5)).to_ne_bytes());
        let f = family(s, &p[..3], &st);
        launch(e, &format!("{f}fwd{d}_{s}"), grid(f, b * h, t), d, &mut a)
    })?;
    Ok([out, lse])
}

/// The grid of a kernel of family `f` over `heads` heads of `t` rows: the tensor cores' take the
/// heads on x and the row blocks on y (dispatched heaviest first, see `flash.cu`), the CUDA
/// cores' the row blocks on x.
fn grid(f: &str, heads: usize, t: usize) -> (usize, usize) {
    if f == "tc" {
        (heads, t.div_ceil(ROWS))
    } else {
        (t.div_ceil(ROWS), heads)
    }
}

fn push_dims(a: &mut ArgPack, h: usize, kv: usize, t: usize) {
    push_i32s(a, &[h, kv, t]);
}

fn push_i32s(a: &mut ArgPack, xs: &[usize]) {
    for &x in xs {
        a.push(&(x as i32).to_ne_bytes());
    }
}

fn cube_backward(q: Ct, k: Ct, v: Ct, out: Ct, lse: Ct, dout: Ct) -> Result<[Ct; 3], String> {
    let (q, k, v) = (last_packed(q), last_packed(k), last_packed(v));
    let packed = burn_cubecl::kernel::into_contiguous::<CudaRuntime>;
    let (out, lse, dout) = (packed(out), packed(lse), packed(dout));
    let ([b, h, t, d], kd) = (dims4(&q)?, dims4(&k)?);
    if let Some(why) = unsupported([b, h, t, d], kd) {
        return Err(why);
    }
    let kv = kd[1];
    let s = suffix(&q)?;
    let dq = empty(&q, vec![b, h, t, d], q.dtype);
    let dk = empty(&q, vec![b, kv, t, d], q.dtype);
    let dv = empty(&q, vec![b, kv, t, d], q.dtype);
    let dd = empty(&q, vec![b, h, t], DType::F32);
    if b * h * t == 0 {
        return Ok([dq, dk, dv]);
    }
    let scale = (d as f32).powf(-0.5);
    let st = [&q, &k, &v].map(|t| t.meta.strides().to_vec());
    // With grouped queries the tensor cores' dk/dv runs a block a query head and writes each
    // head's part here (f32), then GQA_SUM adds the groups up: made for every grouped bf16 call
    // (the family is known only with the addresses), unused on the CUDA cores.
    let parts = (h != kv && s == "bf16").then(|| {
        let part = || empty(&q, vec![b, h, t, d], DType::F32);
        (part(), part())
    });
    let mut tensors = vec![&q, &k, &v, &out, &dout, &lse, &dd, &dq, &dk, &dv];
    if let Some((pk, pv)) = &parts {
        tensors.extend([pk, pv]);
    }
    in_order(&SOURCE, &tensors, |e, p| {
        let f = family(s, &[p[0], p[1], p[2], p[4]], &st);
        let mut a = ArgPack::default();
        // fa_dq(q, k, v, o, dout, lse, dd, dq, ..)
        p[..8].iter().for_each(|&x| a.ptr(x));
        push_dims(&mut a, h, kv, t);
        strides([&q, &k, &v], &mut a);
        a.push(&scale.to_ne_bytes());
        launch(e, &format!("{f}dq{d}_{s}"), grid(f, b * h, t), d, &mut a)?;
        // fa_dkdv(q, k, v, dout, lse, dd, dk, dv, ..), tc: (.., dk, dv, pk, pv, ..)
        let mut a = ArgPack::default();
        for i in [0, 1, 2, 4, 5, 6, 8, 9] {
            a.ptr(p[i]);
        }
        let grouped = f == "tc" && parts.is_some();
        if f == "tc" {
            for i in [10, 11] {
                a.ptr(if grouped { p[i] } else { 0 });
            }
        }
        push_dims(&mut a, h, kv, t);
        strides([&q, &k, &v], &mut a);
        a.push(&scale.to_ne_bytes());
        let heads = if f == "tc" { b * h } else { b * kv };
        launch(e, &format!("{f}dkdv{d}_{s}"), grid(f, heads, t), d, &mut a)?;
        if !grouped {
            return Ok(());
        }
        // gqa_sum(pk, pv, dk, dv, h, kv, rows, n)
        let mut a = ArgPack::default();
        for i in [10, 11, 8, 9] {
            a.ptr(p[i]);
        }
        let (rows, n) = (t * d, b * kv * t * d);
        push_i32s(&mut a, &[h, kv]);
        a.push(&(rows as i64).to_ne_bytes());
        a.push(&(n as i64).to_ne_bytes());
        let blocks =
            u32::try_from(gqa_sum_blocks(n)).map_err(|_| format!("{n} elements of dk and dv"))?;
        e.launch(GQA_SUM, (blocks, 1, 1), GQA_SUM_THREADS, 0, &mut a)
    })?;
    Ok([dq, dk, dv])
}

/// Launches `kevin_fa_{name}` (e.g. "fwd64_f32", "tcdq64_bf16") on `grid` blocks for head
/// dimension `d`: the block and shared memory its kind takes.
fn launch(
    e: &Engine,
    name: &str,
    grid: (usize, usize),
    d: usize,
    args: &mut ArgPack,
) -> Result<(), String> {
    let kind = &name[..name
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(name.len())];
    let (gx, gy) = (
        u32::try_from(grid.0).map_err(|_| format!("{} blocks on x", grid.0))?,
        u32::try_from(grid.1).map_err(|_| format!("{} blocks on y", grid.1))?,
    );
    if gx > i32::MAX as u32 || gy > 65_535 {
        return Err(format!(
            "a grid of {gx} x {gy} blocks for {name} is over CUDA's 2^31 - 1 x 65,535"
        ));
    }
    let smem = smem_bytes(kind, d);
    e.launch(
        &format!("kevin_fa_{name}"),
        (gx, gy, 1),
        block_threads(kind),
        smem,
        args,
    )
}

// ---------------------------------------------------------------------------------------------
// Fusion: custom operations on the inner backend's tensors.

/// One of the kernels' passes as a fusion custom operation: the forward (inputs q, k, v;
/// outputs out, lse) or the backward (inputs q, k, v, out, lse, dout; outputs dq, dk, dv).
#[derive(Debug)]
struct FusedPass<B> {
    desc: CustomOpIr,
    backward: bool,
    _b: std::marker::PhantomData<B>,
}

impl<B: FusionBackend + FlashKernels> Operation<B::FusionRuntime> for FusedPass<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let mut ins = self
            .desc
            .inputs
            .iter()
            .map(|t| handles.get_float_tensor::<B>(t))
            .collect::<Vec<_>>()
            .into_iter();
        let mut next = || ins.next().expect("the pass's inputs, as registered");
        let outs: Vec<FloatTensor<B>> = if self.backward {
            let (q, k, v, o, l, g) = (next(), next(), next(), next(), next(), next());
            B::flash_backward(q, k, v, o, l, g).into()
        } else {
            let (q, k, v) = (next(), next(), next());
            B::flash_forward(q, k, v).into()
        };
        for (ir, t) in self.desc.outputs.iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, t);
        }
    }
}

/// Registers a [`FusedPass`] of `inputs` with outputs of these shapes and dtypes.
fn fused_pass<B: FusionBackend + FlashKernels, const N: usize>(
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: [(Shape, DType); N],
    backward: bool,
) -> [FloatTensor<Fusion<B>>; N] {
    let name = if backward {
        "kevin_flash_backward"
    } else {
        "kevin_flash_forward"
    };
    crate::kernels::custom_op(name, inputs, outputs, |desc| FusedPass::<B> {
        desc,
        backward,
        _b: std::marker::PhantomData,
    })
}

impl<B: FusionBackend + FlashKernels> FlashKernels for Fusion<B> {
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let dims = q.shape.to_vec();
        let [b, h, t, _] = <[usize; 4]>::try_from(&dims[..]).expect("4-d queries");
        let out = (q.shape.clone(), q.dtype);
        let lse = (Shape::from(vec![b, h, t]), DType::F32);
        fused_pass::<B, 2>(vec![q, k, v], [out, lse], false)
    }

    fn flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let like = |t: &FloatTensor<Self>| (t.shape.clone(), t.dtype);
        let grads = [like(&q), like(&k), like(&v)];
        fused_pass::<B, 3>(vec![q, k, v, out, lse, dout], grads, true)
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: the forward keeps what the backward kernels read.

impl<B: FlashKernels, C: CheckpointStrategy> FlashAttention for Autodiff<B, C> {
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [out, lse] = B::flash_forward(
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
        );
        // Kept: q, k, v, the output and the log-sum-exp.
        let state = [
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
            out.clone(),
            lse,
        ];
        with_backward::<B, C, _, 3>([&q, &k, &v], out, state, |[q, k, v, out, lse], dout| {
            B::flash_backward(q, k, v, out, lse, dout)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_kernels_compile_for_sm_90() {
        crate::kernels::assert_compiles(&SOURCE);
    }

    #[test]
    fn unsupported_shapes_are_named() {
        assert_eq!(unsupported([2, 4, 10, 64], [2, 2, 10, 64]), None);
        let e = unsupported([2, 4, 10, 48], [2, 2, 10, 48]).unwrap();
        assert!(e.contains("head dimension 48"), "{e}");
        let e = unsupported([2, 6, 10, 64], [2, 4, 10, 64]).unwrap();
        assert!(e.contains("6 query heads over 4"), "{e}");
        assert!(unsupported([2, 4, 10, 64], [2, 2, 11, 64]).is_some());
    }

    #[test]
    fn shared_memory_fits_the_h200_and_names_every_kernel() {
        for d in HEAD_DIMS {
            for kind in KINDS {
                for kind in [kind.to_string(), format!("tc{kind}")] {
                    // 227 KB per block on sm_90; 48 KB without the opt-in attribute.
                    assert!(smem_bytes(&kind, d) <= 227 * 1024, "{kind} {d}");
                }
            }
        }
        // f32 and bf16 on CUDA cores, bf16 on tensor cores, and the groups' sum.
        assert_eq!(kernel_names().len(), KINDS.len() * HEAD_DIMS.len() * 3 + 1);
        assert_eq!(block_threads("tcdkdv"), 128);
        assert_eq!(block_threads("dkdv"), 256);
    }

    #[test]
    fn tensor_cores_only_for_bf16_rows_on_16_bytes() {
        let packed = vec![4096, 1024, 64, 1];
        let all = [packed.clone(), packed.clone(), packed.clone()];
        assert_eq!(family("bf16", &[256, 512, 1024], &all), "tc");
        assert_eq!(family("f32", &[256, 512, 1024], &all), "");
        // A row or a pointer off 16 bytes takes the CUDA cores.
        assert_eq!(family("bf16", &[256, 514, 1024], &all), "");
        let odd = [packed.clone(), vec![4096, 1024, 68, 1], packed];
        assert_eq!(family("bf16", &[256, 512, 1024], &odd), "");
    }

    /// The tensor cores' three passes on kevin's CPU device model against f64 arithmetic over the
    /// same bf16 inputs, each pass fed what the one before wrote: the forward (out, lse), dq
    /// (with rowsum(dout * out)), and dk, dv with grouped queries (a block a query head, each
    /// head's part summed by GQA_SUM) and with one query head a key/value head (written
    /// directly); two blocks of rows, the last one partial, on the grids `grid` gives.
    #[test]
    fn tensor_core_passes_match_f64_on_the_cpu_model() {
        use half::bf16;
        use kevin::candidate::{ResolvedArg as A, Scalar};
        const D: usize = 16;
        let (b, t) = (1usize, 80usize);
        let scale = (D as f64).powf(-0.5);
        let wave = |n: usize, f: f64| -> Vec<f64> {
            (0..n)
                .map(|i| bf16::from_f64((i as f64 * f + 0.3).sin()).to_f64())
                .collect()
        };
        let dot = |a: &[f64], c: &[f64]| a.iter().zip(c).map(|(x, y)| x * y).sum::<f64>();
        let bf = |x: &[f64]| -> Vec<u8> {
            x.iter()
                .flat_map(|&v| bf16::from_f64(v).to_bits().to_ne_bytes())
                .collect()
        };
        let bf_values = |x: &[u8]| -> Vec<f64> {
            x.chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64())
                .collect()
        };
        let f32_values = |x: &[u8]| -> Vec<f64> {
            x.chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect()
        };
        let close = |what: &str, got: &[f64], want: &[f64], tol: f64| {
            assert_eq!(got.len(), want.len(), "{what}");
            let top = want.iter().fold(1e-30f64, |a, x| a.max(x.abs()));
            let diff = got
                .iter()
                .zip(want)
                .fold(0f64, |a, (x, y)| a.max((x - y).abs()));
            assert!(diff <= tol * top, "{what}: {diff} of {top}");
        };
        for (h, kv) in [(4usize, 2usize), (2, 2)] {
            let (q, k, v, dout) = (
                wave(b * h * t * D, 0.37),
                wave(b * kv * t * D, 0.53),
                wave(b * kv * t * D, 0.71),
                wave(b * h * t * D, 0.29),
            );
            let row = |x: &[f64], head: usize, i: usize| x[(head * t + i) * D..][..D].to_vec();
            // The f64 passes, per query head.
            let (mut out, mut lse, mut dd) =
                (vec![0.0; h * t * D], vec![0.0; h * t], vec![0.0; h * t]);
            let mut dq = vec![0.0; h * t * D];
            let (mut dk, mut dv) = (vec![0.0; kv * t * D], vec![0.0; kv * t * D]);
            for hq in 0..h {
                let hk = hq / (h / kv);
                let p: Vec<Vec<f64>> = (0..t)
                    .map(|i| {
                        let s: Vec<f64> = (0..=i)
                            .map(|j| dot(&row(&q, hq, i), &row(&k, hk, j)) * scale)
                            .collect();
                        let m = s.iter().cloned().fold(f64::MIN, f64::max);
                        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                        lse[hq * t + i] = m + z.ln();
                        s.iter().map(|x| (x - m).exp() / z).collect()
                    })
                    .collect();
                for i in 0..t {
                    for e in 0..D {
                        out[(hq * t + i) * D + e] =
                            (0..=i).map(|j| p[i][j] * row(&v, hk, j)[e]).sum();
                    }
                    dd[hq * t + i] = dot(&row(&dout, hq, i), &row(&out, hq, i));
                }
                for i in 0..t {
                    let (qi, doi) = (row(&q, hq, i), row(&dout, hq, i));
                    for j in 0..=i {
                        let ds = p[i][j] * (dot(&doi, &row(&v, hk, j)) - dd[hq * t + i]);
                        let kj = row(&k, hk, j);
                        for e in 0..D {
                            dv[(hk * t + j) * D + e] += p[i][j] * doi[e];
                            dk[(hk * t + j) * D + e] += scale * ds * qi[e];
                            dq[(hq * t + i) * D + e] += scale * ds * kj[e];
                        }
                    }
                }
            }
            // The kernels: buffers q, k, v, dout, out, lse, dd, dq, dk, dv, pk, pv.
            let mut bufs = vec![
                bf(&q),
                bf(&k),
                bf(&v),
                bf(&dout),
                vec![0u8; 2 * h * t * D],
                vec![0u8; 4 * h * t],
                vec![0u8; 4 * h * t],
                vec![0u8; 2 * h * t * D],
                vec![0u8; 2 * kv * t * D],
                vec![0u8; 2 * kv * t * D],
                vec![0u8; 4 * h * t * D],
                vec![0u8; 4 * h * t * D],
            ];
            let tail = || {
                let mut a: Vec<A> = [h, kv, t]
                    .into_iter()
                    .map(|x| A::Scalar(Scalar::I32(x as i32)))
                    .collect();
                for x in [
                    h * t * D,
                    t * D,
                    D,
                    kv * t * D,
                    t * D,
                    D,
                    kv * t * D,
                    t * D,
                    D,
                ] {
                    a.push(A::Scalar(Scalar::I64(x as i64)));
                }
                a.push(A::Scalar(Scalar::F32(scale as f32)));
                a
            };
            let run = |bufs: &mut Vec<Vec<u8>>, kind: &str, heads: usize, args: Vec<A>| {
                let (gx, gy) = grid("tc", heads, t);
                crate::kernels::run_on_cpu_model(
                    &SOURCE,
                    &format!("kevin_fa_tc{kind}{D}_bf16"),
                    [gx as u32, gy as u32, 1],
                    [128, 1, 1],
                    smem_bytes(&format!("tc{kind}"), D),
                    args,
                    bufs,
                )
            };
            let tensors = |ix: &[usize]| -> Vec<A> { ix.iter().map(|&i| A::Tensor(i)).collect() };
            // fwd(q, k, v, out, lse)
            let mut args = tensors(&[0, 1, 2, 4, 5]);
            args.extend(tail());
            if !run(&mut bufs, "fwd", b * h, args) {
                return;
            }
            close("out", &bf_values(&bufs[4]), &out, 1e-2);
            close("lse", &f32_values(&bufs[5]), &lse, 1e-5);
            // dq(q, k, v, out, dout, lse, dd, dq)
            let mut args = tensors(&[0, 1, 2, 4, 3, 5, 6, 7]);
            args.extend(tail());
            assert!(run(&mut bufs, "dq", b * h, args));
            close("dd", &f32_values(&bufs[6]), &dd, 1e-2);
            close("dq", &bf_values(&bufs[7]), &dq, 2e-2);
            // dkdv(q, k, v, dout, lse, dd, dk, dv, pk | null, pv | null)
            let grouped = h != kv;
            let mut args = tensors(&[0, 1, 2, 3, 5, 6, 8, 9]);
            for i in [10, 11] {
                args.push(if grouped {
                    A::Tensor(i)
                } else {
                    A::Scalar(Scalar::U64(0))
                });
            }
            args.extend(tail());
            assert!(run(&mut bufs, "dkdv", b * h, args));
            if grouped {
                let n = b * kv * t * D;
                let mut args = tensors(&[10, 11, 8, 9]);
                args.extend([
                    A::Scalar(Scalar::I32(h as i32)),
                    A::Scalar(Scalar::I32(kv as i32)),
                    A::Scalar(Scalar::I64((t * D) as i64)),
                    A::Scalar(Scalar::I64(n as i64)),
                ]);
                assert!(crate::kernels::run_on_cpu_model(
                    &SOURCE,
                    GQA_SUM,
                    [gqa_sum_blocks(n) as u32, 1, 1],
                    [GQA_SUM_THREADS, 1, 1],
                    0,
                    args,
                    &mut bufs,
                ));
            }
            close(
                &format!("dk (h {h}, kv {kv})"),
                &bf_values(&bufs[8]),
                &dk,
                2e-2,
            );
            close(
                &format!("dv (h {h}, kv {kv})"),
                &bf_values(&bufs[9]),
                &dv,
                2e-2,
            );
        }
    }
}
