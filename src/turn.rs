//! One turn of an episode, the same for training and for evaluation: the rollout actor
//! (`kevin train`) and [`crate::policy_eval`] (`kevin eval --checkpoint`) both ask the policy
//! with [`crate::episode::Episode::request`] (the episode's prompt and a sampling seed from
//! [`seed`]), and both turn the completion into a [`TurnRecord`] through [`Responded`] (parse the
//! response with [`parse_response`], evaluate its kernel if it has one, score).
//!
//! Dependency direction: `episode` (the state machine) and `prompt` (which renders a history of
//! [`TurnRecord`]s) import this module; it imports neither. So a turn is prompted, seeded, judged and scored identically
//! wherever it runs; only how the generation is batched and the candidate evaluated differs
//! (actor messages vs threads).

use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;
use crate::policy::Completion;
use crate::rng::SplitMix64;

/// One turn of one trajectory: what was asked, what came back, how it was judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// 0-based turn index within the trajectory.
    pub turn: u32,
    /// The full prompt of this turn.
    pub prompt: String,
    /// The policy's full response (reasoning included).
    pub response: String,
    /// The ```cuda block, when the response had one.
    pub kernel: Option<String>,
    /// The summary paragraph after the block, when there was one.
    pub summary: Option<String>,
    /// The evaluation's verdict.
    pub outcome: Outcome,
    /// Turn score S.
    pub score: f64,
    /// Learner version of the weights that sampled the response.
    pub policy_version: u64,
    /// Token ids of the response (in JSON: base64 of little-endian u32, see [`crate::packed`]).
    #[serde(with = "crate::packed")]
    pub response_tokens: Vec<u32>,
    /// Behaviour log-probability of each response token under the sampling policy (in JSON:
    /// base64 of little-endian f32).
    #[serde(with = "crate::packed")]
    pub behaviour_logprobs: Vec<f32>,
    /// Time spent generating (ms, including queueing at the generator).
    pub generate_ms: f64,
    /// Time spent evaluating (ms, compile + verify + profile, including queueing).
    pub evaluate_ms: f64,
}

impl TurnRecord {
    /// The record of turn `turn`: the prompt it was asked, the completion that answered it, the
    /// candidate's block and summary (None for a format error) and the outcome, scored here so
    /// that training and evaluation score a turn the same way.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        turn: u32,
        prompt: String,
        completion: Completion,
        kernel: Option<String>,
        summary: Option<String>,
        outcome: Outcome,
        generate_ms: f64,
        evaluate_ms: f64,
    ) -> TurnRecord {
        TurnRecord {
            turn,
            prompt,
            response: completion.text,
            kernel,
            summary,
            score: outcome.score(),
            outcome,
            policy_version: completion.policy_version,
            response_tokens: completion.token_ids,
            behaviour_logprobs: completion.logprobs,
            generate_ms,
            evaluate_ms,
        }
    }
}

/// What a response offers the environment: its ```cuda block and summary, or the format error
/// that is the turn's outcome (no block, or launch lines that do not parse). The rollout and
/// `kevin eval --checkpoint` both call this, so a response is judged the same way in both.
pub fn parse_response(response: &str) -> Result<(String, String), Outcome> {
    crate::candidate::parse_response(response)
        .map(|c| (c.source, c.summary))
        .map_err(|e| Outcome::FormatError {
            reason: e.to_string(),
        })
}

/// Per turn of one trajectory, whether it resubmits a kernel that an earlier turn of the
/// trajectory already submitted, character for character: a sign of collapse (the policy repeats
/// itself instead of refining) that the training metrics and `kevin eval` both report. Format
/// errors, having no kernel, never repeat; the first turn cannot.
pub fn repeated(trajectory: &[TurnRecord]) -> Vec<bool> {
    trajectory
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.kernel.as_deref().is_some_and(|k| {
                trajectory[..i]
                    .iter()
                    .any(|e| e.kernel.as_deref() == Some(k))
            })
        })
        .collect()
}

