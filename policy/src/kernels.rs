//! kevin's own CUDA sources for the policy (issue 18), in the device's primary context (the one
//! cubecl uses, so burn's device addresses are valid in them).
//!
//! Each source is `cuda/prelude.cuh` (element loads and stores in f32 or bf16, a warp's sum)
//! followed by its own file. They run two ways:
//! - [`cube_launch`]: the learner's kernels ([`crate::flash`]'s attention, [`crate::logprob`]'s
//!   log-probabilities) are handed to cubecl as kernels of its own ([`CubeKernel`]: cubecl
//!   compiles the text with NVRTC, caches it and launches it), so they run in order on the
//!   calling thread's cubecl stream with burn's kernels, with no fence;
//! - an [`Engine`] (per thread, source and GPU, a stream of its own): [`crate::qwen2::fused`]'s
//!   generation pass, and the products of [`crate::cublas`], which cubecl cannot launch. Those
//!   are ordered against cubecl's stream on the device by [`gated`] (`cuda/gate.cu`), not by
//!   host fences.
//!
//! Kernels launched either way take their pointers first, in order, and then one struct of
//! 8-byte words by value ([`Engine::launch_words`]); that is cubecl's calling convention on
//! GPUs with grid constants (compute capability 7.0 and up).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Mutex;

use burn::backend::ir::{CustomOpIr, OperationIr, OperationOutput, TensorIr};
use burn::cubecl::cuda::{CudaCompiler, CudaComputeKernel, CudaRuntime};
use burn::cubecl::frontend::CubePrimitive;
use burn::cubecl::prelude::{
    CompiledKernel, CubeCount, CubeDim, ExecutionMode, KernelId, KernelMetadata, StorageType,
};
use burn::cubecl::server::{KernelArguments, MetadataBindingInfo};
use burn::cubecl::{CompilationError, Compiler, CubeTask};
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionRuntime, FusionTensor};

use cudarc::driver::result as cu;
use cudarc::driver::sys as drv;

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
pub fn function(module: drv::CUmodule, name: &str) -> Result<drv::CUfunction, String> {
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
pub fn launch(
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
    stream: drv::CUstream,
    module: drv::CUmodule,
    /// Each kernel looked up so far.
    fns: RefCell<BTreeMap<String, drv::CUfunction>>,
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
            stream,
            module,
            fns: RefCell::new(BTreeMap::new()),
        })
    }

    /// Launches kernel `name`, whose parameters are `ptrs` (device addresses, in order) and then
    /// one struct of the 8-byte `words` by value, on the engine's stream.
    pub(crate) fn launch_words(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        ptrs: &[u64],
        words: &[u64],
    ) -> Result<(), String> {
        let mut ptrs = ptrs.to_vec();
        let mut words = words.to_vec();
        let mut params: Vec<*mut std::ffi::c_void> =
            ptrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
        params.push(words.as_mut_ptr().cast());
        let f = self.function(name)?;
        // SAFETY: the parameter array points into `ptrs` and `words`, which live until the call
        // returns (the driver copies them); the kernel's parameters are the pointers and then
        // a struct of `words.len()` 8-byte words, as its source declares.
        unsafe { cu::launch_kernel(f, grid, (block, 1, 1), 0, self.stream, &mut params) }
            .map_err(|e| format!("{name}: launch: {e:?}"))
    }

    fn function(&self, name: &str) -> Result<drv::CUfunction, String> {
        let mut fns = self.fns.borrow_mut();
        if let Some(&f) = fns.get(name) {
            return Ok(f);
        }
        let f = function(self.module, name)?;
        fns.insert(name.to_string(), f);
        Ok(f)
    }

    /// The engine's stream (products of libraries go on it too).
    pub(crate) fn stream(&self) -> drv::CUstream {
        self.stream
    }
}

