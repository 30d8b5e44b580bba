//! `kevin train` with the real policy and learner: configs/tiny-cpu.toml (burn on NdArray, the
//! tiny random Qwen2 of models/kevin-tiny, the CPU environment) for 2 learner steps, then resumed
//! for a third. Checks the run directory: Hugging Face checkpoints, 2 then 3 learner steps in the
//! metrics, and turns with real generated text, token ids and finite behaviour log-probs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use common::{assert_ok, jsonl_strict, kevin, root, wal_records};

fn train(run: &Path, max_steps: u64) -> Output {
    // From the repository root: the config's paths (tasks/, models/kevin-tiny) are relative.
    kevin()
        .current_dir(root())
        // Short responses and small batches keep a debug-build step to seconds.
        .env("KEVIN__SAMPLING__MAX_NEW_TOKENS", "32")
        .env("KEVIN__TELEMETRY__TRACE", "false")
        .args(["train", "--config", "configs/tiny-cpu.toml", "--run-dir"])
        .arg(run)
        .args(["--max-steps", &max_steps.to_string()])
        .output()
        .unwrap()
}

fn steps(run: &Path) -> Vec<u64> {
    jsonl_strict(&run.join("metrics.jsonl"))
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect()
}

fn checkpoint(run: &Path, version: u64) -> PathBuf {
    run.join(format!("checkpoints/step-{version:08}/learner"))
}

#[test]
fn tiny_cpu_config_trains_checkpoints_and_resumes() {
    let run = std::env::temp_dir().join(format!("kevin-it-burn-{}", std::process::id()));
    std::fs::remove_dir_all(&run).ok();

    assert_ok(&train(&run, 2));
    assert_eq!(steps(&run), vec![1, 2]);
    let ckpt = checkpoint(&run, 2);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "learner_optimizer.safetensors",
    ] {
        assert!(ckpt.join(f).is_file(), "{} missing", ckpt.join(f).display());
    }

    // Every turn of the accepted groups (the write-ahead log keeps them whole): the policy's
    // tokens with one finite behaviour log-prob each; the text is what the tokens decode to.
    let turns: Vec<Value> = wal_records(&run)
        .iter()
        .flat_map(|r| {
            r["group"]["group"]["trajectories"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|t| t.as_array().unwrap().clone())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(turns.len() >= 2 * 2 * 2 * 2, "{} turns", turns.len());
    let mut with_text = 0;
    for t in &turns {
        // Both are base64 of little-endian values in the log (kevin::packed).
        let tokens: Vec<u32> =
            kevin::packed::unpack(t["response_tokens"].as_str().unwrap()).unwrap();
        let logprobs: Vec<f32> =
            kevin::packed::unpack(t["behaviour_logprobs"].as_str().unwrap()).unwrap();
        assert!(!tokens.is_empty(), "a turn without tokens: {t}");
        assert_eq!(tokens.len(), logprobs.len());
        assert!(tokens.len() <= 32);
        assert!(logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
        if !t["response"].as_str().unwrap().is_empty() {
            with_text += 1;
        }
    }
    assert!(with_text > 0, "no turn has any text");
    // Resume: the learner loads step 2's checkpoint and trains one more step.
    let out = train(&run, 3);
    assert_ok(&out);
    assert_eq!(steps(&run), vec![1, 2, 3]);
    assert!(checkpoint(&run, 3).join("model.safetensors").is_file());
    let weights = |v| std::fs::read(checkpoint(&run, v).join("model.safetensors")).unwrap();
    assert_ne!(weights(2), weights(3), "step 3 did not change the weights");
    // The resumed learner's weights (version 2) reached the policy.
    let versions: Vec<u64> = jsonl_strict(&run.join("episodes.jsonl"))
        .iter()
        .map(|e| e["policy_version"].as_u64().unwrap())
        .collect();
    assert!(versions.contains(&2), "policy versions {versions:?}");
    std::fs::remove_dir_all(&run).ok();
}
