//! The warm start's validation split: whole *forms* held out, so validation loss measures how
//! well the model writes a kind of kernel (or repairs a kind of breakage) it never saw written.
//!
//! Holding out random examples would leave the same form on other tasks in training, and the
//! validation loss would mostly measure memorisation of near-copies. Held-out *tasks* are not
//! needed here: the corpus never contains any (see [`super::train_tasks`]).
//!
//! Forms are ordered by a stable hash of the seed and the form's name and taken into validation
//! until they hold the asked fraction of examples; a form that would overshoot the target by
//! more than half is skipped. The `reference` form (the first-turn answer of every task: the one
//! example every task has) is never held out.

use std::collections::BTreeMap;

use super::{fnv, Example};

/// Forms that always train.
pub const ALWAYS_TRAINED: &[&str] = &["reference"];

/// Which examples train and which validate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FormSplit {
    /// Indices of training examples, in corpus order.
    pub train: Vec<usize>,
    /// Indices of validation examples, in corpus order.
    pub validation: Vec<usize>,
    /// The held-out forms, sorted.
    pub held_out_forms: Vec<String>,
}

/// Splits `examples` by form, about `fraction` of them into validation (0: none).
pub fn split_by_form(examples: &[Example], fraction: f64, seed: u64) -> FormSplit {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in examples {
        *counts.entry(e.form.as_str()).or_default() += 1;
    }
    let target = (fraction.clamp(0.0, 1.0) * examples.len() as f64).round() as usize;
    let limit = target + target / 2;
    let mut forms: Vec<(&str, usize)> = counts
        .into_iter()
        .filter(|(f, _)| !ALWAYS_TRAINED.contains(f))
        .collect();
    forms.sort_by_key(|(f, _)| (fnv(&format!("{seed}:{f}")), *f));
    let mut held: Vec<&str> = Vec::new();
    let mut held_count = 0;
    for (form, count) in &forms {
        if held_count >= target {
            break;
        }
        if held_count + count <= limit && held_count + count < examples.len() {
            held.push(form);
            held_count += count;
        }
    }
    let mut split = FormSplit::default();
    for (i, e) in examples.iter().enumerate() {
        if held.contains(&e.form.as_str()) {
            split.validation.push(i);
        } else {
            split.train.push(i);
        }
    }
    split.held_out_forms = held.iter().map(|f| f.to_string()).collect();
    split.held_out_forms.sort();
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
            let split = split_by_form(&examples, 0.1, seed);
            assert_eq!(split.train.len() + split.validation.len(), examples.len());
            // 10% of 200 is one form of 20 examples.
            assert_eq!(split.validation.len(), 20, "seed {seed}");
            assert_eq!(split.held_out_forms.len(), 1);
            assert!(!split.held_out_forms.contains(&"reference".to_string()));
            for &i in &split.train {
                assert!(!split.held_out_forms.contains(&examples[i].form));
            }
            for &i in &split.validation {
                assert!(split.held_out_forms.contains(&examples[i].form));
            }
            assert_eq!(split, split_by_form(&examples, 0.1, seed), "stable");
        }
        let chosen: std::collections::BTreeSet<_> = (0..20)
            .map(|s| split_by_form(&examples, 0.1, s).held_out_forms)
            .collect();
        assert!(chosen.len() > 1, "the seed changes the held-out form");
    }

    #[test]
    fn no_validation_at_fraction_zero_and_never_everything() {
        let examples = corpus();
        let none = split_by_form(&examples, 0.0, 3);
        assert!(none.validation.is_empty() && none.held_out_forms.is_empty());
        assert_eq!(none.train.len(), examples.len());
        let all = split_by_form(&examples, 1.0, 3);
        assert!(all.train.len() >= 20, "the reference form always trains");
        let one_form: Vec<Example> = (0..5).map(|t| example(&format!("t{t}"), "a")).collect();
        assert_eq!(split_by_form(&one_form, 0.5, 0).train.len(), 5);
    }
}
