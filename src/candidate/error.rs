//! The error of the candidate pipeline. Every message is written as feedback for the policy:
//! it names the line of the cuda block, the kernel, the argument or the limit, and says what
//! would be accepted instead.

use thiserror::Error;

use super::expr::{EvalError, SyntaxError};
use super::extract::FormatError;
use super::rules::RuleViolation;

/// Source text quoted in an error message: whitespace runs (newlines included) as one space, at
/// most 120 characters. Every message is one line of feedback, whatever the source holds (a raw
/// string literal is one token spanning many lines).
pub(crate) fn excerpt(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(120) {
        Some((i, _)) => format!("{}...", &flat[..i]),
        None => flat,
    }
}

/// Why a response is not a runnable candidate. `to_string()` is the feedback text.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum CandidateError {
    /// The response does not have the expected shape (no cuda block, no summary, ...).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A `// kevin:` line is malformed or does not fit the task or the kernel it launches.
    #[error("line {line} of the cuda block ({context}): {error}")]
    Directive {
        /// 1-based line in the cuda block.
        line: usize,
        /// What the line declares: "launch `k`", "scratch `T`", or "`// kevin:` directive".
        context: String,
        /// What is wrong (boxed: it is large, and errors travel through many `?`s).
        error: Box<DirectiveError>,
    },
    /// The source breaks a static rule (host code, a disallowed include, ...).
    #[error("line {line} of the cuda block: {violation}")]
    Rule {
        /// 1-based line in the cuda block.
        line: usize,
        /// The rule broken.
        violation: RuleViolation,
    },
    /// The cuda block is larger than [`super::Limits::max_source_bytes`].
    #[error("the cuda block is {bytes} bytes; the limit is {max} bytes")]
    SourceTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// No launch lines at all.
    #[error(
        "the cuda block declares no launches; add a line like \
         `// kevin: launch KERNEL grid=(...) block=(...) args=(...)`"
    )]
    NoLaunches,
    /// More launch lines than [`super::Limits::max_launches`].
    #[error("the cuda block declares {count} launches; the limit is {max}")]
    TooManyLaunches {
        /// How many there are.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The scratch buffers together exceed the task's cap.
    #[error("scratch buffers total {total} bytes; the limit for this task is {cap} bytes")]
    ScratchTooLarge {
        /// Their total size in bytes (saturating).
        total: u64,
        /// The cap ([`super::Limits::scratch_cap`]).
        cap: u64,
    },
}

/// What is wrong with one `// kevin:` line.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum DirectiveError {
    /// The line does not parse.
    #[error(transparent)]
    Syntax(#[from] SyntaxError),
    /// An expression on the line does not evaluate.
    #[error("{what}: {error}")]
    Eval {
        /// Which expression: "grid x", "smem", "argument 3", "element count".
        what: String,
        /// Why.
        error: EvalError,
    },
    /// The launched kernel is not in the source.
    #[error("no `__global__` kernel named `{kernel}` in the cuda block (kernels: {available})")]
    UnknownKernel {
        /// The name on the launch line.
        kernel: String,
        /// The kernels that are defined, comma separated, or "none".
        available: String,
    },
    /// The launched name is a function that is not `__global__`.
    #[error("`{kernel}` is not declared `__global__`; only `__global__` kernels can be launched")]
    NotAKernel {
        /// The name.
        kernel: String,
    },
    /// The launched kernel is a template.
    #[error("`{kernel}` is a template; launched kernels must be plain `__global__` functions")]
    TemplateKernel {
        /// The name.
        kernel: String,
    },
    /// The launched kernel is defined more than once.
    #[error("`{kernel}` is defined more than once; launched kernels must not be overloaded")]
    OverloadedKernel {
        /// The name.
        kernel: String,
    },
    /// A grid or block dimension is out of range.
    #[error("{key} {axis} = {value}{}, but it must be between 1 and {max}", written_as(.expr, *.value))]
    Dim {
        /// `grid` or `block`.
        key: &'static str,
        /// `x`, `y` or `z`.
        axis: char,
        /// The expression as written (normalised).
        expr: String,
        /// Its value.
        value: i64,
        /// The largest allowed value.
        max: i64,
    },
    /// Too many threads per block.
    #[error("block has {threads} threads; at most {max} threads per block")]
    ThreadsPerBlock {
        /// The product of the block dimensions.
        threads: i64,
        /// The limit.
        max: i64,
    },
    /// Shared memory out of range.
    #[error("smem = {value} bytes{}, but it must be between 0 and {max}", written_as(.expr, *.value))]
    Smem {
        /// The expression.
        expr: String,
        /// Its value.
        value: i64,
        /// The limit.
        max: i64,
    },
    /// Wrong number of arguments.
    #[error(
        "`{kernel}` takes {expected} parameters ({params}) but the launch passes {found} arguments"
    )]
    ArgCount {
        /// The kernel.
        kernel: String,
        /// Its parameter count.
        expected: usize,
        /// The argument count.
        found: usize,
        /// Its parameters, as declared.
        params: String,
    },
    /// An argument that does not fit its parameter.
    #[error("argument {index} `{arg}` {problem}")]
    ArgMismatch {
        /// 1-based position.
        index: usize,
        /// The argument as written.
        arg: String,
        /// What does not fit, naming the parameter and the kernel.
        problem: String,
    },
    /// An argument names nothing the task or the plan defines.
    #[error(
        "argument {index} `{name}` is not a tensor, scratch buffer or size of this task ({known})"
    )]
    UnknownArg {
        /// 1-based position.
        index: usize,
        /// The name.
        name: String,
        /// What is known, e.g. "tensors: A, Y; scratch: T; sizes: N".
        known: String,
    },
    /// A scratch buffer name used twice.
    #[error("scratch `{name}` is already declared on line {first_line}")]
    DuplicateScratch {
        /// The name.
        name: String,
        /// Where it was first declared.
        first_line: usize,
    },
    /// A scratch buffer named like a tensor or size of the task.
    #[error("`{name}` is already a {what} of this task; choose another scratch name")]
    ScratchNameTaken {
        /// The name.
        name: String,
        /// "tensor" or "size".
        what: &'static str,
    },
    /// A scratch buffer with no elements.
    #[error("element count = {value}{}, but a scratch buffer needs at least 1 element", written_as(.expr, *.value))]
    ScratchEmpty {
        /// The expression.
        expr: String,
        /// Its value.
        value: i64,
    },
}

/// " (`expr`)" when the expression says more than its value, else "".
pub(crate) fn written_as(expr: &str, value: impl std::fmt::Display) -> String {
    if expr == value.to_string() {
        String::new()
    } else {
        format!(" (`{expr}`)")
    }
}
