//! The plain-text face of [`InspectReport`]: aligned tables for a terminal, no dependencies.
//! (`--json` uses the report's `Serialize` instead.)

use std::fmt;

use super::inspect::InspectReport;

/// Prints `rows` under `header`, two spaces apart: numbers right-aligned, the columns listed in
/// `left` (names, free text) left-aligned.
fn table(
    f: &mut fmt::Formatter<'_>,
    header: &[&str],
    left: &[usize],
    rows: &[Vec<String>],
) -> fmt::Result {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            if left.contains(&i) {
                line.push_str(&format!("  {cell:<w$}"));
            } else {
                line.push_str(&format!("  {cell:>w$}"));
            }
        }
        writeln!(f, "{}", line.trim_end())?;
    }
    Ok(())
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "run {}: {} session(s), {:.3} s traced",
            self.run_dir.display(),
            self.sessions.len(),
            self.wall_ms / 1000.0
        )?;
        let rows: Vec<Vec<String>> = self
            .sessions
            .iter()
            .map(|s| {
                let state = if s.complete { "closed" } else { "cut" };
                vec![
                    s.file.clone(),
                    format!("{:.3}", s.wall_ms / 1000.0),
                    s.spans.to_string(),
                    s.dropped.to_string(),
                    state.to_owned(),
                ]
            })
            .collect();
        table(
            f,
            &["session", "wall s", "spans", "dropped", "state"],
            &[0, 4],
            &rows,
        )?;

        writeln!(f, "\nactors (busiest first)")?;
        let rows: Vec<Vec<String>> = self
            .actors
            .iter()
            .map(|a| {
                let summed = if a.concurrency > 1 {
                    format!("{:.1}", a.busy_summed_pct)
                } else {
                    "-".to_owned()
                };
                vec![
                    a.actor.clone(),
                    format!("{:.1}", a.busy_pct),
                    format!("{:.1}", a.idle_pct),
                    summed,
                    a.concurrency.to_string(),
                    a.messages.to_string(),
                    format!("{:.3}", a.mean_ms),
                    format!("{:.3}", a.p99_ms),
                    a.mailbox_high_water
                        .map_or("-".to_owned(), |m| m.to_string()),
                ]
            })
            .collect();
        let header = [
            "actor",
            "busy %",
            "idle %",
            "busy (summed) %",
            "concurrency",
            "messages",
            "mean ms",
            "p99 ms",
            "mailbox max",
        ];
        table(f, &header, &[0], &rows)?;

        writeln!(f, "\nslowest spans")?;
        let rows: Vec<Vec<String>> = self
            .slowest
            .iter()
            .map(|s| {
                vec![
                    s.actor.clone(),
                    s.name.clone(),
                    format!("{:.3}", s.dur_ms),
                    format!("{:.3}", s.start_ms / 1000.0),
                    s.session.clone(),
                    s.args.clone(),
                ]
            })
            .collect();
        table(
            f,
            &["actor", "span", "ms", "at s", "session", "args"],
            &[0, 1, 4, 5],
            &rows,
        )?;

        if !self.lease_wait_ms.is_empty() {
            let waits: Vec<String> = self
                .lease_wait_ms
                .iter()
                .map(|(party, ms)| format!("{party} {:.3} s", ms / 1000.0))
                .collect();
            writeln!(
                f,
                "\nwaits for the GPU timing lease (all sessions): {}",
                waits.join(", ")
            )?;
        }

        if !self.warnings.is_empty() {
            writeln!(f, "\nwarnings")?;
            for w in &self.warnings {
                writeln!(f, "  - {w}")?;
            }
        }
        Ok(())
    }
}
