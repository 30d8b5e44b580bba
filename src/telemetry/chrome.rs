//! A `tracing` layer that writes actor spans as a Chrome trace-event file (open it in Perfetto or
//! chrome://tracing), one track per actor, and keeps live per-actor totals in [`TraceStats`].
//!
//! Why this shape: the actors must never wait for telemetry. The layer does the little work that
//! must happen on the actor's thread (read a few fields, take two timestamps) and hands a small
//! record to a writer thread through a bounded channel with `try_send`. When the writer falls
//! behind, records are dropped and counted rather than queued without bound or blocking an actor;
//! the count appears in the file's last event and in [`TraceStats::dropped`].
//!
//! The file is a JSON array written incrementally, one event per line: `[`, then each event
//! followed by `,`, and on a clean finish a last event (the drop counter) and `]`. A process that
//! is killed leaves the array unterminated, which the trace-event format allows; the reader in
//! [`super::reader`] accepts it, including a torn last line.
//!
//! With a size limit ([`chrome_layer_rotating`]), the writer closes the session's file when it
//! reaches the limit (last event and `]`), renames it `trace-NNNN.pKKKK.json`, gzips it on a
//! thread of its own ([`super::files::gzip_in_place`]) and starts the live file again with the
//! same tracks; `kevin inspect` reads a session's parts as one.
//!
//! A span's event runs from its creation to its close (wall time, not busy time): the actors
//! create a span when a message arrives and drop it when the work for that message ends, possibly
//! on another thread, so this is the message's handling latency.
//!
//! # Installing it
//! Give the terminal output its own per-layer filter, so `RUST_LOG` quiets the logs without
//! starving the trace of spans or of the `TRACE`-level [`super::counter`] samples:
//!
//! ```no_run
//! use tracing_subscriber::{filter::filter_fn, layer::SubscriberExt, EnvFilter, Layer};
//!
//! # fn main() -> std::io::Result<()> {
//! # let run_dir = std::path::Path::new("runs/demo");
//! let (chrome, guard) = kevin::telemetry::chrome_layer(&kevin::telemetry::session_trace_path(run_dir)?)?;
//! let stats = guard.stats(); // snapshot() it every learner step for metrics.jsonl
//! let subscriber = tracing_subscriber::registry()
//!     .with(tracing_subscriber::fmt::layer().with_filter(EnvFilter::from_default_env()))
//!     // Only kevin's own spans (the core library and the actors crate) become trace events.
//!     .with(chrome.with_filter(filter_fn(|meta| meta.target().starts_with("kevin"))));
//! tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
//!
//! // In a handler: one span per message, dropped when the message's work is done.
//! let span = tracing::info_span!("Compile", actor = "Compiler", task = "relu_1");
//! let _entered = span.enter();
//! kevin::telemetry::counter("mailbox.Compiler", 3.0);
//! # drop(_entered);
//! // At shutdown, after the actors stopped: write the last event and close the array.
//! guard.finish()?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use serde_json::{json, Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use super::stats::TraceStats;
use super::{ACTOR_FIELD, COUNTER_FIELD, OTHER_TRACK, VALUE_FIELD};

/// Records the channel holds before the layer starts dropping. A record is ~100 bytes, so this
/// bounds the backlog at a few MB; the writer serialises well over 100k events per second, so a
/// full channel means a burst far beyond what any actor produces in normal operation.
pub const DEFAULT_CAPACITY: usize = 1 << 15;

/// How often the writer flushes while events keep coming; a killed process loses at most this
/// much of its trace (plus what sat in the channel).
const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// Name of the counter event written last on a clean finish: the number of dropped records.
pub const DROPPED_COUNTER: &str = "trace_dropped";

/// A span or counter field value, kept as the type it was recorded with.
#[derive(Clone, Debug, PartialEq)]
enum ArgValue {
    Str(String),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

impl ArgValue {
    fn to_json(&self) -> Value {
        match self {
            ArgValue::Str(s) => Value::from(s.as_str()),
            ArgValue::I64(v) => Value::from(*v),
            ArgValue::U64(v) => Value::from(*v),
            ArgValue::F64(v) => Value::from(*v),
            ArgValue::Bool(v) => Value::from(*v),
        }
    }

