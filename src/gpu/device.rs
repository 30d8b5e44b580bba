//! A thin layer over the CUDA driver API (cudarc's `sys` bindings, loaded at run time): one
//! context on one GPU, one stream, raw device buffers, modules, launches and events.
//!
//! Why not cudarc's safe layer: a worker launches kernels it did not write, with argument lists
//! that exist only at run time (pointers and scalars from a launch plan), and must tell a sticky
//! fault of the context (illegal address, trap) from a refused launch (too many resources). The
//! driver calls are few, so they are wrapped here with those distinctions as data ([`GpuError`]).
//!
//! Everything runs on one stream (`stream`), which is also what events time.

use std::ffi::{c_void, CString};

use std::time::{Duration, Instant};

use cudarc::driver::sys;

/// A failed driver call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {name} ({code}: {desc})")]
pub struct GpuError {
    /// The driver function (or what kevin was doing).
    pub call: String,
    /// The CUDA error name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub name: String,
    /// The driver's description, e.g. "an illegal memory access was encountered".
    pub desc: String,
    /// The numeric `CUresult`.
    pub code: u32,
}

impl GpuError {
    /// Whether the error is one of the faults that poison the context for good (CUDA calls them
    /// sticky): the process must exit before the GPU can be used again.
    pub fn is_sticky(&self) -> bool {
        matches!(
            self.code,
            700 // ILLEGAL_ADDRESS
            | 702 // LAUNCH_TIMEOUT
            | 710 // ASSERT
            | 714 // HARDWARE_STACK_ERROR
            | 715 // ILLEGAL_INSTRUCTION
            | 716 // MISALIGNED_ADDRESS
            | 717 // INVALID_ADDRESS_SPACE
            | 718 // INVALID_PC
            | 719 // LAUNCH_FAILED (a trap)
            | 709 // CONTEXT_IS_DESTROYED
            | 999 // UNKNOWN
        )
    }
}

