//! `kevin eval --checkpoint`: the figures on the real CPU backend with a scripted policy (garbage
//! on turn 1, the task's reference solution on turn 2), the command's argument errors, and one
//! end-to-end run of the command on the committed tiny random checkpoint.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use kevin::config::SamplingSection;
use kevin::env::cpu::CpuEnv;
use kevin::policy_eval::{run, score_task, summarize, RunOptions};
use kevin::scripted::ScriptedPolicy;
use kevin::tasks::{Preset, TaskSuite};
use kevin_actors::cmd::eval::checkpoint::episode_tasks;
use serde_json::Value;

use common::{cpu_backend_available, kevin_at_root, root, stderr};

/// A held-out task with a short reference solution.
const TASK: &str = "tanh";

#[test]
fn garbage_then_the_reference_solution_scores_zero_then_one() {
    if !cpu_backend_available() {
        return;
    }
    let suite = TaskSuite::load(root().join("tasks")).unwrap();
    let tasks = episode_tasks(&suite, "heldout", &[TASK.to_string()], Preset::Small).unwrap();
    let env = CpuEnv::new(
        Arc::new(suite),
        &root().join("tasks"),
        Preset::Small,
        PathBuf::from(env!("CARGO_BIN_EXE_kevin")),
        2,
        kevin::env::Deadlines::default(),
    )
    .unwrap();
    let solution =
        std::fs::read_to_string(root().join("tasks/solutions").join(format!("{TASK}.cu"))).unwrap();
    let mut policy = ScriptedPolicy::new(move |task, turn| {
        assert_eq!(task, TASK, "the prompt names its task");
        match turn {
            0 => "I am not sure what to write.".into(),
            _ => format!(
                "Fixing the format.\n```cuda\n{}\n```\nThe reference kernel.",
                solution.trim_end()
            ),
        }
    });
    let opts = RunOptions {
        samples: 2,
        turns: 2,
        prompt_budget_chars: 24_000,
        seed: 0,
        sampling: SamplingSection::default(),
        gen_batch: 8,
        eval_workers: 2,
    };
    let out = run(&mut policy, &env, &tasks, &opts, &mut |_| {}).unwrap();
    let scores = score_task(&out[0]);
    assert_eq!(scores.turn_correct, vec![0.0, 1.0], "{:?}", scores.outcomes);
    assert_eq!(scores.solved_by_turn, vec![0.0, 1.0]);
    assert_eq!((scores.avg_at_k, scores.best_at_k), (1.0, true));
    assert_eq!(scores.format_error_rate, 0.5);
    assert!(scores.best_speedup > 0.0 && scores.avg_speedup > 0.0);
    // The turn-2 prompt carried the turn-1 feedback, as in training.
    assert!(out[0].trajectories[0][1].prompt.contains("Format error"));
    let s = summarize(&[scores]);
    assert_eq!(
        (s.tasks, s.turns, s.avg_at_k, s.best_at_k),
        (1, 4, 1.0, 1.0)
    );
    assert_eq!(s.outcomes.get("correct"), Some(&2));
    assert_eq!(s.outcomes.get("format_error"), Some(&2));
    assert!((s.geomean_speedup.unwrap() - s.mean_speedup).abs() < 1e-9);
}