/// Of the turns after the first of one trajectory, how many are [`repeated`], and out of how many.
pub fn repeats(trajectory: &[TurnRecord]) -> (usize, usize) {
    let n = repeated(trajectory).into_iter().filter(|r| *r).count();
    (n, trajectory.len().saturating_sub(1))
}

/// The sampling seed of one turn: derived from the base seed and a `key` naming the trajectory's
/// group (training: the group id; evaluation: [`name_key`] of the task, so that a task's samples
/// do not depend on which other tasks are evaluated), then mixed with the trajectory and the turn.
pub fn seed(base: u64, key: u64, trajectory: u32, turn: u32) -> u64 {
    let mut g = SplitMix64::derive(base, key);
    g.next_u64() ^ ((trajectory as u64) << 32 | turn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// FNV-1a of a task's name: the seed key of evaluation.
pub fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A turn whose response has been parsed: either a candidate kernel to evaluate, or a response
/// already judged (a format error). [`Responded::record`] makes the turn's record.
#[derive(Debug, Clone)]
pub struct Responded {
    turn: u32,
    prompt: String,
    completion: Completion,
    generate_ms: f64,
    /// (source, summary) of the candidate, or the format error that is the outcome.
    parsed: Result<(String, String), Outcome>,
}

impl Responded {
    /// Parses the `completion` that answered `prompt` at turn `turn` ([`parse_response`]).
    pub fn new(turn: u32, prompt: String, completion: Completion, generate_ms: f64) -> Responded {
        let parsed = parse_response(&completion.text);
        Responded {
            turn,
            prompt,
            completion,
            generate_ms,
            parsed,
        }
    }

    /// The candidate's source to evaluate; `None` when the response has none (a format error,
    /// already judged).
    pub fn candidate(&self) -> Option<&str> {
        self.parsed.as_ref().ok().map(|(source, _)| source.as_str())
    }

    /// The turn's record, scored. `verdict` is the evaluation's outcome of
    /// [`Responded::candidate`]; for a response without a candidate the format error is the
    /// outcome and `verdict` is not used. A candidate without a verdict is a crash of the
    /// evaluation (callers always pass one).
    pub fn record(self, verdict: Option<Outcome>, evaluate_ms: f64) -> TurnRecord {
        let (kernel, summary, outcome) = match self.parsed {
            Err(format_error) => (None, None, format_error),
            Ok((source, summary)) => (
                Some(source),
                Some(summary),
                verdict.unwrap_or_else(|| Outcome::Crash {
                    reason: "the candidate was not evaluated".into(),
                }),
            ),
        };
        TurnRecord::new(
            self.turn,
            self.prompt,
            self.completion,
            kernel,
            summary,
            outcome,
            self.generate_ms,
            evaluate_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluation_seeds_are_training_seeds_keyed_by_the_task_name() {
        // The formula both callers used before they shared it.
        let old = |base: u64, key: u64, k: u32, t: u32| {
            let mut g = SplitMix64::derive(base, key);
            g.next_u64() ^ ((k as u64) << 32 | t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        assert_eq!(seed(7, 42, 3, 2), old(7, 42, 3, 2));
        assert_eq!(name_key(""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(name_key("relu"), name_key("gelu"));
    }

    fn with_kernel(turn: u32, kernel: Option<&str>) -> TurnRecord {
        let outcome = Outcome::CompileError { log: String::new() };
        let mut t = crate::episode::tests::turn(turn, outcome, 0);
        t.kernel = kernel.map(str::to_string);
        t
    }

    #[test]
    fn a_repeat_is_a_kernel_the_trajectory_already_submitted() {
        let traj: Vec<TurnRecord> = [Some("a"), Some("b"), Some("a"), None, None, Some("b ")]
            .iter()
            .enumerate()
            .map(|(i, k)| with_kernel(i as u32, *k))
            .collect();
        // Turn 2 repeats turn 0; two format errors in a row are not repeats; "b " is a new text.
        assert_eq!(repeats(&traj), (1, 5));
        assert_eq!(repeated(&traj), [false, false, true, false, false, false]);
        assert_eq!(repeats(&traj[..1]), (0, 0));
        assert_eq!(repeats(&[]), (0, 0));
    }
}
