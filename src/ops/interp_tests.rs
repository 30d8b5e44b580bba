//! Data-driven tests of the checker and the reference interpreter: every operator against
//! hand-computed values (transcendental ones from Python's `math`), broadcasting, keepdim,
//! negative axes, numerical stability, and the wording of type and parse errors.

use super::interp::run;
use super::{Program, Sizes};

fn sizes(s: &[(&str, usize)]) -> Sizes {
    s.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Runs `src` and compares every output with `expected` (relative and absolute 1e-12).
#[track_caller]
fn check(src: &str, sz: &[(&str, usize)], inputs: &[&[f64]], expected: &[&[f64]]) {
    let p = Program::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let inputs: Vec<Vec<f64>> = inputs.iter().map(|v| v.to_vec()).collect();
    let outs = run(&p, &sizes(sz), &inputs).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outs.len(), expected.len());
    for (o, e) in outs.iter().zip(expected) {
        assert_eq!(o.data.len(), e.len(), "output length, got {:?}", o.data);
        for (g, w) in o.data.iter().zip(e.iter()) {
            let ok = (g - w).abs() <= 1e-12 * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
            assert!(ok, "got {:?}, expected {e:?}\n{src}", o.data);
        }
    }
}

/// One-input elementwise program `Y = <expr of X>` over `[N]`.
#[track_caller]
fn check_map(expr: &str, x: &[f64], expected: &[f64]) {
    let src = format!("input X: f32[N]\noutput Y: f32[N]\nY = {expr}\n");
    check(&src, &[("N", x.len())], &[x], &[expected]);
}

#[track_caller]
fn check_err(src: &str, expected: &str) {
    match Program::parse(src) {
        Ok(_) => panic!("accepted:\n{src}"),
        Err(e) => assert_eq!(e.to_string(), expected),
    }
}

const XS: &[f64] = &[-1.0, 0.5, 2.0];

#[test]
fn elementwise_unary() {
    check_map("relu(X)", XS, &[0.0, 0.5, 2.0]);
    check_map(
        "gelu(X)",
        XS,
        &[
            -0.15865525393145707,
            0.34573123063700656,
            1.9544997361036416,
        ],
    );
    check_map(
        "gelu_tanh(X)",
        XS,
        &[-0.15880800939172324, 0.34571400982514394, 1.954597694087775],
    );
    check_map(
        "silu(X)",
        XS,
        &[-0.2689414213699951, 0.3112296656009273, 1.7615941559557646],
    );
    check_map(
        "sigmoid(X)",
        XS,
        &[0.2689414213699951, 0.6224593312018546, 0.8807970779778823],
    );
    check_map(
        "tanh(X)",
        XS,
        &[-0.7615941559557649, 0.46211715726000974, 0.9640275800758169],
    );
    check_map(
        "softplus(X)",
        XS,
        &[0.31326168751822286, 0.9740769841801067, 2.1269280110429727],
    );
    check_map(
        "mish(X)",
        XS,
        &[-0.30340146137410895, 0.3752452113048951, 1.9439589595339946],
    );
    check_map("elu(X)", XS, &[-0.6321205588285577, 0.5, 2.0]);
    check_map("elu(X, alpha=2)", XS, &[-1.2642411176571154, 0.5, 2.0]);
    check_map(
        "exp(X)",
        XS,
        &[0.36787944117144233, 1.6487212707001282, 7.38905609893065],
    );
    check_map("abs(X)", XS, &[1.0, 0.5, 2.0]);
    check_map("neg(X)", XS, &[1.0, -0.5, -2.0]);
    check_map("-X", XS, &[1.0, -0.5, -2.0]);
    check_map("square(X)", XS, &[1.0, 0.25, 4.0]);
    check_map("leaky_relu(X, 0.1)", XS, &[-0.1, 0.5, 2.0]);
    check_map("leaky_relu(X)", XS, &[-0.01, 0.5, 2.0]);
    check_map("clamp(X, -0.5, 1)", XS, &[-0.5, 0.5, 1.0]);
    check_map("hardtanh(X)", XS, &[-1.0, 0.5, 1.0]);
    check_map("hardtanh(X, hi=0.25)", XS, &[-1.0, 0.25, 0.25]);
    check_map(
        "hardsigmoid(X)",
        &[-4.0, 0.0, 1.5, 4.0],
        &[0.0, 0.5, 0.75, 1.0],
    );
    check_map(
        "hardswish(X)",
        &[-4.0, 0.0, 1.5, 4.0],
        &[0.0, 0.0, 1.125, 4.0],
    );
    let pos: &[f64] = &[0.25, 1.0, 4.0];
    check_map("sqrt(X)", pos, &[0.5, 1.0, 2.0]);
    check_map("rsqrt(X)", pos, &[2.0, 1.0, 0.5]);
    check_map(
        "log(X)",
        pos,
        &[-1.3862943611198906, 0.0, 1.3862943611198906],
    );
}

