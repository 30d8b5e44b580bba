//! Random programs of the op language, one family at a time, written as source text.
//!
//! A draft is built forward from its inputs, one operation at a time. Each value carries its
//! symbolic shape and a rough range of its values (`lo..hi`, about 3.5 standard deviations of
//! the inputs' distributions), and an operation is drawn only from those whose domain the range
//! fits: `log`, `rsqrt` and division by a tensor need values bounded away from zero, `sqrt`
//! non-negative ones, `exp` and `square` a bounded magnitude. The range is a guide, not a proof:
//! the generator then runs every draft through the interpreter at two size presets and keeps only
//! those whose values are finite and whose rounding stays inside the tolerance
//! ([`super::numerics`]).

use std::collections::BTreeMap;

use crate::ops::{Dtype, UnaryFn};
use crate::rng::SplitMix64;
use crate::tasks::InputDist;

/// What a size symbol measures, which decides the values it may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymRole {
    /// A batch of independent problems (a few to a few hundred).
    Batch,
    /// Rows: the outer dimension of a matrix.
    Rows,
    /// Columns: the inner (contiguous) dimension.
    Cols,
    /// The contracted dimension of a matrix product.
    Inner,
    /// Channels of a convolution's input or output.
    Channels,
    /// A spatial extent (length, height, width) of a 1-D or 2-D convolution's input.
    Spatial,
    /// A side of a 3-D convolution's input volume (depth, height, width): smaller, as the
    /// volume grows with its cube.
    Volume,
}

/// The small preset's range of a [`SymRole::Spatial`] size.
pub const SPATIAL_SMALL: (usize, usize) = (5, 24);
/// The small preset's range of a [`SymRole::Volume`] size.
pub const VOLUME_SMALL: (usize, usize) = (5, 9);

/// An operation of the conv family after its convolution, over the channels of `[N, F, *spatial]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ChannelOp {
    InstanceNorm,
    BatchNorm,
    /// A group norm where the channels are a literal (else an instance norm).
    GroupNorm,
    MaxPool,
    AvgPool,
    Scale,
    GlobalAvgPool,
    Softmax,
    /// A softmax over the flattened spatial axes of each channel (a reshape there and back).
    SpatialSoftmax,
    /// A minimum, maximum or sum over the channels.
    Reduce,
}

impl ChannelOp {
    /// Every one with how often it is drawn.
    const DRAWS: [(ChannelOp, f64); 10] = [
        (ChannelOp::InstanceNorm, 1.0),
        (ChannelOp::BatchNorm, 1.0),
        (ChannelOp::GroupNorm, 1.5),
        (ChannelOp::MaxPool, 1.0),
        (ChannelOp::AvgPool, 1.0),
        (ChannelOp::Scale, 1.5),
        (ChannelOp::GlobalAvgPool, 0.8),
        (ChannelOp::Softmax, 0.6),
        (ChannelOp::SpatialSoftmax, 0.4),
        (ChannelOp::Reduce, 0.8),
    ];

    /// No channel operation may follow it: it leaves no extent (global pooling) or no channels.
    fn terminal(self) -> bool {
        matches!(self, ChannelOp::GlobalAvgPool | ChannelOp::Reduce)
    }
}

/// How the conv family's convolution treats its input's extent and channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConvKind {
    /// Stride 1, half the odd window as padding.
    Same,
    Stride2,
    Dilated,
    Unpadded,
    /// Literal channels in 2, 4 or 8 groups.
    Grouped,
    /// Literal channels, a group each.
    Depthwise,
}

impl ConvKind {
    /// Every one with how often a convolution draws it (a transposed one: the first two).
    const DRAWS: [(ConvKind, f64); 6] = [
        (ConvKind::Same, 3.0),
        (ConvKind::Stride2, 1.5),
        (ConvKind::Dilated, 1.0),
        (ConvKind::Unpadded, 1.0),
        (ConvKind::Grouped, 1.0),
        (ConvKind::Depthwise, 1.0),
    ];
}

/// `, padding=P` where P is not 0.
fn pad_arg(p: usize) -> String {
    if p > 0 {
        format!(", padding={p}")
    } else {
        String::new()
    }
}

/// An extent as an operand of `//`: parenthesised unless a symbol or a number.
fn paren_dim(e: &str) -> String {
    if e.chars().all(|c| c.is_alphanumeric() || c == '_') {
        e.to_string()
    } else {
        format!("({e})")
    }
}

/// A program family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Elementwise chains with broadcasts.
    Elementwise,
    /// A reduction along one axis between elementwise chains.
    Reduce,
    /// A row operation (softmax, log_softmax, norms, cumsum (also reversed: a flip each side),
    /// l2norm) between elementwise chains; sometimes a softmax or l2norm of two inputs whose
    /// results are combined, sometimes a reduction of the row operation's result.
    Row,
    /// A matrix product (plain, batched, transposed operand, matrix-vector) with an epilogue,
    /// sometimes a row operation after it (and then, now and then, a second product of its
    /// result: attention's shape) or an operation on its left operand before it.
    Matmul,
    /// A transpose between elementwise chains.
    Transpose,
    /// A 1-D, 2-D or 3-D convolution (plain, strided, dilated, unpadded, grouped, depthwise or
    /// transposed), with a bias sometimes, then up to two channel operations (norms, pooling,
    /// scales, global pooling, softmax or reductions over channels) and an elementwise chain:
    /// KernelBench level 2's shape.
    Conv,
}

impl Family {
    /// Every family: what `kevin tasks generate` draws without `--families`. (Before the conv
    /// family joined them, the default was the first five: `--families
    /// elementwise,reduce,row,matmul,transpose` gives a seed's tasks of that time.)
    pub const ALL: [Family; 6] = [
        Family::Elementwise,
        Family::Reduce,
        Family::Row,
        Family::Matmul,
        Family::Transpose,
        Family::Conv,
    ];

    /// The name used in task names and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Family::Elementwise => "elementwise",
            Family::Reduce => "reduce",
            Family::Row => "row",
            Family::Matmul => "matmul",
            Family::Transpose => "transpose",
            Family::Conv => "conv",
        }
    }

    /// The family called `name`.
    pub fn from_name(name: &str) -> Option<Family> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// How often the generator draws it.
    fn weight(self) -> f64 {
        match self {
            Family::Elementwise => 3.0,
            Family::Reduce => 2.0,
            Family::Row => 2.5,
            Family::Matmul => 3.0,
            Family::Transpose => 1.0,
            Family::Conv => 2.0,
        }
    }
}

/// One input of a draft.
#[derive(Clone, Debug)]
pub struct InputDraft {
    /// Its name.
    pub name: String,
    /// Its shape, by size symbol or literal (`"1"`).
    pub shape: Vec<String>,
    /// How its values are drawn.
    pub dist: InputDist,
}

