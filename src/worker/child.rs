//! One live worker child process as the parent sees it: the process, a writer thread feeding its
//! stdin, a reader thread decoding frames from its stdout, and a thread keeping the tail of its
//! stderr for crash reports.
//!
//! Why threads: a pipe read has no timeout, and a child that stops reading its stdin can block a
//! write forever. With the I/O on helper threads, the requesting thread only ever waits on a
//! channel with a deadline, so no misbehaving child can hold it past that deadline.

use std::collections::VecDeque;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use serde::de::DeserializeOwned;

use super::pool::{ExitReport, WorkerCommand, WorkerFailure};
use super::protocol::{read_frame, FrameError, FromChild};

/// What the reader thread saw on the child's stdout.
pub(crate) enum Incoming<Resp> {
    /// A well-formed frame.
    Msg(FromChild<Resp>),
    /// A malformed frame; the stream is out of sync, so the reader stops after this.
    Bad(FrameError),
    /// The child closed its stdout (normally: it exited).
    Eof,
}

/// A running child with its helper threads.
pub(crate) struct ChildProc<Resp> {
    process: std::process::Child,
    /// Frames for the writer thread. Dropping it closes the child's stdin.
    to_child: Option<Sender<Vec<u8>>>,
    from_child: Receiver<Incoming<Resp>>,
    stderr_tail: Arc<Mutex<TailBuffer>>,
    /// Disconnects when the stderr thread has seen the end of the stream.
    stderr_done: Receiver<()>,
}

/// Outcome of waiting for the next message.
pub(crate) enum Next<Resp> {
    Msg(FromChild<Resp>),
    Bad(FrameError),
    Eof,
    TimedOut,
}

impl<Resp: DeserializeOwned + Send + 'static> ChildProc<Resp> {
    /// Starts the child and its helper threads. Does not wait for the `Ready` handshake.
    pub(crate) fn spawn(
        command: &WorkerCommand,
        max_frame_bytes: u32,
        stderr_tail_bytes: usize,
    ) -> Result<Self, WorkerFailure> {
        let mut process = Command::new(&command.program)
            .args(&command.args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| WorkerFailure::Spawn {
                program: command.program.clone(),
                reason: e.to_string(),
            })?;
        // All three pipes were requested above, so they are present.
        let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            let _ = process.kill();
            let _ = process.wait();
            return Err(WorkerFailure::Spawn {
                program: command.program.clone(),
                reason: "child pipes missing".into(),
            });
        };

        // Requests are written one at a time, so a small queue is plenty.
        let (to_child, writer_rx) = bounded::<Vec<u8>>(4);
        thread::Builder::new()
            .name("kevin-worker-stdin".into())
            .spawn(move || {
                use std::io::Write;
                for bytes in writer_rx {
                    if stdin.write_all(&bytes).and_then(|_| stdin.flush()).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| spawn_thread_failure(command, e))?;

        // Bounded so a child flooding us with frames cannot grow memory; the reader just blocks.
        let (reader_tx, from_child) = bounded::<Incoming<Resp>>(16);
        thread::Builder::new()
            .name("kevin-worker-stdout".into())
            .spawn(move || loop {
                let item = match read_frame::<_, FromChild<Resp>>(&mut stdout, max_frame_bytes) {
                    Ok(Some(msg)) => Incoming::Msg(msg),
                    Ok(None) => Incoming::Eof,
                    Err(e) => Incoming::Bad(e),
                };
                let last = !matches!(item, Incoming::Msg(_));
                if reader_tx.send(item).is_err() || last {
                    break;
                }
            })
            .map_err(|e| spawn_thread_failure(command, e))?;

        let stderr_tail = Arc::new(Mutex::new(TailBuffer::new(stderr_tail_bytes)));
        let tail = Arc::clone(&stderr_tail);
        let (done_tx, stderr_done) = bounded::<()>(0);
        thread::Builder::new()
            .name("kevin-worker-stderr".into())
            .spawn(move || {
                let _done = done_tx; // dropped when the stream ends
                let mut buf = [0u8; 4096];
                loop {
                    match stderr.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => lock(&tail).push(&buf[..n]),
                    }
                }
            })
            .map_err(|e| spawn_thread_failure(command, e))?;

        Ok(ChildProc {
            process,
            to_child: Some(to_child),
            from_child,
            stderr_tail,
            stderr_done,
        })
    }
}