/// Polls a stream or event `query` until it is done (`Ok(true)`) or `limit` has passed
/// (`Ok(false)`): yielding for the first millisecond (short kernels answer quickly), then
/// sleeping 100 µs between polls.
fn poll(call: &str, limit: Duration, query: impl Fn() -> sys::CUresult) -> Result<bool, GpuError> {
    let start = Instant::now();
    loop {
        let r = query();
        if r != sys::CUresult::CUDA_ERROR_NOT_READY {
            return ck(call, r).map(|_| true);
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Ok(false);
        }
        if waited < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

fn ck(call: &str, r: sys::CUresult) -> Result<(), GpuError> {
    match r.result() {
        Ok(()) => Ok(()),
        Err(e) => Err(GpuError {
            call: call.to_string(),
            name: e
                .error_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "CUDA_ERROR_?".into()),
            desc: e
                .error_string()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            code: e.0 as u32,
        }),
    }
}

fn harness_error(call: &str, what: impl Into<String>) -> GpuError {
    GpuError {
        call: call.to_string(),
        name: what.into(),
        desc: String::new(),
        code: 0,
    }
}

impl GpuError {
    /// "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered": what a candidate's
    /// feedback says about a fault.
    pub fn fault(&self) -> String {
        if self.desc.is_empty() {
            self.name.clone()
        } else {
            format!("{}: {}", self.name, self.desc)
        }
    }
}

/// Whether the CUDA driver library can be loaded (cudarc panics on a missing library, so this
/// is asked first).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// The PCI bus id of GPU `ordinal` (as this process numbers it, after `CUDA_VISIBLE_DEVICES`),
/// e.g. "0000:19:00.0": a name of the GPU that is the same in every process. It creates no
/// context (only `cuInit`, which is idempotent); used to key the GPU-wide timing lease
/// ([`super::lease`]).
pub fn pci_bus_id(ordinal: usize) -> Result<String, GpuError> {
    if !driver_available() {
        return Err(harness_error(
            "cuInit",
            "the CUDA driver library (libcuda.so) is not installed",
        ));
    }
    let ordinal = i32::try_from(ordinal)
        .map_err(|_| harness_error("cuDeviceGet", format!("GPU ordinal {ordinal} is too large")))?;
    let mut bus = [0 as std::ffi::c_char; 64];
    // SAFETY: plain driver calls with out-pointers to locals; the buffer's length is passed.
    unsafe {
        ck("cuInit", sys::cuInit(0))?;
        let mut dev = 0;
        ck("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
        ck(
            "cuDeviceGetPCIBusId",
            sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev),
        )?;
        Ok(std::ffi::CStr::from_ptr(bus.as_ptr())
            .to_string_lossy()
            .into_owned())
    }
}

/// One GPU: a primary context made current on the calling thread, and one stream.
pub struct Gpu {
    dev: sys::CUdevice,
    stream: sys::CUstream,
    pool: sys::CUmemoryPool,
    /// The device's name.
    pub name: String,
    /// L2 cache size in bytes.
    pub l2_bytes: usize,
    /// `sm_XY` of the device.
    pub arch: String,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Shared memory a block may opt in to, in bytes.
    pub smem_optin: u32,
}

impl Gpu {
    /// Opens GPU `ordinal` (primary context, current on this thread) with a fresh stream.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        if !driver_available() {
            return Err(harness_error(
                "cuInit",
                "the CUDA driver library (libcuda.so) is not installed",
            ));
        }
        // SAFETY: plain driver calls with out-pointers to locals.
        unsafe {
            ck("cuInit", sys::cuInit(0))?;
            let mut dev = 0;
            ck("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal as i32))?;
            let mut ctx = std::ptr::null_mut();
            ck(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            ck("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            // Freed buffers stay in the device's default pool for the next request instead of
            // going back to the driver at every synchronisation.
            let mut pool = std::ptr::null_mut();
            ck(
                "cuDeviceGetDefaultMemPool",
                sys::cuDeviceGetDefaultMemPool(&mut pool, dev),
            )?;
            let mut keep = u64::MAX;
            ck(
                "cuMemPoolSetAttribute",
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut keep as *mut u64).cast(),
                ),
            )?;
            let mut stream = std::ptr::null_mut();
            ck(
                "cuStreamCreate",
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                ),
            )?;
            let attr = |a| {
                let mut v = 0;
                ck(
                    "cuDeviceGetAttribute",
                    sys::cuDeviceGetAttribute(&mut v, a, dev),
                )
                .map(|_| v)
            };
            use sys::CUdevice_attribute::*;
            let l2 = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
            let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let smem_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
            let mut name = [0i8; 256];
            ck(
                "cuDeviceGetName",
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev),
            )?;
            let name = std::ffi::CStr::from_ptr(name.as_ptr())
                .to_string_lossy()
                .into_owned();
            Ok(Gpu {
                dev,
                stream,
                pool,
                name,
                l2_bytes: l2.max(0) as usize,
                arch: format!("sm_{major}{minor}"),
                sms: sms.max(1) as u32,
                smem_optin: smem_optin.max(0) as u32,
            })
        }
    }

    /// Gives the pool's idle memory above `keep` bytes back to the driver (after a request: a
    /// worker that ran a large task must not keep its memory from the other workers of its
    /// GPU). Call it after a synchronisation.
    pub fn trim_pool(&self, keep: usize) -> Result<(), GpuError> {
        // SAFETY: the pool is this device's default pool, alive as long as the context.
        unsafe { ck("cuMemPoolTrimTo", sys::cuMemPoolTrimTo(self.pool, keep)) }
    }

    /// Starts a new high-water mark of the memory allocated from this worker's pool.
    pub fn reset_peak(&self) -> Result<(), GpuError> {
        let mut zero = 0u64;
        // SAFETY: the attribute takes a u64 that outlives the call.
        unsafe {
            ck(
                "cuMemPoolSetAttribute(USED_MEM_HIGH)",
                sys::cuMemPoolSetAttribute(
                    self.pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                ),
            )
        }
    }

    /// The most memory allocated from this worker's pool at once since [`Gpu::reset_peak`]:
    /// the harness's (and the candidate's scratch) peak device memory, in bytes.
    pub fn peak_bytes(&self) -> Result<u64, GpuError> {
        let mut v = 0u64;
        // SAFETY: the attribute writes a u64 into a local.
        unsafe {
            ck(
                "cuMemPoolGetAttribute(USED_MEM_HIGH)",
                sys::cuMemPoolGetAttribute(
                    self.pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut v as *mut u64).cast(),
                ),
            )?
        };
        Ok(v)
    }

    /// The stream every launch, copy and event of this worker uses.
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// The device handle.
    pub fn device(&self) -> sys::CUdevice {
        self.dev
    }

    /// Allocates `bytes` of device memory (at least 1 byte), ordered on the stream from the
    /// device's memory pool: a request's buffers come back to the pool when they drop, without
    /// the implicit synchronisation and page mapping of cuMemAlloc/cuMemFree (which cost about
    /// as much as the GPU work of a level-1 evaluation).
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, GpuError> {
        let mut ptr = 0;
        // SAFETY: out-pointer to a local; the stream lives as long as `self`.
        unsafe {
            ck(
                "cuMemAllocAsync",
                sys::cuMemAllocAsync(&mut ptr, bytes.max(1), self.stream),
            )?
        };
        Ok(DevBuf {
            ptr,
            bytes,
            stream: self.stream,
        })
    }

    /// Copies the start of `src` into `dst` and waits.
    pub fn download(&self, dst: &mut [u8], src: &DevBuf) -> Result<(), GpuError> {
        self.download_at(dst, src.ptr, src.bytes)
    }

    /// Copies `dst.len()` bytes from device address `src` (of a buffer of `avail` bytes).
    pub fn download_at(&self, dst: &mut [u8], src: u64, avail: usize) -> Result<(), GpuError> {
        if dst.len() > avail {
            return Err(harness_error(
                "download",
                "destination larger than the buffer",
            ));
        }
        // SAFETY: `src` holds at least `dst.len()` bytes; the copy completes before returning.
        unsafe {
            ck(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), self.stream),
            )?;
        }
        self.sync()
    }

    /// Copies `bytes` between device buffers (asynchronously, on the stream).
    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), GpuError> {
        // SAFETY: callers pass live buffers of at least `bytes` bytes.
        unsafe {
            ck(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream),
            )
        }
    }

    /// Sets `n` bytes at device address `ptr` (inside a live buffer) to `byte`, asynchronously:
    /// no host round trip, unlike an upload.
    pub fn fill_bytes_at(&self, ptr: u64, byte: u8, n: usize) -> Result<(), GpuError> {
        // SAFETY: callers pass an address with `n` bytes of a live buffer behind it.
        unsafe {
            ck(
                "cuMemsetD8Async",
                sys::cuMemsetD8Async(ptr, byte, n, self.stream),
            )
        }
    }

    /// Sets every 32-bit word of `buf` to `word` (asynchronously).
    pub fn fill_u32(&self, buf: &DevBuf, word: u32) -> Result<(), GpuError> {
        // SAFETY: writes `bytes / 4` words inside the buffer.
        unsafe {
            ck(
                "cuMemsetD32Async",
                sys::cuMemsetD32Async(buf.ptr, word, buf.bytes / 4, self.stream),
            )
        }
    }

    /// Sets every 16-bit word of `buf` to `word` (asynchronously).
    pub fn fill_u16(&self, buf: &DevBuf, word: u16) -> Result<(), GpuError> {
        // SAFETY: writes `bytes / 2` halves inside the buffer.
        unsafe {
            ck(
                "cuMemsetD16Async",
                sys::cuMemsetD16Async(buf.ptr, word, buf.bytes / 2, self.stream),
            )
        }
    }

    /// Waits for the stream at most `limit`: `Ok(false)` when work is still running then (the
    /// caller decides what a late kernel means; nothing stops it short of ending the context).
    pub fn sync_within(&self, limit: Duration) -> Result<bool, GpuError> {
        // SAFETY: the stream lives as long as `self`.
        poll("cuStreamQuery", limit, || unsafe {
            sys::cuStreamQuery(self.stream)
        })
    }

    /// Waits for the stream.
    pub fn sync(&self) -> Result<(), GpuError> {
        // SAFETY: the stream lives as long as `self`.
        unsafe { ck("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream)) }
    }

    /// Loads a module from a CUBIN or PTX image.
    pub fn load_module(&self, image: &[u8]) -> Result<GpuModule, GpuError> {
        // cuModuleLoadData reads PTX as a C string: make sure it is terminated.
        let mut owned;
        let data = if image.starts_with(b"\x7fELF") || image.last() == Some(&0) {
            image
        } else {
            owned = image.to_vec();
            owned.push(0);
            &owned[..]
        };
        let mut module = std::ptr::null_mut();
        // SAFETY: `data` is a complete image that outlives the call.
        unsafe {
            ck(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut module, data.as_ptr().cast()),
            )?
        };
        Ok(GpuModule { module })
    }

    /// Launches `f` with kernel parameters `params` (pointers to each argument's value).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list; pointer arguments are trusted to point
    /// into live buffers only as far as the kernel is trusted (candidates run in workers).
    pub unsafe fn launch(
        &self,
        f: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), GpuError> {
        ck(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                smem,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        )
    }

    /// A pair of timing events.
    pub fn timer(&self) -> Result<EventPair, GpuError> {
        let mut start = std::ptr::null_mut();
        let mut end = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; default flags keep timing enabled.
        unsafe {
            ck("cuEventCreate", sys::cuEventCreate(&mut start, 0))?;
            ck("cuEventCreate", sys::cuEventCreate(&mut end, 0))?;
        }
        Ok(EventPair {
            start,
            end,
            stream: self.stream,
        })
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-pointers to locals.
        unsafe { ck("cuMemGetInfo", sys::cuMemGetInfo_v2(&mut free, &mut total))? };
        Ok((free, total))
    }
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DevBuf {
    ptr: u64,
    bytes: usize,
    /// The stream it was allocated on, and is freed on.
    stream: sys::CUstream,
}

impl DevBuf {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocAsync on `stream` and freed once, ordered after all
        // work queued on that stream (every use of the buffer is on it). After a sticky error
        // this fails, which is fine: the process is about to exit.
        unsafe {
            let _ = sys::cuMemFreeAsync(self.ptr, self.stream);
        }
    }
}

