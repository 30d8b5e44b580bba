use std::path::Path;

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
            ("KEVIN__REPLAY__CREDIT", "improvement"),
        ],
    )
    .unwrap();
    assert_eq!(c.replay.credit, crate::rl::TurnCredit::Improvement);
    let gain = load_str("[replay]\ncredit = \"gain\"\n", &[]).unwrap();
    assert_eq!(gain.replay.credit, crate::rl::TurnCredit::Gain);
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
    let learner = "[learner]\nkind = \"burn\"\n";
    let burn = "[policy]\nkind = \"burn\"\n[learner]\nkind = \"burn\"\n";
    // The prompt budget left at 0 is what fits the slots: (4096 - 1024) x 2.5 characters.
    let c = load_str(burn, &[]).unwrap();
    assert_eq!(c.rollout.prompt_budget_chars, 7680);
    let c = load_str("", &[]).unwrap();
    assert_eq!(c.rollout.prompt_budget_chars, 24_000);
    for (text, expected) in [
        (
            learner.to_string(),
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
            // 24,000 characters are about 9,600 tokens: no room in 4,096 with 1,024 to sample.
            format!("{burn}[rollout]\nprompt_budget_chars = 24000\n"),
            "config key `rollout.prompt_budget_chars` = 24000 is invalid: prompts this long (about \
             9600 tokens at 2.5 characters a token) leave less than 1024 tokens for a response in \
             policy.burn.max_len = 4096 (sampling.max_new_tokens, or a quarter of the slot when \
             less): at most 7680 (0 picks it)",
        ),
        (
            format!("{burn}[policy.burn]\ndevice = \"tpu\"\n"),
            "config key `policy.burn.device` = \"tpu\" is invalid",
        ),
        (
            format!("{burn}[policy.burn]\nmatmul = \"fast\"\n"),
            "config key `policy.burn.matmul` = \"fast\" is invalid",
        ),
        (
            format!("{burn}[policy.burn]\ngenerate = \"cudnn\"\n"),
            "config key `policy.burn.generate` = \"cudnn\" is invalid",
        ),
        (
            format!("{burn}[policy.burn]\nattention = \"sdpa\"\n"),
            "config key `policy.burn.attention` = \"sdpa\" is invalid",
        ),
        (
            format!("{burn}[policy.burn]\nlogprobs = \"triton\"\n"),
            "config key `policy.burn.logprobs` = \"triton\" is invalid",
        ),
        (
            format!("{burn}[policy.burn]\nnorms = \"apex\"\n"),
            "config key `policy.burn.norms` = \"apex\" is invalid",
        ),
    ] {
        check_err(&text, &[], expected);
    }
    let c = load_str(burn, &[]).unwrap();
    assert_eq!(c.policy.burn.checkpoint, "models/kevin-tiny");
    assert_eq!(c.policy.burn.device, BurnDevice::Auto);
    assert_eq!(c.policy.burn.matmul, BurnMatmul::Cublas);
    assert_eq!(c.policy.burn.generate, BurnGenerate::Fused);
    assert_eq!(c.policy.burn.attention, BurnAttention::Flash);
    assert_eq!(c.policy.burn.logprobs, BurnLogprobs::Fused);
    assert_eq!(c.policy.burn.norms, BurnNorms::Fused);
    let c = load_str(&format!("{burn}[policy.burn]\ngenerate = \"burn\"\n"), &[]).unwrap();
    assert_eq!(c.policy.burn.generate, BurnGenerate::Burn);
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
            Config::load(Some(&path), &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 3, "quickstart, gpu and sync configs");
}

