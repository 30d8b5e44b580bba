//! Size expressions of the launch plan: `cdiv(M*N, 256)`, `N / 64 + 1`, `-(K % 8)`.
//!
//! The grammar is the usual one: `+ -` below `* / %`, unary minus, parentheses, integer
//! literals, size symbols, and one function, `cdiv(a, b)` (division rounding towards +inf).
//! Evaluation is in `i64` with checked arithmetic, so overflow and division by zero are errors,
//! never panics or wrap-around. `/` and `%` truncate towards zero, as in C.
//!
//! The parser is recursive descent with a depth limit ([`MAX_DEPTH`]), so a response of a
//! million `(` cannot overflow the stack. The directive-line tokenizer lives here too, since
//! [`super::plan`] parses whole directive lines with the same `Parser`.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How deeply expressions may nest (parentheses, unary minus, `cdiv` arguments).
pub const MAX_DEPTH: usize = 64;

/// How many operands and operators one directive line's expressions may hold in all.
pub const MAX_NODES: usize = 1024;

/// An unevaluated integer expression over the task's size symbols.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expr {
    /// An integer literal.
    Int(i64),
    /// A size symbol of the task, such as `N`.
    Sym(String),
    /// Unary minus.
    Neg(Box<Expr>),
    /// A binary operation.
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// `cdiv(a, b)`: `a / b` rounded towards positive infinity.
    Cdiv(Box<Expr>, Box<Expr>),
}

/// A binary operator of [`Expr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`, truncating towards zero.
    Div,
    /// `%`, with the sign of the dividend.
    Rem,
}

impl BinOp {
    fn symbol(self) -> char {
        match self {
            BinOp::Add => '+',
            BinOp::Sub => '-',
            BinOp::Mul => '*',
            BinOp::Div => '/',
            BinOp::Rem => '%',
        }
    }

    fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => 1,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 2,
        }
    }
}

/// A syntax error in a directive line or one of its expressions.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SyntaxError {
    /// The parser wanted one thing and saw another.
    #[error("expected {expected}, found {found}")]
    Unexpected {
        /// What would have been accepted.
        expected: String,
        /// What was there, quoted, or "end of line".
        found: String,
    },
    /// A numeric literal that is neither a decimal integer nor a float.
    #[error("`{text}` is not a valid number (write decimal integers like 256 or floats like 0.5)")]
    BadNumber {
        /// The literal as written.
        text: String,
    },
    /// An integer literal beyond `i64`.
    #[error("integer `{text}` does not fit in 64 bits")]
    NumberTooLarge {
        /// The literal as written.
        text: String,
    },
    /// A float literal inside an integer expression.
    #[error("float `{text}` can only be a whole argument, not part of a size expression")]
    FloatInExpr {
        /// The literal as written.
        text: String,
    },
    /// More than [`MAX_NODES`] operands and operators on one line.
    #[error("expressions on this line are longer than {max} operands and operators")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// Nesting beyond [`MAX_DEPTH`].
    #[error("expression nests deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// A call of something other than `cdiv`.
    #[error("unknown function `{name}` (the only function is `cdiv(a, b)`)")]
    UnknownFunction {
        /// The called name.
        name: String,
    },
    /// A `// kevin:` line whose directive is neither `launch` nor `scratch`.
    #[error("unknown directive `{found}` (expected `launch` or `scratch`)")]
    UnknownDirective {
        /// The word after `kevin:`.
        found: String,
    },
    /// A comment that looks like a directive but is not spelled `// kevin: `.
    #[error("write directives as `// kevin: launch ...` or `// kevin: scratch ...`")]
    Misspelled,
    /// A `key=` other than grid, block, smem, args.
    #[error("unknown key `{key}` (expected grid=, block=, smem= or args=)")]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// The same key twice on one launch line.
    #[error("`{key}=` is given twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A required key is missing.
    #[error("missing `{key}=(...)`")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A grid or block with 0 or more than 3 dimensions.
    #[error("`{key}` has {count} dimensions; give 1 to 3 (x, y, z)")]
    DimCount {
        /// `grid` or `block`.
        key: String,
        /// How many were given.
        count: usize,
    },
    /// A scratch dtype that kevin does not know.
    #[error(
        "unknown dtype `{found}` (expected one of f16, bf16, f32, f64, i8, u8, i32, i64, bool)"
    )]
    UnknownDtype {
        /// The dtype as written.
        found: String,
    },
}

/// An error evaluating an [`Expr`] against the task's sizes.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum EvalError {
    /// A symbol that names nothing.
    #[error("`{name}` is not a size of this task (sizes: {sizes})")]
    UnknownSymbol {
        /// The symbol.
        name: String,
        /// The task's sizes, comma separated.
        sizes: String,
    },
    /// A symbol that names a tensor or scratch buffer, not a size.
    #[error(
        "`{name}` is a {what}, not a size; size expressions use only sizes ({sizes}) and integers"
    )]
    NotASize {
        /// The symbol.
        name: String,
        /// "tensor" or "scratch buffer".
        what: String,
        /// The task's sizes, comma separated.
        sizes: String,
    },
    /// Checked arithmetic failed.
    #[error("`{expr}` overflows 64-bit integer arithmetic")]
    Overflow {
        /// The subexpression that overflowed.
        expr: String,
    },
    /// Division (or `%`, or `cdiv`) by zero.
    #[error("`{expr}` divides by zero")]
    DivisionByZero {
        /// The subexpression.
        expr: String,
    },
}

