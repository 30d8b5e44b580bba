//! The correctness protocol: is a candidate's output right, on inputs it cannot anticipate?
//!
//! Every rule closes a way to pass without computing the task:
//! - **Fresh secret inputs, several trials** ([`ProtocolConfig::trials`], default 5): each trial
//!   draws its seed from the OS (`getrandom`), so a kernel cannot hard-code outputs or special-case
//!   one input set; a fixed seed exists only for tests.
//! - **Reference first**: the fp64 reference of a trial is computed before the candidate runs, so
//!   nothing the candidate does (on a GPU: leave state behind, corrupt memory) can reach it.
//! - **Outputs pre-filled with NaN** before every run: an element the kernel never writes stays
//!   NaN (a distinctive payload, [`super::buffer::F32_FILL`]; i64 uses `i64::MIN`) and fails, so
//!   leftovers of an earlier run, of the reference or of zeroed memory never count as results.
//! - **Inputs compared to a copy** after every run (bit for bit): a kernel that writes its result
//!   into an input, or uses an input as scratch, fails ("input A was modified").
//! - **Tolerance** `|got - want| <= atol + rtol * |want|` with the task's tolerance (i64 outputs
//!   exactly); NaN or Inf where the reference is finite fails, so NaN cannot slip through a
//!   comparison that is false for NaN.
//! - **Two runs on the same inputs**: a race or an uninitialised read often passes once; when the
//!   first run passes and the second does not, the reason says so. Bitwise differences between two
//!   runs that both pass are accepted (atomic reductions legitimately reorder additions).
//!
//! The backend runs the candidate through the [`Executor`] trait, on [`TensorBuf`]s whose memory
//! is fenced by guard pages. An [`ExecFailure`] of the candidate becomes its
//! [`Outcome`]; a failure of the harness itself (a task whose reference fails, no OS randomness,
//! a backend fault) is a [`HarnessError`], never charged to the candidate.

use crate::ops::interp::InterpError;
use crate::ops::Dtype;
use crate::outcome::{Mismatch, Outcome};
use crate::rng::SplitMix64;
use crate::tasks::{Preset, Role, Task, Tolerance};

use super::buffer::{dtype_size, BufferError, TensorBuf};
use super::ExecFailure;

/// Runs a candidate on task tensors; implemented by each execution backend.
pub trait Executor {
    /// Runs the candidate's whole launch sequence once on `tensors` (task tensors in signature
    /// order: inputs then outputs). A GPU backend copies the host buffers to the device and the
    /// outputs (and inputs, so that clobbering is seen) back before returning.
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure>;

    /// A task tensor for this executor. A backend whose candidate runs in another process
    /// allocates it in memory shared with that process; the default is a guard-paged host buffer.
    fn alloc(&mut self, name: &str, dtype: Dtype, numel: usize) -> Result<TensorBuf, BufferError> {
        TensorBuf::new(name, dtype, numel)
    }

    /// Why the runs so far tampered with the executor's own buffers (a scratch buffer's slack
    /// overwritten), or `None`.
    fn tampering(&self) -> Option<String> {
        None
    }
}

/// Settings of the correctness protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolConfig {
    /// Number of trials, each on fresh inputs (at least 1 is run).
    pub trials: u32,
    /// Fixed base seed for reproducible tests; `None` (the default) draws every trial's seed from
    /// the OS so the candidate cannot know it.
    pub seed: Option<u64>,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            trials: 5,
            seed: None,
        }
    }
}

/// What a passed check established.
#[derive(Debug, Clone, PartialEq)]
pub struct CorrectnessReport {
    /// Trials run.
    pub trials: u32,
    /// Executor runs (two per trial).
    pub runs: u32,
    /// The seed of each trial's inputs.
    pub seeds: Vec<u64>,
    /// Largest `|got - want| / (atol + rtol * |want|)` over all float output elements: how close
    /// the candidate came to the tolerance (0 for exact results; at most 1 when passed).
    pub max_error_ratio: f64,
}

