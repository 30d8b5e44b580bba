//! Inline PTX for the CPU model. The `asm` statements of a candidate whose instructions the model
//! emulates are rewritten, before compiling, into calls of `runtime/kevin_cuda_ptx.h`; any other
//! `asm` is an [`CpuCompileError::Unsupported`] that names what was not understood.
//!
//! The emulated forms are the ones fast GEMM kernels use and that have a faithful CPU meaning:
//! `mma.sync.aligned.m16n8k{8,16}.row.col` with f16/bf16 inputs (f32 or f16 accumulators),
//! `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared}.b16`, and
//! `cp.async.{ca,cg}.shared.global` with `commit_group`, `wait_group` and `wait_all`. Emulating
//! PTX in general (registers, predicates, blocks) would be a simulator of its own.
//!
//! How a statement is read: GCC's extended-asm syntax (`asm volatile("t" "t" : outputs :
//! inputs : clobbers)`, adjacent string literals joined, `%0` and `%[name]` operands, `=`/`+`
//! outputs, `r l f h d n` constraints, matching constraints such as `"0"`, `memory`/`cc`
//! clobbers). The replacement binds each operand expression once (outputs by reference, inputs by
//! value) inside `do { ... } while (0)`, calls the runtime per instruction and writes outputs
//! back; it keeps the statement's line count so diagnostics still name candidate lines.
//!
//! A recognised instruction written wrongly (an operand count or constraint `ptxas` would reject)
//! is a [`CpuCompileError::Source`] naming the candidate line, like the GPU toolchain's error.
//!
//! Files: `statement` reads the `asm` statement (template, operands, constraints), `template`
//! splits its PTX into instructions and operands, `emit` generates the runtime calls. Only
//! [`rewrite`] and [`Rewritten`] are for the rest of `cpu/` (the compiler calls them); nothing
//! outside `cpu/` may import from here, and this module imports only `candidate::lex` and
//! `cpu::compile`'s error type.

mod emit;
mod statement;
mod template;

#[cfg(test)]
mod tests;

use super::compile::CpuCompileError;
use crate::candidate::lex::{lex, TokKind, Token};
use emit::translate;
use statement::parse_statement;

/// What the emulated forms are, for messages about the others.
const EMULATED: &str =
    "the CPU device model emulates only mma.sync m16n8k8/m16n8k16 with f16/bf16, \
                        ldmatrix m8n8 b16 and cp.async";

/// A candidate with its `asm` statements rewritten.
#[derive(Debug)]
pub(crate) struct Rewritten {
    /// The source to compile.
    pub source: String,
    /// True when a warp-collective instruction (`mma.sync`, `ldmatrix`) was rewritten: the
    /// kernels then need fibers.
    pub collective: bool,
}

/// Rewrites every `asm` statement of `src`, or says which one the model cannot run.
pub(crate) fn rewrite(src: &str) -> Result<Rewritten, CpuCompileError> {
    let toks = lex(src);
    let mut out = String::with_capacity(src.len() + 256);
    let mut copied = 0;
    let mut collective = false;
    let mut depth = 0usize;
    let mut k = 0;
    while k < toks.len() {
        let t = &toks[k];
        if t.kind == TokKind::Punct && !t.in_directive {
            match t.text {
                "{" => depth += 1,
                "}" => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if t.kind != TokKind::Ident || !matches!(t.text, "asm" | "__asm__" | "__asm") {
            k += 1;
            continue;
        }
        if depth == 0 && !t.in_directive {
            return Err(unsupported("file-scope asm"));
        }
        let stmt = parse_statement(&toks, k)?;
        let code = translate(&stmt, t.line)?;
        collective |= code.collective;
        let (start, end) = (offset(src, t), offset(src, &toks[stmt.close]) + 1);
        out.push_str(&src[copied..start]);
        out.push_str(&code.text);
        let newline = if t.in_directive { " \\\n" } else { "\n" };
        out.push_str(&newline.repeat(src[start..end].matches('\n').count()));
        copied = end;
        k = stmt.close + 1;
    }
    out.push_str(&src[copied..]);
    Ok(Rewritten {
        source: out,
        collective,
    })
}

fn offset(src: &str, t: &Token<'_>) -> usize {
    t.text.as_ptr() as usize - src.as_ptr() as usize
}

pub(super) fn unsupported(what: impl std::fmt::Display) -> CpuCompileError {
    CpuCompileError::Unsupported {
        feature: format!("inline PTX: {what} ({EMULATED})"),
    }
}

pub(super) fn invalid(line: usize, what: impl std::fmt::Display) -> CpuCompileError {
    CpuCompileError::Source {
        log: format!("candidate.cu:{line}: error: inline PTX: {what}"),
    }
}
