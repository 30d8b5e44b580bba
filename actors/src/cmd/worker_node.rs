//! `kevin worker-node`: evaluate jobs from a NATS JetStream queue for `env.kind = "remote"`
//! daemons ([`crate::remote::node`]), on this machine's cpu or cuda backend.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cmd::{failure, usage, CmdResult};
use crate::remote::{node, Connection};

/// `kevin worker-node` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// NATS server URL(s), comma-separated (e.g. nats://10.0.0.5:4222). No password in it.
    #[arg(long, value_name = "URL")]
    pub nats: String,
    /// Evaluation backend: "cpu" or "cuda" (default: cuda when nvidia-smi lists a GPU); "sim"
    /// answers every job at once with a simulated verdict, to measure the bus alone (`kevin bench
    /// remote --backend sim`), never for training.
    #[arg(long, value_parser = ["cpu", "cuda", "sim"])]
    pub backend: Option<String>,
    /// The fleet's prefix (the daemon's env.remote.prefix).
    #[arg(long, default_value = "kevin")]
    pub prefix: String,
    /// Worker processes of the local environment (cpu: evaluation workers; cuda: compile
    /// workers). Default: the cores.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Jobs evaluated at once (default: the workers).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Where fetched task files are kept (default: a folder in the temp directory).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// This node's name in results and logs (default: host name and process id).
    #[arg(long)]
    pub name: Option<String>,
    /// User for user/password authentication; the password is read from --password-env.
    #[arg(long)]
    pub user: Option<String>,
    /// Environment variable holding the password of --user.
    #[arg(long, default_value = "KEVIN_NATS_PASSWORD", value_name = "VAR")]
    pub password_env: String,
    /// File holding an nkey seed (nkey authentication).
    #[arg(long, value_name = "FILE")]
    pub nkey_file: Option<String>,
    /// NATS credentials file (JWT and nkey seed).
    #[arg(long, value_name = "FILE")]
    pub creds_file: Option<String>,
    /// Require TLS (implied by a tls:// URL and by the files below).
    #[arg(long)]
    pub tls: bool,
    /// PEM certificate authority to trust for the server's certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_ca_file: Option<String>,
    /// PEM client certificate for mutual TLS (with --tls-key-file).
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<String>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<String>,
}

/// Runs the node until SIGINT or SIGTERM; the jobs in hand are finished first.
pub fn run(args: Args) -> CmdResult {
    crate::cmd::signals::install();
    let auths = [&args.user, &args.nkey_file, &args.creds_file];
    if auths.iter().filter(|a| a.is_some()).count() > 1 {
        return Err(usage("give one of --user, --nkey-file and --creds-file"));
    }
    if args.nats.split(',').any(|u| {
        u.split_once("://")
            .map_or(u, |(_, rest)| rest)
            .split('/')
            .next()
            .is_some_and(|host| host.contains('@'))
    }) {
        return Err(usage(
            "--nats must not carry credentials: use --user with --password-env, --nkey-file or --creds-file",
        ));
    }
    let workers = crate::cmd::workers_or_cores(args.workers);
    let name = args.name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "node".into());
        format!("{host}-{}", std::process::id())
    });
    let conn = Connection {
        url: args.nats.clone(),
        user: args.user.clone().unwrap_or_default(),
        password_env: args.password_env.clone(),
        nkey_file: args.nkey_file.clone().unwrap_or_default(),
        creds_file: args.creds_file.clone().unwrap_or_default(),
        tls: args.tls,
        tls_ca_file: args.tls_ca_file.clone().unwrap_or_default(),
        tls_cert_file: args.tls_cert_file.clone().unwrap_or_default(),
        tls_key_file: args.tls_key_file.clone().unwrap_or_default(),
        name: format!("kevin-node-{name}"),
    };
    let opts = node::NodeOptions {
        conn,
        prefix: args.prefix.clone(),
        backend: args.backend.clone(),
        workers,
        jobs: args.jobs.unwrap_or(workers).max(1),
        cache: args
            .cache
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("kevin-node-cache")),
        name,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(failure)?;
    rt.block_on(node::run(opts, || crate::cmd::signals::received() > 0))
        .map_err(failure)?;
    Ok(ExitCode::SUCCESS)
}
