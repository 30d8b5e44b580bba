//! The file schema: every section as a serde struct with the paper's recipe as its defaults.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::rl::{ReturnAggregation, TurnCredit};

/// Asynchronous (off-policy) or synchronous (on-policy baseline) training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Generation never waits for the learner; stale groups are dropped.
    Async,
    /// Generation pauses while the learner trains; every group is on-policy.
    Sync,
}

/// Which policy writes the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// The simulated policy: no model; configured latency; canned or corpus answers.
    Simulated,
    /// A Qwen2 model in burn (`[policy.burn]`), sampled with continuous batching.
    Burn,
}

/// Whether the cpu environment compiles every candidate with NVRTC before g++ (`env.cpu_nvrtc`),
/// so that a kernel the GPU toolchain rejects is a compile error on the CPU too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuNvrtc {
    /// On where NVRTC is found; otherwise off, said once at startup (log level info).
    #[default]
    Auto,
    /// Always; the environment does not start without NVRTC.
    On,
    /// Never: g++ alone decides what compiles.
    Off,
}

/// Which kernel environment judges the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvKind {
    /// Everything simulated: configured latencies and outcome distributions.
    Simulated,
    /// Real static checks, launch-plan validation and NVRTC compilation in worker processes;
    /// correctness and timing simulated (and labelled so).
    Nvrtc,
    /// The CPU execution backend: candidates compiled against kevin's CUDA device model and
    /// judged by the real correctness protocol in worker processes; CPU timings.
    Cpu,
    /// The GPU harness: NVRTC CUBINs checked and timed on the GPU(s) in `kevin worker --role
    /// cuda` processes against kevin's eager baseline.
    Cuda,
    /// Remote evaluation: each candidate (as source) is a job on a NATS JetStream work queue
    /// (`[env.remote]`); `kevin worker-node` processes on any machine compile, check and time
    /// it with their own cpu or cuda environment and publish the outcome. Built by the actors
    /// crate (the core has no NATS client).
    Remote,
}

/// How the cuda environment times candidates on a GPU other kevin work may use (`env.timing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuTiming {
    /// Under the GPU-wide timing lease ([`crate::gpu::lease`]): a candidate is timed only while
    /// the generator's and the learner's steps (and other evaluations' checks) on its GPU are
    /// paused; they honour the lease between steps. For a policy and an evaluation that share
    /// a GPU (the default).
    Exclusive,
    /// No lease: timing runs beside whatever else runs on the GPU. Only for an evaluation on
    /// GPUs the policy does not use (`env.gpus` without GPU 0, the policy's), where nothing of
    /// kevin's disturbs it.
    Shared,
}

impl GpuTiming {
    /// Parses "exclusive" or "shared" (the CLI's `--timing`).
    pub fn parse(s: &str) -> Result<GpuTiming, String> {
        match s {
            "exclusive" => Ok(GpuTiming::Exclusive),
            "shared" => Ok(GpuTiming::Shared),
            other => Err(format!(
                "--timing {other}: expected \"exclusive\" (the GPU-wide timing lease) or \"shared\" (none)"
            )),
        }
    }

    /// Whether the lease is used.
    pub fn leased(self) -> bool {
        self == GpuTiming::Exclusive
    }
}

/// Which learner optimises the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LearnerKind {
    /// The simulated learner: the real loss on the batch, no model.
    Simulated,
    /// Trains the burn policy's model (`[policy.burn]`) with AdamW; needs `policy.kind = "burn"`.
    Burn,
}

/// Where the burn policy and learner run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnDevice {
    /// burn's NdArray backend on the CPU.
    Cpu,
    /// burn's CUDA backend on GPU 0.
    Cuda,
    /// CUDA when nvidia-smi lists a GPU, else the CPU.
    Auto,
}

/// Which matrix products of the burn policy and learner on CUDA go to cuBLAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnMatmul {
    /// None: burn's own (cubek's) matmul everywhere.
    Burn,
    /// The large ones (the learner's, prefill, the vocabulary head): fp32 compute through
    /// cuBLAS; small decode products stay with burn.
    Cublas,
}

