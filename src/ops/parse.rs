//! Recursive-descent parser of the op language (grammar in the [`crate::ops`] module doc). It
//! builds an unchecked [`Program`]; [`super::check`] fills in the types. Every failure is a
//! [`ParseError`] naming line and column; nesting is bounded so hostile input cannot overflow the
//! stack.

use std::collections::BTreeMap;

use super::ast::{BinOp, Const, Decl, Dim, Dtype, Expr, Poly, Program, Stmt, TensorType};
use super::builtins;
use super::lexer::{tokenize, Tok, Token};
use super::ParseError;

/// Deepest nesting of parentheses and unary minus accepted.
const MAX_DEPTH: usize = 64;

/// True when a program cannot declare `name` (a keyword, a name the PyTorch rendering needs, a
/// built-in function).
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || builtins::is_builtin(name)
}

/// Names a program cannot declare: keywords of the language, and names the PyTorch rendering
/// needs for itself (Python keywords and the module's own identifiers).
const RESERVED: &[&str] = &[
    "input",
    "output",
    "const",
    "true",
    "false",
    "f32",
    "f16",
    "bf16",
    "i64",
    "torch",
    "nn",
    "F",
    "self",
    "super",
    "Model",
    "get_inputs",
    "get_init_inputs",
    "None",
    "True",
    "False",
    "and",
    "as",
    "assert",
    "async",
    "await",
    "break",
    "class",
    "continue",
    "def",
    "del",
    "elif",
    "else",
    "except",
    "finally",
    "for",
    "from",
    "global",
    "if",
    "import",
    "in",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "return",
    "try",
    "while",
    "with",
    "yield",
    "print",
    "float",
    "int",
];

/// Parses `src` into an unchecked program.
pub fn parse(src: &str) -> Result<Program, ParseError> {
    let toks = tokenize(src)?;
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
        consts: BTreeMap::new(),
    };
    let mut prog = Program {
        inputs: Vec::new(),
        outputs: Vec::new(),
        consts: Vec::new(),
        stmts: Vec::new(),
        types: BTreeMap::new(),
    };
    loop {
        while p.peek().tok == Tok::Newline {
            p.pos += 1;
        }
        if p.peek().tok == Tok::Eof {
            break;
        }
        p.line(&mut prog)?;
        let t = p.peek().clone();
        match &t.tok {
            Tok::Newline | Tok::Eof => {}
            other => {
                return Err(err(
                    &t,
                    format!("expected end of line, found {}", other.describe()),
                ))
            }
        }
    }
    Ok(prog)
}

fn err(t: &Token, message: impl Into<String>) -> ParseError {
    ParseError::new(t.line, t.col, message)
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    depth: usize,
    consts: BTreeMap<String, f64>,
}

impl Parser {
    fn peek(&self) -> &Token {
        // `tokenize` always ends with Eof and `pos` never passes it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].tok
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    fn expect_punct(&mut self, c: char, what: &str) -> Result<Token, ParseError> {
        let t = self.bump();
        if t.tok == Tok::Punct(c) {
            Ok(t)
        } else {
            Err(err(
                &t,
                format!("expected '{c}' {what}, found {}", t.tok.describe()),
            ))
        }
    }

    /// A name being declared or assigned.
    fn new_name(&mut self, what: &str) -> Result<(String, Token), ParseError> {
        let t = self.bump();
        match &t.tok {
            Tok::Ident(n) if RESERVED.contains(&n.as_str()) => {
                Err(err(&t, format!("`{n}` is reserved and cannot name {what}")))
            }
            Tok::Ident(n) if builtins::is_builtin(n) => Err(err(
                &t,
                format!("`{n}` is a built-in function and cannot name {what}"),
            )),
            Tok::Ident(n) => Ok((n.clone(), t.clone())),
            other => Err(err(
                &t,
                format!("expected the name of {what}, found {}", other.describe()),
            )),
        }
    }

    fn line(&mut self, prog: &mut Program) -> Result<(), ParseError> {
        let first = self.peek().clone();
        let kw = match &first.tok {
            Tok::Ident(s) => s.clone(),
            other => {
                let msg = format!(
                    "expected a declaration or a statement, found {}",
                    other.describe()
                );
                return Err(err(&first, msg));
            }
        };
        match kw.as_str() {
            "input" | "output" => {
                self.bump();
                let (name, _) = self.new_name(&format!("an {kw}"))?;
                self.expect_punct(':', &format!("after the name of {kw} `{name}`"))?;
                let ty = self.tensor_type()?;
                let decl = Decl {
                    name,
                    ty,
                    line: first.line,
                };
                if kw == "input" {
                    prog.inputs.push(decl);
                } else {
                    prog.outputs.push(decl);
                }
            }
            "const" => {
                self.bump();
                let (name, _) = self.new_name("a constant")?;
                self.expect_punct('=', &format!("after `const {name}`"))?;
                let neg = self.peek().tok == Tok::Punct('-');
                if neg {
                    self.bump();
                }
                let t = self.bump();
                let value = match &t.tok {
                    Tok::Num(v, _) if neg => -v,
                    Tok::Num(v, _) => *v,
                    other => {
                        return Err(err(
                            &t,
                            format!("expected a number, found {}", other.describe()),
                        ))
                    }
                };
                self.consts.insert(name.clone(), value);
                prog.consts.push(Const {
                    name,
                    value,
                    line: first.line,
                });
            }
            _ => {
                let (target, _) = self.new_name("a tensor")?;
                self.expect_punct('=', &format!("after `{target}`"))?;
                let expr = self.expr()?;
                prog.stmts.push(Stmt {
                    target,
                    expr,
                    line: first.line,
                });
            }
        }
        Ok(())
    }

    fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        let t = self.bump();
        let dtype = match &t.tok {
            Tok::Ident(s) => Dtype::from_name(s),
            _ => None,
        }
        .ok_or_else(|| {
            err(
                &t,
                format!(
                    "expected a dtype (f32, f16, bf16, i64), found {}",
                    t.tok.describe()
                ),
            )
        })?;
        self.expect_punct('[', "to open the shape")?;
        let mut shape = Vec::new();
        if self.peek().tok == Tok::Punct(']') {
            self.bump();
            return Ok(TensorType { dtype, shape });
        }
        loop {
            let start = self.peek().clone();
            let poly = self.size_expr()?;
            let dim = Dim::from_poly(poly.clone());
            if poly.constant().is_some_and(|c| c <= 0) {
                return Err(err(
                    &start,
                    format!("dimension `{poly}` is not a positive integer"),
                ));
            }
            shape.push(dim);
            let t = self.bump();
            match &t.tok {
                Tok::Punct(',') => continue,
                Tok::Punct(']') => break,
                other => {
                    return Err(err(
                        &t,
                        format!("expected ',' or ']' in a shape, found {}", other.describe()),
                    ))
                }
            }
        }
        Ok(TensorType { dtype, shape })
    }

