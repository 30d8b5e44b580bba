//! The correctness protocol's steps on device memory ([`GpuTrials`]): the masked reference
//! computed first (its f64 buffers freed), then the inputs drawn on the device, outputs
//! NaN-filled, inputs checked against the generator (no copy), and the comparisons.

use crate::tasks::{Role, TensorSpec, Tolerance};
use crate::verify::buffer::dtype_size;
use crate::verify::correctness::{
    judge, os_seed, Comparison, ElemFailure, FirstFailure, HarnessError, OutputComparison, Trials,
};
use crate::verify::ExecFailure;

use super::buffers::TaskBuffers;
use super::candidate::Candidate;
use super::device::{DevBuf, GpuError};
use super::fault::{exec_failure, harness};
use super::harness::{fill_bits, Harness, CANARY, SLACK};

/// The correctness protocol's steps on the device ([`Trials`]).
pub struct GpuTrials<'a, 't> {
    h: &'a mut Harness,
    bufs: &'a TaskBuffers<'t>,
    cand: &'a Candidate,
    /// The limit of each candidate run.
    limit: std::time::Duration,
    /// The task tensors (inputs then outputs, with slack): freed while a reference is
    /// computed, allocated again for the candidate's run.
    tensors: Vec<DevBuf>,
    /// The masked references of the current trial.
    refs: Vec<DevBuf>,
    /// The current trial's input seed (the inputs are checked against the generator).
    seed: u64,
    key: u64,
    /// Wall-clock ms spent in each step of the protocol (see [`GpuTrials::spent`]); each step
    /// ends with a synchronisation or a download, so this is GPU time plus launch gaps.
    spent: [f64; 4],
}

impl<'a, 't> GpuTrials<'a, 't> {
    /// Trials of `cand` on `bufs`, each run at most `limit` (see [`TaskBuffers::run_limit`]);
    /// `tensors` are the task tensors the limit was measured on (reused or freed).
    pub fn new(
        h: &'a mut Harness,
        bufs: &'a TaskBuffers<'t>,
        cand: &'a Candidate,
        limit: std::time::Duration,
        tensors: Vec<DevBuf>,
    ) -> Result<Self, HarnessError> {
        let refs = bufs.alloc_refs(h)?;
        Ok(GpuTrials {
            h,
            bufs,
            cand,
            limit,
            tensors,
            refs,
            seed: 0,
            key: 0,
            spent: [0.0; 4],
        })
    }

