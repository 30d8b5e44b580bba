//! Tests of the engine on NdArray with the [`BigramLm`] test double.

use std::sync::Arc;

use burn::backend::NdArray;
use burn::tensor::Tensor;
use kevin::config::SamplingSection;
use kevin::policy::FinishReason;

use super::*;
use crate::testing::{BigramCache, BigramLm};
use crate::CausalLm;

type B = NdArray;

fn device() -> burn::tensor::Device<B> {
    Default::default()
}

/// Token t decodes to the letter `a + t`.
fn letters(ids: &[u32]) -> String {
    ids.iter().map(|&t| char::from(b'a' + t as u8)).collect()
}

fn params(temperature: f64, top_k: usize, top_p: f64, max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p,
        top_k,
        max_new_tokens,
        stop: Vec::new(),
        eos_token_ids: Vec::new(),
    }
}

fn request(id: u64, prompt: &[u32], seed: u64, params: &SamplingParams) -> Request {
    Request {
        id,
        prompt: prompt.to_vec(),
        seed,
        params: Arc::new(params.clone()),
    }
}

/// A successor double over 8 tokens: greedy counts up; sampling at temperature 1 is spread
/// (the successor has probability e / (e + 7) = 0.28).
fn successor(max_positions: usize) -> BigramLm<B> {
    BigramLm::successor(8, 1.0, max_positions, &device())
}

fn generator(model: BigramLm<B>, slots: usize, max_len: usize) -> Generator<B, BigramLm<B>> {
    Generator::new(model, slots, max_len).expect("generator settings")
}

fn run(model: BigramLm<B>, slots: usize, max_len: usize, requests: Vec<Request>) -> Vec<Finished> {
    let mut g = generator(model, slots, max_len);
    let out = g.generate_all(requests, &letters).expect("generation");
    assert_eq!(g.cache().used_slots(), 0, "every finished slot is cleared");
    out
}

fn output(f: &Finished) -> &SequenceOutput {
    f.as_ref().expect("request completed")
}

/// Runs one request alone, for comparison with the same request in a batch.
fn solo(model: &BigramLm<B>, max_len: usize, req: &Request) -> SequenceOutput {
    let out = run(model.clone(), 1, max_len, vec![req.clone()]);
    output(&out[0]).clone()
}

#[test]
fn greedy_decoding_counts_up() {
    let out = run(
        successor(64),
        2,
        64,
        vec![request(1, &[0, 1], 0, &params(0.0, 0, 1.0, 5))],
    );
    let out = output(&out[0]);
    assert_eq!(out.token_ids, [2, 3, 4, 5, 6]);
    assert_eq!(out.logprobs, [0.0; 5]);
    assert_eq!(out.text, "cdefg");
    assert_eq!(out.finish, FinishReason::Length);
    assert_eq!((out.prompt_tokens, out.generated_tokens), (2, 5));
}

/// Filters that keep one token are greedy, whatever the temperature (and log-prob 0).
#[test]
fn single_token_filters_equal_greedy() {
    let model = successor(64);
    let greedy = solo(&model, 64, &request(1, &[3], 9, &params(0.0, 0, 1.0, 12)));
    for p in [params(0.9, 1, 1.0, 12), params(0.9, 0, 1e-6, 12)] {
        let out = solo(&model, 64, &request(1, &[3], 9, &p));
        assert_eq!(out, greedy, "{p:?}");
    }
    assert_eq!(greedy.token_ids, [4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]);
}

/// The same request gives the same tokens alone and in any batch; other seeds give others.
#[test]
fn seeded_sampling_is_reproducible_and_independent_of_the_batch() {
    let model = successor(64);
    let plain = params(1.0, 0, 1.0, 20);
    let filtered = params(0.8, 5, 0.9, 20);
    let target = request(7, &[1, 2], 42, &plain);
    let target_filtered = request(8, &[5], 43, &filtered);
    let alone = solo(&model, 64, &target);
    let alone_filtered = solo(&model, 64, &target_filtered);
    assert_eq!(solo(&model, 64, &target), alone, "same seed, same tokens");
    assert!(
        alone.logprobs.iter().all(|&l| l < 0.0),
        "sampled, not greedy"
    );

    let others = vec![
        request(1, &[3, 4, 5], 1, &plain),
        request(2, &[0], 2, &params(0.0, 0, 1.0, 7)),
        request(3, &[6, 6], 3, &filtered),
        request(4, &[2], 42, &params(1.0, 0, 1.0, 3)),
    ];
    // Targets first, last, and joining late (slots full, so they wait for a free one).
    let batches = [
        [
            vec![target.clone(), target_filtered.clone()],
            others.clone(),
        ]
        .concat(),
        [
            others.clone(),
            vec![target.clone(), target_filtered.clone()],
        ]
        .concat(),
    ];
    for (b, batch) in batches.into_iter().enumerate() {
        for slots in [1, 2, 6] {
            let outs = run(model.clone(), slots, 64, batch.clone());
            let find = |id| outs.iter().map(output).find(|o| o.id == id).unwrap();
            assert_eq!(*find(7), alone, "batch {b}, {slots} slots");
            assert_eq!(*find(8), alone_filtered, "batch {b}, {slots} slots");
        }
    }
    let reseeded = solo(&model, 64, &Request { seed: 43, ..target });
    assert_ne!(
        reseeded.token_ids, alone.token_ids,
        "another seed, other tokens"
    );
}

