//! The path to a run's best kernel: the steps the search kept, from the seed to the winner,
//! as `ksearch show` and the export README print them.

use std::fmt::Write as _;

use ksearch_store::{CandidateKind, CandidateRow, RunStore};

use super::ReportError;

/// One kept step on the way to the best kernel: its score and its first shown workload.
struct Step {
    id: i64,
    round: u32,
    note: String,
    score: Option<f64>,
    headline: Option<(String, Option<f64>, Option<f64>)>,
}

fn step(store: &RunStore, cand: &CandidateRow) -> Result<Step, ReportError> {
    let eval = store.evaluation_for(cand.id)?;
    let headline = eval.as_ref().and_then(|e| {
        e.result["workloads"]
            .as_array()?
            .iter()
            .find(|w| !w["held_out"].as_bool().unwrap_or(false))
            .map(|w| {
                (
                    w["name"].as_str().unwrap_or("?").to_string(),
                    w["candidate_median_ns"].as_f64(),
                    // Over the baseline where the task has one, else over the reference: what
                    // the score is made of.
                    w["speedup_vs_baseline"]
                        .as_f64()
                        .or_else(|| w["speedup_vs_reference"].as_f64()),
                )
            })
    });
    Ok(Step {
        id: cand.id,
        round: cand.round,
        note: cand.proposer_note.clone(),
        score: eval.and_then(|e| e.score),
        headline,
    })
}

/// The best kernel's ancestry (parent links from the best back to where it started), as the
/// per-step table of what the search kept: score after each step, its ratio to the step
/// before and to the seed. A chain that does not start at the seed gets the seed as step 0,
/// so every ratio has the same reference.
pub fn render_path(store: &RunStore, best: i64) -> Result<String, ReportError> {
    let mut chain = Vec::new();
    let mut next = Some(best);
    while let Some(id) = next {
        let Some(cand) = store.candidate(id)? else {
            break;
        };
        // Only links to earlier candidates are followed, so a corrupt store cannot loop.
        next = cand.parent_candidate.filter(|p| *p < cand.id);
        chain.push(cand);
    }
    chain.reverse();
    if chain.first().map(|c| c.kind) != Some(CandidateKind::Seed) {
        if let Some(seed) = store
            .candidates()?
            .into_iter()
            .find(|c| c.kind == CandidateKind::Seed)
        {
            chain.insert(0, seed);
        }
    }
    let steps = chain
        .iter()
        .map(|c| step(store, c))
        .collect::<Result<Vec<_>, _>>()?;
    let mut s = String::new();
    let headline = steps
        .iter()
        .find_map(|st| st.headline.as_ref().map(|h| h.0.clone()));
    writeln!(
        s,
        "\npath to the best (score: the geometric-mean speedup the search ranks by{}):",
        headline
            .as_deref()
            .map(|h| format!("; {h}: median time and speedup"))
            .unwrap_or_default()
    )?;
    writeln!(
        s,
        "{:>4} {:>5} {:>5} {:>8} {:>8} {:>8} {:>10} {:>8}  change",
        "step", "cand", "round", "score", "x prev", "x seed", "ms", "speedup"
    )?;
    let seed_score = steps.first().and_then(|st| st.score).filter(|v| *v > 0.0);
    let mut prev: Option<f64> = None;
    for (i, st) in steps.iter().enumerate() {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let (ms, base) = match &st.headline {
            Some((name, t, x)) if Some(name) == headline.as_ref() => (
                t.map(|v| format!("{:.3}", v / 1e6))
                    .unwrap_or_else(|| "-".into()),
                x.map(|v| format!("{v:.2}x")).unwrap_or_else(|| "-".into()),
            ),
            _ => ("-".into(), "-".into()),
        };
        writeln!(
            s,
            "{:>4} {:>5} {:>5} {:>8} {:>8} {:>8} {:>10} {:>8}  {}",
            i,
            st.id,
            st.round,
            st.score
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into()),
            if i == 0 {
                "-".into()
            } else {
                ratio(st.score, prev)
            },
            ratio(st.score, seed_score),
            ms,
            base,
            st.note.chars().take(70).collect::<String>()
        )?;
        prev = st.score;
    }
    Ok(s)
}
