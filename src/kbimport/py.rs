//! The subset of Python that KernelBench problem files are written in: a lexer with
//! indentation, and a parser for module-level assignments, `class` and `def` blocks, `return`,
//! and expressions (arithmetic, calls with keyword and starred arguments, attributes,
//! subscripts, tuples and lists). Compound statements it does not model (`if`, `for`, `with`,
//! ...) are parsed as a header and a block and kept as [`Stmt::Other`], so the importer can name
//! them when it meets one. Nothing here evaluates anything.

use std::fmt;

/// A parse failure, with the 1-based line.
#[derive(Clone, Debug, PartialEq)]
pub struct PyError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for PyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Int(i64),
    Float(f64),
    Str(String),
    Op(&'static str),
    Newline,
    Indent,
    Dedent,
    End,
}

const OPS: [&str; 44] = [
    "**=", "//=", "...", "**", "//", "->", "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "@=",
    "%=", "<<", ">>", ":=", "(", ")", "[", "]", "{", "}", ",", ":", ".", ";", "=", "+", "-", "*",
    "/", "%", "@", "<", ">", "~", "&", "|", "^", "!", "$",
];

fn lex(src: &str) -> Result<Vec<(Tok, usize)>, PyError> {
    let mut out: Vec<(Tok, usize)> = Vec::new();
    let mut indents = vec![0usize];
    let mut depth = 0usize; // open brackets
    let chars: Vec<char> = src.chars().collect();
    let mut i = 0;
    let mut line = 1;
    let mut at_line_start = true;
    let err = |line: usize, m: &str| PyError {
        line,
        message: m.to_string(),
    };
    while i < chars.len() {
        if at_line_start && depth == 0 {
            // Measure the indentation; blank and comment-only lines do not count.
            let mut col = 0;
            let mut j = i;
            while j < chars.len() && (chars[j] == ' ' || chars[j] == '\t') {
                col += if chars[j] == '\t' { 8 - col % 8 } else { 1 };
                j += 1;
            }
            if j >= chars.len() || chars[j] == '\n' || chars[j] == '#' || chars[j] == '\r' {
                while j < chars.len() && chars[j] != '\n' {
                    j += 1;
                }
                i = j;
                if i < chars.len() {
                    i += 1;
                    line += 1;
                }
                continue;
            }
            at_line_start = false;
            i = j;
            let top = *indents.last().unwrap_or(&0);
            if col > top {
                indents.push(col);
                out.push((Tok::Indent, line));
            } else {
                while col < *indents.last().unwrap_or(&0) {
                    indents.pop();
                    out.push((Tok::Dedent, line));
                }
                if col != *indents.last().unwrap_or(&0) {
                    return Err(err(line, "inconsistent indentation"));
                }
            }
        }
        let c = chars[i];
        match c {
            '\n' => {
                if depth == 0 && !matches!(out.last(), Some((Tok::Newline, _)) | None) {
                    out.push((Tok::Newline, line));
                }
                line += 1;
                i += 1;
                // Inside brackets a new line continues the logical line.
                at_line_start = depth == 0;
            }
            ' ' | '\t' | '\r' => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\\' if chars.get(i + 1) == Some(&'\n') => {
                i += 2;
                line += 1;
            }
            '"' | '\'' => {
                let (s, next, lines) =
                    string(&chars, i).ok_or_else(|| err(line, "unterminated string"))?;
                out.push((Tok::Str(s), line));
                line += lines;
                i = next;
            }
            c if c.is_ascii_digit()
                || c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) =>
            {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric()
                        || chars[i] == '.'
                        || chars[i] == '_'
                        || (matches!(chars[i], '+' | '-') && matches!(chars[i - 1], 'e' | 'E')))
                {
                    i += 1;
                }
                let text: String = chars[start..i].iter().filter(|c| **c != '_').collect();
                let tok = if text.contains(['.', 'e', 'E']) && !text.starts_with("0x") {
                    Tok::Float(
                        text.parse()
                            .map_err(|_| err(line, &format!("bad number `{text}`")))?,
                    )
                } else {
                    Tok::Int(
                        text.parse()
                            .map_err(|_| err(line, &format!("bad number `{text}`")))?,
                    )
                };
                out.push((tok, line));
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // String prefixes: r"", f"", b"", rb"" ...
                if word.len() <= 2
                    && word.chars().all(|c| "rRbBfFuU".contains(c))
                    && matches!(chars.get(i), Some('"' | '\''))
                {
                    let (s, next, lines) =
                        string(&chars, i).ok_or_else(|| err(line, "unterminated string"))?;
                    out.push((Tok::Str(s), line));
                    line += lines;
                    i = next;
                } else {
                    out.push((Tok::Name(word), line));
                }
            }
            _ => {
                let rest: String = chars[i..chars.len().min(i + 3)].iter().collect();
                let Some(op) = OPS.iter().find(|o| rest.starts_with(**o)) else {
                    return Err(err(line, &format!("unexpected character `{c}`")));
                };
                match *op {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth = depth.saturating_sub(1),
                    _ => {}
                }
                out.push((Tok::Op(op), line));
                i += op.len();
            }
        }
    }
    if !matches!(out.last(), Some((Tok::Newline, _)) | None) {
        out.push((Tok::Newline, line));
    }
    while indents.len() > 1 {
        indents.pop();
        out.push((Tok::Dedent, line));
    }
    out.push((Tok::End, line));
    Ok(out)
}

