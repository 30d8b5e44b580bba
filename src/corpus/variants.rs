//! Text transformations of a correct cuda block: a different block size (launch plan and
//! `__launch_bounds__` edited together), and deliberate breakages for repair examples.
//!
//! Every transformation refuses rather than guesses: a block-size change needs a kernel that
//! reads `blockDim` and names no block-size literal, and a breakage needs the exact text it
//! edits. None of them is trusted to do what it says: the corpus builder evaluates every result
//! on the CPU backend and keeps a variant only when it is correct, a breakage only when it is not.

use crate::candidate::expr::Expr as PlanExpr;
use crate::candidate::lex::{lex, TokKind};
use crate::candidate::plan::parse_plan;
use crate::rng::SplitMix64;

/// What a breakage did, so the repair turn can say what it fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Breakage {
    /// A bounds check (an early return or a guarding `if`) removed.
    MissingBoundsCheck,
    /// The output written one element further than it should be.
    WrongIndex,
    /// One `__syncthreads()` removed.
    MissingSync,
    /// The first launch's grid halved along x.
    GridTooSmall,
    /// The last argument of the first launch dropped.
    MissingLaunchArg,
    /// One statement's semicolon removed.
    MissingSemicolon,
    /// `threadIdx` misspelled once.
    Typo,
}

impl Breakage {
    /// Every breakage, in the order the builder tries them.
    pub const ALL: [Breakage; 7] = [
        Breakage::MissingBoundsCheck,
        Breakage::WrongIndex,
        Breakage::MissingSync,
        Breakage::GridTooSmall,
        Breakage::MissingLaunchArg,
        Breakage::MissingSemicolon,
        Breakage::Typo,
    ];

    /// A short id (`missing_bounds_check`).
    pub fn name(self) -> &'static str {
        match self {
            Breakage::MissingBoundsCheck => "missing_bounds_check",
            Breakage::WrongIndex => "wrong_index",
            Breakage::MissingSync => "missing_sync",
            Breakage::GridTooSmall => "grid_too_small",
            Breakage::MissingLaunchArg => "missing_launch_arg",
            Breakage::MissingSemicolon => "missing_semicolon",
            Breakage::Typo => "typo",
        }
    }

    /// The outcome kinds this breakage is meant to cause: a pair whose first outcome is another
    /// kind (a removed guard that left code that no longer compiles) would explain the wrong
    /// fix, so the builder drops it.
    pub fn expected(self) -> &'static [&'static str] {
        match self {
            Breakage::MissingBoundsCheck | Breakage::WrongIndex => &["wrong", "crash"],
            Breakage::MissingSync | Breakage::GridTooSmall => &["wrong"],
            Breakage::MissingLaunchArg => &["launch_error"],
            Breakage::MissingSemicolon | Breakage::Typo => &["compile_error"],
        }
    }

    /// What the repair turn says it changed, after quoting the feedback.
    pub fn fix(self) -> &'static str {
        match self {
            Breakage::MissingBoundsCheck => {
                "The grid rounds up to whole blocks, so the last block has threads past the end of the \
                 data, and without a bounds check they read and write outside the tensors. Restore the \
                 guard so those threads do nothing."
            }
            Breakage::WrongIndex => {
                "Each result was stored one element past where it belongs, so one element stayed \
                 unwritten (NaN) and the last store ran off the end. Store at the element's own index."
            }
            Breakage::MissingSync => {
                "A __syncthreads() was missing: threads read shared memory that other threads of the block \
                 had not finished writing (or overwrote values still being read). Put the barrier back \
                 between the writes and the reads."
            }
            Breakage::GridTooSmall => {
                "The grid was too small along x, so part of the output was never written (it stays NaN). \
                 Launch enough blocks to cover every element."
            }
            Breakage::MissingLaunchArg => {
                "The launch line passed fewer arguments than the kernel has parameters. Pass every parameter, \
                 in the order of the kernel's signature."
            }
            Breakage::MissingSemicolon => {
                "The kernel did not compile: a statement lost its terminating semicolon. Add it back."
            }
            Breakage::Typo => {
                "The kernel did not compile: `threadIdx` was misspelled, so the compiler saw an undeclared \
                 identifier. Spell the built-in correctly."
            }
        }
    }
}

