//! When two programs are the same: a canonical form for deduplication, a coarser skeleton, and a
//! test of equivalence by evaluation.
//!
//! - [`canonical`]: intermediates inlined, constants replaced by their values, the operands of
//!   `+ * maximum minimum` sorted, axes counted from zero, inputs and size symbols renamed by
//!   position (the order of inputs that gives the smallest text). Two programs with the same form
//!   compute the same function of the same inputs, whatever they are called and however their
//!   statements are split.
//! - [`skeleton`]: the canonical form without dtypes and without the values of constants and
//!   scalar parameters (`x * 0.5` and `x * 2.0`, `leaky_relu(x, 0.1)` and `leaky_relu(x)`): the
//!   generator refuses a program whose skeleton is a held-out task's, so no generated task is a
//!   held-out one at another precision or with other constants.
//! - [`equivalent`]: both programs run by the interpreter on the same inputs (the held-out
//!   task's own draws, rounded to bf16 so that every dtype holds them exactly), under every
//!   mapping of inputs that fits their shapes; equal outputs mean the same function, whatever the
//!   algebra (`x * sigmoid(x)` and `silu(x)`, `exp(log_softmax(x))` and `softmax(x)`).

use std::collections::BTreeMap;

use crate::ops::interp;
use crate::ops::round::round_bf16;
use crate::ops::{infer_expr, normalize_axis, op_name, BinOp, Dim, Expr, Op, Program, Sizes};
use crate::tasks::{Preset, Task};

/// Inputs beyond which the canonical form keeps the declared order instead of trying every one.
const MAX_PERMUTED_INPUTS: usize = 6;

/// The canonical form of `p` (see the module doc).
pub fn canonical(p: &Program) -> String {
    form(p, false)
}

/// The skeleton of `p`: its canonical form without dtypes and scalar values.
pub fn skeleton(p: &Program) -> String {
    form(p, true)
}

fn form(p: &Program, erase: bool) -> String {
    let n = p.inputs.len();
    let orders: Vec<Vec<usize>> = if n <= MAX_PERMUTED_INPUTS {
        permutations(n)
    } else {
        vec![(0..n).collect()]
    };
    orders
        .iter()
        .map(|order| render_with(p, order, erase))
        .min()
        .unwrap_or_default()
}

/// Every permutation of `0..n` (n! of them; callers keep n small).
fn permutations(n: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    for i in 0..n {
        let mut next = Vec::new();
        for p in &out {
            for pos in 0..=p.len() {
                let mut q = p.clone();
                q.insert(pos, i);
                next.push(q);
            }
        }
        out = next;
    }
    out
}

/// The form with the inputs numbered in `order` (`order[j]` is the declared index of `in{j}`).
fn render_with(p: &Program, order: &[usize], erase: bool) -> String {
    let mut inputs: BTreeMap<&str, String> = BTreeMap::new();
    let mut syms: BTreeMap<String, String> = BTreeMap::new();
    let mut decls = Vec::new();
    for (j, &i) in order.iter().enumerate() {
        let d = &p.inputs[i];
        inputs.insert(&d.name, format!("in{j}"));
        decls.push(format!(
            "in{j}:{}",
            ty(&d.ty.dtype, &d.ty.shape, &mut syms, erase)
        ));
    }
    let r = Renderer { p, inputs, erase };
    let mut outs = Vec::new();
    for d in &p.outputs {
        let body = r.var(&d.name);
        outs.push(format!(
            "{}={body}",
            ty(&d.ty.dtype, &d.ty.shape, &mut syms, erase)
        ));
    }
    format!("{}->{}", decls.join(";"), outs.join(";"))
}

fn ty(
    dtype: &crate::ops::Dtype,
    shape: &[Dim],
    syms: &mut BTreeMap<String, String>,
    erase: bool,
) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| match d {
            Dim::Lit(v) => v.to_string(),
            Dim::Sym(s) => {
                let next = format!("s{}", syms.len());
                syms.entry(s.clone()).or_insert(next).clone()
            }
            Dim::Expr(p) => p
                .rename(&mut |s| {
                    let next = format!("s{}", syms.len());
                    syms.entry(s.to_string()).or_insert(next).clone()
                })
                .to_string(),
        })
        .collect();
    let dt = if erase {
        if dtype.is_float() {
            "float"
        } else {
            "int"
        }
    } else {
        dtype.name()
    };
    format!("{dt}[{}]", dims.join(","))
}

