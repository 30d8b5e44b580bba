//! `kevin bench policy`: the policy's own speed, on the shape and workload the transformers peer
//! (benches/hf_policy.py) measures in the same device call.
//!
//! - generation: the [`Generator`] (continuous batching, KV cache, sampling at temperature 0.9
//!   over the whole vocabulary) on `batch` random prompts of `prompt` tokens, exactly
//!   `new_tokens` new tokens each (no end-of-sequence token); tokens/s counts new tokens over the
//!   whole call, prefill included, as `generate` is timed in Python;
//! - learner: one [`Trainer::train_batch`] per step on `train_batch` sequences of `train_seq`
//!   tokens (one prompt token, the rest response): forward, the clipped surrogate over every
//!   response token, backward, global-norm clipping and one AdamW step, in the micro-batches the
//!   RL learner would use ([`crate::burn_learner::micro_batch_tokens`]); tokens/s over the median
//!   step.
//!
//! The weights are random (a benchmark of speed, not of quality). Each measurement is preceded by
//! a short warm-up of the same kind, so burn's autotuning and kernel compilation are not timed:
//! the learner's warm-up runs until two steps in a row agree within [`SETTLED`] (at most
//! [`WARMUP_STEPS`]), since the first steps of a shape new to the machine compile and autotune
//! kernels for several steps (a Qwen2.5-1.5B step took 1,955 ms after one warm-up step on a
//! fresh H100, and 264 ms in the next process).

use std::sync::Arc;
use std::time::Instant;

use burn::tensor::backend::{AutodiffBackend, Backend};
use kevin::config::{LearnerSection, SamplingSection};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::gate::StepGate;
use crate::sampler::{Generator, Request, SamplingParams};
use crate::train::{TrainSample, Trainer, TrainerConfig};
use crate::{Qwen2, Qwen2Config};

/// Model shapes the benchmark knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Qwen2-0.5B (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936).
    Qwen2_05b,
    /// Qwen2.5-1.5B (hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960, vocab
    /// 151936).
    Qwen25_15b,
    /// The 4M-parameter policy of `models/kevin-sft-4m` (hidden 256, 4 layers, 4 heads, 2 KV
    /// heads, intermediate 768, vocab 3672).
    Kevin4m,
    /// A few-hundred-thousand-parameter model for smoke runs on the CPU.
    Tiny,
}

impl Shape {
    /// Every shape, in the order the flag lists them.
    pub const ALL: [Shape; 4] = [
        Shape::Qwen2_05b,
        Shape::Qwen25_15b,
        Shape::Kevin4m,
        Shape::Tiny,
    ];

    /// The shape's name: "qwen2-0.5b", "qwen2.5-1.5b", "kevin-4m" or "tiny" (the flag's value, and
    /// what benches/hf_policy.py records as the peer's shape).
    pub fn name(self) -> &'static str {
        match self {
            Shape::Qwen2_05b => "qwen2-0.5b",
            Shape::Qwen25_15b => "qwen2.5-1.5b",
            Shape::Kevin4m => "kevin-4m",
            Shape::Tiny => "tiny",
        }
    }

    /// Parses a [`Shape::name`].
    pub fn parse(s: &str) -> Result<Shape, String> {
        Shape::ALL
            .into_iter()
            .find(|shape| shape.name() == s)
            .ok_or_else(|| {
                let names: Vec<String> = Shape::ALL
                    .iter()
                    .map(|shape| format!("\"{}\"", shape.name()))
                    .collect();
                format!("--shape {s}: expected one of {}", names.join(", "))
            })
    }

    /// The model's config.json.
    pub fn config(self) -> Qwen2Config {
        let json = match self {
            Shape::Qwen2_05b => {
                r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
                "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "max_position_embeddings": 32768,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"#
            }
            // Qwen2.5-1.5B's config.json numbers.
            Shape::Qwen25_15b => {
                r#"{"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
                "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                "num_key_value_heads": 2, "max_position_embeddings": 32768,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"#
            }
            Shape::Kevin4m => {
                r#"{"model_type": "qwen2", "vocab_size": 3672, "hidden_size": 256,
                "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 4096,
                "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"#
            }
            Shape::Tiny => {
                r#"{"model_type": "qwen2", "vocab_size": 512, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 2048,
                "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"#
            }
        };
        Qwen2Config::from_json(json).expect("the built-in shapes are valid")
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// The model's shape.
    pub shape: Shape,
    /// Generation batch sizes.
    pub batches: Vec<usize>,
    /// Prompt tokens per sequence.
    pub prompt: usize,
    /// New tokens per sequence.
    pub new_tokens: usize,
    /// Learner: sequences per step.
    pub train_batch: usize,
    /// Learner: tokens per sequence.
    pub train_seq: usize,
    /// Learner: timed steps (after the warm-up: see the module's documentation); 0 skips the
    /// learner.
    pub train_steps: usize,
    /// Generator and learner steps honour the GPU timing lease of GPU 0 (as `kevin train`'s do
    /// with `env.timing = "exclusive"`); only on a GPU.
    pub lease: bool,
    /// After the measurements, keep generating (at the largest batch, with a learner step after
    /// each generation call when `train_steps > 0`) for this many seconds: a concurrent load on
    /// the GPU for the timing-lease measurement (benches/timing_lease.sh). 0: none.
    pub load_seconds: f64,
    /// Which products go to cuBLAS on CUDA (see [`crate::cublas`]).
    pub matmul: crate::cublas::Mode,
    /// Generation through the fused path on CUDA ([`crate::qwen2::fused`]); false: burn's
    /// layers.
    pub fused: bool,
    /// The learner's attention through [`crate::flash`] on CUDA; false: burn's ops.
    pub flash: bool,
    /// The learner's log-probabilities through [`crate::logprob`] on CUDA; false: burn's ops.
    pub logprobs: bool,
    /// The learner's RMSNorm, bias additions, RoPE and SwiGLU through [`crate::norm`] on CUDA;
    /// false: burn's ops.
    pub norms: bool,
    /// How kevin's own kernels and cuBLAS products are ordered against burn's on CUDA
    /// ([`crate::stream`]).
    pub order: crate::stream::Order,
}

