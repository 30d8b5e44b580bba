//! Parity with transformers on burn's CUDA backend. Runs only with `KEVIN_GPU_TESTS=1` (on a
//! machine with a GPU); with `KEVIN_PARITY_DIR` set to a directory written by
//! `python tests/qwen2_parity.py --device cuda --out DIR` it also checks that larger model in
//! f32 and bf16.

mod common;

use std::path::PathBuf;

use burn::backend::cuda::CudaDevice;
use burn::backend::Cuda;
use common::{expected, extend_diff, forward_diff, logits, max_abs_diff, tiny};
use kevin_policy::checkpoint;

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
    let device = CudaDevice::default();

    let f32_dir = dir.join("f32");
    let diff = forward_diff::<Cuda<f32>>(&f32_dir, &device);
    eprintln!(
        "{}: f32 forward: max |kevin - transformers| = {diff:.3e}",
        f32_dir.display()
    );
    assert!(
        diff <= 1e-4,
        "f32 forward: max |kevin - transformers| = {diff}"
    );
    let diff = extend_diff::<Cuda<f32>>(&f32_dir, &device);
    eprintln!(
        "{}: f32 extend: max |kevin - transformers| = {diff:.3e}",
        f32_dir.display()
    );
    assert!(
        diff <= 1e-4,
        "f32 extend: max |kevin - transformers| = {diff}"
    );

    // bf16 against transformers in bf16: the two round at different points, so the bound is
    // 2e-2 or, if larger, how far transformers' own bf16 logits are from its f32 ones.
    let bf16_dir = dir.join("bf16");
    let exp = expected(&bf16_dir);
    let (model, _) = checkpoint::load::<Cuda<half::bf16>>(&bf16_dir, &device).unwrap();
    let ours = logits(&model, &exp);
    let diff = max_abs_diff(&ours, &exp.logits);
    let own = exp
        .logits_f32
        .as_ref()
        .map_or(0.0, |f| max_abs_diff(&exp.logits, f));
    let bound = own.max(2e-2);
    eprintln!(
        "{}: bf16 forward: max |kevin - transformers| = {diff:.3e} (transformers bf16 vs f32: {own:.3e})",
        bf16_dir.display()
    );
    assert!(
        diff <= bound,
        "bf16: max |kevin - transformers| = {diff} > {bound}"
    );
    let diff = extend_diff::<Cuda<half::bf16>>(&bf16_dir, &device);
    eprintln!(
        "{}: bf16 extend: max |kevin - transformers| = {diff:.3e}",
        bf16_dir.display()
    );
    assert!(
        diff <= bound,
        "bf16 extend: max |kevin - transformers| = {diff} > {bound}"
    );
}
