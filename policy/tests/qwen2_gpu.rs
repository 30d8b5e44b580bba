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

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn tensor<B: burn::tensor::backend::Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    device: &B::Device,
) -> burn::tensor::Tensor<B, D> {
    let n = shape.iter().product();
    burn::tensor::Tensor::from_data(
        burn::tensor::TensorData::new(values(n, seed), shape),
        device,
    )
}

fn max_diff<B: burn::tensor::backend::Backend, const D: usize>(
    got: burn::tensor::Tensor<B, D>,
    want: Vec<f32>,
) -> f32 {
    let got = got
        .cast(burn::tensor::DType::F32)
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f32::max)
}

/// The cuBLAS products against NdArray's exact f32 ones on the same values: a linear layer
/// (folded into one product), a batch, transposed operands (a backward's), a broadcast
/// transposed weight (the tied head); f32 within 1e-4 (no TF32), bf16 within its rounding.
#[test]
fn cublas_matmul_matches_the_cpu_on_cuda() {
    use burn::backend::NdArray;
    use burn::tensor::{FloatDType, Tensor};
    use kevin_policy::cublas::{matmul, set_mode, Mode};
    if !gpu_tests() {
        return;
    }
    set_mode(Mode::All);
    let gpu = kevin_policy::cuda_setup::cuda_device(0);
    let cpu = Default::default();
    type G = Cuda<f32>;
    type C = NdArray<f32>;
    let check =
        |a: Tensor<G, 4>, b: Tensor<G, 4>, ca: Tensor<C, 4>, cb: Tensor<C, 4>, what: &str| {
            let want = ca.matmul(cb).into_data().to_vec::<f32>().unwrap();
            let f32_out =
                matmul(a.clone(), b.clone()).unwrap_or_else(|_| panic!("{what}: declined"));
            let d = max_diff(f32_out, want.clone());
            eprintln!("{what}: f32 max |diff| {d:e}");
            assert!(d < 1e-4, "{what}: f32 off by {d}");
            let (a16, b16) = (a.cast(FloatDType::BF16), b.cast(FloatDType::BF16));
            let bf16_out = matmul(a16, b16).unwrap_or_else(|_| panic!("{what}: bf16 declined"));
            let d = max_diff(bf16_out, want);
            eprintln!("{what}: bf16 max |diff| {d:e}");
            assert!(d < 0.25, "{what}: bf16 off by {d}");
        };
    // Linear: [2, 3, 5, 64] @ [1, 1, 64, 40].
    check(
        tensor([2, 3, 5, 64], 1, &gpu),
        tensor([1, 1, 64, 40], 2, &gpu),
        tensor([2, 3, 5, 64], 1, &cpu),
        tensor([1, 1, 64, 40], 2, &cpu),
        "linear",
    );
    // Batch: [2, 3, 17, 32] @ [2, 3, 32, 9].
    check(
        tensor([2, 3, 17, 32], 3, &gpu),
        tensor([2, 3, 32, 9], 4, &gpu),
        tensor([2, 3, 17, 32], 3, &cpu),
        tensor([2, 3, 32, 9], 4, &cpu),
        "batch",
    );
    // Transposed operands: [2, 3, 32, 17]^T @ [2, 3, 9, 32]^T.
    check(
        tensor([2, 3, 32, 17], 5, &gpu).swap_dims(2, 3),
        tensor([2, 3, 9, 32], 6, &gpu).swap_dims(2, 3),
        tensor([2, 3, 32, 17], 5, &cpu).swap_dims(2, 3),
        tensor([2, 3, 9, 32], 6, &cpu).swap_dims(2, 3),
        "transposed",
    );
    // Tied head: [1, 2, 7, 48] @ ([100, 48]^T as [1, 1, 48, 100]).
    let head = |d: &_| tensor::<G, 2>([100, 48], 8, d).transpose().unsqueeze::<4>();
    let chead = |d: &_| tensor::<C, 2>([100, 48], 8, d).transpose().unsqueeze::<4>();
    check(
        tensor([1, 2, 7, 48], 7, &gpu),
        head(&gpu),
        tensor([1, 2, 7, 48], 7, &cpu),
        chead(&cpu),
        "tied head",
    );
}

