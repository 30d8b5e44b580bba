//! Plain host buffers for the device model's unit tests: 256-byte aligned like `cudaMalloc`
//! (vector loads such as `float4` compile to aligned SSE moves), with conversions between f64
//! values and a tensor's element encoding. The evaluation path uses the guard-paged
//! [`crate::verify::buffer::TensorBuf`] instead; these exist so the model's tests need nothing
//! of the protocol.

use std::alloc::Layout;
use std::ffi::c_void;
use std::ptr::NonNull;

use crate::candidate::Dtype;
use crate::ops::round::{bf16_bits, bf16_from_bits, f16_bits, f16_from_bits};

/// Alignment of every buffer, as `cudaMalloc` guarantees.
const ALIGN: usize = 256;

/// A zero-initialised, 256-byte aligned heap buffer.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

impl HostBuffer {
    /// `len` zero bytes (at least one byte is allocated); `None` if the size is unrepresentable
    /// or the allocation fails.
    pub fn zeroed(len: usize) -> Option<HostBuffer> {
        let layout = Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(HostBuffer { ptr, len, layout })
    }

    /// A buffer holding `values` encoded as `dtype` (rounded to nearest, even on ties).
    pub fn from_values(dtype: Dtype, values: &[f64]) -> Option<HostBuffer> {
        let size = dtype.size_bytes() as usize;
        let mut buf = HostBuffer::zeroed(values.len().checked_mul(size)?)?;
        for (chunk, &v) in buf.bytes_mut().chunks_exact_mut(size).zip(values) {
            chunk.copy_from_slice(&encode(dtype, v)[..size]);
        }
        Some(buf)
    }

    /// Fills the buffer with a value no correct kernel leaves in an output: NaN for floating
    /// types, the most negative value for integers.
    pub fn poison(&mut self, dtype: Dtype) {
        let size = dtype.size_bytes() as usize;
        let bytes = match dtype {
            Dtype::F16 => 0x7e00u16.to_ne_bytes().to_vec(),
            Dtype::Bf16 => 0x7fc0u16.to_ne_bytes().to_vec(),
            Dtype::F32 => f32::NAN.to_ne_bytes().to_vec(),
            Dtype::F64 => f64::NAN.to_ne_bytes().to_vec(),
            Dtype::I8 | Dtype::U8 | Dtype::Bool => vec![0x80],
            Dtype::I32 => i32::MIN.to_ne_bytes().to_vec(),
            Dtype::I64 => i64::MIN.to_ne_bytes().to_vec(),
        };
        for chunk in self.bytes_mut().chunks_exact_mut(size) {
            chunk.copy_from_slice(&bytes);
        }
    }

    /// The elements decoded as `dtype`, as f64.
    pub fn values(&self, dtype: Dtype) -> Vec<f64> {
        let size = dtype.size_bytes() as usize;
        self.bytes()
            .chunks_exact(size)
            .map(|c| decode(dtype, c))
            .collect()
    }

    /// The pointer a kernel receives.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr.as_ptr().cast()
    }

    /// The contents.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialised bytes (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The contents, mutably.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// `v` in `dtype`'s encoding, in the first `size_bytes` of the result.
fn encode(dtype: Dtype, v: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    match dtype {
        Dtype::F16 => out[..2].copy_from_slice(&f16_bits(v).to_ne_bytes()),
        Dtype::Bf16 => out[..2].copy_from_slice(&bf16_bits(v).to_ne_bytes()),
        Dtype::F32 => out[..4].copy_from_slice(&(v as f32).to_ne_bytes()),
        Dtype::F64 => out = v.to_ne_bytes(),
        Dtype::I8 => out[0] = (v as i8) as u8,
        Dtype::U8 => out[0] = v as u8,
        Dtype::Bool => out[0] = u8::from(v != 0.0),
        Dtype::I32 => out[..4].copy_from_slice(&(v as i32).to_ne_bytes()),
        Dtype::I64 => out = (v as i64).to_ne_bytes(),
    }
    out
}

fn decode(dtype: Dtype, c: &[u8]) -> f64 {
    let mut b = [0u8; 8];
    b[..c.len()].copy_from_slice(c);
    let u16v = u16::from_ne_bytes([b[0], b[1]]);
    let u32b = [b[0], b[1], b[2], b[3]];
    match dtype {
        Dtype::F16 => f16_from_bits(u16v),
        Dtype::Bf16 => bf16_from_bits(u16v),
        Dtype::F32 => f32::from_ne_bytes(u32b) as f64,
        Dtype::F64 => f64::from_ne_bytes(b),
        Dtype::I8 => b[0] as i8 as f64,
        Dtype::U8 | Dtype::Bool => b[0] as f64,
        Dtype::I32 => i32::from_ne_bytes(u32b) as f64,
        Dtype::I64 => i64::from_ne_bytes(b) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_alignment() {
        let vals = [0.0, 1.5, -2.25, 65504.0];
        for d in [
            Dtype::F16,
            Dtype::Bf16,
            Dtype::F32,
            Dtype::F64,
            Dtype::I64,
            Dtype::I32,
        ] {
            let b = HostBuffer::from_values(d, &vals).expect("alloc");
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            let back = b.values(d);
            if d == Dtype::Bf16 || matches!(d, Dtype::I64 | Dtype::I32) {
                assert_eq!(back[..2], [0.0, if d == Dtype::Bf16 { 1.5 } else { 1.0 }]);
            } else {
                assert_eq!(back, vals);
            }
        }
        let mut p = HostBuffer::zeroed(8).expect("alloc");
        p.poison(Dtype::F32);
        assert!(p.values(Dtype::F32).iter().all(|v| v.is_nan()));
    }
}
