//! The device buffers of one task at one preset, and how much device memory they take.
//!
//! [`TaskBuffers`] holds what both protocols share (the plans and the baseline's
//! intermediates) and allocates the rest by phase, so the fp64 machinery of the reference
//! never coexists with the candidate's tensors:
//! - reference phase ([`TaskBuffers::reference`]): the inputs drawn straight into f64
//!   (`kevin_generate_wide`, no task-dtype copy), the f64 outputs and the f64 plan's
//!   intermediates; each float output's reference is narrowed to f32 and masked into the
//!   request's reference buffer; every f64 result is zeroed, and every transient freed, before the next phase;
//! - candidate phase: the task tensors (with slack) the candidate runs on; inputs are checked
//!   for tampering by regenerating them on the fly (`kevin_regen_diff`), so there is no copy.
//!
//! [`memory_need`] is the same arithmetic as a pure function: `kevin tasks` shows it, and the
//! cuda environment refuses a task whose need does not fit its GPU.

use serde::{Deserialize, Serialize};

use crate::baseline::EagerPlan;
use crate::candidate::Limits;
use crate::ops::Dtype;
use crate::tasks::{Preset, Role, Task, TensorSpec};
use crate::verify::buffer::dtype_size;
use crate::verify::correctness::HarnessError;

use super::device::{DevBuf, Gpu, GpuError};
use super::fault::{harness, harness_text};
use super::harness::{reference_width, Harness, MIN_RUN_LIMIT, RUN_FACTOR, RUN_LIMIT, SLACK};

/// Bytes of one task tensor on the device: its data and the canary slack after it.
pub fn tensor_bytes(spec: &TensorSpec) -> usize {
    spec.numel() * dtype_size(spec.dtype) + SLACK
}

/// Bytes of one output's stored (masked) reference: f32 for a float output, i64 for an index.
pub fn reference_bytes(spec: &TensorSpec) -> usize {
    spec.numel() * reference_width(spec.dtype)
}

pub(super) fn alloc_tensor(gpu: &Gpu, spec: &TensorSpec) -> Result<DevBuf, GpuError> {
    gpu.alloc(tensor_bytes(spec))
}

/// The device memory one request of a task takes in a `cuda` worker, in bytes, beyond the
/// worker's fixed buffers ([`WORKER_FIXED_BYTES`]). Both protocols' peaks are given; a worker
/// serves one request at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryNeed {
    /// The correctness protocol's peak.
    pub verify: u64,
    /// The timing protocol's peak.
    pub profile: u64,
}

impl MemoryNeed {
    /// The larger of the two peaks, plus the worker's fixed buffers: what must be free on the
    /// GPU for the task to be evaluated.
    pub fn peak(&self) -> u64 {
        self.verify.max(self.profile) + WORKER_FIXED_BYTES
    }
}

/// A `cuda` worker's own device memory besides any request's: the L2 flush buffer (twice the
/// L2, 120 MiB on an H200), the harness's counters and cuBLAS's workspace, rounded up.
pub const WORKER_FIXED_BYTES: u64 = 256 << 20;