#[test]
fn elementwise_functions_are_stable_at_extremes() {
    check_map("sigmoid(X)", &[-800.0, 800.0], &[0.0, 1.0]);
    check_map("softplus(X)", &[-800.0, 800.0], &[0.0, 800.0]);
    check_map("silu(X)", &[-800.0, 800.0], &[-0.0, 800.0]);
    check_map("gelu(X)", &[-10.0, 10.0], &[-0.0, 10.0]);
}

#[test]
fn binary_operators_and_scalars() {
    check_map("X * 2 + 1", XS, &[-1.0, 2.0, 5.0]);
    check_map("1 - X / 2", XS, &[1.5, 0.75, 0.0]);
    check_map("2 / X", XS, &[-2.0, 4.0, 1.0]);
    check_map("maximum(X, 0.25)", XS, &[0.25, 0.5, 2.0]);
    check_map("minimum(0.25, X)", XS, &[-1.0, 0.25, 0.25]);
    check_map("pow(X, 2)", XS, &[1.0, 0.25, 4.0]);
    check_map("pow(2, X)", XS, &[0.5, std::f64::consts::SQRT_2, 4.0]);
    check_map("X - -X", XS, &[-2.0, 1.0, 4.0]);
    check_map("(X + 1) * (X - 1)", XS, &[0.0, -0.75, 3.0]);
}

#[test]
fn precedence_follows_python() {
    // '@' binds like '*' and left to right; '+' is looser.
    let src = "input A: f32[M, K]\ninput B: f32[K, N]\noutput Y: f32[M, N]\nY = 2 * A @ B + 1\n";
    check(
        src,
        &[("M", 1), ("K", 2), ("N", 1)],
        &[&[1.0, 2.0], &[3.0, 4.0]],
        &[&[23.0]],
    );
}

#[test]
fn broadcasting_rows_columns_and_outer() {
    let src = "input A: f32[M, N]\ninput b: f32[N]\noutput Y: f32[M, N]\nY = A + b\n";
    let a: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    check(
        src,
        &[("M", 2), ("N", 3)],
        &[a, &[10.0, 20.0, 30.0]],
        &[&[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]],
    );
    let src = "input A: f32[M, 1]\ninput B: f32[1, N]\noutput Y: f32[M, N]\nY = A * B\n";
    check(
        src,
        &[("M", 2), ("N", 3)],
        &[&[1.0, 2.0], &[1.0, 2.0, 3.0]],
        &[&[1.0, 2.0, 3.0, 2.0, 4.0, 6.0]],
    );
    let src = "input A: f32[M, N]\noutput Y: f32[M, N]\nY = A - mean(A, axis=1, keepdim=true)\n";
    check(
        src,
        &[("M", 2), ("N", 2)],
        &[&[1.0, 3.0, 10.0, 20.0]],
        &[&[-1.0, 1.0, -5.0, 5.0]],
    );
}

const A23: &[f64] = &[1.0, -2.0, 3.0, 4.0, 5.0, -6.0];

/// Reduction `f` of a [2, 3] tensor, result declared as `out`.
#[track_caller]
fn check_reduce(call: &str, out: &str, expected: &[f64]) {
    let src = format!("input A: f32[M, N]\noutput Y: {out}\nY = {call}\n");
    check(&src, &[("M", 2), ("N", 3)], &[A23], &[expected]);
}

#[test]
fn reductions_axes_and_keepdim() {
    check_reduce("sum(A, axis=1)", "f32[M]", &[2.0, 3.0]);
    check_reduce("sum(A, axis=0)", "f32[N]", &[5.0, 3.0, -3.0]);
    check_reduce("sum(A, axis=-2)", "f32[N]", &[5.0, 3.0, -3.0]);
    check_reduce("sum(A)", "f32[M]", &[2.0, 3.0]);
    check_reduce("sum(A, 1, true)", "f32[M, 1]", &[2.0, 3.0]);
    check_reduce(
        "sum(A, axis=0, keepdim=true)",
        "f32[1, N]",
        &[5.0, 3.0, -3.0],
    );
    check_reduce("mean(A, axis=1)", "f32[M]", &[2.0 / 3.0, 1.0]);
    check_reduce("max(A, axis=1)", "f32[M]", &[3.0, 5.0]);
    check_reduce("min(A, axis=0)", "f32[N]", &[1.0, -2.0, -6.0]);
    check_reduce("prod(A, axis=1)", "f32[M]", &[-6.0, -120.0]);
    check_reduce("argmax(A, axis=1)", "i64[M]", &[2.0, 1.0]);
    check_reduce("argmin(A, axis=0)", "i64[N]", &[0.0, 0.0, 1.0]);
    check_reduce(
        "argmax(A, axis=0, keepdim=true)",
        "i64[1, N]",
        &[1.0, 1.0, 0.0],
    );
}