/// `source` with a deliberate `breakage`, at a site chosen by `rng` among the candidates; None
/// when the source has no site for it.
pub fn break_source(source: &str, breakage: Breakage, rng: &mut SplitMix64) -> Option<String> {
    let lines: Vec<&str> = source.lines().collect();
    let pick = |rng: &mut SplitMix64, n: usize| rng.below(n as u64) as usize;
    let code_line = |l: &str| !l.trim_start().starts_with("//") && !l.trim_start().starts_with('#');
    match breakage {
        Breakage::MissingBoundsCheck => {
            // `if (... >= ...) return;` lines, or `if (a < b) {` / `if (a < b && c < d) {` guards.
            let sites: Vec<usize> = (0..lines.len())
                .filter(|&i| {
                    let t = lines[i].trim();
                    (t.starts_with("if (") && t.ends_with(") return;") && t.contains(">="))
                        || (t.starts_with("if (")
                            && t.ends_with(") {")
                            && t.contains(" < ")
                            && !t.contains("==")
                            && !t.contains(">"))
                })
                .collect();
            if sites.is_empty() {
                return None;
            }
            let i = sites[pick(rng, sites.len())];
            let t = lines[i].trim();
            let indent = &lines[i][..lines[i].len() - lines[i].trim_start().len()];
            let replaced = if t.ends_with("return;") {
                None
            } else {
                Some(format!("{indent}{{"))
            };
            Some(replace_line(&lines, i, replaced))
        }
        Breakage::WrongIndex => {
            // The output store `Y[expr] = value;` of a generated kernel: index + 1.
            let sites: Vec<(usize, usize, usize)> = lines
                .iter()
                .enumerate()
                .filter(|(_, l)| code_line(l))
                .filter_map(|(i, l)| {
                    let open = l.find('[')?;
                    let close = open + l[open..].find("] = ")?;
                    let name = l[..open].trim();
                    let simple = !name.is_empty()
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && l.trim_start().starts_with(name);
                    (simple && !l[open + 1..close].contains('[')).then_some((i, open, close))
                })
                .filter(|(i, _, _)| {
                    // Only stores into a kernel parameter (an output), not into shared memory.
                    let name = lines[*i][..lines[*i].find('[').unwrap_or(0)].trim();
                    source.contains(&format!("* __restrict__ {name}"))
                        && !source.contains(&format!("const float* __restrict__ {name}"))
                })
                .collect();
            if sites.is_empty() {
                return None;
            }
            let (i, open, close) = sites[pick(rng, sites.len())];
            let l = lines[i];
            let edited = format!("{}[{} + 1{}", &l[..open], &l[open + 1..close], &l[close..]);
            Some(replace_line(&lines, i, Some(edited)))
        }
        Breakage::MissingSync => {
            let sites: Vec<usize> = (0..lines.len())
                .filter(|&i| lines[i].trim() == "__syncthreads();")
                .collect();
            if sites.is_empty() {
                return None;
            }
            Some(replace_line(&lines, sites[pick(rng, sites.len())], None))
        }
        Breakage::GridTooSmall => {
            let plan = parse_plan(source).ok()?;
            let launch = plan.launches.first()?;
            let gx = launch.grid.first()?;
            let smaller = match gx {
                PlanExpr::Cdiv(e, d) => match d.as_ref() {
                    PlanExpr::Int(c) => format!("cdiv({e}, {})", c * 2),
                    _ => return None,
                },
                PlanExpr::Int(n) if *n >= 2 => format!("{}", n / 2),
                PlanExpr::Int(_) => return None,
                other => format!("{other}/2"),
            };
            let mut grid: Vec<String> = launch.grid.iter().map(|e| e.to_string()).collect();
            grid[0] = smaller;
            let line = launch.line - 1;
            let edited = replace_key(lines.get(line)?, "grid", &grid.join(", "))?;
            Some(replace_line(&lines, line, Some(edited)))
        }
        Breakage::MissingLaunchArg => {
            let plan = parse_plan(source).ok()?;
            let launch = plan.launches.first()?;
            if launch.args.len() < 2 {
                return None;
            }
            let args: Vec<String> = launch.args[..launch.args.len() - 1]
                .iter()
                .map(|a| a.to_string())
                .collect();
            let line = launch.line - 1;
            let edited = replace_key(lines.get(line)?, "args", &args.join(", "))?;
            Some(replace_line(&lines, line, Some(edited)))
        }
        Breakage::MissingSemicolon => {
            // A statement line of code that ends with `;` (not a `for` header).
            let sites: Vec<usize> = (0..lines.len())
                .filter(|&i| {
                    let t = lines[i].trim();
                    code_line(lines[i])
                        && t.ends_with(';')
                        && !t.starts_with("for")
                        && !t.starts_with("__shared__")
                        && t.len() > 1
                })
                .collect();
            if sites.is_empty() {
                return None;
            }
            let i = sites[pick(rng, sites.len())];
            let l = lines[i].trim_end();
            Some(replace_line(&lines, i, Some(l[..l.len() - 1].to_string())))
        }
        Breakage::Typo => {
            let sites: Vec<usize> = (0..lines.len())
                .filter(|&i| code_line(lines[i]) && lines[i].contains("threadIdx"))
                .collect();
            if sites.is_empty() {
                return None;
            }
            let i = sites[pick(rng, sites.len())];
            Some(replace_line(
                &lines,
                i,
                Some(lines[i].replacen("threadIdx", "threadIndx", 1)),
            ))
        }
    }
}

