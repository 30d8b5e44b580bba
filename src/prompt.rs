//! Prompts: the first turn's task statement, and later turns' history.
//!
//! The first turn ([`first_turn`]) shows the task as the equivalent PyTorch module (what language
//! models know), the tensors with shapes and dtypes, the candidate format with one worked example,
//! and the rules the harness enforces. Each earlier turn contributes its kernel, its summary and the evaluation feedback; its
//! reasoning is dropped (the paper's context rule). When the history would exceed the budget,
//! the earliest turns are cut first and a note says how many were cut. Deterministic: the same
//! inputs give the same bytes, so prompts can be snapshot-tested.

use crate::ops::torch::RenderError;
use crate::ops::Dtype;
use crate::tasks::{Preset, Role, Task};
use crate::turn::TurnRecord;

/// The worked example of the answer format, for a task unlike any in the suite.
const EXAMPLE: &str = r#"Example answer (for a different task: `Y = relu(X)` with `X: f32[N]`):

```cuda
// kevin: launch relu_kernel grid=(cdiv(N,256)) block=(256) args=(X, Y, N)
__global__ void relu_kernel(const float* __restrict__ X, float* __restrict__ Y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Y[i] = fmaxf(X[i], 0.0f);
}
```
One thread per element; the grid covers all N elements and the bounds check handles the tail.
"#;

/// The first-turn prompt of `task`, with the sizes of `preset` (the sizes it is evaluated at).
pub fn first_turn(task: &Task, preset: Preset) -> Result<String, RenderError> {
    let module = task.torch_module(preset)?;
    let sig = task.signature(preset);
    let mut out = String::new();
    out.push_str(&format!(
        "# Task: {} (level {})
{}

",
        task.name, task.level, task.description
    ));
    out.push_str(
        "Write CUDA kernels that compute exactly what this PyTorch module computes, as fast as \
         possible on an NVIDIA H200 (sm_90):\n\n",
    );
    out.push_str(&format!("```python\n{}\n```\n\n", module.trim_end()));
    out.push_str("Tensors (contiguous, row-major; pass them to kernels by these names):\n");
    for t in &sig.tensors {
        let role = if t.role == Role::Input {
            "input, read-only"
        } else {
            "output"
        };
        let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        out.push_str(&format!(
            "- {}: {}[{}] ({role}; pointer type {})\n",
            t.name,
            t.dtype.name(),
            dims.join(", "),
            pointer_type(t.dtype)
        ));
    }
    let sizes: Vec<String> = sig
        .sizes
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    out.push_str(&format!("Sizes: {}\n\n", sizes.join(", ")));
    out.push_str(&format!(
        "## Answer format\n\
         Reason first if you like. Then write exactly one ```cuda block of device code only, then a \
         one-paragraph summary of your approach.\n\
         - Declare every launch, in order, in a comment inside the block:\n  \
           `// kevin: launch KERNEL grid=(X[,Y[,Z]]) block=(X[,Y[,Z]]) smem=BYTES args=(ARG, ...)`\n  \
           Arguments are the tensor names above, scratch buffers, sizes ({syms}), expressions of \
           them (+ - * / % and cdiv(a,b)) or literals, in the order of the kernel's parameters.\n\
         - Temporary device buffers: `// kevin: scratch NAME f32[EXPR]` (also f16, bf16, i32, i64).\n\
         - No host code: no main, no <<<...>>>, no cuda* runtime calls, no streams, no files, no \
           clock reads. Only CUDA device headers may be included (<cuda_fp16.h>, <cuda_bf16.h>, ...).\n\
         - Outputs start filled with NaN: write every element. Never modify an input. The launch \
           sequence runs twice on the same buffers and must give the same result.\n\
         - Results must match within |got - want| <= {atol} + {rtol} * |want|.\n\n",
        syms = sig.sizes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", "),
        atol = task.tolerance.atol,
        rtol = task.tolerance.rtol,
    ));
    out.push_str(EXAMPLE);
    Ok(out)
}

fn pointer_type(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "float*",
        Dtype::F16 => "__half* (cuda_fp16.h)",
        Dtype::Bf16 => "__nv_bfloat16* (cuda_bf16.h)",
        Dtype::I64 => "long long*",
    }
}

/// Renders one earlier turn for the history.
fn render_turn(t: &TurnRecord) -> String {
    let kernel = t.kernel.as_deref().unwrap_or("(no kernel)");
    let summary = t.summary.as_deref().unwrap_or("(no summary)");
    format!(
        "### Turn {}\nKernel:\n```cuda\n{}\n```\nSummary: {}\nFeedback: {}\n",
        t.turn + 1,
        kernel.trim_end(),
        summary.trim(),
        t.outcome.feedback()
    )
}

