//! The syntax tree of the op language: declarations, statements and expressions, plus the element
//! types and symbolic shapes they carry. The parser builds it, the checker fills in the type of
//! every statement, and the interpreter, the PyTorch renderer and the task loader read it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub use super::size::Poly;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (half).
    F16,
    /// bfloat16: binary32 with the mantissa cut to 7 bits.
    Bf16,
    /// 64-bit signed integer; only produced by argmax/argmin.
    I64,
}

impl Dtype {
    /// Parses the spelling used in programs (`f32`, `f16`, `bf16`, `i64`).
    pub fn from_name(name: &str) -> Option<Dtype> {
        match name {
            "f32" => Some(Dtype::F32),
            "f16" => Some(Dtype::F16),
            "bf16" => Some(Dtype::Bf16),
            "i64" => Some(Dtype::I64),
            _ => None,
        }
    }

    /// The spelling used in programs.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::I64 => "i64",
        }
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I64 => 8,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        self != Dtype::I64
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One dimension of a declared shape: a size symbol such as `M`, a literal extent, or a size
/// expression computed from symbols (`(H + 1) // 2 - 1`, `C*H*W`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A size symbol, bound to a concrete value per size preset.
    Sym(String),
    /// A literal extent.
    Lit(usize),
    /// Any other size expression, in its normal form ([`Dim::from_poly`] keeps a plain symbol
    /// or a constant out of it, so equal dims are equal values of this type).
    Expr(Poly),
}

impl Dim {
    /// The dim of a normalised size expression: a literal or a symbol where it is one.
    pub fn from_poly(p: Poly) -> Dim {
        if let Some(c) = p.constant() {
            return Dim::Lit(c.max(0) as usize);
        }
        if let Some(s) = p.as_sym() {
            return Dim::Sym(s.to_string());
        }
        Dim::Expr(p)
    }

    /// The dim as a size expression.
    pub fn to_poly(&self) -> Poly {
        match self {
            Dim::Sym(s) => Poly::sym(s),
            Dim::Lit(n) => Poly::lit(*n as i64),
            Dim::Expr(p) => p.clone(),
        }
    }

    /// The concrete extent under `sizes`, or `None` when a symbol is unbound (or an expression
    /// is not positive there).
    pub fn resolve(&self, sizes: &Sizes) -> Option<usize> {
        match self {
            Dim::Sym(s) => sizes.get(s).copied(),
            Dim::Lit(n) => Some(*n),
            Dim::Expr(p) => p.eval(sizes).filter(|&v| v > 0).map(|v| v as usize),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Sym(s) => f.write_str(s),
            Dim::Lit(n) => write!(f, "{n}"),
            Dim::Expr(p) => write!(f, "{p}"),
        }
    }
}

/// Concrete values of size symbols, e.g. `{M: 4096, N: 1024}`.
pub type Sizes = BTreeMap<String, usize>;

/// Element type and symbolic shape of a tensor, e.g. `f32[M, N]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorType {
    /// Element type.
    pub dtype: Dtype,
    /// Symbolic shape; empty for a rank-0 tensor.
    pub shape: Vec<Dim>,
}

impl TensorType {
    /// The concrete shape under `sizes`, or the first unbound symbol.
    pub fn concrete_shape(&self, sizes: &Sizes) -> Result<Vec<usize>, String> {
        concrete(&self.shape, sizes)
    }
}

/// `dims` as a tuple, in the op language and in Python alike: `(N, C*H*W)`, `(N,)`.
pub fn shape_tuple(dims: &[Dim]) -> String {
    let items: Vec<String> = dims.iter().map(Dim::to_string).collect();
    match items.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", items.join(", ")),
    }
}

/// The number of elements of a tensor of `dims`, as a polynomial in the size symbols.
pub fn dims_product(dims: &[Dim]) -> Poly {
    dims.iter().fold(Poly::lit(1), |p, d| p.mul(&d.to_poly()))
}

