//! Parity with transformers on burn's CUDA backend. Runs only with `KEVIN_GPU_TESTS=1` (on a
//! machine with a GPU); with `KEVIN_PARITY_DIR` set to a directory written by
//! `python tests/qwen2_parity.py --device cuda --out DIR` it also checks that larger model in
//! f32 and bf16.

mod common;

use std::path::PathBuf;

use burn::backend::cuda::CudaDevice;
use burn::backend::Cuda;
use common::{extend_diff, forward_diff, tiny};
use kevin_policy::parity;

fn gpu_tests() -> bool {
    let on = std::env::var("KEVIN_GPU_TESTS").is_ok_and(|v| v == "1");
    if !on {
        eprintln!("skipped: set KEVIN_GPU_TESTS=1 on a machine with a GPU");
    }
    on
}

#[test]
fn tiny_fixture_matches_transformers_on_cuda_f32() {
    if !gpu_tests() {
        return;
    }
    let device = CudaDevice::default();
    for variant in ["untied", "tied"] {
        let diff = forward_diff::<Cuda<f32>>(&tiny(variant), &device);
        assert!(
            diff <= 1e-4,
            "{variant}: forward: max |kevin - transformers| = {diff}"
        );
        let diff = extend_diff::<Cuda<f32>>(&tiny(variant), &device);
        assert!(
            diff <= 1e-4,
            "{variant}: extend: max |kevin - transformers| = {diff}"
        );
    }
}

#[test]
fn larger_model_matches_transformers_on_cuda() {
    if !gpu_tests() {
        return;
    }
    let Some(dir) = std::env::var_os("KEVIN_PARITY_DIR").map(PathBuf::from) else {
        eprintln!("skipped: KEVIN_PARITY_DIR is not set");
        return;
    };
    // bf16 against transformers in bf16: the two round at different points, so the bound is
    // 2e-2 or, if larger, how far transformers' own bf16 logits are from its f32 ones.
    for dtype in ["f32", "bf16"] {
        let sub = dir.join(dtype);
        let parity = parity::check_named(&sub, "cuda", dtype).unwrap();
        eprintln!("{}: {parity:?}", sub.display());
        assert!(parity.holds(), "{}: {parity:?}", sub.display());
    }
}
