//! Programs with more than one core operation (a matrix product then a softmax, a softmax then
//! a product, a reduction of a product, elementwise work on a product's operand): a kernel per
//! stage, each writing its result in f32 to a scratch buffer that the next stage reads.
//!
//! The program is lowered bottom-up until every stage holds at most one core operation (a
//! matrix product, a reduction, a row operation or a transpose) with elementwise work around
//! it, and a product's operands are tensors. Every stage is then written by the single-kernel
//! writers of [`super`], so a staged form is exactly as trustworthy as they are, and is
//! evaluated like them. Two forms come out: every stage's simplest form, and every stage's
//! last (tiled products, a block per row) when that differs.

use std::collections::{BTreeMap, BTreeSet};

use super::{is_rowop, product_or_one, Ctx, Generated};
use crate::ops::ast::{BinOp, Dim, Expr, Op};
use crate::ops::Dtype;

/// An operation that fixes a kernel's thread mapping.
fn is_core(e: &Expr) -> bool {
    match e {
        Expr::Binary(BinOp::MatMul, ..) => true,
        Expr::Call { op, .. } => {
            matches!(op, Op::Reduce { .. } | Op::Transpose { .. })
                || is_rowop(op)
                || super::window::is_windowed(op)
        }
        _ => false,
    }
}

/// The right operand of a product as the product writers take it: a tensor, or the transpose
/// of one (read transposed, not a stage of its own).
fn plain_rhs(e: &Expr) -> bool {
    match e {
        Expr::Var(_) => true,
        Expr::Call {
            op: Op::Transpose { .. },
            args,
        } => matches!(args.as_slice(), [Expr::Var(_)]),
        _ => false,
    }
}

/// Core operations in `e`.
fn cores(e: &Expr) -> usize {
    cores_with(e, &|_| 0)
}

/// Core operations in `e`, where `chain(x)` > 1 says that `x` begins that many nested
/// reductions one kernel computes, counted once.
fn cores_with(e: &Expr, chain: &dyn Fn(&Expr) -> usize) -> usize {
    let depth = chain(e);
    if depth > 1 {
        return 1 + cores_with(innermost(e, depth), chain);
    }
    let count = |x: &Expr| cores_with(x, chain);
    usize::from(is_core(e))
        + match e {
            Expr::Binary(BinOp::MatMul, a, b) => count(a) + if plain_rhs(b) { 0 } else { count(b) },
            Expr::Binary(_, a, b) => count(a) + count(b),
            Expr::Neg(a) => count(a),
            Expr::Call { args, .. } => args.iter().map(count).sum(),
            _ => 0,
        }
}

/// The operand of the `depth`-th call nested in `e` (its first operand each time).
fn innermost(e: &Expr, depth: usize) -> &Expr {
    match e {
        Expr::Call { args, .. } if depth > 0 && !args.is_empty() => innermost(&args[0], depth - 1),
        _ => e,
    }
}

/// [`innermost`], to rewrite in place (None when `e` has fewer nested calls).
fn innermost_mut(e: &mut Expr, depth: usize) -> Option<&mut Expr> {
    if depth == 0 {
        return Some(e);
    }
    match e {
        Expr::Call { args, .. } => innermost_mut(args.first_mut()?, depth - 1),
        _ => None,
    }
}

/// The operands of `e`, to rewrite in place.
fn operands_mut(e: &mut Expr) -> Vec<&mut Expr> {
    match e {
        Expr::Binary(_, a, b) => vec![a.as_mut(), b.as_mut()],
        Expr::Neg(a) => vec![a.as_mut()],
        Expr::Call { args, .. } => args.iter_mut().collect(),
        _ => Vec::new(),
    }
}

