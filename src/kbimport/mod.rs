//! `kevin tasks import-kernelbench`: KernelBench problem files as kevin tasks.
//!
//! A KernelBench problem is a Python file: a `class Model(nn.Module)` whose `__init__` builds
//! layers and keeps parameters and whose `forward` computes the output, module-level size
//! constants, `get_inputs()` (the tensors `forward` takes, drawn with `torch.rand` or
//! `torch.randn`) and `get_init_inputs()` (the arguments of `__init__`). The importer reads the
//! file with a small Python parser ([`py`]), evaluates the constants and the two functions, and
//! translates `forward` statement by statement into the op language: every `torch.*`,
//! `torch.nn.functional.*`, tensor method and `nn.*` layer call it knows becomes the built-in
//! with PyTorch's semantics, the layers' parameters become inputs drawn as PyTorch initialises
//! them (`nn.Linear`: weight and bias uniform in +-1/sqrt(in_features)), and the sizes become
//! the task's GPU preset (the file's values) and a small preset (off multiples of 32, a few
//! thousand elements per tensor). No torch is needed. The task is checked by kevin's own type
//! checker before it is written.
//!
//! A problem it cannot import is refused with one line naming the construct that stopped it
//! and its line (`nn.Conv2d is not in kevin's op language`), so the refusals of a whole
//! directory say what the op language lacks.

pub(crate) mod py;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use py::{Arg, Expr, Stmt};

use crate::ops::ast::{dims_product, shape_tuple};
use crate::ops::torch::per_axis;
use crate::ops::{transposed_out, window_out, Dim, Poly, Program, Sizes};
use crate::tasks::file::{write_task_file, TaskFileText};
use crate::tasks::{InputDist, Split, Tolerance};

/// Why a problem was not imported: what stopped it, and the 1-based line where.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// 1-based line of the problem file (0: the file as a whole).
    pub line: usize,
    /// What stopped the import, in a few words.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "line {}: {}", self.line, self.reason)
        }
    }
}

/// An imported problem: the task's name and the text of its task file.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The task's name (and file stem).
    pub name: String,
    /// The task file.
    pub text: String,
}

/// The task name of a problem file: `kb<level>_<stem>`, lower case, anything but letters and
/// digits as `_` (`level1/23_Softmax.py` is `kb1_23_softmax`).
pub fn task_name(level: u8, file_stem: &str) -> String {
    let mut s = format!("kb{level}_");
    let mut last_underscore = true;
    for c in file_stem.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
            last_underscore = false;
        } else if !last_underscore {
            s.push('_');
            last_underscore = true;
        }
    }
    while s.ends_with('_') {
        s.pop();
    }
    s
}

/// Imports one problem file (`source`), named after `origin` (e.g. `level1/23_Softmax.py`).
pub fn import(origin: &str, level: u8, source: &str, split: Split) -> Result<Imported, Refusal> {
    let module = py::parse(source).map_err(|e| Refusal {
        line: e.line,
        reason: format!("Python this importer cannot read: {}", e.message),
    })?;
    let stem = origin
        .rsplit('/')
        .next()
        .unwrap_or(origin)
        .trim_end_matches(".py");
    let name = task_name(level, stem);
    // A pass that pins a symbol (grouped channels) after using it runs again with it pinned
    // from the start; pins only grow, so this ends.
    // The same for a size symbol found to be another dim written otherwise (aliases).
    let mut pinned = BTreeSet::new();
    let mut aliases = BTreeMap::new();
    loop {
        let mut m = Importer {
            pinned: pinned.clone(),
            aliases: aliases.clone(),
            ..Importer::default()
        };
        let got = m
            .module(&module)
            .and_then(|()| m.task(&name, origin, level, split));
        match got {
            Err(_) if m.pinned.len() > pinned.len() || m.aliases.len() > aliases.len() => {
                pinned = m.pinned;
                aliases = m.aliases;
            }
            Err(r) => return Err(r),
            Ok(text) => return Ok(Imported { name, text }),
        }
    }
}

/// KernelBench's correctness rule (its eval: `torch.allclose(ref, out, atol=1e-02, rtol=1e-02)`):
/// an imported problem is judged as KernelBench judges it. At its sizes a reduction over a
/// million elements in f32 differs from the fp64 reference by more than the f32 default.
pub const KERNELBENCH_TOLERANCE: Tolerance = Tolerance {
    atol: 1e-2,
    rtol: 1e-2,
};

/// A tensor of the program being written: its op-language text and symbolic shape.
#[derive(Clone, Debug)]
struct Tensor {
    text: String,
    /// How tightly `text` binds: [`ADD`], [`MUL`] or [`ATOM`] (a name, a call, a literal).
    prec: u8,
    shape: Vec<Dim>,
    /// i64 (argmax, argmin).
    int: bool,
}

/// Binding strengths of op-language text: sums, products (`*`, `/`, `@`), atoms.
const ADD: u8 = 0;
const MUL: u8 = 1;
const ATOM: u8 = 2;

impl Tensor {
    /// The text as an operand that needs at least `min`: in parentheses when it binds less.
    fn at(&self, min: u8) -> String {
        if self.prec >= min {
            self.text.clone()
        } else {
            format!("({})", self.text)
        }
    }
}

/// A draw of `get_inputs()`.
#[derive(Clone, Debug, Default)]
struct Draw {
    dims: Vec<Dim>,
    dist: InputDist,
    /// Integers (`torch.randint`) until `.float()` or `.bool()`: kevin's inputs are floats.
    int: bool,
    /// Which `torch.rand` call drew it (from 1; 0 for the others): `A + A.T` is symmetric only
    /// when both are the same draw.
    id: usize,
    /// Its last two axes swapped (`.T`).
    transposed: bool,
}

impl Draw {
    /// A constant tensor (`torch.ones`, a parameter initialised to zeros): a draw without
    /// spread, every value `value`.
    fn constant(dims: Vec<Dim>, value: f64) -> Draw {
        Draw {
            dims,
            dist: InputDist::Normal {
                mean: value,
                std: 0.0,
            },
            ..Draw::default()
        }
    }
}

/// A layer built by `__init__`.
#[derive(Clone, Debug)]
enum Layer {
    /// `nn.Linear`: the dims of its weight `[out, in]`, the bound of PyTorch's uniform
    /// initialisation (1/sqrt(in)), whether it has a bias, and (once `forward` runs) the inputs
    /// that hold them.
    Linear {
        dims: Vec<Dim>,
        bound: f64,
        bias: bool,
        params: Option<(Tensor, Option<Tensor>)>,
    },
    /// `nn.Conv1d/2d/3d`: the weight's dims `[out, in, *kernel]` (kernel extents literal), the
    /// bound of PyTorch's uniform initialisation (1/sqrt(fan_in)), whether it has a bias, the
    /// per-axis stride, padding and dilation, and (once `forward` runs) its parameter inputs.
    Conv {
        dims: Vec<Dim>,
        bound: f64,
        bias: bool,
        window: ConvWindow,
        params: Option<(Tensor, Option<Tensor>)>,
    },
    /// A layer without parameters that applies a function: its name and keyword arguments.
    Func(String, Vec<(String, Val)>),
    /// `nn.BatchNorm1d/2d/3d` with its affine parameters (PyTorch's default): `batch_norm`'s
    /// keyword arguments as [`Layer::Func`] holds them, the channels, and (once `forward` runs)
    /// the weight and bias inputs, drawn as PyTorch initialises them (ones and zeros). They are
    /// kept, not folded away, because their presence is what sends a batch norm to cuDNN in
    /// PyTorch eager, so the baseline times the module as PyTorch runs it.
    AffineNorm {
        kws: Vec<(String, Val)>,
        channels: Dim,
        params: Option<(Tensor, Tensor)>,
    },
}

/// A convolution's per-axis stride, padding and dilation.
#[derive(Clone, Debug)]
struct ConvWindow {
    transposed: bool,
    stride: Vec<usize>,
    padding: Vec<usize>,
    dilation: Vec<usize>,
    /// Zeros unless transposed.
    output_padding: Vec<usize>,
    /// Channel groups (1: none).
    groups: usize,
}

impl ConvWindow {
    /// The input and output channels of a convolution with weight dims `w`: `[out, in/groups,
    /// *k]`, transposed `[in, out/groups, *k]` (a grouped dim is literal: the channels are
    /// pinned).
    fn channels(&self, w: &[Dim]) -> (Dim, Dim) {
        let whole = |d: &Dim| match d {
            Dim::Lit(c) => Dim::Lit(c * self.groups),
            d => d.clone(),
        };
        if self.transposed {
            (w[0].clone(), whole(&w[1]))
        } else {
            (whole(&w[1]), w[0].clone())
        }
    }
}

/// A per-axis integer argument of a convolution or pooling (`3`, `(3, 5)`, absent), checked
/// against the number of spatial axes and its lower bound.
fn axes_arg(
    v: Option<Val>,
    dims: usize,
    default: Option<&[usize]>,
    what: &str,
    min: i64,
    line: usize,
) -> Result<Vec<usize>, Refusal> {
    let ints: Vec<i64> = match v {
        None | Some(Val::None) => match default {
            Some(d) => return Ok(d.to_vec()),
            None => return refuse(line, format!("no `{what}`")),
        },
        Some(Val::Int(n, _)) => vec![n; dims],
        Some(Val::Seq(items)) if items.len() == dims => items
            .iter()
            .map(|i| match i {
                Val::Int(n, _) => Ok(*n),
                other => refuse(line, format!("`{what}` holding {}", other.what())),
            })
            .collect::<Result<_, _>>()?,
        Some(Val::Str(s)) if what == "padding" && s == "valid" => vec![0; dims],
        Some(other) => {
            return refuse(
                line,
                format!("`{what}` that is {} (one or {dims} integers)", other.what()),
            )
        }
    };
    if let Some(bad) = ints.iter().find(|&&n| n < min) {
        return refuse(line, format!("`{what}` of {bad}"));
    }
    Ok(ints.into_iter().map(|n| n as usize).collect())
}

#[derive(Clone, Debug)]
enum Val {
    /// An integer and the size it is the value of: a module-level name, or sizes combined by
    /// `+`, `-`, `*` and `//` (`D * stride` is `2*D` once `D` is a tensor's dim).
    Int(i64, Option<Poly>),
    Float(f64),
    Bool(bool),
    Str(String),
    None,
    Seq(Vec<Val>),
    Tensor(Tensor),
    Draw(Draw),
    Layer(Layer),
    /// A dotted name not yet called (`torch.relu`, `math.pi`).
    Path(String),
    /// A method of a value not yet called (`x.sum`, `torch.rand(n).float`).
    Method(String, Box<Val>),
}

impl Val {
    fn num(&self) -> Option<f64> {
        match self {
            Val::Int(v, _) => Some(*v as f64),
            Val::Float(v) => Some(*v),
            Val::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Val::Int(..) => "an integer",
            Val::Float(_) => "a float",
            Val::Bool(_) => "a bool",
            Val::Str(_) => "a string",
            Val::None => "None",
            Val::Seq(_) => "a tuple or list",
            Val::Tensor(_) => "a tensor",
            Val::Draw(_) => "a random tensor",
            Val::Layer(_) => "a layer",
            Val::Path(_) | Val::Method(..) => "a function",
        }
    }
}

/// A number as the op language writes it (always with a point or an exponent).
fn lit(v: f64) -> String {
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E']) || !v.is_finite() {
        s
    } else {
        format!("{s}.0")
    }
}

fn refuse<T>(line: usize, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        line,
        reason: reason.into(),
    })
}

/// The layer classes of `torch.nn` that apply a function without parameters: the functional
/// name and the names of their positional arguments.
const FUNC_LAYERS: [(&str, &str, &[&str]); 24] = [
    (
        "CrossEntropyLoss",
        "cross_entropy",
        &[
            "weight",
            "size_average",
            "ignore_index",
            "reduce",
            "reduction",
            "label_smoothing",
        ],
    ),
    (
        "NLLLoss",
        "nll_loss",
        &[
            "weight",
            "size_average",
            "ignore_index",
            "reduce",
            "reduction",
        ],
    ),
    (
        "MSELoss",
        "mse_loss",
        &["size_average", "reduce", "reduction"],
    ),
    (
        "L1Loss",
        "l1_loss",
        &["size_average", "reduce", "reduction"],
    ),
    (
        "SmoothL1Loss",
        "smooth_l1_loss",
        &["size_average", "reduce", "reduction", "beta"],
    ),
    ("HuberLoss", "huber_loss", &["reduction", "delta"]),
    (
        "TripletMarginLoss",
        "triplet_margin_loss",
        &[
            "margin",
            "p",
            "eps",
            "swap",
            "size_average",
            "reduce",
            "reduction",
        ],
    ),
    ("ReLU", "relu", &[]),
    ("Sigmoid", "sigmoid", &[]),
    ("Tanh", "tanh", &[]),
    ("GELU", "gelu", &[]),
    ("SiLU", "silu", &[]),
    ("Mish", "mish", &[]),
    ("Softplus", "softplus", &["beta", "threshold"]),
    ("Hardsigmoid", "hardsigmoid", &[]),
    ("Hardswish", "hardswish", &[]),
    ("ELU", "elu", &["alpha"]),
    ("SELU", "selu", &[]),
    ("LeakyReLU", "leaky_relu", &["negative_slope"]),
    ("Hardtanh", "hardtanh", &["min_val", "max_val"]),
    ("Softmax", "softmax", &["dim"]),
    ("LogSoftmax", "log_softmax", &["dim"]),
    ("Identity", "identity", &[]),
    ("Softsign", "softsign", &[]),
];

/// Functions of one tensor with the same name in the op language.
const UNARY: [&str; 14] = [
    "relu",
    "sigmoid",
    "tanh",
    "exp",
    "log",
    "abs",
    "sqrt",
    "rsqrt",
    "square",
    "silu",
    "mish",
    "hardsigmoid",
    "hardswish",
    "neg",
];

/// The other functions and methods [`Importer::function`] translates (on a tensor).
const KNOWN: [&str; 67] = [
    "identity",
    "cross_entropy",
    "nll_loss",
    "gather",
    "flip",
    "flatten",
    "reshape",
    "triu",
    "tril",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "triplet_margin_loss",
    "squeeze",
    "unsqueeze",
    "einsum",
    "scaled_dot_product_attention",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "contiguous",
    "float",
    "clone",
    "detach",
    "size",
    "negative",
    "gelu",
    "softplus",
    "elu",
    "selu",
    "softsign",
    "leaky_relu",
    "hardtanh",
    "clamp",
    "clip",
    "pow",
    "add",
    "sub",
    "mul",
    "div",
    "multiply",
    "subtract",
    "divide",
    "maximum",
    "minimum",
    "matmul",
    "mm",
    "bmm",
    "t",
    "transpose",
    "swapaxes",
    "softmax",
    "log_softmax",
    "cumsum",
    "cumprod",
    "normalize",
    "sum",
    "mean",
    "amax",
    "amin",
    "prod",
    "logsumexp",
    "norm",
];

#[derive(Default)]
struct Importer {
    /// Module-level names.
    globals: BTreeMap<String, Val>,
    /// Functions by name.
    defs: BTreeMap<String, (Vec<py::Param>, Vec<Stmt>, usize)>,
    /// `class Model`'s methods.
    methods: BTreeMap<String, (Vec<py::Param>, Vec<Stmt>, usize)>,
    model_line: usize,
    /// Docstring of `Model` (its first line goes in the description).
    doc: Option<String>,
    /// The program: inputs (name, dims, distribution) and statements.
    inputs: Vec<(String, Vec<Dim>, InputDist)>,
    /// Inputs drawn as integers (`torch.randint` left as it is): i64, indices alone.
    int_inputs: BTreeSet<String>,
    stmts: Vec<String>,
    /// Values of the size symbols (the file's sizes).
    sizes: Sizes,
    /// Counter of intermediates.
    temps: usize,
    /// Size symbols that must equal a dim written otherwise (`nn.LayerNorm(out_channels)` on a
    /// last dim `2*W`): equal at the file's sizes, kept equal in the small preset.
    ties: Vec<(String, Dim)>,
    /// Size symbols written as the file's numbers: the channels of a grouped convolution, and
    /// every size written as a number in `__init__` (a layer's `in_channels=3`: the model's own,
    /// which no preset may change, since a cross-check builds the model with the preset's
    /// `get_init_inputs` and loads the task's parameters into it). A pass that pins a symbol
    /// and then fails runs again with it pinned from the start.
    pinned: BTreeSet<String>,
    /// Running `__init__`: a number that becomes a dim there is pinned.
    in_init: bool,
    /// Size symbols written as another dim: two sizes that PyTorch broadcasts together because
    /// they are equal at the file's sizes (`D32` and `2*D`), one written as the other so that
    /// every preset keeps them equal.
    aliases: BTreeMap<String, Dim>,
    /// `torch.rand` and `torch.randn` calls so far (a draw's `id`).
    draws: usize,
}

