//! Token ids and log-probabilities in JSON as base64 of their little-endian bytes.
//!
//! A turn's response tokens and behaviour log-probabilities are most of a [`TurnRecord`] line
//! (800 tokens: about 4.8 KB of decimal ids and 9.6 KB of decimal floats). Written as a JSON
//! array, every number is parsed back one by one, and the floats' exact parsing is what a WAL
//! recovery spends its time on. Written here as one base64 string of the values' little-endian
//! bytes (4 bytes a value, 5.3 characters), a record is smaller and reads back at memory speed,
//! and every `f32` round-trips bit for bit, NaN and infinities included (which a JSON number
//! cannot hold).
//!
//! Reading accepts both forms: the array of numbers that run directories from before this
//! encoding hold, and the base64 string. A string that is not base64, or whose bytes are not a
//! whole number of values, is an error naming what is wrong.
//!
//! [`TurnRecord`]: crate::turn::TurnRecord

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serializer};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (RFC 4648, with `=` padding) of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let n = (c[0] as u32) << 16 | (c[1] as u32) << 8 | c[2] as u32;
        out.extend([18, 12, 6, 0].map(|s| ALPHABET[(n >> s & 63) as usize]));
    }
    match *chunks.remainder() {
        [a] => {
            let n = (a as u32) << 16;
            out.extend([
                ALPHABET[(n >> 18) as usize],
                ALPHABET[(n >> 12 & 63) as usize],
            ]);
            out.extend(b"==");
        }
        [a, b] => {
            let n = (a as u32) << 16 | (b as u32) << 8;
            out.extend([18, 12, 6].map(|s| ALPHABET[(n >> s & 63) as usize]));
            out.push(b'=');
        }
        _ => {}
    }
    String::from_utf8(out).expect("base64 is ASCII")
}

/// The value of each base64 character, 255 for any other byte.
const DECODE: [u8; 256] = {
    let mut t = [255u8; 256];
    let mut i = 0;
    while i < 64 {
        t[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// The bytes of standard base64 text (padding required, as [`encode`] writes it). The loop
/// over whole groups checks validity once per group (an invalid character decodes to 255, so
/// any high bit in the four is an error) and finds the culprit only on that slow path.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let s = text.as_bytes();
    if s.len() % 4 != 0 {
        return Err(format!(
            "base64 of {} characters, not a multiple of 4",
            s.len()
        ));
    }
    let pad = s.iter().rev().take_while(|&&b| b == b'=').count();
    if pad > 2 {
        return Err("base64 with more than two '=' at its end".into());
    }
    let bad = |from: usize| {
        let at = from
            + s[from..]
                .iter()
                .position(|&b| DECODE[b as usize] == 255)
                .unwrap_or(0);
        format!("byte {:?} at {at} is not a base64 character", s[at] as char)
    };
    let whole = if pad > 0 { s.len() - 4 } else { s.len() };
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (i, q) in s[..whole].chunks_exact(4).enumerate() {
        let v = [q[0], q[1], q[2], q[3]].map(|b| DECODE[b as usize]);
        if (v[0] | v[1] | v[2] | v[3]) & 0x80 != 0 {
            return Err(bad(i * 4));
        }
        let n = (v[0] as u32) << 18 | (v[1] as u32) << 12 | (v[2] as u32) << 6 | v[3] as u32;
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
    }
    if pad > 0 {
        let used = 4 - pad;
        let mut n = 0u32;
        for (j, &b) in s[whole..].iter().enumerate() {
            let v = if j < used { DECODE[b as usize] } else { 0 };
            if v == 255 {
                return Err(bad(whole));
            }
            n = n << 6 | v as u32;
        }
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..used - 1]);
    }
    Ok(out)
}

/// A value that packs into 4 little-endian bytes.
pub trait Packed: Copy + for<'de> Deserialize<'de> {
    /// What the value is, for errors.
    const NAME: &'static str;
    /// Its little-endian bytes.
    fn to_le(self) -> [u8; 4];
    /// The value of little-endian bytes.
    fn from_le(b: [u8; 4]) -> Self;
}