/// A failure of the harness, not of the candidate.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// No seed could be drawn from the OS.
    #[error("no seed from the OS: {0}")]
    Seed(String),
    /// The task's reference failed on its own inputs (a broken task file).
    #[error("reference of task {task} failed: {error}")]
    Reference {
        /// The task.
        task: String,
        /// The interpreter's error.
        error: InterpError,
    },
    /// The task's inputs or reference do not match its signature.
    #[error("task {task}: {what}")]
    Task {
        /// The task.
        task: String,
        /// What does not match.
        what: String,
    },
    /// A host buffer could not be made or written.
    #[error(transparent)]
    Buffer(#[from] BufferError),
    /// The backend failed ([`ExecFailure::Harness`]) or broke the protocol (replaced a tensor).
    #[error("execution backend: {0}")]
    Backend(String),
}

/// Why [`check`] did not pass a candidate.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The candidate failed; this is its outcome (wrong, crash, timeout, launch error,
    /// unsupported).
    #[error("{}", .0.feedback())]
    Candidate(Outcome),
    /// The harness could not run the protocol; the candidate was not judged.
    #[error(transparent)]
    Harness(#[from] HarnessError),
}

impl CheckError {
    /// The candidate's outcome, or the harness error when the candidate was not judged.
    pub fn into_outcome(self) -> Result<Outcome, HarnessError> {
        match self {
            CheckError::Candidate(outcome) => Ok(outcome),
            CheckError::Harness(e) => Err(e),
        }
    }
}

/// Whether `got` is within `tol` of `want`: `|got - want| <= atol + rtol * |want|`.
pub fn within(got: f64, want: f64, tol: Tolerance) -> bool {
    (got - want).abs() <= tol.atol + tol.rtol * want.abs()
}

/// The protocol's primitive steps on one backend's buffers. [`run_protocol`] drives them in the
/// protocol's order and makes every verdict, so backends differ only in where the data lives:
/// [`HostTrials`] keeps it in guard-paged host buffers (the CPU backend), the GPU worker keeps it
/// in device memory and compares there.
pub trait Trials {
    /// Prepares a trial on fresh inputs drawn from `seed`: inputs written, the reference computed
    /// (before any candidate run, out of the candidate's reach) and copies of the inputs taken.
    fn begin(&mut self, seed: u64) -> Result<(), HarnessError>;
    /// Fills every output with its NaN pattern and runs the candidate once.
    fn run_candidate(&mut self) -> Result<(), ExecFailure>;
    /// Why the run tampered with memory it must not change (an input differs from its copy, a
    /// buffer's slack was overwritten), or `None`.
    fn tampering(&mut self) -> Result<Option<String>, HarnessError>;
    /// Every output compared with its reference, in signature order.
    fn compare(&mut self) -> Result<Vec<OutputComparison>, HarnessError>;
}

/// Runs the correctness protocol (see the module documentation) on `task` at `preset` with the
/// candidate behind `exec`, on host buffers, against the fp64 interpreter.
pub fn check(
    task: &Task,
    preset: Preset,
    exec: &mut dyn Executor,
    cfg: &ProtocolConfig,
) -> Result<CorrectnessReport, CheckError> {
    let mut trials = HostTrials::new(task, preset, exec)?;
    run_protocol(&mut trials, cfg)
}

