//! The experiment configuration: one typed struct, loaded in layers and validated once.
//!
//! Layers, later ones winning: built-in defaults (the paper's recipe) < a TOML file <
//! `KEVIN__SECTION__KEY=value` environment variables. Loading is two-stage, as in ripgrep's
//! LowArgs -> HiArgs: the serde-facing [`ConfigFile`] is merged from the layers, every key is
//! checked against the known schema (unknown keys are rejected, never ignored), and
//! [`Config::from_file`] validates values and derives what the runtime needs. Every error is one
//! line naming the key, the value and what is allowed. The resolved config is written into the run
//! directory ([`Config::to_toml`]) so a run always records what it ran with.
//!
//! Files: `schema` (the serde sections and their defaults), `load` (the layers and the
//! unknown-key check), `validate` (the value rules and the runtime [`Config`]), `error` (the
//! one-line [`ConfigError`]). Everything public is re-exported here: import `crate::config::X`,
//! never the submodules. This module depends only on `crate::rl` and `crate::tasks` (for types the schema names);
//! nothing in it may import the environments, the workers, the policy or the actors.

mod error;
mod load;
mod schema;
mod validate;

pub use error::ConfigError;
pub use load::{ENV_PREFIX, ENV_SEPARATOR};
pub use schema::*;
pub use validate::Config;

#[cfg(test)]
mod tests;
