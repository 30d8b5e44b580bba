//! The episode driver of a policy evaluation: K trajectories of N turns per task, each an
//! [`Episode`] exactly as the training rollout drives it (the same prompts with history and
//! feedback, the same response parsing, the same scoring), without the actor system.
//!
//! The policy runs on the calling thread; evaluations run on `eval_workers` threads. Whenever
//! episodes are waiting for a response, up to `gen_batch` of them (the lowest task first, so a
//! task's K trajectories share a batch and tasks finish in order) go to the policy in one
//! `generate` call, and their candidates go to the evaluation threads; while those are compiled,
//! checked and timed, the next batch generates. A response without a valid candidate is a format
//! error at once, with no evaluation, as in training. A failed `generate` call (most often a pass
//! out of GPU memory) is not the end of the evaluation: the batch is halved for it and for every
//! later call, down to one request, which ends the evaluation only if it fails twice.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::SamplingSection;
use crate::env::KernelEnv;
use crate::episode::{Episode, EpisodeTask};
use crate::outcome::Outcome;
use crate::policy::{Completion, GenRequest, Policy, PolicyError};
use crate::turn::{self, Responded, TurnRecord};

use super::TaskTrajectories;

/// How to run the evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// K: trajectories per task.
    pub samples: u32,
    /// N: turns per trajectory.
    pub turns: u32,
    /// Character budget of a prompt (the training config's `rollout.prompt_budget_chars`).
    pub prompt_budget_chars: usize,
    /// Base seed of every request's sampling seed ([`request_seed`]).
    pub seed: u64,
    /// Temperature, top-p, maximum new tokens, stop strings.
    pub sampling: SamplingSection,
    /// Requests per `generate` call (the policy's batch).
    pub gen_batch: usize,
    /// Evaluations at once (threads calling the environment).
    pub eval_workers: usize,
}

/// Where an evaluation stands, after each recorded turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Tasks whose K trajectories are all finished.
    pub tasks_done: usize,
    /// Tasks in all.
    pub tasks: usize,
    /// Finished trajectories.
    pub trajectories_done: usize,
    /// Trajectories in all (tasks x K).
    pub trajectories: usize,
    /// Recorded turns.
    pub turns_done: usize,
    /// Turns in all (tasks x K x N).
    pub turns: usize,
    /// Time since the start.
    pub elapsed: Duration,
}

impl Progress {
    /// The time left at the pace so far (None before the first turn).
    pub fn eta(&self) -> Option<Duration> {
        (self.turns_done > 0).then(|| {
            self.elapsed
                .mul_f64((self.turns - self.turns_done) as f64 / self.turns_done as f64)
        })
    }
}

/// Why an evaluation stopped (a candidate's failure is an outcome, never one of these).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// K or N is 0.
    #[error("--samples {samples} --turns {turns}: both must be at least 1")]
    Shape {
        /// K.
        samples: u32,
        /// N.
        turns: u32,
    },
    /// The policy failed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The policy answered something else than one completion per request, in order.
    #[error("{policy}: {reason}")]
    Completions {
        /// The policy's description.
        policy: String,
        /// What was wrong.
        reason: String,
    },
    /// The environment panicked (a bug of kevin, not of the candidate).
    #[error("the kernel environment failed on task {task}: {reason}")]
    Environment {
        /// The task.
        task: String,
        /// The panic message.
        reason: String,
    },
}

/// The sampling seed of one turn: derived from the base seed, the task's name (so a task's
/// samples do not depend on which other tasks are evaluated), the trajectory and the turn; the
/// training rollout's [`turn::seed`] keyed by [`turn::name_key`] of the task.
pub fn request_seed(seed: u64, task: &str, trajectory: u32, turn: u32) -> u64 {
    turn::seed(seed, turn::name_key(task), trajectory, turn)
}

struct Job {
    episode: usize,
    task: String,
    source: String,
}

struct Done {
    episode: usize,
    outcome: Result<Outcome, String>,
    evaluate_ms: f64,
}

struct Driver<'a> {
    episodes: Vec<(usize, u32, Episode)>,
    tasks: &'a [Arc<EpisodeTask>],
    opts: &'a RunOptions,
    ready: BTreeSet<usize>,
    /// Turns whose candidate is being evaluated.
    waiting: HashMap<usize, Responded>,
    left_per_task: Vec<u32>,
    progress: Progress,
    started: Instant,
    /// Requests per `generate` call now: `gen_batch`, halved after each failed call.
    gen_cap: usize,
}

