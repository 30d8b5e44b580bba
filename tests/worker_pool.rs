//! The worker pool against real child processes (the "echo" role of this very binary): answers,
//! pings, and every failure path (timeout, abort, segfault, exit, garbage on the wire, bad start,
//! a machine too busy to give the worker its time) followed by a working respawned child.

mod common;

use std::time::{Duration, Instant};

use kevin::worker::echo::{EchoRequest, EchoResponse};
use kevin::worker::{PoolConfig, WorkerCommand, WorkerFailure, WorkerPool, PROTOCOL_VERSION};

type EchoPool = WorkerPool<EchoRequest, EchoResponse>;

fn main() {
    common::main(&[
        ("echo_and_ping", echo_and_ping),
        ("timeout_kills_and_respawns", timeout_kills_and_respawns),
        ("abort_is_a_crash_with_stderr", abort_is_a_crash_with_stderr),
        ("segfault_is_a_crash", segfault_is_a_crash),
        (
            "exit_without_answer_is_a_crash",
            exit_without_answer_is_a_crash,
        ),
        (
            "garbage_is_a_protocol_failure",
            garbage_is_a_protocol_failure,
        ),
        (
            "random_garbage_always_kills_and_replaces_the_worker",
            random_garbage_always_kills_and_replaces_the_worker,
        ),
        (
            "stdout_prints_do_not_corrupt_frames",
            stdout_prints_do_not_corrupt_frames,
        ),
        (
            "failure_does_not_touch_other_requests",
            failure_does_not_touch_other_requests,
        ),
        (
            "missing_program_is_a_spawn_failure",
            missing_program_is_a_spawn_failure,
        ),
        (
            "unknown_role_is_a_spawn_failure",
            unknown_role_is_a_spawn_failure,
        ),
        (
            "retired_worker_answers_then_is_replaced",
            retired_worker_answers_then_is_replaced,
        ),
        (
            "failure_returns_before_the_replacement_is_ready",
            failure_returns_before_the_replacement_is_ready,
        ),
        (
            "a_worker_that_forges_a_reply_and_dies_does_not_kill_the_parent",
            a_worker_that_forges_a_reply_and_dies_does_not_kill_the_parent,
        ),
        (
            "a_starved_worker_gets_its_time_and_then_the_machine_is_blamed",
            a_starved_worker_gets_its_time_and_then_the_machine_is_blamed,
        ),
    ]);
}

fn pool(workers: usize) -> EchoPool {
    let config = PoolConfig {
        workers,
        request_timeout: Duration::from_secs(5),
        ..PoolConfig::default()
    };
    WorkerPool::new(common::self_as_worker("echo"), config).expect("echo pool starts")
}

fn echo(text: &str) -> EchoRequest {
    EchoRequest::Echo { text: text.into() }
}

/// After a failure the pool must serve the next request with a fresh child.
fn assert_recovered(pool: &EchoPool) {
    assert_eq!(
        pool.request(&echo("again")),
        Ok(EchoResponse::Text("again".into()))
    );
    let stats = pool.stats();
    assert!(stats.respawns >= 1, "{stats:?}");
    assert!(stats.respawn_latency_max > Duration::ZERO, "{stats:?}");
}

fn echo_and_ping() {
    let pool = pool(2);
    assert_eq!(
        pool.request(&echo("hi ✓")),
        Ok(EchoResponse::Text("hi ✓".into()))
    );
    assert_eq!(
        pool.request(&EchoRequest::Sleep { ms: 10 }),
        Ok(EchoResponse::Slept(10))
    );
    assert!(pool.ping(Duration::from_secs(5)).is_ok());
    let pings = pool.ping_all(Duration::from_secs(5));
    assert_eq!(pings.len(), 2);
    assert!(pings.iter().all(Result::is_ok), "{pings:?}");
    let stats = pool.stats();
    assert_eq!((stats.requests, stats.succeeded, stats.respawns), (2, 2, 0));
}

fn timeout_kills_and_respawns() {
    let pool = pool(1);
    let old_pid = pool.pids()[0];
    let limit = Duration::from_millis(300);
    let start = Instant::now();
    let result = pool.request_with_timeout(&EchoRequest::Sleep { ms: 60_000 }, limit);
    assert_eq!(result, Err(WorkerFailure::Timeout { limit }));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_ne!(pool.pids()[0], old_pid, "the hung child was replaced");
    assert_eq!(pool.stats().timeouts, 1);
    assert_recovered(&pool);
}

