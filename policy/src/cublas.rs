//! cuBLAS matrix products for the policy and the learner on the CUDA backend (issue 18): a
//! backend extension ([`BlasMatmul`]) on burn's CUDA backend, at each of its layers:
//! - `CubeBackend<CudaRuntime, ..>`: reads the operands' device addresses, and runs one
//!   `cublasGemmStridedBatchedEx` (fp32 compute: no TF32 for f32, bf16/f16 accumulated in f32)
//!   through `kevin::gpu::blas` into a fresh packed output;
//! - `Fusion<..>`: a custom operation (never fused; it closes the fusion block before it);
//! - `Autodiff<..>`: its backward is two more products through the same path.
//!
//! The plain-burn reference is `Tensor::matmul` (cubek's kernels; NdArray on the CPU), and a
//! test compares the two ([`crate::burn_tests`] on the GPU).
//!
//! Streams: the product is queued on cubecl's own stream for the calling stream id when
//! [`crate::stream`] finds it (in order with burn's kernels, no host wait). Otherwise it runs on a
//! stream of its own, fenced on both sides: the client is synchronised before the call (the
//! operands are written) and the own stream after it (the output is written before cubecl's next
//! kernel). A fence costs a host round trip, so only products worth it go to cuBLAS
//! ([`MIN_MNK`], [`TALL_ROWS`]); the rest stay with burn.
//!
//! [`matmul`] is the entry point of the model's code, which is generic over its backend: it
//! takes the cuBLAS path when the backend is burn's CUDA backend (`Cuda<f32>`, `Cuda<bf16>`, with
//! or without `Autodiff`), the
//! process-wide [`mode`] allows it and the product is large enough, and returns the operands
//! otherwise.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{binary, broadcast_shape, Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::backend::ir::{CustomOpIr, HandleContainer, OperationIr, OperationOutput, TensorIr};
use burn::backend::{Autodiff, Cuda};
use burn::cubecl::cuda::CudaRuntime;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use cudarc::driver::result as cu;
use cudarc::driver::sys as drv;
use half::bf16;
use kevin::baseline::Gemm;
use kevin::gpu::blas::{Blas, GemmCall};
use kevin::ops::Dtype;

/// Products with fewer multiply-adds (`batch * m * n * k`) than this stay with burn, unless they
/// are tall ([`TALL_ROWS`]): two host fences cost more than cuBLAS saves on them. On the H200 with
/// the 0.5B shape, sending every decode product to cuBLAS made 64-row generation 20% slower (the
/// largest, the MLP's, is 2.8e8), while the learner's key/value projections (9.4e8 at 8 x 1024
/// rows) were worth it.
pub const MIN_MNK: u64 = 1 << 30;

/// Products with at least this many rows (`batch * m`: the learner's and prefill's, not a
/// decode step's) go to cuBLAS from [`MIN_MNK_TALL`] multiply-adds.
pub const TALL_ROWS: u64 = 1024;

/// See [`TALL_ROWS`].
pub const MIN_MNK_TALL: u64 = 1 << 27;

/// Which products go to cuBLAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// None: burn's matmul everywhere (the reference path).
    Off,
    /// Those of at least [`MIN_MNK`] multiply-adds, or [`MIN_MNK_TALL`] when tall (the default
    /// on CUDA).
    Large,
    /// Every float product of the CUDA backend (tests).
    All,
}

static MODE: AtomicU8 = AtomicU8::new(1);

/// Sets the process-wide [`Mode`].
pub fn set_mode(mode: Mode) {
    MODE.store(mode as u8, Ordering::Relaxed);
}

/// The process-wide [`Mode`] (default [`Mode::Large`]).
pub fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        0 => Mode::Off,
        1 => Mode::Large,
        _ => Mode::All,
    }
}

impl Mode {
    /// The name [`parse_mode`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "burn",
            Mode::Large => "cublas",
            Mode::All => "cublas-all",
        }
    }
}

/// Parses a `--matmul` / `policy.burn.matmul` value: "burn" (off), "cublas" (large products)
/// or "cublas-all".
pub fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "burn" => Ok(Mode::Off),
        "cublas" => Ok(Mode::Large),
        "cublas-all" => Ok(Mode::All),
        other => Err(format!(
            "matmul {other:?}: expected \"burn\", \"cublas\" or \"cublas-all\""
        )),
    }
}