struct Renderer<'p> {
    p: &'p Program,
    inputs: BTreeMap<&'p str, String>,
    erase: bool,
}

impl Renderer<'_> {
    fn num(&self, v: f64) -> String {
        if self.erase {
            "c".into()
        } else {
            format!("{v:?}")
        }
    }

    /// A name: an input's position, a constant's value, or the inlined statement assigning it.
    fn var(&self, name: &str) -> String {
        if let Some(i) = self.inputs.get(name) {
            return i.clone();
        }
        if let Some(v) = self.p.const_value(name) {
            return self.num(v);
        }
        match self.p.stmts.iter().find(|s| s.target == name) {
            Some(s) => self.expr(&s.expr),
            None => format!("?{name}"),
        }
    }

    fn rank(&self, e: &Expr) -> usize {
        infer_expr(self.p, e).map_or(0, |t| t.shape.len())
    }

    fn expr(&self, e: &Expr) -> String {
        match e {
            Expr::Num(v) => self.num(*v),
            Expr::Var(n) => self.var(n),
            Expr::Neg(a) => format!("neg({})", self.expr(a)),
            Expr::Binary(op, a, b) => {
                let (mut x, mut y) = (self.expr(a), self.expr(b));
                let name = op.name();
                if matches!(op, BinOp::Add | BinOp::Mul | BinOp::Max | BinOp::Min) && y < x {
                    std::mem::swap(&mut x, &mut y);
                }
                format!("{name}({x},{y})")
            }
            Expr::Call { op, args } => {
                let rank = args.first().map_or(0, |a| self.rank(a));
                let axis = |a: i64| normalize_axis(a, rank).map_or(a, |v| v as i64);
                let params = match *op {
                    Op::Unary(_) => String::new(),
                    Op::LeakyRelu { slope } => self.num(slope),
                    Op::Elu { alpha } => self.num(alpha),
                    Op::Clamp { lo, hi, .. } => format!("{},{}", self.num(lo), self.num(hi)),
                    Op::Reduce {
                        kind,
                        axis: a,
                        keepdim,
                    } => format!("{},{},{keepdim}", kind.name(), axis(a)),
                    Op::Softmax { axis: a }
                    | Op::LogSoftmax { axis: a }
                    | Op::Cumsum { axis: a }
                    | Op::Cumprod { axis: a }
                    | Op::Squeeze { axis: a }
                    | Op::Flip { axis: a }
                    | Op::Gather { axis: a } => axis(a).to_string(),
                    Op::Triangle { upper, diagonal } => format!("{upper},{diagonal}"),
                    Op::Reshape { ref shape } => {
                        let dims: Vec<String> = shape.iter().map(Dim::to_string).collect();
                        dims.join(",")
                    }
                    // An axis of the result, one rank more.
                    Op::Unsqueeze { axis: a } => normalize_axis(a, rank + 1)
                        .map_or(a, |v| v as i64)
                        .to_string(),
                    Op::L2Norm { axis: a, eps } => format!("{},{}", axis(a), self.num(eps)),
                    Op::LayerNorm { eps, weight, bias } => {
                        format!("{},{weight},{bias}", self.num(eps))
                    }
                    Op::RmsNorm { eps, weight } => format!("{},{weight}", self.num(eps)),
                    Op::Transpose { a, b } => {
                        let (a, b) = (axis(a), axis(b));
                        format!("{},{}", a.min(b), a.max(b))
                    }
                    Op::Conv {
                        ref stride,
                        ref padding,
                        ref dilation,
                        ref output_padding,
                        groups,
                        bias,
                        ..
                    } => format!(
                        "{stride:?},{padding:?},{dilation:?},{output_padding:?},{groups},{bias}"
                    ),
                    Op::ChannelNorm {
                        sets,
                        eps,
                        weight,
                        bias,
                    } => format!("{sets:?},{},{weight},{bias}", self.num(eps)),
                    Op::Pool {
                        ref kernel,
                        ref stride,
                        ref padding,
                        ref dilation,
                        count_include_pad,
                        ..
                    } => format!(
                        "{kernel:?},{stride:?},{padding:?},{dilation:?},{count_include_pad}"
                    ),
                };
                let name = match op {
                    Op::Unary(u) => u.name(),
                    // clamp and hardtanh are one operation.
                    Op::Clamp { .. } => "clamp",
                    other => op_name(other),
                };
                let args: Vec<String> = args.iter().map(|a| self.expr(a)).collect();
                format!("{name}[{params}]({})", args.join(","))
            }
        }
    }
}

