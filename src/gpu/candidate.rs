//! A candidate's module loaded on the worker's GPU and its launch sequence run on task tensors.

use std::collections::BTreeMap;

use cudarc::driver::sys::CUfunction;

use crate::candidate::{ResolvedArg, ResolvedLaunch, ResolvedPlan, Scalar};
use crate::verify::ExecFailure;

use super::device::{allow_dynamic_smem, ArgPack, DevBuf, Gpu, GpuError, GpuModule};
use super::fault::{candidate_launches, fault_or, overran};
use super::harness::{Harness, CANARY, RUN_LIMIT, SLACK};

/// Why the candidate's module did not load, with the driver's own words. An image the driver
/// cannot use at all (not for this GPU, not an image, a PTX version or JIT it lacks) is the
/// harness's: kevin's own NVRTC made it for this GPU, so the candidate cannot cause that. Any
/// other refusal (out of memory for its static `__device__` arrays, too many resources) is the
/// candidate's launch error; a sticky fault is settled by [`super::fault::fault_or`].
pub(super) fn module_failure(e: GpuError) -> ExecFailure {
    if module_error_is_harness(e.code) {
        return ExecFailure::Harness(format!(
            "the harness could not load a module it compiled: {e}"
        ));
    }
    fault_or(e, |e| {
        ExecFailure::Launch(format!("the module did not load: {}", e))
    })
}

/// `CUresult` codes of a module load that say the harness made an unusable image:
/// INVALID_IMAGE, NO_BINARY_FOR_GPU, INVALID_PTX, JIT_COMPILER_NOT_FOUND,
/// UNSUPPORTED_PTX_VERSION.
pub fn module_error_is_harness(code: u32) -> bool {
    matches!(code, 200 | 209 | 218 | 221 | 222)
}

/// A candidate's module and launch plan, ready to run on task tensors.
pub struct Candidate {
    pub(super) _module: GpuModule,
    pub(super) launches: Vec<(CUfunction, ResolvedLaunch)>,
    /// The plan's scratch buffers, each [`SLACK`] bytes longer than declared (the slack holds
    /// canaries, as after task tensors: a write past a scratch buffer's end would otherwise land
    /// in another pool allocation unnoticed).
    pub(super) scratch: Vec<DevBuf>,
    /// Each scratch buffer's name and declared size in bytes (where its slack starts).
    pub(super) scratch_sizes: Vec<(String, usize)>,
}

impl Candidate {
    /// Loads the module and looks up every launched kernel (`symbols`: source name -> lowered).
    pub fn load(
        h: &Harness,
        image: &[u8],
        symbols: &BTreeMap<String, String>,
        plan: &ResolvedPlan,
    ) -> Result<Candidate, ExecFailure> {
        let module = h.gpu.load_module(image).map_err(module_failure)?;
        let mut launches = Vec::new();
        for l in &plan.launches {
            let symbol = symbols
                .get(&l.kernel)
                .map_or(l.kernel.as_str(), String::as_str);
            let f = module.function(symbol).map_err(|e| {
                ExecFailure::Launch(format!("kernel `{}` not found: {e}", l.kernel))
            })?;
            // SAFETY: `f` belongs to `module`, which the candidate keeps loaded.
            unsafe { allow_dynamic_smem(f, l.smem_bytes) }.map_err(|e| {
                ExecFailure::Launch(format!(
                    "launch line {}: {} bytes of dynamic shared memory refused: {e}",
                    l.line, l.smem_bytes
                ))
            })?;
            launches.push((f, l.clone()));
        }
        let scratch_sizes: Vec<(String, usize)> = plan
            .scratch
            .iter()
            .map(|s| (s.name.clone(), (s.elems * s.dtype.size_bytes()) as usize))
            .collect();
        let scratch = scratch_sizes
            .iter()
            .map(|(_, bytes)| h.gpu.alloc(bytes + SLACK))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        Ok(Candidate {
            _module: module,
            launches,
            scratch,
            scratch_sizes,
        })
    }

    /// Fills the slack after every scratch buffer with [`CANARY`] (asynchronously, on the
    /// stream, so before the next launch).
    pub(super) fn set_scratch_canaries(&self, gpu: &Gpu) -> Result<(), GpuError> {
        for (buf, (_, bytes)) in self.scratch.iter().zip(&self.scratch_sizes) {
            gpu.fill_bytes_at(buf.ptr() + *bytes as u64, CANARY, SLACK)?;
        }
        Ok(())
    }

