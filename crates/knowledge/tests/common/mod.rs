//! Helpers shared by the integration tests: the checkout's families, knob samples, compilers.
#![allow(dead_code)]

use ksearch_knowledge::{KnobValue, Knobs, TemplateFamily};
use std::path::PathBuf;
use std::process::Command;

/// The task kinds that ship template families, and their task directories.
pub const KINDS: &[&str] = &["softmax", "attention", "selective-scan"];

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn task_dir(kind: &str) -> PathBuf {
    repo_root().join("tasks").join(kind)
}

pub fn family(kind: &str) -> TemplateFamily {
    match TemplateFamily::load(&task_dir(kind)) {
        Ok(Some(f)) => f,
        Ok(None) => panic!("tasks/{kind} has no templates/"),
        Err(e) => panic!("tasks/{kind}: {e}"),
    }
}

/// Every combination of the family's knob values, in odometer order (the last knob fastest):
/// the brute-force oracle the enumeration is checked against.
pub fn product(f: &TemplateFamily) -> Vec<Knobs> {
    let mut product: Vec<Knobs> = vec![Knobs::new()];
    for k in f.knobs() {
        product = product
            .into_iter()
            .flat_map(|p| {
                k.values().iter().map(move |v| {
                    let mut q = p.clone();
                    q.insert(k.name().to_string(), v.clone());
                    q
                })
            })
            .collect();
    }
    product
}

/// A small deterministic generator, so samples are the same on every run.
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Self {
        Lcg(seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407))
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// The defaults, every single-knob change away from them (other knobs repaired where a rule
/// demands it) and `randoms` random valid settings; every value of every knob appears.
pub fn sample(family: &TemplateFamily, randoms: usize, seed: u64) -> Vec<Knobs> {
    let defaults = family.default_knobs();
    let mut out = vec![defaults.clone()];
    for knob in family.knobs() {
        for value in knob.values() {
            if value == knob.default_value() {
                continue;
            }
            let change = Knobs::from([(knob.name().to_string(), value.clone())]);
            let knobs = family
                .apply(&defaults, &change)
                .unwrap_or_else(|e| panic!("{}: cannot apply {change:?}: {e}", family.name()));
            out.push(knobs);
        }
    }
    let all = family.enumerate();
    let mut rng = Lcg::new(seed);
    for _ in 0..randoms {
        out.push(all[rng.below(all.len())].clone());
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|k| seen.insert(k.clone()));
    for knob in family.knobs() {
        for value in knob.values() {
            assert!(
                out.iter().any(|k| k.get(knob.name()) == Some(value)),
                "{}: sample misses {}={value}",
                family.name(),
                knob.name()
            );
        }
    }
    out
}

/// `cc` if it runs, else `None` (the caller prints why it skips).
pub fn cc() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let ok = Command::new(&cc)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then_some(cc)
}

pub fn knob(name: &str, value: impl Into<KnobValue>) -> (String, KnobValue) {
    (name.to_string(), value.into())
}
