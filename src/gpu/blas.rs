//! cuBLAS for the eager baseline's matrix products, as PyTorch eager calls it: one
//! `cublasGemmStridedBatchedEx` per product on the worker's stream, fp32 compute (no TF32, like
//! torch's default), fp16/bf16 storage where the task says so; fp64 storage and compute for the
//! correctness protocol's reference.

use cudarc::cublas::sys as cb;
use cudarc::driver::sys as drv;

use crate::baseline::Gemm;
use crate::ops::Dtype;

/// Why cuBLAS could not be used or a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cuBLAS {call}: {status}")]
pub struct BlasError {
    /// The call.
    pub call: String,
    /// Its status.
    pub status: String,
}

/// One product of a plan at device addresses: the shape and layout are the plan's [`Gemm`]
/// (row-major, strided-batched), `a`, `b` and `c` the addresses of its operands.
#[derive(Debug, Clone, Copy)]
pub struct GemmCall<'g> {
    /// Shape, layout and element type (of a native plan).
    pub g: &'g Gemm,
    /// A, B and C hold f64 (the fp64 reference plan): a double-precision product.
    pub f64: bool,
    /// Device address of A.
    pub a: u64,
    /// Device address of B.
    pub b: u64,
    /// Device address of C.
    pub c: u64,
}

/// A cuBLAS handle bound to one stream.
pub struct Blas {
    handle: cb::cublasHandle_t,
}

fn status(call: &str, s: cb::cublasStatus_t) -> Result<(), BlasError> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(BlasError {
            call: call.to_string(),
            status: format!("{s:?}"),
        })
    }
}

impl Blas {
    /// Whether libcublas can be loaded (cudarc panics on a missing library, so ask first).
    pub fn available() -> bool {
        // SAFETY: only tries to dlopen the library.
        unsafe { cb::is_culib_present() }
    }

    /// A handle whose calls run on `stream`.
    pub fn new(stream: drv::CUstream) -> Result<Blas, BlasError> {
        if !Self::available() {
            return Err(BlasError {
                call: "dlopen".into(),
                status: "libcublas.so not found on the loader path".into(),
            });
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream outlives the handle (both live in the
        // worker's harness).
        unsafe {
            status("cublasCreate", cb::cublasCreate_v2(&mut handle))?;
            status(
                "cublasSetStream",
                cb::cublasSetStream_v2(handle, stream as cb::cudaStream_t),
            )?;
        }
        Ok(Blas { handle })
    }

    /// Enqueues one product. A single fp32 matrix-vector product goes to `cublasSgemv`, as
    /// torch's `mv` does (its GEMM kernels are slower for one column).
    pub fn gemm(&self, call: &GemmCall) -> Result<(), BlasError> {
        let g = call.g;
        if g.n == 1 && g.batch == 1 && !call.f64 && g.dtype == Dtype::F32 {
            return self.sgemv(call);
        }
        let lda = if g.trans_a { g.m } else { g.k };
        let ldb = if g.trans_b { g.k } else { g.n };
        self.gemm_ld(call, lda as i64, ldb as i64)
    }

    /// [`Blas::gemm`] with the row strides of A and B given (elements between consecutive rows
    /// as stored: a view of a wider matrix), C packed; always a GEMM.
    pub fn gemm_ld(&self, call: &GemmCall, lda: i64, ldb: i64) -> Result<(), BlasError> {
        self.gemm_out(call, lda, ldb, call.g.dtype)
    }

    /// [`Blas::gemm_ld`] with C stored as `out` (f32 output of bf16/f16 operands: the policy's
    /// logits); the operands are of the plan's dtype.
    pub fn gemm_out(
        &self,
        call: &GemmCall,
        lda: i64,
        ldb: i64,
        out: Dtype,
    ) -> Result<(), BlasError> {
        let g = call.g;
        let data_type = |d: Dtype| match d {
            _ if call.f64 => Ok(cb::cudaDataType::CUDA_R_64F),
            Dtype::F32 => Ok(cb::cudaDataType::CUDA_R_32F),
            Dtype::F16 => Ok(cb::cudaDataType::CUDA_R_16F),
            Dtype::Bf16 => Ok(cb::cudaDataType::CUDA_R_16BF),
            Dtype::I64 => Err(BlasError {
                call: "gemm".into(),
                status: "no i64 matrix product".into(),
            }),
        };
        let (ty, ty_c) = (data_type(g.dtype)?, data_type(out)?);
        let int = |v: i64, what: &str| {
            i32::try_from(v).map_err(|_| BlasError {
                call: "gemm".into(),
                status: format!("{what} = {v} does not fit cuBLAS's 32-bit int"),
            })
        };
        let (m, n, k) = (g.m as i32, g.n as i32, g.k as i32);
        let (lda, ldb) = (int(lda, "lda")?, int(ldb, "ldb")?);
        // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
        let op = |t: bool| {
            if t {
                cb::cublasOperation_t::CUBLAS_OP_T
            } else {
                cb::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Scalars in the compute type: f32 for every product but the fp64 reference's.
        let (alpha32, beta32) = (1.0f32, 0.0f32);
        let (alpha64, beta64) = (1.0f64, 0.0f64);
        let (alpha, beta, compute) = if call.f64 {
            (
                (&alpha64 as *const f64).cast::<std::ffi::c_void>(),
                (&beta64 as *const f64).cast::<std::ffi::c_void>(),
                cb::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            )
        } else {
            (
                (&alpha32 as *const f32).cast::<std::ffi::c_void>(),
                (&beta32 as *const f32).cast::<std::ffi::c_void>(),
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            )
        };
        // SAFETY: the addresses are live device buffers of the sizes the plan declares.
        unsafe {
            status(
                "cublasGemmStridedBatchedEx",
                cb::cublasGemmStridedBatchedEx(
                    self.handle,
                    op(g.trans_b),
                    op(g.trans_a),
                    n,
                    m,
                    k,
                    alpha,
                    call.b as *const std::ffi::c_void,
                    ty,
                    ldb,
                    g.stride_b,
                    call.a as *const std::ffi::c_void,
                    ty,
                    lda,
                    g.stride_a,
                    beta,
                    call.c as *mut std::ffi::c_void,
                    ty_c,
                    n,
                    g.stride_c,
                    g.batch as i32,
                    compute,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                ),
            )
        }
    }
}

impl Blas {
    /// y(m) = op(A) x(k) for a row-major A: column-major that is A^T (k x m, ld k), or A itself
    /// (m x k, ld m) when A is stored transposed.
    fn sgemv(&self, call: &GemmCall) -> Result<(), BlasError> {
        let g = call.g;
        let (m, k) = (g.m as i32, g.k as i32);
        let (op, rows, cols, lda) = if g.trans_a {
            (cb::cublasOperation_t::CUBLAS_OP_N, m, k, m)
        } else {
            (cb::cublasOperation_t::CUBLAS_OP_T, k, m, k)
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: live device buffers of the sizes the plan declares.
        unsafe {
            status(
                "cublasSgemv",
                cb::cublasSgemv_v2(
                    self.handle,
                    op,
                    rows,
                    cols,
                    &alpha,
                    call.a as *const f32,
                    lda,
                    call.b as *const f32,
                    1,
                    &beta,
                    call.c as *mut f32,
                    1,
                ),
            )
        }
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // As for modules (see `GpuModule`'s drop): destroying the handle may wait for the GPU,
        // where a poisoned worker may still run a candidate's kernel.
        if super::fault::poisoned() {
            return;
        }
        // SAFETY: created once, destroyed once.
        unsafe {
            let _ = cb::cublasDestroy_v2(self.handle);
        }
    }
}