/// True when `a` and `b` compute the same function (see the module doc): for some mapping of
/// `a`'s inputs onto `b`'s that fits their ranks and shapes, `a` run on `b`'s small-preset
/// inputs (two draws) gives `b`'s outputs to 1e-9 relative (1e-12 absolute).
pub fn equivalent(a: &Task, b: &Task) -> bool {
    let (pa, pb) = (&a.program, &b.program);
    if pa.inputs.len() != pb.inputs.len() || pa.outputs.len() != pb.outputs.len() {
        return false;
    }
    let rank_ok = pa
        .outputs
        .iter()
        .zip(&pb.outputs)
        .all(|(x, y)| x.ty.shape.len() == y.ty.shape.len());
    if !rank_ok || pa.inputs.len() > MAX_PERMUTED_INPUTS {
        return false;
    }
    let b_sizes = b.sizes(Preset::Small);
    let draws: Vec<Vec<Vec<f64>>> = [1u64, 2]
        .iter()
        .map(|&seed| {
            b.generate_inputs(Preset::Small, seed)
                .into_iter()
                .map(|v| v.into_iter().map(round_bf16).collect())
                .collect()
        })
        .collect();
    let wants: Vec<Vec<interp::Tensor>> = match draws
        .iter()
        .map(|inputs| interp::run(pb, b_sizes, inputs))
        .collect::<Result<_, _>>()
    {
        Ok(w) => w,
        Err(_) => return false,
    };
    // `order[j]`: which of b's inputs feeds a's input j.
    permutations(pa.inputs.len()).into_iter().any(|order| {
        let Some(sizes) = unify(a, b, b_sizes, &order) else {
            return false;
        };
        draws.iter().zip(&wants).all(|(inputs, want)| {
            let mapped: Vec<Vec<f64>> = order.iter().map(|&i| inputs[i].clone()).collect();
            match interp::run(pa, &sizes, &mapped) {
                Ok(got) => same_outputs(&got, want),
                Err(_) => false,
            }
        })
    })
}

/// Sizes of `a`'s symbols that give its input j the concrete shape of `b`'s input `order[j]`.
fn unify(a: &Task, b: &Task, b_sizes: &Sizes, order: &[usize]) -> Option<Sizes> {
    let mut sizes = Sizes::new();
    for (j, &i) in order.iter().enumerate() {
        let da = &a.program.inputs[j];
        let shape = b.program.inputs[i].ty.concrete_shape(b_sizes).ok()?;
        if da.ty.shape.len() != shape.len() {
            return None;
        }
        for (dim, &v) in da.ty.shape.iter().zip(&shape) {
            match dim {
                Dim::Lit(l) if *l != v => return None,
                Dim::Lit(_) => {}
                Dim::Sym(s) => {
                    if *sizes.entry(s.clone()).or_insert(v) != v {
                        return None;
                    }
                }
                // Computed from other dims: checked when the programs are evaluated.
                Dim::Expr(_) => {}
            }
        }
    }
    // Symbols only in outputs cannot be bound from the inputs.
    a.program
        .size_symbols()
        .iter()
        .all(|s| sizes.contains_key(s))
        .then_some(sizes)
}

fn same_outputs(got: &[interp::Tensor], want: &[interp::Tensor]) -> bool {
    got.len() == want.len()
        && got.iter().zip(want).all(|(g, w)| {
            g.shape == w.shape
                && g.data.iter().zip(&w.data).all(|(&x, &y)| {
                    (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-9 * y.abs() + 1e-12
                })
        })
}