fn abort_is_a_crash_with_stderr() {
    let pool = pool(1);
    let result = pool.request(&EchoRequest::Abort {
        text: "last words".into(),
    });
    match result {
        Err(WorkerFailure::Crashed { exit, stderr_tail }) => {
            assert_eq!(exit.signal, Some(6), "{exit}");
            assert!(stderr_tail.contains("last words"), "{stderr_tail:?}");
        }
        other => panic!("expected a crash, got {other:?}"),
    }
    assert_eq!(pool.stats().crashes, 1);
    assert_recovered(&pool);
}

fn segfault_is_a_crash() {
    let pool = pool(1);
    match pool.request(&EchoRequest::Segfault) {
        Err(WorkerFailure::Crashed { exit, .. }) => assert_eq!(exit.signal, Some(11), "{exit}"),
        other => panic!("expected a crash, got {other:?}"),
    }
    assert_recovered(&pool);
}

fn exit_without_answer_is_a_crash() {
    let pool = pool(1);
    match pool.request(&EchoRequest::Exit { code: 3 }) {
        Err(WorkerFailure::Crashed { exit, .. }) => assert_eq!(exit.code, Some(3), "{exit}"),
        other => panic!("expected a crash, got {other:?}"),
    }
    assert_recovered(&pool);
}

fn garbage_is_a_protocol_failure() {
    let header = |version: u16, len: u32| {
        let mut v = b"KVWK".to_vec();
        v.extend(version.to_le_bytes());
        v.extend(len.to_le_bytes());
        v
    };
    let mut bad_json = header(PROTOCOL_VERSION, 5);
    bad_json.extend(b"{oops");
    // (bytes written instead of an answer, text the failure reason must contain)
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"Segmentation fault (core dumped)\n".to_vec(), "bad magic"),
        (header(PROTOCOL_VERSION + 1, 2), "version mismatch"),
        (header(PROTOCOL_VERSION, u32::MAX), "exceeds the maximum"),
        (bad_json, "bad JSON"),
    ];
    let pool = pool(1);
    for (bytes, expected) in cases {
        match pool.request(&EchoRequest::Raw { bytes }) {
            Err(WorkerFailure::Protocol { reason, .. }) => {
                assert!(reason.contains(expected), "{reason:?} lacks {expected:?}")
            }
            other => panic!("expected a protocol failure ({expected}), got {other:?}"),
        }
        assert_recovered(&pool);
    }
    assert_eq!(pool.stats().protocol_errors, 4);
}

/// Property: whatever a worker writes instead of its answer (random bytes, a valid header before
/// a random or cut-short payload, a well-formed frame answering another request), the request
/// fails, the worker is killed, and a fresh one (another pid) answers the next request.
fn random_garbage_always_kills_and_replaces_the_worker() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let config = PoolConfig {
        workers: 1,
        request_timeout: Duration::from_millis(700),
        ..PoolConfig::default()
    };
    let pool = EchoPool::new(common::self_as_worker("echo"), config).expect("echo pool starts");
    let stale = kevin::worker::protocol::encode_frame(
        &kevin::worker::FromChild::Response {
            id: 999_999,
            body: EchoResponse::Text("stale".into()),
        },
        1 << 20,
    )
    .unwrap();
    for round in 0..16 {
        let mut header = b"KVWK".to_vec();
        header.extend(PROTOCOL_VERSION.to_le_bytes());
        let bytes: Vec<u8> = match round % 4 {
            0 => (0..rng.random_range(1..64)).map(|_| rng.random()).collect(),
            1 => {
                let payload: Vec<u8> = (0..rng.random_range(0..32)).map(|_| rng.random()).collect();
                header.extend((payload.len() as u32).to_le_bytes());
                header.extend(payload);
                header
            }
            2 => stale[..rng.random_range(1..stale.len())].to_vec(),
            _ => stale.clone(),
        };
        let old_pid = pool.pids()[0];
        match pool.request(&EchoRequest::Raw {
            bytes: bytes.clone(),
        }) {
            Err(WorkerFailure::Protocol { .. } | WorkerFailure::Timeout { .. }) => {}
            other => panic!("round {round}: {bytes:?} gave {other:?}"),
        }
        assert_ne!(
            pool.pids()[0],
            old_pid,
            "round {round}: the worker was not replaced"
        );
        assert_eq!(
            pool.request(&echo("after")),
            Ok(EchoResponse::Text("after".into())),
            "round {round}"
        );
    }
    let stats = pool.stats();
    assert_eq!(stats.respawns, 16, "{stats:?}");
    assert_eq!(stats.respawn_latency_recent.len(), 16);
    assert!(stats
        .respawn_latency_median()
        .is_some_and(|m| m > Duration::ZERO));
}

