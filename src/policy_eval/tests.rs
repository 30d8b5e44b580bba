//! The figures on hand-made trajectories, `--budget`'s split, and the driver with a scripted
//! policy against a stand-in environment whose verdict is written in the kernel.

use std::sync::{Arc, Mutex};

use super::*;
use crate::config::SamplingSection;
use crate::env::{Compiled, KernelEnv};
use crate::episode::EpisodeTask;
use crate::outcome::Outcome;
use crate::policy::{Completion, FinishReason, GenRequest, Policy, PolicyError, Weights};
use crate::scripted::ScriptedPolicy;
use crate::turn::TurnRecord;

fn correct(speedup: f64) -> Outcome {
    Outcome::Correct {
        kernel_ms: 1.0 / speedup,
        baseline_ms: 1.0,
        spread: 0.0,
        timing: "cpu".into(),
    }
}

fn fe() -> Outcome {
    Outcome::FormatError {
        reason: "no block".into(),
    }
}

fn ce() -> Outcome {
    Outcome::CompileError { log: "e".into() }
}

fn wrong() -> Outcome {
    Outcome::Wrong {
        reason: "values".into(),
        mismatch: None,
    }
}

/// A trajectory of these outcomes; turn i's response has `tokens` tokens.
fn traj(outcomes: &[Outcome], tokens: usize) -> Vec<TurnRecord> {
    outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let completion = Completion {
                id: 0,
                text: "r".into(),
                token_ids: vec![7; tokens],
                logprobs: vec![-1.0; tokens],
                policy_version: 0,
                finish: FinishReason::Stop,
            };
            TurnRecord::new(
                i as u32,
                "p".into(),
                completion,
                None,
                None,
                o.clone(),
                1.0,
                1.0,
            )
        })
        .collect()
}