/// The extents of `dims` under `sizes`, or the first dim that has none.
pub fn concrete(dims: &[Dim], sizes: &Sizes) -> Result<Vec<usize>, String> {
    dims.iter()
        .map(|d| d.resolve(sizes).ok_or_else(|| d.to_string()))
        .collect()
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// An `input` or `output` declaration.
#[derive(Clone, Debug, PartialEq)]
pub struct Decl {
    /// Tensor name.
    pub name: String,
    /// Declared type.
    pub ty: TensorType,
    /// 1-based source line.
    pub line: usize,
}

/// A named scalar constant: `const alpha = 0.5`.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    /// Constant name.
    pub name: String,
    /// Its value.
    pub value: f64,
    /// 1-based source line.
    pub line: usize,
}

/// An assignment `target = expr`.
#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    /// Name assigned: an output or a new intermediate.
    pub target: String,
    /// Right-hand side.
    pub expr: Expr,
    /// 1-based source line.
    pub line: usize,
}

/// Binary operators, written infix (`+ - * / @`) or as calls (`maximum`, `minimum`, `pow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    /// `a + b`, broadcasting.
    Add,
    /// `a - b`, broadcasting.
    Sub,
    /// `a * b`, broadcasting.
    Mul,
    /// `a / b`, broadcasting.
    Div,
    /// `maximum(a, b)`, broadcasting.
    Max,
    /// `minimum(a, b)`, broadcasting.
    Min,
    /// `pow(a, b)`, broadcasting.
    Pow,
    /// `a @ b`: matrix product (2-D, batched 3-D, 3-D by 2-D, matrix by vector).
    MatMul,
}

impl BinOp {
    /// Its name as a word (`add`, `maximum`, `matmul`): the baseline's kernel names and the
    /// task generator's canonical forms use it.
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Max => "maximum",
            BinOp::Min => "minimum",
            BinOp::Pow => "pow",
            BinOp::MatMul => "matmul",
        }
    }
}

/// Elementwise functions of one tensor without parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryFn {
    /// max(x, 0)
    Relu,
    /// x * Phi(x), with the exact erf form.
    Gelu,
    /// The tanh approximation of GELU.
    GeluTanh,
    /// x * sigmoid(x)
    Silu,
    /// 1 / (1 + exp(-x))
    Sigmoid,
    /// tanh(x)
    Tanh,
    /// exp(x)
    Exp,
    /// Natural logarithm.
    Log,
    /// |x|
    Abs,
    /// -x
    Neg,
    /// Square root.
    Sqrt,
    /// 1 / sqrt(x)
    Rsqrt,
    /// x * x
    Square,
    /// log(1 + exp(x))
    Softplus,
    /// x * tanh(softplus(x))
    Mish,
    /// relu6(x + 3) / 6
    Hardsigmoid,
    /// x * relu6(x + 3) / 6
    Hardswish,
}

impl UnaryFn {
    /// Every function, in declaration order.
    pub const ALL: [UnaryFn; 17] = [
        UnaryFn::Relu,
        UnaryFn::Gelu,
        UnaryFn::GeluTanh,
        UnaryFn::Silu,
        UnaryFn::Sigmoid,
        UnaryFn::Tanh,
        UnaryFn::Exp,
        UnaryFn::Log,
        UnaryFn::Abs,
        UnaryFn::Neg,
        UnaryFn::Sqrt,
        UnaryFn::Rsqrt,
        UnaryFn::Square,
        UnaryFn::Softplus,
        UnaryFn::Mish,
        UnaryFn::Hardsigmoid,
        UnaryFn::Hardswish,
    ];

