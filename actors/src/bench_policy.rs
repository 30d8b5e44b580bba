//! `kevin bench policy`: runs `kevin_policy::bench` on the chosen backend, prints a table and,
//! given the transformers peer's JSON (benches/hf_policy.py, same machine, same call), the
//! ratios the issue asks for (generation at each batch size, learner tokens/s).

use std::path::Path;

use kevin_policy::bench::{run_named, BenchArgs, BenchReport};

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
    }
    out
}

/// Runs the benchmark and reports it.
pub fn run(
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
    let report = run_named(args, device, dtype, &|line| eprintln!("{line}"))?;
    let text = table(&report, peer.as_ref());
    println!("{text}");
    if let Some(path) = json {
        let value = serde_json::json!({ "kevin": report, "transformers": peer, "table": text });
        let body = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
        std::fs::write(path, body).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
