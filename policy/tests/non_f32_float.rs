//! The policy on a backend whose float is not f32 (f64 here; bf16 on the GPU). `extend` returns
//! f32 logits, so every tensor the sampler makes must follow their dtype, not the device's
//! default float: burn refuses mixed dtypes in one operation. Regression: `DTypeMismatch`
//! panics in burn's fusion IR on the H200 in bf16.
//!
//! Its own test binary: burn keeps default dtypes per device, process-wide, and NdArray<f64>
//! would change them for f32 tests running in the same process.

use burn::backend::{Autodiff, NdArray};
use kevin_policy::bench::{run, BenchArgs, Shape};

#[test]
fn generation_and_learning_work_when_the_float_is_not_f32() {
    let args = BenchArgs {
        batches: vec![2],
        prompt: 6,
        new_tokens: 3,
        ..BenchArgs::quick(Shape::Tiny)
    };
    let report =
        run::<Autodiff<NdArray<f64>>>(&args, &Default::default(), "ndarray f64", &|_| {}).unwrap();
    assert_eq!(report.generate[0].forward_passes, 3);
    assert!(report.learner.unwrap().tokens_per_s > 0.0);
}