#[test]
fn argmax_picks_the_first_of_ties() {
    let src = "input A: f32[N]\noutput Y: i64[]\nY = argmax(A, axis=0)\n";
    check(src, &[("N", 4)], &[&[1.0, 7.0, 7.0, 2.0]], &[&[1.0]]);
}

#[test]
fn logsumexp_and_softmax_are_stable_with_large_values() {
    let big: &[f64] = &[1000.0, 1001.0, 1002.0];
    check_map(
        "softmax(X)",
        big,
        &[0.09003057317038046, 0.24472847105479764, 0.6652409557748219],
    );
    check_map(
        "softmax(X, axis=0)",
        &[-1000.0, -999.0, -998.0],
        &[0.09003057317038046, 0.24472847105479764, 0.6652409557748219],
    );
    let lse = 2.40760596444438;
    check_map("log_softmax(X)", big, &[-lse, 1.0 - lse, 2.0 - lse]);
    let src = "input X: f32[N]\noutput Y: f32[]\nY = logsumexp(X, axis=0)\n";
    check(src, &[("N", 3)], &[big], &[&[1000.0 + lse]]);
}

#[test]
fn softmax_over_columns() {
    let src = "input A: f32[M, N]\noutput Y: f32[M, N]\nY = softmax(A, axis=0)\n";
    check(
        src,
        &[("M", 2), ("N", 2)],
        &[&[0.0, 5.0, 0.0, 5.0]],
        &[&[0.5, 0.5, 0.5, 0.5]],
    );
}

#[test]
fn scans() {
    check_map("cumsum(X)", &[1.0, 2.0, 3.0], &[1.0, 3.0, 6.0]);
    check_map("cumprod(X)", &[1.0, 2.0, 3.0], &[1.0, 2.0, 6.0]);
    let src = "input A: f32[M, N]\noutput Y: f32[M, N]\nY = cumsum(A, axis=0)\n";
    check(
        src,
        &[("M", 2), ("N", 3)],
        &[A23],
        &[&[1.0, -2.0, 3.0, 5.0, 3.0, -3.0]],
    );
}

#[test]
fn norms() {
    let s = 1.3416407864998738;
    let t = 0.4472135954999579;
    check_map(
        "layer_norm(X, eps=0)",
        &[1.0, 2.0, 3.0, 4.0],
        &[-s, -t, t, s],
    );
    let eps = [
        -1.3416354199689269,
        -0.447211806656309,
        0.447211806656309,
        1.3416354199689269,
    ];
    check_map("layer_norm(X)", &[1.0, 2.0, 3.0, 4.0], &eps);
    let src = "input X: f32[M, N]\ninput w: f32[N]\ninput b: f32[N]\noutput Y: f32[M, N]\n\
               Y = layer_norm(X, w, b, eps=0)\n";
    let w: &[f64] = &[1.0, 2.0, 1.0, 2.0];
    let b: &[f64] = &[0.0, 0.0, 1.0, 1.0];
    check(
        src,
        &[("M", 1), ("N", 4)],
        &[&[1.0, 2.0, 3.0, 4.0], w, b],
        &[&[-s, -2.0 * t, 1.0 + t, 1.0 + 2.0 * s]],
    );
    let src =
        "input X: f32[N]\ninput b: f32[N]\noutput Y: f32[N]\nY = layer_norm(X, bias=b, eps=0)\n";
    check(
        src,
        &[("N", 4)],
        &[&[1.0, 2.0, 3.0, 4.0], b],
        &[&[-s, -t, 1.0 + t, 1.0 + s]],
    );
    check_map(
        "rms_norm(X, eps=0)",
        &[3.0, 4.0],
        &[0.848528137423857, 1.131370849898476],
    );
    let src = "input X: f32[N]\ninput w: f32[N]\noutput Y: f32[N]\nY = rms_norm(X, w, eps=0)\n";
    check(
        src,
        &[("N", 2)],
        &[&[3.0, 4.0], &[2.0, -1.0]],
        &[&[1.697056274847714, -1.131370849898476]],
    );
    check_map("l2norm(X)", &[3.0, 4.0], &[0.6, 0.8]);
    check_map("l2norm(X, eps=10)", &[3.0, 4.0], &[0.3, 0.4]);
}

