//! The wire format between the daemon and its worker child processes.
//!
//! Every message travels as one frame on the child's stdin (parent to child) or stdout (child to
//! parent):
//!
//! ```text
//! +---------+-----------------+----------------+----------------------+
//! | "KVWK"  | version: u16 LE | length: u32 LE | payload: JSON bytes  |
//! +---------+-----------------+----------------+----------------------+
//! ```
//!
//! The magic catches a child that writes anything but frames to stdout (a stray `printf` in
//! untrusted code, a crash banner); the version catches a daemon and a worker binary from
//! different builds; the length is checked against a maximum *before* anything is allocated, so a
//! garbage header cannot make the daemon reserve gigabytes. Every way a frame can be wrong is a
//! [`FrameError`] variant; decoding never panics.
//!
//! The payload is an envelope ([`ToChild`] or [`FromChild`]) around the pool's own request and
//! response types, which adds the health check (`Ping`/`Pong`), a start-up handshake (`Ready`)
//! and request ids so a reply is always matched to its request.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"KVWK";

/// Bumped whenever the framing or the envelopes change incompatibly.
pub const PROTOCOL_VERSION: u16 = 1;

/// Size of the fixed frame header: magic, version, payload length.
pub const HEADER_LEN: usize = 4 + 2 + 4;

/// Default upper bound on a payload. Generous for a CUBIN or a PTX module (tens to hundreds of
/// KiB), small enough that a lying header cannot exhaust memory.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 64 * 1024 * 1024;

/// Why a frame could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The stream ended inside a frame (a header or payload cut short).
    #[error("truncated frame: expected {expected} bytes of {part}, got {got}")]
    Truncated {
        /// Which part was cut short: "header" or "payload".
        part: &'static str,
        /// How many bytes that part needed.
        expected: usize,
        /// How many arrived before the end of the stream.
        got: usize,
    },
    /// The frame does not start with [`MAGIC`]: the peer wrote something that is not a frame.
    #[error("bad magic {found:02x?} (expected {MAGIC:02x?}): the peer wrote something that is not a frame")]
    BadMagic {
        /// The four bytes found instead.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version (a daemon and worker from different builds).
    #[error("protocol version mismatch: expected {expected}, found {found}")]
    VersionMismatch {
        /// [`PROTOCOL_VERSION`] of this build.
        expected: u16,
        /// The version in the frame.
        found: u16,
    },
    /// The header announces a payload larger than the allowed maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    Oversized {
        /// The announced (or, when encoding, actual) payload length.
        len: u64,
        /// The maximum in force.
        max: u32,
    },
    /// The payload is not the JSON of the expected message type.
    #[error("bad JSON payload: {0}")]
    BadJson(String),
    /// Reading or writing the underlying stream failed.
    #[error("I/O error on the worker channel: {0}")]
    Io(String),
}

/// Messages from the parent (daemon) to a worker child.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToChild<Req> {
    /// Health check: the child answers [`FromChild::Pong`] with the same nonce.
    Ping {
        /// Echoed back so a reply is matched to its ping.
        nonce: u64,
    },
    /// One unit of work for the handler.
    Request {
        /// Echoed back in the response.
        id: u64,
        /// The pool's request type.
        body: Req,
    },
    /// Finish cleanly: the child leaves its serve loop and exits with status 0.
    Shutdown,
}

/// Messages from a worker child to the parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromChild<Resp> {
    /// Sent once when the serve loop starts: the child is up and speaks this protocol.
    Ready {
        /// The worker role (for example "compile").
        role: String,
        /// The child's process id, for logs.
        pid: u32,
    },
    /// Answer to [`ToChild::Ping`].
    Pong {
        /// The ping's nonce.
        nonce: u64,
    },
    /// The handler's answer to [`ToChild::Request`].
    Response {
        /// The request's id.
        id: u64,
        /// The pool's response type.
        body: Resp,
    },
    /// The child could not understand a message (for example a request body of the wrong type);
    /// it exits after sending this.
    Error {
        /// What went wrong, for the failure report.
        message: String,
    },
}

