use super::*;

/// Test double of a [`Timer`]: replays fixed sample sequences (cyclically) for timed runs and
/// `warm_ms` (1000 unless set) for warm-up runs (a run not preceded by a cache flush), and
/// records every call.
struct SequenceTimerDouble {
    warm_ms: f64,
    candidate: Vec<f64>,
    baseline: Vec<f64>,
    next: [usize; 2],
    flushed: bool,
    calls: Vec<&'static str>,
    samples_taken: usize,
    fail_at: Option<(usize, ExecFailure)>,
}

impl SequenceTimerDouble {
    fn new(candidate: &[f64], baseline: &[f64]) -> Self {
        SequenceTimerDouble {
            warm_ms: 1000.0,
            candidate: candidate.to_vec(),
            baseline: baseline.to_vec(),
            next: [0, 0],
            flushed: false,
            calls: Vec::new(),
            samples_taken: 0,
            fail_at: None,
        }
    }
}

impl Timer for SequenceTimerDouble {
    fn time_once(&mut self, which: Which) -> Result<f64, ExecFailure> {
        if let Some((at, failure)) = &self.fail_at {
            if self.samples_taken == *at {
                return Err(failure.clone());
            }
        }
        self.samples_taken += 1;
        let (slot, seq, tag) = match which {
            Which::Candidate => (0, &self.candidate, "K"),
            Which::Baseline => (1, &self.baseline, "B"),
        };
        self.calls.push(tag);
        if !std::mem::take(&mut self.flushed) {
            return Ok(self.warm_ms);
        }
        let v = seq[self.next[slot] % seq.len()];
        self.next[slot] += 1;
        Ok(v)
    }

    fn flush_cache(&mut self) {
        self.flushed = true;
        self.calls.push("flush");
    }
}

/// A protocol without the slow candidate's shortcuts (they have tests of their own).
fn cfg(min_trials: u32, max_trials: u32) -> TimingConfig {
    TimingConfig {
        warmup: 2,
        warmup_ms: f64::INFINITY,
        min_trials,
        slow_min_trials: min_trials,
        slow_ms: f64::INFINITY,
        max_trials,
        rse_target: 0.01,
        budget_ms: 1e9,
        wall_cap_ms: 60_000.0,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn known_sequences_give_known_medians_and_spreads() {
    // (candidate samples, baseline samples, median K, spread K, median B)
    type Case<'a> = (&'a [f64], &'a [f64], f64, f64, f64);
    let cases: &[Case] = &[
        (
            &[5.0, 1.0, 4.0, 2.0, 3.0],
            &[10.0; 5],
            3.0,
            (4.0 - 2.0) / 3.0,
            10.0,
        ),
        (
            &[1.0, 2.0, 3.0, 4.0],
            &[8.0, 6.0, 4.0, 2.0],
            2.5,
            (3.25 - 1.75) / 2.5,
            5.0,
        ),
        (
            &[2.0, 2.0, 2.0, 100.0],
            &[1.0, 3.0, 1.0, 3.0],
            2.0,
            (26.5 - 2.0) / 2.0,
            2.0,
        ),
    ];
    for (k, b, median_k, spread_k, median_b) in cases {
        let n = k.len() as u32;
        let mut timer = SequenceTimerDouble::new(k, b);
        let t = measure(&mut timer, &cfg(n, n)).unwrap();
        assert_eq!(t.trials, n);
        assert_eq!(
            t.kernel.samples,
            k.to_vec(),
            "warm-up samples are discarded"
        );
        assert!(
            close(t.kernel.median_ms, *median_k),
            "{k:?}: {}",
            t.kernel.median_ms
        );
        assert!(
            close(t.kernel.spread, *spread_k),
            "{k:?}: {}",
            t.kernel.spread
        );
        assert!(
            close(t.baseline.median_ms, *median_b),
            "{b:?}: {}",
            t.baseline.median_ms
        );
        assert!(close(t.speedup(), median_b / median_k));
    }
}

#[test]
fn quantiles_interpolate() {
    assert_eq!(quantile(&[], 0.5), None);
    assert_eq!(quantile(&[7.0], 0.25), Some(7.0));
    assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), Some(2.0));
    assert_eq!(quantile(&[1.0, 2.0], 0.5), Some(1.5));
    assert_eq!(quantile(&[1.0, 2.0], 2.0), Some(2.0));
}

