//! Host buffers fenced by guard pages, and the typed tensor buffers the correctness protocol hands
//! to an execution backend.
//!
//! Why guard pages: an out-of-bounds write that lands in some other allocation is the classic way
//! a wrong kernel passes anyway (it corrupts nothing the checker reads) or makes a later,
//! innocent evaluation fail. A [`GuardedBuffer`] is its own `mmap` with an inaccessible
//! (`PROT_NONE`) page before and after the data, so a CPU execution backend that runs candidate
//! code against host memory turns such a write into a `SIGSEGV` in its worker process, which the
//! worker pool reports as a crash of the candidate.
//!
//! Placement: the data ends exactly at the trailing guard page by default
//! ([`Placement::End`]), so writing (or reading) one element past the end faults. The start of
//! the data is then generally not page-aligned: an underflow is caught only once it reaches past
//! the alignment slack (the bytes between the first data page's start and the data's start, less
//! than one page) into the leading guard page. [`Placement::Start`] is the mirror image (the data
//! starts at the leading guard page: index -1 faults, an overflow only beyond the slack). The
//! protocol uses `End`, because overflows (an off-by-one grid, a missing `if (i < n)`) are far more
//! common in kernels than underflows. A buffer whose length is a multiple of the page size has no
//! slack and catches both.
//!
//! Alignment: the end of the data is page-aligned, so a buffer whose byte length is a multiple of
//! an element's size is aligned for that element (f32, u16, i64) in either placement.
//!
//! A GPU backend copies a [`TensorBuf`]'s bytes ([`TensorBuf::as_bytes`],
//! [`TensorBuf::as_bytes_mut`]) to device memory and back inside its `run`; the host buffer keeps
//! the NaN fill and the checks stay the same.

use std::fmt;
use std::ptr::NonNull;

use crate::ops::round::{bf16_bits, bf16_from_bits, f16_bits, f16_from_bits};
use crate::ops::Dtype;

/// The f32 fill of an unwritten output element: a quiet NaN with a payload (`0x7FE5A5A5`) that
/// arithmetic rarely produces, so "left unwritten" can be told from "computed a NaN".
pub const F32_FILL: u32 = 0x7FE5_A5A5;
/// The f16 fill of an unwritten output element (a quiet NaN with a payload).
pub const F16_FILL: u16 = 0x7E5A;
/// The bf16 fill of an unwritten output element (a quiet NaN with a payload).
pub const BF16_FILL: u16 = 0x7FE5;
/// The i64 fill of an unwritten output element (i64 has no NaN; no index is negative).
pub const I64_FILL: i64 = i64::MIN;

/// Why a buffer could not be made or viewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    /// `mmap` or `mprotect` failed.
    #[error("could not map a guarded buffer of {bytes} bytes: {reason}")]
    Map {
        /// Requested data size in bytes.
        bytes: usize,
        /// The OS error.
        reason: String,
    },
    /// The requested size overflows the address arithmetic.
    #[error("buffer size overflows: {elems} elements of {elem_size} bytes")]
    TooLarge {
        /// Number of elements.
        elems: usize,
        /// Bytes per element.
        elem_size: usize,
    },
    /// A typed view was asked of a buffer whose length or alignment does not fit the type.
    #[error("a buffer of {bytes} bytes cannot be viewed as elements of {elem_size} bytes")]
    Layout {
        /// Buffer length in bytes.
        bytes: usize,
        /// Element size in bytes.
        elem_size: usize,
    },
    /// A view of one dtype was asked of a tensor of another.
    #[error("tensor {name} is {actual:?}, not {wanted}")]
    Dtype {
        /// Tensor name.
        name: String,
        /// Its dtype.
        actual: Dtype,
        /// The view asked for.
        wanted: &'static str,
    },
    /// A write did not have one value per element.
    #[error("tensor {name} has {expected} elements, got {got} values")]
    Length {
        /// Tensor name.
        name: String,
        /// Its element count.
        expected: usize,
        /// Values given.
        got: usize,
    },
}

/// Where the data sits between the two guard pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The data starts [`DEVICE_ALIGN`]-aligned as close to the trailing guard page as that
    /// allows (less than 256 bytes before it): an overflow past the slack faults, a write into
    /// the slack breaks its canary ([`GuardedBuffer::slack_intact`]), a read there is harmless
    /// (as on a GPU); an underflow faults only beyond the page's slack. The protocol's choice.
    #[default]
    End,
    /// The data starts at the leading guard page: any underflow faults; an overflow faults only
    /// beyond the alignment slack.
    Start,
}

