//! kevin's own CUDA sources for the policy (issue 18): compiled with NVRTC once per process and
//! architecture, loaded into the device's primary context (the one cubecl uses, so burn's
//! device addresses are valid in them).
//!
//! Each source is `cuda/prelude.cuh` (element loads and stores in f32 or bf16, a warp's sum)
//! followed by its own file: [`crate::qwen2::fused`]'s generation pass, [`crate::flash`]'s
//! attention and [`crate::logprob`]'s log-probabilities for the learner. The last two launch
//! through an [`Engine`] (per thread, source and GPU) by [`in_order`], as fusion custom operations
//! ([`custom_op`]): on cubecl's own stream where [`crate::stream`] finds it, between two host
//! fences otherwise.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::cuda::CudaDevice;
use burn::backend::ir::{CustomOpIr, OperationIr, TensorIr};
use burn::backend::Autodiff;
use burn::cubecl::cuda::CudaRuntime;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionRuntime, FusionTensor};
use kevin::gpu::device::ArgPack;

use cudarc::driver::result as cu;
use cudarc::driver::sys as drv;

/// A process-wide on/off switch of one of kevin's fast paths (on by default; off, burn's ops,
/// the reference path, run instead).
pub struct Switch(AtomicBool);

impl Switch {
    /// A switch that starts on.
    pub const fn on() -> Switch {
        Switch(AtomicBool::new(true))
    }

    /// Turns the path on or off.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Whether the path is taken where it serves.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What every source starts with.
pub const PRELUDE: &str = include_str!("cuda/prelude.cuh");

/// A CUDA source of kevin's: its name (the compile cache's key), its text after [`PRELUDE`],
/// and its kernel symbols.
pub struct Source {
    /// Names it in the cache and in errors.
    pub name: &'static str,
    /// The file's text.
    pub text: &'static str,
    /// Its `extern "C"` kernels.
    pub kernels: fn() -> Vec<String>,
}

impl Source {
    /// The whole text NVRTC compiles.
    pub fn full_text(&self) -> String {
        [PRELUDE, self.text].concat()
    }

    /// Compiles the source for `arch` (e.g. "sm_90") into a cubin.
    pub fn compile(&self, arch: &str) -> Result<Vec<u8>, String> {
        let names = (self.kernels)();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let text = self.full_text();
        let mut req = kevin::compile::CompileRequest::ptx(&text, &names);
        req.arch = arch.to_string();
        req.output = kevin::compile::OutputKind::Cubin;
        let out = kevin::compile::compile(&req, &kevin::compile::find_cuda_include_dirs())
            .map_err(|e| format!("compiling the {} kernels: {e}", self.name))?;
        Ok(out.image.into_bytes())
    }