/// The protocol itself: `cfg.trials` trials on OS-seeded inputs (or derived from the fixed test
/// seed), each run twice; the first tampering or mismatch is the candidate's outcome.
pub fn run_protocol(
    trials: &mut dyn Trials,
    cfg: &ProtocolConfig,
) -> Result<CorrectnessReport, CheckError> {
    let n = cfg.trials.max(1);
    let mut report = CorrectnessReport {
        trials: n,
        runs: 0,
        seeds: Vec::with_capacity(n as usize),
        max_error_ratio: 0.0,
    };
    for trial in 0..n {
        let seed = match cfg.seed {
            Some(base) => SplitMix64::derive(base, trial as u64).next_u64(),
            None => os_seed().map_err(|e| HarnessError::Seed(e.to_string()))?,
        };
        report.seeds.push(seed);
        trials.begin(seed)?;
        for run in 0..2 {
            trials.run_candidate().map_err(failure_outcome)?;
            report.runs += 1;
            if let Some(reason) = trials.tampering()? {
                return Err(wrong(reason, None));
            }
            for out in trials.compare()? {
                let cmp = &out.cmp;
                report.max_error_ratio = report.max_error_ratio.max(cmp.max_ratio);
                if let Some(first) = &cmp.first {
                    let inner = first.reason(&out.name, out.dtype);
                    let reason = if run == 0 { inner } else { race_reason(&inner) };
                    let mismatch = Mismatch {
                        output: out.name.clone(),
                        index: first.index as u64,
                        expected: first.want,
                        got: first.got,
                        mismatches: cmp.count,
                        trial,
                    };
                    return Err(wrong(reason, Some(mismatch)));
                }
            }
        }
    }
    Ok(report)
}

/// [`Trials`] on guard-paged host buffers against the fp64 interpreter: what the CPU backend
/// (and any executor that copies host buffers to a device and back) runs.
pub struct HostTrials<'a> {
    task: &'a Task,
    preset: Preset,
    exec: &'a mut dyn Executor,
    specs: Vec<crate::tasks::TensorSpec>,
    tensors: Vec<TensorBuf>,
    n_inputs: usize,
    reference: Vec<Vec<f64>>,
    snapshots: Vec<Vec<u8>>,
}

impl<'a> HostTrials<'a> {
    /// Allocates the task's tensors at `preset`.
    pub fn new(
        task: &'a Task,
        preset: Preset,
        exec: &'a mut dyn Executor,
    ) -> Result<Self, HarnessError> {
        let specs = task.signature(preset).tensors;
        let tensors = specs
            .iter()
            .map(|t| exec.alloc(&t.name, t.dtype, t.numel()))
            .collect::<Result<Vec<_>, _>>()?;
        let n_inputs = specs.iter().filter(|t| t.role == Role::Input).count();
        Ok(HostTrials {
            task,
            preset,
            exec,
            specs,
            tensors,
            n_inputs,
            reference: Vec::new(),
            snapshots: Vec::new(),
        })
    }

    fn task_error(&self, what: String) -> HarnessError {
        HarnessError::Task {
            task: self.task.name.clone(),
            what,
        }
    }
}

impl Trials for HostTrials<'_> {
    fn begin(&mut self, seed: u64) -> Result<(), HarnessError> {
        let n_inputs = self.n_inputs;
        let inputs = self.task.generate_inputs(self.preset, seed);
        let reference =
            self.task
                .reference(self.preset, &inputs)
                .map_err(|error| HarnessError::Reference {
                    task: self.task.name.clone(),
                    error,
                })?;
        if inputs.len() != n_inputs || reference.len() != self.tensors.len() - n_inputs {
            return Err(self.task_error(format!(
                "{} inputs and {} outputs generated for a signature of {} tensors",
                inputs.len(),
                reference.len(),
                self.tensors.len()
            )));
        }
        for (t, values) in self.tensors.iter_mut().zip(&inputs) {
            t.write_f64(values)?;
        }
        for (t, want) in self.tensors[n_inputs..].iter().zip(&reference) {
            if want.len() != t.numel() {
                return Err(self.task_error(format!(
                    "reference {} has {} values",
                    t.name(),
                    want.len()
                )));
            }
        }
        self.snapshots = self.tensors[..n_inputs]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
        self.reference = reference;
        Ok(())
    }

    fn run_candidate(&mut self) -> Result<(), ExecFailure> {
        self.tensors[self.n_inputs..]
            .iter_mut()
            .for_each(TensorBuf::fill_nan);
        self.exec.run(&mut self.tensors)
    }

    fn tampering(&mut self) -> Result<Option<String>, HarnessError> {
        check_layout(&self.tensors, &self.specs)?;
        if let Some(reason) = modified_input(&self.tensors[..self.n_inputs], &self.snapshots) {
            return Ok(Some(reason));
        }
        Ok(self
            .tensors
            .iter()
            .find(|t| !t.buffer().slack_intact())
            .map(|t| format!("the kernel wrote past the end of {}", t.name()))
            .or_else(|| self.exec.tampering()))
    }

    fn compare(&mut self) -> Result<Vec<OutputComparison>, HarnessError> {
        let tol = self.task.tolerance;
        Ok(self.tensors[self.n_inputs..]
            .iter()
            .zip(&self.reference)
            .map(|(t, want)| OutputComparison {
                name: t.name().to_string(),
                dtype: t.dtype(),
                cmp: compare(t, want, tol),
            })
            .collect())
    }
}

