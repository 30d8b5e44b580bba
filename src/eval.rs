//! Evaluation summaries: what `kevin eval` reports over a set of tasks.
//!
//! Per task an [`Outcome`]; over the set: the correct rate, fast_p (the fraction of tasks whose
//! kernel is correct and more than p times faster than the baseline, as KernelBench defines it),
//! the mean speedup counting an incorrect kernel as 0 (so it rewards correctness and speed
//! together, as the paper's averages do), and the geometric-mean speedup over the correct
//! kernels (robust to one outlier; undefined when nothing is correct). A task the harness could
//! not judge ([`Outcome::HarnessError`]) is left out of every rate and counted apart.

use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;

/// The p of the fast_p figures reported.
pub const FAST_P: [f64; 4] = [0.0, 1.0, 1.5, 2.0];

/// One task's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The task.
    pub task: String,
    /// Its level.
    pub level: u8,
    /// The verdict.
    pub outcome: Outcome,
    /// Wall time of the evaluation (ms).
    pub eval_ms: f64,
}

/// The summary over a set of tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Tasks judged (those the harness failed on are not: see `harness_errors`).
    pub tasks: usize,
    /// Tasks the harness could not judge (not the kernels' failures; in no rate).
    #[serde(default)]
    pub harness_errors: usize,
    /// Correct kernels.
    pub correct: usize,
    /// correct / tasks.
    pub correct_rate: f64,
    /// (p, fraction of tasks correct with speedup > p), for p in [`FAST_P`].
    pub fast_p: Vec<(f64, f64)>,
    /// Mean speedup, incorrect counted as 0.
    pub mean_speedup: f64,
    /// Geometric mean of the correct kernels' speedups (None when none is correct).
    pub geomean_speedup: Option<f64>,
    /// Correct kernels whose speedup was flagged as suspicious (> 10x).
    pub flagged: usize,
    /// Outcome kind -> count.
    pub outcomes: std::collections::BTreeMap<String, usize>,
}

/// Summarises `results`.
pub fn summarize(results: &[TaskResult]) -> Summary {
    let harness_errors = results
        .iter()
        .filter(|r| r.outcome.is_harness_error())
        .count();
    let n = results.len() - harness_errors;
    let speedups: Vec<f64> = results.iter().filter_map(|r| r.outcome.speedup()).collect();
    let correct = results.iter().filter(|r| r.outcome.is_correct()).count();
    let frac = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    let fast_p = FAST_P
        .iter()
        .map(|&p| (p, frac(speedups.iter().filter(|&&s| s > p).count())))
        .collect();
    let mean_speedup = if n == 0 {
        0.0
    } else {
        speedups.iter().sum::<f64>() / n as f64
    };
    let geomean_speedup = (!speedups.is_empty()).then(|| {
        (speedups.iter().map(|s| s.max(1e-12).ln()).sum::<f64>() / speedups.len() as f64).exp()
    });
    let mut outcomes = std::collections::BTreeMap::new();
    for r in results {
        *outcomes.entry(r.outcome.kind().to_string()).or_insert(0) += 1;
    }
    Summary {
        tasks: n,
        harness_errors,
        correct,
        correct_rate: frac(correct),
        fast_p,
        mean_speedup,
        geomean_speedup,
        flagged: results.iter().filter(|r| r.outcome.flagged()).count(),
        outcomes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(task: &str, outcome: Outcome) -> TaskResult {
        TaskResult {
            task: task.into(),
            level: 1,
            outcome,
            eval_ms: 1.0,
        }
    }

    fn correct(speedup: f64) -> Outcome {
        Outcome::Correct {
            kernel_ms: 1.0 / speedup,
            baseline_ms: 1.0,
            spread: 0.0,
            timing: "cpu".into(),
        }
    }

    #[test]
    fn summary_hand_values() {
        let rs = [
            result("a", correct(2.0)),
            result("b", correct(0.5)),
            result("c", Outcome::CompileError { log: String::new() }),
            result("d", correct(1.2)),
        ];
        let s = summarize(&rs);
        assert_eq!((s.tasks, s.correct), (4, 3));
        assert!((s.correct_rate - 0.75).abs() < 1e-12);
        // fast_0 = 3/4, fast_1 = 2/4 (2.0, 1.2), fast_1.5 = 1/4, fast_2 = 0 (2.0 is not > 2).
        let fp: Vec<f64> = s.fast_p.iter().map(|(_, f)| *f).collect();
        assert_eq!(fp, vec![0.75, 0.5, 0.25, 0.0]);
        // Mean with the failure as 0: (2 + 0.5 + 0 + 1.2) / 4 = 0.925.
        assert!((s.mean_speedup - 0.925).abs() < 1e-12);
        // Geometric mean of (2, 0.5, 1.2) = 1.2^(1/3).
        assert!((s.geomean_speedup.unwrap() - 1.2f64.powf(1.0 / 3.0)).abs() < 1e-12);
        assert_eq!(s.outcomes["compile_error"], 1);
        // A task the harness failed on is in no rate.
        let mut with_fault = rs.to_vec();
        with_fault.push(result(
            "e",
            Outcome::harness("cuMemAllocAsync: out of memory"),
        ));
        let f = summarize(&with_fault);
        assert_eq!((f.tasks, f.harness_errors, f.correct), (4, 1, 3));
        assert!((f.correct_rate - 0.75).abs() < 1e-12);
        assert!((f.mean_speedup - 0.925).abs() < 1e-12);
        let empty = summarize(&[]);
        assert_eq!((empty.correct_rate, empty.geomean_speedup), (0.0, None));
    }
}
