//! [`WorkerPool`]: N worker child processes behind a blocking, thread-safe request API.
//!
//! Each request goes to one idle child and gets an answer or a [`WorkerFailure`] by its deadline.
//! A child that times out, crashes or breaks the protocol is killed (SIGKILL) and respawned, and
//! the failure is returned for *that* request only: the other children, and the requests they are
//! serving, are untouched. A replacement is in service once it has said `Ready` and answered a
//! health check (`Ping`); the time from detecting the failure to that answer is the respawn
//! latency the stats record. The pool is meant for dedicated blocking threads (the actors hand work
//! over through crossbeam channels), never for an async executor thread.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::child::{lock, ChildProc, Next};
use super::protocol::{encode_frame, FromChild, ToChild, DEFAULT_MAX_FRAME_BYTES};

/// How to start one worker child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCommand {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables (added to the parent's environment).
    pub env: Vec<(String, String)>,
}

impl WorkerCommand {
    /// `program worker --role <role>`: the hidden subcommand of the `kevin` binary (see
    /// [`super::child_main_from_args`]).
    pub fn kevin_role(program: impl Into<PathBuf>, role: &str) -> Self {
        WorkerCommand {
            program: program.into(),
            args: vec!["worker".into(), "--role".into(), role.into()],
            env: Vec::new(),
        }
    }
}

/// Pool sizing and limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Number of child processes (at least 1).
    pub workers: usize,
    /// Default deadline of one request, from sending it to receiving the answer.
    pub request_timeout: Duration,
    /// How long a new child may take to say `Ready`.
    pub spawn_timeout: Duration,
    /// How much of a child's stderr is kept for a crash report.
    pub stderr_tail_bytes: usize,
    /// Largest frame accepted in either direction.
    pub max_frame_bytes: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            workers: 1,
            request_timeout: Duration::from_secs(10),
            spawn_timeout: Duration::from_secs(10),
            stderr_tail_bytes: 8 * 1024,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        }
    }
}

/// How a child process ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitReport {
    /// Exit code, when it exited on its own.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it (6 = SIGABRT, 9 = SIGKILL, 11 = SIGSEGV).
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(sig)) => write!(f, "signal {sig}{}", signal_name(sig)),
            (None, None) => write!(f, "unknown exit status"),
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => " (SIGILL)",
        6 => " (SIGABRT)",
        7 => " (SIGBUS)",
        8 => " (SIGFPE)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        15 => " (SIGTERM)",
        _ => "",
    }
}

/// Why a request got no answer. This is data about the request (usually the candidate's fault),
/// not an error of the pool: the pool has already replaced the child.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum WorkerFailure {
    /// No answer by the deadline; the child was killed.
    #[error("worker timed out after {limit:?} and was killed")]
    Timeout {
        /// The deadline that passed.
        limit: Duration,
    },
    /// The child died while serving the request.
    #[error("worker crashed ({exit}); stderr tail:\n{stderr_tail}")]
    Crashed {
        /// How it ended.
        exit: ExitReport,
        /// The end of what it wrote to stderr.
        stderr_tail: String,
    },
    /// The child answered with something that is not a valid reply; it was killed.
    #[error("worker broke the protocol: {reason}")]
    Protocol {
        /// What was wrong.
        reason: String,
        /// The end of what it wrote to stderr.
        stderr_tail: String,
    },
    /// No child could be started to serve the request.
    #[error("could not start worker {program:?}: {reason}")]
    Spawn {
        /// The executable.
        program: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Counters of a pool's life, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Requests answered (successfully or not), pings excluded.
    pub requests: u64,
    /// Requests that got a response.
    pub succeeded: u64,
    /// Requests or pings that hit their deadline.
    pub timeouts: u64,
    /// Requests or pings during which the child died.
    pub crashes: u64,
    /// Requests or pings answered with garbage.
    pub protocol_errors: u64,
    /// Failed attempts to start a child.
    pub spawn_failures: u64,
    /// Children started to replace a dead one.
    pub respawns: u64,
    /// Sum of respawn latencies (failure detected until the replacement answered its health
    /// check), for the mean.
    pub respawn_latency_total: Duration,
    /// Longest respawn latency.
    pub respawn_latency_max: Duration,
    /// Most recent respawn latency.
    pub respawn_latency_last: Duration,
    /// Children replaced after an answer that said they must go (see [`WorkerPool::retire_when`]).
    #[serde(default)]
    pub retired: u64,
    /// The latest respawn latencies, oldest first (at most [`RECENT_RESPAWNS`]), for percentiles.
    pub respawn_latency_recent: VecDeque<Duration>,
}

