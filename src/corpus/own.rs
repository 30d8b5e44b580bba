//! Repair examples from a run's own turns (`kevin sft repairs`): the policy's failed kernels,
//! each followed by the prompt the rollout really built over it (the attempt and its real
//! feedback), answered by a kernel the same policy got right for the same task.
//!
//! Why: the evaluations of 2026-12-06 (`benches/results/rl-gen3-h100-2026-12-06.md`) found that
//! after a failed turn the next one is correct 8-10% of the time, against 37-47% for a fresh
//! first turn, and that failures repeat in kind. The corpus's repair pairs ([`super::variants`])
//! teach the repair of mechanical breakages; the policy's own failures are semantic (a program
//! misread) and are what a refinement turn has to mend.
//!
//! Input: the lines of a run's `episodes.jsonl` (one turn each: `seq`, `task`, `trajectory`,
//! `turn`, `outcome`, `prompt`, `response`; what `kevin train` writes with `telemetry.episodes`),
//! or of an evaluation's `kevin eval --transcripts` file on training tasks (`--split train`; the
//! full outcome is its `result`, and all trajectories of a task are one group). The second is how
//! a round of expert iteration collects turns on programs the policy has never trained on, at the
//! evaluation's speed and without a learner.
//! Every pair is a failed turn `t` of a trajectory that has a turn `t + 1` (so the prompt over
//! the failure is the one the rollout built, inside its prompt budget) and a correct kernel for
//! that task anywhere in the input: the fastest of the same group's when it has one, else the
//! fastest of the task's; for a task the policy never got right, a verified kernel of the corpus
//! given as `fallback` (`kevin sft corpus` on the same tasks), so the failures of the programs it
//! cannot yet write are labelled too (DAgger's expert on the policy's own states). The answer is that kernel's ```cuda block and summary after one
//! sentence on what failed (the policy's own reasoning paragraphs are often garbled at this
//! scale, and a pair should teach the kernel, not the noise). Nothing is evaluated again: both outcomes are the run's own, on the
//! GPU preset and environment the run used. A turn the harness failed on judged nothing and is
//! never a failure here; a correct kernel whose speedup is flagged as suspicious is never an
//! answer. A held-out task is an error (RL never trains on one: such input is an evaluation's
//! transcript or the wrong file).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Example, Kind, Turn};
use crate::outcome::Outcome;

/// One line of `episodes.jsonl`, the fields a repair pair needs.
#[derive(Debug, Clone, Deserialize)]
pub struct EpisodeTurn {
    /// Which input the line came from (several runs' group numbers overlap); set by
    /// [`parse_episodes`].
    #[serde(skip)]
    pub source: usize,
    /// The group's sequence number (unique within a run).
    pub seq: u64,
    /// The task's name.
    pub task: String,
    /// The trajectory's index within its group.
    pub trajectory: usize,
    /// The turn's index within its trajectory.
    pub turn: u32,
    /// What the kernel of this turn did.
    pub outcome: Outcome,
    /// The prompt of this turn.
    pub prompt: String,
    /// The policy's response.
    pub response: String,
}

/// How many pairs to keep.
#[derive(Debug, Clone)]
pub struct OwnRepairOptions {
    /// At most this many pairs per task (a task the policy fails often would otherwise fill the
    /// file), drawn by `seed`.
    pub per_task: usize,
    /// Chooses which pairs a task keeps when it has more than `per_task`.
    pub seed: u64,
    /// Answers for the tasks without a correct kernel in the input: a verified response for
    /// each task name ([`corpus_answers`]).
    pub fallback: BTreeMap<String, String>,
}

/// Counts of a build.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OwnRepairStats {
    /// Turns read.
    pub turns: usize,
    /// Tasks among them.
    pub tasks: usize,
    /// Failed turns with a next turn in their trajectory.
    pub failures_followed: usize,
    /// Of those, the ones whose task has no correct kernel in the input and no fallback answer
    /// (no pair).
    pub without_answer: usize,
    /// Failed responses seen before for the same task (the same text: one pair).
    pub repeated: usize,
    /// Pairs written, by the failed turn's outcome kind.
    pub pairs: BTreeMap<String, usize>,
    /// Pairs whose answer came from the failed turn's own group.
    pub answered_in_group: usize,
    /// Pairs whose answer came from the fallback (the task had no correct kernel in the input).
    pub answered_from_fallback: usize,
    /// Tasks with at least one pair.
    pub tasks_with_pairs: usize,
}

