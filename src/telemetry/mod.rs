//! Telemetry: where the time goes in a run, per actor.
//!
//! Three pieces, so a researcher can find the bottleneck actor of a days-long run:
//! - [`chrome`]: a `tracing` layer ([`ChromeLayer`]) that writes every actor span as a Chrome
//!   trace event (one track per actor; open the file in Perfetto) without ever blocking an actor,
//!   and keeps live per-actor totals ([`TraceStats`]) for metrics.jsonl;
//! - [`reader`]: a lenient reader of those files, which accepts the unterminated array a killed
//!   daemon leaves behind;
//! - [`inspect`](mod@inspect): the report behind `kevin inspect RUN_DIR`: busy and idle share, messages,
//!   latency mean and p99, mailbox high-water mark per actor, and the slowest spans.
//!
//! # Conventions the actors follow
//! - A span per handled message, named after the message (`"Compile"`, `"generate_batch"`), with a
//!   field `actor` naming its actor (`"Compiler"`); created when handling starts, dropped when the
//!   work for that message ends. Its event lasts from creation to close, on any threads between.
//! - Spans without an `actor` field inherit their parent's actor (they are drawn nested inside the
//!   message on its track and are not counted as messages); root spans without one go to the track
//!   [`OTHER_TRACK`]. Every other span field becomes an arg of the event.
//! - Queue depths and other sampled values: [`counter`], which emits a `TRACE`-level event with
//!   fields `counter` (the name) and `value` (a number) under target [`COUNTER_TARGET`]; the layer
//!   turns any event with those two fields into a Chrome counter event. Mailbox depths are
//!   counters named `mailbox.<actor>` ([`MAILBOX_COUNTER_PREFIX`]).
//! - One trace file per daemon session, at [`session_trace_path`] (`trace-0001.json`, ...), so a
//!   resumed run keeps every earlier session's trace; `kevin inspect` reads them all.
//! - Async handlers keep their span alive with `future.instrument(span)` (or by moving it into
//!   the future); the event closes when the future, and so the message's work, is done.
//!
//! Dependency direction: this folder imports nothing else of the crate (the actors and the
//! commands import it), so tracing, reading traces and `inspect` work on any run directory.

pub mod chrome;
pub mod files;
pub mod inspect;
pub mod reader;
mod report_text;
mod stats;

use std::io;
use std::path::{Path, PathBuf};

pub use chrome::{
    chrome_layer, chrome_layer_rotating, ChromeLayer, TraceGuard, TraceSummary, DEFAULT_CAPACITY,
};
pub use inspect::{
    inspect, window, ActorReport, InspectError, InspectReport, SessionReport, SlowSpan,
    WindowReport,
};
pub use stats::{CounterSnapshot, StatsSnapshot, TraceStats, TrackSnapshot};

/// The span field that names the actor (the trace track) a span belongs to.
pub const ACTOR_FIELD: &str = "actor";
/// The track of spans that have no actor, neither their own nor inherited.
pub const OTHER_TRACK: &str = "other";
/// The event field that makes an event a counter sample; its value is the counter's name.
pub const COUNTER_FIELD: &str = "counter";
/// The numeric event field that carries a counter sample's value.
pub const VALUE_FIELD: &str = "value";
/// Counters named `mailbox.<actor>` (e.g. `mailbox.Compiler`) sample that actor's mailbox depth;
/// `kevin inspect` reports their highest value as the actor's mailbox high-water mark.
pub const MAILBOX_COUNTER_PREFIX: &str = "mailbox.";
/// The target of events emitted by [`counter`]; filter it out of log output if it shows up.
pub const COUNTER_TARGET: &str = "kevin::telemetry::counter";

/// Samples counter `name` (e.g. `"mailbox.Compiler"`) at `value`: a Chrome counter event in the
/// trace, and the counter's last and highest values in [`TraceStats`].
///
/// It is an ordinary `tracing` event at `TRACE` level, so it reaches the layer only if no global
/// filter disables `TRACE` for [`COUNTER_TARGET`]: give the terminal output its own per-layer
/// filter (see [`chrome`]). Costs nothing when no subscriber listens.
pub fn counter(name: &str, value: f64) {
    tracing::trace!(target: COUNTER_TARGET, counter = name, value = value);
}

/// Where this daemon session writes its trace in `run_dir`: `trace-NNNN.json`, numbered one past
/// the highest session already there, so a resumed run never overwrites an earlier session's
/// trace and `kevin inspect` reads them all in order.
pub fn session_trace_path(run_dir: &Path) -> io::Result<PathBuf> {
    let mut last = 0;
    for entry in std::fs::read_dir(run_dir)? {
        let name = entry?.file_name();
        if let Some(n) = name.to_str().and_then(session_number) {
            last = last.max(n);
        }
    }
    Ok(run_dir.join(format!("trace-{:04}.json", last + 1)))
}

/// The session number of a file named `trace-N.json`.
fn session_number(file_name: &str) -> Option<u64> {
    file_name
        .strip_prefix("trace-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// The session and part of an archived part of a session's trace, `trace-N.pK.json[.gz]`.
fn session_part(file_name: &str) -> Option<(u64, u64)> {
    let rest = file_name.strip_prefix("trace-")?;
    let rest = rest
        .strip_suffix(".gz")
        .unwrap_or(rest)
        .strip_suffix(".json")?;
    let (session, part) = rest.split_once(".p")?;
    Some((session.parse().ok()?, part.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_paths_count_up_past_existing_ones() {
        let dir = std::env::temp_dir().join(format!("kevin-sessions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            session_trace_path(&dir).unwrap(),
            dir.join("trace-0001.json")
        );
        for name in [
            "trace-0001.json",
            "trace-9.json",
            "trace.json",
            "trace-x.json",
        ] {
            std::fs::write(dir.join(name), "[\n").unwrap();
        }
        assert_eq!(
            session_trace_path(&dir).unwrap(),
            dir.join("trace-0010.json")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