impl BenchArgs {
    /// A short run of `shape` on every fast path: one generation of 2 new tokens from a 4-token
    /// prompt at batch 1, one learner step on 2 x 8 tokens, no lease, no load. Tests change
    /// what they measure from here.
    pub fn quick(shape: Shape) -> BenchArgs {
        BenchArgs {
            shape,
            batches: vec![1],
            prompt: 4,
            new_tokens: 2,
            train_batch: 2,
            train_seq: 8,
            train_steps: 1,
            lease: false,
            load_seconds: 0.0,
            matmul: crate::cublas::Mode::Large,
            fused: true,
            flash: true,
            logprobs: true,
            norms: true,
            order: crate::stream::Order::Stream,
        }
    }
}

/// One generation measurement.
#[derive(Debug, Clone, Serialize)]
pub struct GenResult {
    /// Sequences.
    pub batch: usize,
    /// New tokens per second.
    pub tokens_per_s: f64,
    /// Seconds of the timed call.
    pub seconds: f64,
    /// Forward passes of the timed call.
    pub forward_passes: u64,
    /// Seconds of its prefill passes (see [`crate::sampler::GeneratorStats`]).
    pub prefill_s: f64,
    /// Seconds of its decode passes.
    pub decode_s: f64,
}

/// The learner measurement.
#[derive(Debug, Clone, Serialize)]
pub struct LearnResult {
    /// Tokens (sequences x length) per second over the median step.
    pub tokens_per_s: f64,
    /// Median step time (s).
    pub step_seconds: f64,
    /// Every timed step's seconds, in the order they ran (a drift shows here, not in the
    /// median).
    pub steps_seconds: Vec<f64>,
    /// The warm-up steps' seconds, in order.
    pub warmup_seconds: Vec<f64>,
    /// Tokens per step.
    pub tokens: usize,
    /// GiB of GPU memory cubecl's pool held after the steps, the largest over them, its unused
    /// pages returned before the first ([`crate::kernels::pool_reserved`]): the learner's peak
    /// as the pool rounds it, beside PyTorch's peak reserved memory. `None` off CUDA.
    pub pool_gib: Option<f64>,
    /// The weights' and the optimizer state's precision, in words.
    pub precision: String,
}

/// The concurrent load ([`BenchArgs::load_seconds`]).
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    /// Seconds it ran.
    pub seconds: f64,
    /// Generation calls.
    pub generate_calls: u64,
    /// Forward passes.
    pub forward_passes: u64,
    /// Learner steps.
    pub learner_steps: u64,
    /// Milliseconds the generator's passes waited for the timing lease.
    pub generator_lease_wait_ms: f64,
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The backend, in words.
    pub backend: String,
    /// Parameters of the model.
    pub params: usize,
    /// Generation, per batch size.
    pub generate: Vec<GenResult>,
    /// The learner, if measured.
    pub learner: Option<LearnResult>,
    /// The concurrent load, if asked for.
    pub load: Option<LoadResult>,
    /// Waits for the GPU timing lease, per party ([`kevin::gpu::lease::wait_totals`]).
    pub lease_waits: std::collections::BTreeMap<String, kevin::gpu::lease::WaitTotals>,
}