    fn as_f64(&self) -> Option<f64> {
        match self {
            ArgValue::I64(v) => Some(*v as f64),
            ArgValue::U64(v) => Some(*v as f64),
            ArgValue::F64(v) => Some(*v),
            _ => None,
        }
    }
}

/// What the layer sends to the writer thread.
enum Message {
    Span {
        name: &'static str,
        actor: Arc<str>,
        /// True for a message span (it names its own actor, or has no parent).
        message: bool,
        ts_us: f64,
        dur_us: f64,
        args: Vec<(&'static str, ArgValue)>,
    },
    Counter {
        name: String,
        ts_us: f64,
        value: f64,
    },
    /// Sent by [`TraceGuard::finish`]: write the last event and `]`, flush, and stop.
    Finish,
}

/// Per-span state, kept in the span's extensions from creation to close.
struct SpanState {
    start: Instant,
    actor: Option<Arc<str>>,
    /// The actor came from the span's own `actor` field (or the span has no parent at all).
    message: bool,
    args: Vec<(&'static str, ArgValue)>,
}

impl SpanState {
    /// The track a message span is counted open on in the live stats: its actor's (`None` for a
    /// span that is not a message).
    fn track(&self) -> Option<Arc<str>> {
        self.message
            .then(|| self.actor.clone().unwrap_or_else(|| Arc::from(OTHER_TRACK)))
    }
}

/// Collects a span's or event's fields: `actor` apart, the rest as args.
#[derive(Default)]
struct FieldVisitor {
    actor: Option<String>,
    args: Vec<(&'static str, ArgValue)>,
}

impl FieldVisitor {
    fn put(&mut self, field: &Field, value: ArgValue) {
        if field.name() == ACTOR_FIELD {
            if let ArgValue::Str(s) = value {
                self.actor = Some(s);
                return;
            }
        }
        match self.args.iter_mut().find(|(k, _)| *k == field.name()) {
            Some(slot) => slot.1 = value,
            None => self.args.push((field.name(), value)),
        }
    }
}

impl Visit for FieldVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, ArgValue::Str(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, ArgValue::Str(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, ArgValue::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, ArgValue::U64(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, ArgValue::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, ArgValue::Bool(value));
    }
}

/// The `tracing` layer; see the module docs. Create it with [`chrome_layer`].
pub struct ChromeLayer {
    tx: Sender<Message>,
    start: Instant,
    stats: Arc<TraceStats>,
}

impl ChromeLayer {
    /// The live per-actor totals this layer maintains.
    pub fn stats(&self) -> Arc<TraceStats> {
        self.stats.clone()
    }

    fn micros_since_start(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_nanos() as f64 / 1000.0
    }

