//! The GPU worker's state and the protocols on device memory (see the module docs of
//! [`crate::gpu`]).

use std::collections::{BTreeMap, HashMap};

use cudarc::driver::sys::CUfunction;

use crate::baseline::{EagerPlan, Precision, Step, StepArg};
use crate::candidate::{ResolvedArg, ResolvedLaunch, ResolvedPlan, Scalar};
use crate::ops::round::{bf16_from_bits, f16_from_bits};
use crate::ops::Dtype;
use crate::tasks::InputDist;
use crate::tasks::{Preset, Role, Task, TensorSpec, Tolerance};
use crate::verify::buffer::{dtype_size, BF16_FILL, F16_FILL, F32_FILL, I64_FILL};
use crate::verify::correctness::{
    judge, os_seed, Comparison, ElemFailure, FirstFailure, HarnessError, OutputComparison, Trials,
};
use crate::verify::timing::{Timer, Which};
use crate::verify::ExecFailure;

use super::blas::{Blas, GemmCall};
use super::device::{allow_dynamic_smem, ArgPack, DevBuf, EventPair, Gpu, GpuError, GpuModule};
use super::{mask_stream, HARNESS_KERNELS};

/// Bytes after every task tensor, filled with [`CANARY`] before a run: a kernel that writes a
/// little past its output is caught (there are no guard pages on the device).
pub const SLACK: usize = 256;
const CANARY: u8 = 0xA5;
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

/// Set once a sticky fault has poisoned this process's context: every later answer says so, and
/// the parent replaces the worker.
static POISONED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this worker's context is poisoned (it must be replaced).
pub fn poisoned() -> bool {
    POISONED.load(std::sync::atomic::Ordering::SeqCst)
}

/// A candidate's run outlived its limit: it is still on the GPU, so this worker must go.
fn overran(limit: std::time::Duration) -> ExecFailure {
    POISONED.store(true, std::sync::atomic::Ordering::SeqCst);
    ExecFailure::Timeout {
        limit_ms: limit.as_millis() as u64,
    }
}

