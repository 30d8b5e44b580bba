//! The CUDA stream on which cubecl runs a stream id's work (issue 18), so that kevin's own
//! kernels and cuBLAS products can be queued on it, in order with burn's kernels, instead of
//! between two host fences.
//!
//! cubecl 0.10 keeps its streams private: work submitted under a [`StreamId`] (by default one per
//! thread) runs on one of its non-blocking streams, and nothing public names it. This module finds
//! it once per device and stream id by watching one launch: it subscribes to CUPTI's callback on
//! `cuLaunchKernel` (CUPTI is NVIDIA's documented tool interface, `libcupti.so`, part of every
//! CUDA installation and of torch's wheels), has cubecl launch a kernel that reads a buffer just
//! allocated for the purpose (so no other launch can carry its address), takes the `hStream` of
//! the launch whose parameters carry that address, and unsubscribes. The search runs under a
//! process-wide lock, and its answer is kept.
//!
//! Where it cannot be found (no CUPTI library, a driver before CUDA 12.4, another CUPTI client
//! such as a profiler, or `KEVIN_STREAM_ORDER=fence`) the callers keep the fenced path: the
//! client synchronised, their own stream, that stream synchronised. [`order`] says which is in
//! use; a test on the GPU checks both against each other.
//!
//! Why queuing on cubecl's stream is safe: `ComputeClient::get_resource`, which the callers use
//! for every operand's address (all of a call's in one task of cubecl's device thread,
//! `kernels::addresses`), is processed by that thread after every launch submitted before it
//! and aligns the stream with any other stream that used the buffers; the
//! callers then queue their work on the same stream before they submit anything else, and
//! cubecl frees or reuses their operands' memory only on that stream, after their work.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use burn::cubecl::cuda::CudaRuntime;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cudarc::driver::sys as drv;

/// How kevin's own GPU work is ordered against cubecl's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Queued on cubecl's stream when it can be found (the default), fenced otherwise.
    Stream,
    /// Always between two host fences (the reference).
    Fence,
}

impl Order {
    /// Its name in flags and logs.
    pub fn name(self) -> &'static str {
        match self {
            Order::Stream => "stream",
            Order::Fence => "fence",
        }
    }
}

/// Parses `stream` or `fence`, naming the bad value otherwise.
pub fn parse_order(s: &str) -> Result<Order, String> {
    match s {
        "stream" => Ok(Order::Stream),
        "fence" => Ok(Order::Fence),
        other => Err(format!(
            "ordering {other:?}: expected \"stream\" (on cubecl's stream) or \"fence\""
        )),
    }
}

/// 0: not decided yet (the environment decides on first use), 1: stream, 2: fence.
static ORDER: AtomicU8 = AtomicU8::new(0);

/// Sets the process-wide [`Order`].
pub fn set_order(order: Order) {
    ORDER.store(
        if order == Order::Stream { 1 } else { 2 },
        Ordering::Relaxed,
    );
}

/// The process-wide [`Order`]: what [`set_order`] set, else `KEVIN_STREAM_ORDER` (`fence` or
/// `stream`, read once), else [`Order::Stream`].
pub fn order() -> Order {
    match ORDER.load(Ordering::Relaxed) {
        1 => Order::Stream,
        2 => Order::Fence,
        _ => {
            let order = match std::env::var("KEVIN_STREAM_ORDER").as_deref() {
                Ok("fence") => Order::Fence,
                _ => Order::Stream,
            };
            // Only where nothing was set meanwhile: an explicit set_order wins.
            let code = if order == Order::Stream { 1 } else { 2 };
            let _ = ORDER.compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed);
            order
        }
    }
}

/// cubecl's stream for the work that `t`'s client submits from here (the current stream id, on
/// `t`'s device), or `None` when the work must be fenced (see the module's text). Found once per
/// device and stream id.
pub(crate) fn cubecl_stream(t: &CubeTensor<CudaRuntime>) -> Option<drv::CUstream> {
    if order() == Order::Fence {
        return None;
    }
    let key = (
        t.device.index,
        burn::cubecl::stream_id::StreamId::current().value,
    );
    if let Some(found) = known().lock().ok()?.get(&key) {
        return found.map(|s| s as drv::CUstream);
    }
    // One search at a time: CUPTI takes one subscriber, and the launch to watch must be ours.
    static SEARCH: Mutex<()> = Mutex::new(());
    let _one = SEARCH.lock().ok()?;
    if let Some(found) = known().lock().ok()?.get(&key) {
        // Found by another thread of the same stream id while this one waited.
        return found.map(|s| s as drv::CUstream);
    }
    let found = match find(t) {
        Ok(s) => {
            tracing::debug!(
                device = key.0,
                stream_id = key.1,
                "kevin's GPU work goes on cubecl's stream"
            );
            Some(s as usize)
        }
        Err(why) => {
            tracing::info!(device = key.0, stream_id = key.1, %why, "cubecl's stream was not found: kevin's GPU work stays fenced");
            None
        }
    };
    known().lock().ok()?.insert(key, found);
    found.map(|s| s as drv::CUstream)
}

