//! Naive kernels written from a task's op program: short, plainly correct CUDA that a small model
//! can learn the candidate format from before it learns to be fast.
//!
//! The generator is a tiny compiler for the shapes most tasks take: an elementwise expression
//! (broadcasting a trailing-dims tensor such as a bias `[N]` over `[M, N]`, or a per-row value
//! `[M, 1]`), a matrix product with an elementwise epilogue, a reduction along one axis of an
//! elementwise expression followed by elementwise work on its result, a row-wise operation
//! (softmax, the norms, cumsum) between two elementwise expressions, a plain transpose, and a
//! convolution, pooling or norm over channels between two elementwise expressions
//! (`naive/window.rs`). A size computed from others (a strided output's `(H + 1) // 2`) is a
//! size parameter of the kernel (`kevin_d0`, ...) whose launch argument is the expression.
//! Tensors are f32, f16 or bf16 (each load converted to float, the arithmetic in float, the
//! store rounded to nearest), i64 for argmax/argmin outputs; a program outside these shapes
//! gives no kernel rather than a doubtful one. Each kind comes in a few forms (one thread
//! per element, grid-stride, block sizes, shared-memory tiling, a block per row): the forms are
//! written here, not derived from text, so every one is known to be the kernel it says it is.
//! Whether a form is also correct is not taken on trust: the corpus builder evaluates every one.

use std::collections::{BTreeMap, BTreeSet};

use super::scalar::{float_lit, long_product, shape_over, squeezed, Render};
use crate::ops::ast::{BinOp, Dim, Expr, Op, ReduceKind};
use crate::ops::Dtype;
use crate::ops::Poly;
use crate::tasks::Task;

mod staged;
mod window;

/// One generated kernel: the cuda block and the words around it.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// Short id of the form, e.g. `elementwise_b256` (unique per task).
    pub form: String,
    /// The cuda block (launch lines included).
    pub source: String,
    /// The reasoning paragraph of a response that answers with this kernel.
    pub reasoning: String,
    /// The summary paragraph.
    pub summary: String,
}

/// Every naive form the generator can write for `task` (empty when its program is outside the
/// supported shapes).
pub fn generate(task: &Task) -> Vec<Generated> {
    let names = c_names(&task.program);
    if names.is_empty() {
        return generate_in_c_names(task);
    }
    // Kernels written over the C names, then every line the harness reads (launches, scratch)
    // and the words around them given back the task's names.
    let renamed = Task {
        program: rename_program(&task.program, &names),
        ..task.clone()
    };
    let back: BTreeMap<String, String> = names.into_iter().map(|(n, c)| (c, n)).collect();
    let mut out = generate_in_c_names(&renamed);
    for g in &mut out {
        rename_outside(g, &back, &back);
    }
    out
}

/// `g` with the words of `launch` renamed in its `// kevin:` lines (what the harness reads) and
/// those of `words` in its reasoning and summary; the kernels' C is left as it is.
fn rename_outside(
    g: &mut Generated,
    launch: &BTreeMap<String, String>,
    words: &BTreeMap<String, String>,
) {
    let lines: Vec<String> = g
        .source
        .lines()
        .map(|l| {
            if l.starts_with("// kevin:") {
                rename_words(l, launch)
            } else {
                l.to_string()
            }
        })
        .collect();
    g.source = lines.join("\n") + "\n";
    g.reasoning = rename_words(&g.reasoning, words);
    g.summary = rename_words(&g.summary, words);
}

/// The names of `program`'s tensors and sizes that a kernel cannot use as they are (a size `k`
/// beside the writer's loop counter `k`, a tensor `new`, a size `NAN`), each with the C name it
/// gets instead: the first of `k_`, `v0_k_`, `v1_k_`, ... that is free and not another of the
/// program's names.
fn c_names(program: &crate::ops::Program) -> BTreeMap<String, String> {
    let decls = program.inputs.iter().chain(&program.outputs);
    let names: Vec<String> = decls
        .map(|d| d.name.clone())
        .chain(program.size_symbols())
        .collect();
    // Not even an intermediate's or a constant's name, which the reasoning may quote.
    let all: BTreeSet<&String> = names
        .iter()
        .chain(program.stmts.iter().map(|s| &s.target))
        .chain(program.consts.iter().map(|c| &c.name))
        .collect();
    let mut out = BTreeMap::new();
    for n in names.iter().filter(|n| !free_name(n)) {
        let taken = |c: &String| all.contains(c) || out.values().any(|v| v == c);
        // After `k_`, names in lower case without a leading or doubled `_` (`NAN` is `v0_nan_`,
        // `_x` is `v0_x_`), so that one is always free.
        let lower = n
            .to_ascii_lowercase()
            .split('_')
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("_");
        let c = std::iter::once(format!("{n}_"))
            .chain((0..).map(|k| format!("v{k}_{lower}_").replace("__", "_")))
            .find(|c| free_name(c) && !taken(c))
            .expect("an unbounded supply of names");
        out.insert(n.clone(), c);
    }
    out
}

/// `program` with its tensors and sizes renamed by `names` (the others as they are).
fn rename_program(
    program: &crate::ops::Program,
    names: &BTreeMap<String, String>,
) -> crate::ops::Program {
    let name = |n: &str| names.get(n).cloned().unwrap_or_else(|| n.to_string());
    let shape = |s: &[Dim]| -> Vec<Dim> {
        s.iter()
            .map(|d| match d {
                Dim::Sym(s) => Dim::Sym(name(s)),
                Dim::Expr(p) => Dim::Expr(p.rename(&mut |s| name(s))),
                Dim::Lit(v) => Dim::Lit(*v),
            })
            .collect()
    };
    let ty = |t: &crate::ops::TensorType| crate::ops::TensorType {
        dtype: t.dtype,
        shape: shape(&t.shape),
    };
    let decl = |d: &crate::ops::Decl| crate::ops::Decl {
        name: name(&d.name),
        ty: ty(&d.ty),
        line: d.line,
    };
    let var = |v: &str| names.get(v).map(|c| Expr::Var(c.clone()));
    crate::ops::Program {
        inputs: program.inputs.iter().map(decl).collect(),
        outputs: program.outputs.iter().map(decl).collect(),
        consts: program.consts.clone(),
        stmts: program
            .stmts
            .iter()
            .map(|s| crate::ops::Stmt {
                target: name(&s.target),
                expr: substitute(&s.expr, &var),
                line: s.line,
            })
            .collect(),
        types: program
            .types
            .iter()
            .map(|(n, t)| (name(n), ty(t)))
            .collect(),
    }
}

/// `text` with every identifier-like word that `names` maps replaced by its image.
pub(crate) fn rename_words(text: &str, names: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(names.get(word.as_str()).unwrap_or(word));
        word.clear();
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// [`generate`] for a task whose names are all free.
fn generate_in_c_names(task: &Task) -> Vec<Generated> {
    let Some(ctx) = Ctx::new(task) else {
        return Vec::new();
    };
    let Some(stmt) = task.program.stmts.last() else {
        return Vec::new();
    };
    let expr = ctx.inline(&stmt.expr);
    let mut out = match ctx.single(&expr) {
        Some(v) => v,
        None => ctx.staged(&expr).unwrap_or_default(),
    };
    let includes = ctx.includes();
    // The launch lines pass each computed size as its expression (whose numerators are never
    // negative, so C's truncating `/` is the op language's floor `//`); the words quote it.
    let launch: BTreeMap<String, String> = ctx
        .aliases
        .iter()
        .map(|(q, a)| (a.clone(), format!("({})", q.to_string().replace("//", "/"))))
        .collect();
    let words: BTreeMap<String, String> = ctx
        .aliases
        .iter()
        .map(|(q, a)| (a.clone(), format!("({q})")))
        .collect();
    for g in &mut out {
        rename_outside(g, &launch, &words);
        g.source = format!("{includes}{}", g.source);
    }
    out
}

/// A kernel's name: its role (`naive_kernel`, `tiled_kernel`, ...), never the task's name. A
/// generated task is named by a hash that a policy cannot know for a program it has not seen, so
/// kernels named after tasks taught it to write a launch for one name and a kernel of another
/// (every held-out kernel of the first large-corpus warm start failed that way).
fn kernel_name(prefix: &str, role: &str) -> String {
    format!("{prefix}{role}_kernel")
}

/// Elements of a row one block of the split reduction form reduces ([`Ctx::split_reduction`]).
const SPLIT_CHUNK: u32 = 8192;
/// The split form is written for fewer outputs than this at the GPU preset (a thread per output
/// then fills under 8 of the H200's 132 SMs' 64 warps each)...
const SPLIT_MAX_OUTPUTS: u64 = 1024;
/// ... of rows at least this long (8 chunks).
const SPLIT_MIN_LEN: u64 = 8 * SPLIT_CHUNK as u64;

/// What the split reduction form is written from: the operand's iteration shape and reduced
/// axes, the element value at `idx`, the reduction's C (initial value, step on `val`, tree
/// step; `mean`: the result divided by the row's length), the output's store of `red` at `o`
/// and the helpers both need.
struct SplitParts<'s> {
    shape: &'s [Dim],
    axes: (usize, usize),
    value: &'s str,
    init: &'s str,
    step: &'s str,
    tree: &'s str,
    mean: bool,
    store: &'s str,
    helpers: &'s str,
    kind_name: &'s str,
}

/// Reductions nested in one another that one loop computes (see [`Ctx::reduce_chain`]).
struct ReduceChain<'e> {
    /// The kind they share.
    kind: ReduceKind,
    /// The first and last axis of the operand they reduce, together.
    axes: (usize, usize),
    /// The innermost reduction's operand.
    operand: &'e Expr,
    /// How many reductions.
    depth: usize,
}

/// What the generator knows of the task.
#[derive(Clone)]
struct Ctx<'a> {
    task: &'a Task,
    /// Put before every kernel's role (`stage2_`), so the kernels of a staged form differ.
    prefix: String,
    /// The one output.
    out: String,
    /// Symbolic shape of every input and the output.
    shapes: BTreeMap<String, Vec<Dim>>,
    /// Named constants.
    consts: BTreeMap<String, f64>,
    /// Intermediates, inlined where they are used.
    defs: BTreeMap<String, Expr>,
    /// The kernel's parameter list and the launch's argument list (tensors, then sizes).
    params: String,
    args: String,
    /// Their parts: the task's tensors, then its size symbols.
    tensor_params: Vec<String>,
    tensor_args: Vec<String>,
    size_params: Vec<String>,
    size_args: Vec<String>,
    /// How each input is read as a float ("" for f32, else the conversion function).
    loads: BTreeMap<String, &'static str>,
    /// How a float is converted for the output ("" for f32 and i64).
    store: &'static str,
    /// Every size computed from others, with its name in the kernels (see `computed_sizes`).
    aliases: BTreeMap<Poly, String>,
}

