//! Every reference solution in `tasks/solutions/` runs on the CPU device model at the Small
//! preset and matches the task's fp64 reference within its tolerance; solutions with inline PTX
//! are reported unsupported. Compiles run two at a time (the CI machine has two cores).
//!
//! Skipped, with a message, when no C++ compiler is on PATH.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kevin::candidate::{self, Candidate, Limits};
use kevin::cpu::{self, CpuCompileError, HostBuffer, LaunchFailure};
use kevin::tasks::{Preset, Task, TaskSuite};

/// What happened to one solution.
enum Verdict {
    Pass { compile_ms: u128, run_ms: u128 },
    Unsupported(String),
    Fail(String),
}

/// OS threads per launch: 1 by default (two solutions already run at once), `KEVIN_CPU_THREADS`
/// to exercise blocks on several threads.
fn threads() -> usize {
    std::env::var("KEVIN_CPU_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(task: &Task, source: &str, workdir: &Path) -> Verdict {
    let plan = match candidate::plan::parse_plan(source) {
        Ok(p) => p,
        Err(e) => return Verdict::Fail(format!("plan: {e}")),
    };
    let cand = Candidate {
        source: source.to_string(),
        summary: String::new(),
        plan,
    };
    let sig = task.candidate_signature(Preset::Small);
    let resolved = match candidate::validate(&cand, &sig, &Limits::default()) {
        Ok(r) => r,
        Err(e) => return Verdict::Fail(format!("validate: {e}")),
    };
    let t0 = Instant::now();
    let so = match cpu::compile(source, &resolved, workdir) {
        Ok(so) => so,
        Err(CpuCompileError::Unsupported { feature }) => return Verdict::Unsupported(feature),
        Err(e) => return Verdict::Fail(e.to_string()),
    };
    let compile_ms = t0.elapsed().as_millis();
    let module = match cpu::Module::load(&so) {
        Ok(m) => m,
        Err(e) => return Verdict::Fail(e.to_string()),
    };
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = match task.reference(Preset::Small, &inputs) {
        Ok(w) => w,
        Err(e) => return Verdict::Fail(format!("reference: {e}")),
    };
    let mut bufs = Vec::new();
    let mut k_in = 0;
    for t in &sig.tensors {
        let buf = if t.is_output {
            let mut b =
                HostBuffer::zeroed((t.elems * t.dtype.size_bytes()) as usize).expect("alloc");
            b.poison(t.dtype);
            b
        } else {
            k_in += 1;
            HostBuffer::from_values(t.dtype, &inputs[k_in - 1]).expect("alloc")
        };
        bufs.push(buf);
    }
    let scratch: Vec<HostBuffer> = resolved
        .scratch
        .iter()
        .map(|s| {
            let mut b =
                HostBuffer::zeroed((s.elems * s.dtype.size_bytes()) as usize).expect("alloc");
            b.bytes_mut().fill(0xA5); // garbage: scratch is uninitialised on a GPU
            b
        })
        .collect();
    let tptr: Vec<_> = bufs.iter().map(|b| b.as_ptr()).collect();
    let sptr: Vec<_> = scratch.iter().map(|b| b.as_ptr()).collect();
    let t1 = Instant::now();
    for launch in &resolved.launches {
        // SAFETY: buffers sized by the plan; reference solutions are trusted code.
        match unsafe { module.launch(launch, &tptr, &sptr, threads()) } {
            Ok(()) => {}
            Err(LaunchFailure::Unsupported(m)) => return Verdict::Unsupported(m),
            Err(e) => return Verdict::Fail(format!("{}: {e}", launch.kernel)),
        }
    }
    let run_ms = t1.elapsed().as_millis();
    let tol = task.tolerance;
    let outs = sig.tensors.iter().zip(&bufs).filter(|(t, _)| t.is_output);
    for ((t, buf), want) in outs.zip(&want) {
        let got = buf.values(t.dtype);
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                (g - w).abs() <= tol.atol + tol.rtol * w.abs()
            };
            if !ok {
                return Verdict::Fail(format!("{}[{i}] = {g}, reference {w}", t.name));
            }
        }
    }
    Verdict::Pass { compile_ms, run_ms }
}

#[test]
fn reference_solutions_run_on_the_cpu_model() {
    if let Err(e) = cpu::find_compiler() {
        eprintln!("SKIP cpu_solutions: {e}");
        return;
    }
    let start = Instant::now();
    let suite = TaskSuite::load(root().join("tasks")).expect("task suite");
    let mut jobs = Vec::new();
    for task in suite.tasks() {
        let path = root()
            .join("tasks/solutions")
            .join(format!("{}.cu", task.name));
        if let Ok(src) = std::fs::read_to_string(&path) {
            jobs.push((task, src));
        }
    }
    let only = std::env::var("KEVIN_CPU_ONLY").ok();
    jobs.retain(|(t, _)| only.as_deref().is_none_or(|o| t.name == o));
    let base = std::env::temp_dir().join(format!("kevin-cpu-solutions-{}", std::process::id()));
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((task, src)) = jobs.get(i) else {
                    break;
                };
                let v = check(task, src, &base.join(&task.name));
                results.lock().unwrap_or_else(|e| e.into_inner()).push((
                    task.name.clone(),
                    src.contains("asm"),
                    v,
                ));
            });
        }
    });
    let _ = std::fs::remove_dir_all(&base);
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let mut bad = Vec::new();
    let (mut pass, mut unsupported) = (0, 0);
    for (name, has_asm, v) in &results {
        match v {
            Verdict::Pass { compile_ms, run_ms } => {
                eprintln!("{name:32} pass (compile {compile_ms} ms, run {run_ms} ms)")
            }
            Verdict::Unsupported(why) => eprintln!("{name:32} unsupported: {why}"),
            Verdict::Fail(why) => eprintln!("{name:32} FAIL: {why}"),
        }
        match v {
            Verdict::Pass { .. } if !has_asm => pass += 1,
            Verdict::Unsupported(_) if *has_asm => unsupported += 1,
            _ => bad.push(name.clone()),
        }
    }
    eprintln!(
        "{} solutions: {pass} pass, {unsupported} unsupported (inline asm), {} wrong; {:.1}s",
        results.len(),
        bad.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(bad.is_empty(), "solutions that did not behave: {bad:?}");
}
