//! Remote evaluation through NATS JetStream: the daemon's `remote` environment ([`RemoteEnv`],
//! `env.kind = "remote"`) and the worker node (`kevin worker-node`, [`node`]).
//!
//! The bus is NATS JetStream, not a protocol of kevin's own. Everything lives under one prefix
//! (`env.remote.prefix`, `--prefix`, default "kevin"):
//!
//! - `<prefix>_jobs`: a work-queue stream on the subject `<prefix>.jobs`. Each evaluation is one
//!   [`Job`] (the candidate as source, the task by name and its suite by content hash, the
//!   preset and deadlines), published with its id as the `Nats-Msg-Id`, so a retried publish is
//!   stored once. Nodes pull from the durable consumer `<prefix>_nodes`, whose `ack_wait`,
//!   `max_deliver` and `max_ack_pending` are the daemon's `env.remote.ack_wait_ms`,
//!   `max_deliver` and `max_inflight` (backpressure: no more jobs are handed out than that).
//! - `<prefix>_results`: a work-queue stream on `<prefix>.results.<daemon>`; a node publishes the
//!   [`JobResult`] there (again with the job's id as `Nats-Msg-Id`) and acknowledges the job only
//!   once JetStream has stored the result. The daemon reads its own subject through a durable
//!   consumer of its own, matches results to waiting evaluations by id and drops a second result
//!   for an id (a job redone after its node died between publishing and acknowledging).
//! - `<prefix>_tasks`: a key-value bucket of task files by content hash (`task.<sha256>`) and
//!   suites as lists of (name, hash) (`suite.<sha256>`). A node fetches a suite it has not seen,
//!   and of it only the task files it has not stored yet, once, into its cache folder; it then
//!   evaluates with the ordinary local environment of its backend ([`kevin::env::build`]).
//!
//! Guarantees: at least once delivery with exactly-once effect. A job whose node dies or stalls
//! is redelivered after `ack_wait`; after `max_deliver` deliveries JetStream's max-deliveries
//! advisory turns it into a harness error (never the candidate's fault, never trained on); a
//! duplicate result is dropped by id; a result is stored before its job is acknowledged, so none
//! is lost. A daemon that hears nothing within `job_timeout_ms` (no node running) gives the
//! candidate a harness error too.
//!
//! Dependency direction: the core crate has no NATS client and no async runtime; this module
//! imports `kevin::env` (admission, the local factory) and is used by `pipeline::system` (the
//! environment of `kevin train`) and `cmd::worker_node`.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use kevin::config::RemoteEnvSection;
use kevin::env::Deadlines;
use kevin::outcome::Outcome;
use kevin::tasks::Preset;

mod env;
pub mod node;
pub mod server;

pub use env::{RemoteEnv, RemoteStats};

/// How long JetStream keeps a job or a result nobody took (a daemon or its nodes gone).
const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Window in which JetStream drops a second publish with the same `Nats-Msg-Id`.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The names of one fleet's streams, consumer, bucket and subjects.
#[derive(Debug, Clone)]
pub struct Names {
    prefix: String,
}

impl Names {
    /// The names under `prefix`.
    pub fn new(prefix: &str) -> Names {
        Names {
            prefix: prefix.to_string(),
        }
    }
    /// The jobs stream.
    pub fn jobs_stream(&self) -> String {
        format!("{}_jobs", self.prefix)
    }
    /// The subject jobs are published on.
    pub fn jobs_subject(&self) -> String {
        format!("{}.jobs", self.prefix)
    }
    /// The nodes' shared durable consumer of jobs.
    pub fn nodes_consumer(&self) -> String {
        format!("{}_nodes", self.prefix)
    }
    /// The results stream.
    pub fn results_stream(&self) -> String {
        format!("{}_results", self.prefix)
    }
    /// The subject a daemon's results come back on.
    pub fn results_subject(&self, daemon: &str) -> String {
        format!("{}.results.{daemon}", self.prefix)
    }
    /// A daemon's durable consumer of its results.
    pub fn results_consumer(&self, daemon: &str) -> String {
        format!("{}_daemon_{daemon}", self.prefix)
    }
    /// The task bucket.
    pub fn tasks_bucket(&self) -> String {
        format!("{}_tasks", self.prefix)
    }
    /// JetStream's advisory when a job of the nodes' consumer reached `max_deliver`.
    pub fn max_deliveries_advisory(&self) -> String {
        format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{}",
            self.jobs_stream(),
            self.nodes_consumer()
        )
    }
}