/// How the burn policy's generation runs its cached forward pass on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnGenerate {
    /// The fused path: own kernels between cuBLAS products on a stream of its own.
    Fused,
    /// burn's layers, op by op (the reference).
    Burn,
}

/// How the burn learner's (and log-prob passes') causal attention runs on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnAttention {
    /// Own kernels without the score matrix, forward and backward (FlashAttention-2's
    /// recurrence).
    Flash,
    /// burn's ops: scores, mask, softmax, values (the reference).
    Burn,
}

/// How the burn learner's (and log-prob passes') chosen-token log-probabilities run on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnLogprobs {
    /// One kernel per direction over the logits in place (the softmax never materialised).
    Fused,
    /// burn's ops: the chosen rows in f32, shifted, exponentiated, summed (the reference).
    Burn,
}

/// How the burn learner's RMSNorm, bias additions, RoPE and SwiGLU run on CUDA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BurnNorms {
    /// Own kernels: RMSNorm in one pass per row each way, the sums over rows in one kernel, RoPE
    /// and SwiGLU in one kernel each way.
    Fused,
    /// burn's ops (the reference).
    Burn,
}

/// Where tasks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskSource {
    /// Synthetic task names for the simulated environment.
    Simulated,
    /// The task suite in `tasks.dir` (train split only).
    Suite,
}

/// The off-policy correction of the policy-gradient loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Correction {
    /// Clipped ratio against the behaviour log-probs.
    Clipped,
    /// Clip pi_theta / pi_prox, weight by pi_prox / pi_behaviour (capped).
    Decoupled,
}

/// `[run]`: the run's identity and lifecycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// Run name: the run directory is `<runs_dir>/<name>` unless `--run-dir` says otherwise.
    pub name: String,
    /// Parent folder of run directories.
    pub runs_dir: String,
    /// Seed of every random choice the system makes.
    pub seed: u64,
    /// "async" or "sync".
    pub mode: Mode,
    /// Stop after this many learner steps (0: run until stopped).
    pub max_steps: u64,
    /// Write a checkpoint every this many learner steps (and always at shutdown).
    pub checkpoint_every: u64,
    /// How long a shutdown waits for in-flight episodes before it abandons them (seconds).
    pub drain_timeout_s: f64,
    /// Disk budget of the run directory (GB, 0: none). Over it, the oldest rotated episode and
    /// trace archives are removed; the write-ahead log, checkpoints and metrics never are. May
    /// change when a run resumes.
    pub max_disk_gb: f64,
    /// Below this much free space (MB) on the run directory's disk, the daemon stops cleanly
    /// (drain, checkpoint, exit 1 naming the cause) before a write fails. May change when a run
    /// resumes.
    pub min_free_disk_mb: u64,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            name: "default".into(),
            runs_dir: "runs".into(),
            seed: 0,
            mode: Mode::Async,
            max_steps: 0,
            checkpoint_every: 10,
            drain_timeout_s: 60.0,
            max_disk_gb: 50.0,
            min_free_disk_mb: 1024,
        }
    }
}

/// `[tasks]`: the task suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksSection {
    /// "suite" (the task files in `dir`) or "simulated" (synthetic tasks).
    pub source: TaskSource,
    /// The task suite's folder, or several joined by `:` (e.g. the hand-written suite and a
    /// folder from `kevin tasks generate`: `"tasks:/data/gen"`).
    pub dir: String,
    /// Size preset prompts and evaluation use: "small" (CPU) or "gpu".
    pub preset: crate::tasks::Preset,
    /// Number of synthetic tasks when `source = "simulated"`.
    pub simulated_count: u32,
    /// A `kevin eval --checkpoint --json` file of the starting policy on training tasks (e.g.
    /// `kevin eval --split train --dir D --json F`), several joined by `:`, or "" for none. At a
    /// fresh start (not on resume, whose checkpoint keeps the sampler's state) each task it covers
    /// starts its sampling average at its share of correct turns there, instead of 0.5: GRPO learns nothing from a
    /// task the policy always or never solves, and on programs it has never seen most are never
    /// solved, so without a prior a run spends its first visit to every task finding that out.
    pub prior: String,
    /// The sampling weight of a task whose groups carry no signal (always or never solved); the
    /// weight of a task solved half the time is `floor + 1`. Small, never zero: every task is
    /// revisited.
    pub floor: f64,
}

