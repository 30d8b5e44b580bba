//! The device buffers of one task at one preset: the tensors the candidate sees (with slack and
//! canaries), the masked references and input copies, and the baseline's intermediates.

use crate::baseline::EagerPlan;
use crate::tasks::{Preset, Role, Task, TensorSpec};
use crate::verify::buffer::dtype_size;
use crate::verify::correctness::HarnessError;

use super::device::{DevBuf, Gpu, GpuError};
use super::fault::{harness, harness_text};
use super::harness::{Harness, MIN_RUN_LIMIT, RUN_FACTOR, RUN_LIMIT, SLACK};

pub(super) fn alloc_tensor(gpu: &Gpu, spec: &TensorSpec) -> Result<DevBuf, GpuError> {
    gpu.alloc(spec.numel() * dtype_size(spec.dtype) + SLACK)
}

/// Device buffers of one task at one preset: the tensors the candidate sees (with slack), the
/// masked references and input copies, and the baseline's intermediates.
pub struct TaskBuffers<'t> {
    pub(super) task: &'t Task,
    pub(super) specs: Vec<TensorSpec>,
    pub(super) n_inputs: usize,
    /// The baseline in the task's dtypes: what candidates are timed against.
    pub(super) plan: EagerPlan,
    /// The same program in f64: the reference of the correctness protocol.
    pub(super) ref_plan: EagerPlan,
    pub(super) tensors: Vec<DevBuf>,
    /// Masked references, 8 bytes per element.
    pub(super) refs: Vec<DevBuf>,
    pub(super) snaps: Vec<DevBuf>,
    pub(super) temps: Vec<DevBuf>,
    /// f64 copies of the inputs and the f64 plan's intermediates.
    pub(super) wide: Vec<DevBuf>,
    pub(super) ref_temps: Vec<DevBuf>,
}

impl<'t> TaskBuffers<'t> {
    /// Allocates everything for `task` at `preset`.
    pub fn new(h: &mut Harness, task: &'t Task, preset: Preset) -> Result<Self, HarnessError> {
        let specs = task.signature(preset).tensors;
        let n_inputs = specs.iter().filter(|t| t.role == Role::Input).count();
        let plan = h.baseline_plan(task, preset).map_err(harness_text)?;
        let ref_plan = h.reference_plan(task, preset).map_err(harness_text)?;
        if plan.buffers.len() < specs.len() || ref_plan.buffers.len() < specs.len() {
            return Err(harness_text(
                "the baseline plan has fewer buffers than the task has tensors",
            ));
        }
        let gpu = &h.gpu;
        let tensors = specs
            .iter()
            .map(|s| alloc_tensor(gpu, s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let refs = specs[n_inputs..]
            .iter()
            .map(|s| gpu.alloc(s.numel() * 8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let wide = specs[..n_inputs]
            .iter()
            .map(|s| gpu.alloc(s.numel() * 8))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let ref_temps = ref_plan.buffers[specs.len()..]
            .iter()
            .map(|b| gpu.alloc(b.stored_bytes(ref_plan.precision)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let snaps = specs[..n_inputs]
            .iter()
            .map(|s| alloc_tensor(gpu, s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        let temps = plan.buffers[specs.len()..]
            .iter()
            .map(|b| gpu.alloc(b.elems * dtype_size(b.dtype)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        Ok(TaskBuffers {
            task,
            specs,
            n_inputs,
            plan,
            ref_plan,
            tensors,
            refs,
            snaps,
            temps,
            wide,
            ref_temps,
        })
    }

    /// The limit of one verification run of a candidate for this task: [`RUN_FACTOR`] times
    /// the baseline's time on this GPU (its second run, on inputs drawn from a fixed seed),
    /// within [`MIN_RUN_LIMIT`, `RUN_LIMIT`]. The outputs are zeroed afterwards, so no correct
    /// result is left in memory the candidate can reach.
    pub fn run_limit(&self, h: &mut Harness) -> Result<std::time::Duration, HarnessError> {
        let ptrs = self.tensor_ptrs();
        let (inputs, outputs) = ptrs.split_at(self.n_inputs);
        self.generate(h, inputs, 0).map_err(harness)?;
        let base = self.baseline_ptrs(inputs, outputs);
        let events = h.gpu.timer().map_err(harness)?;
        let mut ms = 0.0;
        for _ in 0..2 {
            events.start().map_err(harness)?;
            h.run_baseline(&self.plan, &base).map_err(harness)?;
            events.stop().map_err(harness)?;
            ms = events.elapsed_ms().map_err(harness)?;
        }
        for t in &self.tensors[self.n_inputs..] {
            h.gpu.fill_u32(t, 0).map_err(harness)?;
        }
        let limit = std::time::Duration::from_secs_f64(ms * RUN_FACTOR / 1e3);
        Ok(limit.clamp(MIN_RUN_LIMIT, RUN_LIMIT))
    }

    pub(super) fn tensor_ptrs(&self) -> Vec<u64> {
        self.tensors.iter().map(DevBuf::ptr).collect()
    }

    /// Baseline addresses: `inputs`, then `outputs`, then the intermediates.
    pub(super) fn baseline_ptrs(&self, inputs: &[u64], outputs: &[u64]) -> Vec<u64> {
        inputs
            .iter()
            .chain(outputs)
            .copied()
            .chain(self.temps.iter().map(DevBuf::ptr))
            .collect()
    }

    /// Draws the inputs of a trial into `targets` (one buffer per input).
    pub(super) fn generate(&self, h: &Harness, targets: &[u64], seed: u64) -> Result<(), GpuError> {
        for (i, spec) in self.specs[..self.n_inputs].iter().enumerate() {
            let dist = self.task.inputs.get(i).copied().unwrap_or_default();
            let stream = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            h.generate(targets[i], spec.numel(), spec.dtype, dist, seed ^ stream)?;
        }
        Ok(())
    }

    /// Computes the fp64 reference of the task-dtype `inputs` into `outputs` (8 bytes per
    /// element) and masks it with `key`; the f64 copies and intermediates are overwritten
    /// afterwards so no unmasked result stays behind.
    pub(super) fn reference_into(
        &self,
        h: &mut Harness,
        inputs: &[u64],
        outputs: &[u64],
        key: u64,
    ) -> Result<(), GpuError> {
        for ((spec, &src), dst) in self.specs[..self.n_inputs]
            .iter()
            .zip(inputs)
            .zip(&self.wide)
        {
            h.widen(src, dst.ptr(), spec.numel(), spec.dtype)?;
        }
        let ptrs: Vec<u64> = self
            .wide
            .iter()
            .map(DevBuf::ptr)
            .chain(outputs.iter().copied())
            .chain(self.ref_temps.iter().map(DevBuf::ptr))
            .collect();
        h.run_baseline(&self.ref_plan, &ptrs)?;
        for (spec, &out) in self.specs[self.n_inputs..].iter().zip(outputs) {
            h.mask(out, spec.numel(), 8, key)?;
        }
        for t in self.wide.iter().chain(&self.ref_temps) {
            h.gpu.fill_u32(t, 0)?;
        }
        h.gpu.sync()
    }
}
