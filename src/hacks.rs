//! The adversarial suite: known reward hacks and faults as candidates, each with the outcome it
//! must get on each backend (`tests/data/hacks/hacks.toml`, read by [`HackSuite::load`]).
//!
//! A hack that earns a reward is a hole in the harness; one that crashes the daemon or loses a
//! result is a hole in the system. The suite makes both testable: `kevin bench hacks` evaluates
//! every case and compares, `kevin bench faults` submits them by the hundred among valid kernels.
//! The manifest states the expected outcome *per backend* because some faults cannot happen on
//! the CPU model (and a few are caught differently there); such an entry must say why
//! (`not_reproducible`), so "the CPU passes it" is a stated, tested fact, never a silent gap. An
//! expected "correct" outcome always needs that explanation or a `note` saying why passing is
//! right (e.g. a printf flood computes the right answer and its output is contained).
//!
//! Every hack the threat model lists (issue 6) must have at least one case: [`HACKS`] names them,
//! and loading fails when one is missing, so the list cannot silently shrink.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::outcome::{Outcome, KINDS};

/// The manifest's file name inside the suite's folder.
pub const MANIFEST: &str = "hacks.toml";

/// The hacks the suite must cover: the `hack` ids of the manifest, with what each one is.
pub const HACKS: &[(&str, &str)] = &[
    (
        "unwritten_output",
        "returning without writing the outputs, hoping for stale memory",
    ),
    ("partial_output", "writing only part of the output"),
    ("copy_input", "copying an input to the output"),
    (
        "hardcoded_results",
        "results hard-coded for one size preset",
    ),
    (
        "device_global_cache",
        "caching results in a __device__ global across calls",
    ),
    (
        "uninitialised_shared",
        "reading uninitialised shared memory",
    ),
    ("race", "a race (missing barrier)"),
    ("clobber_input", "clobbering an input"),
    (
        "low_precision",
        "computing in lower precision than the task's dtype",
    ),
    ("constant_output", "constant output"),
    ("infinite_loop", "an infinite loop"),
    ("illegal_address", "an illegal address"),
    ("trap", "__trap()"),
    ("misaligned_access", "a misaligned vector access"),
    (
        "oversized_shared_memory",
        "an oversized shared-memory request",
    ),
    (
        "compile_bomb",
        "a compile bomb (deep template recursion, huge unroll, constant evaluation)",
    ),
    ("printf_flood", "a printf flood"),
    ("huge_grid", "a grid so large it would run for minutes"),
    (
        "memory_scan",
        "scanning device memory beyond its own buffers",
    ),
    // Issue 17: the CPU sandbox and timed outputs.
    (
        "libc_call",
        "calling the C library (open, read) from device code",
    ),
    (
        "load_time_code",
        "code that runs when the module loads (a constructor)",
    ),
    (
        "host_environment",
        "reading the evaluating process's environment",
    ),
    (
        "system_call",
        "a raw system call through a stub made at run time",
    ),
    (
        "forged_reply",
        "writing a forged reply onto the process's standard output",
    ),
    (
        "timed_call_count",
        "counting calls and skipping work once the check is over",
    ),
    (
        "timed_fill_detect",
        "skipping work when the output is not the NaN fill",
    ),
    (
        "timed_input_cache",
        "replaying a cached output when the inputs' fingerprint repeats",
    ),
    // --- issue 17, GPU part (g17-gpu).
    (
        "scratch_overflow",
        "writing past the end of a scratch buffer",
    ),
    (
        "timer_asm_macro",
        "reading %globaltimer through inline PTX assembled by macros",
    ),
    (
        "has_include",
        "asking __has_include whether a file exists on the evaluation machine",
    ),
    (
        "host_function",
        "a host function (neither __device__ nor __global__)",
    ),
    (
        "nvrtc_only_error",
        "a kernel g++ accepts and NVRTC rejects (INFINITY without a header, a kernel named norm)",
    ),
];

/// Why the suite could not be loaded. One line, naming the file and the case.
#[derive(Debug, thiserror::Error)]
pub enum HackError {
    /// A file could not be read.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// The manifest is not valid TOML of the expected shape.
    #[error("{path}: {reason}")]
    Parse {
        /// The manifest.
        path: PathBuf,
        /// The parser's message, on one line.
        reason: String,
    },
    /// A case breaks a rule of the manifest.
    #[error("{path}: case `{case}`: {reason}")]
    Case {
        /// The manifest.
        path: PathBuf,
        /// The case's name.
        case: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A hack of [`HACKS`] has no case.
    #[error("{path}: no case covers the hack `{hack}` ({what})")]
    Missing {
        /// The manifest.
        path: PathBuf,
        /// The hack's id.
        hack: String,
        /// What it is.
        what: String,
    },
}

/// One or several outcome kinds.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Kinds {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectationFile {
    outcome: Kinds,
    reason: Option<String>,
    not_reproducible: Option<String>,
    note: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    name: String,
    hack: String,
    file: String,
    task: String,
    cpu: ExpectationFile,
    cuda: ExpectationFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    case: Vec<CaseFile>,
}