/// Two consecutive warm-up steps within this fraction of each other end the learner's warm-up.
pub const SETTLED: f64 = 0.1;

/// The most learner warm-up steps.
pub const WARMUP_STEPS: usize = 6;

/// Runs `step` (which returns its seconds) until two consecutive runs agree within [`SETTLED`]
/// of the later one, at least twice and at most `max` times; returns the seconds of each.
pub fn settle(
    max: usize,
    mut step: impl FnMut() -> Result<f64, String>,
) -> Result<Vec<f64>, String> {
    let mut times: Vec<f64> = Vec::new();
    while times.len() < max.max(1) {
        times.push(step()?);
        if let [.., a, b] = times[..] {
            if (a - b).abs() <= SETTLED * b {
                break;
            }
        }
    }
    Ok(times)
}

fn random_tokens(rng: &mut StdRng, n: usize, vocab: usize) -> Vec<u32> {
    // Token 0 upwards are often special tokens of a real tokenizer; random weights do not care.
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// Times one `generate_all` of `batch` requests on a fresh generator; returns the result and the
/// model back.
fn generate_once<B: Backend>(
    model: Qwen2<B>,
    batch: usize,
    prompt: usize,
    new_tokens: usize,
    seed: u64,
    lease: bool,
) -> Result<(GenResult, Qwen2<B>), String> {
    let vocab = model.config().vocab_size;
    let mut gen = Generator::new(model, batch, prompt + new_tokens).map_err(|e| e.to_string())?;
    gen.set_gate(StepGate::for_policy_gpu(lease, "generator")?);
    let params = Arc::new(SamplingParams {
        temperature: 0.9,
        top_p: 1.0,
        top_k: 0,
        max_new_tokens: new_tokens,
        stop: Vec::new(),
        eos_token_ids: Vec::new(),
    });
    let mut rng = StdRng::seed_from_u64(seed);
    let requests: Vec<Request> = (0..batch)
        .map(|i| Request {
            id: i as u64,
            prompt: random_tokens(&mut rng, prompt, vocab),
            seed: seed ^ i as u64,
            params: params.clone(),
        })
        .collect();
    let start = Instant::now();
    let done = gen
        .generate_all(requests, &|_: &[u32]| String::new())
        .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    let mut tokens = 0;
    for d in done {
        let out = d.map_err(|r| r.to_string())?;
        tokens += out.token_ids.len();
    }
    if tokens != batch * new_tokens {
        return Err(format!(
            "generated {tokens} tokens, expected {}",
            batch * new_tokens
        ));
    }
    let stats = gen.stats();
    Ok((
        GenResult {
            batch,
            tokens_per_s: tokens as f64 / seconds,
            seconds,
            forward_passes: stats.forward_passes,
            prefill_s: stats.prefill_pass_s,
            decode_s: stats.decode_pass_s,
        },
        gen.into_model(),
    ))
}

/// Runs the benchmark on backend `B` (its autodiff twin for the learner) on `device`;
/// `progress` gets one line per finished measurement.
pub fn run<B: AutodiffBackend>(
    args: &BenchArgs,
    device: &B::Device,
    backend: &str,
    progress: &dyn Fn(&str),
) -> Result<BenchReport, String> {
    let cfg = args.shape.config();
    let mut model = Qwen2::<B::InnerBackend>::new(&cfg, device).map_err(|e| e.to_string())?;
    let params = burn::module::Module::num_params(&model);
    let mut generate = Vec::new();
    for &batch in &args.batches {
        // Warm-up at the same batch: prefill and decode shapes get compiled and tuned.
        let (_, m) = generate_once(model, batch, args.prompt, 4, 1, args.lease)?;
        let (r, m) = generate_once(m, batch, args.prompt, args.new_tokens, 2, args.lease)?;
        model = m;
        progress(&format!(
            "generate bs{batch}: {:.0} tokens/s ({:.2} s, {} passes: prefill {:.3} s, decode \
             {:.3} s)",
            r.tokens_per_s, r.seconds, r.forward_passes, r.prefill_s, r.decode_s
        ));
        generate.push(r);
    }
    drop(model);
    let learner = if args.train_steps == 0 {
        None
    } else {
        // What generation left in the pool goes back first.
        let mut pool = crate::kernels::pool_reserved(device, true);
        let (mut trainer, samples) = bench_trainer::<B>(args, device)?;
        // TrainStats holds host values: the step is finished when it returns.
        let mut step = || -> Result<f64, String> {
            let t = Instant::now();
            trainer.train_batch(&samples).map_err(|e| e.to_string())?;
            Ok(t.elapsed().as_secs_f64())
        };
        let warm = settle(WARMUP_STEPS, &mut step)?;
        let warm_ms: Vec<String> = warm.iter().map(|s| format!("{:.0}", s * 1e3)).collect();
        progress(&format!(
            "learner warm-up: {} steps ({} ms)",
            warm.len(),
            warm_ms.join(", ")
        ));
        let mut times = Vec::new();
        for _ in 0..args.train_steps {
            times.push(step()?);
            pool = pool.max(crate::kernels::pool_reserved(device, false));
        }
        let pool_gib = pool.map(|b| b as f64 / (1u64 << 30) as f64);
        let steps_seconds = times.clone();
        times.sort_by(f64::total_cmp);
        let step_seconds = times[times.len() / 2];
        let tokens = args.train_batch * args.train_seq;
        let precision = crate::optim::state_precision(crate::qwen2::float_dtype::<B>());
        let r = LearnResult {
            tokens_per_s: tokens as f64 / step_seconds,
            step_seconds,
            steps_seconds,
            warmup_seconds: warm,
            tokens,
            pool_gib,
            precision,
        };
        let in_order: Vec<String> = r
            .steps_seconds
            .iter()
            .map(|s| format!("{:.0}", s * 1e3))
            .collect();
        progress(&format!(
            "learner {}x{}: {:.0} tokens/s ({:.0} ms/step{}; in order {} ms)",
            args.train_batch,
            args.train_seq,
            r.tokens_per_s,
            step_seconds * 1e3,
            pool_gib.map_or(String::new(), |g| format!(", cubecl's pool {g:.1} GiB")),
            in_order.join(", ")
        ));
        Some(r)
    };
    let load = if args.load_seconds > 0.0 {
        Some(load::<B>(args, device, progress)?)
    } else {
        None
    };
    Ok(BenchReport {
        backend: backend.to_string(),
        params,
        generate,
        learner,
        load,
        lease_waits: kevin::gpu::lease::wait_totals(),
    })
}

/// A benchmark's trainer and the batch it trains on.
type BenchTrainer<B> = (Trainer<B, Qwen2<B>>, Vec<TrainSample>);

/// The learner of the benchmark (one AdamW step per batch of `train_batch` random sequences),
/// honouring the timing lease when `args.lease`, and its batch.
fn bench_trainer<B: AutodiffBackend>(
    args: &BenchArgs,
    device: &B::Device,
) -> Result<BenchTrainer<B>, String> {
    let cfg = args.shape.config();
    let vocab = cfg.vocab_size;
    let model = Qwen2::<B>::new(&cfg, device).map_err(|e| e.to_string())?;
    let sampling = SamplingSection {
        max_new_tokens: args.train_seq as u32,
        ..SamplingSection::default()
    };
    let mut tcfg = TrainerConfig::new(&LearnerSection::default(), &sampling);
    tcfg.optimizer_steps = 1;
    tcfg.micro_batch_tokens = crate::burn_learner::micro_batch_tokens::<B>(&cfg);
    let mut trainer: Trainer<B, Qwen2<B>> =
        Trainer::new(model, tcfg, None).map_err(|e| e.to_string())?;
    trainer.set_gate(StepGate::for_policy_gpu(args.lease, "learner")?);
    let mut rng = StdRng::seed_from_u64(3);
    // Behaviour log-probs near the random model's own (uniform over the vocabulary).
    let uniform = -(vocab as f32).ln();
    let samples: Vec<TrainSample> = (0..args.train_batch)
        .map(|i| TrainSample {
            prompt_tokens: random_tokens(&mut rng, 1, vocab),
            response_tokens: random_tokens(&mut rng, args.train_seq - 1, vocab),
            behaviour_logprobs: vec![uniform; args.train_seq - 1],
            advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
        })
        .collect();
    Ok((trainer, samples))
}

/// The concurrent load: generation calls at the largest batch (each followed by a learner step
/// when `train_steps > 0`) until `load_seconds` have passed; a progress line about every 10 s
/// (the timing-lease harness stops it with a signal, so the lines are what it reads).
fn load<B: AutodiffBackend>(
    args: &BenchArgs,
    device: &B::Device,
    progress: &dyn Fn(&str),
) -> Result<LoadResult, String> {
    let cfg = args.shape.config();
    let batch = args.batches.iter().copied().max().unwrap_or(1);
    let mut model = Qwen2::<B::InnerBackend>::new(&cfg, device).map_err(|e| e.to_string())?;
    let mut trainer = if args.train_steps > 0 {
        Some(bench_trainer::<B>(args, device)?)
    } else {
        None
    };
    let start = Instant::now();
    let mut last_line = Instant::now();
    progress(&format!(
        "load: generating bs{batch}{} for {:.0} s ({})",
        if trainer.is_some() {
            " with learner steps"
        } else {
            ""
        },
        args.load_seconds,
        if args.lease {
            "honouring the GPU timing lease"
        } else {
            "without the timing lease"
        }
    ));
    let mut r = LoadResult {
        seconds: 0.0,
        generate_calls: 0,
        forward_passes: 0,
        learner_steps: 0,
        generator_lease_wait_ms: 0.0,
    };
    while start.elapsed().as_secs_f64() < args.load_seconds {
        let seed = 100 + r.generate_calls;
        let (g, m) = generate_once(model, batch, args.prompt, args.new_tokens, seed, args.lease)?;
        model = m;
        r.generate_calls += 1;
        r.forward_passes += g.forward_passes;
        if let Some((trainer, samples)) = trainer.as_mut() {
            trainer.train_batch(samples).map_err(|e| e.to_string())?;
            r.learner_steps += 1;
        }
        if last_line.elapsed().as_secs_f64() >= 10.0 {
            last_line = Instant::now();
            progress(&format!(
                "load: {:.0} s, {} generation calls, {} passes, {} learner steps; lease waits {}",
                start.elapsed().as_secs_f64(),
                r.generate_calls,
                r.forward_passes,
                r.learner_steps,
                waits_line()
            ));
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    r.generator_lease_wait_ms = kevin::gpu::lease::wait_totals()
        .get("generator.step")
        .map_or(0.0, |w| w.waited_ms);
    Ok(r)
}

/// "generator.step 12 ms over 3400 holds (max 9 ms), ..." or "none".
fn waits_line() -> String {
    let waits = kevin::gpu::lease::wait_totals();
    if waits.is_empty() {
        return "none".into();
    }
    waits
        .iter()
        .map(|(k, w)| {
            format!(
                "{k} {:.0} ms over {} holds (max {:.1} ms)",
                w.waited_ms, w.holds, w.max_ms
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the benchmark on a backend named at run time: `device` "cuda" (burn's CUDA backend on
/// GPU 0) or "cpu" (NdArray), `dtype` "bf16" or "f32" (the CPU runs f32 only).
pub fn run_named(
    args: &BenchArgs,
    device: &str,
    dtype: &str,
    progress: &dyn Fn(&str),
) -> Result<BenchReport, String> {
    use burn::backend::{Autodiff, Cuda, NdArray};
    crate::cublas::set_mode(args.matmul);
    crate::qwen2::fused::SWITCH.set(args.fused);
    crate::flash::SWITCH.set(args.flash);
    crate::logprob::SWITCH.set(args.logprobs);
    crate::norm::SWITCH.set(args.norms);
    crate::stream::set_order(args.order);
    let generate = if args.fused { "fused" } else { "burn" };
    let generate = format!(
        "{generate}, attention {}, logprobs {}, norms {}, order {}",
        if args.flash { "flash" } else { "burn" },
        if args.logprobs { "fused" } else { "burn" },
        if args.norms { "fused" } else { "burn" },
        args.order.name()
    );
    if device == "cuda" {
        crate::cuda_setup::require_gpu("--device cuda")?;
    } else if args.lease {
        // There is no GPU to lease: the CPU's steps disturb no GPU timing.
        let args = BenchArgs {
            lease: false,
            ..args.clone()
        };
        return run_named(&args, device, dtype, progress);
    }
    match (device, dtype) {
        ("cuda", "bf16") => run::<Autodiff<Cuda<half::bf16>>>(
            args,
            &crate::cuda_setup::cuda_device(0),
            &format!(
                "burn cuda (fusion), bf16, matmul {}, generate {generate}",
                args.matmul.name()
            ),
            progress,
        ),
        ("cuda", "f32") => run::<Autodiff<Cuda<f32>>>(
            args,
            &crate::cuda_setup::cuda_device(0),
            &format!(
                "burn cuda (fusion), f32, matmul {}, generate {generate}",
                args.matmul.name()
            ),
            progress,
        ),
        ("cpu", "f32") => {
            run::<Autodiff<NdArray<f32>>>(args, &Default::default(), "burn ndarray, f32", progress)
        }
        (d, t) => Err(format!(
            "--device {d} --dtype {t}: expected cuda with bf16 or f32, or cpu with f32"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};

    #[test]
    fn tiny_benchmark_runs_on_the_cpu_and_counts_every_token() {
        let args = BenchArgs {
            batches: vec![1, 3],
            prompt: 8,
            new_tokens: 5,
            train_seq: 16,
            ..BenchArgs::quick(Shape::Tiny)
        };
        let lines = std::sync::Mutex::new(Vec::new());
        let report = run::<Autodiff<NdArray>>(&args, &Default::default(), "ndarray", &|l| {
            lines.lock().unwrap().push(l.to_string())
        })
        .unwrap();
        assert_eq!(report.generate.len(), 2);
        // One prefill pass and four decode passes for five new tokens.
        assert!(report.generate.iter().all(|g| g.forward_passes == 5));
        assert!(report.generate.iter().all(|g| g.tokens_per_s > 0.0));
        let l = report.learner.unwrap();
        assert_eq!(l.tokens, 32);
        assert!(l.tokens_per_s.is_finite() && l.tokens_per_s > 0.0);
        let lines = lines.into_inner().unwrap();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[2].starts_with("learner warm-up: "), "{lines:?}");
        // Every timed step in the order it ran, the median among them.
        assert_eq!(l.steps_seconds.len(), args.train_steps);
        assert!(l.steps_seconds.contains(&l.step_seconds));
        assert!(!l.warmup_seconds.is_empty() && l.warmup_seconds.len() <= WARMUP_STEPS);
        assert!(lines[3].contains("; in order "), "{lines:?}");
        assert!(report.params > 30_000, "{}", report.params);
    }

    #[test]
    fn the_learner_warm_up_runs_until_two_steps_agree() {
        // A test double for the learner's steps: their seconds, in order.
        let run = |secs: &[f64], max: usize| {
            let mut it = secs.iter().copied();
            settle(max, || it.next().ok_or_else(|| "no more steps".to_string()))
        };
        assert_eq!(run(&[1.0, 1.05], 6).unwrap(), [1.0, 1.05]);
        // Compilation in the first steps: it ends where two agree within 10%.
        assert_eq!(
            run(&[1.9, 0.30, 0.27, 0.26, 0.26], 6).unwrap(),
            [1.9, 0.30, 0.27, 0.26]
        );
        // Never settling: `max` steps.
        let doubling = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
        assert_eq!(run(&doubling, 6).unwrap().len(), 6);
        // A failed step ends it with the step's error.
        assert_eq!(run(&[1.0], 6).unwrap_err(), "no more steps");
    }

    #[test]
    fn the_load_runs_for_its_seconds_with_learner_steps() {
        let args = BenchArgs {
            batches: vec![2],
            new_tokens: 3,
            // The CPU has no GPU to lease: asked for, it is dropped (see `run_named`).
            lease: true,
            load_seconds: 0.3,
            ..BenchArgs::quick(Shape::Tiny)
        };
        let lines = std::sync::Mutex::new(Vec::new());
        let report = run_named(&args, "cpu", "f32", &|l| {
            lines.lock().unwrap().push(l.to_string())
        })
        .unwrap();
        let load = report.load.unwrap();
        assert!(load.seconds >= 0.3, "{}", load.seconds);
        assert!(load.generate_calls >= 1);
        assert_eq!(load.learner_steps, load.generate_calls);
        assert_eq!(load.forward_passes, 3 * load.generate_calls);
        assert_eq!(load.generator_lease_wait_ms, 0.0);
        assert!(lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("load: generating bs2 with learner steps")
                && l.contains("without the timing lease")));
    }

    #[test]
    fn unknown_shape_is_named() {
        assert!(Shape::parse("llama").unwrap_err().contains("llama"));
        for shape in Shape::ALL {
            assert_eq!(Shape::parse(shape.name()), Ok(shape));
        }
        assert_eq!(Shape::Qwen2_05b.config().num_hidden_layers, 24);
    }
}