/// What the one core of a stage computes, in words.
fn core_words(e: &Expr) -> String {
    let mut found = Vec::new();
    super::find_calls(
        e,
        &|op| is_rowop(op) || matches!(op, Op::Reduce { .. }) || super::window::is_windowed(op),
        &mut found,
    );
    let mut products = Vec::new();
    super::find_matmuls(e, &mut products);
    if !products.is_empty() {
        return "the matrix product".into();
    }
    match found.first() {
        Some(Expr::Call { op, .. }) => match op {
            Op::Reduce { kind, .. } => format!("the {} reduction", kind.name()),
            Op::Softmax { .. } => "the softmax".into(),
            Op::LogSoftmax { .. } => "the log_softmax".into(),
            Op::LayerNorm { .. } => "the layer norm".into(),
            Op::RmsNorm { .. } => "the RMS norm".into(),
            Op::L2Norm { .. } => "the L2 normalisation".into(),
            Op::Cumsum { .. } => "the cumulative sum".into(),
            Op::Cumprod { .. } => "the cumulative product".into(),
            Op::Conv { transposed, .. } => if *transposed {
                "the transposed convolution"
            } else {
                "the convolution"
            }
            .into(),
            Op::Pool { max, .. } => if *max {
                "the max pooling"
            } else {
                "the average pooling"
            }
            .into(),
            Op::ChannelNorm { .. } => "the norm over channels".into(),
            _ => "its operation".into(),
        },
        _ if cores(e) > 0 => "the transpose".into(),
        _ => "the elementwise work".into(),
    }
}

/// How a form maps threads, in words.
fn form_words(form: &str) -> &'static str {
    let table: [(&str, &str); 14] = [
        ("window", "a thread per output element walking its window"),
        (
            "channel_norm_thread",
            "a thread per set of elements sharing statistics",
        ),
        (
            "channel_norm_block",
            "a block per set of elements sharing statistics",
        ),
        ("elementwise", "a thread per element"),
        ("matmul_naive", "a thread per output element"),
        ("matmul_tiled", "shared-memory tiles"),
        (
            "bmm_naive",
            "a thread per output element, the batch on the grid's z",
        ),
        ("matvec_naive", "a thread per row"),
        ("reduce_thread_per_output", "a thread per output"),
        ("reduce_block", "a block per row and a shared-memory tree"),
        ("rowwise_thread_per_row", "a thread per row"),
        (
            "rowwise_block",
            "a block per row with block-wide reductions",
        ),
        ("transpose_naive", "a 2-D grid of copies"),
        ("transpose_elementwise", "a thread per output element"),
    ];
    table
        .iter()
        .find(|(p, _)| form.starts_with(p))
        .map_or("its own kernel", |(_, w)| w)
}

/// A stage: the buffer it writes (a scratch name, or the output for the last) and its
/// expression over the inputs and earlier scratch buffers.
struct Stage {
    target: String,
    expr: Expr,
}

/// The program cut into stages of one core operation each.
struct Lowering<'c, 'a> {
    ctx: &'c Ctx<'a>,
    stages: Vec<Stage>,
    /// Every scratch buffer and its shape, in order.
    scratch: Vec<(String, Vec<Dim>)>,
    /// What each scratch buffer holds, over the inputs alone (for its shape).
    holds: BTreeMap<String, Expr>,
}

impl Lowering<'_, '_> {
    /// `e` with every scratch buffer replaced by what it holds.
    fn expand(&self, e: &Expr) -> Expr {
        super::substitute(e, &|v| self.holds.get(v).cloned())
    }

    /// The shape of a tensor or scratch buffer.
    fn shape_of(&self, v: &str) -> Option<&Vec<Dim>> {
        self.ctx
            .shapes
            .get(v)
            .or_else(|| self.scratch.iter().find(|(n, _)| n == v).map(|(_, s)| s))
    }

    /// A new stage computing `e` into a new f32 scratch buffer; the buffer, to read instead.
    fn stage(&mut self, mut e: Expr) -> Option<Expr> {
        let full = self.expand(&e);
        let mut ty = crate::ops::infer_expr(&self.ctx.task.program, &full).ok()?;
        if ty.dtype == Some(Dtype::I64) {
            return None;
        }
        ty.shape = self.ctx.aliased(&ty.shape)?;
        // The same value twice (an intermediate read in two places) is computed once.
        if let Some((n, _)) = self.holds.iter().find(|(_, h)| **h == full) {
            return Some(Expr::Var(n.clone()));
        }
        let taken: BTreeSet<&String> = self.ctx.shapes.keys().chain(self.holds.keys()).collect();
        let name = (0..)
            .map(|i| format!("tmp{i}"))
            .find(|n| !taken.contains(n) && !self.ctx.consts.contains_key(n))?;
        // A core that the writers cannot take with the work around it (a reduction broadcast
        // back over its operand) is a stage of its own first, as in the last stage.
        let mut scratch = self.scratch.clone();
        scratch.push((name.clone(), ty.shape.clone()));
        let alone = self
            .ctx
            .stage_ctx(&scratch, Some(&name))
            .single(&e)
            .is_some();
        if !alone {
            if let Some(core) = first_core(&e).filter(|c| **c != e).cloned() {
                let read = self.stage(core.clone())?;
                replace(&mut e, &core, &read);
                return self.stage(e);
            }
        }
        self.scratch.push((name.clone(), ty.shape));
        self.holds.insert(name.clone(), full);
        self.stages.push(Stage {
            target: name.clone(),
            expr: e,
        });
        Some(Expr::Var(name))
    }