/// Stop strings: found across token boundaries and inside a token; the text is cut before the
/// stop string, the tokens keep the one that completed it. EOS is kept in the tokens, not in the
/// text.
#[test]
fn stop_strings_and_eos_cut_consistently() {
    // Token t decodes to a letter, except token 4, "xyz". Greedy from [0]: 1 2 3 4 5 ...
    let decode = |ids: &[u32]| -> String {
        ids.iter()
            .map(|&t| match t {
                4 => "xyz".to_string(),
                t => char::from(b'a' + t as u8).to_string(),
            })
            .collect()
    };
    let check = |stop: &[&str], eos: &[u32], tokens: &[u32], text: &str, finish: FinishReason| {
        let mut p = params(0.0, 0, 1.0, 6);
        p.stop = stop.iter().map(|s| s.to_string()).collect();
        p.eos_token_ids = eos.to_vec();
        let mut g = generator(successor(64), 1, 64);
        let out = g
            .generate_all(vec![request(1, &[0], 0, &p)], &decode)
            .unwrap();
        let out = output(&out[0]);
        let ctx = format!("stop {stop:?}, eos {eos:?}");
        assert_eq!(out.token_ids, tokens, "{ctx}");
        assert_eq!(out.logprobs.len(), tokens.len(), "{ctx}");
        assert_eq!(out.generated_tokens, tokens.len(), "{ctx}");
        assert_eq!(out.text, text, "{ctx}");
        assert_eq!(out.finish, finish, "{ctx}");
    };
    use FinishReason::{Length, Stop};
    check(&[], &[], &[1, 2, 3, 4, 5, 6], "bcdxyzfg", Length);
    check(&["d"], &[], &[1, 2, 3], "bc", Stop);
    check(&["cd"], &[], &[1, 2, 3], "b", Stop); // spans two tokens
    check(&["dx"], &[], &[1, 2, 3, 4], "bc", Stop); // spans two tokens, ends inside the second
    check(&["y"], &[], &[1, 2, 3, 4], "bcdx", Stop); // inside one token; "z" is cut too
    check(&["f", "zf", "q"], &[], &[1, 2, 3, 4, 5], "bcdxy", Stop); // the earliest one wins
    check(&["bc"], &[], &[1, 2], "", Stop);
    check(&[], &[3], &[1, 2, 3], "bc", Stop); // EOS
    check(&["d"], &[3], &[1, 2, 3], "bc", Stop); // EOS first: its text is not decoded
    check(&["q"], &[9], &[1, 2, 3, 4, 5, 6], "bcdxyzfg", Length);
}

/// `max_new_tokens` ends with Length, and so does a full slot, whichever comes first.
#[test]
fn token_limits_give_length() {
    let p = params(0.7, 0, 1.0, 10);
    let outs = run(
        successor(64),
        3,
        8,
        vec![
            request(1, &[0, 1, 2], 1, &params(0.7, 0, 1.0, 4)), // max_new_tokens first
            request(2, &[0, 1, 2], 2, &p),                      // slot full after 8 - 3
            request(3, &[0; 7], 3, &p),                         // room for one token
        ],
    );
    let lens: Vec<(usize, FinishReason)> = outs
        .iter()
        .map(output)
        .map(|o| (o.generated_tokens, o.finish))
        .collect();
    use FinishReason::Length;
    assert_eq!(lens, [(4, Length), (5, Length), (1, Length)]);
    // A model with fewer positions caps the slot.
    let g = generator(successor(6), 1, 100);
    assert_eq!(g.max_len(), 6);
}

