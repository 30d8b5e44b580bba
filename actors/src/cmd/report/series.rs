//! The report's series: what each chart plots, step by step, taken from the metrics records.
//!
//! A value is `None` at a step that did not record it (a batch without a correct turn has no mean
//! speedup; a run without tracing has no busy fractions); the plot leaves a gap there and the
//! window means skip it, rather than drawing a made-up zero.

use kevin::metrics::StepMetrics;

/// The actors of the evaluation pipeline and the learner, always drawn when recorded, in this
/// order. Other tracks (rollout, replay queue, telemetry, ...) are drawn only when busy enough to
/// matter (see [`OTHER_ACTOR_MIN_BUSY`]).
pub const PIPELINE_ACTORS: [&str; 5] = ["Generator", "Compiler", "Verifier", "Profiler", "Learner"];
/// Mean busy fraction above which an actor outside [`PIPELINE_ACTORS`] gets a line too, so an
/// unexpected bottleneck is not hidden, while the near-idle bookkeeping actors do not clutter it.
pub const OTHER_ACTOR_MIN_BUSY: f64 = 0.05;
/// Upper bound of the default window, so a long run compares its first and last 50 steps.
const MAX_DEFAULT_WINDOW: usize = 50;

/// One named value per learner step.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend and summary label.
    pub label: String,
    /// One entry per step of the chart (`None`: not recorded at that step).
    pub values: Vec<Option<f64>>,
}

impl Series {
    fn new(
        label: impl Into<String>,
        steps: &[StepMetrics],
        f: impl Fn(&StepMetrics) -> Option<f64>,
    ) -> Series {
        Series {
            label: label.into(),
            values: steps.iter().map(f).collect(),
        }
    }

    /// Whether any step recorded a value.
    pub fn is_empty(&self) -> bool {
        self.values.iter().all(Option::is_none)
    }

    /// Mean of the recorded values among `values[range]` (`None` when none is recorded there).
    pub fn mean(&self, range: std::ops::Range<usize>) -> Option<f64> {
        let vals: Vec<f64> = self.values[range].iter().flatten().copied().collect();
        (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
    }
}

/// A plotted line, optionally with a band of +- its spread around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// The values.
    pub series: Series,
    /// The spread drawn as a band (`value - spread` to `value + spread`) where recorded.
    pub spread: Option<Series>,
}

/// One PNG: a chart of one or more lines over learner steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// File name in the output folder.
    pub file: &'static str,
    /// Title drawn above the chart.
    pub title: &'static str,
    /// What is plotted, for the summary and warnings.
    pub what: &'static str,
    /// Y-axis description.
    pub y_label: &'static str,
    /// Learner step of each value.
    pub steps: Vec<u64>,
    /// The lines.
    pub lines: Vec<Line>,
    /// The y axis always includes `[0, y_at_least]` (1 for rates and busy fractions).
    pub y_at_least: f64,
}

impl Chart {
    /// Whether no line has a recorded value (the chart is then not drawn).
    pub fn is_empty(&self) -> bool {
        self.lines.iter().all(|l| l.series.is_empty())
    }
}

/// The default window of the summary's first-vs-last comparison: a fifth of the steps, at least
/// one, at most 50.
pub fn default_window(steps: usize) -> usize {
    (steps / 5).clamp(1, MAX_DEFAULT_WINDOW)
}

/// Whether the step trained on anything (a batch of only stale drops has no reward to show).
fn trained(m: &StepMetrics) -> bool {
    m.groups > 0
}

/// Mean version gap of the groups the step trained on.
pub fn staleness_mean(m: &StepMetrics) -> Option<f64> {
    let n: u64 = m.staleness.values().sum();
    (n > 0).then(|| m.staleness.iter().map(|(k, c)| (k * c) as f64).sum::<f64>() / n as f64)
}

/// Largest version gap among the groups the step trained on.
pub fn staleness_max(m: &StepMetrics) -> Option<f64> {
    m.staleness
        .iter()
        .filter(|(_, c)| **c > 0)
        .map(|(k, _)| *k as f64)
        .next_back()
}

