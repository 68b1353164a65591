//! `ksearch show` and `ksearch export`: reading a run back from its store.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::Value;

use ksearch_eval::report::render_result;
use ksearch_eval::EvalResult;
use ksearch_search::accounting::{TimeAccount, TimeKind, WallEnd};
use ksearch_search::world_model::WorldModel;
use ksearch_store::{CandidateKind, RunStore};

use crate::exit;
use crate::search::open_run;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// List every candidate, not only the last 15.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Directory to write the kernel and its README into; default: `<run dir>/export`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn show(args: &ShowArgs) -> Result<u8> {
    let store = open_run(&args.runs_dir, &args.run)?;
    print!("{}", render_show(&store, args.all)?);
    Ok(exit::OK)
}

/// The run's world model: the engine's live checkpoint, else the latest snapshot.
fn world_model(store: &RunStore) -> Result<Option<WorldModel>> {
    let value = match store.get_state("engine")? {
        Some(state) => Some(state["wm"].clone()),
        None => store.latest_world_model()?.map(|(_, _, v)| v),
    };
    value
        .map(|v| serde_json::from_value(v).context("the stored world model is unreadable"))
        .transpose()
}

fn score_of(store: &RunStore, candidate: i64) -> Result<Option<(String, Option<f64>)>> {
    Ok(store
        .evaluation_for(candidate)?
        .map(|e| (e.status, e.score)))
}

pub fn render_show(store: &RunStore, all: bool) -> Result<String> {
    let c = store.config();
    let mut s = String::new();
    writeln!(
        s,
        "run {}  task {}  backend {}  strategy {}  proposer {}  selection {}  seed {}",
        store.id(),
        c.task,
        c.backend,
        c.strategy,
        c.proposer,
        c.selection,
        c.seed
    )?;
    let summary = store.finish_summary()?;
    match &summary {
        Some(sum) => writeln!(
            s,
            "status: finished — {}",
            sum["stop_reason"].as_str().unwrap_or("?")
        )?,
        None => match store.writer()? {
            Some(w) => writeln!(
                s,
                "status: running{}",
                w.pid.map(|p| format!(" (process {p})")).unwrap_or_default()
            )?,
            None => writeln!(
                s,
                "status: interrupted (`ksearch resume {}` continues it)",
                store.id()
            )?,
        },
    }
    let candidates = store.candidates()?;
    let evaluations = store.evaluations()?;
    let passed = evaluations.iter().filter(|e| e.status == "passed").count();
    let usage = store.usage_totals()?;
    writeln!(
        s,
        "candidates {} · evaluations {} ({} passed, {} rejected) · proposer calls {} · tokens {} · ${:.2}",
        candidates.len(),
        evaluations.len(),
        passed,
        evaluations.len() - passed,
        usage.calls,
        usage.input_tokens + usage.output_tokens,
        usage.cost_usd
    )?;
    if let Some(f) = store.failed_calls()? {
        writeln!(
            s,
            "proposer errors: {} of {} calls; the last ({}, {}): {}",
            f.count, usage.calls, f.last_role, f.last_at, f.last_error
        )?;
    }
    let seed_score = candidates
        .iter()
        .find(|c| c.kind == CandidateKind::Seed)
        .and_then(|c| score_of(store, c.id).ok().flatten())
        .and_then(|(_, sc)| sc);
    if let Some(best) = summary
        .as_ref()
        .and_then(|s| s.get("best"))
        .filter(|b| !b.is_null())
    {
        let score = best["score"].as_f64().unwrap_or(0.0);
        writeln!(
            s,
            "best: candidate {} (round {}, node {})",
            best["candidate_id"],
            best["round"],
            best["node"].as_str().unwrap_or("-"),
        )?;
        if let Some(sum) = summary.as_ref() {
            let lines =
                crate::headline::confirmed(sum)
                    .into_iter()
                    .chain(crate::headline::rechecked(
                        sum,
                        best["rechecked_score"].as_f64(),
                        sum["seed_recheck_score"].as_f64(),
                    ));
            for line in lines {
                writeln!(s, "{line}")?;
            }
        }
        write!(s, "search score {score:.3}")?;
        if let Some(seed) = seed_score.filter(|v| *v > 0.0) {
            write!(
                s,
                " ({} by the search's own measurements)",
                crate::headline::versus_seed(score / seed)
            )?;
        }
        writeln!(s)?;
        if let Some(r) = summary
            .as_ref()
            .and_then(|s| s.get("recheck"))
            .filter(|r| !r.is_null())
        {
            writeln!(
                s,
                "re-check on all workloads (fresh process and seed): {}",
                r["status"].as_str().unwrap_or("?")
            )?;
        }
    }

    s.push_str(&render_time(&TimeAccount::of_run(store)?));

    if let Some(best) = summary
        .as_ref()
        .and_then(|s| s["best"]["candidate_id"].as_i64())
    {
        s.push_str(&render_path(store, best)?);
    }

    if let Some(wm) = world_model(store)? {
        writeln!(s, "\nworld model (* = on the path to the best solution):")?;
        s.push_str(&wm.render_tree());
    }

    writeln!(s, "\ncandidates:")?;
    writeln!(
        s,
        "{:>5} {:>5} {:>5} {:>6} {:<8} {:<22} {:>8}  note",
        "id", "round", "cycle", "node", "kind", "status", "score"
    )?;
    let shown = if all || candidates.len() <= 15 {
        &candidates[..]
    } else {
        writeln!(
            s,
            "  … {} earlier (--all lists them)",
            candidates.len() - 15
        )?;
        &candidates[candidates.len() - 15..]
    };
    for cand in shown {
        let (status, score) = score_of(store, cand.id)?.unwrap_or(("(not evaluated)".into(), None));
        writeln!(
            s,
            "{:>5} {:>5} {:>5} {:>6} {:<8} {:<22} {:>8}  {}",
            cand.id,
            cand.round,
            cand.cycle,
            cand.node_id.as_deref().unwrap_or("-"),
            cand.kind.as_str(),
            status,
            score
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into()),
            cand.proposer_note.chars().take(70).collect::<String>()
        )?;
    }
    Ok(s)
}

