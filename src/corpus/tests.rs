//! The corpus builder against a recording test environment: which tasks it asks about, the
//! format of every response, the second-turn prompts, determinism. The real CPU backend runs in
//! `actors/tests/sft.rs`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::*;
use crate::candidate::Limits;
use crate::env::Compiled;

/// Admits candidates with the real rules and plan validation; then a misspelled built-in is a
/// compile error, a removed barrier or bounds check is a wrong result, anything else is correct.
struct TestEnv {
    suite: Arc<TaskSuite>,
    asked: Mutex<Vec<String>>,
}

impl KernelEnv for TestEnv {
    fn describe(&self) -> String {
        "test environment".into()
    }
    fn compile(&self, task: &str, source: &str) -> Result<Compiled, Outcome> {
        self.asked.lock().unwrap().push(task.to_string());
        crate::env::admit_named(&self.suite, task, Preset::Small, &Limits::default(), source)?;
        if source.contains("threadIndx") {
            return Err(Outcome::CompileError {
                log: "kernel.cu:3: error: 'threadIndx' was not declared in this scope".into(),
            });
        }
        Ok(Compiled {
            task: task.into(),
            artifact: Arc::new(source.to_string()),
            compile_ms: 0.0,
        })
    }
    fn verify(&self, compiled: &Compiled) -> Result<(), Outcome> {
        let src = compiled.artifact.downcast_ref::<String>().unwrap();
        if src.contains(" + 1] = ") {
            return Err(Outcome::Wrong {
                reason: "values differ".into(),
                mismatch: None,
            });
        }
        Ok(())
    }
    fn profile(&self, _: &Compiled) -> Outcome {
        panic!("the corpus builder never times")
    }
}

