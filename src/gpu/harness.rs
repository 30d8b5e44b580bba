//! The GPU worker's state ([`Harness`]): its GPU, the harness's kernels (input generation,
//! masks, fills, comparisons), the L2 flush, the eager baseline runner; and the limits of one
//! run of a candidate (see the module docs of [`crate::gpu`]).

use std::collections::HashMap;

use cudarc::driver::sys::CUfunction;

use crate::baseline::{BatchNorm, Conv, EagerPlan, Precision, Step, StepArg};
use crate::ops::round::{bf16_from_bits, f16_from_bits};
use crate::ops::Dtype;
use crate::tasks::InputDist;
use crate::tasks::{Preset, Task, Tolerance};
use crate::verify::buffer::{dtype_size, BF16_FILL, F16_FILL, F32_FILL, I64_FILL};

use super::blas::{Blas, GemmCall};
use super::device::{allow_dynamic_smem, ArgPack, DevBuf, Gpu, GpuError, GpuModule};
use super::dnn::Dnn;
use super::{mask_stream, HARNESS_KERNELS};

/// Bytes after every task tensor, filled with [`CANARY`] before a run: a kernel that writes a
/// little past its output is caught (there are no guard pages on the device).
pub const SLACK: usize = 256;
pub(super) const CANARY: u8 = 0xA5;
/// Input sets rotated between timed runs.
pub const TIMING_SETS: usize = 3;

/// The longest one run of a candidate's launch sequence may take, in verification or in a
/// timed run: 200 times the slowest baseline of the suite at the GPU preset. A kernel still
/// running then is answered as a timeout at once and its worker replaced (the only way to stop
/// it), so a hung kernel holds the GPU for a second instead of the request's whole deadline
/// (a minute in configs/gpu.toml) and slows its neighbours' checks no longer than that.
pub const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A verification run may take at most this many times the task's own baseline (timed on the
/// worker's GPU when the request starts), within [`MIN_RUN_LIMIT`, `RUN_LIMIT`]. Verification
/// runs the candidate ten times (five trials, twice each): with only the global `RUN_LIMIT`, a
/// kernel that took just under a second per run (a printf flood, a scan of device memory) held
/// the GPU for ten seconds, or to the request's deadline. Timed runs keep `RUN_LIMIT`.
pub const RUN_FACTOR: f64 = 200.0;

/// The floor of the per-task verification run limit: launch latency and clock ramp-up dominate
/// below it.
pub const MIN_RUN_LIMIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The worker's GPU with the harness's and the baseline's modules loaded.
pub struct Harness {
    pub(super) gpu: Gpu,
    pub(super) _hmod: GpuModule,
    pub(super) hk: HashMap<&'static str, CUfunction>,
    pub(super) bmod: GpuModule,
    pub(super) bfns: HashMap<String, CUfunction>,
    pub(super) blas: Option<Result<Blas, String>>,
    pub(super) dnn: Option<Result<Dnn, String>>,
    pub(super) flush: DevBuf,
    pub(super) flush_value: u32,
    pub(super) stats: DevBuf,
    /// Fallback plans (GEMMs as kevin's kernel) when cuBLAS is missing.
    pub(super) use_blas: bool,
    /// Fallback plans (convolutions as kevin's direct kernel) when cuDNN is missing.
    pub(super) use_dnn: bool,
}

