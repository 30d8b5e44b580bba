//! Reading kernel signatures from the source, lightly: for each `__global__` (and, for better
//! messages, `__device__`) function, its name, whether it is a template, whether this is a
//! definition, and for each parameter whether it is a pointer (and to what) or a scalar (and of
//! which C type). That is what [`super::validate()`] needs to check a launch's arguments and what
//! a worker needs to pack them.
//!
//! This is not a C++ parser. It reads the token stream of the tokenizer (`lex.rs`) (comments and strings
//! already out of the way, directive lines skipped), so macros are not expanded: a kernel whose
//! signature is built by a macro is not found, and the error says which kernels were.

use serde::{Deserialize, Serialize};

use super::lex::{lex, TokKind, Token};
use super::Dtype;

/// A `__global__` function as declared in the source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSig {
    /// Its name.
    pub name: String,
    /// 1-based line of `__global__`.
    pub line: usize,
    /// Preceded by `template <...>`.
    pub is_template: bool,
    /// Has a body (`{`), as opposed to a declaration (`;`).
    pub is_definition: bool,
    /// Its parameters in order.
    pub params: Vec<Param>,
}

/// One kernel parameter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Param {
    /// The declaration as written, spacing normalised: `const float* __restrict__ a`.
    pub text: String,
    /// What it takes.
    pub kind: ParamKind,
}

/// What a parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// A device pointer (or array parameter).
    Pointer(Pointee),
    /// A scalar passed by value.
    Scalar(ScalarType),
    /// Something kevin cannot pass: a reference, a struct by value, a `short`, a `half`...
    Unsupported,
}

/// What a pointer parameter points to, as far as it can be checked against a tensor's dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pointee {
    /// Elements of this dtype (vector types count as their element: `float4` is f32).
    Dtype(Dtype),
    /// `void`, `char`, `unsigned char`, unsigned ints, or an unknown type: anything goes.
    Any,
}

/// The C type of a scalar parameter, which fixes how its bytes are packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScalarType {
    /// `int`, `int32_t`.
    I32,
    /// `unsigned`, `unsigned int`, `uint32_t`.
    U32,
    /// `long`, `long long`, `int64_t`, `ptrdiff_t` (LP64).
    I64,
    /// `unsigned long (long)`, `size_t`, `uint64_t`.
    U64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl ScalarType {
    /// The C name used in messages.
    pub fn c_name(self) -> &'static str {
        match self {
            ScalarType::I32 => "int",
            ScalarType::U32 => "unsigned int",
            ScalarType::I64 => "long long",
            ScalarType::U64 => "unsigned long long",
            ScalarType::F32 => "float",
            ScalarType::F64 => "double",
        }
    }

    /// True for `float` and `double`.
    pub fn is_float(self) -> bool {
        matches!(self, ScalarType::F32 | ScalarType::F64)
    }
}

/// Functions found in a source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Functions {
    /// `__global__` functions, declarations and definitions, in source order.
    pub kernels: Vec<KernelSig>,
    /// Names of `__device__` functions.
    pub device_functions: Vec<String>,
}

/// The `__global__` functions of `source`.
pub fn kernels(source: &str) -> Vec<KernelSig> {
    scan(&lex(source)).kernels
}

/// Qualifiers that say nothing about a parameter's type.
const QUALIFIERS: [&str; 7] = [
    "const",
    "volatile",
    "__restrict__",
    "__restrict",
    "restrict",
    "__grid_constant__",
    "register",
];

/// Words that are part of a type, so never a parameter's name.
const TYPE_WORDS: [&str; 12] = [
    "int", "unsigned", "signed", "long", "short", "char", "float", "double", "bool", "void",
    "size_t", "half",
];

/// Attributes with a parenthesised argument that may sit between `__global__` and the name.
const ATTRIBUTES: [&str; 5] = [
    "__launch_bounds__",
    "__attribute__",
    "__declspec",
    "__maxnreg__",
    "alignas",
];

