//! `ksearch report`: a run as one self-contained HTML file (no network: inline SVG, CSS and a
//! little vanilla JavaScript), written to the run's directory when `ksearch run` ends.
//!
//! What is drawn is decided here, in Rust: the summary, the best-so-far curves (over
//! evaluations and over wall time, failures marked by class), the world-model tree (native
//! `<details>` elements, so it folds without script) and the candidates table. The script only
//! sorts the table and fills the detail panel of a clicked candidate: its source, a diff
//! against its parent, its evaluation log and the proposer exchange that produced it. Those
//! texts are embedded gzip-compressed (base64 in a JSON block) and unpacked on demand by the
//! browser's `DecompressionStream`, so a report of thousands of candidates stays small and
//! opens fast. The page sets `window.ksearchReady` once its script has run (the browser test
//! waits for it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;

use base64::Engine as _;
use serde_json::Value;

use ksearch_store::{CandidateKind, CandidateRow, EvaluationRow, ExchangeRow, RunStore};

use super::{counts_line, finished, headline, recheck_of, render_time, world_model, ReportError};
use crate::accounting::TimeAccount;
use crate::world_model::{Node, NodeId, NodeState};

/// Characters of an evaluation log kept in the report (its tail).
const LOG_CHARS: usize = 8000;
/// The plots' size in SVG units.
const PLOT_W: f64 = 640.0;
const PLOT_H: f64 = 240.0;
const PAD: f64 = 40.0;
/// Tree levels shown unfolded (the path to the best kernel always is).
const OPEN_LEVELS: usize = 2;

/// A rendered report: the page and what it holds.
pub struct HtmlReport {
    pub html: String,
    pub candidates: usize,
    pub evaluations: usize,
}

/// The report of the run in `store`, finished or not.
pub fn render_html(store: &RunStore) -> Result<HtmlReport, ReportError> {
    let candidates = store.candidates()?;
    let evaluations = store.evaluations()?;
    let exchanges = store.exchanges()?;
    let mut blobs = Blobs::default();

    let mut body = String::new();
    summary(store, &candidates, &evaluations, &mut body)?;
    curves(&candidates, &evaluations, &mut body)?;
    tree(store, &candidates, &mut body)?;
    table(
        store,
        &candidates,
        &evaluations,
        &exchanges,
        &mut blobs,
        &mut body,
    )?;

    let mut html = String::with_capacity(body.len() + blobs.bytes + 16_384);
    write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>ksearch run {}</title><style>{STYLE}</style></head><body>\n",
        esc(store.id())
    )?;
    html.push_str(&body);
    html.push_str("<script type=\"application/json\" id=\"blobs\">");
    html.push_str(&script_json(&blobs.map));
    html.push_str("</script>\n<script>");
    html.push_str(SCRIPT);
    html.push_str("</script>\n</body></html>\n");
    Ok(HtmlReport {
        html,
        candidates: candidates.len(),
        evaluations: evaluations.len(),
    })
}

// -- summary ---------------------------------------------------------------------------------

fn summary(
    store: &RunStore,
    candidates: &[CandidateRow],
    evaluations: &[EvaluationRow],
    out: &mut String,
) -> Result<(), ReportError> {
    let c = store.config();
    writeln!(out, "<header><h1>ksearch run {}</h1>", esc(store.id()))?;
    writeln!(
        out,
        "<p class=\"config\">task <b>{}</b> · backend <b>{}</b> · strategy {} · proposer {} · \
         selection {} · seed {} · budgets <code>{}</code> · started {} · ksearch {}</p></header>",
        esc(&c.task),
        esc(&c.backend),
        esc(&c.strategy),
        esc(&c.proposer),
        esc(&c.selection),
        c.seed,
        esc(&c.budgets.to_string()),
        esc(&c.created_at),
        esc(&c.ksearch_version)
    )?;
    writeln!(out, "<section id=\"summary\"><h2>Summary</h2>")?;
    if let Some(device) = device(evaluations) {
        writeln!(out, "<p>device: {}</p>", esc(&device))?;
    }
    let outcome = finished(store)?;
    match &outcome {
        Some(o) => writeln!(out, "<p>status: finished — {}</p>", esc(&o.stop_reason))?,
        None => writeln!(out, "<p>status: not finished (running or interrupted)</p>")?,
    }
    writeln!(
        out,
        "<p>{}</p>",
        esc(&counts_line(
            candidates,
            evaluations,
            &store.usage_totals()?
        ))
    )?;
    if let Some((o, best)) = outcome.as_ref().and_then(|o| Some((o, o.best.as_ref()?))) {
        writeln!(
            out,
            "<p class=\"best\">best: candidate <a href=\"#c{id}\" data-goto=\"{id}\">{id}</a> \
             (round {}, node {})</p><ul class=\"headline\">",
            best.round,
            esc(best.node.as_deref().unwrap_or("-")),
            id = best.candidate_id
        )?;
        for line in headline::lines(o) {
            writeln!(out, "<li>{}</li>", esc(&line))?;
        }
        writeln!(out, "<li>search score {:.3}</li></ul>", best.score)?;
        if let Some(r) = recheck_of(o) {
            writeln!(
                out,
                "<p>re-check on every workload (fresh process and seed): {}</p>",
                esc(r.status.as_deref().unwrap_or("?"))
            )?;
        }
        best_table(evaluations, best.candidate_id, out)?;
    }
    if let Some(yard) = yardstick_lines(candidates, evaluations) {
        writeln!(out, "<details><summary>reference and baseline (the run's yardstick)</summary><pre>{}</pre></details>", esc(&yard))?;
    }
    writeln!(
        out,
        "<details open><summary>time</summary><pre class=\"time\">{}</pre></details></section>",
        esc(render_time(&TimeAccount::of_run(store)?).trim())
    )?;
    Ok(())
}

