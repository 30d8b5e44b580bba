//! Test doubles of execution backends for the correctness protocol: correct executors (the fp64
//! interpreter, or hand-written Rust "kernels" for relu and a row sum) and a wrapper that breaks a
//! correct executor in one chosen way.

use crate::tasks::{Preset, Task};

use super::buffer::TensorBuf;
use super::correctness::Executor;
use super::ExecFailure;

/// Correct executor double: reads the input buffers and writes the fp64 interpreter's outputs
/// (rounded to each output's dtype). Works for every task.
pub struct InterpreterExecDouble {
    pub task: Task,
    pub preset: Preset,
}

impl Executor for InterpreterExecDouble {
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        let n_inputs = self.task.program.inputs.len();
        let inputs: Vec<Vec<f64>> = tensors[..n_inputs]
            .iter()
            .map(TensorBuf::read_f64)
            .collect();
        let outputs = self
            .task
            .reference(self.preset, &inputs)
            .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        for (t, values) in tensors[n_inputs..].iter_mut().zip(&outputs) {
            t.write_f64(values)
                .map_err(|e| ExecFailure::Harness(e.to_string()))?;
        }
        Ok(())
    }
}

/// Correct executor double for `relu` (X: f32[M, N] -> Y), written as a CPU "kernel".
pub struct ReluKernelDouble;

impl Executor for ReluKernelDouble {
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        let [x, y] = tensors else {
            return Err(ExecFailure::Launch("relu takes two tensors".into()));
        };
        let x = x.as_f32().map_err(|e| ExecFailure::Launch(e.to_string()))?;
        let y = y
            .as_f32_mut()
            .map_err(|e| ExecFailure::Launch(e.to_string()))?;
        y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.max(0.0));
        Ok(())
    }
}

/// Correct executor double for `sum_reduce` (X: f32[B, M, N] -> Y: f32[B, N], sum over M),
/// accumulating in f32 as a kernel would; the sizes are given.
pub struct SumReduceKernelDouble {
    pub b: usize,
    pub m: usize,
    pub n: usize,
}

impl Executor for SumReduceKernelDouble {
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        let [x, y] = tensors else {
            return Err(ExecFailure::Launch("sum_reduce takes two tensors".into()));
        };
        let x = x.as_f32().map_err(|e| ExecFailure::Launch(e.to_string()))?;
        let y = y
            .as_f32_mut()
            .map_err(|e| ExecFailure::Launch(e.to_string()))?;
        let (m, n) = (self.m, self.n);
        for b in 0..self.b {
            for j in 0..n {
                y[b * n + j] = (0..m).map(|i| x[(b * m + i) * n + j]).sum();
            }
        }
        Ok(())
    }
}

/// What [`TamperExecDouble`] does after (or instead of) the correct run.
pub type Tamper = Box<dyn FnMut(Call, &mut [TensorBuf]) -> Result<(), ExecFailure>>;

/// Which call of the executor this is.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// 0-based count of all calls so far (two per trial).
    pub index: u32,
}

impl Call {
    /// The trial of this call.
    pub fn trial(self) -> u32 {
        self.index / 2
    }

    /// True on the second run of a trial.
    pub fn second_run(self) -> bool {
        self.index % 2 == 1
    }
}

/// Executor double that runs a correct executor, then applies a tamper to the tensors: one
/// element off, part of the output unwritten, an input clobbered, a race, an Inf, a failure.
pub struct TamperExecDouble {
    pub inner: Box<dyn Executor>,
    pub tamper: Tamper,
    pub calls: u32,
}

impl TamperExecDouble {
    pub fn new(
        inner: impl Executor + 'static,
        tamper: impl FnMut(Call, &mut [TensorBuf]) -> Result<(), ExecFailure> + 'static,
    ) -> Self {
        TamperExecDouble {
            inner: Box::new(inner),
            tamper: Box::new(tamper),
            calls: 0,
        }
    }
}

impl Executor for TamperExecDouble {
    fn run(&mut self, tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        let call = Call { index: self.calls };
        self.calls += 1;
        self.inner.run(tensors)?;
        (self.tamper)(call, tensors)
    }
}

/// Executor double that fails every run with `failure`.
pub struct FailingExecDouble(pub ExecFailure);

impl Executor for FailingExecDouble {
    fn run(&mut self, _tensors: &mut [TensorBuf]) -> Result<(), ExecFailure> {
        Err(self.0.clone())
    }
}