/// How many (device, stream id) pairs have had cubecl's stream found so far.
pub fn streams_found() -> usize {
    known()
        .lock()
        .map(|k| k.values().filter(|s| s.is_some()).count())
        .unwrap_or(0)
}

type Known = BTreeMap<(usize, u64), Option<usize>>;

/// What the searches found, by (device, stream id): the stream, or `None` where it was not
/// found (the work stays fenced).
fn known() -> &'static Mutex<Known> {
    static KNOWN: Mutex<Known> = Mutex::new(BTreeMap::new());
    &KNOWN
}

/// The address the watched launch must carry (0: none), and the stream of the launches that
/// carried it (0: none yet; u64::MAX: more than one stream did).
static TARGET: AtomicU64 = AtomicU64::new(0);
static FOUND: AtomicU64 = AtomicU64::new(0);

/// CUPTI's callback domain of the driver API, the site before the call, and the ids of
/// `cuLaunchKernel` and its per-thread-stream twin (`cupti_driver_cbid.h`).
const DOMAIN_DRIVER_API: u32 = 1;
const SITE_ENTER: u32 = 0;
const CBID_LAUNCH_KERNEL: u32 = 307;
const CBID_LAUNCH_KERNEL_PTSZ: u32 = 442;

/// `CUpti_CallbackData` (cupti_callbacks.h).
#[repr(C)]
struct CallbackData {
    callback_site: u32,
    function_name: *const c_char,
    function_params: *const c_void,
    function_return_value: *mut c_void,
    symbol_name: *const c_char,
    context: drv::CUcontext,
    context_uid: u32,
    correlation_data: *mut u64,
    correlation_id: u32,
}

