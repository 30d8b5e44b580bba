//! Checking a [`Candidate`] against a task and resolving its launch plan into numbers.
//!
//! Order of checks: the source size, the static rules ([`super::rules`]), the number of
//! launches, the scratch buffers (names, sizes, total against [`Limits::scratch_cap`]), then each
//! launch in order: the kernel exists, is `__global__`, is neither a template nor overloaded; its
//! grid, block and shared memory are within [`Limits`]; its arguments match the kernel's
//! parameters in number and kind (tensor or scratch buffer for a pointer, with a matching dtype
//! where the pointer's element type says one; an integer expression or float literal for a
//! scalar, converted to the parameter's C type and range-checked). The first failure is returned.
//!
//! A bare name in `args=` is resolved as a task tensor, then a scratch buffer, then a size.
//! Scratch names may not shadow tensors or sizes, so that order never matters.

use serde::{Deserialize, Serialize};

use super::error::{excerpt, CandidateError, DirectiveError};
use super::expr::{EvalError, Expr};
use super::lex::lex;
use super::plan::{Arg, LaunchDecl};
use super::signature::{scan, Functions, KernelSig, Param, ParamKind, Pointee, ScalarType};
use super::{rules, Candidate, Dtype, Limits, TaskSignature};

/// A launch plan with every expression evaluated and every name resolved: what a worker runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResolvedPlan {
    /// Buffers to allocate before the first launch (uninitialised) and free after the last.
    pub scratch: Vec<ScratchBuffer>,
    /// Launches, in order, all on the harness's stream.
    pub launches: Vec<ResolvedLaunch>,
}

/// A scratch buffer to allocate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchBuffer {
    /// Its name in the plan.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Element count, at least 1.
    pub elems: u64,
}

/// One launch, ready to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResolvedLaunch {
    /// 1-based line of its `// kevin: launch` in the cuda block (for launch-error messages).
    pub line: usize,
    /// The `__global__` function's name as written in the source (not mangled).
    pub kernel: String,
    /// Grid dimensions (x, y, z), each at least 1.
    pub grid: [u32; 3],
    /// Block dimensions (x, y, z), each at least 1.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub smem_bytes: u32,
    /// Arguments, one per kernel parameter, in order.
    pub args: Vec<ResolvedArg>,
}

/// One resolved argument.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolvedArg {
    /// Device pointer to the task tensor at this index of [`TaskSignature::tensors`].
    Tensor(usize),
    /// Device pointer to the scratch buffer at this index of [`ResolvedPlan::scratch`].
    Scratch(usize),
    /// A scalar, already in the parameter's C type.
    Scalar(Scalar),
}

/// A scalar argument in the exact C type of its parameter, so packing it is `to_ne_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scalar {
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `long long`.
    I64(i64),
    /// `unsigned long long` / `size_t`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