/// The reason for a failure on the second run after the first passed.
fn race_reason(inner: &str) -> String {
    const RACE: &str =
        "results differ between two runs on the same inputs (a race or an uninitialised read?)";
    if inner == VALUES_DIFFER {
        RACE.to_string()
    } else {
        format!("{RACE}: on the second run, {inner}")
    }
}

const VALUES_DIFFER: &str = "values differ";

fn wrong(reason: String, mismatch: Option<Mismatch>) -> CheckError {
    CheckError::Candidate(Outcome::Wrong { reason, mismatch })
}

/// The outcome of a candidate's execution failure in the verify stage (or the harness error of
/// the backend's own failure).
fn failure_outcome(f: ExecFailure) -> CheckError {
    match f.into_outcome("verify") {
        Ok(outcome) => CheckError::Candidate(outcome),
        Err(what) => CheckError::Harness(HarnessError::Backend(what)),
    }
}

/// The executor must hand back the tensors it was given (same names, dtypes, sizes).
fn check_layout(
    tensors: &[TensorBuf],
    specs: &[crate::tasks::TensorSpec],
) -> Result<(), HarnessError> {
    let same = tensors.len() == specs.len()
        && tensors
            .iter()
            .zip(specs)
            .all(|(t, s)| t.name() == s.name && t.dtype() == s.dtype && t.numel() == s.numel());
    if same {
        Ok(())
    } else {
        Err(HarnessError::Backend(
            "the executor replaced or resized a task tensor".into(),
        ))
    }
}

/// "input A was modified (index 3: 1.5 -> 0)" for the first input whose bytes changed.
fn modified_input(inputs: &[TensorBuf], snapshots: &[Vec<u8>]) -> Option<String> {
    inputs.iter().zip(snapshots).find_map(|(t, before)| {
        let pos = t.as_bytes().iter().zip(before).position(|(a, b)| a != b)?;
        let size = dtype_size(t.dtype());
        let index = pos / size;
        let name = t.name();
        let now = t.get_f64(index).unwrap_or(f64::NAN);
        // Decode the original element through a one-element tensor of the same dtype.
        let was = TensorBuf::new("", t.dtype(), 1).ok().and_then(|mut one| {
            one.as_bytes_mut()
                .copy_from_slice(before.get(index * size..(index + 1) * size)?);
            one.get_f64(0)
        });
        Some(match was {
            Some(was) => format!("input {name} was modified (index {index}: {was} -> {now})"),
            None => format!("input {name} was modified (index {index})"),
        })
    })
}

/// Why one output element failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemFailure {
    /// Still the NaN (or i64 sentinel) fill.
    Unwritten,
    /// NaN or Inf where the reference is finite.
    NonFinite,
    /// Out of tolerance (or a different index, for i64).
    Differs,
}

