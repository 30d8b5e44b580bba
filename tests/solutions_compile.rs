//! Reference solutions (`tasks/solutions/<task>.cu`) compile with NVRTC exactly as the harness
//! compiles a candidate, and their `// kevin:` launch declarations are consistent with the task.
//!
//! For every solution file this test:
//! - checks that the file stem names a task of the suite;
//! - parses the `// kevin: scratch NAME dtype[expr]` and `// kevin: launch NAME grid=(..)
//!   block=(..) smem=EXPR args=(..)` lines (a simple parser, not the candidate-format parser);
//! - checks every launch argument: a task tensor, a scratch buffer, a size expression (size
//!   symbols, integer literals, `+ - * / %`, `cdiv(a, b)`, parentheses) or a float literal;
//! - checks the argument count against the `__global__` function's parameter list, and that
//!   tensors/scratch go to pointer parameters and everything else to scalar parameters;
//! - evaluates grid, block and smem at both presets (block <= 1024 threads, grid y,z <= 65535,
//!   dynamic smem <= 227 KiB, at most 16 launches);
//! - compiles the source with `kevin::compile::compile` (PTX for sm_90, the launched kernels as
//!   name expressions) and asserts success, printing NVRTC's log on failure.
//!
//! Without NVRTC the compile step is skipped with a message (the static checks still run),
//! unless `KEVIN_REQUIRE_NVRTC=1`, which turns the skip into a failure.
//! Run one file: `KEVIN_SOLUTION=relu cargo test --test solutions_compile -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kevin::compile::{compile, find_cuda_include_dirs, locate_nvrtc, CompileRequest};
use kevin::tasks::{Preset, Task, TaskSuite};

const MAX_LAUNCHES: usize = 16;
const MAX_BLOCK_THREADS: i64 = 1024;
const MAX_GRID_YZ: i64 = 65535;
const MAX_SMEM: i64 = 227 * 1024;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn solution_files() -> Vec<PathBuf> {
    let dir = root().join("tasks").join("solutions");
    let only = std::env::var("KEVIN_SOLUTION").ok();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .filter(|p| {
                only.as_deref().is_none_or(|o| {
                    o.split(',')
                        .any(|n| p.file_stem().is_some_and(|s| s == n.trim()))
                })
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

fn nvrtc_available() -> bool {
    match locate_nvrtc() {
        Ok(_) => true,
        Err(e) if std::env::var("KEVIN_REQUIRE_NVRTC").as_deref() == Ok("1") => {
            panic!("KEVIN_REQUIRE_NVRTC=1 but NVRTC is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("solutions_compile: skipping the NVRTC step: {e}");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Launch-declaration parsing

#[derive(Debug)]
struct Launch {
    kernel: String,
    grid: Vec<String>,
    block: Vec<String>,
    smem: String,
    args: Vec<String>,
}

#[derive(Debug)]
struct Scratch {
    name: String,
    dtype: String,
    numel: String,
}

/// Splits `s` at top-level commas (outside parentheses).
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' | '[' => {
                depth += 1;
                cur.push(c)
            }
            ')' | ']' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The text of `key=(...)` (without the parentheses) or `key=WORD` in `line`.
fn field(line: &str, key: &str) -> Option<String> {
    let pat = format!("{key}=");
    let mut start = None;
    for (i, _) in line.match_indices(&pat) {
        let ok = i == 0 || line[..i].ends_with(char::is_whitespace);
        if ok {
            start = Some(i + pat.len());
            break;
        }
    }
    let rest = &line[start?..];
    if let Some(inner) = rest.strip_prefix('(') {
        let mut depth = 1;
        for (i, c) in inner.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(inner[..i].to_string());
                    }
                }
                _ => {}
            }
        }
        None
    } else {
        Some(rest.split_whitespace().next().unwrap_or("").to_string())
    }
}

fn parse_decls(src: &str) -> Result<(Vec<Scratch>, Vec<Launch>), String> {
    let (mut scratch, mut launches) = (Vec::new(), Vec::new());
    for (no, raw) in src.lines().enumerate() {
        let line = raw.trim();
        let Some(rest) = line.strip_prefix("//") else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix("kevin:") else {
            continue;
        };
        let rest = rest.trim();
        let err = |m: &str| format!("line {}: {m}: {raw}", no + 1);
        if let Some(r) = rest.strip_prefix("scratch") {
            // NAME dtype[expr]
            let r = r.trim();
            let (name, ty) = r
                .split_once(char::is_whitespace)
                .ok_or_else(|| err("bad scratch"))?;
            let ty = ty.trim();
            let open = ty
                .find('[')
                .ok_or_else(|| err("scratch type needs [numel]"))?;
            let close = ty
                .rfind(']')
                .ok_or_else(|| err("scratch type needs [numel]"))?;
            let dtype = ty[..open].trim().to_string();
            if !["f32", "f16", "bf16", "i64", "i32"].contains(&dtype.as_str()) {
                return Err(err("unknown scratch dtype"));
            }
            scratch.push(Scratch {
                name: name.to_string(),
                dtype,
                numel: ty[open + 1..close].to_string(),
            });
        } else if let Some(r) = rest.strip_prefix("launch") {
            let r = r.trim();
            let kernel = r
                .split_whitespace()
                .next()
                .ok_or_else(|| err("no kernel"))?;
            let grid = field(r, "grid").ok_or_else(|| err("no grid=(..)"))?;
            let block = field(r, "block").ok_or_else(|| err("no block=(..)"))?;
            let smem = field(r, "smem").unwrap_or_else(|| "0".to_string());
            let args = field(r, "args").ok_or_else(|| err("no args=(..)"))?;
            launches.push(Launch {
                kernel: kernel.to_string(),
                grid: split_top(&grid),
                block: split_top(&block),
                smem,
                args: split_top(&args),
            });
        } else {
            return Err(err("unknown kevin: directive"));
        }
    }
    Ok((scratch, launches))
}

// ---------------------------------------------------------------------------------------------
// Size expressions: symbols, integers, + - * / %, cdiv(a, b), parentheses; 64-bit.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(i64),
    Name(String),
    Sym(char),
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let (mut i, mut out) = (0, Vec::new());
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let j = (i..b.len())
                .find(|&j| !b[j].is_ascii_digit())
                .unwrap_or(b.len());
            if j < b.len() && (b[j] == b'.' || b[j] == b'e' || b[j] == b'E') {
                return Err(format!("not an integer expression: {s}"));
            }
            out.push(Tok::Num(s[i..j].parse().map_err(|e| format!("{s}: {e}"))?));
            i = j;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let j = (i..b.len())
                .find(|&j| !(b[j].is_ascii_alphanumeric() || b[j] == b'_'))
                .unwrap_or(b.len());
            out.push(Tok::Name(s[i..j].to_string()));
            i = j;
        } else if "+-*/%(),".contains(c) {
            out.push(Tok::Sym(c));
            i += 1;
        } else {
            return Err(format!("unexpected `{c}` in expression {s}"));
        }
    }
    Ok(out)
}

