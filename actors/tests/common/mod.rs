//! Helpers shared by the integration tests in `actors/tests` (each test file says `mod common;`):
//! where the repository and the `kevin` binary are, how to run the binary, how to check its
//! exit, how to read the JSON-lines files a run writes, and which optional backends are here.
//! Nothing here asserts anything about kevin's behaviour: the tests do.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The repository root (KEVIN_ROOT when the test runs elsewhere than it was built).
pub fn root() -> PathBuf {
    std::env::var_os("KEVIN_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap()
                .to_path_buf()
        })
}

/// The `kevin` binary (KEVIN_BIN when the test runs on another machine than it was built on).
pub fn bin() -> PathBuf {
    std::env::var_os("KEVIN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kevin")))
}

/// `kevin` for a training run: logging at warn (RUST_LOG) and without a KEVIN__RUN__MAX_STEPS
/// from the caller's environment; the caller adds the arguments.
pub fn kevin() -> Command {
    let mut c = Command::new(bin());
    c.env("RUST_LOG", "warn")
        .env_remove("KEVIN__RUN__MAX_STEPS");
    c
}

/// Runs `kevin ARGS` from the repository root (so `tasks/`, `models/` and `configs/` resolve)
/// and returns what it did.
pub fn kevin_at_root(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(root())
        .output()
        .unwrap()
}

/// The process's stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Panics with the status, stdout and stderr unless `out` exited 0.
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "kevin failed ({:?}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The JSON lines of `path` that parse, in order; nothing when it is not there (a live run's
/// files may be missing or end in a torn line).
pub fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Every JSON line of `path`; panics when the file is missing or a line does not parse.
pub fn jsonl_strict(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every record of a run directory's write-ahead log (all its segments, oldest first); panics
/// when a line does not parse.
pub fn wal_records(run: &Path) -> Vec<Value> {
    kevin::wal::segments(&run.join(kevin::wal::WAL_DIR))
        .unwrap()
        .iter()
        .flat_map(|s| jsonl_strict(&s.path))
        .collect()
}

/// True when a C++ compiler for the CPU backend is here; else says that the test is skipped.
pub fn cpu_backend_available() -> bool {
    let ok = kevin::cpu::find_compiler().is_ok();
    if !ok {
        eprintln!("skipping: no C++ compiler for the CPU backend");
    }
    ok
}

/// True when `KEVIN_GPU_TESTS=1` asks for the GPU tests.
pub fn gpu_tests() -> bool {
    std::env::var("KEVIN_GPU_TESTS").is_ok_and(|v| v == "1")
}

/// Pixels of one colour a line across a plot leaves at least (a legend's sample of a line that
/// drew nothing leaves about 50).
pub const MIN_LINE_PIXELS: usize = 300;

/// Decodes a plot `kevin report` wrote: its width, height, and the indices of the line colours
/// (`kevin_actors::cmd::report::plot::line_colour`) drawn with at least [`MIN_LINE_PIXELS`]
/// pixels, i.e. the lines drawn across it.
pub fn plot_lines(path: &Path) -> (u32, u32, Vec<usize>) {
    use kevin_actors::cmd::report::{plot, png};
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (w, h, rgb) = png::decode_rgb(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut counts = [0usize; plot::LINE_COLOURS];
    for px in rgb.chunks(3) {
        if let Some(i) = (0..plot::LINE_COLOURS).find(|i| px == plot::line_colour(*i)) {
            counts[i] += 1;
        }
    }
    let drawn = (0..plot::LINE_COLOURS)
        .filter(|i| counts[*i] >= MIN_LINE_PIXELS)
        .collect();
    (w, h, drawn)
}

/// A config of fast simulated components, where a run of a few steps takes well under a second.
/// The learner's step takes `step_ms`, and `extra` (TOML) overrides its keys.
pub fn simulated_config(step_ms: f64, extra: &str) -> String {
    let base = format!(
        r#"
[run]
name = "it"
checkpoint_every = 2
[tasks]
source = "simulated"
[rollout]
trajectories = 4
turns = 3
max_inflight_groups = 8
[replay]
tasks_per_batch = 2
[policy.simulated]
batch_ms = 1.0
token_ms = 0.0
response_tokens = 8
[env.simulated]
compile_ms = 0.2
verify_ms = 0.2
profile_ms = 0.2
[learner.simulated]
step_ms = {step_ms:?}
"#
    );
    merge_toml(&base, extra)
}

/// `extra` overrides keys of `base` (both TOML).
pub fn merge_toml(base: &str, extra: &str) -> String {
    fn merge(a: &mut toml::Table, b: toml::Table) {
        for (k, v) in b {
            match (a.get_mut(&k), v) {
                (Some(toml::Value::Table(x)), toml::Value::Table(y)) => merge(x, y),
                (_, v) => {
                    a.insert(k, v);
                }
            }
        }
    }
    let mut a: toml::Table = base.parse().unwrap();
    merge(&mut a, extra.parse().unwrap());
    toml::to_string(&a).unwrap()
}

/// Sends SIGINT to `child` (Ctrl-C), as a user stopping a run does.
pub fn interrupt(child: &std::process::Child) {
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill -INT {}", child.id());
}