    /// The number of reductions nested in `e` that one reduction kernel computes together (1
    /// for a lone reduction, 0 when `e` is none).
    fn chain(&self, e: &Expr) -> usize {
        let full = self.expand(e);
        let depth = self.ctx.reduce_chain(&full).map_or(0, |c| c.depth);
        // Only the calls written in `e` itself: a scratch buffer that holds reductions is read,
        // not computed again (counting through it, `innermost` would stop at the buffer and
        // the count would never end).
        let mut own = 0;
        let mut x = e;
        while let Expr::Call { args, .. } = x {
            if own == depth || args.is_empty() {
                break;
            }
            own += 1;
            x = &args[0];
        }
        own
    }

    /// Core operations in `e`, reductions that one kernel computes together counted once.
    fn cores(&self, e: &Expr) -> usize {
        cores_with(e, &|x| self.chain(x))
    }

    /// `e` with inner stages split off, so that it holds at most one core operation.
    fn lower(&mut self, e: &Expr) -> Option<Expr> {
        let depth = self.chain(e);
        if depth > 1 {
            // Reductions that one kernel computes: their operand is lowered, and computed
            // first when it has a core of its own.
            let mut out = e.clone();
            let operand = innermost_mut(&mut out, depth)?;
            let mut lowered = self.lower(operand)?;
            if self.cores(&lowered) > 0 {
                lowered = self.stage(lowered)?;
            }
            *operand = lowered;
            return Some(out);
        }
        let mut out = e.clone();
        let product = matches!(e, Expr::Binary(BinOp::MatMul, ..));
        for (i, arg) in operands_mut(&mut out).into_iter().enumerate() {
            if !(product && i == 1 && plain_rhs(arg)) {
                *arg = self.lower(arg)?;
            }
        }
        if let Expr::Binary(BinOp::MatMul, a, b) = &mut out {
            // A product reads tensors (a matrix's transpose in place, a batch's as a stage of
            // its own): any other operand (a view or a triangle of a tensor too) is computed
            // first.
            if !matches!(a.as_ref(), Expr::Var(_)) {
                **a = self.stage((**a).clone())?;
            }
            let read_in_place = match b.as_ref() {
                Expr::Var(_) => true,
                Expr::Call {
                    op: Op::Transpose { .. },
                    args,
                } => match args.as_slice() {
                    [Expr::Var(w)] => self.shape_of(w).is_some_and(|s| s.len() == 2),
                    _ => false,
                },
                _ => false,
            };
            if !read_in_place {
                **b = self.stage((**b).clone())?;
            }
            return Some(out);
        }
        // One core per stage: this node's own, or (when it has none) one operand's.
        let keep = usize::from(!is_core(&out));
        let with_core: Vec<usize> = operands_mut(&mut out)
            .iter()
            .enumerate()
            .filter(|(_, a)| self.cores(a) > 0)
            .map(|(i, _)| i)
            .collect();
        let split = with_core.len().saturating_sub(keep);
        for &i in &with_core[..split] {
            let arg = operands_mut(&mut out).swap_remove(i).clone();
            let read = self.stage(arg)?;
            *operands_mut(&mut out).swap_remove(i) = read;
        }
        Some(out)
    }
}

/// The kernels of one stage: its launch lines and the rest of its source.
fn split_launches(source: &str) -> (Vec<&str>, String) {
    let mut launches = Vec::new();
    let mut rest = String::new();
    for line in source.lines() {
        if line.starts_with("// kevin: launch ") {
            launches.push(line);
        } else {
            rest.push_str(line);
            rest.push('\n');
        }
    }
    (launches, rest)
}