/// The machine the evaluations ran on, from the latest one's environment: the GPU where there
/// is one, else the CPU model and cores.
fn device(evaluations: &[EvaluationRow]) -> Option<String> {
    let env = evaluations
        .iter()
        .rev()
        .find_map(|e| e.result.get("environment").filter(|v| v.is_object()))?;
    let text = |k: &str| env.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    if let Some(gpu) = text("gpu") {
        let cc = text("compute_capability")
            .map(|c| format!(" (compute capability {c})"))
            .unwrap_or_default();
        return Some(format!("{gpu}{cc}"));
    }
    let cpu = text("cpu_model")?;
    let cores = env.get("cores").and_then(Value::as_u64);
    Some(match cores {
        Some(n) => format!("{cpu}, {n} cores"),
        None => cpu.to_owned(),
    })
}

/// The search's yardstick (that of its latest evaluation; a re-check measures its own on more
/// workloads): per workload, the reference's and the baseline's medians with their intervals.
fn yardstick_lines(candidates: &[CandidateRow], evaluations: &[EvaluationRow]) -> Option<String> {
    let rechecks = recheck_ids(candidates);
    let y = evaluations
        .iter()
        .rev()
        .filter(|e| !rechecks.contains(&e.candidate_id))
        .find_map(|e| e.result.get("yardstick").filter(|v| !v.is_null()))?;
    let mut s = String::new();
    for (name, w) in y.get("workloads")?.as_object()? {
        let _ = write!(s, "{name}:");
        for who in ["reference", "baseline"] {
            let Some(m) = w.get(who) else { continue };
            let ms = |k: &str| m.get(k).and_then(Value::as_f64).map(|v| v / 1e6);
            if let Some(med) = ms("median_ns") {
                let _ = write!(s, "  {who} {med:.4} ms");
                if let (Some(lo), Some(hi)) = (ms("lo_ns"), ms("hi_ns")) {
                    let _ = write!(s, " ({lo:.4}–{hi:.4})");
                }
            }
        }
        s.push('\n');
    }
    (!s.is_empty()).then_some(s)
}

/// The best kernel's evaluation per workload: median time, speedup over the baseline with its
/// interval, fraction of the hardware's peak (roofline).
fn best_table(
    evaluations: &[EvaluationRow],
    best: i64,
    out: &mut String,
) -> Result<(), ReportError> {
    let Some(e) = evaluations.iter().rev().find(|e| e.candidate_id == best) else {
        return Ok(());
    };
    let rows: Vec<&Value> = e.result["workloads"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|w| w["held_out"].as_bool() != Some(true))
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "<table class=\"best-table\"><thead><tr><th>workload</th><th>median (µs)</th>\
         <th>× baseline</th><th>interval</th><th>of peak</th></tr></thead><tbody>"
    )?;
    for w in rows {
        let f = |k: &str| w[k].as_f64();
        let iv = w["speedup_interval"]
            .as_array()
            .and_then(|a| Some((a.first()?.as_f64()?, a.get(1)?.as_f64()?)));
        writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(w["name"].as_str().unwrap_or("?")),
            f("candidate_median_ns")
                .map(|v| format!("{:.1}", v / 1e3))
                .unwrap_or_default(),
            f("speedup_vs_baseline")
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default(),
            iv.map(|(lo, hi)| format!("{lo:.3}–{hi:.3}"))
                .unwrap_or_default(),
            f("roofline_fraction")
                .map(|v| format!("{:.0}%", v * 100.0))
                .unwrap_or_default(),
        )?;
    }
    writeln!(out, "</tbody></table>")?;
    Ok(())
}

// -- curves ----------------------------------------------------------------------------------

/// The candidates that are re-checks (whose evaluations are not the search's own).
fn recheck_ids(candidates: &[CandidateRow]) -> BTreeSet<i64> {
    candidates
        .iter()
        .filter(|c| c.kind == CandidateKind::Recheck)
        .map(|c| c.id)
        .collect()
}

/// One search evaluation as the curves see it.
struct Point {
    index: usize,
    seconds: f64,
    score: Option<f64>,
    status: String,
    candidate: i64,
}

fn curves(
    candidates: &[CandidateRow],
    evaluations: &[EvaluationRow],
    out: &mut String,
) -> Result<(), ReportError> {
    let rechecks = recheck_ids(candidates);
    let start = evaluations
        .iter()
        .find_map(|e| ksearch_store::timestamp_millis(&e.created_at));
    let points: Vec<Point> = evaluations
        .iter()
        .filter(|e| !rechecks.contains(&e.candidate_id))
        .enumerate()
        .map(|(i, e)| Point {
            index: i + 1,
            seconds: match (start, ksearch_store::timestamp_millis(&e.created_at)) {
                (Some(a), Some(b)) => (b - a) as f64 / 1000.0,
                _ => i as f64,
            },
            score: e.score.filter(|_| e.status == "passed"),
            status: e.status.clone(),
            candidate: e.candidate_id,
        })
        .collect();
    writeln!(
        out,
        "<section id=\"progress\"><h2>Best so far</h2><div class=\"plots\">"
    )?;
    plot(out, "curve", "evaluations", &points, |p| p.index as f64)?;
    plot(out, "curve-wall", "wall time (s)", &points, |p| p.seconds)?;
    let mut failures: BTreeMap<&str, usize> = BTreeMap::new();
    for p in points.iter().filter(|p| p.score.is_none()) {
        *failures.entry(p.status.as_str()).or_default() += 1;
    }
    write!(out, "</div><p class=\"legend\">")?;
    if failures.is_empty() {
        write!(out, "no failed evaluation")?;
    }
    for (status, n) in failures {
        write!(
            out,
            "<span class=\"fail-key {}\">✕ {} {n}</span> ",
            class_of(status),
            esc(status)
        )?;
    }
    writeln!(out, "</p></section>")?;
    Ok(())
}