/// How far back to look for `template` before `__global__` (keeps the scan linear).
const TEMPLATE_LOOKBACK: usize = 64;

/// Finds the functions in a token stream. Linear in the number of tokens.
pub(crate) fn scan(all: &[Token<'_>]) -> Functions {
    let toks: Vec<&Token<'_>> = all.iter().filter(|t| !t.in_directive).collect();
    let mut out = Functions::default();
    let mut i = 0;
    while i < toks.len() {
        let is_global = toks[i].is_ident("__global__");
        if !is_global && !toks[i].is_ident("__device__") {
            i += 1;
            continue;
        }
        let Some((name_at, open)) = find_name(&toks, i + 1) else {
            i += 1;
            continue;
        };
        let close = matching_paren(&toks, open);
        let name = toks[name_at].text.to_string();
        if !is_global {
            out.device_functions.push(name);
            i = close;
            continue;
        }
        let start = i.saturating_sub(TEMPLATE_LOOKBACK);
        let is_template = toks[start..i]
            .iter()
            .rev()
            .take_while(|t| !(t.is_punct(";") || t.is_punct("{") || t.is_punct("}")))
            .any(|t| t.is_ident("template"));
        let params = split_params(&toks[open + 1..close.min(toks.len())]);
        out.kernels.push(KernelSig {
            name,
            line: toks[i].line,
            is_template,
            is_definition: close < toks.len()
                && toks.get(close + 1).is_some_and(|t| t.is_punct("{")),
            params,
        });
        i = close.max(i + 1);
    }
    out
}

/// From just after `__global__`, the index of the function name and of its `(`.
fn find_name(toks: &[&Token<'_>], mut j: usize) -> Option<(usize, usize)> {
    while j < toks.len() {
        let t = toks[j];
        if ATTRIBUTES.iter().any(|a| t.is_ident(a))
            && toks.get(j + 1).is_some_and(|t| t.is_punct("("))
        {
            j = matching_paren(toks, j + 1) + 1;
        } else if t.is_punct("(") {
            let name = j.checked_sub(1)?;
            return (toks[name].kind == TokKind::Ident).then_some((name, j));
        } else if t.is_punct(";") || t.is_punct("{") || t.is_punct("}") || t.is_punct("=") {
            return None;
        } else {
            j += 1;
        }
    }
    None
}

/// Index of the `)` matching the `(` at `open`; stops early (returning that index) at `;`, `{`
/// or `}`, which cannot occur in a parameter list, or at the end.
fn matching_paren(toks: &[&Token<'_>], open: usize) -> usize {
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(open) {
        if t.is_punct("(") {
            depth += 1;
        } else if t.is_punct(")") {
            depth = depth.saturating_sub(1);
            if depth == 0 {
                return j;
            }
        } else if t.is_punct(";") || t.is_punct("{") || t.is_punct("}") {
            return j;
        }
    }
    toks.len()
}

/// Splits a parameter list at top-level commas and classifies each parameter.
fn split_params(toks: &[&Token<'_>]) -> Vec<Param> {
    if toks.is_empty() || (toks.len() == 1 && toks[0].is_ident("void")) {
        return Vec::new();
    }
    let mut params = Vec::new();
    let mut depth = 0i64;
    let mut start = 0;
    for (j, t) in toks.iter().enumerate() {
        match t.text {
            "(" | "[" | "<" => depth += 1,
            ")" | "]" | ">" => depth -= 1,
            ">>" => depth -= 2,
            "," if depth <= 0 => {
                params.push(parse_param(&toks[start..j]));
                start = j + 1;
            }
            _ => {}
        }
    }
    params.push(parse_param(&toks[start..]));
    params
}

fn parse_param(toks: &[&Token<'_>]) -> Param {
    let text = join(toks);
    // A default argument does not change the type.
    let decl = toks
        .iter()
        .position(|t| t.is_punct("="))
        .map_or(toks, |k| &toks[..k]);
    let stars = decl.iter().filter(|t| t.is_punct("*")).count();
    let is_array = decl.iter().any(|t| t.is_punct("["));
    let is_ref = decl.iter().any(|t| t.is_punct("&") || t.is_punct("&&"));
    // Type words: identifiers that are not qualifiers nor namespace prefixes (`cuda::std::`),
    // and not what follows `[` (array bounds).
    let bracket = decl
        .iter()
        .position(|t| t.is_punct("["))
        .unwrap_or(decl.len());
    let mut words: Vec<&str> = decl[..bracket]
        .iter()
        .enumerate()
        .filter(|(k, t)| {
            t.kind == TokKind::Ident
                && !QUALIFIERS.contains(&t.text)
                && !decl.get(k + 1).is_some_and(|n| n.is_punct("::"))
        })
        .map(|(_, t)| t.text)
        .collect();
    if words.len() >= 2 && words.last().is_some_and(|w| !TYPE_WORDS.contains(w)) {
        words.pop(); // the parameter's name
    }
    let kind = if is_ref || decl.is_empty() {
        ParamKind::Unsupported
    } else if stars > 0 || is_array {
        let pointee = if stars + usize::from(is_array) > 1 {
            Pointee::Any
        } else {
            pointee(&words)
        };
        ParamKind::Pointer(pointee)
    } else {
        scalar_type(&words).map_or(ParamKind::Unsupported, ParamKind::Scalar)
    };
    Param { text, kind }
}

fn scalar_type(words: &[&str]) -> Option<ScalarType> {
    Some(match words.join(" ").as_str() {
        "int" | "signed" | "signed int" | "int32_t" => ScalarType::I32,
        "unsigned" | "unsigned int" | "uint32_t" | "uint" => ScalarType::U32,
        "long" | "long int" | "signed long" | "long long" | "long long int"
        | "signed long long" | "int64_t" | "ptrdiff_t" | "intptr_t" | "ssize_t" => ScalarType::I64,
        "unsigned long"
        | "unsigned long int"
        | "unsigned long long"
        | "unsigned long long int"
        | "size_t"
        | "uint64_t"
        | "uintptr_t" => ScalarType::U64,
        "float" => ScalarType::F32,
        "double" => ScalarType::F64,
        _ => return None,
    })
}

fn pointee(words: &[&str]) -> Pointee {
    let dtype = match words.join(" ").as_str() {
        "float" | "float1" | "float2" | "float3" | "float4" => Dtype::F32,
        "double" | "double1" | "double2" | "double3" | "double4" => Dtype::F64,
        "half" | "__half" | "half2" | "__half2" => Dtype::F16,
        "__nv_bfloat16" | "nv_bfloat16" | "__nv_bfloat162" | "nv_bfloat162" => Dtype::Bf16,
        "int" | "signed" | "signed int" | "int32_t" | "int2" | "int4" => Dtype::I32,
        "long long" | "long long int" | "long" | "int64_t" | "longlong2" => Dtype::I64,
        "int8_t" | "signed char" | "char4" => Dtype::I8,
        "uint8_t" | "uchar4" => Dtype::U8,
        "bool" => Dtype::Bool,
        _ => return Pointee::Any,
    };
    Pointee::Dtype(dtype)
}

/// Joins tokens with C-like spacing: `const float* __restrict__ a`, `float a[]`.
fn join(toks: &[&Token<'_>]) -> String {
    let mut s = String::new();
    let mut prev: Option<&str> = None;
    for t in toks {
        let tight_before = matches!(t.text, "*" | "&" | "[" | "]" | "," | "::" | ")");
        let tight_after = matches!(prev, Some("::" | "[" | "(") | None);
        if !tight_before && !tight_after {
            s.push(' ');
        }
        s.push_str(t.text);
        prev = Some(t.text);
    }
    s
}
