//! The op language: small tensor programs that define kevin's tasks.
//!
//! A program declares named inputs and outputs with an element type and a symbolic shape, optional
//! scalar constants, and then assigns each output (and any intermediates) with one statement per
//! line. [`Program::parse`] parses and type-checks it; [`interp`] is the trusted fp64 reference
//! interpreter; [`torch`] renders the equivalent PyTorch module shown in prompts.
//!
//! ```text
//! # Linear layer, GELU, then a row softmax.
//! input A: f32[M, K]
//! input W: f32[K, N]
//! input b: f32[N]
//! const scale = 0.5
//! output Y: f32[M, N]
//! T = gelu(A @ W + b) * scale
//! Y = softmax(T, axis=-1)
//! ```
//!
//! Grammar (one declaration or statement per line; newlines inside `()` or `[]` are ignored;
//! `#` starts a comment):
//!
//! ```text
//! program := (line? NEWLINE)* line?
//! line    := 'input' NAME ':' type | 'output' NAME ':' type
//!          | 'const' NAME '=' '-'? NUMBER | NAME '=' expr
//! type    := DTYPE '[' (dim (',' dim)*)? ']'     DTYPE: f32 f16 bf16 i64
//! dim     := dterm (('+' | '-') dterm)*          # a size expression, e.g. `(H - 3) // 2 + 1`
//! dterm   := dfact (('*' dfact) | ('//' INTEGER))*
//! dfact   := NAME | INTEGER | '(' dim ')'
//! expr    := term (('+' | '-') term)*
//! term    := unary (('*' | '/' | '@') unary)*   # '@' binds like '*', as in Python
//! unary   := '-' unary | atom
//! atom    := NUMBER | NAME | NAME '(' args? ')' | '(' expr ')'
//! args    := arg (',' arg)*            arg := (NAME '=')? (expr | '(' expr (',' expr)* ')')
//! ```
//!
//! Built-ins (positional arguments bind in order; parameters also by name; scalar parameters
//! take a literal, a negated literal, a constant name, or `true`/`false`):
//!
//! - elementwise: `relu gelu gelu_tanh silu sigmoid tanh exp log abs neg sqrt rsqrt square
//!   softplus mish hardsigmoid hardswish` (one tensor), `leaky_relu(x, slope=0.01)`,
//!   `elu(x, alpha=1.0)`, `clamp(x, lo, hi)`, `hardtanh(x, lo=-1, hi=1)`;
//! - binary with NumPy broadcasting: `+ - * /`, `maximum(a, b)`, `minimum(a, b)`, `pow(a, b)`;
//! - reductions: `sum mean max min prod argmax argmin logsumexp` as `f(x, axis=-1,
//!   keepdim=false)` (argmax/argmin give i64);
//! - along an axis: `softmax log_softmax cumsum cumprod` as `f(x, axis=-1)`,
//!   `l2norm(x, axis=-1, eps=1e-12)`;
//! - over the last axis: `layer_norm(x, weight?, bias?, eps=1e-5)`, `rms_norm(x, weight?,
//!   eps=1e-6)`;
//! - over channels of `x: [N, C, *]` (weight and bias `[C]`): `group_norm(x, groups, weight?,
//!   bias?, eps=1e-5)`, `batch_norm(x, weight?, bias?, eps=1e-5)` (training mode: the batch's
//!   statistics), `instance_norm(x, weight?, bias?, eps=1e-5)`;
//! - `A @ B`: `[M,K]@[K,N]`, `[...,M,K]@[...,K,N]` (the same batch dims), `[...,M,K]@[K,N]`,
//!   `[M,K]@[K]`;
//!   `transpose(x, a=-2, b=-1)`; `unsqueeze(x, axis)` and `squeeze(x, axis)` (an axis of extent 1;
//!   the elements unchanged); `triu(x, diagonal=0)`, `tril(x, diagonal=0)` (zeros below / above
//!   the diagonal of every matrix of the last two axes); `flip(x, axis)` (the elements in
//!   reverse order along `axis`); `reshape(x, (d0, d1, ...))` (dims are size expressions, as
//!   many elements: the same elements in order); `gather(x, index, axis)` (PyTorch's
//!   `torch.gather`: an i64 `index` of x's rank and dims but along `axis`; an i64 tensor is an
//!   input or an argmax, and goes only into views (`unsqueeze`, `squeeze`, `reshape`), gathers
//!   and outputs);
//! - windowed over `x: [N, C, *spatial]` (1 to 3 spatial axes; a per-axis parameter is one
//!   integer or a tuple of one per axis): `conv1d/conv2d/conv3d(x, weight, bias?, stride=1,
//!   padding=0, dilation=1, groups=1)` with `weight: [F, C/groups, *kernel]`,
//!   `conv_transpose1d/2d/3d(x, weight, bias?, stride=1, padding=0, output_padding=0, groups=1,
//!   dilation=1)` with `weight: [C, F/groups, *kernel]` (output length `(L - 1)*stride -
//!   2*padding + dilation*(k - 1) + output_padding + 1`),
//!   `max_pool1d/2d/3d(x, kernel_size, stride=kernel_size, padding=0, dilation=1)` and
//!   `avg_pool1d/2d/3d(x, kernel_size, stride=kernel_size, padding=0, count_include_pad=true)`,
//!   PyTorch's semantics in floor mode (`ceil_mode=true` is refused). Each output length is
//!   `(L + 2*padding - dilation*(k - 1) - 1) // stride + 1`, a size expression.
//!
//! Shapes are checked symbolically: two dims agree when their size expressions have the same
//! normal form ([`size`]: sums, products and floor divisions by a literal of size symbols), and
//! a literal 1 broadcasts. A dim written in a declaration must be positive at every preset. Every input must be used, every intermediate used, every
//! output assigned exactly once with exactly its declared type. Errors name the line and column
//! (parse errors) or the line and statement (type errors).
//!
//! Dependencies: `ops` is the bottom of the core; it imports nothing else from the crate (tasks,
//! the baseline, the verifier, the corpus and the devices build on it). Outside `ops`, use the
//! re-exported items and the public `ast`, `interp`, `lexer`, `round` and `torch`; `check`,
//! `builtins` and `parse` are private, and `kernels` is for the baseline's lowering only.

