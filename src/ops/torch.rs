//! Renders a program as the equivalent PyTorch module, the way KernelBench writes its problems: a
//! `class Model(nn.Module)` whose `forward` takes the inputs in declaration order and returns the
//! outputs, module-level size constants, and `get_inputs()` / `get_init_inputs()`. This is what a
//! prompt shows the policy. The output is deterministic: the same program and sizes always give
//! the same text.

use std::fmt::Write;

use super::ast::{
    BinOp, Decl, Dim, Dtype, Expr, NormSets, Op, Program, ReduceKind, Sizes, UnaryFn,
};
use super::check::infer_expr;

/// Why a module could not be rendered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A size symbol of the program has no value.
    #[error("size `{0}` has no value")]
    MissingSize(String),
}

/// The PyTorch spelling of a dtype, e.g. `torch.float32`.
pub fn torch_dtype(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "torch.float32",
        Dtype::F16 => "torch.float16",
        Dtype::Bf16 => "torch.bfloat16",
        Dtype::I64 => "torch.int64",
    }
}

/// A Python float literal that reads back as the same f64.
fn num(v: f64) -> String {
    format!("{v:?}")
}

/// Renders `program` with the size constants in `sizes` (one per size symbol, in order of first
/// appearance); `get_inputs()` draws every input with `torch.randn`.
pub fn render_module(program: &Program, sizes: &Sizes) -> Result<String, RenderError> {
    render_module_with(program, sizes, None, &|_, _| None)
}

/// Like [`render_module`], with a docstring for `Model` and a say in how inputs are drawn:
/// `init(decl, dims)` returns the Python expression creating the input (given its dims as
/// Python, e.g. `"M, K"`), or `None` for `torch.randn(dims, dtype=...)`.
pub fn render_module_with(
    program: &Program,
    sizes: &Sizes,
    doc: Option<&str>,
    init: &dyn Fn(&Decl, &str) -> Option<String>,
) -> Result<String, RenderError> {
    let mut s = String::new();
    s.push_str("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n");
    s.push_str("class Model(nn.Module):\n");
    if let Some(doc) = doc {
        let _ = writeln!(
            s,
            "    \"\"\"{}\"\"\"\n",
            doc.replace('\\', "\\\\").replace("\"\"\"", "'''")
        );
    }
    s.push_str("    def __init__(self):\n        super().__init__()\n\n");
    let args: Vec<String> = program
        .inputs
        .iter()
        .map(|d| format!("{}: torch.Tensor", d.name))
        .collect();
    let ret = if program.outputs.len() == 1 {
        "torch.Tensor".to_string()
    } else {
        format!(
            "tuple[{}]",
            vec!["torch.Tensor"; program.outputs.len()].join(", ")
        )
    };
    let _ = writeln!(s, "    def forward(self, {}) -> {ret}:", args.join(", "));
    for st in &program.stmts {
        let _ = writeln!(
            s,
            "        {} = {}",
            st.target,
            Renderer { program }.expr(&st.expr).0
        );
    }
    let outs: Vec<&str> = program.outputs.iter().map(|d| d.name.as_str()).collect();
    let _ = writeln!(s, "        return {}\n\n", outs.join(", "));
    for sym in program.size_symbols() {
        let v = sizes
            .get(&sym)
            .ok_or_else(|| RenderError::MissingSize(sym.clone()))?;
        let _ = writeln!(s, "{sym} = {v}");
    }
    for c in &program.consts {
        let _ = writeln!(s, "{} = {}", c.name, num(c.value));
    }
    s.push_str("\n\ndef get_inputs():\n");
    for d in &program.inputs {
        let dims: Vec<String> = d.ty.shape.iter().map(Dim::to_string).collect();
        let shape = if dims.is_empty() {
            "()".to_string()
        } else {
            dims.join(", ")
        };
        let make = if d.ty.dtype.is_float() {
            "torch.randn"
        } else {
            "torch.zeros"
        };
        let value = init(d, &shape)
            .unwrap_or_else(|| format!("{make}({shape}, dtype={})", torch_dtype(d.ty.dtype)));
        let _ = writeln!(s, "    {} = {value}", d.name);
    }
    let names: Vec<&str> = program.inputs.iter().map(|d| d.name.as_str()).collect();
    let _ = writeln!(s, "    return [{}]\n\n", names.join(", "));
    s.push_str("def get_init_inputs():\n    return []\n");
    Ok(s)
}

