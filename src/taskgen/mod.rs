//! Procedural training tasks: random programs of the op language, each vetted as a task file
//! would be and then some, so a policy can learn the mapping from programs to kernels from far
//! more programs than anyone writes by hand (`kevin tasks generate`).
//!
//! Families ([`Family`]): elementwise chains with broadcasts; a reduction along any axis;
//! a row operation (softmax, log_softmax, layer and RMS norm, l2norm, cumsum and reversed
//! cumsum through `flip`; logsumexp,
//! argmax and argmin as reductions); matrix products (plain, batched, with a shared or a
//! transposed weight, matrix-vector) with epilogues, sometimes a row operation after them, and
//! sometimes an operation on the left operand first (elementwise, or a row operation, so the
//! program needs a kernel per stage); transposes. Each in f32, f16 or bf16, with
//! 1 to `max_ops` operations before and after its core.
//!
//! A draft becomes a task only when all of these hold:
//!
//! 1. it parses and type-checks, and its task file loads (the file written is the file checked);
//! 2. its canonical form ([`canonical`]) is new: not a task of the suite, not generated before;
//! 3. it is not a held-out task: neither the same [`skeleton`] (any dtype, any constants) as a
//!    held-out task nor [`equivalent`] to one by evaluation;
//! 4. its numerics are sound at the small preset and at a *probe* preset (the small sizes, but
//!    with every reduced, normalised, scanned or contracted axis at its GPU size): inputs drawn
//!    from their distributions give finite fp64 outputs; the op-by-op result with every
//!    operation rounded to its dtype ([`crate::ops::interp::run_eager`], what the baseline
//!    computes) is within half the tolerance of them; index outputs match exactly; the output is
//!    not (nearly) constant; every input changes the output when it is redrawn, so no kernel
//!    passes by ignoring one (these two on [`GenOptions::draws`] independent draws of the inputs,
//!    every one of which must pass: a program whose output is constant on most draws, e.g. an
//!    argmax that a long column normalisation leaves to one input, once passed on a lucky draw
//!    and took a kernel that ignored the other input for correct at 55x); and (with [`GenOptions::plain_sums`], the default) a plain kernel,
//!    adding its long sums in order in an f32 accumulator, stays within half the tolerance at the
//!    probe ([`plain_sums_fit`]), so that no correct kernel is judged wrong for f32 arithmetic;
//! 5. its GPU preset meets the 0.1 ms rule ([`Task::estimate_gpu_baseline_ms`]) and the memory a
//!    `cuda` worker needs for it ([`crate::gpu::buffers::memory_need`]) fits `max_gpu_bytes`.
//!
//! Sizes: the small preset draws distinct values off multiples of 32 (batches 2 to 4, the rest 5
//! to 96); the GPU preset starts from common sizes and grows one random symbol at a time until
//! the estimate passes the 0.1 ms rule.
//!
//! Everything is a function of the seed: drafts are drawn in order from one stream, vetted in
//! parallel, and accepted in draft order, so the same seed writes the same files on any machine
//! with any number of threads. Generated tasks are `split = "train"`.

mod canon;
mod draft;
mod names;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use canon::{canonical, equivalent, skeleton};
pub use draft::{Family, SymRole};
pub use names::Naming;

use crate::ops::interp::{self, Tensor};
use crate::ops::{infer_expr, normalize_axis, BinOp, Dim, Dtype, Expr, Op, Program, Sizes};
use crate::rng::{fnv1a, SplitMix64};
use crate::tasks::{InputDist, Preset, Split, Task, TaskError, TaskSuite, Tolerance};
use draft::Draft;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Tasks to generate.
    pub count: usize,
    /// Seed of everything drawn.
    pub seed: u64,
    /// Most operations in a program (at least 1).
    pub max_ops: usize,
    /// Families to draw from (all when empty).
    pub families: Vec<Family>,
    /// Largest device memory a task's evaluation may need ([`crate::gpu::buffers::memory_need`]).
    pub max_gpu_bytes: u64,
    /// Threads vetting drafts.
    pub threads: usize,
    /// Give up after this many drafts per task asked for (a generator that rejects nearly
    /// everything is a bug to report, not a loop to wait on).
    pub max_drafts_per_task: usize,
    /// How the programs name their sizes, tensors and scalars ([`Naming`]).
    pub naming: Naming,
    /// Composite shapes are drawn too (second products, row operations of two inputs,
    /// reductions of a row operation's result: [`draft::draft`]); off, a seed gives its programs
    /// of before 2026-12-06.
    pub composite: bool,
    /// Refuse a program whose tolerance a plain kernel's f32 sums cannot meet at the probe
    /// preset ([`plain_sums_fit`]: a long reduction, scan or product of values that cancel);
    /// off, a seed gives its programs of before the check (late on 2026-12-06).
    pub plain_sums: bool,
    /// Independent input draws at each of the small and probe presets on which the output must
    /// not be (nearly) constant and every input must move it (check 4); 1 gives a seed's
    /// programs of before 2026-12-07, which checked one draw.
    pub draws: u32,
}

