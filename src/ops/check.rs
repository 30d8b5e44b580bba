//! Type and shape checker of the op language. Shapes stay symbolic: two dims agree when they are
//! the same symbol or the same literal, and only a literal 1 broadcasts. The checker also enforces
//! the program's bookkeeping (names defined once, inputs and intermediates used, outputs assigned
//! once with their declared type) and records the type of every tensor in [`Program::types`].

use std::collections::{BTreeMap, BTreeSet};

use super::ast::{
    collect_vars, dims_product, shape_tuple, BinOp, Dim, Dtype, Expr, NormSets, Op, Poly, Program,
    ReduceKind, TensorType,
};
use super::CheckError;

/// The type of an expression: a tensor type, or a Python-like scalar (`dtype == None`, rank 0)
/// that takes the dtype of the tensor it meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExprType {
    /// Element type; `None` for a scalar literal or constant.
    pub dtype: Option<Dtype>,
    /// Symbolic shape.
    pub shape: Vec<Dim>,
}

impl ExprType {
    fn of(t: &TensorType) -> Self {
        ExprType {
            dtype: Some(t.dtype),
            shape: t.shape.clone(),
        }
    }

    fn describe(&self) -> String {
        match self.dtype {
            Some(d) => TensorType {
                dtype: d,
                shape: self.shape.clone(),
            }
            .to_string(),
            None => "a scalar".to_string(),
        }
    }
}

/// The name a call is written with, for messages.
pub fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Unary(u) => u.name(),
        Op::LeakyRelu { .. } => "leaky_relu",
        Op::Elu { .. } => "elu",
        Op::Clamp { hardtanh: true, .. } => "hardtanh",
        Op::Clamp { .. } => "clamp",
        Op::Reduce { kind, .. } => kind.name(),
        Op::Softmax { .. } => "softmax",
        Op::LogSoftmax { .. } => "log_softmax",
        Op::Cumsum { .. } => "cumsum",
        Op::Cumprod { .. } => "cumprod",
        Op::LayerNorm { .. } => "layer_norm",
        Op::RmsNorm { .. } => "rms_norm",
        Op::L2Norm { .. } => "l2norm",
        Op::Transpose { .. } => "transpose",
        Op::Unsqueeze { .. } => "unsqueeze",
        Op::Squeeze { .. } => "squeeze",
        Op::Flip { .. } => "flip",
        Op::Reshape { .. } => "reshape",
        Op::Gather { .. } => "gather",
        Op::Triangle { upper: true, .. } => "triu",
        Op::Triangle { .. } => "tril",
        Op::ChannelNorm { sets, .. } => match sets {
            NormSets::Batch => "batch_norm",
            NormSets::Groups(_) => "group_norm",
            NormSets::Instance => "instance_norm",
        },
        Op::Conv {
            transposed: true,
            dims,
            ..
        } => ["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"][dims.clamp(&1, &3) - 1],
        Op::Conv { dims, .. } => ["conv1d", "conv2d", "conv3d"][dims.clamp(&1, &3) - 1],
        Op::Pool {
            max: true, dims, ..
        } => ["max_pool1d", "max_pool2d", "max_pool3d"][dims.clamp(&1, &3) - 1],
        Op::Pool { dims, .. } => ["avg_pool1d", "avg_pool2d", "avg_pool3d"][dims.clamp(&1, &3) - 1],
    }
}

/// The output length of a window sliding over `len` (PyTorch's floor-mode formula):
/// `(len + 2*padding - dilation*(kernel - 1) - 1) // stride + 1`.
pub fn window_out(len: &Dim, kernel: &Dim, stride: usize, padding: usize, dilation: usize) -> Dim {
    let span = kernel.to_poly().sub(&Poly::lit(1)).scale(dilation as i64);
    let inner = len.to_poly().add(&Poly::lit(2 * padding as i64)).sub(&span);
    Dim::from_poly(
        inner
            .sub(&Poly::lit(1))
            .floor_div(stride as i64)
            .add(&Poly::lit(1)),
    )
}

