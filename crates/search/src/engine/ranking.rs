//! Ranking under noise.
//!
//! Every score carries an interval (docs/search.md, "Scores"). Picking the maximum of noisy
//! scores favours whichever kernel drew a lucky measurement, so:
//!
//! - a candidate whose score tops the incumbent's replaces it at once only when its interval
//!   lies wholly above the incumbent's; otherwise both are measured again, the incumbent first,
//!   and the better geometric mean of each kernel's measurements is kept ([`Engine::duel`]);
//! - the run's winner is confirmed at the end: it, the runner-ups and the seed are evaluated in
//!   turn for a few rounds, a runner-up takes over only if it confirms clearly faster, and the
//!   run's headline is that confirmed comparison ([`Engine::confirm`]). A kernel whose search
//!   interval lies wholly below the winner's, by a margin, is no runner-up: to take over it
//!   would have to confirm wholly above the winner, past both intervals and the margin, so
//!   measuring it again buys nothing ([`cannot_overtake`]).
//!
//! Results without an interval (a fake evaluator, an old harness) are ranked by score alone.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{BestRef, Engine, EngineError, Purpose};

/// Runner-ups the winner is confirmed against.
pub const CONFIRM_RUNNER_UPS: usize = 2;

/// One kernel's measurements in the confirmation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Confirmed {
    pub candidate_id: i64,
    /// `winner`, `runner-up` or `seed`.
    pub role: String,
    /// Its score in each round (failed evaluations leave it out of the ranking).
    pub scores: Vec<f64>,
    /// Geometric mean of `scores`.
    pub score: Option<f64>,
    /// Geometric means of the rounds' interval bounds.
    pub interval: Option<[f64; 2]>,
    /// Statuses of rounds that did not pass.
    #[serde(default)]
    pub failures: Vec<String>,
}

/// The final re-measure of the winner against the runner-ups and the seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Confirmation {
    pub rounds: u32,
    pub contenders: Vec<Confirmed>,
    /// The candidate the confirmation kept as the run's best.
    pub winner: i64,
    /// Kernels ranked among the runner-ups that were not confirmed because their search
    /// interval lies wholly below the winner's ([`cannot_overtake`]), best first.
    #[serde(default)]
    pub clearly_slower: Vec<i64>,
}

/// One passed search evaluation, as the finish ranks them for the re-check and the
/// confirmation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ranked {
    pub candidate_id: i64,
    pub score: f64,
    /// Its score interval, as the evaluator summarises the stored result.
    pub interval: Option<[f64; 2]>,
}

/// How far below the winner's interval a kernel's interval must lie (the ratio of the
/// winner's lower bound to its upper bound) before the confirmation leaves it out. The
/// winner is the highest of many noisy scores, so its interval can sit too high; repeated
/// evaluations of one kernel differ by less than 10% on our machines (docs/results/scores),
/// and this asks for half as much again beyond both intervals.
pub const OVERTAKE_MARGIN: f64 = 1.15;

/// Whether a kernel measured at `interval` cannot take the winner's place in the
/// confirmation: its interval lies wholly below the winner's, by more than
/// [`OVERTAKE_MARGIN`]. A runner-up takes over only by confirming wholly above the winner
/// ([`confirmed_winner`]), which would take both measurements to move past both intervals
/// and the margin. Without both intervals it can.
pub fn cannot_overtake(interval: Option<[f64; 2]>, winner: &BestRef) -> bool {
    match (interval, winner.interval) {
        (Some(r), Some(w)) => r[1] * OVERTAKE_MARGIN < w[0],
        _ => false,
    }
}

impl Confirmation {
    pub fn of(&self, id: i64) -> Option<&Confirmed> {
        self.contenders.iter().find(|c| c.candidate_id == id)
    }

    pub fn seed(&self) -> Option<&Confirmed> {
        self.contenders.iter().find(|c| c.role == "seed")
    }
}

/// Whether a challenger's interval lies wholly above the incumbent's (so it wins without a
/// re-measure). Without both intervals, a higher score is enough.
pub fn clearly_better(challenger: (f64, Option<[f64; 2]>), incumbent: &BestRef) -> bool {
    match (challenger.1, incumbent.interval) {
        (Some(c), Some(i)) => c[0] > i[1],
        _ => challenger.0 > incumbent.score,
    }
}

