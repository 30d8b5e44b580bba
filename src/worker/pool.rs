//! [`WorkerPool`]: N worker child processes behind a blocking, thread-safe request API.
//!
//! Each request goes to one idle child and gets an answer or a [`WorkerFailure`] by its deadline.
//! A child that times out, crashes or breaks the protocol is killed (SIGKILL) and reaped before
//! the failure is returned for *that* request only: the other children, and the requests they are
//! serving, are untouched. Its replacement is started on a background thread, so the failed
//! request returns at once and whatever its caller holds (the CUDA environment holds its GPU's
//! lock around a request) is not held through a process start and context creation. The slot
//! rejoins the idle queue once the replacement has said `Ready` and answered a health check
//! (`Ping`); the time from detecting the failure to that answer is the respawn latency the stats
//! record. The pool is meant for dedicated blocking threads (the actors hand work over through
//! crossbeam channels), never for an async executor thread.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::child::{lock, ChildProc, Next};
use super::protocol::{encode_frame, FromChild, ToChild, DEFAULT_MAX_FRAME_BYTES};
use super::sched::{Expiry, WorkDeadline};

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
    /// [`crate::roles::child_main_from_args`]).
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
        24 => " (SIGXCPU)",
        31 => " (SIGSYS)",
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
    /// No answer by the backstop ([`super::sched::STARVED_BACKSTOP`] times the limit), and the child had had
    /// less than its limit of time: the rest it spent waiting for a CPU. The machine is too busy
    /// to judge the request; the child was killed.
    #[error(
        "the machine is too busy: the worker waited {starved:.1?} for a CPU in {elapsed:.1?} and \
         had not had its {limit:?} when it was stopped"
    )]
    Starved {
        /// The deadline of the request.
        limit: Duration,
        /// From sending the request to giving up.
        elapsed: Duration,
        /// How long the worker's threads waited, runnable, for a CPU meanwhile.
        starved: Duration,
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
    /// Requests or pings that the machine gave too little CPU to finish by the backstop
    /// ([`WorkerFailure::Starved`]).
    #[serde(default)]
    pub starved: u64,
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
    shared: Arc<Shared<Resp>>,
    retire: Option<fn(&Resp) -> bool>,
    _req: PhantomData<fn(&Req)>,
}

/// The part of a pool that background respawns share with it (nothing in it depends on `Req`).
struct Shared<Resp> {
    command: WorkerCommand,
    config: PoolConfig,
    slots: Vec<Mutex<Slot<Resp>>>,
    /// Indices of idle slots: a request takes one, and gives it back when done (or its respawn
    /// does). Capacity N, so returning an index never blocks.
    idle_tx: Sender<usize>,
    idle_rx: Receiver<usize>,
    stats: Mutex<PoolStats>,
    next_id: std::sync::atomic::AtomicU64,
    /// Respawns under way on background threads, and the signal that one finished.
    respawning: Mutex<usize>,
    respawned: Condvar,
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
        let shared = Shared {
            command,
            config,
            slots: (0..n).map(|_| Mutex::new(Slot { child: None })).collect(),
            idle_tx,
            idle_rx,
            stats: Mutex::new(PoolStats::default()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            respawning: Mutex::new(0),
            respawned: Condvar::new(),
        };
        for (i, slot) in shared.slots.iter().enumerate() {
            lock(slot).child = Some(shared.start_child()?);
            let _ = shared.idle_tx.send(i);
        }
        Ok(WorkerPool {
            shared: Arc::new(shared),
            retire: None,
            _req: PhantomData,
        })
    }

    /// Replaces a child after any answer for which `retire` is true (a GPU worker whose context a
    /// kernel poisoned answers with the crash, then must not serve again).
    pub fn retire_when(mut self, retire: fn(&Resp) -> bool) -> Self {
        self.retire = Some(retire);
        self
    }

    /// Sends `req` to an idle worker (waiting for one if all are busy) with the default deadline.
    pub fn request(&self, req: &Req) -> Result<Resp, WorkerFailure> {
        self.request_with_timeout(req, self.shared.config.request_timeout)
    }

