//! `kevin report`: plots and summary of a synthetic run written with the real metrics record
//! type; corrupt lines skipped and named; resumed runs; the errors of a missing or empty run;
//! several runs compared (one line per run, labelled by the settings in which they differ).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kevin::metrics::{BatchSignals, StepMetrics};
use kevin_actors::cmd::report::{self, MetricsLog, ReportError, ReportOptions};

const PLOTS: [&str; 7] = [
    "reward.png",
    "correctness.png",
    "speedup.png",
    "staleness.png",
    "utilisation.png",
    "signal.png",
    "length.png",
];
/// The first line colour of every chart (plot.rs's palette), to show a line was drawn.
const FIRST_LINE_RGB: [u8; 3] = [31, 119, 180];

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kevin-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CONFIG: &str = r#"# resolved kevin config
[run]
name = "synthetic"
mode = "async"

[rollout]
trajectories = 4
turns = 2

[replay]
tasks_per_batch = 2
max_staleness = 2
"#;

/// Step `k` of the synthetic run: one session started at unix time 1000, a step every 10 s;
/// reward 0.1k +- 0.05; correct rate 0 at step 1, else 0.5, with mean speedup 0.5k; two groups of
/// lag 0 and two of lag 2; fixed busy fractions (Telemetry too idle to be drawn, Rollout busy
/// enough); responses of 100 + k tokens, a repeat rate of 0.01k, one flat group of the two.
fn step(k: u64) -> StepMetrics {
    let busy = [
        ("Generator", 0.5),
        ("Compiler", 1.5),
        ("Verifier", 0.2),
        ("Profiler", 0.1),
        ("Learner", 0.05),
        ("Rollout", 0.2),
        ("Telemetry", 0.001),
    ];
    StepMetrics {
        step: k,
        elapsed_s: 10.0 * k as f64,
        unix_s: 1000.0 + 10.0 * k as f64,
        reward_mean: 0.1 * k as f64,
        reward_std: Some(0.05),
        correct_rate: if k == 1 { 0.0 } else { 0.5 },
        mean_speedup: if k == 1 { 0.0 } else { 0.5 * k as f64 },
        staleness: BTreeMap::from([(0, 2), (2, 2)]),
        groups: 2,
        accepted_total: 2 * k,
        busy: busy.iter().map(|(a, b)| (a.to_string(), *b)).collect(),
        signals: Some(BatchSignals {
            response_tokens: 100.0 + k as f64,
            repeat_rate: 0.01 * k as f64,
            distinct_first: 1.0,
            advantage_abs_mean: 0.2,
            flat_groups: 1,
        }),
        ..Default::default()
    }
}

fn line(m: &StepMetrics) -> String {
    serde_json::to_string(m).unwrap()
}

/// A run directory with `config` (when given) and these metrics lines.
fn run_dir(name: &str, config: Option<&str>, lines: &[String]) -> PathBuf {
    let dir = tmp(name);
    if let Some(c) = config {
        std::fs::write(dir.join("config.toml"), c).unwrap();
    }
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
    dir
}

