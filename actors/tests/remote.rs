//! Remote evaluation with real parts: a real nats-server (JetStream, file storage in a temp
//! folder, loopback, a free port), `kevin worker-node` processes, and the daemon's `RemoteEnv`
//! driven directly or through `kevin train`. The outcomes match the local cpu pool's on the
//! reference solutions and the protocol cases; a node killed mid-job loses nothing (the job is
//! redelivered and done once); a job no node finishes in `max_deliver` deliveries is a harness
//! error; wrong credentials are refused with a clear error that shows no secret.
//!
//! nats-server comes from Debian's `nats-server` package (`.ci/run` installs it). Without it a
//! test is skipped with the reason printed, unless `KEVIN_REQUIRE_NATS=1` (set in CI), which
//! turns the skip into a failure.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kevin::config::RemoteEnvSection;
use kevin::env::{evaluate, Deadlines, KernelEnv};
use kevin::outcome::Outcome;
use kevin::tasks::{Preset, TaskSuite};
use kevin_actors::remote::server::LocalNatsServer;
use kevin_actors::remote::RemoteEnv;

use common::{bin, cpu_backend_available, root};

/// The password of the servers that ask for one (only ever in a child's environment).
const PASSWORD: &str = "s3cret-for-tests";

/// The nats-server of one test ([`LocalNatsServer`]: stopped and its storage removed when
/// dropped), with [`PASSWORD`] for `user` when given; None (skipped, the reason printed) when
/// nats-server or the CPU backend is missing, unless KEVIN_REQUIRE_NATS=1.
fn nats_server(test: &str, user: Option<&str>) -> Option<LocalNatsServer> {
    let auth = user.map_or(String::new(), |u| {
        format!("authorization {{ user: {u:?}, password: {PASSWORD:?} }}\n")
    });
    nats_server_conf(test, &auth)
}

