//! Live per-actor aggregates kept by the trace layer, so the daemon can put actor busy fractions
//! and handling latencies into metrics.jsonl every learner step without re-reading the trace file.
//!
//! The layer updates these when a message span opens and when it closes: one read lock on the
//! track map (a write lock only the first time an actor is seen) and one mutex per track. A
//! snapshot counts the time of the messages still open up to its own instant, so the busy time
//! between two snapshots is the time spent inside that window, also for a message (a generation
//! round, a learner step) that outlasts several windows; counting a message only when it closed
//! put all of its time in the window of its close (a single actor "busy" 2x a step's wall time). Actors on different tracks
//! never contend with each other; a pool sharing a track contends only on that track's small lock.
//! Latency percentiles come from a log-linear histogram (16 sub-buckets per power of two, so a
//! reported percentile is within about 6% of the true value); `kevin inspect` computes exact ones
//! from the trace file.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use serde::Serialize;

/// Sub-buckets per power of two, as a bit count: 2^4 = 16 sub-buckets, relative error <= 1/16.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets needed to cover every u64 value of microseconds.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// A log-linear histogram of durations in microseconds.
#[derive(Clone)]
struct Histogram {
    counts: Box<[u64]>,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
        }
    }

    fn bucket(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = exp - SUB_BITS;
        let mantissa = (v >> shift) - SUB; // in 0..SUB
        ((shift as u64 + 1) * SUB + mantissa) as usize
    }

    /// The largest value that falls into bucket `i`.
    fn upper_bound(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let mantissa = i % SUB;
        let lower = (SUB + mantissa) << shift;
        lower.saturating_add((1u64 << shift) - 1)
    }

    fn record(&mut self, v: u64) {
        self.counts[Self::bucket(v)] += 1;
    }

    /// The value at quantile `q` (nearest rank), as the upper bound of its bucket.
    fn quantile(&self, q: f64, total: u64) -> u64 {
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::upper_bound(i);
            }
        }
        Self::upper_bound(BUCKETS - 1)
    }
}

/// Running totals of one track (one actor).
struct TrackAgg {
    handled: u64,
    /// Summed time of the closed messages.
    busy_us: u64,
    /// Messages open now, and the sum of their start times (microseconds since the trace start).
    open: u64,
    open_start_sum_us: u64,
    max_us: u64,
    hist: Histogram,
}

/// Last and highest value of one counter (e.g. a mailbox depth).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CounterSnapshot {
    /// The most recent value reported.
    pub last: f64,
    /// The highest value reported since the trace started.
    pub max: f64,
}

/// Live aggregates of a trace, shared between the layer (which writes) and the daemon (which
/// reads snapshots). Obtain it from [`super::ChromeLayer::stats`] or [`super::TraceGuard::stats`].
pub struct TraceStats {
    start: Instant,
    tracks: RwLock<HashMap<Arc<str>, Arc<Mutex<TrackAgg>>>>,
    counters: Mutex<HashMap<String, CounterSnapshot>>,
    dropped: AtomicU64,
}

impl TraceStats {
    pub(crate) fn new(start: Instant) -> Self {
        TraceStats {
            start,
            tracks: RwLock::new(HashMap::new()),
            counters: Mutex::new(HashMap::new()),
            dropped: AtomicU64::new(0),
        }
    }

    /// The track of `actor`, made on first sight.
    fn track(&self, actor: &Arc<str>) -> Arc<Mutex<TrackAgg>> {
        let existing = self
            .tracks
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(actor)
            .cloned();
        let cell = match existing {
            Some(cell) => cell,
            None => self
                .tracks
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(actor.clone())
                .or_insert_with(|| {
                    Arc::new(Mutex::new(TrackAgg {
                        handled: 0,
                        busy_us: 0,
                        open: 0,
                        open_start_sum_us: 0,
                        max_us: 0,
                        hist: Histogram::new(),
                    }))
                })
                .clone(),
        };
        cell
    }

    /// A message of `actor` that started at `start` is being handled (until [`Self::close_open`]
    /// or [`Self::record_message`]).
    pub(crate) fn open_message(&self, actor: &Arc<str>, start: Instant) {
        let at = self.us_since_start(start);
        let cell = self.track(actor);
        let mut agg = cell.lock().unwrap_or_else(PoisonError::into_inner);
        agg.open += 1;
        agg.open_start_sum_us = agg.open_start_sum_us.saturating_add(at);
    }

