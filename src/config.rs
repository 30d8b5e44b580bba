//! The experiment configuration: one typed struct, loaded in layers and validated once.
//!
//! Layers, later ones winning: built-in defaults (the paper's recipe) < a TOML file <
//! `KEVIN__SECTION__KEY=value` environment variables. Loading is two-stage, as in ripgrep's
//! LowArgs -> HiArgs: the serde-facing [`ConfigFile`] is merged from the layers, every key is
//! checked against the known schema (unknown keys are rejected, never ignored), and
//! [`Config::from_file`] validates values and derives what the runtime needs. Every error is one
//! line naming the key, the value and what is allowed. The resolved config is written into the run
//! directory ([`Config::to_toml`]) so a run always records what it ran with.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::rl::ReturnAggregation;

/// The prefix of environment overrides: `KEVIN__ROLLOUT__TURNS=8` sets `rollout.turns`.
pub const ENV_PREFIX: &str = "KEVIN";
/// Separator between prefix, section and key in environment overrides.
pub const ENV_SEPARATOR: &str = "__";

/// A configuration error: always a single line naming the offending key or file.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// The config file could not be read or parsed.
    #[error("config file {}: {}", one_line(.path), one_line(.reason))]
    File {
        /// The file.
        path: String,
        /// Why it failed, as one line.
        reason: String,
    },
    /// A key that the schema does not know.
    #[error("unknown config key `{key}` (from {origin}); allowed keys{section}: {allowed}")]
    UnknownKey {
        /// The dotted key.
        key: String,
        /// Where it came from: the file or the environment variable.
        origin: String,
        /// " in [section]" or empty for the top level.
        section: String,
        /// The allowed keys at that level.
        allowed: String,
    },
    /// A value that does not fit its key.
    #[error("config key `{key}` = {value} is invalid: {allowed}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// The offending value as written.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

/// Keeps an error on one line whatever the input held: control characters are escaped.
fn one_line(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.escape_debug().to_string()
    } else {
        s.to_string()
    }
}

fn invalid(key: &str, value: impl std::fmt::Display, allowed: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: one_line(key),
        value: one_line(&value.to_string()),
        allowed: one_line(&allowed.into()),
    }
}

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
        }
    }
}

/// `[tasks]`: the task suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksSection {
    /// "suite" (the task files in `dir`) or "simulated" (synthetic tasks).
    pub source: TaskSource,
    /// The task suite's folder.
    pub dir: String,
    /// Size preset prompts and evaluation use: "small" (CPU) or "gpu".
    pub preset: crate::tasks::Preset,
    /// Number of synthetic tasks when `source = "simulated"`.
    pub simulated_count: u32,
}

impl Default for TasksSection {
    fn default() -> Self {
        TasksSection {
            source: TaskSource::Suite,
            dir: "tasks".into(),
            preset: crate::tasks::Preset::Gpu,
            simulated_count: 16,
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
    /// Character budget of a prompt; the earliest turns of the history are cut first.
    pub prompt_budget_chars: u32,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            trajectories: 16,
            turns: 4,
            max_inflight_groups: 16,
            prompt_budget_chars: 24_000,
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
}

impl Default for BurnPolicySection {
    fn default() -> Self {
        BurnPolicySection {
            checkpoint: "models/kevin-tiny".into(),
            seed: 0,
            device: BurnDevice::Auto,
            max_len: 4096,
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
        }
    }
}

/// `[env]`: the kernel environment (compile, verify, profile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvSection {
    /// Which environment runs: "simulated", "nvrtc", "cpu" or "cuda".
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
    /// Deadline of one compilation (ms).
    pub compile_timeout_ms: u64,
    /// Deadline of one correctness check (ms).
    pub verify_timeout_ms: u64,
    /// Deadline of one timing run (ms).
    pub profile_timeout_ms: u64,
    /// The simulated environment's parameters.
    pub simulated: SimEnvSection,
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
            verify_timeout_ms: 20_000,
            profile_timeout_ms: 30_000,
            simulated: SimEnvSection::default(),
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
    /// Divide advantages by the group's standard deviation.
    pub std_normalize: bool,
    /// Keep a write-ahead log so accepted groups survive a crash.
    pub wal: bool,
}

impl Default for ReplaySection {
    fn default() -> Self {
        ReplaySection {
            tasks_per_batch: 8,
            max_staleness: 2,
            gamma: 0.4,
            aggregation: ReturnAggregation::Sum,
            std_normalize: false,
            wal: true,
        }
    }
}

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
}