/// A loaded module.
pub struct GpuModule {
    module: sys::CUmodule,
}

impl GpuModule {
    /// Looks up a kernel by its (lowered) symbol.
    pub fn function(&self, symbol: &str) -> Result<sys::CUfunction, GpuError> {
        let name = CString::new(symbol)
            .map_err(|_| harness_error("cuModuleGetFunction", "NUL in name"))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: the module is loaded; out-pointer to a local.
        unsafe {
            ck(
                &format!("cuModuleGetFunction({symbol})"),
                sys::cuModuleGetFunction(&mut f, self.module, name.as_ptr()),
            )?
        };
        Ok(f)
    }
}

impl Drop for GpuModule {
    fn drop(&mut self) {
        // A poisoned worker is about to be replaced, possibly with a kernel of this module still
        // running (it overran `RUN_LIMIT`): cuModuleUnload would wait for that kernel, holding
        // the answer (and the GPU's lock in the parent) until the request's deadline. On the
        // H200 storm this cost 5 s per hung candidate.
        if super::fault::poisoned() {
            return;
        }
        // SAFETY: loaded once, unloaded once.
        unsafe {
            let _ = sys::cuModuleUnload(self.module);
        }
    }
}

/// Lets `f` use `bytes` of dynamic shared memory (above the default 48 KiB needs opting in).
///
/// # Safety
/// `f` must be a function of a module that is still loaded.
pub unsafe fn allow_dynamic_smem(f: sys::CUfunction, bytes: u32) -> Result<(), GpuError> {
    if bytes <= 48 * 1024 {
        return Ok(());
    }
    ck(
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        sys::cuFuncSetAttribute(
            f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        ),
    )
}

