//! The `evolve` strategy's program database, in the manner of OpenEvolve and ShinkaEvolve: a
//! population split into islands, a MAP-Elites grid per island over configurable feature
//! dimensions, an elite archive across islands, ring migration between islands, and the
//! sampling of a parent, an optional crossover mate and the inspirations each child is
//! written from.
//!
//! The database is plain data: the engine adds every evaluated child and asks for the next
//! selections; it is checkpointed with the engine's state after each round, so a resumed run
//! continues with the same population. Every random choice is drawn from the run's seed, the
//! round and the sample, so the selections of a round do not depend on when it runs (a
//! resumed round asks for the same parents).
//!
//! Only candidates that passed are members of islands: a failed child has no fitness to
//! compete with. A population whose islands are empty (the seed failed) selects nothing, and
//! the engine writes from the specification instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// A feature dimension of the MAP-Elites grid.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// The source's length in characters, binned over the range seen so far.
    Complexity,
    /// How different the source's lines are from a fixed reference set (the first programs
    /// added), binned over the range seen so far.
    Diversity,
    /// A template knob's value (offline candidates), one bin per value seen.
    Knob(String),
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Feature::Complexity => f.write_str("complexity"),
            Feature::Diversity => f.write_str("diversity"),
            Feature::Knob(k) => write!(f, "knob:{k}"),
        }
    }
}

impl FromStr for Feature {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "complexity" => Ok(Feature::Complexity),
            "diversity" => Ok(Feature::Diversity),
            _ => match s.strip_prefix("knob:") {
                Some(k) if !k.is_empty() => Ok(Feature::Knob(k.to_string())),
                _ => Err(format!(
                    "unknown feature `{s}` (one of: complexity, diversity, knob:NAME)"
                )),
            },
        }
    }
}

impl Serialize for Feature {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Feature {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How the evolve strategy is configured (`ksearch run --strategy evolve`; docs/search.md).
/// The defaults follow the OpenEvolve configuration of the K-Search comparison (three
/// islands, population 25, archive 12, exploitation 0.65, exploration 0.35, three top and two
/// diverse inspirations) with OpenEvolve's own grid (complexity and diversity, ten bins each).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvolveSettings {
    pub islands: u32,
    /// Members per island at most; the weakest that holds no grid cell leaves first.
    pub population: u32,
    /// Programs in the elite archive (the best across islands).
    pub archive: u32,
    /// Children an island receives between migrations.
    pub migration_interval: u32,
    /// Fraction of an island's members (its best) copied to both ring neighbours.
    pub migration_rate: f64,
    /// Share of parents drawn from the current island at random.
    pub exploration: f64,
    /// Share of parents drawn from the elite archive; the rest come from any island.
    pub exploitation: f64,
    /// Inspirations from the island's best.
    pub top_inspirations: u32,
    /// Inspirations from other cells of the island's grid.
    pub diverse_inspirations: u32,
    /// Share of mutations asked for as SEARCH/REPLACE diffs; the rest are full rewrites.
    pub diff_ratio: f64,
    /// Share of children written from two parents (0: no crossover).
    pub crossover_ratio: f64,
    pub features: Vec<Feature>,
    /// Bins per feature dimension.
    pub feature_bins: u32,
}

impl Default for EvolveSettings {
    fn default() -> Self {
        Self {
            islands: 3,
            population: 25,
            archive: 12,
            migration_interval: 10,
            migration_rate: 0.1,
            exploration: 0.35,
            exploitation: 0.65,
            top_inspirations: 3,
            diverse_inspirations: 2,
            diff_ratio: 0.5,
            crossover_ratio: 0.0,
            features: vec![Feature::Complexity, Feature::Diversity],
            feature_bins: 10,
        }
    }
}

/// Settings that cannot make a population.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("evolve settings: {0}")]
pub struct EvolveSettingsError(String);

impl EvolveSettings {
    /// Checks the ranges: at least one island, member and bin; ratios in 0..=1 with
    /// exploration and exploitation together at most 1.
    pub fn validate(&self) -> Result<(), EvolveSettingsError> {
        let bad = |why: String| Err(EvolveSettingsError(why));
        if self.islands == 0 || self.population == 0 || self.archive == 0 {
            return bad("islands, population and archive must be at least 1".into());
        }
        if self.feature_bins == 0 {
            return bad("feature bins must be at least 1".into());
        }
        for (name, v) in [
            ("migration rate", self.migration_rate),
            ("exploration", self.exploration),
            ("exploitation", self.exploitation),
            ("diff ratio", self.diff_ratio),
            ("crossover ratio", self.crossover_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{name} must be between 0 and 1, not {v}"));
            }
        }
        if self.exploration + self.exploitation > 1.0 + 1e-9 {
            return bad(format!(
                "exploration ({}) and exploitation ({}) add up to more than 1",
                self.exploration, self.exploitation
            ));
        }
        Ok(())
    }
}

/// How a child is to be written from its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mutation {
    /// SEARCH/REPLACE blocks against the parent (the offline proposer: one knob, one step).
    Diff,
    /// The whole kernel written anew from the parent (offline: several knobs moved).
    Full,
    /// Two parents combined (offline: each knob from one of them).
    Crossover,
}