impl Driver<'_> {
    fn record(&mut self, i: usize, turn: TurnRecord, report: &mut dyn FnMut(&Progress)) {
        let (task, _, episode) = &mut self.episodes[i];
        episode.record(turn);
        self.progress.turns_done += 1;
        if episode.is_done() {
            self.progress.trajectories_done += 1;
            self.left_per_task[*task] -= 1;
            if self.left_per_task[*task] == 0 {
                self.progress.tasks_done += 1;
            }
        } else {
            self.ready.insert(i);
        }
        self.progress.elapsed = self.started.elapsed();
        report(&self.progress);
    }

    fn evaluated(&mut self, d: Done, report: &mut dyn FnMut(&Progress)) -> Result<(), RunError> {
        let w = self
            .waiting
            .remove(&d.episode)
            .expect("an evaluation answers a waiting turn");
        let outcome = d.outcome.map_err(|reason| RunError::Environment {
            task: self.tasks[self.episodes[d.episode].0].name.clone(),
            reason,
        })?;
        self.record(d.episode, w.record(Some(outcome), d.evaluate_ms), report);
        Ok(())
    }
}

/// Runs K x N episodes per task of `tasks` with `policy` against `env` (see the module docs),
/// calling `report` after every recorded turn. The trajectories come back in task order, each
/// task's in trajectory order.
pub fn run(
    policy: &mut dyn Policy,
    env: &dyn KernelEnv,
    tasks: &[Arc<EpisodeTask>],
    opts: &RunOptions,
    report: &mut dyn FnMut(&Progress),
) -> Result<Vec<TaskTrajectories>, RunError> {
    if opts.samples == 0 || opts.turns == 0 {
        return Err(RunError::Shape {
            samples: opts.samples,
            turns: opts.turns,
        });
    }
    let episodes: Vec<(usize, u32, Episode)> = tasks
        .iter()
        .enumerate()
        .flat_map(|(ti, task)| {
            (0..opts.samples).map(move |k| {
                let e = Episode::new(task.clone(), opts.turns, opts.prompt_budget_chars);
                (ti, k, e)
            })
        })
        .collect();
    let mut d = Driver {
        ready: (0..episodes.len()).collect(),
        progress: Progress {
            tasks_done: 0,
            tasks: tasks.len(),
            trajectories_done: 0,
            trajectories: episodes.len(),
            turns_done: 0,
            turns: episodes.len() * opts.turns as usize,
            elapsed: Duration::ZERO,
        },
        episodes,
        tasks,
        opts,
        waiting: HashMap::new(),
        left_per_task: vec![opts.samples; tasks.len()],
        started: Instant::now(),
        gen_cap: opts.gen_batch.max(1),
    };
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
    std::thread::scope(|s| {
        for _ in 0..opts.eval_workers.max(1) {
            let (rx, tx) = (job_rx.clone(), done_tx.clone());
            s.spawn(move || {
                for job in rx {
                    let t0 = Instant::now();
                    // The environment is trusted code: a panic is kevin's bug, reported as such
                    // rather than left to hang the driver waiting for this answer.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        crate::env::evaluate(env, &job.task, &job.source)
                    }))
                    .map_err(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panic".into())
                    });
                    let done = Done {
                        episode: job.episode,
                        outcome,
                        evaluate_ms: t0.elapsed().as_secs_f64() * 1e3,
                    };
                    if tx.send(done).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        let result = drive(&mut d, policy, &job_tx, &done_rx, report);
        // Workers stop once the queue is closed and empty.
        drop(job_tx);
        result
    })?;
    let mut out: Vec<TaskTrajectories> = tasks
        .iter()
        .map(|t| TaskTrajectories {
            task: t.name.clone(),
            level: t.level,
            trajectories: Vec::with_capacity(opts.samples as usize),
        })
        .collect();
    for (ti, _, e) in d.episodes {
        out[ti].trajectories.push(e.into_turns());
    }
    Ok(out)
}