impl<Resp> ChildProc<Resp> {
    /// Hands a complete frame to the writer thread. A failure here means the writer has stopped
    /// (the child closed its stdin); the caller learns why from the next [`Self::next`].
    pub(crate) fn send(&self, frame: Vec<u8>) {
        if let Some(tx) = &self.to_child {
            let _ = tx.send(frame);
        }
    }

    /// Waits for the next message until `deadline`.
    pub(crate) fn next(&self, deadline: Instant) -> Next<Resp> {
        match self.from_child.recv_deadline(deadline) {
            Ok(Incoming::Msg(m)) => Next::Msg(m),
            Ok(Incoming::Bad(e)) => Next::Bad(e),
            Ok(Incoming::Eof) | Err(RecvTimeoutError::Disconnected) => Next::Eof,
            Err(RecvTimeoutError::Timeout) => Next::TimedOut,
        }
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        self.to_child = None;
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// After the child closed its stdout: its exit status, killing it if it lingers.
    pub(crate) fn reap(&mut self, grace: Duration) -> ExitReport {
        self.to_child = None;
        let deadline = Instant::now() + grace;
        loop {
            match self.process.try_wait() {
                Ok(Some(status)) => return exit_report(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                _ => {
                    // Closed stdout but kept running: it is not a worker any more.
                    let _ = self.process.kill();
                    return match self.process.wait() {
                        Ok(status) => exit_report(status),
                        Err(_) => ExitReport::default(),
                    };
                }
            }
        }
    }

    /// The last bytes the child wrote to stderr, waiting briefly for the stream to end so a
    /// dying child's last words are included.
    pub(crate) fn stderr_tail(&self, wait: Duration) -> String {
        let _ = self.stderr_done.recv_timeout(wait);
        lock(&self.stderr_tail).to_string_lossy()
    }

    /// Asks the child to exit by closing its stdin after `goodbye`; kills it if it has not exited
    /// within `grace`.
    pub(crate) fn shutdown(&mut self, goodbye: Option<Vec<u8>>, grace: Duration) {
        if let Some(frame) = goodbye {
            self.send(frame);
        }
        self.to_child = None;
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.process.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}

fn spawn_thread_failure(command: &WorkerCommand, e: std::io::Error) -> WorkerFailure {
    WorkerFailure::Spawn {
        program: command.program.clone(),
        reason: format!("could not start an I/O thread: {e}"),
    }
}

fn exit_report(status: ExitStatus) -> ExitReport {
    #[cfg(unix)]
    let signal = std::os::unix::process::ExitStatusExt::signal(&status);
    #[cfg(not(unix))]
    let signal = None;
    ExitReport {
        code: status.code(),
        signal,
    }
}

/// Locks a mutex, ignoring poisoning: the data behind these locks stays valid even if a holder
/// panicked (it is a byte buffer or a slot that is re-checked on use).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps the last `cap` bytes written to it.
pub(crate) struct TailBuffer {
    cap: usize,
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl TailBuffer {
    pub(crate) fn new(cap: usize) -> Self {
        TailBuffer {
            cap,
            bytes: VecDeque::with_capacity(cap.min(64 * 1024)),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.bytes.extend(data);
        let excess = self.bytes.len().saturating_sub(self.cap);
        self.bytes.drain(..excess);
        self.dropped += excess as u64;
    }

    pub(crate) fn to_string_lossy(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        if self.dropped > 0 {
            format!("[... {} earlier bytes dropped]\n{text}", self.dropped)
        } else {
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TailBuffer;

    #[test]
    fn tail_buffer_keeps_the_end() {
        let mut t = TailBuffer::new(4);
        t.push(b"ab");
        assert_eq!(t.to_string_lossy(), "ab");
        t.push(b"cdef");
        assert_eq!(t.to_string_lossy(), "[... 2 earlier bytes dropped]\ncdef");
    }
}
