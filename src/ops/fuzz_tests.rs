//! Robustness tests: thousands of truncated, mutated and randomly assembled programs must be
//! rejected with an error or accepted, never panic; every accepted one must also run through the
//! interpreter and the PyTorch renderer without panicking.
//!
//! `fuzz_programs_never_panic` is the long-running target: `KEVIN_FUZZ_ITERS` inputs (default
//! 20,000 so CI stays quick; the recorded full run is 1,000,000, see
//! benches/results/fuzz-2026-11-30.md), seed `KEVIN_FUZZ_SEED`. Every rejection must be one line;
//! a syntax error names where the input is wrong (`line L, column C: ...`).

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

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One generated input: a seed program mutated at the character level (most inputs), a soup of
/// language pieces, or a truncated seed.
fn generated(rng: &mut StdRng) -> String {
    match rng.random_range(0..10) {
        0..=5 => {
            let mut chars: Vec<char> = SEEDS[rng.random_range(0..SEEDS.len())].chars().collect();
            for _ in 0..rng.random_range(1..5) {
                let at = rng.random_range(0..chars.len().max(1));
                match rng.random_range(0..4) {
                    0 if !chars.is_empty() => {
                        chars.remove(at);
                    }
                    1 => {
                        let piece = PIECES[rng.random_range(0..PIECES.len())];
                        for (k, c) in piece.chars().enumerate() {
                            chars.insert((at + k).min(chars.len()), c);
                        }
                    }
                    2 if !chars.is_empty() => {
                        let other = rng.random_range(0..chars.len());
                        chars.swap(at, other);
                    }
                    _ if !chars.is_empty() => chars[at] = char::from(rng.random_range(0u8..128)),
                    _ => {}
                }
            }
            chars.into_iter().collect()
        }
        6..=8 => (0..rng.random_range(0..40))
            .map(|_| PIECES[rng.random_range(0..PIECES.len())])
            .collect::<Vec<_>>()
            .join(if rng.random_bool(0.5) { " " } else { "" }),
        _ => {
            let src = SEEDS[rng.random_range(0..SEEDS.len())];
            let cut = rng.random_range(0..=src.len());
            src.get(..cut).unwrap_or(src).to_string()
        }
    }
}

#[test]
fn fuzz_programs_never_panic() {
    let iters = env_u64("KEVIN_FUZZ_ITERS", 20_000);
    let seed = env_u64("KEVIN_FUZZ_SEED", 4);
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut accepted, start) = (0u64, std::time::Instant::now());
    for _ in 0..iters {
        let src = generated(&mut rng);
        match Program::parse(&src) {
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.contains('\n'), "multi-line error for {src:?}: {msg}");
                // Syntax errors always have a position; type errors one unless they concern the
                // whole program (e.g. no output declared).
                if let super::OpsError::Parse(p) = &e {
                    assert!(p.line >= 1 && p.col >= 1, "no position for {src:?}: {msg}");
                }
            }
            Ok(_) => {
                accepted += 1;
                exercise(&src, &mut rng);
            }
        }
    }
    eprintln!(
        "fuzz: {iters} programs in {:.1} s (seed {seed}): {accepted} accepted",
        start.elapsed().as_secs_f64()
    );
    // The mutations must leave some programs valid, or nothing past the parser is exercised.
    if iters >= 10_000 {
        assert!(
            accepted * 200 > iters,
            "only {accepted} of {iters} accepted"
        );
    }
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