/// Every size expression of `program` (of its declarations, and of the value of every operation
/// in it, each in normal form), in the order first met. The kernels name each (`kevin_d0`, ...)
/// and take it as a size parameter whose launch argument is the expression, so a kernel's C
/// only ever sees names, and a shape inferred anywhere in the program maps to those names.
fn computed_sizes(program: &crate::ops::Program) -> Vec<Poly> {
    fn add(shape: &[Dim], out: &mut Vec<Poly>) {
        for d in shape {
            if let Dim::Expr(q) = d {
                if !out.contains(q) {
                    out.push(q.clone());
                }
            }
        }
    }
    fn walk(program: &crate::ops::Program, e: &Expr, out: &mut Vec<Poly>) {
        if let Ok(t) = crate::ops::infer_expr(program, e) {
            add(&t.shape, out);
        }
        match e {
            Expr::Neg(a) => walk(program, a, out),
            Expr::Binary(_, a, b) => {
                walk(program, a, out);
                walk(program, b, out);
            }
            Expr::Call { args, .. } => args.iter().for_each(|a| walk(program, a, out)),
            Expr::Num(_) | Expr::Var(_) => {}
        }
    }
    let mut out = Vec::new();
    for d in program.inputs.iter().chain(&program.outputs) {
        add(&d.ty.shape, &mut out);
    }
    for s in &program.stmts {
        walk(program, &s.expr, &mut out);
    }
    out
}

/// `shape` with each computed size replaced by its kernel name (None for one not in `aliases`).
fn aliased(aliases: &BTreeMap<Poly, String>, shape: &[Dim]) -> Option<Vec<Dim>> {
    shape
        .iter()
        .map(|d| match d {
            Dim::Expr(q) => aliases.get(q).map(|a| Dim::Sym(a.clone())),
            _ => Some(d.clone()),
        })
        .collect()
}

/// The shape of `e` over `shapes` whose computed sizes go by their kernel names in `aliases`:
/// inferred over the sizes themselves, then named again.
pub(super) fn aliased_shape_over(
    e: &Expr,
    shapes: &BTreeMap<String, Vec<Dim>>,
    consts: &BTreeMap<String, f64>,
    aliases: &BTreeMap<Poly, String>,
) -> Option<Vec<Dim>> {
    if aliases.is_empty() {
        return shape_over(e, shapes, consts);
    }
    let named: BTreeMap<&String, &Poly> = aliases.iter().map(|(q, a)| (a, q)).collect();
    let expanded: BTreeMap<String, Vec<Dim>> = shapes
        .iter()
        .map(|(n, s)| {
            let s = s
                .iter()
                .map(|d| match d {
                    Dim::Sym(a) => named
                        .get(a)
                        .map_or_else(|| d.clone(), |q| Dim::Expr((*q).clone())),
                    _ => d.clone(),
                })
                .collect();
            (n.clone(), s)
        })
        .collect();
    aliased(aliases, &shape_over(e, &expanded, consts)?)
}

/// The C type of a tensor element.
fn c_type(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "float",
        Dtype::F16 => "__half",
        Dtype::Bf16 => "__nv_bfloat16",
        Dtype::I64 => "long long",
    }
}

/// The conversion of an element to float ("" when it is one).
fn load_fn(d: Dtype) -> &'static str {
    match d {
        Dtype::F16 => "__half2float",
        Dtype::Bf16 => "__bfloat162float",
        Dtype::F32 | Dtype::I64 => "",
    }
}

/// The conversion of a float to an element, rounding to nearest ("" when none is needed).
fn store_fn(d: Dtype) -> &'static str {
    match d {
        Dtype::F16 => "__float2half_rn",
        Dtype::Bf16 => "__float2bfloat16_rn",
        Dtype::F32 | Dtype::I64 => "",
    }
}

/// Identifiers the kernels declare themselves (locals, macros, shared arrays). A program name
/// equal to one would be shadowed by it or redeclared (the first KernelBench import had `k` as a
/// size and `for (int k = 0; k < k; ++k)` as a loop), so such a name is renamed in the kernel.
const RESERVED: [&str; 86] = [
    "As", "BK", "BLOCK", "BM", "BN", "TILE", "Ws", "a0", "acc", "accs", "av", "base", "best",
    "best_r", "buf", "bz", "c0", "c1", "c2", "c3", "c4", "c5", "cg", "ch", "chunks", "cnt", "col",
    "col0", "dv", "end", "gc", "gk", "gr", "grp", "i", "ic", "idx", "ii", "in", "inv", "j", "jj",
    "k", "k0", "kk", "lane", "len", "m", "mean", "mx", "n", "o", "o0", "o1", "o2", "oc", "outer",
    "p0", "p1", "p2", "q0", "q1", "q2", "r", "red", "rem", "row", "row0", "run", "s", "set", "src",
    "ss", "stride", "sum", "t", "tid", "total", "tx", "ty", "val", "var", "w0", "wv", "xi", "xv",
];

/// Words of C++ and CUDA that the kernels use (identifiers beginning with `__`, the intrinsics
/// and qualifiers, are all refused by [`free_name`]).
const C_NAMES: [&str; 38] = [
    "auto",
    "blockDim",
    "blockIdx",
    "char",
    "const",
    "continue",
    "define",
    "do",
    "double",
    "else",
    "erff",
    "expf",
    "expm1f",
    "extern",
    "fabsf",
    "float",
    "fmaxf",
    "fminf",
    "for",
    "gridDim",
    "if",
    "include",
    "int",
    "log1pf",
    "logf",
    "long",
    "powf",
    "return",
    "rsqrtf",
    "short",
    "signed",
    "sizeof",
    "sqrtf",
    "static",
    "tanhf",
    "threadIdx",
    "undef",
    "void",
];

/// Every keyword and alternative token of C++20, which no declaration may take (a tensor `new`
/// or a size `xor` is a syntax error in any kernel).
const CPP_KEYWORDS: [&str; 92] = [
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char16_t",
    "char32_t",
    "char8_t",
    "class",
    "co_await",
    "co_return",
    "co_yield",
    "compl",
    "concept",
    "const",
    "const_cast",
    "consteval",
    "constexpr",
    "constinit",
    "continue",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "not_eq",
    "nullptr",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "requires",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
];

/// Object-like macros spelt in lower case that the headers a kernel is compiled against define
/// (the C library's, CUDA's, the CPU device model's): the preprocessor would replace a tensor or
/// size of that name (a size `errno` became a function pointer, and the kernel crashed). Macros
/// in capitals are refused by their spelling (see [`free_name`]).
const LOWER_MACROS: [&str; 8] = [
    "errno",
    "linux",
    "math_errhandling",
    "stderr",
    "stdin",
    "stdout",
    "unix",
    "warpSize",
];

/// True when `name` may appear in a kernel next to the writer's own identifiers (locals, C++
/// and CUDA words, helpers `*_f`, `*_f1` and `kevin_*`, kernels `*_kernel`) and the headers'
/// (every C++ keyword; names C++ reserves for the implementation, with a leading `_` or a
/// `__`; anything spelt like a macro: capitals, digits and `_` only, with two capitals or a `_`
/// (`NAN`, `EOF`, `M_PI`, `KEVIN_CUDA_H`), and the macros spelt in lower case). A task name that
/// is not free is renamed in the kernel (see [`generate`]).
pub(crate) fn free_name(name: &str) -> bool {
    let helper = name
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .ends_with("_f");
    let capitals = name.chars().filter(char::is_ascii_uppercase).count();
    let macro_like =
        !name.chars().any(|c| c.is_ascii_lowercase()) && (capitals >= 2 || name.contains('_'));
    !RESERVED.contains(&name)
        && !C_NAMES.contains(&name)
        && !CPP_KEYWORDS.contains(&name)
        && !LOWER_MACROS.contains(&name)
        && !name.starts_with('_')
        && !name.contains("__")
        && !macro_like
        && !name.starts_with("kevin_")
        && !helper
        && !name.ends_with("_kernel")
}

impl<'a> Ctx<'a> {
    fn new(task: &'a Task) -> Option<Ctx<'a>> {
        let p = &task.program;
        if p.outputs.len() != 1 || p.stmts.last()?.target != p.outputs[0].name {
            return None;
        }
        let names = p.inputs.iter().chain(&p.outputs).map(|d| d.name.clone());
        if !names.chain(p.size_symbols()).all(|n| free_name(&n)) {
            return None;
        }
        let out = &p.outputs[0];
        // An i64 input can only be an index (the type rules let it into views and gathers
        // alone): read as it is (`long long`, no conversion).
        // A size computed from others (`(H + 1) // 2`, a strided convolution's output) is a
        // size parameter of its own in the kernels, `kevin_d0`, ...; the launch lines pass the
        // expression (see `computed_sizes`).
        let aliases: BTreeMap<Poly, String> = computed_sizes(p)
            .into_iter()
            .enumerate()
            .map(|(i, q)| (q, format!("kevin_d{i}")))
            .collect();
        let mut params = Vec::new();
        let mut args = Vec::new();
        let mut shapes = BTreeMap::new();
        let mut loads = BTreeMap::new();
        for d in &p.inputs {
            params.push(format!(
                "const {}* __restrict__ {}",
                c_type(d.ty.dtype),
                d.name
            ));
            args.push(d.name.clone());
            shapes.insert(d.name.clone(), aliased(&aliases, &d.ty.shape)?);
            loads.insert(d.name.clone(), load_fn(d.ty.dtype));
        }
        params.push(format!(
            "{}* __restrict__ {}",
            c_type(out.ty.dtype),
            out.name
        ));
        args.push(out.name.clone());
        shapes.insert(out.name.clone(), aliased(&aliases, &out.ty.shape)?);
        let mut size_args = p.size_symbols();
        size_args.extend(aliases.values().cloned());
        let size_params: Vec<String> = size_args.iter().map(|s| format!("int {s}")).collect();
        let defs = p
            .stmts
            .iter()
            .take(p.stmts.len() - 1)
            .map(|s| (s.target.clone(), s.expr.clone()))
            .collect();
        Some(Ctx {
            task,
            prefix: String::new(),
            out: out.name.clone(),
            shapes,
            consts: p.consts.iter().map(|c| (c.name.clone(), c.value)).collect(),
            defs,
            params: [params.as_slice(), &size_params].concat().join(", "),
            args: [args.as_slice(), &size_args].concat().join(", "),
            tensor_params: params,
            tensor_args: args,
            size_params,
            size_args,
            loads,
            store: store_fn(out.ty.dtype),
            aliases,
        })
    }

    /// A renderer of elementwise work at the flat `index` over `shape`.
    fn render(&self, shape: &[Dim], index: &str) -> Render<'_> {
        Render::new(
            &self.shapes,
            &self.consts,
            &self.loads,
            &self.aliases,
            shape,
            index,
        )
    }

