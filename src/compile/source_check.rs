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

/// PTX special registers that read a clock or count events (a cycle counter is a clock):
/// `%clock`, `%clock_hi`, `%clock64`, `%globaltimer`, `%globaltimer_lo`, `%globaltimer_hi`, and
/// the performance-monitor counters `%pm0`..`%pm7`, `%pm0_64`..`%pm7_64` (PTX ISA, "Special
/// Registers"). Matched as prefixes of a `%` name, so a future `%clock_lo` is covered too.
const PTX_TIMER_PREFIXES: [&str; 3] = ["clock", "globaltimer", "pm"];

/// The first timer register the compiled PTX reads, if any. This sees what was compiled, so an
/// inline-asm string assembled by macros (`S(%glob) S(altimer)`) cannot hide one. The PTX names
/// registers the compiler made `%r12`, `%rd3`, `%f1`, `%p2`...; none starts with these words.
pub(crate) fn ptx_timer_register(ptx: &str) -> Option<String> {
    let b = ptx.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let start = i + 1;
            let mut end = start;
            while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                end += 1;
            }
            let name = &ptx[start..end];
            let timer = PTX_TIMER_PREFIXES
                .iter()
                .any(|p| match name.strip_prefix(p) {
                    // `%pm` must be followed by a digit: `%pm0`, `%pm7_64`.
                    Some(rest) if *p == "pm" => rest.starts_with(|c: char| c.is_ascii_digit()),
                    Some(_) => true,
                    None => false,
                });
            if timer {
                return Some(format!("%{name}"));
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    None
}

/// The first `__has_include` or `__has_include_next` in `source` (outside comments and
/// literals), with its line: NVRTC answers them from the file system of the machine it runs on.
/// The static rules reject them before a candidate gets here; this is the compile worker's own
/// check, for any request.
pub(crate) fn check_has_include(source: &str, file_name: &str) -> Result<(), String> {
    let toks = crate::candidate::lex::lex(source);
    match toks.iter().find(|t| {
        t.kind == crate::candidate::lex::TokKind::Ident
            && (t.text == "__has_include" || t.text == "__has_include_next")
    }) {
        Some(t) => Err(format!(
            "{file_name}({}): error: `{}` is not allowed: whether a file exists on the evaluation \
             machine is not the kernel's business",
            t.line, t.text
        )),
        None => Ok(()),
    }
}

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
    fn timer_registers_are_found_in_ptx() {
        let ptx = "\tmov.u64 \t%rd1, %globaltimer;\n\tst.global.u64 [%rd2], %rd1;";
        assert_eq!(ptx_timer_register(ptx).as_deref(), Some("%globaltimer"));
        for reg in [
            "%clock",
            "%clock_hi",
            "%clock64",
            "%globaltimer_lo",
            "%pm3",
            "%pm0_64",
        ] {
            let ptx = format!("mov.u32 %r1, {reg};");
            assert_eq!(ptx_timer_register(&ptx).as_deref(), Some(reg), "{reg}");
        }
        let clean = "mov.u32 %r1, %tid.x; mov.u32 %r2, %ctaid.x; setp.ge.s32 %p1, %r1, %r2; \
                     ld.param.u64 %rd1, [k_param_0]; mov.u32 %r3, %smid; // %pmx";
        assert_eq!(ptx_timer_register(clean), None);
    }

    #[test]
    fn has_include_is_rejected() {
        let e = check_has_include("int a;\n#if __has_include(\"/etc/passwd\")\n#endif", "k.cu");
        assert!(e.unwrap_err().contains("k.cu(2): error: `__has_include`"));
        assert!(check_has_include("#if __has_include_next(<x>)\n#endif", "k.cu").is_err());
        assert!(check_has_include(
            "// __has_include\nconst char* s = \"__has_include\";",
            "k.cu"
        )
        .is_ok());
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