thread_local! {
    static ENGINES: RefCell<BTreeMap<(&'static str, usize), Result<Engine, String>>> =
        const { RefCell::new(BTreeMap::new()) };
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

/// `t` packed row-major (a copy when it is not).
pub(crate) fn packed(t: CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    let s = t.meta.shape().to_vec();
    let rows: Vec<usize> = (0..s.len()).map(|i| s[i + 1..].iter().product()).collect();
    if t.meta.strides()[..] == rows[..] {
        t
    } else {
        burn_cubecl::kernel::into_contiguous(t)
    }
}

/// One kernel of a [`Source`] as a kernel of cubecl's: the source's text with only `instance`
/// (one of its instantiation macros, e.g. `KEVIN_FLASH_TC(64)`) expanded, compiled by cubecl
/// with NVRTC, cached under an id that names the text's hash, and launched by cubecl with
/// `block` threads and `smem` bytes of dynamic shared memory.
pub(crate) struct CubeKernel {
    source: &'static Source,
    entry: String,
    instance: String,
    block: u32,
    smem: u32,
}

/// What names a [`CubeKernel`] in cubecl's caches (its in-process one and the PTX cache on
/// disk): the entry, the instance, the launch shape and the text's hash, so an edited source is
/// never served from a stale entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CubeKernelKey {
    source: &'static str,
    entry: String,
    instance: String,
    smem: u32,
    text: u64,
}

impl CubeKernel {
    fn text(&self) -> String {
        format!(
            "#define KEVIN_SELECTED\n{}\n{}\n",
            self.source.full_text(),
            self.instance
        )
    }

    fn cube_dim(&self) -> CubeDim {
        CubeDim {
            x: self.block,
            y: 1,
            z: 1,
        }
    }
}

impl KernelMetadata for CubeKernel {
    fn id(&self) -> KernelId {
        KernelId::new::<Self>()
            .info(CubeKernelKey {
                source: self.source.name,
                entry: self.entry.clone(),
                instance: self.instance.clone(),
                smem: self.smem,
                text: kevin::rng::fnv1a(self.text().as_bytes()),
            })
            .cube_dim(self.cube_dim())
    }

    fn address_type(&self) -> StorageType {
        u32::as_type_native_unchecked().storage_type()
    }
}

impl CubeTask<CudaCompiler> for CubeKernel {
    fn compile(
        &self,
        _compiler: &mut CudaCompiler,
        _options: &<CudaCompiler as Compiler>::CompilationOptions,
        _mode: ExecutionMode,
        _address_type: StorageType,
    ) -> Result<CompiledKernel<CudaCompiler>, CompilationError> {
        Ok(CompiledKernel {
            entrypoint_name: self.entry.clone(),
            debug_name: Some(self.source.name),
            source: self.text(),
            cube_dim: self.cube_dim(),
            debug_info: None,
            repr: Some(launch_repr(
                self.cube_dim(),
                self.smem as usize,
                &self.entry,
            )),
        })
    }
}

/// The part of cubecl's kernel representation its CUDA server reads for a kernel of ours: the
/// block, and the dynamic shared memory as one byte array (cubecl launches with its size).
fn launch_repr(cube_dim: CubeDim, smem: usize, name: &str) -> CudaComputeKernel {
    use cubecl_cpp::shared::{Body, Elem, Flags, Item, SharedMemory};
    let address_type = Item::scalar(Elem::U32, true);
    let shared_memories = if smem == 0 {
        Vec::new()
    } else {
        vec![SharedMemory::Array {
            index: 0,
            item: Item::scalar(Elem::U8, true),
            length: smem,
            align: 16,
            offset: 0,
        }]
    };
    CudaComputeKernel {
        tensor_maps: Vec::new(),
        buffers: Vec::new(),
        scalars: Vec::new(),
        info: Default::default(),
        meta_static_len: 0,
        body: Body {
            instructions: Vec::new(),
            shared_memories,
            pipelines: Vec::new(),
            barriers: Vec::new(),
            const_arrays: Vec::new(),
            local_arrays: Vec::new(),
            info_by_ptr: false,
            has_dynamic_meta: false,
            address_type,
        },
        cube_dim,
        cluster_dim: None,
        extensions: Vec::new(),
        flags: Flags {
            cube_dim,
            ..Default::default()
        },
        items: Default::default(),
        kernel_name: name.to_string(),
    }
}

/// A launch of `entry` (defined by `instance` of `source`, see [`CubeKernel`]) by cubecl, in order
/// on the calling thread's cubecl stream: `grid` blocks of `block` threads with `smem` bytes of
/// dynamic shared memory, the kernel's parameters being `tensors`' device addresses in order and
/// then the struct of `words`. No fence: cubecl's own kernels before it have written its inputs,
/// and those after it read its outputs. The tensors must be large enough for what the kernel
/// reads and writes (the callers check their shapes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cube_launch(
    source: &'static Source,
    entry: &str,
    instance: &str,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    tensors: &[&CubeTensor<CudaRuntime>],
    words: &[u64],
) -> Result<(), String> {
    let first = tensors.first().ok_or("a kernel without tensors")?;
    if grid.1 > 65_535 || grid.2 > 65_535 {
        return Err(format!("{entry}: grid {grid:?} is over 65,535 in y or z"));
    }
    let kernel = CubeKernel {
        source,
        entry: entry.to_string(),
        instance: instance.to_string(),
        block,
        smem,
    };
    let args = KernelArguments {
        buffers: tensors.iter().map(|t| t.handle.clone().binding()).collect(),
        info: MetadataBindingInfo::custom(words.to_vec()),
        tensor_maps: Vec::new(),
    };
    first.client.launch(
        Box::new(kernel),
        CubeCount::Static(grid.0, grid.1, grid.2),
        args,
    );
    Ok(())
}