/// The device memory a request of `task` at `preset` takes (see the module docs for the
/// phases). Parts, with I/O the task's inputs/outputs with slack, R the stored references,
/// W/F the f64 inputs/float outputs of the reference, RT the f64 plan's intermediates, T the
/// baseline's intermediates, S the largest scratch a candidate may ask for:
/// - verify: T + S + R + max(W + F + RT, I + O)
/// - profile: T + S + R + max(W + F + RT, k I + 2 O): k = 3 input sets, or for inputs over
///   [`super::timer::SHARED_INPUTS_ABOVE`] one, redrawn per timed run; the checked set's outputs
///   and one set shared by the other runs and the baseline.
pub fn memory_need(task: &Task, preset: Preset) -> Result<MemoryNeed, String> {
    let plan = crate::baseline::lower(task, preset).map_err(|e| e.to_string())?;
    let ref_plan = crate::baseline::lower_f64(task, preset).map_err(|e| e.to_string())?;
    let specs = task.signature(preset).tensors;
    let sum = |f: &dyn Fn(&TensorSpec) -> usize, role: Role| -> u64 {
        specs
            .iter()
            .filter(|s| s.role == role)
            .map(|s| f(s) as u64)
            .sum()
    };
    let inputs = sum(&tensor_bytes, Role::Input);
    let outputs = sum(&tensor_bytes, Role::Output);
    let refs = sum(&reference_bytes, Role::Output);
    let wide = sum(&|s| s.numel() * 8, Role::Input);
    let wide_out = sum(&wide_output_bytes, Role::Output);
    let ref_temps: u64 = ref_plan.buffers[specs.len().min(ref_plan.buffers.len())..]
        .iter()
        .map(|b| b.stored_bytes(ref_plan.precision) as u64)
        .sum();
    let temps: u64 = plan.buffers[specs.len().min(plan.buffers.len())..]
        .iter()
        .map(|b| (b.elems * dtype_size(b.dtype)) as u64)
        .sum();
    let scratch = Limits::default().scratch_cap(&task.candidate_signature(preset));
    let reference = wide + wide_out + ref_temps;
    let base = temps + scratch + refs;
    let sets = if inputs <= super::timer::SHARED_INPUTS_ABOVE {
        super::harness::TIMING_SETS as u64
    } else {
        1
    };
    Ok(MemoryNeed {
        verify: base + reference.max(inputs + outputs),
        profile: base + reference.max(sets * inputs + 2 * outputs),
    })
}

/// Bytes of an output's transient f64 result in the reference phase (an index output is
/// computed straight into its reference buffer).
fn wide_output_bytes(spec: &TensorSpec) -> usize {
    if spec.dtype == Dtype::I64 {
        0
    } else {
        spec.numel() * 8
    }
}

/// Plans and the baseline's intermediates of one task at one preset; the tensors, references
/// and the reference's transients are allocated by phase (see the module docs).
pub struct TaskBuffers<'t> {
    pub(super) task: &'t Task,
    pub(super) specs: Vec<TensorSpec>,
    pub(super) n_inputs: usize,
    /// The baseline in the task's dtypes: what candidates are timed against.
    pub(super) plan: EagerPlan,
    /// The same program in f64: the reference of the correctness protocol.
    pub(super) ref_plan: EagerPlan,
    pub(super) temps: Vec<DevBuf>,
}

impl<'t> TaskBuffers<'t> {
    /// Lowers the plans of `task` at `preset` and allocates the baseline's intermediates.
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
        let temps = plan.buffers[specs.len()..]
            .iter()
            .map(|b| h.gpu.alloc(b.elems * dtype_size(b.dtype)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)?;
        Ok(TaskBuffers {
            task,
            specs,
            n_inputs,
            plan,
            ref_plan,
            temps,
        })
    }

