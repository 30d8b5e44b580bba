//! Reads Chrome trace-event files back, leniently: the file a killed daemon leaves is an
//! unterminated JSON array, possibly with a trailing comma and a torn last line, and it still
//! holds hours of useful trace. A complete document (an array, or an object with `traceEvents`)
//! is read as such; anything else is read one event per line, as [`super::chrome`] writes it.
//!
//! Only what [`inspect`](mod@super::inspect) needs is typed: complete events (`"ph":"X"`), thread names and
//! counters. Other phases are skipped. Damage anywhere but the last line is an error naming the
//! file and the line.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::inspect::InspectError;

/// One event of a trace file that inspection cares about.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceEvent {
    /// A complete event (`"ph":"X"`): one span.
    Span {
        /// The span name (the message or work name).
        name: String,
        /// `"message"` for a handled message, `"span"` for work nested in one; `None` when the
        /// writer did not say (then it counts as a message).
        cat: Option<String>,
        /// The track.
        tid: u64,
        /// Start, in microseconds.
        ts_us: f64,
        /// Duration, in microseconds.
        dur_us: f64,
        /// The span's fields.
        args: Map<String, Value>,
    },
    /// A `thread_name` metadata event: the name of a track.
    ThreadName {
        /// The track.
        tid: u64,
        /// Its name (the actor).
        name: String,
    },
    /// A counter sample (`"ph":"C"`).
    Counter {
        /// The counter's name.
        name: String,
        /// When, in microseconds.
        ts_us: f64,
        /// The sampled series.
        args: Map<String, Value>,
    },
}

/// The readable content of one trace file.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceFile {
    /// The file read.
    pub path: PathBuf,
    /// Its events, in file order.
    pub events: Vec<TraceEvent>,
    /// Whether the array was closed (`]`): the writer finished cleanly.
    pub complete: bool,
    /// Whether the last line was cut in the middle of an event and skipped.
    pub torn: bool,
}

/// Reads the trace file at `path`; see the module docs for what is tolerated.
pub fn read_trace(path: &Path) -> Result<TraceFile, InspectError> {
    let read = |path: &Path| -> std::io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut super::files::open_text(path)?, &mut bytes)?;
        Ok(bytes)
    };
    let bytes = read(path).map_err(|source| InspectError::Read {
        path: path.to_owned(),
        source,
    })?;
    // Lossy: a kill can cut a multi-byte character, and that only ever hits the torn last line.
    let text = String::from_utf8_lossy(&bytes);
    parse_trace(path, &text)
}

/// Parses trace text that came from `path` (named in errors).
pub fn parse_trace(path: &Path, text: &str) -> Result<TraceFile, InspectError> {
    let err = |at: String, message: String| InspectError::Parse {
        path: path.to_owned(),
        at,
        message,
    };
    let mut file = TraceFile {
        path: path.to_owned(),
        events: Vec::new(),
        complete: false,
        torn: false,
    };
    if let Ok(doc) = serde_json::from_str::<Value>(text) {
        let list = match doc {
            Value::Array(list) => list,
            Value::Object(mut obj) => match obj.remove("traceEvents") {
                Some(Value::Array(list)) => list,
                _ => return Err(err("top level".into(), "no traceEvents array".into())),
            },
            _ => return Err(err("top level".into(), "not a trace-event array".into())),
        };
        for (i, value) in list.into_iter().enumerate() {
            if let Some(event) = typed(value).map_err(|m| err(format!("event {}", i + 1), m))? {
                file.events.push(event);
            }
        }
        file.complete = true;
        return Ok(file);
    }

    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    match lines.first() {
        Some((_, l)) if l.starts_with('[') => {}
        Some((n, _)) => return Err(err(format!("line {n}"), "not a trace-event array".into())),
        None => return Ok(file), // created, then killed before anything was written
    }
    let last = lines.len() - 1;
    for (k, &(n, line)) in lines.iter().enumerate() {
        let mut body = line.strip_prefix('[').unwrap_or(line).trim();
        if let Some(rest) = body.strip_suffix(']') {
            file.complete = true;
            body = rest.trim();
        }
        let body = body.strip_suffix(',').unwrap_or(body).trim();
        if body.is_empty() {
            continue;
        }
        let value = match serde_json::from_str::<Value>(body) {
            Ok(v) => v,
            Err(_) if k == last => {
                file.torn = true;
                break;
            }
            Err(e) => return Err(err(format!("line {n}"), e.to_string())),
        };
        if let Some(event) = typed(value).map_err(|m| err(format!("line {n}"), m))? {
            file.events.push(event);
        }
    }
    Ok(file)
}

