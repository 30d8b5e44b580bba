//! Simulated components: a policy and a learner that cost what they are configured to cost and
//! produce outputs from configured distributions; their kernel environment is
//! [`crate::env::sim`] (it reads the marker the simulated policy writes into its kernels).
//!
//! They exist so the actor system runs end to end without a GPU or a model, and they stay useful
//! afterwards: the integration tests and the pipeline benchmark run on them. They are selected
//! only explicitly (`kind = "simulated"`) and say they are simulated in every description, every
//! response and every outcome's timing label. They do compute for real what is not simulated:
//! the simulated learner evaluates the actual clipped-surrogate loss on the batch it is given.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::{LearnerSection, SamplingSection, SimPolicySection};
use crate::env::sim::sleep_ms;
use crate::learner::{Learner, LearnerError, TrainStats};
use crate::policy::{Completion, FinishReason, GenRequest, Policy, PolicyError, Weights};
use crate::replay::Batch;
use crate::rl;
use crate::rng::SplitMix64;

/// Number of earlier turns a prompt shows (the history headings written by [`crate::prompt`]).
fn earlier_turns(prompt: &str) -> u32 {
    prompt.matches("\n### Turn ").count() as u32
}

/// A policy that answers after a configured delay: with a canned, meaningless kernel, or, when a
/// corpus folder is configured, with the task's file from it (e.g. the reference solutions),
/// sometimes broken on purpose so the compiler has something to reject.
#[derive(Debug)]
pub struct SimPolicy {
    cfg: SimPolicySection,
    version: u64,
    corpus: HashMap<String, Option<String>>,
}

impl SimPolicy {
    /// A simulated policy with the given cost model.
    pub fn new(cfg: SimPolicySection) -> Self {
        SimPolicy {
            cfg,
            version: 0,
            corpus: HashMap::new(),
        }
    }

    /// The corpus answer for the task named in the prompt's `# Task:` header, if any.
    fn corpus_answer(&mut self, prompt: &str) -> Option<(String, String)> {
        if self.cfg.corpus.is_empty() {
            return None;
        }
        let task = prompt
            .lines()
            .find_map(|l| l.strip_prefix("# Task: "))?
            .split_whitespace()
            .next()?
            .to_string();
        let dir = Path::new(&self.cfg.corpus);
        let source = self
            .corpus
            .entry(task.clone())
            .or_insert_with(|| std::fs::read_to_string(dir.join(format!("{task}.cu"))).ok())
            .clone()?;
        Some((task, source))
    }
}

/// Breaks `source` so that it no longer compiles: removes one statement terminator.
fn break_source(source: &str, rng: &mut SplitMix64) -> String {
    let semis: Vec<usize> = source
        .char_indices()
        .filter(|(i, c)| {
            *c == ';'
                && !source[..*i]
                    .rsplit('\n')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with("//")
        })
        .map(|(i, _)| i)
        .collect();
    if semis.is_empty() {
        return format!("{source}\n#error simulated breakage\n");
    }
    let at = semis[rng.below(semis.len() as u64) as usize];
    format!("{}{}", &source[..at], &source[at + 1..])
}

impl Policy for SimPolicy {
    fn describe(&self) -> String {
        format!(
            "simulated policy (no model): {} ms per batch + {} ms per token, {} tokens per response",
            self.cfg.batch_ms, self.cfg.token_ms, self.cfg.response_tokens
        )
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn generate(
        &mut self,
        batch: &[GenRequest],
        _sampling: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError> {
        // A batched forward pass costs about the same for the whole batch: that is why the
        // generator batches, and the simulation keeps that property.
        sleep_ms(self.cfg.batch_ms + self.cfg.token_ms * self.cfg.response_tokens as f64);
        Ok(batch
            .iter()
            .map(|req| {
                let mut rng = SplitMix64::new(req.seed);
                let turn = earlier_turns(&req.prompt);
                let draw = rng.next_u64();
                let corpus = self.corpus_answer(&req.prompt);
                let text = if rng.next_f64() < self.cfg.p_format_error {
                    format!("Simulated reasoning (policy v{}) that forgot to write a kernel.", self.version)
                } else if let Some((task, source)) = corpus {
                    let broken = rng.next_f64() < self.cfg.p_mutate * 0.5f64.powi(turn as i32);
                    let source = if broken { break_source(&source, &mut rng) } else { source };
                    format!(
                        "Simulated reasoning (policy v{v}).\n```cuda\n{}\n```\nSimulated summary: the corpus answer for \
                         {task}{}.",
                        source.trim_end(),
                        if broken { ", broken on purpose" } else { "" },
                        v = self.version
                    )
                } else {
                    format!(
                        "Simulated reasoning (policy v{v}).\n```cuda\n// sim: turn={turn} draw={draw}\n\
                         // kevin: launch sim_kernel grid=(1) block=(32) args=(Y)\n\
                         __global__ void sim_kernel(float* y) {{ y[threadIdx.x] = 0.0f; }}\n```\n\
                         Simulated summary of attempt {n}.",
                        v = self.version,
                        n = turn + 1
                    )
                };
                let n = self.cfg.response_tokens as usize;
                Completion {
                    id: req.id,
                    text,
                    token_ids: (0..n).map(|_| rng.below(32_000) as u32).collect(),
                    logprobs: (0..n).map(|_| -(rng.next_f64() * 2.0) as f32).collect(),
                    policy_version: self.version,
                    finish: FinishReason::Stop,
                }
            })
            .collect())
    }

    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        self.version = weights.version;
        Ok(())
    }
}

/// A learner with no model: it evaluates the real loss of the recipe on each batch (with the
/// current log-probs taken as the behaviour log-probs plus a small deterministic drift), sleeps
/// for the configured step time, and counts versions.
#[derive(Debug)]
pub struct SimLearner {
    cfg: LearnerSection,
    max_tokens: usize,
    version: u64,
}

impl SimLearner {
    /// A simulated learner whose optimizer steps take `step_ms` each.
    pub fn new(step_ms: f64) -> Self {
        let mut cfg = LearnerSection::default();
        cfg.simulated.step_ms = step_ms;
        SimLearner {
            cfg,
            max_tokens: 4096,
            version: 0,
        }
    }