/// Element types a [`GuardedBuffer`] can be viewed as. Sealed: f32, u16 (f16/bf16 bits), i64.
pub trait Element: Copy + sealed::Sealed + 'static {}
impl Element for f32 {}
impl Element for u16 {}
impl Element for i64 {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for i64 {}
}

/// `bytes` of read-write memory between two `PROT_NONE` guard pages, in its own mapping.
/// Zero-initialised (fresh anonymous memory). Dropping it unmaps it.
pub struct GuardedBuffer {
    /// Start of the whole mapping (the leading guard page).
    map: NonNull<u8>,
    /// Length of the whole mapping.
    map_len: usize,
    /// Start of the data.
    data: NonNull<u8>,
    /// Length of the data in bytes.
    len: usize,
    placement: Placement,
}

// SAFETY: the buffer exclusively owns its mapping; `&self` only reads and `&mut self` writes.
unsafe impl Send for GuardedBuffer {}
// SAFETY: shared references give only read access.
unsafe impl Sync for GuardedBuffer {}

impl fmt::Debug for GuardedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedBuffer")
            .field("len", &self.len)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn os_error(bytes: usize) -> BufferError {
    BufferError::Map {
        bytes,
        reason: std::io::Error::last_os_error().to_string(),
    }
}

/// Alignment of a buffer's start, as cudaMalloc guarantees.
pub const DEVICE_ALIGN: usize = 256;

/// The byte written into the slack after a buffer's data.
const CANARY: u8 = 0xA5;

impl GuardedBuffer {
    /// `bytes` of zeroed memory ending at the trailing guard page ([`Placement::End`]).
    pub fn new(bytes: usize) -> Result<GuardedBuffer, BufferError> {
        GuardedBuffer::with_placement(bytes, Placement::End)
    }

    /// `bytes` of zeroed memory placed as `placement` says.
    pub fn with_placement(
        bytes: usize,
        placement: Placement,
    ) -> Result<GuardedBuffer, BufferError> {
        GuardedBuffer::map(bytes, placement, None)
    }

    /// The bytes of a shared file a buffer of `bytes` occupies ([`GuardedBuffer::shared`]): its
    /// data pages, `bytes` rounded up to whole pages.
    pub fn file_span(bytes: usize) -> Option<usize> {
        bytes.div_ceil(page_size()).checked_mul(page_size())
    }

    /// A buffer of `bytes` whose data pages are [`GuardedBuffer::file_span`] bytes of the shared
    /// file `fd` from `file_offset` (page-aligned), between guard pages of its own, placed as
    /// [`Placement::End`]. Two processes that map the same span see the same bytes at the same
    /// offsets from their data pointers. `fresh`: this is the span's first mapping, so the
    /// canary is written into its slack (a second view must not rewrite it, or it would hide an
    /// overflow).
    pub fn shared(
        fd: std::os::fd::RawFd,
        file_offset: u64,
        bytes: usize,
        fresh: bool,
    ) -> Result<GuardedBuffer, BufferError> {
        let mut buf = GuardedBuffer::map(bytes, Placement::End, Some((fd, file_offset)))?;
        if !fresh {
            return Ok(buf);
        }
        buf.slack_mut().fill(CANARY);
        Ok(buf)
    }

