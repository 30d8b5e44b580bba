//! Host functions: a function *definition* at namespace or class scope that is neither
//! `__device__` nor `__global__` is host code, which the format does not allow (the block holds
//! device code only). NVRTC compiles such a function as device code (kevin passes
//! `--device-as-default-execution-space`) and g++ as ordinary code, so without this rule the two
//! backends would read the same source differently.
//!
//! What counts, read on the token stream (`lex.rs`):
//! - a `{` at namespace scope (file scope, `namespace X {`, `extern "C" {`) or in a class body
//!   (`struct`/`class`/`union`), preceded since the last `;`, `}` or `{` by a parenthesised
//!   parameter list and no `=` (an initialiser such as `auto f = [](float x) { ... };` is a
//!   variable, not a function), and not by a control keyword;
//! - its qualifiers are everything since that boundary: `__device__` or `__global__` there (or a
//!   macro defined in the block whose body holds one of them, `#define DEV __device__`) makes it
//!   device code. Templates (`template <...> __device__ ...`) and `inline` helpers need
//!   `__device__` like any other function; `__host__` is rejected by name elsewhere;
//! - except `constexpr` and `consteval` functions: CUDA calls them from device code only with
//!   relaxed constexpr, but with kevin's `--device-as-default-execution-space` they are device
//!   functions, and both compilers evaluate them at compile time where a constant is needed
//!   (`constexpr int cdiv(int a, int b)` for tile sizes is common and harmless). On the CPU
//!   backend the NVRTC front-end compiles them as device code too, so they cannot do there what
//!   device code cannot;
//! - the bodies of `#define`s are read the same way, so a macro that defines a function is
//!   checked where it is defined.
//!
//! Function bodies are skipped: lambdas and local classes inside device code are device code.
//! Not seen: a function whose definition is assembled by a macro from pieces (its `{` and its
//! parameter list in different macros), or a qualifier macro that is later redefined to nothing.
//! Both still compile as device code on the GPU (see above).

use super::lex::{TokKind, Token};

/// Identifiers that may precede a parenthesised group without being the function's name.
const NOT_NAMES: [&str; 9] = [
    "__attribute__",
    "__launch_bounds__",
    "__align__",
    "alignas",
    "__declspec",
    "decltype",
    "noexcept",
    "throw",
    "__maxnreg__",
];

/// Keywords whose `(...) {` is a statement, not a function (in a macro body).
const CONTROL: [&str; 6] = ["if", "for", "while", "switch", "catch", "return"];

/// The first host function definition: its name and 1-based line.
pub(crate) fn first_host_function(toks: &[Token<'_>]) -> Option<(String, usize)> {
    let qualifier_macros = qualifier_macros(toks);
    let code: Vec<Token<'_>> = toks.iter().filter(|t| !t.in_directive).copied().collect();
    if let Some(found) = scan(&code, &qualifier_macros) {
        return Some(found);
    }
    // Each `#define` body, read as if at namespace scope.
    for body in define_bodies(toks) {
        if let Some(found) = scan(&body, &qualifier_macros) {
            return Some(found);
        }
    }
    None
}

/// Names of the macros whose body holds `__device__` or `__global__`.
fn qualifier_macros<'a>(toks: &[Token<'a>]) -> Vec<&'a str> {
    let mut names = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].starts_directive {
            let line: Vec<&Token<'a>> = toks[i + 1..]
                .iter()
                .take_while(|t| t.in_directive && !t.starts_directive)
                .collect();
            if line.first().is_some_and(|t| t.is_ident("define"))
                && line
                    .iter()
                    .skip(2)
                    .any(|t| t.is_ident("__device__") || t.is_ident("__global__"))
            {
                if let Some(name) = line.get(1).filter(|t| t.kind == TokKind::Ident) {
                    names.push(name.text);
                }
            }
            i += 1 + line.len();
        } else {
            i += 1;
        }
    }
    names
}

