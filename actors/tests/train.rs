//! End-to-end tests of `kevin train` with the simulated components: the real binary, the real
//! actor system, real files. They check that groups flow in async and sync mode, stale groups are
//! dropped and counted, the learner version advances, a stopped run resumes, a kill -9 loses no
//! accepted group and trains none twice, component panics are survived, and bad configs exit 2.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{assert_ok, cpu_backend_available, jsonl, kevin, wal_records};

/// A fresh directory for one test, with a config file made of the fast base plus `extra`.
fn setup(name: &str, extra: &str) -> (PathBuf, PathBuf) {
    let root = std::env::temp_dir().join(format!("kevin-it-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    std::fs::create_dir_all(&root).unwrap();
    let config = root.join("config.toml");
    std::fs::write(&config, common::simulated_config(2.0, extra)).unwrap();
    (root.join("run"), config)
}

fn train(run: &Path, config: &Path, max_steps: u64) -> Output {
    kevin()
        .args(["train", "--config"])
        .arg(config)
        .arg("--run-dir")
        .arg(run)
        .args(["--max-steps", &max_steps.to_string()])
        .output()
        .unwrap()
}

fn seqs(v: &Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// Every accepted group is consumed exactly once by the learner's record or is still pending in
/// the newest checkpoint; nothing is consumed twice. Accepted groups are numbered 0, 1, ... with
/// no gap, so what was accepted is 0..n, n from the newest checkpoint's counter (a clean stop
/// checkpoints last); a pending group must still be in the write-ahead log, whose covered
/// segments compaction deletes.
fn check_no_loss_no_duplicates(run: &Path) {
    let wal: Vec<u64> = wal_seqs(run);
    let wal_set: BTreeSet<u64> = wal.iter().copied().collect();
    assert_eq!(wal.len(), wal_set.len(), "WAL sequence numbers are unique");
    let mut consumed: BTreeMap<u64, u32> = BTreeMap::new();
    // The whole record: archived lines too.
    for step in kevin::run_dir::read_all_steps(run).unwrap() {
        for &s in step.trained.iter().chain(&step.dropped) {
            *consumed.entry(s).or_default() += 1;
        }
    }
    let twice: Vec<_> = consumed.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "groups consumed twice: {twice:?}");
    let ckpt = newest_checkpoint(run);
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("state.json")).unwrap()).unwrap();
    let pending: BTreeSet<u64> = seqs(&state, "replay_pending").into_iter().collect();
    let accepted = state["counters"]["groups_accepted"].as_u64().unwrap();
    for s in 0..accepted {
        let c = consumed.contains_key(&s);
        let p = pending.contains(&s);
        assert!(
            c ^ p,
            "group {s}: consumed={c} pending={p} (must be exactly one)"
        );
        assert!(
            !p || wal_set.contains(&s),
            "group {s} is pending but not in the write-ahead log"
        );
    }
    for s in consumed.keys().chain(&wal_set) {
        assert!(
            *s < accepted,
            "group {s} is consumed or logged, but only {accepted} were accepted"
        );
    }
}

/// The sequence numbers in the run's write-ahead log, oldest first.
fn wal_seqs(run: &Path) -> Vec<u64> {
    wal_records(run)
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect()
}

/// The number of write-ahead log segments on disk.
fn wal_segments(run: &Path) -> usize {
    kevin::wal::segments(&run.join(kevin::wal::WAL_DIR))
        .unwrap()
        .len()
}

fn newest_checkpoint(run: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("step-")
        })
        .collect();
    dirs.sort();
    dirs.pop().expect("a checkpoint")
}

#[test]
fn async_run_writes_everything_and_inspect_reads_it() {
    let (run, config) = setup("async", "");
    let out = train(&run, &config, 4);
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("learner version 4"), "{stdout}");
    for f in [
        "config.toml",
        "metrics.jsonl",
        "episodes.jsonl",
        "trace-0001.json",
        "wal",
        "learner.jsonl",
    ] {
        assert!(run.join(f).exists(), "{f} missing");
    }
    let metrics = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(
        metrics
            .iter()
            .map(|m| m["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    for m in &metrics {
        assert_eq!(m["groups"], 2);
        for key in [
            "reward_mean",
            "correct_rate",
            "mean_speedup",
            "staleness",
            "mailbox_high_water",
            "busy",
            "dropped_total",
        ] {
            assert!(!m[key].is_null(), "metrics lack {key}: {m}");
        }
    }
    let episodes = jsonl(&run.join("episodes.jsonl"));
    assert!(
        episodes.len() >= 4 * 2 * 4 * 3,
        "every turn of every trained group is recorded"
    );
    assert!(episodes
        .iter()
        .all(|e| e["prompt"].is_string() && e["outcome"]["kind"].is_string()));
    // Later turns see the history.
    assert!(episodes
        .iter()
        .any(|e| e["turn"] == 2 && e["prompt"].as_str().unwrap().contains("### Turn 2")));
    // The trace is a complete JSON array after a clean stop.
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("trace-0001.json")).unwrap())
            .unwrap();
    assert!(trace.as_array().unwrap().len() > 50);
    check_no_loss_no_duplicates(&run);

    let out = kevin().arg("inspect").arg(&run).output().unwrap();
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for actor in [
        "Generator",
        "Compiler",
        "Verifier",
        "Profiler",
        "ReplayQueue",
        "Learner",
        "Rollout",
    ] {
        assert!(text.contains(actor), "inspect lacks {actor}:\n{text}");
    }
    assert!(text.contains("slowest spans"), "{text}");
}

