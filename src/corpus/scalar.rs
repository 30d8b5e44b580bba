//! Elementwise op-language expressions as C float expressions, for the naive kernels: every
//! tensor read at a flat index (a trailing-dims tensor such as a bias `[N]` broadcast over
//! `[M, N]` as `b[i % N]`), constants as float literals, each function through a small
//! `__device__` helper written once per kernel. An expression this cannot render exactly gives
//! `None`, and the task gets no naive kernel of that kind.

use std::collections::BTreeMap;

use crate::ops::ast::{BinOp, Dim, Expr, Op, Poly, UnaryFn};

/// A float literal in C (`0.5f`, `1e-05f`).
pub(super) fn float_lit(v: f64) -> String {
    let s = format!("{v:?}");
    let s = if s.contains(['.', 'e']) {
        s
    } else {
        format!("{s}.0")
    };
    if v < 0.0 {
        format!("({s}f)")
    } else {
        format!("{s}f")
    }
}

/// `(long long)M * N` as a C expression that cannot overflow int.
pub(super) fn long_product(shape: &[Dim]) -> String {
    match shape {
        [] => "1".into(),
        [d] => format!("(long long){d}"),
        [d, rest @ ..] => format!(
            "(long long){d} * {}",
            rest.iter()
                .map(Dim::to_string)
                .collect::<Vec<_>>()
                .join(" * ")
        ),
    }
}

/// Renders elementwise expressions as C float expressions at a flat index.
pub(super) struct Render<'c> {
    /// Symbolic shape of every tensor the expression may read.
    shapes: &'c BTreeMap<String, Vec<Dim>>,
    /// Named constants.
    consts: &'c BTreeMap<String, f64>,
    /// The conversion of each tensor's elements to float ("" when they are float).
    loads: &'c BTreeMap<String, &'static str>,
    /// The kernel names of computed sizes (`kevin_d0` for `C*H*W`), in which `shapes` are.
    aliases: &'c BTreeMap<Poly, String>,
    /// The shape the flat index runs over.
    shape: Vec<Dim>,
    /// The flat index as a C expression (a local's name, or an index computed from it inside a
    /// view).
    index: String,
    /// The matrix product this expression contains, rendered as `acc`.
    pub(super) matmul: Option<Expr>,
    /// A row-wise operation rendered as a variable.
    pub(super) row_value: Option<(Expr, String)>,
    /// Device helper functions used, by name.
    helpers: BTreeMap<String, String>,
    /// Their names in the order they were first used: a helper that calls another (`mish_f`
    /// calls `softplus_f`) asks for it first, so this order defines every callee before its
    /// caller.
    order: Vec<String>,
}

impl<'c> Render<'c> {
    pub(super) fn new(
        shapes: &'c BTreeMap<String, Vec<Dim>>,
        consts: &'c BTreeMap<String, f64>,
        loads: &'c BTreeMap<String, &'static str>,
        aliases: &'c BTreeMap<Poly, String>,
        shape: &[Dim],
        index: &str,
    ) -> Self {
        Render {
            shapes,
            consts,
            loads,
            aliases,
            shape: shape.to_vec(),
            index: index.to_string(),
            matmul: None,
            row_value: None,
            helpers: BTreeMap::new(),
            order: Vec::new(),
        }
    }

    /// Starts from the helpers `other` defined: a kernel rendered in two parts (before and after
    /// a reduction or a row operation) then gives every helper one name across both, and
    /// [`Self::helpers`] of the second part defines them all.
    pub(super) fn inherit_helpers(&mut self, other: &Render) {
        self.helpers = other.helpers.clone();
        self.order = other.order.clone();
    }

    /// The helper functions, each on its own line(s), callees before callers.
    pub(super) fn helpers(&self) -> String {
        let mut s = String::new();
        for h in self.order.iter().filter_map(|n| self.helpers.get(n)) {
            s.push_str(h);
            s.push('\n');
        }
        s
    }

    /// How tensor `v` is read at the flat index, or None when it does not broadcast simply.
    fn tensor_at(&self, v: &str) -> Option<String> {
        let s = self.shapes.get(v)?;
        let i = &self.index;
        let at = if *s == self.shape {
            format!("{v}[{i}]")
        } else if s.iter().all(|d| *d == Dim::Lit(1)) {
            format!("{v}[0]")
        } else if s.len() < self.shape.len() && self.shape.ends_with(s) {
            // Trailing dims: a bias [N] over [M, N] repeats every N elements (a product in
            // parentheses: `%` binds like `*`).
            if s.len() == 1 {
                format!("{v}[{i} % {}]", long_product(s))
            } else {
                format!("{v}[{i} % ({})]", long_product(s))
            }
        } else if let Some(inner) = self.per_row(s) {
            // Trailing dims of extent 1: a per-row value [M, 1] over [M, N] is read once per
            // `inner` elements.
            format!("{v}[{i} / {inner}]")
        } else {
            // Any other broadcast ([B, 1, N] over [B, M, N]): the coordinates of the flat index
            // along the dims the tensor has, each times the tensor's own stride.
            format!("{v}[{}]", self.broadcast_index(s)?)
        };
        Some(match self.loads.get(v).copied().unwrap_or("") {
            "" => at,
            f => format!("{f}({at})"),
        })
    }