/// [`nats_server`] with `extra` in its config.
fn nats_server_conf(test: &str, extra: &str) -> Option<LocalNatsServer> {
    if let Some(why) = kevin_actors::remote::server::missing() {
        if std::env::var("KEVIN_REQUIRE_NATS").as_deref() == Ok("1") {
            panic!("KEVIN_REQUIRE_NATS=1 but {why}");
        }
        eprintln!("skipping: {why}");
        return None;
    }
    if !cpu_backend_available() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("kevin-nats-{test}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    Some(LocalNatsServer::start(&dir, extra).unwrap())
}

/// A `kevin worker-node` process, its stderr lines collected; killed when dropped.
struct Node {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Node {
    /// `kevin worker-node --nats URL --prefix PREFIX --backend cpu` with `args`, `env` in its
    /// environment.
    fn start(
        server: &LocalNatsServer,
        prefix: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Node {
        let mut c = Command::new(bin());
        c.args(["worker-node", "--nats", &server.url(), "--backend", "cpu"])
            .args(["--prefix", prefix])
            .args(["--name", name, "--workers", "1"])
            .arg("--cache")
            .arg(server.dir().join(format!("cache-{name}")))
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("KEVIN_NATS_PASSWORD")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Node { child, lines }
    }

    /// Lines of its log containing `what`.
    fn count(&self, what: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(what))
            .count()
    }

    /// Waits until its log has a line containing `what`.
    fn wait_for(&self, what: &str, limit: Duration) {
        let t0 = Instant::now();
        while self.count(what) == 0 {
            assert!(
                t0.elapsed() < limit,
                "no {what:?} in the node's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits (at most 20 s) for the node to exit, as a refused one does: its status and log.
    fn exit(&mut self) -> (std::process::ExitStatus, String) {
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        };
        // The last lines reach the collector.
        std::thread::sleep(Duration::from_millis(100));
        (status, self.log())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Deadlines short enough that a redelivery comes within seconds.
const DEADLINES: Deadlines = Deadlines {
    compile_ms: 10_000,
    verify_ms: 3_000,
    profile_ms: 6_000,
};

/// `[env.remote]` for `server` under `prefix`, with ack_wait just above `deadlines`.
fn section_for(
    server: &LocalNatsServer,
    prefix: &str,
    max_deliver: u32,
    deadlines: Deadlines,
) -> RemoteEnvSection {
    RemoteEnvSection {
        url: server.url(),
        prefix: prefix.into(),
        max_inflight: 16,
        ack_wait_ms: deadlines.compile_ms + deadlines.verify_ms + deadlines.profile_ms + 1_000,
        max_deliver,
        job_timeout_ms: 120_000,
        ..RemoteEnvSection::default()
    }
}

/// [`section_for`] with [`DEADLINES`].
fn section(server: &LocalNatsServer, prefix: &str, max_deliver: u32) -> RemoteEnvSection {
    section_for(server, prefix, max_deliver, DEADLINES)
}

fn remote_env_for(
    server: &LocalNatsServer,
    prefix: &str,
    max_deliver: u32,
    deadlines: Deadlines,
) -> RemoteEnv {
    let suite = Arc::new(TaskSuite::load(root().join("tasks")).unwrap());
    RemoteEnv::start(
        &section_for(server, prefix, max_deliver, deadlines),
        Preset::Small,
        deadlines,
        suite,
        &root().join("tasks"),
    )
    .unwrap()
}

fn remote_env(server: &LocalNatsServer, prefix: &str, max_deliver: u32) -> RemoteEnv {
    remote_env_for(server, prefix, max_deliver, DEADLINES)
}

fn case(name: &str) -> (String, String) {
    let source =
        std::fs::read_to_string(root().join("tests/data/cpu").join(format!("{name}.cu"))).unwrap();
    (name.split('.').next().unwrap().to_string(), source)
}

fn solution(task: &str) -> (String, String) {
    let source =
        std::fs::read_to_string(root().join("tasks/solutions").join(format!("{task}.cu"))).unwrap();
    (task.to_string(), source)
}

/// Evaluates every (task, source) of `jobs` at once, each on its own thread.
fn evaluate_all(env: &Arc<dyn KernelEnv>, jobs: &[(String, String)]) -> Vec<Outcome> {
    let handles: Vec<_> = jobs
        .iter()
        .cloned()
        .map(|(task, source)| {
            let env = env.clone();
            std::thread::spawn(move || evaluate(env.as_ref(), &task, &source))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// `outcome`, or, when it is the harness's "the machine is too busy" ([`Outcome::is_busy`]: a
/// worker starved of CPU by the rest of the machine, no verdict on the candidate), the job
/// evaluated again on its own: `evaluate` itself asks again while the answer stays busy (3 times
/// in all, `kevin::outcome::busy_retry`), now without the rest of the batch loading the machine.
fn rejudge_if_starved(
    env: &Arc<dyn KernelEnv>,
    job: &(String, String),
    outcome: Outcome,
) -> Outcome {
    if !outcome.is_busy() {
        return outcome;
    }
    eprintln!("{}: {outcome:?}; judged again, alone", job.0);
    evaluate(env.as_ref(), &job.0, &job.1)
}

#[test]
fn two_nodes_judge_like_the_local_cpu_pool() {
    let Some(server) = nats_server("match", None) else {
        return;
    };
    let a = Node::start(&server, "match", "a", &["--jobs", "2"], &[]);
    let b = Node::start(&server, "match", "b", &["--jobs", "2"], &[]);
    // The nodes compile with g++ (the CPU backend) while the other tests of this binary load
    // both cores: `attention`'s reference took over 10 s of its own time on a 2-core CI machine
    // (2026-12-06, after the run-queue waits were taken off). 60 s, the CPU configs' deadline;
    // the other tests keep 10 s.
    let cpu_compile = Deadlines {
        compile_ms: 60_000,
        ..DEADLINES
    };
    let remote = Arc::new(remote_env_for(&server, "match", 3, cpu_compile));
    let env: Arc<dyn KernelEnv> = remote.clone();
    let suite = TaskSuite::load(root().join("tasks")).unwrap();
    let mut jobs: Vec<(String, String)> = [
        "relu.correct",
        "relu.wrong",
        "relu.clobber",
        "relu.out_of_bounds",
        "relu.infinite_loop",
        "relu_sum_rows.correct",
    ]
    .iter()
    .map(|c| case(c))
    .collect();
    // A few reference solutions (every one of them: cpu_eval.rs); KEVIN_REMOTE_TASKS=all for all.
    let all = std::env::var("KEVIN_REMOTE_TASKS").as_deref() == Ok("all");
    let take = if all { usize::MAX } else { 6 };
    jobs.extend(suite.tasks().iter().take(take).map(|t| solution(&t.name)));
    // A format error never leaves the daemon.
    jobs.push(("relu".into(), "no kernel here".into()));

    let t0 = Instant::now();
    let remote_outcomes = evaluate_all(&env, &jobs);
    let remote_s = t0.elapsed().as_secs_f64();
    // The reference pool compiles while the other tests of this binary load both cores (CI
    // once took over 10 s on `attention`): a compile deadline is no outcome any case expects.
    let local: Arc<dyn KernelEnv> = Arc::new(
        kevin::env::cpu::CpuEnv::new(
            Arc::new(TaskSuite::load(root().join("tasks")).unwrap()),
            &root().join("tasks"),
            Preset::Small,
            bin(),
            2,
            Deadlines {
                compile_ms: 120_000,
                ..DEADLINES
            },
        )
        .unwrap(),
    );
    let t0 = Instant::now();
    let local_outcomes = evaluate_all(&local, &jobs);
    let local_s = t0.elapsed().as_secs_f64();
    for ((job, r), l) in jobs.iter().zip(&remote_outcomes).zip(&local_outcomes) {
        // "The machine is too busy" is the harness declining to judge (a worker that did not get
        // its CPU time), on either side, not an outcome: that job is judged again, alone.
        let (r, l) = (
            &rejudge_if_starved(&env, job, r.clone()),
            &rejudge_if_starved(&local, job, l.clone()),
        );
        assert_eq!(
            r.kind(),
            l.kind(),
            "{}: remote {r:?}, local {l:?}\nnode a:\n{}\nnode b:\n{}",
            job.0,
            a.log(),
            b.log()
        );
        if let (Outcome::Correct { timing: rt, .. }, Outcome::Correct { timing: lt, .. }) = (r, l) {
            assert_eq!(rt, lt);
        }
        assert!(!r.is_harness_error(), "{}: {r:?}", job.0);
    }
    let stats = remote.stats();
    println!(
        "{} evaluations: remote (2 nodes x 2 jobs) {remote_s:.1} s, local pool (2 workers) \
         {local_s:.1} s; {stats:?}",
        jobs.len()
    );
    assert_eq!(
        stats.jobs,
        jobs.len() as u64 - 1,
        "the format error is not a job"
    );
    assert_eq!(stats.results, stats.jobs);
    assert_eq!(stats.duplicates + stats.gave_up + stats.timed_out, 0);
    let (on_a, on_b) = (a.count("job started"), b.count("job started"));
    assert_eq!(
        on_a + on_b,
        stats.jobs as usize,
        "a:\n{}\nb:\n{}",
        a.log(),
        b.log()
    );
    assert!(on_a > 0 && on_b > 0, "both nodes work: a {on_a}, b {on_b}");
    // Each node fetched the suite once.
    assert_eq!(a.count("task suite fetched"), 1, "{}", a.log());
}

#[test]
fn a_node_killed_mid_job_loses_nothing() {
    let Some(server) = nats_server("kill", None) else {
        return;
    };
    let mut a = Node::start(&server, "kill", "a", &["--jobs", "1"], &[]);
    let remote = Arc::new(remote_env(&server, "kill", 3));
    let env: Arc<dyn KernelEnv> = remote.clone();
    let jobs = vec![case("relu.correct"), case("relu_sum_rows.correct")];
    let runner = {
        let (env, jobs) = (env.clone(), jobs.clone());
        std::thread::spawn(move || evaluate_all(&env, &jobs))
    };
    // Node a has one job in hand (it takes one at a time): kill it there.
    a.wait_for("job started", Duration::from_secs(60));
    a.kill();
    let killed_at = Instant::now();
    let b = Node::start(&server, "kill", "b", &["--jobs", "2"], &[]);
    let outcomes = runner.join().unwrap();
    for (job, o) in jobs.iter().zip(&outcomes) {
        assert!(o.is_correct(), "{}: {o:?}\nb:\n{}", job.0, b.log());
    }
    let stats = remote.stats();
    println!(
        "killed node a mid-job; all {} done {:.1} s later by b; {stats:?}",
        jobs.len(),
        killed_at.elapsed().as_secs_f64()
    );
    assert_eq!(stats.jobs, 2);
    assert_eq!(stats.results, 2, "each job answered once");
    assert_eq!(stats.gave_up + stats.timed_out, 0);
    // The job a held came to b again after ack_wait.
    assert_eq!(b.count("delivered=2"), 1, "{}", b.log());
}

#[test]
fn a_nats_server_restarted_mid_run_loses_nothing() {
    let Some(mut server) = nats_server("restart", None) else {
        return;
    };
    let a = Node::start(&server, "restart", "a", &["--jobs", "2"], &[]);
    let remote = Arc::new(remote_env(&server, "restart", 3));
    let env: Arc<dyn KernelEnv> = remote.clone();
    let jobs: Vec<_> = [
        "relu",
        "relu_sum_rows",
        "softmax",
        "gelu",
        "l2_normalize",
        "matmul",
    ]
    .iter()
    .map(|t| solution(t))
    .collect();
    let runner = {
        let (env, jobs) = (env.clone(), jobs.clone());
        std::thread::spawn(move || evaluate_all(&env, &jobs))
    };
    // Jobs queued and one in hand: the server dies and comes back on its storage.
    a.wait_for("job started", Duration::from_secs(60));
    server.restart().unwrap();
    let restarted_at = Instant::now();
    let outcomes = runner.join().unwrap();
    for (job, o) in jobs.iter().zip(&outcomes) {
        assert!(o.is_correct(), "{}: {o:?}\na:\n{}", job.0, a.log());
    }
    let stats = remote.stats();
    println!(
        "nats-server restarted mid-run; all {} done {:.1} s later; {stats:?}",
        jobs.len(),
        restarted_at.elapsed().as_secs_f64()
    );
    assert_eq!(stats.jobs, jobs.len() as u64);
    assert_eq!(stats.results, jobs.len() as u64, "each job answered once");
    assert_eq!(stats.gave_up + stats.timed_out, 0);
}

#[test]
fn a_job_no_node_finishes_is_a_harness_error() {
    let Some(server) = nats_server("maxdeliver", None) else {
        return;
    };
    let mut a = Node::start(&server, "maxdeliver", "a", &["--jobs", "1"], &[]);
    let remote = Arc::new(remote_env(&server, "maxdeliver", 1));
    let env: Arc<dyn KernelEnv> = remote.clone();
    let runner = {
        let env = env.clone();
        std::thread::spawn(move || evaluate_all(&env, &[case("relu.correct")]))
    };
    a.wait_for("job started", Duration::from_secs(60));
    a.kill();
    // JetStream gives up on a job when a node asks for one after ack_wait: b does.
    let b = Node::start(&server, "maxdeliver", "b", &["--jobs", "1"], &[]);
    let t0 = Instant::now();
    let outcomes = runner.join().unwrap();
    let Outcome::HarnessError { reason, .. } = &outcomes[0] else {
        panic!("{:?}", outcomes[0])
    };
    println!(
        "given up {:.1} s after the kill: {reason}",
        t0.elapsed().as_secs_f64()
    );
    assert!(reason.contains("max_deliver"), "{reason}");
    assert_eq!(remote.stats().gave_up, 1);
    assert_eq!(b.count("job started"), 0, "{}", b.log());
}

#[test]
fn wrong_credentials_are_refused_with_a_clear_error() {
    let Some(server) = nats_server("auth", Some("kevin")) else {
        return;
    };
    let wrong = "not-the-password-42";
    let mut refused = Node::start(
        &server,
        "kevin",
        "wrong",
        &["--user", "kevin"],
        &[("KEVIN_NATS_PASSWORD", wrong)],
    );
    let (status, log) = refused.exit();
    println!("{log}");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("refused the credentials"), "{log}");
    assert!(log.contains("user \"kevin\""), "{log}");
    assert!(
        !log.contains(wrong),
        "the password must not be shown: {log}"
    );
    // No password at all says which variable is missing.
    let mut missing = Node::start(&server, "kevin", "missing", &["--user", "kevin"], &[]);
    let status = missing.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(status.code(), Some(1));
    assert!(
        missing.log().contains("$KEVIN_NATS_PASSWORD is not set"),
        "{}",
        missing.log()
    );
    // The right password connects.
    let good = Node::start(
        &server,
        "kevin",
        "good",
        &["--user", "kevin"],
        &[("KEVIN_NATS_PASSWORD", PASSWORD)],
    );
    good.wait_for("worker node connected", Duration::from_secs(20));
}

/// A self-signed CA and a server certificate for 127.0.0.1 (openssl), in `dir`: the CA's PEM.
fn test_certificates(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=kevin-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "ext",
    ]);
    dir.join("ca.pem")
}

#[test]
fn nkeys_over_tls_are_admitted_and_a_wrong_seed_or_an_untrusted_server_refused() {
    if Command::new("openssl").arg("version").output().is_err() {
        if std::env::var("KEVIN_REQUIRE_NATS").as_deref() == Ok("1") {
            panic!(
                "KEVIN_REQUIRE_NATS=1 but openssl, which makes the test certificates, is missing"
            );
        }
        eprintln!("skipping: no openssl to make test certificates");
        return;
    }
    let certs = std::env::temp_dir().join(format!("kevin-nats-certs-{}", std::process::id()));
    let ca = test_certificates(&certs);
    let user = nkeys::KeyPair::new_user();
    let seed_file = certs.join("user.nk");
    std::fs::write(&seed_file, user.seed().unwrap()).unwrap();
    let stranger = certs.join("stranger.nk");
    std::fs::write(&stranger, nkeys::KeyPair::new_user().seed().unwrap()).unwrap();
    let conf = format!(
        "authorization {{ users: [ {{ nkey: {:?} }} ] }}\n\
         tls {{ cert_file: {:?}, key_file: {:?} }}\n",
        user.public_key(),
        certs.join("server.pem").display().to_string(),
        certs.join("server.key").display().to_string(),
    );
    let Some(server) = nats_server_conf("tls", &conf) else {
        return;
    };
    let (seed, ca_s, stranger_s) = (
        seed_file.display().to_string(),
        ca.display().to_string(),
        stranger.display().to_string(),
    );
    // A seed the server does not know: refused, naming the file, never the seed.
    let mut refused = Node::start(
        &server,
        "tls",
        "stranger",
        &["--nkey-file", &stranger_s, "--tls-ca-file", &ca_s],
        &[],
    );
    let (status, log) = refused.exit();
    println!("unknown seed: {}", log.lines().last().unwrap_or(""));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("refused the credentials") && log.contains("stranger.nk"),
        "{log}"
    );
    let stranger_seed = std::fs::read_to_string(&stranger).unwrap();
    assert!(
        !log.contains(stranger_seed.trim()),
        "the seed must not be shown: {log}"
    );
    // The right seed, but the server's certificate from a CA the node does not trust.
    let mut untrusted = Node::start(&server, "tls", "untrusted", &["--nkey-file", &seed], &[]);
    let (status, log) = untrusted.exit();
    println!("untrusted server: {}", log.lines().last().unwrap_or(""));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("TLS with the NATS server") && log.contains("certificate"),
        "{log}"
    );
    // Both right: a node and the daemon over TLS with the nkey judge a reference solution.
    let node = Node::start(
        &server,
        "tls",
        "good",
        &["--nkey-file", &seed, "--tls-ca-file", &ca_s],
        &[],
    );
    let section = RemoteEnvSection {
        nkey_file: seed.to_string(),
        tls_ca_file: ca_s.to_string(),
        ..section(&server, "tls", 3)
    };
    let remote = RemoteEnv::start(
        &section,
        Preset::Small,
        DEADLINES,
        Arc::new(TaskSuite::load(root().join("tasks")).unwrap()),
        &root().join("tasks"),
    )
    .unwrap();
    assert!(remote.describe().contains("nkey seed from") && remote.describe().contains("TLS"));
    let (task, source) = solution("relu");
    let outcome = evaluate(&remote, &task, &source);
    assert!(outcome.is_correct(), "{outcome:?}\n{}", node.log());
    std::fs::remove_dir_all(&certs).ok();
}

#[test]
fn kevin_train_evaluates_on_worker_nodes() {
    let Some(server) = nats_server("train", Some("kevin")) else {
        return;
    };
    // Two nodes of one slot each, with up to four evaluations in flight: both get work.
    let nodes = ["a", "b"].map(|name| {
        Node::start(
            &server,
            "trainfleet",
            name,
            &["--user", "kevin", "--jobs", "1"],
            &[("KEVIN_NATS_PASSWORD", PASSWORD)],
        )
    });
    let dir = server.dir().join("run");
    let config = server.dir().join("config.toml");
    let extra = format!(
        "[tasks]\nsource = \"suite\"\ndir = {:?}\npreset = \"small\"\n\
         [env]\nkind = \"remote\"\ncompile_timeout_ms = 60000\n\
         [env.remote]\nurl = {:?}\nprefix = \"trainfleet\"\nuser = \"kevin\"\nmax_inflight = 4\n\
         ack_wait_ms = 120000\n\
         [rollout]\ntrajectories = 2\nturns = 2\nmax_inflight_groups = 2\n[replay]\ntasks_per_batch = 1\n\
         [policy.simulated]\ncorpus = {:?}\np_mutate = 0.5\np_format_error = 0.0\n",
        root().join("tasks").display().to_string(),
        server.url(),
        root().join("tasks/solutions").display().to_string()
    );
    std::fs::write(&config, common::simulated_config(2.0, &extra)).unwrap();
    let out = common::kevin()
        .args(["train", "--config"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&dir)
        .args(["--max-steps", "2"])
        .env("KEVIN_NATS_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    common::assert_ok(&out);
    assert!(
        !common::stderr(&out).contains(PASSWORD),
        "the password must not be logged"
    );
    let episodes = common::jsonl(&dir.join("episodes.jsonl"));
    assert!(!episodes.is_empty());
    let mut correct = 0;
    for e in &episodes {
        let o = &e["outcome"];
        match o["kind"].as_str().unwrap() {
            "correct" => {
                assert_eq!(o["timing"], "cpu", "{o}");
                correct += 1;
            }
            "compile_error" | "unsupported" | "wrong" | "crash" => {}
            other => panic!("a reference solution or a broken one cannot get {other}: {o}"),
        }
    }
    assert!(correct > 0, "{episodes:?}");
    let started = nodes.each_ref().map(|n| n.count("job started"));
    for (n, count) in nodes.iter().zip(started) {
        assert!(
            count > 0,
            "each node evaluated some of the run's kernels: {}",
            n.log()
        );
    }
    // A turn whose launch lines the daemon refuses itself never becomes a job.
    assert!(
        started.iter().sum::<usize>() <= episodes.len(),
        "no turn evaluated twice: {started:?} for {} turns",
        episodes.len()
    );
    println!(
        "kevin train: {} episodes, {correct} correct; the nodes ran {started:?} jobs",
        episodes.len()
    );
}

/// `kevin bench remote --backend sim` end to end: a nats-server of its own, a node process, the
/// local pool and the bus side by side, every job answered once; the report's figures are there
/// (their size is the benchmark's business, not a test's).
#[test]
fn bench_remote_measures_the_bus_against_the_local_pool() {
    // The bench starts its own server; this only checks that one can run here.
    let Some(server) = nats_server("bench", None) else {
        return;
    };
    drop(server);
    let json = std::env::temp_dir().join(format!("kevin-bench-remote-{}.json", std::process::id()));
    let out = Command::new(bin())
        .current_dir(root())
        .args(["bench", "remote", "--backend", "sim", "--sequential", "20"])
        .args([
            "--jobs",
            "60",
            "--concurrency",
            "4",
            "--workers",
            "2",
            "--nodes",
            "2",
        ])
        .arg("--json")
        .arg(&json)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    for side in ["local", "remote"] {
        assert!(r[side]["jobs_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r[side]["outcomes"].as_array().unwrap().len(), 20, "{r}");
    }
    assert!(
        r["remote"]["latency_median_ms"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    assert!(r["added_latency_ms"].as_f64().unwrap().is_finite(), "{r}");
    let stats = r["remote_stats"].as_str().unwrap();
    let jobs: u64 = stats
        .split("jobs: ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(jobs >= 80, "warm-up, 20 and 60 jobs: {stats}");
    assert!(
        stats.contains(&format!("results: {jobs},")),
        "each job answered once: {stats}"
    );
    assert!(
        stats.contains("duplicates: 0, gave_up: 0, timed_out: 0"),
        "{stats}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("| latency median (ms) |"));
}
