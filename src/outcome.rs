//! What evaluating one candidate produced, the score it earns and the feedback the next turn sees.
//!
//! An outcome is data, never an error: a kernel that does not compile is an ordinary result of
//! the environment. Every variant renders into the feedback text that the policy reads in its
//! next turn, so each one says what went wrong precisely enough to fix it.

use serde::{Deserialize, Serialize};

use crate::rl;

/// Every [`Outcome::kind`], in the order of the enum.
pub const KINDS: [&str; 9] = [
    "format_error",
    "compile_error",
    "launch_error",
    "crash",
    "timeout",
    "wrong",
    "unsupported",
    "correct",
    "harness_error",
];

/// Speedups above this are flagged: they are more often a hole in the harness than a real win.
/// A turn's score counts no more than this ([`rl::MAX_SCORED_SPEEDUP`]).
pub const SUSPICIOUS_SPEEDUP: f64 = rl::MAX_SCORED_SPEEDUP;

/// The first element where a candidate's output disagreed with the reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// The output tensor's name.
    pub output: String,
    /// Flat (row-major) index of the element.
    pub index: u64,
    /// The reference value.
    #[serde(with = "float_or_name")]
    pub expected: f64,
    /// The candidate's value (NaN when it left the element unwritten).
    #[serde(with = "float_or_name")]
    pub got: f64,
    /// Number of elements out of tolerance in that output.
    pub mismatches: u64,
    /// Which correctness trial (0-based) found it.
    pub trial: u32,
}

/// JSON has no NaN or infinity, and a mismatch is often exactly that: non-finite values travel
/// as the strings "NaN", "inf" and "-inf" (worker protocol, episodes.jsonl), finite ones as
/// numbers.
mod float_or_name {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_nan() {
            s.serialize_str("NaN")
        } else if v.is_infinite() {
            s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
        } else {
            s.serialize_f64(*v)
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Num(f64),
        Name(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Num(v) => Ok(v),
            Repr::Name(n) => match n.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!("not a number: {other:?}"))),
            },
        }
    }
}

/// The result of evaluating one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The response has no kernel or breaks the candidate format.
    FormatError {
        /// What to fix, addressed to the policy.
        reason: String,
    },
    /// The compiler rejected the kernel.
    CompileError {
        /// The compiler's log, trimmed for feedback.
        log: String,
    },
    /// The launch plan could not be executed (bad configuration, too many resources).
    LaunchError {
        /// What failed.
        reason: String,
    },
    /// The kernel crashed its worker (illegal address, trap, misaligned access, ...).
    Crash {
        /// What the worker reported.
        reason: String,
    },
    /// A stage did not finish before its deadline.
    Timeout {
        /// The stage that ran out of time (compile, verify, profile).
        stage: String,
        /// The deadline in milliseconds.
        limit_ms: u64,
    },
    /// The kernel ran but its result is wrong (or it clobbered an input, or raced).
    Wrong {
        /// A one-line reason (e.g. "input A was modified").
        reason: String,
        /// The first mismatching element, when the failure was a value mismatch.
        mismatch: Option<Mismatch>,
    },
    /// The kernel used something the execution backend cannot reproduce faithfully.
    Unsupported {
        /// The feature.
        feature: String,
    },
    /// Correct, with its timing against the baseline.
    Correct {
        /// Median kernel time (ms).
        kernel_ms: f64,
        /// Median baseline time (ms).
        baseline_ms: f64,
        /// Relative spread of the kernel's timing (e.g. interquartile range / median).
        spread: f64,
        /// Where the times come from ("cuda" or "cpu" or "simulated"): CPU timings say so.
        timing: String,
    },
    /// The evaluation harness failed (its reference, its buffers, its worker or device before
    /// the candidate ran): the candidate was not judged. Never the candidate's outcome: such a
    /// turn earns no reward and is not trained on (the rollout abandons its group, counted as
    /// `Rollout.harness_error`), and evaluation summaries leave it out of their rates.
    HarnessError {
        /// What failed.
        reason: String,
        /// The machine was too busy to give the harness its time (a worker or the compiler
        /// starved of CPU past its backstop, [`WorkerFailure::Starved`]): nothing is broken, and
        /// the same candidate asked again later may well be judged. The rollout and `kevin eval`
        /// ask again, [`BUSY_ATTEMPTS`] times in all, [`busy_backoff`] apart, before they give
        /// up on it as on any other harness error. Absent from JSON when false.
        ///
        /// [`WorkerFailure::Starved`]: crate::worker::pool::WorkerFailure::Starved
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        busy: bool,
    },
}

/// How many times a candidate the harness was too busy to judge
/// ([`Outcome::is_busy`]) is sent in all before its turn is given up as a harness error.
pub const BUSY_ATTEMPTS: u32 = 3;

/// The wait before sending such a candidate again after `attempt` (0-based) busy answers: 2 s,
/// then 4 s. Long against a CPU burst, short against a turn's generation.
pub fn busy_backoff(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_secs(2 << attempt.min(4))
}

