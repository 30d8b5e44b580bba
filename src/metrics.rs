//! The per-step metrics record: one line of `metrics.jsonl` per learner step.
//!
//! Everything a researcher plots or a monitor alerts on is here: reward and correctness of the
//! batch, speedups, staleness, queue depths, actor utilisation, drops and failures. The learner
//! actor fills it; the telemetry actor writes it; `kevin inspect` and `kevin report` read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::replay::Batch;

/// One learner step's metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Learner version after the step.
    pub step: u64,
    /// Seconds since this daemon session started.
    pub elapsed_s: f64,
    /// Unix time (seconds).
    pub unix_s: f64,
    /// Mean turn score over the batch.
    pub reward_mean: f64,
    /// Standard deviation of the turn scores over the batch (population; `None` in files written
    /// before it was recorded, so they still load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_std: Option<f64>,
    /// Fraction of the batch's turns that were correct.
    pub correct_rate: f64,
    /// Mean speedup of the correct turns (0 when none).
    pub mean_speedup: f64,
    /// Fraction of turns per outcome kind.
    pub outcomes: BTreeMap<String, f64>,
    /// Signs of collapse and of a vanishing learning signal in the batch (`None` in files written
    /// before they were recorded, and for an empty batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals: Option<BatchSignals>,
    /// Version gap -> number of groups in the batch with that staleness.
    pub staleness: BTreeMap<u64, u64>,
    /// Groups in the batch.
    pub groups: u64,
    /// Groups dropped as stale before this step.
    pub dropped: u64,
    /// Groups dropped as stale in this run (all sessions).
    pub dropped_total: u64,
    /// Groups accepted in this run (all sessions).
    pub accepted_total: u64,
    /// Turns completed per second in this session.
    pub turns_per_s: f64,
    /// Groups waiting in the replay queue after the batch was taken.
    pub replay_pending: u64,
    /// Current mailbox depth per actor.
    pub mailbox_depth: BTreeMap<String, u64>,
    /// Highest mailbox depth per actor in this session.
    pub mailbox_high_water: BTreeMap<String, u64>,
    /// Busy fraction per actor since the previous step (from the trace; absent when tracing is off).
    pub busy: BTreeMap<String, f64>,
    /// Restarts of supervised actors and panics caught in components, per name.
    pub failures: BTreeMap<String, u64>,
    /// Training loss.
    pub loss: f64,
    /// Fraction of clipped tokens.
    pub clip_fraction: f64,
    /// Gradient norm.
    pub grad_norm: f64,
    /// Tokens trained on.
    pub tokens: u64,
    /// Seconds the learner spent on this step.
    pub train_s: f64,
    /// Milliseconds this daemon session has waited for the GPU-wide timing lease so far, per
    /// party and hold ("generator.step", "learner.step", "evaluation.timing",
    /// "evaluation.step"; see [`crate::gpu::lease::wait_totals`]). Empty without the lease.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lease_wait_ms: BTreeMap<String, f64>,
    /// The evaluation cache's counters so far in this session ("answered", "misses",
    /// "verify_hits", "profile_hits", "entries"; see `kevin::env::CacheStats`). Empty without
    /// a cache.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eval_cache: BTreeMap<String, u64>,
}

/// What a learner step's batch says of the policy's health, beyond its reward: the figures a
/// researcher looks at when RL does not improve the policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchSignals {
    /// Mean response length in tokens (a falling length is a sign of collapse).
    pub response_tokens: f64,
    /// Of the turns after their trajectory's first, the fraction that resubmit a kernel the
    /// trajectory already submitted unchanged ([`crate::turn::repeats`]).
    pub repeat_rate: f64,
    /// Mean over groups of the share of distinct first-turn kernels among the group's
    /// trajectories (1: all different; 1/m: every sample wrote the same kernel).
    pub distinct_first: f64,
    /// Mean absolute advantage over the batch's turns.
    pub advantage_abs_mean: f64,
    /// Groups whose turns all had the same return: zero advantage, so no gradient.
    pub flat_groups: u64,
}

