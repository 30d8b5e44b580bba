//! Evaluating a policy, the way the paper's Tables 1 and 2 do: K independent trajectories of N
//! refinement turns per task, then correctness and speedup over the tasks.
//!
//! [`run`] drives the episodes (the training rollout's [`crate::episode::Episode`], prompts and
//! feedback included) through a [`crate::policy::Policy`] and a [`crate::env::KernelEnv`];
//! [`score_task`] and [`summarize`] turn the trajectories into the figures below.
//!
//! Definitions (per task, over its K trajectories of N turns):
//! - a trajectory is *correct* when any of its turns produced a correct kernel;
//! - `turn_correct[t]`: the fraction of trajectories whose turn t is correct, and
//!   `solved_by_turn[t]`: the fraction with a correct kernel at turn t or before (serial
//!   refinement shows as these rising with t);
//! - avg@K: the fraction of correct trajectories (= `solved_by_turn[N-1]`); best@K: 1 when any
//!   trajectory is correct;
//! - `best_speedup`: the largest speedup of any correct kernel of any trajectory, 0 when none;
//!   `avg_speedup`: the mean over trajectories of each one's best correct speedup (0 for an
//!   incorrect trajectory): the speedup columns of best@K and avg@K in Table 1;
//! - the format-error rate and the mean response tokens are over all K x N turns; the repeat
//!   rate is over the turns after each trajectory's first: the fraction that resubmit a kernel
//!   their trajectory already submitted ([`crate::turn::repeats`]).
//!
//! Over the tasks: avg@K, best@K and the per-turn figures are means over tasks; `mean_speedup`
//! is the mean over tasks of `best_speedup` (unsolved tasks count 0, as in the paper, so it
//! rewards correctness and speed together) and `mean_avg_speedup` the same of `avg_speedup`;
//! `geomean_speedup` is the geometric mean of `best_speedup` over the solved tasks only (None
//! when none is solved); fast_p is the fraction of tasks whose best correct kernel is more than
//! p times faster than the baseline (fast_1: faster than the reference at all), for p in
//! [`crate::eval::FAST_P`]. The format-error rate and mean response tokens are over all turns.

pub mod compare;
mod run;

pub use run::{request_seed, run, Progress, RunError, RunOptions};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::eval::FAST_P;
use crate::turn::TurnRecord;

/// K trajectories for `--budget B` kernels per task at N turns: B / N, refusing a budget that
/// N does not divide or that leaves no trajectory (the comparison of Table 2 is at an equal
/// number of kernels, so a rounded K would compare unequal budgets).
pub fn samples_for_budget(budget: u32, turns: u32) -> Result<u32, String> {
    if turns == 0 {
        return Err("--turns 0: at least one turn is needed".into());
    }
    if budget < turns || budget % turns != 0 {
        return Err(format!(
            "--budget {budget} with --turns {turns}: the budget must be a positive multiple of \
             the turns (K = budget / turns trajectories of {turns} turns each)"
        ));
    }
    Ok(budget / turns)
}

/// The trajectories of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskTrajectories {
    /// The task.
    pub task: String,
    /// Its level.
    pub level: u8,
    /// K trajectories of N turns each.
    pub trajectories: Vec<Vec<TurnRecord>>,
}

/// One task's figures (see the module docs for the definitions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskScores {
    /// The task.
    pub task: String,
    /// Its level.
    pub level: u8,
    /// K.
    pub samples: usize,
    /// N (the longest trajectory).
    pub turns: usize,
    /// Per turn t: fraction of trajectories whose turn t is correct.
    pub turn_correct: Vec<f64>,
    /// Per turn t: fraction of trajectories with a correct kernel at turn t or before.
    pub solved_by_turn: Vec<f64>,
    /// Fraction of trajectories with a correct kernel.
    pub avg_at_k: f64,
    /// Whether any trajectory has a correct kernel.
    pub best_at_k: bool,
    /// Best correct speedup over all turns of all trajectories (0 when none is correct).
    pub best_speedup: f64,
    /// Mean over trajectories of each one's best correct speedup (0 for an incorrect one).
    pub avg_speedup: f64,
    /// Fraction of the turns whose response broke the format.
    pub format_error_rate: f64,
    /// Mean response tokens per turn.
    pub mean_response_tokens: f64,
    /// Of the turns after a trajectory's first, the fraction that resubmit a kernel their
    /// trajectory already submitted (0 in files written before it was recorded).
    #[serde(default)]
    pub repeat_rate: f64,
    /// Outcome kind -> turns.
    pub outcomes: BTreeMap<String, usize>,
    /// Correct kernels with a speedup flagged as suspicious (> 10x).
    pub flagged: usize,
}

