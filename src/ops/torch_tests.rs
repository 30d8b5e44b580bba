//! Snapshot tests of the PyTorch rendering: the exact module text for a few task programs.

use super::torch::render_module;
use super::{Program, Sizes};

#[track_caller]
fn check(src: &str, sizes: &[(&str, usize)], expected: &str) {
    let p = Program::parse(src).unwrap_or_else(|e| panic!("{e}"));
    let sizes: Sizes = sizes.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let got = render_module(&p, &sizes).unwrap();
    assert_eq!(got, expected, "\n--- got ---\n{got}");
}

#[test]
fn dump() {
    let src = "input A: f32[B, M, K]\ninput W: f32[B, K, N]\ninput g: f32[N]\nconst s = 0.5\noutput Y: f32[B, M, N]\noutput Z: i64[B, M]\nT = -(A @ W) * s - -1\nY = layer_norm(maximum(T, 0), bias=g)\nZ = argmax(Y, axis=2)\n";
    check(src, &[("B", 2), ("M", 3), ("K", 4), ("N", 5)], "");
}