fn stdout_prints_do_not_corrupt_frames() {
    let pool = pool(1);
    let req = EchoRequest::PrintToStdout {
        text: "printf from a kernel".into(),
    };
    assert_eq!(
        pool.request(&req),
        Ok(EchoResponse::Text("printf from a kernel".into()))
    );
    assert_eq!(pool.stats().respawns, 0);
}

fn failure_does_not_touch_other_requests() {
    let pool = &pool(2);
    std::thread::scope(|s| {
        let hung = s.spawn(|| {
            pool.request_with_timeout(&EchoRequest::Sleep { ms: 60_000 }, Duration::from_secs(2))
        });
        // Give the hung request time to take a worker; the others share the second one.
        std::thread::sleep(Duration::from_millis(200));
        let others: Vec<_> = (0..3)
            .map(|i| s.spawn(move || (i, pool.request(&echo(&format!("req {i}"))))))
            .collect();
        for h in others {
            let (i, r) = h.join().unwrap();
            assert_eq!(r, Ok(EchoResponse::Text(format!("req {i}"))));
        }
        assert!(matches!(
            hung.join().unwrap(),
            Err(WorkerFailure::Timeout { .. })
        ));
    });
    assert_eq!(pool.stats().succeeded, 3);
}

fn missing_program_is_a_spawn_failure() {
    let command = WorkerCommand::kevin_role("/nonexistent/kevin", "echo");
    match EchoPool::new(command, PoolConfig::default()) {
        Err(WorkerFailure::Spawn { program, .. }) => {
            assert_eq!(program.to_str(), Some("/nonexistent/kevin"))
        }
        Err(other) => panic!("expected a spawn failure, got {other:?}"),
        Ok(_) => panic!("expected a spawn failure, got a pool"),
    }
}

fn unknown_role_is_a_spawn_failure() {
    match EchoPool::new(
        common::self_as_worker("no-such-role"),
        PoolConfig::default(),
    ) {
        Err(WorkerFailure::Spawn { reason, .. }) => {
            assert!(reason.contains("exit code 2"), "{reason}");
            assert!(reason.contains("unknown role"), "{reason}");
        }
        Err(other) => panic!("expected a spawn failure, got {other:?}"),
        Ok(_) => panic!("expected a spawn failure, got a pool"),
    }
}

/// A worker whose answer says it must go (a GPU worker with a poisoned context) delivers that
/// answer, then is replaced before it serves anything else.
fn retired_worker_answers_then_is_replaced() {
    let pool = pool(1)
        .retire_when(|r: &EchoResponse| matches!(r, EchoResponse::Text(t) if t == "poisoned"));
    let first = pool.pids()[0];
    assert_eq!(
        pool.request(&echo("fine")),
        Ok(EchoResponse::Text("fine".into()))
    );
    assert_eq!(pool.pids()[0], first, "a normal answer keeps the worker");
    assert_eq!(
        pool.request(&echo("poisoned")),
        Ok(EchoResponse::Text("poisoned".into())),
        "the answer that retires the worker is still delivered"
    );
    let second = pool.pids()[0];
    assert!(
        second.is_some() && second != first,
        "{first:?} -> {second:?}"
    );
    assert_eq!(pool.stats().retired, 1);
    assert_recovered(&pool);
}

/// A failed request returns once its child is killed, not after the replacement has started (the
/// CUDA environment holds its GPU's lock around a request, so a respawn inside it would stall the
/// GPU for a process start). Children here take 1.5 s to say `Ready`, standing in for a slow
/// start such as creating a CUDA context.
fn failure_returns_before_the_replacement_is_ready() {
    let mut command = common::self_as_worker("echo");
    command
        .env
        .push((kevin::worker::echo::START_DELAY_ENV.into(), "1500".into()));
    let config = PoolConfig {
        workers: 1,
        request_timeout: Duration::from_secs(5),
        ..PoolConfig::default()
    };
    let pool: EchoPool = WorkerPool::new(command, config).expect("echo pool starts");
    let first = pool.pids()[0];
    assert!(matches!(
        pool.request(&EchoRequest::Segfault),
        Err(WorkerFailure::Crashed { .. })
    ));
    // Returned before the replacement answered its health check: no respawn recorded yet.
    assert_eq!(pool.stats().respawns, 0, "{:?}", pool.stats());
    // The next request waits for the replacement rather than failing.
    assert_eq!(
        pool.request(&echo("after")),
        Ok(EchoResponse::Text("after".into()))
    );
    let stats = pool.stats();
    assert_eq!(stats.respawns, 1, "{stats:?}");
    assert!(
        stats.respawn_latency_last >= Duration::from_millis(1500),
        "{stats:?}"
    );
    assert_ne!(pool.pids()[0], first);
}

