//! End-to-end tests of [`super::evaluate`] with executor and timer doubles.

use super::correctness::{HarnessError, ProtocolConfig};
use super::doubles::*;
use super::timing::{Timer, TimingConfig, Which};
use super::*;
use crate::tasks::{Preset, TaskSuite};

/// Timer double: a constant time per program, or a failure.
struct ConstTimerDouble {
    kernel_ms: f64,
    baseline_ms: f64,
    fail: Option<ExecFailure>,
}

impl Timer for ConstTimerDouble {
    fn time_once(&mut self, which: Which) -> Result<f64, ExecFailure> {
        match (&self.fail, which) {
            (Some(f), _) => Err(f.clone()),
            (None, Which::Candidate) => Ok(self.kernel_ms),
            (None, Which::Baseline) => Ok(self.baseline_ms),
        }
    }
}

fn cfg() -> EvalConfig {
    EvalConfig {
        protocol: ProtocolConfig {
            trials: 2,
            seed: Some(7),
        },
        timing: TimingConfig::default(),
        label: "cpu".into(),
    }
}

#[test]
fn evaluate_composes_check_and_measure() {
    let suite = TaskSuite::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tasks")).unwrap();
    let relu = suite.get("relu").unwrap();
    let timer = |fail| ConstTimerDouble {
        kernel_ms: 0.5,
        baseline_ms: 1.0,
        fail,
    };
    let ok = evaluate(
        relu,
        Preset::Small,
        &mut ReluKernelDouble,
        &mut timer(None),
        &cfg(),
    )
    .unwrap();
    assert_eq!(ok.speedup(), Some(2.0));
    assert!(matches!(&ok, Outcome::Correct { timing, .. } if timing == "cpu"));

    let mut wrong = TamperExecDouble::new(ReluKernelDouble, |_, t| {
        t[1].as_f32_mut().unwrap()[0] = 9.0;
        Ok(())
    });
    let got = evaluate(relu, Preset::Small, &mut wrong, &mut timer(None), &cfg()).unwrap();
    assert_eq!(got.kind(), "wrong");

    let slow = timer(Some(ExecFailure::Timeout { limit_ms: 100 }));
    let got = evaluate(
        relu,
        Preset::Small,
        &mut ReluKernelDouble,
        &mut { slow },
        &cfg(),
    )
    .unwrap();
    let want = Outcome::Timeout {
        stage: "profile".into(),
        limit_ms: 100,
    };
    assert_eq!(got, want);

    let broken = timer(Some(ExecFailure::Harness("no events".into())));
    let got = evaluate(
        relu,
        Preset::Small,
        &mut ReluKernelDouble,
        &mut { broken },
        &cfg(),
    );
    assert!(matches!(got, Err(HarnessError::Backend(m)) if m == "no events"));
}