impl Harness {
    /// Opens GPU `ordinal` and loads the harness and baseline modules (CUBIN or PTX images).
    pub fn new(
        ordinal: usize,
        harness_image: &[u8],
        baseline_image: &[u8],
    ) -> Result<Self, GpuError> {
        let gpu = Gpu::open(ordinal)?;
        let hmod = gpu.load_module(harness_image)?;
        let mut hk = HashMap::new();
        for k in HARNESS_KERNELS {
            hk.insert(*k, hmod.function(k)?);
        }
        // SAFETY: the scribble kernel belongs to `hmod`, loaded for the harness's lifetime.
        unsafe { allow_dynamic_smem(hk["kevin_scribble_smem"], gpu.smem_optin)? };
        let bmod = gpu.load_module(baseline_image)?;
        // At least twice the L2, so a flush evicts everything (50 MiB on an H100/H200).
        let flush = gpu.alloc((2 * gpu.l2_bytes).max(8 << 20))?;
        let stats = gpu.alloc(4 * 8)?;
        Ok(Harness {
            gpu,
            _hmod: hmod,
            hk,
            bmod,
            bfns: HashMap::new(),
            blas: None,
            dnn: None,
            flush,
            flush_value: 0,
            stats,
            use_blas: std::env::var_os("KEVIN_NO_CUBLAS").is_none(),
            use_dnn: std::env::var_os("KEVIN_NO_CUDNN").is_none(),
        })
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Whether the baseline's GEMMs go through cuBLAS (else kevin's own kernel).
    pub fn blas_in_use(&mut self) -> bool {
        self.use_blas && self.blas().is_ok()
    }

    pub(super) fn blas(&mut self) -> Result<&Blas, String> {
        let stream = self.gpu.stream();
        self.blas
            .get_or_insert_with(|| Blas::new(stream).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// Whether the baseline's convolutions go through cuDNN (else kevin's direct kernel).
    pub fn dnn_in_use(&mut self) -> bool {
        self.use_dnn && self.dnn().is_ok()
    }

    pub(super) fn dnn(&mut self) -> Result<&mut Dnn, String> {
        let stream = self.gpu.stream();
        self.dnn
            .get_or_insert_with(|| Dnn::new(stream).map_err(|e| e.to_string()))
            .as_mut()
            .map_err(|e| e.clone())
    }

    pub(super) fn hk(&self, name: &str) -> CUfunction {
        // Every name is looked up in `new`.
        self.hk[name]
    }

    /// A grid-stride launch of a harness kernel over `n` elements.
    pub(super) fn launch_h(&self, name: &str, n: u64, args: &mut ArgPack) -> Result<(), GpuError> {
        let blocks = n.div_ceil(256).clamp(1, 8192) as u32;
        let mut params = args.params();
        // SAFETY: the harness kernels' parameter lists are the ones packed by the callers below.
        unsafe {
            self.gpu
                .launch(self.hk(name), [blocks, 1, 1], [256, 1, 1], 0, &mut params)
        }
    }

    /// Draws `n` input values of `dtype` from `dist` into `buf`.
    pub fn generate(
        &self,
        ptr: u64,
        n: usize,
        dtype: Dtype,
        dist: Draw,
        seed: u64,
    ) -> Result<(), GpuError> {
        let mut args = ArgPack::default();
        args.ptr(ptr);
        args.push(&(n as u64).to_ne_bytes());
        push_draw(&mut args, dtype, dist, seed)?;
        self.launch_h("kevin_generate", n as u64, &mut args)
    }

    /// The values [`Harness::generate`] draws at `offset .. offset + n`, rounded to `dtype`,
    /// stored as f64 at `ptr` (8 bytes each): the reference's inputs without a task-dtype copy.
    pub fn generate_wide(
        &self,
        ptr: u64,
        n: usize,
        offset: u64,
        dtype: Dtype,
        dist: Draw,
        seed: u64,
    ) -> Result<(), GpuError> {
        let mut args = ArgPack::default();
        args.ptr(ptr);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&offset.to_ne_bytes());
        push_draw(&mut args, dtype, dist, seed)?;
        self.launch_h("kevin_generate_wide", n as u64, &mut args)
    }

    /// The first index where the input at `ptr` differs from what [`Harness::generate`] drew
    /// there: an input the candidate modified, found without keeping a copy.
    pub fn regen_diff(
        &self,
        ptr: u64,
        n: usize,
        dtype: Dtype,
        dist: Draw,
        seed: u64,
    ) -> Result<Option<u64>, GpuError> {
        self.reset_stats()?;
        let mut args = ArgPack::default();
        args.ptr(ptr);
        args.push(&(n as u64).to_ne_bytes());
        push_draw(&mut args, dtype, dist, seed)?;
        args.ptr(self.stats.ptr() + 8);
        self.launch_h("kevin_regen_diff", n as u64, &mut args)?;
        let s = self.read_stats()?;
        Ok((s[1] != u64::MAX).then_some(s[1]))
    }

    /// The value [`Harness::generate`] drew at `index` (as `dtype` rounds it).
    pub fn generated_element(
        &self,
        index: u64,
        dtype: Dtype,
        dist: Draw,
        seed: u64,
    ) -> Result<f64, GpuError> {
        // The stats' last slot is free: 8 bytes at offset 24.
        self.generate_wide(self.stats.ptr() + 24, 1, index, dtype, dist, seed)?;
        let mut bytes = [0u8; 8];
        self.gpu.download_at(&mut bytes, self.stats.ptr() + 24, 8)?;
        Ok(f64::from_ne_bytes(bytes))
    }

    /// f64 at `src` -> f32 at `dst` masked with `key`'s stream, `n` elements (a float output's
    /// reference in 4 bytes).
    pub fn narrow_masked(&self, src: u64, dst: u64, n: usize, key: u64) -> Result<(), GpuError> {
        let mut args = ArgPack::default();
        args.ptr(src);
        args.ptr(dst);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&key.to_ne_bytes());
        self.launch_h("kevin_narrow", n as u64, &mut args)
    }

