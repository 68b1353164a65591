//! The words a run's result is reported in (`run`, `show`, `export`): the re-measured comparison
//! with the seed leads, since both kernels were measured there under the same conditions, and a
//! ratio below one reads as "slower", never as "0.49x faster".

use crate::engine::RunOutcome;

/// `ratio` is how many times the seed's time the kernel's time divides into (a ratio of
/// speedups over the same baseline): above one it is faster, below one slower.
pub fn versus_seed(ratio: f64) -> String {
    if !ratio.is_finite() || ratio <= 0.0 {
        return "not comparable with the seed".into();
    }
    if (ratio - 1.0).abs() < 0.005 {
        return "as fast as the seed".into();
    }
    if ratio > 1.0 {
        format!("{ratio:.2}x faster than the seed")
    } else {
        format!("{:.2}x slower than the seed", 1.0 / ratio)
    }
}

/// The confirmed comparison, the run's headline: the winner's score in the final confirmation
/// (it, the runner-ups and the seed evaluated in turn) with its interval, and how it compares
/// with the seed measured there.
pub fn confirmed(outcome: &RunOutcome) -> Option<String> {
    let c = outcome.confirmation.as_ref()?;
    let best_id = outcome.best.as_ref()?.candidate_id;
    let w = c.of(best_id)?;
    let score = w.score?;
    let mut line = format!("confirmed: {score:.3}x the baseline");
    if let Some([lo, hi]) = w.interval {
        line.push_str(&format!(" ({lo:.3}–{hi:.3})"));
    }
    if let Some(seed) = c.seed().filter(|s| s.candidate_id != best_id) {
        if let Some(s) = seed.score.filter(|s| *s > 0.0) {
            line.push_str(&format!(", {}", versus_seed(score / s)));
        }
    }
    let others = c.contenders.len() - 1;
    line.push_str(&format!(
        " ({} kernel{} re-measured in turn with it, {} round{}",
        others,
        if others == 1 { "" } else { "s" },
        c.rounds,
        if c.rounds == 1 { "" } else { "s" }
    ));
    if !c.clearly_slower.is_empty() {
        // Runner-ups whose search interval lay wholly below the winner's (ranking.rs).
        let n = c.clearly_slower.len();
        line.push_str(&format!(
            "; {n} runner-up{} left out, clearly slower in the search",
            if n == 1 { "" } else { "s" }
        ));
    }
    line.push(')');
    Some(line)
}

/// The re-measured comparison: `best` and `seed` are the two kernels' scores in the final
/// re-check (every workload, a fresh process and seed).
pub fn remeasured(best: f64, seed: f64) -> Option<String> {
    (seed > 0.0).then(|| {
        format!(
            "re-measured on all workloads: {} ({best:.3} vs the seed's {seed:.3})",
            versus_seed(best / seed)
        )
    })
}

/// The re-check's lines, in the order run, show and export print them: its comparison with
/// the seed ([`remeasured`]) and, where it and the confirmation do not support each other,
/// the [`disagreement`] caution. `best` and `seed` are the two kernels' re-check scores;
/// `outcome` is the run's.
pub fn rechecked(outcome: &RunOutcome, best: Option<f64>, seed: Option<f64>) -> Vec<String> {
    let Some((best, seed)) = best.zip(seed) else {
        return Vec::new();
    };
    remeasured(best, seed)
        .into_iter()
        .chain(disagreement(outcome, best, seed))
        .collect()
}

/// The headline lines of a run whose best kernel passed the re-check, in the order run, show
/// and export print them: the [`confirmed`] comparison, then the [`rechecked`] lines.
pub fn lines(outcome: &RunOutcome) -> Vec<String> {
    let best = outcome.best.as_ref().and_then(|b| b.rechecked_score);
    confirmed(outcome)
        .into_iter()
        .chain(rechecked(outcome, best, outcome.seed_recheck_score))
        .collect()
}

/// How far the confirmation's and the re-check's comparisons with the seed may differ before
/// the run says they disagree.
const AGREEMENT: f64 = 0.10;
/// A confirmed interval wider than this factor says the machine was too busy for a precise
/// figure.
pub const PRECISE_SPAN: f64 = 2.0;

/// Whether a confirmed interval is precise enough to read as one figure: positive, and its
/// top within [`PRECISE_SPAN`] of its bottom.
pub fn precise(interval: [f64; 2]) -> bool {
    let [lo, hi] = interval;
    lo > 0.0 && hi / lo <= PRECISE_SPAN
}