impl Mutation {
    pub fn as_str(self) -> &'static str {
        match self {
            Mutation::Diff => "diff",
            Mutation::Full => "full",
            Mutation::Crossover => "crossover",
        }
    }
}

/// Where a parent was drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Draw {
    /// A random member of the current island.
    Exploration,
    /// The elite archive (its members on the current island when it has some).
    Exploitation,
    /// Any member of any island.
    Random,
}

/// What one child is written from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    pub island: u32,
    pub parent: i64,
    pub draw: Draw,
    pub mutation: Mutation,
    /// The second parent of a crossover.
    pub mate: Option<i64>,
    /// Inspirations: the island's best, parent and mate excluded.
    pub top: Vec<i64>,
    /// Inspirations: holders of other cells of the island's grid.
    pub diverse: Vec<i64>,
}

impl Selection {
    /// Every inspiration, the top ones first.
    pub fn inspirations(&self) -> impl Iterator<Item = i64> + '_ {
        self.top.iter().chain(&self.diverse).copied()
    }
}

/// A program the database knows: a passing candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Program {
    candidate: i64,
    /// FNV-1a of the source: a child identical to a program already here (its evaluation was
    /// reused, so its score is the same) is not added again.
    source_hash: u64,
    score: f64,
    /// Raw feature values, in the order of the settings' features.
    features: Vec<FeatureValue>,
    /// Round the program was added in (0: the seed).
    round: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum FeatureValue {
    Number(f64),
    Category(String),
}

/// A program's key: its round in the high half, its sample in the low half (the seed is 0).
/// Keys, not candidate ids, order the database: the samples of a round are recorded in the
/// order their threads get there, and the draws must not depend on that.
type Key = u64;

fn key(round: u32, sample: u32) -> Key {
    (u64::from(round) << 32) | u64::from(sample)
}

/// One island: its members and its MAP-Elites grid (cell → the best member placed there).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Island {
    members: BTreeSet<Key>,
    grid: BTreeMap<String, Key>,
    /// Children added to this island since its last migration.
    since_migration: u32,
}

/// Reference programs for the diversity feature.
const DIVERSITY_REFERENCES: usize = 8;

/// The population of an evolve run (see the module documentation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Population {
    settings: EvolveSettings,
    seed: u64,
    programs: BTreeMap<Key, Program>,
    islands: Vec<Island>,
    /// The elite archive: the best programs across islands, best first.
    archive: Vec<Key>,
    /// Line hashes of the diversity reference programs.
    references: Vec<BTreeSet<u64>>,
    /// Per numeric feature, the range seen so far (for binning).
    ranges: Vec<Option<(f64, f64)>>,
    /// Per categorical feature, the values seen in order (their bins).
    categories: Vec<Vec<String>>,
    /// Migrations so far.
    migrations: u32,
}

impl Population {
    pub fn new(settings: EvolveSettings, seed: u64) -> Result<Self, EvolveSettingsError> {
        settings.validate()?;
        let n = settings.features.len();
        Ok(Self {
            islands: vec![Island::default(); settings.islands as usize],
            settings,
            seed,
            programs: BTreeMap::new(),
            archive: Vec::new(),
            references: Vec::new(),
            ranges: vec![None; n],
            categories: vec![Vec::new(); n],
            migrations: 0,
        })
    }

    pub fn settings(&self) -> &EvolveSettings {
        &self.settings
    }

