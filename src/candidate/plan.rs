//! The launch plan: the `// kevin:` lines of the cuda block, parsed but not yet evaluated.
//!
//! ```text
//! // kevin: scratch NAME DTYPE[EXPR]
//! // kevin: launch KERNEL grid=(e[,e[,e]]) block=(e[,e[,e]]) [smem=e] args=(a, ...)
//! ```
//!
//! A directive is a whole-line `//` comment whose text starts with `kevin:`. Keys of a launch
//! may come in any order; `smem` defaults to 0; `grid=N` is accepted for `grid=(N)`. An argument
//! is an expression (a bare name may be a tensor, a scratch buffer or a size: [`super::validate()`]
//! decides) or a whole float literal such as `0.5` or `-1e-3f` for a float parameter. A trailing
//! `// comment` on a directive line is ignored. A comment that looks like a misspelled directive
//! (`// kevin launch ...`, `// Kevin: scratch ...`) is an error rather than silently ignored.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::error::{CandidateError, DirectiveError};
use super::expr::{parse_number, Expr, Number, Parser, SyntaxError, Tok};
use super::Dtype;

/// All directives of a cuda block, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchPlan {
    /// `// kevin: scratch` lines.
    pub scratch: Vec<ScratchDecl>,
    /// `// kevin: launch` lines, in launch order.
    pub launches: Vec<LaunchDecl>,
}

/// `// kevin: scratch NAME DTYPE[EXPR]`: a device buffer the harness allocates (uninitialised)
/// and frees, private to one evaluation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchDecl {
    /// 1-based line in the cuda block.
    pub line: usize,
    /// Its name, used as a launch argument.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Element count.
    pub elems: Expr,
}

/// `// kevin: launch KERNEL grid=(..) block=(..) [smem=..] args=(..)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchDecl {
    /// 1-based line in the cuda block.
    pub line: usize,
    /// The `__global__` function to launch.
    pub kernel: String,
    /// 1 to 3 grid dimensions (x, y, z).
    pub grid: Vec<Expr>,
    /// 1 to 3 block dimensions (x, y, z).
    pub block: Vec<Expr>,
    /// Dynamic shared memory in bytes, if given.
    pub smem: Option<Expr>,
    /// Arguments, one per kernel parameter.
    pub args: Vec<Arg>,
}

/// One launch argument as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arg {
    /// An integer expression, or a bare name (tensor, scratch buffer or size).
    Expr(Expr),
    /// A float literal, for a `float` or `double` parameter.
    Float(f64),
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Expr(e) => e.fmt(f),
            Arg::Float(v) => write!(f, "{v:?}"),
        }
    }
}

/// Directive words accepted after `kevin:`.
const DIRECTIVES: [&str; 2] = ["launch", "scratch"];

/// Parses every `// kevin:` line of `source`.
pub fn parse_plan(source: &str) -> Result<LaunchPlan, CandidateError> {
    let mut plan = LaunchPlan::default();
    for (i, text) in source.lines().enumerate() {
        let line = i + 1;
        let Some(body) =
            directive_body(text).map_err(|error| syntax(line, "`// kevin:` directive", error))?
        else {
            continue;
        };
        let mut p = Parser::new(body);
        let word = p
            .ident("`launch` or `scratch`")
            .map_err(|e| syntax(line, "`// kevin:` directive", e))?;
        match word {
            "launch" => plan.launches.push(parse_launch(&mut p, line)?),
            "scratch" => plan.scratch.push(parse_scratch(&mut p, line)?),
            other => {
                let error = SyntaxError::UnknownDirective {
                    found: other.to_string(),
                };
                return Err(syntax(line, "`// kevin:` directive", error));
            }
        }
    }
    Ok(plan)
}

/// The text after `kevin:` if `text` is a directive line; `Err` if it looks like a misspelled
/// one.
fn directive_body(text: &str) -> Result<Option<&str>, SyntaxError> {
    let Some(rest) = text.trim_start().strip_prefix("//") else {
        return Ok(None);
    };
    let rest = rest.trim_start();
    if let Some(body) = rest.strip_prefix("kevin:") {
        return Ok(Some(body));
    }
    // Near misses: "kevin" in any case, then non-word characters, then a directive word.
    let is_kevin = rest
        .get(..5)
        .is_some_and(|w| w.eq_ignore_ascii_case("kevin"));
    if !is_kevin {
        return Ok(None);
    }
    let after = rest[5..].trim_start_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_');
    let word_len = after
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(after.len());
    if after.len() < rest.len() - 5 && DIRECTIVES.contains(&&after[..word_len]) {
        Err(SyntaxError::Misspelled)
    } else {
        Ok(None)
    }
}

fn syntax(line: usize, context: &str, error: SyntaxError) -> CandidateError {
    CandidateError::Directive {
        line,
        context: context.to_string(),
        error: Box::new(DirectiveError::Syntax(error)),
    }
}

