//! Task sampling: which task the next group works on.
//!
//! Tasks are weighted by how informative their groups are likely to be. GRPO learns nothing from
//! a group whose turns all score alike (all advantages are zero), so a task that is always solved
//! or never solved is sampled less: the weight is `floor + 4 p (1 - p)` where p is a moving
//! average of the task's recent correctness (starting at 0.5). Only the train split is ever
//! sampled. The state (averages, random stream, group counter) is checkpointed. The floor is
//! `tasks.floor`; a prior (`tasks.prior`: an evaluation of the starting policy) sets the averages
//! of the tasks it covers at a fresh start ([`TaskSampler::set_prior`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

/// Weight of a task whose groups carry no signal: small, never zero, so every task is revisited.
pub const FLOOR_WEIGHT: f64 = 0.1;
/// Weight of the newest observation in a task's moving average.
pub const EMA_ALPHA: f64 = 0.3;

/// What survives a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Moving average of correctness per task.
    pub success: BTreeMap<String, f64>,
    /// Groups sampled per task.
    pub sampled: BTreeMap<String, u64>,
    /// The random stream.
    pub rng: SplitMix64,
    /// Id of the next group.
    pub next_group_id: u64,
}

/// The sampler.
#[derive(Debug, Clone)]
pub struct TaskSampler {
    tasks: Vec<String>,
    state: SamplerState,
    floor: f64,
}

impl TaskSampler {
    /// A sampler over the train-split task names `tasks` (non-empty).
    pub fn new(tasks: Vec<String>, seed: u64) -> Self {
        TaskSampler {
            tasks,
            state: SamplerState {
                success: BTreeMap::new(),
                sampled: BTreeMap::new(),
                rng: SplitMix64::derive(seed, 1),
                next_group_id: 0,
            },
            floor: FLOOR_WEIGHT,
        }
    }

    /// The weight of a task without signal (`tasks.floor`; [`FLOOR_WEIGHT`] by default), above
    /// zero.
    pub fn with_floor(mut self, floor: f64) -> Self {
        debug_assert!(floor > 0.0);
        self.floor = floor;
        self
    }

    /// Starts the average of every sampled task that `rates` names (task -> share of correct
    /// turns, clamped to [0, 1]) at its rate; other names are ignored. Returns how many tasks it
    /// set. Call before the first pick of a fresh run; a restored state replaces it.
    pub fn set_prior(&mut self, rates: &BTreeMap<String, f64>) -> usize {
        let mut set = 0;
        for t in &self.tasks {
            if let Some(&p) = rates.get(t) {
                self.state.success.insert(t.clone(), p.clamp(0.0, 1.0));
                set += 1;
            }
        }
        set
    }

    /// Restores a checkpointed state (tasks no longer in the suite are forgotten).
    pub fn restore(&mut self, mut state: SamplerState) {
        state.success.retain(|t, _| self.tasks.contains(t));
        state.sampled.retain(|t, _| self.tasks.contains(t));
        self.state = state;
    }

    /// The state to checkpoint.
    pub fn state(&self) -> &SamplerState {
        &self.state
    }

    /// The current weight of `task`.
    pub fn weight(&self, task: &str) -> f64 {
        let p = self.state.success.get(task).copied().unwrap_or(0.5);
        self.floor + 4.0 * p * (1.0 - p)
    }

    /// Picks the next group's task; returns (task name, group id).
    pub fn pick(&mut self) -> (String, u64) {
        let weights: Vec<f64> = self.tasks.iter().map(|t| self.weight(t)).collect();
        let i = self.state.rng.weighted(&weights);
        let task = self.tasks[i].clone();
        *self.state.sampled.entry(task.clone()).or_default() += 1;
        let id = self.state.next_group_id;
        self.state.next_group_id += 1;
        (task, id)
    }

    /// Folds a finished group's correctness rate into its task's average.
    pub fn feedback(&mut self, task: &str, correct_rate: f64) {
        if !self.tasks.iter().any(|t| t == task) {
            return;
        }
        let p = self.state.success.entry(task.to_string()).or_insert(0.5);
        *p = (1.0 - EMA_ALPHA) * *p + EMA_ALPHA * correct_rate.clamp(0.0, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn informative_tasks_are_preferred() {
        let mut s = TaskSampler::new(vec!["easy".into(), "mixed".into(), "hard".into()], 3);
        for _ in 0..20 {
            s.feedback("easy", 1.0);
            s.feedback("mixed", 0.5);
            s.feedback("hard", 0.0);
            s.feedback("unknown", 1.0);
        }
        assert!(s.weight("mixed") > 1.0);
        assert!(s.weight("easy") < 0.2 && s.weight("hard") < 0.2);
        let mut counts = BTreeMap::new();
        for _ in 0..3000 {
            *counts.entry(s.pick().0).or_insert(0) += 1;
        }
        assert!(counts["mixed"] > 5 * counts["easy"], "{counts:?}");
        assert!(counts["hard"] > 0, "no task is starved");
        assert_eq!(s.state().next_group_id, 3000);
    }

    #[test]
    fn a_prior_steers_the_first_picks_to_tasks_with_signal() {
        let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
        // t0 solved half the time; t1..t8 never; t9 absent from the prior (0.5 then).
        let rates: BTreeMap<String, f64> = names[..9]
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), if i == 0 { 0.5 } else { 0.0 }))
            .chain([("not-a-task".to_string(), 1.0)])
            .collect();
        let mut s = TaskSampler::new(names.clone(), 5).with_floor(0.01);
        assert_eq!(s.set_prior(&rates), 9);
        assert!((s.weight("t0") - 1.01).abs() < 1e-12 && (s.weight("t9") - 1.01).abs() < 1e-12);
        assert!((s.weight("t3") - 0.01).abs() < 1e-12);
        let mut counts = BTreeMap::new();
        for _ in 0..2000 {
            *counts.entry(s.pick().0).or_insert(0) += 1;
        }
        let signal = counts["t0"] + counts["t9"];
        assert!(signal > 1800, "{counts:?}");
        // The same sampler without a prior spreads its picks evenly.
        let mut flat = TaskSampler::new(names, 5);
        let mut c = BTreeMap::new();
        for _ in 0..2000 {
            *c.entry(flat.pick().0).or_insert(0) += 1;
        }
        assert!(c["t0"] + c["t9"] < 600, "{c:?}");
    }

    #[test]
    fn state_round_trips() {
        let mut a = TaskSampler::new(vec!["x".into(), "y".into()], 9);
        a.pick();
        a.feedback("x", 1.0);
        let saved = serde_json::to_string(a.state()).unwrap();
        let mut b = TaskSampler::new(vec!["x".into(), "y".into()], 0);
        b.restore(serde_json::from_str(&saved).unwrap());
        for _ in 0..10 {
            assert_eq!(a.pick(), b.pick());
        }
    }
}