#[test]
fn matmul_variants() {
    let src = "input A: f32[M, K]\ninput B: f32[K, N]\noutput Y: f32[M, N]\nY = A @ B\n";
    check(
        src,
        &[("M", 2), ("K", 2), ("N", 2)],
        &[&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]],
        &[&[19.0, 22.0, 43.0, 50.0]],
    );
    let src = "input A: f32[B, M, K]\ninput W: f32[B, K, N]\noutput Y: f32[B, M, N]\nY = A @ W\n";
    let a: &[f64] = &[1.0, 2.0, 3.0, 4.0, 1.0, 0.0, 0.0, 1.0];
    let w: &[f64] = &[5.0, 6.0, 7.0, 8.0, 1.0, 2.0, 3.0, 4.0];
    let sz = [("B", 2), ("M", 2), ("K", 2), ("N", 2)];
    check(
        src,
        &sz,
        &[a, w],
        &[&[19.0, 22.0, 43.0, 50.0, 1.0, 2.0, 3.0, 4.0]],
    );
    let src = "input A: f32[B, M, K]\ninput W: f32[K, N]\noutput Y: f32[B, M, N]\nY = A @ W\n";
    check(
        src,
        &sz,
        &[a, &[5.0, 6.0, 7.0, 8.0]],
        &[&[19.0, 22.0, 43.0, 50.0, 5.0, 6.0, 7.0, 8.0]],
    );
    let src = "input A: f32[M, K]\ninput v: f32[K]\noutput Y: f32[M]\nY = A @ v\n";
    check(
        src,
        &[("M", 3), ("K", 2)],
        &[&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[1.0, -1.0]],
        &[&[-1.0, -1.0, -1.0]],
    );
}

#[test]
fn transposes() {
    let src = "input A: f32[M, N]\noutput Y: f32[N, M]\nY = transpose(A)\n";
    check(
        src,
        &[("M", 2), ("N", 3)],
        &[A23],
        &[&[1.0, 4.0, -2.0, 5.0, 3.0, -6.0]],
    );
    let src = "input A: f32[B, M, N]\noutput Y: f32[N, M, B]\nY = transpose(A, 0, 2)\n";
    let a: Vec<f64> = (0..8).map(f64::from).collect();
    let sz = [("B", 2), ("M", 2), ("N", 2)];
    check(
        src,
        &sz,
        &[&a],
        &[&[0.0, 4.0, 2.0, 6.0, 1.0, 5.0, 3.0, 7.0]],
    );
}

#[test]
fn flips_reverse_one_axis() {
    // A23 = [[1, -2, 3], [4, 5, -6]].
    let src =
        |axis: &str| format!("input A: f32[M, N]\noutput Y: f32[M, N]\nY = flip(A, {axis})\n");
    let sz = [("M", 2), ("N", 3)];
    check(&src("0"), &sz, &[A23], &[&[4.0, 5.0, -6.0, 1.0, -2.0, 3.0]]);
    check(
        &src("axis=-1"),
        &sz,
        &[A23],
        &[&[3.0, -2.0, 1.0, -6.0, 5.0, 4.0]],
    );
    // The middle axis of [2, 2, 2]; a reversed cumulative sum.
    let a: Vec<f64> = (0..8).map(f64::from).collect();
    let src = "input A: f32[B, M, N]\noutput Y: f32[B, M, N]\nY = flip(A, 1)\n";
    let sz = [("B", 2), ("M", 2), ("N", 2)];
    check(
        src,
        &sz,
        &[&a],
        &[&[2.0, 3.0, 0.0, 1.0, 6.0, 7.0, 4.0, 5.0]],
    );
    let src = "input X: f32[N]\noutput Y: f32[N]\nY = flip(cumsum(flip(X, 0)), 0)\n";
    check(src, &[("N", 3)], &[XS], &[&[1.5, 2.5, 2.0]]);
}

#[test]
fn reshapes_keep_the_elements_in_order() {
    // A softmax over two axes at once: flattened, then the old shape back.
    let src = "input A: f32[M, N]\noutput Y: f32[M, N]\n\
               Y = reshape(softmax(reshape(A, (M*N,))), (M, N))\n";
    let e: Vec<f64> = A23.iter().map(|v| v.exp()).collect();
    let total: f64 = e.iter().sum();
    let want: Vec<f64> = e.iter().map(|v| v / total).collect();
    check(src, &[("M", 2), ("N", 3)], &[A23], &[&want]);
    let src =
        "input A: f32[B, M, N]\noutput Y: f32[B, N, M]\nY = reshape(A, shape=(B, N, M)) * 2.0\n";
    let a: Vec<f64> = (0..12).map(f64::from).collect();
    let want: Vec<f64> = a.iter().map(|v| v * 2.0).collect();
    check(src, &[("B", 2), ("M", 2), ("N", 3)], &[&a], &[&want]);
}