/// The actors the utilisation chart draws: [`PIPELINE_ACTORS`] that were recorded, then any
/// other actor whose mean busy fraction exceeds [`OTHER_ACTOR_MIN_BUSY`], by name.
pub fn busy_actors(steps: &[StepMetrics]) -> Vec<String> {
    let mut names: Vec<String> = PIPELINE_ACTORS
        .iter()
        .filter(|a| steps.iter().any(|m| m.busy.contains_key(**a)))
        .map(|a| a.to_string())
        .collect();
    let mut others = std::collections::BTreeMap::<&str, (f64, usize)>::new();
    for m in steps {
        for (name, b) in &m.busy {
            if !PIPELINE_ACTORS.contains(&name.as_str()) {
                let e = others.entry(name).or_default();
                e.0 += b;
                e.1 += 1;
            }
        }
    }
    names.extend(
        others
            .into_iter()
            .filter(|(_, (sum, n))| sum / *n as f64 > OTHER_ACTOR_MIN_BUSY)
            .map(|(name, _)| name.to_string()),
    );
    names
}

/// The seven charts of a report, in summary order (the comparison draws the first four by index).
pub fn charts(steps: &[StepMetrics]) -> Vec<Chart> {
    let xs: Vec<u64> = steps.iter().map(|m| m.step).collect();
    let line = |s: Series| Line {
        series: s,
        spread: None,
    };
    let chart = |file, title, what, y_label, y_at_least, lines| Chart {
        file,
        title,
        what,
        y_label,
        steps: xs.clone(),
        lines,
        y_at_least,
    };
    let reward_std = Series::new("reward std", steps, |m| m.reward_std.filter(|_| trained(m)));
    vec![
        chart(
            "reward.png",
            "Reward",
            "reward",
            if reward_std.is_empty() {
                "turn score (batch mean)"
            } else {
                "turn score (batch mean; band: +-1 std)"
            },
            0.0,
            vec![Line {
                series: Series::new("reward mean", steps, |m| {
                    trained(m).then_some(m.reward_mean)
                }),
                spread: (!reward_std.is_empty()).then_some(reward_std),
            }],
        ),
        chart(
            "correctness.png",
            "Correctness",
            "correctness rate",
            "fraction of turns correct",
            1.0,
            vec![line(Series::new("correct rate", steps, |m| {
                trained(m).then_some(m.correct_rate)
            }))],
        ),
        chart(
            "speedup.png",
            "Mean speedup of correct turns",
            "mean speedup",
            "speedup over the eager baseline",
            1.0,
            // The record holds 0 when no turn was correct: no speedup, not a speedup of 0.
            vec![line(Series::new("mean speedup", steps, |m| {
                (trained(m) && m.correct_rate > 0.0).then_some(m.mean_speedup)
            }))],
        ),
        chart(
            "staleness.png",
            "Staleness of trained groups",
            "staleness",
            "policy lag (learner versions)",
            1.0,
            vec![
                line(Series::new("mean lag", steps, staleness_mean)),
                line(Series::new("max lag", steps, staleness_max)),
            ],
        ),
        chart(
            "utilisation.png",
            "Actor utilisation",
            "actor busy fractions",
            "busy time / wall time (>1: a pool busy in parallel)",
            1.0,
            busy_actors(steps)
                .into_iter()
                .map(|a| line(Series::new(a.clone(), steps, |m| m.busy.get(&a).copied())))
                .collect(),
        ),
        chart(
            "signal.png",
            "Learning signal and signs of collapse",
            "batch signals",
            "fraction (mean absolute advantage: score units)",
            1.0,
            vec![
                line(Series::new("repeat rate", steps, |m| {
                    m.signals.as_ref().map(|s| s.repeat_rate)
                })),
                line(Series::new("distinct first kernels", steps, |m| {
                    m.signals.as_ref().map(|s| s.distinct_first)
                })),
                line(Series::new("flat groups", steps, |m| {
                    let s = m.signals.as_ref()?;
                    (m.groups > 0).then(|| s.flat_groups as f64 / m.groups as f64)
                })),
                line(Series::new("mean abs advantage", steps, |m| {
                    m.signals.as_ref().map(|s| s.advantage_abs_mean)
                })),
            ],
        ),
        chart(
            "length.png",
            "Response length",
            "response length",
            "tokens per response (batch mean)",
            0.0,
            vec![line(Series::new("response tokens", steps, |m| {
                m.signals.as_ref().map(|s| s.response_tokens)
            }))],
        ),
    ]
}