pub mod ast;
mod builtins;
mod check;
pub mod interp;
pub(crate) mod kernels;
pub mod lexer;
mod parse;
pub mod round;
pub mod size;
pub mod torch;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod interp_tests;
#[cfg(test)]
mod torch_tests;

pub use ast::{
    BinOp, Const, Decl, Dim, Dtype, Expr, NormSets, Op, Program, ReduceKind, Sizes, Stmt,
};
pub use ast::{Poly, TensorType, UnaryFn};
pub use check::{
    expr_shape, group_constraints, infer_expr, matmul_shape, normalize_axis, op_name,
    transposed_out, window_out, ExprType,
};
pub use parse::is_reserved;

use std::fmt;

/// A syntax error, located by line and column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {col}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What was expected or found.
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(line: usize, col: usize, message: impl Into<String>) -> Self {
        ParseError {
            line,
            col,
            message: message.into(),
        }
    }
}

/// A type or shape error, located by line and naming the statement or declaration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct CheckError {
    /// 1-based line of the statement or declaration (0 when it concerns the whole program).
    pub line: usize,
    /// The name assigned or declared on that line, if any.
    pub target: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.target, self.line) {
            (Some(t), l) if l > 0 => write!(f, "line {l}, statement `{t}`: {}", self.message),
            (None, l) if l > 0 => write!(f, "line {l}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Why a program text was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpsError {
    /// The text is not a program.
    #[error("syntax error: {0}")]
    Parse(#[from] ParseError),
    /// The program is ill-typed.
    #[error("type error: {0}")]
    Check(#[from] CheckError),
}

impl Program {
    /// Parses and type-checks a program.
    pub fn parse(src: &str) -> Result<Program, OpsError> {
        let mut program = parse::parse(src)?;
        check::check(&mut program)?;
        Ok(program)
    }
}