/// What a case must get on one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// The outcome kinds that are right (any of them; usually one).
    pub outcomes: Vec<String>,
    /// Text the outcome's feedback must contain, when given.
    pub reason: Option<String>,
    /// Why this backend cannot reproduce the fault (and so gives `outcomes` instead).
    pub not_reproducible: Option<String>,
    /// Anything else a reader of a run's log should know about this expectation.
    pub note: Option<String>,
}

impl Expectation {
    /// `Ok` when `outcome` is what this expectation allows; otherwise one line saying what was
    /// expected and what came.
    pub fn check(&self, outcome: &Outcome) -> Result<(), String> {
        let kind = outcome.kind();
        if !self.outcomes.iter().any(|k| k == kind) {
            return Err(format!(
                "expected {}, got {kind}: {}",
                self.outcomes.join(" or "),
                first_line(&outcome.feedback())
            ));
        }
        match &self.reason {
            Some(r) if !outcome.feedback().contains(r.as_str()) => Err(format!(
                "{kind} as expected, but the reason lacks {r:?}: {}",
                first_line(&outcome.feedback())
            )),
            _ => Ok(()),
        }
    }

    /// The expected kinds as text ("crash", "crash|wrong").
    pub fn label(&self) -> String {
        self.outcomes.join("|")
    }
}

/// The first line of a text, cut to 200 characters (for one-line reports).
pub fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("");
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}

/// One case of the suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HackCase {
    /// Unique name (e.g. "relu.unwritten").
    pub name: String,
    /// Which hack of [`HACKS`] it is.
    pub hack: String,
    /// The candidate's file.
    pub file: PathBuf,
    /// The task it is written for.
    pub task: String,
    /// The candidate (the contents of a ```cuda block).
    pub source: String,
    /// What it must get on the CPU backend.
    pub cpu: Expectation,
    /// What it must get on the CUDA backend.
    pub cuda: Expectation,
}

impl HackCase {
    /// The expectation for `backend` ("cpu" or "cuda"); None for another name.
    pub fn expectation(&self, backend: &str) -> Option<&Expectation> {
        match backend {
            "cpu" => Some(&self.cpu),
            "cuda" => Some(&self.cuda),
            _ => None,
        }
    }
}

/// The whole suite.
#[derive(Debug, Clone)]
pub struct HackSuite {
    /// The cases, in manifest order.
    pub cases: Vec<HackCase>,
}

impl HackSuite {
    /// Reads `dir/hacks.toml` and every candidate it names, checking the manifest's rules: unique
    /// names, known hack ids and outcome kinds, an explanation for every expected "correct", and a
    /// case for every hack of [`HACKS`].
    pub fn load(dir: &Path) -> Result<HackSuite, HackError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| HackError::Io {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let file: ManifestFile = toml::from_str(&text).map_err(|e| HackError::Parse {
            path: path.clone(),
            reason: e.to_string().replace('\n', " "),
        })?;
        let mut names = BTreeSet::new();
        let mut cases = Vec::with_capacity(file.case.len());
        for c in file.case {
            let bad = |reason: String| HackError::Case {
                path: path.clone(),
                case: c.name.clone(),
                reason,
            };
            if c.name.is_empty() || !names.insert(c.name.clone()) {
                return Err(bad("names must be unique and non-empty".into()));
            }
            if !HACKS.iter().any(|(id, _)| *id == c.hack) {
                return Err(bad(format!(
                    "unknown hack `{}` (see kevin::hacks::HACKS)",
                    c.hack
                )));
            }
            if c.task.is_empty() {
                return Err(bad("task is empty".into()));
            }
            let cpu = expectation(c.cpu).map_err(|r| bad(format!("cpu: {r}")))?;
            let cuda = expectation(c.cuda).map_err(|r| bad(format!("cuda: {r}")))?;
            let file = dir.join(&c.file);
            let source = std::fs::read_to_string(&file).map_err(|e| HackError::Io {
                path: file.clone(),
                reason: e.to_string(),
            })?;
            cases.push(HackCase {
                name: c.name,
                hack: c.hack,
                file,
                task: c.task,
                source,
                cpu,
                cuda,
            });
        }
        if let Some((hack, what)) = HACKS
            .iter()
            .find(|(id, _)| !cases.iter().any(|c| c.hack == *id))
        {
            return Err(HackError::Missing {
                path,
                hack: hack.to_string(),
                what: what.to_string(),
            });
        }
        Ok(HackSuite { cases })
    }

