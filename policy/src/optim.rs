//! The optimizer both trainers (RL, [`crate::train`], and the warm start, [`crate::sft`]) step
//! with: AdamW with PyTorch's hyper-parameters and f32 state, the linear warm-up, the clipped
//! step, and the optimizer state on disk.
//!
//! # AdamW with f32 state
//!
//! [`AdamW`] keeps each parameter's first and second moments in f32 and, for a parameter that is
//! not f32 (a bf16 model's), an f32 master copy of its weights: the step is taken on the master
//! and the parameter becomes its rounding. A bf16 parameter alone loses every update smaller than
//! half its last bit, which at RL's learning rates is most of them. The step is PyTorch's AdamW
//! (decoupled weight decay, bias-corrected moments) with the global norm's clip applied to the
//! gradient inside it: one kernel launch for every parameter of a step on burn's CUDA backend
//! ([`crate::norm::adamw_many`], with the norms' switch; the moments and masters updated in
//! place), burn's ops elsewhere. It replaced burn's `AdamW`, whose state is in
//! the model's dtype and which launches several kernels a parameter after the clip's own.
//!
//! # Optimizer state on disk
//!
//! [`OPTIMIZER_FILE`], a safetensors file: for each parameter (by its dotted path) `PATH.exp_avg`,
//! `PATH.exp_avg_sq` and, when it has one, `PATH.master`, f32 in burn's layout (a linear weight
//! is `[in, out]`), and a metadata entry `kevin`: JSON with the learner version, the optimizer
//! steps taken, and each parameter's path, shape and steps. burn's `ParamId`s are random per
//! process, so the state is matched to the model by position in the module's visiting order;
//! [`OptimizedModel::load`] checks paths and shapes first, naming the first parameter that
//! differs. Run directories of kevin before this format hold [`LEGACY_OPTIMIZER_FILE`] (burn's
//! AdamW record, keyed the same way); it is read when the safetensors file is absent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, FloatDType, Tensor};
use safetensors::{Dtype, SafeTensors};

use crate::checkpoint::{decode, encoded, Encoded};
use crate::grad_norm::{clip_factor, global_grad_norm};
use crate::norm::AdamStep;
use crate::SaveDtype;

/// The file in a run directory that holds the optimizer state.
pub const OPTIMIZER_FILE: &str = "learner_optimizer.safetensors";

/// The file earlier kevins wrote the optimizer state to (burn's AdamW record, MessagePack); read
/// when [`OPTIMIZER_FILE`] is absent.
pub const LEGACY_OPTIMIZER_FILE: &str = "learner_optimizer.mpk";

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

/// One parameter's AdamW state: steps taken, f32 moments and, for a parameter that is not f32,
/// its f32 weights once it has stepped. All `[n]`, the parameter flattened.
#[derive(Clone)]
struct Slot<B: Backend> {
    time: u64,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    master: Option<Tensor<B, 1>>,
}

/// AdamW (PyTorch's) with f32 moments and f32 master weights, its state kept by parameter
/// position (see the module's docs). `B` is the backend the parameters' values live on (the
/// autodiff backend's inner one).
#[derive(Clone)]
pub struct AdamW<B: Backend> {
    settings: AdamWSettings,
    slots: Vec<Option<Slot<B>>>,
}

impl<B: Backend> AdamW<B> {
    /// No state: each parameter's starts at its first step.
    pub fn new(settings: AdamWSettings) -> Self {
        AdamW {
            settings,
            slots: Vec::new(),
        }
    }

