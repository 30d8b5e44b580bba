//! Validation: [`Config::from_file`] checks every value of a loaded [`ConfigFile`] and names the
//! rule a bad value breaks.

use std::path::{Path, PathBuf};

use super::error::{invalid, ConfigError};
use super::schema::{
    BurnDevice, ConfigFile, EnvKind, GpuTiming, LearnerKind, Mode, PolicyKind, TaskSource,
};

/// Checks a `telemetry.prometheus` value without resolving it: empty (off), or `host:port`
/// with a port number. Binding it is the daemon's start.
pub(crate) fn check_addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err("must be host:port (e.g. \"127.0.0.1:9464\"), or \"\" for off".into()),
    }
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

/// `[env.remote]`: a queue JetStream can run, names NATS accepts, and deadlines that leave a node
/// time to finish a job before it is handed to another.
fn check_remote(f: &ConfigFile) -> Result<(), ConfigError> {
    let r = &f.env.remote;
    if f.env.kind != EnvKind::Remote {
        return Ok(());
    }
    if r.url.trim().is_empty() {
        return Err(invalid("env.remote.url", "\"\"", "must name a NATS server"));
    }
    // A password in the URL would be written to config.toml and the log: refuse it.
    if r.url.split(',').any(|u| {
        u.split_once("://")
            .map_or(u, |(_, rest)| rest)
            .split('/')
            .next()
            .is_some_and(|host| host.contains('@'))
    }) {
        return Err(invalid(
            "env.remote.url",
            "(not shown: it carries credentials)",
            "must not carry credentials; use env.remote.user and env.remote.password_env, \
             nkey_file or creds_file",
        ));
    }
    if r.prefix.is_empty()
        || !r
            .prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(invalid(
            "env.remote.prefix",
            format!("{:?}", r.prefix),
            "letters, digits, '-' and '_' (it names streams and subjects)",
        ));
    }
    check_min("env.remote.max_inflight", r.max_inflight.into(), 1)?;
    check_min("env.remote.max_deliver", r.max_deliver.into(), 1)?;
    let stages = f.env.compile_timeout_ms + f.env.verify_timeout_ms + f.env.profile_timeout_ms;
    if r.ack_wait_ms <= stages {
        return Err(invalid(
            "env.remote.ack_wait_ms",
            r.ack_wait_ms,
            format!(
                "must exceed env.compile_timeout_ms + verify_timeout_ms + profile_timeout_ms \
                 ({stages}), or a node still evaluating a job loses it to another"
            ),
        ));
    }
    check_min("env.remote.job_timeout_ms", r.job_timeout_ms, r.ack_wait_ms)?;
    if r.tls_cert_file.is_empty() != r.tls_key_file.is_empty() {
        return Err(invalid(
            "env.remote.tls_cert_file",
            format!("{:?}", r.tls_cert_file),
            "a client certificate and env.remote.tls_key_file come together",
        ));
    }
    let auths = [
        !r.user.is_empty(),
        !r.nkey_file.is_empty(),
        !r.creds_file.is_empty(),
    ];
    if auths.iter().filter(|a| **a).count() > 1 {
        return Err(invalid(
            "env.remote.user",
            format!("{:?}", r.user),
            "one of user (with password_env), nkey_file and creds_file",
        ));
    }
    Ok(())
}

/// `env.timing = "shared"` times candidates beside whatever runs on the GPU: refused where the
/// burn policy (on GPU 0 whenever there is a GPU, which a cuda environment implies) generates
/// and trains on one of the evaluation's GPUs.
fn check_timing(f: &ConfigFile) -> Result<(), ConfigError> {
    let policy_on_gpu =
        f.policy.kind == PolicyKind::Burn && f.policy.burn.device != BurnDevice::Cpu;
    if f.env.timing == GpuTiming::Shared
        && f.env.kind == EnvKind::Cuda
        && policy_on_gpu
        && f.env.gpus.contains(&0)
    {
        return Err(invalid(
            "env.timing",
            "\"shared\"",
            "times candidates on GPU 0 while the burn policy generates and trains there \
             (policy.burn.device); use \"exclusive\" (the timing lease), or evaluate on GPUs the \
             policy does not use (env.gpus without 0)",
        ));
    }
    Ok(())
}

