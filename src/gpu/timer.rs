//! The timing protocol's [`Timer`] on the device ([`GpuTimer`]): CUDA events, the L2 flushed
//! before every timed run, input sets rotated (drawn into one buffer per input; every candidate
//! run on an unchecked set gets freshly drawn inputs), and the last timed output of the checked
//! set re-checked.

use crate::tasks::Role;
use crate::verify::correctness::{os_seed, HarnessError};
use crate::verify::timing::{Timer, Which};
use crate::verify::ExecFailure;

use super::buffers::TaskBuffers;
use super::candidate::Candidate;
use super::device::{DevBuf, EventPair};
use super::fault::{exec_failure, harness, overran};
use super::harness::{Harness, RUN_LIMIT, TIMING_SETS};
use super::trials::compare_output;

/// Inputs (all of a task's, in bytes) above which the timing sets share one input buffer: the
/// level-1 and level-2 tasks keep a buffer per set (each drawn once), tasks at KernelBench's
/// current sizes redraw (untimed) instead of holding three copies.
pub const SHARED_INPUTS_ABOVE: u64 = 1 << 30;

/// Bytes of all of a task's inputs (with slack).
fn input_bytes(bufs: &TaskBuffers) -> u64 {
    bufs.specs[..bufs.n_inputs]
        .iter()
        .map(|s| super::buffers::tensor_bytes(s) as u64)
        .sum()
}

/// The timing protocol's [`Timer`] on the device: CUDA events around the whole launch sequence,
/// the L2 flushed before every timed run, [`TIMING_SETS`] input sets rotated, and the output of
/// the last timed candidate run on one of them re-checked afterwards ([`GpuTimer::recheck`]).
///
/// For a large task the sets share one input buffer per input: a set is drawn into it
/// (untimed, from its own seed) before a run that needs it, so rotating sets costs no memory (a
/// task of 1.6e9 elements fits); smaller tasks keep one buffer per set ([`SHARED_INPUTS_ABOVE`]). The checked set keeps its own outputs, so its last timed output is still there when
/// timing ends; every other candidate run and every baseline run share one more set of outputs.
/// Only the checked set, drawn from the OS after the candidate was loaded, has an fp64
/// reference (computed first, its f64 buffers freed before the sets are allocated): a kernel
/// cannot tell which of its timed runs will be checked.
pub struct GpuTimer<'a, 't> {
    h: &'a mut Harness,
    bufs: &'a TaskBuffers<'t>,
    cand: &'a Candidate,
    /// The input seed of each set.
    seeds: [u64; TIMING_SETS],
    /// Input buffers: one per set for tasks whose inputs take at most
    /// [`SHARED_INPUTS_ABOVE`] bytes (each set drawn once), else one shared by all sets (a set
    /// redrawn before a run that needs it), with the set each holds now.
    slots: Vec<(Vec<DevBuf>, Option<usize>)>,
    /// The slot of the current run.
    slot: usize,
    /// Outputs of the checked set's candidate runs.
    checked_out: Vec<DevBuf>,
    /// Outputs of every other run (candidate or baseline).
    shared_out: Vec<DevBuf>,
    /// The set whose last timed output is re-checked, and its masked reference.
    checked: usize,
    refs: Vec<DevBuf>,
    events: EventPair,
    key: u64,
    turn: [usize; 2],
}

impl<'a, 't> GpuTimer<'a, 't> {
    /// Draws the sets' seeds and computes the checked set's reference.
    pub fn new(
        h: &'a mut Harness,
        bufs: &'a TaskBuffers<'t>,
        cand: &'a Candidate,
    ) -> Result<Self, HarnessError> {
        let seed = || os_seed().map_err(|e| HarnessError::Seed(e.to_string()));
        let key = seed()?;
        let checked = (seed()? % TIMING_SETS as u64) as usize;
        let mut seeds = [0u64; TIMING_SETS];
        for s in &mut seeds {
            *s = seed()?;
        }
        let refs = bufs.alloc_refs(h)?;
        bufs.reference(h, seeds[checked], &refs, key)
            .map_err(harness)?;
        let separate = input_bytes(bufs) <= SHARED_INPUTS_ABOVE;
        let mut slots = Vec::new();
        for _ in 0..if separate { TIMING_SETS } else { 1 } {
            slots.push((bufs.alloc_tensors(h, Role::Input)?, None));
        }
        let checked_out = bufs.alloc_tensors(h, Role::Output)?;
        let shared_out = bufs.alloc_tensors(h, Role::Output)?;
        // Once for all timed runs: nothing but an overflowing candidate run writes the slack,
        // so [`GpuTimer::recheck`] sees a write past a scratch buffer in any of them.
        cand.set_scratch_canaries(&h.gpu).map_err(harness)?;
        let events = h.gpu.timer().map_err(harness)?;
        Ok(GpuTimer {
            h,
            bufs,
            cand,
            seeds,
            slots,
            slot: 0,
            checked_out,
            shared_out,
            checked,
            refs,
            events,
            key,
            turn: [0, 0],
        })
    }