/// A correct kernel that can answer: its input and group, and its response.
struct Answer<'a> {
    group: (usize, u64),
    speedup: f64,
    response: &'a str,
}

/// Builds the repair pairs (sorted by task, then by the failed turn's input, group, trajectory
/// and turn).
/// `held_out` names the suite's held-out tasks; an input turn of one is an error naming it.
pub fn own_repairs(
    turns: &[EpisodeTurn],
    held_out: &BTreeSet<String>,
    opts: &OwnRepairOptions,
) -> Result<(Vec<Example>, OwnRepairStats), String> {
    if let Some(t) = turns.iter().find(|t| held_out.contains(&t.task)) {
        return Err(format!(
            "task `{}` (group {}, trajectory {}, turn {}) is held out: repairs are built from \
             training runs' turns only",
            t.task, t.seq, t.trajectory, t.turn
        ));
    }
    let mut stats = OwnRepairStats {
        turns: turns.len(),
        ..Default::default()
    };
    // Each trajectory's turns by number; each task's correct kernels.
    let mut trajectories: BTreeMap<(&str, usize, u64, usize), BTreeMap<u32, &EpisodeTurn>> =
        BTreeMap::new();
    let mut answers: BTreeMap<&str, Vec<Answer<'_>>> = BTreeMap::new();
    let mut tasks: BTreeSet<&str> = BTreeSet::new();
    for t in turns {
        tasks.insert(t.task.as_str());
        trajectories
            .entry((t.task.as_str(), t.source, t.seq, t.trajectory))
            .or_default()
            .insert(t.turn, t);
        if t.outcome.is_correct() && !t.outcome.flagged() {
            answers.entry(t.task.as_str()).or_default().push(Answer {
                group: (t.source, t.seq),
                speedup: t.outcome.speedup().unwrap_or(0.0),
                response: &t.response,
            });
        }
    }
    stats.tasks = tasks.len();
    // The candidates of each task: (failed turn, the turn after it), one per failed text.
    let mut candidates: BTreeMap<&str, Vec<(&EpisodeTurn, &EpisodeTurn)>> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for ((task, ..), by_turn) in &trajectories {
        for (n, failed) in by_turn {
            if failed.outcome.is_correct() || failed.outcome.is_harness_error() {
                continue;
            }
            let Some(next) = by_turn.get(&(n + 1)) else {
                continue;
            };
            stats.failures_followed += 1;
            if !answers.contains_key(task) && !opts.fallback.contains_key(*task) {
                stats.without_answer += 1;
                continue;
            }
            if !seen.insert((task, failed.response.as_str())) {
                stats.repeated += 1;
                continue;
            }
            candidates.entry(task).or_default().push((failed, next));
        }
    }
    let mut examples = Vec::new();
    for (task, pairs) in candidates {
        let pairs = super::capped(pairs, Some(opts.per_task), opts.seed ^ super::fnv(task));
        let pool = answers.get(task).map(Vec::as_slice).unwrap_or_default();
        stats.tasks_with_pairs += 1;
        for (failed, next) in pairs {
            let in_group: Vec<&Answer<'_>> = pool
                .iter()
                .filter(|a| a.group == (failed.source, failed.seq))
                .collect();
            let (from, choices) = if !in_group.is_empty() {
                stats.answered_in_group += 1;
                ("group", in_group)
            } else {
                ("task", pool.iter().collect::<Vec<_>>())
            };
            // The fastest; the first of equals (input order); else the fallback's.
            let best = choices.iter().fold(None::<&&Answer<'_>>, |b, a| match b {
                Some(b) if b.speedup >= a.speedup => Some(b),
                _ => Some(a),
            });
            let (from, right) = match best {
                Some(b) => (from, b.response),
                None => {
                    stats.answered_from_fallback += 1;
                    ("fallback", opts.fallback[task].as_str())
                }
            };
            let kind = failed.outcome.kind();
            *stats.pairs.entry(kind.to_owned()).or_default() += 1;
            examples.push(Example {
                task: task.to_owned(),
                kind: Kind::OwnRepair,
                form: format!("own:{kind}+{from}"),
                turns: vec![
                    Turn {
                        prompt: failed.prompt.clone(),
                        response: failed.response.clone(),
                    },
                    Turn {
                        prompt: next.prompt.clone(),
                        response: answer(kind, right),
                    },
                ],
                outcomes: vec![kind.to_owned(), "correct".to_owned()],
            });
        }
    }
    Ok((examples, stats))
}

