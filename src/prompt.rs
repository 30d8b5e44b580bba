//! Prompt construction for later turns: the task statement followed by the history.
//!
//! Each earlier turn contributes its kernel, its summary and the evaluation feedback; its
//! reasoning is dropped (the paper's context rule). When the history would exceed the budget,
//! the earliest turns are cut first and a note says how many were cut. Deterministic: the same
//! inputs give the same bytes, so prompts can be snapshot-tested.

use crate::episode::TurnRecord;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::episode::tests::turn;
    use crate::outcome::Outcome;

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
    }
}
