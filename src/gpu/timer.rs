//! The timing protocol's [`Timer`] on the device ([`GpuTimer`]): CUDA events, the L2 flushed
//! before every timed run, input sets rotated, and the last timed output re-checked.

use crate::verify::correctness::{os_seed, HarnessError};
use crate::verify::timing::{Timer, Which};
use crate::verify::ExecFailure;

use super::buffers::{alloc_tensor, TaskBuffers};
use super::candidate::Candidate;
use super::device::{DevBuf, EventPair};
use super::fault::{exec_failure, harness, overran};
use super::harness::{Harness, RUN_LIMIT, TIMING_SETS};
use super::trials::compare_output;

/// One input set of the timing protocol, with the outputs of the candidate's runs on it.
struct InputSet {
    inputs: Vec<DevBuf>,
    outputs: Vec<DevBuf>,
}

/// The timing protocol's [`Timer`] on the device: CUDA events around the whole launch sequence,
/// the L2 flushed before every timed run, [`TIMING_SETS`] input sets rotated, and the output of
/// the last timed candidate run on one of them re-checked afterwards ([`GpuTimer::recheck`]).
///
/// Every set keeps its own output buffers, so the last timed output of each set is still there
/// when timing ends. Only the checked set, drawn from the OS after the candidate was loaded,
/// has an fp64 reference: a kernel cannot tell which of its timed runs will be checked, and the
/// timing run pays for one reference instead of one per set.
pub struct GpuTimer<'a, 't> {
    h: &'a mut Harness,
    bufs: &'a TaskBuffers<'t>,
    cand: &'a Candidate,
    sets: Vec<InputSet>,
    /// The set whose last timed output is re-checked, and its masked reference.
    checked: usize,
    refs: Vec<DevBuf>,
    base_out: Vec<DevBuf>,
    events: EventPair,
    key: u64,
    turn: [usize; 2],
}