/// Two events on the worker's stream: `start()` before a launch sequence, `stop()` after it,
/// then `elapsed_ms()` waits for the end and returns the GPU time between them.
pub struct EventPair {
    start: sys::CUevent,
    end: sys::CUevent,
    stream: sys::CUstream,
}

impl EventPair {
    /// Records the start event.
    pub fn start(&self) -> Result<(), GpuError> {
        // SAFETY: live event and stream.
        unsafe { ck("cuEventRecord", sys::cuEventRecord(self.start, self.stream)) }
    }

    /// Records the end event.
    pub fn stop(&self) -> Result<(), GpuError> {
        // SAFETY: live event and stream.
        unsafe { ck("cuEventRecord", sys::cuEventRecord(self.end, self.stream)) }
    }

    /// Waits at most `limit` for the end event: milliseconds between the two, or `None` when
    /// the timed work is still running then.
    pub fn elapsed_ms_within(&self, limit: Duration) -> Result<Option<f64>, GpuError> {
        // SAFETY: the event lives as long as `self`.
        if poll("cuEventQuery", limit, || unsafe {
            sys::cuEventQuery(self.end)
        })? {
            self.elapsed_ms().map(Some)
        } else {
            Ok(None)
        }
    }

    /// Waits for the end event; milliseconds between the two.
    pub fn elapsed_ms(&self) -> Result<f64, GpuError> {
        let mut ms = 0f32;
        // SAFETY: both events were recorded on this stream.
        unsafe {
            ck("cuEventSynchronize", sys::cuEventSynchronize(self.end))?;
            ck(
                "cuEventElapsedTime",
                sys::cuEventElapsedTime(&mut ms, self.start, self.end),
            )?;
        }
        Ok(f64::from(ms))
    }
}

impl Drop for EventPair {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.start);
            let _ = sys::cuEventDestroy_v2(self.end);
        }
    }
}

/// Packs launch arguments: keeps each value alive at a stable address and hands out the
/// `void*[]` array `cuLaunchKernel` wants.
#[derive(Default)]
pub struct ArgPack {
    values: Vec<[u8; 8]>,
}

impl ArgPack {
    /// Adds one argument of up to 8 bytes (a pointer or a scalar in its C type).
    pub fn push(&mut self, bytes: &[u8]) {
        let mut v = [0u8; 8];
        v[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
        self.values.push(v);
    }

    /// Adds a device pointer.
    pub fn ptr(&mut self, p: u64) {
        self.push(&p.to_ne_bytes());
    }

    /// The parameter array (valid while `self` is neither moved nor changed).
    pub fn params(&mut self) -> Vec<*mut c_void> {
        self.values
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast())
            .collect()
    }
}