    /// Hands a record to the writer without ever blocking; counts it when it cannot.
    fn send(&self, msg: Message) {
        match self.tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.stats.record_drop(),
        }
    }
}

impl<S> Layer<S> for ChromeLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let start = Instant::now();
        let Some(span) = ctx.span(id) else { return };
        let mut fields = FieldVisitor::default();
        attrs.record(&mut fields);
        let parent = span.parent();
        let (actor, message) = match fields.actor {
            Some(a) => (Some(Arc::from(a)), true),
            None => {
                let inherited = parent.as_ref().and_then(|p| {
                    p.extensions()
                        .get::<SpanState>()
                        .and_then(|s| s.actor.clone())
                });
                (inherited, parent.is_none())
            }
        };
        let state = SpanState {
            start,
            actor,
            message,
            args: fields.args,
        };
        if let Some(track) = state.track() {
            self.stats.open_message(&track, start);
        }
        span.extensions_mut().insert(state);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = FieldVisitor::default();
        values.record(&mut fields);
        let mut ext = span.extensions_mut();
        let Some(state) = ext.get_mut::<SpanState>() else {
            return;
        };
        if let Some(a) = fields.actor {
            let actor: Arc<str> = Arc::from(a);
            if let Some(track) = state.track() {
                self.stats.close_open(&track, state.start);
            }
            self.stats.open_message(&actor, state.start);
            state.actor = Some(actor);
            state.message = true;
        }
        for (k, v) in fields.args {
            match state.args.iter_mut().find(|(name, _)| *name == k) {
                Some(slot) => slot.1 = v,
                None => state.args.push((k, v)),
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        // Only counter events matter here; log lines are the fmt layer's business.
        let has_counter = event.metadata().fields().field(COUNTER_FIELD).is_some();
        if !has_counter {
            return;
        }
        let mut fields = FieldVisitor::default();
        event.record(&mut fields);
        let name = fields.args.iter().find_map(|(k, v)| match v {
            ArgValue::Str(s) if *k == COUNTER_FIELD => Some(s.clone()),
            _ => None,
        });
        let value = fields
            .args
            .iter()
            .find_map(|(k, v)| if *k == VALUE_FIELD { v.as_f64() } else { None });
        if let (Some(name), Some(value)) = (name, value) {
            self.stats.record_counter(&name, value);
            let ts_us = self.micros_since_start(Instant::now());
            self.send(Message::Counter { name, ts_us, value });
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let end = Instant::now();
        let Some(span) = ctx.span(&id) else { return };
        let Some(state) = span.extensions_mut().remove::<SpanState>() else {
            return;
        };
        let dur = end.saturating_duration_since(state.start);
        if let Some(track) = state.track() {
            self.stats
                .record_message(&track, state.start, dur.as_micros() as u64);
        }
        let actor = state.actor.unwrap_or_else(|| Arc::from(OTHER_TRACK));
        self.send(Message::Span {
            name: span.name(),
            actor,
            message: state.message,
            ts_us: self.micros_since_start(state.start),
            dur_us: dur.as_nanos() as f64 / 1000.0,
            args: state.args,
        });
    }
}

/// Keeps the writer thread; [`TraceGuard::finish`] (or dropping the guard) writes the last event,
/// closes the array and flushes. Keep it alive for as long as the daemon runs.
pub struct TraceGuard {
    tx: Sender<Message>,
    writer: Option<JoinHandle<io::Result<TraceSummary>>>,
    stats: Arc<TraceStats>,
}

/// What a finished trace file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    /// Span and counter events written (metadata events not included).
    pub events: u64,
    /// Records dropped because the channel was full or the writer had stopped.
    pub dropped: u64,
}

impl TraceGuard {
    /// The live per-actor totals of this trace.
    pub fn stats(&self) -> Arc<TraceStats> {
        self.stats.clone()
    }