impl Packed for u32 {
    const NAME: &'static str = "token ids (u32)";
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_le(b: [u8; 4]) -> Self {
        u32::from_le_bytes(b)
    }
}

impl Packed for f32 {
    const NAME: &'static str = "log-probabilities (f32)";
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_le(b: [u8; 4]) -> Self {
        f32::from_le_bytes(b)
    }
}

/// The base64 text of `values`.
pub fn pack<T: Packed>(values: &[T]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le()).collect();
    encode(&bytes)
}

/// The values of base64 text that [`pack`] wrote.
pub fn unpack<T: Packed>(text: &str) -> Result<Vec<T>, String> {
    let bytes = decode(text)?;
    if bytes.len() % 4 != 0 {
        return Err(format!(
            "{} bytes of {}, not a multiple of 4",
            bytes.len(),
            T::NAME
        ));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| T::from_le([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// `#[serde(with = "crate::packed")]` on a `Vec<u32>` or `Vec<f32>` field.
pub fn serialize<T: Packed, S: Serializer>(values: &[T], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&pack(values))
}

/// Reads the base64 string, or the array of numbers of older files.
pub fn deserialize<'de, T: Packed, D: Deserializer<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct Either<T>(PhantomData<T>);
    impl<'de, T: Packed> Visitor<'de> for Either<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "{} as a base64 string or an array of numbers", T::NAME)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<T>, E> {
            unpack(v).map_err(|e| E::custom(format!("{}: {e}", T::NAME)))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(v) = seq.next_element()? {
                out.push(v);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Either(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Row {
        #[serde(with = "crate::packed")]
        ids: Vec<u32>,
        #[serde(with = "crate::packed")]
        lp: Vec<f32>,
    }

    #[test]
    fn base64_matches_the_rfc_vectors_and_reads_back() {
        // RFC 4648, section 10.
        for (plain, b64) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(plain.as_bytes()), b64);
            assert_eq!(decode(b64).unwrap(), plain.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
    }

    #[test]
    fn bad_base64_is_an_error_that_says_why() {
        assert!(decode("Zm9").unwrap_err().contains("multiple of 4"));
        assert!(decode("Zm*v").unwrap_err().contains("'*' at 2"));
        assert!(decode("Z===").unwrap_err().contains("more than two"));
        assert!(decode("Zm=v").unwrap_err().contains("not a base64"));
        // 3 bytes are not a whole f32.
        assert!(unpack::<f32>("Zm9v")
            .unwrap_err()
            .contains("3 bytes of log-probabilities"));
    }

    #[test]
    fn values_round_trip_bit_for_bit_and_old_arrays_still_read() {
        let row = Row {
            ids: vec![0, 1, 151_643, u32::MAX],
            lp: vec![
                -0.463_361_53,
                0.0,
                -0.0,
                f32::MIN_POSITIVE,
                f32::NEG_INFINITY,
                f32::NAN,
            ],
        };
        let text = serde_json::to_string(&row).unwrap();
        assert!(text.starts_with("{\"ids\":\""), "{text}");
        let back: Row = serde_json::from_str(&text).unwrap();
        assert_eq!(back.ids, row.ids);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.lp), bits(&row.lp));

        let old: Row = serde_json::from_str(r#"{"ids":[7,8],"lp":[-0.5,-1.25]}"#).unwrap();
        assert_eq!(
            old,
            Row {
                ids: vec![7, 8],
                lp: vec![-0.5, -1.25]
            }
        );

        let err = serde_json::from_str::<Row>(r#"{"ids":"Zm9v","lp":[]}"#).unwrap_err();
        assert!(
            err.to_string().contains("token ids (u32): 3 bytes"),
            "{err}"
        );
        let err = serde_json::from_str::<Row>(r#"{"ids":{"a":1},"lp":[]}"#).unwrap_err();
        assert!(
            err.to_string().contains("base64 string or an array"),
            "{err}"
        );
    }
}
