//! The GPU execution backend: what a `kevin worker --role cuda` process does on its GPU.
//!
//! - [`device`]: the CUDA driver calls (context, stream, buffers, modules, launches, events),
//!   with sticky faults told apart from refused launches.
//! - [`harness.cu`](HARNESS_SOURCE): trusted kernels that generate inputs on the device, fill
//!   outputs with their NaN patterns, mask references, check inputs against their generator, and
//!   compare.
//! - [`blas`]: cuBLAS for the eager baseline's GEMMs; [`dnn`]: cuDNN for its convolutions (the
//!   only libraries the baseline calls, both loaded at run time, both optional: without them
//!   the baseline runs kevin's own GEMM and convolution kernels).
//! - [`fault`]: sticky faults that poison the worker's context, and how a GPU error becomes the
//!   candidate's failure.
//! - [`harness`]: the worker's state ([`harness::Harness`]: its GPU, the harness kernels, the
//!   baseline runner) and the run limits.
//! - [`candidate`]: the candidate's module and its launches; [`buffers`]: one task's device
//!   buffers.
//! - [`trials`]: the correctness protocol's [`crate::verify::correctness::Trials`] on device
//!   memory; [`timer`]: the [`crate::verify::timing::Timer`] with CUDA events;
//!   [`baseline_check`]: the baseline against the fp64 interpreter (GPU tests).
//! - [`lease`]: the GPU-wide timing lease (flock, across processes): timing runs exclusive,
//!   generator and learner steps and correctness checks shared.
//! - [`worker`]: the `kevin worker --role cuda` child that answers the requests of
//!   [`crate::verify::request`] with all of the above.
//!
//! Dependency direction: this folder imports [`crate::verify`], [`crate::baseline`] and the
//! worker pool's serve loop, never `crate::env` (the cuda environment, the parent side, imports
//! this folder's worker).
//!
//! # Why the data stays on the device
//! Tasks at the GPU preset have up to 67M elements per tensor: generating inputs and computing
//! references on the host would cost seconds per candidate (and the fp64 interpreter cannot run
//! a 4096^3 matmul in a request's deadline). So inputs are drawn on the device by a
//! counter-based generator from an OS seed, the reference is the eager baseline (trusted kernels
//! and cuBLAS, checked against the fp64 interpreter by the GPU tests), and outputs are compared on
//! the device; only a few counters and the first failing element cross to the host, where
//! [`crate::verify::correctness::judge`] names the failure. The protocol's order and verdicts are
//! [`crate::verify::correctness::run_protocol`]'s, shared with the CPU backend.
//!
//! # What the candidate can and cannot reach
//! It runs in the worker's context, so it can address the worker's device memory. References
//! are kept XOR-masked with a key stream whose 64-bit key is drawn from the OS per trial and
//! lives only on the host (and in the parameters of the harness's own kernels), so scanning
//! memory finds bytes it cannot decode; the reference's f64 outputs and intermediates are zeroed
//! before they are freed (its f64 inputs are not: the candidate gets the same values). There are no input copies: inputs are checked against the
//! counter-based generator that drew them (`kevin_regen_diff`), whose seed is on the host only.
//!
//! # Memory
//! A request's buffers are allocated by phase ([`buffers`]): the fp64 reference's buffers never
//! coexist with the candidate's tensors, references are stored in 4 bytes per float element, and
//! the timing sets share one input buffer (redrawn before each timed run, untimed). The need is
//! [`buffers::memory_need`]; the cuda environment refuses a task whose need does not fit its GPU.
//!
//! # Who is at fault
//! [`fault`]: a GPU error before the candidate's first launch, or of a trusted step that is not
//! a sticky context fault, is the harness's (a harness error: no reward, not trained on); a
//! sticky fault after the candidate launched is its crash. A fault that poisons the context (illegal address, trap,
//! misaligned access) makes the worker answer with the crash and exit, and the pool starts a
//! fresh one.

pub mod baseline_check;
pub mod blas;
pub mod buffers;
pub mod candidate;
pub mod device;
pub mod dnn;
pub mod fault;
pub mod harness;
pub mod lease;
pub mod timer;
pub mod trials;
pub mod worker;

/// CUDA source of the harness kernels.
pub const HARNESS_SOURCE: &str = include_str!("harness.cu");

/// Kernels of [`HARNESS_SOURCE`], looked up by every worker.
pub const HARNESS_KERNELS: &[&str] = &[
    "kevin_mask2",
    "kevin_mask4",
    "kevin_mask8",
    "kevin_generate",
    "kevin_fill64",
    "kevin_compare",
    "kevin_widen",
    "kevin_scribble_smem",
    "kevin_generate_wide",
    "kevin_regen_diff",
    "kevin_narrow",
];

/// The key stream that masks device copies: must equal `kv_stream` in `harness.cu`.
pub fn mask_stream(key: u64, i: u64) -> u64 {
    let mut z = key
        ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(0x632B_E59B_D9B4_E019);
    z ^= z >> 33;
    z = z.wrapping_mul(0xff51_afd7_ed55_8ccd);
    z ^= z >> 33;
    z = z.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    z ^= z >> 33;
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_stream_is_a_fixed_function() {
        // Pinned values: harness.cu computes the same stream, so a change here must be made there.
        assert_eq!(mask_stream(0, 0), mask_stream(0, 0));
        assert_ne!(mask_stream(1, 0), mask_stream(2, 0));
        assert_ne!(mask_stream(1, 0), mask_stream(1, 1));
        let ones: u32 = (0..1000).map(|i| mask_stream(42, i).count_ones()).sum();
        assert!((30_000..34_000).contains(&ones), "{ones} of 64000 bits set");
    }

    #[test]
    fn harness_compiles_to_a_cubin_for_sm_90() {
        if !crate::compile::tests::nvrtc_or_skip("harness_compiles_to_a_cubin_for_sm_90") {
            return;
        }
        let mut req = crate::compile::CompileRequest::ptx(HARNESS_SOURCE, HARNESS_KERNELS);
        req.arch = "sm_90".into();
        req.output = crate::compile::OutputKind::Cubin;
        let out = crate::compile::compile(&req, &crate::compile::find_cuda_include_dirs());
        match out {
            Ok(o) => assert!(
                matches!(o.image, crate::compile::ModuleImage::Cubin(ref b) if b.starts_with(b"\x7fELF"))
            ),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn harness_source_defines_every_kernel() {
        for k in HARNESS_KERNELS {
            assert!(
                HARNESS_SOURCE.contains(&format!("void {k}(")),
                "{k} missing from harness.cu"
            );
        }
    }
}

#[cfg(test)]
mod model_tests;
