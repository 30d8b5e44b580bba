//! The optimizer both trainers (RL, [`crate::train`], and the warm start, [`crate::sft`]) step
//! with: burn's AdamW with PyTorch's hyper-parameters, the linear warm-up, the clipped step, and
//! the optimizer state on disk keyed by parameter path.
//!
//! # Optimizer state on disk
//!
//! burn keys optimizer state by `ParamId`, a random id given to each parameter when a module is
//! built, so a model loaded from a Hugging Face checkpoint in a new process has different ids.
//! [`OptimizedModel::save`] therefore re-keys the state by the parameter's position in the
//! module's visiting order and stores the parameter paths and shapes beside it;
//! [`OptimizedModel::load`] checks them against the current model (naming the first parameter
//! that differs) and maps the state back onto the current ids.

use std::collections::HashMap;
use std::path::Path;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use crate::grad_norm::clip_global_grad_norm;

/// File (without the extension the recorder adds, `.mpk`) that holds the optimizer state.
pub const OPTIMIZER_FILE: &str = "learner_optimizer";

/// The optimizer: burn's AdamW behind its per-parameter adaptor.
pub type AdamWOptimizer<M, B> = OptimizerAdaptor<AdamW, M, B>;

type OptimRecord<M, B> = <AdamWOptimizer<M, B> as Optimizer<M, B>>::Record;

/// What is saved: optimizer state keyed by parameter position, learner version, optimizer steps
/// taken, parameter paths, parameter shapes.
type SavedState<M, B> = (OptimRecord<M, B>, u64, u64, Vec<String>, Vec<Vec<usize>>);

/// A setting a trainer cannot work with: its key, its value and what is allowed. Both trainers'
/// `validate` check their settings with [`reject_if`]; their errors add whose setting it is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key} = {value}: {reason}")]
pub struct InvalidSetting {
    /// The setting's key (a config key or a flag).
    pub key: &'static str,
    /// Its value.
    pub value: String,
    /// What is allowed.
    pub reason: &'static str,
}

/// `Err` naming `key`, `value` and `reason` when `bad`, else `Ok`.
pub fn reject_if(
    bad: bool,
    key: &'static str,
    value: f64,
    reason: &'static str,
) -> Result<(), InvalidSetting> {
    if bad {
        Err(InvalidSetting {
            key,
            value: value.to_string(),
            reason,
        })
    } else {
        Ok(())
    }
}

/// AdamW's hyper-parameters (PyTorch's names and meanings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWSettings {
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// beta_1.
    pub beta_1: f64,
    /// beta_2.
    pub beta_2: f64,
    /// epsilon.
    pub epsilon: f64,
}

/// A fresh AdamW optimizer: the one both trainers (RL and [`crate::sft`]) step with.
pub fn adamw<B: AutodiffBackend, M: AutodiffModule<B>>(
    settings: &AdamWSettings,
) -> AdamWOptimizer<M, B> {
    AdamWConfig::new()
        .with_beta_1(settings.beta_1 as f32)
        .with_beta_2(settings.beta_2 as f32)
        .with_epsilon(settings.epsilon as f32)
        .with_weight_decay(settings.weight_decay as f32)
        .init()
}

/// The learning rate of optimizer step `step` (0-based): linear warm-up over `warmup_steps` steps
/// (lr/warmup, 2*lr/warmup, ..., lr), then constant.
pub fn warmup_lr(lr: f64, warmup_steps: u64, step: u64) -> f64 {
    if warmup_steps == 0 {
        return lr;
    }
    lr * ((step + 1) as f64 / warmup_steps as f64).min(1.0)
}

/// One optimizer step: clips the global gradient norm to `max_norm`, then steps `model` at `lr`.
/// Returns the norm before clipping, or, when it is NaN or infinite, `Err(norm)` with the model
/// untouched: a step on such gradients would destroy the weights.
///
/// `model` is `Some` on entry and on return; it is taken for the step, which consumes the
/// module, so that no second handle keeps the old weights alive.
pub fn clipped_step<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &mut Option<M>,
    optimizer: &mut AdamWOptimizer<M, B>,
    grads: GradientsParams,
    max_norm: f64,
    lr: f64,
) -> Result<f64, f64> {
    let current = model
        .take()
        .expect("the model is only taken during an optimizer step");
    let (grads, norm) = clip_global_grad_norm(&current, grads, max_norm);
    if !norm.is_finite() {
        *model = Some(current);
        return Err(norm);
    }
    *model = Some(optimizer.step(lr, current, grads));
    Ok(norm)
}