/// `source` (a stage's launch lines and kernels) with each kernel's parameters that its body
/// never reads or writes left out, of its signature and of its launch lines' `args` alike. Every
/// stage is written over every tensor and size of the program; an answer of four stages then
/// passed eleven arguments to each and outgrew the policy's 1,024 new tokens (issue 19,
/// 2026-12-06). A kernel whose parameters and arguments do not pair up is left as it is.
fn prune_params(source: &str) -> String {
    let launch_name = |l: &str| -> Option<String> {
        let rest = l.strip_prefix("// kevin: launch ")?;
        Some(rest.split_whitespace().next()?.to_string())
    };
    let args_of = |l: &str| -> Option<(usize, usize)> {
        let start = l.rfind("args=(")? + "args=(".len();
        Some((start, start + l[start..].rfind(')')?))
    };
    let names: BTreeSet<String> = source.lines().filter_map(launch_name).collect();
    let mut text = source.to_string();
    let mut keep: BTreeMap<String, Vec<bool>> = BTreeMap::new();
    for name in &names {
        // The definition: `NAME(` on a `__global__` line.
        let Some(at) = text
            .match_indices(&format!(" {name}("))
            .map(|(i, _)| i + 1)
            .find(|&i| {
                let line_start = text[..i].rfind('\n').map_or(0, |p| p + 1);
                text[line_start..i].contains("__global__")
            })
        else {
            continue;
        };
        let open = at + name.len();
        let Some(close) = matching(&text, open, '(', ')') else {
            continue;
        };
        let Some(body_open) = text[close..].find('{').map(|p| close + p) else {
            continue;
        };
        let Some(body_close) = matching(&text, body_open, '{', '}') else {
            continue;
        };
        let params: Vec<&str> = text[open + 1..close].split(',').map(str::trim).collect();
        let body = &text[body_open..=body_close];
        let used_words: BTreeSet<&str> = body
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .collect();
        let mask: Vec<bool> = params
            .iter()
            .map(|p| {
                let param = p
                    .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next();
                param.is_none_or(|n| used_words.contains(n))
            })
            .collect();
        // Every launch of the kernel must pass one argument a parameter.
        let pairs = text
            .lines()
            .filter(|l| launch_name(l).as_deref() == Some(name.as_str()))
            .all(|l| args_of(l).is_some_and(|(a, b)| l[a..b].split(',').count() == params.len()));
        if !pairs || mask.iter().all(|&k| k) || !mask.iter().any(|&k| k) {
            continue;
        }
        let kept: Vec<&str> = params
            .iter()
            .zip(&mask)
            .filter(|(_, &k)| k)
            .map(|(p, _)| *p)
            .collect();
        let new_params = kept.join(", ");
        text.replace_range(open + 1..close, &new_params);
        keep.insert(name.clone(), mask);
    }
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let pruned = launch_name(line)
            .and_then(|n| keep.get(&n))
            .and_then(|mask| {
                let (start, end) = args_of(line)?;
                let kept: Vec<&str> = line[start..end]
                    .split(',')
                    .map(str::trim)
                    .zip(mask)
                    .filter(|(_, &k)| k)
                    .map(|(a, _)| a)
                    .collect();
                Some(format!(
                    "{}{}{}",
                    &line[..start],
                    kept.join(", "),
                    &line[end..]
                ))
            });
        out.push_str(pruned.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The index of the bracket closing the one `open` at `at` in `text`.
fn matching(text: &str, at: usize, open: char, close: char) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[at..].char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some(at + i);
            }
        }
    }
    None
}

