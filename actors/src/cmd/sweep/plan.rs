//! The plan of a sweep, made before anything starts: the `--set KEY=V1,V2` lists parsed and
//! combined into variants (their product, or with `--zip` their values paired by position), each
//! variant named after its overrides and built into a [`Config`] by the loader `kevin train`
//! uses, with the overrides as the `KEVIN__SECTION__KEY` variables the child will get, so a key
//! or value the child would refuse is refused here, naming it; then how many variants this
//! machine trains at once ([`placement`]).

use std::path::{Path, PathBuf};

use kevin::config::{
    BurnDevice, Config, ConfigError, ConfigFile, EnvKind, PolicyKind, ENV_PREFIX, ENV_SEPARATOR,
};
use serde::Serialize;

/// Keys the sweep sets itself: a variant's run is named after its overrides and lives under
/// `--dir`, so `--set` may not move or rename it.
pub const RESERVED_KEYS: [&str; 2] = ["run.name", "run.runs_dir"];
/// The variable that names a variant's run (`run.name`, the variant's name).
const RUN_NAME_VAR: &str = "KEVIN__RUN__NAME";
/// Longest variant name kept whole: a longer one is cut and ends in a hash of the whole, so the
/// folder's name stays within what file systems take (255 bytes) and stays stable.
const MAX_NAME: usize = 120;

/// One `--set KEY=V1,V2,...`: a config key (its dotted path) and the values to try, as typed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetArg {
    /// The dotted key, e.g. `learner.lr`.
    pub key: String,
    /// The values, in the order given.
    pub values: Vec<String>,
}

/// One variant: the base config with some keys set.
#[derive(Clone, Debug)]
pub struct Variant {
    /// `key=value` of every override, joined by commas and made safe for a file name: the run
    /// directory's name and the run's `run.name`.
    pub name: String,
    /// (key, value as typed), in `--set` order.
    pub overrides: Vec<(String, String)>,
    /// The run directory: `--dir`/`name`.
    pub dir: PathBuf,
    /// The resolved config the child will run with.
    pub config: Config,
}

impl Variant {
    /// The environment variables that make `kevin train --config BASE` this variant: one
    /// `KEVIN__SECTION__KEY` per override, and `KEVIN__RUN__NAME`.
    pub fn env(&self) -> Vec<(String, String)> {
        self.overrides
            .iter()
            .map(|(k, v)| (env_var(k), v.clone()))
            .chain([(RUN_NAME_VAR.to_string(), self.name.clone())])
            .collect()
    }
}

/// The `KEVIN__SECTION__KEY` variable of a dotted key (`learner.lr` -> `KEVIN__LEARNER__LR`).
pub fn env_var(key: &str) -> String {
    std::iter::once(ENV_PREFIX.to_string())
        .chain(key.split('.').map(str::to_ascii_uppercase))
        .collect::<Vec<_>>()
        .join(ENV_SEPARATOR)
}

/// Parses one `--set KEY=V1,V2,...`: the key's form, the reserved keys, empty and repeated values
/// (whether the key exists and the values fit is [`variants`]' to say, through the loader).
pub fn parse_set(arg: &str) -> Result<SetArg, String> {
    let Some((key, values)) = arg.split_once('=') else {
        return Err(format!(
            "--set {arg}: expected KEY=V1,V2,... (a config key's dotted path and its values, \
             e.g. learner.lr=1e-4,3e-4)"
        ));
    };
    let key = key.trim();
    let well_formed = key.split('.').count() >= 2
        && key.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        && !key.contains("__");
    if !well_formed {
        return Err(format!(
            "--set {key}: not a config key; a key is its section and name in lowercase, dotted, \
             as in the config file (e.g. learner.lr, rollout.turns, policy.burn.device)"
        ));
    }
    if RESERVED_KEYS.contains(&key) {
        return Err(format!(
            "--set {key}: the sweep names each run after its overrides and puts it under --dir; \
             set {key} in the base config, or choose the folder with --dir"
        ));
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
    if let Some(i) = values.iter().position(String::is_empty) {
        return Err(format!(
            "--set {key}: value {} of {:?} is empty",
            i + 1,
            values.join(",")
        ));
    }
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            return Err(format!("--set {key}: value {v} is given twice"));
        }
    }
    Ok(SetArg {
        key: key.to_string(),
        values,
    })
}