/// Checks `candidate` against the task `sig` within `limits`, and resolves its plan.
pub fn validate(
    candidate: &Candidate,
    sig: &TaskSignature,
    limits: &Limits,
) -> Result<ResolvedPlan, CandidateError> {
    let source = &candidate.source;
    if source.len() > limits.max_source_bytes {
        return Err(CandidateError::SourceTooLarge {
            bytes: source.len(),
            max: limits.max_source_bytes,
        });
    }
    let tokens = lex(source);
    rules::check_source(source, &tokens)
        .map_err(|(line, violation)| CandidateError::Rule { line, violation })?;
    let plan = &candidate.plan;
    if plan.launches.is_empty() {
        return Err(CandidateError::NoLaunches);
    }
    if plan.launches.len() > limits.max_launches {
        return Err(CandidateError::TooManyLaunches {
            count: plan.launches.len(),
            max: limits.max_launches,
        });
    }
    let mut ctx = Ctx {
        sig,
        limits,
        functions: scan(&tokens),
        scratch: Vec::new(),
    };
    ctx.resolve_scratch(candidate)?;
    let launches = plan
        .launches
        .iter()
        .map(|l| {
            ctx.resolve_launch(l)
                .map_err(|error| CandidateError::Directive {
                    line: l.line,
                    context: format!("launch `{}`", l.kernel),
                    error: Box::new(error),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ResolvedPlan {
        scratch: ctx.scratch,
        launches,
    })
}

/// What resolution looks things up in.
struct Ctx<'a> {
    sig: &'a TaskSignature,
    limits: &'a Limits,
    functions: Functions,
    scratch: Vec<ScratchBuffer>,
}

/// How many names a message lists before it writes "...".
const MAX_NAMES_SHOWN: usize = 16;

/// "a, b, c" (distinct names, at most [`MAX_NAMES_SHOWN`] of them), or "none".
fn list_or_none<'s>(names: impl Iterator<Item = &'s str>) -> String {
    let mut shown: Vec<&str> = Vec::new();
    for n in names {
        if shown.len() == MAX_NAMES_SHOWN {
            shown.push("...");
            break;
        }
        if !shown.contains(&n) {
            shown.push(n);
        }
    }
    if shown.is_empty() {
        "none".to_string()
    } else {
        shown.join(", ")
    }
}

impl Ctx<'_> {
    fn sizes(&self) -> String {
        list_or_none(self.sig.sizes.keys().map(String::as_str))
    }

    fn scratch_index(&self, name: &str) -> Option<usize> {
        self.scratch.iter().position(|s| s.name == name)
    }

    /// Value of a size symbol, or why `name` is not one.
    fn size(&self, name: &str) -> Result<i64, EvalError> {
        if let Some(v) = self.sig.sizes.get(name) {
            return Ok(*v);
        }
        let what = if self.sig.tensor(name).is_some() {
            "tensor"
        } else if self.scratch_index(name).is_some() {
            "scratch buffer"
        } else {
            return Err(EvalError::UnknownSymbol {
                name: name.to_string(),
                sizes: self.sizes(),
            });
        };
        Err(EvalError::NotASize {
            name: name.to_string(),
            what: what.to_string(),
            sizes: self.sizes(),
        })
    }

    /// Evaluates `e`; `what` names it in an error (built only on failure: every candidate's
    /// validation runs through here, so the success path does not format).
    fn eval(&self, e: &Expr, what: impl FnOnce() -> String) -> Result<i64, DirectiveError> {
        e.eval(&|n| self.size(n))
            .map_err(|error| DirectiveError::Eval {
                what: what(),
                error,
            })
    }

    fn resolve_scratch(&mut self, candidate: &Candidate) -> Result<(), CandidateError> {
        let cap = self.limits.scratch_cap(self.sig);
        let mut total: u64 = 0;
        let mut seen = std::collections::HashMap::new();
        for d in &candidate.plan.scratch {
            let at = |error| CandidateError::Directive {
                line: d.line,
                context: format!("scratch `{}`", d.name),
                error: Box::new(error),
            };
            if let Some(&first_line) = seen.get(d.name.as_str()) {
                return Err(at(DirectiveError::DuplicateScratch {
                    name: d.name.clone(),
                    first_line,
                }));
            }
            seen.insert(d.name.as_str(), d.line);
            let taken = if self.sig.tensor(&d.name).is_some() {
                Some("tensor")
            } else {
                self.sig.sizes.contains_key(&d.name).then_some("size")
            };
            if let Some(what) = taken {
                return Err(at(DirectiveError::ScratchNameTaken {
                    name: d.name.clone(),
                    what,
                }));
            }
            let elems = self
                .eval(&d.elems, || "element count".to_string())
                .map_err(at)?;
            if elems < 1 {
                return Err(at(DirectiveError::ScratchEmpty {
                    expr: d.elems.to_string(),
                    value: elems,
                }));
            }
            let elems = elems as u64; // positive i64
            total = total.saturating_add(elems.saturating_mul(d.dtype.size_bytes()));
            if total > cap {
                return Err(CandidateError::ScratchTooLarge { total, cap });
            }
            self.scratch.push(ScratchBuffer {
                name: d.name.clone(),
                dtype: d.dtype,
                elems,
            });
        }
        Ok(())
    }

    fn kernel(&self, name: &str) -> Result<&KernelSig, DirectiveError> {
        let all: Vec<&KernelSig> = self
            .functions
            .kernels
            .iter()
            .filter(|k| k.name == name)
            .collect();
        if all.is_empty() {
            if self.functions.device_functions.iter().any(|f| f == name) {
                return Err(DirectiveError::NotAKernel {
                    kernel: name.to_string(),
                });
            }
            return Err(DirectiveError::UnknownKernel {
                kernel: name.to_string(),
                available: list_or_none(self.functions.kernels.iter().map(|k| k.name.as_str())),
            });
        }
        let defs: Vec<&KernelSig> = all.iter().copied().filter(|k| k.is_definition).collect();
        if defs.len() > 1 {
            return Err(DirectiveError::OverloadedKernel {
                kernel: name.to_string(),
            });
        }
        let k = defs.first().copied().unwrap_or(all[0]);
        if k.is_template {
            return Err(DirectiveError::TemplateKernel {
                kernel: name.to_string(),
            });
        }
        Ok(k)
    }

    fn dims(&self, exprs: &[Expr], key: &'static str) -> Result<[u32; 3], DirectiveError> {
        let mut out = [1u32; 3];
        for (i, (e, axis)) in exprs.iter().zip(['x', 'y', 'z']).enumerate() {
            let l = self.limits;
            let max = match (key, axis) {
                ("grid", 'x') => l.max_grid_x,
                ("grid", _) => l.max_grid_yz,
                (_, 'z') => l.max_block_z,
                _ => l.max_block_xy,
            }
            .min(i64::from(u32::MAX));
            let value = self.eval(e, || format!("{key} {axis}"))?;
            if !(1..=max).contains(&value) {
                return Err(DirectiveError::Dim {
                    key,
                    axis,
                    expr: e.to_string(),
                    value,
                    max,
                });
            }
            out[i] = value as u32; // in 1..=u32::MAX
        }
        Ok(out)
    }

    fn resolve_launch(&self, l: &LaunchDecl) -> Result<ResolvedLaunch, DirectiveError> {
        let kernel = self.kernel(&l.kernel)?;
        let grid = self.dims(&l.grid, "grid")?;
        let block = self.dims(&l.block, "block")?;
        let threads: i64 = block.iter().map(|&b| i64::from(b)).product();
        if threads > self.limits.max_threads_per_block {
            return Err(DirectiveError::ThreadsPerBlock {
                threads,
                max: self.limits.max_threads_per_block,
            });
        }
        let smem_bytes = match &l.smem {
            None => 0,
            Some(e) => {
                let value = self.eval(e, || "smem".to_string())?;
                let max = self.limits.max_smem_bytes.min(i64::from(u32::MAX));
                if !(0..=max).contains(&value) {
                    return Err(DirectiveError::Smem {
                        expr: e.to_string(),
                        value,
                        max,
                    });
                }
                value as u32 // in 0..=u32::MAX
            }
        };
        if l.args.len() != kernel.params.len() {
            let params: Vec<String> = kernel.params.iter().map(|p| excerpt(&p.text)).collect();
            return Err(DirectiveError::ArgCount {
                kernel: kernel.name.clone(),
                expected: kernel.params.len(),
                found: l.args.len(),
                params: params.join(", "),
            });
        }
        let args = l
            .args
            .iter()
            .zip(&kernel.params)
            .enumerate()
            .map(|(i, (arg, param))| self.resolve_arg(i + 1, arg, param, &kernel.name))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ResolvedLaunch {
            line: l.line,
            kernel: l.kernel.clone(),
            grid,
            block,
            smem_bytes,
            args,
        })
    }

    fn resolve_arg(
        &self,
        index: usize,
        arg: &Arg,
        param: &Param,
        kernel: &str,
    ) -> Result<ResolvedArg, DirectiveError> {
        let mismatch = |problem: String| DirectiveError::ArgMismatch {
            index,
            arg: arg.to_string(),
            problem,
        };
        let p = ParamRef {
            index,
            param,
            kernel,
        };
        let name = match arg {
            Arg::Expr(e) => e.as_sym(),
            Arg::Float(_) => None,
        };
        let tensor = name.and_then(|n| self.sig.tensor(n));
        let buffer = name.and_then(|n| self.scratch_index(n));
        let target = match (tensor, buffer) {
            (Some(t), _) => Some((ResolvedArg::Tensor(t), self.sig.tensors[t].dtype, "tensor")),
            (None, Some(s)) => Some((
                ResolvedArg::Scratch(s),
                self.scratch[s].dtype,
                "scratch buffer",
            )),
            (None, None) => None,
        };
        let unknown = name.filter(|n| target.is_none() && !self.sig.sizes.contains_key(*n));
        if let Some(n) = unknown {
            let known = format!(
                "tensors: {}; scratch: {}; sizes: {}",
                list_or_none(self.sig.tensors.iter().map(|t| t.name.as_str())),
                list_or_none(self.scratch.iter().map(|s| s.name.as_str())),
                self.sizes()
            );
            return Err(DirectiveError::UnknownArg {
                index,
                name: n.to_string(),
                known,
            });
        }
        match (param.kind, target) {
            (ParamKind::Unsupported, _) => Err(mismatch(format!(
                "cannot be passed: {p} has a type kevin cannot pass (use a pointer, int, unsigned, \
                 long long, size_t, float or double)"
            ))),
            (ParamKind::Pointer(pointee), Some((resolved, dtype, what))) => match pointee {
                Pointee::Dtype(want) if want != dtype => Err(mismatch(format!(
                    "is a {what} of {dtype} elements but {p} points to {want} elements"
                ))),
                _ => Ok(resolved),
            },
            (ParamKind::Pointer(_), None) => Err(mismatch(format!(
                "is a number but {p} is a pointer (pass a tensor or a scratch buffer)"
            ))),
            (ParamKind::Scalar(_), Some((_, _, what))) => Err(mismatch(format!(
                "is a {what} but {p} is a scalar (pass a size, an expression or a literal)"
            ))),
            (ParamKind::Scalar(ty), None) => {
                let (scalar, value) = match arg {
                    Arg::Float(v) if ty.is_float() => (float_scalar(*v, ty), format!("{v:?}")),
                    Arg::Float(_) => {
                        return Err(mismatch(format!("is a float but {p} is an integer")));
                    }
                    Arg::Expr(e) => {
                        let v = self.eval(e, || format!("argument {index}"))?;
                        (int_scalar(v, ty), v.to_string())
                    }
                };
                scalar.map(ResolvedArg::Scalar).ok_or_else(|| {
                    let shown = if value == arg.to_string() {
                        String::new()
                    } else {
                        format!("= {value} ")
                    };
                    mismatch(format!("{shown}is out of range for {p} ({})", ty.c_name()))
                })
            }
        }
    }
}

/// "parameter 3 `int n` of `k`", formatted only when an error needs it.
struct ParamRef<'a> {
    index: usize,
    param: &'a Param,
    kernel: &'a str,
}

impl std::fmt::Display for ParamRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "parameter {} `{}` of `{}`",
            self.index,
            excerpt(&self.param.text),
            self.kernel
        )
    }
}

fn float_scalar(v: f64, ty: ScalarType) -> Option<Scalar> {
    match ty {
        ScalarType::F32 => Some(v as f32).filter(|f| f.is_finite()).map(Scalar::F32),
        _ => Some(Scalar::F64(v)),
    }
}

fn int_scalar(v: i64, ty: ScalarType) -> Option<Scalar> {
    Some(match ty {
        ScalarType::I32 => Scalar::I32(i32::try_from(v).ok()?),
        ScalarType::U32 => Scalar::U32(u32::try_from(v).ok()?),
        ScalarType::I64 => Scalar::I64(v),
        ScalarType::U64 => Scalar::U64(u64::try_from(v).ok()?),
        ScalarType::F32 => Scalar::F32(v as f32),
        ScalarType::F64 => Scalar::F64(v as f64),
    })
}