/// The names a function body sees: its parameters and locals (`self.x` as `"self.x"`).
#[derive(Default)]
struct Frame {
    locals: BTreeMap<String, Val>,
}

impl Importer {
    fn module(&mut self, module: &[Stmt]) -> Result<(), Refusal> {
        for s in module {
            match s {
                Stmt::Assign {
                    targets,
                    value,
                    line,
                } => {
                    let mut f = Frame::default();
                    let v = self.eval(&mut f, value, *line)?;
                    for t in targets {
                        self.global(t, v.clone(), *line)?;
                    }
                }
                Stmt::Def {
                    name,
                    params,
                    body,
                    line,
                } => {
                    self.defs
                        .insert(name.clone(), (params.clone(), body.clone(), *line));
                }
                Stmt::Class { name, body, line } if name == "Model" => {
                    self.model_line = *line;
                    for m in body {
                        match m {
                            Stmt::Def {
                                name,
                                params,
                                body,
                                line,
                            } => {
                                self.methods
                                    .insert(name.clone(), (params.clone(), body.clone(), *line));
                            }
                            Stmt::Expr(Expr::Str(doc), _) if self.doc.is_none() => {
                                self.doc = Some(doc.clone());
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if self.model_line == 0 {
            return refuse(0, "no `class Model`");
        }
        Ok(())
    }

    /// A module-level assignment (`n = 4096`, `height, width = 128, 128`): integers become
    /// size symbols named after their target.
    fn global(&mut self, target: &Expr, v: Val, line: usize) -> Result<(), Refusal> {
        match (target, v) {
            (Expr::Name(n), v) => {
                let v = name_ints(v, n);
                self.globals.insert(n.clone(), v);
                Ok(())
            }
            (Expr::Tuple(ts), Val::Seq(vs)) if ts.len() == vs.len() => {
                for (t, v) in ts.iter().zip(vs) {
                    self.global(t, v, line)?;
                }
                Ok(())
            }
            (_, v) => refuse(line, format!("a module-level assignment of {}", v.what())),
        }
    }

    /// Calls a module-level function without arguments (`get_inputs`): its returned value.
    fn call_global(&mut self, name: &str) -> Result<Val, Refusal> {
        let Some((_, body, line)) = self.defs.get(name).cloned() else {
            return refuse(0, format!("no `{name}()`"));
        };
        let mut f = Frame::default();
        match self.run(&mut f, &body)? {
            Some(v) => Ok(v),
            None => refuse(line, format!("`{name}()` returns nothing")),
        }
    }

    /// Runs statements; the value of the first `return`.
    fn run(&mut self, f: &mut Frame, body: &[Stmt]) -> Result<Option<Val>, Refusal> {
        for s in body {
            match s {
                Stmt::Assign {
                    targets,
                    value,
                    line,
                } => {
                    let v = self.eval(f, value, *line)?;
                    for t in targets {
                        self.assign(f, t, v.clone(), *line)?;
                    }
                }
                Stmt::AugAssign {
                    target,
                    op,
                    value,
                    line,
                } => {
                    let cur = self.eval(f, target, *line)?;
                    let rhs = self.eval(f, value, *line)?;
                    let v = self.binary(op, cur, rhs, *line)?;
                    self.assign(f, target, v, *line)?;
                }
                Stmt::Return(v, line) => {
                    return Ok(Some(match v {
                        Some(e) => self.eval(f, e, *line)?,
                        None => Val::None,
                    }));
                }
                Stmt::Expr(Expr::Str(_), _) | Stmt::Skip => {}
                Stmt::Expr(e, line) => {
                    // `super().__init__()` and docstrings do nothing; any other call would.
                    if !is_super_init(e) {
                        return refuse(*line, "an expression statement with effects");
                    }
                }
                Stmt::Other(kw, line) => {
                    return refuse(*line, format!("a `{kw}` statement"));
                }
                Stmt::Def { line, .. } | Stmt::Class { line, .. } => {
                    return refuse(*line, "a nested definition");
                }
            }
        }
        Ok(None)
    }

    fn assign(&mut self, f: &mut Frame, target: &Expr, v: Val, line: usize) -> Result<(), Refusal> {
        match target {
            Expr::Name(n) => {
                let v = match v {
                    // A tensor computed in `forward` becomes a statement of the program.
                    Val::Tensor(t)
                        if t.text.contains(|c: char| !c.is_alphanumeric() && c != '_') =>
                    {
                        Val::Tensor(self.statement(n, t))
                    }
                    v => v,
                };
                f.locals.insert(n.clone(), v);
                Ok(())
            }
            Expr::Attr(obj, attr) if matches!(obj.as_ref(), Expr::Name(s) if s == "self") => {
                let v = match v {
                    Val::Draw(d) => Val::Tensor(self.parameter(attr, d)),
                    v => v,
                };
                f.locals.insert(format!("self.{attr}"), v);
                Ok(())
            }
            Expr::Tuple(items) => match v {
                Val::Seq(vals) if vals.len() == items.len() => {
                    for (t, v) in items.iter().zip(vals) {
                        self.assign(f, t, v, line)?;
                    }
                    Ok(())
                }
                other => refuse(line, format!("unpacking {}", other.what())),
            },
            _ => refuse(line, "an assignment to an index or attribute"),
        }
    }

    /// `t` itself when it is a name, else a statement of it (`named` with a number): a tensor
    /// an expression reads more than once.
    fn named(&mut self, name: &str, t: Tensor) -> Tensor {
        if t.prec == ATOM && t.text.chars().all(|c| c.is_alphanumeric() || c == '_') {
            t
        } else {
            self.statement(name, t)
        }
    }

    /// `name = t` as a statement `nameK = text` (every assignment a new name: the op language
    /// assigns each name once); the tensor that reads it.
    fn statement(&mut self, name: &str, t: Tensor) -> Tensor {
        self.temps += 1;
        let base: String = name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let target = format!(
            "{}{}",
            if base.is_empty() { "t" } else { &base },
            self.temps
        );
        self.stmts.push(format!("{target} = {}", t.text));
        Tensor {
            text: target,
            prec: ATOM,
            ..t
        }
    }

    /// A tensor's dims as Python sees them (`x.shape`, `x.size()`): their values, each naming
    /// its size symbol.
    fn shape_vals(&self, t: &Tensor) -> Vec<Val> {
        self.dim_vals(&t.shape)
    }

    /// Dims as Python sees them: their values, each naming its size symbol.
    fn dim_vals(&self, dims: &[Dim]) -> Vec<Val> {
        dims.iter()
            .map(|d| match d {
                Dim::Lit(v) => Val::Int(*v as i64, None),
                Dim::Sym(s) => Val::Int(
                    self.sizes.get(s).copied().unwrap_or(0) as i64,
                    Some(Poly::sym(s)),
                ),
                Dim::Expr(p) => {
                    Val::Int(d.resolve(&self.sizes).unwrap_or(0) as i64, Some(p.clone()))
                }
            })
            .collect()
    }

    /// An input for a parameter of the model drawn as `d`.
    fn parameter(&mut self, name: &str, d: Draw) -> Tensor {
        let name = self.fresh_input(name);
        self.inputs.push((name.clone(), d.dims.clone(), d.dist));
        if d.int {
            self.int_inputs.insert(name.clone());
        }
        Tensor {
            text: name,
            prec: ATOM,
            shape: d.dims,
            int: d.int,
        }
    }

    /// A layer's weight and optional bias as inputs `<attr>_weight` and `<attr>_bias`, drawn
    /// as PyTorch initialises them: uniform in +-`bound`.
    fn layer_params(
        &mut self,
        attr: &str,
        dims: &[Dim],
        bias_dim: &Dim,
        bound: f64,
        bias: bool,
    ) -> (Tensor, Option<Tensor>) {
        let dist = InputDist::Uniform {
            lo: -bound,
            hi: bound,
        };
        let draw = |dims: Vec<Dim>| Draw {
            dims,
            dist,
            ..Draw::default()
        };
        let w = self.parameter(&format!("{attr}_weight"), draw(dims.to_vec()));
        let b = bias.then(|| self.parameter(&format!("{attr}_bias"), draw(vec![bias_dim.clone()])));
        (w, b)
    }

    /// `nn.LayerNorm(n)` normalises the last dims, which PyTorch requires to be its sizes: dim
    /// `at` of `shape` against size `n`, refused when they differ at the file's sizes; when
    /// they are equal but written otherwise, the two are tied so that the small preset keeps
    /// them equal.
    fn tie_dim(&mut self, shape: &[Dim], at: usize, n: Val, line: usize) -> Result<(), Refusal> {
        let (Some(last), Val::Int(n, size)) = (shape.get(at), n) else {
            return refuse(line, "nn.LayerNorm without an integer normalized_shape");
        };
        let name = sym_name(&size);
        if let (Some(p), None) = (&size, &name) {
            if *last == Dim::from_poly(p.clone()) {
                return Ok(());
            }
        }
        let which = if at + 1 == shape.len() {
            "last dim".to_string()
        } else {
            format!("dim {at}")
        };
        let at_file = last.resolve(&self.sizes);
        if at_file != usize::try_from(n).ok() {
            return refuse(
                line,
                format!(
                    "nn.LayerNorm({n}) on an input whose {which} {last} is {} at the file's sizes",
                    at_file.map_or("not positive".to_string(), |v| v.to_string())
                ),
            );
        }
        match (name, last) {
            (Some(s), Dim::Sym(l)) if s == *l => {}
            (Some(s), _) if !mentions(last, &s) => self.ties.push((s, last.clone())),
            (None, Dim::Lit(_)) => {}
            (None, Dim::Sym(l)) => self.ties.push((l.clone(), Dim::Lit(n as usize))),
            _ => {
                return refuse(
                    line,
                    format!(
                        "nn.LayerNorm({n}) on a {which} written {last}, which other sizes change"
                    ),
                )
            }
        }
        Ok(())
    }

    /// Layer normalisation over the last `k` dims of `x` (no affine parameters: PyTorch's
    /// are ones and zeros until trained) as statements: the mean and the biased variance as
    /// nested means that keep their dims.
    fn layer_norm_dims(
        &mut self,
        x: Tensor,
        k: usize,
        eps: f64,
        line: usize,
    ) -> Result<Val, Refusal> {
        let r = x.shape.len() as i64;
        let axes: Vec<i64> = (r - k as i64..r).collect();
        let x = self.named("ln_x", x);
        let mean = self.reduce("mean", x.clone(), Some(axes.clone()), true, line)?;
        let centered = self.binary("-", Val::Tensor(x), mean, line)?;
        let centered = self.operand(&centered, line)?;
        let centered = self.statement("ln_centered", centered);
        let square = self.binary(
            "*",
            Val::Tensor(centered.clone()),
            Val::Tensor(centered.clone()),
            line,
        )?;
        let square = self.operand(&square, line)?;
        let var = self.reduce("mean", square, Some(axes), true, line)?;
        let shifted = self.binary("+", var, Val::Float(eps), line)?;
        let inv = self.function("rsqrt", vec![shifted], Vec::new(), line)?;
        self.binary("*", Val::Tensor(centered), inv, line)
    }

    /// `1 / sqrt(d)` for a tensor's last dim `d` (attention's default scale). A number in the
    /// program cannot follow a size symbol, so the symbol is pinned to the file's value: a
    /// pass that pins it after using it stops here and runs again with it pinned from the start.
    fn inverse_sqrt_dim(&mut self, d: Option<&Dim>, line: usize) -> Result<f64, Refusal> {
        match d {
            Some(Dim::Lit(n)) => Ok(1.0 / (*n as f64).sqrt()),
            Some(Dim::Sym(s)) => {
                self.pinned.insert(s.clone());
                refuse(line, format!("the size `{s}` is pinned (it sets a scale)"))
            }
            _ => refuse(line, "a scale set by a computed dim"),
        }
    }

    /// `torch.einsum(spec, a, b)` when it is a matrix product: one index contracted, the last
    /// of `a` and the second last (or only) of `b`, either maybe transposed; the other indices
    /// of `a` lead the output (or are batch dims that `b` shares) and `b`'s last follows.
    fn einsum(&mut self, pos: Vec<Val>, line: usize) -> Result<Val, Refusal> {
        let (Some(Val::Str(spec)), Some(a @ Val::Tensor(_)), Some(b @ Val::Tensor(_)), 3) =
            (pos.first(), pos.get(1), pos.get(2), pos.len())
        else {
            return refuse(line, "`einsum` other than of a spec and two tensors");
        };
        let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
        let not_product = || Refusal {
            line,
            reason: format!("`einsum` \"{spec}\" is not a matrix product"),
        };
        let (ins, out) = spec.split_once("->").ok_or_else(not_product)?;
        let (ia, ib) = ins.split_once(',').ok_or_else(not_product)?;
        let (ia, ib, out): (Vec<char>, Vec<char>, Vec<char>) = (
            ia.chars().collect(),
            ib.chars().collect(),
            out.chars().collect(),
        );
        let (a, b) = (self.operand(a, line)?, self.operand(b, line)?);
        if ia.len() != a.shape.len() || ib.len() != b.shape.len() {
            return refuse(
                line,
                format!("`einsum` \"{spec}\" on tensors of other ranks"),
            );
        }
        let swap = |v: &[char], yes: bool| {
            let mut v = v.to_vec();
            let r = v.len();
            if yes && r >= 2 {
                v.swap(r - 2, r - 1);
            }
            v
        };
        for ta in [false, true] {
            for tb in [false, true] {
                let (la, lb) = (swap(&ia, ta), swap(&ib, tb));
                // Indices as a matrix product gives them, and each index bound to one size.
                let Some(got) = crate::ops::matmul_shape(&la, &lb) else {
                    continue;
                };
                let contracted = la.last().copied();
                if got != out || contracted.is_some_and(|c| out.contains(&c)) {
                    continue;
                }
                let a = if ta {
                    self.last_two_swapped(a, line)?
                } else {
                    a
                };
                let b = if tb {
                    self.last_two_swapped(b, line)?
                } else {
                    b
                };
                return self.matmul(a, b, line);
            }
        }
        Err(not_product())
    }

    /// Shapes `a` and `b` that do not broadcast as written: where two dims differ but are equal
    /// at the file's sizes (as PyTorch saw them), a size symbol of one becomes an alias of the
    /// other and the import runs again (this pass stops here); otherwise the refusal.
    fn tie_broadcast(&mut self, a: &[Dim], b: &[Dim], line: usize) -> Result<Val, Refusal> {
        let n = a.len().max(b.len());
        let mut tied = false;
        for i in 0..n {
            let (Some(x), Some(y)) = (
                (i + a.len()).checked_sub(n).map(|j| &a[j]),
                (i + b.len()).checked_sub(n).map(|j| &b[j]),
            ) else {
                continue;
            };
            let equal = x.resolve(&self.sizes).filter(|&v| v > 1) == y.resolve(&self.sizes);
            if x == y || !equal {
                continue;
            }
            let (sym, other) = match (x, y) {
                (_, Dim::Sym(s)) if !mentions(x, s) => (s, x),
                (Dim::Sym(s), _) if !mentions(y, s) => (s, y),
                _ => continue,
            };
            self.aliases.insert(sym.clone(), other.clone());
            tied = true;
        }
        let what = format!("shapes {} and {} do not broadcast", show(a), show(b));
        if tied {
            return refuse(
                line,
                format!("{what} as written (equal at the file's sizes: tied)"),
            );
        }
        refuse(line, what)
    }

    /// PyTorch's regression and metric losses as compositions: `mse_loss`, `l1_loss`,
    /// `smooth_l1_loss` (beta), `huber_loss` (delta) of `x` and a target, and
    /// `triplet_margin_loss` of an anchor `x`, a positive and a negative (p = 2, the distance
    /// `||a - b + eps||`); reduced by their mean (the default), sum, or not.
    fn loss(
        &mut self,
        name: &str,
        x: Tensor,
        pos: &[Val],
        kw: &[(String, Val)],
        line: usize,
    ) -> Result<Val, Refusal> {
        let key = |k: &str| kw.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let num = |k: &str, default: f64| -> Result<f64, Refusal> {
            match key(k) {
                None | Some(Val::None) => Ok(default),
                Some(v) => v.num().ok_or_else(|| Refusal {
                    line,
                    reason: format!("`{name}`'s `{k}` is {}, not a number", v.what()),
                }),
            }
        };
        for old in ["size_average", "reduce"] {
            if !matches!(key(old), None | Some(Val::None)) {
                return refuse(line, format!("`{name}` with the deprecated `{old}`"));
            }
        }
        let reduction = match key("reduction") {
            None => "mean".to_string(),
            Some(Val::Str(r)) if ["mean", "sum", "none"].contains(&r.as_str()) => r,
            Some(v) => return refuse(line, format!("`{name}` with reduction {}", v.what())),
        };
        let tensor_arg = |i: usize, k: &str| match key(k).or_else(|| pos.get(i).cloned()) {
            Some(v @ Val::Tensor(_)) => Ok(v),
            other => refuse(
                line,
                format!(
                    "`{name}`'s {k} is {}",
                    other.as_ref().map_or("missing", Val::what)
                ),
            ),
        };
        let each = if name == "cross_entropy" || name == "nll_loss" {
            let target = match tensor_arg(1, "target")? {
                Val::Tensor(t) => t,
                _ => unreachable!("tensor_arg gives tensors"),
            };
            self.class_loss(
                name,
                x,
                target,
                key("weight"),
                num("ignore_index", -100.0)?,
                num("label_smoothing", 0.0)?,
                line,
            )?
        } else if name == "triplet_margin_loss" {
            if num("p", 2.0)? != 2.0 || matches!(key("swap"), Some(Val::Bool(true))) {
                return refuse(line, "`triplet_margin_loss` other than p=2 without swap");
            }
            let (margin, eps) = (num("margin", 1.0)?, num("eps", 1e-6)?);
            let anchor = self.named("anchor", x);
            let mut dist = Vec::new();
            for (i, k) in [(1, "positive"), (2, "negative")] {
                let other = tensor_arg(i, k)?;
                let d = self.binary("-", Val::Tensor(anchor.clone()), other, line)?;
                let d = self.binary("+", d, Val::Float(eps), line)?;
                let d = self.operand(&d, line)?;
                let d = self.statement("diff", d);
                let sq = self.binary("*", Val::Tensor(d.clone()), Val::Tensor(d), line)?;
                let sq = self.operand(&sq, line)?;
                let sum = self.reduce("sum", sq, Some(vec![-1]), false, line)?;
                dist.push(self.function("sqrt", vec![sum], Vec::new(), line)?);
            }
            let [dp, dn] = <[Val; 2]>::try_from(dist).map_err(|_| Refusal {
                line,
                reason: "two distances".into(),
            })?;
            let gap = self.binary("-", dp, dn, line)?;
            let gap = self.binary("+", gap, Val::Float(margin), line)?;
            self.function("maximum", vec![gap, Val::Float(0.0)], Vec::new(), line)?
        } else {
            let target = tensor_arg(1, "target")?;
            let d = self.binary("-", Val::Tensor(x), target, line)?;
            let d = self.operand(&d, line)?;
            let d = self.statement("diff", d);
            if name == "mse_loss" {
                self.binary("*", Val::Tensor(d.clone()), Val::Tensor(d), line)?
            } else {
                let abs = self.function("abs", vec![Val::Tensor(d)], Vec::new(), line)?;
                if name == "l1_loss" {
                    abs
                } else {
                    // 0.5 m^2 / beta + (|d| - m) with m = min(|d|, beta) is PyTorch's two
                    // branches in one expression; huber_loss is delta times smooth_l1 at
                    // beta = delta.
                    let huber = name == "huber_loss";
                    let beta = if huber {
                        num("delta", 1.0)?
                    } else {
                        num("beta", 1.0)?
                    };
                    if beta <= 0.0 {
                        return refuse(line, format!("`{name}` with beta or delta <= 0"));
                    }
                    let abs = self.operand(&abs, line)?;
                    let abs = self.statement("absdiff", abs);
                    let m = self.function(
                        "minimum",
                        vec![Val::Tensor(abs.clone()), Val::Float(beta)],
                        Vec::new(),
                        line,
                    )?;
                    let m = self.operand(&m, line)?;
                    let m = self.statement("clipped", m);
                    let sq =
                        self.binary("*", Val::Tensor(m.clone()), Val::Tensor(m.clone()), line)?;
                    let quad = self.binary(
                        "*",
                        sq,
                        Val::Float(if huber { 0.5 } else { 0.5 / beta }),
                        line,
                    )?;
                    let lin = self.binary("-", Val::Tensor(abs), Val::Tensor(m), line)?;
                    let lin = if huber {
                        self.binary("*", lin, Val::Float(beta), line)?
                    } else {
                        lin
                    };
                    self.binary("+", quad, lin, line)?
                }
            }
        };
        if reduction == "none" {
            return Ok(each);
        }
        let each = self.operand(&each, line)?;
        let kind = if reduction == "sum" { "sum" } else { "mean" };
        self.reduce(kind, each, None, false, line)
    }

    /// `cross_entropy` (`log_softmax` first) or `nll_loss` of `x: [batch, classes]` and i64
    /// labels `[batch]`, per sample: `-x[i, target[i]]` as a gather. The classes are pinned to
    /// the file's number (a pass that pins them runs again), so that every preset draws the
    /// labels below it; labels drawn outside `0 .. classes` are refused.
    #[allow(clippy::too_many_arguments)]
    fn class_loss(
        &mut self,
        name: &str,
        x: Tensor,
        target: Tensor,
        weight: Option<Val>,
        ignore_index: f64,
        smoothing: f64,
        line: usize,
    ) -> Result<Val, Refusal> {
        if !matches!(weight, None | Some(Val::None)) || smoothing != 0.0 {
            return refuse(
                line,
                format!("`{name}` with class weights or label smoothing"),
            );
        }
        if x.shape.len() != 2 || target.shape.len() != 1 || !target.int {
            return refuse(
                line,
                format!(
                    "`{name}` of {} by {} (kevin takes [batch, classes] scores and i64 labels [batch])",
                    show(&x.shape),
                    show(&target.shape)
                ),
            );
        }
        let classes = match &x.shape[1] {
            Dim::Lit(n) => *n,
            Dim::Sym(s) if !self.pinned.contains(s) => {
                self.pinned.insert(s.clone());
                return refuse(
                    line,
                    format!("the classes `{s}` are pinned (labels are drawn below them)"),
                );
            }
            d => return refuse(line, format!("`{name}` over {d} classes")),
        };
        let drawn = self
            .inputs
            .iter()
            .find(|(n, _, _)| *n == target.text)
            .map(|(_, _, d)| *d);
        let in_range = match drawn {
            Some(InputDist::Grid { lo, step, count }) => {
                let hi = lo + step * f64::from(count.max(1) - 1);
                lo.min(hi) >= 0.0 && lo.max(hi) < classes as f64 && ignore_index < 0.0
            }
            _ => false,
        };
        if !in_range {
            return refuse(
                line,
                format!("`{name}`'s labels are not drawn in 0 .. {classes} (or an ignore_index is among them)"),
            );
        }
        let scores = if name == "cross_entropy" {
            self.named(
                "logp",
                Tensor {
                    text: format!("log_softmax({}, axis=1)", x.text),
                    prec: ATOM,
                    ..x
                },
            )
        } else {
            self.named("logp", x)
        };
        Ok(Val::Tensor(Tensor {
            text: format!(
                "neg(squeeze(gather({}, unsqueeze({}, axis=1), axis=1), axis=1))",
                scores.text, target.text
            ),
            prec: ATOM,
            shape: target.shape,
            int: false,
        }))
    }

    /// A grouped convolution's input and output channels (`Val::Int`s) are pinned to the file's
    /// numbers, which the groups must divide.
    fn pin_channels(
        &mut self,
        channels: &[&Val],
        groups: usize,
        layer: &str,
        line: usize,
    ) -> Result<(), Refusal> {
        for c in channels {
            let Val::Int(n, sym) = c else {
                return refuse(
                    line,
                    format!("nn.{layer} with channels that are {}", c.what()),
                );
            };
            if *n < 1 || *n as usize % groups != 0 {
                return refuse(
                    line,
                    format!("nn.{layer}: {n} channels are not divisible by groups {groups}"),
                );
            }
            self.pinned
                .insert(sym_name(sym).unwrap_or_else(|| format!("D{n}")));
        }
        Ok(())
    }

    fn fresh_input(&self, base: &str) -> String {
        let taken = |n: &str| {
            crate::ops::is_reserved(n)
                || self.inputs.iter().any(|(i, _, _)| i == n)
                || self.sizes.contains_key(n)
                || self.globals.contains_key(n)
        };
        if !taken(base) {
            return base.to_string();
        }
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| !taken(n))
            .unwrap_or_default()
    }

    /// The dims of a shape given as values (`torch.rand(batch, *shape)`), recording sizes.
    fn dims(&mut self, vals: &[Val], line: usize) -> Result<Vec<Dim>, Refusal> {
        let mut out = Vec::new();
        for v in vals {
            match v {
                Val::Seq(inner) => out.extend(self.dims(inner, line)?),
                Val::Int(1, _) => out.push(Dim::Lit(1)),
                Val::Int(n, sym) if *n > 1 => {
                    if let Some(d) = self.expr_dim(sym.as_ref(), *n) {
                        out.push(d);
                        continue;
                    }
                    let sym = sym_name(sym);
                    let s = sym.clone().unwrap_or_else(|| format!("D{n}"));
                    if self.in_init && sym.is_none() && self.pinned.insert(s.clone()) {
                        if self.sizes.contains_key(&s) {
                            // Used as a symbol before this pass pinned it: run again.
                            return refuse(
                                line,
                                format!("the size `{s}` is pinned (a number in __init__)"),
                            );
                        }
                    }
                    if self.pinned.contains(&s) {
                        out.push(Dim::Lit(*n as usize));
                        continue;
                    }
                    if let Some(d) = self.aliases.get(&s) {
                        if let Dim::Sym(t) = d {
                            self.sizes.insert(t.clone(), *n as usize);
                        }
                        out.push(d.clone());
                        continue;
                    }
                    if let Some(old) = self.sizes.insert(s.clone(), *n as usize) {
                        if old != *n as usize {
                            return refuse(line, format!("size `{s}` is both {old} and {n}"));
                        }
                    }
                    out.push(Dim::Sym(s));
                }
                other => return refuse(line, format!("a dimension that is {}", other.what())),
            }
        }
        Ok(out)
    }

    /// An integer's size as an operand of size arithmetic: a tensor's dim symbol stays a
    /// symbol (and so do sums and products of them); any other number (a stride, a kernel
    /// size, a name never used as a dim) is its value.
    fn size_poly(&self, v: &Val) -> Poly {
        match v {
            Val::Int(n, Some(p)) => {
                let mut syms = Vec::new();
                p.symbols(&mut syms);
                let known = syms.iter().all(|s| {
                    self.sizes.contains_key(s)
                        && !self.pinned.contains(s)
                        && !self.aliases.contains_key(s)
                });
                if known && !syms.is_empty() {
                    p.clone()
                } else {
                    Poly::lit(*n)
                }
            }
            v => Poly::lit(v.num().map_or(0, |x| x as i64)),
        }
    }

    /// The dim of an integer computed from a tensor's dims (`D * stride`, `2 * H`), when it
    /// is one: an expression over size symbols that still holds at the file's sizes.
    fn expr_dim(&self, size: Option<&Poly>, n: i64) -> Option<Dim> {
        let p = size?;
        if p.as_sym().is_some() {
            return None;
        }
        let p = self.size_poly(&Val::Int(n, Some(p.clone())));
        (p.constant().is_none() && p.eval(&self.sizes) == Some(n)).then(|| Dim::from_poly(p))
    }

    fn eval(&mut self, f: &mut Frame, e: &Expr, line: usize) -> Result<Val, Refusal> {
        Ok(match e {
            Expr::Int(v) => Val::Int(*v, None),
            Expr::Float(v) => Val::Float(*v),
            Expr::Bool(b) => Val::Bool(*b),
            Expr::Str(s) => Val::Str(s.clone()),
            Expr::None => Val::None,
            Expr::Name(n) => {
                if let Some(v) = f.locals.get(n).or_else(|| self.globals.get(n)) {
                    v.clone()
                } else if ["torch", "nn", "F", "math"].contains(&n.as_str()) {
                    Val::Path(n.clone())
                } else {
                    return refuse(line, format!("the name `{n}` is not defined"));
                }
            }
            Expr::Attr(obj, attr) => {
                if let Expr::Name(s) = obj.as_ref() {
                    if s == "self" {
                        return f
                            .locals
                            .get(&format!("self.{attr}"))
                            .cloned()
                            .map_or_else(|| refuse(line, format!("`self.{attr}` is not set")), Ok);
                    }
                }
                match self.eval(f, obj, line)? {
                    Val::Path(p) => {
                        let path = format!("{p}.{attr}");
                        match path.as_str() {
                            "math.pi" => Val::Float(std::f64::consts::PI),
                            "math.e" => Val::Float(std::f64::consts::E),
                            _ => Val::Path(path),
                        }
                    }
                    Val::Tensor(t) => match attr.as_str() {
                        "T" | "mT" => self.transpose(t, -2, -1, line)?,
                        "shape" => Val::Seq(self.shape_vals(&t)),
                        _ => Val::Method(attr.clone(), Box::new(Val::Tensor(t))),
                    },
                    // torch.max(x, dim) is a (values, indices) pair.
                    Val::Seq(pair)
                        if pair.len() == 2 && (attr == "values" || attr == "indices") =>
                    {
                        pair[usize::from(attr == "indices")].clone()
                    }
                    Val::Draw(d) if attr == "shape" => Val::Seq(self.dim_vals(&d.dims)),
                    // A draw's transpose: the same draw (a symmetric input is `A + A.T`).
                    Val::Draw(d) if attr == "T" && d.dims.len() == 2 => Val::Draw(Draw {
                        dims: vec![d.dims[1].clone(), d.dims[0].clone()],
                        transposed: !d.transposed,
                        ..d
                    }),
                    v @ Val::Draw(_) => Val::Method(attr.clone(), Box::new(v)),
                    other => {
                        return refuse(line, format!("the attribute `.{attr}` of {}", other.what()))
                    }
                }
            }
            Expr::Call(func, args) => self.call(f, func, args, line)?,
            Expr::Index(obj, idx) => {
                let o = self.eval(f, obj, line)?;
                let i = self.eval(f, idx, line)?;
                match (o, i) {
                    (Val::Seq(items), Val::Int(k, _)) => {
                        let n = items.len() as i64;
                        let k = if k < 0 { k + n } else { k };
                        match items.get(k as usize) {
                            Some(v) if k >= 0 => v.clone(),
                            _ => return refuse(line, "an index out of range"),
                        }
                    }
                    (o, _) => return refuse(line, format!("indexing {}", o.what())),
                }
            }
            Expr::Tuple(items) | Expr::List(items) => {
                let mut out = Vec::new();
                for it in items {
                    match it {
                        Expr::Star(inner) => match self.eval(f, inner, line)? {
                            Val::Seq(v) => out.extend(v),
                            other => return refuse(line, format!("`*` of {}", other.what())),
                        },
                        _ => out.push(self.eval(f, it, line)?),
                    }
                }
                Val::Seq(out)
            }
            Expr::Bin(op, a, b) => {
                let a = self.eval(f, a, line)?;
                let b = self.eval(f, b, line)?;
                self.binary(op, a, b, line)?
            }
            Expr::Neg(a) => match self.eval(f, a, line)? {
                Val::Int(v, _) => Val::Int(-v, None),
                Val::Float(v) => Val::Float(-v),
                Val::Tensor(t) => Val::Tensor(Tensor {
                    text: format!("-{}", t.at(ATOM)),
                    prec: ATOM,
                    ..t
                }),
                Val::Draw(d) => match scale_draw(d, -1.0, 0.0) {
                    Some(d) if !d.int => Val::Draw(d),
                    _ => return refuse(line, "negating this random tensor"),
                },
                other => return refuse(line, format!("negating {}", other.what())),
            },
            Expr::Star(_) => return refuse(line, "`*` outside a call or a display"),
            Expr::Unsupported(what) => return refuse(line, what.clone()),
        })
    }

    fn binary(&mut self, op: &str, a: Val, b: Val, line: usize) -> Result<Val, Refusal> {
        // Numbers.
        if let (Some(x), Some(y)) = (a.num(), b.num()) {
            let ints = matches!((&a, &b), (Val::Int(..), Val::Int(..)));
            let (pa, pb) = (self.size_poly(&a), self.size_poly(&b));
            let sized = |v: i64, p: Option<Poly>| Val::Int(v, p.filter(|p| p.constant().is_none()));
            return Ok(match op {
                "+" if ints => sized(x as i64 + y as i64, Some(pa.add(&pb))),
                "-" if ints => sized(x as i64 - y as i64, Some(pa.sub(&pb))),
                "*" if ints => sized(x as i64 * y as i64, Some(pa.mul(&pb))),
                "//" if ints && y != 0.0 => sized(
                    (x / y).floor() as i64,
                    pb.constant().filter(|&k| k > 0).map(|k| pa.floor_div(k)),
                ),
                "%" if ints && y != 0.0 => Val::Int((x as i64).rem_euclid(y as i64), None),
                "**" if ints && y >= 0.0 => Val::Int((x as i64).pow(y as u32), None),
                "+" => Val::Float(x + y),
                "-" => Val::Float(x - y),
                "*" => Val::Float(x * y),
                "/" => Val::Float(x / y),
                "**" => Val::Float(x.powf(y)),
                _ => return refuse(line, format!("`{op}` on numbers")),
            });
        }
        // A draw scaled and shifted (`torch.rand(n) * 2 - 1`), or scaled by one random factor
        // (`torch.rand(n) * torch.rand(())`).
        if matches!((&a, &b), (Val::Draw(d), _) | (_, Val::Draw(d)) if d.int) {
            return refuse(
                line,
                "arithmetic on integers drawn by torch.randint (convert them with .float() first)",
            );
        }
        if matches!((&a, &b), (Val::Tensor(t), _) | (_, Val::Tensor(t)) if t.int) {
            return refuse(
                line,
                format!("`{op}` on integers (a torch.randint input or an argmax): kevin's i64 tensors are indices only"),
            );
        }
        let affine = match (&a, &b) {
            (Val::Draw(d), _) if b.num().is_some() => {
                let c = b.num().unwrap_or(0.0);
                match op {
                    "*" => Some((d, c, 0.0)),
                    "/" if c != 0.0 => Some((d, 1.0 / c, 0.0)),
                    "+" => Some((d, 1.0, c)),
                    "-" => Some((d, 1.0, -c)),
                    _ => None,
                }
            }
            (_, Val::Draw(d)) if a.num().is_some() => {
                let c = a.num().unwrap_or(0.0);
                match op {
                    "*" => Some((d, c, 0.0)),
                    "+" => Some((d, 1.0, c)),
                    "-" => Some((d, -1.0, c)),
                    _ => None,
                }
            }
            // (A + A.T) of one uniform draw A: a symmetric one, twice its range.
            (Val::Draw(x), Val::Draw(y))
                if op == "+"
                    && x.id > 0
                    && x.id == y.id
                    && x.transposed != y.transposed
                    && x.dims.len() == 2
                    && x.dims[0] == x.dims[1] =>
            {
                return match x.dist {
                    InputDist::Uniform { lo, hi } => Ok(Val::Draw(Draw {
                        dist: InputDist::Symmetric {
                            lo: 2.0 * lo,
                            hi: 2.0 * hi,
                        },
                        id: 0,
                        transposed: false,
                        ..x.clone()
                    })),
                    _ => refuse(line, "a symmetric input of a draw other than torch.rand"),
                };
            }
            (Val::Draw(x), Val::Draw(f)) | (Val::Draw(f), Val::Draw(x))
                if op == "*" && f.dims.is_empty() && !x.dims.is_empty() =>
            {
                return match (x.dist, f.dist) {
                    (InputDist::Uniform { lo, hi }, InputDist::Uniform { lo: 0.0, hi: 1.0 }) => {
                        Ok(Val::Draw(Draw {
                            dist: InputDist::ScaledUniform { lo, hi },
                            ..x.clone()
                        }))
                    }
                    _ => refuse(line, "a random tensor times a random number other than torch.rand(()) times torch.rand"),
                };
            }
            (Val::Draw(_), _) | (_, Val::Draw(_)) => {
                return refuse(line, format!("`{op}` on a random tensor in get_inputs"))
            }
            _ => None,
        };
        if let Some((d, scale, shift)) = affine {
            return match scale_draw(d.clone(), scale, shift) {
                Some(d) => Ok(Val::Draw(d)),
                None => refuse(
                    line,
                    format!("`{op}` of this random tensor is not a distribution kevin draws"),
                ),
            };
        }
        if let (Val::Seq(x), Val::Seq(y)) = (&a, &b) {
            if op == "+" {
                return Ok(Val::Seq([x.clone(), y.clone()].concat()));
            }
        }
        // Tensors.
        let (ta, tb) = (self.operand(&a, line)?, self.operand(&b, line)?);
        if op == "@" {
            return self.matmul(ta, tb, line);
        }
        let Some(shape) = broadcast(&ta.shape, &tb.shape) else {
            return self.tie_broadcast(&ta.shape, &tb.shape, line);
        };
        let (text, prec) = match op {
            "+" | "-" => (format!("{} {op} {}", ta.at(ADD), tb.at(ADD + 1)), ADD),
            "*" | "/" => (format!("{} {op} {}", ta.at(MUL), tb.at(MUL + 1)), MUL),
            "**" => (format!("pow({}, {})", ta.text, tb.text), ATOM),
            _ => return refuse(line, format!("`{op}` on tensors")),
        };
        Ok(Val::Tensor(Tensor {
            text,
            prec,
            shape,
            int: false,
        }))
    }

    /// A value as a tensor operand: a tensor, or a number as a literal of shape [].
    fn operand(&mut self, v: &Val, line: usize) -> Result<Tensor, Refusal> {
        match v {
            Val::Tensor(t) if t.int => refuse(line, "arithmetic on an integer (index) tensor"),
            Val::Tensor(t) => Ok(t.clone()),
            _ => match v.num() {
                Some(x) => Ok(Tensor {
                    text: lit(x),
                    prec: ATOM,
                    shape: Vec::new(),
                    int: false,
                }),
                None => refuse(line, format!("arithmetic on {}", v.what())),
            },
        }
    }

    fn matmul(&mut self, a: Tensor, b: Tensor, line: usize) -> Result<Val, Refusal> {
        let (sa, sb) = (&a.shape, &b.shape);
        let Some(shape) = crate::ops::matmul_shape(sa, sb) else {
            return refuse(
                line,
                format!(
                    "a matrix product of shapes {} and {} (the op language has [M,K]@[K,N], [...,M,K]@[...,K,N], [...,M,K]@[K,N] and [M,K]@[K])",
                    show(sa),
                    show(sb)
                ),
            );
        };
        Ok(Val::Tensor(Tensor {
            text: format!("{} @ {}", a.at(MUL), b.at(MUL + 1)),
            prec: MUL,
            shape,
            int: false,
        }))
    }

    /// `t` with its last two dims swapped, as a tensor operand.
    fn last_two_swapped(&mut self, t: Tensor, line: usize) -> Result<Tensor, Refusal> {
        let v = self.transpose(t, -2, -1, line)?;
        self.operand(&v, line)
    }

    fn transpose(&mut self, t: Tensor, a: i64, b: i64, line: usize) -> Result<Val, Refusal> {
        let r = t.shape.len() as i64;
        let norm = |x: i64| if x < 0 { x + r } else { x };
        let (na, nb) = (norm(a), norm(b));
        if r < 2 || na < 0 || nb < 0 || na >= r || nb >= r {
            return refuse(
                line,
                format!("transposing dims {a} and {b} of a tensor of rank {r}"),
            );
        }
        let mut shape = t.shape.clone();
        shape.swap(na as usize, nb as usize);
        let text = if (na, nb) == (r - 2, r - 1) || (na, nb) == (r - 1, r - 2) {
            format!("transpose({})", t.text)
        } else {
            format!("transpose({}, {na}, {nb})", t.text)
        };
        Ok(Val::Tensor(Tensor {
            text,
            prec: ATOM,
            shape,
            int: false,
        }))
    }

    fn call(
        &mut self,
        f: &mut Frame,
        func: &Expr,
        args: &[Arg],
        line: usize,
    ) -> Result<Val, Refusal> {
        if is_super_init_call(func) {
            return Ok(Val::None);
        }
        let callee = self.eval(f, func, line)?;
        let mut pos = Vec::new();
        let mut kw = Vec::new();
        for a in args {
            match (&a.name, &a.value) {
                (None, Expr::Star(inner)) => match self.eval(f, inner, line)? {
                    Val::Seq(v) => pos.extend(v),
                    other => return refuse(line, format!("`*` of {}", other.what())),
                },
                (None, v) => pos.push(self.eval(f, v, line)?),
                (Some(n), v) => kw.push((n.clone(), self.eval(f, v, line)?)),
            }
        }
        match callee {
            Val::Path(path) => self.call_path(&path, pos, kw, line),
            Val::Method(method, receiver) => {
                let mut all = vec![*receiver];
                all.extend(pos);
                self.function(&method, all, kw, line)
            }
            Val::Layer(layer) => self.apply_layer(layer, pos, kw, line),
            other => refuse(line, format!("calling {}", other.what())),
        }
    }

    /// A call of a dotted path: a layer's constructor, a torch function, a math function.
    fn call_path(
        &mut self,
        path: &str,
        pos: Vec<Val>,
        kw: Vec<(String, Val)>,
        line: usize,
    ) -> Result<Val, Refusal> {
        let short = path
            .trim_start_matches("torch.nn.functional.")
            .trim_start_matches("nn.functional.")
            .trim_start_matches("F.")
            .trim_start_matches("torch.");
        let functional = ["torch.nn.functional.", "nn.functional.", "F."]
            .iter()
            .any(|p| path.starts_with(p));
        if !functional {
            if let Some(layer) = path
                .strip_prefix("nn.")
                .or_else(|| path.strip_prefix("torch.nn."))
            {
                return self.layer(layer, pos, kw, line);
            }
        }
        if let Some(m) = path.strip_prefix("math.") {
            let x = pos.first().and_then(Val::num);
            return match (m, x) {
                ("sqrt", Some(x)) => Ok(Val::Float(x.sqrt())),
                ("exp", Some(x)) => Ok(Val::Float(x.exp())),
                ("log", Some(x)) => Ok(Val::Float(x.ln())),
                ("tanh", Some(x)) => Ok(Val::Float(x.tanh())),
                _ => refuse(line, format!("`{path}`")),
            };
        }
        match short {
            "rand" | "randn" => {
                let dims = self.dims(&pos, line)?;
                if kw.iter().any(|(k, v)| {
                    k == "dtype"
                        && !matches!(v, Val::Path(p) if p == "torch.float32" || p == "torch.float")
                }) {
                    return refuse(line, "an input that is not float32");
                }
                let dist = if short == "rand" {
                    InputDist::Uniform { lo: 0.0, hi: 1.0 }
                } else {
                    InputDist::default()
                };
                self.draws += 1;
                Ok(Val::Draw(Draw {
                    dims,
                    dist,
                    id: self.draws,
                    ..Draw::default()
                }))
            }
            // torch.randint(low=0, high, size): integers, drawn as floats on a grid of step 1.
            "randint" => {
                let (low, high, size) = match pos.as_slice() {
                    [high, size] => (Some(0.0), high.num(), size),
                    [low, high, size] => (low.num(), high.num(), size),
                    _ => return refuse(line, "`torch.randint` without (low,) high and a size"),
                };
                let (Some(low), Some(high)) = (low, high) else {
                    return refuse(line, "`torch.randint` with bounds that are not numbers");
                };
                let count = high - low;
                if !(count >= 1.0 && count <= f64::from(1u32 << 24)) {
                    return refuse(line, format!("`torch.randint({low}, {high})`"));
                }
                let dims = self.dims(std::slice::from_ref(size), line)?;
                Ok(Val::Draw(Draw {
                    dims,
                    dist: InputDist::Grid {
                        lo: low,
                        step: 1.0,
                        count: count as u32,
                    },
                    int: true,
                    ..Draw::default()
                }))
            }
            "tensor" if pos.len() == 1 && pos[0].num().is_some() => {
                Ok(Val::Float(pos[0].num().unwrap_or(0.0)))
            }
            // A constant tensor (a parameter initialised to ones, a zero input) is a draw
            // without spread: every value is the constant.
            "ones" | "zeros" | "full" => {
                let (dims, value) = if short == "full" {
                    let fill = pos.get(1).and_then(Val::num).or_else(|| {
                        kw.iter()
                            .find(|(k, _)| k == "fill_value")
                            .and_then(|(_, v)| v.num())
                    });
                    let Some(fill) = fill else {
                        return refuse(line, "`torch.full` without a numeric fill value");
                    };
                    (self.dims(&pos[..1.min(pos.len())], line)?, fill)
                } else {
                    (
                        self.dims(&pos, line)?,
                        if short == "ones" { 1.0 } else { 0.0 },
                    )
                };
                if kw.iter().any(|(k, v)| {
                    k == "dtype"
                        && !matches!(v, Val::Path(p) if p == "torch.float32" || p == "torch.float")
                }) {
                    return refuse(line, "an input that is not float32");
                }
                Ok(Val::Draw(Draw::constant(dims, value)))
            }
            "randperm" | "eye" | "arange" | "tensor" | "empty" => refuse(
                line,
                format!("`torch.{short}` inputs (kevin draws float inputs from a distribution)"),
            ),
            _ => self.function(short, pos, kw, line),
        }
    }

    /// `nn.<name>(...)` in `__init__`.
    fn layer(
        &mut self,
        name: &str,
        pos: Vec<Val>,
        kw: Vec<(String, Val)>,
        line: usize,
    ) -> Result<Val, Refusal> {
        let arg = |i: usize, key: &str| -> Option<Val> {
            kw.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .or_else(|| pos.get(i).cloned())
        };
        match name {
            "Linear" => {
                let (Some(inp), Some(out)) = (arg(0, "in_features"), arg(1, "out_features")) else {
                    return refuse(line, "nn.Linear without in_features and out_features");
                };
                let bias = !matches!(arg(2, "bias"), Some(Val::Bool(false)));
                let bound = 1.0 / inp.num().unwrap_or(1.0).max(1.0).sqrt();
                let dims = self.dims(&[out, inp], line)?;
                Ok(Val::Layer(Layer::Linear {
                    dims,
                    bound,
                    bias,
                    params: None,
                }))
            }
            "Conv1d" | "Conv2d" | "Conv3d" | "ConvTranspose1d" | "ConvTranspose2d"
            | "ConvTranspose3d" => {
                let transposed = name.starts_with("ConvTranspose");
                let d = (name.as_bytes()[name.len() - 2] - b'0') as usize;
                let (Some(inp), Some(out)) = (arg(0, "in_channels"), arg(1, "out_channels")) else {
                    return refuse(
                        line,
                        format!("nn.{name} without in_channels and out_channels"),
                    );
                };
                // PyTorch's positions: (in, out, kernel, stride, padding, dilation, groups,
                // bias, padding_mode), transposed (in, out, kernel, stride, padding,
                // output_padding, groups, bias, dilation, padding_mode).
                let at = |plain: usize, tr: usize| if transposed { tr } else { plain };
                let ones = vec![1; d];
                let zeros = vec![0; d];
                let kernel = axes_arg(arg(2, "kernel_size"), d, None, "kernel_size", 1, line)?;
                let groups = match arg(6, "groups") {
                    None => 1,
                    Some(Val::Int(g, _)) if g >= 1 => g as usize,
                    Some(other) => {
                        return refuse(line, format!("nn.{name} with groups {}", other.what()))
                    }
                };
                let window = ConvWindow {
                    transposed,
                    stride: axes_arg(arg(3, "stride"), d, Some(&ones), "stride", 1, line)?,
                    padding: axes_arg(arg(4, "padding"), d, Some(&zeros), "padding", 0, line)?,
                    dilation: axes_arg(
                        arg(at(5, 8), "dilation"),
                        d,
                        Some(&ones),
                        "dilation",
                        1,
                        line,
                    )?,
                    output_padding: if transposed {
                        axes_arg(
                            arg(5, "output_padding"),
                            d,
                            Some(&zeros),
                            "output_padding",
                            0,
                            line,
                        )?
                    } else {
                        zeros.clone()
                    },
                    groups,
                };
                let bias = !matches!(arg(7, "bias"), Some(Val::Bool(false)));
                let mode = arg(at(8, 9), "padding_mode");
                if !matches!(mode, None | Some(Val::Str(_)))
                    || matches!(mode, Some(Val::Str(m)) if m != "zeros")
                {
                    return refuse(
                        line,
                        format!("nn.{name} with a padding_mode other than zeros"),
                    );
                }
                // kaiming_uniform's fan_in: the weight's second dim times the window.
                let per_window = if transposed { &out } else { &inp };
                let fan_in = per_window.num().unwrap_or(1.0) / groups as f64
                    * kernel.iter().product::<usize>() as f64;
                let bound = 1.0 / fan_in.max(1.0).sqrt();
                if groups > 1 {
                    // Grouped channels stay the file's numbers: the weight's second dim is the
                    // channels over the groups, which a size symbol cannot be divided into.
                    self.pin_channels(&[&inp, &out], groups, &name, line)?;
                }
                let mut dims = if transposed {
                    self.dims(&[inp, out], line)?
                } else {
                    self.dims(&[out, inp], line)?
                };
                if groups > 1 {
                    dims[1] = match dims[1] {
                        Dim::Lit(c) => Dim::Lit(c / groups),
                        // Pinned just now, after the input's dims were made: [`import`] runs
                        // the file again with it pinned from the start.
                        _ => return refuse(line, "a grouped convolution's channels are pinned"),
                    };
                }
                dims.extend(kernel.iter().map(|&k| Dim::Lit(k)));
                Ok(Val::Layer(Layer::Conv {
                    dims,
                    bound,
                    bias,
                    window,
                    params: None,
                }))
            }
            "AdaptiveAvgPool1d" | "AdaptiveAvgPool2d" | "AdaptiveAvgPool3d"
            | "AdaptiveMaxPool1d" | "AdaptiveMaxPool2d" | "AdaptiveMaxPool3d" => {
                // F.adaptive_{avg,max}_pool{d}d(x, output_size[, return_indices]).
                let (stem, d) = name.split_at(name.len() - 2);
                let f = format!("adaptive_{}_pool{}", stem[8..11].to_lowercase(), d);
                let kws = named_args(&["output_size", "return_indices"], pos, kw);
                Ok(Val::Layer(Layer::Func(f, kws)))
            }
            "MaxPool1d" | "MaxPool2d" | "MaxPool3d" | "AvgPool1d" | "AvgPool2d" | "AvgPool3d" => {
                let (stem, d) = name.split_at(name.len() - 2);
                let f = format!("{}_pool{}", stem[..3].to_lowercase(), d.to_lowercase());
                let names: &[&str] = if stem == "MaxPool" {
                    &[
                        "kernel_size",
                        "stride",
                        "padding",
                        "dilation",
                        "return_indices",
                        "ceil_mode",
                    ]
                } else {
                    &[
                        "kernel_size",
                        "stride",
                        "padding",
                        "ceil_mode",
                        "count_include_pad",
                        "divisor_override",
                    ]
                };
                Ok(Val::Layer(Layer::Func(f, named_args(names, pos, kw))))
            }
            // PyTorch initialises the affine parameters to ones and zeros: until trained group
            // and instance norms are without them, as nn.LayerNorm; a batch norm keeps them as
            // inputs (Layer::AffineNorm). A module is in training mode: batch norm normalises
            // with the batch's statistics.
            "GroupNorm" => {
                let Some(groups) = arg(0, "num_groups") else {
                    return refuse(line, "nn.GroupNorm without num_groups");
                };
                let eps = arg(2, "eps").unwrap_or(Val::Float(1e-5));
                Ok(Val::Layer(Layer::Func(
                    "group_norm".into(),
                    vec![("num_groups".into(), groups), ("eps".into(), eps)],
                )))
            }
            "BatchNorm1d" | "BatchNorm2d" | "BatchNorm3d" | "InstanceNorm1d" | "InstanceNorm2d"
            | "InstanceNorm3d" => {
                let eps = arg(1, "eps").unwrap_or(Val::Float(1e-5));
                let mut kws = vec![("eps".to_string(), eps)];
                if !name.starts_with("Batch") {
                    return Ok(Val::Layer(Layer::Func("instance_norm".into(), kws)));
                }
                kws.push(("training".into(), Val::Bool(true)));
                let affine = !matches!(arg(3, "affine"), Some(Val::Bool(false)));
                if !affine {
                    return Ok(Val::Layer(Layer::Func("batch_norm".into(), kws)));
                }
                let Some(features) = arg(0, "num_features") else {
                    return refuse(line, format!("nn.{name} without num_features"));
                };
                let channels = match self.dims(&[features], line)?.as_slice() {
                    [d] => d.clone(),
                    _ => return refuse(line, format!("nn.{name} with num_features not one size")),
                };
                Ok(Val::Layer(Layer::AffineNorm {
                    kws,
                    channels,
                    params: None,
                }))
            }
            "Dropout" => match arg(0, "p").and_then(|v| v.num()) {
                Some(p) if p == 0.0 => Ok(Val::Layer(Layer::Func("identity".into(), Vec::new()))),
                _ => refuse(line, "nn.Dropout with p > 0 (random in training mode)"),
            },
            "Parameter" => match pos.into_iter().next() {
                Some(Val::Draw(d)) => Ok(Val::Draw(d)),
                // A parameter holding one number (`nn.Parameter(torch.tensor(c))`) is that
                // number until trained.
                Some(v @ (Val::Int(..) | Val::Float(_))) => Ok(v),
                _ => refuse(
                    line,
                    "nn.Parameter of something other than torch.rand or torch.randn",
                ),
            },
            "LayerNorm" => {
                // PyTorch initialises the affine parameters to ones and zeros: the layer is
                // layer_norm without them until trained.
                // It normalises over the last dims, as many as `normalized_shape` names.
                let size = match arg(0, "normalized_shape") {
                    Some(Val::Seq(v)) if !v.is_empty() => Val::Seq(v),
                    Some(v @ Val::Int(..)) => Val::Seq(vec![v]),
                    _ => return refuse(line, "nn.LayerNorm without an integer normalized_shape"),
                };
                let eps = arg(1, "eps").and_then(|v| v.num()).unwrap_or(1e-5);
                Ok(Val::Layer(Layer::Func(
                    "layer_norm_last".into(),
                    vec![("eps".into(), Val::Float(eps)), ("normalized".into(), size)],
                )))
            }
            "Flatten" => {
                // nn.Flatten flattens from dim 1 unless told otherwise (torch.flatten from 0).
                let mut args = named_args(&["start_dim", "end_dim"], pos, kw);
                if !args.iter().any(|(k, _)| k == "start_dim") {
                    args.push(("start_dim".into(), Val::Int(1, None)));
                }
                Ok(Val::Layer(Layer::Func("flatten".into(), args)))
            }
            _ => {
                let Some((_, f, names)) = FUNC_LAYERS.iter().find(|(n, _, _)| *n == name) else {
                    return refuse(line, format!("nn.{name} is not in kevin's op language"));
                };
                let kw = kw.into_iter().filter(|(k, _)| k != "inplace").collect();
                Ok(Val::Layer(Layer::Func(
                    f.to_string(),
                    named_args(names, pos, kw),
                )))
            }
        }
    }

    /// `conv{d}d(x, w, b?, ...)` or `conv_transpose{d}d(...)` with its output shape; refuses a
    /// weight that does not match the input's channels and a window that does not fit.
    fn conv(
        &mut self,
        x: Tensor,
        w: Tensor,
        b: Option<Tensor>,
        win: &ConvWindow,
        line: usize,
    ) -> Result<Val, Refusal> {
        let d = win.stride.len();
        let name = if win.transposed {
            format!("conv_transpose{d}d")
        } else {
            format!("conv{d}d")
        };
        if x.shape.len() != d + 2 || w.shape.len() != d + 2 {
            return refuse(
                line,
                format!(
                    "{name} of {} with a weight of {}",
                    show(&x.shape),
                    show(&w.shape)
                ),
            );
        }
        let g = win.groups;
        let (w_in, out_channels) = win.channels(&w.shape);
        if x.shape[1] != w_in {
            return refuse(
                line,
                format!(
                    "{name} of {} channels with a weight of {}",
                    x.shape[1],
                    show(&w.shape)
                ),
            );
        }
        let mut shape = vec![x.shape[0].clone(), out_channels];
        for i in 0..d {
            let (len, k) = (&x.shape[2 + i], &w.shape[2 + i]);
            let (s, p, dil) = (win.stride[i], win.padding[i], win.dilation[i]);
            let out = if win.transposed {
                transposed_out(len, k, s, p, dil, win.output_padding[i])
            } else {
                window_out(len, k, s, p, dil)
            };
            if out.to_poly().constant().is_some_and(|c| c <= 0) {
                return refuse(
                    line,
                    format!("{name} whose window does not fit {}", show(&x.shape)),
                );
            }
            shape.push(out);
        }
        let bias = b.map(|b| format!(", {}", b.text)).unwrap_or_default();
        let mut extra = if win.transposed {
            format!(", output_padding={}", per_axis(&win.output_padding))
        } else {
            String::new()
        };
        // PyTorch's order: groups before dilation when transposed, after it otherwise.
        let groups = if g > 1 {
            format!(", groups={g}")
        } else {
            String::new()
        };
        let tail = if win.transposed {
            extra.push_str(&groups);
            String::new()
        } else {
            groups
        };
        let text = format!(
            "{name}({}, {}{bias}, stride={}, padding={}{extra}, dilation={}{tail})",
            x.text,
            w.text,
            per_axis(&win.stride),
            per_axis(&win.padding),
            per_axis(&win.dilation)
        );
        Ok(Val::Tensor(Tensor {
            text,
            prec: ATOM,
            shape,
            int: false,
        }))
    }

    fn apply_layer(
        &mut self,
        layer: Layer,
        pos: Vec<Val>,
        kw: Vec<(String, Val)>,
        line: usize,
    ) -> Result<Val, Refusal> {
        match layer {
            Layer::Linear {
                dims,
                params: Some((weight, bias)),
                ..
            } => {
                let [x] = pos.as_slice() else {
                    return refuse(line, "a linear layer called with other than one tensor");
                };
                let x = self.operand(x, line)?;
                let Some(last) = x.shape.last() else {
                    return refuse(line, "a linear layer on a scalar");
                };
                if *last != dims[1] {
                    return refuse(
                        line,
                        format!(
                            "a linear layer of {} on a tensor of shape {}",
                            show(&dims),
                            show(&x.shape)
                        ),
                    );
                }
                let mut shape = x.shape.clone();
                let n = shape.len();
                shape[n - 1] = dims[0].clone();
                if n > 3 {
                    return refuse(line, "a linear layer on a tensor of rank above 3");
                }
                let mut text = format!("{} @ transpose({})", x.at(MUL), weight.text);
                let mut prec = MUL;
                if let Some(b) = bias {
                    text = format!("{text} + {}", b.text);
                    prec = ADD;
                }
                Ok(Val::Tensor(Tensor {
                    text,
                    prec,
                    shape,
                    int: false,
                }))
            }
            Layer::Linear { .. } => refuse(line, "a linear layer called outside forward"),
            Layer::Conv {
                window,
                params: Some((weight, bias)),
                ..
            } => {
                let [x] = pos.as_slice() else {
                    return refuse(line, "a convolution called with other than one tensor");
                };
                let x = self.operand(x, line)?;
                self.conv(x, weight, bias, &window, line)
            }
            Layer::Conv { .. } => refuse(line, "a convolution called outside forward"),
            Layer::Func(name, stored) => {
                let mut all_kw = stored;
                all_kw.extend(kw);
                self.function(&name, pos, all_kw, line)
            }
            Layer::AffineNorm {
                kws,
                params: Some((w, b)),
                ..
            } => {
                let mut all_kw = kws;
                all_kw.extend(kw);
                all_kw.push(("weight".into(), Val::Tensor(w)));
                all_kw.push(("bias".into(), Val::Tensor(b)));
                self.function("batch_norm", pos, all_kw, line)
            }
            Layer::AffineNorm { .. } => refuse(line, "a batch norm called outside forward"),
        }
    }

    /// `x.view(shape)` or `x.reshape(shape)` that only inserts or removes extent-1 dims (a
    /// parameter `[C]` viewed as `[1, C, 1, 1, 1]`): squeezes, then unsqueezes, which keep the
    /// elements in order as the view does. The other dims must be x's, in order, at the file's
    /// sizes (one may be `-1`). Any other is the op language's `reshape` ([`Self::reshape`]).
    fn unit_view(&self, name: &str, x: Tensor, args: &[Val], line: usize) -> Result<Val, Refusal> {
        let items = match args {
            [Val::Seq(items)] => items.as_slice(),
            items => items,
        };
        let mut asked = Vec::new();
        for v in items {
            match v {
                Val::Int(n, _) => asked.push(*n),
                v => return refuse(line, format!("`{name}` to a shape holding {}", v.what())),
            }
        }
        let other = || self.reshape(name, x.clone(), items, line);
        let kept: Vec<Dim> = x
            .shape
            .iter()
            .filter(|d| **d != Dim::Lit(1))
            .cloned()
            .collect();
        let wanted: Vec<i64> = asked.iter().copied().filter(|&n| n != 1).collect();
        if wanted.len() != kept.len() || wanted.iter().filter(|&&n| n == -1).count() > 1 {
            return other();
        }
        for (n, d) in wanted.iter().zip(&kept) {
            if *n != -1 && d.resolve(&self.sizes) != Some(*n as usize) {
                return other();
            }
        }
        let mut cur = x;
        for a in (0..cur.shape.len()).rev() {
            if cur.shape[a] == Dim::Lit(1) {
                cur = squeeze(cur, a);
            }
        }
        for (a, n) in asked.iter().enumerate() {
            if *n == 1 {
                cur = unsqueeze(cur, a);
            }
        }
        Ok(Val::Tensor(cur))
    }

    /// `view` or `reshape` of `x` to the dims `items` (one may be -1) as the op language's
    /// `reshape`: each dim a tensor's dim symbol, a size computed from them, or an integer; an
    /// integer equal at the file's sizes to a dim of `x` not matched otherwise is that dim (so
    /// every preset keeps the element count); -1 is the product of the dims of `x` the others
    /// do not match.
    fn reshape(&self, name: &str, x: Tensor, items: &[Val], line: usize) -> Result<Val, Refusal> {
        let asked: Vec<String> = items
            .iter()
            .map(|v| v.num().map_or("?".into(), |n| n.to_string()))
            .collect();
        let cannot = |why: &str| refuse(line, format!("`{name}` to [{}]: {why}", asked.join(", ")));
        let mut left: Vec<Dim> = x
            .shape
            .iter()
            .filter(|d| **d != Dim::Lit(1))
            .cloned()
            .collect();
        let mut dims: Vec<Option<Dim>> = Vec::new();
        for v in items {
            let d = match v {
                Val::Int(-1, _) if !dims.contains(&None) => None,
                Val::Int(n, _) if *n >= 1 => {
                    let d = Dim::from_poly(self.size_poly(v));
                    let same = left.iter().position(|l| *l == d).or_else(|| {
                        // A literal that is a dim of x at the file's sizes.
                        matches!(d, Dim::Lit(k) if k > 1)
                            .then(|| {
                                left.iter().position(|l| {
                                    l.resolve(&self.sizes) == Some(*n as usize)
                                        && !matches!(l, Dim::Lit(_))
                                })
                            })
                            .flatten()
                    });
                    Some(match same {
                        Some(i) => left.remove(i),
                        None => d,
                    })
                }
                v => return cannot(&format!("a dim that is {}", v.what())),
            };
            dims.push(d);
        }
        let rest = dims_product(&left);
        let shape: Vec<Dim> = dims
            .into_iter()
            .map(|d| d.unwrap_or_else(|| Dim::from_poly(rest.clone())))
            .collect();
        if dims_product(&shape) != dims_product(&x.shape) {
            return cannot(
                "not the same number of elements at every size (a dim of the input is split)",
            );
        }
        Ok(Val::Tensor(Tensor {
            text: format!("reshape({}, {})", x.text, shape_tuple(&shape)),
            prec: ATOM,
            shape,
            int: x.int,
        }))
    }

    /// `torch.flatten(x, start_dim, end_dim)`: dims `start..=end` as their product.
    fn flatten(&self, x: Tensor, start: i64, end: i64, line: usize) -> Result<Val, Refusal> {
        let r = x.shape.len() as i64;
        let at = |d: i64| if d < 0 { d + r.max(1) } else { d };
        let (s, e) = (at(start), at(end));
        if r == 0 || !(0..r).contains(&s) || !(0..r).contains(&e) || s > e {
            return refuse(
                line,
                format!("`flatten({start}, {end})` of a tensor of rank {r}"),
            );
        }
        if s == e {
            return Ok(Val::Tensor(x));
        }
        let (s, e) = (s as usize, e as usize);
        let merged = dims_product(&x.shape[s..=e]);
        let mut items = self.dim_vals(&x.shape[..s]);
        items.push(Val::Int(
            merged.eval(&self.sizes).unwrap_or(0),
            Some(merged),
        ));
        items.extend(self.dim_vals(&x.shape[e + 1..]));
        self.reshape("flatten", x, &items, line)
    }

    /// A torch function (or tensor method, or functional layer) on values.
    fn function(
        &mut self,
        name: &str,
        pos: Vec<Val>,
        kw: Vec<(String, Val)>,
        line: usize,
    ) -> Result<Val, Refusal> {
        let get = |i: usize, key: &str| -> Option<Val> {
            kw.iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .or_else(|| pos.get(i).cloned())
        };
        let num = |i: usize, key: &str, default: f64| -> Result<f64, Refusal> {
            match get(i, key) {
                None | Some(Val::None) => Ok(default),
                Some(v) => v.num().ok_or_else(|| Refusal {
                    line,
                    reason: format!("`{name}`'s `{key}` is {}, not a number", v.what()),
                }),
            }
        };
        // On a draw in get_inputs only the dtype conversions mean anything.
        if let Some(Val::Draw(d)) = pos.first() {
            let float = Draw {
                int: false,
                ..d.clone()
            };
            return match name {
                "contiguous" | "cuda" => Ok(Val::Draw(d.clone())),
                "float" | "to" => Ok(Val::Draw(float)),
                // A mask: the integers 0 and 1 as they multiply floats.
                "bool" => match d.dist {
                    InputDist::Grid {
                        lo: 0.0,
                        step: 1.0,
                        count: 2,
                    } => Ok(Val::Draw(float)),
                    _ => refuse(line, "`bool` of a draw other than the integers 0 and 1"),
                },
                // A triangular input: the diagonal kept, a square uniform draw.
                "triu" | "tril"
                    if matches!(d.dist, InputDist::Uniform { .. })
                        && pos.len() == 1
                        && kw
                            .iter()
                            .all(|(k, v)| k == "diagonal" && v.num() == Some(0.0))
                        && d.dims.len() == 2
                        && d.dims[0] == d.dims[1] =>
                {
                    let InputDist::Uniform { lo, hi } = d.dist else {
                        return refuse(line, "a triangular draw");
                    };
                    let dist = if name == "triu" {
                        InputDist::Upper { lo, hi }
                    } else {
                        InputDist::Lower { lo, hi }
                    };
                    Ok(Val::Draw(Draw { dist, ..float }))
                }
                _ => refuse(line, format!("`{name}` of a random tensor in get_inputs")),
            };
        }
        if name == "einsum" {
            return self.einsum(pos, line);
        }
        let x = match pos.first() {
            // Integers (labels, an argmax) go through views and gathers alone.
            Some(Val::Tensor(t)) if t.int => {
                const INDEX_OPS: [&str; 11] = [
                    "unsqueeze",
                    "squeeze",
                    "view",
                    "reshape",
                    "flatten",
                    "flip",
                    "contiguous",
                    "clone",
                    "detach",
                    "size",
                    "long",
                ];
                if !INDEX_OPS.contains(&name) {
                    return refuse(
                        line,
                        format!("`{name}` of integers (a torch.randint input or an argmax): kevin's i64 tensors are indices only"),
                    );
                }
                Some(t.clone())
            }
            Some(v @ Val::Tensor(_)) => self.operand(v, line).ok(),
            _ => None,
        };
        let Some(x) = x else {
            return match name {
                "sqrt" | "exp" | "log" | "tanh" => {
                    let v = num(0, "input", f64::NAN)?;
                    Ok(Val::Float(match name {
                        "sqrt" => v.sqrt(),
                        "exp" => v.exp(),
                        "log" => v.ln(),
                        _ => v.tanh(),
                    }))
                }
                _ if KNOWN.contains(&name) => refuse(
                    line,
                    format!("`{name}` on {}", pos.first().map_or("nothing", Val::what)),
                ),
                _ => refuse(line, format!("`{name}` is not in kevin's op language")),
            };
        };
        let same = |text: String| -> Val {
            Val::Tensor(Tensor {
                text,
                prec: ATOM,
                shape: x.shape.clone(),
                int: false,
            })
        };
        let dim = |i: usize| -> Result<Option<i64>, Refusal> {
            match get(i, "dim").or_else(|| get(usize::MAX, "axis")) {
                None | Some(Val::None) => Ok(None),
                Some(Val::Int(d, _)) => Ok(Some(d)),
                Some(v) => refuse(
                    line,
                    format!(
                        "`{name}` over {} (the op language reduces one axis at a time)",
                        v.what()
                    ),
                ),
            }
        };
        let keepdim = matches!(get(2, "keepdim"), Some(Val::Bool(true)));
        Ok(match name {
            "identity" | "contiguous" | "float" | "clone" | "detach" => Val::Tensor(x),
            "long" if x.int => Val::Tensor(x),
            "size" => {
                let dims = self.shape_vals(&x);
                match get(1, "dim") {
                    None => Val::Seq(dims),
                    Some(Val::Int(d, _)) => {
                        let r = dims.len() as i64;
                        let i = if d < 0 { d + r } else { d };
                        match dims.get(i as usize) {
                            Some(v) if i >= 0 => v.clone(),
                            _ => return refuse(line, format!("size({d}) of a tensor of rank {r}")),
                        }
                    }
                    Some(v) => return refuse(line, format!("size of {}", v.what())),
                }
            }
            n if UNARY.contains(&n) => same(format!("{n}({})", x.text)),
            "negative" => same(format!("neg({})", x.text)),
            "gelu" => match get(1, "approximate") {
                Some(Val::Str(s)) if s == "tanh" => same(format!("gelu_tanh({})", x.text)),
                None => same(format!("gelu({})", x.text)),
                Some(Val::Str(s)) if s == "none" => same(format!("gelu({})", x.text)),
                Some(v) => return refuse(line, format!("gelu with approximate = {}", v.what())),
            },
            "softplus" => {
                if num(1, "beta", 1.0)? != 1.0 || num(2, "threshold", 20.0)? != 20.0 {
                    return refuse(
                        line,
                        "softplus with beta or threshold other than the defaults",
                    );
                }
                same(format!("softplus({})", x.text))
            }
            "elu" => same(format!(
                "elu({}, alpha={})",
                x.text,
                lit(num(1, "alpha", 1.0)?)
            )),
            "selu" => Val::Tensor(Tensor {
                text: format!(
                    "elu({}, alpha={}) * {}",
                    x.text,
                    lit(1.673_263_242_354_377_3),
                    lit(1.050_700_987_355_480_5)
                ),
                prec: MUL,
                shape: x.shape.clone(),
                int: false,
            }),
            "softsign" => Val::Tensor(Tensor {
                text: format!("{} / (abs({}) + 1.0)", x.at(MUL), x.text),
                prec: MUL,
                shape: x.shape.clone(),
                int: false,
            }),
            "leaky_relu" => same(format!(
                "leaky_relu({}, {})",
                x.text,
                lit(num(1, "negative_slope", 0.01)?)
            )),
            "hardtanh" => same(format!(
                "clamp({}, {}, {})",
                x.text,
                lit(num(1, "min_val", -1.0)?),
                lit(num(2, "max_val", 1.0)?)
            )),
            "clamp" | "clip" => {
                let lo = get(1, "min").and_then(|v| v.num());
                let hi = get(2, "max").and_then(|v| v.num());
                match (lo, hi) {
                    (Some(l), Some(h)) => {
                        same(format!("clamp({}, {}, {})", x.text, lit(l), lit(h)))
                    }
                    (Some(l), None) => same(format!("maximum({}, {})", x.text, lit(l))),
                    (None, Some(h)) => same(format!("minimum({}, {})", x.text, lit(h))),
                    (None, None) => return refuse(line, "clamp without bounds"),
                }
            }
            "pow" => {
                let e = get(1, "exponent").ok_or_else(|| Refusal {
                    line,
                    reason: "pow without an exponent".into(),
                })?;
                return self.binary("**", Val::Tensor(x), e, line);
            }
            "add" | "sub" | "mul" | "div" | "multiply" | "subtract" | "divide" | "maximum"
            | "minimum" => {
                let other = get(1, "other").ok_or_else(|| Refusal {
                    line,
                    reason: format!("`{name}` without a second operand"),
                })?;
                let op = match name {
                    "add" => "+",
                    "sub" | "subtract" => "-",
                    "mul" | "multiply" => "*",
                    "div" | "divide" => "/",
                    _ => "",
                };
                if !op.is_empty() {
                    return self.binary(op, Val::Tensor(x), other, line);
                }
                let o = self.operand(&other, line)?;
                let Some(shape) = broadcast(&x.shape, &o.shape) else {
                    return self.tie_broadcast(&x.shape, &o.shape, line);
                };
                Val::Tensor(Tensor {
                    text: format!("{name}({}, {})", x.text, o.text),
                    prec: ATOM,
                    shape,
                    int: false,
                })
            }
            "matmul" | "mm" | "bmm" => {
                let other = get(1, "other")
                    .or_else(|| get(1, "mat2"))
                    .ok_or_else(|| Refusal {
                        line,
                        reason: format!("`{name}` without a second operand"),
                    })?;
                let o = self.operand(&other, line)?;
                return self.matmul(x, o, line);
            }
            "t" => return self.transpose(x, -2, -1, line),
            "transpose" | "swapaxes" => {
                let (Some(a), Some(b)) = (
                    get(1, "dim0").and_then(|v| v.num()),
                    get(2, "dim1").and_then(|v| v.num()),
                ) else {
                    return refuse(line, "transpose without two dims");
                };
                return self.transpose(x, a as i64, b as i64, line);
            }
            "softmax" | "log_softmax" | "cumsum" | "cumprod" => {
                let Some(d) = dim(1)? else {
                    return refuse(line, format!("`{name}` without `dim`"));
                };
                same(format!("{name}({}, axis={d})", x.text))
            }
            "scaled_dot_product_attention" => {
                let (Some(k @ Val::Tensor(_)), Some(v @ Val::Tensor(_))) =
                    (get(1, "key"), get(2, "value"))
                else {
                    return refuse(line, format!("`{name}` without key and value tensors"));
                };
                if !matches!(get(3, "attn_mask"), None | Some(Val::None)) {
                    return refuse(line, format!("`{name}` with an attn_mask"));
                }
                if num(4, "dropout_p", 0.0)? != 0.0 {
                    return refuse(line, format!("`{name}` with dropout_p > 0 (random)"));
                }
                for (i, key) in [(5, "is_causal"), (7, "enable_gqa")] {
                    if matches!(get(i, key), Some(Val::Bool(true))) {
                        return refuse(line, format!("`{name}` with {key}=True"));
                    }
                }
                let scale = match get(6, "scale") {
                    None | Some(Val::None) => self.inverse_sqrt_dim(x.shape.last(), line)?,
                    Some(s) => s.num().ok_or_else(|| Refusal {
                        line,
                        reason: format!("`{name}`'s scale is {}", s.what()),
                    })?,
                };
                // softmax(Q @ K^T * scale, -1) @ V.
                let k = self.operand(&k, line)?;
                let kt = self.last_two_swapped(k, line)?;
                let scores = self.matmul(x, kt, line)?;
                let scores = self.binary("*", scores, Val::Float(scale), line)?;
                let probs = self.operand(&scores, line)?;
                let probs = Val::Tensor(Tensor {
                    text: format!("softmax({}, axis=-1)", probs.text),
                    prec: ATOM,
                    ..probs
                });
                let probs = self.operand(&probs, line)?;
                let probs = self.statement("attn", probs);
                let v = self.operand(&v, line)?;
                return self.matmul(probs, v, line);
            }
            "mse_loss"
            | "l1_loss"
            | "smooth_l1_loss"
            | "huber_loss"
            | "triplet_margin_loss"
            | "cross_entropy"
            | "nll_loss" => {
                return self.loss(name, x, &pos, &kw, line);
            }
            "normalize" => {
                if num(1, "p", 2.0)? != 2.0 {
                    return refuse(line, "normalize with p other than 2");
                }
                let d = dim(2)?.unwrap_or(1);
                let eps = num(3, "eps", 1e-12)?;
                same(format!("l2norm({}, axis={d}, eps={})", x.text, lit(eps)))
            }
            "conv1d" | "conv2d" | "conv3d" | "conv_transpose1d" | "conv_transpose2d"
            | "conv_transpose3d" => {
                let transposed = name.starts_with("conv_transpose");
                let d = (name.as_bytes()[name.len() - 2] - b'0') as usize;
                let Some(w @ Val::Tensor(_)) = get(1, "weight") else {
                    return refuse(line, format!("`{name}` without a weight tensor"));
                };
                let w = self.operand(&w, line)?;
                let b = match get(2, "bias") {
                    None | Some(Val::None) => None,
                    Some(v @ Val::Tensor(_)) => Some(self.operand(&v, line)?),
                    Some(v) => {
                        return refuse(line, format!("`{name}` with a bias that is {}", v.what()))
                    }
                };
                // PyTorch's positions: (x, w, b, stride, padding, dilation, groups), transposed
                // (x, w, b, stride, padding, output_padding, groups, dilation).
                match get(6, "groups") {
                    None | Some(Val::Int(1, _)) => {}
                    Some(_) => {
                        return refuse(line, format!("`{name}` with groups > 1 (not imported yet)"))
                    }
                }
                let (ones, zeros) = (vec![1; d], vec![0; d]);
                let window = ConvWindow {
                    transposed,
                    stride: axes_arg(get(3, "stride"), d, Some(&ones), "stride", 1, line)?,
                    padding: axes_arg(get(4, "padding"), d, Some(&zeros), "padding", 0, line)?,
                    dilation: axes_arg(
                        get(if transposed { 7 } else { 5 }, "dilation"),
                        d,
                        Some(&ones),
                        "dilation",
                        1,
                        line,
                    )?,
                    output_padding: if transposed {
                        axes_arg(
                            get(5, "output_padding"),
                            d,
                            Some(&zeros),
                            "output_padding",
                            0,
                            line,
                        )?
                    } else {
                        zeros.clone()
                    },
                    groups: 1,
                };
                return self.conv(x, w, b, &window, line);
            }
            "adaptive_avg_pool1d"
            | "adaptive_avg_pool2d"
            | "adaptive_avg_pool3d"
            | "adaptive_max_pool1d"
            | "adaptive_max_pool2d"
            | "adaptive_max_pool3d" => {
                // To 1 along an axis: a mean (or max) over it that keeps it; to the size it has
                // (or None): the axis as it is. Other sizes have windows of varying length.
                let d = (name.as_bytes()[name.len() - 2] - b'0') as usize;
                let max = name.starts_with("adaptive_max");
                if max && matches!(get(2, "return_indices"), Some(Val::Bool(true))) {
                    return refuse(line, format!("`{name}` with return_indices"));
                }
                let r = x.shape.len();
                if r != d + 1 && r != d + 2 {
                    return refuse(
                        line,
                        format!("`{name}` of a tensor of shape {}", show(&x.shape)),
                    );
                }
                let sizes: Vec<Option<i64>> = match get(1, "output_size") {
                    Some(Val::Int(n, _)) => vec![Some(n); d],
                    Some(Val::Seq(items)) if items.len() == d => items
                        .iter()
                        .map(|v| match v {
                            Val::Int(n, _) => Ok(Some(*n)),
                            Val::None => Ok(None),
                            other => refuse(line, format!("`{name}` to {}", other.what())),
                        })
                        .collect::<Result<_, _>>()?,
                    other => {
                        return refuse(
                            line,
                            format!(
                                "`{name}` to {}",
                                other.map_or("nothing".to_string(), |v| v.what().to_string())
                            ),
                        )
                    }
                };
                let mut axes = Vec::new();
                for (i, size) in sizes.into_iter().enumerate() {
                    let axis = r - d + i;
                    match size {
                        None => {}
                        Some(1) => axes.push(axis as i64),
                        Some(n) if x.shape[axis] == Dim::Lit(n as usize) => {}
                        Some(n) => {
                            return refuse(
                                line,
                                format!(
                                    "`{name}` to {n} (only to 1, a global pooling, or to the \
                                     size an axis has)"
                                ),
                            )
                        }
                    }
                }
                let kind = if max { "max" } else { "mean" };
                return self.reduce(kind, x, Some(axes), true, line);
            }
            "max_pool1d" | "max_pool2d" | "max_pool3d" | "avg_pool1d" | "avg_pool2d"
            | "avg_pool3d" => {
                let d = (name.as_bytes()[name.len() - 2] - b'0') as usize;
                let max = name.starts_with("max");
                let kernel = axes_arg(get(1, "kernel_size"), d, None, "kernel_size", 1, line)?;
                let stride = axes_arg(get(2, "stride"), d, Some(&kernel), "stride", 1, line)?;
                let padding =
                    axes_arg(get(3, "padding"), d, Some(&vec![0; d]), "padding", 0, line)?;
                let (dilation, ceil, flag) = if max {
                    let dil = axes_arg(
                        get(4, "dilation"),
                        d,
                        Some(&vec![1; d]),
                        "dilation",
                        1,
                        line,
                    )?;
                    if matches!(get(6, "return_indices"), Some(Val::Bool(true))) {
                        return refuse(line, format!("`{name}` with return_indices"));
                    }
                    (dil, get(5, "ceil_mode"), String::new())
                } else {
                    if !matches!(get(6, "divisor_override"), None | Some(Val::None)) {
                        return refuse(line, format!("`{name}` with divisor_override"));
                    }
                    let count = !matches!(get(5, "count_include_pad"), Some(Val::Bool(false)));
                    let flag = if count {
                        String::new()
                    } else {
                        ", count_include_pad=false".into()
                    };
                    (vec![1; d], get(4, "ceil_mode"), flag)
                };
                if matches!(ceil, Some(Val::Bool(true))) {
                    return refuse(
                        line,
                        format!("`{name}` with ceil_mode=True (floor mode only)"),
                    );
                }
                if x.shape.len() != d + 2 {
                    return refuse(
                        line,
                        format!("`{name}` of a tensor of shape {}", show(&x.shape)),
                    );
                }
                let mut shape = x.shape[..2].to_vec();
                for i in 0..d {
                    if 2 * padding[i] > kernel[i] {
                        return refuse(line, format!("`{name}` with padding over half the window"));
                    }
                    shape.push(window_out(
                        &x.shape[2 + i],
                        &Dim::Lit(kernel[i]),
                        stride[i],
                        padding[i],
                        dilation[i],
                    ));
                }
                let mut text = format!(
                    "{name}({}, {}, stride={}, padding={}",
                    x.text,
                    per_axis(&kernel),
                    per_axis(&stride),
                    per_axis(&padding)
                );
                if max {
                    let _ = write!(text, ", dilation={}", per_axis(&dilation));
                }
                text.push_str(&flag);
                text.push(')');
                Val::Tensor(Tensor {
                    text,
                    prec: ATOM,
                    shape,
                    int: false,
                })
            }
            "group_norm" | "batch_norm" | "instance_norm" => {
                // F.group_norm(x, num_groups, weight, bias, eps), F.batch_norm(x, running_mean,
                // running_var, weight, bias, training, momentum, eps), F.instance_norm(x,
                // running_mean, running_var, weight, bias, use_input_stats, momentum, eps).
                let (w_at, eps_at) = if name == "group_norm" { (2, 4) } else { (3, 7) };
                if name == "batch_norm" && !matches!(get(5, "training"), Some(Val::Bool(true))) {
                    return refuse(line, "batch_norm with running statistics (training=False)");
                }
                if name == "instance_norm"
                    && matches!(get(5, "use_input_stats"), Some(Val::Bool(false)))
                {
                    return refuse(line, "instance_norm with running statistics");
                }
                let mut args = vec![x.text.clone()];
                if name == "group_norm" {
                    match get(1, "num_groups") {
                        Some(Val::Int(g, _)) => args.push(g.to_string()),
                        _ => return refuse(line, "group_norm without an integer num_groups"),
                    }
                }
                for (i, key) in [(w_at, "weight"), (w_at + 1, "bias")] {
                    match get(i, key) {
                        None | Some(Val::None) => {}
                        Some(v @ Val::Tensor(_)) => {
                            let t = self.operand(&v, line)?;
                            args.push(format!("{key}={}", t.text));
                        }
                        Some(v) => {
                            return refuse(line, format!("`{name}`'s {key} is {}", v.what()))
                        }
                    }
                }
                let eps = num(eps_at, "eps", 1e-5)?;
                same(format!("{name}({}, eps={})", args.join(", "), lit(eps)))
            }
            "layer_norm_last" => {
                let Some(Val::Seq(sizes)) = get(usize::MAX, "normalized") else {
                    return refuse(line, "nn.LayerNorm without an integer normalized_shape");
                };
                let (r, k) = (x.shape.len(), sizes.len());
                if k > r {
                    return refuse(
                        line,
                        format!("nn.LayerNorm over {k} dims of a tensor of rank {r}"),
                    );
                }
                for (i, n) in sizes.into_iter().enumerate() {
                    self.tie_dim(&x.shape, r - k + i, n, line)?;
                }
                let eps = num(usize::MAX, "eps", 1e-5)?;
                if k == 1 {
                    return Ok(same(format!("layer_norm({}, eps={})", x.text, lit(eps))));
                }
                // Over several dims: (x - mean) / sqrt(var + eps), both over the last k dims,
                // the variance biased as PyTorch's.
                self.layer_norm_dims(x, k, eps, line)?
            }
            "sum" | "mean" | "amax" | "amin" | "prod" | "logsumexp" | "max" | "min" | "argmax"
            | "argmin" => {
                if let (true, Some(other @ (Val::Tensor(_) | Val::Float(_)))) =
                    (matches!(name, "max" | "min"), get(1, "other"))
                {
                    // torch.max(a, b) with a tensor or a float: elementwise.
                    let op = if name == "max" { "maximum" } else { "minimum" };
                    return self.function(op, vec![Val::Tensor(x), other], Vec::new(), line);
                }
                let kind = match name {
                    "amax" => "max",
                    "amin" => "min",
                    k => k,
                };
                let d = match get(1, "dim").or_else(|| get(usize::MAX, "axis")) {
                    None | Some(Val::None) => None,
                    Some(Val::Int(d, _)) => Some(vec![d]),
                    Some(Val::Seq(ds)) => Some(
                        ds.iter()
                            .map(|v| match v {
                                Val::Int(d, _) => Ok(*d),
                                _ => refuse(line, "a reduction over dims that are not integers"),
                            })
                            .collect::<Result<Vec<_>, _>>()?,
                    ),
                    Some(v) => return refuse(line, format!("`{name}` over {}", v.what())),
                };
                let pair = matches!(name, "max" | "min") && d.is_some();
                let values = self.reduce(kind, x.clone(), d.clone(), keepdim, line)?;
                if pair {
                    // torch.max(x, dim) is a (values, indices) pair.
                    let arg = if name == "max" { "argmax" } else { "argmin" };
                    let indices = self.reduce(arg, x, d, keepdim, line)?;
                    Val::Seq(vec![values, indices])
                } else {
                    values
                }
            }
            "norm" => {
                let p = get(1, "p");
                let two = match &p {
                    None | Some(Val::None) => true,
                    Some(Val::Str(s)) => s == "fro",
                    Some(v) => v.num() == Some(2.0),
                };
                if !two {
                    return refuse(line, "a norm other than the 2-norm (or Frobenius norm)");
                }
                let dims = match get(2, "dim") {
                    None | Some(Val::None) => None,
                    Some(Val::Int(d, _)) => Some(vec![d]),
                    Some(Val::Seq(ds)) => Some(
                        ds.iter()
                            .filter_map(|v| v.num().map(|x| x as i64))
                            .collect(),
                    ),
                    Some(v) => return refuse(line, format!("a norm over {}", v.what())),
                };
                let keep = matches!(get(3, "keepdim"), Some(Val::Bool(true)));
                let sq = Tensor {
                    text: format!("square({})", x.text),
                    prec: ATOM,
                    ..x.clone()
                };
                let Val::Tensor(s) = self.reduce("sum", sq, dims, keep, line)? else {
                    return refuse(line, "a norm");
                };
                Val::Tensor(Tensor {
                    text: format!("sqrt({})", s.text),
                    prec: ATOM,
                    ..s
                })
            }
            "unsqueeze" => {
                let Some(d) = dim(1)? else {
                    return refuse(line, "`unsqueeze` without `dim`");
                };
                let r = x.shape.len() as i64;
                let at = if d < 0 { d + r + 1 } else { d };
                if !(0..=r).contains(&at) {
                    return refuse(line, format!("`unsqueeze({d})` of a tensor of rank {r}"));
                }
                Val::Tensor(unsqueeze(x, at as usize))
            }
            "squeeze" => {
                // PyTorch removes the given dim (every dim without one) only where its extent
                // is 1; a dim of another (or a symbolic) extent is left alone, and refused here
                // when it is not 1 at every size.
                let r = x.shape.len() as i64;
                let axes: Vec<i64> = match dim(1)? {
                    Some(d) => {
                        let at = if d < 0 { d + r } else { d };
                        if !(0..r).contains(&at) {
                            return refuse(line, format!("`squeeze({d})` of a tensor of rank {r}"));
                        }
                        if x.shape[at as usize] != Dim::Lit(1) {
                            return refuse(
                                line,
                                format!(
                                    "`squeeze({d})` of a dim of extent {}, not 1",
                                    x.shape[at as usize]
                                ),
                            );
                        }
                        vec![at]
                    }
                    None => (0..r)
                        .filter(|&a| x.shape[a as usize] == Dim::Lit(1))
                        .collect(),
                };
                let mut cur = x;
                for &a in axes.iter().rev() {
                    cur = squeeze(cur, a as usize);
                }
                Val::Tensor(cur)
            }
            "view" | "reshape" => return self.unit_view(name, x, &pos[1..], line),
            "flatten" => {
                let int = |i: usize, key: &str, default: i64| match get(i, key) {
                    None | Some(Val::None) => Ok(default),
                    Some(Val::Int(d, _)) => Ok(d),
                    Some(v) => refuse(line, format!("`flatten`'s {key} is {}", v.what())),
                };
                let (s, e) = (int(1, "start_dim", 0)?, int(2, "end_dim", -1)?);
                return self.flatten(x, s, e, line);
            }
            "permute" | "expand" | "repeat" | "unfold" | "view_as" => {
                return refuse(
                    line,
                    format!("`{name}`: reshapes are not in kevin's op language yet"),
                )
            }
            "triu" | "tril" => {
                let d = match get(1, "diagonal") {
                    None | Some(Val::None) => 0,
                    Some(Val::Int(d, _)) => d,
                    Some(v) => return refuse(line, format!("`{name}`'s diagonal is {}", v.what())),
                };
                if x.shape.len() < 2 {
                    return refuse(
                        line,
                        format!("`{name}` of a tensor of rank {}", x.shape.len()),
                    );
                }
                same(if d == 0 {
                    format!("{name}({})", x.text)
                } else {
                    format!("{name}({}, diagonal={d})", x.text)
                })
            }
            "flip" => {
                // `torch.flip(x, dims)`, `x.flip(dims)` and `x.flip(d0, d1, ...)`: one flip
                // per axis (the same elements; PyTorch flips them all in one kernel).
                let dims: Vec<Val> = match (kw.iter().find(|(k, _)| k == "dims"), &pos[1..]) {
                    (Some((_, Val::Seq(v))), _) => v.clone(),
                    (Some((_, v)), _) => vec![v.clone()],
                    (None, [Val::Seq(v)]) => v.clone(),
                    (None, v) => v.to_vec(),
                };
                if dims.is_empty() {
                    return refuse(line, "`flip` without dims");
                }
                let r = x.shape.len() as i64;
                let mut text = x.text.clone();
                let mut seen = Vec::new();
                for d in dims {
                    let Val::Int(d, _) = d else {
                        return refuse(line, format!("`flip` over {}", d.what()));
                    };
                    let at = if d < 0 { d + r } else { d };
                    if !(0..r).contains(&at) || seen.contains(&at) {
                        return refuse(line, format!("`flip({d})` of a tensor of rank {r}"));
                    }
                    seen.push(at);
                    text = format!("flip({text}, axis={at})");
                }
                same(text)
            }
            "gather" => {
                // torch.gather(x, dim, index), x.gather(dim, index).
                let (Some(Val::Int(d, _)), Some(Val::Tensor(index))) =
                    (get(1, "dim"), get(2, "index"))
                else {
                    return refuse(line, "`gather` without an integer dim and an index tensor");
                };
                if !index.int {
                    return refuse(line, "`gather` by an index that is no integer tensor");
                }
                let r = x.shape.len() as i64;
                let at = if d < 0 { d + r } else { d };
                if !(0..r).contains(&at) {
                    return refuse(line, format!("`gather({d})` of a tensor of rank {r}"));
                }
                Val::Tensor(Tensor {
                    text: format!("gather({}, {}, axis={at})", x.text, index.text),
                    prec: ATOM,
                    shape: index.shape,
                    int: false,
                })
            }
            "diag" | "where" | "masked_fill" | "cat" | "stack" | "split" | "chunk" => {
                return refuse(
                    line,
                    format!("`torch.{name}` is not in kevin's op language yet"),
                )
            }
            _ => return refuse(line, format!("`{name}` is not in kevin's op language")),
        })
    }

    /// A reduction over `dims` (all when None), one axis at a time from the last.
    fn reduce(
        &mut self,
        kind: &str,
        x: Tensor,
        dims: Option<Vec<i64>>,
        keepdim: bool,
        line: usize,
    ) -> Result<Val, Refusal> {
        let r = x.shape.len() as i64;
        let mut axes: Vec<i64> = match dims {
            None => (0..r).collect(),
            Some(ds) => ds.iter().map(|&d| if d < 0 { d + r } else { d }).collect(),
        };
        if axes.iter().any(|&a| a < 0 || a >= r) {
            return refuse(
                line,
                format!("`{kind}` over a dim outside a tensor of rank {r}"),
            );
        }
        axes.sort_unstable();
        axes.dedup();
        if axes.len() > 1 && matches!(kind, "argmax" | "argmin" | "logsumexp") {
            return refuse(line, format!("`{kind}` over several dims at once"));
        }
        if axes.is_empty() {
            return Ok(Val::Tensor(x));
        }
        let mut cur = x;
        for &a in axes.iter().rev() {
            let mut shape = cur.shape.clone();
            if keepdim {
                shape[a as usize] = Dim::Lit(1);
            } else {
                shape.remove(a as usize);
            }
            let kd = if keepdim { ", keepdim=true" } else { "" };
            cur = Tensor {
                text: format!("{kind}({}, axis={a}{kd})", cur.text),
                prec: ATOM,
                shape,
                int: matches!(kind, "argmax" | "argmin"),
            };
        }
        Ok(Val::Tensor(cur))
    }

    /// The task file.
    fn task(
        &mut self,
        name: &str,
        origin: &str,
        level: u8,
        split: Split,
    ) -> Result<String, Refusal> {
        // get_init_inputs() binds __init__'s parameters; get_inputs() forward's.
        let init_args = match self.call_global("get_init_inputs")? {
            Val::Seq(v) => v,
            other => return refuse(0, format!("get_init_inputs() returns {}", other.what())),
        };
        let draws = match self.call_global("get_inputs")? {
            Val::Seq(v) => v,
            other => return refuse(0, format!("get_inputs() returns {}", other.what())),
        };
        let mut frame = Frame::default();
        if let Some((params, body, line)) = self.methods.get("__init__").cloned() {
            self.bind(&mut frame, &params, init_args, line, "__init__")?;
            self.in_init = true;
            let ran = self.run(&mut frame, &body);
            self.in_init = false;
            ran?;
        }
        let Some((params, body, line)) = self.methods.get("forward").cloned() else {
            return refuse(self.model_line, "Model has no forward");
        };
        let mut tensors = Vec::new();
        for (i, d) in draws.into_iter().enumerate() {
            match d {
                // A number passed to forward is a constant of the task; integers drawn by
                // torch.randint an i64 input (an index: labels, gather positions).
                Val::Draw(_) | Val::Int(..) | Val::Float(_) => tensors.push(d),
                d => {
                    return refuse(
                        line,
                        format!(
                        "input {i} of get_inputs() is {}, not a torch.rand or torch.randn tensor",
                        d.what()
                    ),
                    )
                }
            }
        }
        let names: Vec<String> = params.iter().skip(1).map(|p| p.name.clone()).collect();
        if names.len() != tensors.len() {
            return refuse(
                line,
                format!(
                    "forward takes {} inputs and get_inputs() gives {}",
                    names.len(),
                    tensors.len()
                ),
            );
        }
        // forward's inputs come first, in its order; the layers' parameters after them.
        let params_first = std::mem::take(&mut self.inputs);
        let forward_inputs = tensors.iter().filter(|d| matches!(d, Val::Draw(_))).count();
        for (n, d) in names.iter().zip(tensors) {
            let v = match d {
                Val::Draw(d) => Val::Tensor(self.parameter(n, d)),
                v => v,
            };
            frame.locals.insert(n.clone(), v);
        }
        // Layers' parameter inputs: named after the layer (`gemm_weight`), in the order built.
        let mut layers: Vec<(String, Val)> = frame
            .locals
            .iter()
            .filter(|(k, _)| k.starts_with("self."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        layers.sort_by_key(|(k, _)| k.clone());
        for (k, v) in layers {
            let attr = k.trim_start_matches("self.");
            let layer = match v {
                Val::Layer(Layer::Linear {
                    dims, bound, bias, ..
                }) => {
                    let params = self.layer_params(attr, &dims, &dims[0], bound, bias);
                    Layer::Linear {
                        dims,
                        bound,
                        bias,
                        params: Some(params),
                    }
                }
                Val::Layer(Layer::Conv {
                    dims,
                    bound,
                    bias,
                    window,
                    ..
                }) => {
                    // The bias has the output channels.
                    let (_, outputs) = window.channels(&dims);
                    let params = self.layer_params(attr, &dims, &outputs, bound, bias);
                    Layer::Conv {
                        dims,
                        bound,
                        bias,
                        window,
                        params: Some(params),
                    }
                }
                Val::Layer(Layer::AffineNorm { kws, channels, .. }) => {
                    let constant = |value| Draw::constant(vec![channels.clone()], value);
                    let w = self.parameter(&format!("{attr}_weight"), constant(1.0));
                    let b = self.parameter(&format!("{attr}_bias"), constant(0.0));
                    Layer::AffineNorm {
                        kws,
                        channels,
                        params: Some((w, b)),
                    }
                }
                _ => continue,
            };
            frame.locals.insert(k.clone(), Val::Layer(layer));
        }
        // Parameters declared in __init__ (nn.Parameter) keep their place after forward's.
        self.inputs.extend(params_first);
        let out = match self.run(&mut frame, &body)? {
            Some(Val::Tensor(t)) => t,
            Some(Val::Seq(v)) if v.len() != 1 => {
                return refuse(line, "forward returns several tensors")
            }
            Some(other) => return refuse(line, format!("forward returns {}", other.what())),
            None => return refuse(line, "forward returns nothing"),
        };
        // The output: the last statement renamed when it is what forward returns.
        let y = self.fresh_input("Y");
        let last = self
            .stmts
            .last()
            .and_then(|s| s.strip_prefix(&format!("{} = ", out.text)))
            .map(str::to_string);
        let value = match last {
            Some(v) => {
                self.stmts.pop();
                v
            }
            None => out.text.clone(),
        };
        // A parameter that forward never reads (an nn.Parameter made in __init__ and left
        // unused) is no input of the task: it cannot change the output. forward's own inputs
        // stay, in its order, as the cross-check passes them.
        let mut used = BTreeSet::new();
        for text in self.stmts.iter().chain(std::iter::once(&value)) {
            for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                used.insert(word.to_string());
            }
        }
        let mut i = 0;
        self.inputs.retain(|(n, _, _)| {
            i += 1;
            i <= forward_inputs || used.contains(n)
        });
        let mut program = String::new();
        for (n, dims, _) in &self.inputs {
            let dtype = if self.int_inputs.contains(n) {
                "i64"
            } else {
                "f32"
            };
            let _ = writeln!(program, "input {n}: {dtype}[{}]", join_dims(dims));
        }
        let dtype = if out.int { "i64" } else { "f32" };
        let _ = writeln!(program, "output {y}: {dtype}[{}]", join_dims(&out.shape));
        for s in &self.stmts {
            let _ = writeln!(program, "{s}");
        }
        let _ = writeln!(program, "{y} = {value}");
        let parsed = Program::parse(&program).map_err(|e| Refusal {
            line,
            reason: format!("the translated program does not check ({e}):\n{program}"),
        })?;
        let symbols = parsed.size_symbols();
        let gpu: Sizes = symbols
            .iter()
            .map(|s| (s.clone(), self.sizes.get(s).copied().unwrap_or(1)))
            .collect();
        let small = small_sizes(&parsed, &symbols, &self.ties);
        let doc = self
            .doc
            .as_deref()
            .and_then(|d| d.lines().map(str::trim).find(|l| !l.is_empty()))
            .unwrap_or("");
        let description = format!("KernelBench {origin}: {doc}");
        let inputs: Vec<(String, InputDist)> = self
            .inputs
            .iter()
            .map(|(n, _, d)| (n.clone(), *d))
            .collect();
        Ok(write_task_file(&TaskFileText {
            name,
            level: level.clamp(1, 2),
            split,
            description: description.trim_end_matches([' ', ':']),
            program: &program,
            symbols: &symbols,
            gpu: &gpu,
            small: &small,
            inputs: &inputs,
            tolerance: Some(KERNELBENCH_TOLERANCE),
        }))
    }
}

impl Importer {
    /// Binds a function's parameters (after `self`) to `args`, defaults for the rest.
    fn bind(
        &mut self,
        f: &mut Frame,
        params: &[py::Param],
        args: Vec<Val>,
        line: usize,
        what: &str,
    ) -> Result<(), Refusal> {
        let names = &params[params.len().min(1)..];
        if args.len() > names.len() {
            return refuse(
                line,
                format!(
                    "{what} takes {} arguments and gets {}",
                    names.len(),
                    args.len()
                ),
            );
        }
        let mut args = args.into_iter();
        for p in names {
            let v = match (args.next(), &p.default) {
                (Some(v), _) => v,
                (None, Some(d)) => {
                    let mut empty = Frame::default();
                    self.eval(&mut empty, d, line)?
                }
                (None, None) => return refuse(line, format!("{what}'s `{}` has no value", p.name)),
            };
            f.locals.insert(p.name.clone(), v);
        }
        Ok(())
    }
}

/// `squeeze(x, axis=a)`: x without its axis `a`, of extent 1.
fn squeeze(x: Tensor, a: usize) -> Tensor {
    let mut shape = x.shape;
    shape.remove(a);
    Tensor {
        text: format!("squeeze({}, axis={a})", x.text),
        prec: ATOM,
        shape,
        int: x.int,
    }
}

/// `unsqueeze(x, axis=a)`: x with an axis of extent 1 inserted at `a`.
fn unsqueeze(x: Tensor, a: usize) -> Tensor {
    let mut shape = x.shape;
    shape.insert(a, Dim::Lit(1));
    Tensor {
        text: format!("unsqueeze({}, axis={a})", x.text),
        prec: ATOM,
        shape,
        int: x.int,
    }
}

/// Integers of a module-level value named `n` become the size symbol `n` (`n_0`, `n_1` ...
/// inside a tuple).
fn name_ints(v: Val, n: &str) -> Val {
    match v {
        Val::Int(x, None) => Val::Int(x, Some(Poly::sym(n))),
        Val::Seq(items) if items.len() == 1 => Val::Seq(vec![name_ints(items[0].clone(), n)]),
        Val::Seq(items) => Val::Seq(
            items
                .into_iter()
                .enumerate()
                .map(|(i, x)| name_ints(x, &format!("{n}_{i}")))
                .collect(),
        ),
        v => v,
    }
}

/// The draw `a * x + b` for a draw `x`, when it is one of kevin's distributions.
fn scale_draw(d: Draw, a: f64, b: f64) -> Option<Draw> {
    let dist = match d.dist {
        InputDist::Uniform { lo, hi } => {
            let (x, y) = (lo * a + b, hi * a + b);
            InputDist::Uniform {
                lo: x.min(y),
                hi: x.max(y),
            }
        }
        InputDist::Normal { mean, std } => InputDist::Normal {
            mean: mean * a + b,
            std: std * a.abs(),
        },
        InputDist::Positive { min, std } if a > 0.0 && min * a + b > 0.0 => InputDist::Positive {
            min: min * a + b,
            std: std * a,
        },
        InputDist::Grid { lo, step, count } if a != 0.0 => InputDist::Grid {
            lo: lo * a + b,
            step: step * a,
            count,
        },
        InputDist::Symmetric { lo, hi } if a != 0.0 => InputDist::Symmetric {
            lo: (lo * a + b).min(hi * a + b),
            hi: (lo * a + b).max(hi * a + b),
        },
        // (u * f) * a = (u * a) * f: a scale only, no shift.
        InputDist::ScaledUniform { lo, hi } if b == 0.0 && a != 0.0 => InputDist::ScaledUniform {
            lo: (lo * a).min(hi * a),
            hi: (lo * a).max(hi * a),
        },
        _ => return None,
    };
    Some(Draw { dist, ..d })
}

fn is_super_init_call(func: &Expr) -> bool {
    matches!(func, Expr::Attr(obj, m) if m == "__init__" && matches!(obj.as_ref(), Expr::Call(f, _) if matches!(f.as_ref(), Expr::Name(s) if s == "super")))
}

fn is_super_init(e: &Expr) -> bool {
    matches!(e, Expr::Call(f, _) if is_super_init_call(f))
}

/// NumPy broadcasting of two symbolic shapes.
fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = (i + a.len()).checked_sub(n).map(|j| &a[j]);
        let y = (i + b.len()).checked_sub(n).map(|j| &b[j]);
        out.push(match (x, y) {
            (Some(x), None) => x.clone(),
            (None, Some(y)) => y.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Lit(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Lit(1))) => x.clone(),
            _ => return None,
        });
    }
    Some(out)
}

/// A call's positional arguments named by their parameters (`names`, in order), then its
/// keyword arguments.
fn named_args(names: &[&str], pos: Vec<Val>, kw: Vec<(String, Val)>) -> Vec<(String, Val)> {
    let mut args: Vec<(String, Val)> = names
        .iter()
        .zip(pos)
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    args.extend(kw);
    args
}

/// The size symbol an integer is the value of, when it is one symbol (not a sum or product).
fn sym_name(size: &Option<Poly>) -> Option<String> {
    size.as_ref().and_then(|p| p.as_sym().map(str::to_string))
}

/// Whether the size symbol `s` appears in `d`.
fn mentions(d: &Dim, s: &str) -> bool {
    let mut syms = Vec::new();
    d.to_poly().symbols(&mut syms);
    syms.iter().any(|x| x == s)
}

fn join_dims(d: &[Dim]) -> String {
    d.iter().map(Dim::to_string).collect::<Vec<_>>().join(", ")
}

fn show(d: &[Dim]) -> String {
    format!("[{}]", join_dims(d))
}

/// The small preset: distinct values off multiples of 32, shrunk until no tensor of the
/// program has more than 8192 elements, with the ties the file's sizes imply kept.
fn small_sizes(p: &Program, symbols: &[String], ties: &[(String, Dim)]) -> Sizes {
    const START: [usize; 8] = [37, 41, 29, 23, 19, 17, 13, 11];
    let mut sizes: Sizes = symbols
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), START[i % START.len()]))
        .collect();
    let elems = |sizes: &Sizes| -> Vec<(usize, Vec<String>)> {
        p.inputs
            .iter()
            .chain(&p.outputs)
            .map(|d| {
                let mut syms: Vec<String> = Vec::new();
                for x in &d.ty.shape {
                    match x {
                        Dim::Sym(s) => syms.push(s.clone()),
                        Dim::Expr(p) => p.symbols(&mut syms),
                        Dim::Lit(_) => {}
                    }
                }
                let n = d.ty.shape.iter().map(|x| x.resolve(sizes).unwrap_or(1));
                (n.product(), syms)
            })
            .collect()
    };
    // Every dim positive (a computed dim resolves to None when it is not).
    let fits = |sizes: &Sizes| {
        p.inputs
            .iter()
            .chain(&p.outputs)
            .flat_map(|d| &d.ty.shape)
            .all(|x| x.resolve(sizes).is_some())
    };
    for _ in 0..64 {
        let Some((n, syms)) = elems(&sizes).into_iter().max_by_key(|(n, _)| *n) else {
            break;
        };
        if n <= 8192 {
            break;
        }
        // Shrink the largest symbol of the largest tensor, staying off multiples of 32.
        let Some(s) = syms
            .iter()
            .max_by_key(|s| sizes.get(*s).copied().unwrap_or(0))
            .cloned()
        else {
            break;
        };
        let v = sizes.get(&s).copied().unwrap_or(2);
        if v <= 2 {
            break;
        }
        sizes.insert(s.clone(), (v / 2).max(2));
        if !fits(&sizes) {
            // A computed dim (a convolution's output) would vanish: keep the larger value.
            sizes.insert(s, v);
            break;
        }
    }
    // Start values too small for a window: grow every symbol until each dim is positive.
    for _ in 0..8 {
        if fits(&sizes) {
            break;
        }
        sizes.values_mut().for_each(|v| *v = *v * 2 + 1);
    }
    // Channels split into groups (group norms, grouped convolutions): a multiple of the groups.
    for (_, dim, groups) in crate::ops::group_constraints(p) {
        if let Dim::Sym(s) = dim {
            if let Some(v) = sizes.get_mut(&s) {
                *v = (*v / groups).max(1) * groups;
            }
        }
    }
    for (s, d) in ties {
        if let (true, Some(v)) = (sizes.contains_key(s), d.resolve(&sizes)) {
            sizes.insert(s.clone(), v);
        }
    }
    sizes
}
