//! Episodes: one trajectory of n refinement turns on one task, and groups of m trajectories.
//!
//! [`Episode`] is the state machine the Rollout actor drives: it builds each turn's prompt from
//! the task and the history (earlier kernels, summaries and feedback; never earlier reasoning),
//! records what each turn produced, and says when the trajectory is done. It does no I/O and
//! knows nothing of actors, so it is tested directly.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::policy::GenRequest;
use crate::prompt;
use crate::turn::{self, TurnRecord};

/// What an episode needs to know of its task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeTask {
    /// The task's name (unique in the suite).
    pub name: String,
    /// KernelBench-style level (1: single operators, 2: fused sequences).
    pub level: u8,
    /// The first-turn prompt: the task statement and the answer format.
    pub statement: String,
}

/// m trajectories of one task: the unit the replay queue accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// Unique id assigned by the task sampler.
    pub id: u64,
    /// The task's name.
    pub task: String,
    /// m trajectories of up to n turns each.
    pub trajectories: Vec<Vec<TurnRecord>>,
}

impl Group {
    /// All turns of all trajectories.
    pub fn turns(&self) -> impl Iterator<Item = &TurnRecord> {
        self.trajectories.iter().flatten()
    }

    /// Policy version of the oldest turn: what the staleness rule looks at.
    pub fn oldest_policy_version(&self) -> u64 {
        self.turns().map(|t| t.policy_version).min().unwrap_or(0)
    }

    /// Number of turn-samples.
    pub fn turn_count(&self) -> usize {
        self.trajectories.iter().map(Vec::len).sum()
    }

    /// Fraction of turns whose kernel was correct.
    pub fn correct_rate(&self) -> f64 {
        let n = self.turn_count();
        if n == 0 {
            return 0.0;
        }
        self.turns().filter(|t| t.outcome.is_correct()).count() as f64 / n as f64
    }
}

/// The state machine of one trajectory.
#[derive(Debug, Clone)]
pub struct Episode {
    task: Arc<EpisodeTask>,
    max_turns: u32,
    prompt_budget_chars: usize,
    turns: Vec<TurnRecord>,
}

impl Episode {
    /// The generation request of the next turn: its prompt (history and feedback within the
    /// episode's budget) and the seed [`turn::seed`]`(base, key, trajectory, turn)`; `id` is the
    /// caller's.
    pub fn request(&self, id: u64, base: u64, key: u64, trajectory: u32) -> GenRequest {
        GenRequest {
            id,
            prompt: self.prompt(),
            seed: turn::seed(base, key, trajectory, self.next_turn()),
        }
    }

    /// A fresh trajectory of `max_turns` turns on `task`.
    pub fn new(task: Arc<EpisodeTask>, max_turns: u32, prompt_budget_chars: usize) -> Self {
        Episode {
            task,
            max_turns,
            prompt_budget_chars,
            turns: Vec::new(),
        }
    }

    /// The task.
    pub fn task(&self) -> &EpisodeTask {
        &self.task
    }

    /// Index of the next turn.
    pub fn next_turn(&self) -> u32 {
        self.turns.len() as u32
    }

    /// True when every turn has been recorded.
    pub fn is_done(&self) -> bool {
        self.next_turn() >= self.max_turns
    }

    /// The prompt of the next turn: the task, then every earlier turn's kernel, summary and
    /// feedback, the earliest cut first when the budget would be exceeded.
    pub fn prompt(&self) -> String {
        prompt::build(&self.task.statement, &self.turns, self.prompt_budget_chars)
    }

    /// Records the turn just evaluated.
    pub fn record(&mut self, turn: TurnRecord) {
        debug_assert_eq!(turn.turn, self.next_turn());
        self.turns.push(turn);
    }

    /// The recorded turns.
    pub fn turns(&self) -> &[TurnRecord] {
        &self.turns
    }

    /// The finished trajectory.
    pub fn into_turns(self) -> Vec<TurnRecord> {
        self.turns
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::outcome::Outcome;

    pub(crate) fn turn(i: u32, outcome: Outcome, version: u64) -> TurnRecord {
        TurnRecord {
            turn: i,
            prompt: format!("prompt {i}"),
            response: format!("thinking {i}\n```cuda\nkernel {i}\n```\nsummary {i}"),
            kernel: Some(format!("kernel {i}")),
            summary: Some(format!("summary {i}")),
            score: outcome.score(),
            outcome,
            policy_version: version,
            response_tokens: vec![1, 2, 3],
            behaviour_logprobs: vec![-0.5, -0.25, -1.0],
            generate_ms: 1.0,
            evaluate_ms: 1.0,
        }
    }

    #[test]
    fn episode_runs_n_turns_and_carries_history() {
        let task = Arc::new(EpisodeTask {
            name: "t".into(),
            level: 1,
            statement: "Write relu.".into(),
        });
        let mut e = Episode::new(task, 2, 10_000);
        assert_eq!(e.prompt(), prompt::build("Write relu.", &[], 10_000));
        e.record(turn(
            0,
            Outcome::CompileError {
                log: "error: x".into(),
            },
            3,
        ));
        assert!(!e.is_done());
        let p = e.prompt();
        assert!(p.contains("kernel 0") && p.contains("summary 0") && p.contains("error: x"));
        assert!(!p.contains("thinking 0"), "earlier reasoning is dropped");
        e.record(turn(1, Outcome::CompileError { log: "e".into() }, 4));
        assert!(e.is_done());
    }

    #[test]
    fn group_statistics() {
        let ok = Outcome::Correct {
            kernel_ms: 1.0,
            baseline_ms: 1.0,
            spread: 0.0,
            timing: "cuda".into(),
        };
        let g = Group {
            id: 1,
            task: "t".into(),
            trajectories: vec![
                vec![turn(0, ok.clone(), 5), turn(1, ok, 6)],
                vec![turn(0, Outcome::CompileError { log: String::new() }, 4)],
            ],
        };
        assert_eq!(g.oldest_policy_version(), 4);
        assert_eq!(g.turn_count(), 3);
        assert!((g.correct_rate() - 2.0 / 3.0).abs() < 1e-12);
    }
}