/// The burn policy and learner come as a pair (the learner trains the policy's model and
/// publishes it to the policy), and the model directory must hold what they read.
/// The room a burn policy's slot keeps for a response: `sampling.max_new_tokens`, or a quarter of
/// `policy.burn.max_len` when that is less.
fn burn_response_room(f: &ConfigFile) -> u64 {
    u64::from(f.sampling.max_new_tokens).min(u64::from(f.policy.burn.max_len) / 4)
}

/// The largest prompt budget, in characters, that fits a burn policy's slot next to the
/// response's room, at 2.5 characters a token (kevin's BPE measures about 2.8 on prompts): a
/// prompt past it gets its response cut short, or is refused by the policy.
fn burn_prompt_budget(f: &ConfigFile) -> u64 {
    (u64::from(f.policy.burn.max_len).saturating_sub(burn_response_room(f))) * 5 / 2
}

/// `rollout.prompt_budget_chars = 0`: what fits the burn policy's slots, 24,000 characters for
/// the other policies.
fn auto_prompt_budget(f: &ConfigFile) -> u32 {
    if f.policy.kind == PolicyKind::Burn {
        // At least the smallest budget allowed, so a slot too small is named by its own key.
        u32::try_from(burn_prompt_budget(f).max(256)).unwrap_or(u32::MAX)
    } else {
        24_000
    }
}

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
    let most = burn_prompt_budget(f);
    if u64::from(f.rollout.prompt_budget_chars) > most {
        return Err(invalid(
            "rollout.prompt_budget_chars",
            f.rollout.prompt_budget_chars,
            format!(
                "prompts this long (about {} tokens at 2.5 characters a token) leave less than \
                 {} tokens for a response in policy.burn.max_len = {} \
                 (sampling.max_new_tokens, or a quarter of the slot when less): at most {most} \
                 (0 picks it)",
                u64::from(f.rollout.prompt_budget_chars) * 2 / 5,
                burn_response_room(f),
                b.max_len,
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// Validates every value of `file`.
    pub fn from_file(mut file: ConfigFile) -> Result<Config, ConfigError> {
        if file.rollout.prompt_budget_chars == 0 {
            file.rollout.prompt_budget_chars = auto_prompt_budget(&file);
        }
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
        if !(f.tasks.floor > 0.0 && f.tasks.floor <= 1.0) {
            return Err(invalid(
                "tasks.floor",
                f.tasks.floor.to_string(),
                "a weight above 0 and at most 1 (a task solved half the time weighs floor + 1)",
            ));
        }
        if !f.tasks.prior.is_empty() && f.tasks.source != TaskSource::Suite {
            return Err(invalid(
                "tasks.prior",
                format!("{:?}", f.tasks.prior),
                "needs tasks.source = \"suite\" (a prior is an evaluation on real tasks)",
            ));
        }
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
        check_timing(f)?;
        check_remote(f)?;
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
            ("env.simulated.p_harness_error", s.p_harness_error),
            ("env.simulated.p_busy", s.p_busy),
            (
                "policy.simulated.p_format_error",
                f.policy.simulated.p_format_error,
            ),
        ] {
            check_range(key, v, 0.0, 1.0)?;
        }
        check_range("env.simulated.median_speedup", s.median_speedup, 1e-3, 1e3)?;
        check_min("replay.tasks_per_batch", f.replay.tasks_per_batch.into(), 1)?;
        check_min("replay.wal_segment_kb", f.replay.wal_segment_kb, 1)?;
        check_range("run.max_disk_gb", f.run.max_disk_gb, 0.0, 1e6)?;
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
        check_addr(&f.telemetry.prometheus).map_err(|rule| {
            invalid(
                "telemetry.prometheus",
                format!("{:?}", f.telemetry.prometheus),
                rule,
            )
        })?;
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