/// The synthetic run of ten steps, with a corrupt line 4 and a blank line 8.
fn synthetic_lines() -> Vec<String> {
    let mut lines: Vec<String> = (1..=10).map(|k| line(&step(k))).collect();
    lines.insert(3, r#"{"step": 4, "reward_mean": oops"#.into());
    lines.insert(7, String::new());
    lines
}

/// Decodes a PNG written by the report: (width, height, RGB bytes).
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{}: no PNG signature",
        path.display()
    );
    assert!(
        bytes.len() > 4000,
        "{}: only {} bytes",
        path.display(),
        bytes.len()
    );
    kevin_actors::cmd::report::png::decode_rgb(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts the summary's first-vs-last row of `label`.
fn check_row(summary: &str, label: &str, first: &str, last: &str, change: &str) {
    let row = format!("| {label} | {first} | {last} | {change} |");
    assert!(summary.contains(&row), "no row {row:?} in:\n{summary}");
}

#[test]
fn synthetic_run_gives_seven_plots_and_a_summary_with_its_numbers() {
    let dir = run_dir("synthetic", Some(CONFIG), &synthetic_lines());
    let r = report::write_report(&dir, &ReportOptions::default()).unwrap();
    assert_eq!(r.out, dir.join("report"));
    assert_eq!(r.steps, 10);
    assert_eq!(
        r.plots,
        PLOTS
            .iter()
            .map(|p| dir.join("report").join(p))
            .collect::<Vec<_>>()
    );
    for p in &r.plots {
        let (w, h, rgb) = decode(p);
        assert_eq!((w, h), (report::plot::WIDTH, report::plot::HEIGHT));
        assert!(
            rgb.chunks(3).any(|px| px == FIRST_LINE_RGB),
            "{}: no line drawn",
            p.display()
        );
        let dark = rgb
            .chunks(3)
            .filter(|px| px.iter().all(|c| *c < 80))
            .count();
        assert!(dark > 500, "{}: {dark} dark pixels, no text?", p.display());
    }

    // The corrupt line is skipped and named; nothing else is wrong.
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains("metrics.jsonl line 4:") && r.warnings[0].ends_with("(skipped)"),
        "{}",
        r.warnings[0]
    );

    let summary = std::fs::read_to_string(&r.summary).unwrap();
    assert!(
        summary.starts_with("# Run report: synthetic\n"),
        "{summary}"
    );
    for expected in [
        "| mode | async |",
        "| rollout | 4 trajectories x 2 turns per group, 2 tasks per batch, max staleness 2 |",
        "| learner steps | 10 (steps 1-10) |",
        "| daemon sessions | 1 |",
        "| wall time | 100.0 s (0.03 h), each session up to its last step |",
        // 20 groups x 4 trajectories in 100 s.
        "| trajectories/hour | 2880 generated (20 groups accepted x 4), 2880 trained (20 groups x 4) |",
        "| metrics.jsonl | 1 unreadable line(s) skipped, 0 redone step record(s) replaced |",
        "| series | first (steps 1-2) | last (steps 9-10) | change |",
        "line 4",
        "![Reward](reward.png)",
        "![Actor utilisation](utilisation.png)",
        "```toml\n# resolved kevin config\n[run]",
    ] {
        assert!(summary.contains(expected), "no {expected:?} in:\n{summary}");
    }
    check_row(&summary, "reward mean", "0.150", "0.950", "+0.800");
    check_row(&summary, "reward std", "0.050", "0.050", "+0.000");
    check_row(&summary, "correct rate", "0.250", "0.500", "+0.250");
    // Step 1 had no correct turn: its 0 is not a speedup, so the first window is step 2 alone.
    check_row(&summary, "mean speedup", "1.000", "4.750", "+3.750");
    check_row(&summary, "staleness: mean lag", "1.000", "1.000", "+0.000");
    check_row(&summary, "staleness: max lag", "2.000", "2.000", "+0.000");
    check_row(&summary, "busy: Compiler", "1.500", "1.500", "+0.000");
    check_row(&summary, "busy: Rollout", "0.200", "0.200", "+0.000");
    check_row(&summary, "repeat rate", "0.015", "0.095", "+0.080");
    check_row(&summary, "flat groups", "0.500", "0.500", "+0.000");
    check_row(&summary, "response tokens", "101.500", "109.500", "+8.000");
    // No series label breaks the summary's markdown table with a pipe of its own.
    for m in &r.means {
        assert!(!m.series.contains('|'), "{:?}", m.series);
    }
    check_row(&summary, "mean abs advantage", "0.200", "0.200", "+0.000");
    assert!(!summary.contains("busy: Telemetry"), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_writes_to_out_and_counts_the_skipped_line() {
    let dir = run_dir("cli", Some(CONFIG), &synthetic_lines());
    let out = dir.join("elsewhere");
    let o = Command::new(env!("CARGO_BIN_EXE_kevin"))
        .args([
            "report",
            dir.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .args(["--window", "3"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.starts_with("kevin report: 1 warning(s):\n"),
        "{stderr}"
    );
    assert!(stderr.contains("metrics.jsonl line 4:"), "{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "kevin report: 10 learner steps, 7 plots in {}\n",
            out.display()
        )),
        "{stdout}"
    );
    for f in PLOTS.iter().chain(&["summary.md"]) {
        assert!(out.join(f).is_file(), "{f} not in {}", out.display());
        assert!(stdout.contains(&*out.join(f).to_string_lossy()), "{stdout}");
    }
    assert!(!dir.join("report").exists());
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    check_row(&summary, "reward mean", "0.200", "0.900", "+0.700");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_run_dir_is_a_one_line_error_naming_it() {
    let missing = std::env::temp_dir().join(format!("kevin-report-nothing-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_kevin"))
        .args(["report", missing.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "kevin: run directory {} does not exist\n",
            missing.display()
        )
    );
    assert!(o.stdout.is_empty());
}

#[test]
fn runs_that_cannot_be_reported_say_why_and_name_the_file() {
    let cases: [(&str, Option<&[&str]>, &str); 3] = [
        (
            "no-metrics",
            None,
            " does not exist: not a kevin run directory, or the run has not finished a learner step yet",
        ),
        ("empty", Some(&[]), ": no learner step recorded"),
        (
            "all-corrupt",
            Some(&["{\"step\": 1,", "not json"]),
            ": no learner step recorded (2 unreadable lines skipped)",
        ),
    ];
    for (name, lines, expected) in cases {
        let dir = tmp(name);
        let metrics = dir.join("metrics.jsonl");
        if let Some(lines) = lines {
            std::fs::write(&metrics, lines.join("\n")).unwrap();
        }
        let err = report::write_report(&dir, &ReportOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}{expected}", metrics.display()),
            "{name}"
        );
        assert!(!dir.join("report").exists(), "{name}: wrote a report");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let file = tmp("file").join("metrics.jsonl");
    std::fs::write(&file, "").unwrap();
    assert!(matches!(
        report::write_report(&file, &ReportOptions::default()),
        Err(ReportError::NotADir(p)) if p == file
    ));
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
fn a_run_without_tracing_or_reward_spread_skips_those_plots_and_says_so() {
    // As an older kevin wrote it: no reward_std key; tracing off, so no busy fractions. No config.
    let lines: Vec<String> = (1..=3)
        .map(|k| {
            let m = StepMetrics {
                reward_std: None,
                busy: BTreeMap::new(),
                ..step(k)
            };
            let l = line(&m);
            assert!(!l.contains("reward_std"));
            l
        })
        .collect();
    let dir = run_dir("untraced", None, &lines);
    let r = report::write_report(&dir, &ReportOptions::default()).unwrap();
    let names: Vec<_> = r
        .plots
        .iter()
        .map(|p| p.file_name().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        PLOTS
            .iter()
            .filter(|p| **p != "utilisation.png")
            .map(Into::into)
            .collect::<Vec<std::ffi::OsString>>()
    );
    assert!(
        r.warnings.iter().any(|w| w
            .contains("actor busy fractions not recorded at any step; utilisation.png not drawn")),
        "{:?}",
        r.warnings
    );
    assert!(
        r.warnings.iter().any(|w| w.contains("config.toml")),
        "{:?}",
        r.warnings
    );
    let summary = std::fs::read_to_string(&r.summary).unwrap();
    assert!(
        summary.starts_with("# Run report: kevin-report-untraced-"),
        "{summary}"
    );
    assert!(summary.contains("unknown (no rollout.trajectories in the config); groups/hour: 720 accepted, 720 trained"), "{summary}");
    assert!(
        summary.contains("- actor busy fractions: not recorded, no plot"),
        "{summary}"
    );
    assert!(!summary.contains("reward std"), "{summary}");
    // Without a recorded spread the reward axis does not promise a band.
    let log = MetricsLog::read(&dir.join("metrics.jsonl")).unwrap();
    let charts = report::series::charts(&log.steps);
    assert_eq!(charts[0].y_label, "turn score (batch mean)");
    assert_eq!(charts[0].lines[0].spread, None);
    check_row(&summary, "reward mean", "0.100", "0.300", "+0.200");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_run_counts_its_sessions_and_keeps_the_redone_steps() {
    // Session 1 (started at 1000): steps 1-3, the last at 30 s. Session 2 (started at 5000)
    // resumed from the checkpoint of step 2: step 3 again, then 4, at 5 and 10 s.
    let mut records: Vec<StepMetrics> = (1..=3).map(step).collect();
    for (k, elapsed) in [(3, 5.0), (4, 10.0)] {
        records.push(StepMetrics {
            elapsed_s: elapsed,
            unix_s: 5000.0 + elapsed,
            reward_mean: 7.0,
            ..step(k)
        });
    }
    let text: String = records.iter().map(|m| line(m) + "\n").collect();
    let log = MetricsLog::parse(Path::new("metrics.jsonl"), &text);
    assert_eq!(log.sessions, 2);
    assert_eq!(log.wall_s, 40.0);
    assert_eq!(log.redone, 1);
    assert_eq!(
        log.steps
            .iter()
            .map(|m| (m.step, m.reward_mean))
            .collect::<Vec<_>>(),
        vec![(1, 0.1), (2, 0.2), (3, 7.0), (4, 7.0)]
    );
    assert!(log.skipped.is_empty());
}

/// The config of compared run `name` with learning rate `lr`.
fn config_with(name: &str, lr: &str) -> String {
    CONFIG.replace(
        "name = \"synthetic\"",
        &format!("name = \"{name}\"\n[learner]\nlr = {lr}"),
    )
}

#[test]
fn several_runs_are_drawn_one_colour_each_and_compared_by_their_differing_settings() {
    let root = tmp("compare");
    // Three runs that differ in learner.lr (and in run.name, which is not a setting); the third
    // has a higher reward at every step and only six steps.
    let mut dirs = Vec::new();
    for (i, (lr, steps)) in [("0.0001", 10), ("0.0003", 10), ("0.001", 6)]
        .iter()
        .enumerate()
    {
        let dir = root.join(format!("run-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.toml"), config_with(&format!("r{i}"), lr)).unwrap();
        let text: String = (1..=*steps)
            .map(|k| {
                let m = StepMetrics {
                    reward_mean: step(k).reward_mean + 0.4 * i as f64,
                    ..step(k)
                };
                line(&m) + "\n"
            })
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
        dirs.push(dir);
    }
    let json = root.join("compare.json");
    let o = Command::new(env!("CARGO_BIN_EXE_kevin"))
        .arg("report")
        .args(&dirs)
        .args(["--window", "2", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The runs share a folder: the comparison goes to its report/.
    let out = root.canonicalize().unwrap().join("report");
    assert!(
        stdout.starts_with(&format!(
            "kevin report: 3 runs differing in learner.lr, 9 plots in {}\n",
            out.display()
        )),
        "{stdout}"
    );
    for f in PLOTS[..4].iter().chain(&[
        "utilisation-generator.png",
        "utilisation-learner.png",
        "summary.md",
    ]) {
        assert!(out.join(f).is_file(), "{f} not in {}", out.display());
    }
    let (w, h, lines) = common::plot_lines(&out.join("reward.png"));
    assert_eq!((w, h), (report::plot::WIDTH, report::plot::HEIGHT));
    assert_eq!(lines, [0, 1, 2], "one line per run");
    // The runs' other series are equal, so the last run's line covers the others.
    for f in PLOTS[1..4].iter().chain(&["utilisation-compiler.png"]) {
        let (w, h, lines) = common::plot_lines(&out.join(f));
        assert_eq!((w, h), (report::plot::WIDTH, report::plot::HEIGHT));
        assert!(lines.contains(&2), "{f}: {lines:?}");
    }

    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.starts_with("# Comparison of 3 runs\n"), "{summary}");
    assert!(
        summary.contains("They differ in `learner.lr`;"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "| run | learner.lr | steps | window | wall time (s) | trajectories/hour | reward first \
             | reward last | correct rate first | correct rate last |"
        ),
        "{summary}"
    );
    // Rewards 0.1k (+0.4 for the third run); windows of 2 steps; 2 groups of 4 per 10 s.
    for row in [
        "| run-0 | 0.0001 | 10 | 2 | 100.0 | 2880 | 0.150 | 0.950 | 0.250 | 0.500 |",
        "| run-2 | 0.001 | 6 | 2 | 60.0 | 2880 | 0.950 | 1.350 | 0.250 | 0.500 |",
    ] {
        assert!(summary.contains(row), "no {row:?} in:\n{summary}");
    }
    assert!(summary.contains("![Reward](reward.png)"), "{summary}");

    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(c["differing_keys"], serde_json::json!(["learner.lr"]));
    assert_eq!(c["runs"].as_array().unwrap().len(), 3);
    assert_eq!(c["runs"][1]["label"], "learner.lr=0.0003");
    assert_eq!(c["runs"][1]["name"], "r1");
    assert_eq!(c["runs"][1]["settings"]["learner.lr"], 0.0003);
    assert_eq!(c["runs"][2]["steps"], 6);
    let reward = c["runs"][0]["means"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["series"] == "reward mean")
        .unwrap();
    let close = |v: &serde_json::Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
    assert!(
        close(&reward["first"], 0.15) && close(&reward["last"], 0.95),
        "{reward}"
    );
    assert_eq!(c["plots"].as_array().unwrap().len(), 9);

    // Runs in different folders need --out.
    let elsewhere = tmp("compare-elsewhere");
    let moved = elsewhere.join("run-0");
    std::fs::rename(&dirs[0], &moved).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kevin"))
        .arg("report")
        .arg(&moved)
        .arg(&dirs[1])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "kevin: the runs are in different folders: name the comparison's output folder with --out\n"
    );
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&elsewhere);
}