/// `cuLaunchKernel_params` (generated_cuda_meta.h): the call's arguments.
#[repr(C)]
struct LaunchParams {
    f: drv::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: drv::CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

type Subscriber = *mut c_void;
type Callback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

/// The four CUPTI functions used, from `libcupti.so`.
struct Cupti {
    subscribe: unsafe extern "C" fn(*mut Subscriber, Callback, *mut c_void) -> u32,
    enable_callback: unsafe extern "C" fn(u32, Subscriber, u32, u32) -> u32,
    unsubscribe: unsafe extern "C" fn(Subscriber) -> u32,
    _lib: libloading::Library,
}

// SAFETY: function pointers into a library that is never unloaded.
unsafe impl Send for Cupti {}
unsafe impl Sync for Cupti {}

impl Cupti {
    /// The library, loaded once: the loader's path first, then `$CUDA_PATH`'s and
    /// `/usr/local/cuda`'s (`extras/CUPTI/lib64`, `lib64`, `targets/x86_64-linux/lib`), then the
    /// `nvidia-cuda-cupti` pip wheel's (which torch installs).
    fn get() -> Result<&'static Cupti, String> {
        static LIB: OnceLock<Result<Cupti, String>> = OnceLock::new();
        LIB.get_or_init(Cupti::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Cupti, String> {
        let mut candidates: Vec<String> = ["libcupti.so", "libcupti.so.13", "libcupti.so.12"]
            .map(String::from)
            .to_vec();
        for root in [
            std::env::var("CUDA_PATH").ok(),
            Some("/usr/local/cuda".into()),
        ]
        .into_iter()
        .flatten()
        {
            for dir in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"] {
                candidates.push(format!("{root}/{dir}/libcupti.so"));
            }
        }
        if let Some(dir) = kevin::compile::nvrtc::pip_lib_dir("nvidia.cuda_cupti") {
            candidates.extend(
                ["libcupti.so.12", "libcupti.so.13"].map(|n| dir.join(n).display().to_string()),
            );
        }
        let lib = candidates
            .iter()
            // SAFETY: loading NVIDIA's CUPTI library, whose initialisers are sound.
            .find_map(|c| unsafe { libloading::Library::new(c) }.ok())
            .ok_or_else(|| format!("no CUPTI library (tried {})", candidates.join(", ")))?;
        // SAFETY: the symbols' C signatures as cupti_callbacks.h declares them.
        unsafe {
            let subscribe = *lib
                .get(b"cuptiSubscribe\0")
                .map_err(|e| format!("cuptiSubscribe: {e}"))?;
            let enable_callback = *lib
                .get(b"cuptiEnableCallback\0")
                .map_err(|e| format!("cuptiEnableCallback: {e}"))?;
            let unsubscribe = *lib
                .get(b"cuptiUnsubscribe\0")
                .map_err(|e| format!("cuptiUnsubscribe: {e}"))?;
            Ok(Cupti {
                subscribe,
                enable_callback,
                unsubscribe,
                _lib: lib,
            })
        }
    }
}

/// CUPTI's callback: before a `cuLaunchKernel` whose 8-byte parameters include [`TARGET`], notes
/// its stream in [`FOUND`]. Runs on whichever thread launches (cubecl's device thread).
unsafe extern "C" fn on_launch(_user: *mut c_void, domain: u32, cbid: u32, data: *const c_void) {
    if domain != DOMAIN_DRIVER_API
        || (cbid != CBID_LAUNCH_KERNEL && cbid != CBID_LAUNCH_KERNEL_PTSZ)
        || data.is_null()
    {
        return;
    }
    let target = TARGET.load(Ordering::Acquire);
    // SAFETY: CUPTI hands a valid CUpti_CallbackData for the driver API domain, whose
    // functionParams are cuLaunchKernel's arguments for these two ids; each parameter is read
    // only where cuFuncGetParamInfo says the kernel has it, with 8 bytes.
    unsafe {
        let data = &*(data as *const CallbackData);
        if target == 0 || data.callback_site != SITE_ENTER || data.function_params.is_null() {
            return;
        }
        let p = &*(data.function_params as *const LaunchParams);
        if p.kernel_params.is_null() {
            return;
        }
        for i in 0..64usize {
            let (mut offset, mut size) = (0usize, 0usize);
            if drv::cuFuncGetParamInfo(p.f, i, &mut offset, &mut size)
                != drv::CUresult::CUDA_SUCCESS
            {
                break;
            }
            let arg = *p.kernel_params.add(i);
            if size == 8 && !arg.is_null() && *(arg as *const u64) == target {
                let s = p.stream as u64;
                if FOUND
                    .compare_exchange(0, s, Ordering::AcqRel, Ordering::Acquire)
                    .is_err_and(|prev| prev != s)
                {
                    FOUND.store(u64::MAX, Ordering::Release);
                }
                return;
            }
        }
    }
}

/// Watches one launch of cubecl's from here (see the module's text).
fn find(t: &CubeTensor<CudaRuntime>) -> Result<drv::CUstream, String> {
    let mut version = 0i32;
    // SAFETY: an out-parameter to a local.
    unsafe { drv::cuDriverGetVersion(&mut version) };
    if version < 12040 {
        return Err(format!(
            "the driver's CUDA {version} predates cuFuncGetParamInfo (12.4)"
        ));
    }
    let cupti = Cupti::get()?;
    type Cube = CubeBackend<CudaRuntime, f32, i32, u8>;
    let client = t.client.clone();
    let probe = burn_cubecl::ops::numeric::empty_device_contiguous_dtype(
        client.clone(),
        t.device.clone(),
        Shape::new([1024]),
        DType::F32,
    );
    let address = client
        .get_resource(probe.handle.clone())
        .map_err(|e| format!("the probe's address: {e:?}"))?
        .resource()
        .ptr;
    TARGET.store(address, Ordering::Release);
    FOUND.store(0, Ordering::Release);
    let mut sub: Subscriber = std::ptr::null_mut();
    // SAFETY: a valid callback and out-parameter; unsubscribed below on every path.
    let rc = unsafe { (cupti.subscribe)(&mut sub, on_launch, std::ptr::null_mut()) };
    if rc != 0 {
        TARGET.store(0, Ordering::Release);
        return Err(format!(
            "cuptiSubscribe failed with CUPTI error {rc} (another CUPTI client, e.g. a profiler?)"
        ));
    }
    let watched = (|| {
        for cbid in [CBID_LAUNCH_KERNEL, CBID_LAUNCH_KERNEL_PTSZ] {
            // SAFETY: a live subscriber.
            let rc = unsafe { (cupti.enable_callback)(1, sub, DOMAIN_DRIVER_API, cbid) };
            if rc != 0 {
                return Err(format!(
                    "cuptiEnableCallback({cbid}) failed with CUPTI error {rc}"
                ));
            }
        }
        // A kernel that reads the probe (a copy, so not in place), then a request that cubecl's
        // device thread answers only after it has launched that kernel.
        let out = Cube::float_exp(probe.clone());
        client
            .get_resource(out.handle.clone())
            .map(drop)
            .map_err(|e| format!("after the watched launch: {e:?}"))
    })();
    // SAFETY: the subscriber made above.
    unsafe { (cupti.unsubscribe)(sub) };
    TARGET.store(0, Ordering::Release);
    watched?;
    match FOUND.swap(0, Ordering::AcqRel) {
        0 => Err("no launch carried the probe's address".into()),
        u64::MAX => Err("launches on two streams carried the probe's address".into()),
        s => Ok(s as drv::CUstream),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_parse_and_name_the_bad_value() {
        assert_eq!(parse_order("stream"), Ok(Order::Stream));
        assert_eq!(parse_order("fence").map(Order::name), Ok("fence"));
        let e = parse_order("gates").unwrap_err();
        assert!(e.contains("\"gates\""), "{e}");
    }
}
