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
        stdout.contains("by kind: first_turn 2, repair "),
        "{stdout}"
    );
    let examples = read_jsonl(&out).unwrap();
    let count = |k: Kind| examples.iter().filter(|e| e.kind == k).count();
    assert_eq!(count(Kind::FirstTurn), 2);
    assert!(count(Kind::Variant) >= 4, "{stdout}");
    assert!(count(Kind::Repair) >= 8, "{stdout}");
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
    let bad = generate(&["--families", "conv"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no family `conv` (families: elementwise")
    );

    // `kevin sft corpus` over a folder of tasks into `out`: its output, once no variant was
    // incorrect.
    let corpus = |tasks: &std::path::Path, out: &std::path::Path| {
        let run = kevin_at_root(&[
            "sft",
            "corpus",
            "--dir",
            tasks.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--workers",
            "2",
        ]);
        let stdout = succeeded(&run);
        assert!(
            !stdout.contains("variants that were not correct"),
            "{stdout}"
        );
        stdout
    };
    let out = dir.join("corpus.jsonl");
    let stdout = corpus(&tasks, &out);
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

    // Row operations only: the block-per-row form (block-wide tree reductions) compiles and
    // verifies next to the thread-per-row one.
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
    let stdout = corpus(&rows, &out);
    let forms: std::collections::BTreeSet<String> = read_jsonl(&out)
        .unwrap()
        .into_iter()
        .map(|e| e.form)
        .collect();
    assert!(
        forms.iter().any(|f| f.starts_with("naive:rowwise_block_b")),
        "{forms:?}\n{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
