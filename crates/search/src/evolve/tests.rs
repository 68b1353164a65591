use super::*;

/// The seed's source (no child's).
const SEED: &str = "seed kernel;\n";

/// A source whose length and lines depend on `n` (its complexity grows with `n`).
fn src(n: usize) -> String {
    (0..n).map(|i| format!("line {i} of {n};\n")).collect()
}

/// The candidates on island `i`, in key order.
fn members(p: &Population, i: usize) -> Vec<i64> {
    p.islands[i]
        .members
        .iter()
        .map(|k| p.candidate(*k))
        .collect()
}

/// The candidates holding island `i`'s grid cells, in cell order.
fn holders(p: &Population, i: usize) -> Vec<i64> {
    p.islands[i]
        .grid
        .values()
        .map(|k| p.candidate(*k))
        .collect()
}

fn settings() -> EvolveSettings {
    EvolveSettings::default()
}

fn knobs(tile: u32) -> serde_json::Value {
    serde_json::json!({"tile": tile})
}

#[test]
fn a_child_takes_its_cell_only_from_a_weaker_holder() {
    let s = EvolveSettings {
        islands: 1,
        features: vec![Feature::Knob("tile".into())],
        ..settings()
    };
    let mut p = Population::new(s, 7).unwrap();
    p.add_seed(1, 1.0, SEED, Some(&knobs(16)));
    // Same cell (tile 16), better: it takes the cell; the seed stays a member without one.
    assert!(p.add_child(0, 1, 2, 2, 1.5, &src(4), Some(&knobs(16))));
    assert_eq!(holders(&p, 0), vec![2]);
    assert!(members(&p, 0).contains(&1));
    // Same cell, worse than its holder: it stays out of the island but joins the database.
    assert!(!p.add_child(0, 2, 3, 3, 1.2, &src(5), Some(&knobs(16))));
    assert!(!members(&p, 0).contains(&3));
    assert!(p.archive().contains(&3));
    // A new cell (tile 32) takes anyone.
    assert!(p.add_child(0, 3, 4, 4, 0.5, &src(6), Some(&knobs(32))));
    assert_eq!(p.islands[0].grid.len(), 2);
}

#[test]
fn an_island_over_its_size_drops_its_weakest_free_member_and_keeps_its_best() {
    let s = EvolveSettings {
        islands: 1,
        population: 4,
        features: vec![Feature::Knob("tile".into())],
        feature_bins: 100,
        ..settings()
    };
    let mut p = Population::new(s, 1).unwrap();
    p.add_seed(1, 1.0, SEED, Some(&knobs(0)));
    // Each child in the seed's cell beats the holder before it: the holders it displaces
    // stay as members without a cell until the cap removes them, weakest first.
    for (i, score) in [1.1, 1.2, 1.3, 1.4, 1.5].into_iter().enumerate() {
        let id = i as i64 + 2;
        assert!(p.add_child(0, 1, (id) as u32, id, score, &src(4 + i), Some(&knobs(0))));
        assert!(p.islands[0].members.len() <= 4);
    }
    assert_eq!(
        members(&p, 0),
        vec![3, 4, 5, 6],
        "the weakest (seed, then 2) left first"
    );
    assert_eq!(p.best(), Some((6, 1.5)));
}

#[test]
fn the_archive_holds_the_best_across_islands_best_first() {
    let s = EvolveSettings {
        archive: 3,
        ..settings()
    };
    let mut p = Population::new(s, 1).unwrap();
    p.add_seed(1, 1.0, SEED, None);
    for (id, island, score) in [(2, 0, 1.4), (3, 1, 0.9), (4, 2, 2.0), (5, 0, 1.1)] {
        p.add_child(
            island,
            1,
            (id) as u32,
            id,
            score,
            &src(id as usize + 3),
            None,
        );
    }
    assert_eq!(p.archive(), vec![4, 2, 5]);
}

#[test]
fn selections_repeat_for_a_round_and_sample_and_islands_take_turns() {
    let mut p = Population::new(settings(), 42).unwrap();
    p.add_seed(1, 1.0, SEED, None);
    for id in 2..12 {
        p.add_child(
            (id % 3) as u32,
            1,
            (id) as u32,
            id,
            1.0 + id as f64 / 10.0,
            &src(id as usize * 7),
            None,
        );
    }
    let a = p.select(5, 1, 2).unwrap();
    // The same question after a checkpoint gets the same answer.
    let again: Population = serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
    assert_eq!(again.select(5, 1, 2).unwrap(), a);
    assert_eq!(again, p);
    // Islands in turn, child by child: round r, sample s is child (r - 1) * samples + s.
    let islands: Vec<u32> = (1..=3)
        .flat_map(|r| (0..2).map(move |s| (r, s)))
        .map(|(r, s)| p.select(r, s, 2).unwrap().island)
        .collect();
    assert_eq!(islands, vec![0, 1, 2, 0, 1, 2]);
    // Another seed draws other parents somewhere in the first rounds.
    let mut q = p.clone();
    q.seed = 43;
    assert!((1..20).any(|r| q.select(r, 0, 1) != p.select(r, 0, 1)));
}

