//! `/metrics` for Prometheus: the daemon's state in the text exposition format (version 0.0.4),
//! served over HTTP by one thread of its own (`telemetry.prometheus`, off by default).
//!
//! What is exposed, with Prometheus' naming conventions (`kevin_` prefix, base units, `_total`
//! for counters, `_ratio` for fractions):
//! - the last learner step's [`StepMetrics`]: reward, correctness, speedup, loss, clip ratio,
//!   gradient norm, tokens, the step's seconds, the outcome mix of its batch, the replay queue,
//!   mailbox depths and high-water marks, actor busy ratios, failures by name, waits for the GPU
//!   timing lease, accepted and dropped groups;
//! - counters kept from every group the telemetry actor records in this session: turns by
//!   outcome kind, groups, correct turns;
//! - the environment's worker pools, read at each scrape ([`PoolStats`]): requests, successes,
//!   timeouts, starved requests, crashes, protocol errors, spawn failures, respawns, retirements
//!   and respawn latency.
//!
//! Counters restart from zero with each daemon session (Prometheus' `rate` handles the reset);
//! the run-wide totals are the `accepted`/`dropped` ones, which a resumed run carries on.
//!
//! The server answers `GET /metrics` (and `HEAD`), 404 for any other path and 405 for another
//! method, one connection at a time with short timeouts, and closes every connection after its
//! answer. It needs no HTTP crate: a scrape is one small request.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::metrics::StepMetrics;
use crate::replay::ScoredGroup;
use crate::worker::PoolStats;

/// The exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long one connection may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads the worker pools' counters at scrape time.
pub type PoolSource = Box<dyn Fn() -> Vec<(String, PoolStats)> + Send + Sync>;

/// What the daemon has told the exporter so far.
#[derive(Default)]
struct State {
    last: Option<StepMetrics>,
    steps: u64,
    tokens: u64,
    train_s: f64,
    turns: BTreeMap<String, u64>,
    groups: u64,
    correct: u64,
}

/// The daemon's metrics as Prometheus reads them: the telemetry actor records into it, the
/// server renders it on each scrape.
#[derive(Default)]
pub struct Exporter {
    state: Mutex<State>,
    pools: Option<PoolSource>,
}