/// A caution when the run's two measurements of the winner against the seed do not support
/// each other: the confirmation's ratio and the re-check's (`best` and `seed`, the two
/// kernels' re-check scores) differ by more than 10%, or the confirmed interval spans more
/// than a factor of two. Both happen when the machine was busy while the run measured, or when
/// the kernels' times vary widely from call to call (multi-threaded cpu kernels on few cores);
/// the figures are then printed as they are, with this line, rather than one of them alone.
pub fn disagreement(outcome: &RunOutcome, best: f64, seed: f64) -> Option<String> {
    let c = outcome.confirmation.as_ref()?;
    let best_id = outcome.best.as_ref()?.candidate_id;
    let w = c.of(best_id)?;
    let mut why = Vec::new();
    let confirmed = c
        .seed()
        .filter(|s| s.candidate_id != best_id)
        .and_then(|s| Some(w.score? / s.score.filter(|v| *v > 0.0)?));
    if let Some(confirmed) = confirmed.filter(|_| best > 0.0 && seed > 0.0) {
        let rechecked = best / seed;
        if (confirmed / rechecked).ln().abs() > (1.0 + AGREEMENT).ln() {
            why.push(format!(
                "the confirmation ({}) and the re-check ({}) differ by more than {:.0}%",
                versus_seed(confirmed),
                versus_seed(rechecked),
                AGREEMENT * 100.0
            ));
        }
    }
    if let Some([lo, hi]) = w.interval {
        if !precise([lo, hi]) {
            why.push(format!(
                "the confirmed interval spans {}",
                if lo > 0.0 {
                    format!("a factor of {:.1}", hi / lo)
                } else {
                    "everything below its top".to_string()
                }
            ));
        }
    }
    (!why.is_empty()).then(|| {
        format!(
            "caution: {}: these measurements are too noisy to rely on (the machine was busy, or \
             the kernels' times vary from call to call); run it again on a quiet machine",
            why.join(", and ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A finished run whose best is candidate 7, with `confirmation` as stored.
    fn outcome(confirmation: Value) -> RunOutcome {
        serde_json::from_value(json!({
            "stop_reason": "rounds budget reached (2)", "rounds_used": 2, "cycles": 1,
            "passed": 2, "failed": 0, "seed_score": 1.0, "recheck": null,
            "best": {"candidate_id": 7, "score": 2.0, "node": "n1", "round": 1},
            "confirmation": confirmation,
        }))
        .unwrap()
    }

    #[test]
    fn ratios_read_the_right_way_round() {
        assert_eq!(versus_seed(26.45), "26.45x faster than the seed");
        assert_eq!(versus_seed(0.49), "2.04x slower than the seed");
        assert_eq!(versus_seed(1.002), "as fast as the seed");
        assert_eq!(versus_seed(f64::NAN), "not comparable with the seed");
        assert_eq!(
            remeasured(1.5, 3.0).unwrap(),
            "re-measured on all workloads: 2.00x slower than the seed (1.500 vs the seed's 3.000)"
        );
        assert!(remeasured(1.0, 0.0).is_none());
    }

    #[test]
    fn the_confirmation_leads_with_its_interval_and_the_seed() {
        let summary = outcome(json!({"rounds": 2, "winner": 7, "contenders": [
            {"candidate_id": 7, "role": "winner", "scores": [2.0, 2.2], "score": 2.1,
             "interval": [1.9, 2.3]},
            {"candidate_id": 1, "role": "seed", "scores": [1.0, 1.1], "score": 1.05,
             "interval": [0.9, 1.2]},
            {"candidate_id": 5, "role": "runner-up", "scores": [1.9, 2.0], "score": 1.95,
             "interval": null},
        ]}));
        assert_eq!(
            confirmed(&summary).unwrap(),
            "confirmed: 2.100x the baseline (1.900–2.300), 2.00x faster than the seed \
             (2 kernels re-measured in turn with it, 2 rounds)"
        );
        assert!(confirmed(&outcome(Value::Null)).is_none());
        let mut lean = summary.clone();
        if let Some(c) = lean.confirmation.as_mut() {
            c.clearly_slower = vec![4];
        }
        assert_eq!(
            confirmed(&lean).unwrap(),
            "confirmed: 2.100x the baseline (1.900–2.300), 2.00x faster than the seed \
             (2 kernels re-measured in turn with it, 2 rounds; 1 runner-up left out, clearly \
             slower in the search)"
        );
    }

    fn confirmation(interval: [f64; 2]) -> RunOutcome {
        outcome(json!({"rounds": 2, "winner": 7, "contenders": [
            {"candidate_id": 7, "role": "winner", "scores": [2.0], "score": 2.0,
             "interval": interval},
            {"candidate_id": 1, "role": "seed", "scores": [1.0], "score": 1.0,
             "interval": [0.9, 1.1]},
        ]}))
    }

    #[test]
    fn a_recheck_that_contradicts_the_confirmation_is_called_out() {
        let steady = confirmation([1.8, 2.2]);
        // 2.00x against 1.90x: within 10%, nothing to say.
        assert_eq!(disagreement(&steady, 0.95, 0.5), None);
        // 2.00x faster against 2.54x slower (run 2 of docs/results/scores/).
        let line = disagreement(&steady, 0.531, 1.350).unwrap();
        assert!(
            line.starts_with(
                "caution: the confirmation (2.00x faster than the seed) and the re-check \
                 (2.54x slower than the seed) differ by more than 10%"
            ),
            "{line}"
        );
        // A confirmed interval of 0.4–13: no precise figure, whatever the re-check says.
        let busy = confirmation([0.418, 13.185]);
        let line = disagreement(&busy, 1.9, 1.0).unwrap();
        assert!(line.contains("spans a factor of 31.5"), "{line}");
        assert!(line.ends_with("run it again on a quiet machine"), "{line}");
        // The re-check's lines together: its comparison, then the caution where one is due.
        let lines = rechecked(&steady, Some(0.531), Some(1.350));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("re-measured on all workloads: 2.54x slower"));
        assert!(lines[1].starts_with("caution: "));
        assert_eq!(rechecked(&steady, Some(0.95), Some(0.5)).len(), 1);
        assert!(rechecked(&steady, Some(0.95), None).is_empty());
        // `lines` takes the re-check's scores from the outcome.
        let mut run = steady.clone();
        run.best.as_mut().unwrap().rechecked_score = Some(0.531);
        run.seed_recheck_score = Some(1.350);
        assert_eq!(super::lines(&run).len(), 3);
        // Nothing confirmed, nothing to compare.
        assert_eq!(disagreement(&outcome(Value::Null), 1.0, 2.0), None);
    }
}
