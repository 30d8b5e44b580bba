//! Parity with transformers on burn's CUDA backend. Runs only with `KEVIN_GPU_TESTS=1` (on a
//! machine with a GPU); with `KEVIN_PARITY_DIR` set to a directory written by
//! `python tests/qwen2_parity.py --device cuda --out DIR` it also checks that larger model in
//! f32 and bf16.

mod common;

use std::path::PathBuf;

use burn::backend::Cuda;
use common::tiny;
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
    let device = kevin_policy::cuda_setup::cuda_device(0);
    for variant in ["untied", "tied"] {
        // Split matmuls: burn's CUDA matmuls round f32 operands to TF32.
        let parity = parity::check::<Cuda<f32>>(&tiny(variant), &device, 1e-4, 2e-2, true).unwrap();
        eprintln!("{variant}: {parity:?}");
        assert!(parity.holds(), "{variant}: {parity:?}");
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
    // f32 with split matmuls within 1e-4; bf16 as close to transformers' f32 logits as
    // transformers' own bf16 logits are (bound 2e-2 or that difference, if larger).
    for dtype in ["f32", "bf16"] {
        let sub = dir.join(dtype);
        let parity = parity::check_named(&sub, "cuda", dtype, false).unwrap();
        eprintln!("{}: {parity:?}", sub.display());
        assert!(parity.holds(), "{}: {parity:?}", sub.display());
    }
}
