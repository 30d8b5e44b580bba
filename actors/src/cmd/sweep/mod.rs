//! `kevin sweep --config BASE --set KEY=V1,V2 [--set ...] [--zip] [--dir DIR] [--parallel N]`:
//! variants of one config, each a real `kevin train` in a run directory of its own, named after
//! its overrides; then `kevin report DIR` compares them.
//!
//! Everything is checked before anything starts ([`plan`]): every key and value through the
//! loader `kevin train` uses (as the `KEVIN__SECTION__KEY` variables the children get), every
//! combination, every existing run directory against its variant's config (a folder started
//! with another config is refused, as `kevin train` would refuse it), and `--parallel` against
//! the machine ([`plan::placement`]). Then [`launch`] runs the variants that are not finished,
//! and `sweep.json` ([`manifest`]) records where each is.
//!
//! Resuming: "finished" is read from each run directory (its newest complete checkpoint reached
//! `run.max_steps`), so running the same command again skips the finished variants and resumes
//! the others where their checkpoints are (`kevin train` resumes a run directory by itself).

pub mod launch;
pub mod manifest;
pub mod plan;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kevin::config::{Config, ConfigFile};

use super::{cores, env_vars, failure, usage, CmdResult};
use crate::pipeline::system::first_difference;
use manifest::{Manifest, Status, VariantRecord, MANIFEST_FILE};
use plan::{SetArg, Variant};

/// The resolved config `kevin train` writes into a run directory.
const STORED_CONFIG: &str = "config.toml";

/// Train variants of one config side by side: one `kevin train` child per variant (the product
/// of the --set values, or with --zip their values paired), each in a run directory named after
/// its overrides. Ctrl-C stops the running ones cleanly (they drain and checkpoint); the same
/// command again resumes the unfinished and skips the finished.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The base config (TOML); KEVIN__SECTION__KEY variables apply to every variant.
    #[arg(long)]
    pub config: PathBuf,
    /// KEY=V1,V2,...: a config key as its dotted path (learner.lr, rollout.turns, run.mode,
    /// policy.burn.device, ...) and the values to try. Repeat for more keys. run.name and
    /// run.runs_dir are the sweep's own.
    #[arg(long = "set", value_name = "KEY=V1,V2", required = true)]
    pub sets: Vec<String>,
    /// Pair the values of the --sets by position (all need as many) instead of taking their
    /// product.
    #[arg(long)]
    pub zip: bool,
    /// Folder of the variants' run directories and sweep.json (default:
    /// <run.runs_dir>/<run.name>-sweep of the base config).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Variants trained at once: at most one per core for CPU runs, one per GPU (or per GPU
    /// group a run needs) for runs that use GPUs; a larger value is lowered and says so.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub parallel: u64,
    /// Check and list the variants, start nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Plans, checks and runs the sweep; exit 1 when a variant failed, 2 when the plan is refused.
pub fn run(args: Args) -> CmdResult {
    let vars = env_vars();
    let sets: Vec<SetArg> = args
        .sets
        .iter()
        .map(|s| plan::parse_set(s))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    let base = Config::load(Some(&args.config), &vars).map_err(usage)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| Path::new(&base.run.runs_dir).join(format!("{}-sweep", base.run.name)));
    let variants = plan::variants(&args.config, &vars, &sets, args.zip, &dir).map_err(usage)?;
    for v in &variants {
        check_stored_config(v).map_err(usage)?;
    }
    let requested = usize::try_from(args.parallel).unwrap_or(usize::MAX);
    let placement = plan::placement(
        requested,
        variants.iter().map(|v| &v.config.file),
        &plan::visible_gpus(),
        cores(),
    );
    if let Some(note) = &placement.note {
        eprintln!("sweep: {note}");
    }
    let mut manifest = Manifest {
        config: args.config.clone(),
        sets,
        combine: if args.zip { "zip" } else { "product" },
        parallel: placement.parallel,
        variants: variants.iter().map(VariantRecord::new).collect(),
        updated_unix: 0,
    };
    let todo = manifest
        .variants
        .iter()
        .filter(|r| r.status != Status::Finished)
        .count();
    eprintln!(
        "sweep: {} variant(s) in {}: {} finished, {todo} to train, {} at a time",
        variants.len(),
        dir.display(),
        variants.len() - todo,
        placement.parallel
    );
    if args.dry_run {
        print!("{}", table(&manifest));
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::create_dir_all(&dir).map_err(|e| failure(format!("{}: {e}", dir.display())))?;
    for r in manifest
        .variants
        .iter()
        .filter(|r| r.status == Status::Finished)
    {
        eprintln!(
            "sweep: {} skipped: finished (learner version {})",
            r.name,
            r.version.unwrap_or(0)
        );
    }
    manifest.write(&dir).map_err(failure)?;
    let exe = kevin::worker::own_binary().map_err(|e| failure(format!("the kevin binary: {e}")))?;
    let ended = launch::Launcher {
        exe: &exe,
        config: &args.config,
        dir: &dir,
        parallel: placement.parallel,
        gpu_slots: placement.gpu_slots,
    }
    .run(&variants, &mut manifest)
    .map_err(failure)?;

    print!("{}", table(&manifest));
    let failed = manifest
        .variants
        .iter()
        .filter(|r| r.status == Status::Failed)
        .count();
    if ended.by_signal {
        println!("stopped by signal; run the same command again to resume the unfinished variants");
    }
    println!("manifest: {}", dir.join(MANIFEST_FILE).display());
    println!("compare the runs with: kevin report {}", dir.display());
    if failed > 0 {
        eprintln!("kevin sweep: {failed} variant(s) failed (their logs say why)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A variant's run directory that already holds a config must hold this variant's (all but
/// `run.max_steps`, which a resumed run may raise): `kevin train` would refuse it anyway, and
/// the sweep refuses before anything starts.
fn check_stored_config(v: &Variant) -> Result<(), String> {
    let path = v.dir.join(STORED_CONFIG);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let stored: ConfigFile = toml::from_str(&text).map_err(|e| {
        format!(
            "{}: {}",
            path.display(),
            e.to_string().lines().next().unwrap_or("not a kevin config")
        )
    })?;
    match first_difference(&stored, &v.config.file) {
        None => Ok(()),
        Some(key) => Err(format!(
            "variant {}: its run directory {} was started with a different config ({key} \
             differs); use the config it was started with, or another --dir",
            v.name,
            v.dir.display()
        )),
    }
}

/// The sweep's final table (markdown).
fn table(m: &Manifest) -> String {
    let mut s = String::from(
        "| variant | status | learner version | exit | note | run directory |\n\
         | --- | --- | ---: | ---: | --- | --- |\n",
    );
    for r in &m.variants {
        s += &format!(
            "| {} | {} | {}/{} | {} | {} | {} |\n",
            r.name,
            r.status.word(),
            r.version.map_or_else(|| "-".to_string(), |v| v.to_string()),
            r.max_steps,
            r.exit_code
                .map_or_else(|| "-".to_string(), |c| c.to_string()),
            r.note.as_deref().unwrap_or(""),
            r.dir.display()
        );
    }
    s
}