    /// For a tensor of the iteration shape's rank whose dims agree with it up to a run of
    /// trailing 1s (`[M, 1]` or `[B, M, 1]` over `[B, M, N]` when ranks match), the number of
    /// elements each of its values covers, as a C expression.
    fn per_row(&self, s: &[Dim]) -> Option<String> {
        if s.len() != self.shape.len() {
            return None;
        }
        let keep = s
            .iter()
            .rposition(|d| *d != Dim::Lit(1))
            .map_or(0, |p| p + 1);
        if keep == s.len() || s[..keep] != self.shape[..keep] {
            return None;
        }
        Some(format!("({})", long_product(&self.shape[keep..])))
    }

    /// The flat index into a tensor of shape `s` that broadcasts (NumPy's rules, aligned to
    /// the right) over the iteration shape, as a C expression of the flat index; None when a
    /// dim is neither 1 nor the iteration shape's.
    fn broadcast_index(&self, s: &[Dim]) -> Option<String> {
        let r = self.shape.len();
        if s.len() > r {
            return None;
        }
        let lead = r - s.len();
        let mut terms = Vec::new();
        for k in lead..r {
            let d = &s[k - lead];
            if *d == Dim::Lit(1) {
                continue;
            }
            if *d != self.shape[k] {
                return None;
            }
            let c = self.coord(k);
            let stride: Vec<&Dim> = s[k - lead + 1..]
                .iter()
                .filter(|x| **x != Dim::Lit(1))
                .collect();
            terms.push(if stride.is_empty() {
                format!("({c})")
            } else {
                let dims: Vec<String> = stride.iter().map(|x| x.to_string()).collect();
                format!("({c}) * {}", dims.join(" * "))
            });
        }
        Some(if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        })
    }

    /// The coordinate of the flat index along axis `k` of the iteration shape, as a C
    /// expression.
    fn coord(&self, k: usize) -> String {
        let i = &self.index;
        let inner = &self.shape[k + 1..];
        let c = if inner.is_empty() {
            i.to_string()
        } else {
            format!("({i} / ({}))", long_product(inner))
        };
        if k > 0 {
            format!("{c} % {}", self.shape[k])
        } else {
            c
        }
    }

    /// The shape of `e` (None when it reads a name this renderer does not know).
    fn shape_of(&self, e: &Expr) -> Option<Vec<Dim>> {
        super::naive::aliased_shape_over(e, self.shapes, self.consts, self.aliases)
    }

    /// `unsqueeze(x)` or `squeeze(x)` (`view`, of shape `vs`): the same elements in the same
    /// order, so `x` is read at the flat index into the view, which is the iteration's own
    /// index when the two shapes differ only by extents of 1, and else the view's broadcast
    /// index.
    fn view(&mut self, view: &Expr, x: &Expr) -> Option<String> {
        let vs = self.shape_of(view)?;
        let xs = self.shape_of(x)?;
        let index = if squeezed(&vs) == squeezed(&self.shape) {
            self.index.clone()
        } else {
            format!("({})", self.broadcast_index(&vs)?)
        };
        let shape = std::mem::replace(&mut self.shape, xs);
        let index = std::mem::replace(&mut self.index, index);
        let v = self.scalar(x);
        self.shape = shape;
        self.index = index;
        v
    }

    /// `flip(x, axis)`: `x` read at the flat index whose coordinate `a` along the axis is
    /// `extent - 1 - a`. Only an elementwise `x`: a product or row operation inside is a
    /// value at this index alone, so the staged writer computes it first.
    fn flip(&mut self, flip: &Expr, x: &Expr, axis: i64) -> Option<String> {
        let inside = |v: Option<&Expr>| v.is_some_and(|m| contains(x, m));
        if inside(self.matmul.as_ref()) || inside(self.row_value.as_ref().map(|(r, _)| r)) {
            return None;
        }
        let fs = self.shape_of(flip)?;
        let at = crate::ops::normalize_axis(axis, fs.len())?;
        let base = if fs == self.shape {
            self.index.clone()
        } else {
            format!("({})", self.broadcast_index(&fs)?)
        };
        let shape = std::mem::replace(&mut self.shape, fs);
        let index = std::mem::replace(&mut self.index, base);
        let a = self.coord(at);
        let inner = long_product(&self.shape[at + 1..]);
        self.index = format!(
            "({} + ((long long){} - 1 - 2 * ({a})) * {inner})",
            self.index, self.shape[at]
        );
        let v = self.scalar(x);
        self.shape = shape;
        self.index = index;
        v
    }

    /// `gather(x, index, axis)` of a tensor `x`: `x` read where the flat index's coordinate
    /// along the axis is the index's element there (an i64, read as it is).
    fn gather(&mut self, g: &Expr, args: &[Expr], axis: i64) -> Option<String> {
        let [Expr::Var(x), index] = args else {
            return None;
        };
        let (gs, xs) = (self.shape_of(g)?, self.shapes.get(x)?.clone());
        if squeezed(&gs) != squeezed(&self.shape) {
            return None;
        }
        let at = crate::ops::normalize_axis(axis, gs.len())?;
        let shape = std::mem::replace(&mut self.shape, gs);
        let v = self.scalar(index).map(|v| {
            let (i, ka, kx) = (&self.index, &self.shape[at], &xs[at]);
            let inner = &self.shape[at + 1..];
            let outer = match (inner.is_empty(), *ka == Dim::Lit(1)) {
                (true, true) => i.to_string(),
                (true, false) => format!("({i} / {ka})"),
                (false, _) => format!("({i} / ({} * {ka}))", long_product(inner)),
            };
            if inner.is_empty() {
                format!("{outer} * {kx} + {v}")
            } else {
                let n = long_product(inner);
                format!("({outer} * {kx} + {v}) * {n} + {i} % ({n})")
            }
        });
        self.shape = shape;
        let at = v?;
        Some(match self.loads.get(x).copied().unwrap_or("") {
            "" => format!("{x}[{at}]"),
            f => format!("{f}({x}[{at}])"),
        })
    }

    /// `triu(x)` / `tril(x)`: `x` where the column of the element in its matrix minus its row
    /// is at least (at most) `diagonal`, else 0. Row and column are the iteration's coordinates
    /// along the matrix's two axes (0 along an axis of extent 1 that broadcasts).
    fn triangle(&mut self, tri: &Expr, x: &Expr, upper: bool, diagonal: i64) -> Option<String> {
        let ts = self.shape_of(tri)?;
        let (r, t) = (self.shape.len(), ts.len());
        if t < 2 || t > r {
            return None;
        }
        let at = |k: usize| -> String {
            if ts[k - (r - t)] == Dim::Lit(1) {
                "0".into()
            } else {
                format!("({})", self.coord(k))
            }
        };
        let (row, col) = (at(r - 2), at(r - 1));
        let cmp = if upper { ">=" } else { "<=" };
        let v = self.scalar(x)?;
        Some(format!("(({col} - {row} {cmp} {diagonal}LL) ? {v} : 0.0f)"))
    }

    fn helper(&mut self, name: &str, body: &str) -> String {
        if !self.helpers.contains_key(name) {
            let def =
                format!("__device__ __forceinline__ float {name}(float x) {{ return {body}; }}");
            self.helpers.insert(name.to_string(), def);
            self.order.push(name.to_string());
        }
        name.to_string()
    }

    fn unary(&mut self, f: UnaryFn, x: String) -> String {
        use UnaryFn::*;
        let call = |name: String| format!("{name}({x})");
        match f {
            Relu => format!("fmaxf({x}, 0.0f)"),
            Gelu => call(self.helper(
                "gelu_f",
                "0.5f * x * (1.0f + erff(x * 0.70710678118654752f))",
            )),
            GeluTanh => call(self.helper(
                "gelu_tanh_f",
                "0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)))",
            )),
            Silu => call(self.helper("silu_f", "x / (1.0f + expf(-x))")),
            Sigmoid => call(self.helper("sigmoid_f", "1.0f / (1.0f + expf(-x))")),
            Tanh => format!("tanhf({x})"),
            Exp => format!("expf({x})"),
            Log => format!("logf({x})"),
            Abs => format!("fabsf({x})"),
            Neg => format!("(-({x}))"),
            Sqrt => format!("sqrtf({x})"),
            Rsqrt => format!("rsqrtf({x})"),
            Square => call(self.helper("square_f", "x * x")),
            Softplus => call(self.helper("softplus_f", "fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)))")),
            Mish => {
                self.helper("softplus_f", "fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)))");
                call(self.helper("mish_f", "x * tanhf(softplus_f(x))"))
            }
            Hardsigmoid => {
                call(self.helper("hardsigmoid_f", "fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f"))
            }
            Hardswish => call(self.helper(
                "hardswish_f",
                "x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f",
            )),
        }
    }

    pub(super) fn scalar(&mut self, e: &Expr) -> Option<String> {
        if self.matmul.as_ref() == Some(e) {
            return Some("acc".into());
        }
        if let Some((row, name)) = &self.row_value {
            if row == e {
                return Some(name.clone());
            }
        }
        Some(match e {
            Expr::Num(v) => float_lit(*v),
            Expr::Var(v) => match self.consts.get(v) {
                Some(c) => float_lit(*c),
                None => self.tensor_at(v)?,
            },
            Expr::Neg(a) => format!("(-{})", self.scalar(a)?),
            Expr::Binary(op, a, b) => {
                let (a, b) = (self.scalar(a)?, self.scalar(b)?);
                match op {
                    BinOp::Add => format!("({a} + {b})"),
                    BinOp::Sub => format!("({a} - {b})"),
                    BinOp::Mul => format!("({a} * {b})"),
                    BinOp::Div => format!("({a} / {b})"),
                    BinOp::Max => format!("fmaxf({a}, {b})"),
                    BinOp::Min => format!("fminf({a}, {b})"),
                    BinOp::Pow => format!("powf({a}, {b})"),
                    BinOp::MatMul => return None,
                }
            }
            Expr::Call {
                op: Op::Gather { axis },
                args,
            } => return self.gather(e, args, *axis),
            Expr::Call { op, args } => {
                let [x] = args.as_slice() else {
                    return None;
                };
                match op {
                    Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Reshape { .. } => {
                        return self.view(e, x)
                    }
                    Op::Triangle { upper, diagonal } => {
                        return self.triangle(e, x, *upper, *diagonal)
                    }
                    Op::Flip { axis } => return self.flip(e, x, *axis),
                    _ => {}
                }
                let x = self.scalar(x)?;
                match op {
                    Op::Unary(f) => self.unary(*f, x),
                    Op::LeakyRelu { slope } => {
                        let name = self.leaky_helper(*slope);
                        format!("{name}({x})")
                    }
                    Op::Elu { alpha } => {
                        let body = format!("x > 0.0f ? x : {} * expm1f(x)", float_lit(*alpha));
                        let name = self.param_helper("elu", &body);
                        format!("{name}({x})")
                    }
                    Op::Clamp { lo, hi, .. } => {
                        format!("fminf(fmaxf({x}, {}), {})", float_lit(*lo), float_lit(*hi))
                    }
                    _ => return None,
                }
            }
        })
    }

    fn leaky_helper(&mut self, slope: f64) -> String {
        let body = format!("x > 0.0f ? x : {} * x", float_lit(slope));
        self.param_helper("leaky_relu", &body)
    }

    /// A helper whose body depends on a parameter: one function per distinct value.
    fn param_helper(&mut self, base: &str, body: &str) -> String {
        if let Some((n, _)) = self.helpers.iter().find(|(_, h)| h.contains(body)) {
            return n.clone();
        }
        let count = self.helpers.keys().filter(|k| k.starts_with(base)).count();
        let name = if count == 0 {
            format!("{base}_f")
        } else {
            format!("{base}_f{count}")
        };
        self.helper(&name, body)
    }
}