/// The replacement lists of every `#define` (parameters skipped).
fn define_bodies<'a>(toks: &[Token<'a>]) -> Vec<Vec<Token<'a>>> {
    let mut bodies = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if !toks[i].starts_directive {
            i += 1;
            continue;
        }
        let line: Vec<Token<'a>> = toks[i + 1..]
            .iter()
            .take_while(|t| t.in_directive && !t.starts_directive)
            .copied()
            .collect();
        i += 1 + line.len();
        if !line.first().is_some_and(|t| t.is_ident("define")) || line.len() < 3 {
            continue;
        }
        // A function-like macro's parameter list directly follows its name (same line, and the
        // lexer keeps no whitespace, so `#define F (x)` reads like `#define F(x)`: the only cost
        // is skipping a parenthesised group of an object-like macro's body).
        let mut start = 2;
        if line[2].is_punct("(") {
            while start < line.len() && !line[start].is_punct(")") {
                start += 1;
            }
            start += 1;
        }
        if start < line.len() {
            bodies.push(line[start..].to_vec());
        }
    }
    bodies
}

#[derive(Clone, Copy, PartialEq)]
enum Scope {
    /// File scope, a namespace or `extern "C" { }`.
    Namespace,
    /// A struct, class or union body: member functions are checked too.
    Class,
    /// A function body, an initialiser, an enum: not looked into.
    Other,
}

