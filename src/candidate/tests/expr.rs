//! Expressions: parsing, precedence, printing, checked evaluation.

use crate::candidate::expr::{EvalError, Expr, Parser, MAX_DEPTH, MAX_NODES};

/// Parses `input` as a whole expression and evaluates it with M=64, N=32, K=16 and a tensor
/// `A`. `expected`: `Ok(value)` or `Err(message)`.
fn check(input: &str, expected: Result<i64, &str>) {
    assert_eq!(
        eval(input),
        expected.map_err(str::to_string),
        "input: {input}"
    );
}

fn parse(input: &str) -> Result<Expr, String> {
    let mut p = Parser::new(input);
    let e = p.expr().map_err(|e| e.to_string())?;
    match p.peek() {
        None => Ok(e),
        Some(t) => Err(format!("trailing {t}")),
    }
}

fn eval(input: &str) -> Result<i64, String> {
    let lookup = |name: &str| match name {
        "M" => Ok(64),
        "N" => Ok(32),
        "K" => Ok(16),
        "BIG" => Ok(i64::MAX),
        "A" => Err(EvalError::NotASize {
            name: "A".into(),
            what: "tensor".into(),
            sizes: "K, M, N".into(),
        }),
        _ => Err(EvalError::UnknownSymbol {
            name: name.into(),
            sizes: "K, M, N".into(),
        }),
    };
    parse(input)?.eval(&lookup).map_err(|e| e.to_string())
}

#[test]
fn literals_symbols_precedence() {
    check("42", Ok(42));
    check("M", Ok(64));
    check("M*N", Ok(2048));
    check("1 + 2 * 3", Ok(7));
    check("(1 + 2) * 3", Ok(9));
    check("10 - 3 - 2", Ok(5));
    check("100 / 10 / 5", Ok(2));
    check("17 % 5 * 2", Ok(4));
    check("-3 + 5", Ok(2));
    check("- -3", Ok(3));
    check("2 * -M", Ok(-128));
    check("((((K))))", Ok(16));
}

#[test]
fn division_truncates_like_c() {
    check("7 / 2", Ok(3));
    check("-7 / 2", Ok(-3));
    check("-7 % 2", Ok(-1));
}

#[test]
fn cdiv_rounds_up() {
    check("cdiv(M*N, 256)", Ok(8));
    check("cdiv(2049, 256)", Ok(9));
    check("cdiv(0, 256)", Ok(0));
    check("cdiv(-7, 2)", Ok(-3));
    check("cdiv(7, -2)", Ok(-3));
    check("cdiv(-7, -2)", Ok(4));
    check("cdiv(cdiv(N, 4), 3)", Ok(3));
}

#[test]
fn checked_arithmetic() {
    check(
        "BIG + 1",
        Err("`BIG + 1` overflows 64-bit integer arithmetic"),
    );
    check(
        "BIG * 2",
        Err("`BIG * 2` overflows 64-bit integer arithmetic"),
    );
    check(
        "-BIG - 2",
        Err("`-BIG - 2` overflows 64-bit integer arithmetic"),
    );
    check(
        "(-BIG - 1) / -1",
        Err("`(-BIG - 1) / -1` overflows 64-bit integer arithmetic"),
    );
    check(
        "(-BIG - 1) % -1",
        Err("`(-BIG - 1) % -1` overflows 64-bit integer arithmetic"),
    );
    check(
        "-(-BIG - 1)",
        Err("`-(-BIG - 1)` overflows 64-bit integer arithmetic"),
    );
    check(
        "cdiv(-BIG - 1, -1)",
        Err("`cdiv(-BIG - 1, -1)` overflows 64-bit integer arithmetic"),
    );
    check("cdiv(BIG, 2)", Ok(i64::MAX / 2 + 1));
    check("M / (N - 32)", Err("`M / (N - 32)` divides by zero"));
    check("M % 0", Err("`M % 0` divides by zero"));
    check("cdiv(M, 0)", Err("`cdiv(M, 0)` divides by zero"));
    check("9223372036854775807", Ok(i64::MAX));
    check(
        "9223372036854775808",
        Err("integer `9223372036854775808` does not fit in 64 bits"),
    );
    check(
        "99999999999999999999999999",
        Err("integer `99999999999999999999999999` does not fit in 64 bits"),
    );
}

#[test]
fn names_that_are_not_sizes() {
    check(
        "Q + 1",
        Err("`Q` is not a size of this task (sizes: K, M, N)"),
    );
    check(
        "A * 2",
        Err("`A` is a tensor, not a size; size expressions use only sizes (K, M, N) and integers"),
    );
}

#[test]
fn syntax_errors() {
    check("", Err("expected an expression, found end of line"));
    check("1 +", Err("expected an expression, found end of line"));
    check(
        "(1 + 2",
        Err("expected `)` to close `(`, found end of line"),
    );
    check("1 + )", Err("expected an expression, found `)`"));
    check("1 2", Err("trailing `2`"));
    check(
        "max(1, 2)",
        Err("unknown function `max` (the only function is `cdiv(a, b)`)"),
    );
    check(
        "cdiv(1)",
        Err("expected `,` between the two arguments of `cdiv`, found `)`"),
    );
    check(
        "cdiv(1, 2, 3)",
        Err("expected `)` after the second argument of `cdiv`, found `,`"),
    );
    check(
        "0.5 * N",
        Err("float `0.5` can only be a whole argument, not part of a size expression"),
    );
    check(
        "0x10",
        Err("`0x10` is not a valid number (write decimal integers like 256 or floats like 0.5)"),
    );
    check(
        "64k",
        Err("`64k` is not a valid number (write decimal integers like 256 or floats like 0.5)"),
    );
    check("1 $ 2", Err("trailing `$`"));
}

#[test]
fn depth_and_length_are_bounded() {
    let ok = format!(
        "{}1{}",
        "(".repeat(MAX_DEPTH - 1),
        ")".repeat(MAX_DEPTH - 1)
    );
    check(&ok, Ok(1));
    let deep = format!("{}1{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
    check(&deep, Err("expression nests deeper than 64 levels"));
    check(
        &"(".repeat(100_000),
        Err("expression nests deeper than 64 levels"),
    );
    check(
        &"-".repeat(100_000),
        Err("expression nests deeper than 64 levels"),
    );
    check(
        &"cdiv(".repeat(1000),
        Err("expression nests deeper than 64 levels"),
    );
    let long = vec!["1"; MAX_NODES].join("+");
    check(
        &long,
        Err("expressions on this line are longer than 1024 operands and operators"),
    );
    let fits = vec!["1"; MAX_NODES / 2].join("+");
    check(&fits, Ok((MAX_NODES / 2) as i64));
}

#[test]
fn display_round_trips() {
    for input in [
        "cdiv(M * N, 256)",
        "(M + 1) * 2",
        "M - (N - K)",
        "M - N - K",
        "-(M + 1)",
        "M / (N * K)",
        "-M * 2",
    ] {
        let e = parse(input).unwrap();
        assert_eq!(e.to_string(), input);
        assert_eq!(parse(&e.to_string()).unwrap(), e);
    }
}

#[test]
fn serde_round_trip() {
    let e = parse("cdiv(M * N, 256) - -1").unwrap();
    let json = serde_json::to_string(&e).unwrap();
    assert_eq!(serde_json::from_str::<Expr>(&json).unwrap(), e);
}