    /// `shape` with its computed sizes given their kernel names (None for one not known).
    fn aliased(&self, shape: &[Dim]) -> Option<Vec<Dim>> {
        aliased(&self.aliases, shape)
    }

    /// Tensor `v` read at `idx` as a float.
    fn ld(&self, v: &str, idx: &str) -> String {
        match self.loads.get(v).copied().unwrap_or("") {
            "" => format!("{v}[{idx}]"),
            f => format!("{f}({v}[{idx}])"),
        }
    }

    /// A float value converted for a store to the output.
    fn st(&self, value: &str) -> String {
        match self.store {
            "" => value.to_string(),
            f => format!("{f}({value})"),
        }
    }

    /// The `#include` lines the half-precision types need (empty for f32).
    fn includes(&self) -> String {
        let decls = self
            .task
            .program
            .inputs
            .iter()
            .chain(&self.task.program.outputs);
        let dtypes: BTreeSet<Dtype> = decls.map(|d| d.ty.dtype).collect();
        let mut s = String::new();
        if dtypes.contains(&Dtype::F16) {
            s.push_str("#include <cuda_fp16.h>\n");
        }
        if dtypes.contains(&Dtype::Bf16) {
            s.push_str("#include <cuda_bf16.h>\n");
        }
        s
    }

    /// `e` with every intermediate replaced by its definition.
    fn inline(&self, e: &Expr) -> Expr {
        substitute(e, &|v| self.defs.get(v).map(|d| self.inline(d)))
    }

    fn kernel(&self, role: &str) -> String {
        kernel_name(&self.prefix, role)
    }

    /// The forms of the first single-kernel writer that takes `e` (None when none does).
    fn single(&self, e: &Expr) -> Option<Vec<Generated>> {
        self.transpose(e)
            .or_else(|| self.elementwise(e))
            .or_else(|| self.matmul(e))
            .or_else(|| self.reduction(e))
            .or_else(|| self.rowwise(e))
            .or_else(|| self.transposed_elementwise(e))
            .or_else(|| self.windowed(e))
    }

    fn out_shape(&self) -> &[Dim] {
        &self.shapes[&self.out]
    }

    /// The first-line comment and the head of every kernel.
    fn signature(&self, kernel: &str) -> String {
        format!("__global__ void {kernel}({})", self.params)
    }

    fn launch(&self, kernel: &str, grid: &str, block: &str) -> String {
        format!(
            "// kevin: launch {kernel} grid=({grid}) block=({block}) args=({})",
            self.args
        )
    }

    fn program_text(&self) -> String {
        let stmts: Vec<String> = self
            .task
            .program
            .stmts
            .iter()
            .map(|s| format!("{} = {}", s.target, stmt_source(&self.task.source, s.line)))
            .collect();
        stmts.join("; ")
    }

    // ---- elementwise -------------------------------------------------------------------------