    /// Like [`Self::request`] with an explicit deadline, counted from when a worker takes it.
    /// A failure returns as soon as the failed child is killed and reaped; its replacement starts
    /// in the background (see the module docs).
    pub fn request_with_timeout(&self, req: &Req, limit: Duration) -> Result<Resp, WorkerFailure> {
        let shared = &self.shared;
        let id = shared.fresh_id();
        let msg = ToChild::Request { id, body: req };
        let frame = encode_frame(&msg, shared.config.max_frame_bytes).map_err(|e| {
            WorkerFailure::Protocol {
                reason: format!("request could not be encoded: {e}"),
                stderr_tail: String::new(),
            }
        })?;
        let idx = shared.take_idle();
        let result = shared.exchange(idx, frame, Expect::Response(id), limit);
        match (&result, self.retire) {
            (Err(failed), _) => Shared::respawn_in_background(shared, idx, failed.detected),
            (Ok(FromChild::Response { body, .. }), Some(retire)) if retire(body) => {
                let since = shared.retire_child(idx);
                Shared::respawn_in_background(shared, idx, since);
            }
            _ => shared.give_back(idx),
        }
        let mut stats = lock(&shared.stats);
        stats.requests += 1;
        let result = result
            .map_err(|failed| failed.failure)
            .and_then(|msg| match msg {
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
        let shared = &self.shared;
        let idx = shared.take_idle();
        let start = Instant::now();
        match shared.ping_slot(idx, limit) {
            Ok(()) => {
                shared.give_back(idx);
                Ok(start.elapsed())
            }
            Err(failed) => {
                Shared::respawn_in_background(shared, idx, failed.detected);
                Err(failed.failure)
            }
        }
    }

    /// Health check of every worker, one after the other (each waits for its worker to finish
    /// what it is doing, and for background respawns to end). A dead worker is respawned by its
    /// ping before the next one is checked.
    pub fn ping_all(&self, limit: Duration) -> Vec<Result<Duration, WorkerFailure>> {
        let shared = &self.shared;
        self.wait_for_respawns();
        (0..shared.slots.len())
            .map(|i| {
                let start = Instant::now();
                shared
                    .ping_slot(i, limit)
                    .map(|()| start.elapsed())
                    .map_err(|failed| {
                        // This slot is still in the idle queue: replace its child in place.
                        let mut slot = lock(&shared.slots[i]);
                        if slot.child.is_none() {
                            slot.child = shared.respawn(failed.detected).ok();
                        }
                        failed.failure
                    })
            })
            .collect()
    }

    /// Blocks until no replacement child is being started in the background.
    pub fn wait_for_respawns(&self) {
        let mut pending = lock(&self.shared.respawning);
        while *pending > 0 {
            pending = self
                .shared
                .respawned
                .wait(pending)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        lock(&self.shared.stats).clone()
    }

    /// Number of worker slots.
    pub fn workers(&self) -> usize {
        self.shared.slots.len()
    }

    /// The configuration the pool runs with.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// Process ids of the children (for tests and logs), after background respawns have ended.
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.wait_for_respawns();
        self.shared
            .slots
            .iter()
            .map(|s| lock(s).child.as_ref().map(ChildProc::pid))
            .collect()
    }
}

/// A failed exchange: why, and when the failure was detected (the start of the respawn latency).
struct Failed {
    failure: WorkerFailure,
    detected: Instant,
}

impl<Resp> Shared<Resp>
where
    Resp: DeserializeOwned + Send + 'static,
{
    /// A fresh nonce and the ping frame that carries it.
    fn ping_frame(&self) -> Result<(u64, Vec<u8>), WorkerFailure> {
        let nonce = self.fresh_id();
        let frame = encode_frame(&ToChild::<()>::Ping { nonce }, self.config.max_frame_bytes)
            .map_err(|e| WorkerFailure::Protocol {
                reason: e.to_string(),
                stderr_tail: String::new(),
            })?;
        Ok((nonce, frame))
    }

    fn ping_slot(&self, idx: usize, limit: Duration) -> Result<(), Failed> {
        let (nonce, frame) = self.ping_frame().map_err(|failure| Failed {
            failure,
            detected: Instant::now(),
        })?;
        self.exchange(idx, frame, Expect::Pong(nonce), limit)
            .map(drop)
    }

    fn take_idle(&self) -> usize {
        // The pool holds a sender, so the channel never disconnects while `self` lives.
        self.idle_rx.recv().unwrap_or(0)
    }

    fn give_back(&self, idx: usize) {
        let _ = self.idle_tx.send(idx);
    }

    fn fresh_id(&self) -> u64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends one frame to slot `idx` and waits for the expected answer. On any failure the child
    /// is killed and reaped and the slot left empty: the caller has it replaced.
    fn exchange(
        &self,
        idx: usize,
        frame: Vec<u8>,
        expect: Expect,
        limit: Duration,
    ) -> Result<FromChild<Resp>, Failed> {
        let mut slot = lock(&self.slots[idx]);
        if slot.child.is_none() {
            // Only after a background respawn failed: try once more, and report if that fails.
            slot.child = Some(self.respawn(Instant::now()).map_err(|failure| Failed {
                failure,
                detected: Instant::now(),
            })?);
        }
        let Some(child) = slot.child.as_mut() else {
            return Err(Failed {
                failure: WorkerFailure::Spawn {
                    program: self.command.program.clone(),
                    reason: "worker slot empty after respawn".into(),
                },
                detected: Instant::now(),
            });
        };
        // The limit is the child's own time: what it waits for a CPU on a machine busier than
        // its cores moves the deadline on, up to a backstop where the machine is blamed.
        let mut deadline = WorkDeadline::start(child.pid(), limit);
        child.send(frame);
        // Exactly one message settles the exchange: children are killed after any failure, so
        // a stale reply to an earlier request can never be waiting here.
        let mut answer = child.next(deadline.first());
        while matches!(answer, Next::TimedOut) {
            let Some(due) = deadline.extend() else { break };
            answer = child.next(due);
        }
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
                match deadline.expiry() {
                    Expiry::Timeout => WorkerFailure::Timeout { limit },
                    Expiry::Starved { elapsed, starved } => WorkerFailure::Starved {
                        limit,
                        elapsed,
                        starved,
                    },
                }
            }
        };
        child.kill();
        slot.child = None;
        {
            let mut stats = lock(&self.stats);
            match failure {
                WorkerFailure::Timeout { .. } => stats.timeouts += 1,
                WorkerFailure::Starved { .. } => stats.starved += 1,
                WorkerFailure::Crashed { .. } => stats.crashes += 1,
                WorkerFailure::Protocol { .. } => stats.protocol_errors += 1,
                WorkerFailure::Spawn { .. } => stats.spawn_failures += 1,
            }
        }
        // A candidate that crashes or hangs its worker is ordinary (its outcome says so, and the
        // pool's counters count it); a worker that cannot be started, or that the machine gave
        // too little CPU to finish, is the harness's problem.
        if matches!(
            failure,
            WorkerFailure::Spawn { .. } | WorkerFailure::Starved { .. }
        ) {
            tracing::warn!(worker = idx, %failure, "worker failed; respawning");
        } else {
            tracing::debug!(worker = idx, %failure, "worker failed; respawning");
        }
        Err(Failed { failure, detected })
    }

