//! The baseline executed on the CPU device model (GEMMs through the tiled kernel) and compared
//! with the fp64 interpreter at each task's tolerance: every task of `tasks/` at the small
//! preset, and the fixtures of `tests/data/baseline/`, which cover the ops, dtypes, layouts
//! (rows, columns, long rows, broadcasts, transposes) and alignments the tasks leave out.
//!
//! The F64 plans (the GPU's correctness reference) run on the same tasks and fixtures with f64
//! buffers and must agree with the interpreter to [`F64_TOL`], index outputs exactly.
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
use crate::ops::round::round_to;
use crate::tasks::{TaskSuite, Tolerance};
use crate::verify::buffer::{GuardedBuffer, TensorBuf, I64_FILL};
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
        StepArg::F64(v) => ResolvedArg::Scalar(Scalar::F64(v)),
    }
}

/// Runs `plan` (GEMMs as kernels) on `inputs`; every other buffer starts as NaN, so a step that
/// reads an unwritten element shows up as a NaN in the outputs. Returns every buffer.
fn run(module: &Module, plan: &EagerPlan, inputs: &[Vec<f64>]) -> Vec<TensorBuf> {
    assert_eq!(plan.precision, Precision::Native);
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
    launch_all(module, plan, &ptrs);
    bufs
}

/// Runs an F64 plan on `inputs` (rounded to their task dtype, then stored as f64, as the GPU
/// harness widens the task's inputs); other buffers start as NaN (i64: [`I64_FILL`]). Returns
/// every buffer's values. f64 elements travel as their bit patterns in i64 slices.
fn run_f64(module: &Module, plan: &EagerPlan, inputs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    assert_eq!(plan.precision, Precision::F64);
    let mut bufs: Vec<GuardedBuffer> = plan
        .buffers
        .iter()
        .map(|b| GuardedBuffer::new(b.stored_bytes(plan.precision)).expect("buffer"))
        .collect();
    for (i, (b, decl)) in bufs.iter_mut().zip(&plan.buffers).enumerate() {
        let words = b.as_mut_slice::<i64>().expect("8-byte elements");
        match (inputs.get(i), decl.dtype) {
            (Some(data), Dtype::I64) => {
                words.iter_mut().zip(data).for_each(|(w, &v)| *w = v as i64)
            }
            (Some(data), d) => words
                .iter_mut()
                .zip(data)
                .for_each(|(w, &v)| *w = round_to(d, v).to_bits() as i64),
            (None, Dtype::I64) => words.fill(I64_FILL),
            (None, _) => words.fill(f64::NAN.to_bits() as i64),
        }
    }
    let ptrs: Vec<*mut c_void> = bufs.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
    launch_all(module, plan, &ptrs);
    bufs.iter()
        .zip(&plan.buffers)
        .map(|(b, decl)| {
            let words = b.as_slice::<i64>().expect("8-byte elements");
            match decl.dtype {
                Dtype::I64 => words.iter().map(|&w| w as f64).collect(),
                _ => words.iter().map(|&w| f64::from_bits(w as u64)).collect(),
            }
        })
        .collect()
}