    /// The steps of the parameters at these positions, each `(position, param [n], grad [n])`
    /// (the gradient in the parameter's dtype) times `scale`, at learning rate `lr`: the new
    /// parameters, with their positions. On burn's CUDA backend one kernel launch steps them all
    /// ([`crate::norm::adamw_many`]), the moments and f32 masters updated in place.
    pub fn update_many(
        &mut self,
        items: Vec<(usize, Tensor<B, 1>, Tensor<B, 1>)>,
        lr: f64,
        scale: f64,
    ) -> Vec<(usize, Tensor<B, 1>)> {
        let mut kept = Vec::with_capacity(items.len());
        let mut operands = Vec::with_capacity(items.len());
        let mut steps = Vec::with_capacity(items.len());
        for (position, param, grad) in items {
            if self.slots.len() <= position {
                self.slots.resize(position + 1, None);
            }
            let dtype = param.dtype();
            let slot = self.slots[position].take().unwrap_or_else(|| {
                let zeros = || Tensor::zeros(param.dims(), (&param.device(), DType::F32));
                Slot {
                    time: 0,
                    m: zeros(),
                    v: zeros(),
                    master: None,
                }
            });
            let time = slot.time + 1;
            steps.push(AdamStep::at(&self.settings, lr, time, scale));
            // An f32 parameter is its own master; another starts from its own values where no
            // master was kept (its first step, or state of an earlier kevin).
            let w = match (dtype, slot.master) {
                (DType::F32, _) => param,
                (_, Some(master)) => master,
                (_, None) => param.cast(FloatDType::F32),
            };
            operands.push([grad, w, slot.m, slot.v]);
            kept.push((position, dtype, time));
        }
        let outs = match crate::norm::adamw_many(operands, steps.clone()) {
            Ok(outs) => outs,
            Err(operands) => operands
                .into_iter()
                .zip(steps)
                .map(|([g, w, m, v], step)| reference_step(g, w, m, v, step))
                .collect(),
        };
        kept.into_iter()
            .zip(outs)
            .map(|((position, dtype, time), (w, m, v, rounded))| {
                let (param, master) = match dtype {
                    DType::F32 => (w, None),
                    _ => (rounded.unwrap_or_else(|| w.clone().cast(dtype)), Some(w)),
                };
                self.slots[position] = Some(Slot { time, m, v, master });
                (position, param)
            })
            .collect()
    }
}

/// What [`AdamW`] keeps for a model whose parameters are `dtype`, in words.
pub fn state_precision(dtype: DType) -> String {
    match dtype {
        DType::F32 => "f32 weights, f32 AdamW moments".to_string(),
        d => format!("{d:?} weights, f32 master weights and AdamW moments"),
    }
}

/// [`AdamW::update`]'s arithmetic in burn's ops, the reference of [`crate::norm::adamw`] (and
/// its path off CUDA): the f32 weights, moments and, for a gradient not in f32, the weights
/// rounded to its dtype.
pub fn reference_step<B: Backend>(
    g: Tensor<B, 1>,
    w: Tensor<B, 1>,
    m: Tensor<B, 1>,
    v: Tensor<B, 1>,
    s: AdamStep,
) -> crate::norm::AdamOut<B> {
    let dtype = g.dtype();
    let mut g = g.cast(FloatDType::F32);
    if s.scale != 1.0 {
        g = g.mul_scalar(s.scale);
    }
    let m = m
        .mul_scalar(s.beta_1)
        .add(g.clone().mul_scalar(1.0 - s.beta_1));
    let v = v
        .mul_scalar(s.beta_2)
        .add(g.square().mul_scalar(1.0 - s.beta_2));
    let delta = m
        .clone()
        .mul_scalar(s.c1)
        .div(v.clone().mul_scalar(s.c2).sqrt().add_scalar(s.eps));
    let decayed = if s.decay == 1.0 {
        w
    } else {
        w.mul_scalar(s.decay)
    };
    let w = decayed.sub(delta.mul_scalar(s.lr));
    let rounded = (dtype != DType::F32).then(|| w.clone().cast(dtype));
    (w, m, v, rounded)
}

/// Every parameter that has a gradient, in visiting order: its position, its values and its
/// gradient (taken out of the gradients), both flattened.
struct Collect<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    position: usize,
    found: Vec<(
        usize,
        Tensor<B::InnerBackend, 1>,
        Tensor<B::InnerBackend, 1>,
    )>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let position = self.position;
        self.position += 1;
        if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let inner = param.val().inner();
            let n = inner.shape().num_elements();
            self.found
                .push((position, inner.reshape([n]), grad.reshape([n])));
        }
    }
}

/// Puts each stepped parameter (by position, flattened) in its place, in visiting order.
struct Stepped<B: AutodiffBackend> {
    stepped: Vec<Option<Tensor<B::InnerBackend, 1>>>,
    position: usize,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Stepped<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let position = self.position;
        self.position += 1;
        let Some(new) = self.stepped.get_mut(position).and_then(Option::take) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let tracked = tensor.is_require_grad();
        let mut tensor = Tensor::from_inner(new.reshape(tensor.dims()));
        if tracked {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Replaces every parameter that has an f32 master ([`AdamW`]'s, for a model not in f32) by
/// that master, in visiting order: the weights the optimizer steps, not their rounding.
struct Masters<'a, B: Backend> {
    slots: &'a [Option<Slot<B>>],
    position: usize,
}

impl<B: AutodiffBackend> ModuleMapper<B> for Masters<'_, B::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let position = self.position;
        self.position += 1;
        let master = self
            .slots
            .get(position)
            .and_then(Option::as_ref)
            .and_then(|s| s.master.clone());
        let Some(master) = master else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let full = Tensor::from_inner(master.reshape(tensor.dims()));
        Param::from_mapped_value(id, full, mapper)
    }
}