    fn map(
        bytes: usize,
        placement: Placement,
        file: Option<(std::os::fd::RawFd, u64)>,
    ) -> Result<GuardedBuffer, BufferError> {
        let page = page_size();
        let too_large = || BufferError::TooLarge {
            elems: bytes,
            elem_size: 1,
        };
        let data_len = GuardedBuffer::file_span(bytes).ok_or_else(too_large)?;
        let map_len = data_len.checked_add(2 * page).ok_or_else(too_large)?;
        if map_len > isize::MAX as usize {
            return Err(too_large());
        }
        // SAFETY: an anonymous private mapping at an address of the kernel's choice.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(os_error(bytes));
        }
        let map = map.cast::<u8>();
        if data_len > 0 {
            // SAFETY: [map + page, map + page + data_len) lies inside the mapping just made; the
            // file mapping replaces those pages of it (MAP_FIXED over our own reservation).
            let rc = unsafe {
                match file {
                    None => libc::mprotect(
                        map.add(page).cast(),
                        data_len,
                        libc::PROT_READ | libc::PROT_WRITE,
                    ),
                    Some((fd, offset)) => {
                        let m = libc::mmap(
                            map.add(page).cast(),
                            data_len,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED | libc::MAP_FIXED,
                            fd,
                            offset as libc::off_t,
                        );
                        if m == libc::MAP_FAILED {
                            -1
                        } else {
                            0
                        }
                    }
                }
            };
            if rc != 0 {
                let err = os_error(bytes);
                // SAFETY: unmapping the mapping made above, which nothing else refers to.
                unsafe { libc::munmap(map.cast(), map_len) };
                return Err(err);
            }
        }
        // Data starts DEVICE_ALIGN-aligned, as cudaMalloc's does: vectorised loads (float4, and
        // the aligned SSE moves they compile to on the CPU) must not fault on a correct kernel.
        // With `End`, that leaves up to DEVICE_ALIGN - 1 bytes of slack before the guard page;
        // the slack holds a canary, so a write into it is still caught ([`GuardedBuffer::slack_intact`]).
        let offset = match placement {
            Placement::End => (page + data_len - bytes) / DEVICE_ALIGN * DEVICE_ALIGN,
            Placement::Start => page,
        };
        // SAFETY: offset <= map_len - page, inside the mapping; mmap never returns null on success.
        let (map, data) = unsafe {
            (
                NonNull::new_unchecked(map),
                NonNull::new_unchecked(map.add(offset)),
            )
        };
        let mut buf = GuardedBuffer {
            map,
            map_len,
            data,
            len: bytes,
            placement,
        };
        if file.is_none() {
            buf.slack_mut().fill(CANARY);
        }
        Ok(buf)
    }

    /// The bytes between the end of the data and the trailing guard page (or the end of the
    /// data's pages, with `Start`).
    fn slack_range(&self) -> (usize, usize) {
        let page = page_size();
        let data_start = self.data.as_ptr() as usize - self.map.as_ptr() as usize;
        let pages_end = self.map_len - page;
        (data_start + self.len, pages_end)
    }

    fn slack_mut(&mut self) -> &mut [u8] {
        let (from, to) = self.slack_range();
        // SAFETY: [from, to) lies in the read-write pages of the mapping, after the data.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(from), to - from) }
    }

    /// True when nothing wrote past the end of the data into the slack before the guard page.
    pub fn slack_intact(&self) -> bool {
        let (from, to) = self.slack_range();
        // SAFETY: as in `slack_mut`, read-only.
        let slack = unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(from), to - from) };
        slack.iter().all(|b| *b == CANARY)
    }

    /// Data length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the data sits.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The data's first byte, for a backend that hands the memory to foreign code (a device copy,
    /// a CPU device model). Writing outside `[ptr, ptr + len)` faults at least at the guarded end.
    pub fn as_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }

    /// Mutable pointer to the data's first byte (see [`GuardedBuffer::as_ptr`]).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_ptr()
    }

    /// The data as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: data..data+len is mapped read-write and owned by self (len 0: aligned, non-null).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }

    /// The data as mutable bytes.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in as_bytes, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), self.len) }
    }

    fn check_layout<T: Element>(&self) -> Result<usize, BufferError> {
        let size = std::mem::size_of::<T>();
        let aligned = (self.data.as_ptr() as usize) % std::mem::align_of::<T>() == 0;
        if self.len % size != 0 || !aligned {
            return Err(BufferError::Layout {
                bytes: self.len,
                elem_size: size,
            });
        }
        Ok(self.len / size)
    }

    /// The data as elements of `T`; fails when the length is not a multiple of `T`'s size.
    pub fn as_slice<T: Element>(&self) -> Result<&[T], BufferError> {
        let n = self.check_layout::<T>()?;
        // SAFETY: aligned, n * size_of::<T>() == len bytes mapped; every bit pattern is a valid T.
        Ok(unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<T>(), n) })
    }

    /// The data as mutable elements of `T` (see [`GuardedBuffer::as_slice`]).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T], BufferError> {
        let n = self.check_layout::<T>()?;
        // SAFETY: as in as_slice, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr().cast::<T>(), n) })
    }
}

impl Drop for GuardedBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by with_placement and is unmapped exactly once, here.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

/// Bytes per element of a dtype.
pub fn dtype_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F32 => 4,
        Dtype::F16 | Dtype::Bf16 => 2,
        Dtype::I64 => 8,
    }
}

/// One task tensor in host memory: a [`GuardedBuffer`] with its name, dtype and element count.
/// f16 and bf16 are stored as their 16-bit patterns.
#[derive(Debug)]
pub struct TensorBuf {
    name: String,
    dtype: Dtype,
    numel: usize,
    buf: GuardedBuffer,
}

impl TensorBuf {
    /// A zeroed tensor of `numel` elements of `dtype`, ending at its trailing guard page.
    pub fn new(
        name: impl Into<String>,
        dtype: Dtype,
        numel: usize,
    ) -> Result<TensorBuf, BufferError> {
        Ok(TensorBuf {
            name: name.into(),
            dtype,
            numel,
            buf: GuardedBuffer::new(TensorBuf::bytes_for(dtype, numel)?)?,
        })
    }

