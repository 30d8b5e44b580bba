//! The table of built-in functions: each name's parameters (tensor operands and constant scalar
//! parameters with their defaults) and how a call binds its positional and keyword arguments into
//! an [`Expr`]. The parser calls [`bind`]; the module doc of [`crate::ops`] lists the same table.

use super::ast::{BinOp, Dim, Expr, NormSets, Op, Poly, ReduceKind, UnaryFn};

/// One formal parameter.
#[derive(Clone, Copy)]
enum P {
    /// A required tensor operand.
    T(&'static str),
    /// An optional tensor operand.
    OptT(&'static str),
    /// A float parameter with an optional default.
    F(&'static str, Option<f64>),
    /// An integer parameter (an axis) with an optional default.
    I(&'static str, Option<i64>),
    /// A boolean parameter with an optional default.
    B(&'static str, Option<bool>),
    /// A per-spatial-axis integer parameter: one integer for every axis, or a tuple of one per
    /// axis; with an optional default (`None` and not optional: required).
    Axes(&'static str, Option<i64>),
    /// A per-axis parameter that may be left out (a pooling's stride: its window).
    OptAxes(&'static str),
    /// A shape: a tuple of dims (size symbols, integers, sums and products of them).
    Shape(&'static str),
}

/// An argument as written: an expression, or a tuple `(a, b)` (per-axis integer parameters).
#[derive(Clone, Debug)]
pub enum Arg {
    /// Any expression.
    Expr(Expr),
    /// A parenthesised list with a comma.
    Tuple(Vec<Expr>),
    /// A shape: size expressions, as in a declaration (the parser reads a shape parameter's
    /// argument so, see [`is_shape_param`]).
    Shape(Vec<Poly>),
}

impl P {
    fn name(self) -> &'static str {
        match self {
            P::T(n) | P::OptT(n) | P::F(n, _) | P::I(n, _) | P::B(n, _) => n,
            P::Axes(n, _) | P::OptAxes(n) | P::Shape(n) => n,
        }
    }
}

/// A bound argument value.
#[derive(Clone)]
enum V {
    Tensor(Expr),
    Absent,
    F(f64),
    I(i64),
    B(bool),
    /// Per-axis integers (one value broadcasts later); empty when left out.
    Axes(Vec<i64>),
    /// A shape.
    Shape(Vec<Dim>),
}

/// The spatial axes of a windowed built-in (`conv2d` -> 2), and whether it is a convolution, a
/// max pooling or an average pooling.
fn windowed(name: &str) -> Option<(usize, &'static str)> {
    let (stem, d) = name.split_at(name.len().checked_sub(2)?);
    let dims = match d {
        "1d" => 1,
        "2d" => 2,
        "3d" => 3,
        _ => return None,
    };
    let kind = match stem {
        "conv" => "conv",
        "conv_transpose" => "conv_transpose",
        "max_pool" => "max_pool",
        "avg_pool" => "avg_pool",
        _ => return None,
    };
    Some((dims, kind))
}

fn unary_fn(name: &str) -> Option<UnaryFn> {
    UnaryFn::from_name(name)
}

fn reduce_kind(name: &str) -> Option<ReduceKind> {
    ReduceKind::from_name(name)
}

fn signature(name: &str) -> Option<Vec<P>> {
    use P::*;
    if unary_fn(name).is_some() {
        return Some(vec![T("x")]);
    }
    if reduce_kind(name).is_some() {
        return Some(vec![T("x"), I("axis", Some(-1)), B("keepdim", Some(false))]);
    }
    if let Some((_, kind)) = windowed(name) {
        return Some(match kind {
            "conv" => vec![
                T("x"),
                T("weight"),
                OptT("bias"),
                Axes("stride", Some(1)),
                Axes("padding", Some(0)),
                Axes("dilation", Some(1)),
                I("groups", Some(1)),
            ],
            "conv_transpose" => vec![
                T("x"),
                T("weight"),
                OptT("bias"),
                Axes("stride", Some(1)),
                Axes("padding", Some(0)),
                Axes("output_padding", Some(0)),
                I("groups", Some(1)),
                Axes("dilation", Some(1)),
            ],
            "max_pool" => vec![
                T("x"),
                Axes("kernel_size", None),
                OptAxes("stride"),
                Axes("padding", Some(0)),
                Axes("dilation", Some(1)),
                B("ceil_mode", Some(false)),
            ],
            _ => vec![
                T("x"),
                Axes("kernel_size", None),
                OptAxes("stride"),
                Axes("padding", Some(0)),
                B("ceil_mode", Some(false)),
                B("count_include_pad", Some(true)),
            ],
        });
    }
    Some(match name {
        "leaky_relu" => vec![T("x"), F("slope", Some(0.01))],
        "elu" => vec![T("x"), F("alpha", Some(1.0))],
        "clamp" => vec![T("x"), F("lo", None), F("hi", None)],
        "hardtanh" => vec![T("x"), F("lo", Some(-1.0)), F("hi", Some(1.0))],
        "maximum" | "minimum" | "pow" => vec![T("a"), T("b")],
        "softmax" | "log_softmax" | "cumsum" | "cumprod" => vec![T("x"), I("axis", Some(-1))],
        "l2norm" => vec![T("x"), I("axis", Some(-1)), F("eps", Some(1e-12))],
        "layer_norm" => vec![T("x"), OptT("weight"), OptT("bias"), F("eps", Some(1e-5))],
        "rms_norm" => vec![T("x"), OptT("weight"), F("eps", Some(1e-6))],
        "group_norm" => vec![
            T("x"),
            I("groups", None),
            OptT("weight"),
            OptT("bias"),
            F("eps", Some(1e-5)),
        ],
        "batch_norm" | "instance_norm" => {
            vec![T("x"), OptT("weight"), OptT("bias"), F("eps", Some(1e-5))]
        }
        "transpose" => vec![T("x"), I("a", Some(-2)), I("b", Some(-1))],
        "unsqueeze" | "squeeze" | "flip" => vec![T("x"), I("axis", None)],
        "triu" | "tril" => vec![T("x"), I("diagonal", Some(0))],
        "reshape" => vec![T("x"), Shape("shape")],
        "gather" => vec![T("x"), T("index"), I("axis", None)],
        _ => return None,
    })
}

/// True when the argument of `name` at `position` (keyword `kw`) is a shape, which the parser
/// reads as size expressions (`(N, C*H*W, (L + 1) // 2)`).
pub fn is_shape_param(name: &str, position: usize, kw: Option<&str>) -> bool {
    let Some(params) = signature(name) else {
        return false;
    };
    let p = match kw {
        Some(k) => params.iter().find(|p| p.name() == k),
        None => params.get(position),
    };
    matches!(p, Some(P::Shape(_)))
}

/// True when `name` is a built-in function (such names cannot name tensors).
pub fn is_builtin(name: &str) -> bool {
    signature(name).is_some()
}

/// Evaluates a constant scalar argument: a literal, a negation, or a named constant.
fn const_value(e: &Expr, consts: &dyn Fn(&str) -> Option<f64>) -> Option<f64> {
    match e {
        Expr::Num(v) => Some(*v),
        Expr::Neg(inner) => const_value(inner, consts).map(|v| -v),
        Expr::Var(n) => consts(n),
        _ => None,
    }
}

/// Binds a call `name(args)`; each argument is `(keyword, value)`. Errors are messages for the
/// parser to locate.
pub fn bind(
    name: &str,
    args: Vec<(Option<String>, Arg)>,
    consts: &dyn Fn(&str) -> Option<f64>,
) -> Result<Expr, String> {
    let params = signature(name).ok_or_else(|| format!("unknown function `{name}`"))?;
    let mut slots: Vec<Option<Arg>> = vec![None; params.len()];
    let mut next_positional = 0usize;
    let mut seen_keyword = false;
    for (kw, value) in args {
        let idx = match kw {
            None => {
                if seen_keyword {
                    return Err(format!("positional argument after a keyword in `{name}`"));
                }
                if next_positional >= params.len() {
                    return Err(format!("`{name}` takes at most {} arguments", params.len()));
                }
                next_positional += 1;
                next_positional - 1
            }
            Some(k) => {
                seen_keyword = true;
                let idx = params.iter().position(|p| p.name() == k).ok_or_else(|| {
                    let names: Vec<&str> = params.iter().map(|p| p.name()).collect();
                    format!(
                        "`{name}` has no parameter `{k}` (it has {})",
                        names.join(", ")
                    )
                })?;
                if slots[idx].is_some() {
                    return Err(format!("parameter `{k}` of `{name}` given twice"));
                }
                idx
            }
        };
        slots[idx] = Some(value);
    }
    let int_of = |n: &str, e: &Expr| match const_value(e, consts) {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e9 => Ok(v as i64),
        _ => Err(format!("parameter `{n}` of `{name}` must be an integer")),
    };
    let mut vals = Vec::with_capacity(params.len());
    for (p, slot) in params.iter().zip(slots) {
        let slot = match (p, slot) {
            (P::Shape(_), Some(Arg::Shape(dims))) => {
                if let Some(bad) = dims.iter().find(|d| d.constant().is_some_and(|c| c < 1)) {
                    return Err(format!(
                        "dimension `{bad}` of `{name}` is not a positive integer"
                    ));
                }
                vals.push(V::Shape(dims.into_iter().map(Dim::from_poly).collect()));
                continue;
            }
            (P::Shape(n), None) => return Err(format!("`{name}` needs argument `{n}`")),
            (_, Some(Arg::Shape(_))) => {
                unreachable!("the parser reads shapes for shape parameters")
            }
            (P::Axes(n, _) | P::OptAxes(n), Some(Arg::Tuple(items))) => {
                let v = items
                    .iter()
                    .map(|e| int_of(n, e))
                    .collect::<Result<_, _>>()?;
                vals.push(V::Axes(v));
                continue;
            }
            (P::Axes(n, _) | P::OptAxes(n), Some(Arg::Expr(e))) => {
                vals.push(V::Axes(vec![int_of(n, &e)?]));
                continue;
            }
            (P::Axes(_, Some(d)), None) => {
                vals.push(V::Axes(vec![*d]));
                continue;
            }
            (P::OptAxes(_), None) => {
                vals.push(V::Axes(Vec::new()));
                continue;
            }
            (_, Some(Arg::Tuple(_))) => {
                return Err(format!(
                    "parameter `{}` of `{name}` takes one value, not a tuple",
                    p.name()
                ))
            }
            (_, Some(Arg::Expr(e))) => Some(e),
            (_, None) => None,
        };
        let v = match (*p, slot) {
            (P::T(_) | P::OptT(_), Some(e)) => V::Tensor(e),
            (P::OptT(_), None) => V::Absent,
            (P::F(_, Some(d)), None) => V::F(d),
            (P::I(_, Some(d)), None) => V::I(d),
            (P::B(_, Some(d)), None) => V::B(d),
            (P::F(n, _), Some(e)) => V::F(const_value(&e, consts).ok_or_else(|| {
                format!("parameter `{n}` of `{name}` must be a number or a constant")
            })?),
            (P::I(n, _), Some(e)) => match const_value(&e, consts) {
                Some(v) if v.fract() == 0.0 && v.abs() < 1e9 => V::I(v as i64),
                _ => return Err(format!("parameter `{n}` of `{name}` must be an integer")),
            },
            (P::B(n, _), Some(e)) => match e {
                Expr::Var(s) if s == "true" => V::B(true),
                Expr::Var(s) if s == "false" => V::B(false),
                _ => return Err(format!("parameter `{n}` of `{name}` must be true or false")),
            },
            (p, None) => return Err(format!("`{name}` needs argument `{}`", p.name())),
            (P::Axes(..) | P::OptAxes(_) | P::Shape(_), Some(_)) => {
                unreachable!("handled above")
            }
        };
        vals.push(v);
    }
    if let Some((dims, kind)) = windowed(name) {
        return build_windowed(name, dims, kind, vals);
    }
    Ok(build(name, vals))
}

/// Builds a convolution or pooling call, checking every per-axis parameter against PyTorch's
/// rules: one value or one per spatial axis, strides, dilations and windows positive, padding
/// not negative (and at most half the window for pooling).
fn build_windowed(name: &str, dims: usize, kind: &str, vals: Vec<V>) -> Result<Expr, String> {
    let mut tensors = Vec::new();
    let mut present = Vec::new();
    let mut axes = Vec::new();
    let (mut ints, mut bools) = (Vec::new(), Vec::new());
    for v in vals {
        match v {
            V::Tensor(e) => {
                if !tensors.is_empty() {
                    present.push(true);
                }
                tensors.push(e)
            }
            V::Absent => present.push(false),
            V::Axes(a) => axes.push(a),
            V::I(i) => ints.push(i),
            V::B(b) => bools.push(b),
            V::F(_) | V::Shape(_) => {}
        }
    }
    let per_axis = |what: &str, v: &[i64], min: i64| -> Result<Vec<usize>, String> {
        let v = match v.len() {
            1 => vec![v[0]; dims],
            n if n == dims => v.to_vec(),
            n => {
                return Err(format!(
                "`{what}` of `{name}` has {n} values; give one, or one per spatial axis ({dims})"
            ))
            }
        };
        if let Some(bad) = v.iter().find(|&&x| x < min) {
            return Err(format!(
                "`{what}` of `{name}` must be at least {min}, got {bad}"
            ));
        }
        Ok(v.into_iter().map(|x| x as usize).collect())
    };
    let call = |op: Op, args: Vec<Expr>| Expr::Call { op, args };
    if kind == "conv" || kind == "conv_transpose" {
        let groups = ints.first().copied().unwrap_or(1);
        if groups < 1 {
            return Err(format!(
                "`groups` of `{name}` must be at least 1, got {groups}"
            ));
        }
        let transposed = kind == "conv_transpose";
        let stride = per_axis("stride", &axes[0], 1)?;
        let (dilation, output_padding) = if transposed {
            (
                per_axis("dilation", &axes[3], 1)?,
                per_axis("output_padding", &axes[2], 0)?,
            )
        } else {
            (per_axis("dilation", &axes[2], 1)?, vec![0; dims])
        };
        // PyTorch's rule: the extra length must be smaller than the stride or the dilation.
        if let Some(i) = (0..dims).find(|&i| output_padding[i] >= stride[i].max(dilation[i])) {
            return Err(format!(
                "`output_padding` of `{name}` must be smaller than the stride or the dilation: {} \
                 against {} and {}",
                output_padding[i], stride[i], dilation[i]
            ));
        }
        let op = Op::Conv {
            transposed,
            output_padding,
            dims,
            stride,
            padding: per_axis("padding", &axes[1], 0)?,
            dilation,
            groups: groups as usize,
            bias: present.get(1) == Some(&true),
        };
        return Ok(call(op, tensors));
    }
    let kernel = per_axis("kernel_size", &axes[0], 1)?;
    let stride = if axes[1].is_empty() {
        kernel.clone()
    } else {
        per_axis("stride", &axes[1], 1)?
    };
    let padding = per_axis("padding", &axes[2], 0)?;
    if let Some(i) = (0..dims).find(|&i| 2 * padding[i] > kernel[i]) {
        return Err(format!(
            "`padding` of `{name}` must be at most half the window: {} against a window of {}",
            padding[i], kernel[i]
        ));
    }
    let max = kind == "max_pool";
    let dilation = if max {
        per_axis("dilation", &axes[3], 1)?
    } else {
        vec![1; dims]
    };
    if bools.first() == Some(&true) {
        return Err(format!(
            "`ceil_mode=true` of `{name}` is not supported (floor mode only)"
        ));
    }
    let op = Op::Pool {
        max,
        dims,
        kernel,
        stride,
        padding,
        dilation,
        count_include_pad: !max && bools.get(1) != Some(&false),
    };
    Ok(call(op, tensors))
}

fn build(name: &str, vals: Vec<V>) -> Expr {
    let mut tensors = Vec::new();
    let (mut floats, mut ints, mut bools) = (Vec::new(), Vec::new(), Vec::new());
    // Which optional tensor operands were given, in parameter order.
    let mut present = Vec::new();
    let mut shape = Vec::new();
    for v in vals {
        match v {
            V::Tensor(e) => {
                if !tensors.is_empty() {
                    present.push(true);
                }
                tensors.push(e)
            }
            V::Absent => present.push(false),
            V::F(f) => floats.push(f),
            V::I(i) => ints.push(i),
            V::B(b) => bools.push(b),
            V::Axes(_) => {}
            V::Shape(s) => shape = s,
        }
    }
    let f = |i: usize| floats.get(i).copied().unwrap_or(0.0);
    let n = |i: usize| ints.get(i).copied().unwrap_or(-1);
    let call = |op: Op, args: Vec<Expr>| Expr::Call { op, args };
    if let Some(u) = unary_fn(name) {
        return call(Op::Unary(u), tensors);
    }
    if let Some(kind) = reduce_kind(name) {
        let keepdim = bools.first().copied().unwrap_or(false);
        return call(
            Op::Reduce {
                kind,
                axis: n(0),
                keepdim,
            },
            tensors,
        );
    }
    let binop = match name {
        "maximum" => Some(BinOp::Max),
        "minimum" => Some(BinOp::Min),
        "pow" => Some(BinOp::Pow),
        _ => None,
    };
    if let Some(op) = binop {
        let mut it = tensors.into_iter();
        let (a, b) = (it.next(), it.next());
        return match (a, b) {
            (Some(a), Some(b)) => Expr::Binary(op, Box::new(a), Box::new(b)),
            // Unreachable: both operands are required by the signature.
            _ => Expr::Num(f64::NAN),
        };
    }
    let op = match name {
        "leaky_relu" => Op::LeakyRelu { slope: f(0) },
        "elu" => Op::Elu { alpha: f(0) },
        "clamp" => Op::Clamp {
            lo: f(0),
            hi: f(1),
            hardtanh: false,
        },
        "hardtanh" => Op::Clamp {
            lo: f(0),
            hi: f(1),
            hardtanh: true,
        },
        "softmax" => Op::Softmax { axis: n(0) },
        "log_softmax" => Op::LogSoftmax { axis: n(0) },
        "cumsum" => Op::Cumsum { axis: n(0) },
        "cumprod" => Op::Cumprod { axis: n(0) },
        "l2norm" => Op::L2Norm {
            axis: n(0),
            eps: f(0),
        },
        "layer_norm" => Op::LayerNorm {
            eps: f(0),
            weight: present.first() == Some(&true),
            bias: present.get(1) == Some(&true),
        },
        "rms_norm" => Op::RmsNorm {
            eps: f(0),
            weight: present.first() == Some(&true),
        },
        "group_norm" | "batch_norm" | "instance_norm" => Op::ChannelNorm {
            sets: match name {
                "group_norm" => NormSets::Groups(n(0).max(0) as usize),
                "batch_norm" => NormSets::Batch,
                _ => NormSets::Instance,
            },
            eps: f(0),
            weight: present.first() == Some(&true),
            bias: present.get(1) == Some(&true),
        },
        "unsqueeze" => Op::Unsqueeze { axis: n(0) },
        "squeeze" => Op::Squeeze { axis: n(0) },
        "flip" => Op::Flip { axis: n(0) },
        "reshape" => Op::Reshape { shape },
        "gather" => Op::Gather { axis: n(0) },
        "triu" | "tril" => Op::Triangle {
            upper: name == "triu",
            diagonal: n(0),
        },
        _ => Op::Transpose { a: n(0), b: n(1) },
    };
    call(op, tensors)
}
