//! The Telemetry actor: writes episodes.jsonl (every turn of every accepted group) and
//! metrics.jsonl (one line per learner step), both rotated and gzipped by size
//! ([`kevin::telemetry::files::RotatingLog`]; the budget never removes the metrics' archives) and the best kernel per task (`best/<task>.cu`), and keeps the Prometheus
//! exporter's numbers ([`kevin::prometheus::Exporter`]) when `telemetry.prometheus` is set.
//!
//! It runs on its own arbiter because it does file I/O. Spans do not pass through it: the
//! tracing layer ([`kevin::telemetry`]) has its own writer thread, so tracing never waits on a
//! mailbox.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix::prelude::*;
use kevin::prometheus::Exporter;
use kevin::replay::ScoredGroup;
use kevin::telemetry::files::RotatingLog;
use serde_json::json;

use crate::pipeline::mailbox::actix_capacity;
use crate::pipeline::messages::{Flush, RecordGroup, RecordMetrics};

/// The Telemetry actor.
pub struct Telemetry {
    metrics: RotatingLog,
    episodes: Option<RotatingLog>,
    best_dir: PathBuf,
    best: HashMap<String, f64>,
    credits: usize,
    exporter: Option<Arc<Exporter>>,
}

/// Score recorded in the first line of a best-kernel file.
fn best_score(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .next()?
        .split("score=")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Telemetry {
    /// Opens (appending) the run directory's files; episodes.jsonl and metrics.jsonl rotate at
    /// `rotate_bytes` (0: never). Every group and step is also recorded into `exporter` when there is one.
    pub fn open(
        run_dir: &Path,
        episodes: bool,
        rotate_bytes: u64,
        credits: usize,
        exporter: Option<Arc<Exporter>>,
    ) -> std::io::Result<Telemetry> {
        let best_dir = run_dir.join("best");
        std::fs::create_dir_all(&best_dir)?;
        let mut best = HashMap::new();
        for entry in std::fs::read_dir(&best_dir)?.flatten() {
            let path = entry.path();
            if let (Some(stem), Some(score)) =
                (path.file_stem().and_then(|s| s.to_str()), best_score(&path))
            {
                best.insert(stem.to_string(), score);
            }
        }
        Ok(Telemetry {
            metrics: RotatingLog::open(run_dir, "metrics", "jsonl", rotate_bytes)?,
            episodes: if episodes {
                Some(RotatingLog::open(
                    run_dir,
                    "episodes",
                    "jsonl",
                    rotate_bytes,
                )?)
            } else {
                None
            },
            best_dir,
            best,
            credits,
            exporter,
        })
    }

    fn record(&mut self, g: &ScoredGroup) -> std::io::Result<()> {
        for (ti, (traj, (rets, advs))) in g
            .group
            .trajectories
            .iter()
            .zip(g.returns.iter().zip(&g.advantages))
            .enumerate()
        {
            for (turn, (ret, adv)) in traj.iter().zip(rets.iter().zip(advs)) {
                if let Some(out) = &mut self.episodes {
                    let line = json!({
                        "seq": g.seq, "group": g.group.id, "task": g.group.task, "trajectory": ti,
                        "turn": turn.turn, "policy_version": turn.policy_version, "score": turn.score,
                        "return": ret, "advantage": adv, "outcome": turn.outcome,
                        "generate_ms": turn.generate_ms, "evaluate_ms": turn.evaluate_ms,
                        "prompt": turn.prompt, "response": turn.response,
                    });
                    out.write_line(&serde_json::to_vec(&line)?)?;
                }
                let best = self
                    .best
                    .get(&g.group.task)
                    .copied()
                    .unwrap_or(f64::NEG_INFINITY);
                if let (true, Some(kernel)) =
                    (turn.outcome.is_correct() && turn.score > best, &turn.kernel)
                {
                    self.best.insert(g.group.task.clone(), turn.score);
                    let header = format!(
                        "// kevin best: score={} speedup={:.3} seq={} turn={} policy_version={}\n",
                        turn.score,
                        turn.outcome.speedup().unwrap_or(0.0),
                        g.seq,
                        turn.turn,
                        turn.policy_version
                    );
                    let file_name = format!("{}.cu", g.group.task.replace(['/', '\\'], "_"));
                    std::fs::write(self.best_dir.join(file_name), header + kernel + "\n")?;
                }
            }
        }
        Ok(())
    }
}

impl Actor for Telemetry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(actix_capacity(self.credits));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        let _ = self.metrics.flush();
        if let Some(e) = &mut self.episodes {
            let _ = e.flush();
        }
    }
}

impl Handler<RecordGroup> for Telemetry {
    type Result = ();

    fn handle(&mut self, msg: RecordGroup, _ctx: &mut Context<Self>) {
        let _span = tracing::info_span!("RecordGroup", actor = "Telemetry").entered();
        if let Some(e) = &self.exporter {
            e.record_group(&msg.group);
        }
        if let Err(e) = self.record(&msg.group) {
            tracing::error!(actor = "Telemetry", error = %e, "could not write episodes.jsonl or a best kernel");
        }
    }
}

impl Handler<RecordMetrics> for Telemetry {
    type Result = ();

    fn handle(&mut self, msg: RecordMetrics, _ctx: &mut Context<Self>) {
        let _span = tracing::info_span!("RecordMetrics", actor = "Telemetry").entered();
        if let Some(e) = &self.exporter {
            e.record_step(&msg.0);
        }
        let written = serde_json::to_vec(&msg.0)
            .map_err(std::io::Error::from)
            .and_then(|line| self.metrics.write_line(&line))
            .and_then(|_| self.metrics.flush());
        if let Err(e) = written {
            tracing::error!(actor = "Telemetry", error = %e, "could not write metrics.jsonl");
        }
    }
}

impl Handler<Flush> for Telemetry {
    type Result = ();

    fn handle(&mut self, _: Flush, _ctx: &mut Context<Self>) {
        let _ = self.metrics.flush();
        if let Some(e) = &mut self.episodes {
            if let Err(err) = e.flush() {
                tracing::error!(actor = "Telemetry", error = %err, "could not flush episodes.jsonl");
            }
        }
    }
}
