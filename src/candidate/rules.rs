//! Static rules: what the cuda block may not contain, checked on the token stream of the
//! tokenizer (`lex.rs`) so that comments and string literals never trip a rule ("no cudaMalloc
//! here" in a comment is fine).
//!
//! The block holds device code only; the harness owns memory, streams and launches. Rejected:
//! - host code: a `main(` function, `<<<` launch syntax, `__host__`, CUDA runtime and driver API
//!   identifiers (`cuda` followed by an upper-case letter, such as `cudaMalloc`, `cudaStream_t`,
//!   `cudaDeviceSynchronize`; `cuMem*`, `cuLaunch*`, `cuCtx*`, ...), and host libraries
//!   (`nvrtc*`, `cublas*`, `cudnn*`, `curand*`, `nccl*`, ...);
//! - the host C++ standard library: `std::` (but `cuda::std::`, libcu++, is fine);
//! - files, processes and the environment: calls of `fopen`, `system`, `popen`, `exit`, `fork`,
//!   `getenv`, `dlopen`, `syscall`, `pthread_create` and the like;
//! - timer reads: identifiers containing `clock`, `globaltimer` or `chrono` (`clock64()`,
//!   `cuda::ptx::get_sreg_globaltimer()`, `cuda::std::chrono`), and string literals (adjacent
//!   literals joined) containing `%clock` or `%globaltimer`. Inline PTX (`asm`, `asm volatile`) is
//!   otherwise allowed, because `mma`, `ldmatrix` and `cp.async` are legitimate speed; the timer
//!   registers are the part of PTX that could tell a timed run from a checked one. A PTX string
//!   assembled by macros is not seen here; the compile worker looks for the timer registers in
//!   the PTX NVRTC produced too (`crate::compile`), which no macro can hide from;
//! - host functions: a function definition that is neither `__device__` nor `__global__`
//!   (`host_fns.rs` says what counts), named with its line;
//! - `__has_include` and `__has_include_next`: NVRTC answers them from the evaluation machine's
//!   file system (a verdict that depends on whether a host file exists leaks one bit per
//!   evaluation). Rejected whatever the operand, so no macro can build one: an allowed header
//!   is always there and can be included directly;
//! - preprocessor directives other than `#include` of [`ALLOWED_INCLUDES`] (or a header under
//!   [`ALLOWED_INCLUDE_DIRS`]), `#pragma unroll` / `#pragma nounroll`, and the macro directives
//!   (`#define`, `#undef`, `#if`, `#ifdef`, `#ifndef`, `#elif`, `#else`, `#endif`); `"quoted"`
//!   includes (they could read arbitrary files into the compile log); `_Pragma`; and token
//!   pasting `##` (or its digraph `%:%:`), which could assemble a banned identifier out of
//!   harmless halves; and a line splice (`\` at the end of a line) inside a word, for the same
//!   reason; and a `\` outside a literal (a universal character name such as `\u0063` could
//!   spell a banned identifier). Macro bodies are checked like any other code; `%:` counts as `#`.
//!
//! `cuda_runtime.h` is allowed although it is a host header: models include it by habit, it is
//! harmless without host calls, and every host call is rejected by name.

use thiserror::Error;

use super::error::excerpt;
use super::lex::{TokKind, Token};

/// Headers that may be included with `#include <...>`.
pub const ALLOWED_INCLUDES: [&str; 8] = [
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_fp8.h",
    "cuda_runtime.h",
    "mma.h",
    "cooperative_groups.h",
    "cuda_pipeline.h",
    "math_constants.h",
];

/// Directories whose headers may be included: `cooperative_groups/reduce.h`, libcu++'s
/// `cuda/std/cstdint`, `cuda/pipeline`, `cuda/barrier`.
pub const ALLOWED_INCLUDE_DIRS: [&str; 2] = ["cooperative_groups/", "cuda/"];

/// Macro directives, allowed (their bodies are still checked token by token).
const MACRO_DIRECTIVES: [&str; 10] = [
    "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif", "elifdef", "elifndef",
];

