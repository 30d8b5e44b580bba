//! A small tokenizer for CUDA C++ source, just enough for the static rules and for reading
//! `__global__` signatures: it skips comments, keeps string and character literals whole (so
//! nothing inside them looks like code), and marks preprocessor directives.
//!
//! The CPU device model reads `asm` statements with it too (`cpu/ptx.rs`).
//!
//! It never fails: any byte it does not understand becomes a one-character punctuation token.
//! It does not expand macros; the rules in [`super::rules`] close the holes that leaves (token
//! pasting is rejected, identifiers inside `#define` bodies are checked like any other).

/// What kind of token this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokKind {
    /// An identifier or keyword: `[A-Za-z_][A-Za-z0-9_]*`.
    Ident,
    /// A numeric literal, suffixes included (`1.0f`, `0x10`, `1'000`).
    Number,
    /// A string literal, quotes included (raw strings too).
    Str,
    /// A character literal, quotes included.
    Char,
    /// Punctuation: `%:%:`, `<<<`, `>>>`, `::`, `##`, `%:`, `<<`, `>>`, or a single character.
    Punct,
}

/// One token with the 1-based line it starts on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Token<'a> {
    pub kind: TokKind,
    pub text: &'a str,
    pub line: usize,
    /// True for every token of a preprocessor directive line (continuations included).
    pub in_directive: bool,
    /// True for the `#` that opens a directive.
    pub starts_directive: bool,
}

impl Token<'_> {
    /// True when this is the identifier `name`.
    pub fn is_ident(&self, name: &str) -> bool {
        self.kind == TokKind::Ident && self.text == name
    }

    /// True when this is the punctuation `p`.
    pub fn is_punct(&self, p: &str) -> bool {
        self.kind == TokKind::Punct && self.text == p
    }
}

/// Prefixes that turn a following `"` into a raw string literal.
const RAW_PREFIXES: [&str; 5] = ["R", "LR", "uR", "UR", "u8R"];

/// Tokenizes `src`. Linear in the length of `src`.
pub(crate) fn lex(src: &str) -> Vec<Token<'_>> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let mut at_line_start = true;
    let mut in_directive = false;
    while i < b.len() {
        let c = b[i];
        // Whitespace and line structure.
        if c == b'\n' {
            line += 1;
            at_line_start = true;
            in_directive = false;
            i += 1;
            continue;
        }
        if c == b'\\' && next_is_newline(b, i + 1).is_some() {
            // Line splice: the logical line (and any directive) continues.
            let skip = next_is_newline(b, i + 1).unwrap_or(1);
            line += 1;
            i += 1 + skip;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        // Comments.
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                if b[i] == b'\\' && next_is_newline(b, i + 1).is_some() {
                    line += 1;
                    i += 1 + next_is_newline(b, i + 1).unwrap_or(1);
                    continue;
                }
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i = (i + 2).min(b.len());
            continue;
        }
        let start = i;
        let start_line = line;
        let mut starts_directive = false;
        let kind;
        // `%:` is the digraph of `#`, and works as one.
        let hash_len = match (c, b.get(i + 1)) {
            (b'#', _) => 1,
            (b'%', Some(b':')) => 2,
            _ => 0,
        };
        if hash_len > 0 && at_line_start {
            in_directive = true;
            starts_directive = true;
            kind = TokKind::Punct;
            i += hash_len;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            if b.get(i) == Some(&b'"') && RAW_PREFIXES.contains(&&src[start..i]) {
                i = raw_string_end(b, i, &mut line);
                kind = TokKind::Str;
            } else {
                kind = TokKind::Ident;
            }
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            i = number_end(b, i);
            kind = TokKind::Number;
        } else if c == b'"' || c == b'\'' {
            i = quoted_end(b, i, &mut line);
            kind = if c == b'"' {
                TokKind::Str
            } else {
                TokKind::Char
            };
        } else {
            i += punct_len(&src[i..]);
            kind = TokKind::Punct;
        }
        at_line_start = false;
        out.push(Token {
            kind,
            text: &src[start..i],
            line: start_line,
            in_directive,
            starts_directive,
        });
    }
    out
}

/// If `b[i..]` starts with a newline (`\n` or `\r\n`), possibly after spaces and tabs (compilers
/// accept `\` + spaces + newline as a splice, with a warning), its length.
fn next_is_newline(b: &[u8], i: usize) -> Option<usize> {
    let spaces = b[i.min(b.len())..]
        .iter()
        .take_while(|&&c| c == b' ' || c == b'\t')
        .count();
    let j = i + spaces;
    match (b.get(j), b.get(j + 1)) {
        (Some(b'\n'), _) => Some(spaces + 1),
        (Some(b'\r'), Some(b'\n')) => Some(spaces + 2),
        _ => None,
    }
}

/// End of a numeric literal starting at `i` (pp-number rules, loosely).
fn number_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        let c = b[i];
        let exponent_sign =
            (c == b'+' || c == b'-') && matches!(b[i - 1], b'e' | b'E' | b'p' | b'P');
        let separator = c == b'\'' && b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric);
        if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exponent_sign || separator {
            i += 1;
        } else {
            break;
        }
    }
    i
}

/// End of a `"..."` or `'...'` literal starting at `i`; an unterminated one ends at the newline.
fn quoted_end(b: &[u8], i: usize, line: &mut usize) -> usize {
    let quote = b[i];
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => {
                if let Some(n) = next_is_newline(b, j + 1) {
                    *line += 1;
                    j += 1 + n;
                } else {
                    j += 2;
                }
            }
            b'\n' => return j,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    b.len()
}

/// End of a raw string literal whose opening `"` is at `i`: `R"delim( ... )delim"`.
fn raw_string_end(b: &[u8], i: usize, line: &mut usize) -> usize {
    let open = i + 1;
    let Some(paren) = b[open..].iter().take(17).position(|&c| c == b'(') else {
        // Not a valid raw string: treat it as an ordinary one.
        return quoted_end(b, i, line);
    };
    let delim = &b[open..open + paren];
    let mut j = open + paren + 1;
    while j < b.len() {
        if b[j] == b'\n' {
            *line += 1;
        }
        if b[j] == b')'
            && b[j + 1..].starts_with(delim)
            && b.get(j + 1 + delim.len()) == Some(&b'"')
        {
            return j + delim.len() + 2;
        }
        j += 1;
    }
    b.len()
}

/// Length in bytes of the punctuation token at the start of `s` (never 0 for non-empty `s`).
fn punct_len(s: &str) -> usize {
    for p in ["%:%:", "<<<", ">>>", "::", "##", "%:", "<<", ">>"] {
        if s.starts_with(p) {
            return p.len();
        }
    }
    s.chars().next().map_or(1, char::len_utf8)
}