#[test]
fn sync_mode_trains_on_policy() {
    let (run, config) = setup(
        "sync",
        "[run]\nmode = \"sync\"\n[replay]\nmax_staleness = 0\n[rollout]\nmax_inflight_groups = 2\n",
    );
    assert_ok(&train(&run, &config, 3));
    let metrics = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 3);
    for m in &metrics {
        let st = m["staleness"].as_object().unwrap();
        assert_eq!(
            st.keys().collect::<Vec<_>>(),
            vec!["0"],
            "sync groups are on-policy: {m}"
        );
        assert_eq!(m["dropped"], 0);
    }
    // Each round's groups were sampled by the version the learner then trained.
    let versions: BTreeSet<u64> = jsonl(&run.join("episodes.jsonl"))
        .iter()
        .map(|e| e["policy_version"].as_u64().unwrap())
        .collect();
    // (Groups of version 3 may have started before the stop and been drained into the queue.)
    assert!(
        versions.is_superset(&BTreeSet::from([0, 1, 2])) && versions.iter().all(|v| *v <= 3),
        "{versions:?}"
    );
}

#[test]
fn stale_groups_are_dropped_and_counted() {
    // A slow generator, a fast learner, many groups in flight and no staleness allowed: groups
    // started before the last update are stale by the time the learner sees them.
    let (run, config) = setup(
        "stale",
        "[replay]\nmax_staleness = 0\ntasks_per_batch = 1\n[rollout]\nmax_inflight_groups = 8\n[policy.simulated]\nbatch_ms = 5.0\n",
    );
    assert_ok(&train(&run, &config, 5));
    let metrics = jsonl(&run.join("metrics.jsonl"));
    let dropped: u64 = metrics.iter().map(|m| m["dropped"].as_u64().unwrap()).sum();
    assert!(dropped > 0, "no group was dropped: {metrics:?}");
    assert_eq!(
        metrics.last().unwrap()["dropped_total"].as_u64().unwrap(),
        dropped
    );
    let recorded: usize = jsonl(&run.join("learner.jsonl"))
        .iter()
        .map(|s| seqs(s, "dropped").len())
        .sum();
    assert_eq!(
        recorded as u64, dropped,
        "drops are in the learner's record"
    );
    check_no_loss_no_duplicates(&run);
}

