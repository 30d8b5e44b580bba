//! Defenses, measured (issue 6), through the real `kevin` binary:
//!
//! - `kevin bench hacks`: every case of the adversarial suite (tests/data/hacks/) gets the
//!   outcome and reason its manifest expects, and the reference solution of every task the cases
//!   use is judged correct (no false positives);
//! - `kevin bench faults` at CI size: a storm of faulty and valid candidates loses nothing,
//!   misattributes nothing, changes no valid verdict, and really does kill and respawn workers.
//!
//! Both run on the CPU backend (when a C++ compiler is present) and, with `KEVIN_GPU_TESTS=1`, on
//! the GPU (`--backend cuda`, the storm at full size). The table each run prints is in the log.

mod common;

use std::process::Command;
use std::sync::Mutex;

use common::{bin, cpu_backend_available, gpu_tests, root};

/// The runs share the machine's cores and their deadlines are wall-clock: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `kevin bench <what> --backend <backend> ... --json <file>` from the repository root and
/// returns the JSON it wrote; panics (with its output) unless it exited 0.
fn bench(what: &str, backend: &str, extra: &[&str]) -> serde_json::Value {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let json = std::env::temp_dir().join(format!(
        "kevin-{what}-{backend}-{}.json",
        std::process::id()
    ));
    let out = Command::new(bin())
        .args([
            "bench",
            what,
            "--backend",
            backend,
            "--workers",
            "2",
            "--json",
        ])
        .arg(&json)
        .args(extra)
        .current_dir(root())
        .output()
        .expect("kevin runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "kevin bench {what} --backend {backend} exited with {}:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&json).expect("the JSON report");
    std::fs::remove_file(&json).ok();
    serde_json::from_str(&text).expect("valid JSON")
}

fn suite_passes(backend: &str) {
    let hacks = kevin::hacks::HackSuite::load(&root().join("tests/data/hacks")).unwrap();
    let report = bench("hacks", backend, &[]);
    assert_eq!(report["passed"], true);
    let results = report["results"].as_array().unwrap();
    // Every case and every reference was evaluated and judged as expected.
    assert_eq!(results.len(), hacks.cases.len() + hacks.tasks().len());
    for c in &hacks.cases {
        let r = results.iter().find(|r| r["case"] == c.name.as_str());
        let r = r.unwrap_or_else(|| panic!("{} missing from the report", c.name));
        assert!(r["mismatch"].is_null(), "{}: {}", c.name, r["mismatch"]);
    }
    for task in hacks.tasks() {
        let r = results
            .iter()
            .find(|r| r["case"] == format!("reference {task}").as_str())
            .unwrap_or_else(|| panic!("reference {task} missing"));
        assert_eq!(
            r["outcome"]["kind"], "correct",
            "reference {task}: {}",
            r["outcome"]
        );
    }
}

fn storm_loses_nothing(backend: &str, count: usize) {
    let report = bench(
        "faults",
        backend,
        &["--count", &count.to_string(), "--seed", "7"],
    );
    assert_eq!(report["submitted"], count);
    assert_eq!(report["received"], count);
    for figure in [
        "lost",
        "duplicates",
        "misattributed",
        "verdict_changes",
        "daemon_crashes",
    ] {
        assert_eq!(
            report[figure], 0,
            "{figure}: {}",
            report["misattributed_examples"]
        );
    }
    // The storm was real: workers died and came back.
    assert!(report["respawns"].as_u64().unwrap() > 0, "no respawn");
    assert!(report["respawn_median_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn every_hack_gets_its_outcome_on_the_cpu_backend() {
    if cpu_backend_available() {
        suite_passes("cpu");
    }
}

#[test]
fn a_fault_storm_loses_nothing_on_the_cpu_backend() {
    if cpu_backend_available() {
        storm_loses_nothing("cpu", 60);
    }
}

#[test]
fn every_hack_gets_its_outcome_on_the_gpu() {
    if !gpu_tests() {
        eprintln!("skipping: set KEVIN_GPU_TESTS=1 on a machine with a GPU");
        return;
    }
    suite_passes("cuda");
}

#[test]
fn a_fault_storm_loses_nothing_on_the_gpu() {
    if !gpu_tests() {
        eprintln!("skipping: set KEVIN_GPU_TESTS=1 on a machine with a GPU");
        return;
    }
    storm_loses_nothing("cuda", 1000);
}