/// A string literal starting at `i`: its text, the index after it, and the newlines inside.
fn string(chars: &[char], i: usize) -> Option<(String, usize, usize)> {
    let q = chars[i];
    let triple = chars.get(i + 1) == Some(&q) && chars.get(i + 2) == Some(&q);
    let mut j = if triple { i + 3 } else { i + 1 };
    let mut s = String::new();
    let mut lines = 0;
    loop {
        let c = *chars.get(j)?;
        if c == '\\' {
            s.push(*chars.get(j + 1)?);
            if chars[j + 1] == '\n' {
                lines += 1;
            }
            j += 2;
            continue;
        }
        if triple {
            if c == q && chars.get(j + 1) == Some(&q) && chars.get(j + 2) == Some(&q) {
                return Some((s, j + 3, lines));
            }
        } else if c == q {
            return Some((s, j + 1, lines));
        } else if c == '\n' {
            return None;
        }
        if c == '\n' {
            lines += 1;
        }
        s.push(c);
        j += 1;
    }
}

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Int(i64),
    Float(f64),
    Str(String),
    Name(String),
    /// `True`, `False`.
    Bool(bool),
    None,
    Attr(Box<Expr>, String),
    Call(Box<Expr>, Vec<Arg>),
    /// `a[i]` (a slice or several indices: [`Expr::Unsupported`] inside).
    Index(Box<Expr>, Box<Expr>),
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    /// A binary operator: `+ - * / // % @ **`.
    Bin(&'static str, Box<Expr>, Box<Expr>),
    Neg(Box<Expr>),
    /// `*x` in a call or a display.
    Star(Box<Expr>),
    /// A construct the importer never models (comparison, slice, lambda, ...), by name.
    Unsupported(String),
}

/// A call argument, positional or by keyword.
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<String>,
    pub value: Expr,
}

/// A function parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub default: Option<Expr>,
}

/// A statement, with its line.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    Assign {
        targets: Vec<Expr>,
        value: Expr,
        line: usize,
    },
    /// `x += y` and the like (the operator without `=`).
    AugAssign {
        target: Expr,
        op: &'static str,
        value: Expr,
        line: usize,
    },
    Return(Option<Expr>, usize),
    Expr(Expr, usize),
    Def {
        name: String,
        params: Vec<Param>,
        body: Vec<Stmt>,
        line: usize,
    },
    Class {
        name: String,
        body: Vec<Stmt>,
        line: usize,
    },
    /// `import`, `from ... import`, `pass`.
    Skip,
    /// A statement the importer does not model (`if`, `for`, ...), by its keyword.
    Other(String, usize),
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
}

