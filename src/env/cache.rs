//! The evaluation cache ([`CachedEnv`]): a candidate whose exact text was already judged for the
//! same task gets that verdict again instead of a second compile, check and timing.
//!
//! A small policy repeats itself: `kevin-rl-4m` (the RL checkpoint of 2026-12-04) wrote one
//! kernel eight times out of eight for two of three training tasks (8 trajectories, temperature
//! 0.9, 2026-12-06), and the GPU checked and timed every copy under its one lock. The verdict is
//! a property of the text: the same source, launch lines and task give the same program on the
//! same inputs' distribution.
//!
//! - **Key**: the task's name and the whole ```cuda block, byte for byte (no hash, so no
//!   collision). One environment has one preset, so the preset needs no place in the key.
//! - **What is kept**: the final outcome of a candidate (a compile, launch or format error, a
//!   crash, a wrong result, an unsupported feature, or the timed correct result), and that a
//!   candidate passed verification while its timing is pending. **Never kept**: a harness error
//!   (not the candidate's) and a timeout (a run slowed by another process on the GPU must not
//!   stick to the text); the next copy is judged afresh.
//! - **Copies in flight**: the copies of one group arrive together. Each stage of one key runs
//!   under that key's lock, so the first copy checks (or times) and the others wait for it and
//!   take its verdict; a copy never waits across stages (no deadlock with a full pool). The
//!   lock is held only inside one stage call, which has its own deadline.
//! - **Passes are checked again, failures are not**: a failure is proof, a pass only evidence.
//!   The 1st, 2nd, 4th, 8th, ... copy of a kernel kept as correct is compiled and checked again
//!   (not timed again), and a failure replaces the pass. Without this, a kernel that passes by
//!   chance (a race, uninitialised memory) would keep its one lucky pass for every later copy: a
//!   lottery a policy could learn to play. With it, such a kernel keeps a pass over `n` copies
//!   with probability about `q^log2(n)`, and a sound one costs `log2(n)` checks, not `n`.
//! - **Bound**: at most `capacity` keys, the oldest forgotten first.
//!
//! What this gives up, on purpose: between its checks, a racy kernel keeps its verdict for its
//! copies instead of drawing one per copy, and a correct kernel's copies share one timing instead
//! of drawing their own (so the best of several copies' timings no longer picks the luckiest
//! noise).

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::{Compiled, KernelEnv};
use crate::outcome::Outcome;
use crate::worker::PoolStats;

/// What is known of one key.
#[derive(Debug, Clone, Default)]
enum Known {
    /// Nothing yet (or only outcomes that are not kept).
    #[default]
    Nothing,
    /// It passed verification; its timing has not ended yet.
    Verified,
    /// Its final outcome.
    Final(Outcome),
}

/// One key's verdict, behind the lock its stages run under.
#[derive(Debug, Default)]
struct Slot {
    known: Mutex<Known>,
    /// Copies that found a correct verdict here: the 1st, 2nd, 4th, 8th, ... are checked again.
    passes: AtomicU64,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The artifact of a [`CachedEnv`]: the key, and the inner environment's compiled candidate
/// (`None` when the verdict was known before compiling).
struct Keyed {
    slot: Arc<Slot>,
    inner: Option<Compiled>,
    /// A copy of a kernel kept as correct that is checked again (see [`recheck`]).
    recheck: bool,
}

/// Whether the `n`th copy (from 1) of a kernel kept as correct is checked again: the 1st, 2nd,
/// 4th, 8th, ... A pass is evidence, a failure is proof, so only passes are checked again. A
/// kernel that passes by chance (a race, uninitialised memory) with probability `q` keeps its
/// verdict over `n` copies with probability about `q^log2(n)`; a sound kernel costs `log2(n)`
/// checks instead of `n`.
fn recheck(n: u64) -> bool {
    n.is_power_of_two()
}

/// How often the cache answered (see [`KernelEnv::cache_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Candidates whose final outcome came from the cache at compile time (nothing ran).
    pub answered: u64,
    /// Verifications of compiled copies answered from the cache (a copy that arrived while the
    /// first was checked); copies answered whole are counted in `answered` only.
    pub verify_hits: u64,
    /// Timings of compiled copies answered from the cache.
    pub profile_hits: u64,
    /// Candidates compiled (each a miss at compile time).
    pub misses: u64,
    /// Copies of a kernel kept as correct that were compiled and checked again (not timed).
    #[serde(default)]
    pub rechecks: u64,
    /// Keys held now.
    pub entries: u64,
}