impl Default for TelemetrySection {
    fn default() -> Self {
        TelemetrySection {
            log_level: "info".into(),
            trace: true,
            episodes: true,
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

/// The validated runtime configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The validated sections.
    pub file: ConfigFile,
    /// Where the layers came from, for the log ("defaults", the file, the overrides).
    pub sources: Vec<String>,
}

impl std::ops::Deref for Config {
    type Target = ConfigFile;
    fn deref(&self) -> &ConfigFile {
        &self.file
    }
}

/// Environment overrides present in `vars`, as (dotted key, variable name, value).
fn env_overrides(vars: &[(String, String)]) -> Vec<(String, String, String)> {
    let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
    vars.iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(&prefix)?;
            let key = rest
                .split(ENV_SEPARATOR)
                .map(str::to_ascii_lowercase)
                .collect::<Vec<_>>()
                .join(".");
            Some((key, k.clone(), v.clone()))
        })
        .collect()
}

fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) {
    let mut parts = key.split('.').peekable();
    let mut current = table;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            current.insert(part.to_string(), value);
            return;
        }
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        current = entry.as_table_mut().expect("just made a table");
    }
}

/// Checks every key of `user` against the schema `known`; returns the first unknown key.
fn find_unknown(user: &toml::Table, known: &toml::Table, prefix: &str) -> Option<(String, String)> {
    for (k, v) in user {
        let dotted = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match known.get(k) {
            None => {
                let allowed = known.keys().cloned().collect::<Vec<_>>().join(", ");
                return Some((dotted, allowed));
            }
            Some(toml::Value::Table(kt)) => {
                if let toml::Value::Table(ut) = v {
                    if let Some(found) = find_unknown(ut, kt, &dotted) {
                        return Some(found);
                    }
                }
            }
            Some(_) => {}
        }
    }
    None
}

fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut v = table.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

/// Turns serde's "invalid type: string \"x\", expected u32" plus the key we can find in the message
/// into our one-line error. serde's messages from toml name the key path in the form
/// "... for key `rollout.turns`" or (toml) with a table path; we search the merged table instead.
fn type_error(message: &str, merged: &toml::Table) -> ConfigError {
    let line = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    // toml's deserializer reports the failing key path as `key` in backticks or in the form
    // "in `section.key`": find the longest dotted path that exists in the merged table.
    let mut best: Option<String> = None;
    for piece in line.split('`') {
        if lookup(merged, piece).is_some() && best.as_ref().is_none_or(|b| piece.len() > b.len()) {
            best = Some(piece.to_string());
        }
    }
    match best {
        Some(key) => {
            let value = lookup(merged, &key)
                .map(|v| v.to_string())
                .unwrap_or_default();
            invalid(&key, value, line)
        }
        None => ConfigError::Invalid {
            key: "?".into(),
            value: "?".into(),
            allowed: line,
        },
    }
}

impl ConfigFile {
    /// Layers defaults < `path` (when given) < the `KEVIN__*` variables in `vars` with the
    /// `config` crate, and checks keys and types. Values are validated by [`Config::from_file`].
    ///
    /// Unknown keys are looked for in each layer separately, before merging, so the error can
    /// name the file or the environment variable that brought the key in.
    pub fn load(
        path: Option<&Path>,
        vars: &[(String, String)],
    ) -> Result<(ConfigFile, Vec<String>), ConfigError> {
        let defaults = ConfigFile::default();
        let known = toml::Table::try_from(&defaults).expect("defaults serialise");
        let mut builder = config::Config::builder()
            .add_source(config::Config::try_from(&defaults).expect("defaults serialise"));
        let mut sources = vec!["defaults".to_string()];
        if let Some(path) = path {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
            let table: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::File {
                        path: shown.clone(),
                        reason: e
                            .to_string()
                            .lines()
                            .next()
                            .unwrap_or("not valid TOML")
                            .to_string(),
                    })?;
            if let Some((key, allowed)) = find_unknown(&table, &known, "") {
                return Err(unknown(key, shown.clone(), allowed));
            }
            builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
            sources.push(shown);
        }
        let mut env = config::Map::new();
        for (key, var, raw) in env_overrides(vars) {
            let mut single = toml::Table::new();
            set_dotted(&mut single, &key, toml::Value::Boolean(true));
            if let Some((key, allowed)) = find_unknown(&single, &known, "") {
                return Err(unknown(key, format!("environment variable {var}"), allowed));
            }
            env.insert(var.clone(), raw.clone());
            sources.push(format!("{var}={raw}"));
        }
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator(ENV_SEPARATOR)
                .separator(ENV_SEPARATOR)
                .try_parsing(true)
                .source(Some(env)),
        );
        let layered = builder.build().map_err(|e| ConfigError::File {
            path: path
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(none)".into()),
            reason: e.to_string(),
        })?;
        let merged: toml::Table = layered.clone().try_deserialize().unwrap_or_default();
        let file: ConfigFile = layered
            .try_deserialize()
            .map_err(|e| type_error(&e.to_string(), &merged))?;
        Ok((file, sources))
    }
}

