//! cuDNN for the eager baseline's convolutions, as PyTorch eager calls it: a forward convolution
//! (or, for a transposed one, the backward-data convolution) on the worker's stream, with the
//! algorithm cuDNN's heuristics rank first (`*_v7`, PyTorch's choice with
//! `torch.backends.cudnn.benchmark = False`), then the bias added by `cudnnAddTensor`. f32
//! convolutions run without TF32 (`CUDNN_FMA_MATH`, as with `torch.backends.cudnn.allow_tf32 =
//! False`: a TF32 convolution would not meet the tasks' fp32 tolerance); f16 and bf16 ones on
//! tensor cores with f32 accumulation, as PyTorch runs them. 1-D convolutions run as 2-D ones
//! over a unit axis, and a batch whose tensors exceed cuDNN's 32-bit indexing runs in parts of
//! the batch, both as PyTorch does. (The measured search, `cudnnFind*` as with
//! `cudnn.benchmark = True`, was tried on the KernelBench import on 2026-12-04: fewer tasks within
//! 15% of eager, and one f16 fixture off its tolerance; the heuristics stayed.)
//!
//! Descriptors and the chosen algorithm are made once per convolution shape and kept; the
//! workspace is one device buffer per worker, grown to the largest algorithm's need.
//!
//! Training-mode batch norms that PyTorch sends to cuDNN (see `Step::BatchNorm`) run through
//! `cudnnBatchNormalizationForwardTraining` in spatial mode, as `cudnn_batch_norm` calls it for
//! an NCHW tensor.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};

use cudarc::cudnn::sys as dn;
use cudarc::driver::sys as drv;

use crate::baseline::{BatchNorm, Conv, Window};
use crate::ops::Dtype;

use super::device::{DevBuf, Gpu};

/// The largest workspace an algorithm may ask for; costlier algorithms are passed over, as
/// PyTorch passes over those that do not fit in free memory.
const MAX_WORKSPACE: usize = 1 << 30;

/// Why cuDNN could not be used or a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cuDNN {call}: {status}")]
pub struct DnnError {
    /// The call.
    pub call: String,
    /// Its status.
    pub status: String,
}

fn status(call: &str, s: dn::cudnnStatus_t) -> Result<(), DnnError> {
    if s == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr(dn::cudnnGetErrorString(s)) };
    Err(DnnError {
        call: call.to_string(),
        status: text.to_string_lossy().into_owned(),
    })
}

fn err(call: &str, status: impl Into<String>) -> DnnError {
    DnnError {
        call: call.to_string(),
        status: status.into(),
    }
}

/// The descriptors and algorithm of one convolution shape.
struct Prepared {
    x: dn::cudnnTensorDescriptor_t,
    y: dn::cudnnTensorDescriptor_t,
    bias: dn::cudnnTensorDescriptor_t,
    w: dn::cudnnFilterDescriptor_t,
    conv: dn::cudnnConvolutionDescriptor_t,
    algo: Algo,
    workspace: usize,
}

/// The chosen algorithm of a forward or (transposed convolution) backward-data convolution.
#[derive(Clone, Copy)]
enum Algo {
    Forward(dn::cudnnConvolutionFwdAlgo_t),
    BackwardData(dn::cudnnConvolutionBwdDataAlgo_t),
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by `make` and is destroyed once, here.
        unsafe {
            for t in [self.x, self.y, self.bias] {
                if !t.is_null() {
                    dn::cudnnDestroyTensorDescriptor(t);
                }
            }
            if !self.w.is_null() {
                dn::cudnnDestroyFilterDescriptor(self.w);
            }
            if !self.conv.is_null() {
                dn::cudnnDestroyConvolutionDescriptor(self.conv);
            }
        }
    }
}

/// The descriptors of one batch-norm shape: x and y as `[n, c, s, 1]`, and the per-channel
/// descriptor cuDNN derives for weight and bias.
struct NormPrepared {
    x: dn::cudnnTensorDescriptor_t,
    bn: dn::cudnnTensorDescriptor_t,
}

impl Drop for NormPrepared {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was created by `make_norm` and is destroyed once, here.
        unsafe {
            for t in [self.x, self.bn] {
                if !t.is_null() {
                    dn::cudnnDestroyTensorDescriptor(t);
                }
            }
        }
    }
}