/// The device code of several stages as one translation unit: a helper, a block reduction or
/// a `#define` written by two stages appears once (a macro given another value is undefined
/// first), each kernel in stage order.
fn join_bodies(bodies: &[String]) -> String {
    let mut seen = BTreeSet::new();
    let mut defines: BTreeMap<String, String> = BTreeMap::new();
    // Device functions by name, as first defined: a later stage that defines the same name
    // otherwise (an `elu_f` of another alpha) gets its own name for it.
    let mut functions: BTreeMap<String, String> = BTreeMap::new();
    let mut out = String::new();
    for (k, body) in bodies.iter().enumerate() {
        let mut parts = chunks(body);
        let clashes: Vec<String> = parts
            .iter()
            .filter_map(|c| {
                let name = function_name(c)?;
                functions
                    .get(name)
                    .is_some_and(|first| first != c)
                    .then(|| name.to_string())
            })
            .collect();
        if !clashes.is_empty() {
            let mut renamed = body.clone();
            for name in &clashes {
                renamed = rename_calls(&renamed, name, &format!("{name}_s{}", k + 1));
            }
            parts = chunks(&renamed);
        }
        for text in parts {
            if let Some(name) = function_name(&text) {
                functions
                    .entry(name.to_string())
                    .or_insert_with(|| text.clone());
            }
            if let Some(def) = text.strip_prefix("#define ") {
                let (name, value) = def.trim().split_once(' ').unwrap_or((def.trim(), ""));
                match defines.insert(name.to_string(), value.to_string()) {
                    Some(old) if old == value => continue,
                    Some(_) => out.push_str(&format!("#undef {name}\n")),
                    None => {}
                }
                out.push_str(&text);
            } else if text.starts_with("__global__") || seen.insert(text.clone()) {
                out.push_str(&text);
            }
        }
    }
    out
}

/// The top-level pieces of device code: a preprocessor line, a one-line helper, or a function up
/// to its closing `}` (and whatever trails the last one).
fn chunks(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chunk = String::new();
    for line in body.lines() {
        if !line.trim().is_empty() || !chunk.is_empty() {
            chunk.push_str(line);
            chunk.push('\n');
        }
        let one_line = chunk.lines().count() == 1
            && (line.starts_with('#') || line.starts_with("__device__") && line.ends_with('}'));
        if one_line || line == "}" {
            out.push(std::mem::take(&mut chunk));
        }
    }
    if !chunk.is_empty() {
        out.push(chunk);
    }
    out
}

/// The name a `__device__` function chunk defines.
fn function_name(chunk: &str) -> Option<&str> {
    if !chunk.starts_with("__device__") {
        return None;
    }
    let head = &chunk[..chunk.find('(')?];
    head.rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .filter(|n| !n.is_empty())
}

/// `text` with every call or definition of the function `name` (the name followed by `(`, not
/// preceded by part of another identifier) renamed to `to`.
fn rename_calls(text: &str, name: &str, to: &str) -> String {
    let pattern = format!("{name}(");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(p) = rest.find(&pattern) {
        let before = rest[..p].chars().next_back();
        out.push_str(&rest[..p]);
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            out.push_str(&pattern);
        } else {
            out.push_str(to);
            out.push('(');
        }
        rest = &rest[p + pattern.len()..];
    }
    out.push_str(rest);
    out
}

/// The first core operation of `e` (outermost first).
fn first_core(e: &Expr) -> Option<&Expr> {
    if is_core(e) {
        return Some(e);
    }
    match e {
        Expr::Binary(_, a, b) => first_core(a).or_else(|| first_core(b)),
        Expr::Neg(a) => first_core(a),
        Expr::Call { args, .. } => args.iter().find_map(first_core),
        _ => None,
    }
}

/// `e` with every occurrence of `from` replaced by `to`.
fn replace(e: &mut Expr, from: &Expr, to: &Expr) {
    if e == from {
        *e = to.clone();
        return;
    }
    for a in operands_mut(e) {
        replace(a, from, to);
    }
}

impl<'a> Ctx<'a> {
    /// The context every stage kernel is written in: every tensor as a parameter (the inputs,
    /// the output, the scratch buffers, then the sizes), writing `target` (a scratch buffer,
    /// stored as f32) or the output when `None`.
    fn stage_ctx(&self, scratch: &[(String, Vec<Dim>)], target: Option<&str>) -> Ctx<'a> {
        let mut c = self.clone();
        let params: Vec<String> = scratch
            .iter()
            .map(|(n, _)| format!("float* __restrict__ {n}"))
            .collect();
        let args: Vec<String> = scratch.iter().map(|(n, _)| n.clone()).collect();
        c.params = [self.tensor_params.as_slice(), &params, &self.size_params]
            .concat()
            .join(", ");
        c.args = [self.tensor_args.as_slice(), &args, &self.size_args]
            .concat()
            .join(", ");
        for (n, shape) in scratch {
            c.shapes.insert(n.clone(), shape.clone());
            c.loads.insert(n.clone(), "");
        }
        if let Some(t) = target {
            c.out = t.to_string();
            c.store = "";
        }
        c
    }
}