fn wait_for_steps(run: &Path, steps: usize, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while jsonl(&run.join("learner.jsonl")).len() < steps {
        assert!(child.try_wait().unwrap().is_none(), "kevin exited early");
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_train(run: &Path, config: &Path) -> Child {
    kevin()
        .args(["train", "--config"])
        .arg(config)
        .arg("--run-dir")
        .arg(run)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sigint_checkpoints_and_the_run_resumes() {
    let (run, config) = setup("resume", "[policy.simulated]\nbatch_ms = 5.0\n");
    let mut child = spawn_train(&run, &config);
    wait_for_steps(&run, 3, &mut child);
    common::interrupt(&child);
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    let stopped_at = jsonl(&run.join("learner.jsonl")).len() as u64;
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped by signal"));
    assert!(
        newest_checkpoint(&run).ends_with(format!("step-{stopped_at:08}")),
        "final checkpoint at the last step"
    );
    check_no_loss_no_duplicates(&run);

    // Resume without --config: the stored config is used; --max-steps counts learner versions.
    let out = kevin()
        .arg("train")
        .arg("--run-dir")
        .arg(&run)
        .args(["--max-steps", &(stopped_at + 2).to_string()])
        .output()
        .unwrap();
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("resumed from {stopped_at}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("learner version {}", stopped_at + 2)),
        "{stdout}"
    );
    let steps: Vec<u64> = jsonl(&run.join("learner.jsonl"))
        .iter()
        .map(|s| s["version"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=stopped_at + 2).collect::<Vec<_>>());
    assert!(
        run.join("trace-0002.json").exists(),
        "one trace file per session"
    );
    check_no_loss_no_duplicates(&run);

    // A different config on the same run directory is refused with exit code 2.
    let (_, other) = setup(
        "resume-other",
        "[policy.simulated]\nbatch_ms = 5.0\n[rollout]\nturns = 2\n",
    );
    let out = train(&run, &other, 10);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rollout.turns differs"), "{stderr}");
}

#[test]
fn prometheus_scrapes_the_running_daemon_and_a_taken_port_stops_it_with_the_key() {
    let addr = format!("127.0.0.1:{}", free_port());
    let (run, config) = setup(
        "prometheus",
        &format!("[policy.simulated]\nbatch_ms = 5.0\n[telemetry]\nprometheus = \"{addr}\"\n"),
    );
    let mut child = spawn_train(&run, &config);
    wait_for_steps(&run, 3, &mut child);
    let body = kevin::prometheus::scrape(&addr).unwrap();
    let value = |series: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{body}"))
    };
    assert!(value("kevin_learner_version") >= 1.0);
    assert!(value("kevin_groups_accepted_total") >= 1.0);
    assert!(value("kevin_groups_recorded_total") >= 1.0);
    assert!(body.contains("kevin_turns_total{outcome=\""), "{body}");
    assert!(
        body.contains("kevin_mailbox_high_water{actor=\"Generator\"}"),
        "{body}"
    );
    assert!(
        body.contains("# TYPE kevin_learner_tokens_total counter"),
        "{body}"
    );

    // A second daemon asking for the same port is stopped before it starts, naming the key.
    let (run2, config2) = setup(
        "prometheus-taken",
        &format!("[telemetry]\nprometheus = \"{addr}\"\n"),
    );
    let out = train(&run2, &config2, 2);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("telemetry.prometheus") && stderr.contains(&addr),
        "{stderr}"
    );

    common::interrupt(&child);
    assert_ok(&child.wait_with_output().unwrap());
    assert!(
        kevin::prometheus::scrape(&addr).is_err(),
        "the endpoint ends with the daemon"
    );
    check_no_loss_no_duplicates(&run);
}

/// A free loopback port (bound, then released for the process that takes it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's `prometheus` and `promtool`, or a skip (a failure under
/// `KEVIN_REQUIRE_PROMETHEUS=1`, which CI sets after installing them).
fn prometheus_available() -> bool {
    let found = ["prometheus", "promtool"].iter().all(|b| {
        std::process::Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found && std::env::var("KEVIN_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
        panic!("KEVIN_REQUIRE_PROMETHEUS=1 but prometheus or promtool is not on PATH");
    }
    if !found {
        eprintln!(
            "skipping: prometheus and promtool are not installed (apt-get install prometheus)"
        );
    }
    found
}

#[test]
fn a_real_prometheus_scrapes_the_daemon_and_promtool_accepts_the_exposition() {
    if !prometheus_available() {
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let (run, config) = setup(
        "prometheus-real",
        &format!("[policy.simulated]\nbatch_ms = 5.0\n[telemetry]\nprometheus = \"{addr}\"\n"),
    );
    let mut child = spawn_train(&run, &config);
    wait_for_steps(&run, 2, &mut child);

    // promtool's linter: names, units, counters' _total, HELP and TYPE.
    let body = kevin::prometheus::scrape(&addr).unwrap();
    let mut lint = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    lint.stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success() && lint.stdout.is_empty() && lint.stderr.is_empty(),
        "promtool: {}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    // A Prometheus server scraping it every second, asked through its HTTP API.
    let dir = run.parent().unwrap().join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let prom_addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: kevin\n    \
             static_configs: [{{targets: [\"{addr}\"]}}]\n"
        ),
    )
    .unwrap();
    let mut prom = std::process::Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap();
    let query = |q: &str| -> Option<f64> {
        let body =
            kevin::prometheus::http_get(&prom_addr, &format!("/api/v1/query?query={q}")).ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = None;
    while Instant::now() < deadline {
        if let (Some(up), Some(version)) = (query("up"), query("kevin_learner_version")) {
            seen = Some((up, version));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let _ = prom.kill();
    let _ = prom.wait();
    common::interrupt(&child);
    assert_ok(&child.wait_with_output().unwrap());
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let (up, version) = seen.unwrap_or_else(|| panic!("Prometheus never scraped kevin:\n{log}"));
    assert_eq!(up, 1.0, "the target is up");
    assert!(version >= 1.0, "kevin_learner_version = {version}");
}

#[test]
fn kill_9_loses_no_accepted_group_and_trains_none_twice() {
    // 1 KiB segments (a group each) and a checkpoint every 3 steps: compaction runs at every
    // checkpoint, so the kill may land in it.
    let (run, config) = setup(
        "kill9",
        "[run]\ncheckpoint_every = 3\n[replay]\nwal_segment_kb = 1\n[policy.simulated]\nbatch_ms = 3.0\n",
    );
    let mut child = spawn_train(&run, &config);
    wait_for_steps(&run, 5, &mut child);
    child.kill().unwrap(); // SIGKILL: no drain, no final checkpoint
    child.wait().unwrap();
    let steps_before = jsonl(&run.join("learner.jsonl")).len() as u64;
    let accepted_before = wal_seqs(&run).last().map_or(0, |s| s + 1);
    assert!(
        wal_segments(&run) < accepted_before as usize,
        "segments the checkpoint covers are deleted ({} segments for {accepted_before} groups)",
        wal_segments(&run)
    );
    // Simulate a checkpoint torn by the kill: a newer checkpoint folder without its manifest.
    let torn = run
        .join("checkpoints")
        .join(format!("step-{:08}", steps_before + 100));
    std::fs::create_dir_all(torn.join("learner")).unwrap();
    std::fs::write(torn.join("state.json"), "{\"learner_version\": 9").unwrap();

    let out = train(&run, &config, steps_before + 3);
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let resumed: u64 = stdout
        .split("resumed from ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        resumed <= steps_before && resumed >= 3,
        "resumed from the last complete checkpoint, not the torn one: {stdout}"
    );
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(newest_checkpoint(&run).join("state.json")).unwrap(),
    )
    .unwrap();
    assert!(
        state["counters"]["groups_accepted"].as_u64().unwrap() >= accepted_before,
        "accepted groups survive and are counted: {state}"
    );
    let versions: Vec<u64> = jsonl(&run.join("learner.jsonl"))
        .iter()
        .map(|s| s["version"].as_u64().unwrap())
        .collect();
    assert_eq!(
        versions,
        (1..=steps_before + 3).collect::<Vec<_>>(),
        "steps after the checkpoint were redone once"
    );
    check_no_loss_no_duplicates(&run);
}

#[test]
fn repeated_kills_with_compaction_lose_nothing_and_restarts_stay_small() {
    // A checkpoint and a compaction at every step, one group per segment; killed five times at
    // different moments, then run to a clean stop.
    let (run, config) = setup(
        "kills",
        "[run]\ncheckpoint_every = 1\n[replay]\nwal_segment_kb = 1\n[policy.simulated]\nbatch_ms = 2.0\n",
    );
    let mut steps = 0usize;
    for round in 0..5u64 {
        let mut child = spawn_train(&run, &config);
        steps += 2 + round as usize % 2;
        wait_for_steps(&run, steps, &mut child);
        std::thread::sleep(Duration::from_millis(7 * round));
        child.kill().unwrap();
        child.wait().unwrap();
        steps = jsonl(&run.join("learner.jsonl")).len();
    }
    let out = train(&run, &config, steps as u64 + 2);
    assert_ok(&out);
    check_no_loss_no_duplicates(&run);
    let accepted = wal_seqs(&run).last().map_or(0, |s| s + 1) as usize;
    // What is left is what is pending, plus the active segment: not the run's history.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(newest_checkpoint(&run).join("state.json")).unwrap(),
    )
    .unwrap();
    let pending = seqs(&state, "replay_pending").len();
    assert!(
        wal_segments(&run) <= pending + 1,
        "{} segments left for {pending} pending groups ({accepted} accepted)",
        wal_segments(&run)
    );
}

#[test]
fn episodes_and_traces_rotate_gzipped_and_read_back_whole() {
    // 4 KiB files: several archives of each in a short run (metrics: about 1 KB a step).
    let (run, config) = setup(
        "rotate",
        "[telemetry]\nrotate_kb = 4\n[policy.simulated]\nbatch_ms = 2.0\n",
    );
    assert_ok(&train(&run, &config, 12));
    let names: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let count = |prefix: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(prefix) && n.ends_with(".gz"))
            .count()
    };
    assert!(count("episodes.0") >= 2, "{names:?}");
    assert!(count("trace-0001.p") >= 2, "{names:?}");
    assert!(count("metrics.0") >= 2, "{names:?}");
    // kevin report reads every step, from the metrics' archives and the live file.
    let json = run.parent().unwrap().join("report.json");
    let out = kevin()
        .arg("report")
        .arg(&run)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_ok(&out);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["steps"], 12, "{report}");
    // Every turn of every accepted group is in episodes, across its archives.
    let lines = kevin::telemetry::files::RotatingLog::read_all(&run, "episodes", "jsonl").unwrap();
    let groups = wal_seqs(&run).len();
    assert_eq!(
        lines.len(),
        groups * 4 * 3,
        "4 trajectories x 3 turns a group"
    );
    // inspect reads the session's parts as one session.
    let out = kevin()
        .arg("inspect")
        .arg(&run)
        .arg("--json")
        .output()
        .unwrap();
    assert_ok(&out);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sessions"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["sessions"][0]["complete"], true);
}

#[test]
fn a_disk_budget_removes_old_archives_and_a_full_disk_stops_cleanly() {
    // A 400 KB budget with 4 KiB archives and a compacted log: archives go, oldest first, as
    // new ones are made.
    let (run, config) = setup(
        "budget",
        "[run]\nmax_disk_gb = 0.0004\n[replay]\nwal_segment_kb = 16\n[telemetry]\nrotate_kb = 4\n[policy.simulated]\nbatch_ms = 5.0\n",
    );
    let mut child = spawn_train(&run, &config);
    wait_for_steps(&run, 6, &mut child);
    // The budget is looked at every 2 s.
    std::thread::sleep(Duration::from_millis(4500));
    common::interrupt(&child);
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    let archives = kevin::telemetry::files::archives(&run).unwrap();
    let names: Vec<String> = archives
        .iter()
        .map(|a| a.path.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    for oldest in ["episodes.000001.jsonl.gz", "trace-0001.p0001.json.gz"] {
        assert!(
            !names.iter().any(|n| n == oldest),
            "{oldest} is removed: {names:?}"
        );
    }
    assert!(
        names.iter().any(|n| n.starts_with("episodes.")),
        "the newest archives stay: {names:?}"
    );
    // (No bound on what is left at the end: the budget is looked at every 2 s, and a loaded
    // machine writes more archives between two looks and while draining.)
    check_no_loss_no_duplicates(&run);

    // Less free space than any disk has: the run stops at once, drained and checkpointed,
    // exit 1 naming the key; the same command resumes.
    let (full, config) = setup("diskfull", "[run]\nmin_free_disk_mb = 1000000000000\n");
    let out = train(&full, &config, 50);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run.min_free_disk_mb"), "{stderr}");
    assert!(stderr.contains("MB free"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("the disk is nearly full"), "{stdout}");
    assert!(newest_checkpoint(&full).join("COMPLETE").exists());
}

/// A failure counter of a metrics line (0 when it never counted).
fn failures(metrics: &Value, key: &str) -> u64 {
    metrics["failures"][key].as_u64().unwrap_or(0)
}

/// The run wrote episodes, and none holds a turn the harness did not judge.
fn assert_every_episode_judged(run: &Path) {
    let episodes = jsonl(&run.join("episodes.jsonl"));
    assert!(!episodes.is_empty());
    assert!(
        !episodes
            .iter()
            .any(|e| e.to_string().contains("harness_error")),
        "a harness error reached the episodes"
    );
}

#[test]
fn harness_errors_are_counted_logged_and_never_trained_on() {
    let (run, config) = setup("harness", "[env.simulated]\np_harness_error = 0.05\n");
    let out = train(&run, &config, 4);
    assert_ok(&out);
    let last = jsonl(&run.join("metrics.jsonl")).pop().unwrap();
    let counted = failures(&last, "Rollout.harness_error");
    assert!(counted > 0, "harness errors were not counted: {last}");
    // No episode (what the learner trains on) holds an unjudged turn, and none was refused
    // late by the replay queue: the rollout dropped them first.
    assert_every_episode_judged(&run);
    assert!(last["failures"]["ReplayQueue.unjudged"].is_null(), "{last}");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("the harness failed; the candidate was not judged"),
        "harness errors are logged: {log}"
    );
}

#[test]
fn candidates_the_machine_was_too_busy_to_judge_are_sent_again_not_abandoned() {
    // A third of the verifications find the machine too busy; each attempt draws anew, so a
    // candidate is given up only after three busy answers in a row (1 in 27).
    let (run, config) = setup("busy", "[env.simulated]\np_busy = 0.33\n");
    let out = train(&run, &config, 4);
    assert_ok(&out);
    let last = jsonl(&run.join("metrics.jsonl")).pop().unwrap();
    let busy = failures(&last, "Rollout.harness_busy");
    let abandoned = failures(&last, "Rollout.harness_error");
    assert!(busy > 0, "busy verdicts were not counted: {last}");
    // Sent again, nearly all were judged: far fewer groups abandoned than busy answers.
    assert!(
        abandoned * 4 < busy,
        "busy {busy}, abandoned {abandoned}: {last}"
    );
    assert_every_episode_judged(&run);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("it is sent again"), "{log}");
}

#[test]
fn component_panics_are_survived_and_counted() {
    let (run, config) = setup("panic", "[env.simulated]\np_panic = 0.1\n");
    assert_ok(&train(&run, &config, 4));
    let last = jsonl(&run.join("metrics.jsonl")).pop().unwrap();
    let restarts = failures(&last, "Compiler.restart");
    assert!(restarts > 0, "{last}");
    let crashes = jsonl(&run.join("episodes.jsonl"))
        .iter()
        .filter(|e| {
            e["outcome"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("injected panic"))
        })
        .count();
    assert!(
        crashes > 0,
        "the panicking candidates were scored as crashes"
    );
}

fn check_config_error(extra_file: &str, env: &[(&str, &str)], expected: &str) {
    let (run, config) = setup("badcfg", "");
    std::fs::write(&config, extra_file).unwrap();
    let mut cmd = kevin();
    cmd.args(["train", "--config"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&run);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(expected), "{stderr}");
}

/// An evaluation's JSON as `kevin eval --checkpoint --json` writes it, reduced to what
/// `tasks.prior` reads: each task's per-turn correct shares.
fn prior_json(rates: &[(String, f64)]) -> String {
    let tasks: Vec<Value> = rates
        .iter()
        .map(|(t, r)| serde_json::json!({"task": t, "turn_correct": [r, r]}))
        .collect();
    serde_json::json!({"command": "kevin eval --checkpoint", "tasks": tasks}).to_string()
}

#[test]
fn a_prior_steers_sampling_to_tasks_with_signal_and_a_bad_one_is_named() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let suite = kevin::tasks::TaskSuite::load(repo.join("tasks")).unwrap();
    let names: Vec<String> = suite
        .split(kevin::tasks::Split::Train)
        .map(|t| t.name.clone())
        .collect();
    assert!(names.len() > 20);
    // The policy never solved any task but two, which it solved half the time.
    let rates: Vec<(String, f64)> = names
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), if i < 2 { 0.5 } else { 0.0 }))
        .collect();
    let (run, config) = setup("prior", "");
    let prior = run.parent().unwrap().join("prior.json");
    std::fs::write(&prior, prior_json(&rates)).unwrap();
    let tasks = |prior: &Path| {
        format!(
            "[tasks]\nsource = \"suite\"\ndir = {:?}\npreset = \"small\"\nprior = {:?}\nfloor = 0.001\n",
            repo.join("tasks"),
            prior
        )
    };
    std::fs::write(&config, common::simulated_config(2.0, &tasks(&prior))).unwrap();
    assert_ok(&train(&run, &config, 4));
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(newest_checkpoint(&run).join("state.json")).unwrap(),
    )
    .unwrap();
    let sampled = state["sampler"]["sampled"].as_object().unwrap();
    let count = |t: &str| sampled.get(t).and_then(Value::as_u64).unwrap_or(0);
    let (signal, all): (u64, u64) = (
        names[..2].iter().map(|t| count(t)).sum(),
        sampled.values().filter_map(Value::as_u64).sum(),
    );
    // Uniform picks would give the two tasks 2 / names.len() (under a tenth) of the groups.
    assert!(all >= 8 && signal * 10 >= all * 9, "{sampled:?}");
    // A resumed run keeps its checkpointed sampler and needs the file no more.
    std::fs::remove_file(&prior).unwrap();
    assert_ok(&train(&run, &config, 6));

    // A file that is not an evaluation, and one that names none of the run's tasks: the run stops
    // before the policy loads, naming the key and the file, with nothing trained.
    for (text, expected) in [
        (
            "{\"loss\": 1}".to_string(),
            "not the JSON of `kevin eval --checkpoint`",
        ),
        (
            prior_json(&[("no_such_task".into(), 1.0)]),
            "covers none of the run's",
        ),
    ] {
        let (run, config) = setup("badprior", "");
        let bad = run.parent().unwrap().join("bad.json");
        std::fs::write(&bad, text).unwrap();
        std::fs::write(&config, common::simulated_config(2.0, &tasks(&bad))).unwrap();
        let out = train(&run, &config, 2);
        assert!(!out.status.success(), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("tasks.prior")
                && stderr.contains(&bad.display().to_string())
                && stderr.contains(expected),
            "{stderr}"
        );
        let checkpoints = std::fs::read_dir(run.join("checkpoints")).map_or(0, |d| d.count());
        assert_eq!(checkpoints, 0, "nothing trained");
    }
}