/// Driver API prefixes (`cu` + one of these).
const DRIVER_PREFIXES: [&str; 13] = [
    "cuMem",
    "cuLaunch",
    "cuCtx",
    "cuStream",
    "cuEvent",
    "cuModule",
    "cuInit",
    "cuDevice",
    "cuGraph",
    "cuLink",
    "cuFunc",
    "cuLibrary",
    "cuPointer",
];

/// Host library prefixes.
const HOST_LIBRARIES: [&str; 9] = [
    "nvrtc", "cublas", "cudnn", "cufft", "curand", "cusparse", "cusolver", "nccl", "nvml",
];

/// Functions that touch files, processes or the environment (rejected when called).
const SYSTEM_CALLS: [&str; 33] = [
    "fopen",
    "freopen",
    "fclose",
    "fread",
    "fwrite",
    "fprintf",
    "fscanf",
    "fputs",
    "fgets",
    "fflush",
    "tmpfile",
    "system",
    "popen",
    "pclose",
    "exit",
    "_exit",
    "_Exit",
    "abort",
    "atexit",
    "quick_exit",
    "getenv",
    "setenv",
    "putenv",
    "fork",
    "vfork",
    "execve",
    "execv",
    "execvp",
    "execl",
    "dlopen",
    "dlsym",
    "syscall",
    "pthread_create",
];

/// Identifiers that read a clock contain one of these (`clock64`, `__globaltimer`,
/// `cuda::ptx::get_sreg_clock64`, `cuda::std::chrono::system_clock`).
const TIMER_WORDS: [&str; 3] = ["clock", "globaltimer", "chrono"];

/// PTX special registers that read a clock, looked for in string literals.
const TIMER_REGISTERS: [&str; 2] = ["%clock", "%globaltimer"];

/// A broken rule. The message says what is not allowed and what to do instead.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RuleViolation {
    /// A CUDA runtime / driver / host-library identifier.
    #[error(
        "`{name}` is host API; the block holds device code only (the harness allocates memory, \
         creates streams and launches kernels from the `// kevin:` lines)"
    )]
    HostApi {
        /// The identifier.
        name: String,
    },
    /// `main(`.
    #[error("`main` is host code; write only device code and declare launches with `// kevin: launch` lines")]
    Main,
    /// `<<<`.
    #[error("`<<<...>>>` launches are host code; declare launches with `// kevin: launch` lines instead")]
    LaunchSyntax,
    /// `__host__`.
    #[error("`__host__` functions are not allowed; the block holds device code only")]
    HostFunction,
    /// A function definition that is neither `__device__` nor `__global__`.
    #[error(
        "function `{name}` is host code (neither `__device__` nor `__global__`); the block holds \
         device code only: declare it `__device__`"
    )]
    HostFunctionDefinition {
        /// The function's name.
        name: String,
    },
    /// `__has_include`, `__has_include_next`.
    #[error(
        "`{name}` is not allowed: whether a file exists on the evaluation machine is not the \
         kernel's business; include the allowed headers directly"
    )]
    HasInclude {
        /// The operator.
        name: String,
    },
    /// `std::`.
    #[error("`std::{name}` is from the host C++ standard library; use plain arrays, CUDA intrinsics or `cuda::std::`")]
    StdLibrary {
        /// What follows `std::`.
        name: String,
    },
    /// A file, process or environment call.
    #[error("`{name}` (files, processes, the environment) is not allowed in device code")]
    SystemCall {
        /// The function.
        name: String,
    },
    /// A clock read.
    #[error("reading the GPU clock (`{name}`) is not allowed")]
    Timer {
        /// The identifier or PTX register.
        name: String,
    },
    /// An include outside the allowlist.
    #[error(
        "`#include {header}` is not allowed; allowed: <cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h>, \
         <cuda_runtime.h>, <mma.h>, <cooperative_groups.h>, <cuda_pipeline.h>, <math_constants.h>, \
         <cooperative_groups/...>, <cuda/...>"
    )]
    Include {
        /// The header as written (`<stdio.h>`, `"x.h"`).
        header: String,
    },
    /// A pragma other than unroll.
    #[error("`#pragma {text}` is not allowed; only `#pragma unroll` (with an optional count) and `#pragma nounroll`")]
    Pragma {
        /// The pragma's text.
        text: String,
    },
    /// A directive outside the allowed set.
    #[error("`#{name}` is not allowed; allowed: #include, #pragma unroll, #define, #undef, #if, #ifdef, #ifndef, #elif, #else, #endif")]
    Directive {
        /// The directive's name.
        name: String,
    },
    /// A line splice inside an identifier, number or word.
    #[error("a line continuation (`\\` at the end of a line) may not split a word; join the line")]
    SplitToken,
    /// A `\` outside a literal: a universal character name (`\u0063udaMalloc` is `cudaMalloc`).
    #[error("`\\` outside a string or character literal is not allowed (no universal character names in identifiers)")]
    Backslash,
    /// `##`.
    #[error("token pasting (`##`) is not allowed")]
    TokenPasting,
    /// `_Pragma` / `__pragma`.
    #[error("`{name}` is not allowed; use `#pragma unroll`")]
    PragmaOperator {
        /// The operator.
        name: String,
    },
}