/// Five requests through two slots: all complete, slots are cleared and reused (the double
/// refuses to overfill a slot that was not cleared), each output equals its solo run, and the
/// pass counters add up.
#[test]
fn more_requests_than_slots_reuse_slots() {
    let model = successor(64);
    let p = params(1.0, 0, 1.0, 5);
    let reqs: Vec<Request> = (0..5)
        .map(|i| request(i, &[i as u32, 1, 2], i, &p))
        .collect();
    let mut g = generator(model.clone(), 2, 8);
    let outs = g.generate_all(reqs.clone(), &letters).unwrap();
    for (req, out) in reqs.iter().zip(&outs) {
        assert_eq!(*output(out), solo(&model, 8, req), "request {}", req.id);
    }
    let s = g.stats();
    // Pairs (0, 1), (2, 3) then 4 alone, 5 passes each.
    assert_eq!(
        (s.forward_passes, s.rows, s.max_rows, s.finished),
        (15, 25, 2, 5)
    );
    assert_eq!((s.prefill_rows, s.prefill_tokens), (5, 15));
    assert_eq!(s.tokens, 15 + 20, "prompts + one token per decode row");
    assert_eq!(g.cache().used_slots(), 0);
    assert!(g.is_idle());
}

/// Continuous batching: a request joins as soon as a slot frees, while the other slot is still
/// decoding, and leaves when it finishes.
#[test]
fn requests_join_and_leave_at_step_boundaries() {
    let model = successor(64);
    let mut g = generator(model, 2, 64);
    let p = |n| params(0.0, 0, 1.0, n);
    g.submit(request(1, &[0], 0, &p(2)));
    g.submit(request(2, &[0], 0, &p(5)));
    g.submit(request(3, &[0, 1, 2], 0, &p(2)));
    let mut log = Vec::new();
    while !g.is_idle() {
        let done = g.step(&letters).unwrap();
        let ids: Vec<u64> = done.iter().map(|f| output(f).id).collect();
        log.push((g.running(), g.waiting(), ids, g.cache().used_slots()));
    }
    // Step 1: 1 and 2 prefill; step 2: 1 ends; step 3: 3 prefills next to 2's decode; step 4:
    // 3 ends; step 5: 2 ends.
    assert_eq!(
        log,
        [
            (2, 1, vec![], 2),
            (1, 1, vec![1], 1),
            (2, 0, vec![], 2),
            (1, 0, vec![3], 1),
            (0, 0, vec![2], 0),
        ]
    );
    let s = g.stats();
    assert_eq!(
        (s.forward_passes, s.rows, s.tokens),
        (5, 9, 2 + 2 + 4 + 2 + 1)
    );
}

/// Requests that cannot run are refused with a reason naming the problem, and the others run
/// exactly as they would alone.
#[test]
fn bad_requests_are_refused_without_disturbing_the_others() {
    let model = successor(64);
    let good = params(1.0, 0, 1.0, 4);
    let a = request(1, &[1, 2], 5, &good);
    let b = request(2, &[3], 6, &good);
    let mut bad_params = good.clone();
    bad_params.top_p = 0.0;
    let batch = vec![
        a.clone(),
        request(10, &[0; 8], 0, &good),
        request(11, &[], 0, &good),
        b.clone(),
        request(12, &[1, 8], 0, &good),
        request(13, &[1], 0, &bad_params),
        request(1, &[4], 0, &good),
    ];
    let outs = run(model.clone(), 2, 8, batch);
    assert_eq!(*output(&outs[0]), solo(&model, 8, &a));
    assert_eq!(*output(&outs[3]), solo(&model, 8, &b));
    let refused: Vec<String> = [1, 2, 4, 5, 6]
        .iter()
        .map(|&i| outs[i].as_ref().unwrap_err().to_string())
        .collect();
    assert_eq!(
        refused,
        [
            "request 10: prompt of 8 tokens leaves no room for a response: a slot holds 8 \
             tokens (prompt + response)",
            "request 11: empty prompt",
            "request 12: prompt token 8 at position 1 is outside the vocabulary of 8",
            "request 13: sampling.top_p = 0: must be in (0, 1]",
            "request 1: another request with this id is in flight",
        ]
    );
    // Refused at submit, handed back by the next step without a forward pass.
    let mut g = generator(model, 1, 8);
    g.submit(request(10, &[0; 9], 0, &good));
    assert!(!g.is_idle());
    let done = g.step(&letters).unwrap();
    assert!(matches!(
        &done[..],
        [Err(Rejected {
            id: 10,
            reason: RejectReason::PromptTooLong {
                prompt_tokens: 9,
                max_len: 8
            }
        })]
    ));
    assert_eq!(g.stats().forward_passes, 0);
    assert!(g.is_idle());
}