    /// The name a program calls it by (the one table of these names; the parser, messages and
    /// the baseline's kernel names all use it).
    pub fn name(self) -> &'static str {
        use UnaryFn::*;
        match self {
            Relu => "relu",
            Gelu => "gelu",
            GeluTanh => "gelu_tanh",
            Silu => "silu",
            Sigmoid => "sigmoid",
            Tanh => "tanh",
            Exp => "exp",
            Log => "log",
            Abs => "abs",
            Neg => "neg",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Square => "square",
            Softplus => "softplus",
            Mish => "mish",
            Hardsigmoid => "hardsigmoid",
            Hardswish => "hardswish",
        }
    }

    /// The function a program's name calls.
    pub fn from_name(name: &str) -> Option<UnaryFn> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// Reductions over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    /// Sum.
    Sum,
    /// Arithmetic mean.
    Mean,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Product.
    Prod,
    /// Index of the first maximum (i64 result).
    Argmax,
    /// Index of the first minimum (i64 result).
    Argmin,
    /// log(sum(exp(x))), computed stably.
    Logsumexp,
}

impl ReduceKind {
    /// Every reduction, in declaration order.
    pub const ALL: [ReduceKind; 8] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::Argmax,
        ReduceKind::Argmin,
        ReduceKind::Logsumexp,
    ];

    /// The name a program calls it by.
    pub fn name(self) -> &'static str {
        use ReduceKind::*;
        match self {
            Sum => "sum",
            Mean => "mean",
            Max => "max",
            Min => "min",
            Prod => "prod",
            Argmax => "argmax",
            Argmin => "argmin",
            Logsumexp => "logsumexp",
        }
    }

    /// The reduction a program's name calls.
    pub fn from_name(name: &str) -> Option<ReduceKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A built-in operation applied by a call, with its constant parameters resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A parameterless elementwise function.
    Unary(UnaryFn),
    /// `leaky_relu(x, slope=0.01)`.
    LeakyRelu {
        /// Slope for negative inputs.
        slope: f64,
    },
    /// `elu(x, alpha=1.0)`.
    Elu {
        /// Scale of the negative branch.
        alpha: f64,
    },
    /// `clamp(x, lo, hi)` or `hardtanh(x, lo=-1, hi=1)` (`hardtanh` sets `hardtanh`).
    Clamp {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
        /// Written as `hardtanh` (rendered as `F.hardtanh`).
        hardtanh: bool,
    },
    /// `sum(x, axis=-1, keepdim=false)` and friends.
    Reduce {
        /// Which reduction.
        kind: ReduceKind,
        /// Axis (negative counts from the end).
        axis: i64,
        /// Keep the reduced axis with extent 1.
        keepdim: bool,
    },
    /// `softmax(x, axis=-1)`.
    Softmax {
        /// Axis.
        axis: i64,
    },
    /// `log_softmax(x, axis=-1)`.
    LogSoftmax {
        /// Axis.
        axis: i64,
    },
    /// `cumsum(x, axis=-1)`.
    Cumsum {
        /// Axis.
        axis: i64,
    },
    /// `cumprod(x, axis=-1)`.
    Cumprod {
        /// Axis.
        axis: i64,
    },
    /// `layer_norm(x, weight?, bias?, eps=1e-5)` over the last axis (biased variance).
    LayerNorm {
        /// Added to the variance.
        eps: f64,
        /// A weight operand follows `x`.
        weight: bool,
        /// A bias operand follows (after the weight, if any).
        bias: bool,
    },
    /// `rms_norm(x, weight?, eps=1e-6)` over the last axis.
    RmsNorm {
        /// Added to the mean square.
        eps: f64,
        /// A weight operand follows `x`.
        weight: bool,
    },
    /// `l2norm(x, axis=-1, eps=1e-12)`: x / max(||x||_2, eps).
    L2Norm {
        /// Axis.
        axis: i64,
        /// Lower bound on the norm.
        eps: f64,
    },
    /// `transpose(x, a=-2, b=-1)`: swaps two axes.
    Transpose {
        /// First axis.
        a: i64,
        /// Second axis.
        b: i64,
    },
    /// `unsqueeze(x, axis)`: a new axis of extent 1 at `axis` (of the result: -1 appends), the
    /// elements unchanged (PyTorch's `unsqueeze`).
    Unsqueeze {
        /// Axis of the result.
        axis: i64,
    },
    /// `triu(x, diagonal=0)` / `tril(x, diagonal=0)`: the elements of every matrix of the last
    /// two axes on and above (below) the `diagonal`-th diagonal, zeros elsewhere (PyTorch's).
    Triangle {
        /// `triu` (keep `col - row >= diagonal`), else `tril` (`col - row <= diagonal`).
        upper: bool,
        /// Offset of the diagonal: 0 the main one, positive above it.
        diagonal: i64,
    },
    /// `reshape(x, (d0, d1, ...))`: the same elements in the same order under another shape of
    /// as many elements (PyTorch's `reshape` / `view` of a contiguous tensor); each dim a size
    /// symbol, an integer, or a sum or product of them (`C*H*W`).
    Reshape {
        /// The new shape.
        shape: Vec<Dim>,
    },
    /// `gather(x, index, axis)`: PyTorch's `torch.gather(x, axis, index)`. The result has the
    /// shape of the i64 `index`, whose other dims are those of `x`; element `[.., j, ..]` is
    /// `x[.., index[.., j, ..], ..]` along `axis` (an index outside `0 .. x.shape[axis]` is an
    /// error).
    Gather {
        /// Axis the indices pick along.
        axis: i64,
    },
    /// `flip(x, axis)`: the elements in reverse order along `axis` (PyTorch's `flip(x, [axis])`).
    Flip {
        /// Axis reversed.
        axis: i64,
    },
    /// `squeeze(x, axis)`: removes `axis`, whose extent must be 1 (PyTorch's `squeeze(dim)`
    /// leaves other extents alone, which no program relies on here).
    Squeeze {
        /// Axis removed.
        axis: i64,
    },
    /// `conv1d/conv2d/conv3d(x, weight, bias?, stride=1, padding=0, dilation=1, groups=1)`:
    /// PyTorch's cross-correlation over `x: [N, C, *spatial]` with `weight: [F, C/groups,
    /// *kernel]`, giving `[N, F, *out]`, `out = (L + 2*padding - dilation*(k - 1) - 1) // stride
    /// + 1` per spatial axis. Transposed (`conv_transpose1d/2d/3d(x, weight, bias?, stride=1,
    /// padding=0, output_padding=0, groups=1, dilation=1)`): the gradient of that convolution,
    /// `weight: [C, F/groups, *kernel]`, `out = (L - 1)*stride - 2*padding + dilation*(k - 1) +
    /// output_padding + 1`.
    Conv {
        /// `conv_transpose*d`.
        transposed: bool,
        /// Extra length on one side of a transposed convolution's output (zeros otherwise).
        output_padding: Vec<usize>,
        /// Spatial axes (1, 2 or 3).
        dims: usize,
        /// Per spatial axis.
        stride: Vec<usize>,
        /// Zeros on both sides, per spatial axis.
        padding: Vec<usize>,
        /// Per spatial axis.
        dilation: Vec<usize>,
        /// Channel groups.
        groups: usize,
        /// A bias operand `[F]` follows the weight.
        bias: bool,
    },
    /// `group_norm(x, groups, weight?, bias?, eps=1e-5)`, `batch_norm(x, weight?, bias?,
    /// eps=1e-5)` and `instance_norm(x, weight?, bias?, eps=1e-5)` over `x: [N, C, *]`:
    /// statistics (mean, biased variance) per sample and group of channels, per channel over
    /// the batch (training mode), or per sample and channel; weight and bias `[C]`.
    ChannelNorm {
        /// Which elements share statistics.
        sets: NormSets,
        /// Added to the variance.
        eps: f64,
        /// A weight operand follows `x`.
        weight: bool,
        /// A bias operand follows (after the weight, if any).
        bias: bool,
    },
    /// `max_pool1d/2d/3d(x, kernel_size, stride=kernel_size, padding=0, dilation=1)` and
    /// `avg_pool1d/2d/3d(x, kernel_size, stride=kernel_size, padding=0,
    /// count_include_pad=true)` over the trailing spatial axes of `x: [N, C, *spatial]`
    /// (`ceil_mode` is not supported).
    Pool {
        /// Max pooling (padding counts as -inf) or average pooling.
        max: bool,
        /// Spatial axes (1, 2 or 3).
        dims: usize,
        /// Window, per spatial axis.
        kernel: Vec<usize>,
        /// Per spatial axis.
        stride: Vec<usize>,
        /// Per spatial axis (at most half the window, as PyTorch requires).
        padding: Vec<usize>,
        /// Per spatial axis (1 for average pooling).
        dilation: Vec<usize>,
        /// Average pooling divides by the whole window, padding included.
        count_include_pad: bool,
    },
}

