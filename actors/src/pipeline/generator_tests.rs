//! The Generator actor against test doubles of a policy (no model): requests join a running
//! stream, weights wait for an empty stream, failures answer exactly the requests they drop.

use super::*;
use crate::pipeline::mailbox::Mailbox;
use kevin::policy::{FinishReason, GenRequest, PolicyError, PolicyStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// What a request asks of the double, by its prompt.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ask {
    /// Finish after this many steps.
    Steps(usize),
    /// Run until another request has finished (at most 5,000 steps).
    UntilOther,
    /// Fail the step it first runs in.
    Fail,
}

fn ask(prompt: &str) -> Ask {
    match prompt {
        "until-other" => Ask::UntilOther,
        "fail" => Ask::Fail,
        n => Ask::Steps(n.parse().expect("a step count")),
    }
}

/// Test double of a policy with continuous batching: each step runs every queued request one
/// step (sleeping 1 ms), and logs what it did.
struct StreamDouble {
    version: u64,
    running: Vec<(u64, Ask, usize)>,
    finished: usize,
    steps: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<String>>>,
}

impl StreamDouble {
    fn new(steps: Arc<AtomicUsize>, log: Arc<Mutex<Vec<String>>>) -> StreamDouble {
        StreamDouble {
            version: 0,
            running: Vec::new(),
            finished: 0,
            steps,
            log,
        }
    }

    fn completion(&self, id: u64) -> Completion {
        Completion {
            id,
            text: format!("v{}", self.version),
            token_ids: vec![1],
            logprobs: vec![-0.5],
            policy_version: self.version,
            finish: FinishReason::Stop,
        }
    }
}