pub fn geomean(xs: &[f64]) -> Option<f64> {
    let xs: Vec<f64> = xs
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    (!xs.is_empty()).then(|| (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

fn geomean_interval(ivs: &[[f64; 2]]) -> Option<[f64; 2]> {
    let lo = geomean(&ivs.iter().map(|i| i[0]).collect::<Vec<_>>())?;
    let hi = geomean(&ivs.iter().map(|i| i[1]).collect::<Vec<_>>())?;
    (ivs.len() == ivs.iter().filter(|i| i[0] > 0.0).count()).then_some([lo, hi])
}

impl Engine<'_> {
    /// Measures the incumbent and then the challenger again and returns which to keep, with
    /// its pooled score (geometric mean of all its measurements) and interval. The re-measures
    /// are recorded as a `remeasure` event with their full results.
    pub(super) fn duel(
        &self,
        incumbent: &BestRef,
        challenger: BestRef,
    ) -> Result<BestRef, EngineError> {
        let mut pair = [incumbent.clone(), challenger];
        let mut results = Vec::new();
        let mut failed = [false, false];
        for (i, b) in pair.iter_mut().enumerate() {
            let Some(view) = self.attempt_view(b.candidate_id)? else {
                failed[i] = true;
                continue;
            };
            let eval = self.evaluate_timed(&view.source, Purpose::Search)?;
            match (eval.summary.passed, eval.summary.score) {
                (true, Some(s)) => {
                    b.scores.push(s);
                    b.score = geomean(&b.scores).unwrap_or(b.score);
                    if let (Some(old), Some(new)) = (b.interval, eval.summary.score_interval) {
                        b.interval = geomean_interval(&[old, new]);
                    }
                }
                _ => failed[i] = true,
            }
            results.push(json!({"candidate": b.candidate_id, "result": eval.result}));
        }
        let [inc, ch] = pair;
        let keep_challenger = match failed {
            [_, true] => false,
            [true, false] => true,
            [false, false] => ch.score > inc.score,
        };
        self.event(
            "remeasure",
            json!({"incumbent": inc.candidate_id, "challenger": ch.candidate_id,
                   "incumbent_scores": inc.scores, "challenger_scores": ch.scores,
                   "failed": failed, "kept": if keep_challenger { ch.candidate_id }
                                             else { inc.candidate_id },
                   "results": results}),
        )?;
        Ok(if keep_challenger { ch } else { inc })
    }

    /// Evaluates the winner, the [`CONFIRM_RUNNER_UPS`] runner-ups (the next distinct sources
    /// by search score, less those that [`cannot_overtake`] it) and the seed in turn for
    /// `rounds` rounds, rotating the order each round. Returns the confirmation; its `winner`
    /// is the kernel it keeps ([`confirmed_winner`]; the caller re-checks it if it is not the
    /// re-checked winner). The seed is confirmed whatever its score: the headline's ratio to
    /// the seed is measured here.
    pub(super) fn confirm(
        &self,
        winner: &BestRef,
        ranked: &[Ranked],
        seed: Option<i64>,
        rounds: u32,
    ) -> Result<Option<Confirmation>, EngineError> {
        if rounds == 0 {
            return Ok(None);
        }
        // (id, role, source), one per distinct source.
        let mut contenders: Vec<(i64, String, String)> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut clearly_slower = Vec::new();
        let mut runner_ups = 0;
        let picks = std::iter::once((winner.candidate_id, "winner", None))
            .chain(seed.map(|s| (s, "seed", None)))
            .chain(
                ranked
                    .iter()
                    .map(|r| (r.candidate_id, "runner-up", r.interval)),
            );
        // The runner-ups are the next CONFIRM_RUNNER_UPS distinct kernels by search score;
        // one that cannot overtake the winner is left out, not replaced (those further down
        // scored lower still).
        for (id, role, interval) in picks {
            if role == "runner-up" && runner_ups >= CONFIRM_RUNNER_UPS {
                break;
            }
            let Some(view) = self.attempt_view(id)? else {
                continue;
            };
            if !seen.insert(view.source_id.clone()) {
                continue;
            }
            if role == "runner-up" {
                runner_ups += 1;
                if cannot_overtake(interval, winner) {
                    clearly_slower.push(id);
                    continue;
                }
            }
            contenders.push((id, role.to_string(), view.source));
        }
        if contenders.len() < 2 {
            return Ok(None);
        }
        let mut scores: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        let mut ivs: Vec<Vec<[f64; 2]>> = vec![Vec::new(); contenders.len()];
        let mut failures: Vec<Vec<String>> = vec![Vec::new(); contenders.len()];
        let mut results = Vec::new();
        for r in 0..rounds as usize {
            for k in 0..contenders.len() {
                let i = (k + r) % contenders.len();
                let (id, _, source) = &contenders[i];
                let eval = self.evaluate_timed(source, Purpose::Search)?;
                match (eval.summary.passed, eval.summary.score) {
                    (true, Some(s)) => {
                        scores[i].push(s);
                        if let Some(iv) = eval.summary.score_interval {
                            ivs[i].push(iv);
                        }
                    }
                    _ => failures[i].push(eval.summary.status.clone()),
                }
                results.push(json!({"round": r, "candidate": id, "result": eval.result}));
            }
        }
        let confirmed: Vec<Confirmed> = contenders
            .iter()
            .enumerate()
            .map(|(i, (id, role, _))| Confirmed {
                candidate_id: *id,
                role: role.clone(),
                score: if failures[i].is_empty() {
                    geomean(&scores[i])
                } else {
                    None
                },
                interval: (ivs[i].len() == scores[i].len())
                    .then(|| geomean_interval(&ivs[i]))
                    .flatten(),
                scores: scores[i].clone(),
                failures: failures[i].clone(),
            })
            .collect();
        let best = confirmed_winner(&confirmed, winner);
        let confirmation = Confirmation {
            rounds,
            contenders: confirmed,
            winner: best,
            clearly_slower,
        };
        self.event(
            "confirmation",
            json!({"confirmation": confirmation, "results": results}),
        )?;
        Ok(Some(confirmation))
    }
}

impl Engine<'_> {
    /// The confirmation ranked a runner-up above the re-checked winner `prior`: it becomes the
    /// best if it passes the re-check too; otherwise `prior` stays and the confirmation says so.
    pub(super) fn accept_confirmed(
        &self,
        confirmation: &mut Confirmation,
        prior: &BestRef,
        state: &super::EngineState,
    ) -> Result<Option<BestRef>, EngineError> {
        let id = confirmation.winner;
        let Some(view) = self.attempt_view(id)? else {
            confirmation.winner = prior.candidate_id;
            return Ok(Some(prior.clone()));
        };
        let note = format!("re-check of candidate {id}, confirmed faster than the winner");
        let (_, summary) = self.recheck_view(&view, view.knobs.clone(), note, state)?;
        if !summary.passed {
            self.event(
                "recheck_failed",
                json!({"candidate": id, "status": summary.status, "message": summary.message}),
            )?;
            confirmation.winner = prior.candidate_id;
            return Ok(Some(prior.clone()));
        }
        let row = self.store().candidate(id)?;
        let confirmed = confirmation.of(id);
        Ok(Some(BestRef {
            candidate_id: id,
            score: confirmed.and_then(|c| c.score).unwrap_or(prior.score),
            node: row.as_ref().and_then(|r| r.node_id.clone()),
            round: row.map(|r| r.round).unwrap_or(0),
            rechecked_score: summary.score,
            interval: confirmed.and_then(|c| c.interval),
            scores: confirmed.map(|c| c.scores.clone()).unwrap_or_default(),
        }))
    }
}

/// Which contender the confirmation keeps. The seed competes only as the comparison. A
/// runner-up replaces the winner only when it confirmed clearly faster (its interval wholly
/// above the winner's, [`clearly_better`]): among kernels whose confirmations overlap, the
/// highest is the one that drew the luckiest measurements, so its confirmed score would
/// overstate it and a fresh measurement (the re-check) would fall short. A winner that failed
/// its confirmation gives way to the best of the others.
fn confirmed_winner(confirmed: &[Confirmed], winner: &BestRef) -> i64 {
    let others = confirmed
        .iter()
        .filter(|c| c.role == "runner-up")
        .filter_map(|c| c.score.map(|s| (c, s)));
    let incumbent = confirmed
        .iter()
        .find(|c| c.candidate_id == winner.candidate_id)
        .and_then(|c| {
            c.score.map(|score| BestRef {
                score,
                interval: c.interval,
                ..winner.clone()
            })
        });
    let pick = match &incumbent {
        Some(inc) => others
            .filter(|(c, s)| clearly_better((*s, c.interval), inc))
            .max_by(|a, b| a.1.total_cmp(&b.1)),
        None => others.max_by(|a, b| a.1.total_cmp(&b.1)),
    };
    pick.map(|(c, _)| c.candidate_id)
        .unwrap_or(winner.candidate_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best(score: f64, interval: Option<[f64; 2]>) -> BestRef {
        BestRef {
            candidate_id: 1,
            score,
            node: None,
            round: 1,
            rechecked_score: None,
            interval,
            scores: vec![score],
        }
    }

    #[test]
    fn a_challenger_wins_outright_only_beyond_noise() {
        let inc = best(2.0, Some([1.9, 2.1]));
        assert!(clearly_better((2.5, Some([2.2, 2.8])), &inc));
        assert!(!clearly_better((2.2, Some([2.05, 2.4])), &inc));
        // Without intervals, the score decides.
        assert!(clearly_better((2.2, None), &best(2.0, None)));
        assert!(!clearly_better((1.9, None), &best(2.0, None)));
    }

    #[test]
    fn geomeans() {
        assert!((geomean(&[1.0, 4.0]).unwrap() - 2.0).abs() < 1e-12);
        assert!(geomean(&[]).is_none());
        let iv = geomean_interval(&[[1.0, 4.0], [4.0, 16.0]]).unwrap();
        assert!((iv[0] - 2.0).abs() < 1e-12 && (iv[1] - 8.0).abs() < 1e-12);
    }
}