#[test]
fn intermediates_constants_and_several_outputs() {
    let src = "input X: f32[N]\nconst a = -2\noutput Y: f32[N]\noutput Z: f32[]\n\
               T = X * a   # scaled\nY = relu(T)\nZ = sum(Y, axis=0)\n";
    check(src, &[("N", 3)], &[XS], &[&[2.0, 0.0, 0.0], &[2.0]]);
}

#[test]
fn half_precision_inputs_are_rounded_first() {
    let src = "input X: f16[N]\ninput Z: bf16[N]\noutput Y: f32[N]\nY = X + Z\n";
    check(
        src,
        &[("N", 1)],
        &[&[0.1], &[0.1]],
        &[&[0.0999755859375 + 0.10009765625]],
    );
}

#[test]
fn interpreter_rejects_bad_inputs() {
    let p = Program::parse("input X: f32[N]\noutput Y: f32[N]\nY = relu(X)\n").unwrap();
    let e = run(&p, &sizes(&[("N", 2)]), &[vec![1.0]]).unwrap_err();
    assert_eq!(e.to_string(), "input `X` needs 2 values, got 1");
    let e = run(&p, &sizes(&[]), &[vec![1.0]]).unwrap_err();
    assert_eq!(e.to_string(), "size `N` has no value");
    let e = run(&p, &sizes(&[("N", 0)]), &[vec![]]).unwrap_err();
    assert_eq!(e.to_string(), "size `N` is zero");
}

const HEAD: &str = "input A: f32[M, N]\ninput b: f32[K]\n";

#[test]
fn type_errors_name_the_statement() {
    check_err(
        &format!("{HEAD}output Y: f32[M, N]\nY = A + b\n"),
        "type error: line 4, statement `Y`: cannot broadcast f32[M, N] with f32[K]",
    );
    check_err(
        &format!("{HEAD}output Y: f32[M, N]\nY = A @ b\n"),
        "type error: line 4, statement `Y`: cannot multiply f32[M, N] by f32[K] with @",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, N]\nY = softmax(A, axis=2)\n",
        "type error: line 3, statement `Y`: axis 2 of `softmax` is out of range for f32[M, N]",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, N]\nY = flip(A, axis=2)\n",
        "type error: line 3, statement `Y`: axis 2 of `flip` is out of range for f32[M, N]",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, M]\nY = reshape(A, (M, M))\n",
        "type error: line 3, statement `Y`: `reshape` of f32[M, N] to (M, M): not the same \
         number of elements at every size",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, N]\nY = reshape(A, (M, N / 2))\n",
        "syntax error: line 3, column 22: a dim divides with `//` (floor division)",
    );
    check_err(
        "input A: f32[N]\noutput Y: f32[N]\nY = triu(A)\n",
        "type error: line 3, statement `Y`: `triu` needs a matrix (rank >= 2), got f32[N]",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[N]\nY = squeeze(A, axis=0)\n",
        "type error: line 3, statement `Y`: `squeeze` of axis 0 of f32[M, N]: its extent is M, not 1",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, N, 1]\nY = unsqueeze(A, axis=4)\n",
        "type error: line 3, statement `Y`: axis 4 of `unsqueeze` is out of range for f32[M, N]",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M]\nY = sum(A, axis=0)\n",
        "type error: line 3, statement `Y`: produces f32[N] but the output is declared f32[M]",
    );
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, N]\nY = relu(A) + C\n",
        "type error: line 3, statement `Y`: unknown name `C`",
    );
    check_err(
        "input A: f32[N]\noutput Y: f32[N]\noutput Z: f32[N]\nZ = Y + A\nY = A\n",
        "type error: line 4, statement `Z`: output `Y` is used before it is assigned",
    );
    check_err(
        "input A: f32[N]\noutput Y: i64[]\nT = argmax(A, axis=0)\nY = T + 1\n",
        "type error: line 4, statement `Y`: `+` needs floating-point operands, got i64",
    );
    check_err(
        "input A: f32[N]\ninput w: f32[M]\noutput Y: f32[N]\nY = layer_norm(A, w)\n",
        "type error: line 4, statement `Y`: `layer_norm` weight/bias must have shape [N], got f32[M]",
    );
}