/// A cuDNN handle bound to one stream, with the shapes it has prepared.
pub struct Dnn {
    handle: dn::cudnnHandle_t,
    prepared: HashMap<String, Prepared>,
    norms: HashMap<(usize, usize, usize), NormPrepared>,
    workspace: Option<DevBuf>,
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.prepared.clear();
        self.norms.clear();
        // SAFETY: the handle was created in `new` and is destroyed once, after its descriptors.
        unsafe { dn::cudnnDestroy(self.handle) };
    }
}

/// The cuDNN storage type of a task dtype.
fn data_type(d: Dtype) -> Result<dn::cudnnDataType_t, DnnError> {
    Ok(match d {
        Dtype::F32 => dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        Dtype::F16 => dn::cudnnDataType_t::CUDNN_DATA_HALF,
        Dtype::Bf16 => dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        other => {
            return Err(err(
                "data type",
                format!("no convolution in {}", other.name()),
            ))
        }
    })
}

/// Packed (row-major) strides of `dims`.
fn packed(dims: &[c_int]) -> Vec<c_int> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

fn int(v: usize, what: &str) -> Result<c_int, DnnError> {
    c_int::try_from(v).map_err(|_| err("shape", format!("{what} {v} exceeds a C int")))
}

fn ints(v: &[usize], what: &str) -> Result<Vec<c_int>, DnnError> {
    v.iter().map(|&x| int(x, what)).collect()
}

/// The convolution's window with a leading unit axis for a 1-D one (cuDNN's convolutions take
/// 4-D or 5-D tensors).
fn geometry(c: &Conv) -> Window {
    let w = &c.window;
    let lift = |v: &[usize], unit: usize| {
        let mut out = if v.len() == 1 { vec![unit] } else { Vec::new() };
        out.extend(v);
        out
    };
    Window {
        spatial: lift(&w.spatial, 1),
        kernel: lift(&w.kernel, 1),
        out: lift(&w.out, 1),
        stride: lift(&w.stride, 1),
        padding: lift(&w.padding, 0),
        dilation: lift(&w.dilation, 1),
    }
}

/// A ranked algorithm of either kind, as [`first_fit`] reads it.
trait Ranked {
    fn status(&self) -> dn::cudnnStatus_t;
    fn memory(&self) -> usize;
    fn math(&self) -> dn::cudnnMathType_t;
    fn algo(&self) -> Algo;
}

/// `Ranked` for a perf struct of cuDNN's whose algorithm is the `Algo` variant given.
macro_rules! ranked {
    ($perf:ty, $variant:path) => {
        impl Ranked for $perf {
            fn status(&self) -> dn::cudnnStatus_t {
                self.status
            }
            fn memory(&self) -> usize {
                self.memory
            }
            fn math(&self) -> dn::cudnnMathType_t {
                self.mathType
            }
            fn algo(&self) -> Algo {
                $variant(self.algo)
            }
        }
    };
}

ranked!(dn::cudnnConvolutionFwdAlgoPerf_t, Algo::Forward);
ranked!(dn::cudnnConvolutionBwdDataAlgoPerf_t, Algo::BackwardData);

/// The first of `ranked` that succeeds, fits the workspace cap and whose math `allowed` takes:
/// its algorithm, workspace and math type.
fn first_fit<R: Ranked>(
    ranked: &[R],
    allowed: impl Fn(dn::cudnnMathType_t) -> bool,
) -> Option<(Algo, usize, dn::cudnnMathType_t)> {
    ranked
        .iter()
        .find(|r| {
            r.status() == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                && r.memory() <= MAX_WORKSPACE
                && allowed(r.math())
        })
        .map(|r| (r.algo(), r.memory(), r.math()))
}

/// What identifies a convolution's descriptors and algorithm (everything but its buffers).
fn shape_key(c: &Conv) -> String {
    format!(
        "{}|{}|{}|{}|{}|{}|{:?}",
        c.dtype.name(),
        c.transposed,
        c.n,
        c.c,
        c.f,
        c.groups,
        c.window
    )
}

/// Elements of one sample of `c`'s input and of its output.
fn per_sample(c: &Conv) -> (usize, usize) {
    let prod = |v: &[usize]| v.iter().product::<usize>();
    (c.c * prod(&c.window.spatial), c.f * prod(&c.window.out))
}

/// Whether elements of `n` fit cuDNN's 32-bit indexing of one tensor.
fn fits(n: usize) -> bool {
    n < i32::MAX as usize
}

impl Dnn {
    /// Whether libcudnn (version 9) can be loaded (cudarc panics on a missing library, so ask
    /// first).
    pub fn available() -> bool {
        // SAFETY: only tries to dlopen the library.
        unsafe { dn::is_culib_present() }
    }

