//! Tests of the chrome layer: real spans through a real subscriber into a real file.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tracing::dispatcher::{self, Dispatch};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Registry;

use super::*;
use crate::telemetry::reader::{read_trace, TraceEvent};
use crate::telemetry::StatsSnapshot;

/// A fresh directory under the system temp dir, unique per test and process.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kevin-telemetry-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn dispatch(layer: ChromeLayer) -> Dispatch {
    Dispatch::new(Registry::default().with(layer))
}

fn events_named<'a>(events: &'a [Value], ph: &str, name: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["ph"] == ph && e["name"] == name)
        .collect()
}

/// Runs a small actor system's worth of spans on several threads and returns the finished file.
fn traced_run(dir: &std::path::Path) -> (PathBuf, TraceSummary, StatsSnapshot) {
    let path = dir.join("trace-1.json");
    let (layer, guard) = chrome_layer(&path).unwrap();
    let d = dispatch(layer);
    let compiler = {
        let d = d.clone();
        std::thread::spawn(move || {
            dispatcher::with_default(&d, || {
                for task in 0..5u64 {
                    let span = tracing::info_span!("Compile", actor = "Compiler", task);
                    let _in = span.enter();
                    std::thread::sleep(Duration::from_millis(2));
                    let _nvrtc = tracing::info_span!("nvrtc").entered();
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
    };
    let generator = {
        let d = d.clone();
        std::thread::spawn(move || {
            dispatcher::with_default(&d, || {
                for _ in 0..4 {
                    let span =
                        tracing::info_span!("generate_batch", actor = "Generator", batch = 8);
                    span.in_scope(|| std::thread::sleep(Duration::from_millis(3)));
                    super::super::counter("mailbox.Generator", 2.0);
                }
            })
        })
    };
    // A message span started here and finished on another thread (as a blocking hand-off does).
    let moved = dispatcher::with_default(&d, || {
        tracing::info_span!("generate_batch", actor = "Generator", batch = 1)
    });
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2));
        drop(moved);
    })
    .join()
    .unwrap();
    dispatcher::with_default(&d, || tracing::info_span!("housekeeping").in_scope(|| {}));
    compiler.join().unwrap();
    generator.join().unwrap();
    let stats = guard.stats().snapshot();
    let summary = guard.finish().unwrap();
    (path, summary, stats)
}

#[test]
fn spans_of_several_actors_become_one_track_each() {
    let dir = temp_dir("tracks");
    let (path, summary, stats) = traced_run(&dir);
    let text = std::fs::read_to_string(&path).unwrap();
    let events: Vec<Value> = serde_json::from_str(&text).expect("a closed file is a JSON array");

    // One thread_name per track, and tracks named after the actors.
    let names: Vec<&str> = events_named(&events, "M", "thread_name")
        .iter()
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["Compiler", "Generator", OTHER_TRACK]);
    let tid_of = |actor: &str| {
        events_named(&events, "M", "thread_name")
            .iter()
            .find(|e| e["args"]["name"] == actor)
            .map(|e| e["tid"].as_u64().unwrap())
            .unwrap()
    };

    // Compile spans: on the Compiler track, args kept, sequential and non-overlapping.
    let compiles = events_named(&events, "X", "Compile");
    assert_eq!(compiles.len(), 5);
    let mut end_prev = 0.0;
    for (i, e) in compiles.iter().enumerate() {
        assert_eq!(e["tid"].as_u64(), Some(tid_of("Compiler")));
        assert_eq!(e["cat"], "message");
        assert_eq!(e["args"]["task"].as_u64(), Some(i as u64));
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(dur >= 3000.0, "Compile lasted {dur} us, slept 3 ms");
        assert!(
            ts >= end_prev,
            "Compile {i} starts before the previous one ended"
        );
        end_prev = ts + dur;
    }
    // nvrtc inherits the Compiler track, nests inside its Compile, and is not a message.
    let nvrtc = events_named(&events, "X", "nvrtc");
    assert_eq!(nvrtc.len(), 5);
    for (child, parent) in nvrtc.iter().zip(&compiles) {
        assert_eq!(child["tid"], parent["tid"]);
        assert_eq!(child["cat"], "span");
        let (cs, ps) = (
            child["ts"].as_f64().unwrap(),
            parent["ts"].as_f64().unwrap(),
        );
        let ce = cs + child["dur"].as_f64().unwrap();
        assert!(cs >= ps && ce <= ps + parent["dur"].as_f64().unwrap() + 0.001);
    }
    // The span moved to another thread is timed from creation to close.
    let batches = events_named(&events, "X", "generate_batch");
    assert_eq!(batches.len(), 5);
    assert!(batches
        .iter()
        .all(|e| e["tid"].as_u64() == Some(tid_of("Generator"))));
    let moved = batches.iter().find(|e| e["args"]["batch"] == 1).unwrap();
    assert!(moved["dur"].as_f64().unwrap() >= 2000.0);
    let other = events_named(&events, "X", "housekeeping");
    assert_eq!(other[0]["tid"].as_u64(), Some(tid_of(OTHER_TRACK)));

    // Counters, and the drop counter last.
    let samples = events_named(&events, "C", "mailbox.Generator");
    assert_eq!(samples.len(), 4);
    assert_eq!(samples[0]["args"]["value"], 2.0);
    let last = events.last().unwrap();
    assert_eq!(
        (&last["name"], &last["args"]["dropped"]),
        (&Value::from(DROPPED_COUNTER), &Value::from(0))
    );
    assert_eq!(
        summary,
        TraceSummary {
            events: 5 + 5 + 5 + 1 + 4,
            dropped: 0
        }
    );

    // Live stats count messages only.
    assert_eq!(stats.tracks["Compiler"].handled, 5);
    assert_eq!(stats.tracks["Generator"].handled, 5);
    assert_eq!(stats.tracks[OTHER_TRACK].handled, 1);
    assert!(stats.tracks["Compiler"].busy_us >= 15_000);
    assert_eq!(stats.counters["mailbox.Generator"].max, 2.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn live_stats_count_an_open_message_up_to_each_snapshot_on_its_actors_track() {
    let dir = temp_dir("open");
    let (layer, guard) = chrome_layer(&dir.join("trace-1.json")).unwrap();
    let stats = layer.stats();
    let d = dispatch(layer);
    let round = dispatcher::with_default(&d, || {
        tracing::info_span!("generate_round", actor = "Generator")
    });
    // Its actor named later, as a span declared with `actor = field::Empty` does.
    let step = dispatcher::with_default(&d, || {
        tracing::info_span!("train_step", actor = tracing::field::Empty)
    });
    step.record("actor", "Learner");
    std::thread::sleep(Duration::from_millis(20));
    let a = stats.snapshot();
    for actor in ["Generator", "Learner"] {
        let t = &a.tracks[actor];
        assert_eq!(t.handled, 0, "{actor}");
        assert!(
            t.busy_us >= 20_000,
            "{actor} open 20 ms, busy {} us",
            t.busy_us
        );
    }
    assert_eq!(a.tracks.get(OTHER_TRACK).map_or(0, |t| t.busy_us), 0);
    std::thread::sleep(Duration::from_millis(5));
    drop(round);
    drop(step);
    let b = stats.snapshot();
    let f = b.busy_fractions_since(&a);
    for actor in ["Generator", "Learner"] {
        assert_eq!(b.tracks[actor].handled, 1, "{actor}");
        assert!(
            f[actor] <= 1.0,
            "{actor}: {} of a window inside one message",
            f[actor]
        );
    }
    guard.finish().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_cut_by_a_kill_still_reads_up_to_the_cut() {
    let dir = temp_dir("cut");
    let (path, _, _) = traced_run(&dir);
    let full = std::fs::read(&path).unwrap();
    let whole = read_trace(&path).unwrap();
    assert!(whole.complete);
    // Cut at every tenth of the file: mid-line, just after a comma, inside the first line.
    for tenth in 0..10 {
        let cut = &full[..full.len() * tenth / 10];
        let cut_path = dir.join(format!("trace-cut{tenth}.json"));
        std::fs::write(&cut_path, cut).unwrap();
        let part = read_trace(&cut_path).unwrap_or_else(|e| panic!("cut at {tenth}/10: {e}"));
        assert!(!part.complete);
        assert!(part.events.len() <= whole.events.len());
        assert_eq!(
            part.events[..],
            whole.events[..part.events.len()],
            "not a prefix"
        );
        let spans = |evs: &[TraceEvent]| {
            evs.iter()
                .filter(|e| matches!(e, TraceEvent::Span { .. }))
                .count()
        };
        if tenth >= 5 {
            assert!(spans(&part.events) > 0, "half a file and no spans");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn records_beyond_a_full_channel_are_dropped_and_counted() {
    let dir = temp_dir("drops");
    let path = dir.join("trace.json");
    // No writer yet: the channel fills after two records, and the rest must not block.
    let (layer, rx) = unstarted_layer(2);
    let (tx, stats) = (layer.tx.clone(), layer.stats());
    let d = dispatch(layer);
    dispatcher::with_default(&d, || {
        for i in 0..10u64 {
            tracing::info_span!("Verify", actor = "Verifier", i).in_scope(|| {});
        }
    });
    assert_eq!(stats.dropped(), 8);
    // Drops are not messages lost to the live stats: those are counted before the hand-off.
    assert_eq!(stats.snapshot().tracks["Verifier"].handled, 10);

    let guard = start_writer(&path, 0, tx, rx, stats.clone()).unwrap();
    assert_eq!(
        guard.finish().unwrap(),
        TraceSummary {
            events: 2,
            dropped: 8
        }
    );
    let events: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let verifies = events_named(&events, "X", "Verify");
    let kept: Vec<u64> = verifies
        .iter()
        .map(|e| e["args"]["i"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, [0, 1]);
    assert_eq!(events.last().unwrap()["args"]["dropped"], 8);
    // After finish, records go nowhere, and are counted.
    dispatcher::with_default(&d, || {
        tracing::info_span!("late", actor = "Verifier").in_scope(|| {})
    });
    assert_eq!(stats.dropped(), 9);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rotated_session_is_gzipped_in_parts_and_inspected_as_one() {
    let dir = temp_dir("rotate");
    let path = dir.join("trace-0002.json");
    // About 200 bytes an event: a part every few events.
    let (layer, guard) = chrome_layer_rotating(&path, 1000).unwrap();
    let d = dispatch(layer);
    dispatcher::with_default(&d, || {
        for i in 0..60u64 {
            let actor = if i % 2 == 0 { "Verifier" } else { "Compiler" };
            tracing::info_span!("Work", actor, i).in_scope(|| {});
        }
    });
    let summary = guard.finish().unwrap();
    assert_eq!(summary.dropped, 0);
    let mut parts: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "trace-0002.json")
        .collect();
    parts.sort();
    assert!(parts.len() >= 5, "{parts:?}");
    assert!(
        parts.iter().all(|n| n.ends_with(".json.gz")),
        "every closed part is compressed: {parts:?}"
    );
    assert_eq!(parts[0], "trace-0002.p0001.json.gz");
    // Each part is a whole trace that names its tracks.
    let first = read_trace(&dir.join(&parts[1])).unwrap();
    assert!(first.complete);
    assert!(first
        .events
        .iter()
        .any(|e| matches!(e, TraceEvent::ThreadName { name, .. } if name == "Verifier")));
    let report = crate::telemetry::inspect::inspect(&dir).unwrap();
    assert_eq!(report.sessions.len(), 1, "{:?}", report.sessions);
    assert_eq!(report.sessions[0].spans, 60);
    assert!(report.sessions[0].complete);
    let messages: u64 = report.actors.iter().map(|a| a.messages).sum();
    assert_eq!(messages, 60);
    let _ = std::fs::remove_dir_all(&dir);
}
