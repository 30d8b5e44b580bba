//! The replay queue's logic: groups in, returns and advantages computed, stale groups dropped,
//! batches out, and a write-ahead log so that an accepted group survives a crash.
//!
//! A group is *accepted* once its WAL record is on disk (written and fsynced); only then does the
//! rollout's hand-off complete. Every accepted group later ends in exactly one learner step's
//! record, as trained or as dropped-stale (see [`crate::run_dir`] for the record and recovery).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::ReplaySection;
use crate::episode::Group;
use crate::rl;

/// Where the queue logs each group before accepting it: the write-ahead log
/// ([`crate::wal::Wal`]) implements it. A trait here, so the queue does not depend on the log's
/// storage (which depends on the queue's types).
pub trait GroupLog: std::fmt::Debug + Send {
    /// Writes `group` durably: when this returns Ok, the group survives kill -9.
    fn append(&mut self, group: &ScoredGroup) -> Result<(), ReplayError>;
}

/// A group with its per-turn returns and advantages, numbered by the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredGroup {
    /// Acceptance sequence number (unique, increasing across restarts).
    pub seq: u64,
    /// The group.
    pub group: Group,
    /// Return of every turn, shaped like `group.trajectories`.
    pub returns: Vec<Vec<f64>>,
    /// Advantage of every turn, shaped like `group.trajectories`.
    pub advantages: Vec<Vec<f64>>,
}

/// Computes discounted returns per trajectory and advantages over all m*n turn-samples.
pub fn score_group(seq: u64, group: Group, cfg: &ReplaySection) -> ScoredGroup {
    let returns: Vec<Vec<f64>> = group
        .trajectories
        .iter()
        .map(|t| {
            let scores: Vec<f64> = t.iter().map(|r| r.score).collect();
            rl::turn_returns(
                &rl::turn_credits(&scores, cfg.credit),
                cfg.gamma,
                cfg.aggregation,
            )
        })
        .collect();
    let flat: Vec<f64> = returns.iter().flatten().copied().collect();
    let flat_adv = rl::group_advantages(&flat, cfg.std_normalize);
    let mut it = flat_adv.into_iter();
    let advantages = returns
        .iter()
        .map(|r| r.iter().map(|_| it.next().unwrap_or(0.0)).collect())
        .collect();
    ScoredGroup {
        seq,
        group,
        returns,
        advantages,
    }
}

/// A failure of the replay queue's storage.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The write-ahead log could not be written or read.
    #[error("write-ahead log {path}: {reason}")]
    Wal {
        /// The log file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The group holds a turn the harness could not judge: it is never trained on.
    #[error("group {group} of task {task}: turn {turn} was not judged (harness error: {reason})")]
    Unjudged {
        /// The group's id.
        group: u64,
        /// Its task.
        task: String,
        /// The turn.
        turn: u32,
        /// The harness's error.
        reason: String,
    },
}

/// A batch for the learner, with the groups dropped as stale since the previous batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Learner version the batch was formed at.
    pub learner_version: u64,
    /// Fresh groups, oldest first.
    pub groups: Vec<ScoredGroup>,
    /// Sequence numbers of groups dropped as stale since the previous batch.
    pub dropped: Vec<u64>,
    /// Version gap (learner version - oldest turn version) of each group in the batch.
    pub staleness: Vec<u64>,
}

/// The queue itself: accepted groups waiting for the learner.
#[derive(Debug)]
pub struct ReplayBuffer {
    cfg: ReplaySection,
    pending: VecDeque<ScoredGroup>,
    next_seq: u64,
    dropped_since_batch: Vec<u64>,
    dropped_total: u64,
    accepted_total: u64,
    wal: Option<Box<dyn GroupLog>>,
}

impl ReplayBuffer {
    /// A queue holding `recovered` (groups accepted before a restart and not yet consumed), with
    /// sequence numbers continuing after `next_seq`.
    pub fn new(
        cfg: ReplaySection,
        wal: Option<Box<dyn GroupLog>>,
        recovered: Vec<ScoredGroup>,
        next_seq: u64,
    ) -> Self {
        ReplayBuffer {
            cfg,
            pending: recovered.into(),
            next_seq,
            dropped_since_batch: Vec::new(),
            dropped_total: 0,
            accepted_total: 0,
            wal,
        }
    }

