//! The correctness protocol's steps on device memory ([`GpuTrials`]): inputs drawn on the
//! device, outputs NaN-filled, the masked reference and input copy, and the comparisons.

use crate::tasks::{TensorSpec, Tolerance};
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
    key: u64,
    /// Wall-clock ms spent in each step of the protocol (see [`GpuTrials::spent`]); each step
    /// ends with a synchronisation or a download, so this is GPU time plus launch gaps.
    spent: [f64; 4],
}

impl<'a, 't> GpuTrials<'a, 't> {
    /// Trials of `cand` on `bufs`, each run at most `limit` (see [`TaskBuffers::run_limit`]).
    pub fn new(
        h: &'a mut Harness,
        bufs: &'a TaskBuffers<'t>,
        cand: &'a Candidate,
        limit: std::time::Duration,
    ) -> Self {
        GpuTrials {
            h,
            bufs,
            cand,
            limit,
            key: 0,
            spent: [0.0; 4],
        }
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
        let inputs: Vec<u64> = b.tensors[..b.n_inputs].iter().map(DevBuf::ptr).collect();
        let refs: Vec<u64> = b.refs.iter().map(DevBuf::ptr).collect();
        b.generate(self.h, &inputs, seed).map_err(harness)?;
        b.reference_into(self.h, &inputs, &refs, self.key)
            .map_err(harness)?;
        for (i, spec) in b.specs[..b.n_inputs].iter().enumerate() {
            let bytes = spec.numel() * dtype_size(spec.dtype);
            self.h
                .gpu
                .copy(b.snaps[i].ptr(), b.tensors[i].ptr(), bytes)
                .map_err(harness)?;
            self.h
                .mask(
                    b.snaps[i].ptr(),
                    spec.numel(),
                    dtype_size(spec.dtype),
                    self.key,
                )
                .map_err(harness)?;
        }
        self.h.gpu.sync().map_err(harness)
    }

    fn run_inner(&mut self) -> Result<(), ExecFailure> {
        let b = self.bufs;
        for (spec, t) in b.specs.iter().zip(&b.tensors).skip(b.n_inputs) {
            self.h
                .fill_output(t, spec.numel(), spec.dtype)
                .map_err(exec_failure)?;
        }
        set_canaries(self.h, b).map_err(exec_failure)?;
        self.cand
            .set_scratch_canaries(&self.h.gpu)
            .map_err(exec_failure)?;
        self.h.scribble_shared().map_err(exec_failure)?;
        self.cand.run(&self.h.gpu, &b.tensor_ptrs(), self.limit)
    }

    fn tampering_inner(&mut self) -> Result<Option<String>, HarnessError> {
        let b = self.bufs;
        for (i, spec) in b.specs[..b.n_inputs].iter().enumerate() {
            let width = dtype_size(spec.dtype);
            let first = self
                .h
                .diff(
                    b.tensors[i].ptr(),
                    b.snaps[i].ptr(),
                    spec.numel(),
                    width,
                    self.key,
                )
                .map_err(harness)?;
            if let Some(index) = first {
                let (now, _) = self
                    .h
                    .element(b.tensors[i].ptr(), index, spec.dtype, None)
                    .map_err(harness)?;
                let (was, _) = self
                    .h
                    .element(b.snaps[i].ptr(), index, spec.dtype, Some(self.key))
                    .map_err(harness)?;
                return Ok(Some(format!(
                    "input {} was modified (index {index}: {was} -> {now})",
                    spec.name
                )));
            }
        }
        for (spec, t) in b.specs.iter().zip(&b.tensors) {
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
            let got = b.tensors[b.n_inputs + j].ptr();
            let cmp = compare_output(self.h, got, b.refs[j].ptr(), spec, self.key, tol)?;
            out.push(OutputComparison {
                name: spec.name.clone(),
                dtype: spec.dtype,
                cmp,
            });
        }
        Ok(out)
    }
}

pub(super) fn set_canaries(h: &Harness, b: &TaskBuffers) -> Result<(), GpuError> {
    for (spec, t) in b.specs.iter().zip(&b.tensors) {
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