    /// Whether some island has a member to draw a parent from.
    pub fn is_empty(&self) -> bool {
        self.islands.iter().all(|i| i.members.is_empty())
    }

    /// The best program's candidate and score.
    pub fn best(&self) -> Option<(i64, f64)> {
        self.archive
            .first()
            .and_then(|k| self.programs.get(k).map(|p| (p.candidate, p.score)))
    }

    fn candidate(&self, k: Key) -> i64 {
        self.programs.get(&k).map_or(0, |p| p.candidate)
    }

    /// Members of each island, in island order.
    pub fn island_sizes(&self) -> Vec<usize> {
        self.islands.iter().map(|i| i.members.len()).collect()
    }

    /// The elite archive's candidates, best first.
    pub fn archive(&self) -> Vec<i64> {
        self.archive.iter().map(|k| self.candidate(*k)).collect()
    }

    pub fn migrations(&self) -> u32 {
        self.migrations
    }

    /// The seed (or any first program): a member of every island, so each starts from it.
    pub fn add_seed(
        &mut self,
        candidate: i64,
        score: f64,
        source: &str,
        knobs: Option<&serde_json::Value>,
    ) {
        let k = key(0, 0);
        let program = self.program(candidate, score, source, knobs, 0);
        self.programs.insert(k, program);
        for i in 0..self.islands.len() {
            self.place(i, k);
        }
        self.update_archive(k);
    }

    /// A passing child of `island`: sample `sample` of `round`. Returns whether it entered
    /// the island (it always joins the database, so it can reach the archive).
    #[allow(clippy::too_many_arguments)]
    pub fn add_child(
        &mut self,
        island: u32,
        round: u32,
        sample: u32,
        candidate: i64,
        score: f64,
        source: &str,
        knobs: Option<&serde_json::Value>,
    ) -> bool {
        let i = island as usize % self.islands.len();
        self.islands[i].since_migration += 1;
        let hash = fnv(source.as_bytes());
        if self.programs.values().any(|p| p.source_hash == hash) {
            return false;
        }
        let k = key(round, sample);
        let first = self.is_empty();
        let program = self.program(candidate, score, source, knobs, round);
        self.programs.insert(k, program);
        self.update_archive(k);
        if first {
            // The first program of a population whose seed failed: every island starts from
            // it, as from a seed.
            for j in 0..self.islands.len() {
                self.place(j, k);
            }
            return true;
        }
        self.place(i, k)
    }

    /// Counts a child that failed against its island (it takes a generation as any child
    /// does, so migration keeps its pace when children fail).
    pub fn add_failure(&mut self, island: u32) {
        let i = island as usize % self.islands.len();
        self.islands[i].since_migration += 1;
    }

    /// Ends a round: migrates when every island has had `migration_interval` children since
    /// the last migration. Returns the migrants.
    pub fn end_round(&mut self) -> Vec<(u32, u32, i64)> {
        let n = self.islands.len();
        let interval = self.settings.migration_interval.max(1);
        if n < 2 || self.islands.iter().any(|i| i.since_migration < interval) {
            return Vec::new();
        }
        // Who leaves is decided on the islands as they were before anyone arrived.
        let leaving: Vec<Vec<Key>> = (0..n)
            .map(|i| {
                let members = self.ranked(&self.islands[i].members);
                let k = ((members.len() as f64) * self.settings.migration_rate).ceil() as usize;
                members.into_iter().take(k.max(1)).collect()
            })
            .collect();
        let mut moved = Vec::new();
        for (from, ids) in leaving.iter().enumerate() {
            let mut targets = vec![(from + 1) % n, (from + n - 1) % n];
            targets.dedup();
            for &to in &targets {
                for &id in ids {
                    // A program already on the island is not copied again (OpenEvolve once
                    // grew 183 copies of one program this way).
                    if self.islands[to].members.contains(&id) {
                        continue;
                    }
                    if self.place(to, id) {
                        moved.push((from as u32, to as u32, self.candidate(id)));
                    }
                }
            }
        }
        for island in &mut self.islands {
            island.since_migration = 0;
        }
        self.migrations += 1;
        moved
    }

