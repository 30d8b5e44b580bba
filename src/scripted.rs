//! A scripted policy: a test double, not a model.
//!
//! [`ScriptedPolicy`] answers every prompt with the text a script chooses from the task the
//! prompt asks for (its `# Task:` header) and the turn (how many earlier attempts it shows), so
//! a test of code that drives a [`Policy`] (the rollout, `kevin eval --checkpoint`) knows the
//! exact response behind every turn: a reference solution on turn 2 and garbage on turn 1 gives
//! per-turn correctness 0 then 1, whatever the batching. It describes itself as scripted; it is
//! never selected by a config.

use crate::config::SamplingSection;
use crate::policy::{Completion, FinishReason, GenRequest, Policy, PolicyError, Weights};
use crate::prompt;

/// The script: (task name, 0-based turn) -> response text. The task is "" when the prompt has
/// no `# Task:` header.
pub type Script = Box<dyn FnMut(&str, u32) -> String + Send>;

/// A policy whose responses a script writes. Its response tokens are one id per
/// whitespace-separated word (each with log-probability -1), so token counts are exact too.
pub struct ScriptedPolicy {
    script: Script,
    version: u64,
    batches: Vec<usize>,
    prompts: Vec<String>,
}

impl ScriptedPolicy {
    /// A policy that answers with `script(task, turn)`.
    pub fn new(script: impl FnMut(&str, u32) -> String + Send + 'static) -> Self {
        ScriptedPolicy {
            script: Box::new(script),
            version: 0,
            batches: Vec::new(),
            prompts: Vec::new(),
        }
    }

    /// The size of every batch `generate` was called with, in order.
    pub fn batch_sizes(&self) -> &[usize] {
        &self.batches
    }

    /// Every prompt it was asked, in order.
    pub fn prompts(&self) -> &[String] {
        &self.prompts
    }
}

impl Policy for ScriptedPolicy {
    fn describe(&self) -> String {
        "scripted policy (a test double: a script writes every response)".into()
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn generate(
        &mut self,
        batch: &[GenRequest],
        _sampling: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError> {
        self.batches.push(batch.len());
        Ok(batch
            .iter()
            .map(|req| {
                self.prompts.push(req.prompt.clone());
                let task = prompt::task_of(&req.prompt).unwrap_or("");
                let text = (self.script)(task, prompt::turn_of(&req.prompt));
                let words = text.split_whitespace().count();
                Completion {
                    id: req.id,
                    token_ids: (0..words as u32).collect(),
                    logprobs: vec![-1.0; words],
                    text,
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