    /// Writes everything already sent, the drop counter and the closing `]`, and flushes.
    /// Records sent after this are dropped (and counted).
    pub fn finish(mut self) -> io::Result<TraceSummary> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> io::Result<TraceSummary> {
        let Some(writer) = self.writer.take() else {
            return Ok(TraceSummary {
                events: 0,
                dropped: self.stats.dropped(),
            });
        };
        // Blocking here is fine: this is shutdown, not an actor's hot path. If the writer died,
        // the channel is disconnected and this returns at once.
        let _ = self.tx.send(Message::Finish);
        writer
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("trace writer thread panicked")))
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        let _ = self.finish_inner();
    }
}

/// Creates the trace file at `path` (truncating it), starts its writer thread, and returns the
/// layer to install plus the guard that closes the file.
pub fn chrome_layer(path: &Path) -> io::Result<(ChromeLayer, TraceGuard)> {
    chrome_layer_rotating(path, 0)
}

/// [`chrome_layer`] whose file is closed, gzipped and started again each time it reaches
/// `rotate_bytes` (0: never).
pub fn chrome_layer_rotating(
    path: &Path,
    rotate_bytes: u64,
) -> io::Result<(ChromeLayer, TraceGuard)> {
    let (layer, rx) = unstarted_layer(DEFAULT_CAPACITY);
    let guard = start_writer(
        path,
        rotate_bytes,
        layer.tx.clone(),
        rx,
        layer.stats.clone(),
    )?;
    Ok((layer, guard))
}

/// The layer and the receiving end of its channel, before any writer drains it (tests use the
/// gap to fill the channel deterministically).
fn unstarted_layer(capacity: usize) -> (ChromeLayer, Receiver<Message>) {
    let (tx, rx) = bounded(capacity);
    let start = Instant::now();
    let stats = Arc::new(TraceStats::new(start));
    (ChromeLayer { tx, start, stats }, rx)
}

fn start_writer(
    path: &Path,
    rotate_bytes: u64,
    tx: Sender<Message>,
    rx: Receiver<Message>,
    stats: Arc<TraceStats>,
) -> io::Result<TraceGuard> {
    // Parts of earlier sessions that a crash left uncompressed (best effort: a trace is not worth
    // failing a start over).
    if let Some(dir) = path.parent().filter(|_| rotate_bytes > 0) {
        let _ = super::files::finish_pending(dir, "trace-");
    }
    let file = File::create(path)?;
    let mut writer = TraceWriter {
        out: BufWriter::new(file),
        stats: stats.clone(),
        tids: HashMap::new(),
        events: 0,
        last_ts_us: 0.0,
        path: path.to_path_buf(),
        rotate_bytes,
        bytes: 0,
        parts: 0,
        compressing: Vec::new(),
    };
    writer.begin()?;
    let handle = std::thread::Builder::new()
        .name("kevin-trace-writer".to_owned())
        .spawn(move || writer.run(rx))?;
    Ok(TraceGuard {
        tx,
        writer: Some(handle),
        stats,
    })
}

/// Serialises records into the file on its own thread.
struct TraceWriter {
    out: BufWriter<File>,
    stats: Arc<TraceStats>,
    /// Track id per actor, assigned in order of first appearance (1, 2, ...).
    tids: HashMap<Arc<str>, u64>,
    events: u64,
    last_ts_us: f64,
    /// The live file.
    path: PathBuf,
    /// Size at which the live file is closed and archived (0: never).
    rotate_bytes: u64,
    /// Bytes in the live file.
    bytes: u64,
    /// Parts archived so far.
    parts: u64,
    /// Compressions of archived parts still running.
    compressing: Vec<JoinHandle<io::Result<PathBuf>>>,
}

impl TraceWriter {
    fn line(&mut self, event: &Value) -> io::Result<()> {
        let mut text = serde_json::to_vec(event)?;
        text.extend_from_slice(b",\n");
        self.bytes += text.len() as u64;
        self.out.write_all(&text)
    }