/// The output length of a transposed convolution over `len`:
/// `(len - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1`.
pub fn transposed_out(
    len: &Dim,
    kernel: &Dim,
    stride: usize,
    padding: usize,
    dilation: usize,
    output_padding: usize,
) -> Dim {
    let span = kernel.to_poly().sub(&Poly::lit(1)).scale(dilation as i64);
    let grown = len.to_poly().sub(&Poly::lit(1)).scale(stride as i64);
    let extra = output_padding as i64 + 1 - 2 * padding as i64;
    Dim::from_poly(grown.add(&span).add(&Poly::lit(extra)))
}

/// The shape of a convolution or pooling of `x` (`[N, C, *spatial]`), with `w` the weight of a
/// convolution; errors name the rule broken.
fn windowed_shape(
    op: &Op,
    name: &str,
    x: &ExprType,
    rest: &[ExprType],
) -> Result<ExprType, String> {
    let (dims, stride, padding, dilation) = match op {
        Op::Conv {
            dims,
            stride,
            padding,
            dilation,
            ..
        }
        | Op::Pool {
            dims,
            stride,
            padding,
            dilation,
            ..
        } => (*dims, stride, padding, dilation),
        _ => unreachable!("not a windowed op"),
    };
    if x.shape.len() != dims + 2 {
        return Err(format!(
            "`{name}` needs an input of rank {} ([N, C, {}]), got {}",
            dims + 2,
            ["L", "H, W", "D, H, W"][dims - 1],
            x.describe()
        ));
    }
    let mut shape = x.shape[..2].to_vec();
    let kernel: Vec<Dim> = match op {
        Op::Conv {
            groups,
            bias,
            transposed,
            ..
        } => {
            let w = &rest[0];
            float_tensor(w, name)?;
            let layout = if *transposed {
                "[C, F/groups, kernel...]"
            } else {
                "[F, C/groups, kernel...]"
            };
            if w.shape.len() != dims + 2 {
                return Err(format!(
                    "`{name}` needs a weight of rank {} ({layout}), got {}",
                    dims + 2,
                    w.describe()
                ));
            }
            let g = *groups as i64;
            // Input and output channels; a symbolic count's divisibility by groups is checked
            // where sizes are bound (the interpreter).
            let outputs = if *transposed {
                if w.shape[0] != x.shape[1] {
                    return Err(format!(
                        "`{name}`: the weight's first dim {} must be the input's channels {}",
                        w.shape[0], x.shape[1]
                    ));
                }
                Dim::from_poly(w.shape[1].to_poly().scale(g))
            } else {
                if w.shape[1].to_poly().scale(g) != x.shape[1].to_poly() {
                    return Err(format!(
                        "`{name}`: the weight's second dim times groups ({} x {groups}) must be the \
                         input's channels {} (with groups, write the channels as a multiple: \
                         [N, {groups}*G, ...] and [F, G, ...])",
                        w.shape[1], x.shape[1]
                    ));
                }
                w.shape[0].clone()
            };
            let divides = |d: &Dim| d.to_poly().constant().is_none_or(|c| c % g == 0);
            let grouped = if *transposed {
                &x.shape[1]
            } else {
                &w.shape[0]
            };
            if !divides(grouped) {
                return Err(format!(
                    "`{name}`: {grouped} channels are not divisible by groups {groups}"
                ));
            }
            if *bias {
                let b = &rest[1];
                if b.shape != [outputs.clone()] || b.dtype.is_none() {
                    return Err(format!(
                        "`{name}` bias must have shape [{outputs}], got {}",
                        b.describe()
                    ));
                }
            }
            shape[1] = outputs;
            w.shape[2..].to_vec()
        }
        Op::Pool { kernel, .. } => kernel.iter().map(|&k| Dim::Lit(k)).collect(),
        _ => unreachable!(),
    };
    for i in 0..dims {
        let out = match op {
            Op::Conv {
                transposed: true,
                output_padding,
                ..
            } => transposed_out(
                &x.shape[2 + i],
                &kernel[i],
                stride[i],
                padding[i],
                dilation[i],
                output_padding[i],
            ),
            _ => window_out(
                &x.shape[2 + i],
                &kernel[i],
                stride[i],
                padding[i],
                dilation[i],
            ),
        };
        if out.to_poly().constant().is_some_and(|c| c <= 0) {
            return Err(format!(
                "`{name}`: the window ({}, dilation {}) does not fit spatial axis {i} of length {} \
                 padded by {}",
                kernel[i], dilation[i], x.shape[2 + i], padding[i]
            ));
        }
        shape.push(out);
    }
    let mut dtype = x.dtype;
    for t in rest {
        dtype = join_dtype(dtype, t.dtype, &format!("`{name}`"))?;
    }
    Ok(ExprType { dtype, shape })
}