/// A model being trained, its AdamW state and the optimizer steps taken: what both trainers
/// hold.
pub(crate) struct OptimizedModel<B: AutodiffBackend, M: AutodiffModule<B>> {
    /// Always `Some` between calls; taken for the duration of an optimizer step, which consumes
    /// the module, so that no second handle keeps the old weights alive.
    model: Option<M>,
    optimizer: AdamWOptimizer<M, B>,
    settings: AdamWSettings,
    steps: u64,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> OptimizedModel<B, M> {
    /// `model` with fresh optimizer state, no step taken.
    pub(crate) fn new(model: M, settings: AdamWSettings) -> Self {
        OptimizedModel {
            model: Some(model),
            optimizer: adamw(&settings),
            settings,
            steps: 0,
        }
    }

    /// The model being trained.
    pub(crate) fn model(&self) -> &M {
        self.model
            .as_ref()
            .expect("the model is only taken during an optimizer step")
    }

    /// The trained model.
    pub(crate) fn into_model(self) -> M {
        self.model
            .expect("the model is only taken during an optimizer step")
    }

    /// Optimizer steps taken.
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    /// One [`clipped_step`] at `lr`; counts the step when it is taken. `Err(norm)` when the norm
    /// is NaN or infinite (no step, not counted).
    pub(crate) fn step(
        &mut self,
        grads: GradientsParams,
        max_norm: f64,
        lr: f64,
    ) -> Result<f64, f64> {
        let norm = clipped_step(&mut self.model, &mut self.optimizer, grads, max_norm, lr)?;
        self.steps += 1;
        Ok(norm)
    }

    /// Writes the optimizer state, `version` and the optimizer-step counter to `path` (the
    /// recorder adds `.mpk`). The error is the reason, for the caller to name the file.
    pub(crate) fn save(&self, path: &Path, version: u64) -> Result<(), String> {
        let table = param_table::<B, M>(self.model());
        let position: HashMap<ParamId, usize> = table
            .iter()
            .enumerate()
            .map(|(i, (id, _, _))| (*id, i))
            .collect();
        let mut state: OptimRecord<M, B> = Default::default();
        for (id, record) in self.optimizer.to_record() {
            let i = position.get(&id).ok_or_else(|| {
                format!(
                    "the optimizer holds state for parameter {id}, which the model does not have"
                )
            })?;
            state.insert(ParamId::from(*i as u64), record);
        }
        let paths = table.iter().map(|(_, p, _)| p.clone()).collect();
        let shapes = table.iter().map(|(_, _, s)| s.clone()).collect();
        let saved: SavedState<M, B> = (state, version, self.steps, paths, shapes);
        Recorder::<B>::record(
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            saved,
            path.to_path_buf(),
        )
        .map_err(|e| e.to_string())
    }

    /// Restores what [`OptimizedModel::save`] wrote onto the current model, whose parameter
    /// paths and shapes must match those saved, reading it onto `device`; returns the saved
    /// version.
    pub(crate) fn load(&mut self, path: &Path, device: &B::Device) -> Result<u64, String> {
        let (state, version, steps, paths, shapes): SavedState<M, B> = Recorder::<B>::load(
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            path.to_path_buf(),
            device,
        )
        .map_err(|e| e.to_string())?;
        let table = param_table::<B, M>(self.model());
        if paths.len() != table.len() || shapes.len() != table.len() {
            return Err(format!(
                "saved for a model of {} parameters, this model has {}",
                paths.len(),
                table.len()
            ));
        }
        for (i, (_, path, shape)) in table.iter().enumerate() {
            if &paths[i] != path || &shapes[i] != shape {
                return Err(format!(
                    "parameter {i} was saved as {} {:?}, the model has {} {:?}",
                    paths[i], shapes[i], path, shape
                ));
            }
        }
        let mut rekeyed: OptimRecord<M, B> = Default::default();
        for (position, record) in state {
            let i = position.val() as usize;
            let (id, _, _) = table.get(i).ok_or_else(|| {
                format!(
                    "state for parameter position {i}, the model has {}",
                    table.len()
                )
            })?;
            rekeyed.insert(*id, record);
        }
        self.optimizer = adamw(&self.settings).load_record(rekeyed);
        self.steps = steps;
        Ok(version)
    }
}

/// The parameters of a module in visiting order: id, dotted path, shape.
#[derive(Default)]
struct ParamTable {
    path: Vec<String>,
    entries: Vec<(ParamId, String, Vec<usize>)>,
}

impl<B: Backend> ModuleVisitor<B> for ParamTable {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.entries
            .push((param.id, self.path.join("."), param.dims().to_vec()));
    }
}

/// The parameters of `module` in visiting order: id, dotted path, shape.
pub(crate) fn param_table<B: Backend, M: Module<B>>(
    module: &M,
) -> Vec<(ParamId, String, Vec<usize>)> {
    let mut table = ParamTable::default();
    module.visit(&mut table);
    table.entries
}
