//! The burn policy and learner of a kevin config, on the backend chosen at run time, and the
//! random-initialised checkpoints of `kevin policy init`.
//!
//! `[policy.burn].device` picks the backend: "cpu" is burn's NdArray (f32), "cuda" burn's CUDA
//! backend (f32) on GPU 0, "auto" CUDA when nvidia-smi lists a GPU. The learner trains on
//! `Autodiff<backend>` and publishes its model on the backend itself, which is where the policy
//! samples, so a publication is a reference-counted handle on the same device memory.
//!
//! Both are built here, in one place, so they start identical: the learner opens the model
//! directory (or initialises randomly when it has no weights file), and the policy is built from
//! the learner's published model. A resumed run then loads the run directory's checkpoint into
//! the learner, and the daemon publishes the learner's weights to the policy before the first
//! batch (see the actors crate's `system.rs`). [`build_policy`] opens the same directory the same
//! way for a policy alone, on the inference backend (`kevin eval --checkpoint`).

use std::path::Path;
use std::sync::Arc;

use burn::backend::{Autodiff, Cuda, NdArray};
use burn::tensor::backend::{AutodiffBackend, Backend};
use kevin::config::{BurnDevice, Config};
use kevin::learner::Learner;
use kevin::policy::Policy;

use crate::burn_learner::{config_for_tokenizer, open_model, BurnLearner, TOKENIZER_FILE};
use crate::burn_policy::BurnPolicy;
use crate::checkpoint::{self, SaveDtype};
use crate::gate::StepGate;
use crate::qwen2::{Qwen2, Qwen2Config};
use crate::tokenizer::Tokenizer;

/// The learner's backend on the CPU.
pub type CpuTrain = Autodiff<NdArray<f32>>;
/// The learner's backend on a GPU.
pub type CudaTrain = Autodiff<Cuda<f32>>;
/// A trainer's backend on a GPU with bf16 parameters (f32 masters in the optimizer): `kevin sft
/// train --dtype bf16`.
pub type CudaTrainBf16 = Autodiff<Cuda<half::bf16>>;

/// A policy and the learner that trains it.
pub type PolicyAndLearner = (Box<dyn Policy>, Box<dyn Learner>);

/// The backend `device` resolves to: true for CUDA.
pub fn uses_cuda(device: BurnDevice) -> bool {
    match device {
        BurnDevice::Cpu => false,
        BurnDevice::Cuda => true,
        BurnDevice::Auto => kevin::machine::has_gpu(),
    }
}

/// `policy.burn.matmul`: which products go to cuBLAS on CUDA ([`crate::cublas`]).
/// And `policy.burn.generate`: the fused generation path on CUDA ([`crate::qwen2::fused`]) or not;
/// `policy.burn.attention`: the learner's attention through [`crate::flash`] or burn's ops;
/// `policy.burn.logprobs`: its log-probabilities through [`crate::logprob`] or burn's ops;
/// `policy.burn.norms`: RMSNorm, the bias additions, RoPE and SwiGLU through [`crate::norm`] or
/// burn's ops.
fn set_matmul(config: &Config) {
    crate::cublas::set_mode(match config.policy.burn.matmul {
        kevin::config::BurnMatmul::Burn => crate::cublas::Mode::Off,
        kevin::config::BurnMatmul::Cublas => crate::cublas::Mode::Large,
    });
    crate::qwen2::fused::SWITCH
        .set(config.policy.burn.generate == kevin::config::BurnGenerate::Fused);
    crate::flash::SWITCH.set(config.policy.burn.attention == kevin::config::BurnAttention::Flash);
    crate::logprob::SWITCH.set(config.policy.burn.logprobs == kevin::config::BurnLogprobs::Fused);
    crate::norm::SWITCH.set(config.policy.burn.norms == kevin::config::BurnNorms::Fused);
}

/// The burn policy and learner of `config` (`policy.kind = "burn"`), starting from the same
/// weights. Errors are one line naming the file or key.
///
/// On a GPU with `env.timing = "exclusive"`, the generator and the learner each honour the GPU
/// timing lease of GPU 0 between their steps ([`crate::gate`]).
pub fn build(config: &Config) -> Result<PolicyAndLearner, String> {
    if uses_cuda(config.policy.burn.device) {
        crate::cuda_setup::require_gpu("policy.burn.device")?;
        set_matmul(config);
        let (mut policy, mut learner) =
            build_parts::<CudaTrain>(config, crate::cuda_setup::cuda_device(0))?;
        let leased = config.env.timing.leased();
        policy.set_gate(StepGate::for_policy_gpu(leased, "generator")?);
        learner.set_gate(StepGate::for_policy_gpu(leased, "learner")?);
        Ok((Box::new(policy), Box::new(learner)))
    } else {
        build_on::<CpuTrain>(config, Default::default())
    }
}

/// [`build`] on the learner backend `B`, on `device` (no timing lease).
pub fn build_on<B: AutodiffBackend>(
    config: &Config,
    device: B::Device,
) -> Result<PolicyAndLearner, String> {
    let (policy, learner) = build_parts::<B>(config, device)?;
    Ok((Box::new(policy), Box::new(learner)))
}

type Parts<B> = (
    BurnPolicy<<B as AutodiffBackend>::InnerBackend>,
    BurnLearner<B>,
);