    fn elementwise(&self, e: &Expr) -> Option<Vec<Generated>> {
        let shape = self.out_shape().to_vec();
        let mut r = self.render(&shape, "i");
        let value = self.st(&r.scalar(e)?);
        let helpers = r.helpers();
        let n = product(&shape);
        let y = &self.out;
        let what = self.program_text();
        let mut out = Vec::new();
        for block in [256, 128] {
            let k = self.kernel("elementwise");
            let src = format!(
                "{launch}\n{helpers}{sig} {{\n    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
                 long long n = {nll};\n    if (i < n) {{\n        {y}[i] = {value};\n    }}\n}}\n",
                launch = self.launch(&k, &format!("cdiv({n},{block})"), &block.to_string()),
                sig = self.signature(&k),
                nll = long_product(&shape),
            );
            out.push(Generated {
                form: format!("elementwise_b{block}"),
                source: src,
                reasoning: format!(
                    "`{what}` is elementwise: every output element depends only on the input elements at the \
                     same position (a smaller tensor broadcasts along the leading dimensions, so its index is \
                     the flat index modulo its size). One thread per element is the simplest correct mapping: \
                     a 1-D grid of {block}-thread blocks covers all {n} elements and a bounds check handles the tail."
                ),
                summary: format!(
                    "One thread per output element, {block} threads per block and cdiv({n},{block}) blocks; \
                     each thread computes its element in registers with one read of each input and one write, \
                     and the `i < n` check guards the last block."
                ),
            });
        }
        let k = self.kernel("grid_stride");
        let src = format!(
            "{launch}\n{helpers}{sig} {{\n    long long n = {nll};\n    long long stride = (long long)gridDim.x * blockDim.x;\n    \
             for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{\n        \
             {y}[i] = {value};\n    }}\n}}\n",
            launch = self.launch(&k, &format!("cdiv({n},1024)"), "256"),
            sig = self.signature(&k),
            nll = long_product(&shape),
        );
        out.push(Generated {
            form: "elementwise_grid_stride".into(),
            source: src,
            reasoning: format!(
                "`{what}` is elementwise, so any assignment of elements to threads works. A grid-stride loop \
                 decouples the grid from the problem size: each thread starts at its global index and steps by \
                 the total number of threads, so a grid of a quarter as many threads as elements still covers \
                 all {n} of them and every thread does about four."
            ),
            summary: format!(
                "Grid-stride loop over the {n} flattened elements with 256-thread blocks and cdiv({n},1024) \
                 blocks (about four elements per thread); the loop condition is the bounds check."
            ),
        });
        Some(out)
    }

    fn transpose(&self, e: &Expr) -> Option<Vec<Generated>> {
        let Expr::Call {
            op: Op::Transpose { a, b },
            args,
        } = e
        else {
            return None;
        };
        let [Expr::Var(x)] = args.as_slice() else {
            return None;
        };
        let xs = self.shapes.get(x)?;
        if xs.len() != 2 || !matches!((a, b), (-2, -1) | (0, 1) | (-1, -2) | (1, 0)) {
            return None;
        }
        let (rows, cols) = (dim(&xs[0]), dim(&xs[1]));
        let y = &self.out;
        let k = self.kernel("naive");
        let src = format!(
            "{launch}\n{sig} {{\n    int col = blockIdx.x * blockDim.x + threadIdx.x;  // column of {x}, row of {y}\n    \
             int row = blockIdx.y * blockDim.y + threadIdx.y;  // row of {x}, column of {y}\n    \
             if (row < {rows} && col < {cols}) {{\n        {y}[(long long)col * {rows} + row] = {x}[(long long)row * {cols} + col];\n    }}\n}}\n",
            launch = self.launch(&k, &format!("cdiv({cols},16), cdiv({rows},16)"), "16, 16"),
            sig = self.signature(&k),
        );
        Some(vec![Generated {
            form: "transpose_naive".into(),
            source: src,
            reasoning: format!(
                "{y} is the transpose of {x} ([{rows}, {cols}] -> [{cols}, {rows}]): element (r, c) of {x} goes to \
                 (c, r) of {y}. The simplest kernel gives each thread one element with a 2-D grid of 16x16 blocks; \
                 reads are coalesced along rows of {x}, writes are strided (a shared-memory tile would fix that later)."
            ),
            summary: format!(
                "One thread per element on a 2-D grid (x over the {cols} columns of {x}, y over its {rows} rows), \
                 16x16 blocks, both indices bounds-checked; each thread copies {x}[r][c] to {y}[c][r]."
            ),
        }])
    }

    // ---- matrix products ---------------------------------------------------------------------

    fn matmul(&self, e: &Expr) -> Option<Vec<Generated>> {
        let mut found = Vec::new();
        find_matmuls(e, &mut found);
        let [mm] = found.as_slice() else {
            return None;
        };
        let Expr::Binary(BinOp::MatMul, lhs, rhs) = mm else {
            return None;
        };
        let Expr::Var(a) = lhs.as_ref() else {
            return None;
        };
        let ash = self.shapes.get(a)?;
        // rhs: W [K, N], transpose(W) with W [N, K], or a vector x [K].
        let (w, transposed) = match rhs.as_ref() {
            Expr::Var(w) => (w.clone(), false),
            Expr::Call {
                op: Op::Transpose { .. },
                args,
            } => match args.as_slice() {
                [Expr::Var(w)] => (w.clone(), true),
                _ => return None,
            },
            _ => return None,
        };
        let wsh = self.shapes.get(&w)?;
        if ash.len() >= 3 && !transposed {
            return self.batched_matmul(e, mm, a, &w, ash, wsh);
        }
        if ash.len() != 2 {
            return None;
        }
        let (m, k) = (dim(&ash[0]), dim(&ash[1]));
        let what = self.program_text();
        let y = self.out.clone();
        if wsh.len() == 1 && !transposed {
            return self.matvec(e, mm, a, &w, &m, &k, &what);
        }
        if wsh.len() != 2 {
            return None;
        }
        let n = if transposed {
            dim(&wsh[0])
        } else {
            dim(&wsh[1])
        };
        let shape = self.out_shape().to_vec();
        let mut r = self.render(&shape, "i");
        r.matmul = Some((*mm).clone());
        let value = self.st(&r.scalar(e)?);
        let helpers = r.helpers();
        let w_at = |kk: &str| {
            if transposed {
                self.ld(&w, &format!("(long long)col * {k} + {kk}"))
            } else {
                self.ld(&w, &format!("(long long){kk} * {n} + col"))
            }
        };
        let w_desc = if transposed {
            format!("{w} is stored [{n}, {k}], so column col of the product reads row col of {w}")
        } else {
            format!("{w} is [{k}, {n}]")
        };
        let mut out = Vec::new();
        for (bx, by) in [(16, 16), (32, 8)] {
            let kern = self.kernel("naive");
            let src = format!(
                "{launch}\n{helpers}{sig} {{\n    int col = blockIdx.x * blockDim.x + threadIdx.x;\n    \
                 int row = blockIdx.y * blockDim.y + threadIdx.y;\n    if (row >= {m} || col >= {n}) return;\n    \
                 float acc = 0.0f;\n    for (int k = 0; k < {k}; ++k) {{\n        acc += {a_row} * {wk};\n    }}\n    \
                 long long i = (long long)row * {n} + col;\n    {y}[i] = {value};\n}}\n",
                launch = self.launch(
                    &kern,
                    &format!("cdiv({n},{bx}), cdiv({m},{by})"),
                    &format!("{bx}, {by}")
                ),
                sig = self.signature(&kern),
                wk = w_at("k"),
                a_row = self.ld(a, &format!("(long long)row * {k} + k")),
            );
            out.push(Generated {
                form: format!("matmul_naive_{bx}x{by}"),
                source: src,
                reasoning: format!(
                    "`{what}`: a matrix product {a} [{m}, {k}] times {w_desc}, followed by an elementwise epilogue. \
                     The straightforward kernel gives each thread one output element (row, col): it accumulates the \
                     dot product over k in a float register, then applies the epilogue before the single store, so \
                     nothing intermediate goes to memory. A 2-D grid of {bx}x{by} blocks covers the [{m}, {n}] output."
                ),
                summary: format!(
                    "One thread per output element on a 2-D grid ({bx}x{by} blocks, x over columns so neighbouring \
                     threads read neighbouring elements of {w}), a float accumulator over the {k}-long dot product, \
                     the epilogue fused before the store, and an early return for threads outside [{m}, {n}]."
                ),
            });
        }
        // Shared-memory tiling: each 16x16 tile of A and W is loaded once per block.
        let kern = self.kernel("tiled");
        let w_tile = if transposed {
            let at = self.ld(&w, &format!("(long long)col * {k} + k0 + ty"));
            format!("(k0 + ty < {k} && col < {n}) ? {at} : 0.0f")
        } else {
            let at = self.ld(&w, &format!("(long long)(k0 + ty) * {n} + col"));
            format!("(k0 + ty < {k} && col < {n}) ? {at} : 0.0f")
        };
        let src = format!(
            "{launch}\n#define TILE 16\n{helpers}{sig} {{\n    __shared__ float As[TILE][TILE];\n    __shared__ float Ws[TILE][TILE + 1];\n    \
             int tx = threadIdx.x, ty = threadIdx.y;\n    int col = blockIdx.x * TILE + tx;\n    int row = blockIdx.y * TILE + ty;\n    \
             float acc = 0.0f;\n    for (int k0 = 0; k0 < {k}; k0 += TILE) {{\n        \
             As[ty][tx] = (row < {m} && k0 + tx < {k}) ? {a_tile} : 0.0f;\n        \
             Ws[ty][tx] = {w_tile};\n        __syncthreads();\n        for (int kk = 0; kk < TILE; ++kk) {{\n            \
             acc += As[ty][kk] * Ws[kk][tx];\n        }}\n        __syncthreads();\n    }}\n    \
             if (row < {m} && col < {n}) {{\n        long long i = (long long)row * {n} + col;\n        {y}[i] = {value};\n    }}\n}}\n",
            launch = self.launch(&kern, &format!("cdiv({n},16), cdiv({m},16)"), "16, 16"),
            sig = self.signature(&kern),
            a_tile = self.ld(a, &format!("(long long)row * {k} + k0 + tx")),
        );
        out.push(Generated {
            form: "matmul_tiled16".into(),
            source: src,
            reasoning: format!(
                "`{what}`: a matrix product {a} [{m}, {k}] times {w_desc}, then an elementwise epilogue. A naive \
                 kernel reads every input element from global memory once per output that uses it. Tiling fixes \
                 that: each 16x16 block stages a 16x16 tile of {a} and of {w} in shared memory, synchronises, \
                 accumulates the 16 partial products from shared memory, and synchronises again before the next \
                 tile overwrites it. Out-of-range tile elements are loaded as zeros, so any {m}, {n}, {k} works."
            ),
            summary: format!(
                "Shared-memory tiled matrix product: 16x16 blocks, one output element per thread, tiles of {a} and \
                 {w} loaded cooperatively (zero-padded at the edges) with __syncthreads() before and after each use, \
                 float accumulation, the epilogue fused before a bounds-checked store."
            ),
        });
        // Register tiling: a 64x64 block tile, each of 256 threads accumulating a 4x4 patch of
        // outputs in registers, so every value read from shared memory feeds four products.
        let kern = self.kernel("reg");
        let (w_load_index, w_load) = if transposed {
            // W is [N, K]: neighbouring threads read neighbouring k of one row of W.
            (
                "int col = idx / BK, kk = idx % BK;",
                self.ld(&w, &format!("(long long)gc * {k} + gk")),
            )
        } else {
            (
                "int kk = idx / BN, col = idx % BN;",
                self.ld(&w, &format!("(long long)gk * {n} + gc")),
            )
        };
        let src = format!(
            "{launch}\n#define BM 64\n#define BN 64\n#define BK 16\n{helpers}{sig} {{\n    \
             __shared__ float As[BK][BM + 4];\n    __shared__ float Ws[BK][BN + 4];\n    \
             int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;\n    \
             int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;\n    float accs[4][4];\n    \
             for (int ii = 0; ii < 4; ++ii)\n        for (int jj = 0; jj < 4; ++jj) accs[ii][jj] = 0.0f;\n    \
             for (int k0 = 0; k0 < {k}; k0 += BK) {{\n        \
             for (int idx = tid; idx < BM * BK; idx += 256) {{\n            int r = idx / BK, kk = idx % BK;\n            \
             int gr = row0 + r, gk = k0 + kk;\n            As[kk][r] = (gr < {m} && gk < {k}) ? {a_load} : 0.0f;\n        }}\n        \
             for (int idx = tid; idx < BK * BN; idx += 256) {{\n            {w_load_index}\n            \
             int gk = k0 + kk, gc = col0 + col;\n            Ws[kk][col] = (gk < {k} && gc < {n}) ? {w_load} : 0.0f;\n        }}\n        \
             __syncthreads();\n        for (int kk = 0; kk < BK; ++kk) {{\n            float av[4], wv[4];\n            \
             for (int ii = 0; ii < 4; ++ii) av[ii] = As[kk][ty + 16 * ii];\n            \
             for (int jj = 0; jj < 4; ++jj) wv[jj] = Ws[kk][tx + 16 * jj];\n            \
             for (int ii = 0; ii < 4; ++ii)\n                for (int jj = 0; jj < 4; ++jj) accs[ii][jj] += av[ii] * wv[jj];\n        }}\n        \
             __syncthreads();\n    }}\n    \
             for (int ii = 0; ii < 4; ++ii) {{\n        for (int jj = 0; jj < 4; ++jj) {{\n            \
             int row = row0 + ty + 16 * ii, col = col0 + tx + 16 * jj;\n            \
             if (row >= {m} || col >= {n}) continue;\n            float acc = accs[ii][jj];\n            \
             long long i = (long long)row * {n} + col;\n            {y}[i] = {value};\n        }}\n    }}\n}}\n",
            launch = self.launch(&kern, &format!("cdiv({n},64), cdiv({m},64)"), "16, 16"),
            sig = self.signature(&kern),
            a_load = self.ld(a, &format!("(long long)gr * {k} + gk")),
        );
        out.push(Generated {
            form: "matmul_reg64x64".into(),
            source: src,
            reasoning: format!(
                "`{what}`: a matrix product {a} [{m}, {k}] times {w_desc}, then an elementwise epilogue. For a large \
                 product the arithmetic, not the memory, sets the time, and a kernel that computes one output per \
                 thread spends most of its instructions on shared-memory reads. Register tiling fixes that: each \
                 block of 16x16 threads computes a 64x64 tile of the output, staging 64x16 of {a} and 16x64 of {w} \
                 in shared memory per step of k; each thread then keeps a 4x4 patch of accumulators in registers \
                 (rows ty + 16i, columns tx + 16j, so a warp's reads of a shared row hit distinct banks) and \
                 multiplies 4 values of each operand into 16 products. Out-of-range elements are zeros, and the \
                 epilogue runs on each accumulator before its bounds-checked store."
            ),
            summary: "Register-tiled matrix product: 16x16 threads per 64x64 output tile, 64x16 and 16x64 \
                      operand tiles in shared memory (padded, zero at the edges) per k-step of 16, a 4x4 \
                      register patch of float accumulators per thread, the epilogue fused before each \
                      bounds-checked store."
                .to_string(),
        });
        Some(out)
    }

    /// `[B, M, K] @ [B, K, N]` (or a shared `[K, N]`) with an elementwise epilogue: one thread
    /// per output element, the batch on the grid's z.
    fn batched_matmul(
        &self,
        e: &Expr,
        mm: &Expr,
        a: &str,
        w: &str,
        ash: &[Dim],
        wsh: &[Dim],
    ) -> Option<Vec<Generated>> {
        // The batch dims fold into one (the grid's z): their product.
        let r = ash.len();
        let bt = match &ash[..r - 2] {
            [one] => dim(one),
            dims => format!("({})", dims.iter().map(dim).collect::<Vec<_>>().join(" * ")),
        };
        let (m, k) = (dim(&ash[r - 2]), dim(&ash[r - 1]));
        let shared = match wsh.len() {
            2 => true,
            n if n == r && wsh[..r - 2] == ash[..r - 2] => false,
            _ => return None,
        };
        let n = dim(wsh.last()?);
        let shape = self.out_shape().to_vec();
        let mut r = self.render(&shape, "i");
        r.matmul = Some(mm.clone());
        let value = self.st(&r.scalar(e)?);
        let helpers = r.helpers();
        let y = &self.out;
        let what = self.program_text();
        let w_base = if shared {
            "0".to_string()
        } else {
            format!("(long long)bz * {k} * {n}")
        };
        let a_at = self.ld(a, &format!("a0 + (long long)row * {k} + k"));
        let w_at = self.ld(w, &format!("w0 + (long long)k * {n} + col"));
        let kern = self.kernel("naive");
        let src = format!(
            "{launch}\n{helpers}{sig} {{\n    int col = blockIdx.x * blockDim.x + threadIdx.x;\n    \
             int row = blockIdx.y * blockDim.y + threadIdx.y;\n    int bz = blockIdx.z;\n    if (row >= {m} || col >= {n}) return;\n    \
             long long a0 = (long long)bz * {m} * {k};\n    long long w0 = {w_base};\n    \
             float acc = 0.0f;\n    for (int k = 0; k < {k}; ++k) {{\n        acc += {a_at} * {w_at};\n    }}\n    \
             long long i = ((long long)bz * {m} + row) * {n} + col;\n    {y}[i] = {value};\n}}\n",
            launch = self.launch(
                &kern,
                &format!("cdiv({n},16), cdiv({m},16), {bt}"),
                "16, 16"
            ),
            sig = self.signature(&kern),
        );
        let w_words = if shared {
            format!("the same {w} [{k}, {n}] for every batch")
        } else {
            format!("{w} [{bt}, {k}, {n}], one matrix per batch")
        };
        Some(vec![Generated {
            form: "bmm_naive".into(),
            source: src,
            reasoning: format!(
                "`{what}`: {bt} independent matrix products, {a} [{bt}, {m}, {k}] times {w_words}, then an \
                 elementwise epilogue. The simplest kernel gives each thread one output element: a 2-D grid of \
                 16x16 blocks over [{m}, {n}] and the batch on the grid's z, each thread offsetting into its \
                 batch's matrices, accumulating the dot product in a float register and applying the epilogue \
                 before the store."
            ),
            summary: format!(
                "One thread per output element: grid (cdiv({n},16), cdiv({m},16), {bt}) of 16x16 blocks, batch \
                 offsets from blockIdx.z, a float accumulator over the {k}-long dot product, the epilogue fused \
                 before a bounds-checked store."
            ),
        }])
    }

    #[allow(clippy::too_many_arguments)]
    fn matvec(
        &self,
        e: &Expr,
        mm: &Expr,
        a: &str,
        x: &str,
        m: &str,
        k: &str,
        what: &str,
    ) -> Option<Vec<Generated>> {
        let shape = self.out_shape().to_vec();
        let mut r = self.render(&shape, "i");
        r.matmul = Some((*mm).clone());
        let value = self.st(&r.scalar(e)?);
        let helpers = r.helpers();
        let y = &self.out;
        let kern = self.kernel("naive");
        let src = format!(
            "{launch}\n{helpers}{sig} {{\n    int row = blockIdx.x * blockDim.x + threadIdx.x;\n    if (row >= {m}) return;\n    \
             float acc = 0.0f;\n    for (int k = 0; k < {k}; ++k) {{\n        acc += {a_row} * {x_k};\n    }}\n    \
             long long i = row;\n    {y}[i] = {value};\n}}\n",
            launch = self.launch(&kern, &format!("cdiv({m},128)"), "128"),
            sig = self.signature(&kern),
            a_row = self.ld(a, &format!("(long long)row * {k} + k")),
            x_k = self.ld(x, "k"),
        );
        Some(vec![Generated {
            form: "matvec_naive".into(),
            source: src,
            reasoning: format!(
                "`{what}`: a matrix-vector product, each of the {m} outputs a dot product of one row of {a} with \
                 {x}. The simplest kernel gives each thread one row and a float accumulator over the {k} columns."
            ),
            summary: format!(
                "One thread per output row (128-thread blocks, cdiv({m},128) of them), a sequential float dot \
                 product over the row, one store per thread, threads past the last row return early."
            ),
        }])
    }

    // ---- elementwise work around a transpose --------------------------------------------------

    /// `post(transpose(pre(...)))`: one thread per output element, which finds the same element
    /// in the transpose's operand by swapping two coordinates, computes `pre` there and `post`
    /// at its own index.
    fn transposed_elementwise(&self, e: &Expr) -> Option<Vec<Generated>> {
        let mut found = Vec::new();
        find_calls(e, &|op| matches!(op, Op::Transpose { .. }), &mut found);
        let [tr] = found.as_slice() else {
            return None;
        };
        let Expr::Call {
            op: Op::Transpose { a, b },
            args,
        } = tr
        else {
            return None;
        };
        let [x_e] = args.as_slice() else {
            return None;
        };
        let shape = self.out_shape().to_vec();
        let rank = shape.len();
        let (a, b) = (
            crate::ops::normalize_axis(*a, rank)?,
            crate::ops::normalize_axis(*b, rank)?,
        );
        if !(2..=6).contains(&rank) || a == b {
            return None;
        }
        let mut pre_shape = shape.clone();
        pre_shape.swap(a, b);
        if self.iteration_shape(x_e)? != pre_shape {
            return None;
        }
        let mut pre = self.render(&pre_shape, "src");
        let t = pre.scalar(x_e)?;
        let mut post = self.render(&shape, "i");
        post.inherit_helpers(&pre);
        post.row_value = Some(((*tr).clone(), "t".into()));
        let value = self.st(&post.scalar(e)?);
        let helpers = post.helpers();
        // Coordinates of i in the output, then the operand's flat index with a and b swapped.
        let mut coords = String::from("    long long rem = i;\n");
        for k in (0..rank).rev() {
            if k == 0 {
                coords.push_str("    long long c0 = rem;\n");
            } else {
                let d = dim(&shape[k]);
                coords.push_str(&format!(
                    "    long long c{k} = rem % {d};\n    rem /= {d};\n"
                ));
            }
        }
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(a, b);
        let mut src_idx = format!("c{}", perm[0]);
        for k in 1..rank {
            src_idx = format!("({src_idx}) * {} + c{}", dim(&pre_shape[k]), perm[k]);
        }
        let n = product(&shape);
        let y = &self.out;
        let what = self.program_text();
        let kern = self.kernel("naive");
        let src = format!(
            "{launch}\n{helpers}{sig} {{\n    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
             if (i >= {nll}) return;\n{coords}    long long src = {src_idx};\n    float t = {t};\n    {y}[i] = {value};\n}}\n",
            launch = self.launch(&kern, &format!("cdiv({n},256)"), "256"),
            sig = self.signature(&kern),
            nll = long_product(&shape),
        );
        Some(vec![Generated {
            form: "transpose_elementwise".into(),
            source: src,
            reasoning: format!(
                "`{what}`: elementwise work before and after a transpose of axes {a} and {b}. No intermediate \
                 needs to be stored: each thread takes one output element, splits its flat index into \
                 coordinates, swaps coordinates {a} and {b} to find the same element in the transpose's operand, \
                 computes the work before the transpose there, and the work after it at its own index."
            ),
            summary: format!(
                "One thread per output element (256-thread blocks over {n} elements): coordinates from the flat \
                 index, the operand read at the swapped coordinates, everything computed in float registers, one \
                 bounds-checked store; writes are coalesced, reads strided."
            ),
        }])
    }

    // ---- reductions along one axis -----------------------------------------------------------

    fn reduction(&self, e: &Expr) -> Option<Vec<Generated>> {
        // One reduction, possibly followed by elementwise work on its result (`post`).
        // (Reductions over adjacent axes nested in one another count as one.)
        let mut found = Vec::new();
        find_calls(e, &|op| matches!(op, Op::Reduce { .. }), &mut found);
        let red = *found.first()?;
        let chain = self.reduce_chain(red)?;
        if found.len() != chain.depth {
            return None;
        }
        let kind = &chain.kind;
        let has_post = !std::ptr::eq(red, e);
        if has_post && matches!(kind, ReduceKind::Argmax | ReduceKind::Argmin) {
            return None;
        }
        // The output element from the reduced value `red`, at output index `index`, with the
        // helpers of `before` (so one name never means two functions) and its own.
        let post = |index: &'static str, before: &Render| -> Option<(String, String)> {
            let mut r = self.render(self.out_shape(), index);
            r.inherit_helpers(before);
            r.row_value = Some(((*red).clone(), "red".into()));
            let v = r.scalar(e)?;
            Some((self.st(&v), r.helpers()))
        };
        let inner_e = chain.operand;
        let shape = self.iteration_shape(inner_e)?;
        let (a0, a1) = chain.axes;
        // One thread (or block, or warp) per reduced value: the output must be the reduction's
        // shape (up to extents of 1, which a view adds or removes), not a larger one its result
        // is broadcast back over (`x / mean(x, keepdim)` is a kernel per stage).
        if squeezed(self.out_shape()) != squeezed(&self.iteration_shape(red)?) {
            return None;
        }
        let outer = product_or_one(&shape[..a0]);
        let len = product(&shape[a0..=a1]);
        let inner = product_or_one(&shape[a1 + 1..]);
        let mut r = self.render(&shape, "idx");
        let v = r.scalar(inner_e)?;
        let (store_o, helpers) = post("o", &r)?;
        let y = &self.out;
        let what = self.program_text();
        let (init, step, fin, kind_words) = match kind {
            ReduceKind::Sum => ("0.0f", "acc += val;", "acc".to_string(), "sum"),
            ReduceKind::Mean => (
                "0.0f",
                "acc += val;",
                format!("acc / (float){}", paren(&len)),
                "mean",
            ),
            ReduceKind::Max => (
                "-__int_as_float(0x7f800000)",
                "acc = fmaxf(acc, val);",
                "acc".into(),
                "maximum",
            ),
            ReduceKind::Min => (
                "__int_as_float(0x7f800000)",
                "acc = fminf(acc, val);",
                "acc".into(),
                "minimum",
            ),
            ReduceKind::Prod => ("1.0f", "acc *= val;", "acc".into(), "product"),
            ReduceKind::Argmax | ReduceKind::Argmin | ReduceKind::Logsumexp => {
                ("", "", String::new(), "")
            }
        };

        let kern = self.kernel("naive");
        let outs = format!("{outer} * {inner}");
        let head = format!(
            "    long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
             if (o >= (long long){outer} * {inner}) return;\n    long long outer = o / {pi}, in = o % {pi};\n",
            pi = paren(&inner)
        );
        let idx = format!("(outer * {len} + r) * {inner} + in");
        let body = match kind {
            ReduceKind::Argmax | ReduceKind::Argmin => {
                let cmp = if *kind == ReduceKind::Argmax { ">" } else { "<" };
                format!(
                    "    float best = 0.0f;\n    long long best_r = 0;\n    for (int r = 0; r < {len}; ++r) {{\n        \
                     long long idx = {idx};\n        float val = {v};\n        \
                     if (r == 0 || val {cmp} best) {{ best = val; best_r = r; }}\n    }}\n    {y}[o] = best_r;\n"
                )
            }
            ReduceKind::Logsumexp => format!(
                "    float m = -__int_as_float(0x7f800000);\n    for (int r = 0; r < {len}; ++r) {{\n        long long idx = {idx};\n        \
                 m = fmaxf(m, {v});\n    }}\n    float s = 0.0f;\n    for (int r = 0; r < {len}; ++r) {{\n        \
                 long long idx = {idx};\n        s += expf({v} - m);\n    }}\n    float red = m + logf(s);\n    {y}[o] = {store_o};\n"
            ),
            _ => format!(
                "    float acc = {init};\n    for (int r = 0; r < {len}; ++r) {{\n        long long idx = {idx};\n        \
                 float val = {v};\n        {step}\n    }}\n    float red = {fin};\n    {y}[o] = {store_o};\n"
            ),
        };
        let kind_name = kind.name();
        let mut out = vec![Generated {
            form: "reduce_thread_per_output".into(),
            source: format!(
                "{launch}\n{helpers}{sig} {{\n{head}{body}}}\n",
                launch = self.launch(&kern, &format!("cdiv({outs},128)"), "128"),
                sig = self.signature(&kern),
            ),
            reasoning: format!(
                "`{what}` reduces ({kind_name}) along an axis of length {len}. View the operand as [{outer}, {len}, \
                 {inner}] (outer, reduced, inner) in row-major order: output o = outer * {inner} + in reads the \
                 elements (outer * {len} + r) * {inner} + in for r < {len}. The simplest correct kernel gives each \
                 output its own thread, which loops over r in registers."
            ),
            summary: format!(
                "One thread per output element (128-thread blocks), a sequential {} over the {len} reduced elements \
                 in a float register, the elementwise operand computed on the fly, one store per output.",
                if kind_words.is_empty() { kind_name } else { kind_words }
            ),
        }];
        // A block per output row with a shared-memory tree, for last-axis sums, means and maxima.
        let last_axis = a1 + 1 == shape.len();
        let tree_op = tree_step(*kind);
        let block_post = post("outer", &r);
        if let (true, Some(tree), Some((store_b, _))) = (last_axis, tree_op, block_post) {
            for block in [256, 128] {
                let kern = self.kernel("block_reduce");
                let fin_b = fin.replace("acc", "buf[0]");
                let src = format!(
                    "{launch}\n#define BLOCK {block}\n{helpers}{sig} {{\n    __shared__ float buf[BLOCK];\n    \
                     long long outer = blockIdx.x;\n    const long long in = 0;\n    int t = threadIdx.x;\n    float acc = {init};\n    \
                     for (int r = t; r < {len}; r += BLOCK) {{\n        long long idx = {idx};\n        float val = {v};\n        {step}\n    }}\n    \
                     buf[t] = acc;\n    __syncthreads();\n    for (int s = BLOCK / 2; s > 0; s >>= 1) {{\n        \
                     if (t < s) {tree}\n        __syncthreads();\n    }}\n    if (t == 0) {{\n        float red = {fin_b};\n        {y}[outer] = {store_b};\n    }}\n}}\n",
                    launch = self.launch(&kern, &outer, &block.to_string()),
                    sig = self.signature(&kern),
                );
                out.push(Generated {
                    form: format!("reduce_block_b{block}"),
                    source: src,
                    reasoning: format!(
                        "`{what}` reduces ({kind_name}) each row of {len} elements to one value. A thread per row \
                         leaves most of the GPU idle when rows are long, so give each row a block of {block} \
                         threads: each thread strides over the row accumulating a partial result, writes it to \
                         shared memory, and a tree halves the number of active threads each step, with \
                         __syncthreads() between steps so every partial is written before it is read."
                    ),
                    summary: format!(
                        "One {block}-thread block per row ({outer} blocks): strided per-thread partials, then a \
                         shared-memory tree reduction with a barrier after every level; thread 0 writes the row's \
                         result."
                    ),
                });
            }
            // A warp per row: 32 lanes stride over it and shuffle their partials together.
            if let (Some((store_w, _)), Some((warp, warp_fn))) =
                (post("outer", &r), warp_reduce(*kind))
            {
                let kern = self.kernel("warp_reduce");
                let src = format!(
                    "{launch}\n{warp_fn}\n{helpers}{sig} {{\n    int lane = threadIdx.x & 31;\n    \
                     long long outer = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);\n    if (outer >= (long long){outer}) return;\n    \
                     const long long in = 0;\n    float acc = {init};\n    for (int r = lane; r < {len}; r += 32) {{\n        \
                     long long idx = {idx};\n        float val = {v};\n        {step}\n    }}\n    acc = {warp}(acc);\n    \
                     if (lane == 0) {{\n        float red = {fin};\n        {y}[outer] = {store_w};\n    }}\n}}\n",
                    launch = self.launch(&kern, &format!("cdiv({outer},8)"), "256"),
                    sig = self.signature(&kern),
                );
                out.push(Generated {
                    form: "reduce_warp".into(),
                    source: src,
                    reasoning: format!(
                        "`{what}` reduces ({kind_name}) each row of {len} elements to one value. A warp per row \
                         needs no shared memory and no __syncthreads(): its 32 lanes stride over the row (neighbouring \
                         lanes read neighbouring elements, so the loads coalesce), each keeps a partial result, and \
                         five __shfl_xor_sync steps combine the partials in registers, after which every lane holds \
                         the row's result and lane 0 writes it. Blocks of 256 threads carry 8 rows; a warp past the \
                         last row returns as a whole, so the full-mask shuffles stay valid."
                    ),
                    summary: format!(
                        "One warp per row (8 rows per 256-thread block, cdiv({outer},8) blocks): lane-strided \
                         coalesced partials, a butterfly of warp shuffles instead of a shared-memory tree, lane 0 \
                         stores the result."
                    ),
                });
            }
        }
        // Few outputs of long rows (a loss, a norm over a whole tensor) at the problem's own
        // sizes, where a thread, a warp or a block per output leaves most of the GPU idle: a grid
        // of blocks per output row, then a block per output combining the row's partials. Last,
        // so it is a staged program's fast form. (With many outputs it would only add a
        // launch, and across an inner axis break the coalescing a thread per output has.)
        let few_long = self.gpu_sizes().is_some_and(|sizes| {
            let elems = |dims: &[Dim]| -> Option<u64> {
                dims.iter()
                    .try_fold(1u64, |acc, d| acc.checked_mul(d.resolve(&sizes)? as u64))
            };
            let outputs = elems(&shape[..a0]).zip(elems(&shape[a1 + 1..]));
            outputs
                .zip(elems(&shape[a0..=a1]))
                .is_some_and(|((o, i), l)| {
                    o.saturating_mul(i) < SPLIT_MAX_OUTPUTS && l >= SPLIT_MIN_LEN
                })
        });
        if let (true, Some(tree), Some((store_s, _))) = (few_long, tree_op, post("o", &r)) {
            let split = self.split_reduction(SplitParts {
                shape: &shape,
                axes: (a0, a1),
                value: &v,
                init,
                step,
                tree,
                mean: *kind == ReduceKind::Mean,
                store: &store_s,
                helpers: &helpers,
                kind_name,
            });
            out.push(split);
        }
        Some(out)
    }

    /// The GPU preset's sizes with every computed size's kernel name bound to its value there;
    /// None where one does not evaluate.
    fn gpu_sizes(&self) -> Option<crate::ops::Sizes> {
        let mut sizes = self.task.gpu_sizes.clone();
        for (q, name) in &self.aliases {
            let v = q.eval(&self.task.gpu_sizes)?;
            sizes.insert(name.clone(), usize::try_from(v).ok()?);
        }
        Some(sizes)
    }

    /// Two kernels for a reduction with few outputs of long rows: `SPLIT_CHUNK`-element
    /// chunks of each row a 256-thread block each, their partial results into a scratch
    /// buffer, then a block per output reduces its row's partials and stores the result.
    fn split_reduction(&self, p: SplitParts<'_>) -> Generated {
        let SplitParts {
            shape,
            axes: (a0, a1),
            value,
            init,
            step,
            tree,
            mean,
            store,
            helpers,
            kind_name,
        } = p;
        let outer = product_or_one(&shape[..a0]);
        let len = product(&shape[a0..=a1]);
        let inner = product_or_one(&shape[a1 + 1..]);
        let long_len = long_product(&shape[a0..=a1]);
        let part = format!("kevin_{}part", self.prefix);
        let chunks = format!("cdiv({len}, {SPLIT_CHUNK})");
        let first = self.kernel("split_partial");
        let second = self.kernel("split_final");
        let launch = |k: &str, grid: &str| {
            format!(
                "// kevin: launch {k} grid=({grid}) block=(256) args=({}, {part})",
                self.args
            )
        };
        let sig = |k: &str| {
            format!(
                "__global__ void {k}({}, float* __restrict__ {part})",
                self.params
            )
        };
        let y = &self.out;
        // A mean divides by the row's length as a 64-bit product (rows this form takes are long).
        let fin_b = if mean {
            format!("buf[0] / (float)({long_len})")
        } else {
            "buf[0]".to_string()
        };
        // What both kernels begin with, and the shared-memory tree that ends each.
        let head = format!(
            " {{\n    __shared__ float buf[256];\n    \
             const long long chunks = ({long_len} + {SPLIT_CHUNK} - 1) / {SPLIT_CHUNK};\n    \
             int t = threadIdx.x;\n    float acc = {init};\n"
        );
        let tree_loop = format!(
            "    buf[t] = acc;\n    __syncthreads();\n    for (int s = 128; s > 0; s >>= 1) {{\n        \
             if (t < s) {tree}\n        __syncthreads();\n    }}\n"
        );
        let what = self.program_text();
        // The second kernel's step combines partial results: a product's partials multiply, a
        // sum's (and a mean's) add, as the elements do.
        let source = format!(
            "// kevin: scratch {part} f32[{outer}*{inner}*{chunks}]\n{l1}\n{l2}\n{helpers}\
             {s1}{head}    long long o = blockIdx.x / chunks, ch = blockIdx.x % chunks;\n    \
             long long outer = o / {pi}, in = o % {pi};\n    \
             long long end = ch * {SPLIT_CHUNK} + {SPLIT_CHUNK};\n    \
             if (end > {long_len}) end = {long_len};\n    \
             for (long long r = ch * {SPLIT_CHUNK} + t; r < end; r += 256) {{\n        \
             long long idx = (outer * {long_len} + r) * {inner} + in;\n        \
             float val = {value};\n        {step}\n    }}\n{tree_loop}    \
             if (t == 0) {part}[blockIdx.x] = buf[0];\n}}\n\
             {s2}{head}    long long o = blockIdx.x;\n    \
             for (long long ch = t; ch < chunks; ch += 256) {{\n        \
             float val = {part}[o * chunks + ch];\n        {step}\n    }}\n{tree_loop}    \
             if (t == 0) {{\n        float red = {fin_b};\n        {y}[o] = {store};\n    }}\n}}\n",
            l1 = launch(&first, &format!("{outer}*{inner}*{chunks}")),
            l2 = launch(&second, &format!("{outer}*{inner}")),
            s1 = sig(&first),
            s2 = sig(&second),
            pi = paren(&inner),
        );
        Generated {
            form: "reduce_split".into(),
            source,
            reasoning: format!(
                "`{what}` reduces ({kind_name}) rows of {len} elements to {outer}*{inner} values. With few \
                 outputs and long rows, a thread, a warp or even a block per output leaves most of the \
                 GPU's SMs idle, so split every row into chunks of {SPLIT_CHUNK} elements and give each chunk \
                 a 256-thread block ({outer}*{inner}*{chunks} blocks): its threads stride through the \
                 chunk, and a shared-memory tree combines their partials into one value per chunk, written \
                 to a scratch buffer. A second kernel, launched after the first on the same stream so it \
                 reads every partial, gives each output a block that combines its row's {chunks} partials \
                 the same way and stores the result."
            ),
            summary: format!(
                "Two kernels: {outer}*{inner}*{chunks} blocks of 256 threads reduce {SPLIT_CHUNK}-element \
                 chunks into f32 partials in scratch (strided loads, a shared-memory tree with a barrier \
                 after every level), then a block per output reduces its row's partials and thread 0 stores \
                 the result."
            ),
        }
    }

    /// The reduction `red` with the reductions directly nested in it that one loop computes
    /// with it: of the same kind (a sum, mean, maximum, minimum or product of one of them is that
    /// of all),
    /// over axes that are adjacent in the innermost operand (`mean(mean(x, axis=3), axis=2)`
    /// over [B, C, H, W] is a mean over H*W contiguous elements). None when `red` is not a
    /// reduction.
    fn reduce_chain<'e>(&self, red: &'e Expr) -> Option<ReduceChain<'e>> {
        let mut nest = Vec::new();
        let mut operand = red;
        while let Expr::Call {
            op:
                Op::Reduce {
                    kind,
                    axis,
                    keepdim,
                },
            args,
        } = operand
        {
            let [x] = args.as_slice() else {
                return None;
            };
            let merges = matches!(
                kind,
                ReduceKind::Sum
                    | ReduceKind::Mean
                    | ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::Prod
            );
            if let Some((first, _, _)) = nest.first() {
                if kind != first || !merges {
                    break;
                }
            }
            nest.push((*kind, *axis, *keepdim));
            operand = x;
            if !merges {
                break;
            }
        }
        let (kind, _, _) = *nest.first()?;
        // The operand's axes, innermost reduction first: each reduces one still there.
        let rank = self.iteration_shape(operand)?.len();
        let mut axes: Vec<Option<usize>> = (0..rank).map(Some).collect();
        let mut reduced = Vec::new();
        for &(_, axis, keepdim) in nest.iter().rev() {
            let at = crate::ops::normalize_axis(axis, axes.len())?;
            reduced.push(axes[at]?);
            if keepdim {
                axes[at] = None;
            } else {
                axes.remove(at);
            }
        }
        reduced.sort_unstable();
        let (a0, a1) = (reduced[0], reduced[reduced.len() - 1]);
        if a1 - a0 + 1 != reduced.len() {
            return None;
        }
        Some(ReduceChain {
            kind,
            axes: (a0, a1),
            operand,
            depth: nest.len(),
        })
    }

    /// The shape an elementwise expression iterates over: its own (its tensors broadcast
    /// together, through any views).
    fn iteration_shape(&self, e: &Expr) -> Option<Vec<Dim>> {
        aliased_shape_over(e, &self.shapes, &self.consts, &self.aliases)
    }

    // ---- row-wise operations: softmax, norms, cumsum ------------------------------------------

    fn rowwise(&self, e: &Expr) -> Option<Vec<Generated>> {
        let mut found = Vec::new();
        find_rowops(e, &mut found);
        let [row_op] = found.as_slice() else {
            return None;
        };
        let Expr::Call { op, args } = row_op else {
            return None;
        };
        let x_e = args.first()?;
        let shape = self.out_shape().to_vec();
        if shape.is_empty() || self.iteration_shape(x_e)? != shape {
            return None;
        }
        // The operation runs along `ax`: lanes of n elements, `inner` apart, one per
        // (outer, inner) pair; on the last axis a lane is a row.
        let ax = match op {
            Op::Softmax { axis }
            | Op::LogSoftmax { axis }
            | Op::Cumsum { axis }
            | Op::Cumprod { axis }
            | Op::L2Norm { axis, .. } => crate::ops::normalize_axis(*axis, shape.len())?,
            _ => shape.len() - 1,
        };
        let n = dim(&shape[ax]);
        let inner = product_or_one(&shape[ax + 1..]);
        let outer = product_or_one(&shape[..ax]);
        let m = if inner == "1" {
            outer.clone()
        } else {
            format!("{outer} * {inner}")
        };
        let mut pre = self.render(&shape, "idx");
        let v = pre.scalar(x_e)?;
        let param = |i: usize| -> Option<String> {
            match args.get(i)? {
                Expr::Var(g) if self.shapes.get(g)?.len() == 1 => Some(self.ld(g, "j")),
                _ => None,
            }
        };
        // (passes over the row that compute the statistics, the value t of element j, words)
        // Where element j of this thread's lane is: a row is contiguous, a lane along an inner
        // axis has its elements `inner` apart (and there may be more lanes than an int holds).
        let (row_decl, m_cmp, base, at) = if inner == "1" {
            (
                "int row = blockIdx.x * blockDim.x + threadIdx.x;".to_string(),
                m.clone(),
                format!("(long long)row * {n}"),
                "base + j".to_string(),
            )
        } else {
            let pi = paren(&inner);
            (
                "long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;".to_string(),
                format!("(long long){m}"),
                format!("(row / {pi}) * {n} * {inner} + row % {pi}"),
                format!("base + (long long)j * {inner}"),
            )
        };
        // The passes that compute a lane's statistics, given how a pass visits the lane's
        // elements (`each`: a loop header) and how a partial result becomes the lane's (`red`:
        // nothing for a thread per lane, a block reduction for a block per row); the value t of
        // element j; words for the reasoning.
        let stats_for = |each: &str, red: &dyn Fn(ReduceKind, &str) -> String| {
            let sum = |var: &str| red(ReduceKind::Sum, var);
            let max = |var: &str| red(ReduceKind::Max, var);
            Some(match op {
                Op::Softmax { .. } | Op::LogSoftmax { .. } => {
                    let log = matches!(op, Op::LogSoftmax { .. });
                    (
                        format!(
                            "    float mx = -__int_as_float(0x7f800000);\n    {each} {{\n        long long idx = {at};\n        \
                             mx = fmaxf(mx, {v});\n    }}\n{}    float sum = 0.0f;\n    {each} {{\n        \
                             long long idx = {at};\n        sum += expf({v} - mx);\n    }}\n{}",
                            max("mx"),
                            sum("sum")
                        ),
                        if log {
                            format!("({v} - mx) - logf(sum)")
                        } else {
                            format!("expf({v} - mx) / sum")
                        },
                        "subtract the row maximum before exponentiating (so expf cannot overflow), sum the exponentials, then normalise",
                    )
                }
                Op::LayerNorm { eps, weight, bias } => {
                    let mut t = format!("({v} - mean) * inv");
                    if *weight {
                        t = format!("{t} * {}", param(1)?);
                    }
                    if *bias {
                        t = format!("{t} + {}", param(if *weight { 2 } else { 1 })?);
                    }
                    (
                        format!(
                            "    float mean = 0.0f;\n    {each} {{\n        long long idx = {at};\n        \
                             mean += {v};\n    }}\n{}    mean /= (float){n};\n    float var = 0.0f;\n    {each} {{\n        \
                             long long idx = {at};\n        float dv = {v} - mean;\n        var += dv * dv;\n    }}\n{}    \
                             var /= (float){n};\n    float inv = rsqrtf(var + {eps});\n",
                            sum("mean"),
                            sum("var"),
                            eps = float_lit(*eps)
                        ),
                        t,
                        "compute the mean, then the biased variance around it (two passes, which is more accurate than E[x^2] - mean^2), then normalise and apply the affine parameters",
                    )
                }
                Op::RmsNorm { eps, weight } => {
                    let mut t = format!("{v} * inv");
                    if *weight {
                        t = format!("{t} * {}", param(1)?);
                    }
                    (
                        format!(
                            "    float ss = 0.0f;\n    {each} {{\n        long long idx = {at};\n        \
                             float xv = {v};\n        ss += xv * xv;\n    }}\n{}    float inv = rsqrtf(ss / (float){n} + {eps});\n",
                            sum("ss"),
                            eps = float_lit(*eps)
                        ),
                        t,
                        "sum the squares, take the reciprocal root of their mean plus eps, and scale every element (and the weight)",
                    )
                }
                Op::L2Norm { eps, .. } => (
                    format!(
                        "    float ss = 0.0f;\n    {each} {{\n        long long idx = {at};\n        \
                         float xv = {v};\n        ss += xv * xv;\n    }}\n{}    float inv = 1.0f / fmaxf(sqrtf(ss), {eps});\n",
                        sum("ss"),
                        eps = float_lit(*eps)
                    ),
                    format!("{v} * inv"),
                    "sum the squares, divide every element by the norm (at least eps)",
                ),
                Op::Cumsum { .. } => (
                    "    float run = 0.0f;\n".to_string(),
                    "run".to_string(),
                    "keep a running sum along the row and write it at every element",
                ),
                Op::Cumprod { .. } => (
                    "    float run = 1.0f;\n".to_string(),
                    "run".to_string(),
                    "keep a running product along the row and write it at every element",
                ),
                _ => return None,
            })
        };
        let each_seq = format!("for (int j = 0; j < {n}; ++j)");
        let (stats, t, words) = stats_for(&each_seq, &|_, _| String::new())?;
        let mut post = self.render(&shape, "idx");
        post.inherit_helpers(&pre);
        post.row_value = Some(((*row_op).clone(), "t".into()));
        let value = self.st(&post.scalar(e)?);
        let helpers = post.helpers();
        let y = &self.out;
        let what = self.program_text();
        let kern = self.kernel("naive");
        let is_scan = matches!(op, Op::Cumsum { .. } | Op::Cumprod { .. });
        let write = if is_scan {
            let step = if matches!(op, Op::Cumprod { .. }) {
                "*="
            } else {
                "+="
            };
            format!(
                "        run {step} {v};\n        float t = run;\n        {y}[idx] = {value};\n"
            )
        } else {
            format!("        float t = {t};\n        {y}[idx] = {value};\n")
        };
        let src = format!(
            "{launch}\n{helpers}{sig} {{\n    {row_decl}\n    if (row >= {m_cmp}) return;\n    \
             long long base = {base};\n{stats}    {each_seq} {{\n        long long idx = {at};\n{write}    }}\n}}\n",
            launch = self.launch(&kern, &format!("cdiv({m},64)"), "64"),
            sig = self.signature(&kern),
        );
        let lanes = if inner == "1" {
            format!(
                "works row by row over the last axis: every output element of a row needs statistics of \
                 the whole row. The simplest correct kernel gives each of the {m} rows its own thread, which walks \
                 its {n} elements sequentially"
            )
        } else {
            format!(
                "works along axis {ax}: every output element needs statistics of its lane, the {n} elements \
                 that differ only in that index, {inner} apart in memory. The simplest correct kernel gives each of \
                 the {m} lanes its own thread, which walks its {n} elements with a stride of {inner}"
            )
        };
        let mut out = vec![Generated {
            form: "rowwise_thread_per_row".into(),
            source: src,
            reasoning: format!("`{what}` {lanes}: {words}."),
            summary: format!(
                "One thread per {lane} (64-thread blocks, cdiv({m},64) of them), sequential passes over the {lane}'s \
                 {n} elements in float registers, the elementwise parts fused into the passes, one store per element.",
                lane = if inner == "1" { "row" } else { "lane" }
            ),
        }];
        // A block per row: the passes strided over the block's threads, each partial result
        // combined by a shared-memory tree (rows along the last axis; a scan stays sequential).
        if inner == "1" && !is_scan {
            let block = 256;
            let each = format!("for (int j = threadIdx.x; j < {n}; j += BLOCK)");
            // Each block-wide reduction the passes call, once, in the order first called.
            let used = std::cell::RefCell::new(Vec::new());
            let name = |kind: ReduceKind| {
                if kind == ReduceKind::Max {
                    "max"
                } else {
                    "sum"
                }
            };
            let red = |kind: ReduceKind, var: &str| {
                if !used.borrow().contains(&kind) {
                    used.borrow_mut().push(kind);
                }
                format!("    {var} = kevin_block_{}({var}, buf);\n", name(kind))
            };
            let (stats, t, _) = stats_for(&each, &red)?;
            let kern = self.kernel("block_rows");
            let mut trees = String::new();
            for &kind in used.borrow().iter() {
                trees += &tree_fn(kind)?;
            }
            let src = format!(
                "{launch}\n#define BLOCK {block}\n{trees}{helpers}{sig} {{\n    __shared__ float buf[BLOCK];\n    \
                 long long row = blockIdx.x;\n    long long base = row * {n};\n{stats}    {each} {{\n        \
                 long long idx = {at};\n        float t = {t};\n        {y}[idx] = {value};\n    }}\n}}\n",
                launch = self.launch(&kern, &m, &block.to_string()),
                sig = self.signature(&kern),
            );
            out.push(Generated {
                form: format!("rowwise_block_b{block}"),
                source: src,
                reasoning: format!(
                    "`{what}` works row by row over the last axis: every output element of a row needs \
                     statistics of the whole row ({words}). A thread per row leaves most of the GPU idle and \
                     reads each row sequentially, so give each of the {m} rows a block of {block} threads: \
                     every pass strides over the row's {n} elements (neighbouring threads read neighbouring \
                     elements, so the loads coalesce), and each partial result is combined by a shared-memory \
                     tree, with __syncthreads() between levels and before the buffer is reused."
                ),
                summary: format!(
                    "One {block}-thread block per row ({m} blocks): coalesced strided passes, block-wide tree \
                     reductions in shared memory for the row's statistics, the elementwise parts fused into the \
                     final pass, one store per element."
                ),
            });
            // A warp per row: the same passes over 32 lanes, partials combined by shuffles.
            let each = format!("for (int j = lane; j < {n}; j += 32)");
            let used = std::cell::RefCell::new(Vec::<(String, String)>::new());
            let red = |kind: ReduceKind, var: &str| {
                let (name, def) = warp_reduce(kind).unwrap_or_default();
                if !used.borrow().iter().any(|(n, _)| *n == name) {
                    used.borrow_mut().push((name.clone(), def));
                }
                format!("    {var} = {name}({var});\n")
            };
            let (stats, t, _) = stats_for(&each, &red)?;
            let warp_fns: String = used
                .borrow()
                .iter()
                .map(|(_, d)| format!("{d}\n"))
                .collect();
            let kern = self.kernel("warp_rows");
            let src = format!(
                "{launch}\n{warp_fns}{helpers}{sig} {{\n    int lane = threadIdx.x & 31;\n    \
                 long long row = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);\n    if (row >= (long long){m}) return;\n    \
                 long long base = row * {n};\n{stats}    {each} {{\n        long long idx = {at};\n        \
                 float t = {t};\n        {y}[idx] = {value};\n    }}\n}}\n",
                launch = self.launch(&kern, &format!("cdiv({m},8)"), "256"),
                sig = self.signature(&kern),
            );
            out.push(Generated {
                form: "rowwise_warp".into(),
                source: src,
                reasoning: format!(
                    "`{what}` works row by row over the last axis: every output element of a row needs \
                     statistics of the whole row ({words}). For rows of a few thousand elements a warp per row \
                     is enough parallelism and needs no shared memory or __syncthreads(): the 32 lanes stride \
                     over the row's {n} elements (coalesced), and each statistic is combined with five \
                     __shfl_xor_sync steps, after which every lane holds it. Blocks of 256 threads carry 8 rows; \
                     a warp past the last row returns as a whole, so the full-mask shuffles stay valid."
                ),
                summary: format!(
                    "One warp per row (8 rows per 256-thread block, cdiv({m},8) blocks): lane-strided coalesced \
                     passes, warp-shuffle butterflies for the row's statistics, the elementwise parts fused into \
                     the final pass, one store per element."
                ),
            });
        }
        Some(out)
    }
}

