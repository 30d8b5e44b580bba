//! Dedicated threads for blocking work (policy forward passes, the learner, compile/verify/profile
//! calls, file writes), so nothing blocking ever runs on an async executor thread.
//!
//! Jobs go to the threads over a crossbeam channel; each job's result comes back over a tokio
//! oneshot that async code awaits. A panic inside a job is caught on the worker thread (the thread
//! lives on) and comes back as [`JobPanic`], so a component bug fails one request, is counted, and
//! takes nothing else down. The channel is unbounded because callers bound what they submit:
//! every submitter holds a mailbox credit ([`crate::pipeline::mailbox`]) while its job is queued.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{unbounded, Sender};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

/// A job panicked; the message is the panic's payload when it was a string.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPanic(pub String);

/// A fixed set of named worker threads.
#[derive(Debug, Clone)]
pub struct BlockingPool {
    name: String,
    jobs: Sender<Job>,
    panics: Arc<AtomicU64>,
}

impl BlockingPool {
    /// Starts `threads` threads named `<name>-<i>`. They exit when every handle is dropped.
    pub fn new(name: &str, threads: usize) -> BlockingPool {
        let (tx, rx) = unbounded::<Job>();
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .expect("spawning a worker thread");
        }
        BlockingPool {
            name: name.to_string(),
            jobs: tx,
            panics: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Runs `f` on a pool thread; await the receiver for its result.
    pub fn run<T, F>(&self, f: F) -> oneshot::Receiver<Result<T, JobPanic>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let panics = self.panics.clone();
        let name = self.name.clone();
        let job: Job = Box::new(move || {
            let result = catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
                panics.fetch_add(1, Ordering::Relaxed);
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                tracing::error!(pool = %name, panic = %msg, "a job panicked; the pool thread lives on");
                JobPanic(msg)
            });
            // The receiver may be gone (its requester gave up); nothing to do then.
            let _ = tx.send(result);
        });
        if self.jobs.send(job).is_err() {
            tracing::error!(pool = %self.name, "pool threads are gone");
        }
        rx
    }

    /// Panics caught so far.
    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn results_and_panics_come_back() {
        let pool = BlockingPool::new("test", 2);
        assert_eq!(pool.run(|| 2 + 2).await.unwrap(), Ok(4));
        let r = pool.run(|| -> u32 { panic!("boom") }).await.unwrap();
        assert_eq!(r, Err(JobPanic("boom".into())));
        assert_eq!(pool.panics(), 1);
        // The thread survived.
        assert_eq!(pool.run(|| 5).await.unwrap(), Ok(5));
    }
}
