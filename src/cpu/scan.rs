//! A light token scan of candidate source, enough for what the CPU model must know before it
//! compiles: features it cannot run (tensor-core and cooperative-groups headers, textures; inline
//! PTX is `ptx.rs`'s), whether any barrier or warp operation appears (else threads run as a plain loop),
//! and where `extern __shared__` declarations are, so they can be rewritten.
//!
//! Comments, string and character literals are skipped; macros are not expanded. That is enough
//! because the candidate rules forbid token pasting (`##`), so a feature cannot be spelled
//! without its identifier appearing in the source.

/// One token: an identifier or a single punctuation byte, with its byte range and the brace
/// depth at which it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tok<'a> {
    pub text: &'a str,
    pub start: usize,
    pub end: usize,
    pub depth: usize,
}

/// Tokenises `src`: identifiers and numbers as words, other non-space bytes one by one.
pub(crate) fn tokens(src: &str) -> Vec<Tok<'_>> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut depth = 0usize;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                i += 1;
            }
            i = (i + 2).min(b.len());
        } else if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok {
                text: &src[start..i],
                start,
                end: i,
                depth,
            });
        } else if c.is_ascii_whitespace() || !c.is_ascii() {
            i += 1;
        } else {
            if c == b'}' {
                depth = depth.saturating_sub(1);
            }
            out.push(Tok {
                text: &src[i..i + 1],
                start: i,
                end: i + 1,
                depth,
            });
            if c == b'{' {
                depth += 1;
            }
            i += 1;
        }
    }
    out
}

/// Headers the model provides (as stubs over `kevin_cuda.h`).
pub(crate) const SUPPORTED_HEADERS: [&str; 5] = [
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_runtime.h",
    "cuda.h",
    "math_constants.h",
];

/// The first feature of `src` the model cannot run, named for the `Unsupported` outcome.
pub(crate) fn unsupported_feature(src: &str) -> Option<String> {
    let toks = tokens(src);
    for (k, t) in toks.iter().enumerate() {
        match t.text {
            "wmma" | "nvcuda" => return Some("tensor-core wmma (mma.h)".into()),
            "cooperative_groups" => return Some("cooperative groups".into()),
            "include" if k > 0 && toks[k - 1].text == "#" => {
                let line_end = src[t.end..].find('\n').map_or(src.len(), |n| t.end + n);
                let header = src[t.end..line_end]
                    .trim()
                    .trim_matches(|c| c == '<' || c == '>' || c == '"');
                if !SUPPORTED_HEADERS.contains(&header) {
                    return Some(format!("#include <{header}>"));
                }
            }
            s if s.starts_with("tex1D")
                || s.starts_with("tex2D")
                || s.starts_with("tex3D")
                || s.starts_with("surf") && s.contains("write")
                || s.starts_with("__pipeline_")
                || s == "memcpy_async" =>
            {
                return Some(format!("`{s}`"));
            }
            _ => {}
        }
    }
    None
}

/// True when the source names a barrier or a warp operation, so threads need fibers.
pub(crate) fn needs_fibers(src: &str) -> bool {
    tokens(src).iter().any(|t| {
        t.text.starts_with("__syncthreads")
            || t.text == "__syncwarp"
            || t.text == "__activemask"
            || (t.text.starts_with("__") && t.text.ends_with("_sync"))
    })
}

/// Rewrites every `extern __shared__ T name[];` into a pointer to the launch's dynamic shared
/// memory, keeping line numbers (diagnostics name candidate lines). Inside a function it becomes
/// a local pointer; at file scope a macro, followed by a `#line` that restores numbering.
pub(crate) fn rewrite_extern_shared(src: &str) -> String {
    let toks = tokens(src);
    let mut out = String::with_capacity(src.len() + 128);
    let mut copied = 0;
    let mut k = 0;
    while k + 1 < toks.len() {
        if toks[k].text != "extern" || toks[k + 1].text != "__shared__" {
            k += 1;
            continue;
        }
        let Some(semi) = toks[k..].iter().position(|t| t.text == ";").map(|p| p + k) else {
            break;
        };
        let Some(bracket) = toks[k..semi]
            .iter()
            .position(|t| t.text == "[")
            .map(|p| p + k)
        else {
            k += 1;
            continue;
        };
        if bracket < k + 3 {
            k += 1;
            continue;
        }
        let name = toks[bracket - 1].text;
        let mut ty = Vec::new();
        let mut j = k + 2;
        while j < bracket - 1 {
            let t = toks[j].text;
            if matches!(t, "__align__" | "alignas" | "__attribute__") {
                // Skip the parenthesised argument: alignment is the runtime's (128 bytes).
                let mut level = 0usize;
                j += 1;
                while j < bracket - 1 {
                    match toks[j].text {
                        "(" => level += 1,
                        ")" => {
                            level = level.saturating_sub(1);
                            if level == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            } else {
                ty.push(t);
            }
            j += 1;
        }
        let ty = join_type(&ty);
        let (start, end) = (toks[k].start, toks[semi].end);
        out.push_str(&src[copied..start]);
        let newlines = src[start..end].matches('\n').count();
        if toks[k].depth > 0 {
            out.push_str(&format!(
                "{ty}* {name} = reinterpret_cast<{ty}*>(kevin_dynamic_smem());"
            ));
            out.push_str(&"\n".repeat(newlines));
        } else {
            let line = src[..end].matches('\n').count() + 1;
            out.push_str(&format!(
                "\n#define {name} (reinterpret_cast<{ty}*>(kevin_dynamic_smem()))\n#line {line} \"candidate.cu\"\n"
            ));
        }
        copied = end;
        k = semi + 1;
    }
    out.push_str(&src[copied..]);
    out
}

/// Joins type tokens with spaces where two words meet (`unsigned char`, `float*`).
fn join_type(toks: &[&str]) -> String {
    let mut s = String::new();
    for t in toks {
        let word = t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if word && s.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            s.push(' ');
        }
        s.push_str(t);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_features_outside_comments_only() {
        assert_eq!(
            unsupported_feature("// wmma::mma_sync\n__global__ void k() {}"),
            None
        );
        assert_eq!(
            unsupported_feature("__device__ void f() { nvcuda::wmma::fill_fragment(a, 0); }")
                .as_deref(),
            Some("tensor-core wmma (mma.h)")
        );
        assert!(unsupported_feature("#include <mma.h>\n").is_some());
        assert_eq!(unsupported_feature("#include <cuda_fp16.h>\n"), None);
    }

    #[test]
    fn detects_sync() {
        assert!(needs_fibers("x = __shfl_xor_sync(0xffffffff, v, 1);"));
        assert!(needs_fibers("__syncthreads();"));
        assert!(!needs_fibers("// __syncthreads();\ny[i] = x[i];"));
    }

    #[test]
    fn rewrites_extern_shared_keeping_lines() {
        let src = "__global__ void k() {\n  extern __shared__ __align__(16) float\n sm[];\n  sm[0] = 1;\n}\n";
        let out = rewrite_extern_shared(src);
        assert!(out.contains("float* sm = reinterpret_cast<float*>(kevin_dynamic_smem());"));
        assert_eq!(out.lines().count(), src.lines().count());
        let top = "extern __shared__ unsigned char buf[];\n__global__ void k() {}\n";
        let out = rewrite_extern_shared(top);
        assert!(
            out.contains("#define buf (reinterpret_cast<unsigned char*>(kevin_dynamic_smem()))")
        );
        assert!(out.contains("#line 1 \"candidate.cu\""));
    }
}