fn unknown(key: String, origin: String, allowed: String) -> ConfigError {
    let section = match key.rsplit_once('.') {
        Some((s, _)) => format!(" in [{s}]"),
        None => String::new(),
    };
    ConfigError::UnknownKey {
        key: one_line(&key),
        origin: one_line(&origin),
        section: one_line(&section),
        allowed: one_line(&allowed),
    }
}

fn check_range(key: &str, v: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= lo && v <= hi {
        Ok(())
    } else {
        Err(invalid(key, v, format!("must be between {lo} and {hi}")))
    }
}

fn check_min(key: &str, v: u64, min: u64) -> Result<(), ConfigError> {
    if v >= min {
        Ok(())
    } else {
        Err(invalid(key, v, format!("must be at least {min}")))
    }
}

/// The burn policy and learner come as a pair (the learner trains the policy's model and
/// publishes it to the policy), and the model directory must hold what they read.
fn check_burn(f: &ConfigFile) -> Result<(), ConfigError> {
    let (policy, learner) = (f.policy.kind, f.learner.kind);
    if learner == LearnerKind::Burn && policy != PolicyKind::Burn {
        return Err(invalid(
            "learner.kind",
            "\"burn\"",
            "needs policy.kind = \"burn\" (it trains the burn policy's model)",
        ));
    }
    if policy == PolicyKind::Burn && learner != LearnerKind::Burn {
        return Err(invalid(
            "policy.kind",
            "\"burn\"",
            "needs learner.kind = \"burn\" (only the burn learner publishes weights it can load)",
        ));
    }
    if policy != PolicyKind::Burn {
        return Ok(());
    }
    let b = &f.policy.burn;
    let dir = Path::new(&b.checkpoint);
    let shown = format!("{:?}", b.checkpoint);
    if b.checkpoint.is_empty() || !dir.is_dir() {
        return Err(invalid(
            "policy.burn.checkpoint",
            shown,
            "must be a Hugging Face model directory (config.json, tokenizer.json, model.safetensors); not found",
        ));
    }
    for file in ["config.json", "tokenizer.json"] {
        if !dir.join(file).is_file() {
            return Err(invalid(
                "policy.burn.checkpoint",
                shown,
                format!("{} is missing", dir.join(file).display()),
            ));
        }
    }
    check_min("policy.burn.max_len", b.max_len.into(), 2)?;
    Ok(())
}

impl Config {
    /// Loads and validates: the one entry point the CLI uses.
    pub fn load(path: Option<&Path>, vars: &[(String, String)]) -> Result<Config, ConfigError> {
        let (file, sources) = ConfigFile::load(path, vars)?;
        let mut config = Config::from_file(file)?;
        config.sources = sources;
        Ok(config)
    }