    /// A handle whose calls run on `stream`.
    pub fn new(stream: drv::CUstream) -> Result<Dnn, DnnError> {
        if !Self::available() {
            return Err(err(
                "dlopen",
                "libcudnn.so.9 not found on the loader path (pip's nvidia-cudnn-cu12 or a \
                 PyTorch installation has it: add its nvidia/cudnn/lib to LD_LIBRARY_PATH)",
            ));
        }
        // SAFETY: the library is present; cudnnGetVersion has no preconditions.
        let version = unsafe { dn::cudnnGetVersion() };
        if !(90_000..100_000).contains(&version) {
            return Err(err(
                "cudnnGetVersion",
                format!("cuDNN {version} found; kevin's bindings are for cuDNN 9"),
            ));
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream outlives the handle (both live in the
        // worker's harness).
        unsafe {
            status("cudnnCreate", dn::cudnnCreate(&mut handle))?;
            if let Err(e) = status(
                "cudnnSetStream",
                dn::cudnnSetStream(handle, stream as dn::cudaStream_t),
            ) {
                dn::cudnnDestroy(handle);
                return Err(e);
            }
        }
        Ok(Dnn {
            handle,
            prepared: HashMap::new(),
            norms: HashMap::new(),
            workspace: None,
        })
    }

    /// Whether cuDNN takes `c` (else the direct kernel runs it): a float dtype, groups, and
    /// one sample's input and output and the weight within its 32-bit indexing (a batch beyond
    /// it runs in parts, as PyTorch splits it).
    pub fn takes(c: &Conv) -> bool {
        let (x, y) = per_sample(c);
        let taps: usize = c.window.kernel.iter().product();
        data_type(c.dtype).is_ok()
            && c.groups > 0
            && c.n > 0
            && fits(x)
            && fits(y)
            && fits(c.c * c.f / c.groups * taps)
    }

    /// `c` as cuDNN runs it: one convolution, or consecutive parts of its batch whose tensors
    /// each fit 32-bit indexing (first sample of each part, and the part).
    fn parts(c: &Conv) -> Vec<(usize, Conv)> {
        let (x, y) = per_sample(c);
        let per = x.max(y).max(1);
        let most = ((i32::MAX as usize - 1) / per).clamp(1, c.n.max(1));
        (0..c.n)
            .step_by(most)
            .map(|start| {
                let n = most.min(c.n - start);
                (start, Conv { n, ..c.clone() })
            })
            .collect()
    }

    /// The descriptors and algorithm of `c`'s shape, made on first use.
    fn prepare(&mut self, c: &Conv) -> Result<&Prepared, DnnError> {
        let key = shape_key(c);
        if !self.prepared.contains_key(&key) {
            let p = self.make(c)?;
            self.prepared.insert(key.clone(), p);
        }
        Ok(&self.prepared[&key])
    }

    fn make(&self, c: &Conv) -> Result<Prepared, DnnError> {
        let dt = data_type(c.dtype)?;
        let g = geometry(c);
        let dims = |ch: usize, sp: &[usize]| -> Result<Vec<c_int>, DnnError> {
            let mut d = vec![int(c.n, "batch")?, int(ch, "channels")?];
            d.extend(ints(sp, "extent")?);
            Ok(d)
        };
        let xd = dims(c.c, &g.spatial)?;
        let yd = dims(c.f, &g.out)?;
        // PyTorch's weight layouts are cuDNN's filters: [f, c/g, k..] for a forward convolution;
        // [c, f/g, k..] for a transposed one, which is the backward data of the forward
        // convolution from y ([n, f, out]) to x ([n, c, spatial]).
        let (k, per) = if c.transposed {
            (c.c, c.f / c.groups)
        } else {
            (c.f, c.c / c.groups)
        };
        let mut wd = vec![int(k, "channels")?, int(per, "channels")?];
        wd.extend(ints(&g.kernel, "window")?);
        let mut bd = vec![1; xd.len()];
        bd[1] = int(c.f, "channels")?;
        let nd = xd.len() as c_int;
        let mut p = Prepared {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            bias: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: Algo::Forward(
                dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            ),
            workspace: 0,
        };
        // SAFETY: every pointer passed is to a live local vector of the length given; the
        // descriptors are owned by `p` (destroyed by its Drop, also on an early return).
        unsafe {
            for (desc, d) in [(&mut p.x, &xd), (&mut p.y, &yd), (&mut p.bias, &bd)] {
                status(
                    "cudnnCreateTensorDescriptor",
                    dn::cudnnCreateTensorDescriptor(desc),
                )?;
                status(
                    "cudnnSetTensorNdDescriptor",
                    dn::cudnnSetTensorNdDescriptor(*desc, dt, nd, d.as_ptr(), packed(d).as_ptr()),
                )?;
            }
            status(
                "cudnnCreateFilterDescriptor",
                dn::cudnnCreateFilterDescriptor(&mut p.w),
            )?;
            status(
                "cudnnSetFilterNdDescriptor",
                dn::cudnnSetFilterNdDescriptor(
                    p.w,
                    dt,
                    dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    nd,
                    wd.as_ptr(),
                ),
            )?;
            status(
                "cudnnCreateConvolutionDescriptor",
                dn::cudnnCreateConvolutionDescriptor(&mut p.conv),
            )?;
            let (pad, stride, dil) = (
                ints(&g.padding, "padding")?,
                ints(&g.stride, "stride")?,
                ints(&g.dilation, "dilation")?,
            );
            status(
                "cudnnSetConvolutionNdDescriptor",
                dn::cudnnSetConvolutionNdDescriptor(
                    p.conv,
                    nd - 2,
                    pad.as_ptr(),
                    stride.as_ptr(),
                    dil.as_ptr(),
                    dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
            )?;
            status(
                "cudnnSetConvolutionGroupCount",
                dn::cudnnSetConvolutionGroupCount(p.conv, int(c.groups, "groups")?),
            )?;
            let f32_math = c.dtype == Dtype::F32;
            let wanted = if f32_math {
                dn::cudnnMathType_t::CUDNN_FMA_MATH
            } else {
                dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            };
            status(
                "cudnnSetConvolutionMathType",
                dn::cudnnSetConvolutionMathType(p.conv, wanted),
            )?;
            // The heuristics' ranking: the first that succeeds, fits the workspace cap and, in
            // f32, does not need tensor cores (TF32); f32 then runs it with FMA math, as
            // PyTorch does without allow_tf32.
            let allowed = |m: dn::cudnnMathType_t| {
                !f32_math
                    || !matches!(
                        m,
                        dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                            | dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                    )
            };
            let mut returned: c_int = 0;
            let chosen = if c.transposed {
                let mut perf = [std::mem::zeroed::<dn::cudnnConvolutionBwdDataAlgoPerf_t>(); 16];
                status(
                    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                    dn::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        self.handle,
                        p.w,
                        p.x,
                        p.conv,
                        p.y,
                        perf.len() as c_int,
                        &mut returned,
                        perf.as_mut_ptr(),
                    ),
                )?;
                first_fit(&perf[..returned.max(0) as usize], allowed)
            } else {
                let mut perf = [std::mem::zeroed::<dn::cudnnConvolutionFwdAlgoPerf_t>(); 16];
                status(
                    "cudnnGetConvolutionForwardAlgorithm_v7",
                    dn::cudnnGetConvolutionForwardAlgorithm_v7(
                        self.handle,
                        p.x,
                        p.w,
                        p.conv,
                        p.y,
                        perf.len() as c_int,
                        &mut returned,
                        perf.as_mut_ptr(),
                    ),
                )?;
                first_fit(&perf[..returned.max(0) as usize], allowed)
            };
            let (algo, workspace, math) = chosen.ok_or_else(|| {
                err(
                    "algorithm",
                    format!("none of {returned} ranked algorithms applies"),
                )
            })?;
            let math = if f32_math { wanted } else { math };
            status(
                "cudnnSetConvolutionMathType",
                dn::cudnnSetConvolutionMathType(p.conv, math),
            )?;
            p.algo = algo;
            p.workspace = workspace;
        }
        Ok(p)
    }

    /// Makes `c`'s descriptors, chooses its algorithm and grows the workspace to its need, so
    /// that no run of it (a timed one included) waits for the host: called when a plan is made.
    pub fn ready(&mut self, gpu: &Gpu, c: &Conv) -> Result<(), DnnError> {
        let mut need = 0;
        for (_, part) in Self::parts(c) {
            need = need.max(self.prepare(&part)?.workspace);
        }
        if need > self.workspace.as_ref().map_or(0, DevBuf::bytes) {
            self.workspace = None;
            self.workspace = Some(
                gpu.alloc(need)
                    .map_err(|e| err("workspace", e.to_string()))?,
            );
        }
        Ok(())
    }

    /// Enqueues `c` at device addresses `x`, `w`, `bias` (if the step has one) and `y`: in
    /// parts of its batch where it exceeds 32-bit indexing.
    pub fn conv(
        &mut self,
        gpu: &Gpu,
        c: &Conv,
        (x, w, bias, y): (u64, u64, Option<u64>, u64),
    ) -> Result<(), DnnError> {
        self.ready(gpu, c)?;
        let size = c.dtype.size_bytes() as u64;
        let (x_elems, y_elems) = per_sample(c);
        let (x_per, y_per) = (x_elems as u64 * size, y_elems as u64 * size);
        for (start, part) in Self::parts(c) {
            let at = start as u64;
            self.conv_part(&part, (x + at * x_per, w, bias, y + at * y_per))?;
        }
        Ok(())
    }

    /// Makes the descriptors of batch norm `b`'s shape (when the plan is made, as for a
    /// convolution).
    pub fn ready_norm(&mut self, b: &BatchNorm) -> Result<(), DnnError> {
        let key = (b.n, b.c, b.s);
        if !self.norms.contains_key(&key) {
            let p = Self::make_norm(b)?;
            self.norms.insert(key, p);
        }
        Ok(())
    }

    fn make_norm(b: &BatchNorm) -> Result<NormPrepared, DnnError> {
        let dims = [
            int(b.n, "batch")?,
            int(b.c, "channels")?,
            int(b.s, "extent")?,
            1,
        ];
        let mut p = NormPrepared {
            x: std::ptr::null_mut(),
            bn: std::ptr::null_mut(),
        };
        // SAFETY: pointers to live locals of the lengths given; the descriptors are owned by `p`
        // (destroyed by its Drop, also on an early return).
        unsafe {
            status(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut p.x),
            )?;
            status(
                "cudnnSetTensorNdDescriptor",
                dn::cudnnSetTensorNdDescriptor(
                    p.x,
                    dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                    4,
                    dims.as_ptr(),
                    packed(&dims).as_ptr(),
                ),
            )?;
            status(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut p.bn),
            )?;
            status(
                "cudnnDeriveBNTensorDescriptor",
                dn::cudnnDeriveBNTensorDescriptor(
                    p.bn,
                    p.x,
                    dn::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                ),
            )?;
        }
        Ok(p)
    }

