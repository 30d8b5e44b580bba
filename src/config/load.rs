//! Loading: defaults < TOML file < `KEVIN__SECTION__KEY` variables, with every key of every
//! layer checked against the schema before merging.

use std::path::Path;

use super::error::{invalid, one_line, ConfigError};
use super::schema::ConfigFile;
use super::validate::Config;

/// The prefix of environment overrides: `KEVIN__ROLLOUT__TURNS=8` sets `rollout.turns`.
pub const ENV_PREFIX: &str = "KEVIN";
/// Separator between prefix, section and key in environment overrides.
pub const ENV_SEPARATOR: &str = "__";

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

impl Config {
    /// Loads and validates: the one entry point the CLI uses.
    pub fn load(path: Option<&Path>, vars: &[(String, String)]) -> Result<Config, ConfigError> {
        let (file, sources) = ConfigFile::load(path, vars)?;
        let mut config = Config::from_file(file)?;
        config.sources = sources;
        Ok(config)
    }
}