#[test]
fn parents_are_drawn_in_the_configured_shares() {
    let s = EvolveSettings {
        islands: 2,
        exploration: 0.2,
        exploitation: 0.5,
        ..settings()
    };
    let mut p = Population::new(s, 3).unwrap();
    p.add_seed(1, 1.0, SEED, None);
    for id in 2..20 {
        p.add_child(
            (id % 2) as u32,
            1,
            (id) as u32,
            id,
            id as f64,
            &src(id as usize * 5),
            None,
        );
    }
    let mut counts = BTreeMap::new();
    let n = 4000;
    for r in 1..=n {
        let sel = p.select(r, 0, 1).unwrap();
        *counts.entry(format!("{:?}", sel.draw)).or_insert(0u32) += 1;
        assert!(
            members(&p, sel.island as usize).contains(&sel.parent) || sel.draw != Draw::Exploration
        );
        if sel.draw == Draw::Exploitation {
            assert!(p.archive().contains(&sel.parent));
        }
    }
    let share = |k: &str| f64::from(counts[k]) / f64::from(n);
    assert!((share("Exploration") - 0.2).abs() < 0.03, "{counts:?}");
    assert!((share("Exploitation") - 0.5).abs() < 0.03, "{counts:?}");
    assert!((share("Random") - 0.3).abs() < 0.03, "{counts:?}");
}

#[test]
fn inspirations_are_the_islands_best_then_other_cells_without_the_parent() {
    let s = EvolveSettings {
        islands: 1,
        top_inspirations: 2,
        diverse_inspirations: 2,
        exploration: 0.0,
        exploitation: 1.0,
        features: vec![Feature::Knob("tile".into())],
        feature_bins: 100,
        ..settings()
    };
    let mut p = Population::new(s, 5).unwrap();
    p.add_seed(1, 1.0, SEED, Some(&knobs(1)));
    for id in 2..8 {
        p.add_child(
            0,
            1,
            (id) as u32,
            id,
            id as f64,
            &src(id as usize),
            Some(&knobs(id as u32)),
        );
    }
    for r in 1..50 {
        let sel = p.select(r, 0, 1).unwrap();
        let inspirations: Vec<i64> = sel.inspirations().collect();
        assert!(!inspirations.contains(&sel.parent));
        let top: Vec<i64> = [7, 6, 5]
            .into_iter()
            .filter(|id| *id != sel.parent)
            .take(2)
            .collect();
        assert_eq!(sel.top, top, "{sel:?}");
        assert_eq!(sel.diverse.len(), 2, "{sel:?}");
        let unique: BTreeSet<i64> = inspirations.iter().copied().collect();
        assert_eq!(unique.len(), 4);
    }
}

#[test]
fn migration_copies_each_islands_best_to_both_neighbours_once() {
    let s = EvolveSettings {
        islands: 3,
        migration_interval: 2,
        migration_rate: 0.1,
        features: vec![Feature::Knob("tile".into())],
        feature_bins: 100,
        ..settings()
    };
    let mut p = Population::new(s, 9).unwrap();
    p.add_seed(1, 1.0, SEED, Some(&knobs(0)));
    let mut id = 2;
    for round in 1..=2 {
        for island in 0..3u32 {
            // Island i's children score 2 + i (+0.1 in round 2): each island a distinct best.
            let score = 2.0 + f64::from(island) + f64::from(round - 1) / 10.0;
            assert!(p.add_child(
                island,
                round,
                (id) as u32,
                id,
                score,
                &src(id as usize),
                Some(&knobs(id as u32))
            ));
            id += 1;
        }
        if round == 1 {
            assert!(
                p.end_round().is_empty(),
                "one child per island is below the interval"
            );
        }
    }
    let moved = p.end_round();
    assert_eq!(p.migrations(), 1);
    // Each island's best (its round-2 child: 5, 6, 7) reaches both ring neighbours.
    let mut expected = vec![
        (0, 1, 5),
        (0, 2, 5),
        (1, 2, 6),
        (1, 0, 6),
        (2, 0, 7),
        (2, 1, 7),
    ];
    expected.sort();
    let mut got = moved.clone();
    got.sort();
    assert_eq!(got, expected);
    for i in 0..3 {
        assert!([5, 6, 7].iter().all(|b| members(&p, i).contains(b)));
    }
    // Nothing migrates again until every island has had its interval of children.
    assert!(p.end_round().is_empty());
    for island in 0..3u32 {
        p.add_failure(island);
        p.add_failure(island);
    }
    // The best are everywhere already: the next migration copies nothing twice.
    assert!(p.end_round().is_empty());
    assert_eq!(p.migrations(), 2);
}

