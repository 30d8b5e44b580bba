//! The supervised warm-start corpus: conversations in the real prompt and response format, built
//! from the train split's reference solutions and verified on a real kernel environment.
//!
//! The recipe (one JSON object per line, [`Example`]):
//!
//! - **first_turn**: the prompt is [`prompt::first_turn`] at the preset training evaluates at;
//!   the response is a short reasoning paragraph, the reference solution's ```cuda block and a
//!   one-paragraph summary (what [`crate::candidate::parse_response`] expects).
//! - **variant**: the same prompt, answered by another correct kernel: the reference with a
//!   different block size ([`variants::resize_blocks`]: launch plan, grid and
//!   `__launch_bounds__` edited together, only where the kernel is written against `blockDim`),
//!   and naive kernels written from the task's op program ([`naive`]: one thread per element,
//!   grid-stride loops, a 2-D grid or shared-memory tiles for matrix products, a thread or a block
//!   per row for reductions and row-wise operations).
//! - **repair**: two turns. The first answers with a deliberately broken kernel
//!   ([`variants::break_source`]: a bounds check removed, a wrong index, a missing
//!   `__syncthreads()`, a wrong launch plan, a compile error); the second turn's prompt is
//!   [`prompt::build`] over the real [`TurnRecord`] of that attempt, with the real feedback of
//!   its real outcome, and the response is the correct kernel it was broken from, with a sentence
//!   on what the fix is. A pair is kept only when the outcome is the kind the breakage is meant
//!   to cause ([`Breakage::expected`]), so the explanation fits the feedback. The target of
//!   training is the last turn; earlier turns are context.
//! - **chain**: three to `chain_max_turns` turns: failed attempts drawn from the task's repair
//!   pairs and a response cut off inside its ```cuda block (judged by the rollout's own format
//!   check), each turn's prompt built over the real records of the turns before, then the fix of
//!   the last one. The evaluation's refinement turns carry every earlier attempt in the prompt;
//!   a warm start trained on one-step repairs only lost the answer format once prompts grew past
//!   what it had seen (`benches/results/warmstart-gen-h200-2026-12-03b.md`). Chains add no
//!   evaluation.
//!
//! Nothing is claimed without evaluation: every candidate (reference, variant, breakage) is
//! compiled and put through the correctness protocol by the [`KernelEnv`] given (the CPU backend
//! in `kevin sft corpus`), in parallel. A variant is kept only when it is correct, a repair pair
//! only when its first kernel is not correct and its second is. The timing protocol is not run:
//! the corpus needs correctness, and CPU timings say nothing about GPU speed, so a correct turn
//! is recorded as `correct` without times.
//!
//! Only train-split tasks are used ([`TaskSuite::split`]); asking for a held-out task is an error.
//! Candidate generation is deterministic given the seed (which site a breakage edits); outcomes
//! are whatever the environment reports.

pub mod naive;
pub mod own;
mod scalar;
pub mod split;
pub mod variants;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::env::KernelEnv;
use crate::outcome::Outcome;
use crate::prompt;
use crate::rng::SplitMix64;
use crate::tasks::{Preset, Split, Task, TaskSuite};
use crate::turn::TurnRecord;
use variants::Breakage;

/// What a corpus line teaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The reference solution as the answer to the first-turn prompt.
    FirstTurn,
    /// Another correct kernel for the first-turn prompt.
    Variant,
    /// A broken attempt, its feedback, and the fixed kernel.
    Repair,
    /// Several failed attempts in a row (broken kernels, a response cut off before its block
    /// closed), each with its real feedback, then the fixed kernel: the long prompts of the
    /// later refinement turns.
    Chain,
    /// A policy's own failed turn from a run, the prompt the rollout built over it, and a kernel
    /// the policy got right for that task ([`own`], `kevin sft repairs`).
    OwnRepair,
}

