//! Varied names for a drafted program ([`Naming::Varied`]): the drafter names sizes by role
//! (`M`, `N`, `K`, `B`, and `N`, `C`, `L`, `H`, `W`, `D` in the conv family), never gives a tensor
//! one of those letters, and writes every scalar as a literal. A policy trained on such programs
//! reads a size where a task has a tensor `B` or `K`, invents `M` for a task whose sizes are `S`
//! and `D`, and drops a named constant `s` (issue 19's held-out failures of 2026-12-06:
//! `benches/results/warmstart-sweep-h100-2026-12-06.md`). So, each on its own draw:
//! - the sizes are renamed from [`SIZE_POOL`] (half the programs);
//! - one tensor takes a letter that reads like a size ([`SIZE_LIKE_TENSORS`], a third);
//! - one scalar operand of `+ - * /` becomes a named constant ([`CONST_POOL`], three in five
//!   programs that have one).
//!
//! The draws come from their own generator (the draft's index and the run's seed), so a seed
//! gives the same programs under both namings. A renaming is kept only when the program still
//! parses and its canonical form (which names nothing) is unchanged.

use std::collections::{BTreeMap, BTreeSet};

use super::canon::canonical;
use super::draft::Draft;
use crate::ops::Program;
use crate::rng::SplitMix64;

/// How generated programs name their sizes, tensors and scalars.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Naming {
    /// Renamed on draws of their own (see the module doc): the default.
    #[default]
    Varied,
    /// As drafted: sizes by role, scalars as literals; a seed's tasks before 2026-12-06.
    Fixed,
}

impl Naming {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Naming::Varied => "varied",
            Naming::Fixed => "fixed",
        }
    }

    /// The naming called `name`.
    pub fn from_name(name: &str) -> Option<Naming> {
        [Naming::Varied, Naming::Fixed]
            .into_iter()
            .find(|n| n.name() == name)
    }
}

/// Names a renamed size may take (none `T`, the temporaries' prefix; none a lower-case letter,
/// which kernels use for their loop counters).
pub(crate) const SIZE_POOL: &[&str] = &[
    "S", "D", "L", "E", "H", "P", "R", "Q", "J", "C", "G", "U", "V", "W", "Z", "M", "N", "K", "B",
];

/// Letters that read like sizes, which a tensor may take when no size of its program has them.
pub(crate) const SIZE_LIKE_TENSORS: &[&str] = &["B", "K", "M", "N", "D", "S"];

/// Names a constant may take.
pub(crate) const CONST_POOL: &[&str] = &[
    "s", "alpha", "scale", "factor", "gain", "shift", "inv_t", "coef", "beta", "mult",
];

/// `d` (whose canonical form is `form`) with its names varied (see the module doc), and its
/// program; `None` where the draws change nothing or a renaming would change the program.
pub fn vary(d: &Draft, form: &str, rng: &mut SplitMix64) -> Option<(Draft, Program)> {
    let mut v = d.clone();
    if rng.next_f64() < 0.5 {
        rename_sizes(&mut v, rng);
    }
    if rng.next_f64() < 1.0 / 3.0 {
        rename_a_tensor(&mut v, rng);
    }
    if rng.next_f64() < 0.6 {
        name_a_constant(&mut v, rng);
    }
    if v.source == d.source {
        return None;
    }
    let after = Program::parse(&v.source).ok()?;
    (canonical(&after) == form).then_some((v, after))
}

/// Every identifier of `text`.
fn identifiers(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_alphabetic() || c == '_'))
        .map(str::to_string)
        .collect()
}

/// One of `pool` that is not in `taken`, or `None`.
fn free<'p>(rng: &mut SplitMix64, pool: &[&'p str], taken: &BTreeSet<String>) -> Option<&'p str> {
    let free: Vec<&str> = pool
        .iter()
        .copied()
        .filter(|n| !taken.contains(*n))
        .collect();
    (!free.is_empty()).then(|| free[rng.below(free.len() as u64) as usize])
}

