//! The `asm` statement: GCC's extended-asm syntax read into a template and its operands.

use super::{invalid, unsupported};
use crate::candidate::lex::{TokKind, Token};
use crate::cpu::compile::CpuCompileError;

/// How an operand is accessed, from its constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    /// `=`: written only.
    Write,
    /// `+`: read and written.
    ReadWrite,
    /// An input.
    Read,
}

#[derive(Debug)]
pub(super) struct Operand {
    pub(super) name: Option<String>,
    pub(super) access: Access,
    /// The constraint letter (`r l f h d n i`); for a matching constraint, that of its output.
    pub(super) letter: char,
    /// The input tied to this output by a matching constraint, or the output an input is tied to.
    pub(super) tied: Option<usize>,
    /// The C++ expression, its tokens joined by spaces (comments dropped).
    pub(super) expr: String,
}

#[derive(Debug)]
pub(super) struct Statement {
    pub(super) template: String,
    /// Extended asm (with a `:`): `%` introduces operands.
    pub(super) extended: bool,
    /// Outputs, then inputs.
    pub(super) operands: Vec<Operand>,
    /// Index of the closing `)` token.
    pub(super) close: usize,
}

/// Parses the statement whose `asm` keyword is `toks[k]`.
pub(super) fn parse_statement(toks: &[Token<'_>], k: usize) -> Result<Statement, CpuCompileError> {
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