impl Kind {
    /// The JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::FirstTurn => "first_turn",
            Kind::Variant => "variant",
            Kind::Repair => "repair",
            Kind::Chain => "chain",
            Kind::OwnRepair => "own_repair",
        }
    }
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The user prompt, exactly as the rollout would build it.
    pub prompt: String,
    /// The assistant response: reasoning, one ```cuda block, summary.
    pub response: String,
}

/// One line of the corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// The task's name (always a train-split task).
    pub task: String,
    /// What the example teaches.
    pub kind: Kind,
    /// Which kernel answers (`reference`, `reference_b128`, `naive:elementwise_b256`, ...) and,
    /// for repairs, how it was broken (`reference+missing_sync`).
    pub form: String,
    /// The conversation; the last response is the training target.
    pub turns: Vec<Turn>,
    /// The outcome kind ([`Outcome::kind`]) of each turn's kernel, in order.
    pub outcomes: Vec<String>,
}

/// How to build the corpus.
#[derive(Debug, Clone)]
pub struct CorpusOptions {
    /// The size preset of the prompts (the one training evaluates at).
    pub preset: Preset,
    /// Chooses the site of each breakage.
    pub seed: u64,
    /// The rollout's prompt budget (characters), for second-turn prompts.
    pub prompt_budget_chars: usize,
    /// Evaluations in flight at once (match the environment's worker count).
    pub parallel: usize,
    /// Only these tasks (all train-split tasks when empty).
    pub only: Vec<String>,
    /// At most this many breakages evaluated per task, drawn by `seed` from all that apply (every
    /// one when `None`). Breakages are most of a task's evaluations (about six per form), so a
    /// corpus over thousands of generated tasks caps them to spend its evaluations on programs.
    pub breakages_per_task: Option<usize>,
    /// Chains built per task (0: none), from the failed attempts its repairs already evaluated
    /// and a response cut off inside its ```cuda block; no evaluation is added.
    pub chains_per_task: usize,
    /// The longest chain, in turns (at least 3: two failed attempts and the fix).
    pub chain_max_turns: usize,
}

/// Counts of a build.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CorpusStats {
    /// Examples per kind.
    pub by_kind: BTreeMap<String, usize>,
    /// Turns per outcome kind, over all examples.
    pub by_outcome: BTreeMap<String, usize>,
    /// Repair examples per breakage.
    pub by_breakage: BTreeMap<String, usize>,
    /// Distinct tasks with at least one example.
    pub tasks: usize,
    /// Characters of all prompts and responses.
    pub chars: usize,
    /// Candidates evaluated.
    pub evaluated: usize,
    /// Correct-looking candidates that were not correct (dropped), by form, with the start of
    /// what the evaluation said.
    pub dropped_variants: Vec<String>,
    /// Breakages that turned out correct anyway (dropped).
    pub harmless_breakages: usize,
    /// Breakages whose outcome was not the kind they are meant to cause (dropped: the repair
    /// turn would explain the wrong fix).
    pub unexpected_breakages: usize,
    /// Tasks asked for that have no kernel to learn from: no reference solution, and a program
    /// outside the naive writer's shapes (what the writer should learn next).
    pub unwritten: Vec<String>,
}

/// A built corpus.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// The examples, sorted by task, kind and form.
    pub examples: Vec<Example>,
    /// Their counts.
    pub stats: CorpusStats,
}

/// Progress of the evaluations, for a progress line.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    /// Evaluations finished.
    pub done: usize,
    /// Evaluations in all.
    pub total: usize,
    /// The task of the one just finished.
    pub task: &'a str,
    /// Its outcome kind.
    pub outcome: &'a str,
}