/// Issue 17, item 8: untrusted code in a worker writes a well-formed reply onto the frame
/// channel and kills its worker. The parent, with the SIGPIPE disposition of `kevin eval` and
/// `kevin bench` ([`kevin::roles::set_sigpipe_for`]), must survive its next write to the dead
/// worker: the failure is that request's (a crash), and a fresh worker serves the one after.
/// (With SIGPIPE at its default disposition, as `kevin eval` had it, this test binary dies.)
fn a_worker_that_forges_a_reply_and_dies_does_not_kill_the_parent() {
    for command in ["eval", "bench"] {
        kevin::roles::set_sigpipe_for(Some(command));
        // The forger must name the request's id: a fresh pool numbers from 1 (its first
        // health-check ping included), so one of the first few ids is the first request's.
        let mut forged = None;
        for id in 1..=8 {
            let pool = pool(1);
            let reply = pool.request(&EchoRequest::ForgeAndDie {
                id,
                text: "correct, 5.00x".into(),
            });
            match reply {
                Ok(EchoResponse::Text(t)) => {
                    assert_eq!(t, "correct, 5.00x");
                    forged = Some(pool);
                    break;
                }
                Err(WorkerFailure::Protocol { .. } | WorkerFailure::Crashed { .. }) => continue,
                other => panic!("{command}: unexpected answer to a forged reply: {other:?}"),
            }
        }
        let pool = forged.expect("a forged reply with the right id is accepted by the pool");
        // The forger is gone; the parent's next request is written into a closed pipe.
        std::thread::sleep(Duration::from_millis(300));
        match pool.request(&echo("after the forger")) {
            Err(WorkerFailure::Crashed { .. }) => {}
            Ok(EchoResponse::Text(t)) => assert_eq!(t, "after the forger"),
            other => panic!("{command}: expected the dead worker's crash, got {other:?}"),
        }
        assert_eq!(
            pool.request(&echo("again")),
            Ok(EchoResponse::Text("again".into()))
        );
    }
}

/// Deadlines are the worker's own time: on a machine with ten spinning processes a core, a
/// request that needs 50 ms of CPU is answered although that takes longer than its 300 ms limit,
/// and one that would spin for a minute ends at the backstop (5 x 300 ms) as the machine's
/// failure, not a timeout. Unloaded, the same spin is a timeout at its limit. The load gives the
/// worker about a tenth of a core: its 50 ms take about 0.5 s, well inside the backstop, and its
/// 300 ms limit would take about 3 s, well beyond it (six a core gave it up to a fifth, and the
/// long spin then reached its limit at 1.49 s, a timeout, once on a 2-core CI machine).
fn a_starved_worker_gets_its_time_and_then_the_machine_is_blamed() {
    let pool = pool(1);
    let limit = Duration::from_millis(300);
    let spin = |ms| pool.request_with_timeout(&EchoRequest::Spin { ms }, limit);
    let start = Instant::now();
    assert_eq!(spin(60_000), Err(WorkerFailure::Timeout { limit }));
    assert!(start.elapsed() < limit * 3, "{:?}", start.elapsed());
    let schedstats = std::path::Path::new("/proc/self/task")
        .join(std::process::id().to_string())
        .join("schedstat")
        .exists();
    if !schedstats {
        eprintln!("no run-queue delays in /proc here: deadlines are wall time; the rest skipped");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut load: Vec<_> = (0..10 * cores)
        .map(|_| {
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let answered = spin(50);
    let answered_in = start.elapsed();
    let start = Instant::now();
    let starved = spin(60_000);
    let starved_in = start.elapsed();
    for c in &mut load {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    assert_eq!(
        answered,
        Ok(EchoResponse::Spun(50)),
        "after {answered_in:?}"
    );
    match starved {
        Err(WorkerFailure::Starved {
            limit: l,
            elapsed,
            starved,
        }) => {
            assert_eq!(l, limit);
            assert!(elapsed >= limit * 5, "{elapsed:?}");
            assert!(starved > elapsed - limit, "{starved:?} of {elapsed:?}");
        }
        other => panic!("{other:?} after {starved_in:?}"),
    }
    let stats = pool.stats();
    assert_eq!((stats.timeouts, stats.starved), (1, 1), "{stats:?}");
    assert_recovered(&pool);
}
