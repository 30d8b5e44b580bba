//! Rounding of f64 values to the precision of a tensor dtype, and the bit encodings of f16 and
//! bf16, written out here (round to nearest, ties to even) rather than pulled from a crate. The
//! reference interpreter rounds half-precision inputs with these before computing in f64, and the
//! GPU side uses the bit encodings to upload half-precision tensors.

use super::ast::Dtype;

/// A binary floating-point format with `mant` stored mantissa bits and `exp` exponent bits.
#[derive(Clone, Copy)]
struct Format {
    mant: u32,
    exp: u32,
}

const F16: Format = Format { mant: 10, exp: 5 };
const BF16: Format = Format { mant: 7, exp: 8 };

impl Format {
    fn bias(self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }

    /// Largest finite value.
    fn max(self) -> f64 {
        (2.0 - 2f64.powi(-(self.mant as i32))) * 2f64.powi(self.bias())
    }

    /// Encodes `x`, rounding to nearest with ties to even; overflow gives infinity.
    fn encode(self, x: f64) -> u32 {
        let sign = if x.is_sign_negative() {
            1u32 << (self.mant + self.exp)
        } else {
            0
        };
        let exp_all = (1u32 << self.exp) - 1;
        if x.is_nan() {
            return (exp_all << self.mant) | (1 << (self.mant - 1));
        }
        let a = x.abs();
        if a == 0.0 {
            return sign;
        }
        let emin = 1 - self.bias();
        // Exponent of `a` (floor(log2 a)), read from the bits; f64 subnormals are far below
        // the smallest subnormal of these formats, so clamping to `emin` covers them.
        let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
        let quantum = 2f64.powi(e - self.mant as i32);
        let r = (a / quantum).round_ties_even() * quantum;
        if r > self.max() {
            return sign | (exp_all << self.mant);
        }
        if r < 2f64.powi(emin) {
            // Subnormal (or rounded up to the smallest normal, which this also encodes).
            let m = (r / 2f64.powi(emin - self.mant as i32)) as u32;
            return sign | m;
        }
        let re = ((r.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let m = ((r / 2f64.powi(re) - 1.0) * 2f64.powi(self.mant as i32)) as u32;
        sign | (((re + self.bias()) as u32) << self.mant) | m
    }

    fn decode(self, bits: u32) -> f64 {
        let sign = if bits >> (self.mant + self.exp) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let e = (bits >> self.mant) & ((1 << self.exp) - 1);
        let m = (bits & ((1 << self.mant) - 1)) as f64;
        let scale = 2f64.powi(self.mant as i32);
        if e == 0 {
            sign * m / scale * 2f64.powi(1 - self.bias())
        } else if e == (1 << self.exp) - 1 {
            if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            }
        } else {
            sign * (1.0 + m / scale) * 2f64.powi(e as i32 - self.bias())
        }
    }
}

/// The IEEE binary16 bits nearest to `x`.
pub fn f16_bits(x: f64) -> u16 {
    F16.encode(x) as u16
}

/// The value of IEEE binary16 bits.
pub fn f16_from_bits(bits: u16) -> f64 {
    F16.decode(bits as u32)
}

/// The bfloat16 bits nearest to `x`.
pub fn bf16_bits(x: f64) -> u16 {
    BF16.encode(x) as u16
}

/// The value of bfloat16 bits.
pub fn bf16_from_bits(bits: u16) -> f64 {
    BF16.decode(bits as u32)
}

/// `x` rounded to f32 (Rust's `as` conversion rounds to nearest, ties to even).
pub fn round_f32(x: f64) -> f64 {
    x as f32 as f64
}

/// `x` rounded to f16.
pub fn round_f16(x: f64) -> f64 {
    f16_from_bits(f16_bits(x))
}

/// `x` rounded to bf16.
pub fn round_bf16(x: f64) -> f64 {
    bf16_from_bits(bf16_bits(x))
}

/// `x` rounded to the precision of `dtype` (i64 rounds to the nearest integer, ties to even).
pub fn round_to(dtype: Dtype, x: f64) -> f64 {
    match dtype {
        Dtype::F32 => round_f32(x),
        Dtype::F16 => round_f16(x),
        Dtype::Bf16 => round_bf16(x),
        Dtype::I64 => x.round_ties_even(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_encodings() {
        let cases: &[(f64, u16)] = &[
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00), // halfway above the max rounds to infinity
            (1e6, 0x7c00),
            (6.103515625e-05, 0x0400),       // smallest normal
            (5.960464477539063e-08, 0x0001), // smallest subnormal
            (2.9e-08, 0x0000),
            (1.0 + 1.0 / 2048.0, 0x3c00), // tie rounds to even (down)
            (1.0 + 3.0 / 2048.0, 0x3c02), // tie rounds to even (up)
            (0.1, 0x2e66),
        ];
        for &(x, bits) in cases {
            assert_eq!(f16_bits(x), bits, "f16 bits of {x}");
        }
        assert!(f16_from_bits(0x7e00).is_nan());
        assert_eq!(f16_from_bits(0xfc00), f64::NEG_INFINITY);
    }

    #[test]
    fn bf16_known_encodings() {
        let cases: &[(f64, u16)] = &[
            (1.0, 0x3f80),
            (-1.0, 0xbf80),
            (3.140625, 0x4049),
            (std::f64::consts::PI, 0x4049),
            (1.0 + 1.0 / 256.0, 0x3f80), // tie to even
            (1.0 + 3.0 / 256.0, 0x3f82),
            (1e39, 0x7f80),
        ];
        for &(x, bits) in cases {
            assert_eq!(bf16_bits(x), bits, "bf16 bits of {x}");
        }
    }

    #[test]
    fn round_trips_all_finite_f16_values() {
        for bits in 0u16..=0xffff {
            let v = f16_from_bits(bits);
            if v.is_finite() {
                assert_eq!(f16_bits(v), bits, "bits {bits:#06x}");
            }
        }
    }

    #[test]
    fn bf16_matches_truncated_f32_rounding() {
        // For f32 inputs, RNE to bf16 equals the classic bit trick on the f32 bits.
        for i in 0..10_000u32 {
            let x = f32::from_bits(0x3000_0000u32.wrapping_add(i.wrapping_mul(104_729)));
            let b = x.to_bits();
            let expect = ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            assert_eq!(bf16_bits(x as f64), expect, "{x}");
        }
    }

    #[test]
    fn round_to_dtype() {
        assert_eq!(round_to(Dtype::F32, 0.1), 0.1f32 as f64);
        assert_eq!(round_to(Dtype::F16, 0.1), 0.0999755859375);
        assert_eq!(round_to(Dtype::Bf16, 0.1), 0.10009765625);
    }
}
