//! The simulated kernel environment: latencies and outcome probabilities from the configuration
//! (`env.kind = "simulated"`), nothing compiled or run. It decides from the turn and random draw
//! the simulated policy ([`crate::sim::SimPolicy`]) writes into its canned kernel, so the actor
//! system runs end to end without a GPU; every outcome says "simulated". The nvrtc environment
//! ([`super::nvrtc`]) uses it for the verdicts it cannot yet reach.

use std::sync::Arc;
use std::time::Duration;

use crate::config::SimEnvSection;
use crate::env::{Compiled, KernelEnv};
use crate::outcome::{Mismatch, Outcome};
use crate::rng::SplitMix64;

/// Sleeps `ms` milliseconds (the configured latency of a simulated step); 0 returns at once.
pub(crate) fn sleep_ms(ms: f64) {
    if ms > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(ms / 1000.0));
    }
}

/// What the simulated environment decides from: the turn and random draw the simulated policy
/// wrote into its canned kernel, or, for any other source, a hash of the source (turn 0).
#[derive(Debug, Clone, Copy)]
pub struct SimArtifact {
    turn: u32,
    draw: u64,
}

impl SimArtifact {
    /// The artifact of `source`.
    pub fn of(source: &str) -> SimArtifact {
        parse_marker(source).unwrap_or_else(|| {
            // FNV-1a: any stable hash does; the same source always gets the same verdicts.
            let draw = source.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            });
            SimArtifact { turn: 0, draw }
        })
    }

    /// The same artifact with its draw mixed with `salt`, so repeated evaluations of one source
    /// get independent simulated verdicts.
    pub fn salted(self, salt: u64) -> SimArtifact {
        SimArtifact {
            turn: self.turn,
            draw: SplitMix64::derive(self.draw, salt).next_u64(),
        }
    }
}

/// An environment whose latencies and outcome probabilities are configured; later turns fail
/// less often (refinement helps), so rewards have structure for the learner's math to act on.
#[derive(Debug)]
pub struct SimEnv {
    cfg: SimEnvSection,
    /// Verifications so far: salts the busy draw, so that a candidate sent again may be judged.
    verifies: std::sync::atomic::AtomicU64,
}

impl SimEnv {
    /// A simulated environment.
    pub fn new(cfg: SimEnvSection) -> Self {
        SimEnv {
            cfg,
            verifies: Default::default(),
        }
    }

    fn artifact(compiled: &Compiled) -> SimArtifact {
        compiled
            .artifact
            .downcast_ref::<SimArtifact>()
            .copied()
            .unwrap_or(SimArtifact { turn: 0, draw: 0 })
    }

    fn p(&self, base: f64, turn: u32) -> f64 {
        base * self.cfg.improve_per_turn.powi(turn as i32)
    }
}

fn parse_marker(source: &str) -> Option<SimArtifact> {
    let line = source
        .lines()
        .find_map(|l| l.trim().strip_prefix("// sim:"))?;
    let mut turn = None;
    let mut draw = None;
    for part in line.split_whitespace() {
        if let Some(v) = part.strip_prefix("turn=") {
            turn = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("draw=") {
            draw = v.parse().ok();
        }
    }
    Some(SimArtifact {
        turn: turn?,
        draw: draw?,
    })
}

impl KernelEnv for SimEnv {
    fn describe(&self) -> String {
        format!(
            "simulated kernel environment (nothing compiles or runs): compile {} ms, verify {} ms, profile {} ms",
            self.cfg.compile_ms, self.cfg.verify_ms, self.cfg.profile_ms
        )
    }

    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome> {
        sleep_ms(self.cfg.compile_ms);
        let Some(art) = parse_marker(source) else {
            return Err(Outcome::CompileError {
                log: "simulated compiler: this source was not written by the simulated policy"
                    .into(),
            });
        };
        let mut rng = SplitMix64::derive(art.draw, 11);
        if rng.next_f64() < self.cfg.p_panic {
            panic!("simulated environment: injected panic while compiling for {task}");
        }
        if rng.next_f64() < self.p(self.cfg.p_compile_error, art.turn) {
            return Err(Outcome::CompileError {
                log: "sim.cu(3): error: identifier \"tile\" is undefined (simulated)".into(),
            });
        }
        Ok(Compiled {
            task: task.to_string(),
            artifact: Arc::new(art),
            compile_ms: self.cfg.compile_ms,
        })
    }

    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        sleep_ms(self.cfg.verify_ms);
        let art = Self::artifact(compiled);
        // Its own stream, so the other draws do not depend on this setting.
        if SplitMix64::derive(art.draw, 14).next_f64() < self.cfg.p_harness_error {
            return Err(Outcome::harness(
                "simulated out-of-memory of the harness's buffers",
            ));
        }
        // A fresh draw on every attempt: a machine too busy now may not be next time.
        let attempt = self
            .verifies
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if SplitMix64::derive(art.draw ^ attempt, 15).next_f64() < self.cfg.p_busy {
            return Err(Outcome::busy(
                "the machine is too busy: the worker waited for a CPU (simulated)",
            ));
        }
        let mut rng = SplitMix64::derive(art.draw, 12);
        if rng.next_f64() < self.p(self.cfg.p_crash, art.turn) {
            return Err(Outcome::Crash {
                reason: "simulated illegal memory access".into(),
            });
        }
        if rng.next_f64() < self.p(self.cfg.p_wrong, art.turn) {
            return Err(Outcome::Wrong {
                reason: "values differ (simulated)".into(),
                mismatch: Some(Mismatch {
                    output: "Y".into(),
                    index: rng.below(1024),
                    expected: 1.0,
                    got: 0.0,
                    mismatches: 1 + rng.below(100),
                    trial: 0,
                }),
            });
        }
        Ok(())
    }

    fn profile(&self, compiled: &Compiled) -> Outcome {
        sleep_ms(self.cfg.profile_ms);
        let art = Self::artifact(compiled);
        let mut rng = SplitMix64::derive(art.draw, 13);
        let speedup =
            self.cfg.median_speedup * (0.5 * rng.normal()).exp() * (1.0 + 0.1 * art.turn as f64);
        Outcome::Correct {
            kernel_ms: 1.0 / speedup,
            baseline_ms: 1.0,
            spread: 0.005,
            timing: "simulated".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_turns_fail_less() {
        let env = SimEnv::new(SimEnvSection {
            compile_ms: 0.0,
            p_compile_error: 0.5,
            improve_per_turn: 0.2,
            ..Default::default()
        });
        let fails = |turn: u32| {
            (0..2000)
                .filter(|d| {
                    env.compile("t", &format!("// sim: turn={turn} draw={d}"))
                        .is_err()
                })
                .count()
        };
        let (first, later) = (fails(0), fails(2));
        assert!(first > 800 && later < 100, "first {first}, later {later}");
    }
}