#[test]
fn low_noise_stops_at_min_trials() {
    let k = [1.000, 1.001, 0.999, 1.000, 1.002, 0.998];
    let b = [2.000, 2.002, 1.998];
    let mut timer = SequenceTimerDouble::new(&k, &b);
    let t = measure(&mut timer, &cfg(6, 100)).unwrap();
    assert_eq!(t.stop, StopReason::RseMet);
    assert!(t.rse_met);
    assert_eq!(t.trials, 6);
    assert!(t.kernel.rse < 0.01 && t.baseline.rse < 0.01);
}

#[test]
fn noisy_samples_run_to_the_trial_cap() {
    let k = [1.0, 3.0, 0.5, 5.0, 2.0, 0.7, 4.0];
    let mut timer = SequenceTimerDouble::new(&k, &[1.0]);
    let t = measure(&mut timer, &cfg(3, 40)).unwrap();
    assert_eq!(t.stop, StopReason::MaxTrials);
    assert!(!t.rse_met);
    assert_eq!(t.trials, 40);
    assert_eq!(t.kernel.samples.len(), 40);
}

#[test]
fn only_the_noisy_side_keeps_it_running() {
    // A quiet kernel against a noisy baseline still needs both to meet the target.
    let mut timer = SequenceTimerDouble::new(&[1.0], &[1.0, 9.0, 2.0, 7.0]);
    let t = measure(&mut timer, &cfg(3, 25)).unwrap();
    assert_eq!((t.stop, t.trials), (StopReason::MaxTrials, 25));
    assert_eq!(t.kernel.rse, 0.0);
}

#[test]
fn budget_caps_noisy_measurements() {
    let k = [10.0, 30.0, 5.0, 50.0];
    let mut timer = SequenceTimerDouble::new(&k, &[20.0, 40.0]);
    let config = TimingConfig {
        budget_ms: 200.0,
        ..cfg(3, 1000)
    };
    let t = measure(&mut timer, &config).unwrap();
    assert_eq!(t.stop, StopReason::TimeCap);
    // Per trial (alternating order): 10+20, 20+30... K = 10, 30, 5, 50 and B = 20, 40, 20, 40:
    // 30, 70, 25, 90 -> 215 >= 200 after the fourth trial.
    assert_eq!(t.trials, 4);
    assert!(!t.rse_met);
}

#[test]
fn wall_cap_stops_even_without_samples_adding_up() {
    let mut timer = SequenceTimerDouble::new(&[1.0, 2.0], &[1.0, 3.0]);
    let config = TimingConfig {
        wall_cap_ms: 0.0,
        ..cfg(3, 1000)
    };
    let t = measure(&mut timer, &config).unwrap();
    assert_eq!((t.stop, t.trials), (StopReason::TimeCap, 1));
}

#[test]
fn warmup_then_interleaved_flushed_runs_in_alternating_order() {
    let mut timer = SequenceTimerDouble::new(&[1.0], &[2.0]);
    measure(&mut timer, &cfg(3, 3)).unwrap();
    let expected = [
        "K", "B", "K", "B", // two warm-up pairs, not flushed
        "flush", "K", "flush", "B", // trial 0
        "flush", "B", "flush", "K", // trial 1
        "flush", "K", "flush", "B", // trial 2
    ];
    assert_eq!(timer.calls, expected);
}

#[test]
fn failures_propagate_and_bad_samples_are_harness_errors() {
    let failures = [
        ExecFailure::Crash("illegal address".into()),
        ExecFailure::Timeout { limit_ms: 5 },
        ExecFailure::Launch("too many threads".into()),
        ExecFailure::Unsupported("clock64".into()),
    ];
    for (at, failure) in failures.into_iter().enumerate() {
        let mut timer = SequenceTimerDouble::new(&[1.0], &[1.0]);
        timer.fail_at = Some((at * 3, failure.clone())); // warm-up, trial 0, trial 1, trial 2
        assert_eq!(measure(&mut timer, &cfg(3, 3)), Err(failure));
    }
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        let mut timer = SequenceTimerDouble::new(&[bad], &[1.0]);
        assert!(matches!(
            measure(&mut timer, &cfg(3, 3)),
            Err(ExecFailure::Harness(_))
        ));
    }
}