/// How many parts of the wall `show` lists before summing the rest.
const TIME_PARTS_SHOWN: usize = 8;

/// The `time:` block of `show`: wall, evaluations per hour, the device's busy fraction and the
/// largest parts of the wall (the accounting is `ksearch_search::accounting`'s).
pub fn render_time(t: &TimeAccount) -> String {
    let mut s = String::new();
    let wall = match (t.wall_seconds, t.wall_end) {
        (Some(w), WallEnd::Finished) => format!("wall {}", duration(w)),
        (Some(w), WallEnd::LastRecord) => {
            format!("wall {} (not finished: to the latest record)", duration(w))
        }
        (None, _) => "wall n/a (unreadable time stamps)".into(),
    };
    let n = t.evaluations.harness_runs();
    let per_hour = t
        .evaluations_per_hour
        .map(|r| {
            if r >= 100.0 {
                format!("{r:.0}")
            } else {
                format!("{r:.1}")
            }
        })
        .unwrap_or_else(|| "n/a".into());
    let busy = match (t.busy_fraction, t.device_seconds) {
        (Some(f), Some(d)) => format!("{:.1}% ({d:.1} s)", f * 100.0),
        _ => "n/a".into(),
    };
    let _ = writeln!(
        s,
        "\ntime: {wall} · {n} evaluations, {per_hour} per hour · device busy {busy}"
    );

    let e = &t.evaluations;
    if !e.in_events.is_empty() {
        let mut made = vec![format!("{} stored", e.stored)];
        made.extend(
            e.in_events
                .iter()
                .map(|(kind, k)| format!("{k} in {kind} events")),
        );
        let _ = writeln!(s, "  evaluations: {}", made.join(" + "));
    }
    let mut notes = Vec::new();
    if t.yardsticks > 0 {
        let plural = if t.yardsticks == 1 { "" } else { "s" };
        notes.push(format!("{} yardstick{plural} measured", t.yardsticks));
    }
    if e.reused + e.lint_rejected > 0 {
        notes.push(format!(
            "{} reused and {} lint-rejected results ran no harness",
            e.reused, e.lint_rejected
        ));
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "  {}", notes.join("; "));
    }
    if e.unsteady_repeats > 0 {
        let _ = writeln!(
            s,
            "  {} evaluations repeated after an unsteady first try",
            e.unsteady_repeats
        );
    }
    if e.unsteady_kept > 0 {
        let _ = writeln!(
            s,
            "  {} unsteady evaluations kept as measured (repeats had come out as unsteady)",
            e.unsteady_kept
        );
    }

    if t.parts.iter().all(|p| p.kind == TimeKind::Other) {
        let _ = writeln!(s, "  no phase times recorded (results of an older ksearch)");
        return s;
    }
    let share = |secs: f64| {
        t.share(secs)
            .map(|f| format!("{:.1}%", f * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    let _ = writeln!(
        s,
        "  {:<24} {:>9} {:>6}",
        "where it went", "seconds", "share"
    );
    for p in t.parts.iter().take(TIME_PARTS_SHOWN) {
        let mark = if p.kind == TimeKind::Device { " *" } else { "" };
        let name = format!("{}{mark}", p.name);
        let _ = writeln!(s, "  {name:<24} {:>9.1} {:>6}", p.seconds, share(p.seconds));
    }
    let rest = &t.parts[t.parts.len().min(TIME_PARTS_SHOWN)..];
    if !rest.is_empty() {
        let secs: f64 = rest.iter().map(|p| p.seconds).sum();
        let name = format!("{} more", rest.len());
        let _ = writeln!(s, "  {name:<24} {secs:>9.1} {:>6}", share(secs));
    }
    if t.overlap_seconds > 0.0 {
        let _ = writeln!(
            s,
            "  (the parts exceed the wall by {:.1} s: work overlapped)",
            t.overlap_seconds
        );
    }
    let _ = writeln!(
        s,
        "  * device work (its sum over the wall is the busy fraction)"
    );
    s
}

/// `42.1 s`, `4 min 10 s`, `2 h 05 min`.
fn duration(secs: f64) -> String {
    if secs < 60.0 {
        return format!("{secs:.1} s");
    }
    let whole = secs.round() as u64;
    if whole < 3600 {
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        format!("{} h {:02} min", whole / 3600, whole % 3600 / 60)
    }
}

/// One kept step on the way to the best kernel: its score and its first shown workload.
struct Step {
    id: i64,
    round: u32,
    note: String,
    score: Option<f64>,
    headline: Option<(String, Option<f64>, Option<f64>)>,
}

fn step(store: &RunStore, cand: &ksearch_store::CandidateRow) -> Result<Step> {
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
pub fn render_path(store: &RunStore, best: i64) -> Result<String> {
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
        .collect::<Result<Vec<_>>>()?;
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

pub fn export(args: &ExportArgs) -> Result<u8> {
    let store = open_run(&args.runs_dir, &args.run)?;
    let summary = store
        .finish_summary()?
        .context("the run has not finished; `ksearch resume` it first (or see `ksearch show`)")?;
    let best = summary
        .get("best")
        .filter(|b| !b.is_null())
        .context("the run has no accepted kernel (no candidate passed the final re-check)")?;
    let id = best["candidate_id"]
        .as_i64()
        .context("the run summary names no candidate")?;
    let cand = store
        .candidate(id)?
        .with_context(|| format!("candidate {id} is missing from the store"))?;
    let source = store.source(&cand.source_id)?;
    let config = store.config().clone();
    let ext = store
        .source_path(&cand.source_id)?
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "txt".into());
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| store.dir().join("export"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let task_name = config
        .task
        .rsplit('/')
        .find(|p| !p.is_empty())
        .unwrap_or("kernel")
        .to_string();
    let file = format!("{task_name}_{}.{ext}", config.backend);
    std::fs::write(out.join(&file), &source)?;

    let eval: Option<EvalResult> = store
        .evaluation_for(id)?
        .and_then(|e| serde_json::from_value(e.result).ok());
    let recheck: Option<EvalResult> = summary["recheck"]["recheck_candidate"]
        .as_i64()
        .and_then(|rid| store.evaluation_for(rid).ok().flatten())
        .and_then(|e| serde_json::from_value(e.result).ok());
    let mut readme = String::new();
    writeln!(readme, "# {file}\n")?;
    writeln!(
        readme,
        "Best kernel of ksearch run `{}` (task `{}`, backend `{}`, proposer `{}`, seed {}).\n",
        store.id(),
        config.task,
        config.backend,
        config.proposer,
        config.seed
    )?;
    let lines = crate::headline::confirmed(&summary)
        .into_iter()
        .chain(crate::headline::rechecked(
            &summary,
            best["rechecked_score"].as_f64(),
            summary["seed_recheck_score"].as_f64(),
        ));
    for mut line in lines {
        line[..1].make_ascii_uppercase();
        writeln!(readme, "{line}.\n")?;
    }
    writeln!(
        readme,
        "Search score {:.3} (geometric mean of the speedup over the task's baseline, as the \
         search measured it), found in round {}.",
        best["score"].as_f64().unwrap_or(0.0),
        cand.round
    )?;
    if !cand.knobs.is_null() {
        writeln!(readme, "Template knobs: `{}`.", cand.knobs)?;
    }
    writeln!(
        readme,
        "\nRe-evaluate it on every workload, held-out included:\n\n```\nksearch eval --task {} --backend {} --held-out {file}\n```\n",
        config.task, config.backend
    )?;
    writeln!(readme, "## Steps the search kept\n\n```")?;
    readme.push_str(render_path(&store, id)?.trim_start());
    writeln!(readme, "```\n")?;
    if let Some(r) = &recheck {
        writeln!(
            readme,
            "## Re-check (fresh process, fresh seed, all workloads)\n\n```"
        )?;
        readme.push_str(&render_result(&file, r));
        writeln!(readme, "```\n")?;
    }
    if let Some(r) = &eval {
        writeln!(readme, "## Measured during the search\n\n```")?;
        readme.push_str(&render_result(&file, r));
        writeln!(readme, "```\n")?;
        if let Some(env) = &r.environment {
            writeln!(readme, "Machine: `{}`", Value::Object(env.clone()))?;
        }
    }
    std::fs::write(out.join("README.md"), readme)?;
    println!("{}", out.join(&file).display());
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ksearch_search::accounting::{EvaluationCounts, TimePart};

    fn part(name: &str, seconds: f64, kind: TimeKind) -> TimePart {
        TimePart {
            name: name.into(),
            seconds,
            kind,
        }
    }

    #[test]
    fn the_time_block_of_a_finished_run() {
        let parts = vec![
            part("other", 88.9, TimeKind::Other),
            part("timed_calls", 33.6, TimeKind::Device),
            part("yardstick", 26.6, TimeKind::Device),
            part("flush", 21.4, TimeKind::Device),
            part("settle", 13.8, TimeKind::Harness),
            part("candidate", 12.4, TimeKind::Device),
            part("harness start/exit", 11.8, TimeKind::Harness),
            part("inputs", 11.3, TimeKind::Harness),
            part("load", 7.6, TimeKind::Harness),
            part("reference", 7.4, TimeKind::Device),
        ];
        let t = TimeAccount {
            wall_seconds: Some(250.266),
            wall_end: WallEnd::Finished,
            evaluations: EvaluationCounts {
                stored: 23,
                in_events: [("confirmation".into(), 8), ("remeasure".into(), 4)].into(),
                with_phases: 35,
                reused: 2,
                lint_rejected: 1,
                unsteady_repeats: 11,
                unsteady_kept: 4,
            },
            evaluations_per_hour: Some(35.0 * 3600.0 / 250.266),
            yardsticks: 12,
            parts,
            device_seconds: Some(101.4),
            busy_fraction: Some(101.4 / 250.266),
            overlap_seconds: 0.0,
        };
        insta::assert_snapshot!(render_time(&t));
    }

    #[test]
    fn the_time_block_of_an_old_unfinished_run() {
        let t = TimeAccount {
            wall_seconds: Some(4000.0),
            wall_end: WallEnd::LastRecord,
            evaluations: EvaluationCounts {
                stored: 3,
                ..EvaluationCounts::default()
            },
            evaluations_per_hour: Some(2.7),
            yardsticks: 0,
            parts: vec![part("other", 4000.0, TimeKind::Other)],
            device_seconds: None,
            busy_fraction: None,
            overlap_seconds: 0.0,
        };
        insta::assert_snapshot!(render_time(&t));
    }

    #[test]
    fn durations_read_as_seconds_minutes_or_hours() {
        assert_eq!(duration(0.04), "0.0 s");
        assert_eq!(duration(59.94), "59.9 s");
        assert_eq!(duration(250.27), "4 min 10 s");
        assert_eq!(duration(3600.0), "1 h 00 min");
        assert_eq!(duration(7385.0), "2 h 03 min");
    }
}