/// A model that fails its n-th `extend`, to exercise the engine's recovery. With `draws`, it
/// also draws "on the device" ([`CausalLm::extend_draw`]: its logits through `select_tokens`
/// with the draws' rules), counting those calls there; `poison` then makes the first row's
/// log-prob NaN (a row whose logits are not a distribution).
struct Flaky {
    inner: BigramLm<B>,
    fail_at: usize,
    calls: std::cell::Cell<usize>,
    draws: Option<std::rc::Rc<std::cell::Cell<usize>>>,
    poison: bool,
}

impl CausalLm<B> for Flaky {
    type Cache = BigramCache;
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn max_positions(&self) -> usize {
        self.inner.max_positions()
    }
    fn device(&self) -> burn::tensor::Device<B> {
        CausalLm::device(&self.inner)
    }
    fn new_cache(&self, slots: usize, max_len: usize) -> BigramCache {
        self.inner.new_cache(slots, max_len)
    }
    fn extend(
        &self,
        cache: &mut BigramCache,
        slots: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Tensor<B, 2>, String> {
        self.calls.set(self.calls.get() + 1);
        if self.calls.get() == self.fail_at {
            return Err("device lost".to_string());
        }
        self.inner.extend(cache, slots, tokens)
    }
    fn extend_draw(
        &self,
        cache: &mut BigramCache,
        slots: &[usize],
        tokens: &[Vec<u32>],
        draws: &[crate::DeviceDraw],
    ) -> Result<Option<Vec<(u32, f32)>>, String> {
        let Some(count) = &self.draws else {
            return Ok(None);
        };
        count.set(count.get() + 1);
        let logits = self.extend(cache, slots, tokens)?;
        let choices: Vec<RowChoice> = draws
            .iter()
            .map(|d| RowChoice {
                filter: crate::sampler::TokenFilter {
                    temperature: d.temperature,
                    top_k: 0,
                    top_p: 1.0,
                },
                uniform: d.uniform,
            })
            .collect();
        let mut out: Vec<(u32, f32)> = select_tokens(logits, &choices)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|s| (s.token, s.logprob))
            .collect();
        if self.poison {
            out[0].1 = f32::NAN;
        }
        Ok(Some(out))
    }
    fn clear_slot(&self, cache: &mut BigramCache, slot: usize) {
        self.inner.clear_slot(cache, slot)
    }
    fn forward(&self, tokens: burn::tensor::Tensor<B, 2, burn::tensor::Int>) -> Tensor<B, 3> {
        self.inner.forward(tokens)
    }
}

/// A failed forward pass aborts the sequences of that pass (named in the error), empties their
/// slots, keeps the waiting requests, and the engine carries on.
#[test]
fn failed_forward_aborts_its_rows_and_the_engine_recovers() {
    let model = Flaky {
        inner: successor(64),
        fail_at: 2,
        calls: Default::default(),
        draws: None,
        poison: false,
    };
    let mut g = Generator::new(model, 2, 64).unwrap();
    let p = params(0.0, 0, 1.0, 3);
    for id in 1..=3 {
        g.submit(request(id, &[0], 0, &p));
    }
    assert!(g.step(&letters).unwrap().is_empty());
    let err = g.step(&letters).unwrap_err();
    assert_eq!(
        err,
        GeneratorError::Forward {
            reason: "device lost".to_string(),
            aborted: vec![1, 2]
        }
    );
    assert_eq!(
        (g.running(), g.waiting(), g.cache().used_slots()),
        (0, 1, 0)
    );
    let mut done = Vec::new();
    while !g.is_idle() {
        done.extend(g.step(&letters).unwrap());
    }
    assert_eq!(done.len(), 1);
    assert_eq!(output(&done[0]).token_ids, [1, 2, 3]);
    assert_eq!(g.stats().aborted, 2);
    // Once again submitted, an aborted id is accepted.
    let out = g
        .generate_all(vec![request(1, &[0], 0, &p)], &letters)
        .unwrap();
    assert_eq!(output(&out[0]).token_ids, [1, 2, 3]);

    // generate_all reports the whole call as aborted and leaves the generator idle.
    let model = Flaky {
        inner: successor(64),
        fail_at: 2,
        calls: Default::default(),
        draws: None,
        poison: false,
    };
    let mut g = Generator::new(model, 2, 64).unwrap();
    let reqs = (1..=3).map(|id| request(id, &[0], 0, &p)).collect();
    let err = g.generate_all(reqs, &letters).unwrap_err();
    assert_eq!(
        err,
        GeneratorError::Forward {
            reason: "device lost".to_string(),
            aborted: vec![1, 2, 3]
        }
    );
    assert!(g.is_idle());
    assert_eq!(
        (g.running(), g.waiting(), g.cache().used_slots()),
        (0, 0, 0)
    );
}