#[test]
fn cpu_nvrtc_front_end_is_auto_on_or_off() {
    assert_eq!(
        Config::load(None, &[]).unwrap().env.cpu_nvrtc,
        CpuNvrtc::Auto
    );
    for (text, want) in [
        ("on", CpuNvrtc::On),
        ("off", CpuNvrtc::Off),
        ("auto", CpuNvrtc::Auto),
    ] {
        let c = load_str(&format!("[env]\ncpu_nvrtc = \"{text}\"\n"), &[]).unwrap();
        assert_eq!(c.env.cpu_nvrtc, want, "{text}");
    }
    let err = load_str("[env]\ncpu_nvrtc = \"maybe\"\n", &[])
        .expect_err("not a mode")
        .to_string();
    assert!(err.contains("env") && err.contains("maybe"), "{err}");
}

#[test]
fn shared_timing_is_refused_on_the_policys_gpu() {
    let burn_on_gpu = "[policy]\nkind = \"burn\"\n[policy.burn]\ndevice = \"cuda\"\n\
                       [learner]\nkind = \"burn\"\n[tasks]\nsource = \"suite\"\n\
                       [env]\nkind = \"cuda\"\ntiming = \"shared\"\n";
    check_err(
        burn_on_gpu,
        &[],
        "config key `env.timing` = \"shared\" is invalid: times candidates on GPU 0",
    );
    // The evaluation on GPU 1 only: nothing of the policy's there.
    let c = load_str(&format!("{burn_on_gpu}gpus = [1]\n"), &[]).unwrap();
    assert_eq!(c.env.timing, GpuTiming::Shared);
    // Exclusive is the default and allowed anywhere; an unknown spelling is named.
    assert_eq!(
        Config::load(None, &[]).unwrap().env.timing,
        GpuTiming::Exclusive
    );
    check_err(
        "[env]\ntiming = \"fast\"\n",
        &[],
        "config key `env.timing` = \"fast\" is invalid",
    );
    assert!(GpuTiming::parse("fast").unwrap_err().contains("fast"));
    assert_eq!(GpuTiming::parse("shared"), Ok(GpuTiming::Shared));
}

#[test]
fn remote_env_is_checked_key_by_key() {
    let remote = "[tasks]\nsource = \"suite\"\n[env]\nkind = \"remote\"\n";
    let c = load_str(remote, &[]).unwrap();
    assert_eq!(c.env.kind, EnvKind::Remote);
    assert_eq!(c.env.remote, RemoteEnvSection::default());
    // A node must be able to finish a job before it is handed to another.
    check_err(
        &format!("{remote}[env.remote]\nack_wait_ms = 30000\n"),
        &[],
        "config key `env.remote.ack_wait_ms` = 30000 is invalid: must exceed",
    );
    // No credentials in a URL (it would be logged and stored): the value is not shown either.
    let err = load_str(
        &format!("{remote}[env.remote]\nurl = \"nats://kevin:hunter2@10.0.0.5:4222\"\n"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("config key `env.remote.url`"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    check_err(
        &format!("{remote}[env.remote]\nprefix = \"a.b\"\n"),
        &[],
        "config key `env.remote.prefix` = \"a.b\" is invalid",
    );
    check_err(
        &format!("{remote}[env.remote]\nuser = \"kevin\"\nnkey_file = \"seed.nk\"\n"),
        &[],
        "config key `env.remote.user`",
    );
    check_err(
        &format!("{remote}[env.remote]\nmax_inflight = 0\n"),
        &[],
        "config key `env.remote.max_inflight` = 0 is invalid",
    );
    check_err(
        &format!("{remote}[env.remote]\nfrobnicate = 1\n"),
        &[],
        "unknown config key",
    );
}

#[test]
fn addresses_are_checked_without_resolving() {
    for ok in [
        "",
        "127.0.0.1:9464",
        "[::1]:9464",
        "localhost:9464",
        "0.0.0.0:0",
    ] {
        assert!(validate::check_addr(ok).is_ok(), "{ok}");
    }
    for bad in ["9464", "localhost", ":9464", "host:99999", "host:port"] {
        assert!(
            validate::check_addr(bad).unwrap_err().contains("host:port"),
            "{bad}"
        );
    }
}