    /// The message opened with [`Self::open_message`] with the same `actor` and `start` turned out
    /// to belong to another actor: it is no longer open on this one.
    pub(crate) fn close_open(&self, actor: &Arc<str>, start: Instant) {
        let at = self.us_since_start(start);
        let cell = self.track(actor);
        let mut agg = cell.lock().unwrap_or_else(PoisonError::into_inner);
        agg.open = agg.open.saturating_sub(1);
        agg.open_start_sum_us = agg.open_start_sum_us.saturating_sub(at);
    }

    /// Records one handled message of `actor`, opened with [`Self::open_message`] at `start`, that
    /// took `dur_us` microseconds: it leaves the open ones and joins the closed ones at once.
    pub(crate) fn record_message(&self, actor: &Arc<str>, start: Instant, dur_us: u64) {
        let at = self.us_since_start(start);
        let cell = self.track(actor);
        let mut agg = cell.lock().unwrap_or_else(PoisonError::into_inner);
        agg.open = agg.open.saturating_sub(1);
        agg.open_start_sum_us = agg.open_start_sum_us.saturating_sub(at);
        agg.handled += 1;
        agg.busy_us = agg.busy_us.saturating_add(dur_us);
        agg.max_us = agg.max_us.max(dur_us);
        agg.hist.record(dur_us);
    }

    pub(crate) fn record_counter(&self, name: &str, value: f64) {
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        match counters.get_mut(name) {
            Some(c) => {
                c.last = value;
                c.max = c.max.max(value);
            }
            None => {
                let c = CounterSnapshot {
                    last: value,
                    max: value,
                };
                counters.insert(name.to_owned(), c);
            }
        }
    }

    pub(crate) fn record_drop(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Microseconds since the trace started.
    pub(crate) fn elapsed_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Microseconds from the trace start to `t` (0 for an instant before it).
    fn us_since_start(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_micros() as u64
    }

    /// Trace records dropped so far because the writer could not keep up (or had stopped).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// A consistent-enough copy of every track's totals (each track is copied under its own lock).
    pub fn snapshot(&self) -> StatsSnapshot {
        let now_us = self.elapsed_us();
        let cells: Vec<(Arc<str>, Arc<Mutex<TrackAgg>>)> = self
            .tracks
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let tracks = cells
            .into_iter()
            .map(|(name, cell)| {
                let agg = cell.lock().unwrap_or_else(PoisonError::into_inner);
                // A message opened after `now_us` was read counts nothing yet (saturating).
                let open_us = agg
                    .open
                    .saturating_mul(now_us)
                    .saturating_sub(agg.open_start_sum_us);
                let snap = TrackSnapshot {
                    handled: agg.handled,
                    busy_us: agg.busy_us.saturating_add(open_us),
                    mean_ms: if agg.handled == 0 {
                        0.0
                    } else {
                        agg.busy_us as f64 / agg.handled as f64 / 1000.0
                    },
                    p99_ms: agg.hist.quantile(0.99, agg.handled).min(agg.max_us) as f64 / 1000.0,
                    max_ms: agg.max_us as f64 / 1000.0,
                };
                (name.to_string(), snap)
            })
            .collect();
        let counters = self
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        StatsSnapshot {
            elapsed_us: now_us,
            tracks,
            counters,
            dropped: self.dropped(),
        }
    }
}

/// Totals of one track at the time of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TrackSnapshot {
    /// Messages handled (closed message spans).
    pub handled: u64,
    /// Summed handling time in microseconds up to the snapshot, the messages still open counted up
    /// to its instant (a pool of N workers can accumulate N per second).
    pub busy_us: u64,
    /// Mean handling latency in milliseconds (closed messages).
    pub mean_ms: f64,
    /// 99th-percentile handling latency in milliseconds (histogram bucket bound, within ~6%).
    pub p99_ms: f64,
    /// Longest handling latency in milliseconds.
    pub max_ms: f64,
}

/// A copy of [`TraceStats`] at one instant; serializable into metrics.jsonl.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatsSnapshot {
    /// Microseconds since the trace started.
    pub elapsed_us: u64,
    /// Per-actor totals, by actor name.
    pub tracks: BTreeMap<String, TrackSnapshot>,
    /// Per-counter last and highest values, by counter name.
    pub counters: BTreeMap<String, CounterSnapshot>,
    /// Trace records dropped so far.
    pub dropped: u64,
}