/// Dims that must be multiples of a group count wherever sizes are bound, with the line that asks
/// for it: the channels of a group norm and of a grouped convolution (input channels of any
/// convolution, output channels of a plain one). Literal dims are checked statically; the task
/// loader checks these at every preset.
pub fn group_constraints(program: &Program) -> Vec<(usize, Dim, usize)> {
    fn walk(program: &Program, line: usize, e: &Expr, out: &mut Vec<(usize, Dim, usize)>) {
        match e {
            Expr::Num(_) | Expr::Var(_) => {}
            Expr::Neg(a) => walk(program, line, a, out),
            Expr::Binary(_, a, b) => {
                walk(program, line, a, out);
                walk(program, line, b, out);
            }
            Expr::Call { op, args } => {
                args.iter().for_each(|a| walk(program, line, a, out));
                let shape = |i: usize| {
                    args.get(i)
                        .and_then(|a| infer_expr(program, a).ok())
                        .map(|t| t.shape)
                        .unwrap_or_default()
                };
                match op {
                    Op::ChannelNorm {
                        sets: NormSets::Groups(groups),
                        ..
                    } if *groups > 1 => {
                        if let Some(c) = shape(0).get(1) {
                            out.push((line, c.clone(), *groups));
                        }
                    }
                    Op::Conv {
                        groups, transposed, ..
                    } if *groups > 1 => {
                        if let Some(c) = shape(0).get(1) {
                            out.push((line, c.clone(), *groups));
                        }
                        if !transposed {
                            if let Some(f) = shape(1).first() {
                                out.push((line, f.clone(), *groups));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let mut out = Vec::new();
    for s in &program.stmts {
        walk(program, s.line, &s.expr, &mut out);
    }
    out
}

/// Normalises a possibly negative axis against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Infers the type of `expr` inside a checked `program` (names resolve through
/// [`Program::types`] and the program's constants).
pub fn infer_expr(program: &Program, expr: &Expr) -> Result<ExprType, String> {
    let lookup = |n: &str| -> Result<ExprType, String> {
        if let Some(t) = program.types.get(n) {
            Ok(ExprType::of(t))
        } else if program.const_value(n).is_some() {
            Ok(ExprType {
                dtype: None,
                shape: vec![],
            })
        } else {
            Err(format!("unknown name `{n}`"))
        }
    };
    infer(expr, &lookup, false)
}

/// The shape of `expr` over names that need not be a program's: `shape_of` gives each tensor's
/// shape (every tensor taken as f32) and `None` for a name that is a scalar constant. For code
/// that reads buffers of its own beside a program's tensors (the naive kernel writer's scratch).
pub fn expr_shape(
    expr: &Expr,
    shape_of: &dyn Fn(&str) -> Option<Vec<Dim>>,
) -> Result<Vec<Dim>, String> {
    let lookup = |n: &str| -> Result<ExprType, String> {
        Ok(match shape_of(n) {
            Some(shape) => ExprType {
                dtype: Some(Dtype::F32),
                shape,
            },
            None => ExprType {
                dtype: None,
                shape: vec![],
            },
        })
    };
    infer(expr, &lookup, true).map(|t| t.shape)
}

/// The dtype of an operation on operands of dtypes `a` and `b` (None: a scalar): the same, or
/// f32 for two float types; i64 operands are an error naming `what`.
pub(super) fn join_dtype(
    a: Option<Dtype>,
    b: Option<Dtype>,
    what: &str,
) -> Result<Option<Dtype>, String> {
    Ok(match (a, b) {
        (Some(Dtype::I64), _) | (_, Some(Dtype::I64)) => {
            return Err(format!("{what} needs floating-point operands, got i64"))
        }
        (None, x) | (x, None) => x,
        (Some(x), Some(y)) if x == y => Some(x),
        _ => Some(Dtype::F32),
    })
}

fn broadcast(a: &ExprType, b: &ExprType) -> Result<Vec<Dim>, String> {
    let n = a.shape.len().max(b.shape.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = (i + a.shape.len()).checked_sub(n).map(|j| &a.shape[j]);
        let db = (i + b.shape.len()).checked_sub(n).map(|j| &b.shape[j]);
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Lit(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Lit(1))) => x.clone(),
            _ => {
                let msg = format!("cannot broadcast {} with {}", a.describe(), b.describe());
                return Err(msg);
            }
        };
        out.push(d);
    }
    Ok(out)
}

fn float_tensor(t: &ExprType, what: &str) -> Result<(), String> {
    match t.dtype {
        Some(Dtype::I64) => Err(format!(
            "`{what}` needs a floating-point operand, got {}",
            t.describe()
        )),
        None => Err(format!("`{what}` needs a tensor operand, got a scalar")),
        Some(_) => Ok(()),
    }
}

/// The type of `e`. `shapes_only`: every name's dtype is a stand-in (f32), so rules on dtypes
/// that the shapes do not need (a gather's i64 index) are not checked.
fn infer(
    e: &Expr,
    lookup: &dyn Fn(&str) -> Result<ExprType, String>,
    shapes_only: bool,
) -> Result<ExprType, String> {
    match e {
        Expr::Num(_) => Ok(ExprType {
            dtype: None,
            shape: vec![],
        }),
        Expr::Var(n) => lookup(n),
        Expr::Neg(inner) => {
            let t = infer(inner, lookup, shapes_only)?;
            if t.dtype == Some(Dtype::I64) {
                return Err(format!(
                    "unary minus needs a floating-point operand, got {}",
                    t.describe()
                ));
            }
            Ok(t)
        }
        Expr::Binary(BinOp::MatMul, a, b) => {
            let (ta, tb) = (
                infer(a, lookup, shapes_only)?,
                infer(b, lookup, shapes_only)?,
            );
            float_tensor(&ta, "@")?;
            float_tensor(&tb, "@")?;
            let dtype = join_dtype(ta.dtype, tb.dtype, "@")?;
            let (sa, sb) = (&ta.shape, &tb.shape);
            let mismatch = || {
                format!(
                    "cannot multiply {} by {} with @",
                    ta.describe(),
                    tb.describe()
                )
            };
            let shape = matmul_shape(sa, sb).ok_or_else(mismatch)?;
            Ok(ExprType { dtype, shape })
        }
        Expr::Binary(op, a, b) => {
            let (ta, tb) = (
                infer(a, lookup, shapes_only)?,
                infer(b, lookup, shapes_only)?,
            );
            let what = match op {
                BinOp::Add => "+",
                BinOp::Sub => "-",
                BinOp::Mul => "*",
                BinOp::Div => "/",
                BinOp::Max => "maximum",
                BinOp::Min => "minimum",
                BinOp::Pow => "pow",
                BinOp::MatMul => "@",
            };
            let dtype = join_dtype(ta.dtype, tb.dtype, &format!("`{what}`"))?;
            Ok(ExprType {
                dtype,
                shape: broadcast(&ta, &tb)?,
            })
        }
        Expr::Call { op, args } => {
            let name = op_name(op);
            let mut types = Vec::with_capacity(args.len());
            for a in args {
                types.push(infer(a, lookup, shapes_only)?);
            }
            let Some(x) = types.first().cloned() else {
                return Err(format!("`{name}` has no operand"));
            };
            if let Op::Unary(_) | Op::LeakyRelu { .. } | Op::Elu { .. } | Op::Clamp { .. } = op {
                if x.dtype == Some(Dtype::I64) {
                    return Err(format!(
                        "`{name}` needs a floating-point operand, got {}",
                        x.describe()
                    ));
                }
                return Ok(x);
            }
            // Views keep any element type (an i64 index unsqueezed for a gather).
            let view = matches!(
                op,
                Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Reshape { .. }
            );
            if !view {
                float_tensor(&x, name)?;
            }
            let axis_of = |axis: i64| {
                normalize_axis(axis, x.shape.len()).ok_or_else(|| {
                    format!(
                        "axis {axis} of `{name}` is out of range for {}",
                        x.describe()
                    )
                })
            };
            match op {
                Op::Reduce {
                    kind,
                    axis,
                    keepdim,
                } => {
                    let ax = axis_of(*axis)?;
                    let mut shape = x.shape.clone();
                    if *keepdim {
                        shape[ax] = Dim::Lit(1);
                    } else {
                        shape.remove(ax);
                    }
                    let dtype = match kind {
                        ReduceKind::Argmax | ReduceKind::Argmin => Some(Dtype::I64),
                        _ => x.dtype,
                    };
                    Ok(ExprType { dtype, shape })
                }
                Op::Softmax { axis }
                | Op::LogSoftmax { axis }
                | Op::Cumsum { axis }
                | Op::Cumprod { axis }
                | Op::Flip { axis }
                | Op::L2Norm { axis, .. } => {
                    axis_of(*axis)?;
                    Ok(x)
                }
                Op::Conv { .. } | Op::Pool { .. } => windowed_shape(op, name, &x, &types[1..]),
                Op::ChannelNorm { sets, .. } => {
                    let min = if *sets == NormSets::Instance { 3 } else { 2 };
                    if x.shape.len() < min {
                        return Err(format!(
                            "`{name}` needs an input of rank {min} or more ([N, C, ...]), got {}",
                            x.describe()
                        ));
                    }
                    let c = &x.shape[1];
                    if let NormSets::Groups(groups) = sets {
                        let bad = *groups == 0
                            || c.to_poly()
                                .constant()
                                .is_some_and(|c| c % *groups as i64 != 0);
                        if bad {
                            return Err(format!(
                                "`group_norm`: {c} channels are not divisible into {groups} groups"
                            ));
                        }
                    }
                    let mut dtype = x.dtype;
                    for t in &types[1..] {
                        if t.shape != [c.clone()] || t.dtype.is_none() {
                            return Err(format!(
                                "`{name}` weight/bias must have shape [{c}], got {}",
                                t.describe()
                            ));
                        }
                        dtype = join_dtype(dtype, t.dtype, &format!("`{name}`"))?;
                    }
                    Ok(ExprType {
                        dtype,
                        shape: x.shape,
                    })
                }
                Op::Transpose { a, b } => {
                    let (a, b) = (axis_of(*a)?, axis_of(*b)?);
                    let mut shape = x.shape.clone();
                    shape.swap(a, b);
                    Ok(ExprType {
                        dtype: x.dtype,
                        shape,
                    })
                }
                Op::Gather { axis } => {
                    let at = axis_of(*axis)?;
                    let index = &types[1];
                    let ok = (shapes_only || index.dtype == Some(Dtype::I64))
                        && index.shape.len() == x.shape.len()
                        && (0..x.shape.len()).all(|d| d == at || index.shape[d] == x.shape[d]);
                    if !ok {
                        return Err(format!(
                            "`gather` along axis {axis} of {} needs an i64 index of the same rank \
                             and the same dims but that one, got {}",
                            x.describe(),
                            index.describe()
                        ));
                    }
                    Ok(ExprType {
                        dtype: x.dtype,
                        shape: index.shape.clone(),
                    })
                }
                Op::Reshape { shape } => {
                    // As many elements, in every preset: the products agree as polynomials.
                    if dims_product(&x.shape) != dims_product(shape) {
                        return Err(format!(
                            "`reshape` of {} to {}: not the same number of elements at every size",
                            x.describe(),
                            shape_tuple(shape)
                        ));
                    }
                    Ok(ExprType {
                        dtype: x.dtype,
                        shape: shape.clone(),
                    })
                }
                Op::Unsqueeze { axis } => {
                    // An axis of the result, which has one more.
                    let at = normalize_axis(*axis, x.shape.len() + 1).ok_or_else(|| {
                        format!(
                            "axis {axis} of `unsqueeze` is out of range for {}",
                            x.describe()
                        )
                    })?;
                    let mut shape = x.shape.clone();
                    shape.insert(at, Dim::Lit(1));
                    Ok(ExprType {
                        dtype: x.dtype,
                        shape,
                    })
                }
                Op::Triangle { .. } => {
                    if x.shape.len() < 2 {
                        return Err(format!(
                            "`{name}` needs a matrix (rank >= 2), got {}",
                            x.describe()
                        ));
                    }
                    Ok(x)
                }
                Op::Squeeze { axis } => {
                    let at = axis_of(*axis)?;
                    let mut shape = x.shape.clone();
                    if shape[at] != Dim::Lit(1) {
                        return Err(format!(
                            "`squeeze` of axis {axis} of {}: its extent is {}, not 1",
                            x.describe(),
                            shape[at]
                        ));
                    }
                    shape.remove(at);
                    Ok(ExprType {
                        dtype: x.dtype,
                        shape,
                    })
                }
                _ => {
                    // layer_norm / rms_norm: weight and bias have the shape of the last axis.
                    let last = x.shape.last().cloned().ok_or_else(|| {
                        format!(
                            "`{name}` needs an operand of rank >= 1, got {}",
                            x.describe()
                        )
                    })?;
                    let mut dtype = x.dtype;
                    for t in &types[1..] {
                        if t.shape != [last.clone()] || t.dtype.is_none() {
                            return Err(format!(
                                "`{name}` weight/bias must have shape [{last}], got {}",
                                t.describe()
                            ));
                        }
                        dtype = join_dtype(dtype, t.dtype, &format!("`{name}`"))?;
                    }
                    Ok(ExprType {
                        dtype,
                        shape: x.shape,
                    })
                }
            }
        }
    }
}

fn at(line: usize, target: Option<&str>, message: impl Into<String>) -> CheckError {
    CheckError {
        line,
        target: target.map(str::to_string),
        message: message.into(),
    }
}

/// Checks `program` and fills in [`Program::types`].
pub fn check(program: &mut Program) -> Result<(), CheckError> {
    let mut declared: BTreeMap<String, usize> = BTreeMap::new();
    let decls = program.inputs.iter().chain(&program.outputs);
    let names = decls
        .map(|d| (&d.name, d.line))
        .chain(program.consts.iter().map(|c| (&c.name, c.line)));
    for (name, line) in names {
        if let Some(prev) = declared.insert(name.clone(), line) {
            return Err(at(
                line,
                None,
                format!("`{name}` is already declared on line {prev}"),
            ));
        }
    }
    let symbols = program.size_symbols();
    let decls = program.inputs.iter().chain(&program.outputs);
    let names = decls
        .map(|d| (&d.name, d.line))
        .chain(program.consts.iter().map(|c| (&c.name, c.line)));
    let names = names.chain(program.stmts.iter().map(|s| (&s.target, s.line)));
    for (name, line) in names {
        if symbols.contains(name) {
            return Err(at(
                line,
                None,
                format!("`{name}` names both a size and a tensor or constant"),
            ));
        }
    }
    if program.outputs.is_empty() {
        return Err(at(0, None, "the program declares no output"));
    }
    let mut env: BTreeMap<String, ExprType> = BTreeMap::new();
    for c in &program.consts {
        env.insert(
            c.name.clone(),
            ExprType {
                dtype: None,
                shape: vec![],
            },
        );
    }
    for d in &program.inputs {
        env.insert(d.name.clone(), ExprType::of(&d.ty));
    }
    let outputs: BTreeMap<&str, &TensorType> = program
        .outputs
        .iter()
        .map(|d| (d.name.as_str(), &d.ty))
        .collect();
    let mut types: BTreeMap<String, TensorType> = program
        .inputs
        .iter()
        .map(|d| (d.name.clone(), d.ty.clone()))
        .collect();
    let mut used = BTreeSet::new();
    for s in &program.stmts {
        let err = |m: String| at(s.line, Some(&s.target), m);
        let lookup = |n: &str| -> Result<ExprType, String> {
            if let Some(t) = env.get(n) {
                Ok(t.clone())
            } else if outputs.contains_key(n) {
                Err(format!("output `{n}` is used before it is assigned"))
            } else {
                Err(format!("unknown name `{n}`"))
            }
        };
        let t = infer(&s.expr, &lookup, false).map_err(err)?;
        collect_vars(&s.expr, &mut used);
        let Some(dtype) = t.dtype else {
            return Err(err(
                "the right-hand side is a bare scalar, not a tensor".into()
            ));
        };
        let ty = TensorType {
            dtype,
            shape: t.shape.clone(),
        };
        if env.contains_key(&s.target) {
            return Err(err(format!("`{}` is already defined", s.target)));
        }
        if let Some(decl) = outputs.get(s.target.as_str()) {
            if **decl != ty {
                return Err(err(format!(
                    "produces {ty} but the output is declared {decl}"
                )));
            }
        }
        env.insert(s.target.clone(), t);
        types.insert(s.target.clone(), ty);
    }
    for d in &program.outputs {
        if !env.contains_key(&d.name) {
            return Err(at(
                d.line,
                None,
                format!("output `{}` is never assigned", d.name),
            ));
        }
    }
    for d in &program.inputs {
        if !used.contains(&d.name) {
            return Err(at(
                d.line,
                None,
                format!("input `{}` is never used", d.name),
            ));
        }
    }
    for s in &program.stmts {
        if !outputs.contains_key(s.target.as_str()) && !used.contains(&s.target) {
            let msg = format!("intermediate `{}` is never used", s.target);
            return Err(at(s.line, Some(&s.target), msg));
        }
    }
    program.types = types;
    Ok(())
}

/// The shape of `a @ b` as the op language multiplies (PyTorch's rules without broadcasting the
/// batch dims): `[M,K]@[K,N]`, `[M,K]@[K]`, `[..., M, K]@[..., K, N]` with the same batch dims,
/// and `[..., M, K]@[K,N]` (one matrix for every batch); `None` for any other pair.
pub fn matmul_shape<T: PartialEq + Clone>(a: &[T], b: &[T]) -> Option<Vec<T>> {
    let (ra, rb) = (a.len(), b.len());
    if ra < 2 || b.is_empty() || a[ra - 1] != b[if rb == 1 { 0 } else { rb - 2 }] {
        return None;
    }
    match rb {
        1 if ra == 2 => Some(vec![a[0].clone()]),
        2 => Some([&a[..ra - 1], &b[1..]].concat()),
        _ if rb == ra && a[..ra - 2] == b[..rb - 2] => Some([&a[..ra - 1], &b[rb - 1..]].concat()),
        _ => None,
    }
}