/// A backend whose float matrix product can run through cuBLAS.
pub trait BlasMatmul: Backend {
    /// `lhs [.., m, k] @ rhs [.., k, n]`, batch dimensions broadcast as `float_matmul` does.
    fn blas_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `$call` with `$x` naming each of burn's CUDA backends in turn (f32 and bf16, without and with
/// autodiff): the first one that is the caller's backend answers (`None` when none is).
macro_rules! on_cuda {
    ($x:ident => $call:expr) => {{
        let first = || {
            type $x = burn::backend::Cuda<f32>;
            $call
        };
        first()
            .or_else(|| {
                type $x = burn::backend::Autodiff<burn::backend::Cuda<f32>>;
                $call
            })
            .or_else(|| {
                type $x = burn::backend::Cuda<half::bf16>;
                $call
            })
            .or_else(|| {
                type $x = burn::backend::Autodiff<burn::backend::Cuda<half::bf16>>;
                $call
            })
    }};
}
pub(crate) use on_cuda;

/// `a @ b` through cuBLAS when the backend `B` is burn's CUDA backend, the [`mode`] allows
/// it and the product is worth it; `Err` gives the operands back untouched otherwise.
#[allow(clippy::type_complexity)]
pub fn matmul<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    if !wants(&a, &b) {
        return Err((a, b));
    }
    let out = on_cuda!(X => through::<B, X, D>(&a, &b));
    out.ok_or((a, b))
}

/// Whether [`matmul`] would take `a @ b` (backend aside): the mode, the dtypes, the size.
pub fn wants<B: Backend, const D: usize>(a: &Tensor<B, D>, b: &Tensor<B, D>) -> bool {
    wants_dims::<B>(a.dtype(), &a.dims(), b.dtype(), &b.dims())
}

/// [`wants`] from the operands' dtypes and dimensions (same rank), before building them: the
/// model asks this for `x @ weight` without making the weight's broadcast view unless it is used.
pub fn wants_dims<B: Backend>(da_type: DType, da: &[usize], db_type: DType, db: &[usize]) -> bool {
    let m = mode();
    let d = da.len();
    if m == Mode::Off || d < 2 || db.len() != d || da_type != db_type || dtype_of(da_type).is_none()
    {
        return false;
    }
    if !is_cuda::<B>() {
        return false;
    }
    let out = product_dims(da, db);
    let rows: u64 = out[..d - 1].iter().map(|&x| x as u64).product();
    let mnk = rows * db[d - 1] as u64 * da[d - 1] as u64;
    m == Mode::All || mnk >= MIN_MNK || rows >= TALL_ROWS && mnk >= MIN_MNK_TALL
}

/// The dimensions of `lhs [.., m, k] @ rhs [.., k, n]` (same rank): the batch dimensions
/// broadcast, then `[m, n]`.
fn product_dims(ls: &[usize], rs: &[usize]) -> Vec<usize> {
    let d = ls.len();
    let mut out: Vec<usize> = (0..d - 2).map(|i| ls[i].max(rs[i])).collect();
    out.extend([ls[d - 2], rs[d - 1]]);
    out
}

/// Whether `B` is burn's CUDA backend (f32 or bf16 default floats, with or without autodiff).
pub(crate) fn is_cuda<B: Backend>() -> bool {
    let b = TypeId::of::<B>();
    b == TypeId::of::<Cuda<f32>>()
        || b == TypeId::of::<Autodiff<Cuda<f32>>>()
        || b == TypeId::of::<Cuda<bf16>>()
        || b == TypeId::of::<Autodiff<Cuda<bf16>>>()
}

/// `a @ b` on `X` when `B` is `X`.
fn through<B: Backend, X: BlasMatmul, const D: usize>(
    a: &Tensor<B, D>,
    b: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    let (a, b) = (
        as_backend::<B, X, D>(a.clone())?,
        as_backend::<B, X, D>(b.clone())?,
    );
    Some(from_backend::<X, B, D>(X::blas_matmul(a, b)))
}