    /// Enqueues batch norm `b` (training mode: the batch's statistics, biased variance) at
    /// device addresses `x`, `w`, `b` and `y`, as PyTorch's `cudnn_batch_norm` calls cuDNN for an
    /// NCHW tensor (spatial mode). The running statistics and the saved mean and inverse
    /// deviation are not asked for (cuDNN takes null for each pair): a few floats per channel.
    pub fn batch_norm(
        &mut self,
        b: &BatchNorm,
        (x, w, bias, y): (u64, u64, u64, u64),
    ) -> Result<(), DnnError> {
        self.ready_norm(b)?;
        let p = &self.norms[&(b.n, b.c, b.s)];
        let (one, zero) = (1.0f32, 0.0f32);
        let alpha = (&one as *const f32).cast::<c_void>();
        let beta = (&zero as *const f32).cast::<c_void>();
        let ptr = |a: u64| a as usize as *mut c_void;
        let null = std::ptr::null_mut();
        // SAFETY: the descriptors describe the plan's f32 buffers at these addresses (x and y
        // [n, c, s], w and bias [c]); null running and saved statistics are allowed in pairs.
        unsafe {
            status(
                "cudnnBatchNormalizationForwardTraining",
                dn::cudnnBatchNormalizationForwardTraining(
                    self.handle,
                    dn::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                    alpha,
                    beta,
                    p.x,
                    ptr(x),
                    p.x,
                    ptr(y),
                    p.bn,
                    ptr(w),
                    ptr(bias),
                    0.1,
                    null,
                    null,
                    b.eps,
                    null,
                    null,
                ),
            )
        }
    }