    /// The bytes of `numel` elements of `dtype`, or the overflow.
    pub fn bytes_for(dtype: Dtype, numel: usize) -> Result<usize, BufferError> {
        let elem_size = dtype_size(dtype);
        numel.checked_mul(elem_size).ok_or(BufferError::TooLarge {
            elems: numel,
            elem_size,
        })
    }

    /// A tensor over an existing buffer of exactly `numel` elements of `dtype` (a shared
    /// buffer the CPU executor also maps).
    pub fn from_buffer(
        name: impl Into<String>,
        dtype: Dtype,
        numel: usize,
        buf: GuardedBuffer,
    ) -> Result<TensorBuf, BufferError> {
        if TensorBuf::bytes_for(dtype, numel).ok() != Some(buf.len()) {
            return Err(BufferError::Layout {
                bytes: buf.len(),
                elem_size: dtype_size(dtype),
            });
        }
        Ok(TensorBuf {
            name: name.into(),
            dtype,
            numel,
            buf,
        })
    }

    /// The tensor's name (as in the task's program).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The underlying guarded memory.
    pub fn buffer(&self) -> &GuardedBuffer {
        &self.buf
    }

    /// The underlying guarded memory, mutably (a CPU backend runs kernels against it).
    pub fn buffer_mut(&mut self) -> &mut GuardedBuffer {
        &mut self.buf
    }

