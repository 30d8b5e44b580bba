//! A small warm-start corpus in the real format, for the warm start's tests (the CPU's and the
//! GPU's): first turns of elementwise kernels, one per operation.

use kevin::corpus::{Example, Kind, Turn};

/// One first-turn example per operation in `ops`: `Y = op(X)`, answered by a one-thread-per-element
/// kernel; every other one the `reference` form (the split's always-trained form).
pub fn elementwise_first_turns(ops: &[&str]) -> Vec<Example> {
    ops.iter()
        .enumerate()
        .map(|(i, op)| Example {
            task: format!("{op}_task"),
            kind: Kind::FirstTurn,
            form: if i % 2 == 0 { "reference" } else { "naive:elementwise_b256" }.into(),
            turns: vec![Turn {
                prompt: format!("Write a CUDA kernel for Y = {op}(X), X f32[N]."),
                response: format!(
                    "Elementwise.\n```cuda\n__global__ void k(const float* x, float* y, int n) {{ int i = blockIdx.x * 256 + threadIdx.x; if (i < n) y[i] = {op}(x[i]); }}\n```\nOne thread per element."
                ),
            }],
            outcomes: vec!["correct".into()],
        })
        .collect()
}