#[test]
fn crossover_takes_a_mate_from_another_island_and_only_when_asked() {
    let s = EvolveSettings {
        islands: 2,
        crossover_ratio: 1.0,
        ..settings()
    };
    let mut p = Population::new(s, 11).unwrap();
    p.add_seed(1, 1.0, SEED, None);
    p.add_child(0, 1, 2, 2, 2.0, &src(9), None);
    p.add_child(1, 1, 3, 3, 3.0, &src(15), None);
    for r in 1..30 {
        let sel = p.select(r, 0, 1).unwrap();
        assert_eq!(sel.mutation, Mutation::Crossover);
        let mate = sel.mate.unwrap();
        assert_ne!(mate, sel.parent);
        if sel.island == 0 && sel.parent != 3 {
            assert_eq!(
                mate, 3,
                "island 1's best is the mate of island 0's children"
            );
        }
    }
    let mut none = p.clone();
    none.settings.crossover_ratio = 0.0;
    none.settings.diff_ratio = 1.0;
    assert!((1..30).all(|r| {
        let sel = none.select(r, 0, 1).unwrap();
        sel.mutation == Mutation::Diff && sel.mate.is_none()
    }));
    none.settings.diff_ratio = 0.0;
    assert!((1..30).all(|r| none.select(r, 0, 1).unwrap().mutation == Mutation::Full));
}

#[test]
fn an_empty_population_selects_nothing_and_bad_settings_say_why() {
    let p = Population::new(settings(), 1).unwrap();
    assert!(p.is_empty());
    assert_eq!(p.select(1, 0, 1), None);
    let bad = EvolveSettings {
        exploration: 0.6,
        exploitation: 0.6,
        ..settings()
    };
    let err = Population::new(bad, 1).unwrap_err().to_string();
    assert!(err.contains("add up to more than 1"), "{err}");
    let err = Population::new(
        EvolveSettings {
            islands: 0,
            ..settings()
        },
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("at least 1"), "{err}");
    let err = Population::new(
        EvolveSettings {
            diff_ratio: 1.5,
            ..settings()
        },
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("diff ratio must be between 0 and 1"), "{err}");
}

#[test]
fn features_read_and_write_by_name() {
    for name in ["complexity", "diversity", "knob:tile_m"] {
        let f: Feature = name.parse().unwrap();
        assert_eq!(f.to_string(), name);
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(serde_json::from_value::<Feature>(json).unwrap(), f);
    }
    assert!("knob:".parse::<Feature>().is_err());
    let err = "size".parse::<Feature>().unwrap_err();
    assert!(err.contains("complexity, diversity, knob:NAME"), "{err}");
}

#[test]
fn complexity_and_diversity_spread_programs_over_cells() {
    let mut p = Population::new(
        EvolveSettings {
            islands: 1,
            population: 100,
            ..settings()
        },
        2,
    )
    .unwrap();
    p.add_seed(1, 1.0, SEED, None);
    // Short and long sources, some sharing the seed's lines and some not.
    for id in 2..40 {
        let n = (id as usize * 13) % 60 + 2;
        let text = if id % 2 == 0 {
            src(n)
        } else {
            src(n).replace("line", "row")
        };
        p.add_child(0, 1, (id) as u32, id, 1.0, &text, None);
    }
    let cells: BTreeSet<&String> = p.islands[0].grid.keys().collect();
    assert!(cells.len() >= 6, "{cells:?}");
    let dims: BTreeSet<&str> = cells.iter().filter_map(|c| c.split('-').nth(1)).collect();
    assert!(
        dims.len() >= 2,
        "diversity separates programs too: {cells:?}"
    );
}

#[test]
fn a_child_identical_to_a_program_already_there_is_not_added_again() {
    let mut p = Population::new(settings(), 1).unwrap();
    p.add_seed(1, 1.0, SEED, None);
    assert!(p.add_child(0, 1, 0, 2, 1.5, &src(7), None));
    // The same source again (its stored evaluation reused, so the same score): not a second
    // program, though it counts as the island's child.
    assert!(!p.add_child(1, 2, 0, 3, 1.5, &src(7), None));
    assert_eq!(p.archive(), vec![2, 1]);
    assert_eq!(p.islands[1].since_migration, 1);
}

#[test]
fn when_the_seed_failed_the_first_passing_child_starts_every_island() {
    let mut p = Population::new(settings(), 1).unwrap();
    assert!(p.is_empty());
    p.add_failure(0);
    assert!(p.add_child(0, 2, 0, 5, 1.0, &src(4), None));
    for i in 0..3 {
        assert_eq!(members(&p, i), vec![5], "island {i}");
    }
    // Islands take turns again from here.
    let islands: Vec<u32> = (3..6).map(|r| p.select(r, 0, 1).unwrap().island).collect();
    assert_eq!(islands, vec![2, 0, 1]);
}