impl Policy for StreamDouble {
    fn describe(&self) -> String {
        "stream double".into()
    }
    fn version(&self) -> u64 {
        self.version
    }
    fn generate(
        &mut self,
        _: &[GenRequest],
        _: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError> {
        unreachable!("the generator drives a policy with a stream through it")
    }
    fn set_weights(&mut self, weights: &Weights) -> Result<(), PolicyError> {
        assert!(
            self.running.is_empty(),
            "weights changed with requests in flight"
        );
        self.log
            .lock()
            .unwrap()
            .push(format!("weights v{}", weights.version));
        self.version = weights.version;
        Ok(())
    }
    fn stream(&mut self) -> Option<&mut dyn PolicyStream> {
        Some(self)
    }
}

impl PolicyStream for StreamDouble {
    fn submit(&mut self, batch: &[GenRequest], _: &SamplingSection) -> Result<(), PolicyError> {
        for r in batch {
            self.log.lock().unwrap().push(format!("submit {}", r.id));
            self.running.push((r.id, ask(&r.prompt), 0));
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<Completion>, StreamError> {
        std::thread::sleep(Duration::from_millis(1));
        self.steps.fetch_add(1, Ordering::SeqCst);
        if let Some(&(id, ..)) = self.running.iter().find(|r| r.1 == Ask::Fail) {
            self.running.retain(|r| r.0 != id);
            return Err(StreamError {
                error: PolicyError::Generate {
                    policy: "double".into(),
                    reason: format!("request {id} broke the pass"),
                },
                dropped: vec![id],
            });
        }
        let others_done = self.finished;
        let mut done = Vec::new();
        for r in &mut self.running {
            r.2 += 1;
            let finished = match r.1 {
                Ask::Steps(n) => r.2 >= n,
                Ask::UntilOther => others_done > 0 || r.2 >= 5_000,
                Ask::Fail => unreachable!(),
            };
            if finished {
                done.push(r.0);
            }
        }
        self.running.retain(|r| !done.contains(&r.0));
        self.finished += done.len();
        for id in &done {
            self.log.lock().unwrap().push(format!("done {id}"));
        }
        Ok(done.into_iter().map(|id| self.completion(id)).collect())
    }

    fn in_flight(&self) -> usize {
        self.running.len()
    }
}

/// Test double of a policy without a stream: answers a batch at once.
struct BatchDouble {
    calls: Arc<AtomicUsize>,
    /// Leave the last request of each batch unanswered.
    drop_last: bool,
}

impl Policy for BatchDouble {
    fn describe(&self) -> String {
        "batch double".into()
    }
    fn version(&self) -> u64 {
        3
    }
    fn generate(
        &mut self,
        batch: &[GenRequest],
        _: &SamplingSection,
    ) -> Result<Vec<Completion>, PolicyError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let n = batch.len() - usize::from(self.drop_last);
        Ok(batch[..n]
            .iter()
            .map(|r| Completion {
                id: r.id,
                text: r.prompt.clone(),
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                policy_version: 3,
                finish: FinishReason::Stop,
            })
            .collect())
    }
    fn set_weights(&mut self, _: &Weights) -> Result<(), PolicyError> {
        Ok(())
    }
}

type Reply = oneshot::Receiver<Result<Completion, String>>;

async fn send(addr: &Addr<Generator>, mailbox: &Mailbox, id: u64, prompt: &str) -> Reply {
    let (reply, rx) = oneshot::channel();
    let ticket = mailbox.ticket().await;
    addr.do_send(Generate {
        request: GenRequest {
            id,
            prompt: prompt.into(),
            seed: id,
        },
        reply,
        ticket,
    });
    rx
}

async fn until(what: impl Fn() -> bool) {
    for _ in 0..5_000 {
        if what() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the condition never held");
}

fn start(policy: Box<dyn Policy>) -> (Addr<Generator>, Arc<Mailbox>, Arc<Failures>) {
    let failures = Arc::new(Failures::default());
    let addr = Generator::new(policy, SamplingSection::default(), 64, failures.clone()).start();
    (addr, Mailbox::new("Generator", 64), failures)
}

#[test]
fn a_request_joins_the_running_ones_instead_of_waiting_for_them() {
    actix::System::new().block_on(async {
        let steps = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let double = StreamDouble::new(steps.clone(), log.clone());
        let (addr, mailbox, _) = start(Box::new(double));
        // The first request runs until another finishes: a generator that waited for it before
        // taking the second would only finish it after its 5,000-step cap.
        let long = send(&addr, &mailbox, 1, "until-other").await;
        until(|| steps.load(Ordering::SeqCst) >= 3).await;
        let short = send(&addr, &mailbox, 2, "2").await;
        let short = short.await.unwrap().unwrap();
        let long = long.await.unwrap().unwrap();
        assert_eq!((short.id, long.id), (2, 1));
        let log = log.lock().unwrap().clone();
        assert_eq!(log, ["submit 1", "submit 2", "done 2", "done 1"]);
        assert!(
            steps.load(Ordering::SeqCst) < 100,
            "the first request hit its cap"
        );
    });
}

#[test]
fn weights_wait_until_nothing_is_in_flight_and_hold_new_requests_back() {
    actix::System::new().block_on(async {
        let steps = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let double = StreamDouble::new(steps.clone(), log.clone());
        let (addr, mailbox, failures) = start(Box::new(double));
        let first = send(&addr, &mailbox, 1, "30").await;
        until(|| steps.load(Ordering::SeqCst) >= 2).await;
        addr.do_send(PublishWeights(Weights {
            version: 7,
            payload: Arc::new(()),
        }));
        let second = send(&addr, &mailbox, 2, "1").await;
        let first = first.await.unwrap().unwrap();
        let second = second.await.unwrap().unwrap();
        // The running request finished with the weights it started with; the one that arrived
        // after the publication waited for the new weights.
        assert_eq!((first.policy_version, first.text.as_str()), (0, "v0"));
        assert_eq!((second.policy_version, second.text.as_str()), (7, "v7"));
        let log = log.lock().unwrap().clone();
        assert_eq!(
            log,
            ["submit 1", "done 1", "weights v7", "submit 2", "done 2"]
        );
        assert_eq!(failures.snapshot().values().sum::<u64>(), 0);
    });
}

#[test]
fn a_failed_step_answers_the_requests_it_dropped_and_the_others_go_on() {
    actix::System::new().block_on(async {
        let steps = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (addr, mailbox, failures) = start(Box::new(StreamDouble::new(steps, log)));
        let ok = send(&addr, &mailbox, 1, "5").await;
        let bad = send(&addr, &mailbox, 2, "fail").await;
        let err = bad.await.unwrap().unwrap_err();
        assert!(err.contains("request 2 broke the pass"), "{err}");
        assert_eq!(ok.await.unwrap().unwrap().id, 1);
        assert_eq!(failures.snapshot().get("Generator.policy_error"), Some(&1));
    });
}

#[test]
fn a_policy_without_a_stream_runs_a_batch_at_a_time_and_nothing_goes_unanswered() {
    actix::System::new().block_on(async {
        let calls = Arc::new(AtomicUsize::new(0));
        let (addr, mailbox, _) = start(Box::new(BatchDouble {
            calls: calls.clone(),
            drop_last: false,
        }));
        let a = send(&addr, &mailbox, 1, "a").await;
        let b = send(&addr, &mailbox, 2, "b").await;
        assert_eq!(a.await.unwrap().unwrap().text, "a");
        assert_eq!(b.await.unwrap().unwrap().text, "b");
        assert!((1..=2).contains(&calls.load(Ordering::SeqCst)));

        // A policy that leaves a request unanswered: it gets an error, not a wait forever.
        let (addr, mailbox, failures) = start(Box::new(BatchDouble {
            calls,
            drop_last: true,
        }));
        let lost = send(&addr, &mailbox, 9, "z").await;
        let err = lost.await.unwrap().unwrap_err();
        assert!(err.contains("no completion"), "{err}");
        assert_eq!(failures.snapshot().get("Generator.policy_error"), Some(&1));
    });
}
