//! Robustness tests: thousands of truncated, mutated and randomly assembled programs must be
//! rejected with an error or accepted, never panic; every accepted one must also run through the
//! interpreter and the PyTorch renderer without panicking.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::interp::run;
use super::torch::render_module;
use super::{Program, Sizes};

const SEEDS: &[&str] = &[
    "input A: f32[M, K]\ninput W: f32[K, N]\ninput b: f32[N]\noutput Y: f32[M, N]\nY = relu(A @ W + b)\n",
    "input X: f32[B, N]\nconst s = 0.5\noutput Y: f32[B, N]\nT = gelu_tanh(X) * s\nY = softmax(T, axis=-1)\n",
    "input X: bf16[M, N]\ninput g: bf16[N]\noutput Y: bf16[M, N]\nY = layer_norm(X, g, eps=1e-5)\n",
    "input X: f32[B, M, K]\ninput W: f32[B, K, N]\noutput Y: f32[B, N, M]\nY = transpose(X @ W, 1, 2)\n",
    "input X: f32[M, N]\noutput Y: i64[M, 1]\noutput Z: f32[N]\nY = argmax(X, axis=1, keepdim=true)\n\
     Z = cumsum(max(X, axis=0) - -1, axis=0)\n",
    "input X: f16[N]\nconst s = 3\noutput Y: f16[N]\nY = clamp(pow(X, 2) + pow(2, X), lo=-1, hi=s) * minimum(X, 0)\n",
];

const PIECES: &[&str] = &[
    "input",
    "output",
    "const",
    "X",
    "Y",
    "W",
    "M",
    "N",
    "f32",
    "bf16",
    "i64",
    "[",
    "]",
    "(",
    ")",
    ",",
    ":",
    "=",
    "+",
    "-",
    "*",
    "/",
    "@",
    "\n",
    " ",
    "1",
    "0",
    "-1",
    "2.5e-3",
    "1e",
    "axis",
    "keepdim",
    "true",
    "relu",
    "sum",
    "softmax",
    "layer_norm",
    "transpose",
    "maximum",
    "argmax",
    "#",
    "é",
    "\t",
    "1e400",
    "99999999999999999999",
];

/// Parses `src`; when accepted, runs it at small sizes and renders it.
fn exercise(src: &str, rng: &mut StdRng) {
    let Ok(program) = Program::parse(src) else {
        return;
    };
    let sizes: Sizes = program
        .size_symbols()
        .into_iter()
        .map(|s| (s, rng.random_range(1..4)))
        .collect();
    let inputs: Vec<Vec<f64>> = program
        .inputs
        .iter()
        .map(|d| {
            let n: usize =
                d.ty.concrete_shape(&sizes)
                    .map_or(0, |s| s.iter().product());
            (0..n).map(|_| rng.random_range(-2.0..2.0)).collect()
        })
        .collect();
    let _ = run(&program, &sizes, &inputs);
    let _ = render_module(&program, &sizes);
}

#[test]
fn truncated_programs_never_panic() {
    let mut rng = StdRng::seed_from_u64(1);
    for src in SEEDS {
        assert!(Program::parse(src).is_ok(), "seed program rejected: {src}");
        for (i, _) in src.char_indices() {
            exercise(&src[..i], &mut rng);
            exercise(&src[i..], &mut rng);
        }
    }
}

#[test]
fn mutated_programs_never_panic() {
    let mut rng = StdRng::seed_from_u64(2);
    for _ in 0..3000 {
        let mut chars: Vec<char> = SEEDS[rng.random_range(0..SEEDS.len())].chars().collect();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..chars.len());
            match rng.random_range(0..3) {
                0 => {
                    chars.remove(at);
                }
                1 => chars.insert(
                    at,
                    "()[],:=+-*/@ \n#aZ09._"[rng.random_range(0..22)..]
                        .chars()
                        .next()
                        .unwrap_or('x'),
                ),
                _ => {
                    let other = rng.random_range(0..chars.len());
                    chars.swap(at, other);
                }
            }
        }
        let src: String = chars.into_iter().collect();
        exercise(&src, &mut rng);
    }
}

#[test]
fn random_token_soup_never_panics() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..3000 {
        let n = rng.random_range(0..40);
        let src: String = (0..n)
            .map(|_| PIECES[rng.random_range(0..PIECES.len())])
            .collect::<Vec<_>>()
            .join(" ");
        exercise(&src, &mut rng);
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let src = format!(
        "input X: f32[N]\noutput Y: f32[N]\nY = {}X{}\n",
        "(".repeat(5000),
        ")".repeat(5000)
    );
    let e = Program::parse(&src).unwrap_err();
    assert!(e.to_string().contains("nested deeper"), "{e}");
    let src = format!(
        "input X: f32[N]\noutput Y: f32[N]\nY = {}X\n",
        "-".repeat(5000)
    );
    assert!(Program::parse(&src).is_err());
    let src = format!(
        "input X: f32[N]\noutput Y: f32[N]\nY = {}X{}\n",
        "relu(".repeat(5000),
        ")".repeat(5000)
    );
    assert!(Program::parse(&src).is_err());
}
