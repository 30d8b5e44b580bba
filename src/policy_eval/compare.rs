//! Whether one checkpoint is better than another on the held-out split, by issue 19's rule: a
//! figure is *up* when its mean over paired evaluations rose by more than twice the spread
//! between evaluations of the same checkpoint, *down* when it fell by as much, else *level*.
//!
//! Each side is a set of `kevin eval --checkpoint --json` files of one checkpoint, one per
//! sampling seed. They are paired by seed (the same seed draws the same random numbers for both
//! checkpoints, so a paired difference carries less sampling noise than two independent means);
//! both sides must have the same seeds, K, N and tasks, or the comparison names the file that
//! differs. The spread of a figure is the larger of the two checkpoints' ranges (max - min over
//! their evaluations); with one evaluation a side it is unknown and no figure is called up or
//! down.
//!
//! The verdict on the policy: *better* when avg@K or the mean speedup (best@K) is up and neither
//! is down; *worse* when one is down and neither is up; else *not shown*.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// What one `kevin eval --checkpoint --json` file says, as far as the comparison needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The file.
    pub path: PathBuf,
    /// The checkpoint's path as the file records it (`checkpoint.path`), when it does.
    pub checkpoint: Option<String>,
    /// Base sampling seed.
    pub seed: u64,
    /// K.
    pub samples: u64,
    /// N.
    pub turns: u64,
    /// The tasks evaluated.
    pub tasks: BTreeSet<String>,
    /// Each compared figure's value, in [`FIGURES`] order (`None`: not in the file).
    pub values: Vec<Option<f64>>,
}

/// A compared figure: its label, where it is in the JSON summary, and whether lower is better.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// Label in the table.
    pub label: &'static str,
    /// Key in the file's `summary`.
    pub key: &'static str,
    /// Index into the value when the key holds a list (turn 1 of `turn_correct`).
    pub index: Option<usize>,
    /// Whether a fall is the improvement (format errors).
    pub lower_is_better: bool,
}

/// The figures compared, the two of the verdict first.
pub const FIGURES: [Figure; 7] = [
    Figure {
        label: "avg@K",
        key: "avg_at_k",
        index: None,
        lower_is_better: false,
    },
    Figure {
        label: "mean speedup (best@K)",
        key: "mean_speedup",
        index: None,
        lower_is_better: false,
    },
    Figure {
        label: "best@K",
        key: "best_at_k",
        index: None,
        lower_is_better: false,
    },
    Figure {
        label: "turn 1 correct",
        key: "turn_correct",
        index: Some(0),
        lower_is_better: false,
    },
    Figure {
        label: "mean speedup (per trajectory)",
        key: "mean_avg_speedup",
        index: None,
        lower_is_better: false,
    },
    Figure {
        label: "format errors",
        key: "format_error_rate",
        index: None,
        lower_is_better: true,
    },
    Figure {
        label: "repeated kernels",
        key: "repeat_rate",
        index: None,
        lower_is_better: true,
    },
];

/// Why two sets of evaluations cannot be compared.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CompareError {
    /// A file could not be read or is not an evaluation's JSON.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A side has no file.
    #[error("no evaluation given for the {0} checkpoint")]
    Empty(&'static str),
    /// The two sides do not pair up.
    #[error("{path}: {what}")]
    Unpaired {
        /// The file that does not pair.
        path: PathBuf,
        /// How.
        what: String,
    },
}