fn task(name: &str, trajectories: Vec<Vec<TurnRecord>>) -> TaskTrajectories {
    TaskTrajectories {
        task: name.into(),
        level: 1,
        trajectories,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn close_all(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| close(*x, *y))
}

#[test]
fn figures_on_hand_made_trajectories() {
    let a = task(
        "a",
        vec![traj(&[fe(), correct(2.0)], 10), traj(&[fe(), wrong()], 10)],
    );
    let b = task(
        "b",
        vec![
            traj(&[correct(0.5), correct(0.8)], 20),
            traj(&[ce(), correct(0.25)], 20),
        ],
    );
    let c = task("c", vec![traj(&[fe(), fe()], 30), traj(&[fe(), fe()], 30)]);
    let scores: Vec<TaskScores> = [&a, &b, &c].into_iter().map(score_task).collect();
    // (task, turn_correct, solved_by_turn, avg@K, best@K, best speedup, avg speedup, format errors)
    type Want = (&'static str, [f64; 2], [f64; 2], f64, bool, f64, f64, f64);
    let want: [Want; 3] = [
        ("a", [0.0, 0.5], [0.0, 0.5], 0.5, true, 2.0, 1.0, 0.5),
        ("b", [0.5, 1.0], [0.5, 1.0], 1.0, true, 0.8, 0.525, 0.0),
        ("c", [0.0, 0.0], [0.0, 0.0], 0.0, false, 0.0, 0.0, 1.0),
    ];
    for (s, w) in scores.iter().zip(want) {
        assert_eq!(s.task, w.0);
        assert_eq!((s.samples, s.turns), (2, 2), "{}", s.task);
        assert!(
            close_all(&s.turn_correct, &w.1),
            "{}: {:?}",
            s.task,
            s.turn_correct
        );
        assert!(
            close_all(&s.solved_by_turn, &w.2),
            "{}: {:?}",
            s.task,
            s.solved_by_turn
        );
        assert!(close(s.avg_at_k, w.3), "{}: avg@K {}", s.task, s.avg_at_k);
        assert_eq!(s.best_at_k, w.4, "{}", s.task);
        assert!(close(s.best_speedup, w.5), "{}: {}", s.task, s.best_speedup);
        assert!(close(s.avg_speedup, w.6), "{}: {}", s.task, s.avg_speedup);
        assert!(close(s.format_error_rate, w.7), "{}", s.task);
    }
    assert_eq!(scores[1].outcomes["correct"], 3);
    assert_eq!(scores[1].outcomes["compile_error"], 1);

    let sum = summarize(&scores);
    assert_eq!((sum.tasks, sum.turns), (3, 12));
    assert!(close(sum.avg_at_k, 0.5));
    assert!(close(sum.best_at_k, 2.0 / 3.0));
    assert!(close_all(&sum.turn_correct, &[0.5 / 3.0, 0.5]));
    assert!(close_all(&sum.solved_by_turn, &[0.5 / 3.0, 0.5]));
    // Unsolved c counts 0: (2 + 0.8 + 0) / 3.
    assert!(close(sum.mean_speedup, 2.8 / 3.0));
    assert!(close(sum.mean_avg_speedup, 1.525 / 3.0));
    // Over the solved tasks only: sqrt(2 * 0.8).
    assert!(close(sum.geomean_speedup.unwrap(), 1.6f64.sqrt()));
    // fast_0: a and b; fast_1 and fast_1.5: a (2.0); fast_2: none (2.0 is not > 2).
    let fast: Vec<f64> = sum.fast_p.iter().map(|(_, f)| *f).collect();
    assert!(close_all(&fast, &[2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0]));
    assert!(close(sum.fast_1(), 1.0 / 3.0));
    // 6 format errors in 12 turns; tokens (4*10 + 4*20 + 4*30) / 12.
    assert!(close(sum.format_error_rate, 0.5));
    assert!(close(sum.mean_response_tokens, 20.0));
    assert_eq!(sum.outcomes["format_error"], 6);

    let none = summarize(&[]);
    assert_eq!(
        (none.tasks, none.geomean_speedup, none.fast_1()),
        (0, None, 0.0)
    );
}

#[test]
fn repeat_rate_counts_resubmitted_kernels_over_the_later_turns() {
    let with = |kernels: &[Option<&str>]| -> Vec<TurnRecord> {
        let mut t = traj(&vec![ce(); kernels.len()], 1);
        for (r, k) in t.iter_mut().zip(kernels) {
            r.kernel = k.map(str::to_string);
        }
        t
    };
    // Task a: K=2, N=3, later turns 4, repeats 2 (x x, and y z y). Task b: K=1, N=3, later
    // turns 2, no repeat (format errors have no kernel).
    let a = score_task(&task(
        "a",
        vec![
            with(&[Some("x"), Some("x"), Some("w")]),
            with(&[Some("y"), Some("z"), Some("y")]),
        ],
    ));
    let b = score_task(&task("b", vec![with(&[None, None, Some("v")])]));
    assert!(close(a.repeat_rate, 0.5) && close(b.repeat_rate, 0.0));
    // Weighted by later turns: 2 of 6.
    assert!(close(summarize(&[a, b]).repeat_rate, 2.0 / 6.0));
    // One-turn trajectories have no later turn to repeat in.
    assert!(close(
        score_task(&task("c", vec![with(&[Some("x")])])).repeat_rate,
        0.0
    ));
}

#[test]
fn budget_splits_into_trajectories_of_n_turns() {
    // (budget, turns) -> K, or an error naming the budget.
    let cases: [(u32, u32, Option<u32>); 7] = [
        (64, 4, Some(16)),
        (64, 1, Some(64)),
        (8, 8, Some(1)),
        (6, 4, None),
        (2, 4, None),
        (0, 1, None),
        (8, 0, None),
    ];
    for (budget, turns, want) in cases {
        match (samples_for_budget(budget, turns), want) {
            (Ok(k), Some(w)) => assert_eq!(k, w, "--budget {budget} --turns {turns}"),
            (Err(e), None) => assert!(e.contains("--"), "{e}"),
            (got, want) => panic!("--budget {budget} --turns {turns}: {got:?}, want {want:?}"),
        }
    }
}

/// An environment whose verdict is written in the kernel: `// speedup=S` is correct at S,
/// `// panic` panics, anything else does not compile. Counts its evaluations.
struct MarkerEnv {
    evaluations: Mutex<usize>,
}

impl KernelEnv for MarkerEnv {
    fn describe(&self) -> String {
        "marker environment (test)".into()
    }

    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome> {
        *self.evaluations.lock().unwrap() += 1;
        if source.contains("// panic") {
            panic!("marker environment told to panic");
        }
        let speedup = source
            .lines()
            .find_map(|l| l.trim().strip_prefix("// speedup="))
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| Outcome::CompileError {
                log: "no marker".into(),
            })?;
        Ok(Compiled {
            task: task.into(),
            artifact: Arc::new(speedup),
            compile_ms: 0.0,
        })
    }

    fn verify(&self, _compiled: &Compiled) -> Result<(), Outcome> {
        Ok(())
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        correct(*compiled.artifact.downcast_ref::<f64>().unwrap())
    }
}

fn answer(marker: &str) -> String {
    format!(
        "I think.\n```cuda\n// {marker}\n// kevin: launch k grid=(1) block=(32) args=(Y)\n\
         __global__ void k(float* y) {{ y[threadIdx.x] = 0.0f; }}\n```\nOne block."
    )
}

fn episode_tasks(names: &[&str]) -> Vec<Arc<EpisodeTask>> {
    names
        .iter()
        .map(|n| {
            Arc::new(EpisodeTask {
                name: n.to_string(),
                level: 1,
                statement: format!("# Task: {n} (level 1)\nDo it."),
            })
        })
        .collect()
}

fn options(samples: u32, turns: u32, gen_batch: usize) -> RunOptions {
    RunOptions {
        samples,
        turns,
        prompt_budget_chars: 24_000,
        seed: 7,
        sampling: SamplingSection::default(),
        gen_batch,
        eval_workers: 2,
    }
}

#[test]
fn garbage_then_a_correct_kernel_scores_turn_by_turn() {
    // Turn 0: no block (a format error); turn 1: a correct kernel, 3x on "fast", 0.5x on "slow".
    let mut policy = ScriptedPolicy::new(|task, turn| match turn {
        0 => "garbage without a block".into(),
        _ if task == "fast" => answer("speedup=3"),
        _ => answer("speedup=0.5"),
    });
    let env = MarkerEnv {
        evaluations: Mutex::new(0),
    };
    let tasks = episode_tasks(&["fast", "slow"]);
    let mut last = None;
    let out = run(
        &mut policy,
        &env,
        &tasks,
        &options(3, 2, 4),
        &mut |p: &Progress| last = Some(*p),
    )
    .unwrap();
    // Trajectories in task order, K each, N turns each.
    assert_eq!(
        out.iter().map(|t| t.task.as_str()).collect::<Vec<_>>(),
        ["fast", "slow"]
    );
    assert!(out.iter().all(|t| t.trajectories.len() == 3));
    assert!(out
        .iter()
        .flat_map(|t| &t.trajectories)
        .all(|tr| tr.len() == 2));
    // Format errors are never evaluated: 6 evaluations, the turn-1 kernels.
    assert_eq!(*env.evaluations.lock().unwrap(), 6);
    // The second prompt is the training rollout's: the history with the turn-1 feedback.
    let second = &out[0].trajectories[0][1];
    assert!(second.prompt.contains("### Turn 1") && second.prompt.contains("Format error"));
    assert_eq!(
        second.kernel.as_deref().map(|k| k.contains("speedup=3")),
        Some(true)
    );
    // Every batch stays within gen_batch, and every turn was asked exactly once.
    assert!(policy.batch_sizes().iter().all(|&b| (1..=4).contains(&b)));
    assert_eq!(policy.batch_sizes().iter().sum::<usize>(), 12);
    let p = last.unwrap();
    assert_eq!(
        (p.tasks_done, p.trajectories_done, p.turns_done, p.turns),
        (2, 6, 12, 12)
    );

    let scores: Vec<TaskScores> = out.iter().map(score_task).collect();
    for s in &scores {
        assert_eq!(s.turn_correct, vec![0.0, 1.0], "{}", s.task);
        assert_eq!(s.solved_by_turn, vec![0.0, 1.0], "{}", s.task);
        assert_eq!(
            (s.avg_at_k, s.best_at_k, s.format_error_rate),
            (1.0, true, 0.5)
        );
    }
    let sum = summarize(&scores);
    assert_eq!((sum.avg_at_k, sum.best_at_k), (1.0, 1.0));
    assert!(close(sum.mean_speedup, 1.75));
    assert!(close(sum.geomean_speedup.unwrap(), 1.5f64.sqrt()));
    assert!(close(sum.fast_1(), 0.5));
    // One token per word: half the turns are the 4 words of the garbage, half the answer's.
    let answer_tokens = answer("speedup=3").split_whitespace().count() as f64;
    assert!(close(sum.mean_response_tokens, (4.0 + answer_tokens) / 2.0));
}

#[test]
fn sampling_seeds_differ_by_task_trajectory_and_turn_only() {
    let a = request_seed(1, "relu", 0, 0);
    assert_eq!(a, request_seed(1, "relu", 0, 0));
    for other in [
        request_seed(2, "relu", 0, 0),
        request_seed(1, "gelu", 0, 0),
        request_seed(1, "relu", 1, 0),
        request_seed(1, "relu", 0, 1),
    ] {
        assert_ne!(a, other);
    }
}

#[test]
fn an_environment_panic_stops_the_run_with_the_task_named() {
    let mut policy = ScriptedPolicy::new(|_, _| answer("panic"));
    let env = MarkerEnv {
        evaluations: Mutex::new(0),
    };
    let err = run(
        &mut policy,
        &env,
        &episode_tasks(&["boom"]),
        &options(2, 1, 8),
        &mut |_| {},
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("boom") && msg.contains("told to panic"),
        "{msg}"
    );
    let shape = run(&mut policy, &env, &[], &options(0, 1, 8), &mut |_| {}).unwrap_err();
    assert!(shape.to_string().contains("--samples 0"), "{shape}");
}

/// A test double standing in for a GPU policy whose passes run out of memory: a `generate` call
/// of more than `fits` requests fails, as the burn policy's does when a pass cannot allocate
/// (every request of the call aborted, the engine idle again); smaller calls go to the script.
struct OutOfMemoryAbove {
    inner: ScriptedPolicy,
    fits: usize,
    failed_calls: usize,
}

impl Policy for OutOfMemoryAbove {
    fn describe(&self) -> String {
        "scripted policy out of memory above a batch size (a test double)".into()
    }

    fn version(&self) -> u64 {
        0
    }

    fn generate(
        &mut self,
        batch: &[GenRequest],
        sampling: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError> {
        if batch.len() > self.fits {
            self.failed_calls += 1;
            return Err(PolicyError::Generate {
                policy: "oom-double".into(),
                reason: format!(
                    "forward pass failed: allocating on the GPU: out of memory; aborted requests \
                     ({} of them)",
                    batch.len()
                ),
            });
        }
        self.inner.generate(batch, sampling)
    }

    fn set_weights(&mut self, _: &Weights) -> Result<(), PolicyError> {
        Ok(())
    }
}

#[test]
fn a_batch_out_of_memory_is_halved_and_nothing_is_lost() {
    let tasks = episode_tasks(&["fast", "slow"]);
    let script = |task: &str, turn: u32| match turn {
        0 => "garbage without a block".into(),
        _ if task == "fast" => answer("speedup=3"),
        _ => answer("speedup=0.5"),
    };
    let env = MarkerEnv {
        evaluations: Mutex::new(0),
    };
    let mut policy = OutOfMemoryAbove {
        inner: ScriptedPolicy::new(script),
        fits: 2,
        failed_calls: 0,
    };
    // gen_batch 8: 8 fails, 4 fails, then batches of 2 for the rest of the evaluation.
    let out = run(&mut policy, &env, &tasks, &options(4, 3, 8), &mut |_| {}).unwrap();
    assert_eq!(policy.failed_calls, 2);
    assert!(policy.inner.batch_sizes().iter().all(|&b| b <= 2));
    // Every turn was asked once and recorded: the same figures as without the failures.
    assert_eq!(policy.inner.batch_sizes().iter().sum::<usize>(), 2 * 4 * 3);
    let scores: Vec<TaskScores> = out.iter().map(score_task).collect();
    for s in &scores {
        assert_eq!(s.turn_correct, vec![0.0, 1.0, 1.0], "{}", s.task);
    }

    // A policy that fails even one request at a time ends the evaluation with its reason and
    // what was tried.
    let mut hopeless = OutOfMemoryAbove {
        inner: ScriptedPolicy::new(script),
        fits: 0,
        failed_calls: 0,
    };
    let err = run(&mut hopeless, &env, &tasks, &options(2, 1, 4), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("out of memory"), "{err}");
    assert!(err.contains("one request at a time failed twice"), "{err}");
    // 4 fails, 2 fails, 1 fails twice.
    assert_eq!(hopeless.failed_calls, 4);
}