#[test]
fn correct_outcome_carries_medians_label_and_flag() {
    let mut timer = SequenceTimerDouble::new(&[0.1], &[2.0]);
    let t = measure(&mut timer, &cfg(3, 3)).unwrap();
    let o = correct_outcome(&t, "cpu");
    assert_eq!(
        o,
        Outcome::Correct {
            kernel_ms: 0.1,
            baseline_ms: 2.0,
            spread: 0.0,
            timing: "cpu".into()
        }
    );
    assert!(o.flagged(), "a 20x speedup is flagged");
    assert!(o.feedback().contains("(cpu timing)"));
}

#[test]
fn degenerate_configs_still_measure() {
    let mut timer = SequenceTimerDouble::new(&[1.0], &[1.0]);
    let t = measure(&mut timer, &cfg(0, 0)).unwrap();
    assert_eq!(t.trials, 1);
    let zero = SampleStats::of(&[0.0, 0.0]).unwrap();
    assert_eq!((zero.median_ms, zero.spread, zero.rse), (0.0, 0.0, 0.0));
    assert_eq!(SampleStats::of(&[]), None);
}

/// The default protocol's calls before the first timed trial, and its trial count.
fn default_protocol(timer: &mut SequenceTimerDouble) -> (usize, Timing) {
    let t = measure(timer, &TimingConfig::default()).unwrap();
    let warmup = timer.calls.iter().position(|&c| c == "flush").unwrap();
    (warmup, t)
}

#[test]
fn a_slow_candidate_warms_up_once_and_may_stop_at_three_trials() {
    // 50 ms a run against a 1 ms baseline, both quiet: one warm-up run each (50 ms is past the
    // 20 ms warm-up), and the RSE target stops the loop at 3 trials (the samples add up to
    // 60 ms after two), where a fast kernel needs 5.
    let mut timer = SequenceTimerDouble::new(&[50.0, 50.1, 49.9], &[1.0, 1.001, 0.999]);
    timer.warm_ms = 50.0;
    let (warmup, t) = default_protocol(&mut timer);
    assert_eq!(warmup, 2, "{:?}", timer.calls);
    assert_eq!((t.stop, t.trials), (StopReason::RseMet, 3));
    assert!(t.rse_met);
    assert_eq!(t.kernel.median_ms, 50.0);
}

#[test]
fn a_fast_candidate_keeps_the_full_warm_up_and_minimum() {
    let mut timer = SequenceTimerDouble::new(&[1.0, 1.001, 0.999], &[2.0, 2.001, 1.999]);
    timer.warm_ms = 1.0;
    let (warmup, t) = default_protocol(&mut timer);
    assert_eq!(warmup, 6, "three warm-up pairs: {:?}", timer.calls);
    assert_eq!((t.stop, t.trials), (StopReason::RseMet, 5));
    // A kernel at 10 ms a run: its warm-ups add up to 20 ms after two, and its samples reach
    // 60 ms only at the sixth trial, past the minimum of 5.
    let mut timer = SequenceTimerDouble::new(&[10.0, 10.01, 9.99], &[2.0]);
    timer.warm_ms = 10.0;
    let (warmup, t) = default_protocol(&mut timer);
    assert_eq!(warmup, 4, "{:?}", timer.calls);
    assert_eq!((t.stop, t.trials), (StopReason::RseMet, 5));
}

#[test]
fn a_slow_candidate_against_a_noisy_baseline_still_needs_the_target() {
    // Three trials are only allowed, not enough: the baseline's median must meet the RSE
    // target too, so the loop runs on until it does or a cap stops it.
    let mut timer = SequenceTimerDouble::new(&[50.0], &[1.0, 1.6, 1.3]);
    timer.warm_ms = 50.0;
    let (_, t) = default_protocol(&mut timer);
    assert!(t.trials > 3, "{} trials", t.trials);
    let mut timer = SequenceTimerDouble::new(&[50.0, 80.0, 20.0, 65.0], &[1.0]);
    timer.warm_ms = 50.0;
    let (_, t) = default_protocol(&mut timer);
    assert!(t.trials > 3 && !t.rse_met, "{} trials", t.trials);
    assert_eq!(t.stop, StopReason::TimeCap);
}