    /// Makes set `set` the current inputs, drawing it into its slot unless it is there
    /// already; true when it drew.
    fn load(&mut self, set: usize) -> Result<bool, crate::gpu::device::GpuError> {
        self.slot = set % self.slots.len();
        if self.slots[self.slot].1 == Some(set) {
            return Ok(false);
        }
        self.slots[self.slot].1 = None;
        let ptrs = self.inputs();
        self.bufs.generate(self.h, &ptrs, self.seeds[set])?;
        self.slots[self.slot].1 = Some(set);
        Ok(true)
    }

    /// The current inputs' addresses.
    fn inputs(&self) -> Vec<u64> {
        self.slots[self.slot].0.iter().map(DevBuf::ptr).collect()
    }

    /// Compares the output of the last timed candidate run on the checked set with its
    /// reference: a kernel that is right while checked and wrong (or lazy) while timed is caught
    /// here. When no timed run used that set (a timing configuration with fewer candidate runs
    /// than sets), the candidate is run on it once first. A write past the end of a scratch
    /// buffer in any timed run (its canaries were set before the first) is caught here too.
    pub fn recheck(&mut self) -> Result<Option<String>, HarnessError> {
        let b = self.bufs;
        if self.turn[0] <= self.checked {
            self.load(self.checked).map_err(harness)?;
            for (spec, o) in b.specs[b.n_inputs..].iter().zip(&self.checked_out) {
                self.h
                    .fill_output(o, spec.numel(), spec.dtype)
                    .map_err(harness)?;
            }
            let mut ptrs = self.inputs();
            ptrs.extend(self.checked_out.iter().map(DevBuf::ptr));
            match self.cand.run(&self.h.gpu, &ptrs, RUN_LIMIT) {
                Ok(()) => {}
                Err(ExecFailure::Harness(e)) => return Err(HarnessError::Backend(e)),
                Err(f) => return Ok(Some(format!("a timed run failed: {f}"))),
            }
        }
        if let Some(reason) = self.cand.scratch_overflow(&self.h.gpu).map_err(harness)? {
            return Ok(Some(reason));
        }
        for (j, spec) in b.specs[b.n_inputs..].iter().enumerate() {
            let cmp = compare_output(
                self.h,
                self.checked_out[j].ptr(),
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
        let set = self.turn[slot] % TIMING_SETS;
        self.turn[slot] += 1;
        if which == Which::Candidate && set != self.checked {
            // Fresh inputs for every timed run of an unchecked set: a kernel that caches its
            // output by a fingerprint of its inputs never sees them again. Only the checked set
            // (one run in TIMING_SETS, too few to move a median) keeps the inputs its reference
            // was computed for.
            self.seeds[set] =
                os_seed().map_err(|e| ExecFailure::Harness(format!("no OS seed: {e}")))?;
            let held = set % self.slots.len();
            if self.slots[held].1 == Some(set) {
                self.slots[held].1 = None;
            }
        }
        let drew = self.load(set).map_err(exec_failure)?;
        let inputs = self.inputs();
        let checked_run = which == Which::Candidate && set == self.checked;
        let b = self.bufs;
        if which == Which::Candidate {
            // Every timed run starts from NaN outputs, so the checked output is that run's own
            // work (not an earlier run's, left by a kernel that caches and skips).
            let outs = if checked_run {
                &self.checked_out
            } else {
                &self.shared_out
            };
            for (spec, o) in b.specs[b.n_inputs..].iter().zip(outs) {
                self.h
                    .fill_output(o, spec.numel(), spec.dtype)
                    .map_err(exec_failure)?;
            }
        }
        // Drawing inputs and filling outputs pass through L2: flush again so the run starts as
        // cold as the protocol's own flush left it.
        if drew || which == Which::Candidate {
            self.h.flush_l2().map_err(exec_failure)?;
        }
        self.events.start().map_err(exec_failure)?;
        match which {
            Which::Candidate => {
                let outs = if checked_run {
                    &self.checked_out
                } else {
                    &self.shared_out
                };
                let mut ptrs = inputs;
                ptrs.extend(outs.iter().map(DevBuf::ptr));
                self.cand.enqueue(&self.h.gpu, &ptrs)?;
            }
            Which::Baseline => {
                let outs: Vec<u64> = self.shared_out.iter().map(DevBuf::ptr).collect();
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
            for b in &self.shared_out {
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