    /// The reason when the slack of a scratch buffer no longer holds [`CANARY`] (the kernel
    /// wrote past its end since [`Candidate::set_scratch_canaries`]).
    pub(super) fn scratch_overflow(&self, gpu: &Gpu) -> Result<Option<String>, GpuError> {
        let mut slack = vec![0u8; SLACK];
        for (buf, (name, bytes)) in self.scratch.iter().zip(&self.scratch_sizes) {
            gpu.download_at(&mut slack, buf.ptr() + *bytes as u64, SLACK)?;
            if slack.iter().any(|&x| x != CANARY) {
                return Ok(Some(scratch_overflow_reason(name)));
            }
        }
        Ok(None)
    }

    /// Enqueues the launch sequence on task tensors at `tensors`.
    pub(super) fn enqueue(&self, gpu: &Gpu, tensors: &[u64]) -> Result<(), ExecFailure> {
        // From here on a sticky fault is the candidate's (see [`super::fault`]).
        candidate_launches();
        for (f, l) in &self.launches {
            let mut pack = ArgPack::default();
            for a in &l.args {
                match a {
                    ResolvedArg::Tensor(i) => pack.ptr(tensors.get(*i).copied().unwrap_or(0)),
                    ResolvedArg::Scratch(i) => {
                        pack.ptr(self.scratch.get(*i).map_or(0, DevBuf::ptr))
                    }
                    ResolvedArg::Scalar(s) => match s {
                        Scalar::I32(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::U32(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::I64(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::U64(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::F32(v) => pack.push(&v.to_ne_bytes()),
                        Scalar::F64(v) => pack.push(&v.to_ne_bytes()),
                    },
                }
            }
            let mut params = pack.params();
            // SAFETY: the plan was validated against the kernel's signature; what the kernel
            // does with its pointers is untrusted, which is why this runs in a worker.
            unsafe { gpu.launch(*f, l.grid, l.block, l.smem_bytes, &mut params) }.map_err(|e| {
                fault_or(e, |e| {
                    ExecFailure::Launch(format!(
                        "launch line {} (`{}`): {}",
                        l.line,
                        l.kernel,
                        e.fault()
                    ))
                })
            })?;
        }
        Ok(())
    }

    /// Runs the launch sequence and waits for it: a run past `limit` is a timeout. A run still
    /// going at `limit` gets until [`RUN_LIMIT`] to end, because the driver reports an illegal or
    /// misaligned address some hundreds of milliseconds after the fault (such a run is the crash
    /// it is); one that ends in time without a fault is a timeout (too slow), and one still
    /// running at `RUN_LIMIT` is a timeout that poisons this worker (the kernel cannot be
    /// stopped).
    pub fn run(
        &self,
        gpu: &Gpu,
        tensors: &[u64],
        limit: std::time::Duration,
    ) -> Result<(), ExecFailure> {
        self.enqueue(gpu, tensors)?;
        let started = std::time::Instant::now();
        let failed = |e: GpuError| {
            fault_or(e, |e| {
                ExecFailure::Launch(format!("the launch sequence failed: {}", e.fault()))
            })
        };
        let wait = |d: std::time::Duration| gpu.sync_within(d).map_err(failed);
        if wait(limit)? {
            return Ok(());
        }
        if wait(RUN_LIMIT.saturating_sub(started.elapsed()))? {
            // Ended late. A fault may surface only at the next synchronisation (the storm of
            // 2026-12-01 answered 15 misaligned accesses as slow runs without this).
            gpu.sync().map_err(failed)?;
            Err(ExecFailure::Timeout {
                limit_ms: limit.as_millis() as u64,
            })
        } else {
            Err(overran(limit))
        }
    }
}

/// The wrong outcome's reason for a write past the end of scratch buffer `name`.
pub(crate) fn scratch_overflow_reason(name: &str) -> String {
    format!("the kernel wrote past the end of scratch buffer `{name}`")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: u32, name: &str) -> GpuError {
        GpuError {
            call: "cuModuleLoadData".into(),
            name: name.into(),
            desc: "the driver's words".into(),
            code,
        }
    }

    #[test]
    fn a_module_that_does_not_load_says_why_and_whose_fault() {
        match module_failure(err(2, "CUDA_ERROR_OUT_OF_MEMORY")) {
            ExecFailure::Launch(m) => {
                assert!(m.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{m}");
                assert!(m.contains("the driver's words"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        match module_failure(err(209, "CUDA_ERROR_NO_BINARY_FOR_GPU")) {
            ExecFailure::Harness(m) => assert!(m.contains("NO_BINARY_FOR_GPU"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