/// After the answer to attempt `attempt` (0-based): how long to wait before sending the
/// candidate again, or `None` when the answer stands (it was not `busy`, or that was the last of
/// [`BUSY_ATTEMPTS`]).
pub fn busy_retry(busy: bool, attempt: u32) -> Option<std::time::Duration> {
    (busy && attempt + 1 < BUSY_ATTEMPTS).then(|| busy_backoff(attempt))
}

impl Outcome {
    /// The harness failed for `reason`: the candidate was not judged.
    pub fn harness(reason: impl Into<String>) -> Outcome {
        Outcome::HarnessError {
            reason: reason.into(),
            busy: false,
        }
    }

    /// The machine was too busy for the harness to judge the candidate (`reason` says how long
    /// it waited for a CPU): worth asking again ([`BUSY_ATTEMPTS`]).
    pub fn busy(reason: impl Into<String>) -> Outcome {
        Outcome::HarnessError {
            reason: reason.into(),
            busy: true,
        }
    }

    /// True for a harness error that only says the machine was too busy ([`Outcome::busy`]).
    pub fn is_busy(&self) -> bool {
        matches!(self, Outcome::HarnessError { busy: true, .. })
    }

    /// Short machine-readable kind, as in the JSON tag.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::FormatError { .. } => "format_error",
            Outcome::CompileError { .. } => "compile_error",
            Outcome::LaunchError { .. } => "launch_error",
            Outcome::Crash { .. } => "crash",
            Outcome::Timeout { .. } => "timeout",
            Outcome::Wrong { .. } => "wrong",
            Outcome::Unsupported { .. } => "unsupported",
            Outcome::Correct { .. } => "correct",
            Outcome::HarnessError { .. } => "harness_error",
        }
    }

    /// True when the harness failed and the candidate was not judged.
    pub fn is_harness_error(&self) -> bool {
        matches!(self, Outcome::HarnessError { .. })
    }

    /// True only for a correct kernel.
    pub fn is_correct(&self) -> bool {
        matches!(self, Outcome::Correct { .. })
    }

    /// T_baseline / T_kernel for a correct kernel, None otherwise.
    pub fn speedup(&self) -> Option<f64> {
        match self {
            Outcome::Correct {
                kernel_ms,
                baseline_ms,
                ..
            } if *kernel_ms > 0.0 => Some(baseline_ms / kernel_ms),
            _ => None,
        }
    }

    /// True when a correct kernel's speedup is suspiciously large.
    pub fn flagged(&self) -> bool {
        self.speedup().is_some_and(|s| s > SUSPICIOUS_SPEEDUP)
    }

    /// The turn score S = 0.3 * 1[correct] + speedup * 1[correct].
    pub fn score(&self) -> f64 {
        rl::turn_score(self.is_correct(), self.speedup().unwrap_or(0.0))
    }

    /// The feedback text the policy sees about this turn in its next prompt.
    pub fn feedback(&self) -> String {
        match self {
            Outcome::FormatError { reason } => {
                format!("Format error: {reason}. Answer with one ```cuda block and the kevin launch lines.")
            }
            Outcome::CompileError { log } => format!("Compilation failed:\n{log}"),
            Outcome::LaunchError { reason } => format!("Launch failed: {reason}"),
            Outcome::Crash { reason } => format!("The kernel crashed: {reason}"),
            Outcome::Timeout { stage, limit_ms } => {
                format!("Timed out during {stage} after {limit_ms} ms (an infinite loop or far too much work?)")
            }
            Outcome::Wrong { reason, mismatch: Some(m) } => format!(
                "Wrong result: {reason}. First mismatch in output {} at flat index {}: expected {}, got {} \
                 ({} elements out of tolerance, trial {}).",
                m.output, m.index, m.expected, m.got, m.mismatches, m.trial
            ),
            Outcome::Wrong { reason, mismatch: None } => format!("Wrong result: {reason}."),
            Outcome::Unsupported { feature } => {
                format!("Not supported by this execution backend: {feature}. Rewrite without it.")
            }
            Outcome::Correct { kernel_ms, baseline_ms, spread, timing } => {
                let speedup = self.speedup().unwrap_or(0.0);
                let clock = if timing == "cuda" { String::new() } else { format!(" ({timing} timing)") };
                let mut text = format!(
                    "Correct. Kernel {kernel_ms:.4} ms (spread {:.1}%), baseline {baseline_ms:.4} ms: \
                     speedup {speedup:.2}x{clock}.",
                    spread * 100.0
                );
                if self.flagged() {
                    text.push_str(" This speedup is flagged for review.");
                }
                text
            }
            Outcome::HarnessError { reason, .. } => format!(
                "The evaluation harness failed before judging this kernel (not the kernel's fault): {reason}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn correct(kernel_ms: f64, baseline_ms: f64) -> Outcome {
        Outcome::Correct {
            kernel_ms,
            baseline_ms,
            spread: 0.01,
            timing: "cuda".into(),
        }
    }

    #[test]
    fn score_and_speedup() {
        let c = correct(0.5, 1.0);
        assert_eq!(c.speedup(), Some(2.0));
        assert!((c.score() - 2.3).abs() < 1e-12);
        assert!(!c.flagged());
        assert!(correct(0.05, 1.0).flagged());
        let w = Outcome::Wrong {
            reason: "bad".into(),
            mismatch: None,
        };
        assert_eq!(w.score(), 0.0);
        assert_eq!(w.speedup(), None);
    }

    #[test]
    fn feedback_texts() {
        let check = |o: Outcome, expected: &str| assert_eq!(o.feedback(), expected);
        check(
            Outcome::Timeout {
                stage: "verify".into(),
                limit_ms: 2000,
            },
            "Timed out during verify after 2000 ms (an infinite loop or far too much work?)",
        );
        check(
            Outcome::Wrong {
                reason: "values differ".into(),
                mismatch: Some(Mismatch {
                    output: "Y".into(),
                    index: 7,
                    expected: 1.5,
                    got: f64::NAN,
                    mismatches: 3,
                    trial: 0,
                }),
            },
            "Wrong result: values differ. First mismatch in output Y at flat index 7: expected 1.5, got NaN \
             (3 elements out of tolerance, trial 0).",
        );
        check(
            correct(0.5, 1.0),
            "Correct. Kernel 0.5000 ms (spread 1.0%), baseline 1.0000 ms: speedup 2.00x.",
        );
        check(
            Outcome::Correct { kernel_ms: 2.0, baseline_ms: 1.0, spread: 0.0, timing: "cpu".into() },
            "Correct. Kernel 2.0000 ms (spread 0.0%), baseline 1.0000 ms: speedup 0.50x (cpu timing).",
        );
    }

    #[test]
    fn non_finite_mismatches_survive_json() {
        for got in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.5] {
            let o = Outcome::Wrong {
                reason: "x".into(),
                mismatch: Some(Mismatch {
                    output: "Y".into(),
                    index: 0,
                    expected: 1.0,
                    got,
                    mismatches: 1,
                    trial: 0,
                }),
            };
            let back: Outcome = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
            let Outcome::Wrong {
                mismatch: Some(m), ..
            } = back
            else {
                panic!()
            };
            assert!(m.got == got || (m.got.is_nan() && got.is_nan()));
        }
    }

    #[test]
    fn kinds_lists_every_variant_in_order() {
        let every = [
            Outcome::FormatError {
                reason: String::new(),
            },
            Outcome::CompileError { log: String::new() },
            Outcome::LaunchError {
                reason: String::new(),
            },
            Outcome::Crash {
                reason: String::new(),
            },
            Outcome::Timeout {
                stage: String::new(),
                limit_ms: 0,
            },
            Outcome::Wrong {
                reason: String::new(),
                mismatch: None,
            },
            Outcome::Unsupported {
                feature: String::new(),
            },
            correct(1.0, 1.0),
            Outcome::harness(""),
        ];
        let kinds: Vec<&str> = every.iter().map(Outcome::kind).collect();
        assert_eq!(kinds, KINDS);
    }

    #[test]
    fn outcome_json_is_tagged() {
        let json = serde_json::to_string(&Outcome::CompileError { log: "x".into() }).unwrap();
        assert_eq!(json, r#"{"kind":"compile_error","log":"x"}"#);
        let back: Outcome = serde_json::from_str(&json).unwrap();
        assert_eq!(back.kind(), "compile_error");
    }

    #[test]
    fn a_busy_harness_error_says_so_in_json_and_older_json_reads_as_not_busy() {
        let busy = serde_json::to_string(&Outcome::busy("starved")).unwrap();
        assert_eq!(
            busy,
            r#"{"kind":"harness_error","reason":"starved","busy":true}"#
        );
        let back: Outcome = serde_json::from_str(&busy).unwrap();
        assert!(back.is_busy() && back.is_harness_error());
        // Episodes, WALs and remote nodes from before the field: not busy.
        let old = r#"{"kind":"harness_error","reason":"no GPU"}"#;
        assert_eq!(
            serde_json::to_string(&Outcome::harness("no GPU")).unwrap(),
            old
        );
        let back: Outcome = serde_json::from_str(old).unwrap();
        assert!(!back.is_busy() && back.is_harness_error());
        assert!(!Outcome::CompileError { log: String::new() }.is_busy());
    }

    #[test]
    fn a_busy_answer_is_asked_again_twice_then_stands() {
        let waits: Vec<_> = (0..BUSY_ATTEMPTS).map(|a| busy_retry(true, a)).collect();
        let s = std::time::Duration::from_secs;
        assert_eq!(waits, [Some(s(2)), Some(s(4)), None]);
        assert_eq!(busy_retry(false, 0), None);
    }

    #[test]
    fn busy_backoff_doubles_and_stays_bounded() {
        assert_eq!(busy_backoff(0), std::time::Duration::from_secs(2));
        assert_eq!(busy_backoff(1), std::time::Duration::from_secs(4));
        assert_eq!(busy_backoff(40), std::time::Duration::from_secs(32));
    }
}