    /// Kills and reaps the child of slot `idx` after a good answer that says it must go; returns
    /// when that began (the start of the respawn latency).
    fn retire_child(&self, idx: usize) -> Instant {
        let since = Instant::now();
        if let Some(mut child) = lock(&self.slots[idx]).child.take() {
            child.kill();
            child.reap(Duration::from_secs(1));
        }
        lock(&self.stats).retired += 1;
        since
    }

    /// Starts the replacement of slot `idx`'s dead child on a background thread, which returns
    /// the slot to the idle queue when done. If the replacement cannot start, the slot goes back
    /// empty and the next request on it retries (and reports `Spawn` if that fails too).
    fn respawn_in_background(this: &Arc<Self>, idx: usize, since: Instant) {
        *lock(&this.respawning) += 1;
        let shared = Arc::clone(this);
        let job = move || {
            {
                let mut slot = lock(&shared.slots[idx]);
                if slot.child.is_none() {
                    slot.child = shared.respawn(since).ok();
                }
            }
            shared.give_back(idx);
            *lock(&shared.respawning) -= 1;
            shared.respawned.notify_all();
        };
        let spawned = std::thread::Builder::new()
            .name(format!("respawn-{idx}"))
            .spawn(job);
        if let Err(e) = spawned {
            // No thread to spare: leave the slot empty; the next request on it respawns inline.
            tracing::warn!(worker = idx, error = %e, "no thread for a background respawn");
            this.give_back(idx);
            *lock(&this.respawning) -= 1;
            this.respawned.notify_all();
        }
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

/// Children are shut down when the last owner goes: the pool, or a background respawn that
/// outlived it (whose new child is then shut down here too).
impl<Resp> Drop for Shared<Resp> {
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