    /// Validates every value of `file`.
    pub fn from_file(file: ConfigFile) -> Result<Config, ConfigError> {
        let f = &file;
        if f.run.name.is_empty() || f.run.name.contains(['/', '\\']) || f.run.name.starts_with('.')
        {
            return Err(invalid(
                "run.name",
                format!("{:?}", f.run.name),
                "a non-empty name without path separators",
            ));
        }
        check_min("run.checkpoint_every", f.run.checkpoint_every, 1)?;
        check_range("run.drain_timeout_s", f.run.drain_timeout_s, 0.0, 86_400.0)?;
        check_min("tasks.simulated_count", f.tasks.simulated_count.into(), 1)?;
        if f.env.kind != EnvKind::Simulated && f.tasks.source != TaskSource::Suite {
            return Err(invalid(
                "env.kind",
                format!("{:?}", format!("{:?}", f.env.kind).to_lowercase()),
                "needs tasks.source = \"suite\" (real compilation needs real tasks)",
            ));
        }
        let arch_ok = f.env.arch == "auto"
            || (f.env.arch.starts_with("sm_")
                && f.env.arch[3..].parse::<u32>().is_ok_and(|v| v >= 50));
        if !arch_ok {
            return Err(invalid(
                "env.arch",
                format!("{:?}", f.env.arch),
                "\"auto\" or an architecture such as \"sm_90\"",
            ));
        }
        check_range(
            "policy.simulated.p_mutate",
            f.policy.simulated.p_mutate,
            0.0,
            1.0,
        )?;
        check_min("rollout.trajectories", f.rollout.trajectories.into(), 1)?;
        check_min("rollout.turns", f.rollout.turns.into(), 1)?;
        check_min(
            "rollout.max_inflight_groups",
            f.rollout.max_inflight_groups.into(),
            1,
        )?;
        check_min(
            "rollout.prompt_budget_chars",
            f.rollout.prompt_budget_chars.into(),
            256,
        )?;
        check_range(
            "policy.simulated.batch_ms",
            f.policy.simulated.batch_ms,
            0.0,
            3.6e6,
        )?;
        check_range(
            "policy.simulated.token_ms",
            f.policy.simulated.token_ms,
            0.0,
            3.6e6,
        )?;
        check_min(
            "policy.simulated.response_tokens",
            f.policy.simulated.response_tokens.into(),
            1,
        )?;
        check_range("sampling.temperature", f.sampling.temperature, 0.0, 10.0)?;
        if !(f.sampling.top_p > 0.0 && f.sampling.top_p <= 1.0) {
            return Err(invalid(
                "sampling.top_p",
                f.sampling.top_p,
                "must be in (0, 1]",
            ));
        }
        check_min(
            "sampling.max_new_tokens",
            f.sampling.max_new_tokens.into(),
            1,
        )?;
        check_min("sampling.max_batch", f.sampling.max_batch.into(), 1)?;
        check_min("env.compile_workers", f.env.compile_workers.into(), 1)?;
        check_min("env.verify_workers", f.env.verify_workers.into(), 1)?;
        check_min("env.profile_workers", f.env.profile_workers.into(), 1)?;
        if f.env.kind == EnvKind::Cuda && f.env.gpus.is_empty() {
            return Err(invalid(
                "env.gpus",
                "[]",
                "must name at least one GPU ordinal",
            ));
        }
        check_min("env.compile_timeout_ms", f.env.compile_timeout_ms, 1)?;
        check_min("env.verify_timeout_ms", f.env.verify_timeout_ms, 1)?;
        check_min("env.profile_timeout_ms", f.env.profile_timeout_ms, 1)?;
        let s = &f.env.simulated;
        for (key, v) in [
            ("env.simulated.compile_ms", s.compile_ms),
            ("env.simulated.verify_ms", s.verify_ms),
            ("env.simulated.profile_ms", s.profile_ms),
        ] {
            check_range(key, v, 0.0, 3.6e6)?;
        }
        for (key, v) in [
            ("env.simulated.p_compile_error", s.p_compile_error),
            ("env.simulated.p_wrong", s.p_wrong),
            ("env.simulated.p_crash", s.p_crash),
            ("env.simulated.improve_per_turn", s.improve_per_turn),
            ("env.simulated.p_panic", s.p_panic),
            (
                "policy.simulated.p_format_error",
                f.policy.simulated.p_format_error,
            ),
        ] {
            check_range(key, v, 0.0, 1.0)?;
        }
        check_range("env.simulated.median_speedup", s.median_speedup, 1e-3, 1e3)?;
        check_min("replay.tasks_per_batch", f.replay.tasks_per_batch.into(), 1)?;
        check_range("replay.gamma", f.replay.gamma, 0.0, 1.0)?;
        if f.run.mode == Mode::Sync && f.replay.max_staleness != 0 {
            return Err(invalid(
                "replay.max_staleness",
                f.replay.max_staleness,
                "must be 0 when run.mode = \"sync\" (the on-policy baseline)",
            ));
        }
        if f.run.mode == Mode::Sync && f.rollout.max_inflight_groups < f.replay.tasks_per_batch {
            return Err(invalid(
                "rollout.max_inflight_groups",
                f.rollout.max_inflight_groups,
                format!(
                    "must be at least replay.tasks_per_batch ({}) in sync mode",
                    f.replay.tasks_per_batch
                ),
            ));
        }
        if f.rollout.max_inflight_groups < f.replay.tasks_per_batch {
            return Err(invalid(
                "rollout.max_inflight_groups",
                f.rollout.max_inflight_groups,
                format!(
                    "must be at least replay.tasks_per_batch ({}), or no batch could ever fill",
                    f.replay.tasks_per_batch
                ),
            ));
        }
        if !(f.learner.lr > 0.0 && f.learner.lr < 1.0) {
            return Err(invalid("learner.lr", f.learner.lr, "must be in (0, 1)"));
        }
        check_min(
            "learner.optimizer_steps",
            f.learner.optimizer_steps.into(),
            1,
        )?;
        check_range("learner.clip_low", f.learner.clip_low, 0.0, 1.0)?;
        check_range("learner.clip_high", f.learner.clip_high, 0.0, 10.0)?;
        if f.learner.grad_clip.is_nan() || f.learner.grad_clip <= 0.0 {
            return Err(invalid(
                "learner.grad_clip",
                f.learner.grad_clip,
                "must be > 0",
            ));
        }
        check_range("learner.kl_coef", f.learner.kl_coef, 0.0, 100.0)?;
        check_range(
            "learner.decoupled_weight_cap",
            f.learner.decoupled_weight_cap,
            1.0,
            1e6,
        )?;
        check_burn(f)?;
        check_range(
            "learner.simulated.step_ms",
            f.learner.simulated.step_ms,
            0.0,
            3.6e6,
        )?;
        Ok(Config {
            file,
            sources: vec!["defaults".into()],
        })
    }