/// A chart's opening: the `<svg>` element, its axes, the x axis's label and the two axis
/// ends (the top score, the last x).
fn svg_frame(
    out: &mut String,
    id: &str,
    aria: &str,
    x_label: &str,
    y_top: f64,
    x_end: &str,
) -> std::fmt::Result {
    write!(
        out,
        "<svg id=\"{id}\" class=\"plot\" viewBox=\"0 0 {PLOT_W} {PLOT_H}\" role=\"img\" \
         aria-label=\"{aria}\">\
         <line class=\"axis\" x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>\
         <line class=\"axis\" x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\"/>\
         <text x=\"{mid}\" y=\"{lab}\" class=\"label\">{x_label}</text>\
         <text x=\"4\" y=\"{PAD}\" class=\"label\">{y_top:.3}</text>\
         <text x=\"{r}\" y=\"{tick}\" class=\"label end\">{x_end}</text>",
        b = PLOT_H - PAD,
        r = PLOT_W - PAD,
        mid = PLOT_W / 2.0,
        lab = PLOT_H - 8.0,
        tick = PLOT_H - PAD + 14.0,
    )
}

fn plot(
    out: &mut String,
    id: &str,
    x_label: &str,
    points: &[Point],
    x_of: impl Fn(&Point) -> f64,
) -> Result<(), ReportError> {
    let scores: Vec<f64> = points.iter().filter_map(|p| p.score).collect();
    let y_max = scores.iter().copied().fold(0.0_f64, f64::max).max(1e-9) * 1.1;
    let x_max = points.iter().map(&x_of).fold(0.0_f64, f64::max).max(1.0);
    let sx = |x: f64| PAD + x / x_max * (PLOT_W - 2.0 * PAD);
    let sy = |y: f64| PLOT_H - PAD - y / y_max * (PLOT_H - 2.0 * PAD);
    svg_frame(
        out,
        id,
        &format!("best score so far over {x_label}"),
        x_label,
        y_max / 1.1,
        &format!("{x_max:.0}"),
    )?;
    // The best score so far, as a step line from the first passed evaluation on.
    let mut d = String::new();
    let mut best: Option<f64> = None;
    for p in points {
        let x = sx(x_of(p));
        if let Some(s) = p.score {
            if best.is_none_or(|b| s > b) {
                match best {
                    None => write!(d, "M{x:.1},{:.1}", sy(s))?,
                    Some(b) => write!(d, " L{x:.1},{:.1} L{x:.1},{:.1}", sy(b), sy(s))?,
                }
                best = Some(s);
            }
        }
    }
    if let Some(b) = best {
        write!(d, " L{:.1},{:.1}", sx(x_max), sy(b))?;
        write!(out, "<path class=\"best-so-far\" d=\"{d}\"/>")?;
    }
    for p in points {
        let x = sx(x_of(p));
        match p.score {
            Some(s) => write!(
                out,
                "<circle class=\"eval\" cx=\"{x:.1}\" cy=\"{:.1}\" r=\"2.5\"><title>candidate \
                 {}: {s:.3}</title></circle>",
                sy(s),
                p.candidate
            )?,
            None => write!(
                out,
                "<text class=\"fail {}\" x=\"{x:.1}\" y=\"{:.1}\">✕<title>candidate {}: \
                 {}</title></text>",
                class_of(&p.status),
                PLOT_H - PAD + 4.0,
                p.candidate,
                esc(&p.status)
            )?,
        }
    }
    writeln!(out, "</svg>")?;
    Ok(())
}

// -- world model -----------------------------------------------------------------------------

