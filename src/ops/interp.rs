//! The trusted reference interpreter: runs a checked [`Program`] on the CPU in f64 for concrete
//! sizes and row-major input data. Inputs of a narrower dtype are first rounded to it (so the
//! reference sees exactly the values a GPU kernel sees); everything after that is computed in f64
//! and outputs are returned unrounded. The numerics live in `kernels.rs`.

use std::collections::BTreeMap;

use super::ast::{BinOp, Expr, Op, Program, Sizes};
use super::check::{infer_expr, normalize_axis};
use super::kernels::{self as k, Sums};
use super::round::round_to;

/// A dense row-major f64 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Extents, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values in row-major order.
    pub data: Vec<f64>,
}

impl Tensor {
    /// A rank-0 tensor.
    pub fn scalar(v: f64) -> Tensor {
        Tensor {
            shape: vec![],
            data: vec![v],
        }
    }
}

/// Why a program could not be run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InterpError {
    /// A size symbol of the program has no value.
    #[error("size `{0}` has no value")]
    MissingSize(String),
    /// A size symbol is zero.
    #[error("size `{0}` is zero")]
    ZeroSize(String),
    /// The number of input tensors differs from the program's inputs.
    #[error("expected {expected} input tensors, got {got}")]
    InputCount {
        /// Inputs declared.
        expected: usize,
        /// Tensors given.
        got: usize,
    },
    /// An input tensor has the wrong number of elements.
    #[error("input `{name}` needs {expected} values, got {got}")]
    InputLength {
        /// The input.
        name: String,
        /// Elements of its concrete shape.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// Evaluating a statement failed (a program that was not type-checked, or a bug).
    #[error("line {line}, statement `{target}`: {message}")]
    Eval {
        /// Line of the statement.
        line: usize,
        /// Its target.
        target: String,
        /// What failed.
        message: String,
    },
}

/// Runs `program` with `sizes` on `inputs` (one row-major vector per declared input, in order)
/// and returns the outputs in declaration order.
pub fn run(
    program: &Program,
    sizes: &Sizes,
    inputs: &[Vec<f64>],
) -> Result<Vec<Tensor>, InterpError> {
    run_with(program, sizes, inputs, None, Sums::Exact)
}

/// Like [`run`], but every operation's result is rounded to its dtype, as an eager framework
/// stores each op's output (computing inside the op at higher precision): what the op-by-op
/// baseline computes, up to the order of its float sums. The task generator compares it with
/// [`run`] to keep only programs whose rounding stays well inside their tolerance.
pub fn run_eager(
    program: &Program,
    sizes: &Sizes,
    inputs: &[Vec<f64>],
) -> Result<Vec<Tensor>, InterpError> {
    run_with(program, sizes, inputs, Some(program), Sums::Exact)
}

/// What a plain fused kernel computes: every long sum (matrix products, sum and mean reductions,
/// cumulative sums) added in index order in an f32 accumulator (one thread per output, a `float`
/// accumulator, fused multiply-adds), the rest at full precision, each output rounded once to its
/// dtype. A task whose tolerance this does not meet would judge such a correct kernel wrong
/// ([`crate::taskgen::plain_sums_fit`]).
pub fn run_plain_f32(
    program: &Program,
    sizes: &Sizes,
    inputs: &[Vec<f64>],
) -> Result<Vec<Tensor>, InterpError> {
    let mut outs = run_with(program, sizes, inputs, None, Sums::F32InOrder)?;
    for (t, d) in outs.iter_mut().zip(&program.outputs) {
        let dtype = d.ty.dtype;
        t.data.iter_mut().for_each(|v| *v = round_to(dtype, *v));
    }
    Ok(outs)
}

fn run_with(
    program: &Program,
    sizes: &Sizes,
    inputs: &[Vec<f64>],
    eager: Option<&Program>,
    sums: Sums,
) -> Result<Vec<Tensor>, InterpError> {
    let mode = Mode { eager, sums };
    for sym in program.size_symbols() {
        match sizes.get(&sym) {
            None => return Err(InterpError::MissingSize(sym)),
            Some(0) => return Err(InterpError::ZeroSize(sym)),
            Some(_) => {}
        }
    }
    if inputs.len() != program.inputs.len() {
        return Err(InterpError::InputCount {
            expected: program.inputs.len(),
            got: inputs.len(),
        });
    }
    let mut env: BTreeMap<String, Tensor> = BTreeMap::new();
    for c in &program.consts {
        env.insert(c.name.clone(), Tensor::scalar(c.value));
    }
    for (d, data) in program.inputs.iter().zip(inputs) {
        let shape =
            d.ty.concrete_shape(sizes)
                .map_err(InterpError::MissingSize)?;
        let expected: usize = shape.iter().product();
        if data.len() != expected {
            let name = d.name.clone();
            return Err(InterpError::InputLength {
                name,
                expected,
                got: data.len(),
            });
        }
        let data = data.iter().map(|&v| round_to(d.ty.dtype, v)).collect();
        env.insert(d.name.clone(), Tensor { shape, data });
    }
    for s in &program.stmts {
        let fail = |message: String| InterpError::Eval {
            line: s.line,
            target: s.target.clone(),
            message,
        };
        let value = eval(&s.expr, &env, mode, sizes).map_err(fail)?;
        if let Some(ty) = program.types.get(&s.target) {
            let want = ty.concrete_shape(sizes).map_err(InterpError::MissingSize)?;
            if want != value.shape {
                let msg = format!("computed shape {:?}, expected {want:?}", value.shape);
                return Err(fail(msg));
            }
        }
        env.insert(s.target.clone(), value);
    }
    let mut outs = Vec::with_capacity(program.outputs.len());
    for d in &program.outputs {
        match env.remove(&d.name) {
            Some(t) => outs.push(t),
            None => {
                let message = "output never assigned".to_string();
                return Err(InterpError::Eval {
                    line: d.line,
                    target: d.name.clone(),
                    message,
                });
            }
        }
    }
    Ok(outs)
}