/// `p` as `Q`, which the caller has established is `P` itself (a move through `Any`): a
/// primitive of backend `B` as backend `X`'s once `B` is known to be `X`. Check the backends, not
/// the primitives: burn's CUDA backends in f32 and bf16 share one primitive type.
pub(crate) fn same<P: 'static, Q: 'static>(p: P) -> Q {
    let p: Box<dyn Any> = Box::new(p);
    *p.downcast::<Q>()
        .expect("one type: the caller checked the backends")
}

/// `t`'s float primitive as backend `X`'s, when `B` is `X` (a type check, then [`same`]).
pub(crate) fn as_backend<B: Backend, X: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> Option<FloatTensor<X>> {
    (TypeId::of::<B>() == TypeId::of::<X>()).then(|| same(t.into_primitive().tensor()))
}

/// The tensor of backend `B` holding `X`'s float primitive `p`; `B` must be `X`.
pub(crate) fn from_backend<X: Backend, B: Backend, const D: usize>(
    p: FloatTensor<X>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(same::<_, FloatTensor<B>>(p)))
}

fn dtype_of(d: DType) -> Option<Dtype> {
    match d {
        DType::F32 => Some(Dtype::F32),
        DType::BF16 => Some(Dtype::Bf16),
        DType::F16 => Some(Dtype::F16),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// CubeBackend: the product itself.

impl<F: FloatElement, I: IntElement, BT: BoolElement> BlasMatmul
    for CubeBackend<CudaRuntime, F, I, BT>
{
    fn blas_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        match cube_matmul(&lhs, &rhs) {
            Ok(out) => out,
            Err(why) => {
                fallback_warning(&why);
                Self::float_matmul(lhs, rhs)
            }
        }
    }
}

fn fallback_warning(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!("cuBLAS matmul unavailable, burn's matmul is used instead: {why}");
    });
}

/// One operand's last two dimensions as cuBLAS reads them, and its batch stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    /// Stored transposed (its rows are the contracted or the output's columns).
    pub(crate) trans: bool,
    /// Elements between consecutive stored rows.
    pub(crate) ld: i64,
    /// Elements between consecutive matrices of the batch (0: one matrix for all).
    pub(crate) batch_stride: i64,
}

/// How `shape`/`strides` (rank D, the last two `rows x cols`) map onto a strided batch of
/// `out_batch` matrices: `None` when they do not (a partial broadcast, a batch that is not
/// evenly strided, rows and columns both strided).
pub(crate) fn operand(shape: &[usize], strides: &[usize], out_batch: &[usize]) -> Option<Operand> {
    let d = shape.len();
    let (r, c) = (shape[d - 2], shape[d - 1]);
    let (sr, sc) = (strides[d - 2] as i64, strides[d - 1] as i64);
    let (trans, ld) = if c == 1 || sc == 1 {
        // Row-major (a single column reads as row-major with rows one apart).
        (false, if r == 1 { c as i64 } else { sr.max(c as i64) })
    } else if r == 1 || sr == 1 {
        (true, sc.max(r as i64))
    } else {
        return None;
    };
    if !trans && r > 1 && sr < c as i64 || trans && c > 1 && sc < r as i64 {
        return None;
    }
    // The batch: the operand's non-1 dimensions must be the output's, evenly strided.
    let dims: Vec<usize> = (0..d - 2).filter(|&i| shape[i] != 1).collect();
    if dims.is_empty() {
        return Some(Operand {
            trans,
            ld,
            batch_stride: 0,
        });
    }
    let out_dims: Vec<usize> = (0..d - 2).filter(|&i| out_batch[i] != 1).collect();
    if dims != out_dims || dims.iter().any(|&i| shape[i] != out_batch[i]) {
        return None;
    }
    for w in dims.windows(2) {
        if strides[w[0]] != strides[w[1]] * shape[w[1]] {
            return None;
        }
    }
    let batch_stride = strides[*dims.last()?] as i64;
    // Matrices of the batch must not overlap.
    let span = if trans { ld * c as i64 } else { ld * r as i64 };
    (batch_stride >= span).then_some(Operand {
        trans,
        ld,
        batch_stride,
    })
}