impl Default for TasksSection {
    fn default() -> Self {
        TasksSection {
            source: TaskSource::Suite,
            dir: "tasks".into(),
            preset: crate::tasks::Preset::Gpu,
            simulated_count: 16,
            prior: String::new(),
            floor: crate::sampler::FLOOR_WEIGHT,
        }
    }
}

/// `[rollout]`: episodes and groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// m: trajectories per task group.
    pub trajectories: u32,
    /// n: refinement turns per trajectory.
    pub turns: u32,
    /// Groups being generated or waiting in the replay queue at once. This is the system's one
    /// global bound on work in flight: when it is reached, the task sampler waits.
    pub max_inflight_groups: u32,
    /// Character budget of a prompt; the earliest turns of the history are cut first. 0 (the
    /// default): what fits the burn policy's slots next to a response (`policy.burn.max_len`
    /// less `sampling.max_new_tokens` or a quarter of it, at 2.5 characters a token), 24,000 for
    /// the other policies. A burn policy's budget that does not fit is refused.
    pub prompt_budget_chars: u32,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            trajectories: 16,
            turns: 4,
            max_inflight_groups: 16,
            prompt_budget_chars: 0,
        }
    }
}

/// `[policy.simulated]`: the simulated policy's cost model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimPolicySection {
    /// Fixed cost of one batched forward pass sequence (ms).
    pub batch_ms: f64,
    /// Cost per generated token of a batch (ms); a batch costs batch_ms + tokens * token_ms.
    pub token_ms: f64,
    /// Tokens in each simulated response.
    pub response_tokens: u32,
    /// Probability that a response has no kernel at all (a format error).
    pub p_format_error: f64,
    /// A folder of `<task>.cu` answers (e.g. "tasks/solutions"): when set, the simulated policy
    /// answers each task with its file, sometimes broken (`p_mutate`), instead of a canned kernel.
    pub corpus: String,
    /// Probability that a corpus answer is broken on the first turn (halved at each later turn).
    pub p_mutate: f64,
}

impl Default for SimPolicySection {
    fn default() -> Self {
        SimPolicySection {
            batch_ms: 5.0,
            token_ms: 0.02,
            response_tokens: 64,
            p_format_error: 0.05,
            corpus: String::new(),
            p_mutate: 0.3,
        }
    }
}

/// `[policy.burn]`: the burn policy's model (shared by the burn learner, which trains it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BurnPolicySection {
    /// A Hugging Face Qwen2 directory: config.json and tokenizer.json, and model.safetensors (or
    /// shards). Without a weights file the model is initialised randomly from `seed` (the log
    /// says so). Relative to the working directory. A resumed run loads the run directory's latest
    /// checkpoint instead.
    pub checkpoint: String,
    /// Seed of the random initialisation when `checkpoint` has no weights file.
    pub seed: u64,
    /// "cpu" (burn NdArray, f32), "cuda" (burn CUDA, f32, GPU 0) or "auto" (cuda when
    /// nvidia-smi lists a GPU, else cpu).
    pub device: BurnDevice,
    /// Tokens of one sequence, prompt + response (capped at the model's
    /// max_position_embeddings); a longer prompt gets an empty response.
    pub max_len: u32,
    /// "cublas" (default): large matrix products on CUDA through cuBLAS, fp32 compute; "burn":
    /// burn's own matmul everywhere. Ignored on the CPU.
    pub matmul: BurnMatmul,
    /// "fused" (default): generation's cached forward pass on CUDA as one backend extension
    /// (own kernels and cuBLAS, no per-op host work); "burn": burn's layers (the reference
    /// path). Ignored on the CPU.
    pub generate: BurnGenerate,
    /// "flash" (default): the learner's causal attention on CUDA without the `[t, t]` score
    /// matrix, forward and backward as own kernels (its memory per position no longer grows with
    /// the sequence, so micro-batches grow); "burn": burn's ops (the reference path). Ignored on
    /// the CPU.
    pub attention: BurnAttention,
    /// "fused" (default): the chosen tokens' log-probabilities on CUDA as one kernel per
    /// direction over the logits in place (nothing of the vocabulary's size kept besides the
    /// logits and their gradient); "burn": burn's ops (the reference path). Ignored on the CPU.
    pub logprobs: BurnLogprobs,
    /// "fused" (default): RMSNorm (forward and backward), the bias additions' gradients, RoPE,
    /// SwiGLU, the global gradient norm's sum of squares, AdamW's step and the token
    /// embedding's gradient on CUDA as own kernels (`kevin_policy::norm`); "burn": burn's ops
    /// (the reference path). Ignored on the CPU.
    pub norms: BurnNorms,
}