/// `lines` joined back with line `i` replaced (or removed when `with` is None).
fn replace_line(lines: &[&str], i: usize, with: Option<String>) -> String {
    let mut out = String::new();
    for (j, l) in lines.iter().enumerate() {
        if j == i {
            if let Some(w) = &with {
                out.push_str(w);
                out.push('\n');
            }
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// A launch line with the parenthesised value of `key=(...)` replaced by `value`.
fn replace_key(line: &str, key: &str, value: &str) -> Option<String> {
    let start = line.find(&format!(" {key}=("))? + key.len() + 3;
    let mut depth = 1;
    let mut end = None;
    for (i, c) in line[start..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(start + i);
                    break;
                }
            }
            _ => {}
        }
    }
    Some(format!("{}{value}{}", &line[..start], &line[end?..]))
}

/// `source` with every launch's 1-D block size changed to `block` and its grid scaled to cover
/// the same work; None when that is not clearly safe:
///
/// - every launch has a 1-D literal block, and `block` differs from it;
/// - the grid's x is `cdiv(E, C)` with C a multiple of the old block (C / old elements per block
///   row stay the same per thread), or an expression without `cdiv` (one block per row: kept);
/// - the code reads `blockDim` and contains no literal equal to the old block size (a kernel
///   that hard-codes its block size is left alone); a `__launch_bounds__(old)` is rewritten;
/// - to grow the block, every `__shared__` array's first dimension must be a literal that holds
///   one entry per warp of the new block (per-warp partials).
pub fn resize_blocks(source: &str, block: i64) -> Option<String> {
    let plan = parse_plan(source).ok()?;
    if plan.launches.is_empty() || !(32..=1024).contains(&block) {
        return None;
    }
    let mut old_block = None;
    let mut lines: Vec<String> = source.lines().map(str::to_string).collect();
    for launch in &plan.launches {
        let [PlanExpr::Int(old)] = launch.block.as_slice() else {
            return None;
        };
        if *old_block.get_or_insert(*old) != *old || *old == block {
            return None;
        }
        let mut grid: Vec<String> = launch.grid.iter().map(|e| e.to_string()).collect();
        match launch.grid.first()? {
            PlanExpr::Cdiv(e, d) => match d.as_ref() {
                PlanExpr::Int(c) if c % old == 0 => {
                    grid[0] = format!("cdiv({e}, {})", c / old * block)
                }
                _ => return None,
            },
            other if !other.to_string().contains("cdiv") => {}
            _ => return None,
        }
        let line = lines.get(launch.line - 1)?;
        let edited = replace_key(line, "grid", &grid.join(", "))?;
        let edited = replace_key(&edited, "block", &block.to_string())?;
        lines[launch.line - 1] = edited;
    }
    let old = old_block?;
    let mut text = lines.join("\n");
    text.push('\n');
    let bounds_old = format!("__launch_bounds__({old})");
    text = text.replace(&bounds_old, &format!("__launch_bounds__({block})"));
    let toks = lex(&text);
    if !toks.iter().any(|t| t.is_ident("blockDim")) {
        return None;
    }
    let old_s = old.to_string();
    let new_s = block.to_string();
    for (i, t) in toks.iter().enumerate() {
        if t.kind == TokKind::Number && t.text == old_s {
            return None;
        }
        if t.is_ident("__launch_bounds__") {
            // Only the literal we wrote is acceptable.
            let ok = toks.get(i + 2).is_some_and(|n| n.text == new_s);
            if !ok {
                return None;
            }
        }
        if block > old && t.is_ident("__shared__") {
            let rest = &toks[i..];
            let end = rest.iter().position(|t| t.is_punct(";"))?;
            let decl = &rest[..end];
            if decl.iter().any(|t| t.is_ident("extern")) {
                continue;
            }
            if let Some(open) = decl.iter().position(|t| t.is_punct("[")) {
                let n = decl.get(open + 1)?;
                let closes = decl.get(open + 2).is_some_and(|t| t.is_punct("]"));
                let fits = n.kind == TokKind::Number
                    && closes
                    && n.text.parse::<i64>().is_ok_and(|v| v >= block / 32);
                if !fits {
                    return None;
                }
            }
        }
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ELEMENTWISE: &str = "// kevin: launch k grid=(cdiv(M*N,1024)) block=(256) args=(X, Y, M*N)\n\
        __global__ void __launch_bounds__(256) k(const float* __restrict__ X, float* __restrict__ Y, long long n) {\n    \
        long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
        if (i >= n) return;\n    \
        Y[i] = X[i];\n\
        }\n";

    #[test]
    fn resize_scales_the_grid_and_the_launch_bounds() {
        let got = resize_blocks(ELEMENTWISE, 128).unwrap();
        assert!(got.contains("grid=(cdiv(M * N, 512)) block=(128)"), "{got}");
        assert!(got.contains("__launch_bounds__(128)"), "{got}");
        assert!(
            resize_blocks(ELEMENTWISE, 256).is_none(),
            "same size is no variant"
        );
    }

    #[test]
    fn resize_refuses_hard_coded_blocks() {
        let check = |src: &str| assert_eq!(resize_blocks(src, 128), None, "{src}");
        // No blockDim: the kernel assumes its block size.
        check("// kevin: launch k grid=(M) block=(256) args=(X)\n__global__ void k(float* X) { X[threadIdx.x] = 0; }\n");
        // A literal equal to the old block.
        check("// kevin: launch k grid=(M) block=(256) args=(X)\n__global__ void k(float* X) { __shared__ float s[256]; X[blockDim.x] = s[0]; }\n");
        // A grid that is not a multiple of the block.
        check("// kevin: launch k grid=(cdiv(M,8)) block=(256) args=(X)\n__global__ void k(float* X) { X[blockDim.x] = 0; }\n");
        // A 2-D block.
        check("// kevin: launch k grid=(M) block=(32, 8) args=(X)\n__global__ void k(float* X) { X[blockDim.x] = 0; }\n");
        // Macro launch bounds.
        check("// kevin: launch k grid=(M) block=(256) args=(X)\n#define T 256\n__global__ void __launch_bounds__(T) k(float* X) { X[blockDim.x] = 0; }\n");
    }

    #[test]
    fn growing_needs_per_warp_arrays_that_fit() {
        let src = |n: usize| {
            format!(
                "// kevin: launch k grid=(M) block=(256) args=(X)\n__global__ void k(float* X) {{ __shared__ float red[{n}]; X[blockDim.x] = red[0]; }}\n"
            )
        };
        assert!(resize_blocks(&src(32), 1024).is_some());
        assert!(resize_blocks(&src(8), 512).is_none());
        assert!(
            resize_blocks(&src(8), 128).is_some(),
            "shrinking always fits"
        );
    }

    fn broken(src: &str, b: Breakage) -> Option<String> {
        break_source(src, b, &mut SplitMix64::new(7))
    }

    #[test]
    fn breakages_edit_what_they_name() {
        let check = |b: Breakage, want: &str, gone: &str| {
            let got = broken(ELEMENTWISE, b).unwrap_or_else(|| panic!("{b:?} found no site"));
            assert!(got.contains(want), "{b:?}: {got}");
            assert!(!gone.is_empty() && !got.contains(gone), "{b:?}: {got}");
        };
        check(
            Breakage::MissingBoundsCheck,
            "Y[i] = X[i];",
            "if (i >= n) return;",
        );
        check(Breakage::WrongIndex, "Y[i + 1] = X[i];", "Y[i] =");
        check(
            Breakage::GridTooSmall,
            "grid=(cdiv(M * N, 2048))",
            "cdiv(M*N,1024)",
        );
        check(Breakage::MissingLaunchArg, "args=(X, Y)", "M*N)");
        check(Breakage::Typo, "threadIndx.x", "+ threadIdx.x");
        assert_eq!(broken(ELEMENTWISE, Breakage::MissingSync), None);
        let semi = broken(ELEMENTWISE, Breakage::MissingSemicolon).unwrap();
        assert_eq!(
            semi.matches(';').count() + 1,
            ELEMENTWISE.matches(';').count()
        );
    }

    #[test]
    fn guard_blocks_lose_their_condition() {
        let src = "__global__ void k(float* __restrict__ Y, int n) {\n    int i = threadIdx.x;\n    if (i < n) {\n        Y[i] = 1.0f;\n    }\n}\n";
        let got = broken(src, Breakage::MissingBoundsCheck).unwrap();
        assert!(got.contains("    {\n        Y[i] = 1.0f;"), "{got}");
        let sync = "__global__ void k(float* Y) {\n    __syncthreads();\n    Y[0] = 1;\n}\n";
        assert!(!broken(sync, Breakage::MissingSync)
            .unwrap()
            .contains("__syncthreads"));
    }
}