/// `lhs @ rhs` through cuBLAS, or why not.
fn cube_matmul(
    lhs: &CubeTensor<CudaRuntime>,
    rhs: &CubeTensor<CudaRuntime>,
) -> Result<CubeTensor<CudaRuntime>, String> {
    let dtype = dtype_of(lhs.dtype).ok_or_else(|| format!("dtype {:?}", lhs.dtype))?;
    if lhs.dtype != rhs.dtype {
        return Err(format!("mixed dtypes {:?} and {:?}", lhs.dtype, rhs.dtype));
    }
    if !Blas::available() {
        return Err("libcublas.so is not on the loader path".into());
    }
    let (ls, rs) = (lhs.meta.shape().to_vec(), rhs.meta.shape().to_vec());
    let d = ls.len();
    if d < 2 || rs.len() != d || ls[d - 1] != rs[d - 2] {
        return Err(format!("shapes {ls:?} @ {rs:?}"));
    }
    let (m, k, n) = (ls[d - 2], ls[d - 1], rs[d - 1]);
    let out_shape = product_dims(&ls, &rs);
    let out_batch = &out_shape[..d - 2];
    let batch: usize = out_batch.iter().product::<usize>().max(1);

    // A layout cuBLAS cannot read directly is copied packed first.
    let layout = |t: &CubeTensor<CudaRuntime>, name: &str| {
        if let Some(l) = operand(t.meta.shape(), t.meta.strides(), out_batch) {
            return Ok((t.clone(), l));
        }
        let packed = burn_cubecl::kernel::into_contiguous(t.clone());
        let l = operand(packed.meta.shape(), packed.meta.strides(), out_batch)
            .ok_or_else(|| format!("{name}: a partial broadcast"))?;
        Ok::<_, String>((packed, l))
    };
    let (a, la) = layout(lhs, "lhs")?;
    let (b, lb) = layout(rhs, "rhs")?;
    let out = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        lhs.client.clone(),
        lhs.device.clone(),
        Shape::from(out_shape.clone()),
        lhs.dtype,
    );
    if m * n * batch == 0 {
        return Ok(out);
    }
    // One product of batch * m rows when B is shared and A's matrices follow each other (a
    // linear layer): cuBLAS tiles one tall matrix better than a batch of short ones.
    let fold = lb.batch_stride == 0 && !la.trans && la.batch_stride == la.ld * m as i64;
    let (gm, gbatch) = if fold { (batch * m, 1) } else { (m, batch) };
    let to_u32 = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| format!("{what} = {v} is too large for one cuBLAS call"))
    };
    let g = Gemm {
        dtype,
        a: 0,
        b: 0,
        c: 0,
        m: to_u32(gm, "m")?,
        n: to_u32(n, "n")?,
        k: to_u32(k, "k")?,
        batch: to_u32(gbatch, "batch")?,
        trans_a: la.trans,
        trans_b: lb.trans,
        stride_a: if fold { 0 } else { la.batch_stride },
        stride_b: lb.batch_stride,
        stride_c: (m * n) as i64,
    };

    let (ptrs, held) = crate::kernels::addresses(&[&a, &b, &out])?;
    let (pa, pb, pc) = (ptrs[0], ptrs[1], ptrs[2]);
    let call = GemmCall {
        g: &g,
        f64: false,
        a: pa,
        b: pb,
        c: pc,
    };
    if let Some(stream) = crate::stream::cubecl_stream(lhs) {
        ON_CUBECL.with(|handles| -> Result<(), String> {
            let mut handles = handles.borrow_mut();
            let blas = match handles.entry(stream as usize) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    primary_context(lhs.device.index)?;
                    v.insert(Blas::new(stream).map_err(|e| e.to_string())?)
                }
            };
            blas.gemm_ld(&call, la.ld, lb.ld).map_err(|e| e.to_string())
        })?;
        drop(held);
        return Ok(out);
    }
    // Fence 1: every kernel that writes the operands has finished.
    burn::cubecl::future::block_on(lhs.client.sync()).map_err(|e| format!("sync: {e:?}"))?;
    OWN.with(|own| -> Result<(), String> {
        let mut own = own.borrow_mut();
        if own.is_none() {
            *own = Some(OwnStream::new(lhs.device.index)?);
        }
        let own = own.as_ref().expect("set above");
        own.blas
            .gemm_ld(&call, la.ld, lb.ld)
            .map_err(|e| e.to_string())?;
        // Fence 2: the output is written before cubecl's next kernel reads it.
        // SAFETY: the stream was created by this thread and lives in `own`.
        unsafe { cu::stream::synchronize(own.stream) }.map_err(|e| format!("sync: {e:?}"))
    })?;
    drop(held);
    Ok(out)
}