struct Eval<'a> {
    toks: Vec<Tok>,
    pos: usize,
    sizes: &'a BTreeMap<String, i64>,
}

impl Eval<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Sym(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expr(&mut self) -> Result<i64, String> {
        let mut v = self.term()?;
        loop {
            if self.eat('+') {
                v = v.checked_add(self.term()?).ok_or("overflow")?;
            } else if self.eat('-') {
                v = v.checked_sub(self.term()?).ok_or("overflow")?;
            } else {
                return Ok(v);
            }
        }
    }
    fn term(&mut self) -> Result<i64, String> {
        let mut v = self.unary()?;
        loop {
            if self.eat('*') {
                v = v.checked_mul(self.unary()?).ok_or("overflow")?;
            } else if self.eat('/') {
                let d = self.unary()?;
                v = v.checked_div(d).ok_or("division by zero")?;
            } else if self.eat('%') {
                let d = self.unary()?;
                v = v.checked_rem(d).ok_or("division by zero")?;
            } else {
                return Ok(v);
            }
        }
    }
    fn unary(&mut self) -> Result<i64, String> {
        if self.eat('-') {
            return Ok(-self.unary()?);
        }
        match self.peek().cloned() {
            Some(Tok::Num(n)) => {
                self.pos += 1;
                Ok(n)
            }
            Some(Tok::Name(n)) if n == "cdiv" => {
                self.pos += 1;
                if !self.eat('(') {
                    return Err("cdiv needs (".into());
                }
                let a = self.expr()?;
                if !self.eat(',') {
                    return Err("cdiv needs two arguments".into());
                }
                let b = self.expr()?;
                if !self.eat(')') || b <= 0 {
                    return Err("bad cdiv".into());
                }
                Ok((a + b - 1).div_euclid(b))
            }
            Some(Tok::Name(n)) => {
                self.pos += 1;
                self.sizes
                    .get(&n)
                    .copied()
                    .ok_or_else(|| format!("`{n}` is not a size symbol"))
            }
            Some(Tok::Sym('(')) => {
                self.pos += 1;
                let v = self.expr()?;
                if !self.eat(')') {
                    return Err("missing )".into());
                }
                Ok(v)
            }
            t => Err(format!("unexpected token {t:?}")),
        }
    }
}