/// A warp-wide reduction of `kind` by shuffles (every lane gets the result): its name and its
/// one-line definition.
fn warp_reduce(kind: ReduceKind) -> Option<(String, String)> {
    let (name, step) = match kind {
        ReduceKind::Sum | ReduceKind::Mean => {
            ("kevin_warp_sum", "v += __shfl_xor_sync(0xffffffffu, v, o);")
        }
        ReduceKind::Max => (
            "kevin_warp_max",
            "v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));",
        ),
        ReduceKind::Min => (
            "kevin_warp_min",
            "v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));",
        ),
        ReduceKind::Prod => (
            "kevin_warp_prod",
            "v *= __shfl_xor_sync(0xffffffffu, v, o);",
        ),
        _ => return None,
    };
    Some((
        name.to_string(),
        format!(
            "__device__ __forceinline__ float {name}(float v) {{ for (int o = 16; o > 0; o >>= 1) {step} return v; }}"
        ),
    ))
}

/// `e` with every variable `v` for which `with(v)` gives an expression replaced by it.
fn substitute(e: &Expr, with: &dyn Fn(&str) -> Option<Expr>) -> Expr {
    match e {
        Expr::Var(v) => with(v).unwrap_or_else(|| e.clone()),
        Expr::Num(_) => e.clone(),
        Expr::Neg(a) => Expr::Neg(Box::new(substitute(a, with))),
        Expr::Binary(op, a, b) => Expr::Binary(
            *op,
            Box::new(substitute(a, with)),
            Box::new(substitute(b, with)),
        ),
        Expr::Call { op, args } => Expr::Call {
            op: op.clone(),
            args: args.iter().map(|a| substitute(a, with)).collect(),
        },
    }
}

