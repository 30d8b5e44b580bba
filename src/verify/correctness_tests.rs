use std::cell::RefCell;
use std::rc::Rc;
use std::sync::OnceLock;

use super::*;
use crate::tasks::TaskSuite;
use crate::verify::doubles::*;

fn suite() -> &'static TaskSuite {
    static SUITE: OnceLock<TaskSuite> = OnceLock::new();
    SUITE.get_or_init(|| {
        TaskSuite::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tasks"))
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn task(name: &str) -> Task {
    suite()
        .get(name)
        .unwrap_or_else(|| panic!("no task {name}"))
        .clone()
}

fn fixed(trials: u32) -> ProtocolConfig {
    ProtocolConfig {
        trials,
        seed: Some(42),
    }
}

fn interp(name: &str) -> InterpreterExecDouble {
    InterpreterExecDouble {
        task: task(name),
        preset: Preset::Small,
    }
}

/// Runs the protocol on `task` at the small preset with a fixed seed and 5 trials.
fn run(task: &Task, exec: &mut dyn Executor) -> Result<CorrectnessReport, CheckError> {
    check(task, Preset::Small, exec, &fixed(5))
}

/// What a case expects of `check`.
enum Expect {
    /// Passes.
    Correct,
    /// Wrong with exactly this reason and (output, index, mismatches, trial) of the mismatch.
    Wrong(String, Option<(&'static str, u64, u64, u32)>),
    /// Wrong with a reason starting like this (for reasons that contain input values).
    WrongStarting(&'static str),
    /// This non-Wrong outcome.
    Outcome(Outcome),
}

fn expect(name: &str, task: &Task, exec: &mut dyn Executor, want: Expect) {
    let got = run(task, exec);
    match (want, got) {
        (Expect::Correct, Ok(r)) => {
            assert_eq!((r.trials, r.runs, r.seeds.len()), (5, 10, 5), "{name}");
            assert!(r.max_error_ratio <= 1.0, "{name}: {}", r.max_error_ratio);
        }
        (
            Expect::Wrong(reason, m),
            Err(CheckError::Candidate(Outcome::Wrong {
                reason: r,
                mismatch,
            })),
        ) => {
            assert_eq!(r, reason, "{name}");
            let m_got = mismatch.map(|m| (m.output, m.index, m.mismatches, m.trial));
            let m_want = m.map(|(o, i, n, t)| (o.to_string(), i, n, t));
            assert_eq!(m_got, m_want, "{name}");
        }
        (
            Expect::WrongStarting(prefix),
            Err(CheckError::Candidate(Outcome::Wrong { reason, .. })),
        ) => {
            assert!(reason.starts_with(prefix), "{name}: {reason}");
        }
        (Expect::Outcome(o), Err(CheckError::Candidate(got))) => assert_eq!(got, o, "{name}"),
        (_, got) => panic!("{name}: unexpected {got:?}"),
    }
}

fn f32_out(tensors: &mut [TensorBuf]) -> &mut [f32] {
    tensors.last_mut().unwrap().as_f32_mut().unwrap()
}

#[test]
fn correct_executors_pass() {
    let sum = task("sum_reduce");
    let s = sum.signature(Preset::Small).sizes;
    let size = |k: &str| s.iter().find(|(n, _)| n == k).unwrap().1;
    let mut sum_kernel = SumReduceKernelDouble {
        b: size("B"),
        m: size("M"),
        n: size("N"),
    };
    expect(
        "relu kernel",
        &task("relu"),
        &mut ReluKernelDouble,
        Expect::Correct,
    );
    expect("sum kernel", &sum, &mut sum_kernel, Expect::Correct);
    for name in [
        "relu",
        "sum_reduce",
        "argmax_dim1",
        "gelu_f16",
        "matmul_bf16",
        "softmax_argmax",
    ] {
        expect(name, &task(name), &mut interp(name), Expect::Correct);
    }
}

#[test]
fn broken_relu_kernels_fail_with_their_reason() {
    let relu = task("relu");
    let n = relu.signature(Preset::Small).tensors[1].numel() as u64;
    let last = n as usize - 1;
    type Case = (
        &'static str,
        Box<dyn FnMut(Call, &mut [TensorBuf]) -> Result<(), ExecFailure>>,
        Expect,
    );
    let cases: Vec<Case> = vec![
        (
            "one element off",
            Box::new(|_, t| {
                f32_out(t)[5] += 1.0;
                Ok(())
            }),
            Expect::Wrong("values differ".into(), Some(("Y", 5, 1, 0))),
        ),
        (
            "last element unwritten",
            Box::new(move |_, t| {
                f32_out(t)[last] = f32::from_bits(super::super::buffer::F32_FILL);
                Ok(())
            }),
            Expect::Wrong(
                "output Y was not fully written (NaN left at index 2144)".into(),
                Some(("Y", n - 1, 1, 0)),
            ),
        ),
        (
            "first half unwritten",
            Box::new(move |_, t| {
                f32_out(t)[..last / 2].fill(f32::from_bits(super::super::buffer::F32_FILL));
                Ok(())
            }),
            Expect::Wrong(
                "output Y was not fully written (NaN left at index 0)".into(),
                Some(("Y", 0, last as u64 / 2, 0)),
            ),
        ),
        (
            "input clobbered",
            Box::new(|_, t| {
                t[0].as_f32_mut().unwrap()[3] = 0.0;
                Ok(())
            }),
            Expect::WrongStarting("input X was modified (index 3: "),
        ),
        (
            "racy: second run differs",
            Box::new(|c, t| {
                if c.second_run() {
                    f32_out(t)[2] = -7.0;
                }
                Ok(())
            }),
            Expect::Wrong(
                "results differ between two runs on the same inputs (a race or an uninitialised read?)".into(),
                Some(("Y", 2, 1, 0)),
            ),
        ),
        (
            "second run skipped (cached result)",
            Box::new(|c, t| {
                if c.second_run() {
                    t[1].fill_nan();
                }
                Ok(())
            }),
            Expect::Wrong(
                "results differ between two runs on the same inputs (a race or an uninitialised read?): \
                 on the second run, output Y was not fully written (NaN left at index 0)"
                    .into(),
                Some(("Y", 0, n, 0)),
            ),
        ),
        (
            "Inf where finite",
            Box::new(|_, t| {
                f32_out(t)[0] = f32::INFINITY;
                Ok(())
            }),
            Expect::Wrong(
                "output Y has Inf where the reference is finite (index 0)".into(),
                Some(("Y", 0, 1, 0)),
            ),
        ),
        (
            "computed NaN where finite",
            Box::new(|_, t| {
                f32_out(t)[9] = f32::NAN;
                Ok(())
            }),
            Expect::Wrong(
                "output Y has NaN where the reference is finite (index 9)".into(),
                Some(("Y", 9, 1, 0)),
            ),
        ),
        (
            "wrong only in trial 3",
            Box::new(|c, t| {
                if c.trial() == 3 {
                    f32_out(t)[11] *= 2.0;
                    f32_out(t)[11] += 1.0;
                }
                Ok(())
            }),
            Expect::Wrong("values differ".into(), Some(("Y", 11, 1, 3))),
        ),
    ];
    for (name, tamper, want) in cases {
        let mut exec = TamperExecDouble::new(ReluKernelDouble, tamper);
        expect(name, &relu, &mut exec, want);
    }
}

#[test]
fn clobbered_input_reports_old_and_new_value() {
    let relu = task("relu");
    let inputs = relu.generate_inputs(Preset::Small, SplitMix64::derive(42, 0).next_u64());
    let mut exec = TamperExecDouble::new(ReluKernelDouble, |_, t| {
        t[0].as_f32_mut().unwrap()[3] = 0.0;
        Ok(())
    });
    let want = format!("input X was modified (index 3: {} -> 0)", inputs[0][3]);
    expect("clobber", &relu, &mut exec, Expect::Wrong(want, None));
}

#[test]
fn i64_outputs_compare_exactly() {
    let argmax = task("argmax_dim1");
    let n = argmax.signature(Preset::Small).tensors[1].numel();
    let off_by_one = |_: Call, t: &mut [TensorBuf]| {
        t[1].as_i64_mut().unwrap()[4] += 1;
        Ok(())
    };
    let mut exec = TamperExecDouble::new(interp("argmax_dim1"), off_by_one);
    expect(
        "index off",
        &argmax,
        &mut exec,
        Expect::Wrong("values differ".into(), Some(("Y", 4, 1, 0))),
    );
    let unwritten = move |_: Call, t: &mut [TensorBuf]| {
        t[1].as_i64_mut().unwrap()[n - 1] = i64::MIN;
        Ok(())
    };
    let mut exec = TamperExecDouble::new(interp("argmax_dim1"), unwritten);
    let reason = format!(
        "output Y was not fully written (fill value i64::MIN left at index {})",
        n - 1
    );
    expect(
        "unwritten",
        &argmax,
        &mut exec,
        Expect::Wrong(reason, Some(("Y", n as u64 - 1, 1, 0))),
    );
    // The mismatch reports an unwritten element as NaN.
    let mut exec = TamperExecDouble::new(interp("argmax_dim1"), unwritten);
    match run(&argmax, &mut exec) {
        Err(CheckError::Candidate(Outcome::Wrong {
            mismatch: Some(m), ..
        })) => assert!(m.got.is_nan()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn executor_failures_become_outcomes() {
    let relu = task("relu");
    let cases = [
        (
            ExecFailure::Crash("illegal address".into()),
            Outcome::Crash {
                reason: "illegal address".into(),
            },
        ),
        (
            ExecFailure::Timeout { limit_ms: 250 },
            Outcome::Timeout {
                stage: "verify".into(),
                limit_ms: 250,
            },
        ),
        (
            ExecFailure::Launch("block of 2048 threads".into()),
            Outcome::LaunchError {
                reason: "block of 2048 threads".into(),
            },
        ),
        (
            ExecFailure::Unsupported("warp shuffles".into()),
            Outcome::Unsupported {
                feature: "warp shuffles".into(),
            },
        ),
    ];
    for (failure, outcome) in cases {
        let name = format!("{failure:?}");
        expect(
            &name,
            &relu,
            &mut FailingExecDouble(failure),
            Expect::Outcome(outcome),
        );
    }
    // A failure of the backend itself is not the candidate's outcome.
    let got = run(
        &relu,
        &mut FailingExecDouble(ExecFailure::Harness("cudaMemcpy".into())),
    );
    assert!(
        matches!(got, Err(CheckError::Harness(HarnessError::Backend(_)))),
        "{got:?}"
    );
    // Nor is an executor that swaps a tensor for another.
    let mut swapper = TamperExecDouble::new(ReluKernelDouble, |_, t| {
        t[1] = TensorBuf::new("Y", Dtype::F32, 3).unwrap();
        Ok(())
    });
    let got = run(&relu, &mut swapper);
    assert!(
        matches!(got, Err(CheckError::Harness(HarnessError::Backend(_)))),
        "{got:?}"
    );
}

#[test]
fn tolerance_edge_at_check_level() {
    // atol = 1/16, rtol = 0: where relu gives 0, writing exactly 1/16 passes; one ulp more fails.
    // atol = 0, rtol = 1: where relu gives x > 0, writing exactly 2x passes; one ulp more fails.
    // (atol, rtol, the edge value from the reference value, where the edge applies)
    type EdgeCase = (f64, f64, fn(f32) -> f32, fn(f32) -> bool);
    let cases: [EdgeCase; 2] = [
        (1.0 / 16.0, 0.0, |_| 1.0 / 16.0, |y| y == 0.0),
        (0.0, 1.0, |y| 2.0 * y, |y| y > 0.0),
    ];
    for (atol, rtol, edge, applies) in cases {
        let mut relu = task("relu");
        relu.tolerance = Tolerance { atol, rtol };
        for (bump, passes) in [(false, true), (true, false)] {
            let mut exec = TamperExecDouble::new(ReluKernelDouble, move |_, t| {
                let y = f32_out(t);
                let i = y.iter().position(|&v| applies(v)).unwrap();
                y[i] = edge(y[i]);
                if bump {
                    y[i] = f32::from_bits(y[i].to_bits() + 1);
                }
                Ok(())
            });
            let got = run(&relu, &mut exec);
            assert_eq!(
                got.is_ok(),
                passes,
                "atol {atol} rtol {rtol} bump {bump}: {got:?}"
            );
            if let Ok(r) = got {
                assert_eq!(r.max_error_ratio, 1.0);
            }
        }
    }
}

#[test]
fn within_is_inclusive_at_the_bound() {
    let tol = Tolerance {
        atol: 0.25,
        rtol: 0.5,
    };
    // bound at want = 2: 0.25 + 1 = 1.25
    assert!(within(3.25, 2.0, tol));
    assert!(within(0.75, 2.0, tol));
    assert!(!within(3.25 + f64::EPSILON * 4.0, 2.0, tol));
    assert!(!within(0.75 - f64::EPSILON, 2.0, tol));
    assert!(within(-0.25, 0.0, tol));
    assert!(!within(f64::NAN, 0.0, tol));
    let zero = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    assert!(within(5.0, 5.0, zero) && !within(5.0, 5.000001, zero));
}

#[test]
fn nonfinite_reference_values() {
    let tol = Tolerance {
        atol: 1.0,
        rtol: 1.0,
    };
    let f = |got, want| judge(Dtype::F32, got, false, want, tol);
    assert_eq!(f(f64::NAN, f64::NAN), None);
    assert_eq!(f(1.0, f64::NAN), Some(ElemFailure::Differs));
    assert_eq!(f(f64::INFINITY, f64::INFINITY), None);
    assert_eq!(
        f(f64::NEG_INFINITY, f64::INFINITY),
        Some(ElemFailure::Differs)
    );
    assert_eq!(f(1e30, f64::INFINITY), Some(ElemFailure::Differs));
    assert_eq!(f(f64::INFINITY, 1e30), Some(ElemFailure::NonFinite));
    // The fill fails even where the reference is NaN.
    assert_eq!(
        judge(Dtype::F32, f64::NAN, true, f64::NAN, tol),
        Some(ElemFailure::Unwritten)
    );
}

#[test]
fn trials_draw_fresh_inputs_and_run_twice_on_nan_filled_outputs() {
    /// Executor double that records, on entry, the input bytes and whether the output is all
    /// fill, then computes relu.
    type Log = Rc<RefCell<Vec<(Vec<u8>, bool)>>>;
    struct RecorderExecDouble(Log);
    impl Executor for RecorderExecDouble {
        fn run(&mut self, t: &mut [TensorBuf]) -> Result<(), ExecFailure> {
            let all_fill = (0..t[1].numel()).all(|i| t[1].is_fill(i));
            self.0
                .borrow_mut()
                .push((t[0].as_bytes().to_vec(), all_fill));
            ReluKernelDouble.run(t)
        }
    }
    let seen: Log = Rc::default();
    let relu = task("relu");
    let report = run(&relu, &mut RecorderExecDouble(seen.clone())).unwrap();
    let seen = seen.borrow();
    assert_eq!(seen.len(), 10);
    assert!(
        seen.iter().all(|(_, fill)| *fill),
        "outputs are NaN-filled before every run"
    );
    for pair in seen.chunks(2) {
        assert_eq!(
            pair[0].0, pair[1].0,
            "both runs of a trial see the same inputs"
        );
    }
    let mut distinct: Vec<&Vec<u8>> = seen.iter().step_by(2).map(|s| &s.0).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "every trial has fresh inputs");
    // A fixed seed reproduces; the OS seed does not repeat.
    assert_eq!(
        run(&relu, &mut ReluKernelDouble).unwrap().seeds,
        report.seeds
    );
    let os = || {
        check(
            &relu,
            Preset::Small,
            &mut ReluKernelDouble,
            &ProtocolConfig::default(),
        )
        .unwrap()
    };
    let (a, b) = (os(), os());
    assert_eq!(a.trials, 5);
    assert_ne!(a.seeds, b.seeds);
}

#[test]
fn reference_runs_before_the_candidate() {
    // A broken task (a zero size) fails in the reference: a harness error, the executor untouched.
    let mut broken = task("relu");
    broken.small_sizes.insert("M".into(), 0);
    let mut exec = TamperExecDouble::new(ReluKernelDouble, |_, _| Ok(()));
    let got = run(&broken, &mut exec);
    assert!(
        matches!(
            got,
            Err(CheckError::Harness(HarnessError::Reference { .. }))
        ),
        "{got:?}"
    );
    assert_eq!(exec.calls, 0);
}

#[test]
fn os_seeds_differ() {
    assert_ne!(os_seed().unwrap(), os_seed().unwrap());
}