/// The calling thread's cuBLAS handle on a stream of its own, in the primary context of the
/// device (the context cubecl uses, so its addresses are valid here).
struct OwnStream {
    stream: drv::CUstream,
    blas: Blas,
}

impl OwnStream {
    fn new(device: usize) -> Result<OwnStream, String> {
        let (_, stream) = primary_stream(device)?;
        let blas = Blas::new(stream).map_err(|e| e.to_string())?;
        Ok(OwnStream { stream, blas })
    }
}

/// A new non-blocking stream in the primary context of GPU `device` (the context cubecl uses,
/// so burn's device addresses are valid on it), and that context, made current on this thread.
pub(crate) fn primary_stream(device: usize) -> Result<(drv::CUcontext, drv::CUstream), String> {
    let ctx = primary_context(device)?;
    let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
        .map_err(|e| format!("cuStreamCreate: {e:?}"))?;
    Ok((ctx, stream))
}

/// The primary context of GPU `device`, retained and made current on this thread.
pub(crate) fn primary_context(device: usize) -> Result<drv::CUcontext, String> {
    let err = |what: &str, e: cudarc::driver::DriverError| format!("{what}: {e:?}");
    cu::init().map_err(|e| err("cuInit", e))?;
    let dev = cu::device::get(device as i32).map_err(|e| err("cuDeviceGet", e))?;
    // SAFETY: the primary context is retained for the process's lifetime (never released, as
    // cubecl does) and made current on this thread.
    unsafe {
        let ctx = cu::primary_ctx::retain(dev).map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
        cu::ctx::set_current(ctx).map_err(|e| err("cuCtxSetCurrent", e))?;
        Ok(ctx)
    }
}

thread_local! {
    static OWN: RefCell<Option<OwnStream>> = const { RefCell::new(None) };
    /// The calling thread's cuBLAS handles on cubecl's streams, by stream.
    static ON_CUBECL: RefCell<std::collections::BTreeMap<usize, Blas>> =
        const { RefCell::new(std::collections::BTreeMap::new()) };
}

// ---------------------------------------------------------------------------------------------
// Fusion: a custom operation on the inner backend's tensors.