impl CacheStats {
    /// Candidates that reached the cache: answered at compile time, compiled, or checked again.
    pub fn candidates(&self) -> u64 {
        self.answered + self.misses + self.rechecks
    }

    /// The counters by name, as `StepMetrics::eval_cache` records them.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        [
            ("answered", self.answered),
            ("misses", self.misses),
            ("rechecks", self.rechecks),
            ("verify_hits", self.verify_hits),
            ("profile_hits", self.profile_hits),
            ("entries", self.entries),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The share of candidates answered whole (`None` when no candidate reached the cache).
    pub fn share(&self) -> Option<f64> {
        let n = self.candidates();
        (n > 0).then(|| self.answered as f64 / n as f64)
    }

    /// [`CacheStats::share`] from counters written by [`CacheStats::counters`] (`None` also when
    /// there are none: no cache).
    pub fn answered_share(counters: &std::collections::BTreeMap<String, u64>) -> Option<f64> {
        let get = |k: &str| counters.get(k).copied();
        CacheStats {
            answered: get("answered")?,
            misses: get("misses").unwrap_or(0),
            rechecks: get("rechecks").unwrap_or(0),
            ..CacheStats::default()
        }
        .share()
    }

    /// One line for logs: "412 of 960 candidates answered whole (42.9%), 30 correct verdicts
    /// checked again, 37 checks and 51 timings shared, 548 keys".
    pub fn line(&self) -> String {
        format!(
            "{} of {} candidates answered whole ({:.1}%), {} correct verdicts checked again, {} \
             checks and {} timings shared, {} keys",
            self.answered,
            self.candidates(),
            100.0 * self.share().unwrap_or(0.0),
            self.rechecks,
            self.verify_hits,
            self.profile_hits,
            self.entries
        )
    }
}

/// An environment in front of another that answers repeated candidates from their first
/// verdict (module docs).
pub struct CachedEnv {
    inner: Arc<dyn KernelEnv>,
    capacity: usize,
    /// The keys' slots, and the keys oldest first (one shared copy of each key's text).
    slots: Mutex<(HashMap<Arc<str>, Arc<Slot>>, VecDeque<Arc<str>>)>,
    answered: AtomicU64,
    verify_hits: AtomicU64,
    profile_hits: AtomicU64,
    misses: AtomicU64,
    rechecks: AtomicU64,
}

/// `inner` behind a cache of `capacity` keys; `capacity` 0 gives `inner` back unchanged.
pub fn cached(inner: Arc<dyn KernelEnv>, capacity: usize) -> Arc<dyn KernelEnv> {
    if capacity == 0 {
        inner
    } else {
        Arc::new(CachedEnv::new(inner, capacity))
    }
}

/// A copy answered at compile time whose slot no longer holds the verdict: cannot happen (the
/// copy holds its slot), and is the harness's error, not the candidate's.
fn lost() -> Outcome {
    Outcome::harness("the evaluation cache lost a verdict it answered with")
}

/// Whether `o` may stand for every copy of its candidate (module docs).
fn keepable(o: &Outcome) -> bool {
    !matches!(o, Outcome::HarnessError { .. } | Outcome::Timeout { .. })
}

