//! `kevin inspect RUN_DIR`: which actor is the bottleneck.
//!
//! Reads every trace file of a run (`trace.json` and `trace-*.json`, one per daemon session, with
//! the archived parts of a session, `trace-N.pK.json.gz`, read as one with it) and
//! the mailbox high-water marks in `metrics.jsonl` (and in `mailbox.<actor>` counters), and reports per actor: the share of the traced
//! wall-clock time it was busy (the union of its spans) and idle, its summed busy time and
//! concurrency when its spans overlap (a pool of workers on one track), messages handled, exact
//! mean and p99 handling latency, mailbox high-water mark; and the ten slowest spans overall.
//!
//! The traced window of a session runs from its earliest to its latest timestamp; the chrome
//! writer puts a counter at 0 and one at finish, so a whole daemon session is covered, including
//! the time before the first message. Shares are of the sum of all sessions' windows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use super::chrome::DROPPED_COUNTER;
use super::reader::{read_trace, TraceEvent, TraceFile};
use super::{MAILBOX_COUNTER_PREFIX, VALUE_FIELD};

/// How many of the slowest spans the report lists.
const SLOWEST: usize = 10;
/// Longest args summary shown for a slow span.
const ARGS_WIDTH: usize = 60;

/// Why a run directory could not be inspected. Each names the file (and line) at fault.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The run directory could not be listed.
    #[error("cannot list run directory {}: {source}", dir.display())]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The run directory holds no `trace.json` or `trace-*.json`.
    #[error("no trace file (trace.json or trace-*.json) in {}", dir.display())]
    NoTraceFiles {
        /// The directory.
        dir: PathBuf,
    },
    /// A trace file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A trace file is damaged somewhere other than its last line.
    #[error("{}: {at}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where in it: `line N`, `event N` or `top level`.
        at: String,
        /// What is wrong.
        message: String,
    },
}

/// Everything `kevin inspect` reports; printed as tables by `Display`, as JSON by serde.
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    /// The run directory inspected.
    pub run_dir: PathBuf,
    /// One entry per trace file, in name order.
    pub sessions: Vec<SessionReport>,
    /// Traced wall-clock time of all sessions together, in milliseconds.
    pub wall_ms: f64,
    /// One entry per actor, busiest first.
    pub actors: Vec<ActorReport>,
    /// The slowest spans of all sessions, slowest first.
    pub slowest: Vec<SlowSpan>,
    /// Things a reader should know (cut files, dropped records, an unreadable metrics file).
    pub warnings: Vec<String>,
    /// Milliseconds waited for the GPU-wide timing lease over all sessions, per party and hold
    /// (metrics.jsonl's `lease_wait_ms`; empty when the run had no lease).
    pub lease_wait_ms: BTreeMap<String, f64>,
}

/// One trace file (one daemon session).
#[derive(Clone, Debug, Serialize)]
pub struct SessionReport {
    /// File name within the run directory.
    pub file: String,
    /// Traced wall-clock time, in milliseconds.
    pub wall_ms: f64,
    /// Spans read.
    pub spans: usize,
    /// Whether the writer closed the file (false: the daemon was killed).
    pub complete: bool,
    /// Records the writer dropped, as last reported in the file.
    pub dropped: u64,
}

/// One actor (one trace track).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ActorReport {
    /// The actor (track name).
    pub actor: String,
    /// Messages handled (message spans; nested work spans are not counted).
    pub messages: u64,
    /// Percent of the traced time during which at least one of its spans was open.
    pub busy_pct: f64,
    /// `100 - busy_pct`.
    pub idle_pct: f64,
    /// Summed message durations as a percent of traced time; above 100 for a busy pool.
    pub busy_summed_pct: f64,
    /// Most message spans open at once (1 for a single-threaded actor).
    pub concurrency: u64,
    /// Mean handling latency, in milliseconds.
    pub mean_ms: f64,
    /// 99th-percentile handling latency (nearest rank), in milliseconds.
    pub p99_ms: f64,
    /// Deepest mailbox seen: the highest of metrics.jsonl's `mailbox_high_water` and the trace's
    /// `mailbox.<actor>` counter samples.
    pub mailbox_high_water: Option<u64>,
}