    /// The source's cubin for GPU `device`'s architecture, compiled once per process and
    /// architecture (a failure too is remembered), loaded into the current context.
    pub fn load(&self, device: usize) -> Result<drv::CUmodule, String> {
        type Images = BTreeMap<(&'static str, String), Result<Vec<u8>, String>>;
        static IMAGES: Mutex<Images> = Mutex::new(BTreeMap::new());
        let dev = cu::device::get(device as i32).map_err(|e| format!("{e:?}"))?;
        // SAFETY: attribute queries of a valid device.
        let attr = |a| unsafe { cu::device::get_attribute(dev, a) }.map_err(|e| format!("{e:?}"));
        let major = attr(drv::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(drv::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let arch = format!("sm_{major}{minor}");
        let image = IMAGES
            .lock()
            .map_err(|_| format!("the {} kernels' cache lock is poisoned", self.name))?
            .entry((self.name, arch.clone()))
            .or_insert_with(|| self.compile(&arch))
            .clone()?;
        // SAFETY: a cubin for this device's architecture, loaded into the current context.
        unsafe { cu::module::load_data(image.as_ptr().cast()) }.map_err(|e| format!("{e:?}"))
    }
}

/// Kernel `name` of a loaded module.
pub(crate) fn function(module: drv::CUmodule, name: &str) -> Result<drv::CUfunction, String> {
    let c = std::ffi::CString::new(name).map_err(|_| format!("kernel name {name:?}"))?;
    // SAFETY: the module is loaded in the current (primary) context.
    unsafe { cu::module::get_function(module, c) }.map_err(|e| format!("{name}: {e:?}"))
}

/// Launches `f` on `grid` blocks of `block` threads with `smem` bytes of dynamic shared memory
/// on `stream`.
///
/// `args` must hold exactly the kernel's parameters, in order and in their C types, and every
/// buffer they name must be live and large enough until the stream has run the kernel: the
/// callers build both for their own kernels.
pub(crate) fn launch(
    f: drv::CUfunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: drv::CUstream,
    args: &mut kevin::gpu::device::ArgPack,
) -> Result<(), String> {
    let mut params = args.params();
    // SAFETY: see above; the parameter array lives until the call returns.
    unsafe { cu::launch_kernel(f, grid, (block, 1, 1), smem, stream, &mut params) }
        .map_err(|e| format!("launch: {e:?}"))
}

/// A source's kernels loaded on one GPU for the calling thread, with a stream of its own (in the
/// primary context, where burn's device addresses are valid).
pub(crate) struct Engine {
    ctx: drv::CUcontext,
    /// The engine's own stream.
    own: drv::CUstream,
    /// Where launches go now: [`Engine::own`], or cubecl's stream while [`in_order`] runs on it.
    stream: Cell<drv::CUstream>,
    module: drv::CUmodule,
    /// Each kernel looked up so far, and the dynamic shared memory it was allowed.
    fns: RefCell<BTreeMap<String, (drv::CUfunction, u32)>>,
}

impl Engine {
    fn new(source: &Source, device: usize) -> Result<Engine, String> {
        let (ctx, stream) = crate::cublas::primary_stream(device)?;
        let module = source.load(device).inspect_err(|_| {
            // SAFETY: created above, unused.
            unsafe {
                let _ = cu::stream::destroy(stream);
            }
        })?;
        Ok(Engine {
            ctx,
            own: stream,
            stream: Cell::new(stream),
            module,
            fns: RefCell::new(BTreeMap::new()),
        })
    }

    /// Launches kernel `name` on `grid` blocks of `block` threads with `smem` bytes of dynamic
    /// shared memory on the engine's stream (the kernel's limit raised to `smem` first where it
    /// needs more than 48 KB). `args` as [`launch`] says.
    pub(crate) fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &mut ArgPack,
    ) -> Result<(), String> {
        let f = {
            let mut fns = self.fns.borrow_mut();
            let (f, allowed) = match fns.get(name) {
                Some(&entry) => entry,
                None => (function(self.module, name)?, 48 * 1024),
            };
            if smem > allowed {
                // SAFETY: an attribute of a kernel of the loaded module.
                unsafe {
                    cu::function::set_function_attribute(
                        f,
                        drv::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                }
                .map_err(|e| format!("{name}, shared memory {smem} B: {e:?}"))?;
            }
            fns.insert(name.to_string(), (f, smem.max(allowed)));
            f
        };
        launch(f, grid, block, smem, self.stream.get(), args).map_err(|e| format!("{name}: {e}"))
    }

    /// Copies `values` to device address `ptr`, in order on the engine's stream. `values` may
    /// be dropped when this returns: a copy from pageable host memory is staged before the call
    /// returns (CUDA's API synchronisation behaviour), so only small tables go this way.
    pub(crate) fn upload(&self, ptr: u64, values: &[i64]) -> Result<(), String> {
        // SAFETY: the callers pass a live device buffer of theirs of at least `values`' size (as
        // for `zero`).
        unsafe { cu::memcpy_htod_async(ptr, values, self.stream.get()) }
            .map_err(|e| format!("cuMemcpyHtoDAsync: {e:?}"))
    }

    /// Sets `bytes` bytes from device address `ptr` to zero, in order on the engine's stream.
    pub(crate) fn zero(&self, ptr: u64, bytes: usize) -> Result<(), String> {
        // SAFETY: the callers pass the address and size of a live buffer of theirs: a cubecl
        // tensor, whose memory cubecl reuses only after the stream has run this (on cubecl's own
        // stream), or kept until `in_order` synchronises the engine's own stream.
        unsafe { cu::memset_d8_async(ptr, 0, bytes, self.stream.get()) }
            .map_err(|e| format!("cuMemsetD8Async: {e:?}"))
    }
}

/// Each (source, GPU)'s engine on this thread, or why it could not be made.
type Engines = BTreeMap<(&'static str, usize), Result<Engine, String>>;

thread_local! {
    static ENGINES: RefCell<Engines> = const { RefCell::new(BTreeMap::new()) };
}

/// Runs `f` with the calling thread's engine of `source` on GPU `device` (made on first use; a
/// failure to make it is remembered), with the device's primary context current.
pub(crate) fn with_engine<R>(
    source: &Source,
    device: usize,
    f: impl FnOnce(&Engine) -> Result<R, String>,
) -> Result<R, String> {
    ENGINES.with(|engines| {
        let mut engines = engines.borrow_mut();
        let engine = engines
            .entry((source.name, device))
            .or_insert_with(|| Engine::new(source, device))
            .as_ref()
            .map_err(Clone::clone)?;
        // SAFETY: the primary context, retained for the process's lifetime.
        unsafe { cu::ctx::set_current(engine.ctx) }
            .map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
        f(engine)
    })
}

/// The device addresses of `tensors` (all of one client), with their resources: held, they keep
/// the memory from being reused, so the caller holds them until its work is queued. One task of cubecl's device thread resolves them all: each
/// `get_resource` alone is a round trip to that thread (tens of microseconds), which for the
/// optimizer's table of every parameter's operands (about 2,000 at Qwen2-0.5B) was most of its
/// host time. The task runs after every launch submitted before it, as `get_resource` does, so
/// the ordering `crate::stream` relies on holds.
pub(crate) fn addresses(
    tensors: &[&CubeTensor<CudaRuntime>],
) -> Result<(Vec<u64>, Box<dyn Any + Send>), String> {
    let Some(first) = tensors.first() else {
        return Ok((Vec::new(), Box::new(())));
    };
    let client = &first.client;
    let handles: Vec<_> = tensors.iter().map(|t| t.handle.clone()).collect();
    let resolved = client
        .exclusive(move || {
            handles
                .into_iter()
                .map(|h| client.get_resource(h))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| format!("device address: {e:?}"))?
        .map_err(|e| format!("device address: {e:?}"))?;
    let ptrs = resolved.iter().map(|r| r.resource().ptr).collect();
    Ok((ptrs, Box::new(resolved)))
}

/// Runs `launch` with the tensors' device addresses on `source`'s engine, in order with cubecl's
/// kernels: queued on cubecl's stream when [`crate::stream::cubecl_stream`] finds it (no host
/// wait), else between two fences: the cubecl client is synchronised first (every kernel writing
/// them has finished), the engine's own stream after (the outputs are written before cubecl's
/// next kernel).
pub(crate) fn in_order(
    source: &Source,
    tensors: &[&CubeTensor<CudaRuntime>],
    launch: impl FnOnce(&Engine, &[u64]) -> Result<(), String>,
) -> Result<(), String> {
    let first = tensors[0];
    let client = &first.client;
    let (ptrs, keep) = addresses(tensors)?;
    if let Some(cubecl) = crate::stream::cubecl_stream(first) {
        with_engine(source, first.device.index, |engine| {
            engine.stream.set(cubecl);
            let r = launch(engine, &ptrs);
            engine.stream.set(engine.own);
            r
        })?;
        drop(keep);
        return Ok(());
    }
    burn::cubecl::future::block_on(client.sync()).map_err(|e| format!("sync: {e:?}"))?;
    with_engine(source, first.device.index, |engine| {
        launch(engine, &ptrs)?;
        // SAFETY: the engine's stream, created by this thread.
        unsafe { cu::stream::synchronize(engine.own) }.map_err(|e| format!("sync: {e:?}"))
    })?;
    drop(keep);
    Ok(())
}

/// Whether `source`'s kernels can run on `device` (a burn CUDA device whose engine could be
/// made); the first refusal per source is logged once, naming `what` falls back to burn's ops.
pub(crate) fn usable(source: &Source, device: &dyn Any, what: &str) -> bool {
    let Some(device) = device.downcast_ref::<CudaDevice>() else {
        return false;
    };
    match with_engine(source, device.index, |_| Ok(())) {
        Ok(()) => true,
        Err(why) => {
            static WARNED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
            if WARNED.lock().is_ok_and(|mut w| w.insert(source.name)) {
                tracing::warn!("{what} unavailable, burn's ops are used: {why}");
            }
            false
        }
    }
}

/// The GPU memory cubecl's pool for `device` (burn's CUDA device) holds on this thread's stream,
/// in bytes, after returning its unused pages to the driver when `cleanup`; `None` for another
/// device. The pool keeps what it allocated and frees pages only at such a cleanup, so read
/// after a step it is what the step needed at its peak (with the pool's rounding), the
/// counterpart of PyTorch's peak reserved memory.
pub fn pool_reserved(device: &dyn Any, cleanup: bool) -> Option<u64> {
    use burn::cubecl::Runtime;
    let device = device.downcast_ref::<CudaDevice>()?;
    let client = CudaRuntime::client(device);
    if cleanup {
        client.memory_cleanup();
    }
    client.memory_usage().ok().map(|u| u.bytes_reserved)
}

/// An operation of kevin's kernels under burn's autodiff: `out`, computed from `parents`, with
/// `state` kept when any parent is tracked, and a backward that gives every parent's gradient
/// at once from it and the output's gradient (each registered where its parent is tracked).
pub(crate) fn with_backward<B, C, S, const N: usize>(
    parents: [&FloatTensor<Autodiff<B, C>>; N],
    out: FloatTensor<B>,
    state: S,
    backward: fn(S, FloatTensor<B>) -> [FloatTensor<B>; N],
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    S: Clone + Send + std::fmt::Debug + 'static,
{
    #[derive(Debug)]
    struct Each<B: Backend, S, const N: usize>(fn(S, FloatTensor<B>) -> [FloatTensor<B>; N]);
    impl<B: Backend, S: Clone + Send + std::fmt::Debug + 'static, const N: usize> Backward<B, N>
        for Each<B, S, N>
    {
        type State = S;

        fn backward(self, ops: Ops<S, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
            let dy = grads.consume::<B>(&ops.node);
            let g = (self.0)(ops.state, dy);
            for (parent, grad) in ops.parents.into_iter().zip(g) {
                if let Some(node) = parent {
                    grads.register::<B>(node.id, grad);
                }
            }
        }
    }
    let nodes = parents.map(|t| t.node.clone());
    match Each(backward)
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

type Ct = CubeTensor<CudaRuntime>;

/// `t` packed row-major (a copy when it is not).
pub(crate) fn packed(t: Ct) -> Ct {
    let s = t.meta.shape().to_vec();
    let packed: Vec<usize> = (0..s.len()).map(|i| s[i + 1..].iter().product()).collect();
    if t.meta.strides()[..] == packed[..] {
        t
    } else {
        burn_cubecl::kernel::into_contiguous(t)
    }
}

/// The kernel suffix of a tensor's dtype (the sources instantiate f32 and bf16).
pub(crate) fn suffix(t: &Ct) -> Result<&'static str, String> {
    match t.dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => Err(format!("dtype {other:?} (f32 or bf16)")),
    }
}

/// A kernel's arguments: the tensors' addresses, then the scalars (each as its bytes).
pub(crate) fn args(ptrs: &[u64], scalars: &[&[u8]]) -> ArgPack {
    let mut a = ArgPack::default();
    ptrs.iter().for_each(|&p| a.ptr(p));
    scalars.iter().for_each(|s| a.push(s));
    a
}

/// A launch grid of `x` by `y` blocks, or why not (a count past the driver's 32 bits).
pub(crate) fn blocks(x: usize, y: usize) -> Result<(u32, u32, u32), String> {
    let dim = |v: usize| u32::try_from(v).map_err(|_| format!("{v} blocks"));
    Ok((dim(x)?, dim(y)?, 1))
}

/// A packed tensor of `shape` and `dtype` on `like`'s device, uninitialised.
pub(crate) fn empty(like: &Ct, shape: Vec<usize>, dtype: DType) -> Ct {
    burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        dtype,
    )
}

/// Registers a fusion custom operation named `name` (never fused: it closes the fusion block
/// before it) over `inputs`, with outputs of these shapes and dtypes; `op` makes the operation
/// from its descriptor (which lists the inputs in order, then the outputs).
pub(crate) fn custom_op<R: FusionRuntime, O: Operation<R> + 'static, const N: usize>(
    name: &'static str,
    inputs: Vec<FusionTensor<R>>,
    outputs: [(Shape, DType); N],
    op: impl FnOnce(CustomOpIr) -> O,
) -> [FusionTensor<R>; N] {
    custom_op_vec(name, inputs, outputs.into(), op)
        .try_into()
        .unwrap_or_else(|_| panic!("{name}: {N} outputs"))
}

/// [`custom_op`] with any number of outputs.
pub(crate) fn custom_op_vec<R: FusionRuntime, O: Operation<R> + 'static>(
    name: &'static str,
    inputs: Vec<FusionTensor<R>>,
    outputs: Vec<(Shape, DType)>,
    op: impl FnOnce(CustomOpIr) -> O,
) -> Vec<FusionTensor<R>> {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outs: Vec<TensorIr> = outputs
        .into_iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect();
    let ins: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &ins, &outs);
    client.register(streams, OperationIr::Custom(desc.clone()), op(desc))
}

/// A test's compile of `source` for sm_90 (no GPU needed, only NVRTC): every kernel symbol is a
/// name expression of the compile, so a missing one fails it. Skips with a message without
/// NVRTC unless `KEVIN_REQUIRE_NVRTC=1`.
#[cfg(test)]
pub(crate) fn assert_compiles(source: &Source) {
    if let Err(e) = kevin::compile::locate_nvrtc() {
        assert_ne!(
            std::env::var("KEVIN_REQUIRE_NVRTC").as_deref(),
            Ok("1"),
            "NVRTC is required: {e}"
        );
        eprintln!("skipping: {e}");
        return;
    }
    if let Err(e) = source.compile("sm_90") {
        panic!("{e}");
    }
}

/// Runs kernel `name` of `source` once on kevin's CPU device model ([`kevin::cpu`]: the CUDA
/// source compiled with the host C++ compiler, a block's threads as fibers) with `smem_bytes` of
/// dynamic shared memory over host `buffers` (`ResolvedArg::Tensor(i)` is the address of
/// `buffers[i]`), so tests check a kernel's arithmetic and indexing without a GPU. Returns false
/// (and says so) without a host C++ compiler.
#[cfg(test)]
pub(crate) fn run_on_cpu_model(
    source: &Source,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    smem_bytes: u32,
    args: Vec<kevin::candidate::ResolvedArg>,
    buffers: &mut [Vec<u8>],
) -> bool {
    use kevin::candidate::{ResolvedLaunch, ResolvedPlan};
    if let Err(e) = kevin::cpu::find_compiler() {
        eprintln!("skipping the CPU device model: {e}");
        return false;
    }
    let launch = ResolvedLaunch {
        line: 1,
        kernel: name.to_string(),
        grid,
        block,
        smem_bytes,
        args,
    };
    let plan = ResolvedPlan {
        scratch: Vec::new(),
        launches: vec![launch],
    };
    let dir = std::env::temp_dir().join(format!(
        "kevin-policy-cpu-model-{}-{name}",
        std::process::id()
    ));
    let so = kevin::cpu::compile(&source.full_text(), &plan, &dir)
        .unwrap_or_else(|e| panic!("{} on the CPU model: {e}", source.name));
    let module = kevin::cpu::Module::load(&so).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    let ptrs: Vec<*mut std::ffi::c_void> =
        buffers.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
    // SAFETY: kevin's own kernel; the caller sizes every buffer for the arguments it passes.
    unsafe { module.launch(&plan.launches[0], &ptrs, &[], 2) }
        .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    std::fs::remove_dir_all(&dir).ok();
    true
}
