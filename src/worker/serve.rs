//! The child side of the worker protocol: read frames from stdin, hand each request to a handler,
//! write the answer to stdout.
//!
//! stdout carries frames only. Handlers run untrusted or foreign code (NVRTC, CUDA, a candidate's
//! kernel) that might print, so [`serve`] first moves the frame channel to a private duplicate of
//! fd 1 and points fd 1 at stderr: a stray `printf` or `println!` then lands in the stderr tail of
//! a crash report instead of corrupting the stream.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicI32, Ordering};

use serde::{de::DeserializeOwned, Serialize};

use super::protocol::{read_frame, write_frame, FrameError, FromChild, ToChild};

/// The private frame descriptor once [`serve`] has redirected stdout; -1 before. The test worker
/// uses it to write deliberate garbage onto the frame channel.
pub(crate) static FRAME_FD: AtomicI32 = AtomicI32::new(-1);

/// Why a serve loop stopped with an error (the child then exits non-zero).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A frame from the parent could not be read or an answer could not be written.
    #[error("worker protocol error: {0}")]
    Frame(#[from] FrameError),
    /// stdin/stdout could not be set up.
    #[error("could not set up the worker's standard streams: {0}")]
    Stdio(String),
}

/// Serves requests on stdin/stdout until the parent sends `Shutdown` or closes stdin.
///
/// `max_frame_bytes` must match the parent's pool configuration.
pub fn serve<Req, Resp, F>(role: &str, max_frame_bytes: u32, handler: F) -> Result<(), ServeError>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnMut(Req) -> Resp,
{
    let frames = take_stdout()?;
    let stdin = std::io::stdin().lock();
    serve_on(role, stdin, frames, max_frame_bytes, handler)
}

/// The serve loop on explicit streams (what [`serve`] runs; also usable in-process in tests).
pub fn serve_on<Req, Resp, R, W, F>(
    role: &str,
    mut input: R,
    mut output: W,
    max_frame_bytes: u32,
    mut handler: F,
) -> Result<(), ServeError>
where
    Req: DeserializeOwned,
    Resp: Serialize,
    R: Read,
    W: Write,
    F: FnMut(Req) -> Resp,
{
    let ready: FromChild<Resp> = FromChild::Ready {
        role: role.to_string(),
        pid: std::process::id(),
    };
    write_frame(&mut output, &ready, max_frame_bytes)?;
    loop {
        let msg = match read_frame::<_, ToChild<Req>>(&mut input, max_frame_bytes) {
            Ok(Some(msg)) => msg,
            Ok(None) => return Ok(()),
            Err(e) => {
                // Tell the parent why before giving up; it kills us either way.
                let bye: FromChild<Resp> = FromChild::Error {
                    message: e.to_string(),
                };
                let _ = write_frame(&mut output, &bye, max_frame_bytes);
                return Err(e.into());
            }
        };
        let reply = match msg {
            ToChild::Ping { nonce } => FromChild::Pong { nonce },
            ToChild::Request { id, body } => FromChild::Response {
                id,
                body: handler(body),
            },
            ToChild::Shutdown => return Ok(()),
        };
        write_frame(&mut output, &reply, max_frame_bytes)?;
    }
}

/// Moves the frame channel off fd 1 (see the module docs) and returns it.
#[cfg(unix)]
fn take_stdout() -> Result<std::fs::File, ServeError> {
    use std::os::fd::FromRawFd;
    // Flush anything Rust buffered for fd 1 before it is repointed.
    let _ = std::io::stdout().flush();
    // SAFETY: plain descriptor calls on fds 1 and 2, which every process has open; the new
    // descriptor is owned by the returned File alone.
    unsafe {
        let fd = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
        if fd < 0 {
            return Err(ServeError::Stdio(format!(
                "dup(stdout): {}",
                std::io::Error::last_os_error()
            )));
        }
        if libc::dup2(2, 1) < 0 {
            return Err(ServeError::Stdio(format!(
                "dup2(stderr, stdout): {}",
                std::io::Error::last_os_error()
            )));
        }
        FRAME_FD.store(fd, Ordering::SeqCst);
        Ok(std::fs::File::from_raw_fd(fd))
    }
}

/// Without dup2 the frame channel stays on stdout, unprotected.
#[cfg(not(unix))]
fn take_stdout() -> Result<std::io::Stdout, ServeError> {
    Ok(std::io::stdout())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::protocol::{decode_frame, encode_frame};

    const MAX: u32 = 1 << 20;

    #[test]
    fn serve_answers_pings_and_requests_then_stops_on_shutdown() {
        let mut input = Vec::new();
        for m in [
            ToChild::Ping { nonce: 9 },
            ToChild::Request { id: 4, body: 20u32 },
            ToChild::Shutdown,
            ToChild::Request { id: 5, body: 1 },
        ] {
            input.extend(encode_frame(&m, MAX).unwrap());
        }
        let mut out = Vec::new();
        serve_on("test", input.as_slice(), &mut out, MAX, |x: u32| x + 1).unwrap();

        let mut rest = out.as_slice();
        let mut replies = Vec::new();
        while !rest.is_empty() {
            let (m, used) = decode_frame::<FromChild<u32>>(rest, MAX).unwrap();
            replies.push(m);
            rest = &rest[used..];
        }
        assert!(matches!(replies[0], FromChild::Ready { .. }));
        assert_eq!(
            replies[1..],
            [
                FromChild::Pong { nonce: 9 },
                FromChild::Response { id: 4, body: 21 }
            ]
        );
    }

    #[test]
    fn serve_reports_a_bad_request_and_stops() {
        let input = encode_frame(
            &ToChild::Request {
                id: 1,
                body: "not a number",
            },
            MAX,
        )
        .unwrap();
        let mut out = Vec::new();
        let err = serve_on("test", input.as_slice(), &mut out, MAX, |x: u32| x).unwrap_err();
        assert!(matches!(err, ServeError::Frame(FrameError::BadJson(_))));
        let (_, used) = decode_frame::<FromChild<u32>>(&out, MAX).unwrap();
        let (last, _) = decode_frame::<FromChild<u32>>(&out[used..], MAX).unwrap();
        assert!(matches!(last, FromChild::Error { .. }));
    }
}