fn tree(
    store: &RunStore,
    candidates: &[CandidateRow],
    out: &mut String,
) -> Result<(), ReportError> {
    writeln!(out, "<section id=\"tree-section\"><h2>World model</h2>")?;
    let Some(wm) = world_model(store)? else {
        writeln!(
            out,
            "<div id=\"tree\"><p>no world model (strategy without one)</p></div></section>"
        )?;
        return Ok(());
    };
    let best_path: BTreeSet<NodeId> = wm
        .best_closed()
        .and_then(|b| wm.path_to_root(&b.id).ok())
        .unwrap_or_default()
        .into_iter()
        .collect();
    // A node's solution names a source; the table names candidates (the first with it).
    let mut first_with: BTreeMap<&str, i64> = BTreeMap::new();
    for c in candidates {
        first_with.entry(c.source_id.as_str()).or_insert(c.id);
    }
    let mut children: BTreeMap<&NodeId, Vec<&Node>> = BTreeMap::new();
    for n in wm.nodes() {
        if let Some(p) = &n.parent {
            children.entry(p).or_default().push(n);
        }
    }
    writeln!(
        out,
        "<p class=\"legend\"><span class=\"node-key open\">open</span> \
         <span class=\"node-key closed\">closed (solved)</span> \
         <span class=\"node-key too-hard\">too hard</span> \
         <span class=\"node-key pruned\">pruned</span> · ★ the path to the best kernel · \
         hover a node for its ratings</p><div id=\"tree\"><ul>"
    )?;
    let mut seen = BTreeSet::new();
    if let Some(root) = wm.root() {
        node(root, 0, &children, &best_path, &first_with, &mut seen, out)?;
    }
    for n in wm.nodes().iter().filter(|n| !seen.contains(&n.id)) {
        node(
            n,
            0,
            &children,
            &best_path,
            &first_with,
            &mut BTreeSet::new(),
            out,
        )?;
    }
    writeln!(out, "</ul></div></section>")?;
    Ok(())
}

fn node<'a>(
    n: &'a Node,
    depth: usize,
    children: &BTreeMap<&NodeId, Vec<&'a Node>>,
    best_path: &BTreeSet<NodeId>,
    first_with: &BTreeMap<&str, i64>,
    seen: &mut BTreeSet<&'a NodeId>,
    out: &mut String,
) -> Result<(), ReportError> {
    if !seen.insert(&n.id) {
        return Ok(());
    }
    let (state, detail) = match &n.state {
        NodeState::Open => ("open", String::new()),
        NodeState::Closed { solution } => (
            "closed",
            match first_with.get(solution.solution_id.as_str()) {
                Some(id) => format!("score {:.3} (candidate {id})", solution.score),
                None => format!("score {:.3}", solution.score),
            },
        ),
        NodeState::TooHard { cycles } => ("too-hard", format!("too hard after {cycles} cycle(s)")),
        NodeState::Pruned => ("pruned", String::new()),
    };
    let name = match n.display_name() {
        s if s.is_empty() => "(root)".to_owned(),
        s => s,
    };
    let hover = format!(
        "{}\nrating {:.1}/10 · confidence {:.2} · attempts {} (failed {}) · cycles {} · \
         visits {}{}{}",
        n.id.as_str(),
        n.overall_rating,
        n.confidence,
        n.attempts,
        n.failures,
        n.cycles,
        n.visits,
        if n.notes.is_empty() { "" } else { "\n" },
        n.notes.chars().take(400).collect::<String>()
    );
    let best = if best_path.contains(&n.id) {
        " best"
    } else {
        ""
    };
    let label = format!(
        "{}<span class=\"nid\">{}</span> {}{}",
        if best.is_empty() { "" } else { "★ " },
        esc(n.id.as_str()),
        esc(&name),
        if detail.is_empty() {
            String::new()
        } else {
            format!(" <span class=\"detail\">{}</span>", esc(&detail))
        }
    );
    let kids = children.get(&n.id).map(Vec::as_slice).unwrap_or(&[]);
    write!(
        out,
        "<li class=\"node {state}{best}\" data-node=\"{}\" title=\"{}\">",
        esc(n.id.as_str()),
        esc(&hover)
    )?;
    if kids.is_empty() {
        write!(out, "<span class=\"leaf\">{label}</span>")?;
    } else {
        let open = if depth < OPEN_LEVELS || best_path.contains(&n.id) {
            " open"
        } else {
            ""
        };
        write!(out, "<details{open}><summary>{label}</summary><ul>")?;
        for k in kids {
            node(k, depth + 1, children, best_path, first_with, seen, out)?;
        }
        write!(out, "</ul></details>")?;
    }
    writeln!(out, "</li>")?;
    Ok(())
}

// -- candidates ------------------------------------------------------------------------------