impl Default for BurnPolicySection {
    fn default() -> Self {
        BurnPolicySection {
            checkpoint: "models/kevin-tiny".into(),
            seed: 0,
            device: BurnDevice::Auto,
            max_len: 4096,
            matmul: BurnMatmul::Cublas,
            generate: BurnGenerate::Fused,
            attention: BurnAttention::Flash,
            logprobs: BurnLogprobs::Fused,
            norms: BurnNorms::Fused,
        }
    }
}

/// `[policy]`: the language model that writes kernels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicySection {
    /// Which policy runs ("simulated" or "burn").
    pub kind: PolicyKind,
    /// Cost model of the simulated policy.
    pub simulated: SimPolicySection,
    /// Model, device and sequence length of the burn policy.
    pub burn: BurnPolicySection,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            kind: PolicyKind::Simulated,
            simulated: SimPolicySection::default(),
            burn: BurnPolicySection::default(),
        }
    }
}

/// `[sampling]`: how the policy samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingSection {
    /// Sampling temperature (0.9 in training and evaluation).
    pub temperature: f64,
    /// Nucleus sampling mass (1.0: off).
    pub top_p: f64,
    /// Keep only the k most likely tokens (0: off).
    pub top_k: u32,
    /// Maximum tokens generated per turn.
    pub max_new_tokens: u32,
    /// Largest batch of requests one forward pass serves.
    pub max_batch: u32,
    /// Strings that end a response.
    pub stop: Vec<String>,
}

impl Default for SamplingSection {
    fn default() -> Self {
        SamplingSection {
            temperature: 0.9,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 4096,
            max_batch: 64,
            stop: Vec::new(),
        }
    }
}

/// `[env.simulated]`: the simulated kernel environment's latencies and outcome distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimEnvSection {
    /// Compile latency (ms).
    pub compile_ms: f64,
    /// Correctness-check latency (ms).
    pub verify_ms: f64,
    /// Timing latency (ms).
    pub profile_ms: f64,
    /// Probability of a compile error on the first turn.
    pub p_compile_error: f64,
    /// Probability that a compiled kernel is wrong on the first turn.
    pub p_wrong: f64,
    /// Probability that a kernel crashes its worker.
    pub p_crash: f64,
    /// Factor applied to the failure probabilities at each later turn (refinement helps).
    pub improve_per_turn: f64,
    /// Median speedup of a correct kernel (log-normal around it).
    pub median_speedup: f64,
    /// Probability that compiling panics inside the environment (to exercise supervision).
    pub p_panic: f64,
    /// Probability that verification fails in the harness, not the candidate (a simulated
    /// out-of-memory of the harness's buffers): to exercise how harness errors are kept out of
    /// training.
    pub p_harness_error: f64,
    /// Probability that verification finds the machine too busy to judge (a starved worker),
    /// drawn anew at every attempt: to exercise how busy candidates are sent again.
    pub p_busy: f64,
}

impl Default for SimEnvSection {
    fn default() -> Self {
        SimEnvSection {
            compile_ms: 1.0,
            verify_ms: 2.0,
            profile_ms: 2.0,
            p_compile_error: 0.3,
            p_wrong: 0.3,
            p_crash: 0.02,
            improve_per_turn: 0.7,
            median_speedup: 0.8,
            p_panic: 0.0,
            p_harness_error: 0.0,
            p_busy: 0.0,
        }
    }
}