/// The repair turn's response: what failed in one sentence, then the right kernel's block and
/// summary (the whole response if it does not parse, which a kernel judged correct always did).
fn answer(failed_kind: &str, right: &str) -> String {
    let Ok(c) = crate::candidate::parse_response(right) else {
        return right.to_owned();
    };
    let what = match failed_kind {
        "wrong" => "The previous kernel computed wrong values; this one computes the program again, operation by operation, in the order it is written.",
        "compile_error" => "The previous kernel did not compile; this one is written again without the error.",
        "format_error" => "The previous answer did not follow the answer format; this one is a single cuda block with a launch line for each kernel.",
        "launch_error" => "The previous launch could not run; this kernel's launch lines match its parameters and stay within the device's limits.",
        "crash" => "The previous kernel accessed memory it should not; this one checks every index against the tensor sizes.",
        "timeout" => "The previous kernel ran out of time; this one covers the whole output with a grid sized from the tensor sizes.",
        _ => "The previous attempt failed; this kernel computes the program correctly.",
    };
    super::response(what, &c.source, &c.summary)
}

/// One line of `kevin eval --transcripts`, the fields a repair pair needs.
#[derive(Deserialize)]
struct TranscriptTurn {
    task: String,
    trajectory: usize,
    turn: u32,
    /// The full outcome (the line's `outcome` is only its kind).
    result: Outcome,
    prompt: String,
    response: String,
}

/// Reads the lines of input number `source`: `episodes.jsonl` lines, or `kevin eval
/// --transcripts` lines (a line without `seq`; each task's trajectories are its group 0). An
/// error names the file and line. Blank lines are skipped.
pub fn parse_episodes(source: usize, name: &str, text: &str) -> Result<Vec<EpisodeTurn>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let at = |e: String| format!("{name} line {}: {e}", i + 1);
            let value: serde_json::Value =
                serde_json::from_str(l).map_err(|e| at(e.to_string()))?;
            if value.get("seq").is_some() {
                return serde_json::from_value::<EpisodeTurn>(value)
                    .map(|t| EpisodeTurn { source, ..t })
                    .map_err(|e| at(e.to_string()));
            }
            if value.get("result").is_none() && value.get("feedback").is_some() {
                return Err(at(
                    "an evaluation transcript without `result` (the full outcome; \
                               written by a kevin before 2026-12-07): evaluate again"
                        .into(),
                ));
            }
            let t: TranscriptTurn = serde_json::from_value(value).map_err(|e| at(e.to_string()))?;
            Ok(EpisodeTurn {
                source,
                seq: 0,
                task: t.task,
                trajectory: t.trajectory,
                turn: t.turn,
                outcome: t.result,
                prompt: t.prompt,
                response: t.response,
            })
        })
        .collect()
}