fn table(
    store: &RunStore,
    candidates: &[CandidateRow],
    evaluations: &[EvaluationRow],
    exchanges: &[ExchangeRow],
    blobs: &mut Blobs,
    out: &mut String,
) -> Result<(), ReportError> {
    let mut last_eval: BTreeMap<i64, &EvaluationRow> = BTreeMap::new();
    for e in evaluations {
        last_eval.insert(e.candidate_id, e);
    }
    let source_of: BTreeMap<i64, &CandidateRow> = candidates.iter().map(|c| (c.id, c)).collect();
    // Each round's proposer calls, packed once: round -> blob key ("" when it made none).
    let rounds = RoundStarts::of(candidates);
    let mut round_keys: BTreeMap<u32, String> = BTreeMap::new();
    // The workloads timed in the run, for the table's columns.
    let mut workloads: Vec<String> = Vec::new();
    for e in evaluations {
        for w in e.result["workloads"].as_array().into_iter().flatten() {
            if w["held_out"].as_bool() == Some(true) {
                continue;
            }
            if let Some(n) = w["name"].as_str() {
                if !workloads.iter().any(|x| x == n) {
                    workloads.push(n.to_owned());
                }
            }
        }
    }
    writeln!(
        out,
        "<section id=\"candidates-section\"><h2>Candidates</h2><p class=\"legend\">click a \
         column to sort, a row for its source, diff, log and proposer exchange</p>\
         <div class=\"split\"><div class=\"scroll\"><table id=\"candidates\"><thead><tr>\
         <th data-type=\"n\">id</th><th data-type=\"n\">round</th><th data-type=\"n\">cycle</th>\
         <th>node</th><th>kind</th><th>status</th><th data-type=\"n\">score</th>"
    )?;
    for w in &workloads {
        write!(
            out,
            "<th data-type=\"n\" title=\"median, µs\">{}</th>",
            esc(w)
        )?;
    }
    writeln!(out, "<th>note</th></tr></thead><tbody>")?;
    for c in candidates {
        let e = last_eval.get(&c.id);
        let status = e.map(|e| e.status.as_str()).unwrap_or("not evaluated");
        let src = blobs.add_source(store, c)?;
        let parent_src = match c.parent_candidate.and_then(|p| source_of.get(&p)) {
            Some(p) => blobs.add_source(store, p)?,
            None => String::new(),
        };
        let log = e
            .map(|e| log_text(e))
            .filter(|t| !t.is_empty())
            .map(|t| blobs.add(&format!("l{}", c.id), &t))
            .unwrap_or_default();
        let exchange = match c.kind {
            CandidateKind::Attempt => round_keys
                .entry(c.round)
                .or_insert_with(|| {
                    let calls = rounds.calls(c.round, exchanges);
                    if calls.is_empty() {
                        return String::new();
                    }
                    let text = calls
                        .iter()
                        .map(|x| exchange_text(x))
                        .collect::<Vec<_>>()
                        .join("\n\n==========\n\n");
                    blobs.add(&format!("x{}", c.round), &text)
                })
                .clone(),
            _ => String::new(),
        };
        let message = e
            .and_then(|e| e.result["message"].as_str())
            .filter(|m| !m.is_empty())
            .unwrap_or("");
        let note = if message.is_empty() {
            c.proposer_note.as_str()
        } else {
            message
        };
        write!(
            out,
            "<tr id=\"c{id}\" class=\"cand {cls}\" data-id=\"{id}\" data-src=\"{src}\" \
             data-parent=\"{parent}\" data-parent-src=\"{parent_src}\" data-log=\"{log}\" \
             data-x=\"{exchange}\"><td>{id}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td>",
            c.round,
            c.cycle,
            esc(c.node_id.as_deref().unwrap_or("-")),
            c.kind.as_str(),
            esc(status),
            e.and_then(|e| e.score)
                .filter(|_| status == "passed")
                .map(|s| format!("{s:.3}"))
                .unwrap_or_default(),
            id = c.id,
            cls = class_of(status),
            parent = c
                .parent_candidate
                .map(|p| p.to_string())
                .unwrap_or_default(),
        )?;
        for w in &workloads {
            let us = e.and_then(|e| {
                e.result["workloads"]
                    .as_array()?
                    .iter()
                    .find(|x| x["name"].as_str() == Some(w))?["candidate_median_ns"]
                    .as_f64()
            });
            write!(
                out,
                "<td>{}</td>",
                us.map(|ns| format!("{:.1}", ns / 1e3)).unwrap_or_default()
            )?;
        }
        writeln!(
            out,
            "<td class=\"note\">{}</td></tr>",
            esc(&note.chars().take(160).collect::<String>())
        )?;
    }
    writeln!(
        out,
        "</tbody></table></div><div id=\"detail\"><h3 id=\"detail-title\">select a candidate\
         </h3><pre id=\"source\"></pre><details><summary>diff against its parent</summary>\
         <pre id=\"diff\"></pre></details><details><summary>evaluation log</summary>\
         <pre id=\"log\"></pre></details><details><summary>proposer calls of its round\
         </summary>\
         <pre id=\"exchange\"></pre></details></div></div></section>"
    )?;
    Ok(())
}

/// The evaluation's message and the tail of its log.
fn log_text(e: &EvaluationRow) -> String {
    let mut s = String::new();
    if let Some(m) = e.result["message"].as_str().filter(|m| !m.is_empty()) {
        s.push_str(m);
        s.push_str("\n\n");
    }
    if let Some(t) = e.result["log_tail"].as_str() {
        let skip = t.chars().count().saturating_sub(LOG_CHARS);
        s.extend(t.chars().skip(skip));
    }
    s
}

/// When each round's candidates began to be stored, to find the proposer calls of a
/// candidate's round. The store does not link a call to the candidate it wrote: the engine
/// stores a round's calls at its checkpoint, after the round's candidates, so they are the
/// calls stored from the round's first candidate on and before the next round's first
/// candidate (which may include the world-model steps that opened that round).
struct RoundStarts<'a>(BTreeMap<u32, &'a str>);

impl<'a> RoundStarts<'a> {
    fn of(candidates: &'a [CandidateRow]) -> Self {
        let mut starts: BTreeMap<u32, &str> = BTreeMap::new();
        for c in candidates
            .iter()
            .filter(|c| c.kind == CandidateKind::Attempt)
        {
            let at = starts.entry(c.round).or_insert(c.created_at.as_str());
            *at = (*at).min(c.created_at.as_str());
        }
        RoundStarts(starts)
    }

    fn calls<'x>(&self, round: u32, exchanges: &'x [ExchangeRow]) -> Vec<&'x ExchangeRow> {
        let Some(from) = self.0.get(&round) else {
            return Vec::new();
        };
        // The first candidate of any later round (candidates of a later round are stored
        // later, whatever their rounds' numbers).
        let until = self.0.range(round + 1..).map(|(_, at)| *at).min();
        exchanges
            .iter()
            .filter(|x| {
                x.created_at.as_str() >= *from && until.is_none_or(|u| x.created_at.as_str() < u)
            })
            .collect()
    }
}