/// One level of a shared-memory tree reduction of `kind` over `buf` (thread `t` folds in
/// `t + s`), for the kinds a tree can combine.
/// `kevin_block_sum` (or `_max`): a block-wide reduction of one float per thread through a
/// shared-memory tree of `BLOCK` floats; every thread gets the result.
fn tree_fn(kind: ReduceKind) -> Option<String> {
    let name = if kind == ReduceKind::Max {
        "max"
    } else {
        "sum"
    };
    Some(format!(
        "__device__ float kevin_block_{name}(float v, float* buf) {{\n    int t = threadIdx.x;\n    \
         buf[t] = v;\n    __syncthreads();\n    for (int s = BLOCK / 2; s > 0; s >>= 1) {{\n        \
         if (t < s) {step}\n        __syncthreads();\n    }}\n    float r = buf[0];\n    \
         __syncthreads();\n    return r;\n}}\n",
        step = tree_step(kind)?,
    ))
}

fn tree_step(kind: ReduceKind) -> Option<&'static str> {
    match kind {
        ReduceKind::Sum | ReduceKind::Mean => Some("buf[t] += buf[t + s];"),
        ReduceKind::Max => Some("buf[t] = fmaxf(buf[t], buf[t + s]);"),
        ReduceKind::Min => Some("buf[t] = fminf(buf[t], buf[t + s]);"),
        ReduceKind::Prod => Some("buf[t] *= buf[t + s];"),
        _ => None,
    }
}