/// One of the slowest spans.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlowSpan {
    /// Its actor (track name).
    pub actor: String,
    /// The span name.
    pub name: String,
    /// Duration, in milliseconds.
    pub dur_ms: f64,
    /// Start, in milliseconds since its session's window began.
    pub start_ms: f64,
    /// Trace file it is in.
    pub session: String,
    /// Its args, `key=value` separated by spaces, cut to a readable width.
    pub args: String,
}

/// Running totals of one actor over all sessions.
#[derive(Default)]
struct Acc {
    union_us: f64,
    summed_us: f64,
    durations_us: Vec<f64>,
    concurrency: u64,
}

/// One track's spans in one session, as `(start, end)` in microseconds.
#[derive(Default)]
struct TrackSpans {
    /// Every span: what the busy union is made of.
    all: Vec<(f64, f64)>,
    /// Message spans only: messages, latency, summed busy time, concurrency.
    messages: Vec<(f64, f64)>,
}

/// Inspects the run directory `run_dir`; see the module docs.
pub fn inspect(run_dir: &Path) -> Result<InspectReport, InspectError> {
    let files = read_sessions(run_dir)?;
    let mut warnings = Vec::new();
    let mailbox = mailbox_high_water(&run_dir.join("metrics.jsonl"), &mut warnings);
    let mut out = report(run_dir, &files, mailbox, warnings);
    out.lease_wait_ms = lease_waits(&run_dir.join("metrics.jsonl"));
    Ok(out)
}

