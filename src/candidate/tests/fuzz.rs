//! Fuzz / property test: mutations of valid candidates (byte flips, truncations, inserted
//! tokens, deep parentheses, huge numbers, random launch lines) go through `parse_response` and
//! `validate`. Nothing may panic or hang, every error must be one line, and every accepted plan
//! must satisfy the limits it was validated against.
//!
//! `KEVIN_FUZZ_ITERS` sets the iteration count (default 1,000,000), `KEVIN_FUZZ_SEED` the seed.
//! Each iteration is kept cheap (a small base candidate most of the time) so the default count
//! runs in seconds in the dev profile.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::candidate::{
    parse_response, validate, Limits, ResolvedArg, ResolvedPlan, TaskSignature,
};

const DEFAULT_ITERS: u64 = 1_000_000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small valid response over the GEMM task's tensors and sizes.
const SMALL: &str = "r\n```cuda\n// kevin: scratch S f32[N]\n\
// kevin: launch k grid=(cdiv(M*N,256)) block=(256) smem=0 args=(A, S, 0.5, M*N)\n\
__global__ void k(const float* a, float* s, float c, int n) { int i = threadIdx.x; if (i < n) s[i] = c * a[i]; }\n\
```\nsum\n";

/// Fragments inserted at random places.
const TOKENS: [&str; 58] = [
    "(",
    ")",
    ",",
    "cdiv(",
    "-",
    "*",
    "/",
    "%",
    "+",
    "9223372036854775807",
    "99999999999999999999999",
    "0",
    "-1",
    "1e999",
    "0.5",
    "-0.0",
    "N",
    "M",
    "A",
    "S",
    "Y",
    "\n// kevin: launch k grid=(",
    "\n// kevin: scratch Q f32[",
    "\n",
    "```",
    "\n```cuda\n",
    "\n```\n",
    "\"",
    "'",
    "/*",
    "*/",
    "//",
    "\n#include <",
    "\n#pragma ",
    "\n#define X ",
    "##",
    "__global__ void z(",
    "template <int B>",
    "<<<",
    "asm(\"%globaltimer\")",
    "\\\n",
    "R\"x(",
    ")x\"",
    "__launch_bounds__(",
    "{",
    "}",
    ";",
    "é",
    "\u{0}",
    "std::",
    "cuda::std::",
    "kevin:",
    "=",
    "args=(",
    "grid=",
    "block=",
    "smem=",
    "float* ",
];

const NAMES: [&str; 9] = ["N", "M", "K", "A", "S", "Y", "zz", "k", "gemm_bias"];

fn random_expr(rng: &mut StdRng, depth: u32) -> String {
    if depth == 0 || rng.random_bool(0.4) {
        return match rng.random_range(0..4) {
            0 => NAMES[rng.random_range(0..NAMES.len())].to_string(),
            1 => rng.random_range(-2i64..300).to_string(),
            2 => ["9223372036854775807", "4294967296", "0", "65536", "1024"]
                [rng.random_range(0..5)]
            .to_string(),
            _ => rng.random::<i64>().to_string(),
        };
    }
    let (a, b) = (random_expr(rng, depth - 1), random_expr(rng, depth - 1));
    match rng.random_range(0..7) {
        0 => format!("{a}+{b}"),
        1 => format!("{a}-{b}"),
        2 => format!("{a}*{b}"),
        3 => format!("{a}/{b}"),
        4 => format!("{a}%{b}"),
        5 => format!("cdiv({a},{b})"),
        _ => format!("-({a})"),
    }
}

