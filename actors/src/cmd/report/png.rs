//! A minimal PNG codec for the report's plots: 8-bit RGB, no interlace, filter 0 on every row,
//! the image data zlib-compressed by flate2 (already in the build through burn; the `png` crate
//! would switch on a feature of a crate burn shares and so rebuild all of burn once per target
//! directory). [`decode_rgb`] reads back exactly what [`encode_rgb`] writes, checking every CRC,
//! for the tests.

use std::io::{Read, Write};

const SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend((data.len() as u32).to_be_bytes());
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend(kind);
    out.extend(data);
    out.extend(crc.sum().to_be_bytes());
}

/// `rgb` (row-major, `width * height * 3` bytes) as a PNG file's bytes.
pub fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, String> {
    let row = width as usize * 3;
    if rgb.len() != row * height as usize {
        return Err(format!(
            "{} bytes for a {width}x{height} RGB image ({} expected)",
            rgb.len(),
            row * height as usize
        ));
    }
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend(width.to_be_bytes());
    ihdr.extend(height.to_be_bytes());
    // Bit depth 8, colour type 2 (RGB), deflate, filter method 0, no interlace.
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    for line in rgb.chunks_exact(row.max(1)) {
        z.write_all(&[0]).map_err(|e| e.to_string())?;
        z.write_all(line).map_err(|e| e.to_string())?;
    }
    let idat = z.finish().map_err(|e| e.to_string())?;
    let mut out = SIGNATURE.to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    Ok(out)
}

/// Reads a PNG written by [`encode_rgb`]: (width, height, RGB bytes). Other PNGs (palettes,
/// alpha, 16 bits, interlace, row filters other than 0) are refused with the reason.
pub fn decode_rgb(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), String> {
    let mut rest = bytes
        .strip_prefix(SIGNATURE.as_slice())
        .ok_or("no PNG signature")?;
    let (mut size, mut idat) = (None, Vec::new());
    loop {
        if rest.len() < 12 {
            return Err("truncated chunk".into());
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if rest.len() < 12 + len {
            return Err(format!("chunk of {len} bytes is truncated"));
        }
        let (kind, data) = (&rest[4..8], &rest[8..8 + len]);
        let stored =
            u32::from_be_bytes([rest[8 + len], rest[9 + len], rest[10 + len], rest[11 + len]]);
        let mut crc = flate2::Crc::new();
        crc.update(kind);
        crc.update(data);
        if crc.sum() != stored {
            return Err(format!(
                "bad CRC of chunk {}",
                String::from_utf8_lossy(kind)
            ));
        }
        match kind {
            b"IHDR" => {
                if data.len() != 13 || data[8..] != [8, 2, 0, 0, 0] {
                    return Err("not an 8-bit RGB non-interlaced image".into());
                }
                let w = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
                let h = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
                size = Some((w, h));
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        rest = &rest[12 + len..];
    }
    let (w, h) = size.ok_or("no IHDR chunk")?;
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(idat.as_slice())
        .read_to_end(&mut raw)
        .map_err(|e| format!("image data: {e}"))?;
    let row = w as usize * 3;
    if raw.len() != (row + 1) * h as usize {
        return Err(format!(
            "{} bytes of image data for {w}x{h}, expected {}",
            raw.len(),
            (row + 1) * h as usize
        ));
    }
    let mut rgb = Vec::with_capacity(row * h as usize);
    for line in raw.chunks_exact(row + 1) {
        if line[0] != 0 {
            return Err(format!("row filter {} (only 0 is written)", line[0]));
        }
        rgb.extend_from_slice(&line[1..]);
    }
    Ok((w, h, rgb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption_is_caught() {
        let (w, h) = (7u32, 5u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let bytes = encode_rgb(w, h, &rgb).unwrap();
        assert_eq!(decode_rgb(&bytes).unwrap(), (w, h, rgb.clone()));
        let mut bad = bytes.clone();
        let at = bad.len() / 2;
        bad[at] ^= 0x40;
        assert!(decode_rgb(&bad).unwrap_err().contains("CRC"));
        assert!(encode_rgb(w, h, &rgb[1..])
            .unwrap_err()
            .contains("expected"));
    }
}