    /// A dim: sums and differences of products of size symbols, integers and parenthesised
    /// dims, and floor divisions `// k` by a positive integer, in normal form.
    fn size_expr(&mut self) -> Result<Poly, ParseError> {
        self.enter()?;
        let mut acc = self.size_term()?;
        loop {
            let neg = match self.peek().tok {
                Tok::Punct('+') => false,
                Tok::Punct('-') => true,
                _ => break,
            };
            self.bump();
            let rhs = self.size_term()?;
            acc = if neg { acc.sub(&rhs) } else { acc.add(&rhs) };
        }
        self.depth -= 1;
        Ok(acc)
    }

    fn size_term(&mut self) -> Result<Poly, ParseError> {
        let mut acc = self.size_factor()?;
        loop {
            match (&self.peek().tok, self.peek_at(1)) {
                (Tok::Punct('*'), _) => {
                    self.bump();
                    acc = acc.mul(&self.size_factor()?);
                }
                (Tok::Punct('/'), Tok::Punct('/')) => {
                    self.pos += 2;
                    let t = self.bump();
                    match &t.tok {
                        Tok::Num(_, text) => match text.parse::<i64>() {
                            Ok(k) if k > 0 => acc = acc.floor_div(k),
                            _ => {
                                let msg = format!("`// {text}` needs a positive integer divisor");
                                return Err(err(&t, msg));
                            }
                        },
                        other => {
                            let msg = format!(
                                "a dim divides only by an integer (`// 2`), found {}",
                                other.describe()
                            );
                            return Err(err(&t, msg));
                        }
                    }
                }
                (Tok::Punct('/'), _) => {
                    let t = self.bump();
                    return Err(err(
                        &t,
                        "a dim divides with `//` (floor division)".to_string(),
                    ));
                }
                _ => break,
            }
        }
        Ok(acc)
    }