/// One evaluation, as a node receives it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    /// Unique id (daemon id and a counter); results are matched to jobs by it.
    pub id: String,
    /// The subject the result goes to.
    pub reply: String,
    /// Content hash of the task suite (`suite.<hash>` in the task bucket).
    pub suite: String,
    /// The task's name in that suite.
    pub task: String,
    /// Size preset to evaluate at.
    pub preset: Preset,
    /// Each stage's deadline, which the node's environment enforces.
    pub deadlines: Deadlines,
    /// The candidate's ```cuda block, launch lines included; the node compiles it.
    pub source: String,
    /// Wall-clock time (ms since the Unix epoch) after which the daemon no longer waits: a node
    /// acknowledges such a job without evaluating it.
    pub expires_unix_ms: u64,
}

/// The stage at which an evaluation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ended {
    /// Admission or compilation failed (or never started: a harness error).
    Compile,
    /// The correctness protocol failed.
    Verify,
    /// It was timed: the outcome is final.
    Profile,
}

/// A node's answer to one [`Job`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    /// The job's id.
    pub id: String,
    /// The node that evaluated it (its `--name`).
    pub node: String,
    /// The outcome.
    pub outcome: Outcome,
    /// Where it ended.
    pub ended: Ended,
    /// Compile time on the node (ms).
    pub compile_ms: f64,
    /// The whole evaluation on the node (ms).
    pub eval_ms: f64,
}

/// How to reach the NATS server and prove who we are. Secrets are never held in a form that is
/// logged: the password is read from an environment variable, seeds and credentials from files.
#[derive(Clone, Default)]
pub struct Connection {
    /// Server URL(s), comma-separated.
    pub url: String,
    /// User for user/password authentication ("": none).
    pub user: String,
    /// Environment variable holding the password.
    pub password_env: String,
    /// File holding an nkey seed ("": none).
    pub nkey_file: String,
    /// Credentials file (JWT and seed; "": none).
    pub creds_file: String,
    /// Require TLS.
    pub tls: bool,
    /// PEM root certificate(s) to trust ("": the system's).
    pub tls_ca_file: String,
    /// PEM client certificate ("": none).
    pub tls_cert_file: String,
    /// PEM client key.
    pub tls_key_file: String,
    /// The client's name, as the server's monitoring shows it.
    pub name: String,
}

impl std::fmt::Debug for Connection {
    /// Names what is used, never a secret's value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.url, self.auth_kind())
    }
}

impl Connection {
    /// The connection `[env.remote]` describes.
    pub fn from_section(r: &RemoteEnvSection, name: &str) -> Connection {
        Connection {
            url: r.url.clone(),
            user: r.user.clone(),
            password_env: r.password_env.clone(),
            nkey_file: r.nkey_file.clone(),
            creds_file: r.creds_file.clone(),
            tls: r.tls,
            tls_ca_file: r.tls_ca_file.clone(),
            tls_cert_file: r.tls_cert_file.clone(),
            tls_key_file: r.tls_key_file.clone(),
            name: name.to_string(),
        }
    }

    /// Which authentication is used, in words (for logs and errors).
    pub fn auth_kind(&self) -> String {
        let auth = if !self.user.is_empty() {
            format!("user {:?}, password from ${}", self.user, self.password_env)
        } else if !self.nkey_file.is_empty() {
            format!("nkey seed from {}", self.nkey_file)
        } else if !self.creds_file.is_empty() {
            format!("credentials file {}", self.creds_file)
        } else {
            "no authentication".into()
        };
        let tls = self.tls
            || self.url.starts_with("tls://")
            || !self.tls_ca_file.is_empty()
            || !self.tls_cert_file.is_empty();
        format!("{auth}{}", if tls { ", TLS" } else { "" })
    }

    /// async-nats' options for this connection; errors name the variable or file at fault.
    async fn options(&self) -> Result<async_nats::ConnectOptions, String> {
        let mut o = async_nats::ConnectOptions::new()
            .name(&self.name)
            .connection_timeout(Duration::from_secs(5));
        if !self.user.is_empty() {
            let pass = std::env::var(&self.password_env).map_err(|_| {
                format!(
                    "NATS user {:?}: the password variable ${} is not set",
                    self.user, self.password_env
                )
            })?;
            o = o.user_and_password(self.user.clone(), pass);
        } else if !self.nkey_file.is_empty() {
            let seed = std::fs::read_to_string(&self.nkey_file)
                .map_err(|e| format!("reading the nkey seed {}: {e}", self.nkey_file))?;
            o = o.nkey(seed.trim().to_string());
        } else if !self.creds_file.is_empty() {
            o = o
                .credentials_file(&self.creds_file)
                .await
                .map_err(|e| format!("reading the credentials file {}: {e}", self.creds_file))?;
        }
        if self.tls || self.url.starts_with("tls://") {
            o = o.require_tls(true);
        }
        if !self.tls_ca_file.is_empty() {
            o = o.add_root_certificates(self.tls_ca_file.clone().into());
        }
        if !self.tls_cert_file.is_empty() {
            o = o.add_client_certificate(
                self.tls_cert_file.clone().into(),
                self.tls_key_file.clone().into(),
            );
        }
        Ok(o)
    }