    /// Scores `group`, logs it, queues it; returns its sequence number. A group with a turn the
    /// harness did not judge ([`crate::outcome::Outcome::HarnessError`]) is refused: its score
    /// says nothing about the policy, so it is never trained on.
    pub fn accept(&mut self, group: Group) -> Result<u64, ReplayError> {
        if let Some(t) = group.turns().find(|t| t.outcome.is_harness_error()) {
            return Err(ReplayError::Unjudged {
                group: group.id,
                task: group.task.clone(),
                turn: t.turn,
                reason: t.outcome.feedback(),
            });
        }
        let seq = self.next_seq;
        let scored = score_group(seq, group, &self.cfg);
        if let Some(wal) = &mut self.wal {
            wal.append(&scored)?;
        }
        self.next_seq += 1;
        self.accepted_total += 1;
        self.pending.push_back(scored);
        Ok(seq)
    }

    /// Drops the groups that are stale at `learner_version` (counted, and remembered for the next
    /// batch's record); returns their sequence numbers.
    pub fn drop_stale(&mut self, learner_version: u64) -> Vec<u64> {
        let max = self.cfg.max_staleness;
        let mut dropped = Vec::new();
        self.pending.retain(|g| {
            let stale = rl::is_stale(g.group.oldest_policy_version(), learner_version, max);
            if stale {
                dropped.push(g.seq);
            }
            !stale
        });
        self.dropped_total += dropped.len() as u64;
        self.dropped_since_batch.extend_from_slice(&dropped);
        dropped
    }

    /// Drops stale groups (see [`ReplayBuffer::drop_stale`]), then returns the oldest
    /// `tasks_per_batch` fresh groups if there are that many.
    pub fn take_batch(&mut self, learner_version: u64) -> Option<Batch> {
        self.drop_stale(learner_version);
        let n = self.cfg.tasks_per_batch as usize;
        if self.pending.len() < n {
            return None;
        }
        let groups: Vec<ScoredGroup> = self.pending.drain(..n).collect();
        let staleness = groups
            .iter()
            .map(|g| learner_version.saturating_sub(g.group.oldest_policy_version()))
            .collect();
        Some(Batch {
            learner_version,
            groups,
            dropped: std::mem::take(&mut self.dropped_since_batch),
            staleness,
        })
    }

    /// Puts a batch back at the front (its receiver went away before taking it).
    pub fn put_back(&mut self, batch: Batch) {
        for g in batch.groups.into_iter().rev() {
            self.pending.push_front(g);
        }
        let mut dropped = batch.dropped;
        dropped.append(&mut self.dropped_since_batch);
        self.dropped_since_batch = dropped;
    }

    /// The most recently accepted group still waiting.
    pub fn last(&self) -> Option<&ScoredGroup> {
        self.pending.back()
    }

    /// Groups waiting.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when no group waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Sequence numbers of the groups not yet consumed by a learner step's record: the waiting
    /// ones, and the ones dropped as stale whose drop the next batch will record.
    pub fn pending_seqs(&self) -> Vec<u64> {
        let mut seqs: Vec<u64> = self
            .pending
            .iter()
            .map(|g| g.seq)
            .chain(self.dropped_since_batch.iter().copied())
            .collect();
        seqs.sort_unstable();
        seqs
    }