impl StatsSnapshot {
    /// Fraction of wall time each actor spent handling messages between `earlier` and `self`
    /// (summed over concurrent handlers, so a pool of N can reach N). Call it every learner step
    /// with the previous step's snapshot to get "actor busy fractions" for that step.
    pub fn busy_fractions_since(&self, earlier: &StatsSnapshot) -> BTreeMap<String, f64> {
        let wall = self.elapsed_us.saturating_sub(earlier.elapsed_us);
        self.tracks
            .iter()
            .map(|(name, now)| {
                let before = earlier.tracks.get(name).map_or(0, |t| t.busy_us);
                let busy = now.busy_us.saturating_sub(before);
                let frac = if wall == 0 {
                    0.0
                } else {
                    busy as f64 / wall as f64
                };
                (name.clone(), frac)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_monotonic_and_bound_their_values() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 12345, u64::MAX]) {
            let b = Histogram::bucket(v);
            assert!(b >= last || v > 5000, "bucket order broke at {v}");
            last = b;
            assert!(Histogram::upper_bound(b) >= v, "upper bound below {v}");
            if b > 0 {
                assert!(Histogram::upper_bound(b - 1) < v, "value {v} belongs lower");
            }
        }
    }

    #[test]
    fn p99_is_within_bucket_error() {
        let start = Instant::now();
        let stats = TraceStats::new(start);
        let actor: Arc<str> = Arc::from("Compiler");
        for ms in 1..=100u64 {
            stats.open_message(&actor, start);
            stats.record_message(&actor, start, ms * 1000);
        }
        let snap = stats.snapshot();
        let t = &snap.tracks["Compiler"];
        assert_eq!(t.handled, 100);
        assert!((t.mean_ms - 50.5).abs() < 1e-9);
        assert!(
            t.p99_ms >= 99.0 && t.p99_ms <= 99.0 * 1.07,
            "p99 {}",
            t.p99_ms
        );
        assert_eq!(t.max_ms, 100.0);
    }

    #[test]
    fn a_message_open_across_snapshots_is_busy_in_each_window_not_only_where_it_closes() {
        let origin = Instant::now() - std::time::Duration::from_secs(10);
        let stats = TraceStats::new(origin);
        let actor: Arc<str> = Arc::from("Generator");
        let start = origin + std::time::Duration::from_secs(2);
        stats.open_message(&actor, start);
        let a = stats.snapshot();
        let g = &a.tracks["Generator"];
        assert_eq!(g.handled, 0);
        assert_eq!(
            g.busy_us,
            a.elapsed_us - 2_000_000,
            "open since 2 s: busy up to now"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
        stats.record_message(&actor, start, stats.elapsed_us() - 2_000_000);
        let b = stats.snapshot();
        assert_eq!(b.tracks["Generator"].handled, 1);
        let f = b.busy_fractions_since(&a)["Generator"];
        // Counted at its close alone, the message's 8 s would fall into this 5 ms window.
        assert!(
            f > 0.0 && f <= 1.0,
            "busy fraction {f} of a window inside one message"
        );
        // A message opened for one actor and moved to another leaves nothing open behind.
        let other: Arc<str> = Arc::from("Compiler");
        stats.open_message(&other, start);
        stats.close_open(&other, start);
        let c = stats.snapshot();
        assert_eq!(c.tracks["Compiler"].busy_us, 0);
    }

    #[test]
    fn busy_fractions_are_deltas() {
        let a = StatsSnapshot {
            elapsed_us: 1_000,
            tracks: [(
                "A".to_owned(),
                TrackSnapshot {
                    busy_us: 100,
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        let b = StatsSnapshot {
            elapsed_us: 3_000,
            tracks: [
                (
                    "A".to_owned(),
                    TrackSnapshot {
                        busy_us: 1_100,
                        ..Default::default()
                    },
                ),
                (
                    "B".to_owned(),
                    TrackSnapshot {
                        busy_us: 4_000,
                        ..Default::default()
                    },
                ),
            ]
            .into(),
            ..Default::default()
        };
        let f = b.busy_fractions_since(&a);
        assert_eq!(f["A"], 0.5);
        assert_eq!(f["B"], 2.0);
    }
}