fn exchange_text(x: &ExchangeRow) -> String {
    let e = &x.exchange;
    format!(
        "{} · {} {} · {} in / {} out tokens · ${:.4} · {} ms{}\n\n--- prompt ---\n{}\n\n--- \
         response ---\n{}",
        e.role,
        e.provider,
        e.model,
        e.input_tokens,
        e.output_tokens,
        e.cost_usd,
        e.latency_ms,
        if e.cached { " (cached)" } else { "" },
        e.prompt,
        e.response
    )
}

// -- embedded texts --------------------------------------------------------------------------

/// Texts the page unpacks on demand: key -> base64 of the gzip-compressed text.
#[derive(Default)]
struct Blobs {
    map: BTreeMap<String, String>,
    bytes: usize,
}

impl Blobs {
    fn add(&mut self, key: &str, text: &str) -> String {
        if !self.map.contains_key(key) {
            let packed = base64::engine::general_purpose::STANDARD.encode(gzip(text.as_bytes()));
            self.bytes += packed.len();
            self.map.insert(key.to_owned(), packed);
        }
        key.to_owned()
    }

    /// A candidate's source, once per distinct source.
    fn add_source(&mut self, store: &RunStore, c: &CandidateRow) -> Result<String, ReportError> {
        let key = format!("s{}", c.source_id.as_str());
        if !self.map.contains_key(&key) {
            let text = store.source(&c.source_id)?;
            self.add(&key, &text);
        }
        Ok(key)
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = enc.write_all(data);
    enc.finish().unwrap_or_default()
}

/// JSON safe inside a `<script>` element.
fn script_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v)
        .unwrap_or_else(|_| "{}".into())
        .replace("</", "<\\/")
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A CSS class for an evaluation status.
fn class_of(status: &str) -> String {
    let s: String = status
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("status-{s}")
}

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 1.5em 2em;color:#1d2733;background:#fbfbfd}
h1{font-size:1.4em;margin:.8em 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #dde}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f2f3f7;padding:.6em;overflow:auto;max-height:32em;white-space:pre}
.config{color:#556}.best{font-weight:600}.headline{margin:.2em 0}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{width:640px;max-width:100%;height:auto;background:#fff;border:1px solid #e3e5ee}
.plot .axis{stroke:#889;stroke-width:1}.plot .label{font-size:11px;fill:#556}.plot .end{text-anchor:end}
.plot .best-so-far{fill:none;stroke:#1f6feb;stroke-width:2}.plot .eval{fill:#1f6feb;opacity:.45}
.plot .fail{font-size:9px;fill:#c0392b;text-anchor:middle}.fail-key{color:#c0392b;margin-right:1em}
#tree{max-height:40em;overflow:auto;background:#fff;border:1px solid #e3e5ee;padding:.4em .6em}
#tree ul{list-style:none;padding-left:1.2em;margin:0}#tree>ul{padding-left:0}
#tree li{margin:.1em 0}#tree summary{cursor:pointer}
.node .nid{font-family:ui-monospace,monospace;font-size:11px;color:#667}
#tree summary,#tree .leaf{font-weight:400}#tree .node.best>details>summary,#tree .node.best>.leaf{font-weight:700}
.node.open>details>summary,.node.open>.leaf,.node-key.open{color:#1d2733}
.node.closed>details>summary,.node.closed>.leaf,.node-key.closed{color:#1a7f37}
.node.too-hard>details>summary,.node.too-hard>.leaf,.node-key.too-hard{color:#b35900}
.node.pruned>details>summary,.node.pruned>.leaf,.node-key.pruned{color:#8b8fa3;text-decoration:line-through}
.node .detail{color:#556;font-size:12px}.node-key{margin-right:1em}
.split{display:flex;gap:1em;align-items:flex-start}.scroll{overflow:auto;max-height:70vh;flex:1 1 60%}
#detail{flex:1 1 40%;min-width:22em;position:sticky;top:0}
table{border-collapse:collapse;font-size:12px}th,td{padding:2px 6px;border-bottom:1px solid #e6e8ef;text-align:right;white-space:nowrap}
th{position:sticky;top:0;background:#eef0f6;cursor:pointer}td.note{text-align:left;white-space:normal;max-width:28em}
tr.cand{cursor:pointer}tr.cand:hover{background:#eef3ff}tr.cand.selected{background:#dce7ff}
tr.status-passed td:nth-child(6){color:#1a7f37}tr.cand:not(.status-passed) td:nth-child(6){color:#c0392b}
.legend{color:#556;font-size:12px}.best-table{margin:.4em 0}
"#;

const SCRIPT: &str = r#"
(function(){
  "use strict";
  var blobs = JSON.parse(document.getElementById("blobs").textContent);
  function unpack(key){
    if(!key || !(key in blobs)) return Promise.resolve("");
    var bin = atob(blobs[key]), bytes = new Uint8Array(bin.length);
    for(var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text();
  }
  // A line diff (longest common subsequence), for a candidate against its parent.
  function diff(a, b){
    var x = a.split("\n"), y = b.split("\n"), n = x.length, m = y.length;
    if(n * m > 4e6) return "(too large to diff here)";
    var t = [];
    for(var i = 0; i <= n; i++){ t.push(new Uint32Array(m + 1)); }
    for(i = n - 1; i >= 0; i--) for(var j = m - 1; j >= 0; j--)
      t[i][j] = x[i] === y[j] ? t[i + 1][j + 1] + 1 : Math.max(t[i + 1][j], t[i][j + 1]);
    var out = []; i = 0; j = 0;
    while(i < n && j < m){
      if(x[i] === y[j]){ out.push("  " + x[i]); i++; j++; }
      else if(t[i + 1][j] >= t[i][j + 1]){ out.push("- " + x[i]); i++; }
      else { out.push("+ " + y[j]); j++; }
    }
    while(i < n) out.push("- " + x[i++]);
    while(j < m) out.push("+ " + y[j++]);
    return out.join("\n");
  }
  var table = document.getElementById("candidates");
  var body = table.tBodies[0];
  var selected = null;
  function show(tr){
    if(selected) selected.classList.remove("selected");
    selected = tr; tr.classList.add("selected");
    var d = tr.dataset;
    document.getElementById("detail-title").textContent = "candidate " + d.id +
      (d.parent ? " (parent " + d.parent + ")" : "");
    unpack(d.src).then(function(src){
      document.getElementById("source").textContent = src || "(no source stored)";
      if(d.parentSrc){
        unpack(d.parentSrc).then(function(p){ document.getElementById("diff").textContent = diff(p, src); });
      } else {
        document.getElementById("diff").textContent = "(no parent)";
      }
    });
    unpack(d.log).then(function(t){ document.getElementById("log").textContent = t || "(no log)"; });
    unpack(d.x).then(function(t){ document.getElementById("exchange").textContent = t || "(no proposer call: the seed, a re-check, or an offline proposal)"; });
  }
  body.addEventListener("click", function(ev){
    var tr = ev.target.closest("tr.cand");
    if(tr) show(tr);
  });
  document.querySelectorAll("[data-goto]").forEach(function(a){
    a.addEventListener("click", function(){
      var tr = document.getElementById("c" + a.dataset.goto);
      if(tr){ show(tr); tr.scrollIntoView({block: "center"}); }
    });
  });
  var heads = table.tHead.rows[0].cells, order = {};
  Array.prototype.forEach.call(heads, function(th, col){
    th.addEventListener("click", function(){
      var numeric = th.dataset.type === "n", dir = order[col] = -(order[col] || -1);
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function(r, s){
        var a = r.cells[col].textContent, b = s.cells[col].textContent;
        if(numeric){
          var x = a === "" ? -Infinity : parseFloat(a), y = b === "" ? -Infinity : parseFloat(b);
          return (x - y) * dir;
        }
        return a.localeCompare(b) * dir;
      });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
  window.ksearchReady = true;
})();
"#;

// -- comparisons -----------------------------------------------------------------------------

/// `ksearch compare`'s page: every strategy's best-so-far curve on one chart (the median over
/// its runs, each run faint behind it), the comparison's table, and links to each run's own
/// report (`report.html` in the run's directory, next to this page's `runs_dir`).
pub fn render_compare(
    task: &str,
    rows: &[crate::compare::StrategyRow],
    records: &[crate::compare::RunRecord],
) -> String {
    const COLOURS: [&str; 6] = [
        "#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bf8700", "#57606a",
    ];
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ksearch compare \
         {t}</title><style>{STYLE}</style></head><body><header><h1>ksearch compare: {t}</h1>\
         </header><section id=\"progress\"><h2>Best search score so far</h2>",
        t = esc(task)
    );
    let n_max = records
        .iter()
        .map(|r| r.curve.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let y_max = records
        .iter()
        .flat_map(|r| r.curve.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1e-9)
        * 1.1;
    let sx = |i: usize| PAD + (i as f64) / (n_max as f64) * (PLOT_W - 2.0 * PAD);
    let sy = |y: f64| PLOT_H - PAD - y / y_max * (PLOT_H - 2.0 * PAD);
    let _ = svg_frame(
        &mut out,
        "curve",
        "best score so far per strategy",
        "evaluations",
        y_max / 1.1,
        &n_max.to_string(),
    );
    let path = |curve: &[f64]| -> String {
        let mut d = String::new();
        for (i, y) in curve.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                sx(i + 1),
                sy(*y)
            );
        }
        d
    };
    let mut legend = String::new();
    for (k, row) in rows.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let runs: Vec<&crate::compare::RunRecord> = records
            .iter()
            .filter(|r| r.strategy == row.strategy)
            .collect();
        for r in &runs {
            let _ = write!(
                out,
                "<path class=\"run\" d=\"{}\" style=\"fill:none;stroke:{colour};opacity:.25\"/>",
                path(&r.curve)
            );
        }
        let len = runs.iter().map(|r| r.curve.len()).max().unwrap_or(0);
        let median: Vec<f64> = (0..len)
            .map(|i| {
                let mut v: Vec<f64> = runs
                    .iter()
                    .map(|r| r.curve.get(i).or(r.curve.last()).copied().unwrap_or(0.0))
                    .collect();
                v.sort_by(f64::total_cmp);
                let m = v.len() / 2;
                if v.len().is_multiple_of(2) {
                    (v[m - 1] + v[m]) / 2.0
                } else {
                    v[m]
                }
            })
            .collect();
        let _ = write!(
            out,
            "<path class=\"best-so-far\" d=\"{}\" style=\"stroke:{colour}\"><title>{} (median \
             of {} runs)</title></path>",
            path(&median),
            row.strategy,
            runs.len()
        );
        let _ = write!(
            legend,
            "<span style=\"color:{colour}\">━ {}</span> ",
            row.strategy
        );
    }
    let _ = write!(
        out,
        "</svg><p class=\"legend\">{legend} · bold: the median over seeds; faint: each run</p>\
         </section><section><h2>Table</h2><pre>{}</pre></section><section><h2>Runs</h2><ul>",
        esc(&crate::compare::render(rows, records))
    );
    for r in records {
        let _ = write!(
            out,
            "<li>{} seed {}: <a href=\"{run}/report.html\">{run}</a></li>",
            r.strategy,
            r.seed,
            run = esc(&r.run)
        );
    }
    out.push_str("</ul></section><script>window.ksearchReady = true;</script></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ksearch_store::{NewCandidate, RunConfig};
    use serde_json::json;

    fn store(dir: &std::path::Path) -> RunStore {
        RunStore::create_with_id(
            dir,
            "20261202-000000-test",
            &RunConfig {
                task: "softmax".into(),
                backend: "cpu".into(),
                strategy: "world-model".into(),
                proposer: "offline".into(),
                selection: "calibrated".into(),
                seed: 1,
                secret_seed: 987_654_321,
                budgets: json!({"rounds": 1}),
                flags: json!({}),
                extra: json!({}),
                created_at: String::new(),
                ksearch_version: String::new(),
            },
        )
        .unwrap()
    }

    #[test]
    fn an_empty_run_still_renders_every_part() {
        let tmp = tempfile::tempdir().unwrap();
        let page = render_html(&store(tmp.path())).unwrap();
        assert_eq!((page.candidates, page.evaluations), (0, 0));
        for id in [
            "id=\"summary\"",
            "id=\"curve\"",
            "id=\"tree\"",
            "id=\"candidates\"",
            "id=\"blobs\"",
            "window.ksearchReady = true",
        ] {
            assert!(page.html.contains(id), "{id} missing");
        }
        assert!(
            !page.html.contains("987654321"),
            "the secret seed must stay out"
        );
    }

    #[test]
    fn a_candidate_opens_the_proposer_calls_of_its_round() {
        // The engine stores a round's calls at its checkpoint, after the round's candidates.
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        let pause = || std::thread::sleep(std::time::Duration::from_millis(3));
        let add = |round: u32, code: &str| {
            let source_id = s.put_source(code, "c").unwrap();
            s.add_candidate(&NewCandidate {
                source_id,
                parent_candidate: None,
                node_id: None,
                round,
                cycle: round,
                attempt: 1,
                sample: 0,
                kind: CandidateKind::Attempt,
                proposer_note: String::new(),
                knobs: Value::Null,
            })
            .unwrap()
        };
        let call = |prompt: &str| {
            s.record_exchange(&ksearch_store::Exchange {
                role: "code".into(),
                prompt: prompt.into(),
                response: "int x;".into(),
                model: "m".into(),
                provider: "p".into(),
                input_tokens: 1,
                output_tokens: 1,
                cost_usd: 0.0,
                latency_ms: 1,
                error: None,
                cached: false,
            })
            .unwrap();
        };
        let first = add(1, "int a;");
        pause();
        call("write round one");
        pause();
        let second = add(2, "int b;");
        pause();
        call("write round two");
        let page = render_html(&s).unwrap().html;
        let key = |id: i64| {
            let row = &page[page.find(&format!("id=\"c{id}\"")).unwrap()..];
            let at = row.find("data-x=\"").unwrap() + 8;
            row[at..at + row[at..].find('"').unwrap()].to_owned()
        };
        let blobs: serde_json::Map<String, Value> = serde_json::from_str(
            &page[page.find("id=\"blobs\">").unwrap() + "id=\"blobs\">".len()
                ..page.find("</script>").unwrap()]
                .replace("<\\/", "</"),
        )
        .unwrap();
        let text = |id: i64| {
            let packed = blobs[&key(id)].as_str().unwrap();
            let gz = base64::engine::general_purpose::STANDARD
                .decode(packed)
                .unwrap();
            let mut out = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out)
                .unwrap();
            out
        };
        assert!(text(first).contains("write round one") && !text(first).contains("round two"));
        assert!(text(second).contains("write round two") && !text(second).contains("round one"));
    }

    #[test]
    fn text_written_by_a_candidate_or_a_model_cannot_become_markup() {
        // Notes, messages and sources come from LLM replies and candidate processes.
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        let evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>";
        let source_id = s.put_source(&format!("// {evil}\nint x;"), "c").unwrap();
        let id = s
            .add_candidate(&NewCandidate {
                source_id,
                parent_candidate: None,
                node_id: Some(evil.into()),
                round: 0,
                cycle: 0,
                attempt: 1,
                sample: 0,
                kind: CandidateKind::Seed,
                proposer_note: evil.into(),
                knobs: Value::Null,
            })
            .unwrap();
        s.record_evaluation(
            id,
            "incorrect",
            None,
            &json!({"status": "incorrect", "message": evil, "log_tail": evil,
                    "workloads": [{"name": evil, "held_out": false,
                                   "candidate_median_ns": 1.0}]}),
        )
        .unwrap();
        let page = render_html(&s).unwrap().html;
        // The only script elements are the page's own two.
        assert_eq!(page.matches("<script").count(), 2, "{page}");
        assert!(!page.contains("<img"), "{page}");
        assert!(page.contains("&lt;/script&gt;"));
    }
}