/// Binding strength of a rendered Python expression.
const ADD: u8 = 1;
const MUL: u8 = 2;
const NEG: u8 = 3;
const ATOM: u8 = 4;

struct Renderer<'a> {
    program: &'a Program,
}

impl Renderer<'_> {
    fn is_scalar(&self, e: &Expr) -> bool {
        infer_expr(self.program, e).is_ok_and(|t| t.dtype.is_none())
    }

    fn rank(&self, e: &Expr) -> usize {
        infer_expr(self.program, e).map_or(0, |t| t.shape.len())
    }

    fn atom(&self, e: &Expr) -> String {
        self.expr(e).0
    }

    fn dtype(&self, e: &Expr) -> Option<Dtype> {
        infer_expr(self.program, e).ok().and_then(|t| t.dtype)
    }

    /// The operands of an operation that PyTorch runs in one dtype (matmul, convolutions, norms),
    /// each cast to the dtype the program gives the result where it differs: kevin joins mixed
    /// float operands to f32 (as PyTorch promotes `+`), where torch.matmul or F.layer_norm would
    /// refuse them.
    fn operands<'e>(&self, args: impl IntoIterator<Item = &'e Expr>) -> Vec<String> {
        let args: Vec<&Expr> = args.into_iter().collect();
        let dtypes: Vec<Option<Dtype>> = args.iter().map(|a| self.dtype(a)).collect();
        let joined = dtypes
            .iter()
            .try_fold(None, |j, &d| super::check::join_dtype(j, d, ""))
            .ok()
            .flatten();
        args.iter()
            .zip(&dtypes)
            .map(|(a, d)| match (d, joined) {
                (Some(d), Some(j)) if *d != j => {
                    format!("{}.to({})", self.paren(a, ATOM), torch_dtype(j))
                }
                _ => self.atom(a),
            })
            .collect()
    }

    /// The rendered text and its binding strength.
    fn expr(&self, e: &Expr) -> (String, u8) {
        match e {
            Expr::Num(v) if *v < 0.0 => (num(*v), NEG),
            Expr::Num(v) => (num(*v), ATOM),
            Expr::Var(n) => (n.clone(), ATOM),
            Expr::Neg(a) => (format!("-{}", self.paren(a, NEG)), NEG),
            Expr::Binary(op, a, b) => self.binary(*op, a, b),
            Expr::Call { op, args } => (self.call(op, args), ATOM),
        }
    }

    /// `e` rendered, in parentheses when it binds looser than `min`.
    fn paren(&self, e: &Expr, min: u8) -> String {
        let (s, p) = self.expr(e);
        if p < min {
            format!("({s})")
        } else {
            s
        }
    }

    fn binary(&self, op: BinOp, a: &Expr, b: &Expr) -> (String, u8) {
        let infix = |sym: &str, prec: u8| {
            (
                format!("{} {sym} {}", self.paren(a, prec), self.paren(b, prec + 1)),
                prec,
            )
        };
        let (sa, sb) = (self.is_scalar(a), self.is_scalar(b));
        let call = |s: String| (s, ATOM);
        match op {
            BinOp::Add => infix("+", ADD),
            BinOp::Sub => infix("-", ADD),
            BinOp::Mul => infix("*", MUL),
            BinOp::Div => infix("/", MUL),
            BinOp::MatMul => {
                let ops = self.operands([a, b]);
                let f = if self.rank(a) == 3 && self.rank(b) == 3 {
                    "bmm"
                } else {
                    "matmul"
                };
                call(format!("torch.{f}({}, {})", ops[0], ops[1]))
            }
            BinOp::Max | BinOp::Min => {
                let (torch_fn, py_fn, bound) = if op == BinOp::Max {
                    ("maximum", "max", "min")
                } else {
                    ("minimum", "min", "max")
                };
                call(match (sa, sb) {
                    (true, true) => format!("{py_fn}({}, {})", self.atom(a), self.atom(b)),
                    (false, true) => {
                        format!("torch.clamp({}, {bound}={})", self.atom(a), self.atom(b))
                    }
                    (true, false) => {
                        format!("torch.clamp({}, {bound}={})", self.atom(b), self.atom(a))
                    }
                    _ => format!("torch.{torch_fn}({}, {})", self.atom(a), self.atom(b)),
                })
            }
            BinOp::Pow if sa && sb => call(format!(
                "({} ** {})",
                self.paren(a, ATOM),
                self.paren(b, ATOM)
            )),
            BinOp::Pow => call(format!("torch.pow({}, {})", self.atom(a), self.atom(b))),
        }
    }

    /// The extent of the last axis of `e`, as Python (a size constant or a literal).
    fn last_dim(&self, e: &Expr) -> String {
        infer_expr(self.program, e)
            .ok()
            .and_then(|t| t.shape.last().map(Dim::to_string))
            .unwrap_or_else(|| format!("{}.shape[-1]", self.atom(e)))
    }

    fn call(&self, op: &Op, args: &[Expr]) -> String {
        let joins = matches!(
            op,
            Op::Conv { .. } | Op::LayerNorm { .. } | Op::RmsNorm { .. } | Op::ChannelNorm { .. }
        );
        let mut rendered = if joins {
            self.operands(args)
        } else {
            args.iter().map(|a| self.atom(a)).collect()
        };
        let rest = rendered.split_off(rendered.len().min(1));
        let x = rendered.pop().unwrap_or_default();
        let kd = |k: bool| if k { "True" } else { "False" };
        match *op {
            Op::Unary(u) => {
                let f = match u {
                    UnaryFn::Relu => "torch.relu",
                    UnaryFn::Gelu => "F.gelu",
                    UnaryFn::GeluTanh => return format!("F.gelu({x}, approximate=\"tanh\")"),
                    UnaryFn::Silu => "F.silu",
                    UnaryFn::Sigmoid => "torch.sigmoid",
                    UnaryFn::Tanh => "torch.tanh",
                    UnaryFn::Exp => "torch.exp",
                    UnaryFn::Log => "torch.log",
                    UnaryFn::Abs => "torch.abs",
                    UnaryFn::Neg => "torch.neg",
                    UnaryFn::Sqrt => "torch.sqrt",
                    UnaryFn::Rsqrt => "torch.rsqrt",
                    UnaryFn::Square => "torch.square",
                    UnaryFn::Softplus => "F.softplus",
                    UnaryFn::Mish => "F.mish",
                    UnaryFn::Hardsigmoid => "F.hardsigmoid",
                    UnaryFn::Hardswish => "F.hardswish",
                };
                format!("{f}({x})")
            }
            Op::LeakyRelu { slope } => format!("F.leaky_relu({x}, negative_slope={})", num(slope)),
            Op::Elu { alpha } => format!("F.elu({x}, alpha={})", num(alpha)),
            Op::Clamp {
                lo,
                hi,
                hardtanh: true,
            } => {
                format!("F.hardtanh({x}, min_val={}, max_val={})", num(lo), num(hi))
            }
            Op::Clamp { lo, hi, .. } => {
                format!("torch.clamp({x}, min={}, max={})", num(lo), num(hi))
            }
            Op::Reduce {
                kind,
                axis,
                keepdim,
            } => {
                let f = match kind {
                    ReduceKind::Sum => "torch.sum",
                    ReduceKind::Mean => "torch.mean",
                    ReduceKind::Max => "torch.amax",
                    ReduceKind::Min => "torch.amin",
                    ReduceKind::Prod => "torch.prod",
                    ReduceKind::Argmax => "torch.argmax",
                    ReduceKind::Argmin => "torch.argmin",
                    ReduceKind::Logsumexp => "torch.logsumexp",
                };
                format!("{f}({x}, dim={axis}, keepdim={})", kd(keepdim))
            }
            Op::Softmax { axis } => format!("torch.softmax({x}, dim={axis})"),
            Op::LogSoftmax { axis } => format!("torch.log_softmax({x}, dim={axis})"),
            Op::Cumsum { axis } => format!("torch.cumsum({x}, dim={axis})"),
            Op::Cumprod { axis } => format!("torch.cumprod({x}, dim={axis})"),
            Op::L2Norm { axis, eps } => {
                format!("F.normalize({x}, p=2.0, dim={axis}, eps={})", num(eps))
            }
            Op::LayerNorm { eps, weight, bias } => {
                let n = args.first().map(|a| self.last_dim(a)).unwrap_or_default();
                let mut it = rest.iter();
                let w = if weight { it.next().cloned() } else { None };
                let b = if bias { it.next().cloned() } else { None };
                let w = w.unwrap_or_else(|| "None".into());
                let b = b.unwrap_or_else(|| "None".into());
                format!(
                    "F.layer_norm({x}, ({n},), weight={w}, bias={b}, eps={})",
                    num(eps)
                )
            }
            Op::RmsNorm { eps, weight } => {
                let n = args.first().map(|a| self.last_dim(a)).unwrap_or_default();
                let w = if weight { rest.first().cloned() } else { None };
                let w = w.unwrap_or_else(|| "None".into());
                format!("F.rms_norm({x}, ({n},), weight={w}, eps={})", num(eps))
            }
            Op::Transpose { a, b } => format!("torch.transpose({x}, {a}, {b})"),
            Op::Unsqueeze { axis } => format!("torch.unsqueeze({x}, {axis})"),
            Op::Squeeze { axis } => format!("torch.squeeze({x}, {axis})"),
            Op::Flip { axis } => format!("torch.flip({x}, ({axis},))"),
            Op::Gather { axis } => format!("torch.gather({x}, {axis}, {})", rest[0]),
            Op::Reshape { ref shape } => {
                format!("torch.reshape({x}, {})", super::ast::shape_tuple(shape))
            }
            Op::Triangle { upper, diagonal } => {
                format!("torch.{}({x}, {diagonal})", if upper { "triu" } else { "tril" })
            }
            Op::Conv {
                transposed,
                ref output_padding,
                dims,
                ref stride,
                ref padding,
                ref dilation,
                groups,
                bias,
            } => {
                let w = rest.first().cloned().unwrap_or_default();
                let b = if bias { rest.get(1).cloned() } else { None };
                let b = b.unwrap_or_else(|| "None".into());
                let (s, p, d) = (per_axis(stride), per_axis(padding), per_axis(dilation));
                if transposed {
                    let op = per_axis(output_padding);
                    format!(
                        "F.conv_transpose{dims}d({x}, {w}, {b}, stride={s}, padding={p}, \
                         output_padding={op}, groups={groups}, dilation={d})"
                    )
                } else {
                    format!(
                        "F.conv{dims}d({x}, {w}, {b}, stride={s}, padding={p}, dilation={d}, \
                         groups={groups})"
                    )
                }
            }
            Op::ChannelNorm {
                sets,
                eps,
                weight,
                bias,
            } => {
                let mut it = rest.iter();
                let w = if weight { it.next().cloned() } else { None };
                let b = if bias { it.next().cloned() } else { None };
                let w = w.unwrap_or_else(|| "None".into());
                let b = b.unwrap_or_else(|| "None".into());
                let eps = num(eps);
                match sets {
                    NormSets::Instance => {
                        format!("F.instance_norm({x}, weight={w}, bias={b}, eps={eps})")
                    }
                    NormSets::Batch => format!(
                        "F.batch_norm({x}, None, None, weight={w}, bias={b}, training=True, eps={eps})"
                    ),
                    NormSets::Groups(g) => {
                        format!("F.group_norm({x}, {g}, weight={w}, bias={b}, eps={eps})")
                    }
                }
            }
            Op::Pool {
                max: true,
                dims,
                ref kernel,
                ref stride,
                ref padding,
                ref dilation,
                ..
            } => format!(
                "F.max_pool{dims}d({x}, kernel_size={}, stride={}, padding={}, dilation={})",
                per_axis(kernel),
                per_axis(stride),
                per_axis(padding),
                per_axis(dilation)
            ),
            Op::Pool {
                dims,
                ref kernel,
                ref stride,
                ref padding,
                count_include_pad,
                ..
            } => format!(
                "F.avg_pool{dims}d({x}, kernel_size={}, stride={}, padding={}, count_include_pad={})",
                per_axis(kernel),
                per_axis(stride),
                per_axis(padding),
                kd(count_include_pad)
            ),
        }
    }
}

/// A per-axis parameter as PyTorch and the op language take it: one integer when every axis
/// has the same value, else a tuple.
pub fn per_axis(v: &[usize]) -> String {
    match v {
        [first, rest @ ..] if rest.iter().all(|x| x == first) => first.to_string(),
        _ => format!(
            "({})",
            v.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
