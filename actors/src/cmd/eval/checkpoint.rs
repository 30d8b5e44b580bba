//! `kevin eval --checkpoint DIR`: evaluates a policy checkpoint the way the paper's Tables 1 and
//! 2 do. The burn policy is loaded from the Hugging Face directory as `kevin train` loads it
//! (`kevin_policy::runtime::build_policy`); every selected task (default: the held-out split)
//! gets K trajectories of N refinement turns through `kevin::policy_eval::run` (the training
//! rollout's episodes, prompts and scoring, batched through the policy's continuous batching),
//! evaluated by the kernel environment `--backend` names. Prints a table per task and the
//! summary (avg@K, best@K, per-turn correctness, speedups, fast_p, format errors, tokens), and
//! writes them as JSON for tools. Progress goes to stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kevin::config::{BurnDevice, Config};
use kevin::env::KernelEnv;
use kevin::episode::EpisodeTask;
use kevin::policy::Policy;
use kevin::policy_eval::{
    self, score_task, summarize, PolicySummary, Progress, RunOptions, TaskScores, TaskTrajectories,
};
use kevin::tasks::{Preset, Split, TaskSuite};

use crate::cmd::{name_width, write_json, CmdError};

/// The task splits `--split` accepts.
pub const SPLITS: [&str; 3] = ["heldout", "train", "all"];

/// The devices `--device` accepts.
pub const DEVICES: [&str; 3] = ["cpu", "cuda", "auto"];

/// The flags of `kevin eval` ([`super::Args`]), `--checkpoint` present.
pub type PolicyEvalArgs = super::Args;

/// K: `--samples`, or `--budget / --turns`.
pub fn samples(args: &PolicyEvalArgs) -> Result<u32, String> {
    match (args.samples, args.budget) {
        (Some(_), Some(_)) => Err("--samples and --budget: give one of them".into()),
        (Some(0), None) => Err("--samples 0: at least one trajectory is needed".into()),
        (Some(k), None) => Ok(k),
        (None, Some(b)) => policy_eval::samples_for_budget(b, args.turns),
        (None, None) => Ok(DEFAULT_SAMPLES),
    }
}

/// K without `--samples` or `--budget`: the paper's 16.
pub const DEFAULT_SAMPLES: u32 = 16;

/// The config the evaluation runs with: `--config` (or the built-in defaults) with the
/// `KEVIN__*` variables in `vars`, then the command's flags.
pub fn config(
    args: &PolicyEvalArgs,
    checkpoint: &Path,
    vars: &[(String, String)],
) -> Result<Config, String> {
    let config = Config::load(args.config.as_deref(), vars).map_err(|e| e.to_string())?;
    let mut file = config.file;
    file.policy.burn.checkpoint = checkpoint.display().to_string();
    if let Some(d) = &args.device {
        file.policy.burn.device = match d.as_str() {
            "cpu" => BurnDevice::Cpu,
            "cuda" => BurnDevice::Cuda,
            "auto" => BurnDevice::Auto,
            other => return Err(format!("--device {other}: one of cpu, cuda, auto")),
        };
    }
    if let Some(t) = args.temperature {
        file.sampling.temperature = t;
    }
    if let Some(m) = args.max_new_tokens {
        file.sampling.max_new_tokens = m;
    }
    let mut config = Config::from_file(file).map_err(|e| format!("{e} (from the flags)"))?;
    config.sources = config_sources(args);
    Ok(config)
}

fn config_sources(args: &PolicyEvalArgs) -> Vec<String> {
    let mut s = vec!["defaults".to_string()];
    if let Some(c) = &args.config {
        s.push(c.display().to_string());
    }
    s.push("flags".into());
    s
}

/// The tasks to evaluate: `--tasks` (each in the split) or the whole split, with the first-turn
/// prompt at `preset` (the sizes the backend evaluates at).
pub fn episode_tasks(
    suite: &TaskSuite,
    split: &str,
    only: &[String],
    preset: Preset,
) -> Result<Vec<Arc<EpisodeTask>>, String> {
    let in_split = |s: Split| match split {
        "heldout" => s == Split::Heldout,
        "train" => s == Split::Train,
        "all" => true,
        _ => false,
    };
    if !SPLITS.contains(&split) {
        return Err(format!("--split {split}: one of {}", SPLITS.join(", ")));
    }
    let mut chosen = Vec::new();
    for name in only {
        let task = suite
            .get(name)
            .ok_or_else(|| format!("--tasks: no task named `{name}` in the suite"))?;
        if !in_split(task.split) {
            return Err(format!(
                "--tasks: `{name}` is not in the {split} split (pass --split all to evaluate it)"
            ));
        }
        chosen.push(task);
    }
    if only.is_empty() {
        chosen = suite.tasks().iter().filter(|t| in_split(t.split)).collect();
    }
    if chosen.is_empty() {
        return Err(format!("the {split} split has no task"));
    }
    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    chosen.dedup_by(|a, b| a.name == b.name);
    chosen
        .into_iter()
        .map(|t| {
            let statement = kevin::prompt::first_turn(t, preset)
                .map_err(|e| format!("task {}: {e}", t.name))?;
            Ok(Arc::new(EpisodeTask {
                name: t.name.clone(),
                level: t.level,
                statement,
            }))
        })
        .collect()
}