impl Exporter {
    /// An exporter that also reports the worker pools `pools` returns.
    pub fn with_pools(pools: PoolSource) -> Exporter {
        Exporter {
            state: Mutex::default(),
            pools: Some(pools),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain numbers: still good to read.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one learner step.
    pub fn record_step(&self, m: &StepMetrics) {
        let mut s = self.state();
        s.steps += 1;
        s.tokens += m.tokens;
        s.train_s += m.train_s;
        s.last = Some(m.clone());
    }

    /// Records one accepted group's turns.
    pub fn record_group(&self, g: &ScoredGroup) {
        let mut s = self.state();
        s.groups += 1;
        for t in g.group.turns() {
            *s.turns.entry(t.outcome.kind().to_string()).or_default() += 1;
            s.correct += u64::from(t.outcome.is_correct());
        }
    }

    /// The exposition text of everything recorded, and of the pools now.
    pub fn render(&self) -> String {
        let pools = self.pools.as_ref().map(|f| f()).unwrap_or_default();
        let s = self.state();
        let mut out = Exposition::default();
        out.gauge("kevin_up", "1 while the daemon serves metrics.", &[], 1.0);
        out.counter(
            "kevin_learner_steps_total",
            "Learner steps taken in this session.",
            &[],
            s.steps as f64,
        );
        out.counter(
            "kevin_learner_tokens_total",
            "Tokens trained on in this session.",
            &[],
            s.tokens as f64,
        );
        out.counter(
            "kevin_learner_train_seconds_total",
            "Seconds the learner spent on its steps in this session.",
            &[],
            s.train_s,
        );
        out.counter(
            "kevin_groups_recorded_total",
            "Accepted groups recorded in this session.",
            &[],
            s.groups as f64,
        );
        out.counter(
            "kevin_turns_correct_total",
            "Turns of the recorded groups whose kernel was correct, in this session.",
            &[],
            s.correct as f64,
        );
        out.family(
            "kevin_turns_total",
            "counter",
            "Turns of the recorded groups by outcome kind, in this session.",
        );
        for (kind, n) in &s.turns {
            out.sample("kevin_turns_total", &[("outcome", kind)], *n as f64);
        }
        if let Some(m) = &s.last {
            step_metrics(&mut out, m);
        }
        pool_metrics(&mut out, &pools);
        out.text
    }
}

fn step_metrics(out: &mut Exposition, m: &StepMetrics) {
    let g = [
        (
            "kevin_learner_version",
            "Learner version after the last step.",
            m.step as f64,
        ),
        (
            "kevin_reward_mean",
            "Mean turn score of the last step's batch.",
            m.reward_mean,
        ),
        (
            "kevin_reward_std",
            "Standard deviation of the turn scores of the last step's batch.",
            m.reward_std.unwrap_or(0.0),
        ),
        (
            "kevin_correct_ratio",
            "Fraction of the last step's turns that were correct.",
            m.correct_rate,
        ),
        (
            "kevin_speedup_mean",
            "Mean speedup of the last step's correct turns (0 when none).",
            m.mean_speedup,
        ),
        ("kevin_loss", "Training loss of the last step.", m.loss),
        (
            "kevin_clip_ratio",
            "Fraction of the last step's tokens that were clipped.",
            m.clip_fraction,
        ),
        (
            "kevin_grad_norm",
            "Gradient norm of the last step.",
            m.grad_norm,
        ),
        (
            "kevin_step_tokens",
            "Tokens the last step trained on.",
            m.tokens as f64,
        ),
        (
            "kevin_step_seconds",
            "Seconds the learner spent on the last step.",
            m.train_s,
        ),
        (
            "kevin_step_groups",
            "Groups in the last step's batch.",
            m.groups as f64,
        ),
        (
            "kevin_turns_per_second",
            "Turns completed per second in this session, at the last step.",
            m.turns_per_s,
        ),
        (
            "kevin_replay_pending_groups",
            "Groups waiting in the replay queue after the last step took its batch.",
            m.replay_pending as f64,
        ),
        (
            "kevin_session_seconds",
            "Seconds since this daemon session started, at the last step.",
            m.elapsed_s,
        ),
        (
            "kevin_last_step_timestamp_seconds",
            "Unix time of the last step.",
            m.unix_s,
        ),
    ];
    for (name, help, v) in g {
        out.gauge(name, help, &[], v);
    }
    out.counter(
        "kevin_groups_accepted_total",
        "Groups accepted in this run, all sessions.",
        &[],
        m.accepted_total as f64,
    );
    out.counter(
        "kevin_groups_dropped_total",
        "Groups dropped as stale in this run, all sessions.",
        &[],
        m.dropped_total as f64,
    );
    let labelled: [(&str, &str, &str, &str, Vec<(String, f64)>); 6] = [
        (
            "kevin_step_outcome_ratio",
            "gauge",
            "Fraction of the last step's turns by outcome kind.",
            "outcome",
            m.outcomes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        ),
        (
            "kevin_step_staleness_groups",
            "gauge",
            "Groups of the last step's batch by their version gap.",
            "gap",
            m.staleness
                .iter()
                .map(|(k, v)| (k.to_string(), *v as f64))
                .collect(),
        ),
        (
            "kevin_mailbox_depth",
            "gauge",
            "Messages waiting in each actor's mailbox, at the last step.",
            "actor",
            m.mailbox_depth
                .iter()
                .map(|(k, v)| (k.clone(), *v as f64))
                .collect(),
        ),
        (
            "kevin_mailbox_high_water",
            "gauge",
            "Highest mailbox depth of each actor in this session.",
            "actor",
            m.mailbox_high_water
                .iter()
                .map(|(k, v)| (k.clone(), *v as f64))
                .collect(),
        ),
        (
            "kevin_actor_busy_ratio",
            "gauge",
            "Busy fraction of each actor between the last two steps.",
            "actor",
            m.busy.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        ),
        (
            "kevin_failures_total",
            "counter",
            "Restarts of supervised actors and panics caught in components, by name.",
            "name",
            m.failures
                .iter()
                .map(|(k, v)| (k.clone(), *v as f64))
                .collect(),
        ),
    ];
    for (name, kind, help, label, values) in labelled {
        out.family(name, kind, help);
        for (k, v) in values {
            out.sample(name, &[(label, &k)], v);
        }
    }
    if !m.lease_wait_ms.is_empty() {
        let name = "kevin_lease_wait_seconds_total";
        out.family(
            name,
            "counter",
            "Seconds this session waited for the GPU-wide timing lease, by party and hold.",
        );
        for (k, v) in &m.lease_wait_ms {
            out.sample(name, &[("hold", k)], v / 1e3);
        }
    }
}

fn pool_metrics(out: &mut Exposition, pools: &[(String, PoolStats)]) {
    if pools.is_empty() {
        return;
    }
    type Field = fn(&PoolStats) -> f64;
    let fields: [(&str, &str, Field); 10] = [
        ("requests", "Requests answered, successfully or not.", |p| {
            p.requests as f64
        }),
        ("succeeded", "Requests that got a response.", |p| {
            p.succeeded as f64
        }),
        (
            "timeouts",
            "Requests or pings that hit their deadline.",
            |p| p.timeouts as f64,
        ),
        (
            "starved",
            "Requests the machine gave too little CPU to finish (harness errors).",
            |p| p.starved as f64,
        ),
        (
            "crashes",
            "Requests or pings during which the worker died.",
            |p| p.crashes as f64,
        ),
        (
            "protocol_errors",
            "Requests or pings answered with garbage.",
            |p| p.protocol_errors as f64,
        ),
        (
            "spawn_failures",
            "Failed attempts to start a worker.",
            |p| p.spawn_failures as f64,
        ),
        ("respawns", "Workers started to replace a dead one.", |p| {
            p.respawns as f64
        }),
        (
            "retired",
            "Workers replaced after an answer that said they must go.",
            |p| p.retired as f64,
        ),
        ("respawn_seconds", "Summed respawn latencies.", |p| {
            p.respawn_latency_total.as_secs_f64()
        }),
    ];
    for (field, help, get) in fields {
        let name = format!("kevin_worker_{field}_total");
        out.family(&name, "counter", &format!("Worker pools: {help}"));
        for (pool, p) in pools {
            out.sample(&name, &[("pool", pool)], get(p));
        }
    }
    let name = "kevin_worker_respawn_seconds_max";
    out.family(name, "gauge", "Worker pools: the longest respawn latency.");
    for (pool, p) in pools {
        out.sample(name, &[("pool", pool)], p.respawn_latency_max.as_secs_f64());
    }
}

/// Text in the exposition format, one family at a time.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let val = val
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.text, "{k}=\"{val}\"");
            }
            self.text.push('}');
        }
        let v = if v.is_nan() {
            "NaN".to_string()
        } else if v.is_infinite() {
            if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
        } else {
            format!("{v}")
        };
        let _ = writeln!(self.text, " {v}");
    }

    fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.family(name, "gauge", help);
        self.sample(name, labels, v);
    }

    fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        self.family(name, "counter", help);
        self.sample(name, labels, v);
    }
}