    /// The run directory: `--run-dir` when given, else `<run.runs_dir>/<run.name>`.
    pub fn run_dir(&self, explicit: Option<&Path>) -> PathBuf {
        match explicit {
            Some(p) => p.to_path_buf(),
            None => Path::new(&self.run.runs_dir).join(&self.run.name),
        }
    }

    /// The resolved configuration as TOML, as written into the run directory.
    pub fn to_toml(&self) -> String {
        let header = format!(
            "# resolved kevin config; layers: {}\n",
            self.sources.join(" < ")
        );
        header + &toml::to_string_pretty(&self.file).expect("config serialises")
    }
}

/// Every dotted key the schema knows, for documentation and `--help`.
pub fn known_keys() -> BTreeSet<String> {
    fn walk(t: &toml::Table, prefix: &str, out: &mut BTreeSet<String>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => walk(sub, &key, out),
                _ => {
                    out.insert(key);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(
        &toml::Table::try_from(ConfigFile::default()).expect("defaults serialise"),
        "",
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = std::env::temp_dir().join(format!("kevin-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A unique file per call: tests run in parallel and texts of equal length are common.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{n}.toml"));
        std::fs::write(&path, text).unwrap();
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let result = Config::load(Some(&path), &vars);
        std::fs::remove_file(&path).ok();
        result
    }

    fn check_err(text: &str, vars: &[(&str, &str)], expected_start: &str) {
        let err = load_str(text, vars)
            .expect_err("must be rejected")
            .to_string();
        assert!(!err.contains('\n'), "error must be one line: {err}");
        assert!(
            err.starts_with(expected_start),
            "got: {err}\nexpected to start with: {expected_start}"
        );
    }

    #[test]
    fn defaults_are_the_recipe() {
        let c = Config::load(None, &[]).unwrap();
        assert_eq!(c.rollout.trajectories, 16);
        assert_eq!(c.rollout.turns, 4);
        assert_eq!(c.replay.tasks_per_batch, 8);
        assert_eq!(c.replay.gamma, 0.4);
        assert_eq!(c.learner.clip_low, 0.2);
        assert_eq!(c.learner.clip_high, 0.28);
        assert_eq!(c.learner.grad_clip, 0.05);
        assert_eq!(c.learner.optimizer_steps, 2);
        assert_eq!(c.learner.kl_coef, 0.0);
        assert_eq!(c.sampling.temperature, 0.9);
    }

    #[test]
    fn layers_file_then_environment() {
        let c = load_str(
            "[rollout]\nturns = 8\ntrajectories = 4\n",
            &[("KEVIN__ROLLOUT__TURNS", "2")],
        )
        .unwrap();
        assert_eq!(c.rollout.turns, 2, "environment wins over the file");
        assert_eq!(c.rollout.trajectories, 4, "file wins over defaults");
        let c = load_str(
            "",
            &[
                ("KEVIN__ENV__SIMULATED__COMPILE_MS", "0.5"),
                ("KEVIN__RUN__MODE", "sync"),
                ("KEVIN__REPLAY__MAX_STALENESS", "0"),
            ],
        )
        .unwrap();
        assert_eq!(c.env.simulated.compile_ms, 0.5);
        assert_eq!(c.run.mode, Mode::Sync);
        assert!(c.sources.iter().any(|s| s.starts_with("KEVIN__RUN__MODE")));
        // Unrelated variables are ignored.
        assert!(load_str("", &[("KEVINX", "1"), ("PATH", "/bin")]).is_ok());
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        check_err(
            "[rollout]\nturnz = 3\n",
            &[],
            "unknown config key `rollout.turnz` (from ",
        );
        check_err("[rolout]\nturns = 3\n", &[], "unknown config key `rolout`");
        check_err(
            "",
            &[("KEVIN__ROLLOUT__TURNZ", "3")],
            "unknown config key `rollout.turnz` (from environment variable KEVIN__ROLLOUT__TURNZ)",
        );
        check_err(
            "[env.simulated]\ncompile_mss = 1\n",
            &[],
            "unknown config key `env.simulated.compile_mss`",
        );
    }

    #[test]
    fn bad_values_are_rejected_with_key_value_and_rule() {
        check_err(
            "[rollout]\nturns = 0\n",
            &[],
            "config key `rollout.turns` = 0 is invalid: must be at least 1",
        );
        check_err(
            "[rollout]\nturns = \"four\"\n",
            &[],
            "config key `rollout.turns` = \"four\" is invalid",
        );
        check_err(
            "[run]\nmode = \"fast\"\n",
            &[],
            "config key `run.mode` = \"fast\" is invalid",
        );
        check_err(
            "[replay]\ngamma = 1.5\n",
            &[],
            "config key `replay.gamma` = 1.5 is invalid: must be between 0 and 1",
        );
        check_err(
            "",
            &[("KEVIN__SAMPLING__TOP_P", "0")],
            "config key `sampling.top_p` = 0 is invalid",
        );
        check_err(
            "[run]\nmode = \"sync\"\n",
            &[],
            "config key `replay.max_staleness` = 2 is invalid: must be 0 when",
        );
        check_err(
            "[run]\nname = \"../x\"\n",
            &[],
            "config key `run.name` = \"../x\" is invalid",
        );
        check_err("not toml [", &[], "config file ");
    }

    #[test]
    fn burn_policy_and_learner_are_checked() {
        let burn = "[policy]\nkind = \"burn\"\n[learner]\nkind = \"burn\"\n";
        for (text, expected) in [
            (
                "[learner]\nkind = \"burn\"\n".to_string(),
                "config key `learner.kind` = \"burn\" is invalid: needs policy.kind = \"burn\"",
            ),
            (
                "[policy]\nkind = \"burn\"\n".to_string(),
                "config key `policy.kind` = \"burn\" is invalid: needs learner.kind = \"burn\"",
            ),
            (
                format!("{burn}[policy.burn]\ncheckpoint = \"no/such/dir\"\n"),
                "config key `policy.burn.checkpoint` = \"no/such/dir\" is invalid: must be a Hugging Face",
            ),
            (
                // A tokenizer without a model config.
                format!("{burn}[policy.burn]\ncheckpoint = \"models/kevin-bpe-4096\"\n"),
                "config key `policy.burn.checkpoint` = \"models/kevin-bpe-4096\" is invalid: models/kevin-bpe-4096/config.json is missing",
            ),
            (
                format!("{burn}[policy.burn]\nmax_len = 1\n"),
                "config key `policy.burn.max_len` = 1 is invalid: must be at least 2",
            ),
            (
                format!("{burn}[policy.burn]\ndevice = \"tpu\"\n"),
                "config key `policy.burn.device` = \"tpu\" is invalid",
            ),
        ] {
            check_err(&text, &[], expected);
        }
        let c = load_str(burn, &[]).unwrap();
        assert_eq!(c.policy.burn.checkpoint, "models/kevin-tiny");
        assert_eq!(c.policy.burn.device, BurnDevice::Auto);
    }

    #[test]
    fn resolved_config_round_trips() {
        let c = load_str("[rollout]\nturns = 3\n", &[]).unwrap();
        let text = c.to_toml();
        let back: ConfigFile = toml::from_str(&text).unwrap();
        assert_eq!(back, c.file);
        assert!(known_keys().contains("replay.max_staleness"));
    }

    #[test]
    fn shipped_configs_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut n = 0;
        for entry in std::fs::read_dir(&root).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Config::load(Some(&path), &[])
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 3, "quickstart, gpu and sync configs");
    }
}