impl GenOptions {
    /// Defaults for `count` tasks from `seed`: up to 6 operations, every family, 16 GiB.
    pub fn new(count: usize, seed: u64) -> GenOptions {
        GenOptions {
            count,
            seed,
            max_ops: 6,
            families: Vec::new(),
            max_gpu_bytes: 16 << 30,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_drafts_per_task: 200,
            naming: Naming::default(),
            composite: true,
            draws: DRAWS,
            plain_sums: true,
        }
    }
}

/// The GPU estimate a generated preset must reach: the 0.1 ms rule with a margin for the
/// estimate's error.
pub const MIN_GPU_MS: f64 = 0.12;

/// Input draws at each preset on which check 4's output and input checks must hold
/// ([`GenOptions::draws`]).
pub const DRAWS: u32 = 3;

/// One generated task.
#[derive(Clone, Debug)]
pub struct Generated {
    /// The task, as loaded from `text`.
    pub task: Task,
    /// The task file.
    pub text: String,
    /// Its family.
    pub family: Family,
    /// Its canonical form.
    pub canonical: String,
}

/// Counts of a generation.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GenStats {
    /// Drafts drawn.
    pub drafted: usize,
    /// Tasks accepted.
    pub accepted: usize,
    /// Drafts refused, by reason.
    pub rejected: BTreeMap<String, usize>,
    /// Accepted tasks per family.
    pub by_family: BTreeMap<String, usize>,
    /// Accepted tasks per dtype of their float tensors.
    pub by_dtype: BTreeMap<String, usize>,
    /// Accepted tasks per level.
    pub by_level: BTreeMap<u8, usize>,
    /// Accepted tasks per number of operations.
    pub by_ops: BTreeMap<usize, usize>,
}

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// Too many drafts were refused.
    #[error(
        "gave up after {drafted} drafts with {accepted} of {count} tasks accepted (refused: {})",
        reasons(.rejected)
    )]
    TooManyRejections {
        /// Tasks asked for.
        count: usize,
        /// Tasks accepted.
        accepted: usize,
        /// Drafts drawn.
        drafted: usize,
        /// Refusals by reason.
        rejected: BTreeMap<String, usize>,
    },
    /// A task file could not be written.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The output folder already holds task files.
    #[error(
        "{} already holds {files} task files: generate into an empty or new folder",
        dir.display()
    )]
    NotEmpty {
        /// The folder.
        dir: PathBuf,
        /// Task files in it.
        files: usize,
    },
}