#[test]
fn params_mirror_the_config_section() {
    let section = SamplingSection {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        max_new_tokens: 512,
        max_batch: 64,
        stop: vec!["</answer>".to_string()],
    };
    let p = SamplingParams::from_config(&section, &[151643, 151645]);
    assert_eq!(
        p,
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 40,
            max_new_tokens: 512,
            stop: vec!["</answer>".to_string()],
            eos_token_ids: vec![151643, 151645],
        }
    );
    assert_eq!(p.validate(), Ok(()));
    let bad = [
        (
            SamplingParams {
                temperature: -1.0,
                ..p.clone()
            },
            "sampling.temperature = -1: must be finite and >= 0 (0 is greedy)",
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..p.clone()
            },
            "sampling.top_p = 1.5: must be in (0, 1]",
        ),
        (
            SamplingParams {
                max_new_tokens: 0,
                ..p.clone()
            },
            "sampling.max_new_tokens = 0: a response needs at least one token",
        ),
        (
            SamplingParams {
                stop: vec!["x".to_string(), String::new()],
                ..p.clone()
            },
            "sampling.stop[1] is empty",
        ),
    ];
    for (params, message) in bad {
        assert_eq!(params.validate().unwrap_err().to_string(), message);
    }
}

#[test]
fn generator_settings_are_checked() {
    assert!(matches!(
        Generator::new(successor(64), 0, 8),
        Err(GeneratorError::Config(_))
    ));
    assert!(matches!(
        Generator::new(successor(1), 1, 8),
        Err(GeneratorError::Config(_))
    ));
    let mut g = generator(successor(64), 1, 8);
    g.submit(request(1, &[0], 0, &params(0.0, 0, 1.0, 2)));
    assert_eq!(
        g.generate_all(Vec::new(), &letters),
        Err(GeneratorError::Busy(1))
    );
}

fn drawing(poison: bool) -> (Flaky, std::rc::Rc<std::cell::Cell<usize>>) {
    let draws = std::rc::Rc::new(std::cell::Cell::new(0));
    let model = Flaky {
        inner: successor(64),
        fail_at: usize::MAX,
        calls: Default::default(),
        draws: Some(draws.clone()),
        poison,
    };
    (model, draws)
}

/// Greedy and unfiltered rows go through the model's own draw, one call per pass, with the same
/// tokens as selecting from its logits; a batch with a filtered row goes through the logits.
#[test]
fn unfiltered_rows_are_drawn_by_the_model_and_filtered_rows_from_logits() {
    let reqs = vec![
        request(1, &[1, 2], 5, &params(1.0, 0, 1.0, 9)),
        request(2, &[3], 6, &params(0.0, 0, 1.0, 7)),
        request(3, &[4, 4, 4], 7, &params(0.7, 0, 1.0, 11)),
    ];
    let want = run(successor(64), 4, 64, reqs.clone());
    let (model, draws) = drawing(false);
    let mut g = Generator::new(model, 4, 64).unwrap();
    let got = g.generate_all(reqs, &letters).unwrap();
    assert_eq!(got, want);
    assert_eq!(draws.get() as u64, g.stats().forward_passes);

    let (model, draws) = drawing(false);
    let mut g = Generator::new(model, 4, 64).unwrap();
    let filtered = vec![
        request(1, &[1], 5, &params(1.0, 0, 1.0, 4)),
        request(2, &[2], 6, &params(1.0, 3, 1.0, 4)),
    ];
    g.generate_all(filtered, &letters).unwrap();
    assert_eq!(
        draws.get(),
        0,
        "a filtered row sends the pass through the logits"
    );
}

/// A NaN log-prob from the model's draw fails the pass as a token-selection error naming the
/// row, and aborts that pass's requests.
#[test]
fn a_bad_device_draw_is_a_selection_error() {
    let mut g = Generator::new(drawing(true).0, 2, 64).unwrap();
    let err = g
        .generate_all(
            vec![
                request(1, &[1], 5, &params(1.0, 0, 1.0, 4)),
                request(2, &[2], 6, &params(1.0, 0, 1.0, 4)),
            ],
            &letters,
        )
        .unwrap_err();
    match err {
        GeneratorError::Select {
            source: SelectError::NonFinite { row: 0, logprob },
            mut aborted,
        } => {
            assert!(logprob.is_nan());
            aborted.sort();
            assert_eq!(aborted, [1, 2]);
        }
        other => panic!("{other:?}"),
    }
    assert!(g.is_idle());
}
