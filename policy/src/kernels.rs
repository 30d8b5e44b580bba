//! kevin's own CUDA sources for the policy (issue 18): compiled with NVRTC once per process and
//! architecture, loaded into the device's primary context (the one cubecl uses, so burn's
//! device addresses are valid in them).
//!
//! Each source is `cuda/prelude.cuh` (element loads and stores in f32 or bf16, a warp's sum)
//! followed by its own file: [`crate::qwen2::fused`]'s generation pass and [`crate::flash`]'s
//! attention for the learner.

use std::collections::BTreeMap;
use std::sync::Mutex;

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