/// Gradients through the cuBLAS product (Autodiff over CUDA) against NdArray's of burn's own
/// matmul, with a broadcast weight (its gradient summed over the batch).
#[test]
fn cublas_matmul_gradients_match_the_cpu_on_cuda() {
    use burn::backend::{Autodiff, NdArray};
    use kevin_policy::cublas::{matmul, set_mode, Mode};
    if !gpu_tests() {
        return;
    }
    set_mode(Mode::All);
    let gpu = kevin_policy::cuda_setup::cuda_device(0);
    type G = Autodiff<Cuda<f32>>;
    type C = Autodiff<NdArray<f32>>;
    let x = tensor::<G, 3>([4, 6, 32], 11, &gpu).require_grad();
    let w = tensor::<G, 3>([1, 32, 24], 12, &gpu).require_grad();
    let up = tensor::<G, 3>([4, 6, 24], 13, &gpu);
    let y = matmul(x.clone(), w.clone()).unwrap_or_else(|_| panic!("declined"));
    let grads = (y * up).sum().backward();
    let (gx, gw) = (x.grad(&grads).unwrap(), w.grad(&grads).unwrap());

    let cpu = Default::default();
    let cx = tensor::<C, 3>([4, 6, 32], 11, &cpu).require_grad();
    let cw = tensor::<C, 3>([1, 32, 24], 12, &cpu).require_grad();
    let cup = tensor::<C, 3>([4, 6, 24], 13, &cpu);
    let cgrads = (cx.clone().matmul(cw.clone()) * cup).sum().backward();
    let want_x = cx
        .grad(&cgrads)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let want_w = cw
        .grad(&cgrads)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let (dx, dw) = (max_diff(gx, want_x), max_diff(gw, want_w));
    eprintln!("grad x max |diff| {dx:e}, grad w {dw:e}");
    assert!(dx < 1e-4 && dw < 1e-4, "grad x {dx}, grad w {dw}");
}

/// The tiny fixture against transformers with every product through cuBLAS and no split: fp32
/// products hold f32 parity on their own.
#[test]
fn tiny_fixture_matches_transformers_with_cublas_products() {
    use kevin_policy::cublas::{set_mode, Mode};
    if !gpu_tests() {
        return;
    }
    set_mode(Mode::All);
    let device = kevin_policy::cuda_setup::cuda_device(0);
    for variant in ["untied", "tied"] {
        let parity =
            parity::check::<Cuda<f32>>(&tiny(variant), &device, 1e-4, 2e-2, false).unwrap();
        eprintln!("{variant} (cuBLAS): {parity:?}");
        assert!(parity.holds(), "{variant} (cuBLAS): {parity:?}");
    }
}

/// A chain of 200 dependent products with burn's kernels between them (each product reads the
/// previous step's output, whose memory is then freed and reused): any ordering slip between
/// cuBLAS's stream and cubecl's shows up as a wrong value.
#[test]
fn cublas_products_stay_ordered_in_a_long_chain_on_cuda() {
    use burn::backend::NdArray;
    use burn::tensor::activation::relu;
    use kevin_policy::cublas::{matmul, set_mode, Mode};
    if !gpu_tests() {
        return;
    }
    set_mode(Mode::All);
    let gpu = kevin_policy::cuda_setup::cuda_device(0);
    let cpu = Default::default();
    let mut x = tensor::<Cuda<f32>, 3>([2, 64, 96], 21, &gpu);
    let w = tensor::<Cuda<f32>, 3>([1, 96, 96], 22, &gpu) * 0.1;
    let mut cx = tensor::<NdArray<f32>, 3>([2, 64, 96], 21, &cpu);
    let cw = tensor::<NdArray<f32>, 3>([1, 96, 96], 22, &cpu) * 0.1;
    for _ in 0..200 {
        let y = matmul(x.clone(), w.clone()).unwrap_or_else(|_| panic!("declined"));
        x = relu(y) * 0.5 + x * 0.5;
        cx = relu(cx.clone().matmul(cw.clone())) * 0.5 + cx * 0.5;
    }
    let d = max_diff(x, cx.into_data().to_vec::<f32>().unwrap());
    eprintln!("chain of 200: max |diff| {d:e}");
    assert!(d < 1e-4, "chain off by {d}");
}