#[test]
fn bookkeeping_errors() {
    check_err(
        &format!("{HEAD}output Y: f32[M, N]\nY = relu(A)\n"),
        "type error: line 2: input `b` is never used",
    );
    check_err(
        "input A: f32[N]\noutput Y: f32[N]\noutput Z: f32[N]\nY = A\n",
        "type error: line 3: output `Z` is never assigned",
    );
    check_err(
        "input A: f32[N]\noutput Y: f32[N]\nT = A\nY = A\n",
        "type error: line 3, statement `T`: intermediate `T` is never used",
    );
    check_err(
        "input A: f32[N]\noutput Y: f32[N]\nY = A\nY = A\n",
        "type error: line 4, statement `Y`: `Y` is already defined",
    );
    check_err(
        "input A: f32[N]\ninput A: f32[N]\noutput Y: f32[N]\nY = A\n",
        "type error: line 2: `A` is already declared on line 1",
    );
    check_err(
        "input A: f32[N]\n",
        "type error: the program declares no output",
    );
    check_err(
        "input A: f32[N]\noutput Y: f32[N]\nT = 2\nY = A * T\n",
        "type error: line 3, statement `T`: the right-hand side is a bare scalar, not a tensor",
    );
}

#[test]
fn parse_errors_name_line_and_column() {
    check_err(
        "input A: f32[M, N]\noutput Y: f32[M, N]\nY = relu(A, 1.0 A)\n",
        "syntax error: line 3, column 17: expected ',' or ')' in the arguments of `relu`, found `A`",
    );
    check_err(
        "input A: f32[M, N\n",
        "syntax error: line 2, column 1: expected ',' or ']' in a shape, found end of input",
    );
    check_err(
        "input A: f33[M]\n",
        "syntax error: line 1, column 10: expected a dtype (f32, f16, bf16, i64), found `f33`",
    );
    check_err(
        "input A: f32[M]\noutput Y: f32[M]\nY = (A + 1\n",
        "syntax error: line 4, column 1: expected ')' to close the parenthesis, found end of input",
    );
    check_err(
        "input A: f32[M]\noutput Y: f32[M]\nY = foo(A)\n",
        "syntax error: line 3, column 5: unknown function `foo`",
    );
    check_err(
        "input A: f32[M]\noutput Y: f32[M]\nY = clamp(A, 0)\n",
        "syntax error: line 3, column 5: `clamp` needs argument `hi`",
    );
    check_err(
        "input A: f32[M]\noutput Y: f32[M]\nY = sum(A, axis=1.5)\n",
        "syntax error: line 3, column 5: parameter `axis` of `sum` must be an integer",
    );
    check_err(
        "input relu: f32[M]\n",
        "syntax error: line 1, column 7: `relu` is a built-in function and cannot name an input",
    );
    check_err(
        "input A: f32[M]\noutput Y: f32[M]\nY = A $ 2\n",
        "syntax error: line 3, column 7: unexpected character '$'",
    );
    check_err(
        "input A: f32[0]\n",
        "syntax error: line 1, column 14: dimension `0` is not a positive integer",
    );
}

#[test]
fn names_cannot_shadow_size_symbols() {
    check_err(
        "input N: f32[N]\noutput Y: f32[N]\nY = relu(N)\n",
        "type error: line 1: `N` names both a size and a tensor or constant",
    );
}

#[test]
fn convolutions_against_hand_computed_values() {
    // A 2x2 diagonal kernel over 1..9, plus a bias.
    check(
        "input X: f32[1, 1, 3, 3]\ninput K: f32[1, 1, 2, 2]\ninput b: f32[1]\n\
         output Y: f32[1, 1, 2, 2]\nY = conv2d(X, K, b)\n",
        &[],
        &[
            &[1., 2., 3., 4., 5., 6., 7., 8., 9.],
            &[1., 0., 0., 1.],
            &[1.],
        ],
        &[&[7., 9., 13., 15.]],
    );
    // Zero padding and a stride: windows start at -1, 1 and 3.
    check(
        "input X: f32[1, 1, L]\ninput K: f32[1, 1, 3]\noutput Y: f32[1, 1, (L - 1) // 2 + 1]\n\
         Y = conv1d(X, K, padding=1, stride=2)\n",
        &[("L", 5)],
        &[&[1., 2., 3., 4., 5.], &[1., 1., 1.]],
        &[&[3., 9., 9.]],
    );
    // Dilation 2 reads every other element.
    check(
        "input X: f32[1, 1, 5]\ninput K: f32[1, 1, 2]\noutput Y: f32[1, 1, 3]\n\
         Y = conv1d(X, K, dilation=2)\n",
        &[],
        &[&[1., 2., 3., 4., 5.], &[1., 10.]],
        &[&[31., 42., 53.]],
    );
    // Groups: each output channel sees only its own input channel.
    check(
        "input X: f32[1, 2, 2]\ninput K: f32[2, 1, 1]\noutput Y: f32[1, 2, 2]\n\
         Y = conv1d(X, K, groups=2)\n",
        &[],
        &[&[1., 2., 3., 4.], &[10., 100.]],
        &[&[10., 20., 300., 400.]],
    );
    // Two input channels summed, two output channels, per-axis tuples.
    check(
        "input X: f32[1, 2, 1, 3]\ninput K: f32[2, 2, 1, 2]\noutput Y: f32[1, 2, 1, 2]\n\
         Y = conv2d(X, K, stride=(1, 1), padding=(0, 0))\n",
        &[],
        &[&[1., 2., 3., 4., 5., 6.], &[1., 0., 0., 1., 0., 1., 1., 0.]],
        &[&[6., 8., 6., 8.]],
    );
}