/// `[env]`: the kernel environment (compile, verify, profile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvSection {
    /// Which environment runs: "simulated", "nvrtc", "cpu", "cuda" or "remote".
    pub kind: EnvKind,
    /// GPU ordinals the cuda environment evaluates on (one worker pool per GPU).
    pub gpus: Vec<u32>,
    /// Target architecture of compilation: "auto" (the GPU's own, asked from nvidia-smi; sm_90,
    /// the H200, when there is no GPU) or an architecture such as "sm_90".
    pub arch: String,
    /// Compile workers (compilation is CPU-bound and parallel).
    pub compile_workers: u32,
    /// Verification workers (cpu: in all; cuda: per GPU, where they also time; one request holds
    /// a GPU at a time; the others wait or restart meanwhile).
    pub verify_workers: u32,
    /// Profiling workers (simulated environments; the cuda environment's workers time
    /// candidates under an exclusive lock of their GPU instead).
    pub profile_workers: u32,
    /// Deadline of one compilation (ms). Like the other two stage deadlines it counts the
    /// work's own time: what the compiler or worker waits for a CPU on a machine busier than its
    /// cores moves it on, up to 5x, past which the candidate gets a harness error, not a timeout.
    pub compile_timeout_ms: u64,
    /// The cpu environment's NVRTC front-end: "auto" (default), "on" or "off" ([`CpuNvrtc`]).
    pub cpu_nvrtc: CpuNvrtc,
    /// Deadline of one correctness check (ms).
    pub verify_timeout_ms: u64,
    /// Deadline of one timing run (ms).
    pub profile_timeout_ms: u64,
    /// How candidates are timed on a GPU: "exclusive" (the default; under the GPU-wide timing
    /// lease, which the burn generator and learner honour between steps) or "shared" (no
    /// lease; only where the evaluation's GPUs are not the policy's). See [`GpuTiming`].
    pub timing: GpuTiming,
    /// Keys of the evaluation cache (`kevin::env::cache`): a candidate whose exact ```cuda
    /// block was already judged for the same task gets that verdict instead of another
    /// compile, check and timing (harness errors and timeouts are never kept). 0 turns it off;
    /// the default, 4096, holds a few training steps' candidates.
    /// Real environments only (cpu, cuda, remote); the simulated ones draw their verdicts.
    pub cache_entries: u32,
    /// The simulated environment's parameters.
    pub simulated: SimEnvSection,
    /// The remote environment's bus, queue and credentials (`kind = "remote"`).
    pub remote: RemoteEnvSection,
}

/// `[env.remote]`: remote evaluation through NATS JetStream (`env.kind = "remote"`). The daemon
/// publishes every evaluation as a job to the work-queue stream `<prefix>_JOBS`; worker nodes
/// (`kevin worker-node`) pull jobs, evaluate them and publish the outcome to `<prefix>_RESULTS`
/// before they acknowledge the job. A job whose node dies or stalls is handed to another node
/// after `ack_wait_ms`; after `max_deliver` deliveries it is a harness error (not the
/// candidate's fault). Secrets never go in this file: the password is read from the
/// environment variable `password_env` names, an nkey seed or a credentials file from its file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteEnvSection {
    /// NATS server URL(s), comma-separated ("nats://10.0.0.5:4222,nats://10.0.0.6:4222"). A URL
    /// must not carry a password (`user`/`password_env` do).
    pub url: String,
    /// Prefix of the stream, consumer, bucket and subject names; fleets sharing one server differ
    /// by it. Letters, digits, `-` and `_`.
    pub prefix: String,
    /// Most jobs in flight: the daemon's concurrent evaluations and the job consumer's
    /// max_ack_pending (jobs handed to nodes and not yet acknowledged, all nodes together).
    pub max_inflight: u32,
    /// How long a node may hold a job before JetStream hands it to another node (ms). Must
    /// exceed `compile_timeout_ms + verify_timeout_ms + profile_timeout_ms`, which the node's
    /// own environment enforces; a node reports a job it still evaluates in progress every
    /// third of it (a busy node's deadlines move on), so only a node that is gone loses its job.
    pub ack_wait_ms: u64,
    /// Deliveries of one job (the first and the redeliveries) before it is given up: the
    /// candidate then gets a harness error, which is never trained on.
    pub max_deliver: u32,
    /// How long the daemon waits for one job's outcome in all, queueing for a node included
    /// (ms); then it is a harness error. At least `ack_wait_ms`.
    pub job_timeout_ms: u64,
    /// User name for user/password authentication ("": none).
    pub user: String,
    /// Name of the environment variable that holds the password of `user`.
    pub password_env: String,
    /// File holding an nkey seed (nkey authentication; "": none).
    pub nkey_file: String,
    /// A credentials file (JWT and nkey seed, `.creds`; "": none).
    pub creds_file: String,
    /// Require TLS (also implied by a `tls://` URL or any of the files below).
    pub tls: bool,
    /// PEM file of the certificate authority to trust for the server's certificate ("": the
    /// system's roots).
    pub tls_ca_file: String,
    /// PEM client certificate for mutual TLS ("": none); needs `tls_key_file`.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
}