/// The sets of elements a norm over channels takes its statistics over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormSets {
    /// `batch_norm`: each channel over the whole batch.
    Batch,
    /// `group_norm(x, groups)`: each sample's channels in this many groups.
    Groups(usize),
    /// `instance_norm`: each sample's channels one by one.
    Instance,
}

impl NormSets {
    /// Channel groups per sample for `channels` channels; 0 for batch norm (the kernels' and the
    /// interpreter's convention).
    pub fn groups(self, channels: usize) -> usize {
        match self {
            NormSets::Batch => 0,
            NormSets::Groups(g) => g,
            NormSets::Instance => channels,
        }
    }
}

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A scalar literal.
    Num(f64),
    /// A tensor (input, output or intermediate) or a named constant.
    Var(String),
    /// Unary minus: `-x`.
    Neg(Box<Expr>),
    /// A binary operation.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// A built-in call; `args` are its tensor operands in order (for `layer_norm`: x, weight,
    /// bias, as given).
    Call {
        /// The operation.
        op: Op,
        /// Tensor operands.
        args: Vec<Expr>,
    },
}

/// Adds every name `e` reads (tensors and named constants) to `out`; the checker uses it for
/// "every input used" and the naive-kernel writer for the shape an expression iterates over.
pub(crate) fn collect_vars(e: &Expr, out: &mut BTreeSet<String>) {
    match e {
        Expr::Num(_) => {}
        Expr::Var(n) => {
            out.insert(n.clone());
        }
        Expr::Neg(a) => collect_vars(a, out),
        Expr::Binary(_, a, b) => {
            collect_vars(a, out);
            collect_vars(b, out);
        }
        Expr::Call { args, .. } => args.iter().for_each(|a| collect_vars(a, out)),
    }
}