#[test]
fn pooling_against_hand_computed_values() {
    check(
        "input X: f32[1, 1, 5]\noutput Y: f32[1, 1, 2]\noutput Z: f32[1, 1, 3]\n\
         Y = max_pool1d(X, 2)\nZ = max_pool1d(X, 2, padding=1)\n",
        &[],
        &[&[1., 5., 2., 4., 3.]],
        &[&[5., 4.], &[1., 5., 4.]],
    );
    // The divisor counts the padding by default, not with count_include_pad=false.
    check(
        "input X: f32[1, 1, 4]\noutput Y: f32[1, 1, 4]\noutput Z: f32[1, 1, 4]\n\
         Y = avg_pool1d(X, 3, stride=1, padding=1)\n\
         Z = avg_pool1d(X, 3, stride=1, padding=1, count_include_pad=false)\n",
        &[],
        &[&[1., 2., 3., 4.]],
        &[&[1., 2., 3., 7. / 3.], &[1.5, 2., 3., 3.5]],
    );
    check(
        "input X: f32[1, 1, 2, 4]\noutput Y: f32[1, 1, 1, 2]\nY = avg_pool2d(X, (2, 2))\n",
        &[],
        &[&[1., 2., 3., 4., 5., 6., 7., 8.]],
        &[&[3.5, 5.5]],
    );
}

#[test]
fn windowed_ops_check_their_shapes_and_parameters() {
    check_err(
        "input X: f32[N, 3, H, W]\ninput K: f32[8, 4, 3, 3]\noutput Y: f32[N, 8, H - 2, W - 2]\n\
         Y = conv2d(X, K)\n",
        "type error: line 4, statement `Y`: `conv2d`: the weight's second dim times groups \
         (4 x 1) must be the input's channels 3 (with groups, write the channels as a multiple: \
         [N, 1*G, ...] and [F, G, ...])",
    );
    check_err(
        "input X: f32[N, 3, H, W]\ninput K: f32[8, 3, 3, 3]\noutput Y: f32[N, 8, H, W]\n\
         Y = conv2d(X, K)\n",
        "type error: line 4, statement `Y`: produces f32[N, 8, H - 2, W - 2] but the output is \
         declared f32[N, 8, H, W]",
    );
    check_err(
        "input X: f32[N, 3, H, W]\noutput Y: f32[N, 3, H, W]\nY = max_pool2d(X, (2, 2, 2))\n",
        "syntax error: line 3, column 5: `kernel_size` of `max_pool2d` has 3 values; give one, \
         or one per spatial axis (2)",
    );
    check_err(
        "input X: f32[N, 3, H, W]\noutput Y: f32[N, 3, H, W]\nY = max_pool2d(X, 2, ceil_mode=true)\n",
        "syntax error: line 3, column 5: `ceil_mode=true` of `max_pool2d` is not supported (floor \
         mode only)",
    );
    check_err(
        "input X: f32[N, 3, 2]\noutput Y: f32[N, 3, 1]\nY = max_pool1d(X, 3, padding=2)\n",
        "syntax error: line 3, column 5: `padding` of `max_pool1d` must be at most half the \
         window: 2 against a window of 3",
    );
    check_err(
        "input X: f32[N, 3, 2]\ninput K: f32[1, 3, 5]\noutput Y: f32[N, 1, 1]\nY = conv1d(X, K)\n",
        "type error: line 4, statement `Y`: `conv1d`: the window (5, dilation 1) does not fit \
         spatial axis 0 of length 2 padded by 0",
    );
    // Dims written differently but equal are the same dim.
    Program::parse(
        "input X: f32[N, C, L]\noutput Y: f32[N, C, (L + 1) // 2 - 1]\n\
         Y = max_pool1d(X, 3, stride=2)\n",
    )
    .expect("(L - 3) // 2 + 1 is (L + 1) // 2 - 1");
    check_err(
        "input X: f32[N, C, L]\noutput Y: f32[N, C, L / 2]\nY = max_pool1d(X, 2)\n",
        "syntax error: line 2, column 23: a dim divides with `//` (floor division)",
    );
}

