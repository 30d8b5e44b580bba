//! Finding the device code and the summary in a response.
//!
//! Fenced blocks follow CommonMark closely enough for model output: a fence is a line of three
//! or more backticks (or tildes), possibly indented, with an info string whose first word is
//! the language; the block ends at a line of at least as many of the same character, or at the
//! end of the response (an unclosed block). Blocks do not nest, so a ```` ```cuda ```` line
//! inside a ```` ```text ```` block is text.
//!
//! Rules (strict, so the format is learnable, but helpful in the message):
//! - The code block is the **last** block labelled `cuda`, `cu` or `cuh` (any case). Earlier
//!   blocks are drafts. `cpp`, `c++`, `c` and unlabelled blocks are not accepted: the error names
//!   the labels it did find, so the model learns to write `cuda`.
//! - The summary is everything after that block's closing fence, trimmed; it must not be empty.
//! - An unclosed cuda block (a response cut off at the token limit) is an error, not a guess.

use thiserror::Error;

/// Languages accepted on the opening fence of the code block (compared case-insensitively).
pub const ACCEPTED_LANGUAGES: [&str; 3] = ["cuda", "cu", "cuh"];

/// How many distinct block labels a [`FormatError::NoCudaBlock`] names.
const MAX_LABELS_SHOWN: usize = 4;

/// The parts of a response that [`super::parse_response`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extracted<'a> {
    /// The block's contents, without the fence lines.
    pub source: &'a str,
    /// The trimmed text after the closing fence.
    pub summary: &'a str,
}

/// Why a response has no usable code block or summary.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum FormatError {
    /// No block labelled cuda.
    #[error(
        "the response has no ```cuda block{}; put all device code in one ```cuda fenced block, \
         followed by a one-paragraph summary",
        found_suffix(.found)
    )]
    NoCudaBlock {
        /// Distinct labels of the blocks that were there, at most four ("" for unlabelled).
        found: Vec<String>,
    },
    /// The last cuda block never closes.
    #[error(
        "the ```cuda block opened on line {line} of the response is never closed \
         (end it with a line of ```)"
    )]
    Unclosed {
        /// 1-based line of the opening fence in the response.
        line: usize,
    },
    /// The cuda block has only whitespace.
    #[error("the ```cuda block is empty")]
    EmptyBlock,
    /// Nothing after the cuda block.
    #[error("there is no summary after the ```cuda block; end the response with one paragraph summarising the kernel")]
    NoSummary,
}

fn found_suffix(found: &[String]) -> String {
    if found.is_empty() {
        return String::new();
    }
    let labels: Vec<String> = found
        .iter()
        .map(|l| {
            if l.is_empty() {
                "an unlabelled ```".to_string()
            } else {
                format!("```{l}")
            }
        })
        .collect();
    format!(" (found {} instead)", labels.join(", "))
}

/// An opening fence: its character, its length and the language (first word of the info).
fn opening_fence(line: &str) -> Option<(u8, usize, &str)> {
    let t = line.trim_start();
    let c = *t.as_bytes().first()?;
    if c != b'`' && c != b'~' {
        return None;
    }
    let len = t.bytes().take_while(|&b| b == c).count();
    if len < 3 {
        return None;
    }
    let info = t[len..].trim();
    if c == b'`' && info.contains('`') {
        return None; // inline code such as ```x```, not a fence
    }
    Some((c, len, info.split_whitespace().next().unwrap_or("")))
}

/// True if `line` closes a fence opened with `len` repetitions of `c`.
fn is_closing_fence(line: &str, c: u8, len: usize) -> bool {
    let t = line.trim();
    t.len() >= len && t.bytes().all(|b| b == c)
}

/// One fenced block: its language and byte ranges in the response.
struct Block<'a> {
    lang: &'a str,
    open_line: usize,
    content: (usize, usize),
    /// Byte offset just after the closing fence line; `None` when unclosed.
    after: Option<usize>,
}

/// Splits `response` into its code block and summary.
pub fn extract(response: &str) -> Result<Extracted<'_>, FormatError> {
    // (byte offset of the line start, line text without the newline)
    let mut lines = Vec::new();
    let mut offset = 0;
    for l in response.split_inclusive('\n') {
        lines.push((offset, l.trim_end_matches(['\n', '\r'])));
        offset += l.len();
    }
    let line_start = |i: usize| lines.get(i).map_or(response.len(), |&(o, _)| o);

    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((c, len, lang)) = opening_fence(lines[i].1) else {
            i += 1;
            continue;
        };
        let close = (i + 1..lines.len()).find(|&j| is_closing_fence(lines[j].1, c, len));
        blocks.push(Block {
            lang,
            open_line: i + 1,
            content: (line_start(i + 1), close.map_or(response.len(), line_start)),
            after: close.map(|j| line_start(j + 1)),
        });
        match close {
            Some(j) => i = j + 1,
            None => break,
        }
    }

    let accepted = |lang: &str| {
        ACCEPTED_LANGUAGES
            .iter()
            .any(|a| a.eq_ignore_ascii_case(lang))
    };
    let Some(block) = blocks.iter().rev().find(|b| accepted(b.lang)) else {
        // Distinct labels, a few at most: the message must stay short whatever the response.
        let mut found: Vec<String> = Vec::new();
        for b in &blocks {
            if found.len() == MAX_LABELS_SHOWN {
                break;
            }
            if !found.iter().any(|f| f == b.lang) {
                found.push(b.lang.chars().take(20).collect());
            }
        }
        return Err(FormatError::NoCudaBlock { found });
    };
    let Some(after) = block.after else {
        return Err(FormatError::Unclosed {
            line: block.open_line,
        });
    };
    let source = &response[block.content.0..block.content.1];
    if source.trim().is_empty() {
        return Err(FormatError::EmptyBlock);
    }
    let summary = response[after..].trim();
    if summary.is_empty() {
        return Err(FormatError::NoSummary);
    }
    Ok(Extracted { source, summary })
}