/// The statement's right-hand side as written in the task file (for the reasoning text).
fn stmt_source(source: &str, line: usize) -> String {
    source
        .lines()
        .nth(line.saturating_sub(1))
        .and_then(|l| l.split_once('='))
        .map(|(_, rhs)| rhs.trim().to_string())
        .unwrap_or_default()
}

fn dim(d: &Dim) -> String {
    d.to_string()
}

/// `M*N` as a launch-plan expression.
fn product(shape: &[Dim]) -> String {
    shape.iter().map(dim).collect::<Vec<_>>().join("*")
}

fn product_or_one(shape: &[Dim]) -> String {
    if shape.is_empty() {
        "1".into()
    } else {
        product(shape)
    }
}

fn find_matmuls<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::Binary(BinOp::MatMul, ..) => out.push(e),
        Expr::Neg(a) => find_matmuls(a, out),
        Expr::Binary(_, a, b) => {
            find_matmuls(a, out);
            find_matmuls(b, out);
        }
        Expr::Call { args, .. } => args.iter().for_each(|a| find_matmuls(a, out)),
        _ => {}
    }
}

fn is_rowop(op: &Op) -> bool {
    matches!(
        op,
        Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::L2Norm { .. }
            | Op::Cumsum { .. }
            | Op::Cumprod { .. }
    )
}

fn find_rowops<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    find_calls(e, &is_rowop, out)
}

/// Every call in `e` whose operation `pick` accepts, outermost first.
fn find_calls<'e>(e: &'e Expr, pick: &dyn Fn(&Op) -> bool, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::Call { op, args } => {
            if pick(op) {
                out.push(e);
            }
            args.iter().for_each(|a| find_calls(a, pick, out));
        }
        Expr::Neg(a) => find_calls(a, pick, out),
        Expr::Binary(_, a, b) => {
            find_calls(a, pick, out);
            find_calls(b, pick, out);
        }
        _ => {}
    }
}

/// `e` as an operand of `/` or `%`: a product in parentheses (`o / (M*N)`, not `o / M*N`).
fn paren(e: &str) -> String {
    if e.contains(['*', '+', '-', '/']) {
        format!("({e})")
    } else {
        e.to_string()
    }
}
