//! Tests of `inspect` on hand-written run directories whose answers are known exactly.

use std::path::{Path, PathBuf};

use super::*;

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kevin-inspect-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn name(tid: u64, actor: &str) -> String {
    format!(r#"{{"name":"thread_name","ph":"M","pid":1,"tid":{tid},"args":{{"name":"{actor}"}}}}"#)
}

fn span(tid: u64, name: &str, cat: &str, ts: f64, dur: f64, args: &str) -> String {
    format!(
        r#"{{"name":"{name}","cat":"{cat}","ph":"X","ts":{ts},"dur":{dur},"pid":1,"tid":{tid},"args":{{{args}}}}}"#
    )
}

fn dropped(ts: f64, n: u64) -> String {
    format!(r#"{{"name":"trace_dropped","ph":"C","ts":{ts},"pid":1,"args":{{"dropped":{n}}}}}"#)
}

/// Writes `events` as the chrome writer does; `closed: false` leaves the array open with a
/// torn last line, as a kill does.
fn write_trace(path: &Path, events: &[String], closed: bool) {
    let mut text = String::from("[\n");
    for e in events {
        text.push_str(e);
        text.push_str(",\n");
    }
    if closed {
        text.push_str(&dropped(1000.0, 0));
        text.push_str("\n]\n");
    } else {
        text.push_str(r#"{"name":"Compile","ph":"X","ts":99"#);
    }
    std::fs::write(path, text).unwrap();
}

/// Two sessions of 1000 us each:
/// - trace-1 (closed): Compiler, a pool, handles [0,100] [50,250] [500,600]; Generator handles
///   [100,400] [400,500] with a nested `sample` span [150,200].
/// - trace-2 (killed): Generator handles [0,1000].
fn synthetic_run(test: &str) -> PathBuf {
    let dir = temp_dir(test);
    let first = [
        name(1, "Compiler"),
        name(2, "Generator"),
        dropped(0.0, 0),
        span(1, "Compile", "message", 0.0, 100.0, r#""task":"relu""#),
        span(
            1,
            "Compile",
            "message",
            50.0,
            200.0,
            r#""task":"gemm","turn":2"#,
        ),
        span(2, "sample", "span", 150.0, 50.0, ""),
        span(2, "generate_batch", "message", 100.0, 300.0, r#""batch":8"#),
        span(2, "generate_batch", "message", 400.0, 100.0, r#""batch":4"#),
        span(1, "Compile", "message", 500.0, 100.0, r#""task":"softmax""#),
    ];
    write_trace(&dir.join("trace-1.json"), &first, true);
    let second = [
        dropped(0.0, 0),
        r#"{"name":"mailbox.Verifier","ph":"C","ts":5,"pid":1,"args":{"value":4}}"#.to_owned(),
        name(1, "Generator"),
        span(1, "generate_batch", "message", 0.0, 1000.0, r#""batch":16"#),
    ];
    write_trace(&dir.join("trace-2.json"), &second, false);
    let metrics = concat!(
        r#"{"step":1,"mailbox_high_water":{"Compiler":3,"Generator":1}}"#,
        "\nnot json\n",
        r#"{"step":2,"mailbox_high_water":{"Compiler":7,"Learner":2}}"#,
        "\n",
        r#"{"step":3,"mailbox_hi"#,
    );
    std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
    std::fs::write(dir.join("episodes.jsonl"), "not a trace\n").unwrap();
    dir
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn busy_share_counts_latency_and_mailboxes_are_exact() {
    let dir = synthetic_run("exact");
    let report = inspect(&dir).unwrap();
    assert!(close(report.wall_ms, 2.0), "wall {}", report.wall_ms);
    let actors: Vec<&str> = report.actors.iter().map(|a| a.actor.as_str()).collect();
    assert_eq!(actors, ["Generator", "Compiler", "Learner", "Verifier"]);

    let g = &report.actors[0];
    // Union 400 + 1000 us of 2000; three messages of 300, 100, 1000 us.
    assert_eq!(
        (g.messages, g.concurrency, g.mailbox_high_water),
        (3, 1, Some(1))
    );
    assert!(close(g.busy_pct, 70.0) && close(g.idle_pct, 30.0) && close(g.busy_summed_pct, 70.0));
    assert!(close(g.mean_ms, 1.4 / 3.0) && close(g.p99_ms, 1.0));

    let c = &report.actors[1];
    // Union [0,250] + [500,600] = 350 us; summed 400 us; two overlap at once.
    assert_eq!(
        (c.messages, c.concurrency, c.mailbox_high_water),
        (3, 2, Some(7))
    );
    assert!(close(c.busy_pct, 17.5) && close(c.idle_pct, 82.5) && close(c.busy_summed_pct, 20.0));
    assert!(close(c.mean_ms, 0.4 / 3.0) && close(c.p99_ms, 0.2));

    let l = &report.actors[2];
    assert_eq!((l.messages, l.mailbox_high_water), (0, Some(2)));
    let v = &report.actors[3];
    assert_eq!(
        (v.messages, v.mailbox_high_water),
        (0, Some(4)),
        "from the trace's counter"
    );

    let slow: Vec<(&str, &str, f64, f64, &str)> = report
        .slowest
        .iter()
        .map(|s| {
            (
                s.actor.as_str(),
                s.name.as_str(),
                s.dur_ms,
                s.start_ms,
                s.session.as_str(),
            )
        })
        .collect();
    assert_eq!(
        slow,
        [
            ("Generator", "generate_batch", 1.0, 0.0, "trace-2.json"),
            ("Generator", "generate_batch", 0.3, 0.1, "trace-1.json"),
            ("Compiler", "Compile", 0.2, 0.05, "trace-1.json"),
            ("Compiler", "Compile", 0.1, 0.0, "trace-1.json"),
            ("Generator", "generate_batch", 0.1, 0.4, "trace-1.json"),
            ("Compiler", "Compile", 0.1, 0.5, "trace-1.json"),
            ("Generator", "sample", 0.05, 0.15, "trace-1.json"),
        ]
    );
    assert_eq!(report.slowest[2].args, "task=gemm turn=2");

    let sessions: Vec<(&str, bool, usize)> = report
        .sessions
        .iter()
        .map(|s| (s.file.as_str(), s.complete, s.spans))
        .collect();
    assert_eq!(
        sessions,
        [("trace-1.json", true, 6), ("trace-2.json", false, 1)]
    );
    assert_eq!(report.warnings.len(), 2, "{:?}", report.warnings);
    assert!(report.warnings[0].contains("metrics.jsonl") && report.warnings[0].contains("line 2"));
    assert!(report.warnings[1].contains("trace-2.json") && report.warnings[1].contains("torn"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_prints_aligned_tables_and_serializes() {
    let dir = synthetic_run("display");
    let report = inspect(&dir).unwrap();
    let text = report.to_string();
    let header = text
        .lines()
        .find(|l| l.contains("busy (summed) %"))
        .unwrap();
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("Compiler"))
        .unwrap();
    assert_eq!(
        header.find("idle %").map(|i| i + 6),
        row.find("82.5").map(|i| i + 4)
    );
    assert!(
        text.contains("20.0"),
        "pool shows its summed busy share:\n{text}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["actors"][0]["actor"], "Generator");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_metrics_is_a_warning_and_missing_traces_an_error() {
    let dir = temp_dir("missing");
    let err = inspect(&dir).unwrap_err();
    assert!(matches!(err, InspectError::NoTraceFiles { .. }), "{err}");
    assert!(err.to_string().contains(&*dir.to_string_lossy()));

    write_trace(
        &dir.join("trace.json"),
        &[span(1, "x", "message", 0.0, 10.0, "")],
        true,
    );
    let report = inspect(&dir).unwrap();
    assert_eq!(
        report.actors[0].actor, "tid 1",
        "an unnamed track is named by its id"
    );
    assert!(report.warnings[0].contains("metrics.jsonl"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_middle_line_names_file_and_line() {
    let dir = temp_dir("damaged");
    let text = format!("[\n{},\n{{oops,\n{},\n", name(1, "A"), dropped(1.0, 0));
    std::fs::write(dir.join("trace-1.json"), text).unwrap();
    let msg = inspect(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("trace-1.json") && msg.contains("line 3"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slowest_spans_survive_the_running_cut_and_sessions_sort_by_number() {
    let dir = temp_dir("many");
    let spans: Vec<String> = (0..100)
        .map(|i| {
            span(
                1,
                &format!("s{i}"),
                "message",
                (i * 100) as f64,
                ((i * 37) % 100) as f64,
                "",
            )
        })
        .collect();
    write_trace(&dir.join("trace-10.json"), &spans, true);
    write_trace(&dir.join("trace-9.json"), &[], true);
    let report = inspect(&dir).unwrap();
    let files: Vec<&str> = report.sessions.iter().map(|s| s.file.as_str()).collect();
    assert_eq!(files, ["trace-9.json", "trace-10.json"]);
    let mut want: Vec<(f64, String)> = (0..100)
        .map(|i| (((i * 37) % 100) as f64, format!("s{i}")))
        .collect();
    want.sort_by(|a, b| b.0.total_cmp(&a.0));
    let got: Vec<&str> = report.slowest.iter().map(|s| s.name.as_str()).collect();
    let want: Vec<&str> = want[..10].iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn window_counts_and_cuts_spans_at_its_end_in_the_first_session_only() {
    let dir = synthetic_run("window");
    // trace-1 runs from 0 to 1000 us; the first 300 us hold Compile [0,100] and [50,250], and
    // Generator [100,400] (cut to 300) with its nested [150,200]. trace-2 is not read.
    let w = window(&dir, 300e-6, "Compile", &["Compiler", "Generator"]).unwrap();
    assert_eq!(w.counted, 2);
    assert!((w.seconds - 300e-6).abs() < 1e-12);
    assert!((w.traced_s - 1000e-6).abs() < 1e-12);
    assert!((w.busy_pct["Compiler"] - 250.0 / 3.0).abs() < 1e-9);
    assert!((w.busy_pct["Generator"] - 200.0 / 3.0).abs() < 1e-9);
    assert!((w.union_busy_pct - 100.0).abs() < 1e-9);
    let only = window(&dir, 300e-6, "generate_batch", &["Generator"]).unwrap();
    assert_eq!(only.counted, 1);
    assert!((only.union_busy_pct - 200.0 / 3.0).abs() < 1e-9);
    // A window longer than the session is the session.
    let all = window(&dir, 10.0, "Compile", &[]).unwrap();
    assert_eq!(all.counted, 3);
    assert!((all.seconds - 1000e-6).abs() < 1e-12);
    assert_eq!(all.union_busy_pct, 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn window_of_a_directory_without_traces_names_it() {
    let dir = temp_dir("window-empty");
    let e = window(&dir, 1.0, "Compile", &[]).unwrap_err().to_string();
    assert!(
        e.contains("no trace file") && e.contains("window-empty"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lease_waits_add_up_over_sessions() {
    let dir = std::env::temp_dir().join(format!("kevin-inspect-lease-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("metrics.jsonl");
    // Session 1 ends at 30 ms of generator waits, session 2 starts again from 5; a line
    // without waits and a cut last line are skipped.
    std::fs::write(
        &path,
        "{\"step\":1,\"lease_wait_ms\":{\"generator.step\":10.0,\"evaluation.timing\":2.0}}\n\
         {\"step\":2}\n\
         {\"step\":3,\"lease_wait_ms\":{\"generator.step\":30.0,\"evaluation.timing\":4.0}}\n\
         {\"step\":4,\"lease_wait_ms\":{\"generator.step\":5.0}}\n\
         {\"step\":5,\"lease_wait_ms\":{\"gen",
    )
    .unwrap();
    let waits = lease_waits(&path);
    assert_eq!(waits["generator.step"], 35.0);
    assert_eq!(waits["evaluation.timing"], 4.0);
    assert!(lease_waits(&dir.join("missing.jsonl")).is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