    /// A simulated learner configured by the `[learner]` section; `max_tokens` is the Dr. GRPO
    /// normaliser's token budget (sampling.max_new_tokens).
    pub fn from_config(cfg: &LearnerSection, max_tokens: u32) -> Self {
        SimLearner {
            cfg: cfg.clone(),
            max_tokens: max_tokens as usize,
            version: 0,
        }
    }
}

impl Learner for SimLearner {
    fn describe(&self) -> String {
        format!(
            "simulated learner (no model): {} ms per optimizer step",
            self.cfg.simulated.step_ms
        )
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn train(&mut self, batch: &Batch) -> Result<TrainStats, LearnerError> {
        let clip = rl::Clip {
            eps_low: self.cfg.clip_low,
            eps_high: self.cfg.clip_high,
        };
        let mut stats = TrainStats::default();
        for step in 0..self.cfg.optimizer_steps {
            sleep_ms(self.cfg.simulated.step_ms);
            let mut per_sample = Vec::new();
            let (mut clipped, mut tokens) = (0u64, 0u64);
            for g in &batch.groups {
                for (traj, advs) in g.group.trajectories.iter().zip(&g.advantages) {
                    for (turn, adv) in traj.iter().zip(advs) {
                        let losses: Vec<f64> = turn
                            .behaviour_logprobs
                            .iter()
                            .enumerate()
                            .map(|(i, &lp)| {
                                let drift =
                                    0.05 * (((i as u64 + step as u64) % 7) as f64 - 3.0) / 3.0;
                                let l =
                                    rl::clipped_surrogate(lp as f64 + drift, lp as f64, *adv, clip);
                                clipped += l.clipped as u64;
                                l.loss
                            })
                            .collect();
                        tokens += losses.len() as u64;
                        per_sample.push(losses);
                    }
                }
            }
            stats.loss +=
                rl::drgrpo_loss(&per_sample, self.max_tokens) / self.cfg.optimizer_steps as f64;
            stats.clip_fraction = clipped as f64 / tokens.max(1) as f64;
            stats.tokens = tokens;
            stats.samples = per_sample.len() as u64;
            stats.optimizer_steps += 1;
        }
        self.version += 1;
        Ok(stats)
    }

    fn weights(&self) -> Weights {
        Weights {
            version: self.version,
            payload: Arc::new(()),
        }
    }

    fn save(&self, dir: &Path) -> Result<(), LearnerError> {
        let path = dir.join("learner.json");
        std::fs::write(
            &path,
            format!("{{\"kind\":\"simulated\",\"version\":{}}}\n", self.version),
        )
        .map_err(|e| LearnerError::Checkpoint {
            learner: "simulated".into(),
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    }

    fn load(&mut self, dir: &Path) -> Result<(), LearnerError> {
        let path = dir.join("learner.json");
        let fail = |reason: String| LearnerError::Checkpoint {
            learner: "simulated".into(),
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
        self.version = v["version"]
            .as_u64()
            .ok_or_else(|| fail("no version".into()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimEnvSection;
    use crate::env::sim::SimEnv;
    use crate::env::KernelEnv;
    use crate::outcome::Outcome;

    #[test]
    fn simulated_policy_and_env_round_trip() {
        let mut p = SimPolicy::new(SimPolicySection {
            batch_ms: 0.0,
            token_ms: 0.0,
            ..Default::default()
        });
        let out = p
            .generate(
                &[GenRequest {
                    id: 7,
                    prompt: "task".into(),
                    seed: 1,
                }],
                &SamplingSection::default(),
            )
            .unwrap();
        assert_eq!(out[0].id, 7);
        assert_eq!(out[0].token_ids.len(), out[0].logprobs.len());
        let env = SimEnv::new(SimEnvSection {
            compile_ms: 0.0,
            verify_ms: 0.0,
            profile_ms: 0.0,
            p_compile_error: 0.0,
            p_wrong: 0.0,
            p_crash: 0.0,
            ..Default::default()
        });
        let source = out[0]
            .text
            .split("```cuda\n")
            .nth(1)
            .unwrap()
            .split("```")
            .next()
            .unwrap();
        let c = env.compile("t", source).unwrap();
        env.verify(&c).unwrap();
        let o = env.profile(&c);
        assert!(o.is_correct() && o.feedback().contains("simulated timing"));
        assert!(matches!(
            env.compile("t", "__global__ void k(){}"),
            Err(Outcome::CompileError { .. })
        ));
    }
}
