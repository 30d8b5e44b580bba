//! What the cpu and cuda environments share on the parent side: the compiled module on disk that
//! their workers load ([`ModuleArtifact`], stored in [`Compiled::artifact`]) and the verify and
//! profile requests that name it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::candidate::ResolvedPlan;
use crate::env::Compiled;
use crate::outcome::Outcome;
use crate::tasks::Preset;
use crate::verify::request::{EvalRequest, ModuleJob};

/// What is removed when the last reference to a [`ModuleArtifact`] goes.
#[derive(Debug)]
pub(super) enum Owned {
    /// The module's own folder (the CPU's shared library and its build files).
    Dir(PathBuf),
    /// The module file alone (a CUBIN in the environment's work folder).
    File,
}

/// A compiled module on disk, with what a worker needs to run it.
#[derive(Debug)]
pub(super) struct ModuleArtifact {
    /// What to remove when dropped.
    pub owned: Owned,
    /// The module file.
    pub module: PathBuf,
    /// Source kernel name -> symbol (empty on the CPU).
    pub symbols: BTreeMap<String, String>,
    /// The resolved launch plan.
    pub plan: ResolvedPlan,
}

impl ModuleArtifact {
    /// The request part that names the `kind` module in `compiled`; anything else in
    /// `compiled` is a crash ("not a `kind` module").
    fn job(compiled: &Compiled, kind: &str, preset: Preset) -> Result<ModuleJob, Outcome> {
        let a = compiled
            .artifact
            .downcast_ref::<ModuleArtifact>()
            .ok_or_else(|| Outcome::Crash {
                reason: format!("not a {kind} module"),
            })?;
        Ok(ModuleJob {
            task: compiled.task.clone(),
            preset,
            module: a.module.clone(),
            symbols: a.symbols.clone(),
            plan: a.plan.clone(),
        })
    }

    /// The correctness protocol's request (5 trials) for the `kind` module in `compiled`.
    pub fn verify_request(
        compiled: &Compiled,
        kind: &str,
        preset: Preset,
    ) -> Result<EvalRequest, Outcome> {
        let job = Self::job(compiled, kind, preset)?;
        Ok(EvalRequest::Verify { job, trials: 5 })
    }

    /// The timing protocol's request for the `kind` module in `compiled`.
    pub fn profile_request(
        compiled: &Compiled,
        kind: &str,
        preset: Preset,
    ) -> Result<EvalRequest, Outcome> {
        let job = Self::job(compiled, kind, preset)?;
        Ok(EvalRequest::Profile { job })
    }
}

impl Drop for ModuleArtifact {
    fn drop(&mut self) {
        let _ = match &self.owned {
            Owned::Dir(dir) => std::fs::remove_dir_all(dir),
            Owned::File => std::fs::remove_file(&self.module),
        };
    }
}