/// Serialises `msg` into one complete frame (header and payload).
pub fn encode_frame<T: Serialize>(msg: &T, max_frame_bytes: u32) -> Result<Vec<u8>, FrameError> {
    let payload = serde_json::to_vec(msg).map_err(|e| FrameError::BadJson(e.to_string()))?;
    if payload.len() as u64 > u64::from(max_frame_bytes) {
        return Err(FrameError::Oversized {
            len: payload.len() as u64,
            max: max_frame_bytes,
        });
    }
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Writes one frame and flushes, so the peer sees it at once.
pub fn write_frame<W: Write, T: Serialize>(
    writer: &mut W,
    msg: &T,
    max_frame_bytes: u32,
) -> Result<(), FrameError> {
    let frame = encode_frame(msg, max_frame_bytes)?;
    writer.write_all(&frame).map_err(io_error)?;
    writer.flush().map_err(io_error)
}

/// Reads one frame. `Ok(None)` means the stream ended cleanly between frames (the peer closed
/// it); an end inside a frame is [`FrameError::Truncated`].
pub fn read_frame<R: Read, T: DeserializeOwned>(
    reader: &mut R,
    max_frame_bytes: u32,
) -> Result<Option<T>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let got = read_full(reader, &mut header)?;
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER_LEN {
        // Check the magic on what did arrive first: a child that printed "hi\n" and exited wrote
        // garbage, not a truncated frame, and the report should say so.
        if got >= MAGIC.len() && header[..4] != MAGIC {
            return Err(bad_magic(&header));
        }
        return Err(FrameError::Truncated {
            part: "header",
            expected: HEADER_LEN,
            got,
        });
    }
    let len = check_header(&header, max_frame_bytes)?;
    let mut payload = vec![0u8; len];
    let got = read_full(reader, &mut payload)?;
    if got < len {
        return Err(FrameError::Truncated {
            part: "payload",
            expected: len,
            got,
        });
    }
    serde_json::from_slice(&payload)
        .map(Some)
        .map_err(|e| FrameError::BadJson(one_line(&e.to_string())))
}

/// Decodes one frame from the start of `bytes`; returns the message and how many bytes it used.
pub fn decode_frame<T: DeserializeOwned>(
    bytes: &[u8],
    max_frame_bytes: u32,
) -> Result<(T, usize), FrameError> {
    let mut cursor = bytes;
    match read_frame(&mut cursor, max_frame_bytes)? {
        Some(msg) => Ok((msg, bytes.len() - cursor.len())),
        None => Err(FrameError::Truncated {
            part: "header",
            expected: HEADER_LEN,
            got: 0,
        }),
    }
}

/// `text` with its control characters escaped (`\n` as the two characters `\` `n`): serde's
/// messages quote the offending input, which may contain anything, and an error stays one line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Validates a complete header and returns the payload length.
fn check_header(header: &[u8; HEADER_LEN], max_frame_bytes: u32) -> Result<usize, FrameError> {
    if header[..4] != MAGIC {
        return Err(bad_magic(header));
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(FrameError::VersionMismatch {
            expected: PROTOCOL_VERSION,
            found: version,
        });
    }
    let len = u32::from_le_bytes([header[6], header[7], header[8], header[9]]);
    if len > max_frame_bytes {
        return Err(FrameError::Oversized {
            len: u64::from(len),
            max: max_frame_bytes,
        });
    }
    Ok(len as usize)
}

fn bad_magic(header: &[u8]) -> FrameError {
    FrameError::BadMagic {
        found: [header[0], header[1], header[2], header[3]],
    }
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read.
fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(e)),
        }
    }
    Ok(filled)
}