/// Parses a module.
pub fn parse(src: &str) -> Result<Vec<Stmt>, PyError> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
    };
    let mut out = Vec::new();
    while p.peek() != &Tok::End {
        if p.peek() == &Tok::Newline {
            p.pos += 1;
            continue;
        }
        out.extend(p.stmt()?);
    }
    Ok(out)
}

const BIN_LEVELS: [&[&str]; 2] = [&["+", "-"], &["*", "/", "//", "%", "@"]];

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].0
    }

    fn line(&self) -> usize {
        self.toks[self.pos.min(self.toks.len() - 1)].1
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }

    fn err<T>(&self, m: impl Into<String>) -> Result<T, PyError> {
        Err(PyError {
            line: self.line(),
            message: m.into(),
        })
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if self.is_op(op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_op(&mut self, op: &str) -> Result<(), PyError> {
        if self.eat_op(op) {
            Ok(())
        } else {
            self.err(format!("expected `{op}`, found {:?}", self.peek()))
        }
    }

    fn is_name(&self, n: &str) -> bool {
        matches!(self.peek(), Tok::Name(w) if w == n)
    }

    fn name(&mut self) -> Result<String, PyError> {
        match self.next() {
            Tok::Name(n) => Ok(n),
            t => {
                self.pos -= 1;
                self.err(format!("expected a name, found {t:?}"))
            }
        }
    }

    /// The statements of an indented block (or of the rest of the line after `:`).
    fn block(&mut self) -> Result<Vec<Stmt>, PyError> {
        if self.peek() != &Tok::Newline {
            // `def f(): return x` on one line.
            return self.simple();
        }
        self.pos += 1;
        if self.next() != Tok::Indent {
            self.pos -= 1;
            return self.err("expected an indented block");
        }
        let mut out = Vec::new();
        loop {
            match self.peek() {
                Tok::Dedent => {
                    self.pos += 1;
                    return Ok(out);
                }
                Tok::End => return Ok(out),
                Tok::Newline => self.pos += 1,
                _ => out.extend(self.stmt()?),
            }
        }
    }

    /// One statement, or the several simple statements of a line joined by `;`.
    fn stmt(&mut self) -> Result<Vec<Stmt>, PyError> {
        let line = self.line();
        // Decorators: skipped with the line they are on.
        if self.is_op("@") {
            while !matches!(self.peek(), Tok::Newline | Tok::End) {
                self.pos += 1;
            }
            self.pos += 1;
            return Ok(vec![Stmt::Skip]);
        }
        if self.is_name("def") {
            self.pos += 1;
            let name = self.name()?;
            self.expect_op("(")?;
            let mut params = Vec::new();
            while !self.eat_op(")") {
                if self.eat_op("*") || self.eat_op("**") || self.eat_op("/") {
                    if self.is_op(",") || self.is_op(")") {
                        self.eat_op(",");
                        continue;
                    }
                }
                let pname = self.name()?;
                if self.eat_op(":") {
                    self.expr()?;
                }
                let default = if self.eat_op("=") {
                    Some(self.expr()?)
                } else {
                    None
                };
                params.push(Param {
                    name: pname,
                    default,
                });
                if !self.eat_op(",") {
                    self.expect_op(")")?;
                    break;
                }
            }
            if self.eat_op("->") {
                self.expr()?;
            }
            self.expect_op(":")?;
            let body = self.block()?;
            return Ok(vec![Stmt::Def {
                name,
                params,
                body,
                line,
            }]);
        }
        if self.is_name("class") {
            self.pos += 1;
            let name = self.name()?;
            if self.eat_op("(") {
                while !self.eat_op(")") {
                    self.expr()?;
                    self.eat_op(",");
                }
            }
            self.expect_op(":")?;
            let body = self.block()?;
            return Ok(vec![Stmt::Class { name, body, line }]);
        }
        const COMPOUND: [&str; 8] = ["if", "for", "while", "with", "try", "async", "elif", "else"];
        if let Tok::Name(w) = self.peek().clone() {
            if COMPOUND.contains(&w.as_str()) || w == "except" || w == "finally" {
                // Header to its `:`, then the block; kept by keyword only.
                let mut depth = 0i32;
                loop {
                    match self.next() {
                        Tok::Op("(" | "[" | "{") => depth += 1,
                        Tok::Op(")" | "]" | "}") => depth -= 1,
                        Tok::Op(":") if depth == 0 => break,
                        Tok::End => return self.err(format!("`{w}` without `:`")),
                        _ => {}
                    }
                }
                self.block()?;
                return Ok(vec![Stmt::Other(w, line)]);
            }
        }
        self.simple()
    }

    /// The simple statements of a line (joined by `;`) and its end.
    fn simple(&mut self) -> Result<Vec<Stmt>, PyError> {
        let line = self.line();
        let mut s = vec![self.simple_inner(line)?];
        while self.eat_op(";") {
            if matches!(self.peek(), Tok::Newline | Tok::End) {
                break;
            }
            s.push(self.simple_inner(line)?);
        }
        match self.peek() {
            Tok::Newline => self.pos += 1,
            Tok::End | Tok::Dedent => {}
            t => return self.err(format!("unexpected {t:?} at the end of a statement")),
        }
        Ok(s)
    }

    fn simple_inner(&mut self, line: usize) -> Result<Stmt, PyError> {
        if self.is_name("import") || self.is_name("from") {
            while !matches!(self.peek(), Tok::Newline | Tok::End) {
                self.pos += 1;
            }
            return Ok(Stmt::Skip);
        }
        if self.is_name("pass") {
            self.pos += 1;
            return Ok(Stmt::Skip);
        }
        if self.is_name("return") {
            self.pos += 1;
            if matches!(self.peek(), Tok::Newline | Tok::End | Tok::Op(";")) {
                return Ok(Stmt::Return(None, line));
            }
            return Ok(Stmt::Return(Some(self.tuple_or_expr()?), line));
        }
        for kw in [
            "raise", "assert", "del", "global", "nonlocal", "yield", "break", "continue",
        ] {
            if self.is_name(kw) {
                while !matches!(self.peek(), Tok::Newline | Tok::End) {
                    self.pos += 1;
                }
                return Ok(Stmt::Other(kw.to_string(), line));
            }
        }
        let first = self.tuple_or_expr()?;
        // `x: int = 3`
        if self.eat_op(":") {
            self.expr()?;
        }
        for op in ["+=", "-=", "*=", "/=", "@=", "//=", "**=", "%="] {
            if self.eat_op(op) {
                let value = self.tuple_or_expr()?;
                let op = &op[..op.len() - 1];
                let op = BIN_LEVELS
                    .iter()
                    .flat_map(|l| l.iter())
                    .chain(&["**"])
                    .find(|o| **o == op)
                    .copied()
                    .unwrap_or("+");
                return Ok(Stmt::AugAssign {
                    target: first,
                    op,
                    value,
                    line,
                });
            }
        }
        if !self.is_op("=") {
            return Ok(Stmt::Expr(first, line));
        }
        let mut targets = vec![first];
        let mut value;
        loop {
            self.expect_op("=")?;
            value = self.tuple_or_expr()?;
            if !self.is_op("=") {
                break;
            }
            targets.push(value.clone());
        }
        Ok(Stmt::Assign {
            targets,
            value,
            line,
        })
    }

    /// `a, b` (a tuple without parentheses) or one expression.
    fn tuple_or_expr(&mut self) -> Result<Expr, PyError> {
        let first = self.star_or_expr()?;
        if !self.is_op(",") {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat_op(",") {
            if matches!(
                self.peek(),
                Tok::Newline | Tok::End | Tok::Op("=" | ")" | ";")
            ) {
                break;
            }
            items.push(self.star_or_expr()?);
        }
        Ok(Expr::Tuple(items))
    }

    fn star_or_expr(&mut self) -> Result<Expr, PyError> {
        if self.eat_op("*") {
            return Ok(Expr::Star(Box::new(self.expr()?)));
        }
        self.expr()
    }

    /// An expression: the operators the importer models, and the others parsed and marked.
    fn expr(&mut self) -> Result<Expr, PyError> {
        if self.is_name("lambda") {
            while !matches!(
                self.peek(),
                Tok::Newline | Tok::End | Tok::Op(")" | "]" | ",")
            ) {
                self.pos += 1;
            }
            return Ok(Expr::Unsupported("lambda".into()));
        }
        let e = self.or_test()?;
        if self.is_name("if") {
            self.pos += 1;
            self.or_test()?;
            if !self.is_name("else") {
                return self.err("expected `else`");
            }
            self.pos += 1;
            self.expr()?;
            return Ok(Expr::Unsupported("a conditional expression".into()));
        }
        Ok(e)
    }

    fn or_test(&mut self) -> Result<Expr, PyError> {
        let mut e = self.not_test()?;
        while self.is_name("or") || self.is_name("and") {
            let w = match self.next() {
                Tok::Name(w) => w,
                _ => unreachable!(),
            };
            self.not_test()?;
            e = Expr::Unsupported(format!("`{w}`"));
        }
        Ok(e)
    }

    fn not_test(&mut self) -> Result<Expr, PyError> {
        if self.is_name("not") {
            self.pos += 1;
            self.not_test()?;
            return Ok(Expr::Unsupported("`not`".into()));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Expr, PyError> {
        let mut e = self.bitwise()?;
        loop {
            let cmp = ["<", ">", "==", "!=", "<=", ">="]
                .iter()
                .find(|o| self.is_op(o))
                .copied();
            let word = self.is_name("in") || self.is_name("is");
            if cmp.is_none() && !word {
                return Ok(e);
            }
            self.pos += 1;
            if self.is_name("not") {
                self.pos += 1;
            }
            self.bitwise()?;
            e = Expr::Unsupported("a comparison".into());
        }
    }

    fn bitwise(&mut self) -> Result<Expr, PyError> {
        let mut e = self.arith(0)?;
        while ["|", "&", "^", "<<", ">>"].iter().any(|o| self.is_op(o)) {
            self.pos += 1;
            self.arith(0)?;
            e = Expr::Unsupported("a bitwise operator".into());
        }
        Ok(e)
    }

    fn arith(&mut self, level: usize) -> Result<Expr, PyError> {
        if level == BIN_LEVELS.len() {
            return self.unary();
        }
        let mut e = self.arith(level + 1)?;
        loop {
            let Some(op) = BIN_LEVELS[level].iter().find(|o| self.is_op(o)).copied() else {
                return Ok(e);
            };
            self.pos += 1;
            let r = self.arith(level + 1)?;
            e = Expr::Bin(op, Box::new(e), Box::new(r));
        }
    }

    fn unary(&mut self) -> Result<Expr, PyError> {
        if self.eat_op("-") {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        if self.eat_op("+") {
            return self.unary();
        }
        if self.eat_op("~") {
            self.unary()?;
            return Ok(Expr::Unsupported("`~`".into()));
        }
        self.power()
    }

    fn power(&mut self) -> Result<Expr, PyError> {
        let base = self.primary()?;
        if self.eat_op("**") {
            let exp = self.unary()?;
            return Ok(Expr::Bin("**", Box::new(base), Box::new(exp)));
        }
        Ok(base)
    }

    fn primary(&mut self) -> Result<Expr, PyError> {
        let mut e = self.atom()?;
        loop {
            if self.eat_op(".") {
                let n = self.name()?;
                e = Expr::Attr(Box::new(e), n);
            } else if self.eat_op("(") {
                let mut args = Vec::new();
                while !self.eat_op(")") {
                    let arg = if self.eat_op("**") {
                        self.expr()?;
                        Arg {
                            name: None,
                            value: Expr::Unsupported("`**kwargs`".into()),
                        }
                    } else if matches!(self.peek(), Tok::Name(_))
                        && matches!(self.toks.get(self.pos + 1), Some((Tok::Op("="), _)))
                    {
                        let name = self.name()?;
                        self.expect_op("=")?;
                        Arg {
                            name: Some(name),
                            value: self.expr()?,
                        }
                    } else {
                        Arg {
                            name: None,
                            value: self.star_or_expr()?,
                        }
                    };
                    if self.is_name("for") {
                        return self.skip_comprehension(")");
                    }
                    args.push(arg);
                    if !self.eat_op(",") {
                        self.expect_op(")")?;
                        break;
                    }
                }
                e = Expr::Call(Box::new(e), args);
            } else if self.eat_op("[") {
                let idx = self.subscript()?;
                e = Expr::Index(Box::new(e), Box::new(idx));
            } else {
                return Ok(e);
            }
        }
    }

    /// The inside of `[...]` after a primary, and its `]`.
    fn subscript(&mut self) -> Result<Expr, PyError> {
        let mut items = Vec::new();
        let mut sliced = false;
        while !self.eat_op("]") {
            if self.eat_op(":") {
                sliced = true;
                continue;
            }
            if self.eat_op("...") {
                sliced = true;
                continue;
            }
            if self.eat_op(",") {
                items.push(Expr::None);
                continue;
            }
            items.push(self.expr()?);
        }
        if sliced || items.len() != 1 {
            return Ok(Expr::Unsupported("slicing or multiple indices".into()));
        }
        Ok(items.pop().unwrap_or(Expr::None))
    }

    fn skip_comprehension<T>(&mut self, close: &str) -> Result<T, PyError>
    where
        T: From<Expr>,
    {
        let mut depth = 1i32;
        loop {
            match self.next() {
                Tok::Op("(" | "[" | "{") => depth += 1,
                Tok::Op(o @ (")" | "]" | "}")) => {
                    depth -= 1;
                    if depth == 0 {
                        if o != close {
                            return self.err(format!("expected `{close}`"));
                        }
                        return Ok(T::from(Expr::Unsupported("a comprehension".into())));
                    }
                }
                Tok::End => return self.err("unclosed comprehension"),
                _ => {}
            }
        }
    }

    fn atom(&mut self) -> Result<Expr, PyError> {
        match self.next() {
            Tok::Int(v) => Ok(Expr::Int(v)),
            Tok::Float(v) => Ok(Expr::Float(v)),
            Tok::Str(mut s) => {
                // Adjacent literals concatenate.
                while let Tok::Str(t) = self.peek().clone() {
                    s.push_str(&t);
                    self.pos += 1;
                }
                Ok(Expr::Str(s))
            }
            Tok::Name(n) => Ok(match n.as_str() {
                "True" => Expr::Bool(true),
                "False" => Expr::Bool(false),
                "None" => Expr::None,
                _ => Expr::Name(n),
            }),
            Tok::Op("(") => {
                if self.eat_op(")") {
                    return Ok(Expr::Tuple(Vec::new()));
                }
                let first = self.star_or_expr()?;
                if self.is_name("for") {
                    return self.skip_comprehension(")");
                }
                if self.eat_op(")") {
                    return Ok(first);
                }
                let mut items = vec![first];
                while self.eat_op(",") {
                    if self.is_op(")") {
                        break;
                    }
                    items.push(self.star_or_expr()?);
                }
                self.expect_op(")")?;
                Ok(Expr::Tuple(items))
            }
            Tok::Op("[") => {
                let mut items = Vec::new();
                while !self.eat_op("]") {
                    items.push(self.star_or_expr()?);
                    if self.is_name("for") {
                        return self.skip_comprehension("]");
                    }
                    if !self.eat_op(",") {
                        self.expect_op("]")?;
                        break;
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Op("{") => {
                let mut depth = 1;
                while depth > 0 {
                    match self.next() {
                        Tok::Op("{") => depth += 1,
                        Tok::Op("}") => depth -= 1,
                        Tok::End => return self.err("unclosed `{`"),
                        _ => {}
                    }
                }
                Ok(Expr::Unsupported("a dict or set".into()))
            }
            Tok::Op("...") => Ok(Expr::Unsupported("`...`".into())),
            t => {
                self.pos -= 1;
                self.err(format!("unexpected {t:?}"))
            }
        }
    }
}