/// The shape of `e` over tensors of `shapes` and scalar `consts` (None when it reads another
/// name, or its shapes do not combine).
pub(super) fn shape_over(
    e: &Expr,
    shapes: &BTreeMap<String, Vec<Dim>>,
    consts: &BTreeMap<String, f64>,
) -> Option<Vec<Dim>> {
    let mut names = std::collections::BTreeSet::new();
    crate::ops::ast::collect_vars(e, &mut names);
    if !names
        .iter()
        .all(|n| shapes.contains_key(n) || consts.contains_key(n))
    {
        return None;
    }
    crate::ops::expr_shape(e, &|n| shapes.get(n).cloned()).ok()
}

/// True when `sub` occurs in `e`.
fn contains(e: &Expr, sub: &Expr) -> bool {
    e == sub
        || match e {
            Expr::Neg(a) => contains(a, sub),
            Expr::Binary(_, a, b) => contains(a, sub) || contains(b, sub),
            Expr::Call { args, .. } => args.iter().any(|a| contains(a, sub)),
            _ => false,
        }
}

/// `s` without its extents of 1: the shapes a view (unsqueeze, squeeze) moves between.
pub(super) fn squeezed(s: &[Dim]) -> Vec<Dim> {
    s.iter().filter(|d| **d != Dim::Lit(1)).cloned().collect()
}
