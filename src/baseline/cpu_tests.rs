//! The baseline executed on the CPU device model (GEMMs through the tiled kernel) and compared
//! with the fp64 interpreter at each task's tolerance: every task of `tasks/` at the small
//! preset, and the fixtures of `tests/data/baseline/`, which cover the ops, dtypes, layouts
//! (rows, columns, long rows, broadcasts, transposes) and alignments the tasks leave out.
//!
//! `Module::launch` runs code in this process: fine here, the kernels are the trusted ones.
//! One g++ compile of [`SOURCE`] serves every test. Skipped (with a message) without a C++
//! compiler, like the device model's own tests.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::*;
use crate::candidate::{ResolvedArg, ResolvedLaunch, ResolvedPlan, Scalar};
use crate::cpu::{self, Module};
use crate::tasks::TaskSuite;
use crate::verify::buffer::TensorBuf;
use crate::verify::correctness::within;

/// The compiled baseline module, shared by the tests of this process.
static MODULE: OnceLock<Option<Module>> = OnceLock::new();

fn module() -> Option<&'static Module> {
    MODULE
        .get_or_init(|| {
            if let Err(e) = cpu::find_compiler() {
                eprintln!("SKIP baseline CPU tests: {e}");
                return None;
            }
            let launches = kernel_names()
                .into_iter()
                .map(|kernel| ResolvedLaunch {
                    line: 0,
                    kernel,
                    grid: [1, 1, 1],
                    block: [1, 1, 1],
                    smem_bytes: 0,
                    args: Vec::new(),
                })
                .collect();
            let plan = ResolvedPlan {
                scratch: Vec::new(),
                launches,
            };
            let dir = std::env::temp_dir().join(format!("kevin-baseline-{}", std::process::id()));
            let so = cpu::compile(SOURCE, &plan, &dir).unwrap_or_else(|e| panic!("{e}"));
            let module = Module::load(&so).expect("load the baseline module");
            // The mapping outlives the files.
            let _ = std::fs::remove_dir_all(&dir);
            Some(module)
        })
        .as_ref()
}

fn arg(a: &StepArg) -> ResolvedArg {
    match *a {
        StepArg::Buffer(i) => ResolvedArg::Tensor(i),
        StepArg::I32(v) => ResolvedArg::Scalar(Scalar::I32(v)),
        StepArg::I64(v) => ResolvedArg::Scalar(Scalar::I64(v)),
        StepArg::F32(v) => ResolvedArg::Scalar(Scalar::F32(v)),
    }
}

/// Runs `plan` (GEMMs as kernels) on `inputs`; every other buffer starts as NaN, so a step that
/// reads an unwritten element shows up as a NaN in the outputs. Returns every buffer.
fn run(module: &Module, plan: &EagerPlan, inputs: &[Vec<f64>]) -> Vec<TensorBuf> {
    let plan = plan.with_kernel_gemm();
    let mut bufs: Vec<TensorBuf> = plan
        .buffers
        .iter()
        .map(|b| TensorBuf::new(&b.name, b.dtype, b.elems).expect("buffer"))
        .collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        match inputs.get(i) {
            Some(data) => b.write_f64(data).expect("input length"),
            None => b.fill_nan(),
        }
    }
    let ptrs: Vec<*mut c_void> = bufs
        .iter_mut()
        .map(|b| b.buffer_mut().as_mut_ptr().cast())
        .collect();
    for step in &plan.steps {
        let Step::Kernel {
            kernel,
            grid,
            block,
            smem_bytes,
            args,
        } = step
        else {
            panic!("with_kernel_gemm left a GEMM step");
        };
        let launch = ResolvedLaunch {
            line: 0,
            kernel: kernel.clone(),
            grid: *grid,
            block: *block,
            smem_bytes: *smem_bytes,
            args: args.iter().map(arg).collect(),
        };
        // SAFETY: every buffer has the size the plan declares; the kernels are the trusted ones.
        unsafe { module.launch(&launch, &ptrs, &[], 2) }
            .unwrap_or_else(|e| panic!("{kernel}: {e}"));
    }
    bufs
}

/// Lowers and runs `task` at the small preset and returns one line per output that differs
/// from the reference (empty when all match).
fn check_task(module: &Module, task: &Task) -> Vec<String> {
    let plan = lower(task, Preset::Small).unwrap_or_else(|e| panic!("{e}"));
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = task.reference(Preset::Small, &inputs).expect("reference");
    let bufs = run(module, &plan, &inputs);
    let mut bad = Vec::new();
    for (j, want) in want.iter().enumerate() {
        let out = &bufs[inputs.len() + j];
        let got = out.read_f64();
        let exact = out.dtype() == Dtype::I64;
        let miss = got.iter().zip(want).enumerate().find(|(_, (&g, &w))| {
            if exact {
                g != w
            } else {
                !within(g, w, task.tolerance)
            }
        });
        if let Some((i, (g, w))) = miss {
            bad.push(format!(
                "{} output `{}`[{i}]: got {g}, want {w}",
                task.name,
                out.name()
            ));
        }
    }
    bad
}

fn check_suite(dir: &Path) {
    let suite = TaskSuite::load(dir).unwrap_or_else(|e| panic!("{e}"));
    let Some(module) = module() else {
        return;
    };
    let bad: Vec<String> = suite
        .tasks()
        .iter()
        .flat_map(|t| check_task(module, t))
        .collect();
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn every_task_matches_the_interpreter_on_the_cpu() {
    check_suite(&repo("tasks"));
}

#[test]
fn op_coverage_fixtures_match_the_interpreter_on_the_cpu() {
    check_suite(&repo("tests/data/baseline"));
}

/// The check above can fail: a plan with a wrong scalar gives a mismatch.
#[test]
fn a_wrong_plan_is_caught() {
    let Some(module) = module() else {
        return;
    };
    let suite = TaskSuite::load(repo("tasks")).expect("task suite");
    let task = suite.get("scalar_multiply").expect("task");
    let mut plan = lower(task, Preset::Small).expect("lower");
    let Step::Kernel { args, .. } = &mut plan.steps[0] else {
        panic!("expected a kernel")
    };
    args[1] = StepArg::F32(3.0);
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = task.reference(Preset::Small, &inputs).expect("reference");
    let got = run(module, &plan, &inputs)[1].read_f64();
    assert!(got
        .iter()
        .zip(&want[0])
        .any(|(&g, &w)| !within(g, w, task.tolerance)));
}