    /// Connects (once: a server that cannot be reached or refuses the credentials is an error
    /// that says so; after that the client reconnects by itself).
    pub async fn connect(&self) -> Result<async_nats::Client, String> {
        let urls: Vec<&str> = self.url.split(',').map(str::trim).collect();
        let options = self.options().await?;
        options.connect(urls).await.map_err(|e| {
            use async_nats::ConnectErrorKind as K;
            match e.kind() {
                K::AuthorizationViolation | K::Authentication => format!(
                    "the NATS server at {} refused the credentials ({}): authorization violation",
                    self.url,
                    self.auth_kind()
                ),
                // A certificate the client does not trust comes back as an IO error.
                _ if matches!(e.kind(), K::Tls) || e.to_string().contains("certificate") => {
                    format!(
                        "TLS with the NATS server at {} failed ({}): {e}",
                        self.url,
                        if self.tls_ca_file.is_empty() {
                            "trusting the system's CAs; --tls-ca-file or tls_ca_file names another"
                                .to_string()
                        } else {
                            format!("trusting {}", self.tls_ca_file)
                        }
                    )
                }
                _ => format!("cannot connect to the NATS server at {}: {e}", self.url),
            }
        })
    }
}

/// The hex SHA-256 of `bytes`.
pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// One task of a suite's manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteEntry {
    /// The task's name (its file is `<name>.toml`).
    pub name: String,
    /// Content hash of the file.
    pub hash: String,
}

/// The task files of a suite path (one folder or several, `kevin::tasks::suite_dirs`): the
/// manifest sorted by name and each file's text by hash.
pub fn read_suite_files(
    tasks_dir: &Path,
) -> Result<(Vec<SuiteEntry>, Vec<(String, String)>), String> {
    let mut entries = Vec::new();
    let mut texts = Vec::new();
    for dir in kevin::tasks::suite_dirs(tasks_dir) {
        let read = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in read {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            let hash = content_hash(text.as_bytes());
            entries.push(SuiteEntry {
                name,
                hash: hash.clone(),
            });
            texts.push((hash, text));
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((entries, texts))
}

/// The streams, the nodes' consumer and the task bucket, created where missing; the consumer's
/// limits set to `r`'s (the daemon owns them). Returns the jobs stream.
async fn declare_queue(
    js: &jetstream::Context,
    names: &Names,
    r: &RemoteEnvSection,
) -> Result<stream::Stream, String> {
    let work_queue = |name: String, subject: String| stream::Config {
        name,
        subjects: vec![subject],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        max_age: RETENTION,
        duplicate_window: DUPLICATE_WINDOW,
        ..Default::default()
    };
    let jobs = js
        .get_or_create_stream(work_queue(names.jobs_stream(), names.jobs_subject()))
        .await
        .map_err(|e| format!("creating the stream {}: {e}", names.jobs_stream()))?;
    js.get_or_create_stream(work_queue(
        names.results_stream(),
        format!("{}.results.>", names.prefix),
    ))
    .await
    .map_err(|e| format!("creating the stream {}: {e}", names.results_stream()))?;
    let config = consumer::pull::Config {
        durable_name: Some(names.nodes_consumer()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_millis(r.ack_wait_ms),
        max_deliver: r.max_deliver.into(),
        max_ack_pending: r.max_inflight.into(),
        ..Default::default()
    };
    // Create, or (a durable of that name exists: the server updates it) set the limits of the
    // consumer an earlier daemon made.
    jobs.create_consumer(config)
        .await
        .map_err(|e| format!("setting up the consumer {}: {e}", names.nodes_consumer()))?;
    // The bucket's stream as async-nats' `create_key_value` makes it, made here because that
    // call first asks for the account's limits in a form nats-server 2.9 does not answer.
    let bucket = names.tasks_bucket();
    js.get_or_create_stream(stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: 1,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("creating the bucket {bucket}: {e}"))?;
    Ok(jobs)
}

/// Milliseconds since the Unix epoch.
fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