/// `d` with the identifiers of `names` renamed everywhere it keeps them.
fn apply(d: &mut Draft, names: &BTreeMap<String, String>) {
    let rename = |s: &str| crate::corpus::naive::rename_words(s, names);
    d.source = rename(&d.source);
    for i in &mut d.inputs {
        i.name = rename(&i.name);
        for s in &mut i.shape {
            *s = rename(s);
        }
    }
    d.roles = std::mem::take(&mut d.roles)
        .into_iter()
        .map(|(k, r)| (rename(&k), r))
        .collect();
}

/// Every size symbol renamed to a free one of [`SIZE_POOL`].
fn rename_sizes(d: &mut Draft, rng: &mut SplitMix64) {
    let mut taken = identifiers(&d.source);
    let mut names = BTreeMap::new();
    for size in d.roles.keys() {
        if let Some(n) = free(rng, SIZE_POOL, &taken) {
            taken.insert(n.to_string());
            names.insert(size.clone(), n.to_string());
        }
    }
    apply(d, &names);
}

/// One input or output renamed to a free one of [`SIZE_LIKE_TENSORS`].
fn rename_a_tensor(d: &mut Draft, rng: &mut SplitMix64) {
    let tensors: Vec<String> = d
        .source
        .lines()
        .filter_map(|l| {
            let rest = l
                .strip_prefix("input ")
                .or_else(|| l.strip_prefix("output "))?;
            Some(rest.split(':').next()?.trim().to_string())
        })
        .collect();
    if tensors.is_empty() {
        return;
    }
    let which = tensors[rng.below(tensors.len() as u64) as usize].clone();
    let taken = identifiers(&d.source);
    if let Some(n) = free(rng, SIZE_LIKE_TENSORS, &taken) {
        apply(d, &[(which, n.to_string())].into_iter().collect());
    }
}

/// The byte ranges of the scalar operands of `+ - * /` in `line` (a number after ` OP `).
pub(crate) fn scalar_operands(line: &str) -> Vec<(usize, usize)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let op = b[i + 1];
        if b[i] == b' ' && matches!(op, b'+' | b'-' | b'*' | b'/') && b[i + 2] == b' ' {
            let start = i + 3;
            let mut end = start;
            while end < b.len()
                && (b[end].is_ascii_digit()
                    || b[end] == b'.'
                    || b[end] == b'e'
                    || (matches!(b[end], b'-' | b'+') && end > start && b[end - 1] == b'e'))
            {
                end += 1;
            }
            let token = &line[start..end];
            let word_ends = end == b.len() || !(b[end].is_ascii_alphanumeric() || b[end] == b'_');
            if token.starts_with(|c: char| c.is_ascii_digit()) && word_ends {
                out.push((start, end));
            }
        }
        i += 1;
    }
    out
}

/// One scalar operand of a statement as a constant declared before the output.
fn name_a_constant(d: &mut Draft, rng: &mut SplitMix64) {
    let lines: Vec<String> = d.source.lines().map(str::to_string).collect();
    let found: Vec<(usize, (usize, usize))> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.starts_with("input ") && !l.starts_with("output "))
        .flat_map(|(k, l)| scalar_operands(l).into_iter().map(move |r| (k, r)))
        .collect();
    let Some(&(k, (start, end))) = found.get(rng.below(found.len().max(1) as u64) as usize) else {
        return;
    };
    let Some(name) = free(rng, CONST_POOL, &identifiers(&d.source)) else {
        return;
    };
    let value = lines[k][start..end].to_string();
    let mut out = Vec::with_capacity(lines.len() + 1);
    for (j, line) in lines.into_iter().enumerate() {
        if line.starts_with("output ") && !out.iter().any(|l: &String| l.starts_with("const ")) {
            out.push(format!("const {name} = {value}"));
        }
        out.push(if j == k {
            format!("{}{name}{}", &line[..start], &line[end..])
        } else {
            line
        });
    }
    d.source = out.join("\n") + "\n";
}
