//! Counts of failures the system survived: actor restarts and component panics, by name.
//! They go into every metrics line, so a daemon that keeps running through faults still shows
//! them.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Failure counters shared by all actors.
#[derive(Debug, Default)]
pub struct Failures {
    // A std mutex: taken for a map update, never across an await.
    counts: Mutex<BTreeMap<String, u64>>,
}

impl Failures {
    /// Counts one failure of `what` (e.g. "Compiler.restart", "Generator.policy_error").
    pub fn count(&self, what: &str) {
        *self
            .counts
            .lock()
            .expect("failure counters")
            .entry(what.to_string())
            .or_default() += 1;
    }

    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().expect("failure counters").clone()
    }
}