/// How many respawn latencies [`PoolStats::respawn_latency_recent`] keeps.
pub const RECENT_RESPAWNS: usize = 4096;

impl PoolStats {
    /// Mean respawn latency, if there was any respawn.
    pub fn respawn_latency_mean(&self) -> Option<Duration> {
        (self.respawns > 0).then(|| self.respawn_latency_total / self.respawns as u32)
    }

    /// Median of the recent respawn latencies, if there was any respawn.
    pub fn respawn_latency_median(&self) -> Option<Duration> {
        let mut v: Vec<Duration> = self.respawn_latency_recent.iter().copied().collect();
        v.sort_unstable();
        match v.len() {
            0 => None,
            n if n % 2 == 1 => Some(v[n / 2]),
            n => Some((v[n / 2 - 1] + v[n / 2]) / 2),
        }
    }

    fn record_respawn(&mut self, latency: Duration) {
        self.respawns += 1;
        self.respawn_latency_total += latency;
        self.respawn_latency_max = self.respawn_latency_max.max(latency);
        self.respawn_latency_last = latency;
        if self.respawn_latency_recent.len() == RECENT_RESPAWNS {
            self.respawn_latency_recent.pop_front();
        }
        self.respawn_latency_recent.push_back(latency);
    }
}

/// One worker's place in the pool; `child` is `None` while it is dead and not yet replaced.
struct Slot<Resp> {
    child: Option<ChildProc<Resp>>,
}

/// A pool of worker child processes serving `Req -> Resp` (see the module docs).
pub struct WorkerPool<Req, Resp> {
    command: WorkerCommand,
    config: PoolConfig,
    slots: Vec<Mutex<Slot<Resp>>>,
    /// Indices of idle slots: a request takes one, and gives it back when done. Capacity N, so
    /// returning an index never blocks.
    idle_tx: Sender<usize>,
    idle_rx: Receiver<usize>,
    stats: Mutex<PoolStats>,
    next_id: std::sync::atomic::AtomicU64,
    retire: Option<fn(&Resp) -> bool>,
    _req: PhantomData<fn(&Req)>,
}

/// What one exchange waits for.
enum Expect {
    Response(u64),
    Pong(u64),
}

