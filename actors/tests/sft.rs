//! `kevin sft corpus` and `kevin sft tokenizer` through the real binary: the corpus of two train
//! tasks is built on the CPU backend with its worker processes (every kernel really compiled and
//! checked), a held-out task is refused, and a tokenizer trained on the corpus round-trips it.

mod common;

use kevin::corpus::{read_jsonl, Kind};

use common::{cpu_backend_available, kevin_at_root};

/// The stdout of a run that must have succeeded (else its stdout and stderr in the panic).
fn succeeded(run: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

/// `kevin sft corpus --dir DIR --out OUT --workers 2` with `extra` arguments; its stdout, after
/// checking that it succeeded and that every variant it evaluated was correct.
fn all_correct_corpus(dir: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> String {
    let mut args = vec![
        "sft",
        "corpus",
        "--dir",
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--workers",
        "2",
    ];
    args.extend_from_slice(extra);
    let stdout = succeeded(&kevin_at_root(&args));
    assert!(
        !stdout.contains("variants that were not correct"),
        "{stdout}"
    );
    stdout
}

#[test]
fn corpus_and_tokenizer_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kevin-sft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("corpus.jsonl");
    let run = kevin_at_root(&[
        "sft",
        "corpus",
        "--out",
        out.to_str().unwrap(),
        "--tasks",
        "relu,sum_reduce",
        "--workers",
        "2",
    ]);
    let stdout = succeeded(&run);
    assert!(
        stdout.contains("by kind: chain 4, first_turn 2, repair "),
        "{stdout}"
    );
    let examples = read_jsonl(&out).unwrap();
    let count = |k: Kind| examples.iter().filter(|e| e.kind == k).count();
    assert_eq!(count(Kind::FirstTurn), 2);
    assert!(count(Kind::Variant) >= 4, "{stdout}");
    assert!(count(Kind::Repair) >= 8, "{stdout}");
    assert_eq!(count(Kind::Chain), 4, "{stdout}");
    for e in &examples {
        assert!(e.task == "relu" || e.task == "sum_reduce");
        assert_eq!(e.outcomes.last().unwrap(), "correct");
        if e.kind == Kind::Repair {
            // The second prompt carries the real feedback of the real first outcome.
            let fb = e.turns[1]
                .prompt
                .lines()
                .find(|l| l.starts_with("Feedback: "))
                .unwrap();
            let first = e.outcomes[0].as_str();
            let want = match first {
                "compile_error" => "Feedback: Compilation failed:",
                "launch_error" => "Feedback: Launch failed:",
                "wrong" => "Feedback: Wrong result:",
                "crash" => "Feedback: The kernel crashed:",
                other => panic!("unexpected first outcome {other} in {}", e.form),
            };
            assert!(fb.starts_with(want), "{}: {fb}", e.form);
        }
        if e.kind == Kind::Chain {
            // The last prompt carries every earlier attempt's real feedback, in order.
            let last = &e.turns.last().unwrap().prompt;
            let feedback = last.lines().filter(|l| l.starts_with("Feedback: ")).count();
            assert_eq!(feedback, e.turns.len() - 1, "{}", e.form);
        }
    }

    let refused = kevin_at_root(&[
        "sft",
        "corpus",
        "--out",
        dir.join("x.jsonl").to_str().unwrap(),
        "--tasks",
        "tanh",
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("task `tanh` is held out"));

    let tok_dir = dir.join("tok");
    let run = kevin_at_root(&[
        "sft",
        "tokenizer",
        "--corpus",
        out.to_str().unwrap(),
        "--vocab-size",
        "600",
        "--out",
        tok_dir.to_str().unwrap(),
    ]);
    let stdout = succeeded(&run);
    assert!(stdout.contains("bytes/token"), "{stdout}");
    let tok =
        kevin_policy::tokenizer::Tokenizer::from_file(tok_dir.join("tokenizer.json")).unwrap();
    // At most what was asked (a small corpus runs out of pairs), and more than the bytes.
    assert!(
        (260..=600).contains(&tok.vocab_size()),
        "{}",
        tok.vocab_size()
    );
    for e in &examples {
        for t in &e.turns {
            let text = kevin_policy::chat::training_text(None, &t.prompt, &t.response);
            assert_eq!(tok.decode(&tok.encode(&text).unwrap()).unwrap(), text);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kevin tasks generate` into a fresh folder, then `kevin sft corpus` over it on the CPU
/// backend: every generated task of the elementwise, reduction, row and transpose families gets
/// naive kernels that really compile and verify, in every dtype drawn.
#[test]
fn generated_tasks_feed_the_corpus_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kevin-gen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tasks = dir.join("tasks");
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "tasks",
            "generate",
            "--count",
            "8",
            "--seed",
            "4",
            "--max-ops",
            "3",
            "--out",
            tasks.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        kevin_at_root(&args)
    };
    let run = generate(&["--families", "elementwise,reduce,row,transpose"]);
    let stdout = succeeded(&run);
    assert!(stdout.contains("wrote 8 tasks"), "{stdout}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tasks.join("generated.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["stats"]["accepted"], 8);
    let names: Vec<String> = manifest["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 8);

    // A second generation into the same folder is refused before any work; so is a family
    // that does not exist.
    let again = generate(&[]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds 8 task files"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let none = kevin_at_root(&["tasks", "generate", "--count", "0", "--out", "unused"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("--count"));
    let bad = generate(&["--families", "pooling"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no family `pooling` (families: elementwise"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // `kevin sft corpus` over a folder of tasks into `out`: its output, once no variant was
    // incorrect.
    let corpus = |tasks: &str, out: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "sft",
            "corpus",
            "--dir",
            tasks,
            "--out",
            out.to_str().unwrap(),
            "--workers",
            "2",
        ];
        args.extend_from_slice(extra);
        let run = kevin_at_root(&args);
        let stdout = succeeded(&run);
        assert!(
            !stdout.contains("variants that were not correct"),
            "{stdout}"
        );
        stdout
    };
    let out = dir.join("corpus.jsonl");
    let stdout = corpus(tasks.to_str().unwrap(), &out, &[]);
    let examples = read_jsonl(&out).unwrap();
    let covered: std::collections::BTreeSet<&str> =
        examples.iter().map(|e| e.task.as_str()).collect();
    assert_eq!(covered.len(), 8, "{covered:?}\n{stdout}");
    let half = names.iter().any(|n| {
        let text = std::fs::read_to_string(tasks.join(format!("{n}.toml"))).unwrap();
        text.contains(": f16[") || text.contains(": bf16[")
    });
    assert!(half, "seed 4 draws a half-precision task");
    for e in &examples {
        assert!(names.contains(&e.task));
        assert_eq!(e.outcomes.last().unwrap(), "correct");
    }

    // Row operations only: the block-per-row form (block-wide tree reductions) and the
    // warp-per-row form compile and verify next to the thread-per-row one. The suite path
    // joins the hand-written suite and the generated folder (the workers load both), with one
    // breakage per task.
    let rows = dir.join("rows");
    let run = kevin_at_root(&[
        "tasks",
        "generate",
        "--count",
        "3",
        "--seed",
        "7",
        "--max-ops",
        "2",
        "--families",
        "row",
        "--out",
        rows.to_str().unwrap(),
    ]);
    succeeded(&run);
    let out = dir.join("rows.jsonl");
    let row_names: Vec<String> = std::fs::read_dir(&rows)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".toml").map(str::to_string)
        })
        .collect();
    assert_eq!(row_names.len(), 3, "{row_names:?}");
    let only = format!("{},relu", row_names.join(","));
    let joined = format!("tasks:{}", rows.display());
    let json = dir.join("rows.json");
    let stdout = corpus(
        &joined,
        &out,
        &[
            "--tasks",
            &only,
            "--breakages-per-task",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let examples = read_jsonl(&out).unwrap();
    let covered: std::collections::BTreeSet<&str> =
        examples.iter().map(|e| e.task.as_str()).collect();
    assert_eq!(covered.len(), 4, "{covered:?}\n{stdout}");
    assert!(covered.contains("relu"), "{covered:?}");
    for t in &covered {
        let repairs = examples
            .iter()
            .filter(|e| e.task == *t && e.kind == Kind::Repair);
        assert!(
            repairs.count() <= 1,
            "{t}: more repairs than --breakages-per-task 1"
        );
    }
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(record["breakages_per_task"], 1);
    let generated = record["generated"].as_array().unwrap();
    assert_eq!(generated.len(), 1, "{record}");
    assert_eq!(generated[0]["seed"], 7);
    let forms: std::collections::BTreeSet<String> = examples.into_iter().map(|e| e.form).collect();
    assert!(
        forms.iter().any(|f| f.starts_with("naive:rowwise_block_b")),
        "{forms:?}\n{stdout}"
    );
    // And the warp-per-row form (shuffle reductions), where the row is along the last axis.
    assert!(
        forms.iter().any(|f| f == "naive:rowwise_warp"),
        "{forms:?}\n{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A task file of `program` with small sizes off multiples of 32.
fn task_file(dir: &std::path::Path, name: &str, program: &str, small: &[(&str, u32)]) {
    let sizes = |f: &dyn Fn(u32) -> u32| -> String {
        small
            .iter()
            .map(|(s, v)| format!("{s} = {}\n", f(*v)))
            .collect()
    };
    let text = format!(
        "name = \"{name}\"\nlevel = 2\nsplit = \"train\"\ndescription = \"{name}\"\n\
         program = \"\"\"\n{program}\"\"\"\n\n[sizes.gpu]\n{}\n[sizes.small]\n{}",
        sizes(&|v| v * 128),
        sizes(&|v| v)
    );
    std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
}

#[test]
fn staged_kernels_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    // Programs with two or three core operations: a kernel per stage through f32 scratch,
    // every one compiled and checked by the CPU backend's workers. And one the writer cannot
    // take, which the build names.
    let dir = std::env::temp_dir().join(format!("kevin-staged-{}", std::process::id()));
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    let mkn = [("M", 37), ("K", 19), ("N", 41)];
    task_file(
        &tasks,
        "mm_softmax",
        "input A: f32[M, K]\ninput W: f32[K, N]\ninput b: f32[N]\noutput Y: f32[M, N]\nY = softmax(A @ W + b)\n",
        &mkn,
    );
    task_file(
        &tasks,
        "lsm_mm_bf16",
        "input X: bf16[M, K]\ninput W: bf16[K, N]\noutput Y: bf16[M, N]\nY = log_softmax(X) @ W\n",
        &mkn,
    );
    task_file(
        &tasks,
        "relu_mm_ln",
        "input A: f32[M, K]\ninput W: f32[K, N]\noutput Y: f32[M, N]\nY = layer_norm(relu(A) @ W)\n",
        &mkn,
    );
    task_file(
        &tasks,
        "mm_t_gelu_mean",
        "input A: f32[M, K]\ninput W: f32[N, K]\noutput Y: f32[M]\nY = mean(gelu(A @ transpose(W)), axis=1)\n",
        &mkn,
    );
    task_file(
        &tasks,
        "bqk",
        "input Q: f32[B, S, D]\ninput K: f32[B, S, D]\noutput Y: f32[B, S, S]\nY = rms_norm(Q @ transpose(K))\n",
        &[("B", 3), ("S", 37), ("D", 9)],
    );
    task_file(
        &tasks,
        "l1_rows",
        "input X: f32[M, N]\noutput Y: f32[M, N]\nY = X / mean(abs(X), axis=1, keepdim=true)\n",
        &[("M", 37), ("N", 41)],
    );
    task_file(
        &tasks,
        "rms_inner",
        "input X: f32[B, C, N]\noutput Y: f32[B, C, N]\nY = X / sqrt(mean(square(X), axis=1, keepdim=true) + 1e-5)\n",
        &[("B", 3), ("C", 37), ("N", 41)],
    );
    // Two stages, each with an ELU of its own alpha: two helpers, two names.
    task_file(
        &tasks,
        "elu_mm_elu_f16",
        "input A: f16[M, K]\ninput W: f16[N, K]\ninput c: f16[N]\noutput Y: f16[M, N]\nY = tanh(elu(elu(A) @ transpose(W), alpha=1.5)) * c\n",
        &mkn,
    );
    // Two outputs: outside the writer's shapes (a product of elements was, before it reduced
    // like a sum).
    task_file(
        &tasks,
        "two_outputs",
        "input X: f32[M, N]\noutput Y: f32[M, N]\noutput Z: f32[M, N]\nY = relu(X)\nZ = Y * 2.0\n",
        &[("M", 37), ("N", 11)],
    );
    let out = dir.join("staged.jsonl");
    let json = dir.join("staged.json");
    let stdout = all_correct_corpus(
        &tasks,
        &out,
        &[
            "--breakages-per-task",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        stdout.contains("tasks with no kernel to learn from (no reference, outside the naive writer's shapes): 1: two_outputs"),
        "{stdout}"
    );
    let examples = read_jsonl(&out).unwrap();
    for task in [
        "mm_softmax",
        "lsm_mm_bf16",
        "relu_mm_ln",
        "mm_t_gelu_mean",
        "bqk",
        "l1_rows",
        "rms_inner",
        "elu_mm_elu_f16",
    ] {
        let staged: Vec<&str> = examples
            .iter()
            .filter(|e| e.task == task && e.kind == Kind::Variant)
            .map(|e| e.form.as_str())
            .collect();
        assert!(
            !staged.is_empty() && staged.iter().all(|f| f.starts_with("naive:staged_")),
            "{task}: {staged:?}\n{stdout}"
        );
    }
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(record["unwritten"], serde_json::json!(["two_outputs"]));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The constructs the naive writer learnt last, in every float dtype: views (`unsqueeze`,
/// `squeeze`), `triu`/`tril`, reductions over several axes (one, and broadcast back),
/// products with several batch dims, and sizes named like the writer's own locals. Every form
/// of every task is compiled and checked against its fp64 reference by the CPU backend.
#[test]
fn new_constructs_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let programs: [Program; 10] = [
        ("col_scale", "input A: f32[N]\ninput B: f32[N, M]\noutput Y: f32[N, M]\nY = unsqueeze(A, axis=1) * B\n", &[("N", 37), ("M", 41)]),
        ("squeeze_sum_f16", "input X: f16[B, N]\noutput Y: f16[B]\nY = squeeze(squeeze(sum(unsqueeze(X, axis=1), axis=2, keepdim=true), axis=2), axis=1) * 0.5\n", &[("B", 37), ("N", 41)]),
        ("mm_view_bias_bf16", "input A: bf16[M, K]\ninput W: bf16[K, N]\ninput c: bf16[1, N]\noutput Y: bf16[M, N]\nY = relu(A @ W + squeeze(unsqueeze(c, axis=0), axis=0))\n", &[("M", 37), ("K", 19), ("N", 41)]),
        ("triu_mm", "input A: f32[N, N]\ninput B: f32[N, N]\noutput Y: f32[N, N]\nY = triu(A @ B)\n", &[("N", 37)]),
        ("tril_triu_f16", "input S: f16[M, N]\ninput X: f16[B, M, N]\noutput Y: f16[B, M, N]\nY = tril(S, diagonal=-1) + triu(X, diagonal=2) * 2.0\n", &[("B", 3), ("M", 37), ("N", 41)]),
        ("global_mean", "input X: f32[B, C, H, W]\noutput Y: f32[B, C]\nY = squeeze(squeeze(mean(mean(X, axis=3, keepdim=true), axis=2, keepdim=true), axis=3), axis=2)\n", &[("B", 3), ("C", 5), ("H", 7), ("W", 9)]),
        ("norm3_bf16", "input X: bf16[B, C, H, W]\noutput Y: bf16[B, C, H, W]\nc = X - mean(mean(mean(X, axis=3, keepdim=true), axis=2, keepdim=true), axis=1, keepdim=true)\nY = c * rsqrt(mean(mean(mean(c * c, axis=3, keepdim=true), axis=2, keepdim=true), axis=1, keepdim=true) + 1e-5)\n", &[("B", 3), ("C", 5), ("H", 7), ("W", 9)]),
        ("max2_f16", "input X: f16[B, C, N]\noutput Y: f16[B]\nY = max(max(X, axis=-1), axis=-1)\n", &[("B", 3), ("C", 37), ("N", 41)]),
        ("attention_f16", "input Q: f16[B, H, S, D]\ninput K: f16[B, H, S, D]\ninput V: f16[B, H, S, D]\noutput Y: f16[B, H, S, D]\nY = softmax(Q @ transpose(K) * 0.125, axis=-1) @ V\n", &[("B", 2), ("H", 3), ("S", 17), ("D", 9)]),
        ("einsum_ijk_bf16", "input A: bf16[b, i, j, l]\ninput B: bf16[l, k]\noutput Y: bf16[b, i, j, k]\nY = A @ B\n", &[("b", 2), ("i", 3), ("j", 5), ("l", 19), ("k", 7)]),
    ];
    every_program_gets_verified_kernels("newops", &programs);
}

/// Tasks named with words that C++ or the headers a kernel is compiled against take (keywords,
/// macros, names reserved for the implementation), which the naive writer renames in its
/// kernels; products whose operands are a triangle or a view of a tensor, computed in a stage
/// of their own; products of elements along one axis and several: in every float dtype, every
/// form compiled and checked against its fp64 reference by the CPU backend.
#[test]
fn header_names_product_operands_and_prod_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let programs: [Program; 10] = [
        ("cpp_keywords", "input new: f32[template, this]\ninput union: f32[this]\noutput delete: f32[template, this]\ndelete = relu(new) * union\n", &[("template", 37), ("this", 41)]),
        ("macros_f16", "input NAN: f16[INFINITY, EOF]\noutput NULL: f16[INFINITY]\nNULL = sum(NAN, axis=1)\n", &[("INFINITY", 37), ("EOF", 41)]),
        ("lower_macros_bf16", "input _x: bf16[errno, warpSize]\ninput W: bf16[warpSize, M_PI]\noutput stdout: bf16[errno, M_PI]\nstdout = _x @ W\n", &[("errno", 37), ("warpSize", 19), ("M_PI", 41)]),
        ("alt_tokens", "input xor: f32[B, a__b]\noutput compl: f32[B, a__b]\ncompl = softmax(xor, axis=-1)\n", &[("B", 37), ("a__b", 41)]),
        ("staged_names_f16", "input this: f16[N, N]\ninput W: f16[N, N]\noutput EOF: f16[N, N]\nEOF = softmax(this @ W, axis=-1) @ W\n", &[("N", 37)]),
        ("triangle_operands", "input A: f32[N, N]\ninput B: f32[N, N]\noutput Y: f32[N, N]\nY = triu(A) @ tril(B, diagonal=-1)\n", &[("N", 37)]),
        ("view_operand_bf16", "input A: bf16[M, K]\ninput v: bf16[K]\noutput Y: bf16[M, 1]\nY = A @ unsqueeze(v, axis=1)\n", &[("M", 37), ("K", 41)]),
        ("batched_triangle_f16", "input A: f16[B, M, K]\ninput C: f16[B, K, N]\noutput Y: f16[B, M, N]\nY = A @ triu(C)\n", &[("B", 3), ("M", 37), ("K", 19), ("N", 41)]),
        ("prod_rows", "input X: f32[B, N]\noutput Y: f32[B]\nY = prod(X, axis=1)\n", &[("B", 37), ("N", 41)]),
        ("prod_two_axes_bf16", "input X: bf16[B, C, H, W]\noutput Y: bf16[B, C]\nY = prod(prod(X, axis=3), axis=2) * 2.0\n", &[("B", 3), ("C", 5), ("H", 4), ("W", 6)]),
    ];
    every_program_gets_verified_kernels("names", &programs);
}

/// Flips (read at the mirrored index; around a row operation or a product, a stage of their
/// own) and reshapes (views: the same flat index), in every float dtype: every form compiled
/// and checked against its fp64 reference by the CPU backend.
#[test]
fn flips_and_reshapes_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let programs: [Program; 7] = [
        ("cumsum_reverse", "input X: f32[B, N]\noutput Y: f32[B, N]\nY = flip(cumsum(flip(X, axis=1), axis=1), axis=1)\n", &[("B", 37), ("N", 41)]),
        ("flip_bias_f16", "input X: f16[B, M, N]\ninput b: f16[N]\noutput Y: f16[B, M, N]\nY = flip(X + b, axis=1) * 2.0 + flip(b, axis=0)\n", &[("B", 3), ("M", 37), ("N", 41)]),
        ("flip_product_bf16", "input A: bf16[M, K]\ninput W: bf16[K, N]\noutput Y: bf16[M, N]\nY = relu(flip(A @ W, axis=0))\n", &[("M", 37), ("K", 19), ("N", 41)]),
        ("spatial_softmax", "input X: f32[B, C, H, W]\ninput s: f32[1, C, 1, 1]\noutput Y: f32[B, C, H, W]\nY = reshape(softmax(reshape(X, (B, C, H*W)), axis=2), (B, C, H, W)) * s\n", &[("B", 3), ("C", 5), ("H", 7), ("W", 9)]),
        ("flatten_sum_bf16", "input X: bf16[B, C, H]\noutput Y: bf16[B]\nY = sum(reshape(X, (B, C*H)), axis=1)\n", &[("B", 37), ("C", 5), ("H", 9)]),
        ("split_axis_f16", "input X: f16[B, C*H]\ninput c: f16[C, 1]\noutput Y: f16[B, C, H]\nY = reshape(X, (B, C, H)) * c\n", &[("B", 37), ("C", 5), ("H", 9)]),
        ("flattened_product", "input A: f32[M, K]\ninput W: f32[K, N]\noutput Y: f32[M*N]\nY = relu(reshape(A @ W, (M*N,)))\n", &[("M", 37), ("K", 19), ("N", 41)]),
    ];
    every_program_gets_verified_kernels("flips", &programs);
}

/// The generator's composite shapes (`--shapes composite`): a product's row operation then a
/// second product (attention, plain and batched), a softmax or l2norm of two inputs combined,
/// a reduction of a row operation's result (a cosine similarity; along another axis than the
/// row operation's), in every float dtype: every form compiled and checked against its fp64
/// reference by the CPU backend.
#[test]
fn composite_shapes_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let programs: [Program; 6] = [
        ("attention", "input Q: f32[S, D]\ninput K: f32[S, D]\ninput V: f32[S, D]\nconst scale = 0.125\noutput O: f32[S, D]\nO = softmax((Q @ transpose(K)) * scale) @ V\n", &[("S", 37), ("D", 19)]),
        ("batched_attention_bf16", "input A: bf16[B, M, K]\ninput W: bf16[B, K, N]\ninput V: bf16[B, N, P]\noutput Y: bf16[B, M, P]\nY = softmax(A @ W) @ V\n", &[("B", 3), ("M", 37), ("K", 19), ("N", 41), ("P", 23)]),
        ("norm_product_f16", "input A: f16[M, K]\ninput W: f16[N, K]\ninput b: f16[N]\ninput V: f16[N, P]\noutput Y: f16[M, P]\nT0 = rms_norm(A @ transpose(W) + b)\nY = T0 @ V\n", &[("M", 37), ("K", 19), ("N", 41), ("P", 23)]),
        ("cosine_rows", "input X: f32[B, N]\ninput Y: f32[B, N]\noutput S: f32[B]\nS = sum(l2norm(X) * l2norm(Y), axis=-1)\n", &[("B", 37), ("N", 41)]),
        ("two_softmaxes_mean_f16", "input X: f16[H, Z, D]\ninput U: f16[H, Z, D]\noutput Out: f16[Z, D]\nOut = mean(softmax(X, axis=0) * softmax(U, axis=0), axis=0)\n", &[("H", 5), ("Z", 7), ("D", 41)]),
        ("norm_then_min_bf16", "input X: bf16[M, N]\ninput g: bf16[N]\noutput Y: bf16[N]\nY = min(layer_norm(abs(X), g) - 0.5, axis=0)\n", &[("M", 37), ("N", 41)]),
    ];
    every_program_gets_verified_kernels("composite", &programs);
}

/// Gathers by i64 indices (labels drawn below the classes): a cross-entropy loss (its
/// log_softmax a stage of its own), along the last and a middle axis, in every float dtype;
/// every form compiled and checked against its fp64 reference by the CPU backend.
#[test]
fn gathers_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let programs: [(Program, &str); 4] = [
        (("cross_entropy", "input X: f32[B, 10]\ninput t: i64[B]\noutput Y: f32[]\nY = neg(mean(squeeze(gather(log_softmax(X, axis=1), unsqueeze(t, axis=1), axis=1), axis=1), axis=0))\n", &[("B", 37)]), "t"),
        (("gather_cols_f16", "input X: f16[B, 10]\ninput I: i64[B, 3]\noutput Y: f16[B, 3]\nY = gather(X, I, axis=1) * 2.0\n", &[("B", 37)]), "I"),
        (("gather_mid_bf16", "input H: bf16[B, 10, N]\ninput J: i64[B, 2, N]\noutput Y: bf16[B, 2, N]\nY = relu(gather(H, J, 1))\n", &[("B", 5), ("N", 41)]), "J"),
        (("nll_none", "input X: f32[B, 10]\ninput t: i64[B, 1]\noutput Y: f32[B]\nY = squeeze(gather(X, t, axis=1), axis=1) - 1.0\n", &[("B", 37)]), "t"),
    ];
    let dir = std::env::temp_dir().join(format!("kevin-gathers-{}", std::process::id()));
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    for ((name, program, sizes), index) in &programs {
        task_file(&tasks, name, program, sizes);
        let path = tasks.join(format!("{name}.toml"));
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!(
            "\n[inputs.{index}]\ndist = \"grid\"\nlo = 0.0\nstep = 1.0\ncount = 10\n"
        ));
        std::fs::write(&path, text).unwrap();
    }
    let (covered, stdout) = naive_kernels_verified(&tasks, &dir.join("gathers.jsonl"));
    for ((name, _, _), _) in &programs {
        assert!(
            covered.contains(*name),
            "{name} has no verified kernel\n{stdout}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reductions of few outputs over long rows at the GPU preset (a loss over a whole tensor, a
/// norm over all of it, a column minimum), which the naive writer also gives a split form: a
/// grid of blocks per row into partials, then a block per output. The small sizes make rows of
/// several 8192-element chunks, the last one partial, so the partials are combined for real;
/// every form compiled and checked against its fp64 reference by the CPU backend.
#[test]
fn split_reductions_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let programs: [Program; 4] = [
        ("mse_loss", "input P: f32[B, N]\ninput T: f32[B, N]\noutput Y: f32[]\nY = mean(mean(pow(P - T, 2.0), axis=1), axis=0)\n", &[("B", 3), ("N", 6001)]),
        ("frobenius_f16", "input X: f16[B, C, N]\noutput Y: f16[B, C, N]\nY = X / sqrt(sum(sum(sum(square(X), axis=2), axis=1), axis=0))\n", &[("B", 2), ("C", 3), ("N", 3001)]),
        ("column_min_bf16", "input X: bf16[N, D]\noutput Y: bf16[D]\nY = min(X, axis=0) + 1.0\n", &[("N", 20001), ("D", 5)]),
        ("row_mean_sigmoid", "input X: f32[B, N]\noutput Y: f32[B, 1]\nY = sigmoid(mean(X, axis=1, keepdim=true))\n", &[("B", 3), ("N", 17001)]),
    ];
    let dir = std::env::temp_dir().join(format!("kevin-split-{}", std::process::id()));
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    for (name, program, sizes) in &programs {
        task_file(&tasks, name, program, sizes);
    }
    let (covered, stdout) = naive_kernels_verified(&tasks, &dir.join("split.jsonl"));
    let split: std::collections::BTreeSet<String> = read_jsonl(&dir.join("split.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|e| e.form.contains("reduce_split"))
        .map(|e| e.task)
        .collect();
    for (name, _, _) in &programs {
        assert!(
            covered.contains(*name),
            "{name} has no verified kernel\n{stdout}"
        );
        assert!(
            split.contains(*name),
            "{name} has no verified split form\n{stdout}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A task of the op language: its name, program and sizes.
type Program<'a> = (&'a str, &'a str, &'a [(&'a str, u32)]);

/// Writes `programs` as tasks of a fresh folder and checks that the naive writer gives every one
/// of them kernels the CPU backend verifies.
fn every_program_gets_verified_kernels(tag: &str, programs: &[Program]) {
    let dir = std::env::temp_dir().join(format!("kevin-{tag}-{}", std::process::id()));
    let tasks = dir.join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    for (name, program, sizes) in programs {
        task_file(&tasks, name, program, sizes);
    }
    let (covered, stdout) = naive_kernels_verified(&tasks, &dir.join(format!("{tag}.jsonl")));
    for (name, _, _) in programs {
        assert!(
            covered.contains(*name),
            "{name} has no verified kernel\n{stdout}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kevin sft corpus` of the naive kernels alone (no breakages, no chains) over the tasks of
/// `dir` into `out`, every one of them correct and no task without a kernel: the tasks covered,
/// and the run's stdout.
fn naive_kernels_verified(
    dir: &std::path::Path,
    out: &std::path::Path,
) -> (std::collections::BTreeSet<String>, String) {
    let stdout = all_correct_corpus(
        dir,
        out,
        &["--breakages-per-task", "0", "--chains-per-task", "0"],
    );
    assert!(!stdout.contains("tasks with no kernel"), "{stdout}");
    let covered = read_jsonl(out)
        .unwrap()
        .into_iter()
        .map(|e| e.task)
        .collect();
    (covered, stdout)
}

/// The naive writer's convolutions (strided, dilated, grouped, transposed, 1-D to 3-D),
/// poolings and norms over channels, with elementwise work on both sides and a chain of them in
/// stages, and a cumulative product (`tests/data/naive`, in every float dtype): every form
/// compiled and checked against the fp64 reference by the CPU backend.
#[test]
fn windowed_kernels_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kevin-windowed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tasks = common::root().join("tests/data/naive");
    let (covered, stdout) = naive_kernels_verified(&tasks, &dir.join("windowed.jsonl"));
    let files = std::fs::read_dir(&tasks).unwrap().count();
    assert_eq!(covered.len(), files, "{stdout}");
    // The generator's conv family (convolution, norm, pooling or scale, epilogue): every task
    // gets kernels, and they verify.
    let generated = dir.join("conv");
    succeeded(&kevin_at_root(&[
        "tasks",
        "generate",
        "--count",
        "8",
        "--seed",
        "5",
        "--families",
        "conv",
        "--out",
        generated.to_str().unwrap(),
    ]));
    let (covered, stdout) = naive_kernels_verified(&generated, &dir.join("conv.jsonl"));
    assert_eq!(covered.len(), 8, "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kernelbench_problems_import_and_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    // Problems written for this test in KernelBench's format, in its folder layout.
    let dir = std::env::temp_dir().join(format!("kevin-kb-{}", std::process::id()));
    let src = dir.join("KernelBench");
    for l in ["level1", "level2"] {
        std::fs::create_dir_all(src.join(l)).unwrap();
    }
    let problem = |init: &str, forward: &str, sizes: &str, inputs: &str, init_inputs: &str| {
        format!(
            "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    \"\"\"A test problem.\"\"\"\n    \
             def __init__(self{init}):\n        super(Model, self).__init__()\n{body}\n    def forward(self, x):\n{forward}\n\n\
             {sizes}\n\ndef get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n    return [{init_inputs}]\n",
            init = if init.is_empty() { String::new() } else { format!(", {init}") },
            body = if init.is_empty() {
                String::new()
            } else {
                "        self.gemm = nn.Linear(in_features, out_features)\n".to_string()
            },
        )
    };
    std::fs::write(
        src.join("level1/1_Softmax.py"),
        problem(
            "",
            "        return torch.softmax(x, dim=-1)",
            "batch_size = 256\ndim = 4096",
            "torch.rand(batch_size, dim)",
            "",
        ),
    )
    .unwrap();
    std::fs::write(
        src.join("level1/2_Dropout.py"),
        problem(
            "in_features, out_features",
            "        return self.gemm(x)",
            "batch_size = 8\nin_features = 4\nout_features = 8",
            "torch.rand(batch_size, in_features)",
            "in_features, out_features",
        )
        .replace("nn.Linear(in_features, out_features)", "nn.Dropout(p=0.5)"),
    )
    .unwrap();
    std::fs::write(
        src.join("level1/3_Conv2d_MaxPool.py"),
        problem(
            "in_features, out_features",
            "        return nn.functional.max_pool2d(self.gemm(x), 2)",
            "batch_size = 2\nin_features = 3\nout_features = 4\nheight = 10\nwidth = 9",
            "torch.randn(batch_size, in_features, height, width)",
            "in_features, out_features",
        )
        .replace(
            "nn.Linear(in_features, out_features)",
            "nn.Conv2d(in_features, out_features, 3, padding=1)",
        ),
    )
    .unwrap();
    std::fs::write(
        src.join("level2/1_Gemm_ReLU_Sum.py"),
        problem(
            "in_features, out_features",
            "        x = torch.relu(self.gemm(x))\n        return torch.sum(x, dim=1, keepdim=True)",
            "batch_size = 128\nin_features = 512\nout_features = 1024",
            "torch.randn(batch_size, in_features)",
            "in_features, out_features",
        ),
    )
    .unwrap();
    let out = dir.join("tasks");
    let json = dir.join("import.json");
    let run = kevin_at_root(&[
        "tasks",
        "import-kernelbench",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--split",
        "train",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = succeeded(&run);
    assert!(
        stdout.contains("level1/2_Dropout.py: not imported (line 8: nn.Dropout with p > 0 (random in training mode))"),
        "{stdout}"
    );
    assert!(
        stdout.contains("level 1: imported 2 of 3 problems"),
        "{stdout}"
    );
    assert!(
        stdout.contains("level 2: imported 1 of 1 problems"),
        "{stdout}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(record["refused"][0]["line"], 8);
    assert_eq!(record["imported"].as_array().unwrap().len(), 3);
    // Importing into the same folder again is refused before any work.
    let again = kevin_at_root(&[
        "tasks",
        "import-kernelbench",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds 3 task files"));
    // `kevin tasks naive` writes every problem's naive kernel (held-out tasks too), and `kevin
    // eval --kernels` finds each one correct on the CPU backend.
    let naive = dir.join("naive");
    let naive_run = |form: &str| {
        kevin_at_root(&[
            "tasks",
            "--dir",
            out.to_str().unwrap(),
            "naive",
            "--out",
            naive.to_str().unwrap(),
            "--form",
            form,
        ])
    };
    let stdout = succeeded(&naive_run("fast"));
    assert!(stdout.contains("wrote 3 of 3 kernels"), "{stdout}");
    assert!(stdout.contains("kb1_3_conv2d_maxpool  staged_"), "{stdout}");
    let again = naive_run("simple");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds 3 .cu files"));
    // `kevin tasks baseline --plans` writes the eager plans for scripts/baseline_gpu.py, no GPU
    // needed: both presets of each task, the module PyTorch runs, and the kernels' source.
    let plans = dir.join("plans");
    let plans_run = || {
        kevin_at_root(&[
            "tasks",
            "--dir",
            out.to_str().unwrap(),
            "baseline",
            "--plans",
            plans.to_str().unwrap(),
        ])
    };
    let stdout = succeeded(&plans_run());
    assert!(
        stdout.contains("wrote the plans of 3 of 3 tasks"),
        "{stdout}"
    );
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(plans.join("kb1_3_conv2d_maxpool.gpu.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["preset"], "gpu");
    assert!(record["module"].as_str().unwrap().contains("class Model"));
    assert!(!record["plan"]["steps"].as_array().unwrap().is_empty());
    assert!(std::fs::read_to_string(plans.join("kernels.cu"))
        .unwrap()
        .contains("conv_depthwise"));
    let again = plans_run();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--plans"));
    let results = dir.join("naive.json");
    succeeded(&kevin_at_root(&[
        "eval",
        "--kernels",
        naive.to_str().unwrap(),
        "--dir",
        out.to_str().unwrap(),
        "--backend",
        "cpu",
        "--json",
        results.to_str().unwrap(),
    ]));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let outcomes: Vec<(&str, &str)> = record["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["task"].as_str().unwrap(),
                r["outcome"]["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|(_, k)| *k == "correct"),
        "{outcomes:?}"
    );
    // The imported tasks run end to end: naive kernels compiled and verified against their
    // fp64 references by the CPU backend.
    let corpus = dir.join("kb.jsonl");
    let stdout = all_correct_corpus(&out, &corpus, &["--breakages-per-task", "0"]);
    let examples = read_jsonl(&corpus).unwrap();
    let covered: std::collections::BTreeSet<&str> =
        examples.iter().map(|e| e.task.as_str()).collect();
    // The convolution then pooling gets a kernel per stage.
    assert_eq!(
        covered.into_iter().collect::<Vec<_>>(),
        [
            "kb1_1_softmax",
            "kb1_3_conv2d_maxpool",
            "kb2_1_gemm_relu_sum"
        ],
        "{stdout}"
    );
    // The imported convolution end to end on the CPU backend: a hand-written kernel for it is
    // checked against the fp64 reference (the interpreter, through the baseline's f64 plan), and
    // the same kernel with its padding forgotten is caught.
    let suite = std::sync::Arc::new(kevin::tasks::TaskSuite::load(&out).unwrap());
    let env = kevin::env::cpu::CpuEnv::new(
        suite,
        &out,
        kevin::tasks::Preset::Small,
        common::bin(),
        2,
        kevin::env::Deadlines::default(),
    )
    .unwrap();
    let conv = |pad: &str| {
        format!(
            "// kevin: launch conv_pool grid=(cdiv(batch_size*out_features*(height/2)*(width/2),128)) block=(128) \
             args=(x, gemm_weight, gemm_bias, Y, batch_size, in_features, out_features, height, width)
__global__ void conv_pool(const float* x, const float* w, const float* b, float* y, long long n,
                          long long c, long long f, long long h, long long wd) {{
    long long oh = h / 2, ow = wd / 2, total = n * f * oh * ow;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    long long px = i % ow, py = (i / ow) % oh, oc = (i / (ow * oh)) % f, bn = i / (ow * oh * f);
    float best = -3.4e38f;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) {{
            long long cy = 2 * py + dy, cx = 2 * px + dx;
            float acc = b[oc];
            for (long long ic = 0; ic < c; ++ic)
                for (int ky = 0; ky < 3; ++ky)
                    for (int kx = 0; kx < 3; ++kx) {{
                        long long iy = cy + ky - {pad}, ix = cx + kx - {pad};
                        if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                        acc += x[((bn * c + ic) * h + iy) * wd + ix] * w[((oc * c + ic) * 3 + ky) * 3 + kx];
                    }}
            best = fmaxf(best, acc);
        }}
    y[i] = best;
}}
"
        )
    };
    let task = "kb1_3_conv2d_maxpool";
    let right = kevin::env::evaluate(&env, task, &conv("1"));
    assert!(right.is_correct(), "{right:?}");
    let wrong = kevin::env::evaluate(&env, task, &conv("0"));
    assert_eq!(wrong.kind(), "wrong", "{wrong:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Problems written for this test in KernelBench's format, one of each construct the importer
/// learnt for the naive writer to cover: an einsum over sizes named like the writer's locals
/// (`i`, `j`, `k`), a diagonal scaling through `unsqueeze`, `triu` of a product of triangular
/// inputs, a LayerNorm over the last three dims, scaled dot product attention over 4-D
/// tensors, a product pooled through `unsqueeze` / `squeeze` then summed, and sizes named like
/// C++ keywords and macros (`this`, `EOF`, `errno`). Each imports, and gets naive kernels that
/// the CPU backend compiles and checks against the fp64 reference.
#[test]
fn kernelbench_views_triangles_norms_attention_and_named_sizes_verify_on_the_cpu_backend() {
    if !cpu_backend_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kevin-kbnew-{}", std::process::id()));
    let src = dir.join("KernelBench");
    for l in ["level1", "level2"] {
        std::fs::create_dir_all(src.join(l)).unwrap();
    }
    // (file, __init__'s parameters and body, forward's parameters and body, the sizes,
    // get_inputs' body, get_init_inputs' list)
    let problems: [(&str, &str, &str, &str, &str, &str); 7] = [
        (
            "level1/1_Einsum_Named_Sizes.py",
            "",
            "A, B):\n        return torch.einsum(\"bijl,lk->bijk\", A, B)",
            "b = 2\ni = 48\nj = 40\nl = 64\nk = 96",
            "A = torch.rand(b, i, j, l)\n    B = torch.rand(l, k)\n    return [A, B]",
            "",
        ),
        (
            "level1/2_Diagonal_Scaling.py",
            "",
            "A, B):\n        return A.unsqueeze(1) * B",
            "N = 512\nM = 384",
            "A = torch.rand(N)\n    B = torch.rand(N, M)\n    return [A, B]",
            "",
        ),
        (
            "level1/3_Triu_Of_Product.py",
            "",
            "A, B):\n        return torch.triu(torch.matmul(A, B))",
            "N = 256",
            "A = torch.triu(torch.rand(N, N))\n    B = torch.triu(torch.rand(N, N))\n    return [A, B]",
            "",
        ),
        (
            "level1/4_LayerNorm_Three_Dims.py",
            "normalized_shape: tuple):\n        super(Model, self).__init__()\n        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)",
            "x):\n        return self.ln(x)",
            "batch_size = 4\nfeatures = 32\ndim1 = 48\ndim2 = 64",
            "x = torch.rand(batch_size, features, dim1, dim2)\n    return [x]",
            "(features, dim1, dim2)",
        ),
        (
            "level1/5_Attention.py",
            "",
            "Q, K, V):\n        return torch.nn.functional.scaled_dot_product_attention(Q, K, V)",
            "batch_size = 2\nnum_heads = 4\nsequence_length = 128\nembedding_dimension = 64",
            "Q = torch.rand(batch_size, num_heads, sequence_length, embedding_dimension)\n    \
             K = torch.rand(batch_size, num_heads, sequence_length, embedding_dimension)\n    \
             V = torch.rand(batch_size, num_heads, sequence_length, embedding_dimension)\n    return [Q, K, V]",
            "",
        ),
        (
            "level2/1_Gemm_Pool_Sum.py",
            "in_features, out_features, kernel_size, scale):\n        super(Model, self).__init__()\n        \
             self.gemm = nn.Linear(in_features, out_features)\n        self.pool = nn.MaxPool1d(kernel_size)\n        \
             self.scale = scale",
            "x):\n        x = self.gemm(x)\n        x = self.pool(x.unsqueeze(1)).squeeze(1)\n        \
             x = torch.sum(x, dim=1)\n        return x * self.scale",
            "batch_size = 64\nin_features = 256\nout_features = 512\nkernel_size = 2\nscale = 0.5",
            "return [torch.rand(batch_size, in_features)]",
            "in_features, out_features, kernel_size, scale",
        ),
        (
            "level2/2_Gemm_Keyword_Sizes.py",
            "EOF, this):\n        super(Model, self).__init__()\n        self.gemm = nn.Linear(EOF, this)",
            "x):\n        return torch.softmax(torch.relu(self.gemm(x)), dim=-1)",
            "errno = 64\nEOF = 128\nthis = 96",
            "return [torch.rand(errno, EOF)]",
            "EOF, this",
        ),
    ];
    for (file, init, forward, sizes, inputs, init_inputs) in problems {
        let init = if init.is_empty() {
            "):\n        super(Model, self).__init__()".to_string()
        } else {
            format!(", {init}")
        };
        let text = format!(
            "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    \"\"\"A test problem.\"\"\"\n    \
             def __init__(self{init}\n\n    def forward(self, {forward}\n\n{sizes}\n\n\
             def get_inputs():\n    {inputs}\n\ndef get_init_inputs():\n    return [{init_inputs}]\n"
        );
        std::fs::write(src.join(file), text).unwrap();
    }
    let out = dir.join("tasks");
    let stdout = succeeded(&kevin_at_root(&[
        "tasks",
        "import-kernelbench",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--split",
        "train",
    ]));
    assert!(
        stdout.contains("level 1: imported 5 of 5 problems")
            && stdout.contains("level 2: imported 2 of 2 problems"),
        "{stdout}"
    );
    let (covered, stdout) = naive_kernels_verified(&out, &dir.join("kb.jsonl"));
    assert_eq!(
        covered.into_iter().collect::<Vec<_>>(),
        [
            "kb1_1_einsum_named_sizes",
            "kb1_2_diagonal_scaling",
            "kb1_3_triu_of_product",
            "kb1_4_layernorm_three_dims",
            "kb1_5_attention",
            "kb2_1_gemm_pool_sum",
            "kb2_2_gemm_keyword_sizes",
        ],
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One episodes.jsonl line as `kevin train` writes it.
fn episode_line(
    task: &str,
    seq: u64,
    turn: u32,
    outcome: &kevin::outcome::Outcome,
    response: &str,
) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "seq": seq, "group": seq, "task": task, "trajectory": 0, "turn": turn,
        "policy_version": 0, "score": outcome.score(), "return": 0.0, "advantage": 0.0,
        "outcome": outcome, "generate_ms": 1.0, "evaluate_ms": 1.0,
        "prompt": format!("prompt of turn {turn}"), "response": response,
    }))
    .unwrap()
}

#[test]
fn repairs_from_a_runs_rotated_episodes_through_the_binary() {
    use kevin::outcome::Outcome;
    use kevin::telemetry::files::RotatingLog;
    let dir = std::env::temp_dir().join(format!("kevin-sft-repairs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let wrong = Outcome::Wrong {
        reason: "values differ".into(),
        mismatch: None,
    };
    let compile = Outcome::CompileError { log: "x".into() };
    let right = Outcome::Correct {
        kernel_ms: 2.0,
        baseline_ms: 1.0,
        spread: 0.01,
        timing: "cuda".into(),
    };
    let kernel = "reasoning\n\n```cuda\n// kevin: launch k grid=(cdiv(N,256)) block=(256) args=(X, Y, N)\n\
                  __global__ void k(const float* X, float* Y, int n) {\n\
                  int i = blockIdx.x * blockDim.x + threadIdx.x;\n if (i < n) Y[i] = X[i];\n}\n```\nCopy.";
    // Group 1 in an archived part, group 2 in the live file: the reader takes both.
    let mut log = RotatingLog::open(&run, "episodes", "jsonl", 1 << 30).unwrap();
    log.write_line(&episode_line("relu", 1, 0, &wrong, "w"))
        .unwrap();
    log.write_line(&episode_line("relu", 1, 1, &right, kernel))
        .unwrap();
    log.rotate().unwrap();
    log.write_line(&episode_line("relu", 2, 0, &compile, "c"))
        .unwrap();
    log.write_line(&episode_line("relu", 2, 1, &compile, "c2"))
        .unwrap();
    log.flush().unwrap();
    drop(log);
    let out = dir.join("repairs.jsonl");
    let stdout = succeeded(&kevin_at_root(&[
        "sft",
        "repairs",
        "--episodes",
        run.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(
        stdout.contains("2 repair pairs over 1 of 1 tasks"),
        "{stdout}"
    );
    let examples = read_jsonl(&out).unwrap();
    let forms: Vec<&str> = examples.iter().map(|e| e.form.as_str()).collect();
    assert_eq!(forms, ["own:wrong+group", "own:compile_error+task"]);
    assert!(examples.iter().all(|e| e.kind == Kind::OwnRepair));
    assert!(examples[1].turns[1].response.contains("__global__ void k("));

    // A held-out task's turns are refused, naming the task.
    let heldout = dir.join("heldout.jsonl");
    std::fs::write(&heldout, episode_line("tanh", 1, 0, &wrong, "w")).unwrap();
    let refused = kevin_at_root(&[
        "sft",
        "repairs",
        "--episodes",
        heldout.to_str().unwrap(),
        "--out",
        dir.join("no.jsonl").to_str().unwrap(),
    ]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("task `tanh`") && err.contains("held out"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