    /// The task tensors of `role` (with slack), in signature order.
    pub(super) fn alloc_tensors(
        &self,
        h: &Harness,
        role: Role,
    ) -> Result<Vec<DevBuf>, HarnessError> {
        self.specs
            .iter()
            .filter(|s| s.role == role)
            .map(|s| alloc_tensor(&h.gpu, s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)
    }

    /// One stored reference per output ([`reference_bytes`]).
    pub(super) fn alloc_refs(&self, h: &Harness) -> Result<Vec<DevBuf>, HarnessError> {
        self.specs[self.n_inputs..]
            .iter()
            .map(|s| h.gpu.alloc(reference_bytes(s)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(harness)
    }

    /// The limit of one verification run of a candidate for this task: [`RUN_FACTOR`] times
    /// the baseline's time on this GPU (its second run, on inputs drawn from a fixed seed),
    /// within [`MIN_RUN_LIMIT`, `RUN_LIMIT`], measured on `tensors` (inputs then outputs). The
    /// outputs are zeroed afterwards, so no correct result is left in memory the candidate can
    /// reach.
    pub fn run_limit(
        &self,
        h: &mut Harness,
        tensors: &[DevBuf],
    ) -> Result<std::time::Duration, HarnessError> {
        let ptrs: Vec<u64> = tensors.iter().map(DevBuf::ptr).collect();
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
        for t in &tensors[self.n_inputs..] {
            h.gpu.fill_u32(t, 0).map_err(harness)?;
        }
        let limit = std::time::Duration::from_secs_f64(ms * RUN_FACTOR / 1e3);
        Ok(limit.clamp(MIN_RUN_LIMIT, RUN_LIMIT))
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

    /// The generator's seed of input `i` in the input set of `seed`.
    pub(super) fn input_seed(seed: u64, i: usize) -> u64 {
        seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// The distribution of input `i`, with the extent of its last axis.
    pub(super) fn input_dist(&self, i: usize) -> super::harness::Draw {
        super::harness::Draw {
            dist: self.task.inputs.get(i).copied().unwrap_or_default(),
            cols: self.specs[i].shape.last().copied().unwrap_or(1),
        }
    }

    /// Draws the inputs of the input set of `seed` into `targets` (one buffer per input).
    pub(super) fn generate(&self, h: &Harness, targets: &[u64], seed: u64) -> Result<(), GpuError> {
        for (i, spec) in self.specs[..self.n_inputs].iter().enumerate() {
            let s = Self::input_seed(seed, i);
            h.generate(targets[i], spec.numel(), spec.dtype, self.input_dist(i), s)?;
        }
        Ok(())
    }

    /// The first input of `inputs` that is no longer what the set of `seed` drew, with the
    /// first changed index and the values before and after: "input X was modified (...)".
    pub(super) fn modified_input(
        &self,
        h: &Harness,
        inputs: &[u64],
        seed: u64,
    ) -> Result<Option<String>, GpuError> {
        for (i, spec) in self.specs[..self.n_inputs].iter().enumerate() {
            let (dist, s) = (self.input_dist(i), Self::input_seed(seed, i));
            if let Some(index) = h.regen_diff(inputs[i], spec.numel(), spec.dtype, dist, s)? {
                let (now, _) = h.element(inputs[i], index, spec.dtype, None)?;
                let was = h.generated_element(index, spec.dtype, dist, s)?;
                return Ok(Some(format!(
                    "input {} was modified (index {index}: {was} -> {now})",
                    spec.name
                )));
            }
        }
        Ok(None)
    }

    /// Computes the fp64 reference of the input set of `seed` and stores it, narrowed (f32 for
    /// float outputs, i64 as is) and masked with `key`, in `refs` (one per output). The inputs
    /// are drawn straight into f64; the f64 buffers are zeroed and freed before this returns,
    /// so no unmasked result stays behind and the candidate's phase can reuse the memory.
    pub(super) fn reference(
        &self,
        h: &mut Harness,
        seed: u64,
        refs: &[DevBuf],
        key: u64,
    ) -> Result<(), GpuError> {
        // The f64 inputs are freed without zeroing (the candidate gets the same values); the f64
        // outputs and intermediates are results, zeroed before they are freed.
        let mut wide_inputs = Vec::new();
        let mut transient = Vec::new();
        let mut ptrs = Vec::with_capacity(self.ref_plan.buffers.len());
        for (i, spec) in self.specs[..self.n_inputs].iter().enumerate() {
            let wide = h.gpu.alloc(spec.numel() * 8)?;
            let s = Self::input_seed(seed, i);
            h.generate_wide(
                wide.ptr(),
                spec.numel(),
                0,
                spec.dtype,
                self.input_dist(i),
                s,
            )?;
            ptrs.push(wide.ptr());
            wide_inputs.push(wide);
        }
        let mut narrow = Vec::new();
        for (spec, r) in self.specs[self.n_inputs..].iter().zip(refs) {
            if spec.dtype == Dtype::I64 {
                ptrs.push(r.ptr());
            } else {
                let out = h.gpu.alloc(wide_output_bytes(spec))?;
                ptrs.push(out.ptr());
                narrow.push((out.ptr(), r.ptr(), spec.numel()));
                transient.push(out);
            }
        }
        for b in &self.ref_plan.buffers[self.specs.len()..] {
            let t = h.gpu.alloc(b.stored_bytes(self.ref_plan.precision))?;
            ptrs.push(t.ptr());
            transient.push(t);
        }
        h.run_baseline(&self.ref_plan, &ptrs)?;
        for (src, dst, n) in narrow {
            h.narrow_masked(src, dst, n, key)?;
        }
        for (spec, r) in self.specs[self.n_inputs..].iter().zip(refs) {
            if spec.dtype == Dtype::I64 {
                h.mask(r.ptr(), spec.numel(), reference_width(spec.dtype), key)?;
            }
        }
        for t in &transient {
            h.gpu.fill_u32(t, 0)?;
        }
        drop((wide_inputs, transient));
        h.gpu.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_need_is_the_phases_arithmetic() {
        let suite = crate::tasks::TaskSuite::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tasks"))
            .expect("the task suite loads");
        // relu: one f32 input X, one f32 output Y, no intermediates.
        let task = suite.get("relu").expect("relu is in the suite");
        let sig = task.signature(Preset::Gpu);
        assert_eq!(sig.tensors.len(), 2, "{:?}", sig.tensors);
        let n = sig.tensors[0].numel() as u64;
        let need = memory_need(task, Preset::Gpu).unwrap();
        let scratch = Limits::default().scratch_cap(&task.candidate_signature(Preset::Gpu));
        let tensor = 4 * n + SLACK as u64;
        let reference = 8 * n + 8 * n; // f64 input + f64 output
        let base = scratch + 4 * n; // f32 reference
        assert!(tensor <= super::super::timer::SHARED_INPUTS_ABOVE);
        assert_eq!(need.verify, base + reference.max(2 * tensor));
        // Three input sets of its own, the checked outputs and the shared ones.
        assert_eq!(need.profile, base + reference.max(5 * tensor));
        assert_eq!(
            need.peak(),
            need.verify.max(need.profile) + WORKER_FIXED_BYTES
        );
        // At KernelBench's sizes (benches/data/large-tasks) the sets share their inputs, and the
        // need is within 3x of the task's inputs and outputs (torch eager's floor).
        let large = crate::tasks::TaskSuite::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/data/large-tasks"
        ))
        .expect("the large tasks load");
        let relu = large.get("relu_large").unwrap();
        let n = relu.signature(Preset::Gpu).tensors[0].numel() as u64;
        assert_eq!(n, 4096 * 393216);
        let need = memory_need(relu, Preset::Gpu).unwrap();
        let tensor = 4 * n + SLACK as u64;
        let scratch = Limits::default().scratch_cap(&relu.candidate_signature(Preset::Gpu));
        assert_eq!(need.profile, scratch + 4 * n + (16 * n).max(3 * tensor));
        for t in large.tasks() {
            let need = memory_need(t, Preset::Gpu).unwrap();
            let io: u64 = t
                .signature(Preset::Gpu)
                .tensors
                .iter()
                .map(|s| (s.numel() * dtype_size(s.dtype)) as u64)
                .sum();
            assert!(
                need.peak() <= 3 * io,
                "{}: {need:?} vs {io} bytes of tensors",
                t.name
            );
        }
        // Every task of the suite has a need, and the GPU preset's fits an H200 many times over.
        for t in suite.tasks() {
            let need = memory_need(t, Preset::Gpu).unwrap();
            assert!(need.peak() < 40 << 30, "{}: {need:?}", t.name);
        }
    }
}