impl<B: FusionBackend + BlasMatmul> BlasMatmul for Fusion<B> {
    fn blas_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Op<B> {
            desc: CustomOpIr,
            _b: std::marker::PhantomData<B>,
        }
        impl<B1: FusionBackend + BlasMatmul> Operation<B1::FusionRuntime> for Op<B1> {
            fn execute(
                &self,
                handles: &mut HandleContainer<<B1::FusionRuntime as FusionRuntime>::FusionHandle>,
            ) {
                let ([a, b], [out]) = self.desc.as_fixed();
                let a = handles.get_float_tensor::<B1>(a);
                let b = handles.get_float_tensor::<B1>(b);
                handles.register_float_tensor::<B1>(&out.id, B1::blas_matmul(a, b));
            }
        }
        let dims = product_dims(&lhs.shape, &rhs.shape);
        let client = lhs.client.clone();
        let streams = OperationStreams::with_inputs([&lhs, &rhs]);
        let out = TensorIr::uninit(client.create_empty_handle(), Shape::from(dims), lhs.dtype);
        let desc = CustomOpIr::new(
            "kevin_cublas_matmul",
            &[lhs.into_ir(), rhs.into_ir()],
            &[out],
        );
        client
            .register(
                streams,
                OperationIr::Custom(desc.clone()),
                Op::<B> {
                    desc,
                    _b: std::marker::PhantomData,
                },
            )
            .output()
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: d(lhs) = grad @ rhs^T, d(rhs) = lhs^T @ grad, each summed over the dimensions its
// operand was broadcast along (burn's own matmul backward, through cuBLAS).

impl<B: BlasMatmul, C: CheckpointStrategy> BlasMatmul for Autodiff<B, C> {
    fn blas_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Mm;
        impl<B: BlasMatmul> Backward<B, 2> for Mm {
            type State = (Option<NodeId>, Option<NodeId>, Shape, Shape);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let (l, r, l_shape, r_shape) = ops.state;
                let l = l.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
                let r = r.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
                binary::<B, _, _>(
                    ops.parents,
                    ops.node,
                    grads,
                    |g| {
                        let rt = B::float_transpose(r.expect("kept when lhs is tracked"));
                        broadcast_shape::<B>(B::blas_matmul(g, rt), &l_shape)
                    },
                    |g| {
                        let lt = B::float_transpose(l.expect("kept when rhs is tracked"));
                        broadcast_shape::<B>(B::blas_matmul(lt, g), &r_shape)
                    },
                );
            }
        }
        let (l_tracked, r_tracked) = (lhs.is_tracked(), rhs.is_tracked());
        let (l_shape, r_shape) = (lhs.primitive.shape(), rhs.primitive.shape());
        match Mm
            .prepare::<C>([lhs.node.clone(), rhs.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let l_state = r_tracked.then(|| prep.checkpoint(&lhs));
                let r_state = l_tracked.then(|| prep.checkpoint(&rhs));
                prep.finish(
                    (l_state, r_state, l_shape, r_shape),
                    B::blas_matmul(lhs.primitive, rhs.primitive),
                )
            }
            OpsKind::UnTracked(prep) => prep.finish(B::blas_matmul(lhs.primitive, rhs.primitive)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        for i in (0..shape.len() - 1).rev() {
            s[i] = s[i + 1] * shape[i + 1];
        }
        s
    }

    #[test]
    fn layouts_map_onto_strided_batches() {
        // Packed [2, 3, 4, 5]: row-major, ld 5, batch stride 20.
        let sh = [2, 3, 4, 5];
        let op = operand(&sh, &packed(&sh), &[2, 3]).expect("packed");
        assert_eq!((op.trans, op.ld, op.batch_stride), (false, 5, 20));
        // A broadcast weight [1, 1, 4, 5]: stride 0.
        let sh = [1, 1, 4, 5];
        let op = operand(&sh, &packed(&sh), &[2, 3]).expect("broadcast");
        assert_eq!(op.batch_stride, 0);
        // The transpose of a packed [6, 5, 4]: shape [6, 4, 5], strides [20, 1, 4].
        let op = operand(&[6, 4, 5], &[20, 1, 4], &[6]).expect("transposed");
        assert_eq!((op.trans, op.ld, op.batch_stride), (true, 4, 20));
        // A partial broadcast ([2, 1] against [2, 3]) is refused.
        let sh = [2, 1, 4, 5];
        assert_eq!(operand(&sh, &packed(&sh), &[2, 3]), None);
        // Heads swapped with time ([b, t, h, d] viewed as [b, h, t, d]): the batch is not
        // evenly strided.
        assert_eq!(operand(&[2, 3, 4, 8], &[96, 8, 24, 1], &[2, 3]), None);
        // Both last strides > 1: neither layout.
        assert_eq!(operand(&[4, 5], &[10, 2], &[]), None);
    }

    #[test]
    fn product_dims_broadcast_the_batch() {
        assert_eq!(product_dims(&[2, 1, 5, 7], &[1, 3, 7, 4]), vec![2, 3, 5, 4]);
        assert_eq!(product_dims(&[5, 7], &[7, 4]), vec![5, 4]);
    }

    #[test]
    fn modes_parse_and_name_the_bad_value() {
        assert_eq!(parse_mode("burn"), Ok(Mode::Off));
        assert_eq!(parse_mode("cublas"), Ok(Mode::Large));
        assert_eq!(parse_mode("cublas-all"), Ok(Mode::All));
        let e = parse_mode("fast").unwrap_err();
        assert!(e.contains("\"fast\""), "{e}");
    }
}
