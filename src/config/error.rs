//! The one-line configuration error.

/// A configuration error: always a single line naming the offending key or file.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// The config file could not be read or parsed.
    #[error("config file {}: {}", one_line(.path), one_line(.reason))]
    File {
        /// The file.
        path: String,
        /// Why it failed, as one line.
        reason: String,
    },
    /// A key that the schema does not know.
    #[error("unknown config key `{key}` (from {origin}); allowed keys{section}: {allowed}")]
    UnknownKey {
        /// The dotted key.
        key: String,
        /// Where it came from: the file or the environment variable.
        origin: String,
        /// " in [section]" or empty for the top level.
        section: String,
        /// The allowed keys at that level.
        allowed: String,
    },
    /// A value that does not fit its key.
    #[error("config key `{key}` = {value} is invalid: {allowed}")]
    Invalid {
        /// The dotted key.
        key: String,
        /// The offending value as written.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

/// Keeps an error on one line whatever the input held: control characters are escaped.
pub(super) fn one_line(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.escape_debug().to_string()
    } else {
        s.to_string()
    }
}

pub(super) fn invalid(
    key: &str,
    value: impl std::fmt::Display,
    allowed: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: one_line(key),
        value: one_line(&value.to_string()),
        allowed: one_line(&allowed.into()),
    }
}