/// The source of [`gated`]'s kernels.
pub const GATE: Source = Source {
    name: "gate",
    text: include_str!("cuda/gate.cu"),
    kernels: || {
        ["hold", "wait", "release"]
            .map(|k| format!("kevin_gate_{k}"))
            .to_vec()
    },
};

/// How many polls a gate's wait may take on the GPU before it gives up and reports (a host that
/// failed to enqueue its half): a poll is a sleep of about 64 ns and a read of device memory, so
/// one to a few minutes (a learner step's queue is seconds deep at most).
const GATE_POLLS: u64 = 1 << 27;

/// A thread's gate on one GPU: its two words in device memory, its error word in mapped host
/// memory, and the next ticket.
struct GateState {
    flags: u64,
    error_host: *mut u32,
    error_dev: u64,
    ticket: u32,
}

impl GateState {
    fn new() -> Result<GateState, String> {
        let e = |what: &str, err: cudarc::driver::DriverError| format!("{what}: {err:?}");
        // SAFETY: allocations in the current (primary) context, never freed (one per thread and
        // GPU, as the engines); zeroed before use.
        unsafe {
            let flags = cu::malloc_sync(8).map_err(|x| e("cuMemAlloc", x))?;
            cu::memset_d8_sync(flags, 0, 8).map_err(|x| e("cuMemsetD8", x))?;
            let host = cu::malloc_host(4, drv::CU_MEMHOSTALLOC_DEVICEMAP)
                .map_err(|x| e("cuMemHostAlloc", x))?;
            let error_host = host.cast::<u32>();
            error_host.write_volatile(0);
            let mut error_dev = 0u64;
            drv::cuMemHostGetDevicePointer_v2(&mut error_dev, host, 0)
                .result()
                .map_err(|x| e("cuMemHostGetDevicePointer", x))?;
            Ok(GateState {
                flags,
                error_host,
                error_dev,
                ticket: 0,
            })
        }
    }
}

thread_local! {
    static GATES: RefCell<BTreeMap<usize, Result<GateState, String>>> =
        const { RefCell::new(BTreeMap::new()) };
}