#[test]
fn bad_configs_exit_2_with_one_line_naming_the_key() {
    check_config_error(
        "[rollout]\nturnz = 4\n",
        &[],
        "unknown config key `rollout.turnz`",
    );
    check_config_error(
        "[replay]\ngamma = 2.0\n",
        &[],
        "config key `replay.gamma` = 2 is invalid: must be between 0 and 1",
    );
    check_config_error(
        "",
        &[("KEVIN__SAMPLING__TEMPERATURE", "hot")],
        "config key `sampling.temperature` = \"hot\" is invalid",
    );
    check_config_error(
        "[telemetry]\nprometheus = \"9464\"\n",
        &[],
        "config key `telemetry.prometheus` = \"9464\" is invalid: must be host:port",
    );
    check_config_error(
        "",
        &[("KEVIN__NOPE__X", "1")],
        "unknown config key `nope` (from environment variable KEVIN__NOPE__X)",
    );
    check_config_error(
        "[tasks]\nsource = \"suite\"\nfloor = 0.0\n",
        &[],
        "config key `tasks.floor` = 0 is invalid: a weight above 0 and at most 1",
    );
    check_config_error(
        "[tasks]\nsource = \"simulated\"\nprior = \"eval.json\"\n",
        &[],
        "config key `tasks.prior` = \"eval.json\" is invalid: needs tasks.source = \"suite\"",
    );
}