/// Why a corpus could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// `--only` named a held-out task.
    #[error("task `{0}` is held out: the corpus is built from train-split tasks only")]
    HeldOut(String),
    /// `--only` named a task that is not in the suite.
    #[error("no task named `{0}` in the suite")]
    UnknownTask(String),
    /// The prompt of a task could not be rendered.
    #[error("task `{task}`: rendering its prompt: {reason}")]
    Prompt {
        /// The task.
        task: String,
        /// What failed.
        reason: String,
    },
    /// A reference solution could not be read.
    #[error("reference solution {path}: {source}")]
    Solution {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing the corpus failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A correct-by-construction candidate answer: a kernel and the words around it.
#[derive(Debug, Clone)]
struct Answer {
    task: usize,
    form: String,
    source: String,
    reasoning: String,
    summary: String,
}

impl Answer {
    fn response(&self) -> String {
        response(&self.reasoning, &self.source, &self.summary)
    }
}

/// A response in the candidate format.
pub fn response(reasoning: &str, source: &str, summary: &str) -> String {
    format!(
        "{}\n\n```cuda\n{}\n```\n{}",
        reasoning.trim(),
        source.trim_end(),
        summary.trim()
    )
}

/// One evaluation to run: an answer (index into the answers) or a breakage of one.
#[derive(Debug, Clone)]
struct Job {
    answer: usize,
    breakage: Option<Breakage>,
    source: String,
}

/// The reference solution's file for `task`: `<suite>/solutions/<task>.cu`.
pub fn solution_path(task: &Task) -> PathBuf {
    task.path
        .parent()
        .unwrap_or(Path::new("."))
        .join("solutions")
        .join(format!("{}.cu", task.name))
}

/// The tasks a corpus is built from: the train split, optionally narrowed to `only`.
pub fn train_tasks<'s>(
    suite: &'s TaskSuite,
    only: &[String],
) -> Result<Vec<&'s Task>, CorpusError> {
    for name in only {
        let task = suite
            .get(name)
            .ok_or_else(|| CorpusError::UnknownTask(name.clone()))?;
        if task.split != Split::Train {
            return Err(CorpusError::HeldOut(name.clone()));
        }
    }
    Ok(suite
        .split(Split::Train)
        .filter(|t| only.is_empty() || only.contains(&t.name))
        .collect())
}

/// The leading comment of a reference solution (its author's description), one line.
fn header_comment(source: &str) -> String {
    let mut words = Vec::new();
    for l in source.lines() {
        let t = l.trim();
        if t.starts_with("// kevin:") {
            continue;
        }
        match t.strip_prefix("//") {
            Some(c) => words.push(c.trim().to_string()),
            None if t.is_empty() && words.is_empty() => continue,
            None => break,
        }
    }
    words.join(" ")
}