#[test]
fn a_missing_checkpoint_is_a_one_line_error_naming_it() {
    let out = kevin_at_root(&[
        "eval",
        "--checkpoint",
        "no/such/checkpoint",
        "--samples",
        "2",
        "--turns",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("no/such/checkpoint"), "{err}");
}

#[test]
fn budget_and_task_errors_name_the_flag() {
    // (arguments, what the error must mention)
    let cases: [(&[&str], &str); 4] = [
        (&["--turns", "4", "--budget", "6"], "--budget 6"),
        (&["--samples", "2", "--budget", "8"], "--budget"),
        (
            &["--samples", "1", "--tasks", "relu"],
            "not in the heldout split",
        ),
        (&["--samples", "1", "--tasks", "nope"], "nope"),
    ];
    for (args, says) in cases {
        let mut all = vec!["eval", "--checkpoint", "models/kevin-tiny"];
        all.extend_from_slice(args);
        let out = kevin_at_root(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn tiny_random_checkpoint_runs_end_to_end_and_reports_zeros() {
    let json = std::env::temp_dir().join(format!("kevin-eval-policy-{}.json", std::process::id()));
    let lines = json.with_extension("jsonl");
    let out = kevin_at_root(&[
        "eval",
        "--checkpoint",
        "models/kevin-tiny",
        "--samples",
        "2",
        "--turns",
        "2",
        "--tasks",
        TASK,
        "--backend",
        "cpu",
        "--device",
        "cpu",
        "--max-new-tokens",
        "32",
        "--json",
        json.to_str().unwrap(),
        "--transcripts",
        lines.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // One line per turn, in trajectory and turn order, with what the policy was asked and wrote.
    let text = std::fs::read_to_string(&lines).unwrap();
    let turns: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_file(&lines);
    // The full outcome rides along as `result`: `kevin sft repairs` reads a transcript as turns.
    let read = kevin::corpus::own::parse_episodes(0, "transcript", &text).unwrap();
    assert_eq!(read.len(), 4);
    assert!(read
        .iter()
        .all(|t| t.outcome.kind() == "format_error" && t.task == TASK));
    let order: Vec<(u64, u64)> = turns
        .iter()
        .map(|t| {
            (
                t["trajectory"].as_u64().unwrap(),
                t["turn"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(order, [(0, 0), (0, 1), (1, 0), (1, 1)]);
    for t in &turns {
        assert_eq!(t["task"], TASK);
        assert_eq!(t["outcome"], "format_error");
        assert!(t["prompt"].as_str().unwrap().contains(TASK), "{t}");
        assert!(
            t["feedback"].as_str().unwrap().starts_with("Format error"),
            "{t}"
        );
        let tokens = t["tokens"].as_u64().unwrap();
        assert!(tokens > 0 && tokens <= 32, "{t}");
    }
    // The second turn's prompt carries the first turn's feedback.
    let feedback = turns[0]["feedback"].as_str().unwrap();
    assert!(turns[1]["prompt"]
        .as_str()
        .unwrap()
        .contains(&feedback[..40]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("avg@2 0.0%") && stdout.contains("best@2 0.0%"),
        "{stdout}"
    );
    assert!(stderr(&out).contains("[tasks 1/1]"), "progress on stderr");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(v["checkpoint"]["path"], "models/kevin-tiny");
    assert_eq!(
        (v["samples"].as_u64(), v["turns"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (v["backend"].as_str(), v["device"].as_str()),
        (Some("cpu"), Some("cpu"))
    );
    let s = &v["summary"];
    // A random model writes no ```cuda block: every turn is a format error, every figure 0.
    assert_eq!(s["turns"].as_u64(), Some(4));
    // The evaluation cache stands in front of the real backend; no candidate reached it.
    assert_eq!(
        v["eval_cache"]["misses"].as_u64(),
        Some(0),
        "{}",
        v["eval_cache"]
    );
    assert_eq!(v["eval_cache"]["answered"].as_u64(), Some(0));
    assert_eq!(s["format_error_rate"].as_f64(), Some(1.0));
    for key in ["avg_at_k", "best_at_k", "mean_speedup", "mean_avg_speedup"] {
        assert_eq!(s[key].as_f64(), Some(0.0), "{key}");
    }
    assert!(s["geomean_speedup"].is_null());
    let tokens = s["mean_response_tokens"].as_f64().unwrap();
    assert!(tokens > 0.0 && tokens <= 32.0, "{tokens}");
    // Format errors have no kernel to resubmit.
    assert_eq!(s["repeat_rate"].as_f64(), Some(0.0));
    let task = &v["tasks"][0];
    assert_eq!(task["task"], TASK);
    assert_eq!(task["trajectories"].as_array().unwrap().len(), 2);
    assert_eq!(task["trajectories"][0][1]["repeat"], false);
    assert_eq!(task["turn_correct"], serde_json::json!([0.0, 0.0]));
}

/// A `kevin eval --checkpoint --json` file as far as the comparison reads it.
fn evaluation_file(dir: &std::path::Path, name: &str, seed: u64, avg: f64) -> PathBuf {
    let v = serde_json::json!({
        "command": "kevin eval --checkpoint",
        "checkpoint": {"path": format!("models/{name}")},
        "seed": seed, "samples": 16, "turns": 8,
        "tasks": [{"task": "elu"}, {"task": TASK}],
        "summary": {
            "avg_at_k": avg, "mean_speedup": 0.3, "best_at_k": 0.5, "turn_correct": [0.2, 0.3],
            "mean_avg_speedup": 0.2, "format_error_rate": 0.1, "repeat_rate": 0.05,
        },
    });
    let path = dir.join(format!("{name}-s{seed}.json"));
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn base_and_new_evaluations_compare_by_seed_and_name_what_does_not_pair() {
    let dir = std::env::temp_dir().join(format!("kevin-eval-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let list = |paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| p.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let base = [
        evaluation_file(&dir, "a", 0, 0.50),
        evaluation_file(&dir, "a", 1, 0.52),
    ];
    let new = [
        evaluation_file(&dir, "b", 0, 0.62),
        evaluation_file(&dir, "b", 1, 0.63),
    ];
    let json = dir.join("compare.json");
    let out = kevin_at_root(&[
        "eval",
        "--base",
        &list(&base),
        "--new",
        &list(&new),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("paired on seeds 0, 1"), "{stdout}");
    assert!(stdout.contains("verdict: better"), "{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["verdict"], "better");
    assert_eq!(v["figures"][0]["change"], "up");
    assert_eq!(v["base_files"][1], base[1].to_str().unwrap());

    // A seed without its pair: usage error (exit 2) naming the file.
    let out = kevin_at_root(&["eval", "--base", &list(&base), "--new", &list(&new[..1])]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!(
            "{}: seed 1 has no evaluation of the new checkpoint",
            base[1].display()
        )),
        "{}",
        stderr(&out)
    );
    // --base without --new is refused by the argument parser.
    let out = kevin_at_root(&["eval", "--base", &list(&base)]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