fn reasons(r: &BTreeMap<String, usize>) -> String {
    r.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a draft was refused (the keys of [`GenStats::rejected`]).
#[derive(Debug)]
struct Reject(&'static str);

/// Generates `opts.count` tasks. `suite` is the hand-written suite: its tasks are not
/// generated again, and its held-out tasks are kept out. `progress` is called after each batch.
pub fn generate(
    opts: &GenOptions,
    suite: &TaskSuite,
    mut progress: impl FnMut(&GenStats),
) -> Result<(Vec<Generated>, GenStats), GenError> {
    let families = if opts.families.is_empty() {
        Family::ALL.to_vec()
    } else {
        opts.families.clone()
    };
    let heldout: Vec<&Task> = suite.split(Split::Heldout).collect();
    let heldout_skeletons: BTreeSet<String> =
        heldout.iter().map(|t| skeleton(&t.program)).collect();
    let mut seen: BTreeSet<String> = suite
        .tasks()
        .iter()
        .map(|t| canonical(&t.program))
        .collect();
    let mut rng = SplitMix64::derive(opts.seed, 0x7a5c);
    let mut stats = GenStats::default();
    let mut out: Vec<Generated> = Vec::with_capacity(opts.count);
    let budget = opts.count.max(1) * opts.max_drafts_per_task.max(1);
    let batch = (opts.threads.max(1) * 8).clamp(8, 256);
    while out.len() < opts.count {
        if stats.drafted >= budget {
            return Err(GenError::TooManyRejections {
                count: opts.count,
                accepted: out.len(),
                drafted: stats.drafted,
                rejected: stats.rejected,
            });
        }
        // Draw and cheaply screen a batch in order; vet the survivors in parallel.
        let mut jobs: Vec<(u64, Draft, Program, String)> = Vec::new();
        for _ in 0..batch {
            let index = stats.drafted as u64;
            stats.drafted += 1;
            let family = draft::pick_family(&mut rng, &families);
            let d = draft::draft(&mut rng, family, opts.max_ops, opts.composite);
            let screened = Program::parse(&d.source)
                .map_err(|_| Reject("ill-typed"))
                .and_then(|p| {
                    let form = canonical(&p);
                    if seen.contains(&form) {
                        Err(Reject("duplicate"))
                    } else if heldout_skeletons.contains(&skeleton(&p)) {
                        Err(Reject("held-out"))
                    } else {
                        Ok((p, form))
                    }
                });
            match screened {
                Ok((p, form)) => jobs.push((index, d, p, form)),
                Err(Reject(why)) => *stats.rejected.entry(why.into()).or_default() += 1,
            }
        }
        let vetted = crate::par::par_map(
            &jobs,
            opts.threads,
            |(index, d, p, form)| vet(opts, &heldout, *index, d, p, form),
            |_, _, _| {},
        );
        for r in vetted {
            match r {
                Ok(g) if out.len() < opts.count => {
                    if !seen.insert(g.canonical.clone()) {
                        *stats.rejected.entry("duplicate".into()).or_default() += 1;
                        continue;
                    }
                    stats.accepted += 1;
                    *stats.by_family.entry(g.family.name().into()).or_default() += 1;
                    *stats
                        .by_dtype
                        .entry(float_dtype(&g.task).into())
                        .or_default() += 1;
                    *stats.by_level.entry(g.task.level).or_default() += 1;
                    *stats.by_ops.entry(op_count(&g.task.program)).or_default() += 1;
                    out.push(g);
                }
                Ok(_) => {}
                Err(Reject(why)) => *stats.rejected.entry(why.into()).or_default() += 1,
            }
        }
        progress(&stats);
    }
    Ok((out, stats))
}

/// Writes each task to `dir/<name>.toml` (creating `dir`); refuses a folder that already holds
/// task files, so a generation never mixes with another.
pub fn write(dir: &Path, tasks: &[Generated]) -> Result<(), GenError> {
    let werr = |path: &Path, source| GenError::Write {
        path: path.to_path_buf(),
        source,
    };
    if dir.is_dir() {
        let files = std::fs::read_dir(dir)
            .map_err(|e| werr(dir, e))?
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
            .count();
        if files > 0 {
            return Err(GenError::NotEmpty {
                dir: dir.to_path_buf(),
                files,
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| werr(dir, e))?;
    for g in tasks {
        let path = dir.join(format!("{}.toml", g.task.name));
        std::fs::write(&path, &g.text).map_err(|e| werr(&path, e))?;
    }
    Ok(())
}

/// A fingerprint of a generation: FNV-1a over the task files in name order (what a corpus
/// built from them records).
pub fn fingerprint(tasks: &[Generated]) -> String {
    let mut all: Vec<&Generated> = tasks.iter().collect();
    all.sort_by(|a, b| a.task.name.cmp(&b.task.name));
    let mut bytes = Vec::new();
    for g in all {
        bytes.extend_from_slice(g.task.name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(g.text.as_bytes());
        bytes.push(0);
    }
    format!("{:016x}", fnv1a(&bytes))
}

fn float_dtype(t: &Task) -> &'static str {
    t.program
        .inputs
        .iter()
        .map(|d| d.ty.dtype)
        .find(|d| d.is_float())
        .map_or("i64", Dtype::name)
}

/// Operations of a program: calls and binary operations on tensors. A transpose feeding a
/// matrix product is part of the product (a transposed operand, as cuBLAS and PyTorch take it);
/// a flip or a reshape is layout, no operation (a reversed cumulative sum is one, as
/// KernelBench's level 1 counts it).
pub fn op_count(p: &Program) -> usize {
    fn count(p: &Program, e: &Expr) -> usize {
        match e {
            Expr::Num(_) | Expr::Var(_) => 0,
            Expr::Neg(a) => 1 + count(p, a),
            Expr::Binary(BinOp::MatMul, a, b) => {
                let operand = |x: &Expr| match x {
                    Expr::Call {
                        op: Op::Transpose { .. },
                        args,
                    } => args.iter().map(|a| count(p, a)).sum(),
                    other => count(p, other),
                };
                1 + operand(a) + operand(b)
            }
            Expr::Binary(_, a, b) => {
                let tensor = infer_expr(p, e).is_ok_and(|t| t.dtype.is_some());
                usize::from(tensor) + count(p, a) + count(p, b)
            }
            Expr::Call { op, args } => {
                let layout = matches!(op, Op::Flip { .. } | Op::Reshape { .. });
                usize::from(!layout) + args.iter().map(|a| count(p, a)).sum::<usize>()
            }
        }
    }
    p.stmts.iter().map(|s| count(p, &s.expr)).sum()
}

/// Turns a screened draft into a task, or says why not (checks 3 to 5 of the module doc).
fn vet(
    opts: &GenOptions,
    heldout: &[&Task],
    index: u64,
    d: &Draft,
    p: &Program,
    form: &str,
) -> Result<Generated, Reject> {
    // Names vary here, past screening (canonical forms name nothing), on draws of their own:
    // both namings give a seed's programs.
    let varied = match opts.naming {
        Naming::Fixed => None,
        Naming::Varied => names::vary(d, form, &mut SplitMix64::derive(opts.seed ^ index, 0x4e41)),
    };
    let (d, p) = varied.as_ref().map_or((d, p), |(d, p)| (d, p));
    let mut rng = SplitMix64::derive(opts.seed ^ 0x51e5, index);
    let small = small_sizes(&mut rng, p, &d.roles);
    let gpu = gpu_sizes(&mut rng, p, &d.roles).ok_or(Reject("gpu-size"))?;
    let name = format!(
        "gen_{}_{:010x}",
        d.family.name(),
        fnv1a(form.as_bytes()) >> 24
    );
    let text = task_file(&name, d, p, &gpu, &small);
    let path = PathBuf::from(format!("{name}.toml"));
    let task = crate::tasks::parse_task(&path, &text).map_err(|e: TaskError| {
        debug_assert!(false, "generated task file does not load: {e}\n{text}");
        Reject("invalid-file")
    })?;
    if heldout.iter().any(|h| equivalent(&task, h)) {
        return Err(Reject("held-out"));
    }
    let seed = rng.next_u64();
    numerics(&task, &small, seed, false, opts.draws)?;
    if let Some(probe) = probe_sizes(&task) {
        numerics(&task, &probe, seed ^ 1, opts.plain_sums, opts.draws)?;
    }
    if task.estimate_gpu_baseline_ms() < MIN_GPU_MS {
        return Err(Reject("gpu-size"));
    }
    let need =
        crate::gpu::buffers::memory_need(&task, Preset::Gpu).map_err(|_| Reject("lowering"))?;
    if need.peak() > opts.max_gpu_bytes {
        return Err(Reject("gpu-memory"));
    }
    Ok(Generated {
        task,
        text,
        family: d.family,
        canonical: form.to_string(),
    })
}

/// The task file of a draft.
fn task_file(name: &str, d: &Draft, p: &Program, gpu: &Sizes, small: &Sizes) -> String {
    let level = if op_count(p) <= 1 { 1 } else { 2 };
    let mut words = d.words.join(", ");
    if let Some(c) = words.get(..1) {
        words = c.to_uppercase() + &words[1..];
    }
    let inputs: Vec<(String, InputDist)> =
        d.inputs.iter().map(|i| (i.name.clone(), i.dist)).collect();
    crate::tasks::file::write_task_file(&crate::tasks::file::TaskFileText {
        name,
        level,
        split: Split::Train,
        description: &format!("{words} ({}, generated)", d.dtype.name()),
        program: &d.source,
        symbols: &p.size_symbols(),
        gpu,
        small,
        inputs: &inputs,
        tolerance: None,
    })
}

/// The small preset: distinct values off multiples of 32, batches 2 to 4, the rest 5 to 96.
fn small_sizes(rng: &mut SplitMix64, p: &Program, roles: &BTreeMap<String, SymRole>) -> Sizes {
    let mut sizes = Sizes::new();
    for s in p.size_symbols() {
        let (lo, hi): (u64, u64) = match roles.get(&s) {
            Some(SymRole::Batch) => (2, 4),
            Some(SymRole::Inner) => (5, 64),
            Some(SymRole::Channels) => (2, 12),
            Some(SymRole::Spatial) => {
                (draft::SPATIAL_SMALL.0 as u64, draft::SPATIAL_SMALL.1 as u64)
            }
            Some(SymRole::Volume) => (draft::VOLUME_SMALL.0 as u64, draft::VOLUME_SMALL.1 as u64),
            _ => (5, 96),
        };
        let v = loop {
            let v = (lo + rng.below(hi - lo + 1)) as usize;
            if v % 32 != 0 && !sizes.values().any(|&x| x == v) {
                break v;
            }
        };
        sizes.insert(s, v);
    }
    sizes
}

/// The GPU preset: common sizes to start, then one symbol at a time grown by half or doubled
/// (to a multiple of 64, within its role's cap) until the estimate reaches [`MIN_GPU_MS`].
/// `None` when the caps are reached first.
fn gpu_sizes(
    rng: &mut SplitMix64,
    p: &Program,
    roles: &BTreeMap<String, SymRole>,
) -> Option<Sizes> {
    let syms = p.size_symbols();
    let role = |s: &str| roles.get(s).copied().unwrap_or(SymRole::Cols);
    let range = |r: SymRole| -> (&'static [usize], usize) {
        match r {
            SymRole::Batch => (&[4, 8, 16, 32], 512),
            SymRole::Rows => (&[512, 1024, 2048, 4096], 1 << 17),
            SymRole::Cols => (&[256, 512, 1024, 2048, 4096], 1 << 15),
            SymRole::Inner => (&[256, 512, 1024, 2048], 8192),
            SymRole::Channels => (&[16, 32, 64], 512),
            SymRole::Spatial => (&[32, 64, 128], 2048),
            SymRole::Volume => (&[8, 16, 32], 256),
        }
    };
    let mut sizes = Sizes::new();
    for s in &syms {
        let (starts, _) = range(role(s));
        sizes.insert(s.clone(), starts[rng.below(starts.len() as u64) as usize]);
    }
    for _ in 0..64 {
        if crate::tasks::estimate_baseline_ms(p, &sizes) >= MIN_GPU_MS {
            return Some(sizes);
        }
        let growable: Vec<&String> = syms
            .iter()
            .filter(|s| sizes[*s] < range(role(s)).1)
            .collect();
        if growable.is_empty() {
            return None;
        }
        let s = growable[rng.below(growable.len() as u64) as usize].clone();
        let v = sizes[&s];
        let grown = if rng.below(3) == 0 { v + v / 2 } else { v * 2 };
        let grown = grown.div_ceil(64) * 64;
        sizes.insert(s.clone(), grown.min(range(role(&s)).1));
    }
    None
}

/// Size symbols that are reduced, normalised, scanned or contracted somewhere in the program:
/// the lengths over which rounding errors and magnitudes accumulate.
fn long_symbols(p: &Program) -> BTreeSet<String> {
    fn walk(p: &Program, e: &Expr, out: &mut BTreeSet<String>) {
        let mut mark = |x: &Expr, axis: Option<i64>| {
            if let Ok(t) = infer_expr(p, x) {
                let r = t.shape.len();
                let i = axis.map_or(r.checked_sub(1), |a| normalize_axis(a, r));
                if let Some(Dim::Sym(s)) = i.and_then(|i| t.shape.get(i)) {
                    out.insert(s.clone());
                }
            }
        };
        match e {
            Expr::Num(_) | Expr::Var(_) => {}
            Expr::Neg(a) => walk(p, a, out),
            Expr::Binary(op, a, b) => {
                if *op == BinOp::MatMul {
                    mark(a, None);
                }
                walk(p, a, out);
                walk(p, b, out);
            }
            Expr::Call { op, args } => {
                if let Some(x) = args.first() {
                    match *op {
                        Op::Reduce { axis, .. }
                        | Op::Softmax { axis }
                        | Op::LogSoftmax { axis }
                        | Op::Cumsum { axis }
                        | Op::Cumprod { axis }
                        | Op::L2Norm { axis, .. } => mark(x, Some(axis)),
                        Op::LayerNorm { .. } | Op::RmsNorm { .. } => mark(x, None),
                        // A convolution contracts its input channels (and its window).
                        Op::Conv { .. } => mark(x, Some(1)),
                        _ => {}
                    }
                }
                for a in args {
                    walk(p, a, out);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for s in &p.stmts {
        walk(p, &s.expr, &mut out);
    }
    out
}

/// Elements the probe may hold in its largest tensor.
const PROBE_MAX_ELEMS: usize = 1 << 21;

/// The probe preset: the small sizes with every long symbol at its GPU size (shrunk to fit
/// [`PROBE_MAX_ELEMS`]); `None` when no symbol is long, or nothing can shrink enough.
fn probe_sizes(task: &Task) -> Option<Sizes> {
    let long = long_symbols(&task.program);
    if long.is_empty() {
        return None;
    }
    let mut sizes = task.small_sizes.clone();
    for s in &long {
        sizes.insert(s.clone(), task.gpu_sizes[s]);
    }
    let p = &task.program;
    let largest = |sizes: &Sizes| {
        p.types
            .values()
            .map(|t| {
                t.concrete_shape(sizes)
                    .map_or(0, |s| s.iter().product::<usize>())
            })
            .max()
            .unwrap_or(0)
    };
    if largest(&sizes) > PROBE_MAX_ELEMS {
        // Too large: the other symbols down to 2, then the longest axis halved at a time (not
        // below its small size), so the probe keeps axes thousands long at a bounded cost.
        for (s, v) in sizes.iter_mut() {
            if !long.contains(s) {
                *v = 2;
            }
        }
        while largest(&sizes) > PROBE_MAX_ELEMS {
            let longest = long
                .iter()
                .filter(|s| sizes[*s] / 2 >= task.small_sizes[*s])
                .max_by_key(|s| sizes[*s])?;
            let v = sizes[longest] / 2;
            sizes.insert(longest.clone(), v);
        }
    }
    Some(sizes)
}

/// `task` with its small preset at `sizes`, and inputs drawn there from its distributions.
fn draw_at(task: &Task, sizes: &Sizes, seed: u64) -> (Task, Vec<Vec<f64>>) {
    let mut at = task.clone();
    at.small_sizes = sizes.clone();
    let inputs = at.generate_inputs(Preset::Small, seed);
    (at, inputs)
}

/// `got` is finite and within half of `tol` of `want`: the margin of the generator's checks
/// against rounding (the checks run on far fewer outputs than the GPU preset holds, whose
/// largest error lies further out in the tail).
fn within_half(tol: Tolerance, want: f64, got: f64) -> bool {
    got.is_finite() && (got - want).abs() <= 0.5 * (tol.atol + tol.rtol * want.abs())
}

/// Check 4 of the module doc at `sizes`, with the plain kernel's sums ([`plain_sums_fit`]) when
/// `plain`; the output and input checks ([`informative`]) on `draws` draws of the inputs.
fn numerics(task: &Task, sizes: &Sizes, seed: u64, plain: bool, draws: u32) -> Result<(), Reject> {
    let p = &task.program;
    let (at, inputs) = draw_at(task, sizes, seed);
    let want = interp::run(p, sizes, &inputs).map_err(|_| Reject("interpreter"))?;
    // Finite, and representable in the output's dtype (no overflow to infinity on store).
    let representable = want.iter().zip(&p.outputs).all(|(t, d)| {
        t.data
            .iter()
            .all(|&v| crate::ops::round::round_to(d.ty.dtype, v).is_finite())
    });
    if !representable {
        return Err(Reject("non-finite"));
    }
    let eager = interp::run_eager(p, sizes, &inputs).map_err(|_| Reject("interpreter"))?;
    let tol = task.tolerance;
    for ((w, e), d) in want.iter().zip(&eager).zip(&p.outputs) {
        let exact = !d.ty.dtype.is_float();
        let ok = w.data.iter().zip(&e.data).all(|(&w, &e)| {
            if exact {
                w == e
            } else {
                within_half(tol, w, e)
            }
        });
        if !ok {
            return Err(Reject("rounding"));
        }
    }
    informative(&at, sizes, &inputs, &want, seed)?;
    for k in 1..draws {
        let seed = SplitMix64::derive(seed, u64::from(k)).next_u64();
        let (at, inputs) = draw_at(task, sizes, seed);
        let want = interp::run(p, sizes, &inputs).map_err(|_| Reject("interpreter"))?;
        informative(&at, sizes, &inputs, &want, seed)?;
    }
    if plain {
        plain_sums_meet(task, sizes, &inputs, &want).map_err(|_| Reject("plain-sums"))?;
    }
    Ok(())
}

/// On one draw of the inputs (`inputs` at `sizes`, drawn by `at` ([`draw_at`]) with `seed`;
/// `want` their fp64 reference): no output is (nearly) constant, and redrawing any one input
/// alone moves some output beyond the tolerance.
fn informative(
    at: &Task,
    sizes: &Sizes,
    inputs: &[Vec<f64>],
    want: &[Tensor],
    seed: u64,
) -> Result<(), Reject> {
    let p = &at.program;
    if want
        .iter()
        .zip(&p.outputs)
        .any(|(w, d)| degenerate(w, d.ty.dtype))
    {
        return Err(Reject("degenerate"));
    }
    let tol = at.tolerance;
    let other = at.generate_inputs(Preset::Small, seed ^ 0x9e37_79b9);
    for i in 0..inputs.len() {
        let mut changed = inputs.to_vec();
        changed[i] = other[i].clone();
        let got = interp::run(p, sizes, &changed).map_err(|_| Reject("interpreter"))?;
        let moved = got.iter().zip(want).any(|(g, w)| {
            g.data
                .iter()
                .zip(&w.data)
                .any(|(&g, &w)| !((g - w).abs() <= tol.atol + tol.rtol * w.abs()))
        });
        if !moved {
            return Err(Reject("input-ignored"));
        }
    }
    Ok(())
}

/// Whether a plain kernel can pass `task`: one thread per output adding its long sums in index
/// order in an f32 accumulator ([`interp::run_plain_f32`]) must be within half the task's
/// tolerance of the fp64 reference on every float output, at the probe preset (the small sizes with every
/// reduced, normalised, scanned or contracted axis at its GPU size; the small preset when there
/// is none), on inputs drawn from the task's distributions with `seed`. Where it is not, the
/// tolerance asks for more than f32 arithmetic gives at the task's sizes (e.g. a 4,096-long dot
/// product of unit-normal values whose result is near zero), and the evaluation would call a
/// correct kernel wrong. The error names the output, the element, both values and the sizes.
pub fn plain_sums_fit(task: &Task, seed: u64) -> Result<(), String> {
    let sizes = probe_sizes(task).unwrap_or_else(|| task.small_sizes.clone());
    let (_, inputs) = draw_at(task, &sizes, seed);
    let want = interp::run(&task.program, &sizes, &inputs).map_err(|e| e.to_string())?;
    plain_sums_meet(task, &sizes, &inputs, &want)
}

/// [`plain_sums_fit`] on `inputs` at `sizes`, whose fp64 reference is `want`.
fn plain_sums_meet(
    task: &Task,
    sizes: &Sizes,
    inputs: &[Vec<f64>],
    want: &[Tensor],
) -> Result<(), String> {
    let p = &task.program;
    let plain = interp::run_plain_f32(p, sizes, inputs).map_err(|e| e.to_string())?;
    let tol = task.tolerance;
    for ((w, g), d) in want.iter().zip(&plain).zip(&p.outputs) {
        if !d.ty.dtype.is_float() {
            continue;
        }
        let outside = |i: &usize| !within_half(tol, w.data[*i], g.data[*i]);
        if let Some(i) = (0..w.data.len()).find(outside) {
            return Err(format!(
                "output {}: {} of {} elements outside half the tolerance (atol {:e}, rtol \
                 {:e}) with f32 sums in index order (element {i}: {} against {}) at sizes \
                 {sizes:?}",
                d.name,
                (0..w.data.len()).filter(outside).count(),
                w.data.len(),
                tol.atol,
                tol.rtol,
                g.data[i],
                w.data[i]
            ));
        }
    }
    Ok(())
}

/// True when an output is (nearly) constant: one value (at its dtype) in more than 75% of its
/// elements (a ReLU of centred values leaves half at zero), or fewer than two distinct values.
fn degenerate(t: &Tensor, dtype: Dtype) -> bool {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for &v in &t.data {
        let r = crate::ops::round::round_to(dtype, v);
        *counts.entry(r.to_bits()).or_default() += 1;
    }
    let top = counts.values().copied().max().unwrap_or(0);
    counts.len() < 2 || top * 4 > t.data.len() * 3
}