#[test]
fn transposed_convolutions_against_hand_computed_values() {
    // Each input element scatters the kernel at stride 2: o = 2*i + k.
    check(
        "input X: f32[1, 1, L]\ninput K: f32[1, 1, 2]\noutput Y: f32[1, 1, 2*L]\n\
         output Z: f32[1, 1, 2*L - 2]\noutput O: f32[1, 1, 2*L + 1]\n\
         Y = conv_transpose1d(X, K, stride=2)\nZ = conv_transpose1d(X, K, stride=2, padding=1)\n\
         O = conv_transpose1d(X, K, stride=2, output_padding=1)\n",
        &[("L", 3)],
        &[&[1., 2., 3.], &[1., 10.]],
        &[
            &[1., 10., 2., 20., 3., 30.],
            &[10., 2., 20., 3.],
            &[1., 10., 2., 20., 3., 30., 0.],
        ],
    );
    // Dilation spreads the kernel; input channels are summed; groups keep channels apart.
    check(
        "input X: f32[1, 1, 2]\ninput K: f32[1, 1, 2]\noutput Y: f32[1, 1, 4]\n\
         Y = conv_transpose1d(X, K, dilation=2)\n",
        &[],
        &[&[1., 2.], &[1., 10.]],
        &[&[1., 2., 10., 20.]],
    );
    check(
        "input X: f32[1, 2, 2]\ninput K: f32[2, 1, 1]\ninput b: f32[1]\noutput Y: f32[1, 1, 2]\n\
         output Z: f32[1, 2, 2]\nY = conv_transpose1d(X, K, b)\nZ = conv_transpose1d(X, K, groups=2)\n",
        &[],
        &[&[1., 2., 3., 4.], &[10., 100.], &[0.5]],
        &[&[310.5, 420.5], &[10., 20., 300., 400.]],
    );
    check_err(
        "input X: f32[N, C, L]\ninput K: f32[C, 4, 3]\noutput Y: f32[N, 4, L + 3]\n\
         Y = conv_transpose1d(X, K, output_padding=1)\n",
        "syntax error: line 4, column 5: `output_padding` of `conv_transpose1d` must be smaller \
         than the stride or the dilation: 1 against 1 and 1",
    );
}

#[test]
fn channel_norms_against_hand_computed_values() {
    // Two samples, two channels of two elements: [[1, 3], [5, 7]] and [[0, 2], [4, 10]].
    let x: &[f64] = &[1., 3., 5., 7., 0., 2., 4., 10.];
    let z = |v: &[f64]| -> Vec<f64> {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / v.len() as f64;
        v.iter().map(|a| (a - m) / (var + 1e-5).sqrt()).collect()
    };
    // One group: each sample normalised as a whole.
    let mut group: Vec<f64> = z(&x[..4]);
    group.extend(z(&x[4..]));
    // Instance: each (sample, channel) pair.
    let instance: Vec<f64> = x.chunks(2).flat_map(z).collect();
    // Batch: each channel over both samples.
    let c0 = z(&[1., 3., 0., 2.]);
    let c1 = z(&[5., 7., 4., 10.]);
    let batch = [c0[0], c0[1], c1[0], c1[1], c0[2], c0[3], c1[2], c1[3]];
    check(
        "input X: f32[2, 2, 2]\noutput G: f32[2, 2, 2]\noutput I: f32[2, 2, 2]\n\
         output B: f32[2, 2, 2]\nG = group_norm(X, 1)\nI = instance_norm(X)\nB = batch_norm(X)\n",
        &[],
        &[x],
        &[&group, &instance, &batch],
    );
    // Weight and bias per channel.
    let scaled: Vec<f64> = instance
        .iter()
        .enumerate()
        .map(|(i, v)| v * [2., 3.][i / 2 % 2] + [0.5, -1.][i / 2 % 2])
        .collect();
    check(
        "input X: f32[2, 2, 2]\ninput w: f32[2]\ninput b: f32[2]\noutput Y: f32[2, 2, 2]\n\
         Y = group_norm(X, 2, w, b)\n",
        &[],
        &[x, &[2., 3.], &[0.5, -1.]],
        &[&scaled],
    );
    check_err(
        "input X: f32[N, 6, L]\noutput Y: f32[N, 6, L]\nY = group_norm(X, 4)\n",
        "type error: line 3, statement `Y`: `group_norm`: 6 channels are not divisible into 4 groups",
    );
}