impl BatchSignals {
    /// The signals of `batch`'s groups; `None` when it has no turn.
    pub fn of(batch: &Batch) -> Option<BatchSignals> {
        let turns: Vec<_> = batch.groups.iter().flat_map(|g| g.group.turns()).collect();
        if turns.is_empty() {
            return None;
        }
        let mean = |sum: f64, n: usize| if n == 0 { 0.0 } else { sum / n as f64 };
        let (mut repeated, mut later) = (0, 0);
        let mut distinct = Vec::with_capacity(batch.groups.len());
        let (mut adv_sum, mut adv_n, mut flat_groups) = (0.0, 0, 0);
        for g in &batch.groups {
            for traj in &g.group.trajectories {
                let (r, n) = crate::turn::repeats(traj);
                repeated += r;
                later += n;
            }
            let firsts: Vec<Option<&str>> = g
                .group
                .trajectories
                .iter()
                .filter_map(|t| t.first().map(|r| r.kernel.as_deref()))
                .collect();
            if !firsts.is_empty() {
                let unique: std::collections::HashSet<_> = firsts.iter().collect();
                distinct.push(unique.len() as f64 / firsts.len() as f64);
            }
            let advs: Vec<f64> = g.advantages.iter().flatten().copied().collect();
            adv_sum += advs.iter().map(|a| a.abs()).sum::<f64>();
            adv_n += advs.len();
            let first_return = g.returns.iter().flatten().next();
            if g.returns.iter().flatten().all(|r| Some(r) == first_return) {
                flat_groups += 1;
            }
        }
        Some(BatchSignals {
            response_tokens: mean(
                turns.iter().map(|t| t.response_tokens.len() as f64).sum(),
                turns.len(),
            ),
            repeat_rate: mean(repeated as f64, later),
            distinct_first: mean(distinct.iter().sum(), distinct.len()),
            advantage_abs_mean: mean(adv_sum, adv_n),
            flat_groups,
        })
    }
}