    /// The raw bytes (what a GPU backend copies to the device).
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_bytes()
    }

    /// The raw bytes, mutably (where a GPU backend copies results back).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.buf.as_bytes_mut()
    }

    fn dtype_error(&self, wanted: &'static str) -> BufferError {
        BufferError::Dtype {
            name: self.name.clone(),
            actual: self.dtype,
            wanted,
        }
    }

    /// The elements of an f32 tensor.
    pub fn as_f32(&self) -> Result<&[f32], BufferError> {
        match self.dtype {
            Dtype::F32 => self.buf.as_slice(),
            _ => Err(self.dtype_error("f32")),
        }
    }

    /// The elements of an f32 tensor, mutably.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32], BufferError> {
        match self.dtype {
            Dtype::F32 => self.buf.as_mut_slice(),
            _ => Err(self.dtype_error("f32")),
        }
    }

    /// The bit patterns of an f16 or bf16 tensor.
    pub fn as_u16(&self) -> Result<&[u16], BufferError> {
        match self.dtype {
            Dtype::F16 | Dtype::Bf16 => self.buf.as_slice(),
            _ => Err(self.dtype_error("f16 or bf16")),
        }
    }

    /// The bit patterns of an f16 or bf16 tensor, mutably.
    pub fn as_u16_mut(&mut self) -> Result<&mut [u16], BufferError> {
        match self.dtype {
            Dtype::F16 | Dtype::Bf16 => self.buf.as_mut_slice(),
            _ => Err(self.dtype_error("f16 or bf16")),
        }
    }

    /// The elements of an i64 tensor.
    pub fn as_i64(&self) -> Result<&[i64], BufferError> {
        match self.dtype {
            Dtype::I64 => self.buf.as_slice(),
            _ => Err(self.dtype_error("i64")),
        }
    }

    /// The elements of an i64 tensor, mutably.
    pub fn as_i64_mut(&mut self) -> Result<&mut [i64], BufferError> {
        match self.dtype {
            Dtype::I64 => self.buf.as_mut_slice(),
            _ => Err(self.dtype_error("i64")),
        }
    }

    /// Sets every element to the dtype's fill ([`F32_FILL`], [`F16_FILL`], [`BF16_FILL`],
    /// [`I64_FILL`]), so an element the candidate does not write is detected.
    pub fn fill_nan(&mut self) {
        match self.dtype {
            Dtype::F32 => {
                if let Ok(s) = self.buf.as_mut_slice::<f32>() {
                    s.fill(f32::from_bits(F32_FILL));
                }
            }
            Dtype::F16 | Dtype::Bf16 => {
                let fill = if self.dtype == Dtype::F16 {
                    F16_FILL
                } else {
                    BF16_FILL
                };
                if let Ok(s) = self.buf.as_mut_slice::<u16>() {
                    s.fill(fill);
                }
            }
            Dtype::I64 => {
                if let Ok(s) = self.buf.as_mut_slice::<i64>() {
                    s.fill(I64_FILL);
                }
            }
        }
    }

    /// True when element `i` still holds the fill pattern (false when out of range).
    pub fn is_fill(&self, i: usize) -> bool {
        match self.dtype {
            Dtype::F32 => self
                .as_f32()
                .ok()
                .and_then(|s| s.get(i))
                .is_some_and(|v| v.to_bits() == F32_FILL),
            Dtype::F16 => self
                .as_u16()
                .ok()
                .and_then(|s| s.get(i))
                .is_some_and(|&v| v == F16_FILL),
            Dtype::Bf16 => self
                .as_u16()
                .ok()
                .and_then(|s| s.get(i))
                .is_some_and(|&v| v == BF16_FILL),
            Dtype::I64 => self
                .as_i64()
                .ok()
                .and_then(|s| s.get(i))
                .is_some_and(|&v| v == I64_FILL),
        }
    }

    /// Writes one value per element, each rounded to the dtype (f32 and f16/bf16 to nearest,
    /// i64 to the nearest integer, saturating).
    pub fn write_f64(&mut self, values: &[f64]) -> Result<(), BufferError> {
        if values.len() != self.numel {
            return Err(BufferError::Length {
                name: self.name.clone(),
                expected: self.numel,
                got: values.len(),
            });
        }
        match self.dtype {
            Dtype::F32 => {
                let s = self.buf.as_mut_slice::<f32>()?;
                s.iter_mut().zip(values).for_each(|(d, &v)| *d = v as f32);
            }
            Dtype::F16 => {
                let s = self.buf.as_mut_slice::<u16>()?;
                s.iter_mut()
                    .zip(values)
                    .for_each(|(d, &v)| *d = f16_bits(v));
            }
            Dtype::Bf16 => {
                let s = self.buf.as_mut_slice::<u16>()?;
                s.iter_mut()
                    .zip(values)
                    .for_each(|(d, &v)| *d = bf16_bits(v));
            }
            Dtype::I64 => {
                let s = self.buf.as_mut_slice::<i64>()?;
                s.iter_mut()
                    .zip(values)
                    .for_each(|(d, &v)| *d = v.round_ties_even() as i64);
            }
        }
        Ok(())
    }

    /// Element `i` as f64 (None when out of range). The i64 fill reads as `i64::MIN as f64`.
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        match self.dtype {
            Dtype::F32 => self.as_f32().ok()?.get(i).map(|&v| v as f64),
            Dtype::F16 => self.as_u16().ok()?.get(i).map(|&v| f16_from_bits(v)),
            Dtype::Bf16 => self.as_u16().ok()?.get(i).map(|&v| bf16_from_bits(v)),
            Dtype::I64 => self.as_i64().ok()?.get(i).map(|&v| v as f64),
        }
    }

    /// Every element as f64, in order.
    pub fn read_f64(&self) -> Vec<f64> {
        self.values().map(|(v, _)| v).collect()
    }

    /// Every element in order as `(value as f64, still the fill pattern)`; one pass, no copy.
    pub fn values(&self) -> Values<'_> {
        let inner = match self.dtype {
            Dtype::F32 => self.as_f32().map(|s| ValuesInner::F32(s.iter())),
            Dtype::F16 => self.as_u16().map(|s| ValuesInner::F16(s.iter())),
            Dtype::Bf16 => self.as_u16().map(|s| ValuesInner::Bf16(s.iter())),
            Dtype::I64 => self.as_i64().map(|s| ValuesInner::I64(s.iter())),
        };
        Values(inner.unwrap_or(ValuesInner::Empty))
    }
}

/// Iterator over a tensor's elements: `(value as f64, still the fill pattern)`.
#[derive(Debug)]
pub struct Values<'a>(ValuesInner<'a>);

#[derive(Debug)]
enum ValuesInner<'a> {
    F32(std::slice::Iter<'a, f32>),
    F16(std::slice::Iter<'a, u16>),
    Bf16(std::slice::Iter<'a, u16>),
    I64(std::slice::Iter<'a, i64>),
    Empty,
}

impl Iterator for Values<'_> {
    type Item = (f64, bool);

    fn next(&mut self) -> Option<(f64, bool)> {
        match &mut self.0 {
            ValuesInner::F32(it) => it.next().map(|v| (*v as f64, v.to_bits() == F32_FILL)),
            ValuesInner::F16(it) => it.next().map(|&v| (f16_from_bits(v), v == F16_FILL)),
            ValuesInner::Bf16(it) => it.next().map(|&v| (bf16_from_bits(v), v == BF16_FILL)),
            ValuesInner::I64(it) => it.next().map(|&v| (v as f64, v == I64_FILL)),
            ValuesInner::Empty => None,
        }
    }
}

#[cfg(test)]
#[path = "buffer_tests.rs"]
mod tests;
