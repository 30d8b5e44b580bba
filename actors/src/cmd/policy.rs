//! `kevin policy init` (a random-initialised checkpoint to train from) and `kevin policy parity`
//! (kevin's logits against transformers'), both thin wrappers of `kevin_policy`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{failure, write_json, CmdResult};

/// The burn policy's model: `init` writes a random-initialised checkpoint to start from.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub what: PolicyCommand,
}

/// `kevin policy` subcommands.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Write a random-initialised Hugging Face Qwen2 checkpoint directory (config.json,
    /// model.safetensors, tokenizer.json) for `[policy.burn].checkpoint`: training from scratch.
    /// The config's vocab_size is set to the tokenizer's size when it differs (and says so).
    Init(InitArgs),
    /// Check that kevin computes the logits transformers computed for a checkpoint: DIR holds the
    /// model and `expected.safetensors` (written by `python3 tests/qwen2_parity.py --out`). Prints
    /// the largest difference through the full forward pass and through the KV cache; exits 1
    /// when either is over the bound. In f32 the bound is 1e-4, and on CUDA the matmuls are
    /// split so that burn's TF32 tensor cores keep f32 accuracy (`--tf32` measures them as they
    /// are). In bf16 kevin must be as close to transformers' f32 logits as transformers' own
    /// bf16 ones are (bound 2e-2 or that difference, whichever is larger); the difference to
    /// transformers' bf16 logits is printed too.
    Parity(ParityArgs),
}

/// The flags of `kevin policy init`.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// A Qwen2 config.json (hidden size, layers, heads, ...).
    #[arg(long)]
    pub config_json: PathBuf,
    /// The tokenizer.json the model will use (e.g. models/kevin-bpe-4096/tokenizer.json).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Output folder.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Dtype of model.safetensors: "f32" or "bf16".
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
}

/// The flags of `kevin policy parity`.
#[derive(clap::Args, Debug)]
pub struct ParityArgs {
    /// The checkpoint directory with its expected.safetensors.
    #[arg(long)]
    pub dir: PathBuf,
    /// "cuda" (burn's CUDA backend, GPU 0) or "cpu" (NdArray, f32 only).
    #[arg(long, default_value = "cuda", value_parser = ["cuda", "cpu"])]
    pub device: String,
    /// The dtype kevin computes in: "f32" or "bf16".
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub dtype: String,
    /// f32 on CUDA: leave the matmuls to burn's tensor-core kernels, which round f32
    /// operands to TF32 (shows how far that alone moves the logits).
    #[arg(long)]
    pub tf32: bool,
    /// Also write the differences, the bound and the verdict as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> CmdResult {
    match args.what {
        PolicyCommand::Init(a) => init(a),
        PolicyCommand::Parity(a) => parity(a),
    }
}

fn init(a: InitArgs) -> CmdResult {
    let dtype = if a.dtype == "bf16" {
        kevin_policy::SaveDtype::Bf16
    } else {
        kevin_policy::SaveDtype::F32
    };
    let report =
        kevin_policy::runtime::init_checkpoint(&a.config_json, &a.tokenizer, &a.out, a.seed, dtype)
            .map_err(failure)?;
    if let Some(old) = report.vocab_changed_from {
        println!(
            "vocab_size {old} of {} set to {}, the size of {}",
            a.config_json.display(),
            report.config.vocab_size,
            a.tokenizer.display()
        );
    }
    println!(
        "wrote {} (random Qwen2: {} parameters, {} layers, hidden {}, seed {})",
        a.out.display(),
        report.parameters,
        report.config.num_hidden_layers,
        report.config.hidden_size,
        a.seed
    );
    Ok(ExitCode::SUCCESS)
}

fn parity(a: ParityArgs) -> CmdResult {
    let ParityArgs {
        dir,
        device,
        dtype,
        tf32,
        json,
    } = a;
    let p = kevin_policy::parity::check_named(&dir, &device, &dtype, tf32).map_err(failure)?;
    let rounding = match p.to_f32 {
        Some((forward, extend)) => format!(
            "; kevin vs transformers' f32 model: forward {forward:.3e}, kv-cache \
             {extend:.3e} (transformers' own {dtype} vs f32: {:.3e})",
            p.dtype_rounding
        ),
        None => String::new(),
    };
    println!(
        "{} on {device} {dtype}{}: max |kevin - transformers| forward {:.3e}, kv-cache {:.3e}{rounding}; bound {:.1e}: {}",
        dir.display(),
        if tf32 { " (tf32)" } else { "" },
        p.forward,
        p.extend,
        p.bound,
        if p.holds() { "parity holds" } else { "PARITY FAILS" }
    );
    if let Some(path) = &json {
        let figures = serde_json::json!({
            "dir": dir.display().to_string(),
            "device": device,
            "dtype": dtype,
            "tf32": tf32,
            "forward": p.forward,
            "extend": p.extend,
            "dtype_rounding": p.dtype_rounding,
            "to_f32": p.to_f32,
            "bound": p.bound,
            "holds": p.holds(),
        });
        write_json(path, &figures).map_err(failure)?;
    }
    Ok(if p.holds() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
