//! The serde-facing form of a task file and its validation into a [`Task`]. Unknown keys are
//! rejected; every validation error names the file and the dotted key that is wrong.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{InputDist, Split, Task, TaskError, Tolerance};
use crate::ops::{Dim, Dtype, Program, Sizes};

/// A task file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFile {
    name: String,
    level: u8,
    split: Split,
    description: String,
    program: String,
    sizes: SizesFile,
    #[serde(default)]
    inputs: BTreeMap<String, InputDist>,
    tolerance: Option<Tolerance>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SizesFile {
    gpu: Sizes,
    small: Sizes,
}

/// Parses and validates the text of the task file at `path`.
pub fn parse_task(path: &Path, text: &str) -> Result<Task, TaskError> {
    let raw: TaskFile = toml::from_str(text).map_err(|e| TaskError::Toml {
        file: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let invalid = |key: &str, message: String| TaskError::Invalid {
        file: path.to_path_buf(),
        key: key.to_string(),
        message,
    };
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    if raw.name != stem {
        return Err(invalid(
            "name",
            format!("`{}` must equal the file stem `{stem}`", raw.name),
        ));
    }
    if !(1..=2).contains(&raw.level) {
        return Err(invalid(
            "level",
            format!("{} is not a level (1 or 2)", raw.level),
        ));
    }
    if raw.description.trim().is_empty() {
        return Err(invalid("description", "is empty".into()));
    }
    let program = Program::parse(&raw.program).map_err(|e| invalid("program", e.to_string()))?;
    let symbols = program.size_symbols();
    let grouped = crate::ops::group_constraints(&program);
    for (preset, sizes) in [("gpu", &raw.sizes.gpu), ("small", &raw.sizes.small)] {
        for s in &symbols {
            match sizes.get(s) {
                None => return Err(invalid(&format!("sizes.{preset}.{s}"), "is missing".into())),
                Some(0) => {
                    return Err(invalid(
                        &format!("sizes.{preset}.{s}"),
                        "must be positive".into(),
                    ))
                }
                Some(_) => {}
            }
        }
        // A computed dim (a convolution's output length) must come out positive here too.
        for d in program.inputs.iter().chain(&program.outputs) {
            for dim in &d.ty.shape {
                if let Dim::Expr(p) = dim {
                    let v = p.eval(sizes).unwrap_or(0);
                    if v <= 0 {
                        return Err(invalid(
                            &format!("sizes.{preset}"),
                            format!(
                                "make the dim `{dim}` of `{}` {v}; every dim must be positive",
                                d.name
                            ),
                        ));
                    }
                }
            }
        }
        for (line, dim, groups) in &grouped {
            let (line, groups) = (*line, *groups);
            let v = dim.resolve(sizes).unwrap_or(0);
            if v % groups != 0 {
                return Err(invalid(
                    &format!("sizes.{preset}"),
                    format!(
                        "make `{dim}` {v}, which line {line} of the program splits into {groups} \
                         groups; it must be a multiple of {groups}"
                    ),
                ));
            }
        }
        if let Some(extra) = sizes.keys().find(|k| !symbols.contains(k)) {
            let msg = "is not a size symbol of the program".to_string();
            return Err(invalid(&format!("sizes.{preset}.{extra}"), msg));
        }
    }
    if let Some(extra) = raw
        .inputs
        .keys()
        .find(|k| !program.inputs.iter().any(|d| &d.name == *k))
    {
        return Err(invalid(
            &format!("inputs.{extra}"),
            "is not an input of the program".into(),
        ));
    }
    let mut inputs = Vec::with_capacity(program.inputs.len());
    for d in &program.inputs {
        let dist = raw.inputs.get(&d.name).copied().unwrap_or_default();
        dist.validate()
            .map_err(|m| invalid(&format!("inputs.{}", d.name), m))?;
        let r = d.ty.shape.len();
        if dist.is_matrix() && (r < 2 || d.ty.shape[r - 2] != d.ty.shape[r - 1]) {
            return Err(invalid(
                &format!("inputs.{}", d.name),
                format!(
                    "a triangular or symmetric input needs square matrices in its last two axes, not {}",
                    d.ty
                ),
            ));
        }
        inputs.push(dist);
    }
    let tolerance = match raw.tolerance {
        Some(t) => {
            if !(t.atol >= 0.0 && t.rtol >= 0.0 && t.atol.is_finite() && t.rtol.is_finite()) {
                return Err(invalid(
                    "tolerance",
                    "atol and rtol must be finite and >= 0".into(),
                ));
            }
            t
        }
        None => default_tolerance(&program),
    };
    Ok(Task {
        name: raw.name,
        level: raw.level,
        split: raw.split,
        description: raw.description.trim().to_string(),
        source: raw.program,
        program,
        gpu_sizes: raw.sizes.gpu,
        small_sizes: raw.sizes.small,
        inputs,
        tolerance,
        path: path.to_path_buf(),
    })
}

/// The loosest dtype default among the program's floating-point tensors.
fn default_tolerance(program: &Program) -> Tolerance {
    let decls = program.inputs.iter().chain(&program.outputs);
    let half = decls
        .into_iter()
        .any(|d| matches!(d.ty.dtype, Dtype::F16 | Dtype::Bf16));
    Tolerance::for_dtype(if half { Dtype::Bf16 } else { Dtype::F32 })
}

/// What a task file says, for [`write_task_file`].
pub struct TaskFileText<'a> {
    /// The task's name (the file's stem).
    pub name: &'a str,
    /// 1 (one operation) or 2 (a fused sequence).
    pub level: u8,
    /// Train or held out.
    pub split: Split,
    /// One line (quotes and backslashes are escaped).
    pub description: &'a str,
    /// The program's source, ending in a newline.
    pub program: &'a str,
    /// The size symbols, in the order the presets list them.
    pub symbols: &'a [String],
    /// The GPU preset.
    pub gpu: &'a Sizes,
    /// The small preset.
    pub small: &'a Sizes,
    /// Inputs with a distribution other than the default standard normal (others skipped).
    pub inputs: &'a [(String, InputDist)],
    /// A tolerance other than the dtype's default (`[tolerance]`), if any.
    pub tolerance: Option<Tolerance>,
}

/// The text of a task file that [`parse_task`] reads back as the same task.
pub fn write_task_file(t: &TaskFileText<'_>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let split = match t.split {
        Split::Train => "train",
        Split::Heldout => "heldout",
    };
    let description: String = t
        .description
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let _ = writeln!(s, "name = \"{}\"", t.name);
    let _ = writeln!(s, "level = {}", t.level);
    let _ = writeln!(s, "split = \"{split}\"");
    let _ = writeln!(s, "description = \"{description}\"");
    let _ = writeln!(s, "program = \"\"\"\n{}\"\"\"", t.program);
    for (preset, sizes) in [("gpu", t.gpu), ("small", t.small)] {
        let _ = writeln!(s, "\n[sizes.{preset}]");
        for sym in t.symbols {
            let _ = writeln!(s, "{sym} = {}", sizes.get(sym).copied().unwrap_or(1));
        }
    }
    for (name, dist) in t.inputs {
        let body = match *dist {
            InputDist::Normal { mean, std } if mean == 0.0 && std == 1.0 => continue,
            InputDist::Normal { mean, std } => {
                format!("dist = \"normal\"\nmean = {mean:?}\nstd = {std:?}")
            }
            InputDist::Uniform { lo, hi } => {
                format!("dist = \"uniform\"\nlo = {lo:?}\nhi = {hi:?}")
            }
            InputDist::Positive { min, std } => {
                format!("dist = \"positive\"\nmin = {min:?}\nstd = {std:?}")
            }
            InputDist::Grid { lo, step, count } => {
                format!("dist = \"grid\"\nlo = {lo:?}\nstep = {step:?}\ncount = {count}")
            }
            InputDist::ScaledUniform { lo, hi } => {
                format!("dist = \"scaled_uniform\"\nlo = {lo:?}\nhi = {hi:?}")
            }
            InputDist::Upper { lo, hi } => format!("dist = \"upper\"\nlo = {lo:?}\nhi = {hi:?}"),
            InputDist::Lower { lo, hi } => format!("dist = \"lower\"\nlo = {lo:?}\nhi = {hi:?}"),
            InputDist::Symmetric { lo, hi } => {
                format!("dist = \"symmetric\"\nlo = {lo:?}\nhi = {hi:?}")
            }
        };
        let _ = writeln!(s, "\n[inputs.{name}]\n{body}");
    }
    if let Some(t) = t.tolerance {
        let _ = writeln!(s, "\n[tolerance]\natol = {:?}\nrtol = {:?}", t.atol, t.rtol);
    }
    s
}