    /// Groups dropped as stale since this process started.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_total
    }

    /// Groups accepted since this process started.
    pub fn accepted_total(&self) -> u64 {
        self.accepted_total
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::episode::tests::turn;
    use crate::outcome::Outcome;

    /// A correct kernel at 2x: score 2.3.
    fn ok() -> Outcome {
        Outcome::Correct {
            kernel_ms: 1.0,
            baseline_ms: 2.0,
            spread: 0.0,
            timing: "cuda".into(),
        }
    }

    /// A failed turn: score 0.
    fn bad() -> Outcome {
        Outcome::CompileError { log: String::new() }
    }

    pub(crate) fn group(id: u64, version: u64) -> Group {
        Group {
            id,
            task: format!("t{id}"),
            trajectories: vec![
                vec![turn(0, bad(), version), turn(1, ok(), version)],
                vec![turn(0, bad(), version), turn(1, bad(), version)],
            ],
        }
    }

    #[test]
    fn scoring_matches_hand_values() {
        let cfg = ReplaySection::default();
        let s = score_group(0, group(0, 0), &cfg);
        // Trajectory 0: scores [0, 2.3] -> returns [0.92, 2.3]; trajectory 1: [0, 0].
        assert!((s.returns[0][0] - 0.92).abs() < 1e-12 && (s.returns[0][1] - 2.3).abs() < 1e-12);
        // Mean of (0.92, 2.3, 0, 0) = 0.805.
        assert!((s.advantages[0][0] - 0.115).abs() < 1e-12);
        assert!((s.advantages[1][1] + 0.805).abs() < 1e-12);
    }

    #[test]
    fn improvement_credit_pays_a_repair_and_not_a_repeat() {
        let g = Group {
            id: 0,
            task: "t0".into(),
            trajectories: vec![
                // correct, then the same again: scores [2.3, 2.3].
                vec![turn(0, ok(), 0), turn(1, ok(), 0)],
                // failed, then repaired: scores [0, 2.3].
                vec![turn(0, bad(), 0), turn(1, ok(), 0)],
            ],
        };
        let cfg = ReplaySection {
            credit: rl::TurnCredit::Improvement,
            ..ReplaySection::default()
        };
        let s = score_group(0, g.clone(), &cfg);
        // Credits [2.3, 0] and [0, 2.3]; returns with gamma 0.4: [2.3, 0] and [0.92, 2.3].
        let want = [[2.3, 0.0], [0.92, 2.3]];
        for (got, want) in s.returns.iter().zip(want) {
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12),
                "{s:?}"
            );
        }
        // With the paper's credit the repeat earns as much as the repair.
        let paper = score_group(0, g, &ReplaySection::default());
        assert!((paper.returns[0][1] - paper.returns[1][1]).abs() < 1e-12);
        assert!(s.advantages[0][1] < s.advantages[1][1]);
    }

    #[test]
    fn gain_credit_costs_a_broken_kernel_what_improvement_lets_go() {
        let g = Group {
            id: 0,
            task: "t0".into(),
            trajectories: vec![
                // correct, then the same again: scores [2.3, 2.3].
                vec![turn(0, ok(), 0), turn(1, ok(), 0)],
                // correct, then broken: scores [2.3, 0].
                vec![turn(0, ok(), 0), turn(1, bad(), 0)],
                // failed, then repaired: scores [0, 2.3].
                vec![turn(0, bad(), 0), turn(1, ok(), 0)],
            ],
        };
        let with = |credit| {
            score_group(
                0,
                g.clone(),
                &ReplaySection {
                    credit,
                    ..ReplaySection::default()
                },
            )
        };
        // Under "improvement" breaking a right kernel is credited as a repeat is: nothing.
        let imp = with(rl::TurnCredit::Improvement);
        assert!((imp.advantages[0][1] - imp.advantages[1][1]).abs() < 1e-12);
        // Under "gain" it costs what it lost, the repeat nothing, the repair its whole score:
        // credits [2.3, 0], [2.3, -2.3], [0, 2.3].
        let gain = with(rl::TurnCredit::Gain);
        let want = [[2.3, 0.0], [2.3 - 0.4 * 2.3, -2.3], [0.92, 2.3]];
        for (got, want) in gain.returns.iter().zip(want) {
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12),
                "{gain:?}"
            );
        }
        assert!(gain.advantages[1][1] < gain.advantages[0][1]);
        assert!(gain.advantages[0][1] < gain.advantages[2][1]);
    }

    #[test]
    fn stale_groups_are_dropped_and_counted() {
        let cfg = ReplaySection {
            tasks_per_batch: 2,
            max_staleness: 1,
            ..ReplaySection::default()
        };
        let mut q = ReplayBuffer::new(cfg, None, Vec::new(), 0);
        for (id, v) in [(0, 0), (1, 3), (2, 4), (3, 2)] {
            q.accept(group(id, v)).unwrap();
        }
        // Learner at 4 with staleness 1: versions 0 and 2 are stale.
        let b = q.take_batch(4).unwrap();
        assert_eq!(
            b.groups.iter().map(|g| g.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(b.dropped, vec![0, 3]);
        assert_eq!(b.staleness, vec![1, 0]);
        assert_eq!(q.dropped_total(), 2);
        assert!(q.take_batch(4).is_none());
    }

    #[test]
    fn a_group_with_a_harness_error_is_never_accepted() {
        let mut q = ReplayBuffer::new(ReplaySection::default(), None, Vec::new(), 0);
        let mut g = group(0, 0);
        g.trajectories[1][1] = turn(1, Outcome::harness("cuMemAllocAsync: out of memory"), 0);
        let err = q.accept(g).unwrap_err();
        assert!(
            matches!(err, ReplayError::Unjudged { turn: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("out of memory"), "{err}");
        assert_eq!(q.accepted_total(), 0);
        assert!(q.take_batch(0).is_none());
    }
}
