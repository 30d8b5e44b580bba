//! The PTX template: split into instructions of PTX tokens, each into its opcode and operands.

use super::statement::Statement;
use super::{invalid, unsupported};
use crate::cpu::compile::CpuCompileError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Lex {
    Word(String),
    Num(i64),
    Op(usize),
    Punct(char),
}

/// Splits a template into instructions of PTX tokens, `%N`/`%[name]` resolved to operands.
pub(super) fn template_tokens(
    stmt: &Statement,
    line: usize,
) -> Result<Vec<Vec<Lex>>, CpuCompileError> {
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
pub(super) enum Arg {
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
pub(super) fn instruction(toks: &[Lex]) -> Result<(String, Vec<Arg>), CpuCompileError> {
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