/// A drafted program.
#[derive(Clone, Debug)]
pub struct Draft {
    /// Its family.
    pub family: Family,
    /// Element type of its float tensors.
    pub dtype: Dtype,
    /// The program's source text.
    pub source: String,
    /// Its inputs, in declaration order.
    pub inputs: Vec<InputDraft>,
    /// The role of every size symbol.
    pub roles: BTreeMap<String, SymRole>,
    /// What it computes, in a few words per operation.
    pub words: Vec<String>,
}

/// A value during drafting.
#[derive(Clone, Debug)]
struct Val {
    /// Source text.
    text: String,
    /// True when the text needs no parentheses as an operand.
    atom: bool,
    /// Symbolic shape.
    shape: Vec<String>,
    /// Rough range of its values.
    lo: f64,
    hi: f64,
    /// An index tensor (argmax/argmin): nothing follows it.
    int: bool,
}

impl Val {
    fn operand(&self) -> String {
        if self.atom {
            self.text.clone()
        } else {
            format!("({})", self.text)
        }
    }

    fn call(text: String, shape: Vec<String>, lo: f64, hi: f64) -> Val {
        Val {
            text,
            atom: true,
            shape,
            lo,
            hi,
            int: false,
        }
    }

    fn infix(text: String, shape: Vec<String>, lo: f64, hi: f64) -> Val {
        Val {
            text,
            atom: false,
            shape,
            lo,
            hi,
            int: false,
        }
    }

    fn mag(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }
}

/// Row operations after a product: the built-in, the range of its values, its words.
const TAIL_ROW_OPS: [(&str, f64, f64, &str); 4] = [
    ("softmax", 0.0, 1.0, "softmax"),
    ("log_softmax", -20.0, 0.0, "log_softmax"),
    ("layer_norm", -4.0, 4.0, "layer norm"),
    ("rms_norm", -4.0, 4.0, "RMS norm"),
];

/// Row operations on a product's left operand: values within those of a standard normal input,
/// so the product's range holds.
const PROLOGUE_ROW_OPS: [(&str, f64, f64, &str); 4] = [
    ("softmax", 0.0, 1.0, "softmax"),
    ("l2norm", -1.0, 1.0, "l2norm"),
    ("layer_norm", -4.0, 4.0, "layer norm"),
    ("rms_norm", -4.0, 4.0, "RMS norm"),
];

/// Drafts one program of `family` with 1 to `max_ops` operations. With `composite`, some draw a
/// composite shape: a second product after a product's row operation (attention), a row
/// operation of two inputs combined, a reduction of a row operation's result. Without it, no
/// draw is spent on them: a seed gives its programs of before 2026-12-06.
pub fn draft(rng: &mut SplitMix64, family: Family, max_ops: usize, composite: bool) -> Draft {
    let dtype = match rng.weighted(&[3.0, 1.0, 1.0]) {
        0 => Dtype::F32,
        1 => Dtype::F16,
        _ => Dtype::Bf16,
    };
    let ops = 1 + rng.below(max_ops.max(1) as u64) as usize;
    let mut d = Drafter {
        rng,
        composite,
        dtype,
        inputs: Vec::new(),
        stmts: Vec::new(),
        roles: BTreeMap::new(),
        words: Vec::new(),
        temps: 0,
    };
    let out = match family {
        Family::Elementwise => d.elementwise(ops),
        Family::Reduce => d.reduce(ops),
        Family::Row => d.row(ops),
        Family::Matmul => d.matmul(ops),
        Family::Transpose => d.transpose(ops),
        Family::Conv => d.conv(ops),
    };
    d.finish(family, out)
}

/// Draws a family by the generator's weights among `allowed`.
pub fn pick_family(rng: &mut SplitMix64, allowed: &[Family]) -> Family {
    let w: Vec<f64> = allowed.iter().map(|f| f.weight()).collect();
    allowed[rng.weighted(&w)]
}

struct Drafter<'r> {
    rng: &'r mut SplitMix64,
    /// Composite shapes may be drawn ([`draft`]).
    composite: bool,
    dtype: Dtype,
    inputs: Vec<InputDraft>,
    stmts: Vec<String>,
    roles: BTreeMap<String, SymRole>,
    words: Vec<String>,
    temps: usize,
}