/// Launches every step of `plan` (GEMMs as kernels) on the buffers at `ptrs`.
fn launch_all(module: &Module, plan: &EagerPlan, ptrs: &[*mut c_void]) {
    let plan = plan.with_kernel_steps(true, true);
    for step in &plan.steps {
        let Step::Kernel {
            kernel,
            grid,
            block,
            smem_bytes,
            args,
        } = step
        else {
            panic!("with_kernel_steps left a library step");
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
        unsafe { module.launch(&launch, ptrs, &[], 2) }.unwrap_or_else(|e| panic!("{kernel}: {e}"));
    }
}

/// Lowers and runs `task` at the small preset and returns one line per output that differs
/// from the reference (empty when all match).
fn check_task(module: &Module, task: &Task) -> Vec<String> {
    let plan = lower(task, Preset::Small).unwrap_or_else(|e| panic!("{e}"));
    check_plan(module, task, &plan)
}

/// Runs `plan` of `task` (at the small preset) and returns one line per output that differs
/// from the reference.
fn check_plan(module: &Module, task: &Task, plan: &EagerPlan) -> Vec<String> {
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = task.reference(Preset::Small, &inputs).expect("reference");
    let bufs = run(module, plan, &inputs);
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

/// How close an F64 plan must be to the interpreter: both compute in double and differ only in
/// the order of operations (parallel sums, Welford, online softmax, 1/x then times s) and in the
/// libm (CUDA's or glibc's erf, tanh, pow, ... against Rust's, erf against kernels.rs' series):
/// a few ulps each, far below this on the small preset's extents.
const F64_TOL: Tolerance = Tolerance {
    atol: 1e-12,
    rtol: 1e-9,
};

/// Lowers `task` at the small preset in double precision, runs it and returns one line per
/// output that differs from the interpreter beyond [`F64_TOL`] (index outputs: at all; a NaN
/// matches a NaN), plus the largest relative error seen, for the record.
fn check_task_f64(module: &Module, task: &Task) -> (Vec<String>, f64) {
    let plan = lower_f64(task, Preset::Small).unwrap_or_else(|e| panic!("{e}"));
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = task.reference(Preset::Small, &inputs).expect("reference");
    let bufs = run_f64(module, &plan, &inputs);
    let (mut bad, mut worst) = (Vec::new(), 0.0f64);
    for (j, want) in want.iter().enumerate() {
        let k = inputs.len() + j;
        let exact = plan.buffers[k].dtype == Dtype::I64;
        for (i, (&g, &w)) in bufs[k].iter().zip(want).enumerate() {
            let ok = if exact {
                g == w
            } else {
                within(g, w, F64_TOL) || (g.is_nan() && w.is_nan())
            };
            if w != 0.0 && w.is_finite() {
                worst = worst.max((g - w).abs() / w.abs());
            }
            if !ok && bad.len() < 8 {
                let name = &plan.buffers[k].name;
                bad.push(format!(
                    "{} output `{name}`[{i}]: got {g:e}, want {w:e}",
                    task.name
                ));
            }
        }
    }
    (bad, worst)
}

fn check_suite_f64(dir: &Path) {
    let suite = TaskSuite::load(dir).unwrap_or_else(|e| panic!("{e}"));
    let Some(module) = module() else {
        return;
    };
    let mut bad = Vec::new();
    for task in suite.tasks() {
        let (b, worst) = check_task_f64(module, task);
        println!("{:28} largest relative error {worst:.1e}", task.name);
        bad.extend(b);
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
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

#[test]
fn every_task_in_f64_matches_the_interpreter_to_1e_9() {
    check_suite_f64(&repo("tasks"));
}

#[test]
fn op_coverage_fixtures_in_f64_match_the_interpreter_to_1e_9() {
    check_suite_f64(&repo("tests/data/baseline"));
}

/// The depthwise and pooling kernels' forms that the launch picks only for other windows or for
/// tensors past 2^31 elements compute what the picked ones do: the windowed fixtures with each
/// such step swapped for the 64-bit form, and each depthwise step for the general windows'.
#[test]
fn every_form_of_the_window_kernels_matches_the_interpreter() {
    let Some(module) = module() else {
        return;
    };
    let fixtures = TaskSuite::load(repo("tests/data/baseline")).expect("fixtures");
    let mut swapped = 0;
    for name in ["depthwise", "pooling", "windowed"] {
        let task = fixtures.get(name).expect("fixture");
        for to in ["_wide", "_vol"] {
            let mut plan = lower(task, Preset::Small).unwrap_or_else(|e| panic!("{e}"));
            for step in &mut plan.steps {
                let Step::Kernel { kernel, .. } = step else {
                    continue;
                };
                let Some((family, dtype)) = kernel.rsplit_once('_') else {
                    continue;
                };
                let base = ["conv_depthwise", "max_pool", "avg_pool"]
                    .into_iter()
                    .find(|b| family.starts_with(b));
                if let Some(base) = base.filter(|b| to == "_wide" || b.starts_with("conv")) {
                    *kernel = format!("{base}{to}_{dtype}");
                    swapped += 1;
                }
            }
            let bad = check_plan(module, task, &plan);
            assert!(bad.is_empty(), "{name} with {to} forms: {bad:#?}");
        }
    }
    assert!(swapped >= 20, "only {swapped} steps swapped");
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

/// The F64 check can fail too: the same scalar rounded to f32 (what a float parameter would
/// pass) is caught, and so is the native plan's float arithmetic on a GEMM.
#[test]
fn f64_tolerance_catches_float_rounding() {
    let Some(module) = module() else {
        return;
    };
    let suite = TaskSuite::load(repo("tasks")).expect("task suite");
    let task = suite.get("scalar_multiply").expect("task");
    let mut plan = lower_f64(task, Preset::Small).expect("lower");
    let Step::Kernel { args, .. } = &mut plan.steps[0] else {
        panic!("expected a kernel")
    };
    let s = task.program.const_value("s").expect("the task's scalar");
    assert_eq!(args[1], StepArg::F64(s));
    assert_ne!(f64::from(s as f32), s);
    args[1] = StepArg::F64(f64::from(s as f32));
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = task.reference(Preset::Small, &inputs).expect("reference");
    let got = &run_f64(module, &plan, &inputs)[1];
    assert!(got
        .iter()
        .zip(&want[0])
        .any(|(&g, &w)| !within(g, w, F64_TOL)));

    let task = suite.get("matmul").expect("task");
    let inputs = task.generate_inputs(Preset::Small, 7);
    let want = task.reference(Preset::Small, &inputs).expect("reference");
    let plan = lower(task, Preset::Small).expect("lower");
    let got = run(module, &plan, &inputs)[2].read_f64();
    assert!(got
        .iter()
        .zip(&want[0])
        .any(|(&g, &w)| !within(g, w, F64_TOL)));
}

/// NaN and ties follow the interpreter in F64 plans (its max/min/maximum/relu/clamp drop a NaN;
/// its argmax/argmin keep a NaN only at index 0 and take the first of equal extremes), along
/// rows (warp and block per row) and columns, where the parallel combines see every order.
#[test]
fn f64_nan_and_ties_follow_the_interpreter() {
    let Some(module) = module() else {
        return;
    };
    let src = "input X: f32[R, N]\ninput Y: f32[R, N]\ninput L: f32[2, K]\n\
               output Am: i64[R]\noutput An: i64[R]\noutput Ac: i64[N]\noutput Al: i64[2]\n\
               output Mx: f32[R]\noutput Mn: f32[N]\noutput Re: f32[R, N]\n\
               output Cl: f32[R, N]\noutput Ma: f32[R, N]\noutput Mi: f32[R, N]\n\
               Am = argmax(X, axis=1)\nAn = argmin(X, axis=1)\nAc = argmax(X, axis=0)\n\
               Al = argmin(L, axis=1)\nMx = max(X, axis=1)\nMn = min(X, axis=0)\n\
               Re = relu(X)\nCl = clamp(X, -0.5, 0.5)\nMa = maximum(X, Y)\nMi = minimum(Y, X)";
    let program = crate::ops::Program::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let x = [
        [nan, 1.0, 2.0, 3.0, 0.0],
        [1.0, nan, 3.0, 3.0, -1.0],
        [2.0, 2.0, nan, nan, 2.0],
        [-inf, -inf, nan, -inf, -inf],
        [nan, nan, nan, nan, nan],
        [0.5, 4.0, -3.0, 4.0, nan],
    ];
    let y = [nan, 0.0, 1.0, nan, -2.0].repeat(6);
    // Long rows: a NaN first, then a NaN in the middle before the (tied) minimum.
    let k = 2000;
    let mut l: Vec<f64> = (0..2 * k).map(|i| ((i * 37) % 101) as f64).collect();
    l[0] = nan;
    l[k + 700] = nan;
    l[k + 1500] = -5.0;
    l[k + 1800] = -5.0;
    let inputs = vec![x.concat(), y, l];
    let sizes: crate::ops::Sizes = [("R", 6), ("N", 5), ("K", k)]
        .iter()
        .map(|(s, v)| (s.to_string(), *v))
        .collect();
    let want = crate::ops::interp::run(&program, &sizes, &inputs).expect("interpreter");
    let plan = lower::lower_program("nan", &program, &sizes, Precision::F64).expect("lower");
    let got = run_f64(module, &plan, &inputs);
    for (j, want) in want.iter().enumerate() {
        let got = &got[inputs.len() + j];
        let same = |(&g, &w): (&f64, &f64)| g == w || (g.is_nan() && w.is_nan());
        assert!(
            got.iter().zip(&want.data).all(same),
            "{}: got {got:?}, want {:?}",
            plan.buffers[inputs.len() + j].name,
            want.data
        );
    }
    // The index outputs are what the interpreter's rule gives.
    assert_eq!(got[3], [0.0, 2.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(got[6], [0.0, 1500.0]);
}