fn mean(xs: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = xs
        .into_iter()
        .fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

fn best_correct_speedup(turns: &[TurnRecord]) -> Option<f64> {
    turns
        .iter()
        .filter_map(|t| t.outcome.speedup())
        .max_by(f64::total_cmp)
}

/// The figures of one task.
pub fn score_task(t: &TaskTrajectories) -> TaskScores {
    let trajs = &t.trajectories;
    let n = trajs.iter().map(Vec::len).max().unwrap_or(0);
    let frac = |f: &dyn Fn(&[TurnRecord]) -> bool| mean(trajs.iter().map(|tr| f(tr) as u8 as f64));
    let turn_correct = (0..n)
        .map(|i| frac(&|tr| tr.get(i).is_some_and(|r| r.outcome.is_correct())))
        .collect();
    let solved_by_turn: Vec<f64> = (0..n)
        .map(|i| frac(&|tr| tr.iter().take(i + 1).any(|r| r.outcome.is_correct())))
        .collect();
    let turns: Vec<&TurnRecord> = trajs.iter().flatten().collect();
    let mut outcomes = BTreeMap::new();
    for r in &turns {
        *outcomes.entry(r.outcome.kind().to_string()).or_insert(0) += 1;
    }
    let best = trajs.iter().filter_map(|tr| best_correct_speedup(tr));
    TaskScores {
        task: t.task.clone(),
        level: t.level,
        samples: trajs.len(),
        turns: n,
        avg_at_k: frac(&|tr| tr.iter().any(|r| r.outcome.is_correct())),
        best_at_k: trajs.iter().flatten().any(|r| r.outcome.is_correct()),
        best_speedup: best.clone().max_by(f64::total_cmp).unwrap_or(0.0),
        avg_speedup: mean(
            trajs
                .iter()
                .map(|tr| best_correct_speedup(tr).unwrap_or(0.0)),
        ),
        turn_correct,
        solved_by_turn,
        format_error_rate: mean(
            turns
                .iter()
                .map(|r| (r.outcome.kind() == "format_error") as u8 as f64),
        ),
        mean_response_tokens: mean(turns.iter().map(|r| r.response_tokens.len() as f64)),
        repeat_rate: {
            let (repeated, later) = trajs
                .iter()
                .map(|tr| crate::turn::repeats(tr))
                .fold((0, 0), |(r, l), (a, b)| (r + a, l + b));
            frac_of(repeated, later)
        },
        outcomes,
        flagged: turns.iter().filter(|r| r.outcome.flagged()).count(),
    }
}

/// The figures over all tasks (see the module docs for the definitions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySummary {
    /// Tasks evaluated.
    pub tasks: usize,
    /// Kernels asked for: the sum over tasks of K x N turns.
    pub turns: usize,
    /// Mean over tasks of avg@K.
    pub avg_at_k: f64,
    /// Fraction of tasks solved by some trajectory (best@K).
    pub best_at_k: f64,
    /// Per turn t: mean over tasks of `turn_correct[t]`.
    pub turn_correct: Vec<f64>,
    /// Per turn t: mean over tasks of `solved_by_turn[t]`.
    pub solved_by_turn: Vec<f64>,
    /// Mean over tasks of the best correct speedup, unsolved tasks counted as 0.
    pub mean_speedup: f64,
    /// Mean over tasks of the per-trajectory mean speedup (incorrect trajectories as 0).
    pub mean_avg_speedup: f64,
    /// Geometric mean of the best correct speedup over the solved tasks (None when none is).
    pub geomean_speedup: Option<f64>,
    /// (p, fraction of tasks whose best correct speedup is > p), for p in [`FAST_P`].
    pub fast_p: Vec<(f64, f64)>,
    /// Fraction of all turns whose response broke the format.
    pub format_error_rate: f64,
    /// Mean response tokens over all turns.
    pub mean_response_tokens: f64,
    /// Of all turns after a trajectory's first, the fraction that resubmit a kernel their
    /// trajectory already submitted (0 in files written before it was recorded).
    #[serde(default)]
    pub repeat_rate: f64,
    /// Outcome kind -> turns, over all tasks.
    pub outcomes: BTreeMap<String, usize>,
    /// Correct kernels flagged as suspicious (> 10x).
    pub flagged: usize,
}

