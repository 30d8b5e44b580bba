//! Snapshot tests of the PyTorch rendering: the exact module text for a few task programs
//! (`gemm_bias_relu`, `attention`, a bf16 residual LayerNorm) and one program that exercises
//! precedence, scalar operands and optional operands.

use super::torch::render_module;
use super::{Program, Sizes};

#[track_caller]
fn check(src: &str, sizes: &[(&str, usize)], expected: &str) {
    let p = Program::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let sizes: Sizes = sizes.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let got = render_module(&p, &sizes).unwrap();
    assert_eq!(got, expected, "\n--- got ---\n{got}");
}

const HEADER: &str = "import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

";

const FOOTER: &str = "

def get_init_inputs():
    return []
";

#[test]
fn gemm_bias_relu() {
    let src = "input A: f32[M, K]\ninput W: f32[K, N]\ninput b: f32[N]\noutput Y: f32[M, N]\n\
               Y = relu(A @ W + b)\n";
    let body = r#"    def forward(self, A: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        Y = torch.relu(torch.matmul(A, W) + b)
        return Y


M = 4096
K = 4096
N = 4096


def get_inputs():
    A = torch.randn(M, K, dtype=torch.float32)
    W = torch.randn(K, N, dtype=torch.float32)
    b = torch.randn(N, dtype=torch.float32)
    return [A, W, b]
"#;
    check(
        src,
        &[("M", 4096), ("N", 4096), ("K", 4096)],
        &format!("{HEADER}{body}{FOOTER}"),
    );
}

#[test]
fn attention() {
    let src = "input Q: f32[B, S, D]\ninput K: f32[B, S, D]\ninput V: f32[B, S, D]\n\
               const scale = 0.125\noutput O: f32[B, S, D]\n\
               P = softmax(Q @ transpose(K) * scale, axis=-1)\nO = P @ V\n";
    let body = r#"    def forward(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        P = torch.softmax(torch.bmm(Q, torch.transpose(K, -2, -1)) * scale, dim=-1)
        O = torch.bmm(P, V)
        return O


B = 32
S = 1024
D = 64
scale = 0.125


def get_inputs():
    Q = torch.randn(B, S, D, dtype=torch.float32)
    K = torch.randn(B, S, D, dtype=torch.float32)
    V = torch.randn(B, S, D, dtype=torch.float32)
    return [Q, K, V]
"#;
    check(
        src,
        &[("B", 32), ("S", 1024), ("D", 64)],
        &format!("{HEADER}{body}{FOOTER}"),
    );
}

#[test]
fn bf16_scale_residual_layer_norm() {
    let src = "input X: bf16[M, N]\ninput R: bf16[M, N]\ninput g: bf16[N]\ninput b: bf16[N]\n\
               const alpha = 0.5\noutput Y: bf16[M, N]\nY = layer_norm(X * alpha + R, g, b)\n";
    let body = r#"    def forward(self, X: torch.Tensor, R: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        Y = F.layer_norm(X * alpha + R, (N,), weight=g, bias=b, eps=1e-5)
        return Y


M = 8192
N = 4096
alpha = 0.5


def get_inputs():
    X = torch.randn(M, N, dtype=torch.bfloat16)
    R = torch.randn(M, N, dtype=torch.bfloat16)
    g = torch.randn(N, dtype=torch.bfloat16)
    b = torch.randn(N, dtype=torch.bfloat16)
    return [X, R, g, b]
"#;
    check(
        src,
        &[("M", 8192), ("N", 4096)],
        &format!("{HEADER}{body}{FOOTER}"),
    );
}

#[test]
fn precedence_scalars_and_optional_operands() {
    let src = "input A: f32[B, M, K]\ninput W: f32[B, K, N]\ninput g: f32[N]\nconst s = 0.5\n\
               output Y: f32[B, M, N]\noutput Z: i64[B, M]\nT = -(A @ W) * s - -1\n\
               Y = layer_norm(maximum(T, 0), bias=g) / (T - (1 - T))\nZ = argmax(Y, axis=2)\n";
    let body = r#"    def forward(self, A: torch.Tensor, W: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = -torch.bmm(A, W) * s - -1.0
        Y = F.layer_norm(torch.clamp(T, min=0.0), (N,), weight=None, bias=g, eps=1e-5) / (T - (1.0 - T))
        Z = torch.argmax(Y, dim=2, keepdim=False)
        return Y, Z


B = 2
M = 3
K = 4
N = 5
s = 0.5


def get_inputs():
    A = torch.randn(B, M, K, dtype=torch.float32)
    W = torch.randn(B, K, N, dtype=torch.float32)
    g = torch.randn(N, dtype=torch.float32)
    return [A, W, g]
"#;
    let sizes = [("B", 2), ("M", 3), ("K", 4), ("N", 5)];
    check(src, &sizes, &format!("{HEADER}{body}{FOOTER}"));
}

#[test]
fn convolutions_and_pooling_render_as_torch_functional_calls() {
    let src = "input X: f32[N, 4, H, W]\ninput K: f32[8, 2, 3, 3]\ninput b: f32[8]\n\
               output Y: f32[N, 8, (H + 1) // 2 - 1, (W + 1) // 2 - 1]\n\
               T = conv2d(X, K, b, stride=2, padding=(0, 0), groups=2)\n\
               Y = avg_pool2d(T, (1, 1), count_include_pad=false)\n";
    let p = Program::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let sizes: Sizes = [("N", 2), ("H", 9), ("W", 11)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let got = render_module(&p, &sizes).unwrap();
    assert!(
        got.contains("F.conv2d(X, K, b, stride=2, padding=0, dilation=1, groups=2)"),
        "{got}"
    );
    assert!(
        got.contains(
            "F.avg_pool2d(T, kernel_size=1, stride=1, padding=0, count_include_pad=False)"
        ),
        "{got}"
    );
}

/// Operands of mixed float dtypes: kevin joins them to f32 where PyTorch's matmul, convolutions
/// and norms would refuse them, so the rendering casts the others to the result's dtype (and a
/// scalar, or operands of one dtype, are left as they are).
#[test]
fn mixed_dtype_operands_are_cast_to_the_result() {
    let src = "input A: f32[M, K]\ninput Wh: f16[K, M]\ninput X: f16[M, M]\ninput g: f32[M]\n\
               input Xb: bf16[M, M]\ninput gb: bf16[M]\n\
               output C: f32[M, M]\noutput L: f32[M, M]\noutput R: bf16[M, M]\noutput S: f32[M, M]\n\
               C = A @ Wh\nL = layer_norm(X * 2.0, g, g)\nR = rms_norm(Xb, gb)\nS = Xb @ X\n";
    let p = Program::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let sizes: Sizes = [("M", 8), ("K", 4)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    let got = render_module(&p, &sizes).unwrap();
    for line in [
        "C = torch.matmul(A, Wh.to(torch.float32))",
        "L = F.layer_norm((X * 2.0).to(torch.float32), (M,), weight=g, bias=g, eps=1e-5)",
        "R = F.rms_norm(Xb, (M,), weight=gb, eps=",
        "S = torch.matmul(Xb.to(torch.float32), X.to(torch.float32))",
    ] {
        assert!(got.contains(line), "no `{line}` in\n{got}");
    }
}