/// `path` read as the JSON of `kevin eval --checkpoint --json`, and the error maker naming it.
fn read_eval_json(
    path: &Path,
) -> Result<(serde_json::Value, impl Fn(String) -> CompareError + '_), CompareError> {
    let bad = move |what: String| CompareError::File {
        path: path.to_path_buf(),
        what,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    is_eval_json(&v).map_err(&bad)?;
    Ok((v, bad))
}

/// Whether `v` is the JSON of `kevin eval --checkpoint` (by its "command" field).
fn is_eval_json(v: &serde_json::Value) -> Result<(), String> {
    if v["command"] == "kevin eval --checkpoint" {
        Ok(())
    } else {
        Err("not the JSON of `kevin eval --checkpoint` (its \"command\" field differs)".into())
    }
}

/// Each task's share of correct turns in one `kevin eval --checkpoint --json` file (the mean of
/// its `turn_correct`: every trajectory has the same turns), for `tasks.prior`.
pub fn task_correct_rates(path: &Path) -> Result<BTreeMap<String, f64>, CompareError> {
    let (v, bad) = read_eval_json(path)?;
    let tasks = v["tasks"]
        .as_array()
        .ok_or_else(|| bad("no \"tasks\" list".into()))?;
    let mut rates = BTreeMap::new();
    for t in tasks {
        let name = t["task"]
            .as_str()
            .ok_or_else(|| bad("a task without a \"task\" name".into()))?;
        let per_turn = t["turn_correct"]
            .as_array()
            .filter(|a| !a.is_empty())
            .and_then(|a| a.iter().map(|x| x.as_f64()).collect::<Option<Vec<f64>>>())
            .ok_or_else(|| bad(format!("task {name}: no \"turn_correct\" list of numbers")))?;
        let rate = per_turn.iter().sum::<f64>() / per_turn.len() as f64;
        rates.insert(name.to_string(), rate);
    }
    Ok(rates)
}

impl Evaluation {
    /// Reads one `kevin eval --checkpoint --json` file.
    pub fn read(path: &Path) -> Result<Evaluation, CompareError> {
        let (v, bad) = read_eval_json(path)?;
        Evaluation::from_json(path, &v).map_err(bad)
    }

    /// The evaluation in `v`, the JSON of `path`.
    pub fn from_json(path: &Path, v: &serde_json::Value) -> Result<Evaluation, String> {
        is_eval_json(v)?;
        let int = |key: &str| {
            v[key]
                .as_u64()
                .ok_or_else(|| format!("no whole number \"{key}\""))
        };
        let summary = v["summary"]
            .as_object()
            .ok_or("no \"summary\" object".to_string())?;
        let tasks = v["tasks"]
            .as_array()
            .ok_or("no \"tasks\" list".to_string())?
            .iter()
            .map(|t| {
                t["task"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or("a task without a \"task\" name".to_string())
            })
            .collect::<Result<BTreeSet<_>, _>>()?;
        let values = FIGURES
            .iter()
            .map(|f| {
                let x = summary.get(f.key)?;
                let x = match f.index {
                    Some(i) => x.get(i)?,
                    None => x,
                };
                x.as_f64()
            })
            .collect();
        Ok(Evaluation {
            path: path.to_path_buf(),
            checkpoint: v["checkpoint"]["path"].as_str().map(str::to_string),
            seed: int("seed")?,
            samples: int("samples")?,
            turns: int("turns")?,
            tasks,
            values,
        })
    }
}

/// Up, down or level by the rule of the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Better by more than twice the spread.
    Up,
    /// Worse by more than twice the spread.
    Down,
    /// Neither.
    Level,
    /// No spread known (one evaluation a side) or the figure missing from a file.
    Unknown,
}

/// One figure compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FigureComparison {
    /// The figure's label.
    pub figure: &'static str,
    /// Per seed (in seed order): the base checkpoint's value.
    pub base: Vec<f64>,
    /// Per seed: the new checkpoint's value.
    pub new: Vec<f64>,
    /// Mean of `base`.
    pub base_mean: f64,
    /// Mean of `new`.
    pub new_mean: f64,
    /// `new_mean - base_mean` (the mean of the paired differences).
    pub difference: f64,
    /// Seeds on which the new checkpoint was better, worse (ties count in neither).
    pub better_on: usize,
    /// Seeds on which it was worse.
    pub worse_on: usize,
    /// The larger of the two sides' ranges (`None` with one evaluation a side).
    pub spread: Option<f64>,
    /// The figure's change.
    pub change: Change,
}

/// The verdict on the new checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// avg@K or the mean speedup up, neither down.
    Better,
    /// One of them down, neither up.
    Worse,
    /// Anything else.
    NotShown,
}

/// The comparison of two checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The seeds paired, in order.
    pub seeds: Vec<u64>,
    /// K and N.
    pub samples: u64,
    /// N.
    pub turns: u64,
    /// Tasks evaluated.
    pub tasks: usize,
    /// The base checkpoint, as its first file records it.
    pub base_checkpoint: Option<String>,
    /// The new checkpoint.
    pub new_checkpoint: Option<String>,
    /// Every figure of [`FIGURES`].
    pub figures: Vec<FigureComparison>,
    /// The verdict.
    pub verdict: Verdict,
}

