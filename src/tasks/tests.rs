//! Tests of the task loader against the real `tasks/` directory (counts, splits, every task runs
//! through the reference interpreter, GPU presets are big enough) and against broken files (each
//! error names the file and the key).

use std::path::PathBuf;

use super::*;

fn suite() -> TaskSuite {
    TaskSuite::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tasks")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn suite_has_enough_tasks_per_level_and_held_out_share() {
    let s = suite();
    for level in [1, 2] {
        let n = s.level(level).count();
        let held = s.level(level).filter(|t| t.split == Split::Heldout).count();
        assert!(n >= 22, "level {level} has {n} tasks");
        assert!(
            held >= 5 && held * 5 >= n,
            "level {level}: {held} of {n} held out"
        );
    }
    assert_eq!(
        s.tasks().len(),
        s.split(Split::Train).count() + s.split(Split::Heldout).count()
    );
}

#[test]
fn every_task_runs_at_the_small_preset_with_finite_outputs() {
    for t in suite().tasks() {
        let inputs = t.generate_inputs(Preset::Small, 7);
        let sig = t.signature(Preset::Small);
        let n_in: usize = sig
            .tensors
            .iter()
            .filter(|s| s.role == Role::Input)
            .map(|s| s.numel())
            .sum();
        assert!(
            n_in <= 20_000,
            "{}: small preset has {n_in} input elements",
            t.name
        );
        let outs = t
            .reference(Preset::Small, &inputs)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        let out_specs: Vec<&TensorSpec> = sig
            .tensors
            .iter()
            .filter(|s| s.role == Role::Output)
            .collect();
        assert_eq!(outs.len(), out_specs.len(), "{}", t.name);
        for (o, spec) in outs.iter().zip(out_specs) {
            assert_eq!(o.len(), spec.numel(), "{}: output {}", t.name, spec.name);
            assert!(
                o.iter().all(|v| v.is_finite()),
                "{}: output {} not finite",
                t.name,
                spec.name
            );
        }
        assert!(t.torch_module(Preset::Gpu).is_ok(), "{}", t.name);
    }
}

#[test]
fn gpu_presets_are_estimated_at_least_a_tenth_of_a_millisecond() {
    for t in suite().tasks() {
        let ms = t.estimate_gpu_baseline_ms();
        assert!(ms >= 0.1, "{}: estimated {ms:.3} ms", t.name);
        assert!(ms <= 50.0, "{}: estimated {ms:.3} ms", t.name);
    }
}

#[test]
fn small_presets_include_sizes_that_are_not_multiples_of_32() {
    let s = suite();
    let odd = s
        .tasks()
        .iter()
        .filter(|t| t.small_sizes.values().any(|v| v % 32 != 0))
        .count();
    assert!(
        odd * 2 >= s.tasks().len(),
        "only {odd} tasks have a non-multiple-of-32 size"
    );
}

#[test]
fn inputs_are_deterministic_rounded_and_follow_their_distribution() {
    let s = suite();
    let t = s.get("rsqrt_positive").unwrap();
    let a = t.generate_inputs(Preset::Small, 1);
    assert_eq!(a, t.generate_inputs(Preset::Small, 1));
    assert_ne!(a, t.generate_inputs(Preset::Small, 2));
    assert!(a[0].iter().all(|&v| v >= 0.1 && v as f32 as f64 == v));
    let t = s.get("gelu_f16").unwrap();
    let x = &t.generate_inputs(Preset::Small, 3)[0];
    assert!(x.iter().all(|&v| crate::ops::round::round_f16(v) == v));
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    assert!(mean.abs() < 0.2, "mean {mean}");
}

#[test]
fn signature_lists_inputs_then_outputs_with_concrete_shapes() {
    let s = suite();
    let sig = s.get("gemm_bias_relu").unwrap().signature(Preset::Small);
    let sizes: Vec<(&str, usize)> = sig.sizes.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(sizes, [("M", 33), ("K", 17), ("N", 65)]);
    let t: Vec<(&str, Role, Vec<usize>)> = sig
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.role, t.shape.clone()))
        .collect();
    assert_eq!(
        t,
        [
            ("A", Role::Input, vec![33, 17]),
            ("W", Role::Input, vec![17, 65]),
            ("b", Role::Input, vec![65]),
            ("Y", Role::Output, vec![33, 65]),
        ]
    );
    assert_eq!(
        s.get("gemm_bias_relu").unwrap().tolerance,
        Tolerance::for_dtype(crate::ops::Dtype::F32)
    );
    assert_eq!(s.get("matmul_bf16").unwrap().tolerance.atol, 1e-2);
}