/// One optimizer step: clips the global gradient norm to `max_norm` (every gradient scaled by
/// one factor, inside AdamW's step), then steps `model` at `lr`. Returns the norm before
/// clipping, or, when it is NaN or infinite, `Err(norm)` with the model untouched: a step on
/// such gradients would destroy the weights.
pub fn clipped_step<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: M,
    adamw: &mut AdamW<B::InnerBackend>,
    mut grads: GradientsParams,
    max_norm: f64,
    lr: f64,
) -> (M, Result<f64, f64>) {
    let started = std::time::Instant::now();
    let norm = global_grad_norm::<B, M>(&model, &grads);
    let norm_ms = started.elapsed().as_secs_f64() * 1e3;
    if !norm.is_finite() {
        return (model, Err(norm));
    }
    let mut collect = Collect::<B> {
        grads: &mut grads,
        position: 0,
        found: Vec::new(),
    };
    model.visit(&mut collect);
    let collected = std::time::Instant::now();
    let (parameters, positions) = (collect.found.len(), collect.position);
    let mut stepped = vec![None; positions];
    for (position, param) in adamw.update_many(collect.found, lr, clip_factor(norm, max_norm)) {
        stepped[position] = Some(param);
    }
    let updated = std::time::Instant::now();
    let stepped = model.map(&mut Stepped::<B> {
        stepped,
        position: 0,
    });
    // The norm's wait includes every queued kernel of the backward pass; the steps are queued,
    // not waited for (host time: where it exceeds their GPU time, launches set the pace). The
    // queuing's three parts: taking each parameter and gradient out (flattened), AdamW's call
    // (its launch and table), putting the new parameters in place.
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    tracing::debug!(
        norm_ms,
        steps_queued_ms = ms(started.elapsed()) - norm_ms,
        collect_ms = ms(collected.duration_since(started)) - norm_ms,
        adamw_ms = ms(updated.duration_since(collected)),
        map_ms = ms(updated.elapsed()),
        parameters,
        "optimizer step"
    );
    (stepped, Ok(norm))
}

/// A model being trained, its AdamW state and the optimizer steps taken: what both trainers
/// hold.
pub(crate) struct OptimizedModel<B: AutodiffBackend, M: AutodiffModule<B>> {
    /// Always `Some` between calls; taken for the duration of an optimizer step, which consumes
    /// the module, so that no second handle keeps the old weights alive.
    model: Option<M>,
    adamw: AdamW<B::InnerBackend>,
    steps: u64,
}