/// Types one event; `Ok(None)` for the phases inspection ignores.
fn typed(value: Value) -> Result<Option<TraceEvent>, String> {
    let Value::Object(mut obj) = value else {
        return Err("event is not an object".into());
    };
    let ph = match obj.get("ph") {
        Some(Value::String(ph)) => ph.clone(),
        _ => return Err("event has no \"ph\" string".into()),
    };
    let number = |obj: &Map<String, Value>, key: &str| -> Result<f64, String> {
        obj.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("\"ph\":\"{ph}\" event has no numeric \"{key}\""))
    };
    let string = |obj: &Map<String, Value>, key: &str| -> String {
        obj.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let tid = |obj: &Map<String, Value>| -> Result<u64, String> {
        obj.get("tid")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("\"ph\":\"{ph}\" event has no non-negative integer \"tid\""))
    };
    let args = match obj.remove("args") {
        Some(Value::Object(args)) => args,
        _ => Map::new(),
    };
    let event = match ph.as_str() {
        "X" => TraceEvent::Span {
            name: string(&obj, "name"),
            cat: obj.get("cat").and_then(Value::as_str).map(str::to_owned),
            tid: tid(&obj)?,
            ts_us: number(&obj, "ts")?,
            dur_us: number(&obj, "dur")?.max(0.0),
            args,
        },
        "M" if string(&obj, "name") == "thread_name" => TraceEvent::ThreadName {
            tid: tid(&obj)?,
            name: args
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        },
        "C" => TraceEvent::Counter {
            name: string(&obj, "name"),
            ts_us: number(&obj, "ts")?,
            args,
        },
        _ => return Ok(None),
    };
    Ok(Some(event))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPAN: &str = r#"{"name":"Compile","cat":"message","ph":"X","ts":1.5,"dur":2,"pid":1,"tid":1,"args":{"task":"relu"}}"#;
    const NAME: &str =
        r#"{"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"Compiler"}}"#;

    fn check(text: &str, events: usize, complete: bool, torn: bool) {
        let file = parse_trace(Path::new("trace.json"), text).unwrap();
        assert_eq!(
            (file.events.len(), file.complete, file.torn),
            (events, complete, torn),
            "for {text:?}"
        );
    }

    #[test]
    fn complete_and_cut_files() {
        check(&format!("[\n{NAME},\n{SPAN},\n{SPAN}\n]\n"), 3, true, false);
        check(&format!("[{NAME},{SPAN}]"), 2, true, false);
        check(&format!("{{\"traceEvents\":[{SPAN}]}}"), 1, true, false);
        check(&format!("[\n{NAME},\n{SPAN},\n"), 2, false, false); // trailing comma
        check(
            &format!("[\n{NAME},\n{SPAN},\n{}", &SPAN[..40]),
            2,
            false,
            true,
        ); // torn
        check(&format!("[\n{NAME},\n{SPAN}"), 2, false, false); // no comma yet
        check("[\n", 0, false, false);
        check("", 0, false, false);
    }

    #[test]
    fn damage_before_the_last_line_names_the_line() {
        let text = format!("[\n{NAME},\n{{\"ph\":,\n{SPAN},\n");
        let e = parse_trace(Path::new("runs/a/trace-1.json"), &text).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("runs/a/trace-1.json") && msg.contains("line 3"),
            "{msg}"
        );
    }

    #[test]
    fn span_without_ts_is_an_error_not_a_panic() {
        let text = "[\n{\"ph\":\"X\",\"dur\":1,\"tid\":1},\n{\"ph\":\"i\"}\n]";
        let msg = parse_trace(Path::new("t.json"), text)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("event 1") && msg.contains("\"ts\""), "{msg}");
    }
}
