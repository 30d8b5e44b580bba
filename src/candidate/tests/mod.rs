//! Tests of the candidate pipeline: data-driven `check` helpers per stage, plus a fuzz test.
//! Shared fixtures live here: a valid two-launch candidate and the task it solves.

mod expr;
mod extract;
mod fuzz;
mod plan;
mod rules;
mod validate;

use std::collections::BTreeMap;

use super::{Dtype, TaskSignature, TensorParam};

/// A valid cuda block for `Y = relu(A @ W + b)` with a scratch buffer.
pub(super) const GEMM_SOURCE: &str = r#"#include <cuda_fp16.h>
// kevin: scratch T f32[M*N]
// kevin: launch gemm_bias grid=(cdiv(N,16), cdiv(M,16)) block=(16,16) smem=0 args=(A, W, b, T, M, N, K)
// kevin: launch relu_inplace grid=(cdiv(M*N,256)) block=(256) args=(T, Y, M*N)

// Naive GEMM: no cudaMalloc here, "no main() either".
__global__ void gemm_bias(const float* __restrict__ A, const float* __restrict__ W,
                          const float* __restrict__ b, float* __restrict__ T, int M, int N, int K) {
    int row = blockIdx.y * 16 + threadIdx.y;
    int col = blockIdx.x * 16 + threadIdx.x;
    if (row < M && col < N) {
        float acc = b[col];
        #pragma unroll 4
        for (int k = 0; k < K; ++k) acc += A[row * K + k] * W[k * N + col];
        T[row * N + col] = acc;
    }
}

__global__ void relu_inplace(const float* T, float* Y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(T[i], 0.0f);
}
"#;

/// A response around `source`: reasoning, the block, a summary.
pub(super) fn response(source: &str) -> String {
    format!("Plan: one GEMM, then a ReLU.\n\n```cuda\n{source}```\n\nThe GEMM writes A@W+b to scratch; a ReLU writes Y.\n")
}

/// The task `Y = relu(A @ W + b)` with M=64, N=32, K=16.
pub(super) fn gemm_task() -> TaskSignature {
    let t = |name: &str, elems: u64, is_output: bool| TensorParam {
        name: name.to_string(),
        dtype: Dtype::F32,
        elems,
        is_output,
    };
    TaskSignature {
        tensors: vec![
            t("A", 64 * 16, false),
            t("W", 16 * 32, false),
            t("b", 32, false),
            t("Y", 64 * 32, true),
        ],
        sizes: BTreeMap::from([
            ("M".to_string(), 64),
            ("N".to_string(), 32),
            ("K".to_string(), 16),
        ]),
        eager_intermediate_bytes: 0,
    }
}
