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

use std::fmt::Write as _;

use super::compile::CpuCompileError;
use crate::candidate::lex::{lex, TokKind, Token};

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

fn unsupported(what: impl std::fmt::Display) -> CpuCompileError {
    CpuCompileError::Unsupported {
        feature: format!("inline PTX: {what} ({EMULATED})"),
    }
}

fn invalid(line: usize, what: impl std::fmt::Display) -> CpuCompileError {
    CpuCompileError::Source {
        log: format!("candidate.cu:{line}: error: inline PTX: {what}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The asm statement.

/// How an operand is accessed, from its constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// `=`: written only.
    Write,
    /// `+`: read and written.
    ReadWrite,
    /// An input.
    Read,
}

#[derive(Debug)]
struct Operand {
    name: Option<String>,
    access: Access,
    /// The constraint letter (`r l f h d n i`); for a matching constraint, that of its output.
    letter: char,
    /// The input tied to this output by a matching constraint, or the output an input is tied to.
    tied: Option<usize>,
    /// The C++ expression, its tokens joined by spaces (comments dropped).
    expr: String,
}

#[derive(Debug)]
struct Statement {
    template: String,
    /// Extended asm (with a `:`): `%` introduces operands.
    extended: bool,
    /// Outputs, then inputs.
    operands: Vec<Operand>,
    /// Index of the closing `)` token.
    close: usize,
}

/// Parses the statement whose `asm` keyword is `toks[k]`.
fn parse_statement(toks: &[Token<'_>], k: usize) -> Result<Statement, CpuCompileError> {
    let line = toks[k].line;
    let tok = |j: usize| {
        toks.get(j)
            .ok_or_else(|| invalid(line, "unterminated asm statement"))
    };
    let mut j = k + 1;
    while let Some(t) = toks.get(j) {
        match t.text {
            "volatile" | "__volatile__" | "__volatile" | "inline" | "__inline" | "__inline__" => {
                j += 1
            }
            "goto" => return Err(unsupported("asm goto")),
            _ => break,
        }
    }
    if !tok(j)?.is_punct("(") {
        return Err(unsupported(
            "an asm keyword without a parenthesised template",
        ));
    }
    j += 1;
    let mut template = String::new();
    let mut literals = 0;
    while tok(j)?.kind == TokKind::Str {
        template.push_str(&decode_literal(tok(j)?.text)?);
        literals += 1;
        j += 1;
    }
    if literals == 0 {
        return Err(unsupported(format!(
            "an asm template that is not a string literal (`{}`)",
            tok(j)?.text
        )));
    }
    let mut outputs = Vec::new();
    let mut inputs = Vec::new();
    let mut section = 0;
    loop {
        let t = tok(j)?;
        if t.is_punct(")") {
            break;
        }
        if t.is_punct(":") || t.is_punct("::") {
            section += if t.text == ":" { 1 } else { 2 };
            j += 1;
            if section > 3 {
                return Err(unsupported("asm goto labels"));
            }
            continue;
        }
        match section {
            1 | 2 => {
                let (op, next) = parse_operand(toks, j, section == 1, line)?;
                if section == 1 {
                    &mut outputs
                } else {
                    &mut inputs
                }
                .push(op);
                j = next;
            }
            3 if t.kind == TokKind::Str => {
                let clobber = decode_literal(t.text)?;
                if !matches!(clobber.as_str(), "memory" | "cc") {
                    return Err(unsupported(format!("the asm clobber \"{clobber}\"")));
                }
                j += 1;
            }
            _ => return Err(invalid(line, format!("unexpected `{}` in asm", t.text))),
        }
        // Items of a section are separated by commas.
        if tok(j)?.is_punct(",") {
            j += 1;
        }
    }
    let n_out = outputs.len();
    let mut operands = outputs;
    for (i, mut op) in inputs.into_iter().enumerate() {
        if let Some(o) = op.tied {
            let Some(out) = operands.get_mut(o).filter(|_| o < n_out) else {
                return Err(invalid(
                    line,
                    format!("matching constraint \"{o}\" names no output"),
                ));
            };
            out.tied = Some(n_out + i);
            op.letter = out.letter;
        }
        operands.push(op);
    }
    Ok(Statement {
        template,
        extended: section > 0,
        operands,
        close: j,
    })
}

/// Parses `[name] "constraint" (expr)` at `toks[j]`; returns it and the index after it.
fn parse_operand(
    toks: &[Token<'_>],
    mut j: usize,
    output: bool,
    line: usize,
) -> Result<(Operand, usize), CpuCompileError> {
    let bad = || invalid(line, "malformed asm operand");
    let mut name = None;
    if toks.get(j).is_some_and(|t| t.is_punct("[")) {
        let n = toks
            .get(j + 1)
            .filter(|t| t.kind == TokKind::Ident)
            .ok_or_else(bad)?;
        if !toks.get(j + 2).is_some_and(|t| t.is_punct("]")) {
            return Err(bad());
        }
        name = Some(n.text.to_string());
        j += 3;
    }
    let c = toks
        .get(j)
        .filter(|t| t.kind == TokKind::Str)
        .ok_or_else(bad)?;
    let constraint = decode_literal(c.text)?;
    let (access, letters) = match (output, constraint.as_bytes().first()) {
        (true, Some(b'=')) => (Access::Write, &constraint[1..]),
        (true, Some(b'+')) => (Access::ReadWrite, &constraint[1..]),
        (false, _) => (Access::Read, constraint.as_str()),
        (true, _) => {
            return Err(invalid(
                line,
                format!("output constraint \"{constraint}\" without = or +"),
            ))
        }
    };
    let letters = letters.trim_start_matches('&');
    let (letter, tied) = match letters {
        "r" | "l" | "f" | "h" | "d" => (letters.as_bytes()[0] as char, None),
        "n" | "i" if !output => (letters.as_bytes()[0] as char, None),
        d if !output && !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => {
            ('0', Some(d.parse::<usize>().map_err(|_| bad())?))
        }
        _ => {
            return Err(unsupported(format!(
                "the operand constraint \"{constraint}\""
            )))
        }
    };
    j += 1;
    if !toks.get(j).is_some_and(|t| t.is_punct("(")) {
        return Err(bad());
    }
    let open = j;
    let mut level = 0usize;
    loop {
        let t = toks.get(j).ok_or_else(bad)?;
        match t.text {
            "(" | "[" | "{" if t.kind == TokKind::Punct => level += 1,
            ")" | "]" | "}" if t.kind == TokKind::Punct => {
                level = level.checked_sub(1).ok_or_else(bad)?;
                if level == 0 {
                    break;
                }
            }
            _ => {}
        }
        j += 1;
    }
    let expr: Vec<&str> = toks[open + 1..j].iter().map(|t| t.text).collect();
    if expr.is_empty() {
        return Err(bad());
    }
    let op = Operand {
        name,
        access,
        letter,
        tied,
        expr: expr.join(" "),
    };
    Ok((op, j + 1))
}

/// The characters of a string literal token (escapes decoded, line splices removed).
fn decode_literal(text: &str) -> Result<String, CpuCompileError> {
    if let Some(raw) = text.strip_prefix('R') {
        let body = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"'));
        let body = body.ok_or_else(|| unsupported(format!("the string literal {text}")))?;
        let open = body
            .find('(')
            .ok_or_else(|| unsupported(format!("the string literal {text}")))?;
        let delim = &body[..open];
        let inner = body[open + 1..]
            .strip_suffix(delim)
            .and_then(|b| b.strip_suffix(')'));
        return inner
            .map(str::to_string)
            .ok_or_else(|| unsupported(format!("the string literal {text}")));
    }
    let Some(body) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return Err(unsupported(format!("the string literal {text}")));
    };
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(c @ ('\\' | '"' | '\'' | '?')) => out.push(c),
            // A line splice, possibly with spaces before the newline.
            Some(' ' | '\t' | '\r' | '\n') => {
                while chars.next_if(|c| *c != '\n' && c.is_whitespace()).is_some() {}
                chars.next_if_eq(&'\n');
            }
            Some(c) => return Err(unsupported(format!("the escape \\{c} in an asm template"))),
            None => return Err(unsupported("a string literal ending in \\")),
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The PTX template.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Lex {
    Word(String),
    Num(i64),
    Op(usize),
    Punct(char),
}

/// Splits a template into instructions of PTX tokens, `%N`/`%[name]` resolved to operands.
fn template_tokens(stmt: &Statement, line: usize) -> Result<Vec<Vec<Lex>>, CpuCompileError> {
    let t = stmt.template.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$' | b':');
    let mut instrs = vec![Vec::new()];
    let mut i = 0;
    while i < t.len() {
        let c = t[i];
        let cur = instrs.last_mut().expect("one instruction at least");
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b';' {
            instrs.push(Vec::new());
            i += 1;
        } else if c == b'%' && stmt.extended && t.get(i + 1).is_some_and(u8::is_ascii_digit) {
            let end = i + 1 + t[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            let n: usize = stmt.template[i + 1..end].parse().unwrap_or(usize::MAX);
            if n >= stmt.operands.len() {
                return Err(invalid(line, format!("operand %{n} does not exist")));
            }
            cur.push(Lex::Op(n));
            i = end;
        } else if c == b'%' && stmt.extended && t.get(i + 1) == Some(&b'[') {
            let close = stmt.template[i..].find(']').map(|p| p + i);
            let close = close.ok_or_else(|| invalid(line, "unterminated %[name]"))?;
            let name = &stmt.template[i + 2..close];
            let n = stmt
                .operands
                .iter()
                .position(|o| o.name.as_deref() == Some(name));
            cur.push(Lex::Op(n.ok_or_else(|| {
                invalid(line, format!("no operand named [{name}]"))
            })?));
            i = close + 1;
        } else if c == b'%' && stmt.extended && t.get(i + 1) != Some(&b'%') {
            let rest: String = stmt.template[i..].chars().take(4).collect();
            return Err(unsupported(format!("the operand modifier `{rest}`")));
        } else if c == b'%' || word(c) {
            // A special register (`%%laneid` in extended asm), a word or a number.
            let start = i;
            i += if c == b'%' && stmt.extended { 2 } else { 1 };
            while i < t.len() && word(t[i]) {
                i += 1;
            }
            let w = stmt.template[start..i].replace("%%", "%");
            cur.push(if c.is_ascii_digit() {
                Lex::Num(number(&w)?)
            } else {
                Lex::Word(w)
            });
        } else {
            let ch = stmt.template[i..].chars().next().unwrap_or('?');
            cur.push(Lex::Punct(ch));
            i += ch.len_utf8();
        }
    }
    instrs.retain(|x| !x.is_empty());
    Ok(instrs)
}

fn number(w: &str) -> Result<i64, CpuCompileError> {
    let parsed = match w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16),
        None => w.parse(),
    };
    parsed.map_err(|_| unsupported(format!("the PTX number `{w}`")))
}

/// One PTX operand.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Arg {
    Reg(usize),
    Vec(Vec<usize>),
    Imm(i64),
    Addr { reg: usize, offset: i64 },
    Other(String),
}

fn render(toks: &[Lex]) -> String {
    let mut s = String::new();
    for t in toks {
        match t {
            Lex::Word(w) => s.push_str(w),
            Lex::Num(n) => s.push_str(&n.to_string()),
            Lex::Op(n) => s.push_str(&format!("%{n}")),
            Lex::Punct(c) => s.push(*c),
        }
    }
    s
}

fn parse_arg(toks: &[Lex]) -> Arg {
    use Lex::{Num, Op, Punct};
    match toks {
        [Op(i)] => Arg::Reg(*i),
        [Num(n)] => Arg::Imm(*n),
        [Punct('-'), Num(n)] => Arg::Imm(-n),
        [Punct('['), Op(r), Punct(']')] => Arg::Addr { reg: *r, offset: 0 },
        [Punct('['), Op(r), Punct('+'), Num(n), Punct(']')] => Arg::Addr {
            reg: *r,
            offset: *n,
        },
        [Punct('['), Op(r), Punct('+'), Punct('-'), Num(n), Punct(']')]
        | [Punct('['), Op(r), Punct('-'), Num(n), Punct(']')] => Arg::Addr {
            reg: *r,
            offset: -n,
        },
        [Punct('{'), inner @ .., Punct('}')] => {
            let regs: Vec<usize> = inner
                .iter()
                .enumerate()
                .filter_map(|(k, t)| match (k % 2, t) {
                    (0, Op(i)) => Some(*i),
                    _ => None,
                })
                .collect();
            let commas = inner.iter().skip(1).step_by(2).all(|t| *t == Punct(','));
            if commas && !inner.is_empty() && regs.len() == inner.len().div_ceil(2) {
                Arg::Vec(regs)
            } else {
                Arg::Other(render(toks))
            }
        }
        _ => Arg::Other(render(toks)),
    }
}

/// Splits an instruction into its opcode and operands.
fn instruction(toks: &[Lex]) -> Result<(String, Vec<Arg>), CpuCompileError> {
    let opcode = match &toks[0] {
        Lex::Word(w) if !w.starts_with(['.', '%', '$']) => w.clone(),
        Lex::Punct('{' | '}') => return Err(unsupported("a PTX scope block `{ ... }`")),
        Lex::Punct('@') => return Err(unsupported("a predicated PTX instruction")),
        _ => return Err(unsupported(format!("the PTX statement `{}`", render(toks)))),
    };
    let mut args = Vec::new();
    let mut level = 0i32;
    let mut cur: Vec<Lex> = Vec::new();
    for t in &toks[1..] {
        match t {
            Lex::Punct('{' | '[') => level += 1,
            Lex::Punct('}' | ']') => level -= 1,
            Lex::Punct(',') if level == 0 => {
                args.push(parse_arg(&cur));
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(t.clone());
    }
    if !cur.is_empty() {
        args.push(parse_arg(&cur));
    }
    Ok((opcode, args))
}

// ---------------------------------------------------------------------------------------------
// Code generation.

struct Code {
    text: String,
    collective: bool,
}

/// The replacement of one statement.
fn translate(stmt: &Statement, line: usize) -> Result<Code, CpuCompileError> {
    let mut text = String::from("do { ");
    for (i, op) in stmt.operands.iter().enumerate() {
        let _ = match op.access {
            Access::Read => write!(text, "const auto kevin_ptx_op{i} = ({}); ", op.expr),
            _ => write!(text, "auto& kevin_ptx_op{i} = ({}); ", op.expr),
        };
    }
    let mut collective = false;
    for toks in template_tokens(stmt, line)? {
        let (opcode, args) = instruction(&toks)?;
        let gen = Gen {
            ops: &stmt.operands,
            line,
            opcode: &opcode,
        };
        let parts: Vec<&str> = opcode.split('.').collect();
        let (code, warp) = match parts[..] {
            ["mma", ..] => (gen.mma(&parts, &args)?, true),
            ["ldmatrix", ..] => (gen.ldmatrix(&parts, &args)?, true),
            ["cp", "async", ..] => (gen.cp_async(&parts[2..], &args)?, false),
            _ => return Err(unsupported(format!("`{opcode}`"))),
        };
        text.push_str(&code);
        text.push(' ');
        collective |= warp;
    }
    text.push_str("} while (0)");
    Ok(Code { text, collective })
}

/// Generates the code of one recognised instruction.
struct Gen<'a> {
    ops: &'a [Operand],
    line: usize,
    opcode: &'a str,
}

impl Gen<'_> {
    fn invalid(&self, what: impl std::fmt::Display) -> CpuCompileError {
        invalid(self.line, format!("`{}`: {what}", self.opcode))
    }

    fn unsupported(&self) -> CpuCompileError {
        unsupported(format!("`{}`", self.opcode))
    }

    /// The operand whose value reading `%i` gives: itself, or the input tied to a write-only
    /// output (an untied one has no value).
    fn source(&self, i: usize) -> Result<usize, CpuCompileError> {
        let op = &self.ops[i];
        if op.access != Access::Write {
            return Ok(i);
        }
        match op.tied {
            Some(j) => Ok(j),
            None => Err(unsupported(format!(
                "`{}` reading its write-only output %{i}",
                self.opcode
            ))),
        }
    }

    /// The value of a 32-bit register operand.
    fn read32(&self, i: usize) -> Result<String, CpuCompileError> {
        let src = self.source(i)?;
        let letter = self.ops[src].letter;
        if !matches!(letter, 'r' | 'f') {
            return Err(self.invalid(format!(
                "operand %{i} has constraint \"{letter}\" where a 32-bit register (\"r\" or \"f\") is needed"
            )));
        }
        Ok(format!("::kevin::ptx_b32(kevin_ptx_op{src})"))
    }

    /// The binding an instruction writes a 32-bit register to.
    fn write32(&self, i: usize) -> Result<String, CpuCompileError> {
        let op = &self.ops[i];
        if op.access == Access::Read {
            return Err(unsupported(format!(
                "`{}` writing its input operand %{i}",
                self.opcode
            )));
        }
        if !matches!(op.letter, 'r' | 'f') {
            return Err(self.invalid(format!(
                "output %{i} has constraint \"{}\" where a 32-bit register (\"r\" or \"f\") is needed",
                op.letter
            )));
        }
        Ok(format!("kevin_ptx_op{i}"))
    }

    /// The registers of a vector operand of `n` elements (a bare register when `n` is 1).
    fn vector(&self, arg: &Arg, n: usize, what: &str) -> Result<Vec<usize>, CpuCompileError> {
        match arg {
            Arg::Vec(regs) if regs.len() == n => Ok(regs.clone()),
            Arg::Reg(r) if n == 1 => Ok(vec![*r]),
            _ => Err(self.invalid(format!("{what} must be a vector of {n} registers"))),
        }
    }

    /// The address `[%r + offset]` as a `uint64_t` expression; `global` needs a 64-bit operand.
    fn address(&self, arg: &Arg, global: bool, what: &str) -> Result<String, CpuCompileError> {
        let Arg::Addr { reg, offset } = arg else {
            return Err(self.invalid(format!("{what} must be an address `[%N]` or `[%N+imm]`")));
        };
        let src = self.source(*reg)?;
        let b = format!("kevin_ptx_op{src}");
        match self.ops[src].letter {
            'l' => Ok(format!("(::kevin::ptx_b64({b}) + uint64_t({offset}ll))")),
            'r' if !global => Ok(format!(
                "uint64_t(uint32_t(::kevin::ptx_b32({b}) + uint32_t({offset}ll)))"
            )),
            c => Err(self.invalid(format!(
                "{what} operand %{reg} has constraint \"{c}\"; an address needs {}",
                if global { "\"l\"" } else { "\"r\" or \"l\"" }
            ))),
        }
    }

    /// An integer: an immediate, an `n`/`i` operand, or (when `register`) an `r` operand.
    fn integer(&self, arg: &Arg, register: bool, what: &str) -> Result<String, CpuCompileError> {
        match arg {
            Arg::Imm(n) => Ok(format!("uint64_t({n}ll)")),
            Arg::Reg(i) => {
                let src = self.source(*i)?;
                match self.ops[src].letter {
                    'n' | 'i' => Ok(format!("::kevin::ptx_b64(kevin_ptx_op{src})")),
                    'r' if register => Ok(format!("uint64_t({})", self.read32(*i)?)),
                    c => Err(self.invalid(format!("{what} operand %{i} has constraint \"{c}\""))),
                }
            }
            _ => Err(self.invalid(format!(
                "{what} must be {}",
                if register {
                    "an integer"
                } else {
                    "an immediate"
                }
            ))),
        }
    }

    fn count(&self, args: &[Arg], n: &[usize]) -> Result<(), CpuCompileError> {
        if n.contains(&args.len()) {
            return Ok(());
        }
        let want: Vec<String> = n.iter().map(usize::to_string).collect();
        Err(self.invalid(format!(
            "takes {} operands, found {}",
            want.join(" or "),
            args.len()
        )))
    }

    /// `mma.sync.aligned.m16n8k{8,16}.row.col.dtype.atype.btype.ctype D, A, B, C`.
    fn mma(&self, parts: &[&str], args: &[Arg]) -> Result<String, CpuCompileError> {
        let ["mma", "sync", "aligned", shape, "row", "col", d, a, b, c] = parts[..] else {
            return Err(self.unsupported());
        };
        let k = match shape {
            "m16n8k16" => 16,
            "m16n8k8" => 8,
            _ => return Err(self.unsupported()),
        };
        let ty = |t: &str| match t {
            "f16" => Some("::kevin::PTX_F16"),
            "bf16" => Some("::kevin::PTX_BF16"),
            "f32" => Some("::kevin::PTX_F32"),
            _ => None,
        };
        let accumulators_ok = match a {
            "bf16" => d == "f32" && c == "f32",
            "f16" => matches!(d, "f16" | "f32") && matches!(c, "f16" | "f32"),
            _ => false,
        };
        if a != b || !accumulators_ok {
            return Err(self.unsupported());
        }
        let (Some(ab), Some(ct), Some(dt)) = (ty(a), ty(c), ty(d)) else {
            return Err(self.unsupported());
        };
        self.count(args, &[4])?;
        let width = |t: &str| if t == "f32" { 4 } else { 2 };
        let dregs = self.vector(&args[0], width(d), "D")?;
        let aregs = self.vector(&args[1], k / 4, "A")?;
        let bregs = self.vector(&args[2], k / 8, "B")?;
        let cregs = self.vector(&args[3], width(c), "C")?;
        let values = |regs: &[usize]| -> Result<String, CpuCompileError> {
            let v: Result<Vec<String>, _> = regs.iter().map(|&r| self.read32(r)).collect();
            Ok(v?.join(", "))
        };
        let mut s = format!(
            "{{ const uint32_t kevin_ptx_a[{}] = {{{}}}; const uint32_t kevin_ptx_b[{}] = {{{}}}; \
             const uint32_t kevin_ptx_c[{}] = {{{}}}; uint32_t kevin_ptx_d[{}]; \
             ::kevin::ptx_mma({k}, {ab}, {ct}, {dt}, kevin_ptx_a, kevin_ptx_b, kevin_ptx_c, kevin_ptx_d);",
            aregs.len(),
            values(&aregs)?,
            bregs.len(),
            values(&bregs)?,
            cregs.len(),
            values(&cregs)?,
            dregs.len(),
        );
        for (i, &r) in dregs.iter().enumerate() {
            let _ = write!(
                s,
                " ::kevin::ptx_set({}, kevin_ptx_d[{i}]);",
                self.write32(r)?
            );
        }
        s.push_str(" }");
        Ok(s)
    }

    /// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared{::cta}}.b16 D, [addr]`.
    fn ldmatrix(&self, parts: &[&str], args: &[Arg]) -> Result<String, CpuCompileError> {
        let ["ldmatrix", "sync", "aligned", ref quals @ ..] = parts[..] else {
            return Err(self.unsupported());
        };
        // The ISA writes `.m8n8.x4.trans.shared.b16`; ptxas takes the qualifiers in any order,
        // and CUTLASS writes `.x4.trans.m8n8.shared.b16`.
        let has = |q: &[&str]| quals.iter().filter(|x| q.contains(x)).count();
        let n = match (has(&["x1"]), has(&["x2"]), has(&["x4"])) {
            (1, 0, 0) => 1,
            (0, 1, 0) => 2,
            (0, 0, 1) => 4,
            _ => return Err(self.unsupported()),
        };
        let (trans, shared) = (has(&["trans"]), has(&["shared", "shared::cta"]));
        if has(&["m8n8"]) != 1 || has(&["b16"]) != 1 || trans > 1 || shared > 1 {
            return Err(self.unsupported());
        }
        if quals.len() != 3 + trans + shared {
            return Err(self.unsupported());
        }
        let (trans, shared) = (trans == 1, shared == 1);
        self.count(args, &[2])?;
        let dregs = self.vector(&args[0], n, "the destination")?;
        let addr = self.address(&args[1], false, "the row address")?;
        let mut s = format!(
            "{{ uint32_t kevin_ptx_d[{n}]; ::kevin::ptx_ldmatrix({n}, {trans}, {shared}, {addr}, kevin_ptx_d);"
        );
        for (i, &r) in dregs.iter().enumerate() {
            let _ = write!(
                s,
                " ::kevin::ptx_set({}, kevin_ptx_d[{i}]);",
                self.write32(r)?
            );
        }
        s.push_str(" }");
        Ok(s)
    }

    /// `cp.async.{ca,cg}.shared{::cta}.global{.L2::cache_hint}{.L2::NB} [dst], [src], cp-size
    /// {, src-size}{, cache-policy}`, `cp.async.commit_group`, `.wait_group N`, `.wait_all`.
    fn cp_async(&self, parts: &[&str], args: &[Arg]) -> Result<String, CpuCompileError> {
        match parts {
            ["commit_group"] => {
                self.count(args, &[0])?;
                return Ok("::kevin::ptx_cp_async_commit_group();".into());
            }
            ["wait_all"] => {
                self.count(args, &[0])?;
                return Ok("::kevin::ptx_cp_async_wait_all();".into());
            }
            ["wait_group"] => {
                self.count(args, &[1])?;
                let n = self.integer(&args[0], false, "the group count")?;
                return Ok(format!("::kevin::ptx_cp_async_wait_group({n});"));
            }
            _ => {}
        }
        let [cop @ ("ca" | "cg"), "shared" | "shared::cta", "global", ref quals @ ..] = parts[..]
        else {
            return Err(self.unsupported());
        };
        let hint = quals.contains(&"L2::cache_hint");
        let prefetch = quals
            .iter()
            .filter(|q| matches!(**q, "L2::64B" | "L2::128B" | "L2::256B"))
            .count();
        if prefetch > 1 || quals.len() != prefetch + usize::from(hint) {
            return Err(self.unsupported());
        }
        let extra = usize::from(hint);
        self.count(args, &[3 + extra, 4 + extra])?;
        let dst = self.address(&args[0], false, "the destination")?;
        let src = self.address(&args[1], true, "the source")?;
        let cp_size = self.integer(&args[2], false, "cp-size")?;
        let src_size = if args.len() == 4 + extra {
            self.integer(&args[3], true, "src-size")?
        } else {
            cp_size.clone()
        };
        if hint {
            // The cache policy only steers L2; it must still be a 64-bit operand.
            match args.last() {
                Some(Arg::Reg(i)) if self.ops[self.source(*i)?].letter == 'l' => {}
                _ => return Err(self.invalid("the cache policy must be a 64-bit (\"l\") operand")),
            }
        }
        Ok(format!(
            "::kevin::ptx_cp_async({}, {dst}, {src}, {cp_size}, {src_size});",
            cop == "cg"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feature(r: Result<Rewritten, CpuCompileError>) -> String {
        match r {
            Err(CpuCompileError::Unsupported { feature }) => feature,
            other => panic!("expected unsupported, got {other:?}"),
        }
    }

    fn log(r: Result<Rewritten, CpuCompileError>) -> String {
        match r {
            Err(CpuCompileError::Source { log }) => log,
            other => panic!("expected a source error, got {other:?}"),
        }
    }

    const MMA: &str =
        "__device__ void f(float* d, const unsigned* a, unsigned b0, unsigned b1) {\n\
        asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, \"\n\
                     \"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n\
                     : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n\
                     : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n\
        }\n";

    #[test]
    fn mma_becomes_one_call_with_operands_bound_once() {
        let r = rewrite(MMA).expect("rewrites");
        assert!(r.collective);
        assert_eq!(r.source.lines().count(), MMA.lines().count());
        let s = &r.source;
        assert!(s.contains("auto& kevin_ptx_op0 = (d [ 0 ]);"), "{s}");
        assert!(s.contains("const auto kevin_ptx_op9 = (b1);"), "{s}");
        assert!(s.contains(
            "::kevin::ptx_mma(16, ::kevin::PTX_BF16, ::kevin::PTX_F32, ::kevin::PTX_F32"
        ));
        // C is read from the "+f" outputs, D written back to them.
        assert!(
            s.contains("kevin_ptx_c[4] = {::kevin::ptx_b32(kevin_ptx_op0),"),
            "{s}"
        );
        assert!(
            s.contains("::kevin::ptx_set(kevin_ptx_op3, kevin_ptx_d[3]);"),
            "{s}"
        );
        // The statement's line breaks follow it, before the `;`.
        assert!(s.contains("} while (0)\n\n\n;\n}"), "{s}");
        assert!(!s.contains("asm"), "{s}");
    }

    #[test]
    fn cp_async_ldmatrix_and_groups_with_names_ties_and_clobbers() {
        let src = "__device__ void g(unsigned s, const void* p, int n, unsigned& r0, unsigned& r1) {\n\
            asm volatile(\"cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\" :: \"r\"(s), \"l\"(p), \"r\"(n) : \"memory\");\n\
            asm volatile(\"cp.async.commit_group;\\n\" ::);\n\
            asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(1));\n\
            asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 {%[a], %[b]}, [%[s]+16];\"\n\
                         : [a] \"=r\"(r0), [b] \"=r\"(r1) : [s] \"r\"(s));\n\
            asm(\"ldmatrix.sync.aligned.x4.trans.m8n8.shared.b16 {%0,%1,%2,%3}, [%4];\" : \"=r\"(r0), \"=r\"(r1), \"=r\"(r0), \"=r\"(r1) : \"l\"(p));\n\
            asm(\"cp.async.wait_all;\");\n\
            asm volatile(\"\" ::: \"memory\");\n\
            }\n";
        let r = rewrite(src).expect("rewrites");
        let s = &r.source;
        assert!(r.collective);
        assert_eq!(s.lines().count(), src.lines().count());
        assert!(s.contains("::kevin::ptx_cp_async(true, uint64_t(uint32_t(::kevin::ptx_b32(kevin_ptx_op0) + uint32_t(0ll))), (::kevin::ptx_b64(kevin_ptx_op1) + uint64_t(0ll)), uint64_t(16ll), uint64_t(::kevin::ptx_b32(kevin_ptx_op2)));"), "{s}");
        assert!(s.contains("::kevin::ptx_cp_async_commit_group();"), "{s}");
        assert!(s.contains("::kevin::ptx_cp_async_wait_group(::kevin::ptx_b64(kevin_ptx_op0));"));
        assert!(s.contains("::kevin::ptx_ldmatrix(2, true, true, uint64_t(uint32_t(::kevin::ptx_b32(kevin_ptx_op2) + uint32_t(16ll))), kevin_ptx_d); ::kevin::ptx_set(kevin_ptx_op0, kevin_ptx_d[0]); ::kevin::ptx_set(kevin_ptx_op1, kevin_ptx_d[1]);"), "{s}");
        assert!(s.contains("::kevin::ptx_ldmatrix(4, true, true, (::kevin::ptx_b64(kevin_ptx_op4) + uint64_t(0ll)), kevin_ptx_d);"), "{s}");
        assert!(s.contains("::kevin::ptx_cp_async_wait_all();"), "{s}");
        assert!(s.contains("do { } while (0);"), "{s}");

        // A matching constraint: the tied input is C, the output D.
        let tied = "__device__ void h(float& d, float c, unsigned a, unsigned b) {\n\
            asm(\"mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0}, {%2}, {%3}, {%0};\" : \"=r\"(d) : \"0\"(c), \"r\"(a), \"r\"(b)); }\n";
        let r = rewrite(tied);
        assert!(
            log(r).contains("D must be a vector of 2 registers"),
            "f16 accumulators are two registers"
        );
        let tied = tied.replace("{%0}, {%2}, {%3}, {%0}", "{%0,%0}, {%2,%2}, {%3}, {%0,%0}");
        let s = rewrite(&tied).expect("tied").source;
        assert!(s.contains("kevin_ptx_c[2] = {::kevin::ptx_b32(kevin_ptx_op1), ::kevin::ptx_b32(kevin_ptx_op1)}"), "{s}");
    }

    #[test]
    fn asm_in_a_macro_keeps_its_line_splices() {
        let src = "#define COMMIT() asm volatile( \\\n  \"cp.async.commit_group;\" ::)\n__device__ void f() { COMMIT(); }\n";
        let s = rewrite(src).expect("rewrites").source;
        assert!(
            s.starts_with(
                "#define COMMIT() do { ::kevin::ptx_cp_async_commit_group(); } while (0) \\\n\n"
            ),
            "{s}"
        );
        assert_eq!(s.lines().count(), src.lines().count());
    }

    #[test]
    fn unknown_instructions_and_syntax_are_unsupported_by_name() {
        let f = |body: &str| {
            feature(rewrite(&format!(
                "__device__ void f(unsigned& v, unsigned* p) {{ {body}; }}"
            )))
        };
        assert!(f("asm volatile(\"mov.u32 %0, %%laneid;\" : \"=r\"(v))")
            .starts_with("inline PTX: `mov.u32` (the CPU device model emulates only"));
        assert!(f("asm(\"membar.gl;\")").contains("`membar.gl`"));
        assert!(
            f("asm(\"{ .reg .pred p; setp.ne.b32 p, %0, 0; }\" :: \"r\"(v))")
                .contains("scope block")
        );
        assert!(f("asm(\"@p cp.async.commit_group;\")").contains("predicated"));
        assert!(f("asm(\"mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0}, {%0}, {%0}, {%0};\" : \"+r\"(v))").contains("m16n8k32"));
        assert!(f(
            "asm(\"cp.async.bulk.shared::cluster.global [%0], [%1], 16;\" :: \"r\"(v), \"l\"(p))"
        )
        .contains("cp.async.bulk"));
        assert!(f("asm(\"ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%0}, [%1];\" : \"=r\"(v) : \"l\"(p))").contains("m16n16"));
        assert!(f(
            "asm(\"ldmatrix.sync.aligned.m8n8.x2.x4.b16 {%0}, [%1];\" : \"=r\"(v) : \"l\"(p))"
        )
        .contains("x2.x4"));
        assert!(f("asm(\"mov.u32 %0, 1;\" : \"=m\"(v))").contains("constraint \"=m\""));
        assert!(f("asm(\"cp.async.commit_group;\" ::: \"r1\")").contains("clobber \"r1\""));
        assert!(f("asm goto(\"bra %l0;\" :::: done)").contains("asm goto"));
        assert!(f("asm(TEMPLATE)").contains("not a string literal"));
        assert!(feature(rewrite("asm(\".globl x\");\n")).contains("file-scope asm"));
    }

    #[test]
    fn recognised_instructions_written_wrongly_are_compile_errors() {
        let e = |body: &str| {
            log(rewrite(&format!(
                "__device__ void f(unsigned& v, unsigned s, const void* p) {{\n {body};\n}}"
            )))
        };
        let l = e("asm(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %0}, [%1];\" : \"=r\"(v) : \"r\"(s))");
        assert_eq!(l, "candidate.cu:2: error: inline PTX: `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: the destination must be a vector of 4 registers");
        assert!(
            e("asm(\"cp.async.ca.shared.global [%0], [%1];\" :: \"r\"(s), \"l\"(p))")
                .contains("takes 3 or 4 operands, found 2")
        );
        assert!(
            e("asm(\"cp.async.ca.shared.global [%0], [%1], 4;\" :: \"r\"(s), \"r\"(s))")
                .contains("an address needs \"l\"")
        );
        assert!(
            e("asm(\"cp.async.wait_group %1;\" :: \"n\"(1))").contains("operand %1 does not exist")
        );
        assert!(
            e("asm(\"cp.async.wait_group %[x];\" :: \"n\"(1))").contains("no operand named [x]")
        );
    }
}