/// The first failing element of an output.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstFailure {
    /// Its flat index.
    pub index: usize,
    /// The reference value.
    pub want: f64,
    /// The candidate's value (NaN when unwritten).
    pub got: f64,
    /// Why it failed.
    pub kind: ElemFailure,
}

impl FirstFailure {
    /// The failure's reason text for output `name` of `dtype`.
    pub fn reason(&self, name: &str, dtype: Dtype) -> String {
        let i = self.index;
        match self.kind {
            ElemFailure::Unwritten if dtype == Dtype::I64 => {
                format!(
                    "output {name} was not fully written (fill value i64::MIN left at index {i})"
                )
            }
            ElemFailure::Unwritten => {
                format!("output {name} was not fully written (NaN left at index {i})")
            }
            ElemFailure::NonFinite => {
                let what = if self.got.is_nan() { "NaN" } else { "Inf" };
                format!("output {name} has {what} where the reference is finite (index {i})")
            }
            ElemFailure::Differs => VALUES_DIFFER.to_string(),
        }
    }
}

/// One output compared with its reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The first failing element, if any.
    pub first: Option<FirstFailure>,
    /// How many elements failed.
    pub count: u64,
    /// Largest error / bound over the passing finite elements.
    pub max_ratio: f64,
}

/// A [`Comparison`] with the output it is about.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputComparison {
    /// The output's name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// The comparison.
    pub cmp: Comparison,
}

/// Judges one element; `fill` is true when it still holds the fill pattern. (The GPU's compare
/// kernel applies the same rule on the device; the first failure it finds is judged here again.)
pub fn judge(dtype: Dtype, got: f64, fill: bool, want: f64, tol: Tolerance) -> Option<ElemFailure> {
    if fill {
        return Some(ElemFailure::Unwritten);
    }
    if dtype == Dtype::I64 {
        return (got != want).then_some(ElemFailure::Differs);
    }
    if want.is_nan() {
        return (!got.is_nan()).then_some(ElemFailure::Differs);
    }
    if want.is_infinite() {
        return (got != want).then_some(ElemFailure::Differs);
    }
    if !got.is_finite() {
        return Some(ElemFailure::NonFinite);
    }
    (!within(got, want, tol)).then_some(ElemFailure::Differs)
}

/// Compares one output with its reference.
pub fn compare(t: &TensorBuf, want: &[f64], tol: Tolerance) -> Comparison {
    let mut cmp = Comparison {
        first: None,
        count: 0,
        max_ratio: 0.0,
    };
    let dtype = t.dtype();
    for (index, ((got, fill), &want)) in t.values().zip(want).enumerate() {
        match judge(dtype, got, fill, want, tol) {
            None => {
                if dtype != Dtype::I64 && want.is_finite() {
                    let err = (got - want).abs();
                    let bound = tol.atol + tol.rtol * want.abs();
                    let ratio = if err == 0.0 { 0.0 } else { err / bound };
                    cmp.max_ratio = cmp.max_ratio.max(ratio);
                }
            }
            Some(kind) => {
                cmp.count += 1;
                if cmp.first.is_none() {
                    let got = if kind == ElemFailure::Unwritten {
                        f64::NAN
                    } else {
                        got
                    };
                    cmp.first = Some(FirstFailure {
                        index,
                        want,
                        got,
                        kind,
                    });
                }
            }
        }
    }
    cmp
}

/// A seed from the OS's random source, which no candidate can observe or predict.
pub fn os_seed() -> std::io::Result<u64> {
    let mut bytes = [0u8; 8];
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getrandom writes at most `bytes.len()` bytes into the buffer.
        let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if n == bytes.len() as isize {
            return Ok(u64::from_ne_bytes(bytes));
        }
    }
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(u64::from_ne_bytes(bytes))
}

#[cfg(test)]
#[path = "correctness_tests.rs"]
mod tests;