/// Rough range of a distribution's draws.
fn range(d: &InputDist) -> (f64, f64) {
    match *d {
        InputDist::Normal { mean, std } => (mean - 3.5 * std, mean + 3.5 * std),
        InputDist::Uniform { lo, hi } => (lo, hi),
        InputDist::Positive { min, std } => (min, min + 3.5 * std),
        InputDist::Grid { lo, step, count } => {
            let last = lo + step * f64::from(count.max(1) - 1);
            (lo.min(last), lo.max(last))
        }
        InputDist::ScaledUniform { lo, hi } => (lo.min(0.0), hi.max(0.0)),
        InputDist::Upper { lo, hi } | InputDist::Lower { lo, hi } => (lo.min(0.0), hi.max(0.0)),
        InputDist::Symmetric { lo, hi } => (lo, hi),
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    if x > 30.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// A number as the program writes it: short, and always with a decimal point or exponent.
fn lit(v: f64) -> String {
    let s = format!("{v}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// Tensor names the generator may give any input or output besides the role's conventional ones:
/// none is a size symbol the generator uses (`M N K B`), a temporary (`T1`...), a reserved word of
/// the op language or its PyTorch rendering, or a local of the corpus's kernel writer (a test
/// holds the pool to that).
pub(crate) const NAME_POOL: &[&str] = &[
    "X", "A", "C", "D", "G", "H", "P", "R", "U", "V", "Z", "x", "y", "a", "b", "c", "d", "u", "v",
    "z", "q", "h", "inp", "lhs", "rhs", "data", "act", "feat", "weight", "bias", "scale", "gamma",
    "beta", "other", "mat", "Out", "out", "res", "result",
];

impl Drafter<'_> {
    fn chance(&mut self, p: f64) -> bool {
        self.rng.next_f64() < p
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng.below(xs.len() as u64) as usize]
    }

    fn sym(&mut self, name: &str, role: SymRole) -> String {
        self.roles.insert(name.to_string(), role);
        name.to_string()
    }

    /// A fresh tensor name: half the time the first free one of the role's conventional names
    /// (`prefer`), otherwise any free one of those and [`NAME_POOL`]. A policy trained on
    /// programs that always call a product's right operand `W` writes `W` for a task that calls
    /// it `B`; varied names make reading the program the only way to get them right.
    fn name(&mut self, prefer: &[&str]) -> String {
        let taken =
            |d: &Self, n: &str| d.inputs.iter().any(|i| i.name == n) || d.roles.contains_key(n);
        if self.chance(0.5) {
            if let Some(p) = prefer.iter().find(|p| !taken(self, p)) {
                return p.to_string();
            }
        }
        let free: Vec<&str> = prefer
            .iter()
            .chain(NAME_POOL)
            .copied()
            .filter(|n| !taken(self, n))
            .collect();
        if !free.is_empty() {
            return self.pick(&free).to_string();
        }
        (0..)
            .map(|i| format!("X{i}"))
            .find(|n| !taken(self, n))
            .unwrap_or_default()
    }

    fn input(&mut self, prefer: &[&str], shape: Vec<String>, dist: InputDist) -> Val {
        let name = self.name(prefer);
        let (lo, hi) = range(&dist);
        self.inputs.push(InputDraft {
            name: name.clone(),
            shape: shape.clone(),
            dist,
        });
        Val {
            text: name,
            atom: true,
            shape,
            lo,
            hi,
            int: false,
        }
    }

    /// The distribution of a primary input: mostly standard normal, sometimes scaled, shifted,
    /// uniform or strictly positive.
    fn primary_dist(&mut self) -> InputDist {
        match self.rng.weighted(&[5.0, 1.5, 2.0, 1.0, 0.5]) {
            0 => InputDist::default(),
            1 => InputDist::Normal {
                mean: 0.0,
                std: self.pick(&[0.5, 2.0]),
            },
            2 => InputDist::Positive {
                min: self.pick(&[0.1, 0.5]),
                std: 1.0,
            },
            3 => InputDist::Uniform { lo: -2.0, hi: 2.0 },
            _ => InputDist::Uniform { lo: 0.5, hi: 2.0 },
        }
    }

    /// Materialises `v` as an intermediate now and then, so programs come with several
    /// statements as well as with one.
    fn maybe_store(&mut self, v: Val) -> Val {
        if v.atom && !v.text.contains('(') || !self.chance(0.2) {
            return v;
        }
        let name = format!("T{}", self.temps);
        self.temps += 1;
        self.stmts.push(format!("{name} = {}", v.text));
        Val {
            text: name,
            atom: true,
            ..v
        }
    }

    fn done(&mut self, v: Val, word: String) -> Val {
        self.words.push(word);
        self.maybe_store(v)
    }

    /// One elementwise operation on `v` whose domain `v`'s range fits; `None` when none fits
    /// (never in practice: `neg` and `* c` always do).
    fn elementwise_op(&mut self, v: Val) -> Val {
        loop {
            if let Some(out) = self.try_elementwise(&v) {
                return out;
            }
        }
    }

    fn try_elementwise(&mut self, v: &Val) -> Option<Val> {
        let (lo, hi, mag) = (v.lo, v.hi, v.mag());
        let shape = v.shape.clone();
        let x = v.operand();
        match self.rng.weighted(&[6.0, 1.0, 1.0, 1.0, 2.5, 1.0, 2.5, 0.6]) {
            // A function without parameters.
            0 => {
                let f = self.pick(&UnaryFn::ALL);
                let (l, h) = match f {
                    UnaryFn::Relu => (lo.max(0.0), hi.max(0.0)),
                    UnaryFn::Gelu | UnaryFn::GeluTanh | UnaryFn::Silu | UnaryFn::Mish => {
                        (if lo < 0.0 { -0.31 } else { lo * 0.5 }, hi.max(0.0))
                    }
                    UnaryFn::Hardswish => (if lo < 0.0 { -0.375 } else { 0.0 }, hi.max(0.0)),
                    UnaryFn::Sigmoid => (sigmoid(lo), sigmoid(hi)),
                    UnaryFn::Hardsigmoid => (
                        (lo / 6.0 + 0.5).clamp(0.0, 1.0),
                        (hi / 6.0 + 0.5).clamp(0.0, 1.0),
                    ),
                    UnaryFn::Tanh => (lo.tanh(), hi.tanh()),
                    UnaryFn::Exp if hi <= 6.0 => (lo.exp(), hi.exp()),
                    UnaryFn::Log if lo >= 0.05 => (lo.ln(), hi.ln()),
                    UnaryFn::Abs if lo >= 0.0 => return None,
                    UnaryFn::Abs => (0.0, mag),
                    UnaryFn::Neg => (-hi, -lo),
                    UnaryFn::Sqrt if lo >= 0.0 => (lo.sqrt(), hi.sqrt()),
                    UnaryFn::Rsqrt if lo >= 0.05 => (1.0 / hi.sqrt(), 1.0 / lo.sqrt()),
                    UnaryFn::Square if mag <= 60.0 => (
                        if lo > 0.0 || hi < 0.0 {
                            lo.abs().min(hi.abs()).powi(2)
                        } else {
                            0.0
                        },
                        mag * mag,
                    ),
                    UnaryFn::Softplus => (softplus(lo), softplus(hi)),
                    _ => return None,
                };
                let out = Val::call(format!("{}({})", f.name(), v.text), shape, l, h);
                Some(self.done(out, f.name().to_string()))
            }
            // Functions with a parameter.
            1 => {
                let slope = self.pick(&[0.01, 0.05, 0.1, 0.2]);
                let text = if slope == 0.01 && self.chance(0.5) {
                    format!("leaky_relu({})", v.text)
                } else {
                    format!("leaky_relu({}, {})", v.text, lit(slope))
                };
                let out = Val::call(text, shape, lo.min(0.0) * slope + lo.max(0.0), hi.max(0.0));
                Some(self.done(out, "leaky ReLU".into()))
            }
            2 => {
                let alpha = self.pick(&[0.5, 1.0, 1.5]);
                let text = if alpha == 1.0 {
                    format!("elu({})", v.text)
                } else {
                    format!("elu({}, alpha={})", v.text, lit(alpha))
                };
                let out = Val::call(text, shape, if lo < 0.0 { -alpha } else { lo }, hi.max(0.0));
                Some(self.done(out, "ELU".into()))
            }
            3 => {
                // Bounds inside the range, so the clamp bites without flattening the values.
                let w = hi - lo;
                if w <= 0.0 {
                    return None;
                }
                let round = |x: f64| (x * 100.0).round() / 100.0;
                let (a, b) = (
                    round(lo + w * (0.1 + 0.2 * self.rng.next_f64())),
                    round(hi - w * (0.1 + 0.2 * self.rng.next_f64())),
                );
                if a >= b {
                    return None;
                }
                let (text, word) =
                    if a == -1.0 && b == 1.0 || self.chance(0.15) && lo < -1.0 && hi > 1.0 {
                        (format!("hardtanh({})", v.text), "hardtanh")
                    } else {
                        (
                            format!("clamp({}, {}, {})", v.text, lit(a), lit(b)),
                            "clamp",
                        )
                    };
                let (a, b) = if word == "hardtanh" {
                    (-1.0, 1.0)
                } else {
                    (a, b)
                };
                let out = Val::call(text, shape, a, b);
                Some(self.done(out, word.into()))
            }
            // Scalar arithmetic.
            4 => {
                let c = self.pick(&[0.5, 2.0, 3.0, 0.125, 1.5, 0.1, -1.0, -0.5, 0.25, 4.0]);
                let (text, l, h, word) = match self.rng.below(4) {
                    0 => (
                        format!("{x} * {}", lit(c)),
                        (lo * c).min(hi * c),
                        (lo * c).max(hi * c),
                        "scale",
                    ),
                    1 => (format!("{x} + {}", lit(c)), lo + c, hi + c, "shift"),
                    2 if c > 0.0 => (format!("{x} - {}", lit(c)), lo - c, hi - c, "shift"),
                    3 if c >= 2.0 => (format!("{x} / {}", lit(c)), lo / c, hi / c, "scale"),
                    _ => return None,
                };
                if h.abs().max(l.abs()) > 1e3 {
                    return None;
                }
                let out = Val::infix(text, shape, l, h);
                Some(self.done(out, word.into()))
            }
            5 => {
                let p = self.pick(&[2.0, 3.0, 0.5]);
                let ok = match p {
                    0.5 => lo >= 0.0,
                    2.0 => mag <= 60.0,
                    _ => mag <= 12.0,
                };
                if !ok {
                    return None;
                }
                let (l, h) = match p {
                    0.5 => (lo.sqrt(), hi.sqrt()),
                    2.0 => (0.0, mag * mag),
                    _ => (lo.powi(3), hi.powi(3)),
                };
                let out = Val::call(format!("pow({}, {})", v.text, lit(p)), shape, l, h);
                Some(self.done(out, "power".into()))
            }
            // Another tensor, same shape or broadcast.
            6 => self.binary_with_input(v),
            // The value combined with one of its own earlier inputs (gates like x * sigmoid(x)).
            _ => {
                let same: Vec<usize> = (0..self.inputs.len())
                    .filter(|&i| self.inputs[i].shape == v.shape && self.inputs[i].name != v.text)
                    .collect();
                if same.is_empty() {
                    return None;
                }
                let i = same[self.rng.below(same.len() as u64) as usize];
                let (ilo, ihi) = range(&self.inputs[i].dist);
                let name = self.inputs[i].name.clone();
                let (text, l, h) = if self.chance(0.5) {
                    let m = mag.max(1.0) * ilo.abs().max(ihi.abs());
                    (format!("{x} * {name}"), -m, m)
                } else {
                    (format!("{x} + {name}"), lo + ilo, hi + ihi)
                };
                let out = Val::infix(text, shape, l, h);
                Some(self.done(out, format!("combined with {name}")))
            }
        }
    }

    /// `v op Y` with a new input `Y` of `v`'s shape, of its trailing dimensions (a bias), or
    /// with the last dimension kept at 1 (a per-row value).
    fn binary_with_input(&mut self, v: &Val) -> Option<Val> {
        if self.inputs.len() >= 5 || v.shape.is_empty() {
            return None;
        }
        let r = v.shape.len();
        let (shape, what) = match self
            .rng
            .weighted(&[2.0, 2.0, if r >= 2 { 1.0 } else { 0.0 }])
        {
            0 => (v.shape.clone(), "tensor"),
            1 => (v.shape[r - 1..].to_vec(), "vector"),
            _ => {
                let mut s = v.shape.clone();
                s[r - 1] = "1".into();
                (s, "per-row value")
            }
        };
        let x = v.operand();
        let (lo, hi) = (v.lo, v.hi);
        let op = self.rng.below(6);
        let dist = if op == 5 {
            InputDist::Uniform { lo: 0.5, hi: 2.0 }
        } else {
            self.primary_dist()
        };
        let prefer: &[&str] = match what {
            "vector" => &["b", "c", "d", "e"],
            _ => &["Y", "Z", "U", "V"],
        };
        let y = self.input(prefer, shape, dist);
        let (ylo, yhi) = (y.lo, y.hi);
        let m = v.mag().max(1.0) * ylo.abs().max(yhi.abs());
        let (text, l, h, word, atom) = match op {
            0 => (
                format!("{x} + {}", y.text),
                lo + ylo,
                hi + yhi,
                "add",
                false,
            ),
            1 => (
                format!("{x} - {}", y.text),
                lo - yhi,
                hi - ylo,
                "subtract",
                false,
            ),
            2 => (format!("{x} * {}", y.text), -m, m, "multiply by", false),
            3 => (
                format!("maximum({}, {})", v.text, y.text),
                lo.max(ylo),
                hi.max(yhi),
                "maximum with",
                true,
            ),
            4 => (
                format!("minimum({}, {})", v.text, y.text),
                lo.min(ylo),
                hi.min(yhi),
                "minimum with",
                true,
            ),
            _ => (
                format!("{x} / {}", y.text),
                -v.mag() * 2.0,
                v.mag() * 2.0,
                "divide by",
                false,
            ),
        };
        let out = if atom {
            Val::call(text, v.shape.clone(), l, h)
        } else {
            Val::infix(text, v.shape.clone(), l, h)
        };
        Some(self.done(out, format!("{word} a {what}")))
    }

    fn chain(&mut self, mut v: Val, n: usize) -> Val {
        for _ in 0..n {
            if v.int {
                break;
            }
            v = self.elementwise_op(v);
        }
        v
    }

    /// The shape of a primary input of rank `rank`: `[N]`, `[M, N]` or `[B, M, N]`.
    fn shape(&mut self, rank: usize) -> Vec<String> {
        match rank {
            1 => vec![self.sym("N", SymRole::Cols)],
            2 => vec![self.sym("M", SymRole::Rows), self.sym("N", SymRole::Cols)],
            _ => vec![
                self.sym("B", SymRole::Batch),
                self.sym("M", SymRole::Rows),
                self.sym("N", SymRole::Cols),
            ],
        }
    }

    fn primary(&mut self, rank: usize) -> Val {
        let shape = self.shape(rank);
        let dist = self.primary_dist();
        self.input(&["X", "A"], shape, dist)
    }

    fn elementwise(&mut self, ops: usize) -> Val {
        let rank = 1 + self.rng.weighted(&[1.0, 4.0, 1.5]);
        let x = self.primary(rank);
        self.chain(x, ops)
    }

    fn split_ops(&mut self, ops: usize) -> (usize, usize) {
        let rest = ops.saturating_sub(1);
        let pre = self.rng.below(rest as u64 + 1) as usize;
        (pre, rest - pre)
    }

    fn reduce(&mut self, ops: usize) -> Val {
        let rank = 2 + self.rng.weighted(&[3.0, 1.0]);
        let x = self.primary(rank);
        let (pre, post) = self.split_ops(ops);
        let v = self.chain(x, pre);
        let out = self.reduction(v);
        self.chain(out, post)
    }

    /// A reduction (sum, mean, max, min, logsumexp, argmax or argmin) of `v` along one of its
    /// axes, sometimes keeping the axis.
    fn reduction(&mut self, v: Val) -> Val {
        let rank = v.shape.len();
        let kind = self.pick(&["sum", "mean", "max", "min", "logsumexp", "argmax", "argmin"]);
        let axis = self.rng.below(rank as u64) as usize;
        let keepdim = kind != "argmax" && kind != "argmin" && self.chance(0.3);
        let axis_text = if axis + 1 == rank && self.chance(0.5) {
            "-1".to_string()
        } else {
            axis.to_string()
        };
        let mut shape = v.shape.clone();
        if keepdim {
            shape[axis] = "1".into();
        } else {
            shape.remove(axis);
        }
        let (lo, hi, mag) = (v.lo, v.hi, v.mag());
        let (l, h) = match kind {
            "sum" => (-64.0 * mag, 64.0 * mag),
            "mean" | "max" | "min" => (lo, hi),
            "logsumexp" => (lo, hi + 10.0),
            _ => (0.0, 0.0),
        };
        let kd = if keepdim { ", keepdim=true" } else { "" };
        let text = format!("{kind}({}, axis={axis_text}{kd})", v.text);
        let mut out = Val::call(text, shape, l, h);
        out.int = kind.starts_with("arg");
        self.done(out, format!("{kind} over axis {axis}"))
    }

    fn row(&mut self, ops: usize) -> Val {
        let rank = 2 + self.rng.weighted(&[3.0, 1.0]);
        let x = self.primary(rank);
        // Now and then a row operation of two inputs (composite shapes only, no draw otherwise).
        let two = self.composite && ops >= 3 && self.chance(0.25);
        let (pre, post) = self.split_ops(if two { ops - 2 } else { ops });
        let v = self.chain(x, pre);
        let axis = self.rng.below(rank as u64) as usize;
        let last = axis + 1 == rank;
        let axis_text = if last && self.chance(0.6) {
            String::new()
        } else {
            format!(", axis={axis}")
        };
        let n = v.shape[rank - 1].clone();
        let shape = v.shape.clone();
        let (lo, hi, mag) = (v.lo, v.hi, v.mag());
        if two {
            // The same operation on a second input, the two results combined (two more
            // operations: the second row operation and the combination).
            let (f, range) = if self.chance(0.5) {
                ("softmax", (0.0, 1.0))
            } else {
                ("l2norm", (-1.0, 1.0))
            };
            let out = self.two_rows(f, &v, &axis_text, range);
            return self.after_row(
                out,
                &format!("{f} over axis {axis} of two inputs, combined"),
                post,
            );
        }
        let out = match self.rng.below(6) {
            0 => Val::call(format!("softmax({}{axis_text})", v.text), shape, 0.0, 1.0),
            1 => Val::call(
                format!("log_softmax({}{axis_text})", v.text),
                shape,
                -(hi - lo) - 10.0,
                0.0,
            ),
            // A reversed cumulative sum (from the end of the axis) one time in four.
            2 if self.chance(0.25) => Val::call(
                format!(
                    "flip(cumsum(flip({}, axis={axis}), axis={axis}), axis={axis})",
                    v.text
                ),
                shape,
                -64.0 * mag,
                64.0 * mag,
            ),
            2 => Val::call(
                format!("cumsum({}{axis_text})", v.text),
                shape,
                -64.0 * mag,
                64.0 * mag,
            ),
            3 => Val::call(format!("l2norm({}{axis_text})", v.text), shape, -1.0, 1.0),
            4 => {
                let mut args = vec![v.text.clone()];
                let mut m = 4.0;
                if self.chance(0.6) {
                    let w = self.input(
                        &["g", "w"],
                        vec![n.clone()],
                        InputDist::Normal {
                            mean: 1.0,
                            std: 0.1,
                        },
                    );
                    args.push(w.text);
                    m *= 1.5;
                    if self.chance(0.6) {
                        let b = self.input(
                            &["b", "beta"],
                            vec![n],
                            InputDist::Normal {
                                mean: 0.0,
                                std: 0.1,
                            },
                        );
                        args.push(b.text);
                    }
                }
                let out = Val::call(format!("layer_norm({})", args.join(", ")), shape, -m, m);
                return self.after_row(out, "layer norm", post);
            }
            _ => {
                let mut args = vec![v.text.clone()];
                if self.chance(0.6) {
                    let w = self.input(
                        &["g", "w"],
                        vec![n],
                        InputDist::Normal {
                            mean: 1.0,
                            std: 0.1,
                        },
                    );
                    args.push(w.text);
                }
                let out = Val::call(format!("rms_norm({})", args.join(", ")), shape, -6.0, 6.0);
                return self.after_row(out, "RMS norm", post);
            }
        };
        let word = out.text.split('(').next().unwrap_or("row op").to_string();
        self.after_row(out, &format!("{word} over axis {axis}"), post)
    }

    /// The rest of a row program after its row operation `out`: `post` elementwise operations,
    /// the last of them a reduction of the row operation's result a third of the time (a sum of
    /// normalised products is a cosine similarity; a stage that reads a whole row's result
    /// before it reduces).
    fn after_row(&mut self, out: Val, word: &str, post: usize) -> Val {
        let out = self.done(out, word.to_string());
        if self.composite && post > 0 && self.chance(0.35) {
            let out = self.chain(out, post - 1);
            if !out.int && out.shape.len() >= 2 {
                return self.reduction(out);
            }
            return out;
        }
        self.chain(out, post)
    }

    /// `f(x) op f(y)` for a second input `y` of `x`'s shape (`f` a softmax or an L2
    /// normalisation over `axis`, `axis_text` as it is written): two row operations whose
    /// results combine elementwise, a kernel that must hold two rows.
    fn two_rows(&mut self, f: &str, x: &Val, axis_text: &str, range: (f64, f64)) -> Val {
        let dist = self.primary_dist();
        let y = self.input(&["Y", "B"], x.shape.clone(), dist);
        let (a, b) = range;
        let products = [a * a, a * b, b * b];
        let (op, lo, hi) = match self.rng.below(3) {
            0 => (
                "*",
                products.into_iter().fold(f64::INFINITY, f64::min),
                products.into_iter().fold(f64::NEG_INFINITY, f64::max),
            ),
            1 => ("+", 2.0 * a, 2.0 * b),
            _ => ("-", a - b, b - a),
        };
        Val::infix(
            format!("{f}({}{axis_text}) {op} {f}({}{axis_text})", x.text, y.text),
            x.shape.clone(),
            lo,
            hi,
        )
    }

    fn matmul(&mut self, ops: usize) -> Val {
        let std = self.pick(&[0.02, 0.03, 0.05]);
        let w_dist = InputDist::Normal { mean: 0.0, std };
        let (m, k, n) = (
            self.sym("M", SymRole::Rows),
            self.sym("K", SymRole::Inner),
            self.sym("N", SymRole::Cols),
        );
        let kind = self.rng.weighted(&[5.0, 2.0, 1.0, 1.5, 0.5]);
        // Sometimes the left operand is computed first (a product then needs a kernel per
        // stage, or a fused prologue).
        let pro = ops >= 2 && kind != 4 && self.chance(0.3);
        let (text, shape, word) = match kind {
            0 => {
                let a = self.input(&["A"], vec![m.clone(), k.clone()], InputDist::default());
                let a = self.prologue(a, pro);
                let w = self.input(&["W"], vec![k, n.clone()], w_dist);
                (
                    format!("{} @ {}", a.operand(), w.text),
                    vec![m, n],
                    "matrix product",
                )
            }
            1 => {
                let b = self.sym("B", SymRole::Batch);
                let a = self.input(
                    &["A"],
                    vec![b.clone(), m.clone(), k.clone()],
                    InputDist::default(),
                );
                let a = self.prologue(a, pro);
                let w = self.input(&["W"], vec![b.clone(), k, n.clone()], w_dist);
                (
                    format!("{} @ {}", a.operand(), w.text),
                    vec![b, m, n],
                    "batched matrix product",
                )
            }
            2 => {
                let b = self.sym("B", SymRole::Batch);
                let a = self.input(
                    &["A"],
                    vec![b.clone(), m.clone(), k.clone()],
                    InputDist::default(),
                );
                let w = self.input(&["W"], vec![k, n.clone()], w_dist);
                (
                    format!("{} @ {}", a.text, w.text),
                    vec![b, m, n],
                    "batched product with a shared matrix",
                )
            }
            3 => {
                let a = self.input(&["A"], vec![m.clone(), k.clone()], InputDist::default());
                let a = self.prologue(a, pro);
                let w = self.input(&["W"], vec![n.clone(), k], w_dist);
                (
                    format!("{} @ transpose({})", a.operand(), w.text),
                    vec![m, n],
                    "product with a transposed weight",
                )
            }
            _ => {
                self.roles.remove(&n);
                let a = self.input(&["A"], vec![m.clone(), k.clone()], InputDist::default());
                let x = self.input(&["x", "v"], vec![k], w_dist);
                (
                    format!("{} @ {}", a.text, x.text),
                    vec![m],
                    "matrix-vector product",
                )
            }
        };
        let mut v = self.done(Val::infix(text, shape, -4.0, 4.0), word.into());
        let mut rest = ops.saturating_sub(if pro { 2 } else { 1 });
        if rest > 0 && self.chance(0.6) {
            let last = v.shape[v.shape.len() - 1].clone();
            let b = self.input(
                &["b", "bias"],
                vec![last],
                InputDist::Normal {
                    mean: 0.0,
                    std: 0.1,
                },
            );
            let text = format!("{} + {}", v.text, b.text);
            v = self.done(
                Val::infix(text, v.shape.clone(), v.lo - 0.35, v.hi + 0.35),
                "bias add".into(),
            );
            rest -= 1;
        }
        // Attention's shape now and then (composite shapes only, no draw otherwise): a row
        // operation, then the result times a second matrix.
        let second = self.composite && rest >= 2 && v.shape.len() >= 2 && self.chance(0.25);
        let tail = second || rest > 0 && v.shape.len() >= 2 && self.chance(0.3);
        let body = rest - usize::from(tail) - usize::from(second);
        v = self.chain(v, body);
        if tail && !v.int {
            // Before a second product, not a log_softmax: its values run far below zero.
            let ops: Vec<_> = TAIL_ROW_OPS
                .into_iter()
                .filter(|o| !second || o.0 != "log_softmax")
                .collect();
            let (out, word) = self.row_call(&v, &ops);
            v = self.done(out, word.into());
            if second {
                let batch = (kind == 1).then(|| v.shape[0].clone());
                v = self.second_product(v, batch, word == "softmax");
            }
        }
        v
    }

    /// `v @ V` for a new input `V` of `[N, P]` (`[B, N, P]` with `batch`), `N` the last axis of
    /// `v`: after a softmax (rows of weights summing to one) `V` is standard normal, as an
    /// attention's values are; after a norm it is a weight matrix of small deviation.
    fn second_product(&mut self, v: Val, batch: Option<String>, softmax: bool) -> Val {
        let n = v.shape[v.shape.len() - 1].clone();
        let p = self.sym("P", SymRole::Cols);
        let dist = if softmax {
            InputDist::default()
        } else {
            InputDist::Normal {
                mean: 0.0,
                std: self.pick(&[0.02, 0.03, 0.05]),
            }
        };
        let w_shape: Vec<String> = batch.into_iter().chain([n, p.clone()]).collect();
        let w = self.input(&["V", "W2"], w_shape, dist);
        let mut shape = v.shape.clone();
        *shape.last_mut().expect("a product's result has axes") = p;
        let text = format!("{} @ {}", v.operand(), w.text);
        self.done(
            Val::infix(text, shape, -4.0, 4.0),
            "a second matrix product".into(),
        )
    }

    /// One of `ops` (drawn uniformly) applied to `v` over its last axis, and its words.
    fn row_call(&mut self, v: &Val, ops: &[(&str, f64, f64, &'static str)]) -> (Val, &'static str) {
        let (f, lo, hi, word) = ops[self.rng.below(ops.len() as u64) as usize];
        (
            Val::call(format!("{f}({})", v.text), v.shape.clone(), lo, hi),
            word,
        )
    }

    /// The left operand of a product, with (when `pro`) one operation applied first: a row
    /// operation over its last axis (one whose values stay within those of a standard normal
    /// input, so the product's range holds), or an elementwise one that keeps them within 4.
    fn prologue(&mut self, a: Val, pro: bool) -> Val {
        if !pro {
            return a;
        }
        if self.chance(0.4) {
            let (out, word) = self.row_call(&a, &PROLOGUE_ROW_OPS);
            return self.done(out, format!("{word} of the left operand"));
        }
        for _ in 0..8 {
            let words = self.words.len();
            let (inputs, stmts, temps) = (self.inputs.len(), self.stmts.len(), self.temps);
            let v = self.elementwise_op(a.clone());
            if v.mag() <= 4.0 {
                return v;
            }
            // Too large for the product's range: undo and draw again.
            self.words.truncate(words);
            self.inputs.truncate(inputs);
            self.stmts.truncate(stmts);
            self.temps = temps;
        }
        a
    }

    fn transpose(&mut self, ops: usize) -> Val {
        let rank = 2 + self.rng.weighted(&[3.0, 1.0]);
        let x = self.primary(rank);
        let (pre, post) = self.split_ops(ops);
        let v = self.chain(x, pre);
        let (a, b) = if rank == 2 {
            (0, 1)
        } else {
            self.pick(&[(0, 1), (1, 2), (0, 2)])
        };
        let mut shape = v.shape.clone();
        shape.swap(a, b);
        let text = if b + 1 == rank && a + 2 == rank && self.chance(0.5) {
            format!("transpose({})", v.text)
        } else {
            format!("transpose({}, {a}, {b})", v.text)
        };
        let out = Val::call(text, shape, v.lo, v.hi);
        let out = self.done(out, format!("transpose of axes {a} and {b}"));
        self.chain(out, post)
    }

    /// A convolution, then up to two channel operations, then an elementwise chain: KernelBench
    /// level 2's shape. The convolution is 1-D, 2-D or 3-D, plain or transposed; it keeps its
    /// input's extent, strides it by 2, dilates its window, or pads nothing; grouped and
    /// depthwise ones have literal channel counts (as KernelBench's files write them), as has a
    /// convolution a group norm follows. The channel operations: instance, batch or group norm,
    /// max or average pooling (3-wide of stride 1, or 2-wide of stride 2), a per-channel scale,
    /// a global average pooling, a softmax over channels, or a minimum / maximum / sum over
    /// channels.
    fn conv(&mut self, ops: usize) -> Val {
        let dims = 1 + self.rng.weighted(&[1.0, 3.0, 1.0]);
        let n = self.sym("N", SymRole::Batch);
        let spatial: Vec<String> = match dims {
            1 => vec![self.sym("L", SymRole::Spatial)],
            2 => vec![
                self.sym("H", SymRole::Spatial),
                self.sym("W", SymRole::Spatial),
            ],
            _ => vec![
                self.sym("D", SymRole::Volume),
                self.sym("H", SymRole::Volume),
                self.sym("W", SymRole::Volume),
            ],
        };
        // The smallest extent the small preset may give a spatial axis, followed through the
        // operations so that none leaves an axis empty.
        let mut min_ext = if dims == 3 {
            VOLUME_SMALL.0
        } else {
            SPATIAL_SMALL.0
        };
        let mut rest = ops.saturating_sub(1);
        // The channel operations, drawn first: a group norm needs channels it divides.
        let mut posts = Vec::new();
        let op_weights = ChannelOp::DRAWS.map(|(_, w)| w);
        while rest > posts.len() && posts.len() < 2 && self.chance(0.55) {
            posts.push(ChannelOp::DRAWS[self.rng.weighted(&op_weights)].0);
        }
        // A global pooling or a reduction over channels leaves no extent (or no channels) for
        // another channel operation: it comes last, and only one of them.
        if posts.iter().filter(|op| op.terminal()).count() > 1 {
            posts.pop();
        }
        posts.sort_by_key(|op| op.terminal());
        rest -= posts.len();
        let transposed = self.chance(0.15);
        let kinds = if transposed {
            &ConvKind::DRAWS[..2]
        } else {
            &ConvKind::DRAWS[..]
        };
        let kind_weights: Vec<f64> = kinds.iter().map(|(_, w)| *w).collect();
        let kind = kinds[self.rng.weighted(&kind_weights)].0;
        let literal = matches!(kind, ConvKind::Grouped | ConvKind::Depthwise)
            || posts.contains(&ChannelOp::GroupNorm);
        let (c, f, groups) = if literal {
            let c: usize = self.pick(&[8, 16, 24, 32, 48, 64]);
            match kind {
                ConvKind::Grouped => {
                    let g: usize = self.pick(&[2, 4, 8]);
                    let f = g * self.pick(&[2, 4, 8]);
                    (c.to_string(), f.to_string(), g)
                }
                ConvKind::Depthwise => (c.to_string(), (c * self.pick(&[1, 1, 2])).to_string(), c),
                _ => (c.to_string(), self.pick(&[16, 32, 64]).to_string(), 1),
            }
        } else {
            (
                self.sym("C", SymRole::Channels),
                self.sym("K", SymRole::Channels),
                1,
            )
        };
        let mut xs = vec![n.clone(), c.clone()];
        xs.extend(spatial.iter().cloned());
        let dist = self.primary_dist();
        let x = self.input(&["x", "X"], xs, dist);
        let k: usize = match kind {
            ConvKind::Stride2 | ConvKind::Unpadded => self.pick(&[3, 3, 5]),
            ConvKind::Dilated => 3,
            _ => self.pick(&[1, 3, 3, 5]),
        };
        let std = self.pick(&[0.02, 0.03, 0.05]);
        let per_group = |ch: &str| -> String {
            match ch.parse::<usize>() {
                Ok(v) => (v / groups).to_string(),
                Err(_) => ch.to_string(),
            }
        };
        let mut ws = if transposed {
            vec![c.clone(), f.clone()]
        } else {
            vec![f.clone(), per_group(&c)]
        };
        ws.extend(std::iter::repeat_n(k.to_string(), dims));
        let w = self.input(&["weight", "W"], ws, InputDist::Normal { mean: 0.0, std });
        let bias = if self.chance(0.6) {
            let b = self.input(
                &["bias", "b"],
                vec![f.clone()],
                InputDist::Normal {
                    mean: 0.0,
                    std: 0.1,
                },
            );
            format!(", {}", b.text)
        } else {
            String::new()
        };
        // Its arguments, its output extent from an input extent `e`, and its words.
        let half = k / 2;
        let (args, out_ext, how): (String, fn(&str, usize) -> String, String) =
            match (transposed, kind) {
                (true, ConvKind::Stride2) => (
                    format!(", stride=2, padding={half}, output_padding=1"),
                    |e, _| format!("2*{e}"),
                    "stride 2".into(),
                ),
                (_, ConvKind::Stride2) => (
                    format!(", stride=2, padding={half}"),
                    |e, _| format!("({e} - 1) // 2 + 1"),
                    "stride 2".into(),
                ),
                (_, ConvKind::Dilated) => (
                    format!(", padding={}, dilation=2", k - 1),
                    |e, _| e.to_string(),
                    "dilation 2".into(),
                ),
                (_, ConvKind::Unpadded) => (
                    String::new(),
                    |e, k| format!("{e} - {}", k - 1),
                    "no padding".into(),
                ),
                (_, ConvKind::Grouped | ConvKind::Depthwise) => (
                    pad_arg(half) + &format!(", groups={groups}"),
                    |e, _| e.to_string(),
                    if kind == ConvKind::Depthwise {
                        "depthwise".into()
                    } else {
                        format!("{groups} groups")
                    },
                ),
                (_, ConvKind::Same) => (pad_arg(half), |e, _| e.to_string(), "same extent".into()),
            };
        match (kind, transposed) {
            (ConvKind::Unpadded, _) => min_ext -= k - 1,
            (ConvKind::Stride2, false) => min_ext = (min_ext - 1) / 2 + 1,
            _ => {}
        }
        let name = if transposed { "conv_transpose" } else { "conv" };
        let text = format!("{name}{dims}d({}, {}{bias}{args})", x.text, w.text);
        let mut shape = vec![n, f.clone()];
        shape.extend(spatial.iter().map(|e| out_ext(e, k)));
        let word = format!(
            "{}{dims}-D convolution, window {k}, {how}",
            if transposed { "transposed " } else { "" }
        );
        let mut v = self.done(Val::call(text, shape, -4.0, 4.0), word);
        for op in posts {
            v = self.channel_op(v, op, dims, &f, &mut min_ext);
        }
        self.chain(v, rest)
    }

    /// Channel operation `op` on `v`, a `[N, F, *spatial]` value of `dims` spatial axes with `f`
    /// channels whose spatial extents are at least `min_ext` at the small preset.
    fn channel_op(
        &mut self,
        v: Val,
        op: ChannelOp,
        dims: usize,
        f: &str,
        min_ext: &mut usize,
    ) -> Val {
        let rank = v.shape.len();
        let same =
            |text: String, lo: f64, hi: f64, v: &Val| Val::call(text, v.shape.clone(), lo, hi);
        let (out, word) = match op {
            ChannelOp::InstanceNorm => (
                same(format!("instance_norm({})", v.text), -4.0, 4.0, &v),
                "instance norm".to_string(),
            ),
            ChannelOp::BatchNorm => (
                same(format!("batch_norm({})", v.text), -4.0, 4.0, &v),
                "batch norm (training statistics)".to_string(),
            ),
            ChannelOp::GroupNorm => match f.parse::<usize>() {
                Ok(ch) => {
                    let divisors: Vec<usize> =
                        [2, 4, 8, 16].into_iter().filter(|g| ch % g == 0).collect();
                    let g = self.pick(&divisors);
                    (
                        same(format!("group_norm({}, {g})", v.text), -4.0, 4.0, &v),
                        format!("group norm of {g} groups"),
                    )
                }
                // Channels that are a size symbol: an instance norm (groups of one channel).
                Err(_) => (
                    same(format!("instance_norm({})", v.text), -4.0, 4.0, &v),
                    "instance norm".to_string(),
                ),
            },
            ChannelOp::MaxPool | ChannelOp::AvgPool => {
                let pool = if op == ChannelOp::MaxPool {
                    "max"
                } else {
                    "avg"
                };
                if *min_ext >= 2 && self.chance(0.5) {
                    *min_ext /= 2;
                    let mut shape = v.shape[..2].to_vec();
                    shape.extend(
                        v.shape[2..]
                            .iter()
                            .map(|e| format!("{} // 2", paren_dim(e))),
                    );
                    (
                        Val::call(
                            format!("{pool}_pool{dims}d({}, 2)", v.text),
                            shape,
                            v.lo,
                            v.hi,
                        ),
                        format!("2-wide {pool} pooling of stride 2"),
                    )
                } else {
                    (
                        same(
                            format!(
                                "{pool}_pool{dims}d({}, kernel_size=3, stride=1, padding=1)",
                                v.text
                            ),
                            v.lo,
                            v.hi,
                            &v,
                        ),
                        format!("3-wide {pool} pooling"),
                    )
                }
            }
            ChannelOp::Scale => {
                let mut ss = vec![f.to_string()];
                ss.extend(std::iter::repeat_n("1".to_string(), dims));
                let s = self.input(&["scale", "s"], ss, InputDist::Uniform { lo: 0.5, hi: 2.0 });
                let text = format!("{} * {}", v.operand(), s.text);
                (
                    Val::infix(
                        text,
                        v.shape.clone(),
                        2.0 * v.lo.min(0.0),
                        2.0 * v.hi.max(0.0),
                    ),
                    "per-channel scale".to_string(),
                )
            }
            ChannelOp::GlobalAvgPool => {
                // Global average pooling: a mean over every spatial axis, kept as extents of 1.
                let mut text = v.text.clone();
                for axis in (2..rank).rev() {
                    text = format!("mean({text}, axis={axis}, keepdim=true)");
                }
                let mut shape = v.shape[..2].to_vec();
                shape.extend(std::iter::repeat_n("1".to_string(), dims));
                (
                    Val::call(text, shape, v.lo, v.hi),
                    "global average pooling".to_string(),
                )
            }
            ChannelOp::Softmax => (
                same(format!("softmax({}, axis=1)", v.text), 0.0, 1.0, &v),
                "softmax over channels".to_string(),
            ),
            ChannelOp::SpatialSoftmax => {
                let spatial: Vec<String> = v.shape[2..].iter().map(|e| paren_dim(e)).collect();
                let flat = format!("({}, {}, {})", v.shape[0], v.shape[1], spatial.join("*"));
                let back = format!("({})", v.shape.join(", "));
                (
                    same(
                        format!(
                            "reshape(softmax(reshape({}, {flat}), axis=2), {back})",
                            v.text
                        ),
                        0.0,
                        1.0,
                        &v,
                    ),
                    "softmax over each channel's positions".to_string(),
                )
            }
            ChannelOp::Reduce => {
                let (red, word) =
                    self.pick(&[("min", "minimum"), ("max", "maximum"), ("sum", "sum")]);
                let keep = self.chance(0.5);
                let mut shape = v.shape.clone();
                if keep {
                    shape[1] = "1".to_string();
                } else {
                    shape.remove(1);
                }
                let ch = f.parse::<f64>().unwrap_or(16.0);
                let (lo, hi) = if red == "sum" {
                    (v.lo * ch.sqrt(), v.hi * ch.sqrt())
                } else {
                    (v.lo, v.hi)
                };
                let text = if keep {
                    format!("{red}({}, axis=1, keepdim=true)", v.text)
                } else {
                    format!("{red}({}, axis=1)", v.text)
                };
                (
                    Val::call(text, shape, lo, hi),
                    format!("{word} over channels"),
                )
            }
        };
        self.done(out, word)
    }

    fn finish(mut self, family: Family, out: Val) -> Draft {
        let dt = self.dtype.name();
        let ty = |shape: &[String], dt: &str| format!("{dt}[{}]", shape.join(", "));
        let mut lines: Vec<String> = self
            .inputs
            .iter()
            .map(|i| format!("input {}: {}", i.name, ty(&i.shape, dt)))
            .collect();
        let out_dt = if out.int { "i64" } else { dt };
        let y = self.name(&["Y", "O", "Out"]);
        lines.push(format!("output {y}: {}", ty(&out.shape, out_dt)));
        let mut stmts = self.stmts;
        // `Y = T3` after `T3 = ...` would be a copy (one more eager kernel): assign Y directly.
        let last = stmts
            .last()
            .and_then(|s| s.strip_prefix(&format!("{} = ", out.text)))
            .map(str::to_string);
        let value = match last {
            Some(expr) => {
                stmts.pop();
                expr
            }
            None => out.text,
        };
        lines.extend(stmts);
        lines.push(format!("{y} = {value}"));
        Draft {
            family,
            dtype: self.dtype,
            source: lines.join("\n") + "\n",
            inputs: self.inputs,
            roles: self.roles,
            words: self.words,
        }
    }
}