/// The overrides of every variant: the product of the sets' values (the first `--set` varies
/// slowest), or with `zip` the i-th value of every set together.
pub fn combine(sets: &[SetArg], zip: bool) -> Result<Vec<Vec<(String, String)>>, String> {
    for (i, s) in sets.iter().enumerate() {
        if sets[..i].iter().any(|o| o.key == s.key) {
            return Err(format!(
                "--set {}: the key is set twice; give all its values in one --set",
                s.key
            ));
        }
    }
    if zip {
        let n = sets.first().map_or(0, |s| s.values.len());
        if let Some(other) = sets.iter().find(|s| s.values.len() != n) {
            return Err(format!(
                "--zip pairs values by position, so every --set needs as many: {} has {n}, {} \
                 has {}",
                sets[0].key,
                other.key,
                other.values.len()
            ));
        }
        return Ok((0..n)
            .map(|i| {
                sets.iter()
                    .map(|s| (s.key.clone(), s.values[i].clone()))
                    .collect()
            })
            .collect());
    }
    let mut out: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for s in sets {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                s.values.iter().map(move |v| {
                    let mut o = prefix.clone();
                    o.push((s.key.clone(), v.clone()));
                    o
                })
            })
            .collect();
    }
    Ok(out)
}

/// The run name of a variant: `key=value` pairs joined by commas, every character outside
/// `A-Za-z0-9._+-` of a value replaced by `_`, cut at `MAX_NAME` (120) bytes with a hash of the
/// whole after the cut. The same overrides always give the same name.
pub fn variant_name(overrides: &[(String, String)]) -> String {
    let safe = |v: &str| -> String {
        v.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let whole = overrides
        .iter()
        .map(|(k, v)| format!("{k}={}", safe(v)))
        .collect::<Vec<_>>()
        .join(",");
    if whole.len() <= MAX_NAME {
        return whole;
    }
    let exact = overrides
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    // The name is ASCII, so any byte is a character boundary.
    format!(
        "{}-{:016x}",
        &whole[..MAX_NAME - 17],
        kevin::rng::fnv1a(exact.as_bytes())
    )
}

/// The caller's `KEVIN__*` variables `vars` with `overrides` as variables on top (the `--set`
/// ones win, as they do in the child).
fn with_overrides(
    vars: &[(String, String)],
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let set: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (env_var(k), v.clone()))
        .collect();
    let mut all: Vec<(String, String)> = vars
        .iter()
        .filter(|(name, _)| name != RUN_NAME_VAR && !set.iter().any(|(n, _)| n == name))
        .cloned()
        .collect();
    all.extend(set);
    all
}

/// The node `key` names in the defaults (a section or a value), if any.
fn default_node(key: &str) -> Option<toml::Value> {
    let mut node = toml::Value::try_from(ConfigFile::default()).ok()?;
    for part in key.split('.') {
        node = node.as_table()?.get(part)?.clone();
    }
    Some(node)
}