impl<'a, 't> GpuTimer<'a, 't> {
    /// Draws the input sets and the checked set's reference.
    pub fn new(
        h: &'a mut Harness,
        bufs: &'a TaskBuffers<'t>,
        cand: &'a Candidate,
    ) -> Result<Self, HarnessError> {
        let seed = || os_seed().map_err(|e| HarnessError::Seed(e.to_string()));
        let key = seed()?;
        let checked = (seed()? % TIMING_SETS as u64) as usize;
        let outputs_of = |h: &Harness| {
            bufs.specs[bufs.n_inputs..]
                .iter()
                .map(|s| alloc_tensor(&h.gpu, s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(harness)
        };
        let mut sets = Vec::new();
        for _ in 0..TIMING_SETS {
            let inputs = bufs.specs[..bufs.n_inputs]
                .iter()
                .map(|s| alloc_tensor(&h.gpu, s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(harness)?;
            let outputs = outputs_of(h)?;
            let ip: Vec<u64> = inputs.iter().map(DevBuf::ptr).collect();
            bufs.generate(h, &ip, seed()?).map_err(harness)?;
            sets.push(InputSet { inputs, outputs });
        }
        let refs = bufs.specs[bufs.n_inputs..]
            .iter()
            .map(|s| h.gpu.alloc(s.numel() * 8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let ip: Vec<u64> = sets[checked].inputs.iter().map(DevBuf::ptr).collect();
        let rp: Vec<u64> = refs.iter().map(DevBuf::ptr).collect();
        bufs.reference_into(h, &ip, &rp, key).map_err(harness)?;
        let base_out = outputs_of(h)?;
        let events = h.gpu.timer().map_err(harness)?;
        Ok(GpuTimer {
            h,
            bufs,
            cand,
            sets,
            checked,
            refs,
            base_out,
            events,
            key,
            turn: [0, 0],
        })
    }

    /// Compares the output of the last timed candidate run on the checked set with its
    /// reference: a kernel that is right while checked and wrong (or lazy) while timed is caught
    /// here. When no timed run used that set (a timing configuration with fewer candidate runs
    /// than sets), the candidate is run on it once first.
    pub fn recheck(&mut self) -> Result<Option<String>, HarnessError> {
        let b = self.bufs;
        let set = &self.sets[self.checked];
        if self.turn[0] <= self.checked {
            for (spec, o) in b.specs[b.n_inputs..].iter().zip(&set.outputs) {
                self.h
                    .fill_output(o, spec.numel(), spec.dtype)
                    .map_err(harness)?;
            }
            let ptrs: Vec<u64> = set
                .inputs
                .iter()
                .chain(&set.outputs)
                .map(DevBuf::ptr)
                .collect();
            match self.cand.run(&self.h.gpu, &ptrs, RUN_LIMIT) {
                Ok(()) => {}
                Err(ExecFailure::Harness(e)) => return Err(HarnessError::Backend(e)),
                Err(f) => return Ok(Some(format!("a timed run failed: {f}"))),
            }
        }
        for (j, spec) in b.specs[b.n_inputs..].iter().enumerate() {
            let cmp = compare_output(
                self.h,
                set.outputs[j].ptr(),
                self.refs[j].ptr(),
                spec,
                self.key,
                b.task.tolerance,
            )?;
            if let Some(first) = cmp.first {
                return Ok(Some(format!(
                    "the output of a timed run is wrong: {} (index {}: expected {}, got {})",
                    first.reason(&spec.name, spec.dtype),
                    first.index,
                    first.want,
                    first.got
                )));
            }
        }
        Ok(None)
    }
}

impl Timer for GpuTimer<'_, '_> {
    fn time_once(&mut self, which: Which) -> Result<f64, ExecFailure> {
        let slot = usize::from(which == Which::Baseline);
        let set = self.turn[slot] % self.sets.len();
        self.turn[slot] += 1;
        let inputs: Vec<u64> = self.sets[set].inputs.iter().map(DevBuf::ptr).collect();
        if which == Which::Candidate {
            // Every timed run starts from NaN outputs, so the checked output is that run's own
            // work (not an earlier run's, left by a kernel that caches and skips). The fill
            // passes through L2: flush again so the run starts as cold as the baseline's.
            let b = self.bufs;
            for (spec, o) in b.specs[b.n_inputs..].iter().zip(&self.sets[set].outputs) {
                self.h
                    .fill_output(o, spec.numel(), spec.dtype)
                    .map_err(exec_failure)?;
            }
            self.h.flush_l2().map_err(exec_failure)?;
        }
        self.events.start().map_err(exec_failure)?;
        match which {
            Which::Candidate => {
                let mut ptrs = inputs;
                ptrs.extend(self.sets[set].outputs.iter().map(DevBuf::ptr));
                self.cand.enqueue(&self.h.gpu, &ptrs)?;
            }
            Which::Baseline => {
                let outs: Vec<u64> = self.base_out.iter().map(DevBuf::ptr).collect();
                let ptrs = self.bufs.baseline_ptrs(&inputs, &outs);
                self.h
                    .run_baseline(&self.bufs.plan, &ptrs)
                    .map_err(exec_failure)?;
            }
        }
        self.events.stop().map_err(exec_failure)?;
        if which == Which::Baseline {
            // Untimed: no correct output of the current input set stays readable for a
            // candidate that scans device memory.
            for b in &self.base_out {
                self.h.gpu.fill_u32(b, 0).map_err(exec_failure)?;
            }
            return self.events.elapsed_ms().map_err(exec_failure);
        }
        match self.events.elapsed_ms_within(RUN_LIMIT) {
            Ok(Some(ms)) => Ok(ms),
            Ok(None) => Err(overran(RUN_LIMIT)),
            Err(e) => Err(exec_failure(e)),
        }
    }

    fn flush_cache(&mut self) {
        // A failed flush shows up at the next launch's error check.
        let _ = self.h.flush_l2();
    }
}