fn suite() -> Arc<TaskSuite> {
    Arc::new(TaskSuite::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks")).unwrap())
}

fn options(only: &[&str]) -> CorpusOptions {
    CorpusOptions {
        preset: Preset::Small,
        seed: 1,
        prompt_budget_chars: 24_000,
        parallel: 2,
        only: only.iter().map(|s| s.to_string()).collect(),
        breakages_per_task: None,
        chains_per_task: 0,
        chain_max_turns: 6,
    }
}

fn build_with(only: &[&str]) -> (Corpus, Vec<String>) {
    build_opts(&options(only))
}

fn build_opts(opts: &CorpusOptions) -> (Corpus, Vec<String>) {
    let suite = suite();
    let env = TestEnv {
        suite: suite.clone(),
        asked: Mutex::new(Vec::new()),
    };
    let corpus = build(&suite, &env, opts, &|_| {}).unwrap();
    // The evaluations run in parallel, so their order is not the corpus's: sorted, the tasks
    // asked compare as a multiset.
    let mut asked = env.asked.into_inner().unwrap();
    asked.sort();
    (corpus, asked)
}

#[test]
fn held_out_tasks_never_appear() {
    let suite = suite();
    let (corpus, asked) = build_with(&[]);
    let held_out: Vec<&str> = suite
        .split(Split::Heldout)
        .map(|t| t.name.as_str())
        .collect();
    assert!(!held_out.is_empty());
    for name in &held_out {
        assert!(!asked.iter().any(|a| a == name), "{name} was evaluated");
        assert!(
            !corpus.examples.iter().any(|e| e.task == *name),
            "{name} is in the corpus"
        );
        // Not even inside a prompt.
        let header = format!("# Task: {name} (");
        assert!(!corpus
            .examples
            .iter()
            .any(|e| e.turns.iter().any(|t| t.prompt.contains(&header))));
    }
    let train = suite.split(Split::Train).count();
    assert_eq!(
        corpus.stats.tasks, train,
        "every train task has examples; dropped: {:?}",
        corpus.stats.dropped_variants
    );
    let err = build(
        &suite,
        &TestEnv {
            suite: suite.clone(),
            asked: Mutex::new(Vec::new()),
        },
        &options(&[held_out[0]]),
        &|_| {},
    )
    .unwrap_err();
    assert!(
        matches!(err, CorpusError::HeldOut(ref n) if n == held_out[0]),
        "{err}"
    );
}

#[test]
fn every_response_is_a_valid_candidate() {
    let suite = suite();
    let (corpus, _) = build_with(&[]);
    for e in &corpus.examples {
        let task = suite.get(&e.task).unwrap();
        assert_eq!(e.outcomes.len(), e.turns.len());
        assert_eq!(e.outcomes.last().unwrap(), "correct");
        let last = &e.turns.last().unwrap().response;
        let cand = crate::candidate::parse_response(last)
            .unwrap_or_else(|err| panic!("{} {}: {err}\n{last}", e.task, e.form));
        assert!(!cand.summary.is_empty());
        crate::env::admit(task, Preset::Small, &Limits::default(), &cand.source)
            .unwrap_or_else(|o| panic!("{} {}: {}", e.task, e.form, o.feedback()));
        assert_eq!(
            e.turns[0].prompt,
            prompt::first_turn(task, Preset::Small).unwrap()
        );
    }
    let kinds = &corpus.stats.by_kind;
    assert!(kinds["first_turn"] >= 40, "{kinds:?}");
    assert!(kinds["variant"] > kinds["first_turn"], "{kinds:?}");
    assert!(kinds["repair"] > kinds["first_turn"], "{kinds:?}");
}

#[test]
fn repairs_quote_the_real_feedback_in_the_second_prompt() {
    let (corpus, _) = build_with(&["relu", "matmul"]);
    let repairs: Vec<&Example> = corpus
        .examples
        .iter()
        .filter(|e| e.kind == Kind::Repair)
        .collect();
    assert!(!repairs.is_empty());
    let mut kinds = std::collections::BTreeSet::new();
    for e in repairs {
        assert_eq!(e.turns.len(), 2);
        assert_ne!(e.outcomes[0], "correct");
        let b = Breakage::ALL
            .into_iter()
            .find(|b| e.form.ends_with(&format!("+{}", b.name())))
            .unwrap();
        assert!(b.expected().contains(&e.outcomes[0].as_str()), "{}", e.form);
        kinds.insert(e.outcomes[0].clone());
        let second = &e.turns[1].prompt;
        assert!(second.starts_with(&e.turns[0].prompt), "{}", e.form);
        assert!(second.contains("## Earlier attempts\n### Turn 1\nKernel:\n```cuda\n"));
        let broken = crate::candidate::parse_response(&e.turns[0].response).unwrap();
        assert!(second.contains(broken.source.trim_end()), "{}", e.form);
        let feedback_line = second
            .lines()
            .find(|l| l.starts_with("Feedback: "))
            .unwrap();
        assert!(
            e.turns[1]
                .response
                .contains(feedback_line.trim_start_matches("Feedback: ").trim()),
            "the fix quotes the feedback: {}",
            e.form
        );
        // The earlier reasoning is not in the history (the paper's context rule).
        assert!(!second.contains("Approach:") || e.turns[0].prompt.contains("Approach:"));
    }
    for want in ["compile_error", "launch_error", "wrong"] {
        assert!(kinds.contains(want), "{want} missing from {kinds:?}");
    }
}

#[test]
fn breakages_per_task_caps_each_tasks_evaluations_and_keeps_every_answer() {
    let only = ["softmax", "gemm_bias_relu", "sum_reduce"];
    let (all, asked_all) = build_with(&only);
    let capped_opts = CorpusOptions {
        breakages_per_task: Some(2),
        ..options(&only)
    };
    let (capped, asked) = build_opts(&capped_opts);
    let count = |asked: &[String], t: &str| asked.iter().filter(|a| *a == t).count();
    let variants = |c: &Corpus| {
        let mut v: Vec<_> = c
            .examples
            .iter()
            .filter(|e| matches!(e.kind, Kind::FirstTurn | Kind::Variant))
            .map(|e| (e.task.clone(), e.form.clone()))
            .collect();
        v.sort();
        v
    };
    // Every answer is still evaluated and kept; per task, two breakages at most are added.
    assert_eq!(variants(&capped), variants(&all));
    for t in only {
        let answers = variants(&all).iter().filter(|(task, _)| task == t).count();
        assert!(
            count(&asked_all, t) > answers + 2,
            "{t}: too few breakages to cap"
        );
        assert_eq!(count(&asked, t), answers + 2, "{t}");
    }
    let repairs = capped
        .examples
        .iter()
        .filter(|e| e.kind == Kind::Repair)
        .count();
    assert!(repairs > 0 && repairs <= 2 * only.len(), "{repairs}");
    // The draw depends on the seed only.
    assert_eq!(build_opts(&capped_opts).0.examples, capped.examples);
}

#[test]
fn same_seed_same_corpus() {
    let (a, _) = build_with(&["softmax", "gemm_bias_relu", "sum_reduce"]);
    let (b, _) = build_with(&["softmax", "gemm_bias_relu", "sum_reduce"]);
    assert_eq!(a.examples, b.examples);
    let dir = std::env::temp_dir().join(format!("kevin-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.jsonl");
    write_jsonl(&path, &a.examples).unwrap();
    assert_eq!(read_jsonl(&path).unwrap(), a.examples);
    let line = std::fs::read_to_string(&path).unwrap();
    let first: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    for key in ["task", "kind", "form", "turns", "outcomes"] {
        assert!(first.get(key).is_some(), "{key}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn naive_forms_cover_the_common_shapes() {
    let suite = suite();
    let check = |task: &str, forms: &[&str]| {
        let got: Vec<String> = naive::generate(suite.get(task).unwrap())
            .into_iter()
            .map(|g| g.form)
            .collect();
        assert_eq!(got, forms, "{task}");
    };
    check(
        "relu",
        &[
            "elementwise_b256",
            "elementwise_b128",
            "elementwise_grid_stride",
        ],
    );
    check(
        "gemm_bias_relu",
        &[
            "matmul_naive_16x16",
            "matmul_naive_32x8",
            "matmul_tiled16",
            "matmul_reg64x64",
        ],
    );
    check("matvec", &["matvec_naive"]);
    check(
        "relu_sum_rows",
        &[
            "reduce_thread_per_output",
            "reduce_block_b256",
            "reduce_block_b128",
            "reduce_warp",
        ],
    );
    check("sum_reduce", &["reduce_thread_per_output"]);
    check("argmax_dim1", &["reduce_thread_per_output"]);
    check(
        "layernorm_gelu",
        &[
            "rowwise_thread_per_row",
            "rowwise_block_b256",
            "rowwise_warp",
        ],
    );
    check("exclusive_cumsum", &["rowwise_thread_per_row"]);
    check("transpose", &["transpose_naive"]);
    // Half precision: loads converted to float, the store rounded back.
    check(
        "gelu_f16",
        &[
            "elementwise_b256",
            "elementwise_b128",
            "elementwise_grid_stride",
        ],
    );
    // Kernels are named by their role, never by the task: a policy must be able to name them
    // for a task it has not seen (generated tasks are named by a hash).
    for task in suite.tasks() {
        for g in naive::generate(task) {
            let launches: Vec<&str> = g
                .source
                .lines()
                .filter_map(|l| l.strip_prefix("// kevin: launch "))
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            assert!(!launches.is_empty(), "{} {}", task.name, g.form);
            for name in launches {
                assert!(
                    name.ends_with("_kernel") && !name.contains(&task.name),
                    "{} {}: {name}",
                    task.name,
                    g.form
                );
                assert!(
                    g.source.contains(&format!(" {name}(")),
                    "{name} is not defined"
                );
            }
        }
    }
    let half = &naive::generate(suite.get("gelu_f16").unwrap())[0].source;
    assert!(half.starts_with("#include <cuda_fp16.h>\n"), "{half}");
    assert!(
        half.contains("__float2half_rn(") && half.contains("__half2float(X[i])"),
        "{half}"
    );
    // Two core operations: a kernel per stage.
    check(
        "attention_scores_softmax",
        &[
            "staged_transpose_elementwise+bmm_naive+rowwise_thread_per_row",
            "staged_transpose_elementwise+bmm_naive+rowwise_warp",
        ],
    );
    // Outside the generator's shapes (two outputs; a product of elements was, until
    // `products_of_elements_reduce_like_sums`): no kernel rather than a doubtful one.
    assert!(naive::generate(&program_task(
        "input X: f32[M, N]\noutput Y: f32[M, N]\noutput Z: f32[M, N]\nY = relu(X)\nZ = Y * 2.0\n"
    ))
    .is_empty());
}

#[test]
fn staged_forms_cut_programs_at_their_core_operations() {
    let staged = |program: &str| naive::generate(&program_task(program));
    let forms =
        |program: &str| -> Vec<String> { staged(program).into_iter().map(|g| g.form).collect() };
    // A product, then a row operation on it: the product's epilogue fused into its stage.
    let mm_row = "input A: f32[M, K]\ninput W: f32[K, N]\ninput b: f32[N]\noutput Y: f32[M, N]\n\
                  Y = gelu(softmax(gelu(A @ W + b)))\n";
    assert_eq!(
        forms(mm_row),
        [
            "staged_matmul_naive_16x16+rowwise_thread_per_row",
            "staged_matmul_reg64x64+rowwise_warp"
        ]
    );
    let g = &staged(mm_row)[0];
    assert!(
        g.source
            .starts_with("// kevin: scratch tmp0 f32[M*N]\n// kevin: launch stage1_naive_kernel "),
        "{}",
        g.source
    );
    assert!(
        g.source.contains("\n// kevin: launch stage2_naive_kernel "),
        "{}",
        g.source
    );
    // One helper, defined once, used by both stages.
    assert_eq!(
        g.source.matches("float gelu_f(float x)").count(),
        1,
        "{}",
        g.source
    );
    for k in ["stage1_naive_kernel", "stage2_naive_kernel"] {
        assert_eq!(
            g.source.matches(&format!("void {k}(")).count(),
            1,
            "{}",
            g.source
        );
    }
    // Every kernel takes the scratch buffer, and the first writes it as f32.
    assert_eq!(
        g.source.matches("float* __restrict__ tmp0").count(),
        2,
        "{}",
        g.source
    );
    assert!(g.source.contains("tmp0[i] = "), "{}", g.source);
    // A row operation, then a product of its result: the product reads the buffer.
    assert_eq!(
        forms("input X: bf16[M, K]\ninput W: bf16[K, N]\noutput Y: bf16[M, N]\nY = log_softmax(X) @ W\n"),
        [
            "staged_rowwise_thread_per_row+matmul_naive_16x16",
            "staged_rowwise_warp+matmul_reg64x64"
        ]
    );
    // A reduction of a product; elementwise work on a product's operand.
    assert_eq!(
        forms("input A: f32[M, K]\ninput W: f32[K, N]\noutput Y: f32[M]\nY = sum(relu(A @ W), axis=1)\n"),
        [
            "staged_matmul_naive_16x16+reduce_thread_per_output",
            "staged_matmul_reg64x64+reduce_warp"
        ]
    );
    assert_eq!(
        forms(
            "input A: f32[M, K]\ninput W: f32[K, N]\noutput Y: f32[M, N]\nY = relu(A * 2.0) @ W\n"
        ),
        [
            "staged_elementwise_b256+matmul_naive_16x16",
            "staged_elementwise_grid_stride+matmul_reg64x64"
        ]
    );
    // A reduction broadcast back over its operand: the reduction is a stage of its own (the
    // reduction writer alone would write one value per row into a full-size output).
    assert_eq!(
        forms(
            "input X: f32[M, N]\noutput Y: f32[M, N]\nY = X / mean(abs(X), axis=1, keepdim=true)\n"
        ),
        [
            "staged_reduce_thread_per_output+elementwise_b256",
            "staged_reduce_warp+elementwise_grid_stride"
        ]
    );
    // A reduction over an inner axis broadcast back: read at the coordinates it has.
    let rms = staged(
        "input X: f32[B, C, N]\noutput Y: f32[B, C, N]\nY = X / sqrt(mean(square(X), axis=1, keepdim=true) + 1e-5)\n",
    );
    assert_eq!(rms.len(), 2);
    assert!(
        rms[0]
            .source
            .contains("tmp0[((i / ((long long)C * N))) * N + (i % N)]"),
        "{}",
        rms[0].source
    );
    // Program names that the kernel's own identifiers would shadow (sizes `m` and `k`, a
    // tensor `acc`) are renamed in the kernel; the launch lines keep the task's names.
    let named =
        staged("input acc: f32[m, k]\ninput W: f32[k, N]\noutput Y: f32[m, N]\nY = acc @ W\n");
    assert_eq!(named.len(), 4);
    for g in &named {
        assert!(
            g.source.contains(" args=(acc, W, Y, m, k, N)\n")
                && g.source.contains("const float* __restrict__ acc_, ")
                && g.source.contains("int m_, int k_, int N)"),
            "{}",
            g.source
        );
        assert!(g.reasoning.contains("acc [m, k]"), "{}", g.reasoning);
    }
    // Two warp forms in one unit: the shuffle reduction both use is defined once.
    let warps = &staged("input X: f32[M, N]\noutput Y: f32[M]\nY = max(softmax(X), axis=1)\n")[1];
    assert_eq!(warps.form, "staged_rowwise_warp+reduce_warp");
    assert_eq!(
        warps
            .source
            .matches("float kevin_warp_max(float v)")
            .count(),
        1,
        "{}",
        warps.source
    );
}

/// A train task of `program` with sizes 37, 39, ... (small) for its symbols.
fn program_task(program: &str) -> crate::tasks::Task {
    let p = crate::ops::Program::parse(program).expect("program");
    let mut sizes = String::new();
    for preset in ["gpu", "small"] {
        sizes.push_str(&format!("\n[sizes.{preset}]\n"));
        for (i, s) in p.size_symbols().iter().enumerate() {
            sizes.push_str(&format!("{s} = {}\n", 37 + 2 * i));
        }
    }
    let text = format!(
        "name = \"t\"\nlevel = 2\nsplit = \"train\"\ndescription = \"t\"\n\
         program = \"\"\"\n{program}\"\"\"\n{sizes}"
    );
    crate::tasks::parse_task(std::path::Path::new("t.toml"), &text).expect("task")
}

#[test]
fn naive_forms_cover_generated_shapes() {
    let forms = |program: &str| -> Vec<String> {
        naive::generate(&program_task(program))
            .into_iter()
            .map(|g| g.form)
            .collect()
    };
    // Elementwise work after a reduction, keepdim, and a bf16 output.
    assert_eq!(
        forms("input X: bf16[M, N]\noutput Y: bf16[M, 1]\nY = softplus(max(X, axis=1, keepdim=true)) * 2.0\n"),
        ["reduce_thread_per_output", "reduce_block_b256", "reduce_block_b128", "reduce_warp"]
    );
    // A per-row operand.
    assert_eq!(
        forms("input X: f16[M, N]\ninput rw: f16[M, 1]\noutput Y: f16[M, N]\nY = X * rw\n"),
        [
            "elementwise_b256",
            "elementwise_b128",
            "elementwise_grid_stride"
        ]
    );
    // A row operation along an inner axis of a 3-D tensor.
    let along = naive::generate(&program_task(
        "input X: f32[B, M, N]\noutput Y: f32[B, M, N]\nY = softmax(X, axis=1)\n",
    ));
    assert_eq!(along.len(), 1);
    assert!(
        along[0]
            .source
            .contains("long long idx = base + (long long)j * N;"),
        "{}",
        along[0].source
    );
    // Lanes of a leading axis: products divide as a whole (`o / (M*N)`, not `o / M*N`).
    let lead = naive::generate(&program_task(
        "input X: f32[B, M, N]\noutput Y: f32[M, N]\nY = sum(X, axis=0)\n",
    ));
    assert!(
        lead[0].source.contains("o / (M*N), in = o % (M*N)"),
        "{}",
        lead[0].source
    );
    let scan = naive::generate(&program_task(
        "input X: f32[B, M, N]\noutput Y: f32[B, M, N]\nY = cumsum(X, axis=0)\n",
    ));
    assert!(
        scan[0]
            .source
            .contains("(row / (M*N)) * B * M*N + row % (M*N)"),
        "{}",
        scan[0].source
    );
    // Elementwise work on both sides of a transpose.
    let tr = naive::generate(&program_task(
        "input X: f32[M, N]\ninput b: f32[M]\noutput Y: f32[N, M]\nY = relu(transpose(X * 2.0) + b)\n",
    ));
    assert_eq!(tr.len(), 1);
    assert_eq!(tr[0].form, "transpose_elementwise");
    assert!(
        tr[0].source.contains("long long src = (c1) * N + c0;"),
        "{}",
        tr[0].source
    );
    // Batched matrix products, with a weight per batch or one shared.
    for w in ["W: f32[B, K, N]", "W: f32[K, N]"] {
        let program = format!(
            "input A: f32[B, M, K]\ninput {w}\ninput b: f32[N]\noutput Y: f32[B, M, N]\nY = relu(A @ W + b)\n"
        );
        let forms: Vec<String> = naive::generate(&program_task(&program))
            .into_iter()
            .map(|g| g.form)
            .collect();
        assert_eq!(forms, ["bmm_naive"], "{w}");
    }
    // Helpers before and after a row operation share one namespace: two ELUs, two names.
    let two = &naive::generate(&program_task(
        "input X: f32[M, N]\noutput Y: f32[M, N]\nY = elu(softmax(elu(X)), alpha=0.5)\n",
    ))[0]
        .source;
    assert_eq!(two.matches("float elu_f(float x)").count(), 1, "{two}");
    assert_eq!(two.matches("float elu_f1(float x)").count(), 1, "{two}");
    // Callees before callers: mish calls softplus.
    let mish = &naive::generate(&program_task(
        "input X: f32[M, N]\noutput Y: f32[M, N]\nY = mish(X)\n",
    ))[0]
        .source;
    assert!(
        mish.find("softplus_f(float x)") < mish.find("mish_f(float x)"),
        "{mish}"
    );
    // No INFINITY (NVRTC does not define it).
    let mx = &naive::generate(&program_task(
        "input X: f32[M, N]\noutput Y: f32[M]\nY = max(X, axis=1)\n",
    ))[0]
        .source;
    assert!(
        !mx.contains("INFINITY") && mx.contains("__int_as_float(0x7f800000)"),
        "{mx}"
    );
}

#[test]
fn chains_replay_real_failed_attempts_then_the_fix_and_add_no_evaluation() {
    let only = ["softmax", "gemm_bias_relu", "sum_reduce"];
    let (plain, asked_plain) = build_with(&only);
    let opts = CorpusOptions {
        chains_per_task: 3,
        chain_max_turns: 5,
        ..options(&only)
    };
    let (with, asked) = build_opts(&opts);
    assert_eq!(asked, asked_plain, "chains evaluate nothing new");
    let chains: Vec<&Example> = with
        .examples
        .iter()
        .filter(|e| e.kind == Kind::Chain)
        .collect();
    assert_eq!(with.examples.len(), plain.examples.len() + chains.len());
    assert_eq!(
        chains.len(),
        3 * only.len(),
        "every task has enough failed attempts"
    );
    let mut cut = 0;
    let mut longest = 0;
    for e in &chains {
        let n = e.turns.len();
        assert!((3..=5).contains(&n), "{} turns", n);
        assert_eq!(e.outcomes.len(), n);
        assert_eq!(e.outcomes[n - 1], "correct");
        assert!(e.form.starts_with(&format!("chain{n}:")), "{}", e.form);
        longest = longest.max(n);
        for (t, turn) in e.turns.iter().enumerate() {
            // Every prompt is the rollout's: the statement, then every earlier turn in order.
            assert!(turn.prompt.starts_with(&e.turns[0].prompt));
            for k in 1..=t {
                assert!(
                    turn.prompt.contains(&format!("### Turn {k}\n")),
                    "turn {k} in prompt {t}"
                );
            }
            assert!(!turn.prompt.contains(&format!("### Turn {}\n", t + 1)));
            if t + 1 < n {
                assert_ne!(e.outcomes[t], "correct");
                // The recorded outcome is what the format check says of a response that has no
                // kernel, and a kernel's failure otherwise.
                let parsed = crate::turn::parse_response(&turn.response);
                assert_eq!(
                    parsed.is_err(),
                    e.outcomes[t] == "format_error",
                    "{}",
                    e.outcomes[t]
                );
                if parsed.is_err() {
                    cut += 1;
                    assert!(e.turns[t + 1].prompt.contains("(no kernel)"));
                }
            }
        }
        // The fix is a kernel the corpus verified for this task, explained against the last
        // failure's feedback.
        let (source, _) =
            crate::turn::parse_response(&e.turns[n - 1].response).expect("fix parses");
        assert!(with.examples.iter().any(|v| v.task == e.task
            && v.kind != Kind::Chain
            && v.turns.last().unwrap().response.contains(source.trim_end())));
        assert!(e.turns[n - 1]
            .response
            .starts_with("The previous attempt failed: "));
    }
    assert!(cut > 0, "no chain shows a cut-off response");
    assert!(longest >= 4, "chains never grow past three turns");
    // Chains depend on the seed only.
    assert_eq!(build_opts(&opts).0.examples, with.examples);
}

/// Every identifier in the kernels of `source` that is not one of the task's names (nor one
/// renamed, `k_` for `k`, `v0_nan_` for `NAN`), a scratch buffer (named apart from the task's
/// names) or in a helper
/// function (whose parameters no task name reaches).
fn writer_identifiers(task: &crate::tasks::Task, source: &str) -> BTreeSet<String> {
    let p = &task.program;
    let names: BTreeSet<String> = p
        .inputs
        .iter()
        .chain(&p.outputs)
        .map(|d| d.name.clone())
        .chain(p.size_symbols())
        .collect();
    // A renamed name: `k_` for `k`, or `v0_nan_` for `NAN`.
    let renamed = |w: &str| {
        w.strip_prefix('v')
            .and_then(|r| r.split_once('_'))
            .is_some_and(|(k, r)| k.parse::<u32>().is_ok() && r.ends_with('_'))
    };
    let ours = |w: &str| {
        names.contains(w)
            || names.contains(w.trim_end_matches('_'))
            || renamed(w)
            || w.strip_prefix("tmp")
                .is_some_and(|d| d.parse::<u32>().is_ok())
    };
    let mut out = BTreeSet::new();
    let mut in_helper = false;
    for line in source.lines().filter(|l| !l.starts_with("#include")) {
        if line.starts_with("__device__") {
            in_helper = !line.ends_with('}');
            continue;
        }
        if in_helper {
            in_helper = line != "}";
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut word = String::new();
        let mut member = false;
        for c in code.chars().chain(std::iter::once(' ')) {
            if c.is_alphanumeric() || c == '_' {
                word.push(c);
                continue;
            }
            let number = word.starts_with(|c: char| c.is_ascii_digit());
            if !word.is_empty() && !number && !member && !ours(&word) {
                out.insert(word.clone());
            }
            word.clear();
            member = c == '.';
        }
    }
    out
}

#[test]
fn no_task_name_can_clash_with_the_writers_identifiers() {
    // Every identifier the writer puts in a kernel beside the task's names is one that
    // `free_name` refuses, so a task with that name is renamed in the kernel, not shadowed.
    let suite = suite();
    let mut programs: Vec<crate::tasks::Task> = suite.tasks().to_vec();
    for p in NEW_CONSTRUCTS
        .iter()
        .chain(&HEADER_NAMES)
        .chain(&PRODUCT_OPERANDS)
    {
        programs.push(program_task(p));
    }
    for task in &programs {
        for g in naive::generate(task) {
            for w in writer_identifiers(task, &g.source) {
                assert!(
                    !naive::free_name(&w),
                    "{} {}: `{w}` is free",
                    task.name,
                    g.form
                );
            }
        }
    }
}

/// Programs of the constructs the writer learnt last (views, triangles, reductions over
/// several axes, products with several batch dims, names of the writer's locals), in every
/// float dtype. `actors/tests/sft.rs` verifies their kernels on the CPU backend.
const NEW_CONSTRUCTS: [&str; 10] = [
    "input A: f32[N]\ninput B: f32[N, M]\noutput Y: f32[N, M]\nY = unsqueeze(A, axis=1) * B\n",
    "input X: f16[B, N]\noutput Y: f16[B]\nY = squeeze(squeeze(sum(unsqueeze(X, axis=1), axis=2, keepdim=true), axis=2), axis=1) * 0.5\n",
    "input A: bf16[M, K]\ninput W: bf16[K, N]\ninput c: bf16[1, N]\noutput Y: bf16[M, N]\nY = relu(A @ W + squeeze(unsqueeze(c, axis=0), axis=0))\n",
    "input A: f32[N, N]\ninput B: f32[N, N]\noutput Y: f32[N, N]\nY = triu(A @ B)\n",
    "input S: f16[M, N]\ninput X: f16[B, M, N]\noutput Y: f16[B, M, N]\nY = tril(S, diagonal=-1) + triu(X, diagonal=2) * 2.0\n",
    "input X: f32[B, C, H, W]\noutput Y: f32[B, C]\nY = squeeze(squeeze(mean(mean(X, axis=3, keepdim=true), axis=2, keepdim=true), axis=3), axis=2)\n",
    "input X: bf16[B, C, H, W]\noutput Y: bf16[B, C, H, W]\nc = X - mean(mean(mean(X, axis=3, keepdim=true), axis=2, keepdim=true), axis=1, keepdim=true)\nY = c * rsqrt(mean(mean(mean(c * c, axis=3, keepdim=true), axis=2, keepdim=true), axis=1, keepdim=true) + 1e-5)\n",
    "input X: f16[B, C, N]\noutput Y: f16[B]\nY = max(max(X, axis=-1), axis=-1)\n",
    "input Q: f16[B, H, S, D]\ninput K: f16[B, H, S, D]\ninput V: f16[B, H, S, D]\noutput Y: f16[B, H, S, D]\nY = softmax(Q @ transpose(K) * 0.125, axis=-1) @ V\n",
    "input A: bf16[b, i, j, l]\ninput B: bf16[l, k]\noutput Y: bf16[b, i, j, k]\nY = A @ B\n",
];

#[test]
fn naive_forms_cover_views_triangles_multi_axis_reductions_and_batch_dims() {
    let forms = |program: &str| -> Vec<String> {
        naive::generate(&program_task(program))
            .into_iter()
            .map(|g| g.form)
            .collect()
    };
    let ew = [
        "elementwise_b256",
        "elementwise_b128",
        "elementwise_grid_stride",
    ];
    let mm = [
        "matmul_naive_16x16",
        "matmul_naive_32x8",
        "matmul_tiled16",
        "matmul_reg64x64",
    ];
    let red = [
        "reduce_thread_per_output",
        "reduce_block_b256",
        "reduce_block_b128",
        "reduce_warp",
    ];
    let expected: [&[&str]; 10] = [
        &ew,
        &red,
        &mm,
        &mm,
        &ew,
        &red,
        &[
            "staged_reduce_thread_per_output+elementwise_b256+elementwise_b256+reduce_thread_per_output+elementwise_b256",
            "staged_reduce_split+elementwise_grid_stride+elementwise_grid_stride+reduce_split+elementwise_grid_stride",
        ],
        &red,
        &[
            "staged_transpose_elementwise+bmm_naive+rowwise_thread_per_row+bmm_naive",
            "staged_transpose_elementwise+bmm_naive+rowwise_warp+bmm_naive",
        ],
        &["bmm_naive"],
    ];
    for (program, want) in NEW_CONSTRUCTS.iter().zip(expected) {
        assert_eq!(forms(program), want, "{program}");
    }
    let source = |k: usize| {
        naive::generate(&program_task(NEW_CONSTRUCTS[k]))[0]
            .source
            .clone()
    };
    // A vector made a column broadcasts along the rows.
    assert!(
        source(0).contains("Y[i] = (A[(((i / ((long long)M))))] * B[i]);"),
        "{}",
        source(0)
    );
    // A triangle keeps an element by its row and column in the matrix.
    let tri = source(4);
    assert!(
        tri.contains("(((i % N) - ((i / ((long long)N)) % M) <= -1LL) ? __half2float(S[i % ((long long)M * N)]) : 0.0f)"),
        "{tri}"
    );
    // Reductions over adjacent axes: one loop over H*W elements, the mean divided by both.
    let pool = source(5);
    assert!(
        pool.contains("r < H*W;") && pool.contains("acc / (float)(H*W)"),
        "{pool}"
    );
    // Sizes named like the writer's loop counters: renamed in the kernel, not in the launch.
    let named = source(9);
    assert!(
        named.contains(" args=(A, B, Y, b, i, j, l, k)\n")
            && named.contains("int b, int i_, int j_, int l, int k_)")
            && named.contains("for (int k = 0; k < l; ++k)"),
        "{named}"
    );
}

#[test]
fn windowed_forms_pass_computed_sizes_as_expressions() {
    let suite = suite();
    let check = |task: &crate::tasks::Task, forms: &[&str]| {
        let got = naive::generate(task);
        let names: Vec<&str> = got.iter().map(|g| g.form.as_str()).collect();
        assert_eq!(names, forms, "{}", task.source);
        got
    };
    // A strided output's extents are size parameters; the launch line passes the expressions,
    // in the launch plan's syntax (C's `/` is the floor of a non-negative numerator).
    let conv = check(suite.get("conv2d").unwrap(), &["window_thread_per_output"]);
    let src = &conv[0].source;
    assert!(
        src.contains("grid=(cdiv(N*K*((H + 1) / 2)*((W + 1) / 2),256))"),
        "{src}"
    );
    assert!(
        src.contains("args=(X, Wt, b, Y, N, C, H, W, K, ((H + 1) / 2), ((W + 1) / 2))"),
        "{src}"
    );
    assert!(src.contains("int kevin_d0, int kevin_d1)"), "{src}");
    check(
        suite.get("conv_transpose2d").unwrap(),
        &["window_thread_per_output"],
    );
    check(
        suite.get("depthwise_conv2d").unwrap(),
        &["window_thread_per_output"],
    );
    check(
        suite.get("max_pool2d").unwrap(),
        &["window_thread_per_output"],
    );
    check(
        suite.get("group_norm").unwrap(),
        &["channel_norm_thread_per_set", "channel_norm_block"],
    );
    // Convolutions (strided, dilated, grouped, transposed, 1-D to 3-D), poolings and norms over
    // channels with elementwise work on both sides, and a chain of them that needs a kernel per
    // stage, and a cumulative product (`actors/tests/sft.rs` verifies them all on the CPU
    // backend).
    let naive_dir = TaskSuite::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/naive"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(naive_dir.tasks().len() >= 14);
    for t in naive_dir.tasks() {
        let forms = naive::generate(t);
        assert!(!forms.is_empty(), "{}: no kernel", t.name);
        let staged = forms.iter().all(|f| f.form.starts_with("staged_"));
        assert_eq!(staged, t.name.starts_with("staged_"), "{}", t.name);
        for f in &forms {
            assert!(
                !f.source
                    .lines()
                    .any(|l| !l.starts_with("// kevin:") && l.contains("//")),
                "{}: {}",
                t.name,
                f.source
            );
        }
    }
}

/// Programs named with words that C++ or the headers a kernel is compiled against take: keywords
/// and alternative tokens, macros (in capitals, and the C library's and CUDA's in lower case),
/// names C++ reserves for the implementation (a leading `_`, a `__`), in every float dtype and
/// every kind of kernel. `actors/tests/sft.rs` verifies their kernels on the CPU backend.
const HEADER_NAMES: [&str; 5] = [
    "input new: f32[template, this]\ninput union: f32[this]\noutput delete: f32[template, this]\ndelete = relu(new) * union\n",
    "input NAN: f16[INFINITY, EOF]\noutput NULL: f16[INFINITY]\nNULL = sum(NAN, axis=1)\n",
    "input _x: bf16[errno, warpSize]\ninput W: bf16[warpSize, M_PI]\noutput stdout: bf16[errno, M_PI]\nstdout = _x @ W\n",
    "input xor: f32[B, a__b]\noutput compl: f32[B, a__b]\ncompl = softmax(xor, axis=-1)\n",
    "input this: f16[N, N]\ninput W: f16[N, N]\noutput EOF: f16[N, N]\nEOF = softmax(this @ W, axis=-1) @ W\n",
];

/// Products whose operands are a view or a triangle of a tensor (computed in a stage of their
/// own, as any operand that is not a tensor or a matrix's transpose).
const PRODUCT_OPERANDS: [&str; 3] = [
    "input A: f32[N, N]\ninput B: f32[N, N]\noutput Y: f32[N, N]\nY = triu(A) @ tril(B, diagonal=-1)\n",
    "input A: bf16[M, K]\ninput v: bf16[K]\noutput Y: bf16[M, 1]\nY = A @ unsqueeze(v, axis=1)\n",
    "input A: f16[B, M, K]\ninput C: f16[B, K, N]\noutput Y: f16[B, M, N]\nY = A @ triu(C)\n",
];

#[test]
fn names_that_cpp_or_the_headers_take_are_renamed_in_the_kernel() {
    for n in [
        "new",
        "this",
        "xor",
        "compl",
        "NAN",
        "EOF",
        "NULL",
        "INFINITY",
        "M_PI",
        "FLT_MAX",
        "KEVIN_CUDA_H",
        "errno",
        "stdout",
        "warpSize",
        "_x",
        "_N",
        "a__b",
        "k",
        "acc",
    ] {
        assert!(!naive::free_name(n), "{n} is free");
    }
    for n in [
        "N",
        "K",
        "W",
        "D224",
        "x1",
        "Out",
        "batch_size",
        "in_features",
        "new_",
        "v0_nan_",
    ] {
        assert!(naive::free_name(n), "{n} is not free");
    }
    // Every task gets kernels; their C never names a tensor or size as the task does (each is
    // renamed, `new_`, `v0_nan_`), while the lines the harness reads keep the task's names.
    let renamed: [&[(&str, &str)]; 5] = [
        &[
            ("new", "new_"),
            ("template", "template_"),
            ("this", "this_"),
            ("union", "union_"),
            ("delete", "delete_"),
        ],
        &[
            ("NAN", "v0_nan_"),
            ("INFINITY", "v0_infinity_"),
            ("EOF", "v0_eof_"),
            ("NULL", "v0_null_"),
        ],
        &[
            ("_x", "v0_x_"),
            ("errno", "errno_"),
            ("warpSize", "warpSize_"),
            ("M_PI", "v0_m_pi_"),
            ("stdout", "stdout_"),
        ],
        &[("xor", "xor_"), ("a__b", "v0_a_b_"), ("compl", "compl_")],
        &[("this", "this_"), ("EOF", "v0_eof_")],
    ];
    for (program, names) in HEADER_NAMES.iter().zip(renamed) {
        let task = program_task(program);
        let forms = naive::generate(&task);
        assert!(!forms.is_empty(), "{program}");
        for g in &forms {
            let (launch, code): (Vec<&str>, Vec<&str>) =
                g.source.lines().partition(|l| l.starts_with("// kevin:"));
            let words: BTreeSet<&str> = code
                .iter()
                .flat_map(|l| l.split(|c: char| !(c.is_alphanumeric() || c == '_')))
                .collect();
            for (n, c) in names {
                assert!(
                    !words.contains(n),
                    "{}: `{n}` in the kernel\n{}",
                    g.form,
                    g.source
                );
                assert!(words.contains(c), "{}: no `{c}`\n{}", g.form, g.source);
                assert!(
                    launch.iter().any(|l| l
                        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .any(|w| w == *n)),
                    "{}: `{n}` not in the launch lines\n{}",
                    g.form,
                    g.source
                );
            }
        }
    }
    // `_x_` starts with `_`: the `k_` form is not free for it, so it is `v0_x_`.
    let matmul = naive::generate(&program_task(HEADER_NAMES[2]));
    assert!(
        matmul[0]
            .source
            .contains("const __nv_bfloat16* __restrict__ v0_x_"),
        "{}",
        matmul[0].source
    );
}

#[test]
fn product_operands_that_are_views_or_triangles_are_stages_of_their_own() {
    let forms = |program: &str| -> Vec<String> {
        naive::generate(&program_task(program))
            .into_iter()
            .map(|g| g.form)
            .collect()
    };
    let expected: [&[&str]; 3] = [
        &[
            "staged_elementwise_b256+elementwise_b256+matmul_naive_16x16",
            "staged_elementwise_grid_stride+elementwise_grid_stride+matmul_reg64x64",
        ],
        &[
            "staged_elementwise_b256+matmul_naive_16x16",
            "staged_elementwise_grid_stride+matmul_reg64x64",
        ],
        &[
            "staged_elementwise_b256+bmm_naive",
            "staged_elementwise_grid_stride+bmm_naive",
        ],
    ];
    for (program, want) in PRODUCT_OPERANDS.iter().zip(expected) {
        assert_eq!(forms(program), want, "{program}");
    }
    // The triangles are computed into scratch, and the product reads the scratch.
    let tri = naive::generate(&program_task(PRODUCT_OPERANDS[0]));
    let src = &tri[0].source;
    assert!(
        src.contains("tmp0[i] = (((i % N) - ((i / ((long long)N))) >= 0LL) ? A[i] : 0.0f);")
            && src
                .contains("tmp1[i] = (((i % N) - ((i / ((long long)N))) <= -1LL) ? B[i] : 0.0f);")
            && src.contains("acc += tmp0[(long long)row * N + k] * tmp1[(long long)k * N + col];"),
        "{src}"
    );
}

#[test]
fn products_of_elements_reduce_like_sums() {
    let red = [
        "reduce_thread_per_output",
        "reduce_block_b256",
        "reduce_block_b128",
        "reduce_warp",
    ];
    for (program, len) in [
        (
            "input X: f32[B, N]\noutput Y: f32[B]\nY = prod(X, axis=1)\n",
            "N",
        ),
        (
            "input X: bf16[B, C, N]\noutput Y: bf16[B]\nY = prod(prod(X, axis=2), axis=1)\n",
            "C*N",
        ),
    ] {
        let got = naive::generate(&program_task(program));
        let forms: Vec<&str> = got.iter().map(|g| g.form.as_str()).collect();
        assert_eq!(forms, red, "{program}");
        let one = &got[0].source;
        assert!(
            one.contains("float acc = 1.0f;")
                && one.contains("acc *= val;")
                && one.contains(&format!("r < {len};")),
            "{one}"
        );
        assert!(
            got[1].source.contains("buf[t] *= buf[t + s];"),
            "{}",
            got[1].source
        );
        assert!(
            got[3]
                .source
                .contains("v *= __shfl_xor_sync(0xffffffffu, v, o);"),
            "{}",
            got[3].source
        );
    }
}