/// Generates `requests` in calls of at most `cap` requests. After a failed call (most often a
/// forward pass out of GPU memory: other processes on the device, or a prefill of many long
/// prompts) `cap` is halved, for this batch and every later one, and the rest is asked again: the
/// requests carry their own seeds, so nothing but the batching changes. A single request that
/// fails twice (a second after the first failure) ends the evaluation with the policy's error.
fn generate_halving(
    policy: &mut dyn Policy,
    requests: &[GenRequest],
    sampling: &SamplingSection,
    cap: &mut usize,
) -> Result<Vec<Completion>, RunError> {
    let mut out = Vec::with_capacity(requests.len());
    let mut single_failed = false;
    while out.len() < requests.len() {
        let part = &requests[out.len()..(out.len() + *cap).min(requests.len())];
        match policy.generate(part, sampling) {
            Ok(completions) if completions.len() != part.len() => {
                return Err(RunError::Completions {
                    policy: policy.describe(),
                    reason: format!(
                        "{} completions for {} requests",
                        completions.len(),
                        part.len()
                    ),
                });
            }
            Ok(completions) => {
                out.extend(completions);
                single_failed = false;
            }
            Err(PolicyError::Generate {
                policy: who,
                reason,
            }) if part.len() == 1 => {
                if single_failed {
                    return Err(RunError::Policy(PolicyError::Generate {
                        policy: who,
                        reason: format!(
                            "{reason} (one request at a time failed twice, a second apart, after \
                             the batch was halved; if other processes hold the GPU's memory, run \
                             fewer at once)"
                        ),
                    }));
                }
                single_failed = true;
                tracing::warn!(%reason, "generation of one request failed; asking again in a second");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(PolicyError::Generate { reason, .. }) => {
                *cap = (part.len() / 2).max(1);
                tracing::warn!(
                    %reason,
                    failed = part.len(),
                    "generation failed; going on with batches of {}",
                    *cap
                );
            }
            Err(other) => return Err(other.into()),
        }
    }
    Ok(out)
}

fn drive(
    d: &mut Driver<'_>,
    policy: &mut dyn Policy,
    jobs: &crossbeam_channel::Sender<Job>,
    done: &crossbeam_channel::Receiver<Done>,
    report: &mut dyn FnMut(&Progress),
) -> Result<(), RunError> {
    while d.progress.turns_done < d.progress.turns {
        // Whatever finished evaluating while the policy ran joins this batch.
        while let Ok(r) = done.try_recv() {
            d.evaluated(r, report)?;
        }
        if d.progress.turns_done == d.progress.turns {
            break;
        }
        if d.ready.is_empty() {
            let r = done.recv().map_err(|_| RunError::Environment {
                task: "(any)".into(),
                reason: "every evaluation thread is gone".into(),
            })?;
            d.evaluated(r, report)?;
            continue;
        }
        let batch: Vec<usize> = d.ready.iter().take(d.gen_cap).copied().collect();
        let requests: Vec<GenRequest> = batch
            .iter()
            .map(|&i| {
                d.ready.remove(&i);
                let (ti, k, e) = &d.episodes[i];
                let key = turn::name_key(&d.tasks[*ti].name);
                e.request(i as u64, d.opts.seed, key, *k)
            })
            .collect();
        let t0 = Instant::now();
        let completions = generate_halving(policy, &requests, &d.opts.sampling, &mut d.gen_cap)?;
        let generate_ms = t0.elapsed().as_secs_f64() * 1e3;
        for (req, completion) in requests.into_iter().zip(completions) {
            if completion.id != req.id {
                return Err(RunError::Completions {
                    policy: policy.describe(),
                    reason: format!(
                        "completion {} answers request {}: out of order",
                        completion.id, req.id
                    ),
                });
            }
            let i = req.id as usize;
            let turn = d.episodes[i].2.next_turn();
            let responded = Responded::new(turn, req.prompt, completion, generate_ms);
            let Some(source) = responded.candidate().map(str::to_string) else {
                d.record(i, responded.record(None, 0.0), report);
                continue;
            };
            let task = d.tasks[d.episodes[i].0].name.clone();
            d.waiting.insert(i, responded);
            jobs.send(Job {
                episode: i,
                task,
                source,
            })
            .map_err(|_| RunError::Environment {
                task: d.tasks[d.episodes[i].0].name.clone(),
                reason: "every evaluation thread is gone".into(),
            })?;
        }
    }
    Ok(())
}