    /// Milliseconds spent so far drawing inputs and references (`begin`), running the candidate,
    /// checking inputs and canaries (`tampering`) and comparing outputs.
    pub fn spent(&self) -> [(&'static str, f64); 4] {
        let [b, r, t, c] = self.spent;
        [("begin", b), ("run", r), ("tampering", t), ("compare", c)]
    }
}

impl Trials for GpuTrials<'_, '_> {
    fn begin(&mut self, seed: u64) -> Result<(), HarnessError> {
        let t = std::time::Instant::now();
        let out = self.begin_inner(seed);
        self.spent[0] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn run_candidate(&mut self) -> Result<(), ExecFailure> {
        let t = std::time::Instant::now();
        let out = self.run_inner();
        self.spent[1] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn tampering(&mut self) -> Result<Option<String>, HarnessError> {
        let t = std::time::Instant::now();
        let out = self.tampering_inner();
        self.spent[2] += t.elapsed().as_secs_f64() * 1e3;
        out
    }

    fn compare(&mut self) -> Result<Vec<OutputComparison>, HarnessError> {
        let t = std::time::Instant::now();
        let out = self.compare_inner();
        self.spent[3] += t.elapsed().as_secs_f64() * 1e3;
        out
    }
}

impl GpuTrials<'_, '_> {
    fn begin_inner(&mut self, seed: u64) -> Result<(), HarnessError> {
        let b = self.bufs;
        self.key = os_seed().map_err(|e| HarnessError::Seed(e.to_string()))?;
        self.seed = seed;
        // The reference's f64 buffers never coexist with the task tensors: the peak is the
        // larger phase, not their sum (see `buffers::memory_need`).
        self.tensors.clear();
        b.reference(self.h, seed, &self.refs, self.key)
            .map_err(harness)?;
        let mut tensors = b.alloc_tensors(self.h, Role::Input)?;
        tensors.extend(b.alloc_tensors(self.h, Role::Output)?);
        self.tensors = tensors;
        let inputs: Vec<u64> = self.tensors[..b.n_inputs].iter().map(DevBuf::ptr).collect();
        b.generate(self.h, &inputs, seed).map_err(harness)?;
        self.h.gpu.sync().map_err(harness)
    }

    fn run_inner(&mut self) -> Result<(), ExecFailure> {
        let b = self.bufs;
        for (spec, t) in b.specs.iter().zip(&self.tensors).skip(b.n_inputs) {
            self.h
                .fill_output(t, spec.numel(), spec.dtype)
                .map_err(exec_failure)?;
        }
        set_canaries(self.h, &b.specs, &self.tensors).map_err(exec_failure)?;
        self.cand
            .set_scratch_canaries(&self.h.gpu)
            .map_err(exec_failure)?;
        self.h.scribble_shared().map_err(exec_failure)?;
        let ptrs: Vec<u64> = self.tensors.iter().map(DevBuf::ptr).collect();
        self.cand.run(&self.h.gpu, &ptrs, self.limit)
    }

    fn tampering_inner(&mut self) -> Result<Option<String>, HarnessError> {
        let b = self.bufs;
        let inputs: Vec<u64> = self.tensors[..b.n_inputs].iter().map(DevBuf::ptr).collect();
        if let Some(what) = b
            .modified_input(self.h, &inputs, self.seed)
            .map_err(harness)?
        {
            return Ok(Some(what));
        }
        for (spec, t) in b.specs.iter().zip(&self.tensors) {
            let data = spec.numel() * dtype_size(spec.dtype);
            let mut slack = vec![0u8; SLACK];
            self.h
                .gpu
                .download_at(&mut slack, t.ptr() + data as u64, SLACK)
                .map_err(harness)?;
            if slack.iter().any(|&x| x != CANARY) {
                return Ok(Some(format!(
                    "the kernel wrote past the end of {}",
                    spec.name
                )));
            }
        }
        self.cand.scratch_overflow(&self.h.gpu).map_err(harness)
    }

    fn compare_inner(&mut self) -> Result<Vec<OutputComparison>, HarnessError> {
        let b = self.bufs;
        let tol = b.task.tolerance;
        let mut out = Vec::new();
        for (j, spec) in b.specs[b.n_inputs..].iter().enumerate() {
            let got = self.tensors[b.n_inputs + j].ptr();
            let cmp = compare_output(self.h, got, self.refs[j].ptr(), spec, self.key, tol)?;
            out.push(OutputComparison {
                name: spec.name.clone(),
                dtype: spec.dtype,
                cmp,
            });
        }
        Ok(out)
    }
}

pub(super) fn set_canaries(
    h: &Harness,
    specs: &[TensorSpec],
    tensors: &[DevBuf],
) -> Result<(), GpuError> {
    for (spec, t) in specs.iter().zip(tensors) {
        let data = spec.numel() * dtype_size(spec.dtype);
        h.gpu.fill_bytes_at(t.ptr() + data as u64, CANARY, SLACK)?;
    }
    Ok(())
}

/// Compares one output on the device; the first failure is fetched and judged on the host with
/// the protocol's own rule.
pub(super) fn compare_output(
    h: &Harness,
    got: u64,
    want: u64,
    spec: &TensorSpec,
    key: u64,
    tol: Tolerance,
) -> Result<Comparison, HarnessError> {
    let (count, first, max_ratio) = h
        .compare(got, want, spec.numel(), spec.dtype, key, tol)
        .map_err(harness)?;
    let first = match first {
        None => None,
        Some(index) => {
            let (g, graw) = h.element(got, index, spec.dtype, None).map_err(harness)?;
            let w = h
                .reference_element(want, index, spec.dtype, key)
                .map_err(harness)?;
            let fill = graw == fill_bits(spec.dtype);
            let kind = judge(spec.dtype, g, fill, w, tol).unwrap_or(ElemFailure::Differs);
            Some(FirstFailure {
                index: index as usize,
                want: w,
                got: if kind == ElemFailure::Unwritten {
                    f64::NAN
                } else {
                    g
                },
                kind,
            })
        }
    };
    Ok(Comparison {
        first,
        count,
        max_ratio,
    })
}