    pub(super) fn width_kernel(prefix: &str, width: usize) -> String {
        format!("{prefix}{width}")
    }

    /// XORs `n` elements of `width` bytes at `ptr` with the key stream of `key`.
    pub fn mask(&self, ptr: u64, n: usize, width: usize, key: u64) -> Result<(), GpuError> {
        let mut args = ArgPack::default();
        args.ptr(ptr);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&key.to_ne_bytes());
        self.launch_h(
            &Self::width_kernel("kevin_mask", width),
            n as u64,
            &mut args,
        )
    }

    /// Stats to [0, u64::MAX, 0, 0] (failures, first index, max ratio), on the stream: the
    /// kernel that follows sees them without a host round trip.
    pub(super) fn reset_stats(&self) -> Result<(), GpuError> {
        self.gpu.fill_bytes_at(self.stats.ptr(), 0, 32)?;
        self.gpu.fill_bytes_at(self.stats.ptr() + 8, 0xff, 8)
    }

    pub(super) fn read_stats(&self) -> Result<[u64; 4], GpuError> {
        let mut bytes = [0u8; 32];
        self.gpu.download(&mut bytes, &self.stats)?;
        let mut out = [0u64; 4];
        for (i, v) in out.iter_mut().enumerate() {
            *v = u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        }
        Ok(out)
    }

    /// Fills an output with its dtype's NaN pattern.
    pub fn fill_output(&self, buf: &DevBuf, n: usize, dtype: Dtype) -> Result<(), GpuError> {
        match dtype {
            Dtype::F32 => self.gpu.fill_u32(buf, F32_FILL),
            Dtype::F16 => self.gpu.fill_u16(buf, F16_FILL),
            Dtype::Bf16 => self.gpu.fill_u16(buf, BF16_FILL),
            Dtype::I64 => {
                let mut args = ArgPack::default();
                args.ptr(buf.ptr());
                args.push(&(n as u64).to_ne_bytes());
                args.push(&I64_FILL.to_ne_bytes());
                self.launch_h("kevin_fill64", n as u64, &mut args)
            }
        }
    }

    /// Compares `n` elements of `got` (of `dtype`) with the masked reference (f32 for float
    /// outputs, i64 for index outputs): (failures, first failing index, max error ratio).
    pub fn compare(
        &self,
        got: u64,
        want_masked: u64,
        n: usize,
        dtype: Dtype,
        key: u64,
        tol: Tolerance,
    ) -> Result<(u64, Option<u64>, f64), GpuError> {
        self.reset_stats()?;
        let mut args = ArgPack::default();
        args.ptr(got);
        args.ptr(want_masked);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&dtype_code(dtype).to_ne_bytes());
        args.push(&reference_code(dtype).to_ne_bytes());
        args.push(&key.to_ne_bytes());
        args.push(&fill_bits(dtype).to_ne_bytes());
        args.push(&tol.atol.to_ne_bytes());
        args.push(&tol.rtol.to_ne_bytes());
        args.ptr(self.stats.ptr());
        self.launch_h("kevin_compare", n as u64, &mut args)?;
        let s = self.read_stats()?;
        let ratio = f64::from(f32::from_bits(s[2] as u32));
        Ok((s[0], (s[1] != u64::MAX).then_some(s[1]), ratio))
    }

    /// Widens `n` elements of `dtype` at `src` into f64 at `dst`.
    pub fn widen(&self, src: u64, dst: u64, n: usize, dtype: Dtype) -> Result<(), GpuError> {
        let mut args = ArgPack::default();
        args.ptr(src);
        args.ptr(dst);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&dtype_code(dtype).to_ne_bytes());
        self.launch_h("kevin_widen", n as u64, &mut args)
    }

    /// One stored reference element (f32 for a float output, i64 for an index output),
    /// unmasked with `key`.
    pub fn reference_element(
        &self,
        ptr: u64,
        index: u64,
        dtype: Dtype,
        key: u64,
    ) -> Result<f64, GpuError> {
        let width = reference_width(dtype);
        let mut bytes = [0u8; 8];
        self.gpu
            .download_at(&mut bytes[..width], ptr + index * width as u64, width)?;
        let raw = u64::from_ne_bytes(bytes);
        let m = mask_stream(key, index);
        Ok(decode_reference(
            dtype,
            raw ^ if width == 4 { m & 0xFFFF_FFFF } else { m },
        ))
    }

    /// One element's value, unmasked with `key` when given.
    pub fn element(
        &self,
        ptr: u64,
        index: u64,
        dtype: Dtype,
        key: Option<u64>,
    ) -> Result<(f64, u64), GpuError> {
        let width = dtype_size(dtype);
        let mut bytes = [0u8; 8];
        self.gpu
            .download_at(&mut bytes[..width], ptr + index * width as u64, width)?;
        let mut raw = u64::from_ne_bytes(bytes);
        if let Some(k) = key {
            let m = mask_stream(k, index);
            raw ^= match width {
                2 => m & 0xFFFF,
                4 => m & 0xFFFF_FFFF,
                _ => m,
            };
        }
        Ok((decode(dtype, raw), raw))
    }

    /// Fills every SM's shared memory with 0xff bytes (see `kevin_scribble_smem`).
    pub fn scribble_shared(&self) -> Result<(), GpuError> {
        let bytes = self.gpu.smem_optin;
        let mut args = ArgPack::default();
        args.push(&(bytes / 4).to_ne_bytes());
        let mut params = args.params();
        // SAFETY: the kernel takes one u32; its dynamic shared memory was opted in to in `new`.
        unsafe {
            self.gpu.launch(
                self.hk("kevin_scribble_smem"),
                [self.gpu.sms, 1, 1],
                [1024, 1, 1],
                bytes,
                &mut params,
            )
        }
    }

    /// Overwrites the flush buffer (more than twice the L2), evicting whatever was cached.
    pub fn flush_l2(&mut self) -> Result<(), GpuError> {
        self.flush_value = self.flush_value.wrapping_add(1);
        self.gpu.fill_u32(&self.flush, self.flush_value)
    }

    pub(super) fn baseline_fn(&mut self, name: &str) -> Result<CUfunction, GpuError> {
        if let Some(f) = self.bfns.get(name) {
            return Ok(*f);
        }
        let f = self.bmod.function(name)?;
        self.bfns.insert(name.to_string(), f);
        Ok(f)
    }

    /// Enqueues the eager baseline: `ptrs[i]` is the device address of `plan.buffers[i]`.
    pub fn run_baseline(&mut self, plan: &EagerPlan, ptrs: &[u64]) -> Result<(), GpuError> {
        let fail = |what: String| GpuError {
            call: "baseline".into(),
            name: what,
            desc: String::new(),
            code: 0,
        };
        let ptr = |i: usize| {
            ptrs.get(i)
                .copied()
                .ok_or_else(|| fail(format!("buffer {i} out of range")))
        };
        let no_dnn = || fail("a cuDNN step without cuDNN loaded".into());
        for step in &plan.steps {
            match step {
                Step::Kernel {
                    kernel,
                    grid,
                    block,
                    smem_bytes,
                    args,
                } => {
                    let f = self.baseline_fn(kernel)?;
                    // SAFETY: `f` belongs to the baseline module, loaded while `self` lives.
                    unsafe { allow_dynamic_smem(f, *smem_bytes)? };
                    let mut pack = ArgPack::default();
                    for a in args {
                        match a {
                            StepArg::Buffer(i) => pack.ptr(ptr(*i)?),
                            StepArg::I32(v) => pack.push(&v.to_ne_bytes()),
                            StepArg::I64(v) => pack.push(&v.to_ne_bytes()),
                            StepArg::F32(v) => pack.push(&v.to_ne_bytes()),
                            StepArg::F64(v) => pack.push(&v.to_ne_bytes()),
                        }
                    }
                    let mut params = pack.params();
                    // SAFETY: trusted baseline kernels with the arguments their lowering packs.
                    unsafe {
                        self.gpu
                            .launch(f, *grid, *block, *smem_bytes, &mut params)?
                    };
                }
                Step::Gemm(g) => {
                    let call = GemmCall {
                        g,
                        f64: plan.precision == Precision::F64,
                        a: ptr(g.a)?,
                        b: ptr(g.b)?,
                        c: ptr(g.c)?,
                    };
                    self.blas()
                        .map_err(fail)?
                        .gemm(&call)
                        .map_err(|e| fail(e.to_string()))?;
                }
                Step::Conv(c) => {
                    let at = (
                        ptr(c.x)?,
                        ptr(c.w)?,
                        c.bias.map(ptr).transpose()?,
                        ptr(c.y)?,
                    );
                    let Some(Ok(dnn)) = self.dnn.as_mut() else {
                        return Err(no_dnn());
                    };
                    dnn.conv(&self.gpu, c, at)
                        .map_err(|e| fail(e.to_string()))?;
                }
                Step::BatchNorm(b) => {
                    let at = (ptr(b.x)?, ptr(b.w)?, ptr(b.b)?, ptr(b.y)?);
                    let Some(Ok(dnn)) = self.dnn.as_mut() else {
                        return Err(no_dnn());
                    };
                    dnn.batch_norm(b, at).map_err(|e| fail(e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    /// The fp64 plan that computes the correctness protocol's reference.
    pub fn reference_plan(&mut self, task: &Task, preset: Preset) -> Result<EagerPlan, String> {
        self.runnable(crate::baseline::lower_f64(task, preset))
    }

    /// The baseline plan this worker times candidates against.
    pub fn baseline_plan(&mut self, task: &Task, preset: Preset) -> Result<EagerPlan, String> {
        self.runnable(crate::baseline::lower(task, preset))
    }

    /// A lowered plan as this worker runs it: GEMMs through cuBLAS when it loads, else kevin's
    /// own GEMM kernel; a native plan's convolutions through cuDNN when it loads and takes them,
    /// else (and in the fp64 reference plan) kevin's direct convolution kernel; the same for its
    /// batch norms that PyTorch sends to cuDNN (else kevin's `chan_norm`).
    pub(super) fn runnable(
        &mut self,
        lowered: Result<EagerPlan, crate::baseline::BaselineError>,
    ) -> Result<EagerPlan, String> {
        let plan = lowered.map_err(|e| e.to_string())?;
        let gemm_kernel = !self.blas_in_use();
        let (mut convs, mut norms): (Vec<&Conv>, Vec<&BatchNorm>) = (Vec::new(), Vec::new());
        for step in &plan.steps {
            match step {
                Step::Conv(c) => convs.push(c),
                Step::BatchNorm(b) => norms.push(b),
                _ => {}
            }
        }
        let dnn_kernels = plan.precision == Precision::F64
            || convs.iter().any(|c| !Dnn::takes(c))
            || ((!convs.is_empty() || !norms.is_empty()) && !self.dnn_ready(&convs, &norms));
        Ok(plan.with_kernel_steps(gemm_kernel, dnn_kernels))
    }

    /// Whether cuDNN is in use and has every convolution of `convs` and batch norm of `norms`
    /// ready (descriptors, algorithm, workspace); one it cannot take sends the plan's cuDNN steps
    /// to kevin's kernels.
    fn dnn_ready(&mut self, convs: &[&Conv], norms: &[&BatchNorm]) -> bool {
        if !self.dnn_in_use() {
            return false;
        }
        let gpu = &self.gpu;
        let Some(Ok(dnn)) = self.dnn.as_mut() else {
            return false;
        };
        convs.iter().all(|c| dnn.ready(gpu, c).is_ok())
            && norms.iter().all(|b| dnn.ready_norm(b).is_ok())
    }
}

/// An input's distribution and the extent of its last axis (the matrices of a triangular or
/// symmetric input are `cols x cols`).
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    /// The task file's distribution.
    pub dist: InputDist,
    /// Extent of the input's last axis.
    pub cols: usize,
}

/// Packs the generator's parameters (seed, distribution, dtype) as `kevin_generate` and its
/// siblings take them.
fn push_draw(args: &mut ArgPack, dtype: Dtype, draw: Draw, seed: u64) -> Result<(), GpuError> {
    let cols = draw.cols as f64;
    let (kind, a, b, c) = match draw.dist {
        InputDist::Normal { mean, std } => (0i32, mean, std, 0.0),
        InputDist::Uniform { lo, hi } => (1, lo, hi, 0.0),
        InputDist::Positive { min, std } => (2, min, std, 0.0),
        InputDist::Grid { lo, step, count } => (3, lo, step, f64::from(count)),
        InputDist::ScaledUniform { lo, hi } => (4, lo, hi, 0.0),
        InputDist::Upper { lo, hi } => (5, lo, hi, cols),
        InputDist::Lower { lo, hi } => (6, lo, hi, cols),
        InputDist::Symmetric { lo, hi } => (7, lo, hi, cols),
    };
    let code: i32 = match dtype {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::I64 => 3,
    };
    args.push(&seed.to_ne_bytes());
    args.push(&kind.to_ne_bytes());
    args.push(&(a as f32).to_ne_bytes());
    args.push(&(b as f32).to_ne_bytes());
    args.push(&(c as f32).to_ne_bytes());
    args.push(&code.to_ne_bytes());
    Ok(())
}

/// The compare kernel's code of a stored reference element: 0 = f32 (a float output's
/// reference, narrowed from f64), 3 = i64.
pub(super) fn reference_code(d: Dtype) -> i32 {
    if d == Dtype::I64 {
        3
    } else {
        0
    }
}

/// Bytes per element of a stored reference: 4 for a float output (f32), 8 for i64.
pub fn reference_width(d: Dtype) -> usize {
    if d == Dtype::I64 {
        8
    } else {
        4
    }
}

/// The NaN (or i64) fill pattern of an output of `dtype`, as the compare kernel sees its bits.
pub(super) fn fill_bits(d: Dtype) -> u64 {
    match d {
        Dtype::F32 => u64::from(F32_FILL),
        Dtype::F16 => u64::from(F16_FILL),
        Dtype::Bf16 => u64::from(BF16_FILL),
        Dtype::I64 => I64_FILL as u64,
    }
}

pub(super) fn dtype_code(d: Dtype) -> i32 {
    match d {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::I64 => 3,
    }
}

/// A stored reference element's value from its bits: f32 for a float output of `dtype`, i64
/// for an index output.
pub(super) fn decode_reference(dtype: Dtype, raw: u64) -> f64 {
    if dtype == Dtype::I64 {
        raw as i64 as f64
    } else {
        f64::from(f32::from_bits(raw as u32))
    }
}

/// An element's value from its bits.
pub fn decode(dtype: Dtype, raw: u64) -> f64 {
    match dtype {
        Dtype::F32 => f64::from(f32::from_bits(raw as u32)),
        Dtype::F16 => f16_from_bits(raw as u16),
        Dtype::Bf16 => bf16_from_bits(raw as u16),
        Dtype::I64 => raw as i64 as f64,
    }
}