fn build_parts<B: AutodiffBackend>(config: &Config, device: B::Device) -> Result<Parts<B>, String> {
    let (model, tokenizer) = open::<B>(config, &device)?;
    let learner =
        BurnLearner::<B>::new(model, tokenizer.clone(), &config.learner, &config.sampling)
            .map_err(|e| e.to_string())?;
    let policy = BurnPolicy::<B::InnerBackend>::new(
        learner.inference_model(),
        tokenizer,
        config.sampling.max_batch as usize,
        config.policy.burn.max_len as usize,
        learner.version(),
    )
    .map_err(|e| format!("policy.burn: {e}"))?;
    Ok((policy, learner))
}

/// The burn policy of `config` alone, without a learner (`kevin eval --checkpoint`): the model
/// directory opened as [`build`] opens it, on the backend `[policy.burn].device` picks, at
/// version 0 (a Hugging Face directory does not know its learner version).
///
/// On a GPU with `env.timing = "exclusive"` the generator honours the GPU timing lease of GPU 0
/// between its steps (the evaluation may time candidates there meanwhile).
pub fn build_policy(config: &Config) -> Result<Box<dyn Policy>, String> {
    if uses_cuda(config.policy.burn.device) {
        crate::cuda_setup::require_gpu("policy.burn.device")?;
        set_matmul(config);
        let mut policy = policy_on::<Cuda<f32>>(config, crate::cuda_setup::cuda_device(0))?;
        policy.set_gate(StepGate::for_policy_gpu(
            config.env.timing.leased(),
            "generator",
        )?);
        Ok(Box::new(policy))
    } else {
        build_policy_on::<NdArray<f32>>(config, Default::default())
    }
}

/// [`build_policy`] on the inference backend `B`, on `device` (no timing lease).
pub fn build_policy_on<B: Backend>(
    config: &Config,
    device: B::Device,
) -> Result<Box<dyn Policy>, String> {
    Ok(Box::new(policy_on::<B>(config, device)?))
}

fn policy_on<B: Backend>(config: &Config, device: B::Device) -> Result<BurnPolicy<B>, String> {
    let (model, tokenizer) = open::<B>(config, &device)?;
    BurnPolicy::<B>::new(
        model,
        tokenizer,
        config.sampling.max_batch as usize,
        config.policy.burn.max_len as usize,
        0,
    )
    .map_err(|e| format!("policy.burn: {e}"))
}

/// The model and tokenizer of `[policy.burn].checkpoint` on `device`: the weights, or a random
/// initialisation from `policy.burn.seed` when the directory has none (logged); the config's
/// vocabulary must hold the tokenizer's. Errors are one line naming the file.
fn open<B: Backend>(
    config: &Config,
    device: &B::Device,
) -> Result<(Qwen2<B>, Arc<Tokenizer>), String> {
    let b = &config.policy.burn;
    let dir = Path::new(&b.checkpoint);
    let tokenizer_path = dir.join(TOKENIZER_FILE);
    let tokenizer = Arc::new(
        Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| format!("policy.burn.checkpoint: {}: {e}", tokenizer_path.display()))?,
    );
    let (model, random) =
        open_model::<B>(dir, b.seed, device).map_err(|e| format!("policy.burn.checkpoint: {e}"))?;
    if random {
        tracing::info!(
            checkpoint = %dir.display(),
            seed = b.seed,
            "no model.safetensors in the checkpoint directory: the model is initialised randomly"
        );
    }
    let vocab = model.config().vocab_size;
    if vocab < tokenizer.vocab_size() {
        return Err(format!(
            "policy.burn.checkpoint: {}: vocab_size {vocab} is smaller than the {} tokens of {}",
            dir.join("config.json").display(),
            tokenizer.vocab_size(),
            tokenizer_path.display()
        ));
    }
    Ok((model, tokenizer))
}

/// What [`init_checkpoint`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct InitReport {
    /// The config written.
    pub config: Qwen2Config,
    /// The vocabulary size of the given config when it differed from the tokenizer's.
    pub vocab_changed_from: Option<usize>,
    /// Parameters of the model.
    pub parameters: usize,
}

/// Writes a random-initialised Hugging Face checkpoint into `out`: config.json (`config_json`
/// with `vocab_size` set to the tokenizer's size), model.safetensors in `dtype`, tokenizer.json.
/// The weights are built on the CPU from `seed`.
pub fn init_checkpoint(
    config_json: &Path,
    tokenizer_json: &Path,
    out: &Path,
    seed: u64,
    dtype: SaveDtype,
) -> Result<InitReport, String> {
    let text = std::fs::read_to_string(config_json)
        .map_err(|e| format!("{}: {e}", config_json.display()))?;
    let cfg =
        Qwen2Config::from_json(&text).map_err(|e| format!("{}: {e}", config_json.display()))?;
    let tokenizer = Tokenizer::from_file(tokenizer_json)
        .map_err(|e| format!("{}: {e}", tokenizer_json.display()))?;
    let (cfg, vocab_changed_from) = config_for_tokenizer(cfg, &tokenizer);
    type B = NdArray<f32>;
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, seed);
    let model =
        Qwen2::<B>::new(&cfg, &device).map_err(|e| format!("{}: {e}", config_json.display()))?;
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    checkpoint::save(&model, &cfg, out, dtype).map_err(|e| e.to_string())?;
    let path = out.join(TOKENIZER_FILE);
    tokenizer
        .save(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let parameters = burn::module::Module::num_params(&model);
    Ok(InitReport {
        config: cfg,
        vocab_changed_from,
        parameters,
    })
}
