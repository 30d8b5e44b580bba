//! The evaluation path end to end on the CPU backend, with the real worker processes: a correct
//! kernel passes; a wrong one, one that leaves outputs unwritten, one that clobbers an input, one
//! with a race (missing barriers), one that reads out of bounds and one that loops forever each
//! get the right outcome (tests/data/cpu/). And every reference solution passes, the inline-PTX
//! tensor-core GEMMs (mma.sync, ldmatrix, cp.async) included.

mod common;

use std::sync::Arc;

use kevin::env::cpu::CpuEnv;
use kevin::env::{evaluate, KernelEnv};
use kevin::tasks::{Preset, TaskSuite};

use common::{bin, cpu_backend_available, root};

fn env(verify_timeout_ms: u64) -> Option<CpuEnv> {
    if !cpu_backend_available() {
        return None;
    }
    let suite = Arc::new(TaskSuite::load(root().join("tasks")).unwrap());
    let program = bin();
    Some(
        CpuEnv::new(
            suite,
            &root().join("tasks"),
            Preset::Small,
            program,
            2,
            kevin::env::Deadlines {
                verify_ms: verify_timeout_ms,
                ..kevin::env::Deadlines::default()
            },
        )
        .unwrap(),
    )
}

fn check(env: &dyn KernelEnv, case: &str, kind: &str, says: &str) {
    let path = root().join("tests/data/cpu").join(format!("{case}.cu"));
    let source = std::fs::read_to_string(&path).unwrap();
    let task = case.split('.').next().unwrap();
    let outcome = evaluate(env, task, &source);
    assert_eq!(outcome.kind(), kind, "{case}: {outcome:?}");
    let feedback = outcome.feedback();
    assert!(
        feedback.contains(says),
        "{case}: feedback {feedback:?} should mention {says:?}"
    );
}

#[test]
fn protocol_cases_get_the_right_outcome() {
    let Some(env) = env(5_000) else { return };
    check(&env, "relu.correct", "correct", "cpu timing");
    check(&env, "relu_sum_rows.correct", "correct", "cpu timing");
    check(&env, "relu.wrong", "wrong", "First mismatch in output Y");
    check(&env, "relu.unwritten", "wrong", "Y");
    check(&env, "relu.clobber", "wrong", "input X");
    check(&env, "relu_sum_rows.race", "wrong", "Y");
    check(&env, "relu.out_of_bounds", "crash", "crashed");
    check(&env, "relu.infinite_loop", "timeout", "verify");
    // The worker killed for the loop was replaced: the next evaluation works.
    check(&env, "relu.correct", "correct", "cpu timing");
}

#[test]
fn every_reference_solution_passes_on_the_cpu_backend() {
    let Some(env) = env(60_000) else { return };
    let suite = TaskSuite::load(root().join("tasks")).unwrap();
    let mut failures = Vec::new();
    for task in suite.tasks() {
        let source = std::fs::read_to_string(
            root()
                .join("tasks/solutions")
                .join(format!("{}.cu", task.name)),
        )
        .unwrap();
        let outcome = evaluate(&env, &task.name, &source);
        if !outcome.is_correct() {
            failures.push(format!("{}: {}", task.name, outcome.feedback()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} reference solutions failed on the CPU backend:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
