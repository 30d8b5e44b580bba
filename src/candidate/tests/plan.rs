//! Launch-plan parsing: directive lines, keys, dimensions, arguments, and syntax errors.

use crate::candidate::plan::{parse_plan, Arg, LaunchPlan};

/// Renders a plan compactly, one directive per line.
fn render(plan: &LaunchPlan) -> String {
    let mut out = Vec::new();
    for s in &plan.scratch {
        out.push(format!(
            "{}: scratch {} {}[{}]",
            s.line, s.name, s.dtype, s.elems
        ));
    }
    for l in &plan.launches {
        let list = |v: &[crate::candidate::Expr]| {
            v.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let args: Vec<String> = l.args.iter().map(Arg::to_string).collect();
        let smem = l.smem.as_ref().map_or("-".to_string(), |e| e.to_string());
        out.push(format!(
            "{}: launch {} grid=({}) block=({}) smem={} args=({})",
            l.line,
            l.kernel,
            list(&l.grid),
            list(&l.block),
            smem,
            args.join(", ")
        ));
    }
    out.join("\n")
}

/// `expected`: `Ok(rendered plan)` or `Err(message)`.
fn check(source: &str, expected: Result<&str, &str>) {
    let got = parse_plan(source)
        .map(|p| render(&p))
        .map_err(|e| e.to_string());
    assert_eq!(
        got,
        expected.map(str::to_string).map_err(str::to_string),
        "source:\n{source}"
    );
}

#[test]
fn the_design_example() {
    check(
        "// kevin: scratch T f32[M*N]\n\
         // kevin: launch gemm_bias grid=(cdiv(N,64), cdiv(M,64)) block=(16,16) smem=0 args=(A, W, b, T, M, N, K)\n\
         // kevin: launch relu_inplace grid=(cdiv(M*N,256)) block=(256) args=(T, Y, M*N)\n",
        Ok("1: scratch T f32[M * N]\n\
            2: launch gemm_bias grid=(cdiv(N, 64), cdiv(M, 64)) block=(16, 16) smem=0 args=(A, W, b, T, M, N, K)\n\
            3: launch relu_inplace grid=(cdiv(M * N, 256)) block=(256) smem=- args=(T, Y, M * N)"),
    );
}

#[test]
fn keys_in_any_order_bare_dims_and_three_dims() {
    check(
        "  //kevin:launch k args=() smem=4*K block=32 grid=(1,2,3)",
        Ok("1: launch k grid=(1, 2, 3) block=(32) smem=4 * K args=()"),
    );
}

#[test]
fn float_arguments() {
    check(
        "// kevin: launch k grid=1 block=1 args=(0.5, -1e-3, 2.5f, 1e3, -4, .5)",
        Ok("1: launch k grid=(1) block=(1) smem=- args=(0.5, -0.001, 2.5, 1000.0, -4, 0.5)"),
    );
    check(
        "// kevin: launch k grid=1 block=1 args=(0.5*N)",
        Err("line 1 of the cuda block (launch `k`): float `0.5` can only be a whole argument, not part of a size expression"),
    );
    check(
        "// kevin: launch k grid=1 block=1 args=(1e999)",
        Err("line 1 of the cuda block (launch `k`): `1e999` is not a valid number (write decimal integers like 256 or floats like 0.5)"),
    );
}

#[test]
fn other_comments_and_code_are_ignored() {
    check(
        "// a comment\nint x; // kevin: launch k\n/* kevin: launch k */\n// kevins are nice\n// Kevin says hi\n",
        Ok(""),
    );
}

#[test]
fn trailing_comment_on_a_directive() {
    check(
        "// kevin: scratch S i64[4] // partial sums",
        Ok("1: scratch S i64[4]"),
    );
}

#[test]
fn misspelled_and_unknown_directives() {
    let misspelled = "line 1 of the cuda block (`// kevin:` directive): write directives as `// kevin: launch ...` or `// kevin: scratch ...`";
    check("// kevin launch k grid=1 block=1 args=()", Err(misspelled));
    check("// Kevin: launch k grid=1 block=1 args=()", Err(misspelled));
    check("// kevin : scratch T f32[1]", Err(misspelled));
    check(
        "// kevin: lunch k",
        Err("line 1 of the cuda block (`// kevin:` directive): unknown directive `lunch` (expected `launch` or `scratch`)"),
    );
    check(
        "// kevin:",
        Err("line 1 of the cuda block (`// kevin:` directive): expected `launch` or `scratch`, found end of line"),
    );
}

#[test]
fn launch_syntax_errors() {
    let err = |line: &str, msg: &str| check(line, Err(msg));
    err(
        "// kevin: launch",
        "line 1 of the cuda block (launch): expected a kernel name, found end of line",
    );
    err(
        "// kevin: launch k grid=1 block=1",
        "line 1 of the cuda block (launch `k`): missing `args=(...)`",
    );
    err(
        "// kevin: launch k block=1 args=()",
        "line 1 of the cuda block (launch `k`): missing `grid=(...)`",
    );
    err(
        "// kevin: launch k grid=1 args=()",
        "line 1 of the cuda block (launch `k`): missing `block=(...)`",
    );
    err(
        "// kevin: launch k grid=1 grid=2 block=1 args=()",
        "line 1 of the cuda block (launch `k`): `grid=` is given twice",
    );
    err(
        "// kevin: launch k grid=1 block=1 args=() stream=2",
        "line 1 of the cuda block (launch `k`): unknown key `stream` (expected grid=, block=, smem= or args=)",
    );
    err(
        "// kevin: launch k grid (1) block=1 args=()",
        "line 1 of the cuda block (launch `k`): expected `=` after `grid`, found `(`",
    );
    err(
        "// kevin: launch k grid=(1,2,3,4) block=1 args=()",
        "line 1 of the cuda block (launch `k`): `grid` has 4 dimensions; give 1 to 3 (x, y, z)",
    );
    err(
        "// kevin: launch k grid=() block=1 args=()",
        "line 1 of the cuda block (launch `k`): expected an expression, found `)`",
    );
    err(
        "// kevin: launch k grid=(1 block=1 args=()",
        "line 1 of the cuda block (launch `k`): expected `)` or `,` in `grid=(...)`, found `block`",
    );
    err(
        "// kevin: launch k grid=1 block=1 args=(A, B",
        "line 1 of the cuda block (launch `k`): expected `)` or `,` in `args=(...)`, found end of line",
    );
    err(
        "// kevin: launch k grid=1 block=1 args=(A,)",
        "line 1 of the cuda block (launch `k`): expected an expression, found `)`",
    );
    err(
        "// kevin: launch k grid=1 block=1 args=A",
        "line 1 of the cuda block (launch `k`): expected `(` after `args=`, found `A`",
    );
    err(
        "// kevin: launch k<<<1,1>>> grid=1 block=1 args=()",
        "line 1 of the cuda block (launch `k`): expected `grid=`, `block=`, `smem=` or `args=`, found `<`",
    );
    err(
        "// kevin: launch k grid=1 block=1 smem=1.5 args=()",
        "line 1 of the cuda block (launch `k`): float `1.5` can only be a whole argument, not part of a size expression",
    );
}

#[test]
fn scratch_syntax_errors() {
    let err = |line: &str, msg: &str| check(line, Err(msg));
    err(
        "// kevin: scratch",
        "line 1 of the cuda block (scratch): expected a scratch buffer name, found end of line",
    );
    err(
        "// kevin: scratch T float[4]",
        "line 1 of the cuda block (scratch `T`): unknown dtype `float` (expected one of f16, bf16, f32, f64, i8, u8, i32, i64, bool)",
    );
    err(
        "// kevin: scratch T f32(4)",
        "line 1 of the cuda block (scratch `T`): expected `[` after the dtype (write `f32[N]`), found `(`",
    );
    err(
        "// kevin: scratch T f32[4",
        "line 1 of the cuda block (scratch `T`): expected `]` after the element count, found end of line",
    );
    err(
        "// kevin: scratch T f32[4] x",
        "line 1 of the cuda block (scratch `T`): expected end of line, found `x`",
    );
}

#[test]
fn reports_the_line_of_the_block() {
    check(
        "#include <mma.h>\n\n// kevin: scratch T f32[4]\n// kevin: launch k grid=1 block=1 args=(\n",
        Err("line 4 of the cuda block (launch `k`): expected an expression, found end of line"),
    );
}

#[test]
fn serde_round_trip() {
    let plan = parse_plan("// kevin: scratch T bf16[M]\n// kevin: launch k grid=(1,2) block=3 smem=8 args=(T, 0.5, N+1)").unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<LaunchPlan>(&json).unwrap(), plan);
}