impl Ctx<'_> {
    /// A kernel per stage for a program the single-kernel writers do not take (None when a
    /// stage is outside their shapes too, or there is only one stage).
    pub(super) fn staged(&self, e: &Expr) -> Option<Vec<Generated>> {
        let mut low = Lowering {
            ctx: self,
            stages: Vec::new(),
            scratch: Vec::new(),
            holds: BTreeMap::new(),
        };
        let mut last = low.lower(e)?;
        if low.cores(&last) > 1 {
            return None;
        }
        // The last stage's core operation gets a stage of its own when the writers cannot take
        // the two together (a reduction whose result is broadcast back over its operand).
        if self.stage_ctx(&low.scratch, None).single(&last).is_none() {
            let core = first_core(&last).cloned()?;
            let read = low.stage(core.clone())?;
            replace(&mut last, &core, &read);
        }
        if low.stages.is_empty() {
            return None;
        }
        low.stages.push(Stage {
            target: self.out.clone(),
            expr: last,
        });
        let scratch_args: Vec<String> = low.scratch.iter().map(|(n, _)| n.clone()).collect();
        let mut per_stage: Vec<Vec<Generated>> = Vec::new();
        for (k, stage) in low.stages.iter().enumerate() {
            let target = (stage.target != self.out).then_some(stage.target.as_str());
            let mut c = self.stage_ctx(&low.scratch, target);
            c.prefix = format!("stage{}_", k + 1);
            per_stage.push(c.single(&stage.expr)?);
        }
        let decls: String = low
            .scratch
            .iter()
            .map(|(n, s)| format!("// kevin: scratch {n} f32[{}]\n", product_or_one(s)))
            .collect();
        let what = self.program_text();
        let mut picks: Vec<Vec<&Generated>> = vec![per_stage.iter().map(|f| &f[0]).collect()];
        let fast: Vec<&Generated> = per_stage.iter().map(|f| &f[f.len() - 1]).collect();
        if fast.iter().zip(&picks[0]).any(|(a, b)| a.form != b.form) {
            picks.push(fast);
        }
        let mut out = Vec::new();
        for pick in picks {
            let mut launches = String::new();
            let mut bodies = Vec::new();
            for g in &pick {
                let pruned = prune_params(&g.source);
                let (l, rest) = split_launches(&pruned);
                for line in l {
                    launches.push_str(line);
                    launches.push('\n');
                }
                bodies.push(rest);
            }
            let steps: Vec<String> = pick
                .iter()
                .zip(&low.stages)
                .enumerate()
                .map(|(k, (g, s))| {
                    let into = match low.scratch.iter().find(|(n, _)| *n == s.target) {
                        Some((n, shape)) => format!(
                            "into {n} [{}]",
                            shape
                                .iter()
                                .map(Dim::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        None => format!("into {}", self.out),
                    };
                    format!(
                        "stage {} computes {} {into} with {}",
                        k + 1,
                        core_words(&s.expr),
                        form_words(&g.form)
                    )
                })
                .collect();
            let forms: Vec<&str> = pick.iter().map(|g| g.form.as_str()).collect();
            let names = scratch_args.join(", ");
            out.push(Generated {
                form: format!("staged_{}", forms.join("+")),
                source: format!("{decls}{launches}{}", join_bodies(&bodies)),
                reasoning: format!(
                    "`{what}` chains operations that each need their own thread mapping, so the simplest \
                     correct plan is a kernel per stage: {}. Each stage writes its result in f32 to a scratch \
                     buffer declared with `// kevin: scratch`, and launches on one stream run in order, so \
                     every stage reads the previous one complete. The elementwise work of each stage is fused \
                     into its kernel; fusing the stages themselves would save the round trips through memory.",
                    steps.join("; ")
                ),
                summary: format!(
                    "{} kernels launched in order ({}), the intermediates in f32 scratch ({names}), each \
                     stage's elementwise work fused into its kernel and every store bounds-checked.",
                    pick.len(),
                    forms.join(", ")
                ),
            });
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{join_bodies, prune_params};

    #[test]
    fn stage_kernels_take_only_the_parameters_they_use() {
        let src = "// kevin: launch stage1_k grid=(cdiv(M*N,256)) block=(256) args=(A, W, Y, tmp0, M, N)\n\
                   // kevin: launch stage1_k grid=(1) block=(256) args=(A, W, Y, tmp0, M, N)\n\
                   #define BLOCK 256\n\
                   __global__ void __launch_bounds__(BLOCK) stage1_k(const float* __restrict__ A, \
                   const float* __restrict__ W, float* __restrict__ Y, float* __restrict__ tmp0, int M, int N) {\n\
                   \x20   long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n\
                   \x20   if (i >= (long long)M * N) return;\n\
                   \x20   tmp0[i] = A[i] * 2.0f;\n\
                   }\n";
        let out = prune_params(src);
        assert!(
            out.contains(
                "stage1_k(const float* __restrict__ A, float* __restrict__ tmp0, int M, int N) {"
            ),
            "{out}"
        );
        assert_eq!(out.matches("args=(A, tmp0, M, N)").count(), 2, "{out}");
        assert!(out.contains("#define BLOCK 256\n"), "{out}");
        // Arguments that do not pair with the parameters (in one launch of two): the kernel is
        // left as it is.
        let odd = src.replacen("args=(A, W, Y, tmp0, M, N)", "args=(A, W, Y, tmp0, M)", 1);
        assert_eq!(prune_params(&odd), odd);
    }

    #[test]
    fn joined_stages_define_each_helper_once_and_redefine_macros_cleanly() {
        let a = "#define BLOCK 256\n__device__ __forceinline__ float f(float x) { return x; }\n\
                 __global__ void stage1_k(float* y) {\n    y[0] = f(1.0f);\n}\n";
        let b = "#define BLOCK 128\n__device__ __forceinline__ float f(float x) { return x; }\n\
                 __device__ float g(float v) {\n    return v;\n}\n\
                 __global__ void stage2_k(float* y) {\n    y[0] = g(f(2.0f));\n}\n";
        let c = "#define BLOCK 128\n__device__ float g(float v) {\n    return v;\n}\n\
                 __global__ void stage3_k(float* y) {\n    y[0] = g(3.0f);\n}\n";
        let joined = join_bodies(&[a.into(), b.into(), c.into()]);
        assert_eq!(joined.matches("float f(float x)").count(), 1, "{joined}");
        assert_eq!(joined.matches("float g(float v)").count(), 1, "{joined}");
        assert_eq!(joined.matches("#define BLOCK").count(), 2, "{joined}");
        assert!(
            joined.contains("#undef BLOCK\n#define BLOCK 128\n"),
            "{joined}"
        );
        for k in ["stage1_k", "stage2_k", "stage3_k"] {
            assert_eq!(joined.matches(&format!("void {k}(")).count(), 1, "{joined}");
        }
        assert!(joined.find("stage1_k") < joined.find("stage2_k"));
        assert!(joined.find("float g(") < joined.find("stage2_k"));
        // The same helper name with another body in a later stage: renamed in that stage.
        let d = "__device__ __forceinline__ float elu_f(float x) { return x > 0.0f ? x : 1.5f * expm1f(x); }\n\
                 __global__ void stage2_k(float* y) {\n    y[0] = elu_f(y[0]) + kevin_elu_f(1.0f);\n}\n";
        let a = "__device__ __forceinline__ float elu_f(float x) { return x > 0.0f ? x : 1.0f * expm1f(x); }\n\
                 __global__ void stage1_k(float* y) {\n    y[0] = elu_f(y[0]);\n}\n";
        let joined = join_bodies(&[a.into(), d.into()]);
        assert!(
            joined.contains("float elu_f(float x) { return x > 0.0f ? x : 1.0f"),
            "{joined}"
        );
        assert!(
            joined.contains("float elu_f_s2(float x) { return x > 0.0f ? x : 1.5f"),
            "{joined}"
        );
        assert!(
            joined.contains("y[0] = elu_f_s2(y[0]) + kevin_elu_f(1.0f);"),
            "{joined}"
        );
        assert!(joined.contains("    y[0] = elu_f(y[0]);\n"), "{joined}");
    }
}