/// The running server; stopping it (or dropping it) closes the socket and joins the thread.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` (`host:port`; port 0 picks a free one) and serves `exporter` there.
    pub fn start(addr: &str, exporter: Arc<Exporter>) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prometheus".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    // A client that misbehaves costs at most the timeouts; nothing it sends
                    // reaches anything but the request line's parser.
                    if let Ok(conn) = conn {
                        if let Err(e) = answer(conn, &exporter) {
                            tracing::debug!(error = %e, "prometheus: a scrape failed");
                        }
                    }
                }
            })?;
        Ok(Server {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop; it sees the flag and ends.
        let _ = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one connection: reads the request line and headers (at most 8 KiB), writes the
/// answer, closes.
fn answer(conn: TcpStream, exporter: &Exporter) -> io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(io::Read::take(conn.try_clone()?, 8 << 10));
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body, ctype) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", exporter.render(), CONTENT_TYPE),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "kevin serves /metrics only\n".to_string(),
            "text/plain",
        ),
        _ => (
            "405 Method Not Allowed",
            "GET /metrics\n".to_string(),
            "text/plain",
        ),
    };
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        conn.write_all(body.as_bytes())?;
    }
    conn.flush()
}

/// `GET path` from `addr` (`host:port`) over HTTP/1.0 (so no server answers in chunks): the
/// body of a 200 answer, or an error naming the status. For scrapes ([`scrape`]) and tests that ask a Prometheus server.
pub fn http_get(addr: &str, path: &str) -> io::Result<String> {
    let target = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("{addr}: no address")))?;
    let mut conn = TcpStream::connect_timeout(&target, IO_TIMEOUT)?;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    io::Read::read_to_string(&mut conn, &mut text)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.split_whitespace().nth(1) == Some("200") => Ok(body.to_string()),
        Some((head, _)) => Err(io::Error::other(format!(
            "{addr}{path}: {}",
            head.lines().next().unwrap_or("")
        ))),
        None => Err(io::Error::other(format!(
            "{addr}{path}: not an HTTP answer"
        ))),
    }
}