impl StepMetrics {
    /// Fills the batch-derived fields from `batch`.
    pub fn from_batch(step: u64, batch: &Batch) -> StepMetrics {
        let mut m = StepMetrics {
            step,
            groups: batch.groups.len() as u64,
            dropped: batch.dropped.len() as u64,
            ..Default::default()
        };
        let mut turns = 0u64;
        let (mut score, mut score_sq, mut correct, mut speedup_sum) = (0.0, 0.0, 0u64, 0.0);
        let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
        for g in &batch.groups {
            for t in g.group.turns() {
                turns += 1;
                score += t.score;
                score_sq += t.score * t.score;
                *kinds.entry(t.outcome.kind().to_string()).or_default() += 1;
                if let Some(s) = t.outcome.speedup() {
                    correct += 1;
                    speedup_sum += s;
                }
            }
        }
        for s in &batch.staleness {
            *m.staleness.entry(*s).or_default() += 1;
        }
        if turns > 0 {
            m.reward_mean = score / turns as f64;
            // E[s^2] - E[s]^2 can come out a hair below zero in floating point.
            let var = score_sq / turns as f64 - m.reward_mean * m.reward_mean;
            m.reward_std = Some(var.max(0.0).sqrt());
            m.correct_rate = correct as f64 / turns as f64;
            m.outcomes = kinds
                .into_iter()
                .map(|(k, n)| (k, n as f64 / turns as f64))
                .collect();
        }
        if correct > 0 {
            m.mean_speedup = speedup_sum / correct as f64;
        }
        m.signals = BatchSignals::of(batch);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episode::tests::turn;
    use crate::episode::Group;
    use crate::outcome::Outcome;
    use crate::replay::{score_group, ScoredGroup};
    use crate::turn::TurnRecord;

    fn batch(outcomes: &[Outcome]) -> Batch {
        let group = Group {
            id: 0,
            task: "t".into(),
            trajectories: vec![outcomes
                .iter()
                .enumerate()
                .map(|(i, o)| turn(i as u32, o.clone(), 0))
                .collect()],
        };
        let scored: ScoredGroup = score_group(0, group, &Default::default());
        Batch {
            learner_version: 1,
            groups: vec![scored],
            dropped: vec![],
            staleness: vec![1],
        }
    }

    #[test]
    fn reward_spread_is_the_population_std_of_turn_scores() {
        let ok = Outcome::Correct {
            kernel_ms: 1.0,
            baseline_ms: 2.0,
            spread: 0.0,
            timing: "cpu".into(),
        };
        let bad = Outcome::CompileError { log: String::new() };
        let (a, b) = (ok.score(), bad.score());
        let m = StepMetrics::from_batch(1, &batch(&[ok, bad]));
        assert!((m.reward_mean - (a + b) / 2.0).abs() < 1e-12);
        assert!((m.reward_std.unwrap() - (a - b).abs() / 2.0).abs() < 1e-12);
        assert_eq!(m.staleness, BTreeMap::from([(1, 1)]));
        // An empty batch records no spread rather than a spread of 0.
        let empty = Batch {
            learner_version: 1,
            groups: vec![],
            dropped: vec![3],
            staleness: vec![],
        };
        assert_eq!(StepMetrics::from_batch(1, &empty).reward_std, None);
    }

    #[test]
    fn batch_signals_show_repeats_sameness_and_flat_groups() {
        let ok = || Outcome::Correct {
            kernel_ms: 1.0,
            baseline_ms: 2.0,
            spread: 0.0,
            timing: "cpu".into(),
        };
        let bad = || Outcome::CompileError { log: String::new() };
        // Two trajectories of one group: [a, a] (a repeat) and [a, b]; first kernels both "a".
        let traj = |kernels: [&str; 2], outcomes: [Outcome; 2]| -> Vec<TurnRecord> {
            kernels
                .iter()
                .zip(outcomes)
                .enumerate()
                .map(|(i, (k, o))| {
                    let mut t = turn(i as u32, o, 0);
                    t.kernel = Some(k.to_string());
                    t.response_tokens = vec![0; 10 * (i + 1)];
                    t
                })
                .collect()
        };
        let group = Group {
            id: 0,
            task: "t".into(),
            trajectories: vec![
                traj(["a", "a"], [bad(), ok()]),
                traj(["a", "b"], [bad(), bad()]),
            ],
        };
        let mut b = batch(&[bad()]);
        b.groups.push(score_group(1, group, &Default::default()));
        let s = StepMetrics::from_batch(1, &b).signals.unwrap();
        // Turns: 1 (the single-turn group) + 4, with 3, 10, 20, 10, 20 tokens.
        assert!((s.response_tokens - 63.0 / 5.0).abs() < 1e-12, "{s:?}");
        assert!((s.repeat_rate - 0.5).abs() < 1e-12, "{s:?}");
        // Group 1: one first kernel of one; group 2: one distinct of two.
        assert!((s.distinct_first - 0.75).abs() < 1e-12, "{s:?}");
        // The single-turn group has one return: flat. The other has a correct turn: not flat.
        assert_eq!(s.flat_groups, 1);
        assert!(s.advantage_abs_mean > 0.0);
        assert_eq!(
            BatchSignals::of(&Batch {
                groups: vec![],
                ..b
            }),
            None
        );
    }

    #[test]
    fn lines_written_before_reward_std_still_load() {
        let mut m = StepMetrics {
            step: 4,
            reward_mean: 0.5,
            ..Default::default()
        };
        let old = serde_json::to_string(&m).unwrap();
        assert!(!old.contains("reward_std"), "{old}");
        assert_eq!(serde_json::from_str::<StepMetrics>(&old).unwrap(), m);
        m.reward_std = Some(0.25);
        let new = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<StepMetrics>(&new).unwrap(), m);
    }
}