/// Every session's trace of the run directory, in the order they ran, its parts joined.
fn read_sessions(run_dir: &Path) -> Result<Vec<TraceFile>, InspectError> {
    let files = trace_names(run_dir)?
        .iter()
        .map(|n| read_trace(&run_dir.join(n)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(join_parts(files))
}

/// The run directory's trace files, in the order their sessions ran.
fn trace_names(run_dir: &Path) -> Result<Vec<String>, InspectError> {
    let entries = std::fs::read_dir(run_dir).map_err(|source| InspectError::ReadDir {
        dir: run_dir.to_owned(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n == "trace.json"
                || (n.starts_with("trace-") && n.ends_with(".json"))
                || super::session_part(n).is_some()
        })
        .collect();
    if names.is_empty() {
        return Err(InspectError::NoTraceFiles {
            dir: run_dir.to_owned(),
        });
    }
    // Sessions in the order they ran: `trace.json` first, then by number (trace-9 before
    // trace-10), then any other `trace-*.json` by name; a session's archived parts in order,
    // then its live file.
    names.sort_by_key(|n| session_key(n));
    Ok(names)
}

/// Where a trace file sorts: session, then part (the live file last).
fn session_key(name: &str) -> (u64, u64, String) {
    match (name, super::session_part(name)) {
        ("trace.json", _) => (0, u64::MAX, name.to_owned()),
        (_, Some((session, part))) => (session, part, name.to_owned()),
        _ => (
            super::session_number(name).unwrap_or(u64::MAX),
            u64::MAX,
            name.to_owned(),
        ),
    }
}

/// Joins each session's archived parts with the file after them (the live file, or the next
/// part): one trace per session, as the writer wrote it before rotating.
fn join_parts(files: Vec<TraceFile>) -> Vec<TraceFile> {
    let mut out: Vec<TraceFile> = Vec::new();
    let mut open_part: Option<u64> = None;
    for file in files {
        let name = file_name(&file.path);
        let session = session_key(&name).0;
        match out.last_mut() {
            Some(prev) if open_part == Some(session) => {
                prev.events.extend(file.events);
                prev.path = file.path;
                prev.complete = file.complete;
                prev.torn = file.torn;
            }
            _ => out.push(file),
        }
        open_part = super::session_part(&name).map(|(s, _)| s);
    }
    out
}

/// Builds the report from files already read (and the mailbox marks already gathered).
fn report(
    run_dir: &Path,
    files: &[TraceFile],
    mut mailbox: BTreeMap<String, u64>,
    mut warnings: Vec<String>,
) -> InspectReport {
    let mut acc: BTreeMap<String, Acc> = BTreeMap::new();
    let mut sessions = Vec::new();
    let mut slow: Vec<SlowSpan> = Vec::new();
    let mut wall_us = 0.0;
    // Spans shorter than this cannot enter the slowest list any more.
    let mut slow_floor_ms = 0.0;
    for file in files {
        let session = file_name(&file.path);
        let mut tracks: BTreeMap<u64, String> = BTreeMap::new();
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut dropped = 0;
        for event in &file.events {
            if let Some((start, end)) = extent(event) {
                lo = lo.min(start);
                hi = hi.max(end);
            }
            match event {
                TraceEvent::ThreadName { tid, name } => {
                    tracks.insert(*tid, name.clone());
                }
                TraceEvent::Span { .. } => {}
                TraceEvent::Counter { name, args, .. } => {
                    if name == DROPPED_COUNTER {
                        dropped = args.get("dropped").and_then(Value::as_u64).unwrap_or(0);
                    } else if let Some(actor) = name.strip_prefix(MAILBOX_COUNTER_PREFIX) {
                        let depth = args.get(VALUE_FIELD).and_then(Value::as_f64).unwrap_or(0.0);
                        let slot = mailbox.entry(actor.to_owned()).or_insert(0);
                        *slot = (*slot).max(depth as u64);
                    }
                }
            }
        }
        let window = if hi > lo { hi - lo } else { 0.0 };
        wall_us += window;

        // Per track: all spans for the busy union, message spans for the rest.
        let mut spans_of: BTreeMap<String, TrackSpans> = BTreeMap::new();
        let mut n_spans = 0;
        for event in &file.events {
            let TraceEvent::Span {
                name,
                cat,
                tid,
                ts_us,
                dur_us,
                args,
            } = event
            else {
                continue;
            };
            n_spans += 1;
            let actor = tracks
                .get(tid)
                .cloned()
                .unwrap_or_else(|| format!("tid {tid}"));
            let entry = spans_of.entry(actor.clone()).or_default();
            entry.all.push((*ts_us, ts_us + dur_us));
            if cat.as_deref().is_none_or(|c| c == "message") {
                entry.messages.push((*ts_us, ts_us + dur_us));
            }
            // Keep the list short as we go (a long run has millions of spans), and summarise
            // args only for spans that can still make it.
            let dur_ms = dur_us / 1000.0;
            if slow.len() >= SLOWEST && dur_ms < slow_floor_ms {
                continue;
            }
            slow.push(SlowSpan {
                actor,
                name: name.clone(),
                dur_ms,
                start_ms: (ts_us - lo) / 1000.0,
                session: session.clone(),
                args: summarize(args),
            });
            if slow.len() >= 4 * SLOWEST {
                sort_slowest(&mut slow);
                slow.truncate(SLOWEST);
                slow_floor_ms = slow[SLOWEST - 1].dur_ms;
            }
        }
        for (actor, TrackSpans { all, messages }) in spans_of {
            let a = acc.entry(actor).or_default();
            a.union_us += union_length(all);
            a.summed_us += messages.iter().map(|(s, e)| e - s).sum::<f64>();
            a.concurrency = a.concurrency.max(max_overlap(&messages));
            a.durations_us.extend(messages.iter().map(|(s, e)| e - s));
        }

        if !file.complete {
            let torn = if file.torn {
                ", torn last line skipped"
            } else {
                ""
            };
            warnings.push(format!(
                "{session}: not closed (daemon killed?); read {} events{torn}",
                file.events.len()
            ));
        }
        if dropped > 0 {
            warnings.push(format!(
                "{session}: the trace writer dropped {dropped} records (it could not keep up)"
            ));
        }
        sessions.push(SessionReport {
            file: session,
            wall_ms: window / 1000.0,
            spans: n_spans,
            complete: file.complete,
            dropped,
        });
    }
    sort_slowest(&mut slow);
    slow.truncate(SLOWEST);

    for actor in mailbox.keys() {
        acc.entry(actor.clone()).or_default();
    }
    let pct = |us: f64| {
        if wall_us > 0.0 {
            100.0 * us / wall_us
        } else {
            0.0
        }
    };
    let mut actors: Vec<ActorReport> = acc
        .into_iter()
        .map(|(actor, mut a)| {
            a.durations_us.sort_by(f64::total_cmp);
            let n = a.durations_us.len();
            let busy_pct = pct(a.union_us);
            ActorReport {
                messages: n as u64,
                busy_pct,
                idle_pct: 100.0 - busy_pct,
                busy_summed_pct: pct(a.summed_us),
                concurrency: a.concurrency,
                mean_ms: if n == 0 {
                    0.0
                } else {
                    a.summed_us / n as f64 / 1000.0
                },
                p99_ms: percentile(&a.durations_us, 0.99) / 1000.0,
                mailbox_high_water: mailbox.get(&actor).copied(),
                actor,
            }
        })
        .collect();
    actors.sort_by(|a, b| {
        b.busy_pct
            .total_cmp(&a.busy_pct)
            .then_with(|| b.busy_summed_pct.total_cmp(&a.busy_summed_pct))
            .then_with(|| a.actor.cmp(&b.actor))
    });
    InspectReport {
        run_dir: run_dir.to_owned(),
        sessions,
        wall_ms: wall_us / 1000.0,
        actors,
        slowest: slow,
        warnings,
        lease_wait_ms: BTreeMap::new(),
    }
}

/// What the first session of a run did in its first seconds of wall-clock time: the measure of
/// `kevin bench modes`, which stops each run a little after its window and must not count what
/// happened while it drained.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowReport {
    /// The window: the requested seconds, or the whole session when it was shorter.
    pub seconds: f64,
    /// The session's whole traced time, in seconds.
    pub traced_s: f64,
    /// Spans named by the caller (`count`) that started in the window.
    pub counted: u64,
    /// Percent of the window during which at least one span of each actor was open.
    pub busy_pct: BTreeMap<String, f64>,
    /// Percent of the window during which at least one span of any of the caller's actors
    /// (`union_of`) was open.
    pub union_busy_pct: f64,
}

/// Reads the first session's trace of `run_dir` and measures its first `seconds`: the number of
/// spans named `count` that started in it, each actor's busy share of it, and the busy share of
/// the actors `union_of` together (spans are cut at the window's end).
pub fn window(
    run_dir: &Path,
    seconds: f64,
    count: &str,
    union_of: &[&str],
) -> Result<WindowReport, InspectError> {
    let file = read_sessions(run_dir)?.remove(0);
    let mut tracks: BTreeMap<u64, &str> = BTreeMap::new();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for event in &file.events {
        if let TraceEvent::ThreadName { tid, name } = event {
            tracks.insert(*tid, name);
        }
        if let Some((start, end)) = extent(event) {
            lo = lo.min(start);
            hi = hi.max(end);
        }
    }
    let traced_us = if hi > lo { hi - lo } else { 0.0 };
    let window_us = (seconds * 1e6).min(traced_us);
    let end = lo + window_us;
    let mut counted = 0;
    let mut spans_of: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    let mut union = Vec::new();
    for event in &file.events {
        let TraceEvent::Span {
            name,
            tid,
            ts_us,
            dur_us,
            ..
        } = event
        else {
            continue;
        };
        if *ts_us >= end {
            continue;
        }
        if name == count {
            counted += 1;
        }
        let actor = tracks.get(tid).copied().unwrap_or("?");
        let span = (*ts_us, (ts_us + dur_us).min(end));
        spans_of.entry(actor).or_default().push(span);
        if union_of.contains(&actor) {
            union.push(span);
        }
    }
    let pct = |us: f64| {
        if window_us > 0.0 {
            100.0 * us / window_us
        } else {
            0.0
        }
    };
    Ok(WindowReport {
        seconds: window_us / 1e6,
        traced_s: traced_us / 1e6,
        counted,
        busy_pct: spans_of
            .into_iter()
            .map(|(actor, spans)| (actor.to_owned(), pct(union_length(spans))))
            .collect(),
        union_busy_pct: pct(union_length(union)),
    })
}

/// The time an event covers, in microseconds: a span from its start to its end, a counter
/// sample at its instant; a track name covers none. A session's window is the hull of these.
fn extent(event: &TraceEvent) -> Option<(f64, f64)> {
    match event {
        TraceEvent::Span { ts_us, dur_us, .. } => Some((*ts_us, ts_us + dur_us)),
        TraceEvent::Counter { ts_us, .. } => Some((*ts_us, *ts_us)),
        TraceEvent::ThreadName { .. } => None,
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Slowest first; ties by session, then start, so the order is reproducible.
fn sort_slowest(slow: &mut [SlowSpan]) {
    slow.sort_by(|a, b| {
        b.dur_ms
            .total_cmp(&a.dur_ms)
            .then_with(|| a.session.cmp(&b.session))
            .then_with(|| a.start_ms.total_cmp(&b.start_ms))
    });
}

/// Nearest-rank percentile of ascending `sorted` values (0 when empty).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Total length covered by the intervals `(start, end)`.
fn union_length(mut spans: Vec<(f64, f64)>) -> f64 {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut current: Option<(f64, f64)> = None;
    for (s, e) in spans {
        current = match current {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    total + current.map_or(0.0, |(s, e)| e - s)
}

/// Most intervals open at one instant; an interval ending where another starts does not overlap.
fn max_overlap(spans: &[(f64, f64)]) -> u64 {
    let mut edges: Vec<(f64, i64)> = spans.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut open, mut most) = (0i64, 0i64);
    for (_, delta) in edges {
        open += delta;
        most = most.max(open);
    }
    most as u64
}

/// `key=value` pairs of a span's args, cut to [`ARGS_WIDTH`] characters.
fn summarize(args: &Map<String, Value>) -> String {
    let mut out = String::new();
    for (k, v) in args {
        if !out.is_empty() {
            out.push(' ');
        }
        match v {
            Value::String(s) => out.push_str(&format!("{k}={s}")),
            other => out.push_str(&format!("{k}={other}")),
        }
    }
    if out.chars().count() > ARGS_WIDTH {
        out = out.chars().take(ARGS_WIDTH - 3).collect::<String>() + "...";
    }
    out
}

/// Highest `mailbox_high_water` per actor over all lines of metrics.jsonl. The file is optional
/// and advisory: trouble with it becomes a warning, and a cut last line is expected after a kill.
fn mailbox_high_water(path: &Path, warnings: &mut Vec<String>) -> BTreeMap<String, u64> {
    let mut marks = BTreeMap::new();
    let text = match super::files::read_rotated(path) {
        Ok(text) => text,
        Err(e) => {
            warnings.push(format!(
                "{}: {e}; no mailbox high-water marks",
                path.display()
            ));
            return marks;
        }
    };
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    for (k, &(i, line)) in lines.iter().enumerate() {
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) if k + 1 == lines.len() => break,
            Err(e) => {
                warnings.push(format!("{}: line {}: {e}; skipped", path.display(), i + 1));
                continue;
            }
        };
        let Some(Value::Object(mb)) = value.get("mailbox_high_water") else {
            continue;
        };
        for (actor, depth) in mb {
            let Some(depth) = depth.as_u64().or_else(|| depth.as_f64().map(|f| f as u64)) else {
                continue;
            };
            let slot = marks.entry(actor.clone()).or_insert(0);
            *slot = depth.max(*slot);
        }
    }
    marks
}

/// The GPU timing lease's waits over all sessions, per party: each line of metrics.jsonl holds
/// its session's running totals (`lease_wait_ms`), so a total that drops marks a new session,
/// and the run's total is the sum of each session's last value. Unreadable lines are skipped
/// (the mailbox reader already warned about them).
fn lease_waits(path: &Path) -> BTreeMap<String, f64> {
    let Ok(text) = super::files::read_rotated(path) else {
        return BTreeMap::new();
    };
    // party -> (closed sessions' sum, current session's last value)
    let mut acc: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(Value::Object(waits)) = value.get("lease_wait_ms") else {
            continue;
        };
        for (party, ms) in waits {
            let Some(ms) = ms.as_f64() else { continue };
            let (closed, last) = acc.entry(party.clone()).or_insert((0.0, 0.0));
            if ms < *last {
                *closed += *last;
            }
            *last = ms;
        }
    }
    acc.into_iter()
        .map(|(party, (closed, last))| (party, closed + last))
        .collect()
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