fn eval(s: &str, sizes: &BTreeMap<String, i64>) -> Result<i64, String> {
    let mut e = Eval {
        toks: lex(s)?,
        pos: 0,
        sizes,
    };
    let v = e.expr().map_err(|m| format!("{s}: {m}"))?;
    if e.pos != e.toks.len() {
        return Err(format!("{s}: trailing tokens"));
    }
    Ok(v)
}

fn is_float_literal(s: &str) -> bool {
    let t = s.trim().trim_end_matches(['f', 'F']);
    (t.contains('.') || t.contains('e') || t.contains('E')) && t.parse::<f64>().is_ok()
}

// ---------------------------------------------------------------------------------------------
// Kernel signatures

/// The parameter list of `__global__ void [attributes] NAME(...)` in `src`, split at top-level commas.
fn kernel_params(src: &str, name: &str) -> Result<Vec<String>, String> {
    let code = strip_comments(src);
    let bytes = code.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut found = None;
    for (at, _) in code.match_indices(name) {
        let end = at + name.len();
        if at > 0 && is_ident(bytes[at - 1]) || end < bytes.len() && is_ident(bytes[end]) {
            continue;
        }
        let rest = code[end..].trim_start();
        if !rest.starts_with('(') {
            continue;
        }
        // The declaration starts after the previous `;`, `}` or `{` (or at the beginning).
        let decl_start = code[..at].rfind([';', '}', '{']).map_or(0, |i| i + 1);
        if code[decl_start..at].contains("__global__") {
            found = Some(code.len() - rest.len() + 1);
            break;
        }
    }
    let start = found.ok_or_else(|| format!("no `__global__ ... {name}(` in the source"))?;
    let mut depth = 1;
    for (i, c) in code[start..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    let inner = code[start..start + i].trim();
                    if inner.is_empty() || inner == "void" {
                        return Ok(Vec::new());
                    }
                    return Ok(split_top(inner));
                }
            }
            _ => {}
        }
    }
    Err(format!("unterminated parameter list of {name}"))
}

fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Static checks

fn sizes_of(task: &Task, preset: Preset) -> BTreeMap<String, i64> {
    task.signature(preset)
        .sizes
        .iter()
        .map(|(k, v)| (k.clone(), *v as i64))
        .collect()
}

fn check_static(task: &Task, src: &str) -> Result<Vec<String>, String> {
    let (scratch, launches) = parse_decls(src)?;
    if launches.is_empty() {
        return Err("no `// kevin: launch` line".into());
    }
    if launches.len() > MAX_LAUNCHES {
        return Err(format!(
            "{} launches, more than {MAX_LAUNCHES}",
            launches.len()
        ));
    }
    let code = strip_comments(src);
    for bad in ["<<<", "cudaMalloc", "cudaMemcpy", "printf", "int main"] {
        if code.contains(bad) {
            return Err(format!("device code only: found `{bad}`"));
        }
    }
    let tensors: BTreeSet<String> = task
        .signature(Preset::Small)
        .tensors
        .iter()
        .map(|t| t.name.clone())
        .collect();
    let symbols: BTreeSet<String> = task.program.size_symbols().into_iter().collect();
    let mut buffers = tensors.clone();
    for s in &scratch {
        if tensors.contains(&s.name) || symbols.contains(&s.name) || !buffers.insert(s.name.clone())
        {
            return Err(format!("scratch `{}` clashes with another name", s.name));
        }
    }
    let presets = [("small", Preset::Small), ("gpu", Preset::Gpu)];
    for (pname, preset) in presets {
        let sizes = sizes_of(task, preset);
        for s in &scratch {
            let n = eval(&s.numel, &sizes).map_err(|e| format!("scratch {}: {e}", s.name))?;
            if n <= 0 {
                return Err(format!(
                    "scratch {} ({}) has {n} elements at {pname}",
                    s.name, s.dtype
                ));
            }
        }
        for l in &launches {
            let ctx = |m: String| format!("launch {} at the {pname} preset: {m}", l.kernel);
            if l.grid.is_empty() || l.grid.len() > 3 || l.block.is_empty() || l.block.len() > 3 {
                return Err(ctx("grid and block need 1 to 3 dimensions".into()));
            }
            let g: Vec<i64> = l
                .grid
                .iter()
                .map(|e| eval(e, &sizes))
                .collect::<Result<_, _>>()
                .map_err(ctx)?;
            let b: Vec<i64> = l
                .block
                .iter()
                .map(|e| eval(e, &sizes))
                .collect::<Result<_, _>>()
                .map_err(ctx)?;
            let smem = eval(&l.smem, &sizes).map_err(ctx)?;
            if g.iter().chain(&b).any(|&v| v <= 0) {
                return Err(ctx(format!(
                    "non-positive dimension: grid {g:?} block {b:?}"
                )));
            }
            if g[0] > i32::MAX as i64 || g.iter().skip(1).any(|&v| v > MAX_GRID_YZ) {
                return Err(ctx(format!("grid {g:?} too large")));
            }
            if b.iter().product::<i64>() > MAX_BLOCK_THREADS || b.len() > 2 && b[2] > 64 {
                return Err(ctx(format!("block {b:?} too large")));
            }
            if !(0..=MAX_SMEM).contains(&smem) {
                return Err(ctx(format!("smem {smem} out of range")));
            }
            for a in &l.args {
                if buffers.contains(a) || is_float_literal(a) {
                    continue;
                }
                eval(a, &sizes).map_err(|e| {
                    ctx(format!(
                        "argument `{a}` is not a tensor, scratch, size expression or literal ({e})"
                    ))
                })?;
            }
        }
    }
    let mut kernels = Vec::new();
    for l in &launches {
        let params = kernel_params(src, &l.kernel)?;
        if params.len() != l.args.len() {
            return Err(format!(
                "launch {}: {} args for {} parameters ({})",
                l.kernel,
                l.args.len(),
                params.len(),
                params.join(", ")
            ));
        }
        for (a, p) in l.args.iter().zip(&params) {
            let is_ptr = p.contains('*');
            if buffers.contains(a) != is_ptr {
                return Err(format!(
                    "launch {}: argument `{a}` does not fit parameter `{p}`",
                    l.kernel
                ));
            }
            if !is_ptr {
                let ty = p.replace("const", "");
                let ok = ["int", "unsigned", "long long", "float", "size_t", "long"]
                    .iter()
                    .any(|t| ty.trim_start().starts_with(t));
                if !ok {
                    return Err(format!(
                        "launch {}: unsupported scalar parameter `{p}`",
                        l.kernel
                    ));
                }
            }
        }
        if !kernels.contains(&l.kernel) {
            kernels.push(l.kernel.clone());
        }
    }
    // Every output must be passed to some launch.
    for t in task.signature(Preset::Small).tensors {
        if !launches.iter().any(|l| l.args.contains(&t.name)) {
            return Err(format!("tensor `{}` is never passed to a kernel", t.name));
        }
    }
    Ok(kernels)
}

