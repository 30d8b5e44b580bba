//! The timing protocol's [`Timer`] on the CPU ([`CpuTimer`]): every timed candidate run gets
//! fresh inputs and its output is checked.
//!
//! On the CPU the baseline *is* the fp64 interpreter, so each timed baseline run computes a
//! reference anyway. The timer pairs runs: the candidate's run and the baseline's run of one
//! round (the protocol interleaves them, in either order) share an input set drawn from the OS
//! for that round alone, and the candidate's output is compared with the reference the baseline
//! run produced. So a kernel that caches results by a fingerprint of its inputs never finds a
//! hit, one that counts its calls and replays stale output is wrong, and one that skips work when
//! the output is not the NaN fill always sees the fill (the outputs are refilled before every
//! run). A wrong timed output ends timing with [`ExecFailure::Wrong`]. Drawing inputs, filling
//! and comparing happen outside the timed span; the executor is frozen while they do.

use std::time::Instant;

use crate::tasks::{Preset, Role, Task};
use crate::verify::buffer::TensorBuf;
use crate::verify::correctness::{compare, os_seed, Executor};
use crate::verify::timing::{Timer, Which};
use crate::verify::ExecFailure;

use super::executor::SandboxedExecutor;

/// One round's inputs, and what is known of its two runs so far.
struct Round {
    inputs: Vec<Vec<f64>>,
    /// The candidate's outputs, kept when it ran before the baseline.
    candidate: Option<Vec<Vec<f64>>>,
    candidate_ran: bool,
    reference: Option<Vec<Vec<f64>>>,
}

/// Times the candidate (in its sandboxed executor) against the baseline (the interpreter).
pub struct CpuTimer<'a> {
    exec: &'a mut SandboxedExecutor,
    task: &'a Task,
    preset: Preset,
    tensors: Vec<TensorBuf>,
    n_inputs: usize,
    round: Option<Round>,
    /// Timed candidate runs whose output was checked.
    pub checked: u32,
}

