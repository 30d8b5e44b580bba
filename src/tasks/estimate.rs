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

/// (element count, dtype) of `e`; scalars count as zero bytes.
fn bytes(program: &Program, sizes: &Sizes, e: &Expr) -> f64 {
    match infer_expr(program, e) {
        Ok(t) => match t.dtype {
            Some(d) => {
                let n: f64 = t
                    .shape
                    .iter()
                    .map(|d| d.resolve(sizes).unwrap_or(1) as f64)
                    .product();
                n * d.size_bytes() as f64
            }
            None => 0.0,
        },
        Err(_) => 0.0,
    }
}

fn node(program: &Program, sizes: &Sizes, e: &Expr, seconds: &mut f64) {
    let operands: Vec<&Expr> = match e {
        Expr::Num(_) | Expr::Var(_) => return,
        Expr::Neg(a) => vec![a],
        Expr::Binary(_, a, b) => vec![a, b],
        Expr::Call { args, .. } => args.iter().collect(),
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
        let k = infer_expr(program, a)
            .ok()
            .and_then(|t| t.shape.last().and_then(|d| d.resolve(sizes)))
            .unwrap_or(1) as f64;
        let out = infer_expr(program, e).ok();
        let n_out: f64 = out.as_ref().map_or(0.0, |t| {
            t.shape
                .iter()
                .map(|d| d.resolve(sizes).unwrap_or(1) as f64)
                .product()
        });
        let rate = match out.and_then(|t| t.dtype) {
            Some(Dtype::F16 | Dtype::Bf16) => HALF_FLOPS,
            _ => F32_FLOPS,
        };
        t = t.max(2.0 * n_out * k / rate);
    }
    if let Expr::Call {
        op: crate::ops::Op::Conv { transposed, .. },
        args,
    } = e
    {
        // A convolution: 2 FLOPs per output (input, for a transposed one) element and weight
        // tap of its group: the weight's elements over its first extent.
        let count = |x: &Expr| -> (f64, Vec<f64>) {
            infer_expr(program, x).ok().map_or((0.0, Vec::new()), |t| {
                let dims: Vec<f64> = t
                    .shape
                    .iter()
                    .map(|d| d.resolve(sizes).unwrap_or(1) as f64)
                    .collect();
                (dims.iter().product(), dims)
            })
        };
        let (w_elems, w_dims) = args.get(1).map_or((0.0, Vec::new()), count);
        let taps = w_elems / w_dims.first().copied().unwrap_or(1.0).max(1.0);
        let elems = if *transposed {
            args.first().map_or(0.0, |x| count(x).0)
        } else {
            count(e).0
        };
        let rate = match infer_expr(program, e).ok().and_then(|t| t.dtype) {
            Some(Dtype::F16 | Dtype::Bf16) => HALF_FLOPS,
            _ => F32_FLOPS,
        };
        t = t.max(2.0 * elems * taps / rate);
    }
    *seconds += t;
}