impl Default for RemoteEnvSection {
    fn default() -> Self {
        RemoteEnvSection {
            url: "nats://127.0.0.1:4222".into(),
            prefix: "kevin".into(),
            max_inflight: 64,
            ack_wait_ms: 90_000,
            max_deliver: 3,
            job_timeout_ms: 600_000,
            user: String::new(),
            password_env: "KEVIN_NATS_PASSWORD".into(),
            nkey_file: String::new(),
            creds_file: String::new(),
            tls: false,
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
        }
    }
}

impl Default for EnvSection {
    fn default() -> Self {
        EnvSection {
            kind: EnvKind::Simulated,
            gpus: vec![0],
            arch: "auto".into(),
            compile_workers: 2,
            verify_workers: 1,
            profile_workers: 1,
            compile_timeout_ms: 10_000,
            cpu_nvrtc: CpuNvrtc::Auto,
            verify_timeout_ms: 20_000,
            profile_timeout_ms: 30_000,
            timing: GpuTiming::Exclusive,
            cache_entries: 4096,
            simulated: SimEnvSection::default(),
            remote: RemoteEnvSection::default(),
        }
    }
}

/// `[replay]`: returns, advantages, staleness and batching.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplaySection {
    /// Task groups per learner batch.
    pub tasks_per_batch: u32,
    /// Largest accepted gap between the learner's version and a group's oldest turn.
    pub max_staleness: u64,
    /// Discount of later turns' scores.
    pub gamma: f64,
    /// "sum" or "max" of discounted later scores.
    pub aggregation: ReturnAggregation,
    /// What a turn is credited with before discounting: "score" (its own score, the paper's)
    /// or "improvement" (what it adds over the best score before it in its trajectory, so a
    /// resubmitted kernel earns nothing again and a repair earns its whole score), or "gain"
    /// (that difference unfloored: a turn that breaks or slows a kernel the trajectory already
    /// had is credited with the loss).
    pub credit: TurnCredit,
    /// Divide advantages by the group's standard deviation.
    pub std_normalize: bool,
    /// Keep a write-ahead log so accepted groups survive a crash.
    pub wal: bool,
    /// Size (KiB) at which the write-ahead log starts a new segment. Segments whose groups are
    /// all trained on (or dropped) and covered by a checkpoint are deleted, so the log holds
    /// about what is pending plus one segment. May change when a run resumes.
    pub wal_segment_kb: u64,
}

impl Default for ReplaySection {
    fn default() -> Self {
        ReplaySection {
            tasks_per_batch: 8,
            max_staleness: 2,
            gamma: 0.4,
            aggregation: ReturnAggregation::Sum,
            credit: TurnCredit::Score,
            std_normalize: false,
            wal: true,
            wal_segment_kb: DEFAULT_WAL_SEGMENT_KB,
        }
    }
}

/// Default size of a write-ahead log segment (KiB): 64 MiB.
pub const DEFAULT_WAL_SEGMENT_KB: u64 = 64 << 10;

/// `[learner.simulated]`: the simulated learner's cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimLearnerSection {
    /// Cost of one optimizer step (ms).
    pub step_ms: f64,
}