/// A parsed and type-checked program.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// Inputs, in declaration order (the order of `forward`'s arguments).
    pub inputs: Vec<Decl>,
    /// Outputs, in declaration order (the order of returned values).
    pub outputs: Vec<Decl>,
    /// Named constants.
    pub consts: Vec<Const>,
    /// Statements, in order.
    pub stmts: Vec<Stmt>,
    /// Type of every tensor name: inputs, outputs and intermediates (filled by the checker).
    pub types: BTreeMap<String, TensorType>,
}

impl Program {
    /// Size symbols in order of first appearance in the declarations.
    pub fn size_symbols(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for d in self.inputs.iter().chain(&self.outputs) {
            for dim in &d.ty.shape {
                match dim {
                    Dim::Sym(s) if !out.contains(s) => out.push(s.clone()),
                    Dim::Expr(p) => p.symbols(&mut out),
                    _ => {}
                }
            }
        }
        out
    }

    /// The value of a named constant.
    pub fn const_value(&self, name: &str) -> Option<f64> {
        self.consts.iter().find(|c| c.name == name).map(|c| c.value)
    }
}

#[cfg(test)]
mod name_tests {
    use super::{ReduceKind, UnaryFn};

    #[test]
    fn every_name_parses_back_to_its_op() {
        for f in UnaryFn::ALL {
            assert_eq!(UnaryFn::from_name(f.name()), Some(f));
        }
        for k in ReduceKind::ALL {
            assert_eq!(ReduceKind::from_name(k.name()), Some(k));
        }
        assert_eq!(UnaryFn::from_name("sum"), None);
        assert_eq!(ReduceKind::from_name("relu"), None);
    }
}