/// The exposition text at `addr`'s `/metrics`.
pub fn scrape(addr: &str) -> io::Result<String> {
    http_get(addr, "/metrics")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episode::tests::turn;
    use crate::episode::Group;
    use crate::outcome::Outcome;
    use crate::replay::score_group;

    /// Checks text against the exposition format's grammar: every sample's family was declared
    /// by HELP and TYPE first, names and label names are valid, values parse, no family repeats.
    fn check_exposition(text: &str) -> BTreeMap<String, f64> {
        let mut declared: BTreeMap<String, String> = BTreeMap::new();
        let mut samples = BTreeMap::new();
        let name_ok = |n: &str| {
            !n.is_empty()
                && !n.starts_with(|c: char| c.is_ascii_digit())
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(name_ok(name), "{line}");
                assert!(["counter", "gauge"].contains(&kind), "{line}");
                assert!(
                    declared.insert(name.into(), kind.into()).is_none(),
                    "twice: {line}"
                );
                if kind == "counter" {
                    assert!(
                        name.ends_with("_total"),
                        "a counter's name ends in _total: {line}"
                    );
                }
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let v: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
            let name = series.split('{').next().unwrap();
            assert!(declared.contains_key(name), "undeclared: {line}");
            if let Some(labels) = series.strip_prefix(name) {
                if !labels.is_empty() {
                    assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                    for pair in labels[1..labels.len() - 1].split("\",") {
                        let (k, val) = pair.split_once("=\"").unwrap();
                        assert!(name_ok(k), "{line}");
                        assert!(!val.contains('\n'), "{line}");
                    }
                }
            }
            assert!(
                samples.insert(series.to_string(), v).is_none(),
                "twice: {line}"
            );
        }
        samples
    }

    fn step() -> StepMetrics {
        StepMetrics {
            step: 7,
            reward_mean: 0.25,
            correct_rate: 0.5,
            outcomes: BTreeMap::from([("correct".into(), 0.5), ("wrong".into(), 0.5)]),
            staleness: BTreeMap::from([(0, 3), (2, 1)]),
            accepted_total: 40,
            dropped_total: 2,
            mailbox_depth: BTreeMap::from([("Compiler".into(), 3)]),
            busy: BTreeMap::from([("Generator".into(), 0.9)]),
            failures: BTreeMap::from([("Verifier \"x\"\n".into(), 1)]),
            lease_wait_ms: BTreeMap::from([("learner.step".into(), 1500.0)]),
            tokens: 100,
            train_s: 0.5,
            ..Default::default()
        }
    }

    #[test]
    fn the_exposition_follows_the_format_and_carries_the_step_groups_and_pools() {
        let pools: PoolSource = Box::new(|| {
            vec![(
                "cpu".to_string(),
                PoolStats {
                    requests: 9,
                    crashes: 1,
                    respawn_latency_max: Duration::from_millis(250),
                    ..Default::default()
                },
            )]
        });
        let e = Exporter::with_pools(pools);
        let before = check_exposition(&e.render());
        assert_eq!(before["kevin_up"], 1.0);
        assert!(!before.contains_key("kevin_reward_mean"), "no step yet");
        e.record_step(&step());
        e.record_step(&step());
        let ok = Outcome::Correct {
            kernel_ms: 1.0,
            baseline_ms: 2.0,
            spread: 0.0,
            timing: "cpu".into(),
        };
        let g = Group {
            id: 0,
            task: "t".into(),
            trajectories: vec![vec![
                turn(0, Outcome::CompileError { log: String::new() }, 0),
                turn(1, ok.clone(), 0),
                turn(2, ok, 0),
            ]],
        };
        e.record_group(&score_group(0, g, &Default::default()));
        let text = e.render();
        let s = check_exposition(&text);
        assert_eq!(s["kevin_learner_version"], 7.0);
        assert_eq!(s["kevin_learner_steps_total"], 2.0);
        assert_eq!(s["kevin_learner_tokens_total"], 200.0);
        assert_eq!(s["kevin_reward_mean"], 0.25);
        assert_eq!(s["kevin_groups_accepted_total"], 40.0);
        assert_eq!(s["kevin_step_outcome_ratio{outcome=\"wrong\"}"], 0.5);
        assert_eq!(s["kevin_step_staleness_groups{gap=\"2\"}"], 1.0);
        assert_eq!(s["kevin_mailbox_depth{actor=\"Compiler\"}"], 3.0);
        assert_eq!(s["kevin_actor_busy_ratio{actor=\"Generator\"}"], 0.9);
        assert_eq!(
            s["kevin_failures_total{name=\"Verifier \\\"x\\\"\\n\"}"],
            1.0
        );
        assert_eq!(
            s["kevin_lease_wait_seconds_total{hold=\"learner.step\"}"],
            1.5
        );
        assert_eq!(s["kevin_turns_total{outcome=\"correct\"}"], 2.0);
        assert_eq!(s["kevin_turns_total{outcome=\"compile_error\"}"], 1.0);
        assert_eq!(s["kevin_turns_correct_total"], 2.0);
        assert_eq!(s["kevin_groups_recorded_total"], 1.0);
        assert_eq!(s["kevin_worker_requests_total{pool=\"cpu\"}"], 9.0);
        assert_eq!(s["kevin_worker_crashes_total{pool=\"cpu\"}"], 1.0);
        assert_eq!(s["kevin_worker_respawn_seconds_max{pool=\"cpu\"}"], 0.25);
    }

    #[test]
    fn the_server_answers_metrics_over_http_and_nothing_else() {
        let e = Arc::new(Exporter::default());
        e.record_step(&step());
        let server = Server::start("127.0.0.1:0", e.clone()).unwrap();
        let addr = server.addr().to_string();
        let body = scrape(&addr).unwrap();
        assert_eq!(check_exposition(&body)["kevin_learner_version"], 7.0);
        // Other paths and methods, and a client that sends garbage or nothing, get an answer
        // or a closed connection; the server goes on serving.
        let raw = |req: &[u8]| {
            let mut c = TcpStream::connect(&addr).unwrap();
            // The server may close before reading all of a long request: errors are answers.
            let _ = c.write_all(req);
            let mut out = String::new();
            let _ = io::Read::read_to_string(&mut c, &mut out);
            out
        };
        assert!(raw(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(raw(b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let head = raw(b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        raw(&[0xff; 20_000]);
        drop(TcpStream::connect(&addr).unwrap());
        e.record_step(&StepMetrics { step: 8, ..step() });
        assert_eq!(
            check_exposition(&scrape(&addr).unwrap())["kevin_learner_version"],
            8.0
        );
        drop(server);
        assert!(scrape(&addr).is_err(), "stopped");
    }
}