impl<Req, Resp> WorkerPool<Req, Resp>
where
    Req: Serialize,
    Resp: DeserializeOwned + Send + 'static,
{
    /// Starts `config.workers` children and waits until each has said `Ready`.
    pub fn new(command: WorkerCommand, config: PoolConfig) -> Result<Self, WorkerFailure> {
        let n = config.workers.max(1);
        let (idle_tx, idle_rx) = bounded(n);
        let pool = WorkerPool {
            command,
            config,
            slots: (0..n).map(|_| Mutex::new(Slot { child: None })).collect(),
            idle_tx,
            idle_rx,
            stats: Mutex::new(PoolStats::default()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            retire: None,
            _req: PhantomData,
        };
        for (i, slot) in pool.slots.iter().enumerate() {
            lock(slot).child = Some(pool.start_child()?);
            let _ = pool.idle_tx.send(i);
        }
        Ok(pool)
    }

    /// Replaces a child after any answer for which `retire` is true (a GPU worker whose context a
    /// kernel poisoned answers with the crash, then must not serve again).
    pub fn retire_when(mut self, retire: fn(&Resp) -> bool) -> Self {
        self.retire = Some(retire);
        self
    }

    /// Sends `req` to an idle worker (waiting for one if all are busy) with the default deadline.
    pub fn request(&self, req: &Req) -> Result<Resp, WorkerFailure> {
        self.request_with_timeout(req, self.config.request_timeout)
    }

    /// Like [`Self::request`] with an explicit deadline, counted from when a worker takes it.
    pub fn request_with_timeout(&self, req: &Req, limit: Duration) -> Result<Resp, WorkerFailure> {
        let id = self.fresh_id();
        let msg = ToChild::Request { id, body: req };
        let frame = encode_frame(&msg, self.config.max_frame_bytes).map_err(|e| {
            WorkerFailure::Protocol {
                reason: format!("request could not be encoded: {e}"),
                stderr_tail: String::new(),
            }
        })?;
        let idx = self.take_idle();
        let result = self.exchange(idx, frame, Expect::Response(id), limit);
        if let (Some(retire), Ok(FromChild::Response { body, .. })) = (self.retire, &result) {
            if retire(body) {
                self.replace(idx);
            }
        }
        let _ = self.idle_tx.send(idx);
        let mut stats = lock(&self.stats);
        stats.requests += 1;
        let result = result.and_then(|msg| match msg {
            FromChild::Response { body, .. } => Ok(body),
            // exchange() returns only the message it was asked to expect.
            other => Err(WorkerFailure::Protocol {
                reason: format!("expected a response, got {}", describe(&other)),
                stderr_tail: String::new(),
            }),
        });
        stats.succeeded += u64::from(result.is_ok());
        result
    }

    /// Health check of one idle worker: its ping round-trip time.
    pub fn ping(&self, limit: Duration) -> Result<Duration, WorkerFailure> {
        let idx = self.take_idle();
        let result = self.ping_slot(idx, limit);
        let _ = self.idle_tx.send(idx);
        result
    }

    /// Health check of every worker, one after the other (each waits for its worker to finish
    /// what it is doing). A dead worker is respawned by its ping.
    pub fn ping_all(&self, limit: Duration) -> Vec<Result<Duration, WorkerFailure>> {
        (0..self.slots.len())
            .map(|i| self.ping_slot(i, limit))
            .collect()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        lock(&self.stats).clone()
    }

    /// Number of worker slots.
    pub fn workers(&self) -> usize {
        self.slots.len()
    }

    /// The configuration the pool runs with.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Process ids of the live children (for tests and logs).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.slots
            .iter()
            .map(|s| lock(s).child.as_ref().map(ChildProc::pid))
            .collect()
    }

    /// A fresh nonce and the ping frame that carries it.
    fn ping_frame(&self) -> Result<(u64, Vec<u8>), WorkerFailure> {
        let nonce = self.fresh_id();
        let frame = encode_frame(&ToChild::<Req>::Ping { nonce }, self.config.max_frame_bytes)
            .map_err(|e| WorkerFailure::Protocol {
                reason: e.to_string(),
                stderr_tail: String::new(),
            })?;
        Ok((nonce, frame))
    }

    fn ping_slot(&self, idx: usize, limit: Duration) -> Result<Duration, WorkerFailure> {
        let (nonce, frame) = self.ping_frame()?;
        let start = Instant::now();
        self.exchange(idx, frame, Expect::Pong(nonce), limit)
            .map(|_| start.elapsed())
    }

    fn take_idle(&self) -> usize {
        // The pool holds a sender, so the channel never disconnects while `self` lives.
        self.idle_rx.recv().unwrap_or(0)
    }

    fn fresh_id(&self) -> u64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends one frame to slot `idx` and waits for the expected answer. On any failure the child
    /// is killed and a replacement started before returning.
    fn exchange(
        &self,
        idx: usize,
        frame: Vec<u8>,
        expect: Expect,
        limit: Duration,
    ) -> Result<FromChild<Resp>, WorkerFailure> {
        let mut slot = lock(&self.slots[idx]);
        if slot.child.is_none() {
            slot.child = Some(self.respawn(Instant::now())?);
        }
        let Some(child) = slot.child.as_mut() else {
            return Err(WorkerFailure::Spawn {
                program: self.command.program.clone(),
                reason: "worker slot empty after respawn".into(),
            });
        };
        child.send(frame);
        let deadline = Instant::now() + limit;
        // Exactly one message settles the exchange: children are killed after any failure, so
        // a stale reply to an earlier request can never be waiting here.
        let answer = child.next(deadline);
        let detected = Instant::now();
        let failure = match answer {
            Next::Msg(msg) => match (&expect, &msg) {
                (Expect::Response(want), FromChild::Response { id, .. }) if id == want => {
                    return Ok(msg)
                }
                (Expect::Pong(want), FromChild::Pong { nonce }) if nonce == want => return Ok(msg),
                (_, FromChild::Error { message }) => {
                    protocol(child, format!("worker reported: {message}"))
                }
                _ => protocol(child, format!("unexpected message {}", describe(&msg))),
            },
            Next::Bad(e) => protocol(child, e.to_string()),
            Next::Eof => {
                let exit = child.reap(Duration::from_secs(1));
                WorkerFailure::Crashed {
                    exit,
                    stderr_tail: child.stderr_tail(Duration::from_millis(200)),
                }
            }
            Next::TimedOut => {
                child.kill();
                WorkerFailure::Timeout { limit }
            }
        };
        child.kill();
        {
            let mut stats = lock(&self.stats);
            match failure {
                WorkerFailure::Timeout { .. } => stats.timeouts += 1,
                WorkerFailure::Crashed { .. } => stats.crashes += 1,
                WorkerFailure::Protocol { .. } => stats.protocol_errors += 1,
                WorkerFailure::Spawn { .. } => stats.spawn_failures += 1,
            }
        }
        tracing::warn!(worker = idx, %failure, "worker failed; respawning");
        // Respawn now so the next request finds a ready worker; if that fails, the slot stays
        // empty and the next request retries (and reports Spawn if it fails again).
        slot.child = self.respawn(detected).ok();
        Err(failure)
    }

    /// Kills the child of slot `idx` after a good answer and starts its replacement.
    fn replace(&self, idx: usize) {
        let mut slot = lock(&self.slots[idx]);
        let since = Instant::now();
        if let Some(mut child) = slot.child.take() {
            child.kill();
            child.reap(Duration::from_secs(1));
        }
        lock(&self.stats).retired += 1;
        slot.child = self.respawn(since).ok();
    }

    /// Starts a replacement child and health-checks it, recording the latency from `since` (when
    /// the failure was detected) to its answer.
    fn respawn(&self, since: Instant) -> Result<ChildProc<Resp>, WorkerFailure> {
        let child = self.start_child().and_then(|c| self.health_check(c));
        let latency = since.elapsed();
        let mut stats = lock(&self.stats);
        match &child {
            Ok(_) => stats.record_respawn(latency),
            Err(_) => stats.spawn_failures += 1,
        }
        child
    }

    /// One ping round trip on a fresh child (within the spawn timeout); a child that fails it is
    /// killed and reported as a spawn failure.
    fn health_check(&self, mut child: ChildProc<Resp>) -> Result<ChildProc<Resp>, WorkerFailure> {
        let (nonce, frame) = self.ping_frame()?;
        child.send(frame);
        let reason = match child.next(Instant::now() + self.config.spawn_timeout) {
            Next::Msg(FromChild::Pong { nonce: n }) if n == nonce => return Ok(child),
            Next::Msg(other) => format!("health check answered with {}", describe(&other)),
            Next::Bad(e) => format!("bad health-check answer: {e}"),
            Next::Eof => format!(
                "exited before its health check ({})",
                child.reap(Duration::ZERO)
            ),
            Next::TimedOut => format!(
                "no health-check answer within {:?}",
                self.config.spawn_timeout
            ),
        };
        let tail = child.stderr_tail(Duration::from_millis(200));
        child.kill();
        Err(WorkerFailure::Spawn {
            program: self.command.program.clone(),
            reason: format!("{reason}; stderr tail:\n{tail}"),
        })
    }

    /// Spawns a child and waits for its `Ready`.
    fn start_child(&self) -> Result<ChildProc<Resp>, WorkerFailure> {
        let mut child = ChildProc::spawn(
            &self.command,
            self.config.max_frame_bytes,
            self.config.stderr_tail_bytes,
        )?;
        let deadline = Instant::now() + self.config.spawn_timeout;
        let reason = match child.next(deadline) {
            Next::Msg(FromChild::Ready { .. }) => return Ok(child),
            Next::Msg(other) => format!("expected Ready, got {}", describe(&other)),
            Next::Bad(e) => format!("bad handshake: {e}"),
            Next::Eof => format!("exited during start-up ({})", child.reap(Duration::ZERO)),
            Next::TimedOut => format!("no Ready within {:?}", self.config.spawn_timeout),
        };
        let tail = child.stderr_tail(Duration::from_millis(200));
        child.kill();
        Err(WorkerFailure::Spawn {
            program: self.command.program.clone(),
            reason: format!("{reason}; stderr tail:\n{tail}"),
        })
    }
}

impl<Req, Resp> Drop for WorkerPool<Req, Resp> {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(mut child) = lock(slot).child.take() {
                let bye = encode_frame(&ToChild::<()>::Shutdown, self.config.max_frame_bytes).ok();
                child.shutdown(bye, Duration::from_millis(500));
            }
        }
    }
}

fn protocol<Resp>(child: &mut ChildProc<Resp>, reason: String) -> WorkerFailure {
    child.kill();
    WorkerFailure::Protocol {
        reason,
        stderr_tail: child.stderr_tail(Duration::from_millis(200)),
    }
}

fn describe<Resp>(msg: &FromChild<Resp>) -> String {
    match msg {
        FromChild::Ready { role, pid } => format!("Ready(role={role}, pid={pid})"),
        FromChild::Pong { nonce } => format!("Pong({nonce})"),
        FromChild::Response { id, .. } => format!("Response(id={id})"),
        FromChild::Error { message } => format!("Error({message})"),
    }
}
