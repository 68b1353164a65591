//! A round of the evolve strategy: each sample is a child of a parent drawn from the
//! population ([`crate::evolve`]), written by the proposer as a diff, a rewrite or a crossover
//! with the inspirations as examples, evaluated like any candidate; the children that passed
//! then join their islands and the islands migrate when due.
//!
//! The population is part of the engine's state, checkpointed after the round with
//! everything else, and its selections for a round depend only on the state at the round's
//! start and the run's seed: a resumed round asks for the same children and reuses the ones
//! already recorded.

use serde_json::json;

use ksearch_store::CandidateKind;

use super::{
    independent_sample, BestRef, Engine, EngineError, EngineState, HistoryEntry, RoundStop, Slot,
};
use crate::evolve::{Population, Selection};
use crate::proposer::{AttemptView, CodeRequest, Inspiration, MutationRequest, Step};

/// What one child is written from, with the stored candidates read.
struct Plan {
    selection: Selection,
    parent: AttemptView,
    mate: Option<AttemptView>,
    inspirations: Vec<Inspiration>,
}

impl Engine<'_> {
    /// The population of a run's first generation: the seed, when it passed, on every island.
    fn new_population(&self, state: &EngineState) -> Result<Population, EngineError> {
        let mut population = Population::new(self.cfg.evolve.clone(), self.cfg.seed)
            .map_err(|e| EngineError::Config(e.to_string()))?;
        if let (Some(id), Some(score)) = (state.seed_candidate, state.seed_score) {
            if let Some(view) = self.attempt_view(id)? {
                population.add_seed(id, score, &view.source, view.knobs.as_ref());
            }
        }
        Ok(population)
    }

    /// The stored candidates a selection names.
    fn plan(&self, selection: Selection) -> Result<Option<Plan>, EngineError> {
        let Some(parent) = self.attempt_view(selection.parent)? else {
            return Ok(None);
        };
        let mate = selection
            .mate
            .map(|m| self.attempt_view(m))
            .transpose()?
            .flatten();
        let mut inspirations = Vec::new();
        for (id, why) in selection
            .top
            .iter()
            .map(|id| (*id, "top"))
            .chain(selection.diverse.iter().map(|id| (*id, "diverse")))
        {
            if let Some(view) = self.attempt_view(id)? {
                inspirations.push(Inspiration { view, why });
            }
        }
        Ok(Some(Plan {
            selection,
            parent,
            mate,
            inspirations,
        }))
    }

    /// One round of the evolve strategy (see the module documentation).
    pub(super) fn run_generation(&self, state: &mut EngineState) -> Result<(), RoundStop> {
        let round = state.rounds_used + 1;
        let cycle = state
            .cycle
            .clone()
            .ok_or_else(|| RoundStop::Error(EngineError::State("round outside a cycle".into())))?;
        if state.population.is_none() {
            state.population = Some(self.new_population(state)?);
        }
        let samples = self.cfg.samples.max(1);
        let mut plans: Vec<Option<Plan>> = Vec::new();
        if let Some(population) = &state.population {
            for sample in 0..samples {
                let planned = match population.select(round, sample, samples) {
                    Some(selection) => self.plan(selection)?,
                    None => None,
                };
                plans.push(planned);
            }
        }
        let known = self.known_sources()?;
        let existing: Vec<_> = self
            .store()
            .candidates()
            .map_err(EngineError::from)?
            .into_iter()
            .filter(|c| c.kind == CandidateKind::Attempt && c.round == round)
            .collect();
        let root = state.wm.root_id().clone();
        let root_node = state.wm.node(&root).cloned().ok_or_else(|| {
            RoundStop::Error(EngineError::State("the world model has no root".into()))
        })?;
        let spec_action = independent_sample();
        let wm = &state.wm;
        let outcomes = self.each_sample(|sample| {
            let plan = plans.get(sample as usize).and_then(Option::as_ref);
            let existing = existing.iter().find(|c| c.sample == sample).cloned();
            let at = Slot {
                round,
                cycle: cycle.index,
                attempt: cycle.consumed + 1,
                sample,
                node: cycle.node.as_str(),
            };
            self.produce(at, existing, &|_, _| {}, || match plan {
                Some(p) => {
                    let req = MutationRequest {
                        round,
                        sample,
                        island: p.selection.island,
                        mutation: p.selection.mutation,
                        parent: &p.parent,
                        mate: p.mate.as_ref(),
                        inspirations: &p.inspirations,
                        known_sources: &known,
                    };
                    (self.proposer.mutate(&req), Some(p.parent.candidate_id))
                }
                // No passing program yet (the seed failed): write from the specification, as
                // best-of-n does.
                None => {
                    let req = CodeRequest {
                        step: Step::SpecAction,
                        round,
                        attempt: at.attempt,
                        sample,
                        node: &root_node,
                        action: &spec_action,
                        base: None,
                        last: None,
                        cycle_best: None,
                        history: &[],
                        wm,
                        known_sources: &known,
                    };
                    (self.proposer.sample(&req), None)
                }
            })
        })?;

        // In sample order, so the population does not depend on which thread finished first.
        let attempt = cycle.consumed + 1;
        let mut entered = Vec::new();
        for (sample, o) in (0u32..).zip(&outcomes) {
            let island = plans
                .get(sample as usize)
                .and_then(Option::as_ref)
                .map(|p| p.selection.island)
                .unwrap_or(0);
            if let Some(c) = state.cycle.as_mut() {
                c.history.push(HistoryEntry {
                    attempt,
                    sample,
                    candidate: o.candidate,
                    error: o.candidate.is_none().then(|| {
                        crate::proposer::prompts::keep_end(
                            &o.summary.message,
                            super::HISTORY_ERROR_CHARS,
                        )
                    }),
                });
            }
            state
                .wm
                .record_attempt(&cycle.node, o.summary.passed)
                .map_err(EngineError::from)?;
            let passed = match (o.candidate, o.summary.score, o.summary.passed) {
                (Some(id), Some(score), true) => Some((id, score)),
                _ => None,
            };
            let Some((id, score)) = passed else {
                state.failed += 1;
                if let Some(p) = state.population.as_mut() {
                    p.add_failure(island);
                }
                continue;
            };
            state.passed += 1;
            let challenger =
                BestRef::measured(id, score, &cycle.node, round, o.summary.score_interval);
            state.best = self.offer_best(state.best.take(), challenger)?;
            let Some(view) = self.attempt_view(id)? else {
                continue;
            };
            if let Some(p) = state.population.as_mut() {
                if p.add_child(
                    island,
                    round,
                    sample,
                    id,
                    score,
                    &view.source,
                    view.knobs.as_ref(),
                ) {
                    entered.push((island, id));
                }
            }
        }
        let migrated = state
            .population
            .as_mut()
            .map(Population::end_round)
            .unwrap_or_default();
        if let Some(p) = &state.population {
            self.event(
                "generation",
                json!({"round": round, "entered": entered, "migrated": migrated,
                       "islands": p.island_sizes(), "archive": p.archive(),
                       "selections": plans.iter().map(|p| p.as_ref().map(|p| &p.selection))
                           .collect::<Vec<_>>()}),
            )?;
        }
        if let Some(c) = state.cycle.as_mut() {
            c.consumed += 1;
        }
        state.rounds_used = round;
        self.round_signals(state, round, &outcomes);
        Ok(())
    }
}