fn axis(x: &Tensor, a: i64) -> Result<usize, String> {
    normalize_axis(a, x.shape.len())
        .ok_or_else(|| format!("axis {a} out of range for shape {:?}", x.shape))
}

/// How [`eval`] computes: with `eager` (the program, for the types), each operation's result is
/// rounded to its dtype; `sums` is how long sums are added.
#[derive(Clone, Copy)]
struct Mode<'a> {
    eager: Option<&'a Program>,
    sums: Sums,
}

/// Evaluates `e` as `mode` says.
fn eval(
    e: &Expr,
    env: &BTreeMap<String, Tensor>,
    mode: Mode<'_>,
    sizes: &Sizes,
) -> Result<Tensor, String> {
    let mut t = eval_node(e, env, mode, sizes)?;
    if let (Some(p), Expr::Neg(_) | Expr::Binary(..) | Expr::Call { .. }) = (mode.eager, e) {
        if let Some(d) = infer_expr(p, e)?.dtype.filter(|d| d.is_float()) {
            t.data.iter_mut().for_each(|v| *v = round_to(d, *v));
        }
    }
    Ok(t)
}

fn eval_node(
    e: &Expr,
    env: &BTreeMap<String, Tensor>,
    mode: Mode<'_>,
    sizes: &Sizes,
) -> Result<Tensor, String> {
    Ok(match e {
        Expr::Num(v) => Tensor::scalar(*v),
        Expr::Var(n) => env
            .get(n)
            .cloned()
            .ok_or_else(|| format!("unknown name `{n}`"))?,
        Expr::Neg(a) => {
            let mut t = eval(a, env, mode, sizes)?;
            t.data.iter_mut().for_each(|v| *v = -*v);
            t
        }
        Expr::Binary(BinOp::MatMul, a, b) => k::matmul(
            &eval(a, env, mode, sizes)?,
            &eval(b, env, mode, sizes)?,
            mode.sums,
        )?,
        Expr::Binary(op, a, b) => k::broadcast(
            *op,
            &eval(a, env, mode, sizes)?,
            &eval(b, env, mode, sizes)?,
        )?,
        Expr::Call { op, args } => {
            let mut vals = Vec::with_capacity(args.len());
            for a in args {
                vals.push(eval(a, env, mode, sizes)?);
            }
            let mut it = vals.into_iter();
            let mut x = it.next().ok_or("call without operands")?;
            let map =
                |x: &mut Tensor, f: &dyn Fn(f64) -> f64| x.data.iter_mut().for_each(|v| *v = f(*v));
            match *op {
                Op::Unary(u) => map(&mut x, &|v| k::unary(u, v)),
                Op::LeakyRelu { slope } => map(&mut x, &|v| if v >= 0.0 { v } else { slope * v }),
                Op::Elu { alpha } => map(&mut x, &|v| if v > 0.0 { v } else { alpha * v.exp_m1() }),
                Op::Clamp { lo, hi, .. } => map(&mut x, &|v| v.max(lo).min(hi)),
                Op::Reduce {
                    kind,
                    axis: a,
                    keepdim,
                } => {
                    if x.shape.is_empty() {
                        return Err("cannot reduce a scalar".into());
                    }
                    x = k::reduce(&x, kind, axis(&x, a)?, keepdim, mode.sums)
                }
                Op::Softmax { axis: a } => x = k::map_lanes(&x, axis(&x, a)?, k::softmax_lane),
                Op::LogSoftmax { axis: a } => {
                    x = k::map_lanes(&x, axis(&x, a)?, k::log_softmax_lane)
                }
                Op::Cumsum { axis: a } => {
                    x = k::map_lanes(&x, axis(&x, a)?, |l, o| {
                        k::scan_lane(l, o, false, mode.sums)
                    })
                }
                Op::Cumprod { axis: a } => {
                    x = k::map_lanes(&x, axis(&x, a)?, |l, o| k::scan_lane(l, o, true, mode.sums))
                }
                Op::L2Norm { axis: a, eps } => {
                    x = k::map_lanes(&x, axis(&x, a)?, |l, o| k::l2norm_lane(l, o, eps))
                }
                Op::LayerNorm { eps, weight, bias } => {
                    let w = if weight { it.next() } else { None };
                    let b = if bias { it.next() } else { None };
                    x = norm(&x, eps, false, w.as_ref(), b.as_ref())?
                }
                Op::RmsNorm { eps, weight } => {
                    let w = if weight { it.next() } else { None };
                    x = norm(&x, eps, true, w.as_ref(), None)?
                }
                Op::Transpose { a, b } => x = k::transpose(&x, axis(&x, a)?, axis(&x, b)?),
                // Reshapes: the elements in the same order.
                Op::Unsqueeze { axis: a } => {
                    let at = normalize_axis(a, x.shape.len() + 1).ok_or_else(|| {
                        format!("axis {a} out of range for rank {}", x.shape.len())
                    })?;
                    x.shape.insert(at, 1);
                }
                Op::Triangle { upper, diagonal } => {
                    let r = x.shape.len();
                    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
                    for (k, v) in x.data.iter_mut().enumerate() {
                        let off = (k % cols) as i64 - ((k / cols) % rows) as i64;
                        if (upper && off < diagonal) || (!upper && off > diagonal) {
                            *v = 0.0;
                        }
                    }
                }
                Op::Reshape { ref shape } => {
                    let shape = super::ast::concrete(shape, sizes)
                        .map_err(|d| format!("reshape to a dim {d} without a value"))?;
                    if shape.iter().product::<usize>() != x.data.len() {
                        return Err(format!("reshape of {} elements to {shape:?}", x.data.len()));
                    }
                    x.shape = shape;
                }
                Op::Gather { axis: a } => {
                    let at = axis(&x, a)?;
                    let index = it.next().ok_or("gather without an index")?;
                    let inner: usize = index.shape[at + 1..].iter().product();
                    let (ka, kx) = (index.shape[at], x.shape[at]);
                    let mut data = Vec::with_capacity(index.data.len());
                    for (i, &v) in index.data.iter().enumerate() {
                        if !(v >= 0.0 && v < kx as f64) {
                            return Err(format!(
                                "gather index {v} at element {i} is outside 0 .. {kx}"
                            ));
                        }
                        let (outer, j) = (i / (ka * inner), i % inner);
                        data.push(x.data[(outer * kx + v as usize) * inner + j]);
                    }
                    x = Tensor {
                        shape: index.shape,
                        data,
                    };
                }
                Op::Flip { axis: a } => {
                    let at = axis(&x, a)?;
                    let inner: usize = x.shape[at + 1..].iter().product();
                    let outer = x.shape[at] * inner;
                    if outer > 0 {
                        for block in x.data.chunks_mut(outer) {
                            let rows: Vec<f64> = block.to_vec();
                            for (k, v) in block.iter_mut().enumerate() {
                                let (a, j) = (k / inner, k % inner);
                                *v = rows[(x.shape[at] - 1 - a) * inner + j];
                            }
                        }
                    }
                }
                Op::Squeeze { axis: a } => {
                    let at = axis(&x, a)?;
                    if x.shape[at] != 1 {
                        return Err(format!("squeeze of axis {a} of extent {}", x.shape[at]));
                    }
                    x.shape.remove(at);
                }
                Op::Conv {
                    transposed,
                    ref output_padding,
                    ref stride,
                    ref padding,
                    ref dilation,
                    groups,
                    bias,
                    ..
                } => {
                    let w = it.next().ok_or("conv without a weight")?;
                    let b = if bias { it.next() } else { None };
                    x = if transposed {
                        k::conv_transpose(
                            &x,
                            &w,
                            b.as_ref(),
                            stride,
                            padding,
                            output_padding,
                            dilation,
                            groups,
                        )?
                    } else {
                        k::conv(&x, &w, b.as_ref(), stride, padding, dilation, groups)?
                    }
                }
                Op::ChannelNorm {
                    sets,
                    eps,
                    weight,
                    bias,
                } => {
                    let w = if weight { it.next() } else { None };
                    let b = if bias { it.next() } else { None };
                    let groups = sets.groups(x.shape.get(1).copied().unwrap_or(1));
                    x = k::channel_norm(&x, groups, eps, w.as_ref(), b.as_ref())?
                }
                Op::Pool {
                    max,
                    ref kernel,
                    ref stride,
                    ref padding,
                    ref dilation,
                    count_include_pad,
                    ..
                } => {
                    x = k::pool(
                        &x,
                        max,
                        kernel,
                        stride,
                        padding,
                        dilation,
                        count_include_pad,
                    )?
                }
            }
            x
        }
    })
}

fn norm(
    x: &Tensor,
    eps: f64,
    rms: bool,
    w: Option<&Tensor>,
    b: Option<&Tensor>,
) -> Result<Tensor, String> {
    let Some(&n) = x.shape.last() else {
        return Err("cannot normalise a scalar".into());
    };
    for t in w.iter().chain(b.iter()) {
        if t.shape != [n] {
            return Err(format!(
                "weight/bias of shape {:?} does not match {n}",
                t.shape
            ));
        }
    }
    Ok(k::norm_last(x, eps, rms, w, b))
}