/// Every variant of `sets` on the config file `base`, named and resolved, its run directory under
/// `dir`. Refused, naming what is wrong, before anything starts: a key that names a section, a
/// key the schema does not know or a value of the wrong type (`--set KEY=VALUE: ...`, each
/// value on its own), a variant whose values break a rule of the config, alone or together
/// (`variant NAME: ...`; `run.mode=sync` needs `replay.max_staleness=0`, so those two are swept
/// with `--zip`), a variant that would never end (`run.max_steps = 0`), and two variants whose
/// names clash.
pub fn variants(
    base: &Path,
    vars: &[(String, String)],
    sets: &[SetArg],
    zip: bool,
    dir: &Path,
) -> Result<Vec<Variant>, String> {
    for s in sets {
        if let Some(toml::Value::Table(t)) = default_node(&s.key) {
            return Err(format!(
                "--set {}: names the section [{}], not a key; its keys: {}",
                s.key,
                s.key,
                t.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        for v in &s.values {
            // The layers alone: unknown keys and types. Value rules may need another --set.
            ConfigFile::load(
                Some(base),
                &with_overrides(vars, &[(s.key.clone(), v.clone())]),
            )
            .map_err(|e| {
                // The key came from this --set (passed to the loader as a variable).
                let var = format!("environment variable {}", env_var(&s.key));
                let e = match e {
                    ConfigError::UnknownKey {
                        key,
                        origin,
                        section,
                        allowed,
                    } if origin == var => ConfigError::UnknownKey {
                        key,
                        origin: format!("--set {}", s.key),
                        section,
                        allowed,
                    },
                    e => e,
                };
                format!("--set {}={v}: {e}", s.key)
            })?;
        }
    }
    let mut out: Vec<Variant> = Vec::new();
    for overrides in combine(sets, zip)? {
        let name = variant_name(&overrides);
        let mut with_name = overrides.clone();
        with_name.push(("run.name".into(), name.clone()));
        let config = Config::load(Some(base), &with_overrides(vars, &with_name))
            .map_err(|e| format!("variant {name}: {e}"))?;
        if config.run.max_steps == 0 {
            return Err(format!(
                "variant {name}: run.max_steps = 0 (train until stopped), so it would never \
                 finish; set run.max_steps in {} or sweep it with --set run.max_steps=N",
                base.display()
            ));
        }
        if let Some(twin) = out.iter().find(|o| o.name == name) {
            return Err(format!(
                "variants {:?} and {:?} both get the run name {name}; make the values differ \
                 in letters, digits or ._+-",
                pairs(&twin.overrides),
                pairs(&overrides)
            ));
        }
        out.push(Variant {
            dir: dir.join(&name),
            name,
            overrides,
            config,
        });
    }
    Ok(out)
}

fn pairs(overrides: &[(String, String)]) -> String {
    overrides
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The GPUs one run of `config` occupies on a machine with `gpus` visible GPUs: 0 when it runs on
/// the CPU; the cuda environment's ordinals up to its largest (`env.gpus`); else 1 when the burn
/// policy (and its learner) run on CUDA (`policy.burn.device` cuda, or auto with a GPU here).
pub fn gpus_per_run(config: &ConfigFile, gpus: usize) -> usize {
    if config.env.kind == EnvKind::Cuda {
        return config.env.gpus.iter().max().map_or(1, |g| *g as usize + 1);
    }
    let burn_on_gpu = config.policy.kind == PolicyKind::Burn
        && match config.policy.burn.device {
            BurnDevice::Cuda => true,
            BurnDevice::Auto => gpus > 0,
            BurnDevice::Cpu => false,
        };
    usize::from(burn_on_gpu)
}

/// How many variants train at once, and on which GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Children at once.
    pub parallel: usize,
    /// The `CUDA_VISIBLE_DEVICES` of each slot when the runs use GPUs (a child takes a free
    /// slot for its life); `None` for CPU runs, or where no GPU is visible.
    pub gpu_slots: Option<Vec<String>>,
    /// Why `--parallel` was lowered, when it was.
    pub note: Option<String>,
}

/// The placement of `requested` children of `configs` on a machine with `gpus` visible GPUs
/// (their `CUDA_VISIBLE_DEVICES` names) and `cores` cores: runs that use GPUs get GPUs of their
/// own, as many as the hungriest variant needs ([`gpus_per_run`]), so at most one run per GPU
/// (or per group of GPUs); CPU runs at most one per core.
pub fn placement<'a>(
    requested: usize,
    configs: impl IntoIterator<Item = &'a ConfigFile>,
    gpus: &[String],
    cores: usize,
) -> Placement {
    let need = configs
        .into_iter()
        .map(|c| gpus_per_run(c, gpus.len()))
        .max()
        .unwrap_or(0);
    let (limit, gpu_slots, why) = if need == 0 {
        (
            cores.max(1),
            None,
            format!("the runs use the CPU and this machine has {cores} core(s)"),
        )
    } else if gpus.is_empty() {
        (
            1,
            None,
            "the runs use a GPU and none is visible here".to_string(),
        )
    } else if need > gpus.len() {
        (
            1,
            Some(vec![gpus.join(",")]),
            format!(
                "each run uses {need} GPUs and {} are visible here",
                gpus.len()
            ),
        )
    } else {
        let slots: Vec<String> = gpus.chunks_exact(need).map(|c| c.join(",")).collect();
        (
            slots.len(),
            Some(slots),
            format!(
                "each run uses {need} GPU(s) of its own and {} are visible here",
                gpus.len()
            ),
        )
    };
    let parallel = requested.clamp(1, limit);
    Placement {
        parallel,
        gpu_slots,
        note: (requested > limit)
            .then(|| format!("--parallel {requested}: {why}; running {limit} at a time")),
    }
}

/// The GPUs this process may hand out, by the names `CUDA_VISIBLE_DEVICES` takes: the entries of
/// `CUDA_VISIBLE_DEVICES` when it is set, else the indices nvidia-smi lists
/// ([`kevin::machine::gpu_count`], which honours the variable).
pub fn visible_gpus() -> Vec<String> {
    let n = kevin::machine::gpu_count();
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) => list
            .split(',')
            .map(|e| e.trim().to_string())
            .take(n)
            .collect(),
        Err(_) => (0..n).map(|i| i.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, values: &[&str]) -> SetArg {
        SetArg {
            key: key.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn names(sets: &[SetArg], zip: bool) -> Vec<String> {
        combine(sets, zip)
            .unwrap()
            .iter()
            .map(|o| variant_name(o))
            .collect()
    }

    #[test]
    fn sets_parse_and_bad_ones_are_refused_by_name() {
        assert_eq!(
            parse_set("learner.lr=1e-4, 3e-4").unwrap(),
            set("learner.lr", &["1e-4", "3e-4"])
        );
        assert_eq!(
            parse_set("policy.burn.device=cpu").unwrap(),
            set("policy.burn.device", &["cpu"])
        );
        for (arg, expected) in [
            ("learner.lr", "--set learner.lr: expected KEY=V1,V2"),
            ("lr=1", "--set lr: not a config key"),
            ("Learner.LR=1", "--set Learner.LR: not a config key"),
            ("learner..lr=1", "--set learner..lr: not a config key"),
            ("run.name=a,b", "--set run.name: the sweep names each run"),
            (
                "run.runs_dir=x",
                "--set run.runs_dir: the sweep names each run",
            ),
            (
                "learner.lr=1,,2",
                "--set learner.lr: value 2 of \"1,,2\" is empty",
            ),
            ("learner.lr=", "--set learner.lr: value 1 of \"\" is empty"),
            ("learner.lr=1,1", "--set learner.lr: value 1 is given twice"),
        ] {
            let err = parse_set(arg).unwrap_err();
            assert!(err.starts_with(expected), "{arg}: {err}");
        }
    }

    #[test]
    fn variants_are_the_product_or_the_zip_and_named_after_their_overrides() {
        let sets = [
            set("learner.lr", &["1e-4", "3e-4"]),
            set("rollout.turns", &["2", "4"]),
        ];
        assert_eq!(
            names(&sets, false),
            [
                "learner.lr=1e-4,rollout.turns=2",
                "learner.lr=1e-4,rollout.turns=4",
                "learner.lr=3e-4,rollout.turns=2",
                "learner.lr=3e-4,rollout.turns=4",
            ]
        );
        assert_eq!(
            names(&sets, true),
            [
                "learner.lr=1e-4,rollout.turns=2",
                "learner.lr=3e-4,rollout.turns=4"
            ]
        );
        let uneven = [set("learner.lr", &["1", "2"]), set("rollout.turns", &["2"])];
        let err = combine(&uneven, true).unwrap_err();
        assert!(
            err.contains("learner.lr has 2, rollout.turns has 1"),
            "{err}"
        );
        let twice = [set("learner.lr", &["1"]), set("learner.lr", &["2"])];
        assert!(combine(&twice, false)
            .unwrap_err()
            .starts_with("--set learner.lr: the key is set twice"));
    }

    #[test]
    fn names_are_safe_for_a_file_and_stable() {
        let o = |v: &str| vec![("policy.burn.checkpoint".to_string(), v.to_string())];
        assert_eq!(
            variant_name(&o("models/kevin tiny")),
            "policy.burn.checkpoint=models_kevin_tiny"
        );
        let long = "x".repeat(300);
        let name = variant_name(&o(&long));
        assert_eq!(name.len(), MAX_NAME);
        assert_eq!(name, variant_name(&o(&long)), "stable");
        assert_ne!(
            name,
            variant_name(&o(&format!("{long}y"))),
            "the hash tells them apart"
        );
        assert_eq!(
            env_var("policy.burn.max_len"),
            "KEVIN__POLICY__BURN__MAX_LEN"
        );
    }

    #[test]
    fn parallel_runs_are_bounded_by_cores_or_gpus() {
        let cpu = ConfigFile::default(); // simulated environment and policy
        let gpus = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        let p = placement(8, [&cpu], &gpus(2), 2);
        assert_eq!((p.parallel, p.gpu_slots.clone()), (2, None));
        assert!(p.note.unwrap().contains("2 core(s)"));
        assert_eq!(placement(1, [&cpu], &[], 2).note, None);

        let mut burn = ConfigFile::default();
        burn.policy.kind = PolicyKind::Burn;
        burn.policy.burn.device = BurnDevice::Auto;
        assert_eq!(gpus_per_run(&burn, 0), 0, "auto without a GPU is the CPU");
        let p = placement(4, [&cpu, &burn], &gpus(2), 16);
        assert_eq!(p.parallel, 2);
        assert_eq!(p.gpu_slots, Some(vec!["0".into(), "1".into()]));
        assert!(p.note.unwrap().contains("1 GPU(s) of its own and 2"));

        let mut cuda = ConfigFile::default();
        cuda.env.kind = EnvKind::Cuda;
        cuda.env.gpus = vec![0, 1];
        let p = placement(4, [&cuda], &gpus(5), 16);
        assert_eq!(p.parallel, 2);
        assert_eq!(p.gpu_slots, Some(vec!["0,1".into(), "2,3".into()]));
        let p = placement(2, [&cuda], &gpus(1), 16);
        assert_eq!((p.parallel, p.gpu_slots), (1, Some(vec!["0".into()])));
        burn.policy.burn.device = BurnDevice::Cuda;
        assert_eq!(placement(3, [&burn], &[], 16).parallel, 1);
    }
}
