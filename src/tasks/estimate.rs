//! A rough model of the op-by-op baseline's time, used to size GPU presets (>= 0.1 ms) without a
//! GPU. Each operator node of the program is one eager kernel that reads its tensor operands once
//! and writes its result once; its time is the larger of memory time (4.0e12 B/s, about H200 HBM3e
//! in practice) and compute time (matmul FLOPs at 5e13/s in fp32, 5e14/s in fp16/bf16 on tensor
//! cores). Launch overheads, caches and fusion are ignored, so the estimate is a lower bound in
//! spirit, accurate to maybe a factor of two: a sizing aid, not a measurement.

use crate::ops::{infer_expr, BinOp, Dtype, Expr, Program, Sizes};

const BYTES_PER_S: f64 = 4.0e12;
const F32_FLOPS: f64 = 5.0e13;
const HALF_FLOPS: f64 = 5.0e14;

/// Estimated milliseconds for `program` at `sizes`.
pub fn baseline_ms(program: &Program, sizes: &Sizes) -> f64 {
    let mut seconds = 0.0;
    for s in &program.stmts {
        let before = seconds;
        node(program, sizes, &s.expr, &mut seconds);
        if seconds == before {
            // `Y = X`: a copy.
            seconds += 2.0 * bytes(program, sizes, &s.expr) / BYTES_PER_S;
        }
    }
    seconds * 1e3
}

/// Bytes of the intermediates that PyTorch eager allocates running `program` op by op at `sizes`:
/// the result of every operator node, except a statement's root that is an output (it is
/// written in place). A candidate may use as much scratch (see `Limits::scratch_cap`).
pub fn intermediate_bytes(program: &Program, sizes: &Sizes) -> u64 {
    fn walk(program: &Program, sizes: &Sizes, e: &Expr, root: bool, total: &mut f64) {
        let Some(operands) = operands(e) else {
            return;
        };
        for a in operands {
            walk(program, sizes, a, false, total);
        }
        if !root {
            *total += bytes(program, sizes, e);
        }
    }
    let mut total = 0.0;
    for s in &program.stmts {
        let to_output = program.outputs.iter().any(|d| d.name == s.target);
        walk(program, sizes, &s.expr, to_output, &mut total);
    }
    total.min(u64::MAX as f64) as u64
}

/// The operands of operator node `e`; None for a leaf (a number or a name), which is no node.
fn operands(e: &Expr) -> Option<Vec<&Expr>> {
    match e {
        Expr::Num(_) | Expr::Var(_) => None,
        Expr::Neg(a) => Some(vec![a]),
        Expr::Binary(_, a, b) => Some(vec![a, b]),
        Expr::Call { args, .. } => Some(args.iter().collect()),
    }
}

/// The extents of `e` at `sizes` (an unbound one as 1) and its element type (None for a
/// scalar), when it type-checks.
fn extents(program: &Program, sizes: &Sizes, e: &Expr) -> Option<(Vec<f64>, Option<Dtype>)> {
    let t = infer_expr(program, e).ok()?;
    let dims = t
        .shape
        .iter()
        .map(|d| d.resolve(sizes).unwrap_or(1) as f64)
        .collect();
    Some((dims, t.dtype))
}

/// Elements of `e` at `sizes` (0 when it does not type-check).
fn elems(program: &Program, sizes: &Sizes, e: &Expr) -> f64 {
    extents(program, sizes, e).map_or(0.0, |(d, _)| d.iter().product())
}

/// Bytes of `e` at `sizes`; scalars count as zero bytes.
fn bytes(program: &Program, sizes: &Sizes, e: &Expr) -> f64 {
    match extents(program, sizes, e) {
        Some((dims, Some(d))) => dims.iter().product::<f64>() * d.size_bytes() as f64,
        _ => 0.0,
    }
}

/// FLOP/s of a product or convolution whose result is `e`: tensor-core rate in fp16/bf16.
fn flop_rate(program: &Program, e: &Expr) -> f64 {
    match infer_expr(program, e).ok().and_then(|t| t.dtype) {
        Some(Dtype::F16 | Dtype::Bf16) => HALF_FLOPS,
        _ => F32_FLOPS,
    }
}

fn node(program: &Program, sizes: &Sizes, e: &Expr, seconds: &mut f64) {
    let Some(operands) = operands(e) else {
        return;
    };
    for a in &operands {
        node(program, sizes, a, seconds);
    }
    let traffic: f64 = operands
        .iter()
        .map(|a| bytes(program, sizes, a))
        .sum::<f64>()
        + bytes(program, sizes, e);
    let mut t = traffic / BYTES_PER_S;
    if let Expr::Binary(BinOp::MatMul, a, _) = e {
        let k = extents(program, sizes, a)
            .and_then(|(d, _)| d.last().copied())
            .unwrap_or(1.0);
        t = t.max(2.0 * elems(program, sizes, e) * k / flop_rate(program, e));
    }
    if let Expr::Call {
        op: crate::ops::Op::Conv { transposed, .. },
        args,
    } = e
    {
        // A convolution: 2 FLOPs per output (input, for a transposed one) element and weight
        // tap of its group: the weight's elements over its first extent.
        let taps = args.get(1).map_or(0.0, |w| {
            let (elems, first) = extents(program, sizes, w).map_or((0.0, 1.0), |(d, _)| {
                (d.iter().product(), d.first().copied().unwrap_or(1.0))
            });
            elems / first.max(1.0)
        });
        let each = if *transposed {
            args.first().map_or(0.0, |x| elems(program, sizes, x))
        } else {
            elems(program, sizes, e)
        };
        t = t.max(2.0 * each * taps / flop_rate(program, e));
    }
    *seconds += t;
}