/// Runs `work` (which enqueues products on the engine's stream it is given, reading and
/// writing `tensors`' device addresses) between this point of the calling thread's cubecl
/// stream and its next kernel, ordered on the device (`cuda/gate.cu`): cubecl's stream holds
/// while the engine's stream waits for it, runs `work`, and releases it. The host does not
/// wait for the GPU. A gate whose wait timed out on the GPU (which only a failure to enqueue
/// can cause) is reported by the next call.
pub(crate) fn gated(
    tensors: [&CubeTensor<CudaRuntime>; 3],
    work: impl FnOnce(&Engine, [u64; 3]) -> Result<(), String>,
) -> Result<(), String> {
    let device = tensors[0].device.index;
    let client = &tensors[0].client;
    with_engine(&GATE, device, |engine| {
        GATES.with(|gates| {
            let mut gates = gates.borrow_mut();
            let gate = gates
                .entry(device)
                .or_insert_with(GateState::new)
                .as_mut()
                .map_err(|e| e.clone())?;
            // SAFETY: mapped host memory of this gate, written by the device only on a timeout.
            let failed = unsafe { gate.error_host.read_volatile() };
            if failed != 0 {
                return Err(format!(
                    "a GPU gate (ticket {failed}) gave up waiting after {GATE_POLLS} polls: its \
                     other half was never enqueued"
                ));
            }
            gate.ticket = gate.ticket.wrapping_add(1);
            let words = [gate.flags, gate.error_dev, gate.ticket as u64, GATE_POLLS];
            cube_launch(
                &GATE,
                "kevin_gate_hold",
                "",
                (1, 1, 1),
                1,
                0,
                &tensors,
                &words,
            )?;
            // The addresses, after the hold: cubecl's device thread serves requests in order, so
            // when they are back the hold has been launched. It must reach the GPU before the
            // wait below: should the two streams share a hardware queue, a wait ahead of the
            // hold would block the hold behind it.
            let mut keep = Vec::with_capacity(3);
            let mut ptrs = [0u64; 3];
            for (i, t) in tensors.iter().enumerate() {
                let r = client
                    .get_resource(t.handle.clone())
                    .map_err(|e| format!("device address: {e:?}"));
                match r {
                    Ok(r) => {
                        ptrs[i] = r.resource().ptr;
                        keep.push(r);
                    }
                    Err(e) => {
                        // Release the hold (nothing ran in between), then report.
                        engine.launch_words("kevin_gate_release", (1, 1, 1), 1, &[], &words)?;
                        return Err(e);
                    }
                }
            }
            engine.launch_words("kevin_gate_wait", (1, 1, 1), 1, &[], &words)?;
            let done = work(engine, ptrs);
            // Released whatever `work` enqueued, so cubecl's stream never waits for nothing.
            let released = engine.launch_words("kevin_gate_release", (1, 1, 1), 1, &[], &words);
            drop(keep);
            done.and(released)
        })
    })
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
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outs =
        outputs.map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype));
    let ins: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &ins, &outs);
    client
        .register(streams, OperationIr::Custom(desc.clone()), op(desc))
        .outputs()
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

/// A test's compile of what [`cube_launch`] hands cubecl for `entry` of `source` (only
/// `instance` expanded) as cubecl compiles it (cubecl-cuda's options: the architecture with its
/// `a` features, the CUDA headers, line info; functions are host functions unless marked), for
/// sm_90; the PTX must define `entry`. Skips as [`assert_compiles`] does.
#[cfg(test)]
pub(crate) fn assert_compiles_alone(source: &'static Source, entry: &str, instance: &str) {
    use cudarc::nvrtc::result as nv;
    if kevin::compile::locate_nvrtc().is_err() {
        return assert_compiles(source);
    }
    let kernel = CubeKernel {
        source,
        entry: entry.to_string(),
        instance: instance.to_string(),
        block: 1,
        smem: 0,
    };
    let text = std::ffi::CString::new(kernel.text()).expect("no NUL in the sources");
    let mut opts = vec![
        "--gpu-architecture=sm_90a".to_string(),
        "-lineinfo".to_string(),
    ];
    opts.extend(
        kevin::compile::find_cuda_include_dirs()
            .iter()
            .map(|d| format!("--include-path={}", d.display())),
    );
    let prog = nv::create_program(&text, None).expect("nvrtcCreateProgram");
    let text_of = |v: Vec<std::ffi::c_char>| {
        let bytes: Vec<u8> = v
            .into_iter()
            .map(|c| c as u8)
            .take_while(|&c| c != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    // SAFETY: a live program; the options outlive the call.
    if unsafe { nv::compile_program(prog, &opts) }.is_err() {
        // SAFETY: as above.
        let log = unsafe { nv::get_program_log(prog) }
            .map(text_of)
            .unwrap_or_default();
        panic!("{entry} from {instance:?}: {log}");
    }
    // SAFETY: as above, compiled.
    let ptx = unsafe { nv::get_ptx(prog) }
        .map(text_of)
        .expect("nvrtcGetPTX");
    // SAFETY: destroyed once, after its last use.
    unsafe { nv::destroy_program(prog) }.expect("nvrtcDestroyProgram");
    assert!(
        ptx.contains(&format!(".entry {entry}(")),
        "{instance:?} does not define {entry}"
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn gate_kernels_compile_for_sm_90() {
        super::assert_compiles(&super::GATE);
        super::assert_compiles_alone(&super::GATE, "kevin_gate_hold", "");
    }
}