#[test]
fn unavailable_backends_and_unknown_commands_say_so() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    if kevin::machine::gpu_count() == 0 {
        let out = kevin()
            .current_dir(root)
            .args(["eval", "--kernels", "tasks/solutions", "--backend", "cuda"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("lists no GPU") && err.contains("Nothing was evaluated"),
            "{err}"
        );
    }
    let out = kevin().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
}

/// Workers are this very binary started again. A process whose binary is replaced or removed on
/// disk while it runs (a rebuild, or an upgrade in place under a long run) still starts them, and
/// they are its own build: here every worker starts after the file is gone.
#[test]
fn workers_start_after_the_binary_on_disk_is_gone() {
    if !cpu_backend_available() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = std::env::temp_dir().join(format!("kevin-gone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("kevin");
    std::fs::copy(common::bin(), &copy).unwrap();
    let child = std::process::Command::new(&copy)
        .current_dir(root)
        .env("RUST_LOG", "warn")
        .args(["eval", "--kernels", "tasks/solutions", "--backend", "cpu"])
        .args(["--tasks", "relu,gelu"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `spawn` returns once the copy runs; it starts its workers later.
    std::fs::remove_file(&copy).unwrap();
    let _ = std::fs::remove_dir(&dir);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{stdout}");
    assert!(
        stdout.contains("2 tasks: correct 100.0%"),
        "{stderr}\n{stdout}"
    );
}

fn nvrtc_available() -> bool {
    match kevin::compile::locate_nvrtc() {
        Ok(_) => true,
        Err(e) if std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("KEVIN_REQUIRE_NVRTC=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            false
        }
    }
}

#[test]
fn real_tasks_compile_for_real_in_worker_processes() {
    if !nvrtc_available() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let extra = format!(
        "[tasks]\nsource = \"suite\"\ndir = {:?}\npreset = \"small\"\n[env]\nkind = \"nvrtc\"\ncompile_workers = 2\n\
         [policy.simulated]\ncorpus = {:?}\np_mutate = 0.5\n",
        root.join("tasks").display().to_string(),
        root.join("tasks/solutions").display().to_string()
    );
    let (run, config) = setup("nvrtc", &extra);
    assert_ok(&train(&run, &config, 2));
    let episodes = jsonl(&run.join("episodes.jsonl"));
    let heldout: BTreeSet<String> = kevin::tasks::TaskSuite::load(root.join("tasks"))
        .unwrap()
        .split(kevin::tasks::Split::Heldout)
        .map(|t| t.name.clone())
        .collect();
    assert!(
        episodes
            .iter()
            .all(|e| !heldout.contains(e["task"].as_str().unwrap())),
        "held-out tasks are never trained on"
    );
    // Broken corpus answers get NVRTC's own log as feedback, and the next turn's prompt shows it.
    let compile_errors: Vec<&Value> = episodes
        .iter()
        .filter(|e| e["outcome"]["kind"] == "compile_error")
        .collect();
    assert!(
        !compile_errors.is_empty(),
        "p_mutate = 0.5 must break some answers"
    );
    assert!(compile_errors.iter().any(|e| e["outcome"]["log"]
        .as_str()
        .unwrap()
        .contains("candidate.cu(")));
    assert!(
        episodes.iter().any(|e| e["outcome"]["kind"] == "correct"),
        "intact answers compile"
    );
    assert!(episodes.iter().any(|e| e["prompt"]
        .as_str()
        .unwrap()
        .contains("Feedback: Compilation failed:")));
}

#[test]
fn the_cpu_backend_judges_real_tasks_in_training() {
    if !cpu_backend_available() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let extra = format!(
        "[tasks]\nsource = \"suite\"\ndir = {:?}\npreset = \"small\"\n[env]\nkind = \"cpu\"\ncompile_timeout_ms = 60000\n\
         [rollout]\ntrajectories = 2\nturns = 2\nmax_inflight_groups = 2\n[replay]\ntasks_per_batch = 1\n\
         [policy.simulated]\ncorpus = {:?}\np_mutate = 0.5\np_format_error = 0.0\n",
        root.join("tasks").display().to_string(),
        root.join("tasks/solutions").display().to_string()
    );
    let (run, config) = setup("cpu", &extra);
    assert_ok(&train(&run, &config, 2));
    let episodes = jsonl(&run.join("episodes.jsonl"));
    assert!(!episodes.is_empty());
    // The evaluation cache stands in front of the real backend, and each step records it: every
    // candidate was compiled once or answered from an earlier verdict of the same text.
    let steps = jsonl(&run.join("metrics.jsonl"));
    let last = steps.iter().rev().find(|m| m.get("step").is_some());
    let cache = &last.expect("a learner step")["eval_cache"];
    let count = |k: &str| {
        cache[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {cache}"))
    };
    assert!(count("misses") >= 1, "{cache}");
    assert!((1..=count("misses")).contains(&count("entries")), "{cache}");
    for e in &episodes {
        let o = &e["outcome"];
        match o["kind"].as_str().unwrap() {
            // Real verdicts: CPU timings, or the compiler's own log for a broken answer.
            "correct" => assert_eq!(o["timing"], "cpu", "{o}"),
            // NVRTC's log (the front-end, where NVRTC is installed) says `candidate.cu(58)`,
            // g++'s `candidate.cu:58:`.
            "compile_error" => {
                let log = o["log"].as_str().unwrap();
                assert!(
                    log.contains("candidate.cu:") || log.contains("candidate.cu("),
                    "{o}"
                )
            }
            "unsupported" => assert!(
                o["feature"].as_str().unwrap().contains("PTX")
                    || o["feature"].as_str().unwrap().contains("asm"),
                "{o}"
            ),
            other => panic!("a reference solution or a broken one cannot get {other}: {o}"),
        }
    }
}

#[test]
fn bench_modes_trains_the_config_in_both_modes_for_the_same_wall_clock() {
    // Simulated latencies of a real run's shape: sync waits for the learner, async does not.
    let (root, config) = setup(
        "modes",
        "[policy.simulated]\nbatch_ms = 200.0\n[learner.simulated]\nstep_ms = 300.0\n",
    );
    let json = root.join("modes.json");
    let out = kevin()
        .args(["bench", "modes", "--seconds", "4", "--config"])
        .arg(&config)
        .arg("--dir")
        .arg(root.join("runs"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("async / sync trajectories per hour"),
        "{stdout}"
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes = report["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 2);
    for (m, (name, staleness)) in modes.iter().zip([("async", 2), ("sync", 0)]) {
        assert_eq!(m["mode"], name);
        assert_eq!(m["max_staleness"], staleness);
        assert_eq!(m["ended"], "stopped", "{m}");
        let groups = m["groups"].as_u64().unwrap();
        assert!(groups > 0, "{m}");
        assert_eq!(m["trajectories"].as_u64().unwrap(), 4 * groups);
        assert!(m["learner_steps"].as_u64().unwrap() > 0, "{m}");
        let s = m["seconds"].as_f64().unwrap();
        assert!((3.0..=4.0).contains(&s), "window {s}");
        let busy = m["accelerator_busy_pct"].as_f64().unwrap();
        assert!(busy > 0.0 && busy <= 100.0, "{m}");
        // Each mode's run directory holds its own trace and metrics.
        let dir = root.join("runs").join(name);
        assert!(dir.join("metrics.jsonl").exists() && dir.join("train.log").exists());
    }
    // Sync pauses generation while the learner trains: async finishes more in the same time.
    assert!(
        report["async_over_sync"].as_f64().unwrap() > 1.0,
        "{report}"
    );
    assert!(
        report["note"].is_null(),
        "8 slots for batches of 2 leave async room: {report}"
    );
    // A bad argument names itself.
    let bad = kevin()
        .args(["bench", "modes", "--seconds", "0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--seconds 0"));
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn bench_soak_samples_a_run_and_times_its_restart() {
    // Small files, so that a few seconds show segments compacted and archives rotated.
    let (root, config) = setup(
        "soak",
        "[run]\ncheckpoint_every = 2\n[replay]\nwal_segment_kb = 8\n[telemetry]\nrotate_kb = 8\n",
    );
    let json = root.join("soak.json");
    let out = kevin()
        .args(["bench", "soak", "--turns", "9000", "--hours", "0.01"])
        .args([
            "--sample-s",
            "0.2",
            "--early-s",
            "1",
            "--restart-pairs",
            "2",
            "--config",
        ])
        .arg(&config)
        .arg("--dir")
        .arg(root.join("soak"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert_ok(&out);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(r["turns"].as_u64().unwrap() >= 9000, "{r}");
    assert_eq!(r["ended"], "stopped");
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{r}");
    assert!(samples.iter().all(|s| s["rss_mb"].as_f64().unwrap() > 0.0));
    assert!(r["restart_s"].as_f64().unwrap() > 0.0);
    assert!(r["restart_early_s"].as_f64().unwrap() > 0.0);
    assert!(r["start_fresh_s"].as_f64().unwrap() > 0.0);
    let line = r["restart_line"].as_str().unwrap();
    assert!(line.contains("wal_records_read"), "{line}");
    assert!(r["recovery_ms"].as_f64().unwrap() > 0.0, "{r}");
    // The alternating pairs: each fresh start and restart timed, their medians reported.
    let pairs = r["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2, "{r}");
    assert!(pairs
        .iter()
        .flat_map(|p| p.as_array().unwrap())
        .all(|t| t.as_f64().unwrap() > 0.0));
    assert!(r["pairs_ratio"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        !root.join("soak/fresh").exists(),
        "the pairs' fresh run directory is removed"
    );
    assert!(r["archives"].as_u64().unwrap() >= 1, "{r}");
    // The log is compacted: fewer segments than the groups it took.
    let groups = r["turns"].as_u64().unwrap() / 12;
    assert!(r["wal_segments"].as_u64().unwrap() < groups, "{r}");
}

#[test]
fn a_signal_during_startup_stops_the_run_cleanly() {
    // SIGINT as soon as the process catches it: the handler is installed first thing, so a
    // signal while the daemon is still starting (loading, recovering) stops it cleanly. Before,
    // the handler came only once every actor ran: until then SIGTERM killed the daemon without
    // a checkpoint, and a SIGINT that a background shell had set to ignored was lost (a restart
    // interrupted 80 ms in by `kevin bench soak` ran on).
    let (run, config) = setup("early-signal", "");
    let mut child = spawn_train(&run, &config);
    let sigint_caught = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                let mask = s
                    .lines()
                    .find_map(|l| l.strip_prefix("SigCgt:"))?
                    .trim()
                    .to_owned();
                u64::from_str_radix(&mask, 16).ok()
            })
            .is_some_and(|m| m & (1 << (libc::SIGINT - 1)) != 0)
    };
    let t0 = Instant::now();
    while !sigint_caught(child.id()) {
        assert!(child.try_wait().unwrap().is_none(), "kevin exited early");
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "SIGINT never caught"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    common::interrupt(&child);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("a SIGINT during startup was lost: still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("stopped by signal"), "{stdout}");
}