    /// What child `sample` of `round` is written from, drawn from the run's seed, the round and
    /// the sample; `None` while no island has a member. Islands take turns child by child.
    pub fn select(&self, round: u32, sample: u32, samples: u32) -> Option<Selection> {
        if self.is_empty() {
            return None;
        }
        let n = self.islands.len() as u64;
        let turn =
            u64::from(round.saturating_sub(1)) * u64::from(samples.max(1)) + u64::from(sample);
        let mut island = (turn % n) as usize;
        // An island without members lends its turn to the next one that has some.
        while self.islands[island].members.is_empty() {
            island = (island + 1) % self.islands.len();
        }
        let mut rng = ChaCha8Rng::seed_from_u64(
            self.seed
                ^ 0x5EED_E70E
                ^ (u64::from(round) << 32)
                ^ u64::from(sample).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let s = &self.settings;
        let members: Vec<Key> = self.islands[island].members.iter().copied().collect();
        let u: f64 = rng.random();
        let (draw, parent) = if u < s.exploration {
            (Draw::Exploration, *members.choose(&mut rng)?)
        } else if u < s.exploration + s.exploitation {
            let local: Vec<Key> = self
                .archive
                .iter()
                .copied()
                .filter(|id| self.islands[island].members.contains(id))
                .collect();
            let pool = if local.is_empty() {
                &self.archive
            } else {
                &local
            };
            (Draw::Exploitation, *pool.choose(&mut rng)?)
        } else {
            let all: Vec<Key> = self
                .islands
                .iter()
                .flat_map(|i| i.members.iter().copied())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            (Draw::Random, *all.choose(&mut rng)?)
        };
        let others: Vec<Key> = self
            .programs
            .keys()
            .copied()
            .filter(|id| *id != parent)
            .collect();
        let cross: f64 = rng.random();
        let diff: f64 = rng.random();
        let (mutation, mate) = if cross < s.crossover_ratio && !others.is_empty() {
            // The mate: another island's best when there is one, else this island's.
            let other_islands: Vec<Key> = (0..self.islands.len())
                .filter(|&j| j != island)
                .filter_map(|j| {
                    self.ranked(&self.islands[j].members)
                        .into_iter()
                        .find(|id| *id != parent)
                })
                .collect();
            let mate = other_islands
                .choose(&mut rng)
                .copied()
                .or_else(|| {
                    self.ranked(&self.islands[island].members)
                        .into_iter()
                        .find(|id| *id != parent)
                })
                .or_else(|| others.choose(&mut rng).copied());
            (Mutation::Crossover, mate)
        } else if diff < s.diff_ratio {
            (Mutation::Diff, None)
        } else {
            (Mutation::Full, None)
        };
        let mutation = if mate.is_none() && mutation == Mutation::Crossover {
            Mutation::Diff
        } else {
            mutation
        };
        let top: Vec<Key> = self
            .ranked(&self.islands[island].members)
            .into_iter()
            .filter(|id| *id != parent && Some(*id) != mate)
            .take(s.top_inspirations as usize)
            .collect();
        let mut diverse: Vec<Key> = self.islands[island]
            .grid
            .values()
            .copied()
            .filter(|id| *id != parent && Some(*id) != mate && !top.contains(id))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        diverse.shuffle(&mut rng);
        diverse.truncate(s.diverse_inspirations as usize);
        let candidates = |keys: Vec<Key>| keys.into_iter().map(|k| self.candidate(k)).collect();
        Some(Selection {
            island: island as u32,
            parent: self.candidate(parent),
            draw,
            mutation,
            mate: mate.map(|k| self.candidate(k)),
            top: candidates(top),
            diverse: candidates(diverse),
        })
    }

    /// `ids` by score, best first (ties: the earlier program first).
    fn ranked(&self, ids: &BTreeSet<Key>) -> Vec<Key> {
        let mut v: Vec<(Key, f64)> = ids
            .iter()
            .filter_map(|id| self.programs.get(id).map(|p| (*id, p.score)))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter().map(|(id, _)| id).collect()
    }

    fn program(
        &mut self,
        candidate: i64,
        score: f64,
        source: &str,
        knobs: Option<&serde_json::Value>,
        round: u32,
    ) -> Program {
        let lines = line_hashes(source);
        if self.references.len() < DIVERSITY_REFERENCES && !self.references.contains(&lines) {
            self.references.push(lines.clone());
        }
        let features: Vec<FeatureValue> = self
            .settings
            .features
            .iter()
            .map(|f| match f {
                Feature::Complexity => FeatureValue::Number(source.chars().count() as f64),
                Feature::Diversity => FeatureValue::Number(self.diversity(&lines)),
                Feature::Knob(k) => FeatureValue::Category(
                    knobs
                        .and_then(|v| v.get(k))
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
            })
            .collect();
        for (d, v) in features.iter().enumerate() {
            match v {
                FeatureValue::Number(x) => {
                    let r = self.ranges[d].get_or_insert((*x, *x));
                    r.0 = r.0.min(*x);
                    r.1 = r.1.max(*x);
                }
                FeatureValue::Category(c) => {
                    if !self.categories[d].contains(c) {
                        self.categories[d].push(c.clone());
                    }
                }
            }
        }
        Program {
            candidate,
            source_hash: fnv(source.as_bytes()),
            score,
            features,
            round,
        }
    }

    /// Mean Jaccard distance of a source's lines to the reference programs'.
    fn diversity(&self, lines: &BTreeSet<u64>) -> f64 {
        if self.references.is_empty() {
            return 0.0;
        }
        let total: f64 = self
            .references
            .iter()
            .map(|r| {
                let union = r.union(lines).count();
                if union == 0 {
                    0.0
                } else {
                    1.0 - r.intersection(lines).count() as f64 / union as f64
                }
            })
            .sum();
        total / self.references.len() as f64
    }

    /// The grid cell of a program: each feature's bin, joined.
    fn cell(&self, p: &Program) -> String {
        let bins = self.settings.feature_bins.max(1);
        p.features
            .iter()
            .enumerate()
            .map(|(d, v)| {
                let bin = match v {
                    FeatureValue::Number(x) => match self.ranges[d] {
                        Some((lo, hi)) if hi > lo => (((x - lo) / (hi - lo)) * f64::from(bins))
                            .floor()
                            .clamp(0.0, f64::from(bins - 1))
                            as u32,
                        _ => 0,
                    },
                    FeatureValue::Category(c) => {
                        self.categories[d].iter().position(|x| x == c).unwrap_or(0) as u32 % bins
                    }
                };
                bin.to_string()
            })
            .collect::<Vec<_>>()
            .join("-")
    }

    /// Puts `id` on island `i` when its grid cell is empty or it beats the cell's holder (the
    /// holder stays a member without a cell); an island over its size then loses its weakest
    /// member that holds no cell, never its best. Returns whether `id` is a member after.
    fn place(&mut self, i: usize, id: Key) -> bool {
        let Some(p) = self.programs.get(&id) else {
            return false;
        };
        let cell = self.cell(p);
        let score = p.score;
        let island = &self.islands[i];
        let holder = island.grid.get(&cell).copied();
        let wins = match holder.and_then(|h| self.programs.get(&h)) {
            None => true,
            Some(h) => score > h.score,
        };
        if !wins {
            return false;
        }
        let island = &mut self.islands[i];
        island.grid.insert(cell, id);
        island.members.insert(id);
        let cap = self.settings.population as usize;
        while self.islands[i].members.len() > cap {
            let ranked = self.ranked(&self.islands[i].members);
            let held: BTreeSet<Key> = self.islands[i].grid.values().copied().collect();
            let victim = ranked
                .iter()
                .skip(1)
                .rev()
                .find(|m| !held.contains(m))
                .or_else(|| ranked.iter().skip(1).last())
                .copied();
            let Some(v) = victim else { break };
            let island = &mut self.islands[i];
            island.members.remove(&v);
            island.grid.retain(|_, h| *h != v);
        }
        self.islands[i].members.contains(&id)
    }

    fn update_archive(&mut self, id: Key) {
        if !self.archive.contains(&id) {
            self.archive.push(id);
        }
        let ids: BTreeSet<Key> = self.archive.iter().copied().collect();
        let mut ranked = self.ranked(&ids);
        ranked.truncate(self.settings.archive as usize);
        self.archive = ranked;
    }
}

/// FNV-1a: stable across builds, so a checkpointed population's hashes mean the same after an
/// upgrade.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The hash of each trimmed, non-empty line.
fn line_hashes(source: &str) -> BTreeSet<u64> {
    source
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| fnv(l.as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests;