impl Default for SimLearnerSection {
    fn default() -> Self {
        SimLearnerSection { step_ms: 20.0 }
    }
}

/// `[learner]`: the loss and the optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerSection {
    /// Which learner runs ("simulated", or "burn": trains `[policy.burn]`'s model, and needs
    /// policy.kind = "burn").
    pub kind: LearnerKind,
    /// Off-policy correction: "clipped" or "decoupled".
    pub correction: Correction,
    /// Learning rate (constant after warm-up).
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup_steps: u64,
    /// Optimizer steps per batch.
    pub optimizer_steps: u32,
    /// Lower clip offset.
    pub clip_low: f64,
    /// Upper clip offset (clip-higher).
    pub clip_high: f64,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
    /// KL coefficient to a reference policy (0: off, as in the recipe).
    pub kl_coef: f64,
    /// Cap of the decoupled objective's importance weight.
    pub decoupled_weight_cap: f64,
    /// The simulated learner's cost.
    pub simulated: SimLearnerSection,
}

impl Default for LearnerSection {
    fn default() -> Self {
        LearnerSection {
            kind: LearnerKind::Simulated,
            correction: Correction::Clipped,
            lr: 1e-6,
            warmup_steps: 10,
            optimizer_steps: 2,
            clip_low: 0.2,
            clip_high: 0.28,
            grad_clip: 0.05,
            kl_coef: 0.0,
            decoupled_weight_cap: 5.0,
            simulated: SimLearnerSection::default(),
        }
    }
}

/// `[telemetry]`: logs, trace and metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySection {
    /// Log filter (tracing's EnvFilter syntax), e.g. "info" or "kevin=debug".
    pub log_level: String,
    /// Write the Chrome trace-event file.
    pub trace: bool,
    /// Write episodes.jsonl (every turn's prompt, response, outcome and score).
    pub episodes: bool,
    /// Size (KiB) at which episodes.jsonl, metrics.jsonl and a session's trace file are closed,
    /// gzipped (`episodes.NNNNNN.jsonl.gz`, `metrics.NNNNNN.jsonl.gz`, `trace-NNNN.pNNNN.json.gz`)
    /// and started afresh (0: never).
    /// May change when a run resumes.
    pub rotate_kb: u64,
    /// Where `kevin train` serves `/metrics` for Prometheus (`host:port`, e.g.
    /// "127.0.0.1:9464"; "" for off, the default): the last step's metrics, turns by outcome,
    /// the worker pools' counters (`kevin::prometheus` lists them). Bound at the daemon's start:
    /// an address it cannot bind stops it with an error naming this key.
    pub prometheus: String,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        TelemetrySection {
            log_level: "info".into(),
            trace: true,
            episodes: true,
            rotate_kb: 256 << 10,
            prometheus: String::new(),
        }
    }
}

/// The file-facing configuration: every section with its defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigFile {
    /// `[run]`
    pub run: RunSection,
    /// `[tasks]`
    pub tasks: TasksSection,
    /// `[rollout]`
    pub rollout: RolloutSection,
    /// `[policy]`
    pub policy: PolicySection,
    /// `[sampling]`
    pub sampling: SamplingSection,
    /// `[env]`
    pub env: EnvSection,
    /// `[replay]`
    pub replay: ReplaySection,
    /// `[learner]`
    pub learner: LearnerSection,
    /// `[telemetry]`
    pub telemetry: TelemetrySection,
}

/// Every dotted key the schema knows, for documentation and `--help`.
pub fn known_keys() -> BTreeSet<String> {
    flatten(&toml::Table::try_from(ConfigFile::default()).expect("defaults serialise"))
        .into_keys()
        .collect()
}

/// A config's values by dotted key (`learner.lr`): tables flattened, arrays kept as values.
pub fn flatten(table: &toml::Table) -> BTreeMap<String, toml::Value> {
    fn walk(t: &toml::Table, prefix: &str, out: &mut BTreeMap<String, toml::Value>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => walk(sub, &key, out),
                v => {
                    out.insert(key, v.clone());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(table, "", &mut out);
    out
}