fn scan(toks: &[Token<'_>], qualifier_macros: &[&str]) -> Option<(String, usize)> {
    let mut scopes = vec![Scope::Namespace];
    // Start of the current declaration (after the last `;`, `{` or `}` of a checked scope).
    let mut start = 0;
    for (i, t) in toks.iter().enumerate() {
        let here = *scopes.last().unwrap_or(&Scope::Namespace);
        if t.is_punct("{") {
            let scope = if here == Scope::Other {
                Scope::Other
            } else {
                let decl = &toks[start..i];
                match classify(decl) {
                    Decl::Function { name, line } => {
                        let device = decl.iter().any(|t| {
                            t.is_ident("__device__")
                                || t.is_ident("__global__")
                                || t.is_ident("constexpr")
                                || t.is_ident("consteval")
                                || (t.kind == TokKind::Ident && qualifier_macros.contains(&t.text))
                        });
                        if !device {
                            return Some((name, line));
                        }
                        Scope::Other
                    }
                    Decl::Namespace => Scope::Namespace,
                    Decl::Class => Scope::Class,
                    Decl::Other => Scope::Other,
                }
            };
            scopes.push(scope);
            start = i + 1;
        } else if t.is_punct("}") {
            if scopes.len() > 1 {
                scopes.pop();
            }
            start = i + 1;
        } else if t.is_punct(";") && here != Scope::Other {
            start = i + 1;
        } else if here == Scope::Class
            && t.is_punct(":")
            && toks[start..i].len() == 1
            && matches!(toks[start].text, "public" | "private" | "protected")
        {
            // An access specifier ends nothing but itself.
            start = i + 1;
        }
    }
    None
}

enum Decl {
    Function { name: String, line: usize },
    Namespace,
    Class,
    Other,
}

/// What the tokens before a `{` declare.
fn classify(decl: &[Token<'_>]) -> Decl {
    if decl.is_empty() {
        return Decl::Other; // a bare block
    }
    if decl.iter().any(|t| t.is_ident("namespace"))
        || (decl.len() == 2 && decl[0].is_ident("extern") && decl[1].kind == TokKind::Str)
    {
        return Decl::Namespace;
    }
    // `=` at the top level: an initialiser (`x = {..}`, `f = [](..) {..}`), not a definition.
    // (Default arguments sit inside the parentheses, depth > 0.)
    let mut depth = 0i32;
    let mut name: Option<(String, usize)> = None;
    let mut skip_to = 0;
    for (j, t) in decl.iter().enumerate() {
        if j < skip_to {
            continue;
        }
        if t.is_ident("template") {
            // A template parameter list may hold `=` (default arguments): skip it whole.
            skip_to = template_header_end(decl, j + 1);
            continue;
        }
        if t.kind != TokKind::Punct {
            continue;
        }
        match t.text {
            "(" | "[" => {
                if depth == 0 && t.text == "(" && name.is_none() {
                    name = function_name(&decl[..j]);
                }
                depth += 1;
            }
            ")" | "]" => depth -= 1,
            "=" if depth == 0 && !preceded_by_operator(&decl[..j]) => return Decl::Other,
            _ => {}
        }
    }
    let keyword = |k: &str| decl.iter().any(|t| t.is_ident(k));
    match name {
        Some((name, line)) if !CONTROL.contains(&name.as_str()) => Decl::Function { name, line },
        Some(_) => Decl::Other,
        None if keyword("struct") || keyword("class") || keyword("union") => Decl::Class,
        None => Decl::Other,
    }
}

/// The index after the `<...>` starting at `open` (nested angle brackets counted); `open` when
/// there is none.
fn template_header_end(decl: &[Token<'_>], open: usize) -> usize {
    if !decl.get(open).is_some_and(|t| t.is_punct("<")) {
        return open;
    }
    let mut depth = 0i32;
    for (j, t) in decl.iter().enumerate().skip(open) {
        match t.text {
            "<" => depth += 1,
            ">" => depth -= 1,
            ">>" => depth -= 2,
            _ => {}
        }
        if depth <= 0 {
            return j + 1;
        }
    }
    decl.len()
}

/// The function's name when `before` ends with it (`f`, `S::f`, `operator+`, `~S`).
fn function_name(before: &[Token<'_>]) -> Option<(String, usize)> {
    let last = before.last()?;
    if last.kind == TokKind::Ident {
        if NOT_NAMES.contains(&last.text) {
            return None;
        }
        return Some((last.text.to_string(), last.line));
    }
    // `operator+`, `operator()` (the `(` of `()` is the first group), `operator[]`.
    let op = before.iter().rposition(|t| t.is_ident("operator"))?;
    if before.len() - op <= 3 {
        let text: String = before[op..]
            .iter()
            .map(|t| t.text)
            .collect::<Vec<_>>()
            .join("");
        return Some((text, before[op].line));
    }
    None
}

/// True when the `=` ending `before` belongs to an operator's name (`operator=`, `operator==`).
fn preceded_by_operator(before: &[Token<'_>]) -> bool {
    before.iter().rev().take(2).any(|t| t.is_ident("operator"))
}

#[cfg(test)]
mod tests {
    use super::super::lex::lex;
    use super::*;

    fn host(source: &str) -> Option<(String, usize)> {
        first_host_function(&lex(source))
    }

    #[test]
    fn device_code_passes() {
        for ok in [
            "__global__ void k(float* x) { auto f = [&](int i) { return x[i]; }; x[0] = f(1); }",
            "__device__ __forceinline__ float sq(float x) { return x * x; }",
            "template <bool BT> __device__ void f(float* p) { if (BT) { p[0] = 1; } }",
            "struct MS { float m, s; };\n__device__ MS merge(MS a, MS b) { return a; }",
            "struct P { __device__ P operator+(const P& o) const { return o; } float x; };",
            "namespace ns { __device__ int g(int a) { return a; } }",
            "extern \"C\" { __global__ void k() {} }",
            "extern \"C\" __global__ void k() {}",
            "__device__ const float table[4] = {1, 2, 3, 4};",
            "enum class E { A, B };\nunion U { float f; int i; };",
            "#define DEV __device__ __forceinline__\nDEV float f(float x) { return x; }",
            "#define UNARY(n, e) __device__ float n(float x) { return e; }\nUNARY(neg, -x)",
            "#define LOOP(n) for (int i = 0; i < n; ++i) { acc += i; }\n__global__ void k() {}",
            "__launch_bounds__(256) __global__ void k(float* y) { y[0] = 0; }",
            "float declared_only(float);",
            "constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }",
            "template <int N> constexpr int twice() { return 2 * N; }",
            "struct S { __device__ S() {} __device__ S& operator=(const S& o) { return *this; } };",
        ] {
            assert_eq!(host(ok), None, "{ok}");
        }
    }

    #[test]
    fn host_functions_are_found() {
        for (bad, name, line) in [
            ("float sq(float x) { return x * x; }", "sq", 1),
            (
                "__global__ void k() {}\n\nstatic inline int helper() { return 1; }",
                "helper",
                3,
            ),
            ("template <typename T> T id(T x) { return x; }", "id", 1),
            ("template <int N = 4> float f() { return N; }", "f", 1),
            ("namespace ns {\nint g(int a) { return a; }\n}", "g", 2),
            (
                "struct S {\n  float get() const { return 1; }\n};",
                "get",
                2,
            ),
            ("struct S {\npublic:\n  S() {}\n};", "S", 3),
            ("__attribute__((constructor)) void init() { }", "init", 1),
            ("#define F(n) float n(float x) { return x; }\nF(g)", "n", 1),
            (
                "float2 operator+(float2 a, float2 b) { return a; }",
                "operator+",
                1,
            ),
        ] {
            assert_eq!(host(bad), Some((name.to_string(), line)), "{bad}");
        }
    }
}