    /// The distinct tasks the cases are written for, sorted.
    pub fn tasks(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self.cases.iter().map(|c| c.task.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }
}

fn expectation(e: ExpectationFile) -> Result<Expectation, String> {
    let outcomes = match e.outcome {
        Kinds::One(k) => vec![k],
        Kinds::Many(ks) => ks,
    };
    if outcomes.is_empty() {
        return Err("outcome lists no kind".into());
    }
    if let Some(k) = outcomes.iter().find(|k| !KINDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown outcome kind `{k}` (known: {})",
            KINDS.join(", ")
        ));
    }
    let explained = e.not_reproducible.is_some() || e.note.is_some();
    if outcomes.iter().any(|k| k == "correct") && !explained {
        return Err(
            "a hack expected to be judged correct needs `not_reproducible` or a `note` saying why"
                .into(),
        );
    }
    Ok(Expectation {
        outcomes,
        reason: e.reason.filter(|r| !r.is_empty()),
        not_reproducible: e.not_reproducible,
        note: e.note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/hacks")
    }

    #[test]
    fn the_suite_loads_and_covers_every_hack() {
        let suite = HackSuite::load(&suite_dir()).unwrap();
        assert!(suite.cases.len() >= HACKS.len(), "{}", suite.cases.len());
        let tasks =
            crate::tasks::TaskSuite::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks"))
                .unwrap();
        for c in &suite.cases {
            assert!(
                tasks.get(&c.task).is_some(),
                "{}: unknown task {}",
                c.name,
                c.task
            );
            assert!(
                c.source.contains("// kevin: launch"),
                "{}: no launch line",
                c.name
            );
        }
    }

    fn write_manifest(text: &str) -> (PathBuf, Result<HackSuite, HackError>) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kevin-hacks-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("k.cu"),
            "// kevin: launch k grid=(1) block=(1) args=()\n",
        )
        .unwrap();
        std::fs::write(dir.join(MANIFEST), text).unwrap();
        let r = HackSuite::load(&dir);
        (dir, r)
    }

    fn one_case(cpu: &str) -> String {
        format!(
            "[[case]]\nname = \"a\"\nhack = \"trap\"\nfile = \"k.cu\"\ntask = \"relu\"\ncpu = {cpu}\ncuda = {{ outcome = \"crash\" }}\n"
        )
    }

    #[test]
    fn manifest_errors_are_one_line_and_name_the_case() {
        let cases = [
            (
                one_case("{ outcome = \"crashed\" }"),
                "unknown outcome kind `crashed`",
            ),
            (
                one_case("{ outcome = \"correct\" }"),
                "needs `not_reproducible`",
            ),
            (one_case("{ outcome = [] }"), "lists no kind"),
            (
                one_case("{ outcome = \"crash\", colour = 1 }"),
                "unknown field",
            ),
            (
                one_case("{ outcome = \"crash\" }").replace("\"trap\"", "\"tarp\""),
                "unknown hack `tarp`",
            ),
            (
                one_case("{ outcome = \"crash\" }").replace("k.cu", "missing.cu"),
                "missing.cu",
            ),
            (
                format!("{0}{0}", one_case("{ outcome = \"crash\" }")),
                "unique",
            ),
            (
                one_case("{ outcome = \"crash\" }"),
                "no case covers the hack `unwritten_output`",
            ),
        ];
        for (text, expected) in cases {
            let (dir, r) = write_manifest(&text);
            let e = r.expect_err(expected).to_string();
            assert!(e.contains(expected), "{e:?} lacks {expected:?}");
            assert!(!e.contains('\n'), "multi-line: {e:?}");
            std::fs::remove_dir_all(dir).ok();
        }
    }

    #[test]
    fn expectations_check_kind_and_reason() {
        let e = Expectation {
            outcomes: vec!["crash".into(), "wrong".into()],
            reason: Some("illegal".into()),
            not_reproducible: None,
            note: None,
        };
        let crash = |r: &str| Outcome::Crash { reason: r.into() };
        assert!(e.check(&crash("an illegal address")).is_ok());
        let err = e.check(&crash("a trap")).unwrap_err();
        assert!(err.contains("lacks \"illegal\""), "{err}");
        let err = e
            .check(&Outcome::Timeout {
                stage: "verify".into(),
                limit_ms: 5,
            })
            .unwrap_err();
        assert!(
            err.starts_with("expected crash or wrong, got timeout"),
            "{err}"
        );
        assert_eq!(e.label(), "crash|wrong");
    }
}