const GOOD: &str = r#"name = "t"
level = 1
split = "train"
description = "relu"
program = """
input X: f32[M]
output Y: f32[M]
Y = relu(X)
"""
[sizes.gpu]
M = 100000000
[sizes.small]
M = 33
"#;

/// Loads a directory holding one file `t.toml` with `text`; returns the error message.
fn load_err(text: &str) -> String {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("kevin-tasks-{}-{}", std::process::id(), text.len()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("t.toml"), text).unwrap();
    let r = TaskSuite::load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn check_err(text: &str, expected: &[&str]) {
    let msg = load_err(text);
    for e in expected {
        assert!(msg.contains(e), "`{msg}` lacks `{e}`");
    }
}

#[test]
fn broken_files_name_the_file_and_the_key() {
    assert_eq!(load_err(GOOD), "");
    check_err(
        &GOOD.replace("name = \"t\"", "name = \"u\""),
        &["t.toml: key `name`", "file stem"],
    );
    check_err(&GOOD.replace("level = 1", "level = 3"), &["key `level`"]);
    check_err(
        &GOOD.replace("split = \"train\"", "split = \"test\""),
        &["t.toml", "split"],
    );
    check_err(
        &GOOD.replace("[sizes.small]\nM = 33", "[sizes.small]\nN = 33"),
        &["key `sizes.small.M`: is missing"],
    );
    check_err(
        &GOOD.replace("M = 33", "M = 33\nQ = 2"),
        &["key `sizes.small.Q`"],
    );
    check_err(
        &GOOD.replace("Y = relu(X)", "Y = relu(X"),
        &["key `program`", "line 4, column 1"],
    );
    check_err(
        &format!("{GOOD}[inputs.Z]\ndist = \"normal\"\n"),
        &["key `inputs.Z`"],
    );
    check_err(
        &format!("{GOOD}[inputs.X]\ndist = \"uniform\"\nlo = 1.0\nhi = 0.0\n"),
        &["key `inputs.X`", "`lo`"],
    );
    check_err(
        &format!("{GOOD}[inputs.X]\ndist = \"normal\"\nsdt = 1.0\n"),
        &["t.toml", "sdt"],
    );
    check_err(&format!("{GOOD}colour = 1\n"), &["t.toml", "colour"]);
    check_err(
        &format!("{GOOD}[tolerance]\natol = -1.0\nrtol = 0.0\n"),
        &["key `tolerance`"],
    );
}

#[test]
fn empty_directory_is_an_error() {
    let dir = std::env::temp_dir().join(format!("kevin-tasks-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = TaskSuite::load(&dir).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.to_string().starts_with("no task files"), "{e}");
}

#[test]
fn torch_module_has_the_description_and_input_distributions() {
    let s = suite();
    let m = s
        .get("rsqrt_positive")
        .unwrap()
        .torch_module(Preset::Small)
        .unwrap();
    assert!(
        m.contains("class Model(nn.Module):\n    \"\"\"Elementwise reciprocal square root"),
        "{m}"
    );
    assert!(
        m.contains("X = torch.randn(M, N, dtype=torch.float32).abs() * 1.0 + 0.1\n"),
        "{m}"
    );
    assert!(m.contains("M = 33\nN = 65\n"), "{m}");
}

/// Writes, for every task, the PyTorch module at the small preset, inputs and reference outputs
/// as JSON into `$KEVIN_XCHECK_DIR`, for a cross-check of renderer and interpreter against
/// PyTorch in float64 where PyTorch is installed (`scripts/torch_xcheck.py`).
/// Gated by that variable: without it the test returns at once.
#[test]
fn dump_cross_check() {
    let Ok(dir) = std::env::var("KEVIN_XCHECK_DIR") else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    for t in suite().tasks() {
        let inputs = t.generate_inputs(Preset::Small, 11);
        let outputs = t.reference(Preset::Small, &inputs).unwrap();
        let sig = t.signature(Preset::Small);
        let shapes: Vec<&Vec<usize>> = sig.tensors.iter().map(|s| &s.shape).collect();
        let j = serde_json::json!({
            "module": t.torch_module(Preset::Small).unwrap(),
            "inputs": inputs, "outputs": outputs, "shapes": shapes,
        });
        std::fs::write(format!("{dir}/{}.json", t.name), j.to_string()).unwrap();
    }
}

#[test]
fn a_suite_path_joins_folders_and_refuses_duplicates_and_empty_ones() {
    let base = std::env::temp_dir().join(format!("kevin-tasks-multi-{}", std::process::id()));
    let (extra, empty) = (base.join("extra"), base.join("empty"));
    std::fs::create_dir_all(&extra).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(extra.join("t.toml"), GOOD).unwrap();
    let hand = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tasks"));
    let join = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();

    let both = TaskSuite::load(join(&[&hand, &extra])).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(both.tasks().len(), suite().tasks().len() + 1);
    assert_eq!(both.get("t").unwrap().path, extra.join("t.toml"));
    // Held-out tasks of the hand-written suite stay held out next to another folder.
    assert_eq!(
        both.split(Split::Heldout).count(),
        suite().split(Split::Heldout).count()
    );
    // Made absolute part by part for worker processes, and loadable from there.
    let canonical = canonical_suite_path(Path::new(&join(&[&hand, &extra]))).unwrap();
    assert_eq!(suite_dirs(&canonical).len(), 2);
    assert!(suite_dirs(&canonical).iter().all(|d| d.is_absolute()));

    let twice = TaskSuite::load(join(&[&extra, &extra]))
        .unwrap_err()
        .to_string();
    assert!(twice.contains("task `t` is also defined in"), "{twice}");
    let none = TaskSuite::load(join(&[&hand, &empty]))
        .unwrap_err()
        .to_string();
    assert!(
        none.contains("no task files") && none.contains("empty"),
        "{none}"
    );
    let missing = canonical_suite_path(Path::new(&join(&[&hand, &base.join("nope")]))).unwrap_err();
    assert!(missing.contains("nope"), "{missing}");
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_preset_whose_channels_do_not_split_into_the_groups_is_refused() {
    let text = |c: usize| {
        format!(
            "name = \"gn\"\nlevel = 1\nsplit = \"train\"\ndescription = \"g\"\n\
             program = \"\"\"\ninput X: f32[N, C, L]\noutput Y: f32[N, C, L]\nY = group_norm(X, 4)\n\"\"\"\n\
             [sizes.gpu]\nN = 2\nC = 8\nL = 5\n[sizes.small]\nN = 2\nC = {c}\nL = 5\n"
        )
    };
    let path = std::path::Path::new("gn.toml");
    super::file::parse_task(path, &text(12)).expect("12 channels split into 4 groups");
    let err = super::file::parse_task(path, &text(10))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sizes.small") && err.contains("multiple of 4") && err.contains("line 3"),
        "{err}"
    );
}

#[test]
fn a_constant_input_renders_as_torch_full() {
    let d = InputDist::Normal {
        mean: 1.0,
        std: 0.0,
    };
    assert_eq!(
        d.torch_expr("C, 1, 1", "torch.float32").as_deref(),
        Some("torch.full((C, 1, 1,), 1.0, dtype=torch.float32)")
    );
    assert_eq!(
        d.torch_expr("N", "torch.float16").as_deref(),
        Some("torch.full((N,), 1.0, dtype=torch.float16)")
    );
    // Labels of an i64 input stay integers; a float grid is scaled as floats.
    let labels = InputDist::Grid {
        lo: 0.0,
        step: 1.0,
        count: 10,
    };
    assert_eq!(
        labels.torch_expr("N", "torch.int64").as_deref(),
        Some("torch.randint(0, 10, (N,)) * 1 + 0")
    );
    assert_eq!(
        labels.torch_expr("N", "torch.float32").as_deref(),
        Some("torch.randint(0, 10, (N,)).to(torch.float32) * 1.0 + 0.0")
    );
}

/// The candidate's scratch allowance follows what PyTorch eager allocates between the program's
/// ops: every operator node's result but the roots written into outputs.
#[test]
fn eager_intermediates_count_every_node_but_the_outputs() {
    let program = crate::ops::Program::parse(
        "input X: f32[M, N]\ninput w: f32[N]\noutput Y: f32[M]\n\
         T = relu(X * w)\nY = sum(T + 1.0, axis=1)",
    )
    .unwrap();
    let sizes: crate::ops::Sizes = [("M".to_string(), 100), ("N".to_string(), 1000)].into();
    // X * w and relu(..) (the statement T), then T + 1.0: three [M, N] f32 tensors; the sum
    // is written into Y.
    assert_eq!(
        estimate::intermediate_bytes(&program, &sizes),
        3 * 100 * 1000 * 4
    );
}