fn random_list(rng: &mut StdRng, max: usize) -> String {
    let n = rng.random_range(0..=max);
    (0..n)
        .map(|_| match rng.random_range(0..5) {
            0 => "0.25".to_string(),
            1 => "-1e-3".to_string(),
            _ => random_expr(rng, 3),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn random_launch(rng: &mut StdRng) -> String {
    let kernel = ["k", "gemm_bias", "relu_inplace", "nope"][rng.random_range(0..4)];
    let mut parts = vec![
        format!("grid=({})", random_list(rng, 4)),
        format!("block=({})", random_list(rng, 4)),
        format!("args=({})", random_list(rng, 8)),
    ];
    if rng.random_bool(0.5) {
        parts.push(format!("smem={}", random_expr(rng, 2)));
    }
    let i = rng.random_range(0..parts.len());
    let j = rng.random_range(0..parts.len());
    parts.swap(i, j);
    format!("// kevin: launch {kernel} {}\n", parts.join(" "))
}

fn mutate(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    let pos = |rng: &mut StdRng, b: &Vec<u8>| rng.random_range(0..=b.len());
    match rng.random_range(0..9) {
        0 | 1 => {
            if !bytes.is_empty() {
                let i = rng.random_range(0..bytes.len());
                bytes[i] = rng.random();
            }
        }
        2 => {
            let i = pos(rng, bytes);
            bytes.truncate(i);
        }
        3 | 4 => {
            let i = pos(rng, bytes);
            let t = TOKENS[rng.random_range(0..TOKENS.len())];
            bytes.splice(i..i, t.bytes());
        }
        5 => {
            let i = pos(rng, bytes);
            let j = (i + rng.random_range(0..40)).min(bytes.len());
            bytes.drain(i..j);
        }
        6 => {
            let i = pos(rng, bytes);
            let j = (i + rng.random_range(0..80)).min(bytes.len());
            let copy: Vec<u8> = bytes[i..j].to_vec();
            let k = pos(rng, bytes);
            bytes.splice(k..k, copy);
        }
        7 => {
            let i = pos(rng, bytes);
            // Mostly around the depth limit; now and then far beyond it.
            let n = if rng.random_bool(0.05) {
                rng.random_range(1..5000)
            } else {
                rng.random_range(1..100)
            };
            let (open, close) = if rng.random_bool(0.5) {
                ("(", ")")
            } else {
                ("cdiv(", ",1)")
            };
            let deep = format!(
                "{}N{}",
                open.repeat(n),
                close.repeat(rng.random_range(0..=n))
            );
            bytes.splice(i..i, deep.into_bytes());
        }
        _ => {
            // A random launch line after a random newline (or at the start).
            let newlines: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(_, &c)| c == b'\n')
                .map(|(i, _)| i + 1)
                .collect();
            let i = if newlines.is_empty() {
                0
            } else {
                newlines[rng.random_range(0..newlines.len())]
            };
            let line = random_launch(rng);
            bytes.splice(i..i, line.into_bytes());
        }
    }
}

/// What must hold of any plan `validate` accepts.
fn check_invariants(plan: &ResolvedPlan, sig: &TaskSignature, limits: &Limits) {
    assert!(!plan.launches.is_empty() && plan.launches.len() <= limits.max_launches);
    let scratch_bytes: u64 = plan
        .scratch
        .iter()
        .map(|s| s.elems * s.dtype.size_bytes())
        .sum();
    assert!(scratch_bytes <= limits.scratch_cap(sig));
    for l in &plan.launches {
        assert!(l.grid.iter().all(|&g| g >= 1));
        assert!(i64::from(l.grid[0]) <= limits.max_grid_x);
        assert!(i64::from(l.grid[1].max(l.grid[2])) <= limits.max_grid_yz);
        assert!(l.block.iter().all(|&b| b >= 1));
        let threads: i64 = l.block.iter().map(|&b| i64::from(b)).product();
        assert!(threads <= limits.max_threads_per_block);
        assert!(i64::from(l.smem_bytes) <= limits.max_smem_bytes);
        for a in &l.args {
            match a {
                ResolvedArg::Tensor(i) => assert!(*i < sig.tensors.len()),
                ResolvedArg::Scratch(i) => assert!(*i < plan.scratch.len()),
                ResolvedArg::Scalar(_) => {}
            }
        }
    }
}

/// Every rejection is one non-empty line (it becomes the policy's feedback).
fn assert_one_line(msg: &str, input: &str) {
    assert!(
        !msg.is_empty() && !msg.contains('\n'),
        "bad error {msg:?} for {input:?}"
    );
}

#[test]
fn fuzz_parse_and_validate_never_panic() {
    let iters = env_u64("KEVIN_FUZZ_ITERS", DEFAULT_ITERS);
    let seed = env_u64("KEVIN_FUZZ_SEED", 0x006b_6576_696e);
    let mut rng = StdRng::seed_from_u64(seed);
    let sig = super::gemm_task();
    let limits = Limits::default();
    let gemm = super::response(super::GEMM_SOURCE);
    let (mut accepted, mut parsed) = (0u64, 0u64);
    let start = Instant::now();
    for _ in 0..iters {
        let base = if rng.random_bool(0.1) {
            gemm.as_str()
        } else {
            SMALL
        };
        let mut bytes = base.as_bytes().to_vec();
        for _ in 0..rng.random_range(1..=4) {
            mutate(&mut rng, &mut bytes);
        }
        let response = String::from_utf8_lossy(&bytes);
        match parse_response(&response) {
            Err(e) => assert_one_line(&e.to_string(), &response),
            Ok(candidate) => {
                parsed += 1;
                match validate(&candidate, &sig, &limits) {
                    Ok(plan) => {
                        accepted += 1;
                        check_invariants(&plan, &sig, &limits);
                    }
                    Err(e) => assert_one_line(&e.to_string(), &response),
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "fuzz: {iters} inputs in {secs:.1} s ({:.0}/s, seed {seed:#x}): {parsed} parsed, {accepted} accepted",
        iters as f64 / secs.max(1e-9)
    );
    // The mutations must leave a fair share valid, or the test explores nothing past parsing.
    if iters >= 10_000 {
        assert!(
            parsed * 10 > iters && accepted * 50 > iters,
            "parsed {parsed}, accepted {accepted}"
        );
    }
}

/// Inputs built to be slow or deep; each must be answered quickly (generous bound: the machine
/// may be loaded).
#[test]
fn pathological_inputs_are_fast() {
    let sig = super::gemm_task();
    let limits = Limits::default();
    let launch = "// kevin: launch k grid=1 block=1 args=()\n__global__ void k() {}\n";
    let cases: Vec<(&str, String)> = vec![
        ("many opening fences", "```cuda\n".repeat(200_000)),
        ("many closed blocks", "```\nx\n```\n".repeat(100_000)),
        (
            "deep parens in a directive",
            format!(
                "```cuda\n// kevin: launch k grid=({}1) block=1 args=()\n```\ns",
                "(".repeat(500_000)
            ),
        ),
        (
            "huge argument list",
            format!(
                "```cuda\n// kevin: launch k grid=1 block=1 args=({})\n```\ns",
                "N,".repeat(300_000)
            ),
        ),
        (
            "many directives",
            format!(
                "```cuda\n{}```\ns",
                "// kevin: scratch S f32[1]\n".repeat(100_000)
            ),
        ),
        (
            "many scratch buffers",
            format!(
                "```cuda\n{launch}{}```\ns",
                (0..2000)
                    .map(|i| format!("// kevin: scratch S{i} u8[1]\n"))
                    .collect::<String>()
            ),
        ),
        (
            "unclosed parameter lists",
            format!(
                "```cuda\n{launch}{}\n```\ns",
                "__global__ void k(".repeat(3000)
            ),
        ),
        (
            "nested template angles",
            format!(
                "```cuda\n{launch}__global__ void k({}) {{}}\n```\ns",
                "a<".repeat(10_000)
            ),
        ),
        (
            "unterminated comment",
            format!("```cuda\n{launch}/*{}\n```\ns", "x".repeat(60_000)),
        ),
        (
            "unterminated raw string",
            format!("```cuda\n{launch}R\"x({}\n```\ns", "y".repeat(60_000)),
        ),
        (
            "directive continuation",
            format!(
                "```cuda\n{launch}#define X \\\n{}```\ns",
                "a \\\n".repeat(10_000)
            ),
        ),
        (
            "adjacent strings",
            format!("```cuda\n{launch}{}\n```\ns", "\"%glob\" ".repeat(6_000)),
        ),
    ];
    for (name, response) in cases {
        let start = Instant::now();
        let error = match parse_response(&response) {
            Err(e) => Some(e),
            Ok(c) => validate(&c, &sig, &limits).err(),
        };
        let secs = start.elapsed().as_secs_f64();
        assert!(secs < 2.0, "{name}: {secs:.2} s");
        eprintln!(
            "{name}: {secs:.3} s: {}",
            error.map_or("ok".to_string(), |e| e
                .to_string()
                .chars()
                .take(120)
                .collect())
        );
    }
}
