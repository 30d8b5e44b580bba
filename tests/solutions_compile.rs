//! Every reference solution (`tasks/solutions/<task>.cu`) goes through exactly what a policy's
//! candidate goes through before it runs: the static rules, the launch-plan parser, validation
//! against its task at both size presets (argument names, kinds and order, grid/block/smem and
//! scratch bounds), and NVRTC compilation for sm_90 with the launched kernels as name expressions.
//! Every task has a solution, and every solution a task.
//!
//! Without NVRTC the compile step is skipped with a message (everything else still runs), unless
//! `KEVIN_REQUIRE_NVRTC=1`, which turns the skip into a failure. One file:
//! `KEVIN_SOLUTION=relu cargo test --test solutions_compile -- --nocapture`.

use std::path::{Path, PathBuf};

use kevin::candidate::Limits;
use kevin::compile::{compile, find_cuda_include_dirs, locate_nvrtc, CompileRequest};
use kevin::tasks::{Preset, Task, TaskSuite};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn nvrtc_available() -> bool {
    match locate_nvrtc() {
        Ok(_) => true,
        Err(e) if std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("KEVIN_REQUIRE_NVRTC=1 but {e}")
        }
        Err(e) => {
            eprintln!("solutions_compile: compile step skipped: {e}");
            false
        }
    }
}

/// What any real environment checks before compiling ([`kevin::env::admit`]), at both presets;
/// returns the launched kernel names.
fn check_candidate(task: &Task, source: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for preset in [Preset::Small, Preset::Gpu] {
        let plan = kevin::env::admit(task, preset, &Limits::default(), source)
            .map_err(|o| format!("{preset:?} preset: {}", o.feedback()))?;
        names = plan.launches.iter().map(|l| l.kernel.clone()).collect();
    }
    names.sort();
    names.dedup();
    Ok(names)
}

fn check_file(
    path: &Path,
    suite: &TaskSuite,
    nvrtc: bool,
    include_dirs: &[PathBuf],
) -> Result<bool, String> {
    let stem = path.file_stem().unwrap().to_string_lossy().to_string();
    let task = suite
        .get(&stem)
        .ok_or_else(|| format!("no task named `{stem}`"))?;
    let source = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let kernels = check_candidate(task, &source)?;
    if !nvrtc {
        return Ok(false);
    }
    let names: Vec<&str> = kernels.iter().map(String::as_str).collect();
    let out = compile(&CompileRequest::ptx(source.clone(), &names), include_dirs)
        .map_err(|e| e.to_string())?;
    for k in &kernels {
        if !out.lowered_names.contains_key(k) {
            return Err(format!("kernel {k} has no lowered name"));
        }
    }
    Ok(true)
}

#[test]
fn every_task_has_a_solution_that_validates_and_compiles() {
    let suite = TaskSuite::load(root().join("tasks")).expect("task suite loads");
    let only: Option<Vec<String>> = std::env::var("KEVIN_SOLUTION")
        .ok()
        .map(|s| s.split(',').map(String::from).collect());
    let dir = root().join("tasks/solutions");
    let mut missing: Vec<&str> = suite
        .tasks()
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !dir.join(format!("{n}.cu")).exists())
        .collect();
    missing.sort_unstable();
    assert!(
        only.is_some() || missing.is_empty(),
        "tasks without a reference solution: {missing:?}"
    );

    let nvrtc = nvrtc_available();
    let include_dirs = find_cuda_include_dirs();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tasks/solutions exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .filter(|p| {
            only.as_ref()
                .is_none_or(|o| o.iter().any(|n| p.file_stem().unwrap() == n.as_str()))
        })
        .collect();
    files.sort();
    let (mut compiled, mut failures) = (0, Vec::new());
    for path in &files {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        match check_file(path, &suite, nvrtc, &include_dirs) {
            Ok(true) => compiled += 1,
            Ok(false) => {}
            Err(e) => failures.push(format!("{stem}: {e}")),
        }
    }
    eprintln!(
        "solutions_compile: {} files, {compiled} compiled, {} failed",
        files.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n\n"));
}

#[test]
fn a_broken_solution_is_caught() {
    // The checks above can fail: a launch naming a tensor the task does not have.
    let suite = TaskSuite::load(root().join("tasks")).unwrap();
    let task = suite.get("relu").unwrap();
    let src = std::fs::read_to_string(root().join("tasks/solutions/relu.cu")).unwrap();
    assert!(check_candidate(task, &src).is_ok());
    let first_launch = src.lines().find(|l| l.contains("kevin: launch")).unwrap();
    let broken = src.replace(
        first_launch,
        &first_launch.replace("args=(X,", "args=(NOPE,"),
    );
    let err = check_candidate(task, &broken).unwrap_err();
    assert!(err.contains("NOPE"), "{err}");
}