impl CachedEnv {
    /// `inner` behind a cache of at most `capacity` keys (at least 1).
    pub fn new(inner: Arc<dyn KernelEnv>, capacity: usize) -> Self {
        CachedEnv {
            inner,
            capacity: capacity.max(1),
            slots: Mutex::new((HashMap::new(), VecDeque::new())),
            answered: AtomicU64::new(0),
            verify_hits: AtomicU64::new(0),
            profile_hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rechecks: AtomicU64::new(0),
        }
    }

    /// The slot of `task` and `source`, made (and the oldest forgotten) when new.
    fn slot(&self, task: &str, source: &str) -> Arc<Slot> {
        let mut key = String::with_capacity(task.len() + 1 + source.len());
        key.push_str(task);
        key.push('\0');
        key.push_str(source);
        let mut guard = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        if let Some(slot) = map.get(key.as_str()) {
            return slot.clone();
        }
        let key: Arc<str> = key.into();
        while map.len() >= self.capacity {
            match order.pop_front() {
                Some(old) => {
                    map.remove(&old);
                }
                None => break,
            }
        }
        let slot = Arc::new(Slot::default());
        map.insert(key.clone(), slot.clone());
        order.push_back(key);
        slot
    }

    fn keyed(compiled: &Compiled) -> Option<&Keyed> {
        compiled.artifact.downcast_ref::<Keyed>()
    }
}

