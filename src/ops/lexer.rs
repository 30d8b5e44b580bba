//! Tokenizer of the op language. It turns source text into tokens carrying their 1-based line and
//! column. Newlines end declarations and statements, except inside parentheses or brackets, where
//! they are skipped so that long expressions can wrap. `#` starts a comment to the end of the line.

use super::ParseError;

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    /// An identifier or keyword.
    Ident(String),
    /// A number literal, with its source text.
    Num(f64, String),
    /// One of `( ) [ ] , : = + - * / @`.
    Punct(char),
    /// End of a line (outside brackets).
    Newline,
    /// End of input.
    Eof,
}

impl Tok {
    /// How the token is named in error messages.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Num(_, t) => format!("`{t}`"),
            Tok::Punct(c) => format!("'{c}'"),
            Tok::Newline => "end of line".to_string(),
            Tok::Eof => "end of input".to_string(),
        }
    }
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    /// The token.
    pub tok: Tok,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
}

/// Splits `src` into tokens; the last one is always [`Tok::Eof`].
pub fn tokenize(src: &str) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let mut depth = 0usize;
    while i < chars.len() {
        let c = chars[i];
        let (tl, tc) = (line, col);
        if c == '\n' {
            if depth == 0 {
                out.push(Token {
                    tok: Tok::Newline,
                    line: tl,
                    col: tc,
                });
            }
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
                col += 1;
            }
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            col += 1;
            continue;
        }
        let start = i;
        let tok = if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            Tok::Ident(chars[start..i].iter().collect())
        } else if c.is_ascii_digit() {
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i < chars.len() && chars[i] == '.' {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                } else {
                    return Err(ParseError::new(
                        line,
                        col + (j - start),
                        "expected digits in the exponent of a number",
                    ));
                }
            }
            let text: String = chars[start..i].iter().collect();
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() => Tok::Num(v, text),
                _ => {
                    return Err(ParseError::new(
                        tl,
                        tc,
                        format!("number `{text}` is out of range"),
                    ))
                }
            }
        } else if "()[],:=+-*/@".contains(c) {
            match c {
                '(' | '[' => depth += 1,
                ')' | ']' => depth = depth.saturating_sub(1),
                _ => {}
            }
            i += 1;
            Tok::Punct(c)
        } else {
            return Err(ParseError::new(
                tl,
                tc,
                format!("unexpected character {c:?}"),
            ));
        };
        col += i - start;
        out.push(Token {
            tok,
            line: tl,
            col: tc,
        });
    }
    out.push(Token {
        tok: Tok::Eof,
        line,
        col,
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_line_and_column() {
        let toks = tokenize("Y = relu(A @ W)\n  Z = 1.5e-3").unwrap();
        let z = toks
            .iter()
            .find(|t| t.tok == Tok::Ident("Z".into()))
            .unwrap();
        assert_eq!((z.line, z.col), (2, 3));
        assert!(toks
            .iter()
            .any(|t| matches!(&t.tok, Tok::Num(v, _) if *v == 1.5e-3)));
    }

    #[test]
    fn newlines_inside_parentheses_are_skipped() {
        let toks = tokenize("f(a,\n b)\n").unwrap();
        let newlines = toks.iter().filter(|t| t.tok == Tok::Newline).count();
        assert_eq!(newlines, 1);
    }

    #[test]
    fn bad_exponent_is_an_error() {
        let err = tokenize("x = 1e+").unwrap_err();
        assert!(err.to_string().contains("exponent"), "{err}");
    }
}
