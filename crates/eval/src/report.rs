//! Plain-text tables of evaluation results (and a small table type the CLI reuses).

use crate::protocol::{EvalResult, Status, WorkloadResult};
use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A text table whose column widths fit its contents.
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// A table of `rows`, the first of which is the header; `align(column, columns)` aligns
    /// each column.
    pub fn from_rows(rows: &[Vec<String>], align: impl Fn(usize, usize) -> Align) -> Self {
        let Some((header, body)) = rows.split_first() else {
            return Table::new(&[]);
        };
        let columns: Vec<(&str, Align)> = header
            .iter()
            .enumerate()
            .map(|(c, h)| (h.as_str(), align(c, header.len())))
            .collect();
        let mut table = Table::new(&columns);
        for row in body {
            table.row(row.clone());
        }
        table
    }

    /// Adds a row; missing cells are blank and surplus cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(cell));
            }
        }
        let mut out = String::new();
        let mut line = |cells: &[String]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i] - width(cell);
                match self.align[i] {
                    Align::Left => {
                        text.push_str(cell);
                        text.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        text.extend(std::iter::repeat_n(' ', pad));
                        text.push_str(cell);
                    }
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&self.headers);
        for row in &self.rows {
            line(row);
        }
        out
    }
}

/// Human-readable duration of a nanosecond count, three significant digits.
pub fn format_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "-".into();
    }
    let (value, unit) = scale_ns(ns);
    format!("{value} {unit}")
}

/// `ns` as a three-digit number and its unit.
fn scale_ns(ns: f64) -> (String, &'static str) {
    let (value, unit) = if ns < 1e3 {
        (ns, "ns")
    } else if ns < 1e6 {
        (ns / 1e3, "µs")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, "s")
    };
    (sig3(value), unit)
}

fn sig3(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn format_speedup(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{}x", sig3(v)),
        _ => "-".into(),
    }
}

/// A speedup interval, `1.91–2.07x`.
pub fn format_interval(iv: [f64; 2]) -> String {
    if iv.iter().all(|v| v.is_finite()) {
        format!("{}–{}x", sig3(iv[0]), sig3(iv[1]))
    } else {
        "-".into()
    }
}

/// A drift ratio as a signed percentage, `+3.1%`.
pub fn format_drift(d: f64) -> String {
    format!("{:+.1}%", (d - 1.0) * 100.0)
}

fn format_fraction(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{:.1}%", v * 100.0),
        _ => "-".into(),
    }
}

fn spread(w: &WorkloadResult) -> String {
    match (w.candidate_p10_ns, w.candidate_p90_ns) {
        (Some(lo), Some(hi)) if lo.is_finite() && hi.is_finite() => {
            let ((lo, lo_unit), (hi, hi_unit)) = (scale_ns(lo), scale_ns(hi));
            if lo_unit == hi_unit {
                format!("{lo}–{hi} {hi_unit}")
            } else {
                format!("{lo} {lo_unit}–{hi} {hi_unit}")
            }
        }
        _ => "-".into(),
    }
}

fn correct_cell(w: &WorkloadResult) -> String {
    match w.correct {
        Some(true) => "yes".into(),
        Some(false) => match w.max_abs_err {
            Some(e) => format!("NO (err {e:.2e})"),
            None => "NO".into(),
        },
        None => "-".into(),
    }
}