impl KernelEnv for CachedEnv {
    fn describe(&self) -> String {
        format!(
            "{}; repeated candidates answered from a cache of {} keys",
            self.inner.describe(),
            self.capacity
        )
    }

    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome> {
        let slot = self.slot(task, source);
        // A peek: while another copy holds the key (its check or timing runs), this one
        // compiles and waits at the next stage instead of holding a compile thread.
        let known = match slot.known.try_lock() {
            Ok(known) => known.clone(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().clone(),
            Err(std::sync::TryLockError::WouldBlock) => Known::Nothing,
        };
        let mut again = false;
        if let Known::Final(o) = known {
            if !o.is_correct() {
                self.answered.fetch_add(1, Ordering::Relaxed);
                return Err(o);
            }
            again = recheck(slot.passes.fetch_add(1, Ordering::Relaxed) + 1);
            if !again {
                self.answered.fetch_add(1, Ordering::Relaxed);
                // Through the Verifier and the Profiler, which answer it without running.
                return Ok(Compiled {
                    task: task.to_string(),
                    artifact: Arc::new(Keyed {
                        slot,
                        inner: None,
                        recheck: false,
                    }) as Arc<dyn Any + Send + Sync>,
                    compile_ms: 0.0,
                });
            }
        }
        if again {
            self.rechecks.fetch_add(1, Ordering::Relaxed);
        } else {
            self.misses.fetch_add(1, Ordering::Relaxed);
        }
        match self.inner.compile(task, source) {
            Ok(inner) => Ok(Compiled {
                task: inner.task.clone(),
                compile_ms: inner.compile_ms,
                artifact: Arc::new(Keyed {
                    slot,
                    inner: Some(inner),
                    recheck: again,
                }),
            }),
            Err(o) => {
                if keepable(&o) {
                    let mut known = slot.lock();
                    if !matches!(*known, Known::Final(_)) || again {
                        *known = Known::Final(o.clone());
                    }
                }
                Err(o)
            }
        }
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        let Some(keyed) = Self::keyed(compiled) else {
            return self.inner.verify(compiled);
        };
        // The key's lock for the whole check: copies wait for the first one's verdict.
        let mut known = keyed.slot.lock();
        // A copy answered whole at compile time is counted there, not again here.
        let shared = || {
            if keyed.inner.is_some() {
                self.verify_hits.fetch_add(1, Ordering::Relaxed);
            }
        };
        match &*known {
            // A copy checked again runs whatever is known (see [`recheck`]).
            _ if keyed.recheck => {}
            Known::Verified => {
                shared();
                return Ok(());
            }
            Known::Final(o) => {
                shared();
                return if o.is_correct() {
                    Ok(())
                } else {
                    Err(o.clone())
                };
            }
            Known::Nothing => {}
        }
        let Some(inner) = &keyed.inner else {
            // Answered at compile time, then forgotten: cannot happen (the slot is held).
            return Err(lost());
        };
        let verdict = self.inner.verify(inner);
        match &verdict {
            // A pass checked again keeps the kept timing.
            Ok(()) if keyed.recheck => {}
            Ok(()) => *known = Known::Verified,
            // A failure replaces a pass: it is proof, the pass was only evidence.
            Err(o) if keepable(o) => *known = Known::Final(o.clone()),
            Err(_) => {}
        }
        verdict
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        let Some(keyed) = Self::keyed(compiled) else {
            return self.inner.profile(compiled);
        };
        let mut known = keyed.slot.lock();
        if let Known::Final(o) = &*known {
            if keyed.inner.is_some() {
                self.profile_hits.fetch_add(1, Ordering::Relaxed);
            }
            return o.clone();
        }
        let Some(inner) = &keyed.inner else {
            return lost();
        };
        let o = self.inner.profile(inner);
        if keepable(&o) {
            *known = Known::Final(o.clone());
        }
        o
    }

    fn pool_stats(&self) -> Vec<(String, PoolStats)> {
        self.inner.pool_stats()
    }

    fn device_memory_peak(&self) -> Option<u64> {
        self.inner.device_memory_peak()
    }

    fn phase_stats(&self) -> Vec<(String, u64, f64)> {
        self.inner.phase_stats()
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        let entries = self.slots.lock().unwrap_or_else(|e| e.into_inner()).0.len() as u64;
        Some(CacheStats {
            answered: self.answered.load(Ordering::Relaxed),
            verify_hits: self.verify_hits.load(Ordering::Relaxed),
            profile_hits: self.profile_hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rechecks: self.rechecks.load(Ordering::Relaxed),
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// Test double of an environment (no compiler, no device): its verdict is written in the
    /// source ("wrong", "crash", "slow" for a timeout at verification, "harness", "noisy" for a
    /// timeout of the timing, else correct), it counts its calls, and its checks take a while so
    /// that copies in flight overlap.
    #[derive(Default)]
    struct Counting {
        compiles: AtomicU64,
        verifies: AtomicU64,
        profiles: AtomicU64,
    }

    impl KernelEnv for Counting {
        fn describe(&self) -> String {
            "counting test double".into()
        }
        fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome> {
            self.compiles.fetch_add(1, Ordering::SeqCst);
            if source.contains("syntax") {
                return Err(Outcome::CompileError {
                    log: "error: expected ';'".into(),
                });
            }
            Ok(Compiled {
                task: task.into(),
                artifact: Arc::new(source.to_string()),
                compile_ms: 1.0,
            })
        }
        fn verify(&self, c: &Compiled) -> Result<(), Outcome> {
            let n = self.verifies.fetch_add(1, Ordering::SeqCst);
            let source = checked(c);
            // A lottery kernel: passes the first check of the run, fails every later one.
            if source.contains("wrong") || (source.contains("lottery") && n > 0) {
                Err(Outcome::Wrong {
                    reason: "out[3] differs".into(),
                    mismatch: None,
                })
            } else if source.contains("crash") {
                Err(Outcome::Crash {
                    reason: "illegal address".into(),
                })
            } else if source.contains("slow") {
                Err(Outcome::Timeout {
                    stage: "verify".into(),
                    limit_ms: 10,
                })
            } else if source.contains("harness") {
                Err(Outcome::harness("the worker died"))
            } else {
                Ok(())
            }
        }
        fn profile(&self, c: &Compiled) -> Outcome {
            let n = self.profiles.fetch_add(1, Ordering::SeqCst);
            let source = checked(c);
            if source.contains("noisy") {
                return Outcome::Timeout {
                    stage: "profile".into(),
                    limit_ms: 10,
                };
            }
            Outcome::Correct {
                kernel_ms: 1.0 + n as f64,
                baseline_ms: 2.0,
                spread: 0.01,
                timing: "test".into(),
            }
        }
    }

    /// The double's candidate text, after a while (so that copies in flight overlap).
    fn checked(c: &Compiled) -> &str {
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.artifact
            .downcast_ref::<String>()
            .expect("this double's artifact")
    }

    fn setup(capacity: usize) -> (Arc<Counting>, CachedEnv) {
        let inner = Arc::new(Counting::default());
        let env = CachedEnv::new(inner.clone(), capacity);
        (inner, env)
    }

    /// The whole pipeline, as the actors run it: compile, verify, profile.
    fn evaluate(env: &dyn KernelEnv, task: &str, source: &str) -> Outcome {
        let c = match env.compile(task, source) {
            Ok(c) => c,
            Err(o) => return o,
        };
        match env.verify(&c) {
            Ok(()) => env.profile(&c),
            Err(o) => o,
        }
    }

    fn calls(c: &Counting) -> [u64; 3] {
        [&c.compiles, &c.verifies, &c.profiles].map(|n| n.load(Ordering::SeqCst))
    }

    #[test]
    fn a_repeated_candidate_gets_its_first_verdict_without_running_again() {
        let (inner, env) = setup(16);
        for source in ["kernel wrong", "kernel crash", "syntax"] {
            let o = evaluate(&env, "relu", source);
            assert!(!o.is_correct(), "{o:?}");
            for _ in 0..3 {
                assert_eq!(evaluate(&env, "relu", source), o);
            }
        }
        assert_eq!(calls(&inner), [3, 2, 0], "a failure's copies ran nothing");
        let s = env.cache_stats().expect("stats");
        assert_eq!((s.answered, s.misses, s.entries), (9, 3, 3), "{s:?}");
        assert_eq!(
            (s.verify_hits, s.profile_hits),
            (0, 0),
            "copies answered whole count once: {s:?}"
        );
        assert!(
            s.line()
                .starts_with("9 of 12 candidates answered whole (75.0%)"),
            "{}",
            s.line()
        );
    }

    #[test]
    fn a_pass_is_checked_again_at_the_1st_2nd_4th_8th_copy_and_never_timed_again() {
        let (inner, env) = setup(16);
        let first = evaluate(&env, "relu", "kernel A");
        assert!(first.is_correct(), "{first:?}");
        let mut checks = Vec::new();
        for _ in 0..10 {
            assert_eq!(evaluate(&env, "relu", "kernel A"), first, "the kept timing");
            checks.push(calls(&inner)[1]);
        }
        // Copies 1, 2, 4 and 8 were checked again.
        assert_eq!(checks, [2, 3, 3, 4, 4, 4, 4, 5, 5, 5]);
        assert_eq!(calls(&inner)[2], 1, "timed once");
        let s = env.cache_stats().expect("stats");
        assert_eq!((s.answered, s.misses, s.rechecks), (6, 1, 4), "{s:?}");
    }

    #[test]
    fn a_kernel_that_passed_by_chance_loses_its_pass_at_its_next_check() {
        let (inner, env) = setup(16);
        assert!(evaluate(&env, "relu", "kernel lottery").is_correct());
        // Its first copy is checked again, fails, and the failure stands for every later copy.
        for _ in 0..5 {
            let o = evaluate(&env, "relu", "kernel lottery");
            assert!(matches!(o, Outcome::Wrong { .. }), "{o:?}");
        }
        assert_eq!(calls(&inner), [2, 2, 1]);
    }

    #[test]
    fn the_counters_a_step_records_give_the_share_answered() {
        let (_, env) = setup(16);
        let none = env.cache_stats().expect("stats").counters();
        assert_eq!(CacheStats::answered_share(&none), None, "no candidate yet");
        for _ in 0..4 {
            evaluate(&env, "relu", "kernel A");
        }
        let c = env.cache_stats().expect("stats").counters();
        // The 1st and 2nd copies were checked again, the 3rd answered whole.
        assert_eq!((c["answered"], c["misses"], c["rechecks"]), (1, 1, 2));
        assert_eq!(CacheStats::answered_share(&c), Some(0.25));
        assert_eq!(
            CacheStats::answered_share(&Default::default()),
            None,
            "no cache"
        );
    }

    #[test]
    fn the_key_is_the_task_and_the_exact_text() {
        let (inner, env) = setup(16);
        evaluate(&env, "relu", "kernel A");
        evaluate(&env, "gelu", "kernel A");
        evaluate(&env, "relu", "kernel A ");
        evaluate(&env, "relu", "kernel a");
        assert_eq!(
            calls(&inner),
            [4, 4, 4],
            "another task or one byte more is another key"
        );
    }

    #[test]
    fn harness_errors_and_timeouts_are_judged_again_for_every_copy() {
        let (inner, env) = setup(16);
        for source in ["kernel harness", "kernel slow"] {
            for _ in 0..3 {
                let o = evaluate(&env, "relu", source);
                assert!(
                    matches!(o, Outcome::HarnessError { .. } | Outcome::Timeout { .. }),
                    "{o:?}"
                );
            }
        }
        assert_eq!(calls(&inner), [6, 6, 0]);
        // A timing that timed out: the check is shared, the timing is not.
        for _ in 0..3 {
            let o = evaluate(&env, "relu", "kernel noisy");
            assert!(matches!(o, Outcome::Timeout { .. }), "{o:?}");
        }
        assert_eq!(calls(&inner), [9, 7, 3]);
    }

    #[test]
    fn copies_in_flight_wait_for_the_first_and_share_its_verdict() {
        let (inner, env) = setup(16);
        let env = Arc::new(env);
        let n = 8;
        // All copies are compiled before any is checked, as when a group arrives at once.
        let barrier = Arc::new(Barrier::new(n));
        let outcomes: Vec<Outcome> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let (env, barrier) = (env.clone(), barrier.clone());
                    s.spawn(move || {
                        let c = env.compile("relu", "kernel A").expect("compiles");
                        barrier.wait();
                        env.verify(&c).expect("correct");
                        env.profile(&c)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        assert!(outcomes.iter().all(|o| *o == outcomes[0]), "{outcomes:?}");
        assert_eq!(
            calls(&inner),
            [n as u64, 1, 1],
            "one check and one timing for {n} copies"
        );
        let s = env.cache_stats().expect("stats");
        assert_eq!(
            (s.verify_hits, s.profile_hits),
            (n as u64 - 1, n as u64 - 1),
            "{s:?}"
        );
    }

    #[test]
    fn the_oldest_keys_are_forgotten_past_the_capacity() {
        let (inner, env) = setup(2);
        for source in ["k1 wrong", "k2 wrong", "k3 wrong"] {
            evaluate(&env, "relu", source);
        }
        assert_eq!(env.cache_stats().expect("stats").entries, 2);
        evaluate(&env, "relu", "k3 wrong");
        assert_eq!(calls(&inner)[0], 3, "k3 is still known");
        evaluate(&env, "relu", "k1 wrong");
        assert_eq!(calls(&inner)[0], 4, "k1 was forgotten and is judged again");
    }

    #[test]
    fn no_capacity_gives_the_environment_back_unchanged() {
        let inner: Arc<dyn KernelEnv> = Arc::new(Counting::default());
        assert!(cached(inner.clone(), 0).cache_stats().is_none());
        assert!(cached(inner, 1).cache_stats().is_some());
    }
}