/// Where the checkpoint came from: its `sft.json` (written by the warm start) and, for a run
/// directory's checkpoint (`checkpoints/step-N/learner`), the learner version in `state.json`.
pub fn provenance(checkpoint: &Path) -> serde_json::Value {
    let read = |p: PathBuf| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
    };
    let sft = read(checkpoint.join("sft.json"));
    let version = checkpoint
        .parent()
        .and_then(|p| read(p.join("state.json")))
        .and_then(|s| s.get("learner_version").cloned());
    serde_json::json!({
        "path": checkpoint.display().to_string(),
        "sft": sft,
        "learner_version": version,
    })
}

/// The trajectories and their figures.
pub struct Report {
    /// Per task, every turn.
    pub trajectories: Vec<TaskTrajectories>,
    /// Per task.
    pub scores: Vec<TaskScores>,
    /// Over the tasks.
    pub summary: PolicySummary,
}

/// Runs the episodes with a progress line on stderr and scores them.
pub fn evaluate(
    policy: &mut dyn Policy,
    env: &dyn KernelEnv,
    tasks: &[Arc<EpisodeTask>],
    opts: &RunOptions,
) -> Result<Report, String> {
    let line = crate::cmd::ProgressLine::default();
    let mut last = Instant::now() - Duration::from_secs(1);
    let mut progress = |p: &Progress| {
        // Rewritten in place, a few times a second at most, and always at the end.
        if last.elapsed() < Duration::from_millis(250) && p.turns_done < p.turns {
            return;
        }
        last = Instant::now();
        let eta = p
            .eta()
            .map_or("?".to_string(), |d| format!("{:.0} s", d.as_secs_f64()));
        let text = format!(
            "[tasks {}/{}] trajectories {}/{}, turns {}/{}, {:.1} s, ETA {eta}",
            p.tasks_done,
            p.tasks,
            p.trajectories_done,
            p.trajectories,
            p.turns_done,
            p.turns,
            p.elapsed.as_secs_f64()
        );
        line.show(p.turns_done, p.turns, &text);
    };
    let trajectories = policy_eval::run(policy, env, tasks, opts, &mut progress);
    line.finish();
    let trajectories = trajectories.map_err(|e| e.to_string())?;
    let scores: Vec<TaskScores> = trajectories.iter().map(score_task).collect();
    let summary = summarize(&scores);
    Ok(Report {
        trajectories,
        scores,
        summary,
    })
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The report as text: a line per task, then the summary.
pub fn render(scores: &[TaskScores], s: &PolicySummary, k: u32, n: u32) -> String {
    let w = name_width(scores.iter().map(|r| r.task.as_str()));
    let mut out = format!(
        "{:w$}  lvl  {:>7}  {:>7}  {:>10}  {:>10}  {:>7}  {:>6}  correct at turn 1..{n}\n",
        "task",
        format!("avg@{k}"),
        format!("best@{k}"),
        "best speed",
        "avg speed",
        "fmt err",
        "tokens",
    );
    for r in scores {
        let turns: Vec<String> = r.turn_correct.iter().map(|&c| pct(c)).collect();
        out += &format!(
            "{:w$}  {:>3}  {:>7}  {:>7}  {:>9.3}x  {:>9.3}x  {:>7}  {:>6.1}  {}\n",
            r.task,
            r.level,
            pct(r.avg_at_k),
            if r.best_at_k { "yes" } else { "no" },
            r.best_speedup,
            r.avg_speedup,
            pct(r.format_error_rate),
            r.mean_response_tokens,
            turns.join(" "),
        );
    }
    let by_turn = |v: &[f64]| {
        v.iter()
            .enumerate()
            .map(|(i, c)| format!("t{} {}", i + 1, pct(*c)))
            .collect::<Vec<_>>()
            .join("  ")
    };
    out += &format!(
        "\n{} tasks x {k} trajectories x {n} turns ({} kernels)\n",
        s.tasks, s.turns
    );
    out += &format!(
        "correctness: avg@{k} {}  best@{k} {}\n",
        pct(s.avg_at_k),
        pct(s.best_at_k)
    );
    out += &format!("correct at turn t:          {}\n", by_turn(&s.turn_correct));
    out += &format!(
        "correct by turn t (any <=): {}\n",
        by_turn(&s.solved_by_turn)
    );
    out += &format!(
        "speedup: mean {:.3}x (best@{k} per task, unsolved = 0); mean {:.3}x (avg@{k}: per trajectory, incorrect = 0); geometric mean {} (solved tasks)\n",
        s.mean_speedup,
        s.mean_avg_speedup,
        s.geomean_speedup.map_or("n/a".to_string(), |g| format!("{g:.3}x")),
    );
    out += &format!(
        "fast_p (tasks): {}\n",
        s.fast_p
            .iter()
            .map(|(p, f)| format!("fast_{p}={}", pct(*f)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    out += &format!(
        "format errors {} of turns; mean response tokens {:.1}; {} of the turns after the first resubmit a kernel their trajectory already submitted\n",
        pct(s.format_error_rate),
        s.mean_response_tokens,
        pct(s.repeat_rate),
    );
    out += &format!(
        "outcomes: {}\n",
        s.outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if s.flagged > 0 {
        out += &format!("{} speedup(s) over 10x flagged for review\n", s.flagged);
    }
    out
}

/// What the JSON report says about the run besides the figures.
pub struct RunInfo<'a> {
    /// The arguments.
    pub args: &'a PolicyEvalArgs,
    /// The checkpoint evaluated.
    pub checkpoint: &'a Path,
    /// K.
    pub samples: u32,
    /// The backend used.
    pub backend: &'a str,
    /// The policy's device ("cpu" or "cuda").
    pub device: &'a str,
    /// The config the run used.
    pub config: &'a Config,
    /// The policy's description.
    pub policy: String,
    /// How often the evaluation cache answered a repeated candidate (`None`: no cache).
    pub cache: Option<kevin::env::CacheStats>,
    /// The environment's description.
    pub env: String,
}

/// The JSON written by `--json`: the run's settings, the checkpoint's provenance, per task the
/// figures and each trajectory's outcomes turn by turn, and the summary.
pub fn to_json(info: &RunInfo<'_>, report: &Report) -> serde_json::Value {
    let a = info.args;
    let tasks: Vec<serde_json::Value> = report
        .scores
        .iter()
        .zip(&report.trajectories)
        .map(|(s, t)| {
            let turns: Vec<Vec<serde_json::Value>> = t
                .trajectories
                .iter()
                .map(|tr| {
                    tr.iter()
                        .zip(kevin::turn::repeated(tr))
                        .map(|(r, repeat)| {
                            serde_json::json!({
                                "outcome": r.outcome.kind(),
                                "speedup": r.outcome.speedup(),
                                "tokens": r.response_tokens.len(),
                                "repeat": repeat,
                            })
                        })
                        .collect()
                })
                .collect();
            let mut v = serde_json::to_value(s).expect("scores serialise");
            v["trajectories"] = serde_json::json!(turns);
            v
        })
        .collect();
    serde_json::json!({
        "command": "kevin eval --checkpoint",
        "checkpoint": provenance(info.checkpoint),
        "samples": info.samples,
        "turns": a.turns,
        "budget": info.samples * a.turns,
        "seed": a.seed,
        "split": a.split,
        "backend": info.backend,
        "device": info.device,
        "temperature": info.config.sampling.temperature,
        "top_p": info.config.sampling.top_p,
        "max_new_tokens": info.config.sampling.max_new_tokens,
        "prompt_budget_chars": info.config.rollout.prompt_budget_chars,
        "config": a.config.as_ref().map(|c| c.display().to_string()),
        "date": kevin::clock::utc_rfc3339(),
        "policy": info.policy,
        "env": info.env,
        "eval_cache": info.cache,
        "tasks": tasks,
        "summary": report.summary,
    })
}

/// Runs the command: checks the arguments, loads the policy and the environment, evaluates,
/// prints the table and the summary, writes the JSON.
pub fn main(
    args: &PolicyEvalArgs,
    checkpoint: &Path,
    vars: &[(String, String)],
) -> Result<(), CmdError> {
    use CmdError::{Failure, Usage};
    let k = samples(args).map_err(Usage)?;
    if args.turns == 0 {
        return Err(Usage("--turns 0: at least one turn is needed".into()));
    }
    if !checkpoint.is_dir() {
        return Err(Usage(format!(
            "--checkpoint {}: no such directory (a Hugging Face model directory: config.json, \
             tokenizer.json, model.safetensors)",
            checkpoint.display()
        )));
    }
    let mut config = config(args, checkpoint, vars).map_err(Usage)?;
    // The generator (on a GPU) and the evaluation take the same timing lease, or neither does.
    if let Some(timing) = args.timing()? {
        config.file.env.timing = timing;
    }
    let suite = TaskSuite::load(&args.dir)
        .map_err(|e| Usage(format!("task suite {}: {e}", args.dir.display())))?;
    let backend = args
        .backend
        .clone()
        .unwrap_or_else(|| kevin::machine::default_backend().to_string());
    // The prompt shows the sizes the backend evaluates at.
    let preset = if backend == "cuda" {
        Preset::Gpu
    } else {
        Preset::Small
    };
    let tasks = episode_tasks(&suite, &args.split, &args.tasks, preset).map_err(Usage)?;
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
    let env = crate::cmd::backends::eval_env_timed(
        Some(&backend),
        suite,
        &args.dir,
        parallel,
        kevin::env::Deadlines::default(),
        config.env.timing,
    )
    .map(|env| kevin::env::cached(env, config.env.cache_entries as usize))
    .map_err(Failure)?;
    let mut policy = kevin_policy::runtime::build_policy(&config).map_err(Failure)?;
    let device = if kevin_policy::runtime::uses_cuda(config.policy.burn.device) {
        "cuda"
    } else {
        "cpu"
    };
    eprintln!("kevin eval: {}", policy.describe());
    eprintln!("kevin eval: {}", env.describe());
    eprintln!(
        "kevin eval: {} {} tasks x {k} trajectories x {} turns, seed {}",
        tasks.len(),
        args.split,
        args.turns,
        args.seed
    );
    let opts = RunOptions {
        samples: k,
        turns: args.turns,
        prompt_budget_chars: config.rollout.prompt_budget_chars as usize,
        seed: args.seed,
        sampling: config.sampling.clone(),
        gen_batch: config.sampling.max_batch as usize,
        eval_workers: parallel,
    };
    let report = evaluate(policy.as_mut(), env.as_ref(), &tasks, &opts).map_err(Failure)?;
    let cache = env.cache_stats();
    if let Some(c) = &cache {
        eprintln!("kevin eval: evaluation cache: {}", c.line());
    }
    let info = RunInfo {
        args,
        checkpoint,
        samples: k,
        backend: &backend,
        device,
        config: &config,
        policy: policy.describe(),
        env: env.describe(),
        cache,
    };
    let prov = provenance(checkpoint);
    println!(
        "checkpoint {}{}{}; backend {backend}, policy on {device}, temperature {}, max new tokens {}",
        checkpoint.display(),
        prov["learner_version"]
            .as_u64()
            .map(|v| format!(" (learner version {v})"))
            .unwrap_or_default(),
        if prov["sft"].is_null() { "" } else { " (sft.json present)" },
        config.sampling.temperature,
        config.sampling.max_new_tokens,
    );
    print!("{}", render(&report.scores, &report.summary, k, args.turns));
    if let Some(path) = &args.json {
        write_json(path, &to_json(&info, &report)).map_err(Failure)?;
    }
    if let Some(path) = &args.transcripts {
        std::fs::write(path, transcripts(&report.trajectories))
            .map_err(|e| Failure(format!("--transcripts {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Every turn as one JSON line: task, trajectory, turn, prompt, response, outcome (its kind),
/// its reason (as the feedback text the next turn sees), speedup, response tokens, and the full
/// outcome as `result` (what `kevin sft repairs` reads from a transcript).
pub fn transcripts(trajectories: &[TaskTrajectories]) -> String {
    let mut out = String::new();
    for task in trajectories {
        for (k, turns) in task.trajectories.iter().enumerate() {
            for r in turns {
                let line = serde_json::json!({
                    "task": task.task,
                    "trajectory": k,
                    "turn": r.turn,
                    "prompt": r.prompt,
                    "response": r.response,
                    "outcome": r.outcome.kind(),
                    "feedback": r.outcome.feedback(),
                    "speedup": r.outcome.speedup(),
                    "tokens": r.response_tokens.len(),
                    "result": r.outcome,
                });
                out.push_str(&line.to_string());
                out.push('\n');
            }
        }
    }
    out
}
