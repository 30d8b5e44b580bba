//! `kevin bench policy`: runs `kevin_policy::bench` on the chosen backend, prints a table and,
//! given the transformers peer's JSON (benches/hf_policy.py, same machine, same call), the
//! ratios the issue asks for (generation at each batch size, learner tokens/s).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kevin_policy::bench::{run_named, BenchArgs, BenchReport, Shape};

use crate::cmd::{failure, usage, write_json, CmdResult};

/// The flags of `kevin bench policy`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model shape: "qwen2-0.5b" (the issue's), "qwen2.5-1.5b", "kevin-4m" or "tiny" (a smoke run).
    #[arg(long, default_value = "qwen2-0.5b")]
    pub shape: String,
    /// "cuda" or "cpu" (default: cuda where nvidia-smi lists a GPU).
    #[arg(long)]
    pub device: Option<String>,
    /// "bf16" or "f32" (the CPU runs f32).
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Generation batch sizes, comma-separated.
    #[arg(long, default_value = "1,64", value_delimiter = ',')]
    pub batches: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub prompt: usize,
    /// New tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub new_tokens: usize,
    /// Learner: sequences per step.
    #[arg(long, default_value_t = 8)]
    pub train_batch: usize,
    /// Learner: tokens per sequence.
    #[arg(long, default_value_t = 1024)]
    pub train_seq: usize,
    /// Learner: timed steps after the warm-up, which runs until two steps agree within 10% (at
    /// most 6 steps; 0: no learner).
    #[arg(long, default_value_t = 3)]
    pub train_steps: usize,
    /// "exclusive" (default): generator and learner steps honour the GPU timing lease of GPU 0,
    /// as `kevin train`'s do, so a candidate timed on this GPU meanwhile runs alone; "shared":
    /// they do not. Only matters on a GPU.
    #[arg(long, default_value = "exclusive", value_parser = ["exclusive", "shared"])]
    pub timing: String,
    /// After the measurements, keep generating (largest batch; with a learner step after each
    /// call when --train-steps > 0) for this many seconds: a concurrent GPU load for
    /// benches/timing_lease.sh. Stop it early with a signal.
    #[arg(long, default_value_t = 0.0)]
    pub load_seconds: f64,
    /// Which matrix products run through cuBLAS on CUDA: "cublas" (default: the large ones),
    /// "burn" (none: burn's own matmul) or "cublas-all".
    #[arg(long, default_value = "cublas")]
    pub matmul: String,
    /// How generation runs its cached forward pass on CUDA: "fused" (default: own kernels and
    /// cuBLAS on a stream of its own) or "burn" (burn's layers, the reference path).
    #[arg(long, default_value = "fused", value_parser = ["fused", "burn"])]
    pub generate: String,
    /// How the learner's causal attention runs on CUDA: "flash" (default: own kernels without
    /// the score matrix, forward and backward) or "burn" (burn's ops, the reference path).
    #[arg(long, default_value = "flash", value_parser = ["flash", "burn"])]
    pub attention: String,
    /// How the learner's chosen-token log-probabilities run on CUDA: "fused" (default: one
    /// kernel per direction over the logits in place) or "burn" (burn's ops, the reference path).
    #[arg(long, default_value = "fused", value_parser = ["fused", "burn"])]
    pub logprobs: String,
    /// How the learner's RMSNorm, bias additions, RoPE and SwiGLU run on CUDA: "fused" (default:
    /// own kernels, one pass per row each way, the weight's and bias's sums over rows in one
    /// kernel, RoPE and SwiGLU one kernel each way) or "burn" (burn's ops, the reference path).
    #[arg(long, default_value = "fused", value_parser = ["fused", "burn"])]
    pub norms: String,
    /// How kevin's own kernels and cuBLAS products are ordered against burn's kernels on CUDA:
    /// "stream" (default: queued on cubecl's own stream, found once through CUPTI; fenced where it
    /// cannot be found) or "fence" (a host synchronisation on each side, the reference).
    #[arg(long, default_value = "stream", value_parser = ["stream", "fence"])]
    pub order: String,
    /// The transformers peer's JSON (benches/hf_policy.py --json) to compare with.
    #[arg(long)]
    pub hf: Option<PathBuf>,
    /// Write the results (and the comparison) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark with the flags (device default: cuda where a GPU is listed).