/// Pairs `base` and `new` by seed and compares them (see the module docs).
pub fn compare(base: &[Evaluation], new: &[Evaluation]) -> Result<Comparison, CompareError> {
    let first = base.first().ok_or(CompareError::Empty("base"))?;
    if new.is_empty() {
        return Err(CompareError::Empty("new"));
    }
    let unpaired = |e: &Evaluation, what: String| CompareError::Unpaired {
        path: e.path.clone(),
        what,
    };
    for e in base.iter().chain(new) {
        if (e.samples, e.turns) != (first.samples, first.turns) {
            return Err(unpaired(
                e,
                format!(
                    "{} x {} where {} has {} x {}: compare evaluations of the same K and N",
                    e.samples,
                    e.turns,
                    first.path.display(),
                    first.samples,
                    first.turns
                ),
            ));
        }
        if e.tasks != first.tasks {
            let only: Vec<&String> = e.tasks.symmetric_difference(&first.tasks).collect();
            return Err(unpaired(
                e,
                format!(
                    "its tasks differ from those of {} (in one only: {})",
                    first.path.display(),
                    only.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    let (b, n) = (by_seed(base, "base")?, by_seed(new, "new")?);
    for (side, other, other_name) in [(&b, &n, "new"), (&n, &b, "base")] {
        if let Some((seed, e)) = side.iter().find(|(s, _)| !other.contains_key(s)) {
            return Err(unpaired(
                e,
                format!(
                    "seed {seed} has no evaluation of the {other_name} checkpoint to pair with"
                ),
            ));
        }
    }
    let seeds: Vec<u64> = b.keys().copied().collect();
    let figures: Vec<FigureComparison> = FIGURES
        .iter()
        .enumerate()
        .map(|(i, f)| compare_figure(f, seeds.iter().map(|s| (b[s], n[s])), i))
        .collect();
    let change = |i: usize| figures[i].change;
    let headline = [change(0), change(1)];
    let verdict = if headline.contains(&Change::Up) && !headline.contains(&Change::Down) {
        Verdict::Better
    } else if headline.contains(&Change::Down) && !headline.contains(&Change::Up) {
        Verdict::Worse
    } else {
        Verdict::NotShown
    };
    Ok(Comparison {
        seeds,
        samples: first.samples,
        turns: first.turns,
        tasks: first.tasks.len(),
        base_checkpoint: first.checkpoint.clone(),
        new_checkpoint: new[0].checkpoint.clone(),
        figures,
        verdict,
    })
}

/// `side`'s evaluations by seed; a seed given twice is an error.
fn by_seed<'a>(
    side: &'a [Evaluation],
    name: &str,
) -> Result<std::collections::BTreeMap<u64, &'a Evaluation>, CompareError> {
    let mut seeds = std::collections::BTreeMap::new();
    for e in side {
        if let Some(other) = seeds.insert(e.seed, e) {
            return Err(CompareError::Unpaired {
                path: e.path.clone(),
                what: format!(
                    "seed {} again (also {}) among the {name} checkpoint's evaluations",
                    e.seed,
                    other.path.display()
                ),
            });
        }
    }
    Ok(seeds)
}

fn compare_figure<'a>(
    f: &Figure,
    pairs: impl Iterator<Item = (&'a Evaluation, &'a Evaluation)>,
    i: usize,
) -> FigureComparison {
    let (mut base, mut new, mut missing) = (Vec::new(), Vec::new(), false);
    for (b, n) in pairs {
        match (b.values[i], n.values[i]) {
            (Some(x), Some(y)) => {
                base.push(x);
                new.push(y);
            }
            _ => missing = true,
        }
    }
    let mean = |v: &[f64]| super::mean(v.iter().copied());
    let range = |v: &[f64]| {
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            - v.iter().copied().fold(f64::INFINITY, f64::min)
    };
    let sign = if f.lower_is_better { -1.0 } else { 1.0 };
    let gains: Vec<f64> = base.iter().zip(&new).map(|(b, n)| sign * (n - b)).collect();
    let (base_mean, new_mean) = (mean(&base), mean(&new));
    let spread = (base.len() >= 2 && !missing).then(|| range(&base).max(range(&new)));
    let gain = sign * (new_mean - base_mean);
    let change = match spread {
        None => Change::Unknown,
        Some(s) if gain > 2.0 * s => Change::Up,
        Some(s) if gain < -2.0 * s => Change::Down,
        Some(_) => Change::Level,
    };
    FigureComparison {
        figure: f.label,
        better_on: gains.iter().filter(|g| **g > 0.0).count(),
        worse_on: gains.iter().filter(|g| **g < 0.0).count(),
        base,
        new,
        base_mean,
        new_mean,
        difference: new_mean - base_mean,
        spread,
        change,
    }
}

/// The comparison as the terminal shows it: a line per figure, then the verdict.
pub fn render(c: &Comparison) -> String {
    let seeds: Vec<String> = c.seeds.iter().map(u64::to_string).collect();
    let mut out = format!(
        "{} tasks x {} trajectories x {} turns, paired on seeds {}\nbase: {}\nnew:  {}\n\n",
        c.tasks,
        c.samples,
        c.turns,
        seeds.join(", "),
        c.base_checkpoint.as_deref().unwrap_or("?"),
        c.new_checkpoint.as_deref().unwrap_or("?"),
    );
    let w = FIGURES.iter().map(|f| f.label.len()).max().unwrap_or(0);
    out += &format!(
        "{:w$}  {:>8}  {:>8}  {:>8}  {:>7}  {:>9}  change  per seed (base -> new)\n",
        "figure", "base", "new", "diff", "spread", "better on"
    );
    for f in &c.figures {
        if f.base.is_empty() {
            out += &format!("{:w$}  not recorded in every file\n", f.figure);
            continue;
        }
        let per_seed: Vec<String> = f
            .base
            .iter()
            .zip(&f.new)
            .map(|(b, n)| format!("{b:.3}->{n:.3}"))
            .collect();
        out += &format!(
            "{:w$}  {:>8.3}  {:>8.3}  {:>+8.3}  {:>7}  {:>5} of {}  {:<6}  {}\n",
            f.figure,
            f.base_mean,
            f.new_mean,
            f.difference,
            f.spread.map_or("-".to_string(), |s| format!("{s:.3}")),
            f.better_on,
            f.base.len(),
            match f.change {
                Change::Up => "up",
                Change::Down => "down",
                Change::Level => "level",
                Change::Unknown => "?",
            },
            per_seed.join(" "),
        );
    }
    out += &format!(
        "\nverdict: {} (a figure is up or down when its mean moved by more than twice the spread \
         between evaluations of one checkpoint{})\n",
        match c.verdict {
            Verdict::Better => "better: avg@K or the mean speedup is up, neither is down",
            Verdict::Worse => "worse: avg@K or the mean speedup is down, neither is up",
            Verdict::NotShown => "no change shown in avg@K or the mean speedup",
        },
        if c.seeds.len() < 2 {
            "; with one seed the spread is unknown: evaluate on two or more"
        } else {
            ""
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(name: &str, seed: u64, avg: f64, speed: f64) -> Evaluation {
        let v = serde_json::json!({
            "command": "kevin eval --checkpoint",
            "checkpoint": {"path": format!("models/{name}")},
            "seed": seed, "samples": 16, "turns": 8,
            "tasks": [{"task": "elu"}, {"task": "tanh"}],
            "summary": {
                "avg_at_k": avg, "mean_speedup": speed, "best_at_k": 0.5,
                "turn_correct": [avg / 2.0, avg], "mean_avg_speedup": speed / 2.0,
                "format_error_rate": 0.1,
            },
        });
        Evaluation::from_json(Path::new(&format!("{name}-s{seed}.json")), &v).unwrap()
    }

    #[test]
    fn a_gain_beyond_twice_the_spread_is_up_and_makes_the_policy_better() {
        let base = [eval("a", 0, 0.50, 0.30), eval("a", 1, 0.52, 0.31)];
        // avg@K: spread max(0.02, 0.01) = 0.02, gain 0.105 > 0.04: up. Speedup: spread 0.01,
        // gain 0.005: level.
        let new = [eval("b", 1, 0.63, 0.315), eval("b", 0, 0.62, 0.305)];
        let c = compare(&base, &new).unwrap();
        assert_eq!(c.seeds, [0, 1]);
        let avg = &c.figures[0];
        assert_eq!(
            (avg.base.clone(), avg.new.clone()),
            (vec![0.50, 0.52], vec![0.62, 0.63])
        );
        assert!((avg.spread.unwrap() - 0.02).abs() < 1e-12);
        assert!((avg.difference - 0.115).abs() < 1e-12);
        assert_eq!(
            (avg.change, avg.better_on, avg.worse_on),
            (Change::Up, 2, 0)
        );
        assert_eq!(c.figures[1].change, Change::Level);
        // best@K and format errors equal on both: level, better on no seed.
        assert_eq!(
            (c.figures[2].change, c.figures[2].better_on),
            (Change::Level, 0)
        );
        // repeat_rate is not in these files: unknown, not zero.
        assert_eq!(c.figures[6].change, Change::Unknown);
        assert!(c.figures[6].base.is_empty());
        assert_eq!(c.verdict, Verdict::Better);
        let text = render(&c);
        assert!(text.contains("verdict: better"), "{text}");
        assert!(text.contains("0.500->0.620 0.520->0.630"), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with("repeated kernels")
                && l.ends_with("  not recorded in every file")),
            "{text}"
        );
    }

    #[test]
    fn a_gain_within_the_spread_shows_nothing_and_a_fall_is_worse() {
        let base = [eval("a", 0, 0.59, 0.37), eval("a", 1, 0.53, 0.37)];
        let new = [eval("b", 0, 0.62, 0.37), eval("b", 1, 0.55, 0.37)];
        assert_eq!(compare(&base, &new).unwrap().verdict, Verdict::NotShown);
        let worse = [eval("b", 0, 0.40, 0.37), eval("b", 1, 0.38, 0.37)];
        let c = compare(&base, &worse).unwrap();
        assert_eq!(
            (c.figures[0].change, c.verdict),
            (Change::Down, Verdict::Worse)
        );
        // Lower format errors are the improvement.
        assert!(!FIGURES[0].lower_is_better && FIGURES[5].lower_is_better);
    }

    #[test]
    fn one_seed_a_side_has_no_spread_and_no_verdict() {
        let c = compare(&[eval("a", 0, 0.2, 0.1)], &[eval("b", 0, 0.9, 0.9)]).unwrap();
        assert!(c.figures.iter().all(|f| f.change == Change::Unknown));
        assert_eq!(c.verdict, Verdict::NotShown);
        assert!(render(&c).contains("the spread is unknown"));
    }

    #[test]
    fn evaluations_that_do_not_pair_are_named() {
        let base = [eval("a", 0, 0.5, 0.3), eval("a", 1, 0.5, 0.3)];
        let err = compare(&base, &[eval("b", 0, 0.5, 0.3), eval("b", 2, 0.5, 0.3)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a-s1.json: seed 1 has no evaluation of the new checkpoint to pair with"
        );
        let err = compare(&base, &[eval("b", 0, 0.5, 0.3), eval("b", 0, 0.5, 0.3)]).unwrap_err();
        assert!(err.to_string().contains("seed 0 again"), "{err}");
        let mut other = eval("b", 0, 0.5, 0.3);
        other.turns = 4;
        let err = compare(&base, &[other]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("b-s0.json: 16 x 4 where a-s0.json has 16 x 8"),
            "{err}"
        );
        let mut other = eval("b", 0, 0.5, 0.3);
        other.tasks.insert("relu".into());
        let err = compare(&base, &[other]).unwrap_err();
        assert!(err.to_string().contains("in one only: relu"), "{err}");
        assert_eq!(
            compare(&[], &base).unwrap_err(),
            CompareError::Empty("base")
        );
        let not_eval =
            Evaluation::from_json(Path::new("x.json"), &serde_json::json!({"summary": {}}));
        assert!(not_eval
            .unwrap_err()
            .contains("not the JSON of `kevin eval --checkpoint`"));
    }
}