/// The statement lines of the task's program, as written.
fn program_text(task: &Task) -> String {
    task.source
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("input ")
                && !l.starts_with("output ")
                && !l.starts_with("const ")
                && !l.starts_with('#')
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The launches of a cuda block, in words.
fn launches_text(source: &str) -> String {
    let Ok(plan) = crate::candidate::plan::parse_plan(source) else {
        return String::new();
    };
    let dims = |v: &[crate::candidate::Expr]| {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    plan.launches
        .iter()
        .map(|l| {
            format!(
                "`{}` on a ({}) grid of ({}) blocks",
                l.kernel,
                dims(&l.grid),
                dims(&l.block)
            )
        })
        .collect::<Vec<_>>()
        .join(", then ")
}

fn reference_answer(i: usize, task: &Task, source: &str, form: String, note: &str) -> Answer {
    let header = header_comment(source);
    let header = header
        .split_once(": ")
        .filter(|(name, _)| !name.contains(' '))
        .map_or(header.as_str(), |(_, rest)| rest)
        .to_string();
    let launches = launches_text(source);
    Answer {
        task: i,
        form,
        source: source.to_string(),
        reasoning: format!(
            "The module computes `{}`. Approach: {}{}",
            program_text(task),
            ensure_period(&header),
            note
        ),
        summary: format!("{} Launches: {launches}.", ensure_period(&header)),
    }
}

fn ensure_period(s: &str) -> String {
    let s = s.trim();
    if s.ends_with('.') {
        s.to_string()
    } else {
        format!("{s}.")
    }
}

/// The first line of a feedback text, for the repair turn's reasoning.
fn feedback_head(outcome: &Outcome) -> String {
    let f = outcome.feedback();
    let first = f.lines().next().unwrap_or("").trim();
    let mut head: String = first.chars().take(300).collect();
    if head.len() < first.len() {
        head.push_str("...");
    }
    head
}

/// Builds the corpus: generates every candidate of every train task, evaluates them all on
/// `env` (`opts.parallel` at a time; `progress` is called after each), and assembles the
/// examples that the outcomes support.
pub fn build(
    suite: &TaskSuite,
    env: &dyn KernelEnv,
    opts: &CorpusOptions,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<Corpus, CorpusError> {
    let tasks = train_tasks(suite, &opts.only)?;
    let mut statements = Vec::with_capacity(tasks.len());
    let mut answers: Vec<Answer> = Vec::new();
    let mut unwritten = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let before = answers.len();
        statements.push(prompt::first_turn(task, opts.preset).map_err(|e| {
            CorpusError::Prompt {
                task: task.name.clone(),
                reason: e.to_string(),
            }
        })?);
        let path = solution_path(task);
        if path.exists() {
            let source = std::fs::read_to_string(&path)
                .map_err(|source| CorpusError::Solution { path, source })?;
            answers.push(reference_answer(i, task, &source, "reference".into(), ""));
            for block in [64, 128, 512] {
                if let Some(s) = variants::resize_blocks(&source, block) {
                    let note = format!(
                        " The kernel indexes with blockDim.x, so it runs with {block}-thread blocks; the grid is \
                         sized for {block} threads per block."
                    );
                    let mut a = reference_answer(i, task, &s, format!("reference_b{block}"), &note);
                    a.summary = format!("{} Launched with {block}-thread blocks.", a.summary);
                    answers.push(a);
                }
            }
        }
        for g in naive::generate(task) {
            answers.push(Answer {
                task: i,
                form: format!("naive:{}", g.form),
                source: g.source,
                reasoning: g.reasoning,
                summary: g.summary,
            });
        }
        if answers.len() == before {
            unwritten.push(task.name.clone());
        }
    }
    let mut jobs = Vec::new();
    // The breakages of the current task's answers (answers are grouped by task, in order).
    let mut broken: Vec<Job> = Vec::new();
    for (a, answer) in answers.iter().enumerate() {
        jobs.push(Job {
            answer: a,
            breakage: None,
            source: answer.source.clone(),
        });
        // Breakages of the reference and of every naive form (block variants add little).
        if !answer.form.starts_with("reference_b") {
            for (k, b) in Breakage::ALL.into_iter().enumerate() {
                let mut rng = SplitMix64::derive(
                    opts.seed ^ fnv(&tasks[answer.task].name) ^ fnv(&answer.form),
                    k as u64,
                );
                if let Some(source) = variants::break_source(&answer.source, b, &mut rng) {
                    if source != answer.source {
                        broken.push(Job {
                            answer: a,
                            breakage: Some(b),
                            source,
                        });
                    }
                }
            }
        }
        if answers
            .get(a + 1)
            .is_none_or(|next| next.task != answer.task)
        {
            let task = &tasks[answer.task].name;
            jobs.extend(capped(
                std::mem::take(&mut broken),
                opts.breakages_per_task,
                opts.seed ^ fnv(task),
            ));
        }
    }

    let outcomes = evaluate_all(env, &tasks, &answers, &jobs, opts.parallel, progress);

    let mut stats = CorpusStats {
        evaluated: jobs.len(),
        unwritten,
        ..CorpusStats::default()
    };
    let mut examples = Vec::new();
    let correct: Vec<bool> = {
        let mut c = vec![false; answers.len()];
        for (job, o) in jobs.iter().zip(&outcomes) {
            if job.breakage.is_none() {
                c[job.answer] = o.is_none();
            }
        }
        c
    };
    // The failed attempts of each task (by task index), for the chains.
    let mut attempts: BTreeMap<usize, Vec<Attempt>> = BTreeMap::new();
    for (job, outcome) in jobs.iter().zip(&outcomes) {
        let answer = &answers[job.answer];
        let task = tasks[answer.task];
        let statement = &statements[answer.task];
        match (job.breakage, outcome) {
            (None, None) => examples.push(Example {
                task: task.name.clone(),
                kind: if answer.form == "reference" {
                    Kind::FirstTurn
                } else {
                    Kind::Variant
                },
                form: answer.form.clone(),
                turns: vec![Turn {
                    prompt: statement.clone(),
                    response: answer.response(),
                }],
                outcomes: vec!["correct".into()],
            }),
            (None, Some(o)) => stats.dropped_variants.push(format!(
                "{}/{}: {}",
                task.name,
                answer.form,
                brief(&o.feedback())
            )),
            (Some(_), None) => stats.harmless_breakages += 1,
            (Some(b), Some(o)) if correct[job.answer] && !b.expected().contains(&o.kind()) => {
                stats.unexpected_breakages += 1;
            }
            (Some(b), Some(o)) if correct[job.answer] => {
                let broken = Answer {
                    source: job.source.clone(),
                    ..answer.clone()
                };
                let first = TurnRecord {
                    turn: 0,
                    prompt: statement.clone(),
                    response: broken.response(),
                    kernel: Some(broken.source.trim_end().to_string()),
                    summary: Some(broken.summary.clone()),
                    outcome: o.clone(),
                    score: o.score(),
                    policy_version: 0,
                    response_tokens: Vec::new(),
                    behaviour_logprobs: Vec::new(),
                    generate_ms: 0.0,
                    evaluate_ms: 0.0,
                };
                let second_prompt = prompt::build(
                    statement,
                    std::slice::from_ref(&first),
                    opts.prompt_budget_chars,
                );
                let fixed = response(
                    &format!(
                        "The previous attempt failed: {} {} {}",
                        feedback_head(o),
                        b.fix(),
                        answer.reasoning
                    ),
                    &answer.source,
                    &answer.summary,
                );
                *stats.by_breakage.entry(b.name().to_string()).or_default() += 1;
                attempts.entry(answer.task).or_default().push(Attempt {
                    answer: job.answer,
                    response: first.response.clone(),
                    kernel: first.kernel.clone(),
                    summary: first.summary.clone(),
                    outcome: o.clone(),
                    fix: b.fix(),
                });
                examples.push(Example {
                    task: task.name.clone(),
                    kind: Kind::Repair,
                    form: format!("{}+{}", answer.form, b.name()),
                    turns: vec![
                        Turn {
                            prompt: first.prompt.clone(),
                            response: first.response.clone(),
                        },
                        Turn {
                            prompt: second_prompt,
                            response: fixed,
                        },
                    ],
                    outcomes: vec![o.kind().to_string(), "correct".into()],
                });
            }
            // The answer it was broken from is not correct itself: no pair.
            (Some(_), Some(_)) => {}
        }
    }
    if opts.chains_per_task > 0 {
        for (i, task) in tasks.iter().enumerate() {
            let mut rng = SplitMix64::derive(opts.seed ^ fnv(&task.name), CHAIN_STREAM);
            let mut pool = attempts.remove(&i).unwrap_or_default();
            let correct_answers = answers
                .iter()
                .enumerate()
                .filter(|(a, ans)| ans.task == i && correct[*a])
                .map(|(a, _)| a)
                .collect::<Vec<_>>();
            if !correct_answers.is_empty() {
                let a = correct_answers[rng.below(correct_answers.len() as u64) as usize];
                pool.extend(cut_attempt(a, &answers[a], &mut rng));
            }
            for _ in 0..opts.chains_per_task {
                if let Some(e) = chain(task, &statements[i], &answers, &pool, opts, &mut rng) {
                    examples.push(e);
                }
            }
        }
    }
    examples.sort_by(|a, b| (&a.task, a.kind, &a.form).cmp(&(&b.task, b.kind, &b.form)));
    let mut seen = std::collections::BTreeSet::new();
    for e in &examples {
        *stats.by_kind.entry(e.kind.name().to_string()).or_default() += 1;
        for o in &e.outcomes {
            *stats.by_outcome.entry(o.clone()).or_default() += 1;
        }
        stats.chars += e
            .turns
            .iter()
            .map(|t| t.prompt.len() + t.response.len())
            .sum::<usize>();
        seen.insert(e.task.clone());
    }
    stats.tasks = seen.len();
    Ok(Corpus { examples, stats })
}

/// The seed stream of a task's chains (apart from its breakages' streams, 0..).
const CHAIN_STREAM: u64 = 0xC4A1_0000;

/// A failed attempt a chain can show: the response and what the environment (or the format
/// check) said of it, and the correct answer it was made from.
#[derive(Debug, Clone)]
struct Attempt {
    answer: usize,
    response: String,
    kernel: Option<String>,
    summary: Option<String>,
    outcome: Outcome,
    fix: &'static str,
}

/// What a chain's fix says after a response that was cut off.
const CUT_FIX: &str = "The response stopped inside its ```cuda block, so there was no kernel to \
                       compile; this time the whole kernel is written out, the block closed, and \
                       the summary after it.";

/// `answer`'s response cut off inside its ```cuda block, as a response that ran out of tokens
/// is, judged by the rollout's own format check (None if the check passes it anyway).
fn cut_attempt(a: usize, answer: &Answer, rng: &mut SplitMix64) -> Option<Attempt> {
    let full = answer.response();
    let open = full.find("```cuda\n")? + "```cuda\n".len();
    let body = answer.source.trim_end().len();
    if body < 4 {
        return None;
    }
    let mut cut = open + body / 4 + rng.below((body / 2) as u64) as usize;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let response = full[..cut].to_string();
    let outcome = crate::turn::parse_response(&response).err()?;
    Some(Attempt {
        answer: a,
        response,
        kernel: None,
        summary: None,
        outcome,
        fix: CUT_FIX,
    })
}

/// One chain of `task`: two to `chain_max_turns - 1` distinct failed attempts drawn from
/// `pool`, each turn's prompt built by the rollout's [`prompt::build`] over the turns before,
/// then the correct answer the last attempt was made from.
fn chain(
    task: &Task,
    statement: &str,
    answers: &[Answer],
    pool: &[Attempt],
    opts: &CorpusOptions,
    rng: &mut SplitMix64,
) -> Option<Example> {
    let most = opts.chain_max_turns.saturating_sub(1).min(pool.len());
    if most < 2 {
        return None;
    }
    let n = 2 + rng.below((most - 1) as u64) as usize;
    let mut order: Vec<usize> = (0..pool.len()).collect();
    for i in 0..n {
        let j = i + rng.below((order.len() - i) as u64) as usize;
        order.swap(i, j);
    }
    let picked: Vec<&Attempt> = order[..n].iter().map(|&k| &pool[k]).collect();
    let mut history: Vec<TurnRecord> = Vec::with_capacity(n);
    let mut turns = Vec::with_capacity(n + 1);
    for (t, at) in picked.iter().enumerate() {
        let prompt = prompt::build(statement, &history, opts.prompt_budget_chars);
        turns.push(Turn {
            prompt: prompt.clone(),
            response: at.response.clone(),
        });
        history.push(TurnRecord {
            turn: t as u32,
            prompt,
            response: at.response.clone(),
            kernel: at.kernel.clone(),
            summary: at.summary.clone(),
            outcome: at.outcome.clone(),
            score: at.outcome.score(),
            policy_version: 0,
            response_tokens: Vec::new(),
            behaviour_logprobs: Vec::new(),
            generate_ms: 0.0,
            evaluate_ms: 0.0,
        });
    }
    let last = picked[n - 1];
    let answer = &answers[last.answer];
    turns.push(Turn {
        prompt: prompt::build(statement, &history, opts.prompt_budget_chars),
        response: response(
            &format!(
                "The previous attempt failed: {} {} {}",
                feedback_head(&last.outcome),
                last.fix,
                answer.reasoning
            ),
            &answer.source,
            &answer.summary,
        ),
    });
    let mut outcomes: Vec<String> = picked
        .iter()
        .map(|a| a.outcome.kind().to_string())
        .collect();
    outcomes.push("correct".into());
    Some(Example {
        task: task.name.clone(),
        kind: Kind::Chain,
        form: format!("chain{}:{}", n + 1, answer.form),
        turns,
        outcomes,
    })
}

/// At most `cap` of `jobs` (all when `None`), drawn without replacement by `seed`, in their
/// original order.
fn capped<T>(jobs: Vec<T>, cap: Option<usize>, seed: u64) -> Vec<T> {
    let Some(cap) = cap.filter(|&c| c < jobs.len()) else {
        return jobs;
    };
    let mut rng = SplitMix64::derive(seed, u64::MAX);
    let mut index: Vec<usize> = (0..jobs.len()).collect();
    for i in 0..cap {
        let j = i + rng.below((index.len() - i) as u64) as usize;
        index.swap(i, j);
    }
    let mut keep = vec![false; jobs.len()];
    for &i in &index[..cap] {
        keep[i] = true;
    }
    jobs.into_iter()
        .zip(keep)
        .filter_map(|(j, k)| k.then_some(j))
        .collect()
}

/// FNV-1a of a name: mixes task and form into the breakage seed.
fn fnv(s: &str) -> u64 {
    crate::rng::fnv1a(s.as_bytes())
}

/// Compiles and verifies every job, `parallel` at a time: `None` for a correct kernel, the
/// outcome otherwise.
fn evaluate_all(
    env: &dyn KernelEnv,
    tasks: &[&Task],
    answers: &[Answer],
    jobs: &[Job],
    parallel: usize,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Vec<Option<Outcome>> {
    crate::par::par_map(
        jobs,
        parallel,
        |job| {
            let task = &tasks[answers[job.answer].task].name;
            crate::env::patiently(
                || match env.compile(task, &job.source) {
                    Ok(compiled) => env.verify(&compiled).err(),
                    Err(o) => Some(o),
                },
                |v| v.as_ref().is_some_and(Outcome::is_busy),
            )
        },
        |n, job, verdict| {
            progress(Progress {
                done: n,
                total: jobs.len(),
                task: &tasks[answers[job.answer].task].name,
                outcome: verdict.as_ref().map_or("correct", Outcome::kind),
            })
        },
    )
}

/// Writes the examples as JSON lines.
pub fn write_jsonl(path: &Path, examples: &[Example]) -> Result<(), CorpusError> {
    let werr = |source| CorpusError::Write {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(werr)?;
    let mut w = std::io::BufWriter::new(file);
    for e in examples {
        let line = serde_json::to_string(e).expect("examples serialise");
        writeln!(w, "{line}").map_err(werr)?;
    }
    w.flush().map_err(werr)
}

/// Reads a corpus written by [`write_jsonl`]; an error names the line.
pub fn read_jsonl(path: &Path) -> Result<Vec<Example>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests;

/// The first two lines of an evaluation's feedback, at most 240 characters: enough to say why a kernel
/// that should be correct was not, short enough for a record of thousands.
fn brief(feedback: &str) -> String {
    let lines: Vec<&str> = feedback
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let line = lines[..lines.len().min(2)].join(" ");
    match line.char_indices().nth(240) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line,
    }
}