    /// One part of a convolution, prepared by [`Dnn::ready`].
    fn conv_part(
        &mut self,
        c: &Conv,
        (x, w, bias, y): (u64, u64, Option<u64>, u64),
    ) -> Result<(), DnnError> {
        let key = shape_key(c);
        let ws = self.workspace.as_ref().map_or(0, DevBuf::ptr);
        let p = &self.prepared[&key];
        let (one, zero) = (1.0f32, 0.0f32);
        let alpha = (&one as *const f32).cast::<c_void>();
        let beta = (&zero as *const f32).cast::<c_void>();
        let ptr = |a: u64| a as usize as *mut c_void;
        // SAFETY: the descriptors describe the plan's buffers at these addresses (allocated
        // for the plan's shapes by the caller); the workspace holds at least `p.workspace`
        // bytes; alpha and beta are f32 as cuDNN wants for f32/f16/bf16 data.
        unsafe {
            match p.algo {
                Algo::BackwardData(algo) => status(
                    "cudnnConvolutionBackwardData",
                    dn::cudnnConvolutionBackwardData(
                        self.handle,
                        alpha,
                        p.w,
                        ptr(w),
                        p.x,
                        ptr(x),
                        p.conv,
                        algo,
                        ptr(ws),
                        p.workspace,
                        beta,
                        p.y,
                        ptr(y),
                    ),
                )?,
                Algo::Forward(algo) => status(
                    "cudnnConvolutionForward",
                    dn::cudnnConvolutionForward(
                        self.handle,
                        alpha,
                        p.x,
                        ptr(x),
                        p.w,
                        ptr(w),
                        p.conv,
                        algo,
                        ptr(ws),
                        p.workspace,
                        beta,
                        p.y,
                        ptr(y),
                    ),
                )?,
            }
            if let Some(b) = bias {
                status(
                    "cudnnAddTensor",
                    dn::cudnnAddTensor(self.handle, alpha, p.bias, ptr(b), alpha, p.y, ptr(y)),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv1d(n: usize, c: usize, len: usize) -> Conv {
        Conv {
            dtype: Dtype::F32,
            transposed: false,
            x: 0,
            w: 1,
            bias: None,
            y: 2,
            n,
            c,
            f: 8,
            groups: 1,
            window: Window {
                spatial: vec![len],
                kernel: vec![3],
                out: vec![len - 2],
                stride: vec![1],
                padding: vec![2],
                dilation: vec![1],
            },
        }
    }

    #[test]
    fn a_1d_convolution_runs_as_2d_over_a_unit_axis() {
        let g = geometry(&conv1d(2, 4, 100));
        assert_eq!(g.spatial, [1, 100]);
        assert_eq!(g.kernel, [1, 3]);
        assert_eq!(g.out, [1, 98]);
        assert_eq!(g.stride, [1, 1]);
        assert_eq!(g.padding, [0, 2], "no padding on the added axis");
        assert_eq!(g.dilation, [1, 1]);
        assert_eq!(packed(&[2, 4, 1, 100]), [400, 100, 100, 1]);
    }

    #[test]
    fn cudnn_takes_float_convolutions_within_32_bit_indexing() {
        assert!(Dnn::takes(&conv1d(2, 4, 100)));
        let mut ints = conv1d(2, 4, 100);
        ints.dtype = Dtype::I64;
        assert!(!Dnn::takes(&ints), "no integer convolutions");
        assert!(
            Dnn::takes(&conv1d(1 << 12, 1 << 10, 1 << 10)),
            "2^32 input elements run in parts of the batch"
        );
        assert!(
            !Dnn::takes(&conv1d(2, 1 << 12, 1 << 20)),
            "2^32 in one sample"
        );
        let mut none = conv1d(2, 4, 100);
        none.groups = 0;
        assert!(!Dnn::takes(&none));
    }

    #[test]
    fn a_batch_beyond_32_bit_indexing_runs_in_parts() {
        assert_eq!(Dnn::parts(&conv1d(2, 4, 100)).len(), 1, "small: one part");
        // 2^12 samples of 2^20 input elements: parts of at most 2^11 - 1 samples.
        let big = conv1d(1 << 12, 1 << 10, 1 << 10);
        let parts = Dnn::parts(&big);
        assert_eq!(parts.iter().map(|(_, p)| p.n).sum::<usize>(), big.n);
        let mut next = 0;
        for (start, p) in &parts {
            assert_eq!(*start, next, "consecutive");
            assert!(fits(p.n * p.c * p.window.spatial[0]), "{} samples", p.n);
            next += p.n;
        }
        assert_eq!(parts.len(), 3, "2047 + 2047 + 2");
    }

    #[test]
    fn shapes_key_everything_but_the_buffers() {
        let a = conv1d(2, 4, 100);
        let mut b = a.clone();
        b.x = 7;
        b.bias = Some(9);
        assert_eq!(shape_key(&a), shape_key(&b));
        b.window.padding = vec![1];
        assert_ne!(shape_key(&a), shape_key(&b));
    }
}