impl Expr {
    /// Evaluates with checked `i64` arithmetic; `lookup` resolves size symbols.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Result<i64, EvalError>) -> Result<i64, EvalError> {
        match self {
            Expr::Int(v) => Ok(*v),
            Expr::Sym(name) => lookup(name),
            Expr::Neg(e) => e.eval(lookup)?.checked_neg().ok_or_else(|| self.overflow()),
            Expr::Bin(op, a, b) => {
                let (a, b) = (a.eval(lookup)?, b.eval(lookup)?);
                if matches!(op, BinOp::Div | BinOp::Rem) && b == 0 {
                    return Err(EvalError::DivisionByZero {
                        expr: self.to_string(),
                    });
                }
                let r = match op {
                    BinOp::Add => a.checked_add(b),
                    BinOp::Sub => a.checked_sub(b),
                    BinOp::Mul => a.checked_mul(b),
                    BinOp::Div => a.checked_div(b),
                    BinOp::Rem => a.checked_rem(b),
                };
                r.ok_or_else(|| self.overflow())
            }
            Expr::Cdiv(a, b) => {
                let (a, b) = (a.eval(lookup)?, b.eval(lookup)?);
                if b == 0 {
                    return Err(EvalError::DivisionByZero {
                        expr: self.to_string(),
                    });
                }
                let q = a.checked_div(b).ok_or_else(|| self.overflow())?;
                let r = a % b; // cannot overflow once checked_div succeeded
                if r != 0 && ((r > 0) == (b > 0)) {
                    q.checked_add(1).ok_or_else(|| self.overflow())
                } else {
                    Ok(q)
                }
            }
        }
    }

    fn overflow(&self) -> EvalError {
        EvalError::Overflow {
            expr: self.to_string(),
        }
    }

    /// The symbol, if this expression is a bare symbol.
    pub fn as_sym(&self) -> Option<&str> {
        match self {
            Expr::Sym(s) => Some(s),
            _ => None,
        }
    }

    fn fmt_prec(&self, f: &mut fmt::Formatter<'_>, min_prec: u8) -> fmt::Result {
        match self {
            Expr::Int(v) => write!(f, "{v}"),
            Expr::Sym(s) => f.write_str(s),
            Expr::Neg(e) => {
                f.write_str("-")?;
                e.fmt_prec(f, 3)
            }
            Expr::Cdiv(a, b) => write!(f, "cdiv({a}, {b})"),
            Expr::Bin(op, a, b) => {
                let p = op.precedence();
                if p < min_prec {
                    f.write_str("(")?;
                }
                a.fmt_prec(f, p)?;
                write!(f, " {} ", op.symbol())?;
                b.fmt_prec(f, p + 1)?;
                if p < min_prec {
                    f.write_str(")")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_prec(f, 0)
    }
}

/// A token of a directive line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tok<'a> {
    /// `[A-Za-z_][A-Za-z0-9_]*`
    Ident(&'a str),
    /// Anything that starts with a digit (or `.` and a digit), checked when parsed.
    Number(&'a str),
    /// Any other single character.
    Punct(char),
}

impl fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) | Tok::Number(s) => write!(f, "`{s}`"),
            Tok::Punct(c) => write!(f, "`{c}`"),
        }
    }
}

/// Tokenizes a directive line; a `//` ends it (a trailing comment is allowed).
pub(crate) fn tokenize(s: &str) -> Vec<Tok<'_>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            break;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(&s[start..i]));
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            while i < b.len() {
                let d = b[i];
                let exp_sign = (d == b'+' || d == b'-') && matches!(b[i - 1], b'e' | b'E');
                if d.is_ascii_alphanumeric() || d == b'.' || d == b'_' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Tok::Number(&s[start..i]));
        } else {
            let ch = s[i..].chars().next().unwrap_or('?');
            i += ch.len_utf8();
            out.push(Tok::Punct(ch));
        }
    }
    out
}

/// A number literal as parsed: an integer or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    Int(i64),
    Float(f64),
}

/// Parses a number token: decimal integers, and floats with `.` or an exponent and an optional
/// `f` suffix.
pub(crate) fn parse_number(text: &str) -> Result<Number, SyntaxError> {
    if text.bytes().all(|c| c.is_ascii_digit()) {
        return text
            .parse::<i64>()
            .map(Number::Int)
            .map_err(|_| SyntaxError::NumberTooLarge {
                text: text.to_string(),
            });
    }
    let body = text.strip_suffix(['f', 'F']).unwrap_or(text);
    let looks_float = body
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'))
        && body.bytes().any(|c| matches!(c, b'.' | b'e' | b'E'));
    match body.parse::<f64>() {
        Ok(v) if looks_float && v.is_finite() => Ok(Number::Float(v)),
        _ => Err(SyntaxError::BadNumber {
            text: text.to_string(),
        }),
    }
}

