//! Checks on untrusted source before NVRTC sees it.
//!
//! NVRTC reads any file an `#include` names, and puts the text of a file that fails to parse into
//! its log, which becomes the policy's feedback and lands in episodes.jsonl:
//! `#include "/proc/self/environ"` would leak the daemon's environment (tokens included). So a
//! candidate may include only CUDA's own device headers, by `<name>` relative to the include path.
//! The check runs after the preprocessor's own first phases (line splicing, comment removal), so
//! `#inc\<newline>lude` or `# /* */ include` cannot hide a directive from it.

/// Headers a candidate may include (a name, or a folder prefix ending in '/').
const ALLOWED_HEADERS: &[&str] = &[
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_fp8.h",
    "mma.h",
    "cuda_pipeline.h",
    "cuda_awbarrier.h",
    "cooperative_groups.h",
    "cooperative_groups/",
    "cuda/",
    "stdint.h",
    "cstdint",
    "float.h",
    "cfloat",
    "math.h",
    "cmath",
];

/// Preprocessor directives that read files.
const FILE_DIRECTIVES: &[&str] = &["include", "include_next", "import", "embed"];

/// Returns a compiler-style message (`<file>(<line>): error: ...`) for the first include that is
/// not allowed.
pub(crate) fn check_includes(source: &str, file_name: &str) -> Result<(), String> {
    for (line_no, line) in strip_comments(&splice_lines(source)).lines().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let rest = rest.trim_start();
        let Some(directive) = FILE_DIRECTIVES.iter().find(|d| {
            rest.strip_prefix(**d)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        }) else {
            continue;
        };
        let operand = rest[directive.len()..].trim();
        let allowed = *directive == "include"
            && operand
                .strip_prefix('<')
                .and_then(|o| o.strip_suffix('>'))
                .is_some_and(header_allowed);
        if !allowed {
            return Err(format!(
                "{file_name}({}): error: `#{directive} {operand}` is not allowed: a kernel may \
                 include only CUDA device headers by <name> ({})",
                line_no + 1,
                ALLOWED_HEADERS.join(", ")
            ));
        }
    }
    Ok(())
}

fn header_allowed(name: &str) -> bool {
    !name.contains("..")
        && !name.starts_with('/')
        && ALLOWED_HEADERS.iter().any(|allowed| {
            if allowed.ends_with('/') {
                name.starts_with(allowed) && name.len() > allowed.len()
            } else {
                name == *allowed
            }
        })
}

/// Translation phase 2: a backslash before a newline joins the lines. The joined line keeps its
/// first line number; later lines are padded with empty lines so numbers stay right.
fn splice_lines(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut pending_newlines = 0;
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            // Backslash, optional carriage return, newline.
            let mut lookahead = chars.clone();
            if lookahead.peek() == Some(&'\r') {
                lookahead.next();
            }
            if lookahead.next() == Some('\n') {
                chars = lookahead;
                pending_newlines += 1;
                continue;
            }
        }
        if c == '\n' {
            for _ in 0..pending_newlines {
                out.push('\n');
            }
            pending_newlines = 0;
        }
        out.push(c);
    }
    out
}

/// Translation phase 3, roughly: comments become one space, and string and character literals
/// are left alone. A block comment spanning lines joins them (as the preprocessor does); the
/// swallowed newlines are emitted after the joined line so later line numbers stay right.
fn strip_comments(source: &str) -> String {
    #[derive(PartialEq)]
    enum State {
        Code,
        Line,
        Block,
        Literal(char),
    }
    let mut out = String::with_capacity(source.len());
    let mut state = State::Code;
    let mut pending_newlines = 0;
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match state {
            State::Code if c == '\n' => {
                out.push('\n');
                for _ in 0..pending_newlines {
                    out.push('\n');
                }
                pending_newlines = 0;
            }
            State::Code => match (c, chars.peek()) {
                ('/', Some('/')) => {
                    chars.next();
                    out.push(' ');
                    state = State::Line;
                }
                ('/', Some('*')) => {
                    chars.next();
                    out.push(' ');
                    state = State::Block;
                }
                ('"' | '\'', _) => {
                    out.push(c);
                    state = State::Literal(c);
                }
                _ => out.push(c),
            },
            State::Line => {
                if c == '\n' {
                    out.push('\n');
                    for _ in 0..pending_newlines {
                        out.push('\n');
                    }
                    pending_newlines = 0;
                    state = State::Code;
                }
            }
            State::Block => {
                if c == '*' && chars.peek() == Some(&'/') {
                    chars.next();
                    state = State::Code;
                } else if c == '\n' {
                    pending_newlines += 1;
                }
            }
            State::Literal(quote) => {
                out.push(c);
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        out.push(escaped);
                    }
                } else if c == quote || c == '\n' {
                    state = State::Code;
                }
            }
        }
    }
    out
}

/// Kernel names the launch plan may use: C++ identifiers, optionally namespace-qualified. They
/// become NVRTC name expressions (`&name`), which are compiled as code, so nothing else passes.
pub(crate) fn check_kernel_name(name: &str) -> Result<(), String> {
    let ident = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let body = name.strip_prefix("::").unwrap_or(name);
    if name.len() <= 256 && body.split("::").all(ident) {
        Ok(())
    } else {
        Err(format!(
            "kernel name {name:?} is not a C++ identifier (optionally qualified with ::)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(source: &str, expected: Result<(), &str>) {
        match (check_includes(source, "k.cu"), expected) {
            (Ok(()), Ok(())) => {}
            (Err(msg), Err(part)) => assert!(msg.contains(part), "{msg:?} lacks {part:?}"),
            (got, want) => panic!("{source:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn device_headers_are_allowed() {
        check(
            "#include <cuda_fp16.h>\n#  include <cooperative_groups/reduce.h>\n",
            Ok(()),
        );
        check(
            "// #include \"/etc/passwd\"\nconst char* s = \"#include <x>\";",
            Ok(()),
        );
        check("/* #include \"/etc/passwd\" */ int x;", Ok(()));
    }

    #[test]
    fn file_reads_are_rejected() {
        check("#include \"/proc/self/environ\"", Err("k.cu(1): error"));
        check("int a;\n#include </etc/passwd>", Err("k.cu(2): error"));
        check("#include <../../etc/passwd>", Err("not allowed"));
        check("#include <cuda/../../x>", Err("not allowed"));
        check("#define F \"/etc/passwd\"\n#include F\n", Err("k.cu(2)"));
        check("#include_next <cuda_fp16.h>", Err("#include_next"));
        check("#embed \"/etc/passwd\"", Err("#embed"));
        check("#include <stdio.h>", Err("not allowed"));
    }

    #[test]
    fn hidden_directives_are_found() {
        check("#inc\\\nlude \"/etc/passwd\"", Err("k.cu(1)"));
        check("int a;\n# /* x */ include \"/etc/passwd\"", Err("k.cu(2)"));
        check(
            "#/* multi\nline */include \"/etc/passwd\"",
            Err("not allowed"),
        );
        check("x = 1; \\\n\n#include \"/etc/passwd\"", Err("k.cu(3)"));
        check("int a; /*\n\n*/ int b;\n#include \"/x\"", Err("k.cu(4)"));
        check("int a; /*\n\n*/ int b;\n#include \"/x\"", Err("k.cu(4)"));
    }

    #[test]
    fn kernel_names() {
        for ok in ["gemm", "_k2", "ns::relu", "::top"] {
            assert!(check_kernel_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "2x", "k<float>", "k); system(", "a::", "a b", "ns:::k"] {
            assert!(check_kernel_name(bad).is_err(), "{bad}");
        }
    }
}
