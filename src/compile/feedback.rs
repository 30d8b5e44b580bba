//! Shortening NVRTC logs into feedback the policy can use.
//!
//! A template error can produce tens of KiB of log, which would crowd the next turn's context.
//! The first errors are the ones that matter (later ones are often consequences), so the trimmed
//! log keeps whole error diagnostics in order, drops warnings first, and says what it left out.

/// Upper bound of a trimmed log, in bytes.
pub const MAX_FEEDBACK_BYTES: usize = 3 * 1024;

/// Returns `log` unchanged if it is short, else its first error diagnostics within
/// [`MAX_FEEDBACK_BYTES`] and a note of what was omitted.
pub fn trim_log(log: &str) -> String {
    if log.len() <= MAX_FEEDBACK_BYTES {
        return log.to_string();
    }
    let (mut kept, mut dropped_errors, mut dropped_warnings) = (String::new(), 0, 0);
    let mut summary = String::new();
    for block in diagnostics(log) {
        let is_error = block.lines().next().is_some_and(is_error_line);
        if !is_error && block.lines().next().is_some_and(is_diagnostic_line) {
            dropped_warnings += 1;
        } else if !is_error {
            // The "N errors detected" tail or text before the first diagnostic.
            summary.push_str(block);
        } else if kept.len() + block.len() <= MAX_FEEDBACK_BYTES - 200 {
            kept.push_str(block);
        } else {
            dropped_errors += 1;
        }
    }
    if kept.is_empty() {
        // One enormous diagnostic: keep its beginning.
        kept = truncate_at_char(log, MAX_FEEDBACK_BYTES - 200).to_string();
    }
    let summary = truncate_at_char(summary.trim(), 150);
    format!(
        "{kept}[... log trimmed: {dropped_errors} more errors and {dropped_warnings} warnings \
         omitted]\n{summary}\n"
    )
}

/// Splits a log into diagnostics: each starts at a `file(line): kind: ...` line and runs until
/// the next one. Non-diagnostic text forms its own blocks.
fn diagnostics(log: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in log.split_inclusive('\n') {
        let starts_block = is_diagnostic_line(line) || is_summary_line(line);
        if starts_block && offset > start {
            blocks.push(&log[start..offset]);
            start = offset;
        }
        offset += line.len();
    }
    if offset > start {
        blocks.push(&log[start..offset]);
    }
    blocks
}

/// `name.cu(12): error: ...`, `name.cu(3): warning #177-D: ...`, `... catastrophic error: ...`.
fn is_diagnostic_line(line: &str) -> bool {
    let Some(open) = line.find('(') else {
        return false;
    };
    let Some(close) = line[open..].find("): ") else {
        return false;
    };
    let digits = &line[open + 1..open + close];
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn is_error_line(line: &str) -> bool {
    is_diagnostic_line(line) && line.contains("error")
}

/// `2 errors detected in the compilation of "candidate.cu".`
fn is_summary_line(line: &str) -> bool {
    line.contains("detected in the compilation of")
}

fn truncate_at_char(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag(line: usize, kind: &str, msg: &str) -> String {
        format!("candidate.cu({line}): {kind}: {msg}\n    code();\n    ^\n\n")
    }

    #[test]
    fn short_logs_are_unchanged() {
        let log = diag(3, "error", "identifier \"x\" is undefined");
        assert_eq!(trim_log(&log), log);
    }

    #[test]
    fn long_logs_keep_the_first_errors_and_drop_warnings() {
        let mut log = String::new();
        for i in 0..100 {
            log += &diag(i, "warning #177-D", &"w".repeat(50));
        }
        log += &diag(200, "error", "the first error");
        for i in 0..200 {
            log += &diag(300 + i, "error", &"e".repeat(40));
        }
        log += "201 errors detected in the compilation of \"candidate.cu\".\n";
        let trimmed = trim_log(&log);
        assert!(trimmed.len() <= MAX_FEEDBACK_BYTES, "{}", trimmed.len());
        assert!(trimmed.starts_with("candidate.cu(200): error: the first error"));
        assert!(trimmed.contains("warnings omitted"));
        assert!(trimmed.contains("100 warnings"));
        assert!(trimmed.contains("201 errors detected"));
        assert!(!trimmed.contains("warning #177"));
    }

    #[test]
    fn one_huge_diagnostic_is_cut() {
        let log = diag(1, "error", &"é".repeat(5000));
        let trimmed = trim_log(&log);
        assert!(trimmed.len() <= MAX_FEEDBACK_BYTES);
        assert!(trimmed.starts_with("candidate.cu(1): error"));
    }
}