/// What [`OptimizedModel::save`] writes in the safetensors metadata (key `kevin`).
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedMeta {
    version: u64,
    steps: u64,
    params: Vec<SavedParam>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SavedParam {
    path: String,
    shape: Vec<usize>,
    /// Steps taken (0: no state).
    time: u64,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> OptimizedModel<B, M> {
    /// `model` with fresh optimizer state, no step taken.
    pub(crate) fn new(model: M, settings: AdamWSettings) -> Self {
        OptimizedModel {
            model: Some(model),
            adamw: AdamW::new(settings),
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

    /// The model with the f32 master weights in place of the parameters rounded from them (a
    /// bf16 model's; an f32 model, or a parameter not stepped yet, is as it is): what a
    /// checkpoint should hold.
    pub(crate) fn full_precision(&self) -> M {
        self.model().clone().map(&mut Masters::<B::InnerBackend> {
            slots: &self.adamw.slots,
            position: 0,
        })
    }

    /// One [`clipped_step`] at `lr`; counts the step when it is taken. `Err(norm)` when the norm
    /// is NaN or infinite (no step, not counted).
    pub(crate) fn step(
        &mut self,
        grads: GradientsParams,
        max_norm: f64,
        lr: f64,
    ) -> Result<f64, f64> {
        let current = self
            .model
            .take()
            .expect("the model is only taken during an optimizer step");
        let (model, norm) = clipped_step(current, &mut self.adamw, grads, max_norm, lr);
        self.model = Some(model);
        let norm = norm?;
        self.steps += 1;
        Ok(norm)
    }

    /// Writes the optimizer state, `version` and the optimizer-step counter to `dir`'s
    /// [`OPTIMIZER_FILE`] (under a temporary name, then renamed: a crash leaves no torn file).
    /// The error names the file and the reason.
    pub(crate) fn save(&self, dir: &Path, version: u64) -> Result<(), (PathBuf, String)> {
        let path = dir.join(OPTIMIZER_FILE);
        let fail = |p: &Path, e: String| (p.to_path_buf(), e);
        let table = param_table::<B, M>(self.model());
        let mut params = Vec::with_capacity(table.len());
        let mut tensors: Vec<(String, Encoded)> = Vec::new();
        for (i, (_, name, shape)) in table.iter().enumerate() {
            let slot = self.adamw.slots.get(i).and_then(Option::as_ref);
            params.push(SavedParam {
                path: name.clone(),
                shape: shape.clone(),
                time: slot.map_or(0, |s| s.time),
            });
            let Some(slot) = slot else { continue };
            let parts = [
                ("exp_avg", Some(&slot.m)),
                ("exp_avg_sq", Some(&slot.v)),
                ("master", slot.master.as_ref()),
            ];
            for (kind, t) in parts {
                let Some(t) = t else { continue };
                let values = t
                    .clone()
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| fail(&path, format!("{name}.{kind}: {e:?}")))?;
                let t = encoded(&values, vec![values.len()], SaveDtype::F32);
                tensors.push((format!("{name}.{kind}"), t));
            }
        }
        let meta = SavedMeta {
            version,
            steps: self.steps,
            params,
        };
        let meta = serde_json::to_string(&meta).map_err(|e| fail(&path, e.to_string()))?;
        std::fs::create_dir_all(dir).map_err(|e| fail(dir, e.to_string()))?;
        let tmp = dir.join(format!("{OPTIMIZER_FILE}.tmp"));
        safetensors::serialize_to_file(
            tensors.iter().map(|(name, t)| (name.as_str(), t)),
            Some(HashMap::from([("kevin".to_string(), meta)])),
            &tmp,
        )
        .map_err(|e| fail(&tmp, e.to_string()))?;
        std::fs::rename(&tmp, &path).map_err(|e| fail(&path, e.to_string()))
    }

    /// Restores what [`OptimizedModel::save`] wrote into `dir` onto the current model, whose
    /// parameter paths and shapes must match those saved, reading it onto `device`; returns the
    /// saved version. Without [`OPTIMIZER_FILE`], an earlier kevin's [`LEGACY_OPTIMIZER_FILE`] is
    /// read. The error names the file and the reason; the state is untouched then.
    pub(crate) fn load(
        &mut self,
        dir: &Path,
        device: &B::Device,
    ) -> Result<u64, (PathBuf, String)> {
        let path = dir.join(OPTIMIZER_FILE);
        let legacy = dir.join(LEGACY_OPTIMIZER_FILE);
        if !path.exists() && legacy.exists() {
            return self.load_legacy(&legacy, device).map_err(|e| (legacy, e));
        }
        self.load_safetensors(&path, device).map_err(|e| (path, e))
    }

    fn load_safetensors(&mut self, path: &Path, device: &B::Device) -> Result<u64, String> {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| e.to_string())?;
        let meta = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("kevin"))
            .ok_or("no `kevin` metadata: not a kevin optimizer state")?;
        let meta: SavedMeta =
            serde_json::from_str(meta).map_err(|e| format!("its `kevin` metadata: {e}"))?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
        let saved: Vec<(String, Vec<usize>)> = meta
            .params
            .iter()
            .map(|p| (p.path.clone(), p.shape.clone()))
            .collect();
        let table = self.check_table(&saved)?;
        let read = |name: &str, n: usize| -> Result<Tensor<B::InnerBackend, 1>, String> {
            let view = file.tensor(name).map_err(|e| format!("{name}: {e}"))?;
            if view.dtype() != Dtype::F32 || view.shape() != [n] {
                return Err(format!(
                    "{name} is {:?} {:?}, expected F32 [{n}]",
                    view.dtype(),
                    view.shape()
                ));
            }
            let data =
                decode(view.dtype(), view.data(), &[n]).map_err(|d| format!("{name}: {d:?}"))?;
            Ok(Tensor::from_data(data, (device, DType::F32)))
        };
        let mut slots = Vec::with_capacity(table.len());
        for (p, (_, name, shape)) in meta.params.iter().zip(&table) {
            if p.time == 0 {
                slots.push(None);
                continue;
            }
            let n = shape.iter().product::<usize>();
            let master_name = format!("{name}.master");
            let master = if file.names().contains(&master_name.as_str()) {
                Some(read(&master_name, n)?)
            } else {
                None
            };
            slots.push(Some(Slot {
                time: p.time,
                m: read(&format!("{name}.exp_avg"), n)?,
                v: read(&format!("{name}.exp_avg_sq"), n)?,
                master,
            }));
        }
        self.restore(slots, meta.steps);
        Ok(meta.version)
    }

    /// The current model's parameter table, when its paths and shapes are `saved`'s; else the
    /// first difference.
    fn check_table(
        &self,
        saved: &[(String, Vec<usize>)],
    ) -> Result<Vec<(ParamId, String, Vec<usize>)>, String> {
        let table = param_table::<B, M>(self.model());
        if saved.len() != table.len() {
            return Err(format!(
                "saved for a model of {} parameters, this model has {}",
                saved.len(),
                table.len()
            ));
        }
        for (i, ((_, path, shape), (sp, ss))) in table.iter().zip(saved).enumerate() {
            if sp != path || ss != shape {
                return Err(format!(
                    "parameter {i} was saved as {sp} {ss:?}, the model has {path} {shape:?}"
                ));
            }
        }
        Ok(table)
    }

    /// Takes `slots` as the state, `steps` optimizer steps taken.
    fn restore(&mut self, slots: Vec<Option<Slot<B::InnerBackend>>>, steps: u64) {
        self.adamw.slots = slots;
        self.steps = steps;
    }

    /// Reads an earlier kevin's state: burn's AdamW record keyed by parameter position, with
    /// the version, steps, paths and shapes beside it.
    fn load_legacy(&mut self, path: &Path, device: &B::Device) -> Result<u64, String> {
        type Legacy<M, B> = OptimizerAdaptor<burn::optim::AdamW, M, B>;
        type Saved<M, B> = (
            <Legacy<M, B> as Optimizer<M, B>>::Record,
            u64,
            u64,
            Vec<String>,
            Vec<Vec<usize>>,
        );
        // The recorder adds the extension.
        let (mut state, version, steps, paths, shapes): Saved<M, B> = Recorder::<B>::load(
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            path.with_extension(""),
            device,
        )
        .map_err(|e| e.to_string())?;
        let saved: Vec<(String, Vec<usize>)> = paths.into_iter().zip(shapes).collect();
        let table = self.check_table(&saved)?;
        let mut slots = Vec::with_capacity(table.len());
        for (i, (_, name, shape)) in table.iter().enumerate() {
            let Some(record) = state.remove(&ParamId::from(i as u64)) else {
                slots.push(None);
                continue;
            };
            let n = shape.iter().product::<usize>();
            let flat = |t: Tensor<B::InnerBackend, 1>| t.cast(FloatDType::F32);
            let (time, m, v) = match shape.len() {
                1 => {
                    let s = record.into_state::<1>().momentum;
                    (s.time, flat(s.moment_1), flat(s.moment_2))
                }
                2 => {
                    let s = record.into_state::<2>().momentum;
                    (
                        s.time,
                        flat(s.moment_1.reshape([n])),
                        flat(s.moment_2.reshape([n])),
                    )
                }
                d => return Err(format!("{name}: a parameter of {d} dimensions")),
            };
            slots.push(Some(Slot {
                time: time as u64,
                m,
                v,
                master: None,
            }));
        }
        self.restore(slots, steps);
        Ok(version)
    }
}

/// The learning rate of optimizer step `step` (0-based): linear warm-up over `warmup_steps` steps
/// (lr/warmup, 2*lr/warmup, ..., lr), then constant.
pub fn warmup_lr(lr: f64, warmup_steps: u64, step: u64) -> f64 {
    if warmup_steps == 0 {
        return lr;
    }
    lr * ((step + 1) as f64 / warmup_steps as f64).min(1.0)
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

/// Settings of the optimizer's and the kernel's tests: weight decay 0.1, betas 0.9 / 0.95.
#[cfg(test)]
pub(crate) const TEST_SETTINGS: AdamWSettings = AdamWSettings {
    weight_decay: 0.1,
    beta_1: 0.9,
    beta_2: 0.95,
    epsilon: 1e-8,
};

#[cfg(test)]
#[path = "optim_tests.rs"]
mod tests;