/// Detailed table of one result: a header naming the candidate and status, the rejection
/// reason if any, and one row per workload.
pub fn render_result(label: &str, result: &EvalResult) -> String {
    let mut out = String::new();
    let _ = write!(out, "{label}: {}", result.status);
    if let Some(v) = &result.violation {
        let _ = write!(out, " ({})", v.class);
    }
    if let Some(score) = result.score.filter(|s| s.is_finite()) {
        let _ = write!(out, "  score {}x vs baseline", sig3(score));
        if let Some(iv) = result.score_interval {
            let _ = write!(out, " ({})", format_interval(iv));
        }
    }
    if let Some(d) = result.drift.filter(|d| d.is_finite()) {
        let _ = write!(out, "  drift {}", format_drift(d));
    }
    let _ = writeln!(out, "  [{:.1} s]", result.wall_seconds);
    if !result.passed() {
        let violation_message = result.violation.as_ref().map(|v| v.message.as_str());
        let message = violation_message
            .filter(|m| !m.is_empty())
            .unwrap_or(&result.message);
        if !message.is_empty() {
            for line in message.lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        if let Some(violation) = &result.violation {
            if !result.message.is_empty() && result.message != violation.message {
                let _ = writeln!(out, "  {}", result.message);
            }
        }
        if result.status == Status::BuildError {
            if let Some(build) = &result.build {
                let log = build.log.trim();
                if !log.is_empty() {
                    let _ = writeln!(out, "  build log (last lines):");
                    let lines: Vec<&str> = log.lines().collect();
                    for line in &lines[lines.len().saturating_sub(20)..] {
                        let _ = writeln!(out, "    {line}");
                    }
                }
            }
        }
    }
    if !result.workloads.is_empty() {
        let mut table = Table::new(&[
            ("workload", Align::Left),
            ("set", Align::Left),
            ("correct", Align::Left),
            ("median", Align::Right),
            ("p10–p90", Align::Right),
            ("vs ref", Align::Right),
            ("vs base", Align::Right),
            ("roofline", Align::Right),
        ]);
        for w in &result.workloads {
            table.row(vec![
                w.name.clone(),
                if w.held_out { "held-out" } else { "search" }.into(),
                correct_cell(w),
                w.candidate_median_ns.map(format_ns).unwrap_or("-".into()),
                spread(w),
                format_speedup(w.speedup_vs_reference),
                format_speedup(w.speedup_vs_baseline),
                format_fraction(w.roofline_fraction),
            ]);
        }
        for line in table.render().lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if let Some(line) = sandbox_line(result) {
        let _ = writeln!(out, "  {line}");
    }
    out
}

/// How the candidate's process was confined, in one line (docs/security.md).
fn sandbox_line(result: &EvalResult) -> Option<String> {
    let layers = result.sandbox_layers();
    if layers.is_empty() {
        return None;
    }
    let inactive: Vec<&str> = layers
        .iter()
        .filter(|(_, active)| !active)
        .map(|(name, _)| name.as_str())
        .collect();
    Some(if inactive.is_empty() {
        format!("sandbox: all {} layers active", layers.len())
    } else {
        format!(
            "sandbox: {} of {} layers active; not available here: {}",
            layers.len() - inactive.len(),
            layers.len(),
            inactive.join(", ")
        )
    })
}

/// One line per result: for the end of a multi-file evaluation.
pub fn render_summary(results: &[(String, &EvalResult)]) -> String {
    let mut table = Table::new(&[
        ("candidate", Align::Left),
        ("status", Align::Left),
        ("score", Align::Right),
        ("interval", Align::Right),
        ("wall", Align::Right),
    ]);
    for (label, r) in results {
        let status = match &r.violation {
            Some(v) => format!("{} ({})", r.status, v.class),
            None => r.status.to_string(),
        };
        table.row(vec![
            label.clone(),
            status,
            format_speedup(r.score),
            r.score_interval
                .filter(|_| r.score.is_some())
                .map(format_interval)
                .unwrap_or_else(|| "-".into()),
            format!("{:.1} s", r.wall_seconds),
        ]);
    }
    table.render()
}

/// What `ksearch eval` says before it times the yardstick for `req`'s files.
pub fn yardstick_intro(req: &crate::EvalRequest) -> String {
    let baseline = req
        .task
        .baseline
        .as_ref()
        .map(|b| format!("baseline {}", b.name));
    format!(
        "ksearch: timing the yardstick ({} and the reference) on {} workloads",
        baseline.as_deref().unwrap_or("no baseline"),
        req.workloads.len()
    )
}

/// What `ksearch eval` says once the yardstick is measured: its time and how steady it was
/// (the anchor's times, and where scores are converted through it, the baseline/reference
/// ratio).
pub fn yardstick_measured(y: &crate::Yardstick) -> String {
    let anchor = match y.anchor {
        crate::Anchor::Reference => "reference",
        crate::Anchor::Baseline => "baseline",
    };
    let ratio = match y.anchor {
        crate::Anchor::Reference if y.baseline => format!(
            " and the baseline/reference ratio ±{:.1}%",
            y.ratio_spread() * 100.0
        ),
        _ => String::new(),
    };
    format!(
        "ksearch: yardstick measured in {:.1} s; between its blocks the {anchor} (what \
         evaluations pair candidates with) moved ±{:.1}%{ratio}",
        y.seconds,
        y.spread() * 100.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::parse_result_line;

    fn fixture(name: &str) -> EvalResult {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        parse_result_line(text.trim()).unwrap()
    }

    #[test]
    fn passed_result_table() {
        let r = fixture("result_passed.json");
        insta::assert_snapshot!(render_result("naive.c", &r));
    }

    #[test]
    fn rejected_result_shows_class_and_message() {
        let r = fixture("result_violation.json");
        let text = render_result("cheat.c", &r);
        assert!(text.contains("integrity_violation (stale_output)"));
        insta::assert_snapshot!(text);
    }

    #[test]
    fn the_sandbox_line_names_missing_layers() {
        let mut r = fixture("result_passed.json");
        assert!(!render_result("naive.c", &r).contains("sandbox"));
        let layer = |name: &str, active: bool| serde_json::json!({"name": name, "active": active});
        r.extra.insert(
            "sandbox".into(),
            serde_json::json!([layer("namespaces", true), layer("seccomp", true)]),
        );
        assert!(render_result("naive.c", &r).contains("sandbox: all 2 layers active"));
        r.extra.insert(
            "sandbox".into(),
            serde_json::json!([layer("namespaces", false), layer("seccomp", true)]),
        );
        let text = render_result("naive.c", &r);
        assert!(
            text.contains("sandbox: 1 of 2 layers active; not available here: namespaces"),
            "{text}"
        );
    }

    #[test]
    fn build_error_shows_the_end_of_the_log() {
        let r = fixture("result_build_error.json");
        insta::assert_snapshot!(render_result("broken.c", &r));
    }

    #[test]
    fn summary_lists_every_candidate() {
        let a = fixture("result_passed.json");
        let b = fixture("result_violation.json");
        insta::assert_snapshot!(render_summary(&[
            ("naive.c".into(), &a),
            ("cheat.c".into(), &b)
        ]));
    }

    #[test]
    fn columns_fit_the_widest_cell() {
        let mut t = Table::new(&[("a", Align::Left), ("n", Align::Right)]);
        t.row(vec!["long-name".into(), "1".into()]);
        t.row(vec!["x".into(), "12345".into()]);
        assert_eq!(
            t.render(),
            "a              n\nlong-name      1\nx          12345\n"
        );
    }

    #[test]
    fn durations_pick_a_unit() {
        assert_eq!(format_ns(812.0), "812 ns");
        assert_eq!(format_ns(12_345.0), "12.3 µs");
        assert_eq!(format_ns(1_234_567.0), "1.23 ms");
        assert_eq!(format_ns(2.5e9), "2.50 s");
        assert_eq!(format_ns(f64::NAN), "-");
    }
}
