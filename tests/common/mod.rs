//! A minimal test runner for the worker tests, which are `harness = false` targets: the test
//! binary doubles as the worker executable (`<test binary> worker --role <role>`), and libtest
//! would print its banner onto the worker's stdout, which must carry protocol frames only.

#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use kevin::worker::WorkerCommand;

/// One named test.
pub type Test = (&'static str, fn());

/// If this process was started as a worker, serve and exit; otherwise run `tests` (filtered by
/// any non-flag command-line arguments, as `cargo test NAME` passes them) and exit with 0 when
/// all passed.
pub fn main(tests: &[Test]) -> ! {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        std::process::exit(kevin::roles::child_main_from_args(&args[1..]));
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<&Test> = tests
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("running {} tests", selected.len());
    let mut failed = Vec::new();
    for (name, test) in selected {
        let start = Instant::now();
        let ok = catch_unwind(AssertUnwindSafe(test)).is_ok();
        println!(
            "test {name} ... {} ({:.2?})",
            if ok { "ok" } else { "FAILED" },
            start.elapsed()
        );
        if !ok {
            failed.push(*name);
        }
    }
    if failed.is_empty() {
        println!("test result: ok");
        std::process::exit(0);
    }
    println!("test result: FAILED: {failed:?}");
    std::process::exit(1);
}

/// This test binary started as a worker of `role`.
pub fn self_as_worker(role: &str) -> WorkerCommand {
    let exe = std::env::current_exe().expect("current_exe");
    WorkerCommand::kevin_role(exe, role)
}
