//! `kevin sweep` end to end: bad keys and values refused before anything starts; a sweep of two
//! values of one key stopped by SIGINT, resumed, then skipped; a failing variant that stops
//! nothing else; `kevin report` over the sweep's runs.
//!
//! The runs use the simulated policy, learner and environment (`policy.kind = "simulated"`): a
//! learner step takes about 0.2 s, so a sweep of two 20-step variants takes seconds. The real
//! burn policy of `configs/tiny-cpu.toml` would take minutes per variant on CI's 2 cores, and
//! nothing the sweep does depends on the components: its children are real `kevin train`
//! processes with real run directories, checkpoints and signals either way.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{assert_ok, jsonl, kevin, plot_lines, stderr};

/// Learner steps of every variant.
const MAX_STEPS: u64 = 20;

/// A fresh folder for one test with a fast simulated config of [`MAX_STEPS`] steps (`extra`
/// appended to it), and the sweep's folder inside it (not created).
fn setup(name: &str, extra: &str) -> (PathBuf, PathBuf) {
    let root = std::env::temp_dir().join(format!("kevin-sweep-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    std::fs::create_dir_all(&root).unwrap();
    let config = root.join("base.toml");
    let text = common::simulated_config(100.0, &format!("[run]\nmax_steps = {MAX_STEPS}\n{extra}"));
    std::fs::write(&config, text).unwrap();
    (config, root.join("sweep"))
}

/// `kevin sweep --config CONFIG --dir DIR ARGS`.
fn sweep(config: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut c = kevin();
    c.arg("sweep")
        .arg("--config")
        .arg(config)
        .arg("--dir")
        .arg(dir)
        .args(args);
    c
}

fn manifest(dir: &Path) -> Value {
    let path = dir.join("sweep.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// (name, status, version) of every variant in the manifest.
fn statuses(dir: &Path) -> Vec<(String, String, Option<u64>)> {
    manifest(dir)["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["status"].as_str().unwrap().to_string(),
                v["version"].as_u64(),
            )
        })
        .collect()
}

fn refused(out: &Output, expected: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{expected}: {out:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with(&format!("kevin: {expected}")),
        "expected {expected:?}, got {err}"
    );
}

#[test]
fn bad_keys_and_values_are_refused_before_anything_starts() {
    let (config, dir) = setup("refused", "");
    for (sets, expected) in [
        (
            &["--set", "learner.lrr=1e-4"][..],
            "--set learner.lrr=1e-4: unknown config key `learner.lrr` (from --set learner.lrr); allowed keys in [learner]",
        ),
        (
            &["--set", "rollout.turns=2,two"],
            "--set rollout.turns=two: config key `rollout.turns` = \"two\" is invalid",
        ),
        (
            &["--set", "run.mode=async,fast"],
            "--set run.mode=fast: config key `run.mode` = \"fast\" is invalid",
        ),
        (
            &["--set", "policy.burn=cpu"],
            "--set policy.burn: names the section [policy.burn], not a key",
        ),
        (
            &["--set", "Learner.lr=1"],
            "--set Learner.lr: not a config key",
        ),
        (
            &["--set", "run.name=a,b"],
            "--set run.name: the sweep names each run",
        ),
        (
            &["--set", "learner.lr=1e-4,1e-4"],
            "--set learner.lr: value 1e-4 is given twice",
        ),
        // A value that breaks a rule of the config names its variant.
        (
            &["--set", "learner.lr=0.5,2"],
            "variant learner.lr=2: config key `learner.lr` = 2 is invalid",
        ),
        // run.mode = "sync" needs max_staleness 0: alone it is refused ...
        (
            &["--set", "run.mode=async,sync"],
            "variant run.mode=sync: config key `replay.max_staleness` = 2 is invalid",
        ),
        (
            &[
                "--set",
                "learner.lr=1e-4,2e-4",
                "--set",
                "rollout.turns=2",
                "--zip",
            ],
            "--zip pairs values by position",
        ),
        (
            &["--set", "run.max_steps=0,4"],
            "variant run.max_steps=0: run.max_steps = 0 (train until stopped)",
        ),
    ] {
        refused(&sweep(&config, &dir, sets).output().unwrap(), expected);
        assert!(!dir.exists(), "{expected}: the sweep's folder was created");
    }

    // ... and paired with staleness 0 by --zip it is a plan; a dry run lists it and starts
    // nothing. A --parallel beyond the cores is lowered and says so.
    let out = sweep(
        &config,
        &dir,
        &[
            "--set",
            "run.mode=sync,async",
            "--set",
            "replay.max_staleness=0,2",
            "--zip",
            "--parallel",
            "999",
            "--dry-run",
        ],
    )
    .output()
    .unwrap();
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(
        rows[0].starts_with("| run.mode=sync,replay.max_staleness=0 | pending | -/20 |"),
        "{stdout}"
    );
    assert!(
        rows[1].starts_with("| run.mode=async,replay.max_staleness=2 | pending |"),
        "{stdout}"
    );
    assert!(
        stderr(&out).contains("--parallel 999: the runs use the CPU"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.exists(), "a dry run starts nothing");
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

/// Waits until the run in `run` has recorded `steps` learner steps, while `child` runs.
fn wait_for_steps(run: &Path, steps: usize, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while jsonl(&run.join("learner.jsonl")).len() < steps {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("kevin sweep exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "no learner step in {}",
            run.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sweep_stopped_by_sigint_resumes_the_unfinished_and_skips_the_finished() {
    let (config, dir) = setup("resume", "");
    let args = ["--set", "rollout.turns=2,3"];
    let (first, second) = (dir.join("rollout.turns=2"), dir.join("rollout.turns=3"));

    // Ctrl-C while the first variant trains: it drains and checkpoints; the second never starts.
    let mut child = sweep(&config, &dir, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_steps(&first, 2, &mut child);
    common::interrupt(&child);
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("stopped by signal"),
        "{out:?}"
    );
    assert!(
        stderr(&out).contains("SIGINT to 1 running variant(s) (rollout.turns=2)"),
        "{}",
        stderr(&out)
    );
    let s = statuses(&dir);
    let stopped_at = s[0].2.expect("the stopped variant checkpointed");
    assert!((1..MAX_STEPS).contains(&stopped_at), "{s:?}");
    assert_eq!(
        s,
        [
            ("rollout.turns=2".into(), "stopped".into(), Some(stopped_at)),
            ("rollout.turns=3".into(), "pending".into(), None),
        ]
    );
    assert!(
        !second.exists(),
        "the second variant started after the signal"
    );
    let log = std::fs::read_to_string(first.join("train.log")).unwrap();
    assert!(log.contains("kevin train: stopped by signal"), "{log}");
    // Reported now, the sweep is its one run with steps, and says which variant it left out.
    let out = kevin().arg("report").arg(&dir).output().unwrap();
    assert_ok(&out);
    assert!(
        stderr(&out).contains("variant rollout.turns=3 has no learner step yet"),
        "{}",
        stderr(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!(
            "kevin report: {stopped_at} learner steps, 7 plots in {}",
            dir.join("report").display()
        )),
        "{stdout}"
    );

    // The same command again: the first resumes from its checkpoint, the second runs.
    let out = sweep(&config, &dir, &args).output().unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    for v in ["rollout.turns=2", "rollout.turns=3"] {
        assert!(err.contains(&format!("sweep: {v} started")), "{err}");
        assert!(err.contains(&format!("sweep: {v} finished")), "{err}");
    }
    assert_eq!(
        statuses(&dir),
        [
            ("rollout.turns=2".into(), "finished".into(), Some(MAX_STEPS)),
            ("rollout.turns=3".into(), "finished".into(), Some(MAX_STEPS)),
        ]
    );
    let log = std::fs::read_to_string(first.join("train.log")).unwrap();
    assert!(log.contains(&format!("resumed from {stopped_at}")), "{log}");
    let versions: Vec<u64> = jsonl(&first.join("learner.jsonl"))
        .iter()
        .map(|s| s["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=MAX_STEPS).collect::<Vec<_>>());
    // Each variant ran with its own value and is named after it.
    let stored = std::fs::read_to_string(second.join("config.toml")).unwrap();
    let stored: toml::Table = stored.parse().unwrap();
    assert_eq!(stored["rollout"]["turns"].as_integer(), Some(3));
    assert_eq!(stored["run"]["name"].as_str(), Some("rollout.turns=3"));

    // Once more: both finished, nothing starts.
    let out = sweep(&config, &dir, &args).output().unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    assert!(!err.contains("started"), "{err}");
    for v in ["rollout.turns=2", "rollout.turns=3"] {
        assert!(
            err.contains(&format!(
                "sweep: {v} skipped: finished (learner version {MAX_STEPS})"
            )),
            "{err}"
        );
    }
    assert!(
        !first.join("trace-0003.json").exists(),
        "a finished variant ran again"
    );

    // The report over the sweep's folder: one line per run, labelled by the differing key.
    let json = dir.join("compare.json");
    let out = kevin()
        .arg("report")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_ok(&out);
    let (w, h, lines) = plot_lines(&dir.join("report").join("reward.png"));
    assert_eq!((w, h), (960, 540));
    assert_eq!(lines, [0, 1], "one line per run");
    let c: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(c["differing_keys"], serde_json::json!(["rollout.turns"]));
    let labels: Vec<&str> = c["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["rollout.turns=2", "rollout.turns=3"]);
    assert_eq!(c["runs"][1]["settings"]["rollout.turns"], 3);
    assert_eq!(c["runs"][0]["steps"], MAX_STEPS);
    assert_eq!(c["runs"][0]["sessions"], 2);
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}

#[test]
fn a_failing_variant_stops_no_other_and_a_changed_config_is_refused() {
    let (config, dir) = setup("failing", "");
    // The first variant's task suite is not there: its kevin train fails at set-up.
    let args = [
        "--set",
        "tasks.source=suite,simulated",
        "--set",
        "run.max_steps=2",
    ];
    let out = sweep(&config, &dir, &args)
        .env("KEVIN__TASKS__DIR", "/nonexistent-kevin-tasks")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("sweep: tasks.source=suite,run.max_steps=2 failed after"),
        "{err}"
    );
    assert!(
        err.contains("nonexistent-kevin-tasks"),
        "the log's tail: {err}"
    );
    assert!(err.contains("1 variant(s) failed"), "{err}");
    assert_eq!(
        statuses(&dir),
        [
            (
                "tasks.source=suite,run.max_steps=2".into(),
                "failed".into(),
                None
            ),
            (
                "tasks.source=simulated,run.max_steps=2".into(),
                "finished".into(),
                Some(2)
            ),
        ]
    );
    assert_eq!(manifest(&dir)["variants"][0]["exit_code"], 1);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("| tasks.source=suite,run.max_steps=2 | failed | -/2 | 1 |"),
        "{table}"
    );

    // The base config changes under the sweep's run directories: refused before anything starts.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("turns = 3", "turns = 2");
    std::fs::write(&config, text).unwrap();
    let out = sweep(&config, &dir, &args)
        .env("KEVIN__TASKS__DIR", "/nonexistent-kevin-tasks")
        .output()
        .unwrap();
    refused(
        &out,
        "variant tasks.source=suite,run.max_steps=2: its run directory",
    );
    assert!(
        stderr(&out).contains("was started with a different config (rollout.turns differs)"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(config.parent().unwrap());
}