#[test]
fn solutions_parse_and_compile() {
    let files = solution_files();
    if files.is_empty() {
        eprintln!("solutions_compile: no tasks/solutions/*.cu yet");
        return;
    }
    let suite = TaskSuite::load(root().join("tasks")).expect("task suite loads");
    let nvrtc = nvrtc_available();
    let include_dirs = find_cuda_include_dirs();
    let mut failures = Vec::new();
    let mut compiled = 0;
    for path in &files {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let result = (|| -> Result<bool, String> {
            let task = suite
                .get(&stem)
                .ok_or_else(|| format!("no task named `{stem}`"))?;
            let src = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            let kernels = check_static(task, &src)?;
            if !nvrtc {
                return Ok(false);
            }
            let names: Vec<&str> = kernels.iter().map(|s| s.as_str()).collect();
            let req = CompileRequest::ptx(src.clone(), &names);
            match compile(&req, &include_dirs) {
                Ok(out) => {
                    for k in &kernels {
                        if !out.lowered_names.contains_key(k) {
                            return Err(format!("kernel {k} has no lowered name"));
                        }
                    }
                    if !out.log.trim().is_empty() {
                        eprintln!("{stem}: NVRTC warnings:\n{}", out.log);
                    }
                    Ok(true)
                }
                Err(e) => Err(format!("{e}")),
            }
        })();
        match result {
            Ok(true) => {
                compiled += 1;
                eprintln!("ok       {stem}");
            }
            Ok(false) => eprintln!("checked  {stem} (not compiled: no NVRTC)"),
            Err(e) => {
                eprintln!("FAILED   {stem}: {e}");
                failures.push(format!("{stem}: {e}"));
            }
        }
    }
    eprintln!(
        "solutions_compile: {} files, {} compiled, {} failed",
        files.len(),
        compiled,
        failures.len()
    );
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n\n"));
}

#[test]
fn expression_evaluator() {
    let sizes: BTreeMap<String, i64> = [("M".to_string(), 33), ("N".to_string(), 65)].into();
    assert_eq!(eval("cdiv(M*N, 256)", &sizes).unwrap(), 9);
    assert_eq!(eval("(M + 1) % 4 - N / 2", &sizes).unwrap(), 2 - 32);
    assert!(eval("K", &sizes).is_err());
    assert!(eval("1.5", &sizes).is_err());
    assert!(is_float_literal("1e-5") && is_float_literal("0.5f") && !is_float_literal("M"));
    let _ = Path::new(".");
}
