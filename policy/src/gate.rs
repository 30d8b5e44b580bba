//! The policy's side of the GPU-wide timing lease ([`kevin::gpu::lease`]): a [`StepGate`] holds
//! the lease shared for one step of GPU work (one generator forward pass, one learner
//! micro-batch, one optimizer step) and releases it between steps, so a candidate timed on the
//! same GPU runs alone (`env.timing = "exclusive"`).
//!
//! burn runs kernels asynchronously: a step's work may still be queued on the device when the
//! step's code returns. So the guard ([`GateGuard`]) waits for the device (`B::sync`) before it
//! releases the lease; only then is the step's work really finished.
//!
//! A lease that cannot be taken (a failed `flock`, a nested hold) does not stop generation or
//! training: the step runs without it, and the failure is logged (once per gate) and counted.
//! Waits are counted per party by the core ([`kevin::gpu::lease::wait_totals`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use burn::tensor::backend::Backend;
use kevin::gpu::lease::{GpuLease, Held, Hold};

/// Gates steps of GPU work on the timing lease, or lets them through when there is none.
#[derive(Debug, Default)]
pub struct StepGate {
    lease: Option<GpuLease>,
    /// Steps run without the lease because it could not be taken.
    errors: AtomicU64,
    warned: AtomicBool,
}

/// One step's hold on the lease: waits for the device's queued work, then releases.
pub struct GateGuard<B: Backend> {
    held: Option<Held>,
    device: B::Device,
    /// Wait for the device before releasing (cleared by [`GateGuard::settled`]).
    fence: bool,
}

impl<B: Backend> GateGuard<B> {
    /// How long taking the lease waited (zero without one).
    pub fn waited(&self) -> std::time::Duration {
        self.held
            .as_ref()
            .map_or(std::time::Duration::ZERO, Held::waited)
    }

    /// Releases the lease without waiting for the device: for a step whose work is known to
    /// have finished already (a pass drawn on the device, [`crate::CausalLm::extend_draw`]).
    /// Waiting would also wait for other threads' work on the device (the learner's step), up
    /// to seconds, while a timed candidate waits too.
    pub fn settled(mut self) {
        self.fence = false;
    }
}

impl<B: Backend> Drop for GateGuard<B> {
    fn drop(&mut self) {
        if self.held.is_some() && self.fence {
            // A failed sync surfaces at the next operation on the device; release regardless.
            let _ = B::sync(&self.device);
        }
        self.held = None;
    }
}

impl StepGate {
    /// A gate that lets every step through (no lease: the CPU, or `env.timing = "shared"`).
    pub fn open() -> StepGate {
        StepGate::default()
    }

    /// A gate on `lease` (a handle of this gate's own: handles are not shared between gates).
    pub fn leased(lease: GpuLease) -> StepGate {
        StepGate {
            lease: Some(lease),
            ..StepGate::default()
        }
    }

    /// The gate of the policy's GPU 0 for `party` ("generator", "learner") when `leased`, else
    /// an open gate. An error names the lock file.
    pub fn for_policy_gpu(leased: bool, party: &'static str) -> Result<StepGate, String> {
        if !leased {
            return Ok(StepGate::open());
        }
        let lease =
            GpuLease::for_gpu(0, party).map_err(|e| format!("env.timing = \"exclusive\": {e}"))?;
        tracing::debug!(party, lock = %lease.path().display(), "steps honour the GPU timing lease");
        Ok(StepGate::leased(lease))
    }

    /// Whether this gate takes a lease.
    pub fn is_leased(&self) -> bool {
        self.lease.is_some()
    }

    /// Steps that ran without the lease because it could not be taken.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Waits for the lease (shared) and holds it until the guard drops, which first waits for
    /// the work queued on `device`.
    pub fn enter<B: Backend>(&self, device: &B::Device) -> GateGuard<B> {
        let held = self
            .lease
            .as_ref()
            .and_then(|lease| match lease.take(Hold::Step) {
                Ok(held) => Some(held),
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        tracing::error!(
                            error = %e,
                            "GPU timing lease: a step runs without it (timings on this GPU may be \
                             disturbed); further failures are only counted"
                        );
                    }
                    None
                }
            });
        GateGuard {
            held,
            device: device.clone(),
            fence: true,
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use std::sync::mpsc;
    use std::time::Duration;

    type B = NdArray<f32>;

    fn lock(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kevin-gate-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("gpu-test.lock")
    }

    #[test]
    fn a_step_waits_for_a_timing_run_and_an_open_gate_does_not() {
        let path = lock("wait");
        let timer = GpuLease::open(&path, "test-timer").unwrap();
        let timing = timer.take(Hold::Timing).unwrap();
        let gate = StepGate::leased(GpuLease::open(&path, "test-gate").unwrap());
        assert!(gate.is_leased());
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _step = gate.enter::<B>(&Default::default());
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(150)).is_err());
        drop(timing);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        // An open gate never waits, even while a timing run holds the lease.
        let _timing = timer.take(Hold::Timing).unwrap();
        let open = StepGate::open();
        let _step = open.enter::<B>(&Default::default());
        assert!(!open.is_leased());
    }

    #[test]
    fn a_nested_step_runs_without_the_lease_and_is_counted() {
        let gate = StepGate::leased(GpuLease::open(&lock("nested"), "test-nested").unwrap());
        let outer = gate.enter::<B>(&Default::default());
        assert!(outer.held.is_some());
        let inner = gate.enter::<B>(&Default::default());
        assert!(inner.held.is_none());
        assert_eq!(gate.errors(), 1);
        drop(inner);
        drop(outer);
        assert!(gate.enter::<B>(&Default::default()).held.is_some());
    }
}