    fn size_factor(&mut self) -> Result<Poly, ParseError> {
        let t = self.bump();
        match &t.tok {
            Tok::Ident(s) if !RESERVED.contains(&s.as_str()) && !builtins::is_builtin(s) => {
                Ok(Poly::sym(s))
            }
            Tok::Num(_, text) => match text.parse::<i64>() {
                Ok(n) if n >= 0 => Ok(Poly::lit(n)),
                _ => Err(err(
                    &t,
                    format!("dimension `{text}` is not a positive integer"),
                )),
            },
            Tok::Punct('(') => {
                let p = self.size_expr()?;
                self.expect_punct(')', "to close the parenthesis")?;
                Ok(p)
            }
            other => {
                let msg = format!(
                    "expected a size symbol or an integer, found {}",
                    other.describe()
                );
                Err(err(&t, msg))
            }
        }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(err(
                self.peek(),
                format!("expression nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut lhs = self.term()?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct('+') => BinOp::Add,
                Tok::Punct('-') => BinOp::Sub,
                _ => break,
            };
            self.bump();
            let rhs = self.term()?;
            lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        self.depth -= 1;
        Ok(lhs)
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut lhs = self.unary()?;
        loop {
            let op = match self.peek().tok {
                Tok::Punct('*') => BinOp::Mul,
                Tok::Punct('/') => BinOp::Div,
                Tok::Punct('@') => BinOp::MatMul,
                _ => break,
            };
            self.bump();
            let rhs = self.unary()?;
            lhs = Expr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.peek().tok == Tok::Punct('-') {
            self.bump();
            self.enter()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(match inner {
                Expr::Num(v) => Expr::Num(-v),
                other => Expr::Neg(Box::new(other)),
            });
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, ParseError> {
        let t = self.bump();
        match &t.tok {
            Tok::Num(v, _) => Ok(Expr::Num(*v)),
            Tok::Punct('(') => {
                let e = self.expr()?;
                self.expect_punct(')', "to close the parenthesis")?;
                Ok(e)
            }
            Tok::Ident(name) if self.peek().tok == Tok::Punct('(') => {
                self.bump();
                let args = self.args(name)?;
                let consts = &self.consts;
                let lookup = |n: &str| consts.get(n).copied();
                builtins::bind(name, args, &lookup).map_err(|m| err(&t, m))
            }
            Tok::Ident(name) => Ok(Expr::Var(name.clone())),
            other => Err(err(
                &t,
                format!("expected an expression, found {}", other.describe()),
            )),
        }
    }

    /// True when the `(` at the cursor opens a tuple: a comma at its own depth before it closes.
    fn at_tuple(&self) -> bool {
        if self.peek().tok != Tok::Punct('(') {
            return false;
        }
        let mut depth = 0usize;
        for t in &self.toks[self.pos..] {
            match t.tok {
                Tok::Punct('(') | Tok::Punct('[') => depth += 1,
                Tok::Punct(')') | Tok::Punct(']') => {
                    depth -= 1;
                    if depth == 0 {
                        return false;
                    }
                }
                Tok::Punct(',') if depth == 1 => return true,
                Tok::Eof => return false,
                _ => {}
            }
        }
        false
    }

    /// `(a, b, ...)` (a trailing comma allowed) of items read by `item`, at the `(`; `what`
    /// names the list in an error.
    fn paren_list<T>(
        &mut self,
        what: &str,
        item: fn(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        self.bump();
        let mut items = Vec::new();
        loop {
            if self.peek().tok == Tok::Punct(')') {
                self.bump();
                break;
            }
            items.push(item(self)?);
            let t = self.bump();
            match &t.tok {
                Tok::Punct(',') => continue,
                Tok::Punct(')') => break,
                other => {
                    let msg = format!(
                        "expected ',' or ')' in a {what}, found {}",
                        other.describe()
                    );
                    return Err(err(&t, msg));
                }
            }
        }
        Ok(items)
    }

    /// `(a, b, ...)` as a whole argument value (per-axis integer parameters).
    fn tuple(&mut self) -> Result<Vec<Expr>, ParseError> {
        self.paren_list("tuple", Self::expr)
    }

    /// A shape argument: `(d0, d1, ...)` of size expressions (a trailing comma allowed), or
    /// one size expression.
    fn shape_arg(&mut self) -> Result<Vec<Poly>, ParseError> {
        if self.peek().tok != Tok::Punct('(') || !self.at_tuple() {
            return Ok(vec![self.size_expr()?]);
        }
        self.paren_list("shape", Self::size_expr)
    }

    fn args(&mut self, func: &str) -> Result<Vec<(Option<String>, builtins::Arg)>, ParseError> {
        let mut args = Vec::new();
        if self.peek().tok == Tok::Punct(')') {
            self.bump();
            return Ok(args);
        }
        loop {
            let kw = match (&self.peek().tok, self.peek_at(1)) {
                (Tok::Ident(k), Tok::Punct('=')) => Some(k.clone()),
                _ => None,
            };
            if kw.is_some() {
                self.pos += 2;
            }
            let value = if builtins::is_shape_param(func, args.len(), kw.as_deref()) {
                builtins::Arg::Shape(self.shape_arg()?)
            } else if self.at_tuple() {
                builtins::Arg::Tuple(self.tuple()?)
            } else {
                builtins::Arg::Expr(self.expr()?)
            };
            args.push((kw, value));
            let t = self.bump();
            match &t.tok {
                Tok::Punct(',') => continue,
                Tok::Punct(')') => break,
                other => {
                    let msg = format!(
                        "expected ',' or ')' in the arguments of `{func}`, found {}",
                        other.describe()
                    );
                    return Err(err(&t, msg));
                }
            }
        }
        Ok(args)
    }
}