impl PolicySummary {
    /// fast_1: the fraction of tasks with a correct kernel faster than the baseline.
    pub fn fast_1(&self) -> f64 {
        self.fast_p
            .iter()
            .find(|(p, _)| *p == 1.0)
            .map_or(0.0, |(_, f)| *f)
    }
}

/// The summary over `scores`.
pub fn summarize(scores: &[TaskScores]) -> PolicySummary {
    let n = scores.iter().map(|s| s.turns).max().unwrap_or(0);
    // Per-turn means over tasks (a task with fewer turns, which `run` never makes, counts only
    // where it has them).
    let per_turn = |f: fn(&TaskScores) -> &Vec<f64>| -> Vec<f64> {
        (0..n)
            .map(|i| mean(scores.iter().filter_map(|s| f(s).get(i).copied())))
            .collect()
    };
    let solved: Vec<f64> = scores
        .iter()
        .filter(|s| s.best_at_k)
        .map(|s| s.best_speedup)
        .collect();
    let turn_counts: Vec<usize> = scores.iter().map(|s| s.samples * s.turns).collect();
    let all_turns: usize = turn_counts.iter().sum();
    // Turn-weighted means: every turn counts once, whatever its task's K.
    let per_turn_mean = |f: fn(&TaskScores) -> f64| {
        if all_turns == 0 {
            0.0
        } else {
            scores
                .iter()
                .zip(&turn_counts)
                .map(|(s, &c)| f(s) * c as f64)
                .sum::<f64>()
                / all_turns as f64
        }
    };
    let mut outcomes = BTreeMap::new();
    for s in scores {
        for (k, v) in &s.outcomes {
            *outcomes.entry(k.clone()).or_insert(0) += v;
        }
    }
    PolicySummary {
        tasks: scores.len(),
        turns: all_turns,
        avg_at_k: mean(scores.iter().map(|s| s.avg_at_k)),
        best_at_k: mean(scores.iter().map(|s| s.best_at_k as u8 as f64)),
        turn_correct: per_turn(|s| &s.turn_correct),
        solved_by_turn: per_turn(|s| &s.solved_by_turn),
        mean_speedup: mean(scores.iter().map(|s| s.best_speedup)),
        mean_avg_speedup: mean(scores.iter().map(|s| s.avg_speedup)),
        geomean_speedup: (!solved.is_empty())
            .then(|| mean(solved.iter().map(|s| s.max(1e-12).ln())).exp()),
        fast_p: FAST_P
            .iter()
            .map(|&p| {
                let fast = scores
                    .iter()
                    .filter(|s| s.best_at_k && s.best_speedup > p)
                    .count();
                (p, frac_of(fast, scores.len()))
            })
            .collect(),
        format_error_rate: per_turn_mean(|s| s.format_error_rate),
        mean_response_tokens: per_turn_mean(|s| s.mean_response_tokens),
        repeat_rate: {
            // Weighted by each task's later turns, K x (N - 1).
            let later: Vec<f64> = scores
                .iter()
                .map(|s| (s.samples * s.turns.saturating_sub(1)) as f64)
                .collect();
            let total: f64 = later.iter().sum();
            if total == 0.0 {
                0.0
            } else {
                scores
                    .iter()
                    .zip(&later)
                    .map(|(s, l)| s.repeat_rate * l)
                    .sum::<f64>()
                    / total
            }
        },
        outcomes,
        flagged: scores.iter().map(|s| s.flagged).sum(),
    }
}

fn frac_of(k: usize, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        k as f64 / n as f64
    }
}

#[cfg(test)]
mod tests;