/// A cursor over directive-line tokens with a recursive-descent expression parser.
pub(crate) struct Parser<'a> {
    toks: Vec<Tok<'a>>,
    pos: usize,
    nodes: usize,
}

impl<'a> Parser<'a> {
    /// A parser over the tokens of `s`.
    pub fn new(s: &'a str) -> Self {
        Parser {
            toks: tokenize(s),
            pos: 0,
            nodes: 0,
        }
    }

    /// The next token, without consuming it.
    pub fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.pos).copied()
    }

    /// The token after the next one.
    pub fn peek2(&self) -> Option<Tok<'a>> {
        self.toks.get(self.pos + 1).copied()
    }

    /// Consumes and returns the next token.
    pub fn bump(&mut self) -> Option<Tok<'a>> {
        let t = self.peek();
        self.pos += usize::from(t.is_some());
        t
    }

    /// Consumes `c` if it is next.
    pub fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Consumes `c` or fails saying so.
    pub fn expect(&mut self, c: char, context: &str) -> Result<(), SyntaxError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{c}` {context}")))
        }
    }

    /// Consumes an identifier or fails.
    pub fn ident(&mut self, what: &str) -> Result<&'a str, SyntaxError> {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// An "expected X, found <next token>" error.
    pub fn unexpected(&self, expected: &str) -> SyntaxError {
        SyntaxError::Unexpected {
            expected: expected.to_string(),
            found: self
                .peek()
                .map_or_else(|| "end of line".to_string(), |t| t.to_string()),
        }
    }

    /// Parses an expression (stops before the first token that cannot continue it).
    pub fn expr(&mut self) -> Result<Expr, SyntaxError> {
        self.sum(0)
    }

    fn sum(&mut self, depth: usize) -> Result<Expr, SyntaxError> {
        let mut lhs = self.product(depth)?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct('+')) => BinOp::Add,
                Some(Tok::Punct('-')) => BinOp::Sub,
                _ => return Ok(lhs),
            };
            self.pos += 1;
            self.count_node()?;
            let rhs = self.product(depth)?;
            lhs = Expr::Bin(op, Box::new(lhs), Box::new(rhs));
        }
    }

    fn product(&mut self, depth: usize) -> Result<Expr, SyntaxError> {
        let mut lhs = self.unary(depth)?;
        loop {
            let op = match self.peek() {
                Some(Tok::Punct('*')) => BinOp::Mul,
                Some(Tok::Punct('/')) => BinOp::Div,
                Some(Tok::Punct('%')) => BinOp::Rem,
                _ => return Ok(lhs),
            };
            self.pos += 1;
            self.count_node()?;
            let rhs = self.unary(depth)?;
            lhs = Expr::Bin(op, Box::new(lhs), Box::new(rhs));
        }
    }

    fn unary(&mut self, depth: usize) -> Result<Expr, SyntaxError> {
        if depth >= MAX_DEPTH {
            return Err(SyntaxError::TooDeep { max: MAX_DEPTH });
        }
        self.count_node()?;
        let e = match self.peek() {
            Some(Tok::Punct('-')) => {
                self.pos += 1;
                Expr::Neg(Box::new(self.unary(depth + 1)?))
            }
            Some(Tok::Punct('(')) => {
                self.pos += 1;
                let e = self.sum(depth + 1)?;
                self.expect(')', "to close `(`")?;
                e
            }
            Some(Tok::Number(text)) => {
                self.pos += 1;
                match parse_number(text)? {
                    Number::Int(v) => Expr::Int(v),
                    Number::Float(_) => {
                        return Err(SyntaxError::FloatInExpr {
                            text: text.to_string(),
                        })
                    }
                }
            }
            Some(Tok::Ident(name)) => {
                self.pos += 1;
                if !self.eat('(') {
                    return Ok(Expr::Sym(name.to_string()));
                }
                if name != "cdiv" {
                    return Err(SyntaxError::UnknownFunction {
                        name: name.to_string(),
                    });
                }
                let a = self.sum(depth + 1)?;
                self.expect(',', "between the two arguments of `cdiv`")?;
                let b = self.sum(depth + 1)?;
                self.expect(')', "after the second argument of `cdiv`")?;
                Expr::Cdiv(Box::new(a), Box::new(b))
            }
            _ => return Err(self.unexpected("an expression")),
        };
        Ok(e)
    }

    /// Counts one more expression node against [`MAX_NODES`]. Bounding the node count bounds
    /// the height of the tree, so evaluating, printing and dropping it cannot overflow the stack.
    fn count_node(&mut self) -> Result<(), SyntaxError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            Err(SyntaxError::TooLong { max: MAX_NODES })
        } else {
            Ok(())
        }
    }
}