fn end_of_line(p: &Parser<'_>) -> Result<(), SyntaxError> {
    match p.peek() {
        None => Ok(()),
        Some(_) => Err(p.unexpected("end of line")),
    }
}

fn parse_scratch(p: &mut Parser<'_>, line: usize) -> Result<ScratchDecl, CandidateError> {
    let name = p
        .ident("a scratch buffer name")
        .map_err(|e| syntax(line, "scratch", e))?;
    let context = format!("scratch `{name}`");
    let mut rest = || -> Result<ScratchDecl, SyntaxError> {
        let dtype_name = p.ident("a dtype such as f32")?;
        let dtype = Dtype::from_name(dtype_name).ok_or_else(|| SyntaxError::UnknownDtype {
            found: dtype_name.to_string(),
        })?;
        p.expect('[', "after the dtype (write `f32[N]`)")?;
        let elems = p.expr()?;
        p.expect(']', "after the element count")?;
        end_of_line(p)?;
        Ok(ScratchDecl {
            line,
            name: name.to_string(),
            dtype,
            elems,
        })
    };
    rest().map_err(|e| syntax(line, &context, e))
}

fn parse_launch(p: &mut Parser<'_>, line: usize) -> Result<LaunchDecl, CandidateError> {
    let kernel = p
        .ident("a kernel name")
        .map_err(|e| syntax(line, "launch", e))?;
    let mut rest = || -> Result<LaunchDecl, SyntaxError> {
        let (mut grid, mut block, mut smem, mut args) = (None, None, None, None);
        while p.peek().is_some() {
            let key = p.ident("`grid=`, `block=`, `smem=` or `args=`")?;
            if !["grid", "block", "smem", "args"].contains(&key) {
                return Err(SyntaxError::UnknownKey {
                    key: key.to_string(),
                });
            }
            p.expect('=', &format!("after `{key}`"))?;
            let duplicate = match key {
                "grid" => grid.replace(parse_dims(p, "grid")?).is_some(),
                "block" => block.replace(parse_dims(p, "block")?).is_some(),
                "smem" => smem.replace(p.expr()?).is_some(),
                _ => args.replace(parse_args(p)?).is_some(),
            };
            if duplicate {
                return Err(SyntaxError::DuplicateKey {
                    key: key.to_string(),
                });
            }
        }
        let missing = |key: &str| SyntaxError::MissingKey {
            key: key.to_string(),
        };
        Ok(LaunchDecl {
            line,
            kernel: kernel.to_string(),
            grid: grid.ok_or_else(|| missing("grid"))?,
            block: block.ok_or_else(|| missing("block"))?,
            smem,
            args: args.ok_or_else(|| missing("args"))?,
        })
    };
    rest().map_err(|e| syntax(line, &format!("launch `{kernel}`"), e))
}

/// `(e[, e[, e]])` or a single `e`.
fn parse_dims(p: &mut Parser<'_>, key: &str) -> Result<Vec<Expr>, SyntaxError> {
    if !p.eat('(') {
        return Ok(vec![p.expr()?]);
    }
    let mut dims = Vec::new();
    loop {
        dims.push(p.expr()?);
        if dims.len() > 3 {
            return Err(SyntaxError::DimCount {
                key: key.to_string(),
                count: dims.len(),
            });
        }
        if !p.eat(',') {
            p.expect(')', &format!("or `,` in `{key}=(...)`"))?;
            return Ok(dims);
        }
    }
}

/// `(a, ...)`, possibly empty.
fn parse_args(p: &mut Parser<'_>) -> Result<Vec<Arg>, SyntaxError> {
    p.expect('(', "after `args=`")?;
    let mut args = Vec::new();
    if p.eat(')') {
        return Ok(args);
    }
    loop {
        args.push(parse_arg(p)?);
        if !p.eat(',') {
            p.expect(')', "or `,` in `args=(...)`")?;
            return Ok(args);
        }
    }
}

/// A whole float literal (optionally negated), or else an expression.
fn parse_arg(p: &mut Parser<'_>) -> Result<Arg, SyntaxError> {
    let negated = p.peek() == Some(Tok::Punct('-'));
    let number = if negated { p.peek2() } else { p.peek() };
    if let Some(Tok::Number(text)) = number {
        if let Ok(Number::Float(v)) = parse_number(text) {
            p.bump();
            if negated {
                p.bump();
            }
            return match p.peek() {
                None | Some(Tok::Punct(',' | ')')) => Ok(Arg::Float(if negated { -v } else { v })),
                Some(_) => Err(SyntaxError::FloatInExpr {
                    text: text.to_string(),
                }),
            };
        }
    }
    Ok(Arg::Expr(p.expr()?))
}