/// The prompt for the next turn, at most about `budget_chars` long (the task statement itself is
/// never cut).
pub fn build(statement: &str, history: &[TurnRecord], budget_chars: usize) -> String {
    if history.is_empty() {
        return statement.to_string();
    }
    let rendered: Vec<String> = history.iter().map(render_turn).collect();
    let tail = "\nRefine the kernel: fix what the feedback reports, then make it faster. \
                Answer in the same format.\n";
    let fixed = statement.len() + tail.len() + 64;
    let mut kept = rendered.len();
    let mut size: usize = rendered.iter().map(String::len).sum();
    while kept > 0 && fixed + size > budget_chars {
        size -= rendered[rendered.len() - kept].len();
        kept -= 1;
    }
    let cut = rendered.len() - kept;
    let mut out = String::with_capacity(fixed + size);
    out.push_str(statement);
    out.push_str("\n\n## Earlier attempts\n");
    if cut > 0 {
        out.push_str(&format!(
            "({cut} earliest attempt(s) omitted to fit the context.)\n"
        ));
    }
    for r in &rendered[cut..] {
        out.push_str(r);
    }
    out.push_str(tail);
    out
}

/// The task a prompt of [`first_turn`] (or [`build`] over it) asks for: the name in its
/// `# Task:` header. For test doubles and tools that answer prompts; None for other text.
pub fn task_of(prompt: &str) -> Option<&str> {
    prompt
        .lines()
        .find_map(|l| l.strip_prefix("# Task: "))?
        .split_whitespace()
        .next()
}

/// The 0-based index of the turn a prompt of [`build`] asks for: one past the last earlier turn
/// it shows (turns are numbered from 1 in the history and the earliest are cut first, so the
/// last heading stays), or the number of attempts the cut note says were omitted when all were;
/// 0 for a first-turn prompt.
pub fn turn_of(prompt: &str) -> u32 {
    let heading = prompt
        .match_indices("\n### Turn ")
        .last()
        .and_then(|(i, m)| {
            prompt[i + m.len()..]
                .split('\n')
                .next()?
                .trim()
                .parse()
                .ok()
        });
    let omitted = || {
        let (before, _) = prompt.split_once(" earliest attempt(s) omitted")?;
        before.rsplit('(').next()?.parse().ok()
    };
    heading.or_else(omitted).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episode::tests::turn;
    use crate::outcome::Outcome;

    /// Compares with tests/data/prompts/<name>.txt; KEVIN_UPDATE_SNAPSHOTS=1 rewrites it.
    fn check_snapshot(name: &str, got: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/prompts")
            .join(format!("{name}.txt"));
        if std::env::var_os("KEVIN_UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, got).unwrap();
        }
        let want =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            got,
            want,
            "prompt snapshot {} changed (KEVIN_UPDATE_SNAPSHOTS=1 to accept)",
            path.display()
        );
    }

    #[test]
    fn first_turn_prompt_snapshots() {
        let suite = crate::tasks::TaskSuite::load(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks"),
        )
        .unwrap();
        for (name, preset) in [
            ("relu", Preset::Gpu),
            ("gemm_bias_relu", Preset::Gpu),
            ("layernorm_residual_f16", Preset::Small),
        ] {
            let task = suite.get(name).unwrap();
            let a = first_turn(task, preset).unwrap();
            assert_eq!(a, first_turn(task, preset).unwrap(), "deterministic");
            check_snapshot(name, &a);
        }
    }

    #[test]
    fn history_snapshot() {
        let h = [turn(
            0,
            Outcome::Wrong {
                reason: "values differ".into(),
                mismatch: None,
            },
            0,
        )];
        let expected = "TASK\n\n## Earlier attempts\n### Turn 1\nKernel:\n```cuda\nkernel 0\n```\nSummary: summary 0\n\
                        Feedback: Wrong result: values differ.\n\nRefine the kernel: fix what the feedback reports, \
                        then make it faster. Answer in the same format.\n";
        assert_eq!(build("TASK", &h, 10_000), expected);
    }

    #[test]
    fn earliest_turns_are_cut_first() {
        let h: Vec<_> = (0..5)
            .map(|i| {
                turn(
                    i,
                    Outcome::CompileError {
                        log: "x".repeat(100),
                    },
                    0,
                )
            })
            .collect();
        let full = build("T", &h, 100_000);
        let small = build("T", &h, full.len() - 50);
        assert!(small.contains("(1 earliest attempt(s) omitted"));
        assert!(!small.contains("### Turn 1\n") && small.contains("### Turn 5\n"));
        let tiny = build("T", &h, 10);
        assert!(tiny.contains("(5 earliest attempt(s) omitted"));
        assert_eq!(build("T", &[], 10), "T");
        // The turn a prompt asks for survives the cut: the last heading is kept.
        assert_eq!((turn_of(&full), turn_of(&small), turn_of(&tiny)), (5, 5, 5));
    }

    #[test]
    fn task_and_turn_of_a_prompt() {
        let statement = "# Task: relu (level 1)\nApply relu.";
        assert_eq!(task_of(statement), Some("relu"));
        assert_eq!(turn_of(statement), 0);
        let h: Vec<_> = (0..2)
            .map(|i| turn(i, Outcome::CompileError { log: "x".into() }, 0))
            .collect();
        let p = build(statement, &h, 100_000);
        assert_eq!((task_of(&p), turn_of(&p)), (Some("relu"), 2));
        assert_eq!(task_of("no header"), None);
    }
}