pub fn run(a: &Args) -> CmdResult {
    let shape = Shape::parse(&a.shape).map_err(usage)?;
    let args = BenchArgs {
        shape,
        batches: a.batches.clone(),
        prompt: a.prompt,
        new_tokens: a.new_tokens,
        train_batch: a.train_batch,
        train_seq: a.train_seq,
        train_steps: a.train_steps,
        lease: kevin::config::GpuTiming::parse(&a.timing)
            .map_err(usage)?
            .leased(),
        load_seconds: a.load_seconds,
        matmul: kevin_policy::cublas::parse_mode(&a.matmul).map_err(usage)?,
        fused: a.generate == "fused",
        flash: a.attention == "flash",
        logprobs: a.logprobs == "fused",
        norms: a.norms == "fused",
        order: kevin_policy::stream::parse_order(&a.order).map_err(usage)?,
    };
    if !(a.load_seconds.is_finite() && a.load_seconds >= 0.0) {
        return Err(usage(format!(
            "--load-seconds {}: must be a number of seconds >= 0",
            a.load_seconds
        )));
    }
    let device = a
        .device
        .clone()
        .unwrap_or_else(|| kevin::machine::default_backend().to_string());
    bench(&args, &device, &a.dtype, a.hf.as_deref(), a.json.as_deref()).map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}

/// The peer's figure for `key` ("bs64" or "learner") from its JSON, if present.
fn peer(hf: &serde_json::Value, key: &str) -> Option<f64> {
    if key == "learner" {
        hf["learner"]["tokens_per_s"].as_f64()
    } else {
        hf["generate"][key]["tokens_per_s"].as_f64()
    }
}

fn table(report: &BenchReport, hf: Option<&serde_json::Value>) -> String {
    let mut out = format!(
        "{} ({:.1}M parameters)\n\n| measurement | kevin tokens/s | transformers tokens/s | ratio |\n| --- | --- | --- | --- |\n",
        report.backend,
        report.params as f64 / 1e6
    );
    let mut row = |name: String, ours: f64, key: String| {
        let theirs = hf.and_then(|h| peer(h, &key));
        let (t, r) = match theirs {
            Some(t) => (format!("{t:.0}"), format!("{:.2}x", ours / t)),
            None => ("-".into(), "-".into()),
        };
        out += &format!("| {name} | {ours:.0} | {t} | {r} |\n");
    };
    for g in &report.generate {
        row(
            format!(
                "generate bs{} ({:.2} s, {} passes)",
                g.batch, g.seconds, g.forward_passes
            ),
            g.tokens_per_s,
            format!("bs{}", g.batch),
        );
    }
    if let Some(l) = &report.learner {
        row(
            format!(
                "learner {} tokens/step ({:.0} ms/step)",
                l.tokens,
                l.step_seconds * 1e3
            ),
            l.tokens_per_s,
            "learner".into(),
        );
        // A peer's JSON from before it recorded the precision: its dtype throughout.
        let precision = hf.map(|h| match h["learner"]["precision"].as_str() {
            Some(p) => p.to_string(),
            None => format!(
                "{} weights and AdamW state",
                h["dtype"].as_str().unwrap_or("?")
            ),
        });
        out += &format!(
            "\nlearner precision: kevin {}, transformers {}\n",
            l.precision,
            precision.as_deref().unwrap_or("-")
        );
        let theirs = hf.and_then(|h| h["learner"]["peak_reserved_gib"].as_f64());
        if l.pool_gib.is_some() || theirs.is_some() {
            let gib = |g: Option<f64>| g.map_or("-".into(), |g| format!("{g:.1} GiB"));
            out += &format!(
                "\nlearner GPU memory: kevin {} (cubecl's pool after the steps), transformers {} \
                 (peak reserved)\n",
                gib(l.pool_gib),
                gib(theirs)
            );
        }
    }
    if let Some(l) = &report.load {
        out += &format!(
            "\nload: {:.0} s, {} generation calls ({} passes), {} learner steps; the generator \
             waited {:.0} ms for the GPU timing lease\n",
            l.seconds,
            l.generate_calls,
            l.forward_passes,
            l.learner_steps,
            l.generator_lease_wait_ms
        );
    }
    out
}

/// Runs the benchmark and reports it; a peer measured on another shape (its `"shape"`, written
/// by benches/hf_policy.py) is refused before anything runs.
pub fn bench(
    args: &BenchArgs,
    device: &str,
    dtype: &str,
    hf: Option<&Path>,
    json: Option<&Path>,
) -> Result<(), String> {
    let peer = match hf {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Some(
                serde_json::from_str::<serde_json::Value>(&text)
                    .map_err(|e| format!("{}: not JSON: {e}", p.display()))?,
            )
        }
        None => None,
    };
    if let (Some(p), Some(theirs)) = (hf, peer.as_ref().and_then(|v| v["shape"].as_str())) {
        let shape = args.shape.name();
        if theirs != shape {
            return Err(format!(
                "{}: the transformers peer ran shape {theirs}, this run is {shape} (run \
                 benches/hf_policy.py --shape {shape})",
                p.display()
            ));
        }
    }
    let report = run_named(args, device, dtype, &|line| eprintln!("{line}"))?;
    let text = table(&report, peer.as_ref());
    println!("{text}");
    if let Some(path) = json {
        let value = serde_json::json!({ "kevin": report, "transformers": peer, "table": text });
        write_json(path, &value)?;
    }
    Ok(())
}