/// The fallback answers of a corpus: for each task, the response of its first one-turn example
/// (a first turn or a variant) whose kernel was judged correct.
pub fn corpus_answers(examples: &[Example]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in examples {
        if matches!(e.kind, Kind::FirstTurn | Kind::Variant)
            && e.turns.len() == 1
            && e.outcomes.last().is_some_and(|o| o == "correct")
        {
            out.entry(e.task.clone())
                .or_insert_with(|| e.turns[0].response.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn correct(speedup: f64) -> Outcome {
        Outcome::Correct {
            kernel_ms: 1.0 / speedup,
            baseline_ms: 1.0,
            spread: 0.01,
            timing: "cuda".into(),
        }
    }

    fn wrong() -> Outcome {
        Outcome::Wrong {
            reason: "values differ".into(),
            mismatch: None,
        }
    }

    /// One episodes.jsonl line, with the fields `kevin train`'s telemetry actor writes.
    fn line(task: &str, seq: u64, traj: usize, turn: u32, outcome: &Outcome, resp: &str) -> String {
        serde_json::json!({
            "seq": seq, "group": seq, "task": task, "trajectory": traj, "turn": turn,
            "policy_version": 0, "score": outcome.score(), "return": 0.0, "advantage": 0.0,
            "outcome": outcome, "generate_ms": 1.0, "evaluate_ms": 1.0,
            "prompt": format!("prompt {task} {seq} {traj} {turn}"), "response": resp,
        })
        .to_string()
    }

    fn opts(per_task: usize) -> OwnRepairOptions {
        OwnRepairOptions {
            per_task,
            seed: 0,
            fallback: BTreeMap::new(),
        }
    }

    #[test]
    fn a_failed_turn_is_answered_by_the_fastest_right_kernel_of_its_group_else_of_its_task() {
        let harness = Outcome::harness("worker lost");
        let compile = Outcome::CompileError { log: "err".into() };
        let format = Outcome::FormatError {
            reason: "no block".into(),
        };
        let lines = [
            line("a", 1, 0, 0, &wrong(), "w0"),
            line("a", 1, 0, 1, &correct(0.5), "c-slow"),
            line("a", 1, 1, 0, &compile, "e0"),
            line("a", 1, 1, 1, &correct(2.0), "c-fast"),
            line("a", 2, 0, 0, &format, "f0"),
            line("a", 2, 0, 1, &format, "f1"), // the last turn: nothing after it
            line("a", 2, 1, 0, &harness, "h0"), // not judged: never a failure
            line("a", 2, 1, 1, &wrong(), "w0"), // the same failed text again
            line("a", 2, 1, 2, &correct(9.0), "c-other-group"),
            line("b", 1, 0, 0, &wrong(), "wb"),
            line("b", 1, 0, 1, &wrong(), "wb2"),
        ]
        .join("\n");
        let turns = parse_episodes(0, "episodes.jsonl", &lines).unwrap();
        let (ex, stats) = own_repairs(&turns, &BTreeSet::new(), &opts(8)).unwrap();
        let got: Vec<(&str, &str, &str, &str)> = ex
            .iter()
            .map(|e| {
                (
                    e.form.as_str(),
                    e.turns[0].response.as_str(),
                    e.turns[1].prompt.as_str(),
                    e.turns[1].response.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("own:wrong+group", "w0", "prompt a 1 0 1", "c-fast"),
                ("own:compile_error+group", "e0", "prompt a 1 1 1", "c-fast"),
                (
                    "own:format_error+group",
                    "f0",
                    "prompt a 2 0 1",
                    "c-other-group"
                ),
            ]
        );
        let e = &ex[0];
        assert_eq!((e.task.as_str(), e.kind), ("a", Kind::OwnRepair));
        assert_eq!(e.turns[0].prompt, "prompt a 1 0 0");
        assert_eq!(e.outcomes, ["wrong", "correct"]);
        assert_eq!(stats.turns, 11);
        assert_eq!(stats.tasks, 2);
        // a: w0, e0, f0, w0 again (repeated), and the harness error is skipped; b: wb.
        assert_eq!(stats.failures_followed, 5);
        assert_eq!(stats.repeated, 1);
        assert_eq!(stats.without_answer, 1);
        assert_eq!(stats.answered_in_group, 3);
        assert_eq!(stats.tasks_with_pairs, 1);
    }

    #[test]
    fn a_group_without_a_right_kernel_takes_the_tasks_fastest() {
        let lines = [
            line("a", 1, 0, 0, &wrong(), "w"),
            line("a", 1, 0, 1, &wrong(), "w2"),
            line("a", 2, 0, 0, &correct(0.3), "slow"),
            line("a", 4, 0, 0, &correct(0.7), "fast"),
            line("a", 5, 0, 0, &correct(99.0), "flagged"), // suspicious: never an answer
        ]
        .join("\n");
        let turns = parse_episodes(0, "e", &lines).unwrap();
        let (ex, stats) = own_repairs(&turns, &BTreeSet::new(), &opts(8)).unwrap();
        assert_eq!(ex.len(), 1);
        assert_eq!(
            (ex[0].form.as_str(), ex[0].turns[1].response.as_str()),
            ("own:wrong+task", "fast")
        );
        assert_eq!(stats.answered_in_group, 0);
    }

    #[test]
    fn the_answer_is_a_sentence_on_the_failure_then_the_right_kernels_block_and_summary() {
        let source = "// kevin: launch k grid=(cdiv(N,256)) block=(256) args=(X, Y, N)\n\
                      __global__ void k(const float* X, float* Y, int n) {\n\
                      int i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                      if (i < n) Y[i] = X[i];\n}";
        let right = crate::corpus::response("garbled 2.#define words", source, "One thread each.");
        let lines = [
            line("a", 1, 0, 0, &wrong(), "w"),
            line("a", 1, 0, 1, &correct(1.0), &right),
        ]
        .join("\n");
        let turns = parse_episodes(0, "e", &lines).unwrap();
        let (ex, _) = own_repairs(&turns, &BTreeSet::new(), &opts(8)).unwrap();
        let got = &ex[0].turns[1].response;
        assert!(
            got.starts_with("The previous kernel computed wrong values"),
            "{got}"
        );
        assert!(!got.contains("garbled"), "{got}");
        let parsed = crate::candidate::parse_response(got).unwrap();
        assert_eq!(parsed.source.trim(), source.trim());
        assert_eq!(parsed.summary.trim(), "One thread each.");
    }

    #[test]
    fn runs_given_together_keep_their_groups_apart() {
        // Group 1 of the first run failed; group 1 of the second run got it right: another group.
        let first = [
            line("a", 1, 0, 0, &wrong(), "w"),
            line("a", 1, 0, 1, &wrong(), "w2"),
        ]
        .join("\n");
        let second = line("a", 1, 0, 0, &correct(1.0), "right");
        let mut turns = parse_episodes(0, "one", &first).unwrap();
        turns.extend(parse_episodes(1, "two", &second).unwrap());
        let (ex, _) = own_repairs(&turns, &BTreeSet::new(), &opts(8)).unwrap();
        assert_eq!(ex.len(), 1);
        assert_eq!(ex[0].form, "own:wrong+task");
    }

    #[test]
    fn a_task_keeps_at_most_per_task_pairs_drawn_by_the_seed() {
        let mut lines: Vec<String> = (0..10)
            .flat_map(|t| {
                [
                    line("a", 1, t, 0, &wrong(), &format!("w{t}")),
                    line("a", 1, t, 1, &correct(1.0), "ok"),
                ]
            })
            .collect();
        lines.push(line("c", 1, 0, 0, &correct(1.0), "ok"));
        let turns = parse_episodes(0, "e", &lines.join("\n")).unwrap();
        let (ex, stats) = own_repairs(&turns, &BTreeSet::new(), &opts(3)).unwrap();
        assert_eq!(ex.len(), 3);
        assert_eq!(stats.pairs["wrong"], 3);
        let again = own_repairs(&turns, &BTreeSet::new(), &opts(3)).unwrap().0;
        assert_eq!(ex, again, "the same seed draws the same pairs");
        let mut firsts: Vec<&str> = ex.iter().map(|e| e.turns[0].response.as_str()).collect();
        firsts.dedup();
        assert_eq!(firsts.len(), 3, "three different failed turns");
    }

    /// One `kevin eval --transcripts` line, with the fields the evaluation writes.
    fn transcript(task: &str, traj: usize, turn: u32, outcome: &Outcome, resp: &str) -> String {
        serde_json::json!({
            "task": task, "trajectory": traj, "turn": turn,
            "prompt": format!("prompt {task} {traj} {turn}"), "response": resp,
            "outcome": outcome.kind(), "feedback": outcome.feedback(),
            "speedup": outcome.speedup(), "tokens": 7, "result": outcome,
        })
        .to_string()
    }

    #[test]
    fn an_evaluation_transcript_reads_as_one_group_a_task() {
        let lines = [
            transcript("a", 0, 0, &wrong(), "w"),
            transcript("a", 0, 1, &wrong(), "w2"),
            transcript("a", 1, 0, &correct(2.0), "right"),
        ]
        .join("\n");
        let turns = parse_episodes(3, "t.jsonl", &lines).unwrap();
        assert_eq!(turns.len(), 3);
        assert!(turns.iter().all(|t| t.source == 3 && t.seq == 0));
        assert_eq!(turns[2].outcome.speedup(), Some(2.0));
        let (ex, stats) = own_repairs(&turns, &BTreeSet::new(), &opts(8)).unwrap();
        // The right kernel of another trajectory of the same evaluation is of the failed turn's group.
        assert_eq!(ex.len(), 1);
        assert_eq!(ex[0].form, "own:wrong+group");
        assert_eq!(ex[0].turns[1].prompt, "prompt a 0 1");
        assert_eq!(stats.answered_in_group, 1);
        // A transcript of before the full outcome was written says so.
        let old = serde_json::json!({
            "task": "a", "trajectory": 0, "turn": 0, "prompt": "p", "response": "r",
            "outcome": "wrong", "feedback": "values differ", "speedup": null, "tokens": 3,
        })
        .to_string();
        let err = parse_episodes(0, "old.jsonl", &format!("{}\n{old}", lines)).unwrap_err();
        assert!(
            err.starts_with("old.jsonl line 4:") && err.contains("`result`"),
            "{err}"
        );
    }

    #[test]
    fn a_task_never_got_right_is_answered_by_the_fallback_and_the_policys_own_come_first() {
        let lines = [
            line("a", 1, 0, 0, &wrong(), "wa"),
            line("a", 1, 0, 1, &correct(0.5), "own-a"),
            line("b", 1, 0, 0, &wrong(), "wb"),
            line("b", 1, 0, 1, &wrong(), "wb2"),
            line("c", 1, 0, 0, &wrong(), "wc"),
            line("c", 1, 0, 1, &wrong(), "wc2"),
        ]
        .join("\n");
        let turns = parse_episodes(0, "e", &lines).unwrap();
        let corpus = |task: &str, kind: Kind, outcomes: &[&str], resp: &str| Example {
            task: task.into(),
            kind,
            form: "naive:x".into(),
            turns: vec![Turn {
                prompt: "p".into(),
                response: resp.into(),
            }],
            outcomes: outcomes.iter().map(|o| o.to_string()).collect(),
        };
        let fallback = corpus_answers(&[
            corpus("a", Kind::Variant, &["correct"], "corpus-a"),
            corpus("b", Kind::Variant, &["wrong"], "corpus-b-wrong"),
            corpus("b", Kind::Repair, &["correct"], "corpus-b-repair"),
            corpus("b", Kind::Variant, &["correct"], "corpus-b"),
            corpus("b", Kind::FirstTurn, &["correct"], "corpus-b-later"),
        ]);
        assert_eq!(
            fallback.into_iter().collect::<Vec<_>>(),
            [
                ("a".to_owned(), "corpus-a".to_owned()),
                ("b".to_owned(), "corpus-b".to_owned())
            ],
            "the first correct one-turn kernel of each task"
        );
        let opts = OwnRepairOptions {
            fallback: corpus_answers(&[
                corpus("a", Kind::Variant, &["correct"], "corpus-a"),
                corpus("b", Kind::Variant, &["correct"], "corpus-b"),
            ]),
            ..opts(8)
        };
        let (ex, stats) = own_repairs(&turns, &BTreeSet::new(), &opts).unwrap();
        let got: Vec<(&str, &str, &str)> = ex
            .iter()
            .map(|e| {
                (
                    e.task.as_str(),
                    e.form.as_str(),
                    e.turns[1].response.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", "own:wrong+group", "own-a"),
                ("b", "own:wrong+fallback", "corpus-b"),
            ]
        );
        assert_eq!(stats.answered_from_fallback, 1);
        // c has neither: its failure stays without an answer.
        assert_eq!(stats.without_answer, 1);
        assert_eq!(stats.tasks_with_pairs, 2);
    }

    #[test]
    fn a_held_out_task_or_a_bad_line_is_an_error_naming_it() {
        let lines = [
            line("a", 1, 0, 0, &wrong(), "w"),
            line("softmax_rows", 7, 2, 1, &wrong(), "x"),
        ]
        .join("\n");
        let turns = parse_episodes(0, "e", &lines).unwrap();
        let held: BTreeSet<String> = ["softmax_rows".to_owned()].into();
        let err = own_repairs(&turns, &held, &opts(8)).unwrap_err();
        assert!(
            err.contains("`softmax_rows`") && err.contains("group 7"),
            "{err}"
        );
        let err = parse_episodes(0, "run/episodes.jsonl", "\n{\"seq\": 1}\n").unwrap_err();
        assert!(err.starts_with("run/episodes.jsonl line 2:"), "{err}");
    }
}