impl<'a> CpuTimer<'a> {
    /// Allocates the task's tensors in the executor's shared memory.
    pub fn new(
        exec: &'a mut SandboxedExecutor,
        task: &'a Task,
        preset: Preset,
    ) -> Result<CpuTimer<'a>, ExecFailure> {
        let specs = task.signature(preset).tensors;
        let n_inputs = specs.iter().filter(|t| t.role == Role::Input).count();
        let tensors = specs
            .iter()
            .map(|t| exec.alloc(&t.name, t.dtype, t.numel()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        Ok(CpuTimer {
            exec,
            task,
            preset,
            tensors,
            n_inputs,
            round: None,
            checked: 0,
        })
    }

    /// A new round on fresh inputs, written into the input tensors.
    fn start_round(&mut self) -> Result<(), ExecFailure> {
        let seed = os_seed().map_err(|e| ExecFailure::Harness(format!("no OS seed: {e}")))?;
        let inputs = self.task.generate_inputs(self.preset, seed);
        for (t, values) in self.tensors.iter_mut().zip(&inputs) {
            t.write_f64(values)
                .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        }
        self.round = Some(Round {
            inputs,
            candidate: None,
            candidate_ran: false,
            reference: None,
        });
        Ok(())
    }

    /// The round for a run of `which`: the current one unless `which` already ran in it.
    fn round_for(&mut self, which: Which) -> Result<(), ExecFailure> {
        let done = match &self.round {
            None => true,
            Some(r) => match which {
                Which::Candidate => r.candidate_ran,
                Which::Baseline => r.reference.is_some(),
            },
        };
        if done {
            self.finish_round()?;
            self.start_round()?;
        }
        Ok(())
    }

    /// Checks a round whose candidate ran but whose baseline did not (the protocol ran an odd
    /// number of programs): its reference is computed untimed.
    fn finish_round(&mut self) -> Result<(), ExecFailure> {
        let Some(round) = self.round.take() else {
            return Ok(());
        };
        if let (Some(got), None) = (&round.candidate, &round.reference) {
            let want = self.reference(&round.inputs)?;
            self.judge_values(got, &want)?;
        }
        Ok(())
    }

    fn reference(&self, inputs: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, ExecFailure> {
        self.task
            .reference(self.preset, inputs)
            .map_err(|e| ExecFailure::Harness(e.to_string()))
    }

    /// Compares the output tensors (as the candidate left them) with `want`.
    fn judge_tensors(&mut self, want: &[Vec<f64>]) -> Result<(), ExecFailure> {
        let tol = self.task.tolerance;
        for (t, want) in self.tensors[self.n_inputs..].iter().zip(want) {
            if let Some(first) = compare(t, want, tol).first {
                return Err(timed_wrong(
                    &first.reason(t.name(), t.dtype()),
                    first.index,
                    first.want,
                    first.got,
                ));
            }
        }
        self.checked += 1;
        Ok(())
    }

    /// Compares saved outputs with `want`, through the output tensors' own decoding.
    fn judge_values(&mut self, got: &[Vec<f64>], want: &[Vec<f64>]) -> Result<(), ExecFailure> {
        // The saved values were read from these tensors; writing them back restores the bytes
        // (every dtype's values round-trip through f64), so one comparison serves both orders.
        for (t, values) in self.tensors[self.n_inputs..].iter_mut().zip(got) {
            t.write_f64(values)
                .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        }
        self.judge_tensors(want)
    }

    fn run_candidate(&mut self) -> Result<f64, ExecFailure> {
        self.tensors[self.n_inputs..]
            .iter_mut()
            .for_each(TensorBuf::fill_nan);
        let elapsed = self.exec.run_timed(&mut self.tensors)?;
        if let Some(reason) = self
            .tensors
            .iter()
            .find(|t| !t.buffer().slack_intact())
            .map(|t| format!("a timed run wrote past the end of {}", t.name()))
            .or_else(|| self.exec.tampering())
        {
            return Err(ExecFailure::Wrong(reason));
        }
        let round = self.round.as_mut().expect("round_for made one");
        round.candidate_ran = true;
        match round.reference.take() {
            Some(want) => {
                let checked = self.judge_tensors(&want);
                if let Some(r) = self.round.as_mut() {
                    r.reference = Some(want);
                }
                checked?;
            }
            None => {
                let saved = self.tensors[self.n_inputs..]
                    .iter()
                    .map(TensorBuf::read_f64)
                    .collect();
                round.candidate = Some(saved);
            }
        }
        Ok(elapsed.as_secs_f64() * 1e3)
    }

    fn run_baseline(&mut self) -> Result<f64, ExecFailure> {
        let round = self.round.as_ref().expect("round_for made one");
        let t0 = Instant::now();
        let want = self.reference(&round.inputs)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let saved = self.round.as_mut().and_then(|r| r.candidate.take());
        if let Some(got) = saved {
            self.judge_values(&got, &want)?;
        }
        if let Some(r) = self.round.as_mut() {
            r.reference = Some(want);
        }
        Ok(ms)
    }

    /// Checks the last round if it is still open (call after timing).
    pub fn finish(&mut self) -> Result<(), ExecFailure> {
        self.finish_round()
    }
}

fn timed_wrong(inner: &str, index: usize, want: f64, got: f64) -> ExecFailure {
    ExecFailure::Wrong(format!(
        "the output of a timed run is wrong: {inner} (index {index}: expected {want}, got {got}); \
         every timed run has fresh inputs and is checked"
    ))
}

impl Timer for CpuTimer<'_> {
    fn time_once(&mut self, which: Which) -> Result<f64, ExecFailure> {
        self.round_for(which)?;
        match which {
            Which::Candidate => self.run_candidate(),
            Which::Baseline => self.run_baseline(),
        }
    }
}