fn io_error(e: io::Error) -> FrameError {
    FrameError::Io(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    type Msg = ToChild<String>;
    const MAX: u32 = 1024;

    fn frame(magic: &[u8; 4], version: u16, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = magic.to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(payload);
        v
    }

    fn check_err(bytes: &[u8], expected: FrameError) {
        assert_eq!(decode_frame::<Msg>(bytes, MAX).unwrap_err(), expected);
    }

    #[test]
    fn round_trip_every_envelope() {
        let msgs: Vec<Msg> = vec![
            ToChild::Ping { nonce: 7 },
            ToChild::Request {
                id: 3,
                body: "__global__ void k() {}\n\u{1F600}".into(),
            },
            ToChild::Shutdown,
        ];
        let mut stream = Vec::new();
        for m in &msgs {
            write_frame(&mut stream, m, MAX).unwrap();
        }
        let mut reader = stream.as_slice();
        for m in &msgs {
            assert_eq!(
                read_frame::<_, Msg>(&mut reader, MAX).unwrap().as_ref(),
                Some(m)
            );
        }
        assert_eq!(read_frame::<_, Msg>(&mut reader, MAX).unwrap(), None);

        let reply: FromChild<Vec<u8>> = FromChild::Response {
            id: 3,
            body: vec![0, 255],
        };
        let bytes = encode_frame(&reply, MAX).unwrap();
        let (back, used) = decode_frame::<FromChild<Vec<u8>>>(&bytes, MAX).unwrap();
        assert_eq!((back, used), (reply, bytes.len()));
    }

    #[test]
    fn truncated_header_and_payload() {
        let full = encode_frame(&Msg::Shutdown, MAX).unwrap();
        check_err(
            &full[..6],
            FrameError::Truncated {
                part: "header",
                expected: HEADER_LEN,
                got: 6,
            },
        );
        check_err(
            &full[..full.len() - 1],
            FrameError::Truncated {
                part: "payload",
                expected: full.len() - HEADER_LEN,
                got: full.len() - HEADER_LEN - 1,
            },
        );
        check_err(
            &[],
            FrameError::Truncated {
                part: "header",
                expected: HEADER_LEN,
                got: 0,
            },
        );
    }

    #[test]
    fn bad_magic_even_when_short() {
        check_err(
            &frame(b"XXXX", PROTOCOL_VERSION, 2, b"{}"),
            FrameError::BadMagic { found: *b"XXXX" },
        );
        // A child that printed a short line and died: garbage, not a truncated frame.
        check_err(b"oops\n", FrameError::BadMagic { found: *b"oops" });
    }

    #[test]
    fn version_mismatch() {
        check_err(
            &frame(&MAGIC, PROTOCOL_VERSION + 1, 2, b"{}"),
            FrameError::VersionMismatch {
                expected: PROTOCOL_VERSION,
                found: PROTOCOL_VERSION + 1,
            },
        );
    }

    #[test]
    fn oversized_is_rejected_before_allocating() {
        check_err(
            &frame(&MAGIC, PROTOCOL_VERSION, u32::MAX, b""),
            FrameError::Oversized {
                len: u64::from(u32::MAX),
                max: MAX,
            },
        );
        let big = ToChild::Request {
            id: 1,
            body: "x".repeat(MAX as usize),
        };
        assert!(matches!(
            encode_frame(&big, MAX),
            Err(FrameError::Oversized { max: MAX, .. })
        ));
    }

    #[test]
    fn bad_json_payload() {
        for payload in [
            &b"not json"[..],
            b"{\"type\":\"launch_missiles\"}",
            // An escaped newline in an unknown variant name, which serde quotes in its message.
            b"{\"type\":\"launch\\nmissiles\"}",
            b"\xff\xfe",
        ] {
            let err = decode_frame::<Msg>(
                &frame(&MAGIC, PROTOCOL_VERSION, payload.len() as u32, payload),
                MAX,
            )
            .unwrap_err();
            assert!(matches!(err, FrameError::BadJson(_)), "{err:?}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
}
