//! The warm start's validation split: whole *tasks* (the default) or whole *forms* held out.
//!
//! Holding out random examples would leave the same task and form in training on other examples,
//! and the validation loss would mostly measure memorisation of near-copies. By task (every
//! example of a program: its reference answer, its variants, its repairs), validation loss
//! measures what the held-out evaluation asks: writing kernels for programs never seen. By form,
//! it measures how well the model writes a kind of kernel (or repairs a kind of breakage) it
//! never saw written. The suite's held-out tasks are never in a corpus (see
//! [`super::train_tasks`]): these are training tasks set aside.
//!
//! Tasks (forms) are ordered by a stable hash of the seed and their name and taken into
//! validation until they hold the asked fraction of examples; one that would overshoot the
//! target by more than half is skipped. By form, the `reference` form (the first-turn answer of
//! every task: the one example every task has) is never held out.

use std::collections::BTreeMap;

use super::{fnv, Example};

/// Forms that always train.
pub const ALWAYS_TRAINED: &[&str] = &["reference"];

/// What a validation split holds out whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitBy {
    /// Whole tasks (programs): the default since 2026-12-06.
    #[default]
    Task,
    /// Whole forms (kinds of kernel, kinds of breakage): the split of before.
    Form,
}

impl SplitBy {
    /// The name on the command line and in records.
    pub fn name(self) -> &'static str {
        match self {
            SplitBy::Task => "task",
            SplitBy::Form => "form",
        }
    }

    /// The split called `name`.
    pub fn from_name(name: &str) -> Option<SplitBy> {
        [SplitBy::Task, SplitBy::Form]
            .into_iter()
            .find(|b| b.name() == name)
    }
}

/// Which examples train and which validate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CorpusSplit {
    /// What was held out whole.
    pub by: SplitBy,
    /// Indices of training examples, in corpus order.
    pub train: Vec<usize>,
    /// Indices of validation examples, in corpus order.
    pub validation: Vec<usize>,
    /// The held-out tasks or forms, sorted.
    pub held_out: Vec<String>,
}

/// Splits `examples` by task or by form, about `fraction` of them into validation (0: none).
pub fn split(examples: &[Example], by: SplitBy, fraction: f64, seed: u64) -> CorpusSplit {
    let key = |e: &'_ Example| -> String {
        match by {
            SplitBy::Task => e.task.clone(),
            SplitBy::Form => e.form.clone(),
        }
    };
    let always: &[&str] = match by {
        SplitBy::Task => &[],
        SplitBy::Form => ALWAYS_TRAINED,
    };
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for e in examples {
        *counts.entry(key(e)).or_default() += 1;
    }
    let target = (fraction.clamp(0.0, 1.0) * examples.len() as f64).round() as usize;
    let limit = target + target / 2;
    let mut groups: Vec<(String, usize)> = counts
        .into_iter()
        .filter(|(g, _)| !always.contains(&g.as_str()))
        .collect();
    groups.sort_by_key(|(g, _)| (fnv(&format!("{seed}:{g}")), g.clone()));
    let mut held: Vec<String> = Vec::new();
    let mut held_count = 0;
    for (group, count) in groups {
        if held_count >= target {
            break;
        }
        if held_count + count <= limit && held_count + count < examples.len() {
            held.push(group);
            held_count += count;
        }
    }
    held.sort();
    let mut split = CorpusSplit {
        by,
        ..CorpusSplit::default()
    };
    for (i, e) in examples.iter().enumerate() {
        if held.binary_search(&key(e)).is_ok() {
            split.validation.push(i);
        } else {
            split.train.push(i);
        }
    }
    split.held_out = held;
    split
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::{Kind, Turn};

    fn example(task: &str, form: &str) -> Example {
        Example {
            task: task.into(),
            kind: if form == "reference" {
                Kind::FirstTurn
            } else {
                Kind::Variant
            },
            form: form.into(),
            turns: vec![Turn {
                prompt: "p".into(),
                response: "r".into(),
            }],
            outcomes: vec!["correct".into()],
        }
    }

    fn corpus() -> Vec<Example> {
        let forms = ["reference", "a", "b", "c", "d", "e", "f", "g", "h", "i"];
        (0..20)
            .flat_map(|t| forms.iter().map(move |f| example(&format!("task{t}"), f)))
            .collect()
    }

    #[test]
    fn whole_forms_are_held_out_near_the_fraction_and_never_the_reference() {
        let examples = corpus();
        for seed in 0..20 {
            let s = split(&examples, SplitBy::Form, 0.1, seed);
            assert_eq!(s.train.len() + s.validation.len(), examples.len());
            // 10% of 200 is one form of 20 examples.
            assert_eq!(s.validation.len(), 20, "seed {seed}");
            assert_eq!(s.held_out.len(), 1);
            assert!(!s.held_out.contains(&"reference".to_string()));
            for &i in &s.train {
                assert!(!s.held_out.contains(&examples[i].form));
            }
            for &i in &s.validation {
                assert!(s.held_out.contains(&examples[i].form));
            }
            assert_eq!(s, split(&examples, SplitBy::Form, 0.1, seed), "stable");
        }
        let chosen: std::collections::BTreeSet<_> = (0..20)
            .map(|s| split(&examples, SplitBy::Form, 0.1, s).held_out)
            .collect();
        assert!(chosen.len() > 1, "the seed changes the held-out form");
    }

    #[test]
    fn no_validation_at_fraction_zero_and_never_everything() {
        let examples = corpus();
        let none = split(&examples, SplitBy::Form, 0.0, 3);
        assert!(none.validation.is_empty() && none.held_out.is_empty());
        assert_eq!(none.train.len(), examples.len());
        let all = split(&examples, SplitBy::Form, 1.0, 3);
        assert!(all.train.len() >= 20, "the reference form always trains");
        let one_form: Vec<Example> = (0..5).map(|t| example(&format!("t{t}"), "a")).collect();
        assert_eq!(split(&one_form, SplitBy::Form, 0.5, 0).train.len(), 5);
    }

    #[test]
    fn whole_tasks_are_held_out_near_the_fraction_with_every_example_of_them() {
        let examples = corpus();
        for seed in 0..10 {
            let s = split(&examples, SplitBy::Task, 0.1, seed);
            assert_eq!(s.by, SplitBy::Task);
            // 10% of 200 is two tasks of ten examples, the reference answers among them.
            assert_eq!(s.validation.len(), 20, "seed {seed}");
            assert_eq!(s.held_out.len(), 2);
            for &i in &s.validation {
                assert!(s.held_out.contains(&examples[i].task));
            }
            for &i in &s.train {
                assert!(!s.held_out.contains(&examples[i].task));
            }
            assert!(s
                .validation
                .iter()
                .any(|&i| examples[i].form == "reference"));
            assert_eq!(s, split(&examples, SplitBy::Task, 0.1, seed), "stable");
        }
        assert_eq!(SplitBy::default(), SplitBy::Task);
        for b in [SplitBy::Task, SplitBy::Form] {
            assert_eq!(SplitBy::from_name(b.name()), Some(b));
        }
    }
}