fn note_fault(e: &GpuError) {
    if e.is_sticky() {
        POISONED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn harness(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Backend(e.to_string())
}

/// A GPU error as the candidate's failure: a sticky fault is its crash (and poisons this worker);
/// anything else is what `otherwise` makes of it (a refused launch, or the harness's own error).
fn fault_or(e: GpuError, otherwise: impl FnOnce(GpuError) -> ExecFailure) -> ExecFailure {
    note_fault(&e);
    if e.is_sticky() {
        ExecFailure::Crash(format!("the kernel faulted: {} (at {})", e.fault(), e.call))
    } else {
        otherwise(e)
    }
}

/// A GPU error during the harness's own work: a sticky one was caused by the candidate (the
/// harness's kernels are trusted and the context was fine before the candidate ran).
fn exec_failure(e: GpuError) -> ExecFailure {
    fault_or(e, |e| ExecFailure::Harness(e.to_string()))
}

/// The worker's GPU with the harness's and the baseline's modules loaded.
pub struct Harness {
    gpu: Gpu,
    _hmod: GpuModule,
    hk: HashMap<&'static str, CUfunction>,
    bmod: GpuModule,
    bfns: HashMap<String, CUfunction>,
    blas: Option<Result<Blas, String>>,
    flush: DevBuf,
    flush_value: u32,
    stats: DevBuf,
    /// Fallback plans (GEMMs as kevin's kernel) when cuBLAS is missing.
    use_blas: bool,
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
            flush,
            flush_value: 0,
            stats,
            use_blas: std::env::var_os("KEVIN_NO_CUBLAS").is_none(),
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

    fn blas(&mut self) -> Result<&Blas, String> {
        let stream = self.gpu.stream();
        self.blas
            .get_or_insert_with(|| Blas::new(stream).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| e.clone())
    }

    fn hk(&self, name: &str) -> CUfunction {
        // Every name is looked up in `new`.
        self.hk[name]
    }

    /// A grid-stride launch of a harness kernel over `n` elements.
    fn launch_h(&self, name: &str, n: u64, args: &mut ArgPack) -> Result<(), GpuError> {
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
        dist: InputDist,
        seed: u64,
    ) -> Result<(), GpuError> {
        let (kind, a, b) = match dist {
            InputDist::Normal { mean, std } => (0i32, mean, std),
            InputDist::Uniform { lo, hi } => (1, lo, hi),
            InputDist::Positive { min, std } => (2, min, std),
        };
        let code: i32 = match dtype {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Bf16 => 2,
            Dtype::I64 => {
                return Err(GpuError {
                    call: "generate".into(),
                    name: "i64 inputs are not supported by the GPU input generator".into(),
                    desc: String::new(),
                    code: 0,
                })
            }
        };
        let mut args = ArgPack::default();
        args.ptr(ptr);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&seed.to_ne_bytes());
        args.push(&kind.to_ne_bytes());
        args.push(&(a as f32).to_ne_bytes());
        args.push(&(b as f32).to_ne_bytes());
        args.push(&code.to_ne_bytes());
        self.launch_h("kevin_generate", n as u64, &mut args)
    }

    fn width_kernel(prefix: &str, width: usize) -> String {
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
    fn reset_stats(&self) -> Result<(), GpuError> {
        self.gpu.fill_bytes_at(self.stats.ptr(), 0, 32)?;
        self.gpu.fill_bytes_at(self.stats.ptr() + 8, 0xff, 8)
    }

    fn read_stats(&self) -> Result<[u64; 4], GpuError> {
        let mut bytes = [0u8; 32];
        self.gpu.download(&mut bytes, &self.stats)?;
        let mut out = [0u64; 4];
        for (i, v) in out.iter_mut().enumerate() {
            *v = u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        }
        Ok(out)
    }

    /// The first index where `a` differs from the masked copy `masked`.
    pub fn diff(
        &self,
        a: u64,
        masked: u64,
        n: usize,
        width: usize,
        key: u64,
    ) -> Result<Option<u64>, GpuError> {
        self.reset_stats()?;
        let mut args = ArgPack::default();
        args.ptr(a);
        args.ptr(masked);
        args.push(&(n as u64).to_ne_bytes());
        args.push(&key.to_ne_bytes());
        args.ptr(self.stats.ptr() + 8);
        self.launch_h(
            &Self::width_kernel("kevin_diff", width),
            n as u64,
            &mut args,
        )?;
        let s = self.read_stats()?;
        Ok((s[1] != u64::MAX).then_some(s[1]))
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

    /// Compares `n` elements of `got` (of `dtype`) with the masked 8-byte reference (f64 for
    /// float outputs, i64 for index outputs): (failures, first failing index, max error ratio).
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

    /// One reference element (8 bytes: f64, or i64 for index outputs), unmasked with `key`.
    pub fn reference_element(
        &self,
        ptr: u64,
        index: u64,
        dtype: Dtype,
        key: u64,
    ) -> Result<f64, GpuError> {
        let mut bytes = [0u8; 8];
        self.gpu.download_at(&mut bytes, ptr + index * 8, 8)?;
        Ok(decode_reference(
            dtype,
            u64::from_ne_bytes(bytes) ^ mask_stream(key, index),
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

    fn baseline_fn(&mut self, name: &str) -> Result<CUfunction, GpuError> {
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
                            StepArg::Buffer(i) => pack.ptr(
                                *ptrs
                                    .get(*i)
                                    .ok_or_else(|| fail(format!("buffer {i} out of range")))?,
                            ),
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
                    let ptr = |i: usize| {
                        ptrs.get(i)
                            .copied()
                            .ok_or_else(|| fail(format!("buffer {i} out of range")))
                    };
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
    /// own GEMM kernel.
    fn runnable(
        &mut self,
        lowered: Result<EagerPlan, crate::baseline::BaselineError>,
    ) -> Result<EagerPlan, String> {
        let plan = lowered.map_err(|e| e.to_string())?;
        Ok(if self.blas_in_use() {
            plan
        } else {
            plan.with_kernel_gemm()
        })
    }
}

/// The compare kernel's code of a reference element: 4 = f64, 3 = i64.
fn reference_code(d: Dtype) -> i32 {
    if d == Dtype::I64 {
        3
    } else {
        4
    }
}

/// The NaN (or i64) fill pattern of an output of `dtype`, as the compare kernel sees its bits.
fn fill_bits(d: Dtype) -> u64 {
    match d {
        Dtype::F32 => u64::from(F32_FILL),
        Dtype::F16 => u64::from(F16_FILL),
        Dtype::Bf16 => u64::from(BF16_FILL),
        Dtype::I64 => I64_FILL as u64,
    }
}

fn dtype_code(d: Dtype) -> i32 {
    match d {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
        Dtype::I64 => 3,
    }
}

/// A reference element's value from its 8 bytes: f64 for a float output of `dtype`, i64 for
/// an index output.
fn decode_reference(dtype: Dtype, raw: u64) -> f64 {
    if dtype == Dtype::I64 {
        raw as i64 as f64
    } else {
        f64::from_bits(raw)
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

fn alloc_tensor(gpu: &Gpu, spec: &TensorSpec) -> Result<DevBuf, GpuError> {
    gpu.alloc(spec.numel() * dtype_size(spec.dtype) + SLACK)
}

/// A candidate's module and launch plan, ready to run on task tensors.
pub struct Candidate {
    _module: GpuModule,
    launches: Vec<(CUfunction, ResolvedLaunch)>,
    scratch: Vec<DevBuf>,
}

impl Candidate {
    /// Loads the module and looks up every launched kernel (`symbols`: source name -> lowered).
    pub fn load(
        h: &Harness,
        image: &[u8],
        symbols: &BTreeMap<String, String>,
        plan: &ResolvedPlan,
    ) -> Result<Candidate, ExecFailure> {
        let module = h
            .gpu
            .load_module(image)
            .map_err(|e| ExecFailure::Launch(format!("the module did not load: {e}")))?;
        let mut launches = Vec::new();
        for l in &plan.launches {
            let symbol = symbols
                .get(&l.kernel)
                .map_or(l.kernel.as_str(), String::as_str);
            let f = module.function(symbol).map_err(|e| {
                ExecFailure::Launch(format!("kernel `{}` not found: {e}", l.kernel))
            })?;
            // SAFETY: `f` belongs to `module`, which the candidate keeps loaded.
            unsafe { allow_dynamic_smem(f, l.smem_bytes) }.map_err(|e| {
                ExecFailure::Launch(format!(
                    "launch line {}: {} bytes of dynamic shared memory refused: {e}",
                    l.line, l.smem_bytes
                ))
            })?;
            launches.push((f, l.clone()));
        }
        let scratch = plan
            .scratch
            .iter()
            .map(|s| h.gpu.alloc((s.elems * s.dtype.size_bytes()) as usize))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        Ok(Candidate {
            _module: module,
            launches,
            scratch,
        })
    }

    /// Enqueues the launch sequence on task tensors at `tensors`.
    fn enqueue(&self, gpu: &Gpu, tensors: &[u64]) -> Result<(), ExecFailure> {
        for (f, l) in &self.launches {
            let mut pack = ArgPack::default();
            for a in &l.args {
                match a {
                    ResolvedArg::Tensor(i) => pack.ptr(tensors.get(*i).copied().unwrap_or(0)),
                    ResolvedArg::Scratch(i) => {
                        pack.ptr(self.scratch.get(*i).map_or(0, DevBuf::ptr))
                    }
                    ResolvedArg::Scalar(s) => match s {
                        Scalar::I32(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::U32(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::I64(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::U64(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::F32(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::F64(v) => pack.push(&v.to_ne_bytes()),
                    },
                }
            }
            let mut params = pack.params();
            // SAFETY: the plan was validated against the kernel's signature; what the kernel
            // does with its pointers is untrusted, which is why this runs in a worker.
            unsafe { gpu.launch(*f, l.grid, l.block, l.smem_bytes, &mut params) }.map_err(|e| {
                fault_or(e, |e| {
                    ExecFailure::Launch(format!(
                        "launch line {} (`{}`): {}",
                        l.line,
                        l.kernel,
                        e.fault()
                    ))
                })
            })?;
        }
        Ok(())
    }

    /// Runs the launch sequence and waits for it: a run past `limit` is a timeout. A run still
    /// going at `limit` gets until [`RUN_LIMIT`] to end, because the driver reports an illegal or
    /// misaligned address some hundreds of milliseconds after the fault (such a run is the crash
    /// it is); one that ends in time without a fault is a timeout (too slow), and one still
    /// running at `RUN_LIMIT` is a timeout that poisons this worker (the kernel cannot be
    /// stopped).
    pub fn run(
        &self,
        gpu: &Gpu,
        tensors: &[u64],
        limit: std::time::Duration,
    ) -> Result<(), ExecFailure> {
        self.enqueue(gpu, tensors)?;
        let started = std::time::Instant::now();
        let failed = |e: GpuError| {
            fault_or(e, |e| {
                ExecFailure::Launch(format!("the launch sequence failed: {}", e.fault()))
            })
        };
        let wait = |d: std::time::Duration| gpu.sync_within(d).map_err(failed);
        if wait(limit)? {
            return Ok(());
        }
        if wait(RUN_LIMIT.saturating_sub(started.elapsed()))? {
            // Ended late. A fault may surface only at the next synchronisation (the storm of
            // 2026-12-01 answered 15 misaligned accesses as slow runs without this).
            gpu.sync().map_err(failed)?;
            Err(ExecFailure::Timeout {
                limit_ms: limit.as_millis() as u64,
            })
        } else {
            Err(overran(limit))
        }
    }
}

/// Device buffers of one task at one preset: the tensors the candidate sees (with slack), the
/// masked references and input copies, and the baseline's intermediates.
pub struct TaskBuffers<'t> {
    task: &'t Task,
    specs: Vec<TensorSpec>,
    n_inputs: usize,
    /// The baseline in the task's dtypes: what candidates are timed against.
    plan: EagerPlan,
    /// The same program in f64: the reference of the correctness protocol.
    ref_plan: EagerPlan,
    tensors: Vec<DevBuf>,
    /// Masked references, 8 bytes per element.
    refs: Vec<DevBuf>,
    snaps: Vec<DevBuf>,
    temps: Vec<DevBuf>,
    /// f64 copies of the inputs and the f64 plan's intermediates.
    wide: Vec<DevBuf>,
    ref_temps: Vec<DevBuf>,
}

impl<'t> TaskBuffers<'t> {
    /// Allocates everything for `task` at `preset`.
    pub fn new(h: &mut Harness, task: &'t Task, preset: Preset) -> Result<Self, HarnessError> {
        let specs = task.signature(preset).tensors;
        let n_inputs = specs.iter().filter(|t| t.role == Role::Input).count();
        let plan = h.baseline_plan(task, preset).map_err(harness)?;
        let ref_plan = h.reference_plan(task, preset).map_err(harness)?;
        if plan.buffers.len() < specs.len() || ref_plan.buffers.len() < specs.len() {
            return Err(harness(
                "the baseline plan has fewer buffers than the task has tensors",
            ));
        }
        let gpu = &h.gpu;
        let tensors = specs
            .iter()
            .map(|s| alloc_tensor(gpu, s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let refs = specs[n_inputs..]
            .iter()
            .map(|s| gpu.alloc(s.numel() * 8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let wide = specs[..n_inputs]
            .iter()
            .map(|s| gpu.alloc(s.numel() * 8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let ref_temps = ref_plan.buffers[specs.len()..]
            .iter()
            .map(|b| gpu.alloc(b.stored_bytes(ref_plan.precision)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let snaps = specs[..n_inputs]
            .iter()
            .map(|s| alloc_tensor(gpu, s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let temps = plan.buffers[specs.len()..]
            .iter()
            .map(|b| gpu.alloc(b.elems * dtype_size(b.dtype)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        Ok(TaskBuffers {
            task,
            specs,
            n_inputs,
            plan,
            ref_plan,
            tensors,
            refs,
            snaps,
            temps,
            wide,
            ref_temps,
        })
    }

    /// The limit of one verification run of a candidate for this task: [`RUN_FACTOR`] times
    /// the baseline's time on this GPU (its second run, on inputs drawn from a fixed seed),
    /// within [`MIN_RUN_LIMIT`, `RUN_LIMIT`]. The outputs are zeroed afterwards, so no correct
    /// result is left in memory the candidate can reach.
    pub fn run_limit(&self, h: &mut Harness) -> Result<std::time::Duration, HarnessError> {
        let ptrs = self.tensor_ptrs();
        let (inputs, outputs) = ptrs.split_at(self.n_inputs);
        self.generate(h, inputs, 0).map_err(harness)?;
        let base = self.baseline_ptrs(inputs, outputs);
        let events = h.gpu.timer().map_err(harness)?;
        let mut ms = 0.0;
        for _ in 0..2 {
            events.start().map_err(harness)?;
            h.run_baseline(&self.plan, &base).map_err(harness)?;
            events.stop().map_err(harness)?;
            ms = events.elapsed_ms().map_err(harness)?;
        }
        for t in &self.tensors[self.n_inputs..] {
            h.gpu.fill_u32(t, 0).map_err(harness)?;
        }
        let limit = std::time::Duration::from_secs_f64(ms * RUN_FACTOR / 1e3);
        Ok(limit.clamp(MIN_RUN_LIMIT, RUN_LIMIT))
    }

    fn tensor_ptrs(&self) -> Vec<u64> {
        self.tensors.iter().map(DevBuf::ptr).collect()
    }

    /// Baseline addresses: `inputs`, then `outputs`, then the intermediates.
    fn baseline_ptrs(&self, inputs: &[u64], outputs: &[u64]) -> Vec<u64> {
        inputs
            .iter()
            .chain(outputs)
            .copied()
            .chain(self.temps.iter().map(DevBuf::ptr))
            .collect()
    }

    /// Draws the inputs of a trial into `targets` (one buffer per input).
    fn generate(&self, h: &Harness, targets: &[u64], seed: u64) -> Result<(), GpuError> {
        for (i, spec) in self.specs[..self.n_inputs].iter().enumerate() {
            let dist = self.task.inputs.get(i).copied().unwrap_or_default();
            let stream = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            h.generate(targets[i], spec.numel(), spec.dtype, dist, seed ^ stream)?;
        }
        Ok(())
    }

    /// Computes the fp64 reference of the task-dtype `inputs` into `outputs` (8 bytes per
    /// element) and masks it with `key`; the f64 copies and intermediates are overwritten
    /// afterwards so no unmasked result stays behind.
    fn reference_into(
        &self,
        h: &mut Harness,
        inputs: &[u64],
        outputs: &[u64],
        key: u64,
    ) -> Result<(), GpuError> {
        for ((spec, &src), dst) in self.specs[..self.n_inputs]
            .iter()
            .zip(inputs)
            .zip(&self.wide)
        {
            h.widen(src, dst.ptr(), spec.numel(), spec.dtype)?;
        }
        let ptrs: Vec<u64> = self
            .wide
            .iter()
            .map(DevBuf::ptr)
            .chain(outputs.iter().copied())
            .chain(self.ref_temps.iter().map(DevBuf::ptr))
            .collect();
        h.run_baseline(&self.ref_plan, &ptrs)?;
        for (spec, &out) in self.specs[self.n_inputs..].iter().zip(outputs) {
            h.mask(out, spec.numel(), 8, key)?;
        }
        for t in self.wide.iter().chain(&self.ref_temps) {
            h.gpu.fill_u32(t, 0)?;
        }
        h.gpu.sync()
    }
}

/// The correctness protocol's steps on the device ([`Trials`]).
pub struct GpuTrials<'a, 't> {
    h: &'a mut Harness,
    bufs: &'a TaskBuffers<'t>,
    cand: &'a Candidate,
    /// The limit of each candidate run.
    limit: std::time::Duration,
    key: u64,
    /// Wall-clock ms spent in each step of the protocol (see [`GpuTrials::spent`]); each step
    /// ends with a synchronisation or a download, so this is GPU time plus launch gaps.
    spent: [f64; 4],
}

impl<'a, 't> GpuTrials<'a, 't> {
    /// Trials of `cand` on `bufs`, each run at most `limit` (see [`TaskBuffers::run_limit`]).
    pub fn new(
        h: &'a mut Harness,
        bufs: &'a TaskBuffers<'t>,
        cand: &'a Candidate,
        limit: std::time::Duration,
    ) -> Self {
        GpuTrials {
            h,
            bufs,
            cand,
            limit,
            key: 0,
            spent: [0.0; 4],
        }
    }

    /// Milliseconds spent so far drawing inputs and references (`begin`), running the candidate,
    /// checking inputs and canaries (`tampering`) and comparing outputs.
    pub fn spent(&self) -> [(&'static str, f64); 4] {
        let [b, r, t, c] = self.spent;
        [("begin", b), ("run", r), ("tampering", t), ("compare", c)]
    }
}

impl Trials for GpuTrials<'_, '_> {
    fn begin(&mut self, seed: u64) -> Result<(), HarnessError> {
        let t = std::time::Instant::now();
        let out = self.begin_inner(seed);
        self.spent[0] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn run_candidate(&mut self) -> Result<(), ExecFailure> {
        let t = std::time::Instant::now();
        let out = self.run_inner();
        self.spent[1] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn tampering(&mut self) -> Result<Option<String>, HarnessError> {
        let t = std::time::Instant::now();
        let out = self.tampering_inner();
        self.spent[2] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn compare(&mut self) -> Result<Vec<OutputComparison>, HarnessError> {
        let t = std::time::Instant::now();
        let out = self.compare_inner();
        self.spent[3] += t.elapsed().as_secs_f64() * 1e3;
        out
    }
}

impl GpuTrials<'_, '_> {
    fn begin_inner(&mut self, seed: u64) -> Result<(), HarnessError> {
        let b = self.bufs;
        self.key = os_seed().map_err(|e| HarnessError::Seed(e.to_string()))?;
        let inputs: Vec<u64> = b.tensors[..b.n_inputs].iter().map(DevBuf::ptr).collect();
        let refs: Vec<u64> = b.refs.iter().map(DevBuf::ptr).collect();
        b.generate(self.h, &inputs, seed).map_err(harness)?;
        b.reference_into(self.h, &inputs, &refs, self.key)
            .map_err(harness)?;
        for (i, spec) in b.specs[..b.n_inputs].iter().enumerate() {
            let bytes = spec.numel() * dtype_size(spec.dtype);
            self.h
                .gpu
                .copy(b.snaps[i].ptr(), b.tensors[i].ptr(), bytes)
                .map_err(harness)?;
            self.h
                .mask(
                    b.snaps[i].ptr(),
                    spec.numel(),
                    dtype_size(spec.dtype),
                    self.key,
                )
                .map_err(harness)?;
        }
        self.h.gpu.sync().map_err(harness)
    }

    fn run_inner(&mut self) -> Result<(), ExecFailure> {
        let b = self.bufs;
        for (spec, t) in b.specs.iter().zip(&b.tensors).skip(b.n_inputs) {
            self.h
                .fill_output(t, spec.numel(), spec.dtype)
                .map_err(exec_failure)?;
        }
        set_canaries(self.h, b).map_err(exec_failure)?;
        self.h.scribble_shared().map_err(exec_failure)?;
        self.cand.run(&self.h.gpu, &b.tensor_ptrs(), self.limit)
    }

    fn tampering_inner(&mut self) -> Result<Option<String>, HarnessError> {
        let b = self.bufs;
        for (i, spec) in b.specs[..b.n_inputs].iter().enumerate() {
            let width = dtype_size(spec.dtype);
            let first = self
                .h
                .diff(
                    b.tensors[i].ptr(),
                    b.snaps[i].ptr(),
                    spec.numel(),
                    width,
                    self.key,
                )
                .map_err(harness)?;
            if let Some(index) = first {
                let (now, _) = self
                    .h
                    .element(b.tensors[i].ptr(), index, spec.dtype, None)
                    .map_err(harness)?;
                let (was, _) = self
                    .h
                    .element(b.snaps[i].ptr(), index, spec.dtype, Some(self.key))
                    .map_err(harness)?;
                return Ok(Some(format!(
                    "input {} was modified (index {index}: {was} -> {now})",
                    spec.name
                )));
            }
        }
        for (spec, t) in b.specs.iter().zip(&b.tensors) {
            let data = spec.numel() * dtype_size(spec.dtype);
            let mut slack = vec![0u8; SLACK];
            self.h
                .gpu
                .download_at(&mut slack, t.ptr() + data as u64, SLACK)
                .map_err(harness)?;
            if slack.iter().any(|&x| x != CANARY) {
                return Ok(Some(format!(
                    "the kernel wrote past the end of {}",
                    spec.name
                )));
            }
        }
        Ok(None)
    }

    fn compare_inner(&mut self) -> Result<Vec<OutputComparison>, HarnessError> {
        let b = self.bufs;
        let tol = b.task.tolerance;
        let mut out = Vec::new();
        for (j, spec) in b.specs[b.n_inputs..].iter().enumerate() {
            let got = b.tensors[b.n_inputs + j].ptr();
            let cmp = compare_output(self.h, got, b.refs[j].ptr(), spec, self.key, tol)?;
            out.push(OutputComparison {
                name: spec.name.clone(),
                dtype: spec.dtype,
                cmp,
            });
        }
        Ok(out)
    }
}

fn set_canaries(h: &Harness, b: &TaskBuffers) -> Result<(), GpuError> {
    for (spec, t) in b.specs.iter().zip(&b.tensors) {
        let data = spec.numel() * dtype_size(spec.dtype);
        h.gpu.fill_bytes_at(t.ptr() + data as u64, CANARY, SLACK)?;
    }
    Ok(())
}

/// Compares one output on the device; the first failure is fetched and judged on the host with
/// the protocol's own rule.
fn compare_output(
    h: &Harness,
    got: u64,
    want: u64,
    spec: &TensorSpec,
    key: u64,
    tol: Tolerance,
) -> Result<Comparison, HarnessError> {
    let (count, first, max_ratio) = h
        .compare(got, want, spec.numel(), spec.dtype, key, tol)
        .map_err(harness)?;
    let first = match first {
        None => None,
        Some(index) => {
            let (g, graw) = h.element(got, index, spec.dtype, None).map_err(harness)?;
            let w = h
                .reference_element(want, index, spec.dtype, key)
                .map_err(harness)?;
            let fill = graw == fill_bits(spec.dtype);
            let kind = judge(spec.dtype, g, fill, w, tol).unwrap_or(ElemFailure::Differs);
            Some(FirstFailure {
                index: index as usize,
                want: w,
                got: if kind == ElemFailure::Unwritten {
                    f64::NAN
                } else {
                    g
                },
                kind,
            })
        }
    };
    Ok(Comparison {
        first,
        count,
        max_ratio,
    })
}

/// One input set of the timing protocol, with the outputs of the candidate's runs on it.
struct InputSet {
    inputs: Vec<DevBuf>,
    outputs: Vec<DevBuf>,
}

/// The timing protocol's [`Timer`] on the device: CUDA events around the whole launch sequence,
/// the L2 flushed before every timed run, [`TIMING_SETS`] input sets rotated, and the output of
/// the last timed candidate run on one of them re-checked afterwards ([`GpuTimer::recheck`]).
///
/// Every set keeps its own output buffers, so the last timed output of each set is still there
/// when timing ends. Only the checked set, drawn from the OS after the candidate was loaded,
/// has an fp64 reference: a kernel cannot tell which of its timed runs will be checked, and the
/// timing run pays for one reference instead of one per set.
pub struct GpuTimer<'a, 't> {
    h: &'a mut Harness,
    bufs: &'a TaskBuffers<'t>,
    cand: &'a Candidate,
    sets: Vec<InputSet>,
    /// The set whose last timed output is re-checked, and its masked reference.
    checked: usize,
    refs: Vec<DevBuf>,
    base_out: Vec<DevBuf>,
    events: EventPair,
    key: u64,
    turn: [usize; 2],
}

impl<'a, 't> GpuTimer<'a, 't> {
    /// Draws the input sets and the checked set's reference.
    pub fn new(
        h: &'a mut Harness,
        bufs: &'a TaskBuffers<'t>,
        cand: &'a Candidate,
    ) -> Result<Self, HarnessError> {
        let seed = || os_seed().map_err(|e| HarnessError::Seed(e.to_string()));
        let key = seed()?;
        let checked = (seed()? % TIMING_SETS as u64) as usize;
        let outputs_of = |h: &Harness| {
            bufs.specs[bufs.n_inputs..]
                .iter()
                .map(|s| alloc_tensor(&h.gpu, s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(harness)
        };
        let mut sets = Vec::new();
        for _ in 0..TIMING_SETS {
            let inputs = bufs.specs[..bufs.n_inputs]
                .iter()
                .map(|s| alloc_tensor(&h.gpu, s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(harness)?;
            let outputs = outputs_of(h)?;
            let ip: Vec<u64> = inputs.iter().map(DevBuf::ptr).collect();
            bufs.generate(h, &ip, seed()?).map_err(harness)?;
            sets.push(InputSet { inputs, outputs });
        }
        let refs = bufs.specs[bufs.n_inputs..]
            .iter()
            .map(|s| h.gpu.alloc(s.numel() * 8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let ip: Vec<u64> = sets[checked].inputs.iter().map(DevBuf::ptr).collect();
        let rp: Vec<u64> = refs.iter().map(DevBuf::ptr).collect();
        bufs.reference_into(h, &ip, &rp, key).map_err(harness)?;
        let base_out = outputs_of(h)?;
        let events = h.gpu.timer().map_err(harness)?;
        Ok(GpuTimer {
            h,
            bufs,
            cand,
            sets,
            checked,
            refs,
            base_out,
            events,
            key,
            turn: [0, 0],
        })
    }

    /// Compares the output of the last timed candidate run on the checked set with its
    /// reference: a kernel that is right while checked and wrong (or lazy) while timed is caught
    /// here. When no timed run used that set (a timing configuration with fewer candidate runs
    /// than sets), the candidate is run on it once first.
    pub fn recheck(&mut self) -> Result<Option<String>, HarnessError> {
        let b = self.bufs;
        let set = &self.sets[self.checked];
        if self.turn[0] <= self.checked {
            for (spec, o) in b.specs[b.n_inputs..].iter().zip(&set.outputs) {
                self.h
                    .fill_output(o, spec.numel(), spec.dtype)
                    .map_err(harness)?;
            }
            let ptrs: Vec<u64> = set
                .inputs
                .iter()
                .chain(&set.outputs)
                .map(DevBuf::ptr)
                .collect();
            if let Err(f) = self.cand.run(&self.h.gpu, &ptrs, RUN_LIMIT) {
                return Ok(Some(format!("a timed run failed: {f}")));
            }
        }
        for (j, spec) in b.specs[b.n_inputs..].iter().enumerate() {
            let cmp = compare_output(
                self.h,
                set.outputs[j].ptr(),
                self.refs[j].ptr(),
                spec,
                self.key,
                b.task.tolerance,
            )?;
            if let Some(first) = cmp.first {
                return Ok(Some(format!(
                    "the output of a timed run is wrong: {} (index {}: expected {}, got {})",
                    first.reason(&spec.name, spec.dtype),
                    first.index,
                    first.want,
                    first.got
                )));
            }
        }
        Ok(None)
    }
}

impl Timer for GpuTimer<'_, '_> {
    fn time_once(&mut self, which: Which) -> Result<f64, ExecFailure> {
        let slot = usize::from(which == Which::Baseline);
        let set = self.turn[slot] % self.sets.len();
        self.turn[slot] += 1;
        let inputs: Vec<u64> = self.sets[set].inputs.iter().map(DevBuf::ptr).collect();
        if which == Which::Candidate {
            // Every timed run starts from NaN outputs, so the checked output is that run's own
            // work (not an earlier run's, left by a kernel that caches and skips). The fill
            // passes through L2: flush again so the run starts as cold as the baseline's.
            let b = self.bufs;
            for (spec, o) in b.specs[b.n_inputs..].iter().zip(&self.sets[set].outputs) {
                self.h
                    .fill_output(o, spec.numel(), spec.dtype)
                    .map_err(exec_failure)?;
            }
            self.h.flush_l2().map_err(exec_failure)?;
        }
        self.events.start().map_err(exec_failure)?;
        match which {
            Which::Candidate => {
                let mut ptrs = inputs;
                ptrs.extend(self.sets[set].outputs.iter().map(DevBuf::ptr));
                self.cand.enqueue(&self.h.gpu, &ptrs)?;
            }
            Which::Baseline => {
                let outs: Vec<u64> = self.base_out.iter().map(DevBuf::ptr).collect();
                let ptrs = self.bufs.baseline_ptrs(&inputs, &outs);
                self.h
                    .run_baseline(&self.bufs.plan, &ptrs)
                    .map_err(|e| ExecFailure::Harness(e.to_string()))?;
            }
        }
        self.events.stop().map_err(exec_failure)?;
        if which == Which::Baseline {
            // Untimed: no correct output of the current input set stays readable for a
            // candidate that scans device memory.
            for b in &self.base_out {
                self.h.gpu.fill_u32(b, 0).map_err(exec_failure)?;
            }
            return self.events.elapsed_ms().map_err(exec_failure);
        }
        match self.events.elapsed_ms_within(RUN_LIMIT) {
            Ok(Some(ms)) => Ok(ms),
            Ok(None) => Err(overran(RUN_LIMIT)),
            Err(e) => Err(exec_failure(e)),
        }
    }

    fn flush_cache(&mut self) {
        // A failed flush shows up at the next launch's error check.
        let _ = self.h.flush_l2();
    }
}

/// Downloads a device tensor of `spec`'s elements as f64 values: in its dtype, or (`reference`)
/// as the 8-byte elements of a reference.
fn download_values(
    h: &Harness,
    ptr: u64,
    spec: &TensorSpec,
    reference: bool,
) -> Result<Vec<f64>, GpuError> {
    let width = if reference { 8 } else { dtype_size(spec.dtype) };
    let mut bytes = vec![0u8; spec.numel() * width];
    let n = bytes.len();
    h.gpu.download_at(&mut bytes, ptr, n)?;
    Ok(bytes
        .chunks_exact(width)
        .map(|c| {
            let mut raw = [0u8; 8];
            raw[..width].copy_from_slice(c);
            let raw = u64::from_ne_bytes(raw);
            if reference {
                decode_reference(spec.dtype, raw)
            } else {
                decode(spec.dtype, raw)
            }
        })
        .collect())
}

/// Largest error / tolerance bound and the first element out of tolerance, of `got` against the
/// interpreter's `want`.
fn judge_all(
    spec: &TensorSpec,
    got: &[f64],
    want: &[f64],
    tol: Tolerance,
    ratio: &mut f64,
    first: &mut Option<String>,
) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if judge(spec.dtype, g, false, w, tol).is_some() {
            first.get_or_insert_with(|| format!("{}[{i}]: expected {w}, got {g}", spec.name));
        } else if spec.dtype != Dtype::I64 && w.is_finite() {
            *ratio = ratio.max((g - w).abs() / (tol.atol + tol.rtol * w.abs()));
        }
    }
}

/// Runs the baseline of `task`, and its fp64 reference plan, on one input set drawn on the
/// device from `seed`, and compares both with the fp64 interpreter on the same (downloaded)
/// inputs.
pub fn check_baseline(
    h: &mut Harness,
    task: &Task,
    preset: Preset,
    seed: u64,
) -> Result<crate::cuda_env::BaselineCheck, String> {
    let e = |e: GpuError| e.to_string();
    let bufs = TaskBuffers::new(h, task, preset).map_err(|e| e.to_string())?;
    let inputs: Vec<u64> = bufs.tensors[..bufs.n_inputs]
        .iter()
        .map(DevBuf::ptr)
        .collect();
    let outputs: Vec<u64> = bufs.tensors[bufs.n_inputs..]
        .iter()
        .map(DevBuf::ptr)
        .collect();
    bufs.generate(h, &inputs, seed).map_err(e)?;
    let ptrs = bufs.baseline_ptrs(&inputs, &outputs);
    h.run_baseline(&bufs.plan, &ptrs).map_err(e)?;
    h.gpu.sync().map_err(e)?;
    let host_inputs = bufs.specs[..bufs.n_inputs]
        .iter()
        .zip(&inputs)
        .map(|(s, &p)| download_values(h, p, s, false))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    let want = task
        .reference(preset, &host_inputs)
        .map_err(|e| format!("reference: {e}"))?;
    let tol = task.tolerance;
    let (mut max_ratio, mut first_failure) = (0.0, None);
    let (mut ref_ratio, mut ref_failure) = (0.0, None);
    let out_specs = &bufs.specs[bufs.n_inputs..];
    for ((spec, &p), want) in out_specs.iter().zip(&outputs).zip(&want) {
        let got = download_values(h, p, spec, false).map_err(e)?;
        judge_all(spec, &got, want, tol, &mut max_ratio, &mut first_failure);
    }
    // The fp64 reference, unmasked (key 0 is never drawn; masking is skipped here).
    let wide_out = out_specs
        .iter()
        .map(|s| h.gpu.alloc(s.numel() * 8))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;
    for ((spec, &src), dst) in bufs.specs[..bufs.n_inputs]
        .iter()
        .zip(&inputs)
        .zip(&bufs.wide)
    {
        h.widen(src, dst.ptr(), spec.numel(), spec.dtype)
            .map_err(e)?;
    }
    let rptrs: Vec<u64> = bufs
        .wide
        .iter()
        .map(DevBuf::ptr)
        .chain(wide_out.iter().map(DevBuf::ptr))
        .chain(bufs.ref_temps.iter().map(DevBuf::ptr))
        .collect();
    h.run_baseline(&bufs.ref_plan, &rptrs).map_err(e)?;
    h.gpu.sync().map_err(e)?;
    for ((spec, buf), want) in out_specs.iter().zip(&wide_out).zip(&want) {
        let got = download_values(h, buf.ptr(), spec, true).map_err(e)?;
        judge_all(spec, &got, want, tol, &mut ref_ratio, &mut ref_failure);
    }
    Ok(crate::cuda_env::BaselineCheck {
        steps: bufs.plan.steps.len(),
        cublas: h.blas_in_use(),
        max_error_ratio: max_ratio,
        first_failure,
        reference_max_error_ratio: ref_ratio,
        reference_first_failure: ref_failure,
    })
}