    /// The opening `[` and the process's name: how every file (and part) starts.
    fn open_array(&mut self) -> io::Result<()> {
        self.out.write_all(b"[\n")?;
        self.bytes += 2;
        let meta = json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "kevin"}});
        self.line(&meta)
    }

    fn begin(&mut self) -> io::Result<()> {
        self.open_array()?;
        // A first sample at 0 starts the drop counter's track and marks the session's start, so
        // `inspect` counts the time before the first message as idle.
        let zero = json!({"name": DROPPED_COUNTER, "ph": "C", "ts": 0, "pid": 1,
            "args": {"dropped": 0}});
        self.line(&zero)?;
        self.out.flush()
    }

    /// The last event (the drop counter) and the closing `]`.
    fn close_array(&mut self) -> io::Result<u64> {
        let dropped = self.stats.dropped();
        let ts = round3(self.last_ts_us.max(self.stats.elapsed_us() as f64));
        let last = json!({"name": DROPPED_COUNTER, "ph": "C", "ts": ts, "pid": 1,
            "args": {"dropped": dropped}});
        serde_json::to_writer(&mut self.out, &last)?;
        self.out.write_all(b"\n]\n")?;
        self.out.flush()?;
        Ok(dropped)
    }

    /// Closes the live file as the next part, hands it to a compression thread, and starts the
    /// live file again with the known tracks named.
    fn rotate(&mut self) -> io::Result<()> {
        self.close_array()?;
        self.parts += 1;
        let name = self
            .path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or("trace");
        let part = self
            .path
            .with_file_name(format!("{name}.p{:04}.json", self.parts));
        std::fs::rename(&self.path, &part)?;
        self.out = BufWriter::new(File::create(&self.path)?);
        self.bytes = 0;
        // Join the compressions already done: an unjoined thread keeps its stack, and a long run
        // rotates many times.
        let mut i = 0;
        while i < self.compressing.len() {
            if self.compressing[i].is_finished() {
                join_compression(self.compressing.swap_remove(i))?;
            } else {
                i += 1;
            }
        }
        self.compressing.push(
            std::thread::Builder::new()
                .name("kevin-trace-gzip".to_owned())
                .spawn(move || super::files::gzip_in_place(&part))?,
        );
        self.open_array()?;
        let mut tracks: Vec<(Arc<str>, u64)> =
            self.tids.iter().map(|(a, t)| (a.clone(), *t)).collect();
        tracks.sort_by_key(|(_, t)| *t);
        for (actor, tid) in tracks {
            self.track_names(&actor, tid)?;
        }
        Ok(())
    }

    fn track_names(&mut self, actor: &str, tid: u64) -> io::Result<()> {
        let name = json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
            "args": {"name": actor}});
        self.line(&name)?;
        let order = json!({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid,
            "args": {"sort_index": tid}});
        self.line(&order)
    }

    fn tid(&mut self, actor: &Arc<str>) -> io::Result<u64> {
        if let Some(&tid) = self.tids.get(actor) {
            return Ok(tid);
        }
        let tid = self.tids.len() as u64 + 1;
        self.tids.insert(actor.clone(), tid);
        self.track_names(actor, tid)?;
        Ok(tid)
    }

    fn write(&mut self, msg: Message) -> io::Result<()> {
        match msg {
            Message::Span {
                name,
                actor,
                message,
                ts_us,
                dur_us,
                args,
            } => {
                let tid = self.tid(&actor)?;
                let args: Map<String, Value> = args
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_json()))
                    .collect();
                let cat = if message { "message" } else { "span" };
                let event = json!({"name": name, "cat": cat, "ph": "X", "ts": round3(ts_us),
                    "dur": round3(dur_us), "pid": 1, "tid": tid, "args": args});
                self.last_ts_us = self.last_ts_us.max(ts_us + dur_us);
                self.line(&event)?;
            }
            Message::Counter { name, ts_us, value } => {
                let event = json!({"name": name, "ph": "C", "ts": round3(ts_us), "pid": 1,
                    "args": {"value": value}});
                self.last_ts_us = self.last_ts_us.max(ts_us);
                self.line(&event)?;
            }
            Message::Finish => {}
        }
        self.events += 1;
        Ok(())
    }

    /// Drains the channel until [`Message::Finish`] (or until every sender is gone), flushing at
    /// most every [`FLUSH_EVERY`] while busy and whenever the channel runs dry.
    fn run(mut self, rx: Receiver<Message>) -> io::Result<TraceSummary> {
        let mut last_flush = Instant::now();
        loop {
            match rx.recv_timeout(FLUSH_EVERY) {
                Ok(Message::Finish) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(msg) => {
                    self.write(msg)?;
                    if self.rotate_bytes > 0 && self.bytes >= self.rotate_bytes {
                        self.rotate()?;
                    }
                    if rx.is_empty() || last_flush.elapsed() >= FLUSH_EVERY {
                        self.out.flush()?;
                        last_flush = Instant::now();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
        // Whatever is still queued was sent before finish(): write it too.
        while let Ok(msg) = rx.try_recv() {
            self.write(msg)?;
        }
        drop(rx);
        let dropped = self.close_array()?;
        for c in self.compressing.drain(..) {
            join_compression(c)?;
        }
        Ok(TraceSummary {
            events: self.events,
            dropped,
        })
    }
}

/// Waits for a compression of an archived part; its error, or the thread's panic, as an error.
fn join_compression(handle: JoinHandle<io::Result<PathBuf>>) -> io::Result<()> {
    handle
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("trace compression thread panicked")))
        .map(|_| ())
}

/// Microseconds to nanosecond resolution: keeps the file short and the numbers readable.
fn round3(us: f64) -> f64 {
    (us * 1000.0).round() / 1000.0
}

#[cfg(test)]
#[path = "chrome_tests.rs"]
mod tests;