/// Checks the rules on `source`; the error carries the 1-based line of the first violation.
pub fn check(source: &str) -> Result<(), (usize, RuleViolation)> {
    check_source(source, &super::lex::lex(source))
}

/// Checks the rules on `source` and its tokens.
pub(crate) fn check_source(source: &str, toks: &[Token<'_>]) -> Result<(), (usize, RuleViolation)> {
    check_splices(source)?;
    check_tokens(toks)?;
    match super::host_fns::first_host_function(toks) {
        Some((name, line)) => Err((
            line,
            RuleViolation::HostFunctionDefinition {
                name: excerpt(&name),
            },
        )),
        None => Ok(()),
    }
}

/// Rejects a line splice (`\` at the end of a line) between two identifier characters: the
/// compiler joins the halves into one token (`cuda\⏎Malloc` is `cudaMalloc`), which the
/// token rules would not see. Splices elsewhere (ending a `#define` line) are fine.
fn check_splices(source: &str) -> Result<(), (usize, RuleViolation)> {
    let b = source.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'%';
    let mut line = 1;
    for (i, &c) in b.iter().enumerate() {
        if c == b'\n' {
            line += 1;
        } else if c == b'\\' && i > 0 && word(b[i - 1]) {
            let after = match (b.get(i + 1), b.get(i + 2)) {
                (Some(b'\n'), next) => next,
                (Some(b'\r'), Some(b'\n')) => b.get(i + 3),
                _ => continue,
            };
            if after.is_some_and(|&n| word(n)) {
                return Err((line, RuleViolation::SplitToken));
            }
        }
    }
    Ok(())
}

/// Checks the rules on a token stream.
pub(crate) fn check_tokens(toks: &[Token<'_>]) -> Result<(), (usize, RuleViolation)> {
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        let at = |v: RuleViolation| Err((t.line, v));
        if t.starts_directive {
            if let Some(v) = check_directive(&toks[i + 1..]) {
                return at(v);
            }
        } else if t.kind == TokKind::Str {
            // Adjacent literals are one string to the compiler.
            let mut joined = String::new();
            let mut j = i;
            while j < toks.len() && toks[j].kind == TokKind::Str {
                let text = toks[j].text.replace("\\\r\n", "").replace("\\\n", "");
                joined.extend(text.chars().filter(|&c| c != '"'));
                j += 1;
            }
            if let Some(r) = TIMER_REGISTERS.iter().find(|r| joined.contains(*r)) {
                return at(RuleViolation::Timer {
                    name: r.to_string(),
                });
            }
            i = j;
            continue;
        } else if t.kind == TokKind::Punct {
            match t.text {
                "<<<" => return at(RuleViolation::LaunchSyntax),
                "##" | "%:%:" => return at(RuleViolation::TokenPasting),
                "\\" => return at(RuleViolation::Backslash),
                _ => {}
            }
        } else if t.kind == TokKind::Ident {
            let next = toks.get(i + 1);
            let called = next.is_some_and(|n| n.is_punct("("));
            // `cuda::std::` is libcu++ (device code); `std::` and `::std::` are the host's.
            let libcu = i >= 2 && toks[i - 1].is_punct("::") && toks[i - 2].is_ident("cuda");
            if let Some(v) = check_ident(t.text, called) {
                return at(v);
            }
            if t.text == "std" && !libcu && next.is_some_and(|n| n.is_punct("::")) {
                let name = excerpt(toks.get(i + 2).map_or("", |n| n.text));
                return at(RuleViolation::StdLibrary { name });
            }
        }
        i += 1;
    }
    Ok(())
}

fn check_ident(name: &str, called: bool) -> Option<RuleViolation> {
    let b = name.as_bytes();
    // Every host-API prefix starts with `c` or `n`; most identifiers skip the lists.
    let host_api = matches!(b.first(), Some(b'c' | b'n'))
        && ((name.starts_with("cuda") && b.get(4).is_some_and(u8::is_ascii_uppercase))
            || DRIVER_PREFIXES.iter().any(|p| name.starts_with(p))
            || HOST_LIBRARIES.iter().any(|p| name.starts_with(p)));
    if host_api {
        return Some(RuleViolation::HostApi {
            name: name.to_string(),
        });
    }
    match name {
        "main" if called => Some(RuleViolation::Main),
        "__host__" => Some(RuleViolation::HostFunction),
        "_Pragma" | "__pragma" => Some(RuleViolation::PragmaOperator {
            name: name.to_string(),
        }),
        "__has_include" | "__has_include_next" => Some(RuleViolation::HasInclude {
            name: name.to_string(),
        }),
        _ if TIMER_WORDS.iter().any(|w| name.contains(w)) => Some(RuleViolation::Timer {
            name: name.to_string(),
        }),
        _ if called && SYSTEM_CALLS.contains(&name) => Some(RuleViolation::SystemCall {
            name: name.to_string(),
        }),
        _ => None,
    }
}

/// Checks one directive; `rest` starts just after its `#`.
fn check_directive(rest: &[Token<'_>]) -> Option<RuleViolation> {
    let line: Vec<&Token<'_>> = rest
        .iter()
        .take_while(|t| t.in_directive && !t.starts_directive)
        .collect();
    let Some(name) = line.first() else {
        return None; // the null directive `#`
    };
    match name.text {
        "include" => check_include(&line[1..]),
        "pragma" => {
            let text: Vec<&str> = line[1..].iter().map(|t| t.text).collect();
            match text.first() {
                Some(&"unroll") | Some(&"nounroll") => None,
                _ => Some(RuleViolation::Pragma {
                    text: excerpt(&text.join(" ")),
                }),
            }
        }
        n if MACRO_DIRECTIVES.contains(&n) => None,
        n => Some(RuleViolation::Directive { name: excerpt(n) }),
    }
}

fn check_include(toks: &[&Token<'_>]) -> Option<RuleViolation> {
    let header: String = toks.iter().map(|t| t.text).collect();
    let Some(inner) = header.strip_prefix('<').and_then(|h| h.strip_suffix('>')) else {
        return Some(RuleViolation::Include {
            header: excerpt(&header),
        });
    };
    let allowed = ALLOWED_INCLUDES.contains(&inner)
        || ALLOWED_INCLUDE_DIRS
            .iter()
            .any(|d| inner.starts_with(d) && inner.len() > d.len());
    if allowed && !inner.contains("..") {
        None
    } else {
        Some(RuleViolation::Include {
            header: excerpt(&header),
        })
    }
}
