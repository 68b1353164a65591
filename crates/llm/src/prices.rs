//! Model prices: model name or glob pattern → USD per million tokens.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{LlmError, Usage};

/// The table shipped in `knowledge/prices.toml`.
const BUILTIN_PRICES: &str = include_str!("../../../knowledge/prices.toml");

/// USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

impl Price {
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.input_tokens as f64 * self.input + usage.output_tokens as f64 * self.output)
            / 1_000_000.0
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    models: BTreeMap<String, Price>,
}

#[derive(Clone, Debug)]
struct Entry {
    pattern: String,
    /// `None` for a plain name, which must match exactly.
    glob: Option<glob::Pattern>,
    /// Non-wildcard characters: more means more specific.
    literal_len: usize,
    price: Price,
}

/// A layered price table. Lookups try the layers from the most recently added
/// override down to the base, so a user's file wins over the shipped table
/// wherever it says anything about a model.
#[derive(Clone, Debug, Default)]
pub struct PriceTable {
    layers: Vec<Vec<Entry>>,
}

impl PriceTable {
    /// No prices: every call costs 0 (and is counted as unpriced).
    pub fn empty() -> Self {
        PriceTable::default()
    }

    /// The table shipped with ksearch (`knowledge/prices.toml`).
    pub fn builtin() -> Self {
        // The shipped file is parsed by a unit test, so this cannot fail in a
        // released binary; falling back to an empty table keeps it panic-free.
        Self::from_toml_str(BUILTIN_PRICES, "built-in knowledge/prices.toml").unwrap_or_else(|e| {
            log::error!("{e}");
            PriceTable::empty()
        })
    }

    /// Parses a price file (see `docs/providers.md` for the format).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, LlmError> {
        let file: PriceFile = toml::from_str(text)
            .map_err(|e| LlmError::Config(format!("price table {origin}: {e}")))?;
        let mut layer = Vec::with_capacity(file.models.len());
        for (pattern, price) in file.models {
            layer.push(make_entry(&pattern, price, origin)?);
        }
        Ok(PriceTable {
            layers: vec![layer],
        })
    }

    /// Reads a price file.
    pub fn load(path: &Path) -> Result<Self, LlmError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| LlmError::io(format!("reading price table {}", path.display()), e))?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// This table with `overrides` consulted first.
    pub fn with_overrides(mut self, overrides: PriceTable) -> Self {
        let mut layers = overrides.layers;
        layers.append(&mut self.layers);
        self.layers = layers;
        self
    }

    /// Adds one price on top of everything else.
    pub fn insert(&mut self, pattern: &str, price: Price) -> Result<(), LlmError> {
        let entry = make_entry(pattern, price, "insert")?;
        self.layers.insert(0, vec![entry]);
        Ok(())
    }

    /// The price for `model`, with the pattern that matched.
    ///
    /// Within a layer an exact name beats any pattern, and among patterns the
    /// one with the most literal characters wins (`gpt-4o-mini*` over
    /// `gpt-4o*`). Router-style names (`openai/gpt-4o`) that match nothing
    /// are tried again without the prefix.
    pub fn lookup(&self, model: &str) -> Option<(&str, Price)> {
        let found = self.lookup_exact_name(model);
        if found.is_some() {
            return found;
        }
        match model.rsplit_once('/') {
            Some((_, base)) if !base.is_empty() => self.lookup_exact_name(base),
            _ => None,
        }
    }

    fn lookup_exact_name(&self, model: &str) -> Option<(&str, Price)> {
        for layer in &self.layers {
            let mut best: Option<&Entry> = None;
            for e in layer {
                let matches = match &e.glob {
                    None => e.pattern == model,
                    Some(g) => g.matches(model),
                };
                if !matches {
                    continue;
                }
                if e.glob.is_none() {
                    return Some((&e.pattern, e.price));
                }
                let better = match best {
                    None => true,
                    Some(b) => {
                        e.literal_len > b.literal_len
                            || (e.literal_len == b.literal_len && e.pattern < b.pattern)
                    }
                };
                if better {
                    best = Some(e);
                }
            }
            if let Some(b) = best {
                return Some((&b.pattern, b.price));
            }
        }
        None
    }

    /// USD for `usage` on `model`, or `None` if the model has no price.
    pub fn cost(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.lookup(model).map(|(_, p)| p.cost(usage))
    }

    /// Number of entries over all layers.
    pub fn len(&self) -> usize {
        self.layers.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn make_entry(pattern: &str, price: Price, origin: &str) -> Result<Entry, LlmError> {
    if pattern.is_empty() {
        return Err(LlmError::Config(format!(
            "price table {origin}: empty model pattern"
        )));
    }
    for (what, v) in [("input", price.input), ("output", price.output)] {
        if !v.is_finite() || v < 0.0 {
            return Err(LlmError::Config(format!(
                "price table {origin}: model {pattern:?}: {what} price must be a non-negative number, got {v}"
            )));
        }
    }
    let is_glob = pattern.contains(['*', '?', '[']);
    let glob = if is_glob {
        Some(glob::Pattern::new(pattern).map_err(|e| {
            LlmError::Config(format!(
                "price table {origin}: bad pattern {pattern:?}: {e}"
            ))
        })?)
    } else {
        None
    };
    let literal_len = pattern.chars().filter(|c| !"*?[]".contains(*c)).count();
    Ok(Entry {
        pattern: pattern.to_string(),
        glob,
        literal_len,
        price,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> PriceTable {
        PriceTable::from_toml_str(text, "test").unwrap()
    }

    #[test]
    fn builtin_table_parses_and_prices_common_models() {
        let t = PriceTable::from_toml_str(BUILTIN_PRICES, "builtin").unwrap();
        assert!(t.len() >= 10);
        for m in [
            "gpt-4o",
            "gpt-4o-mini",
            "claude-sonnet-4-5",
            "gemini-2.5-pro",
        ] {
            assert!(t.lookup(m).is_some(), "{m} has no built-in price");
        }
        // The more specific pattern must win over its prefix.
        let (pat, mini) = t.lookup("gpt-4o-mini-2024-07-18").unwrap();
        assert_eq!(pat, "gpt-4o-mini*");
        let (_, full) = t.lookup("gpt-4o-2024-08-06").unwrap();
        assert!(mini.input < full.input);
    }

    #[test]
    fn exact_beats_glob_and_longer_glob_beats_shorter() {
        let t = table(
            r#"
            [models]
            "m*" = { input = 1.0, output = 1.0 }
            "model-x*" = { input = 2.0, output = 2.0 }
            "model-x-large" = { input = 3.0, output = 3.0 }
            "#,
        );
        assert_eq!(t.lookup("model-x-large").unwrap().1.input, 3.0);
        assert_eq!(t.lookup("model-x-small").unwrap().1.input, 2.0);
        assert_eq!(t.lookup("mini").unwrap().1.input, 1.0);
        assert!(t.lookup("other").is_none());
        // Router prefixes fall back to the bare name.
        assert_eq!(t.lookup("vendor/model-x-large").unwrap().1.input, 3.0);
    }

    #[test]
    fn cost_is_per_million_tokens() {
        let t = table(r#"models = { "m" = { input = 2.0, output = 8.0 } }"#);
        let u = Usage {
            input_tokens: 1500,
            output_tokens: 250,
            estimated: false,
        };
        let c = t.cost("m", &u).unwrap();
        assert!((c - (1500.0 * 2.0 + 250.0 * 8.0) / 1e6).abs() < 1e-15);
        assert_eq!(t.cost("n", &u), None);
    }

    #[test]
    fn overrides_win_even_when_less_specific() {
        let base = table(r#"models = { "gpt-4o-mini*" = { input = 0.15, output = 0.6 } }"#);
        let user = table(r#"models = { "gpt-*" = { input = 9.0, output = 9.0 } }"#);
        let t = base.with_overrides(user);
        assert_eq!(t.lookup("gpt-4o-mini").unwrap().1.input, 9.0);
        let mut t2 = table(r#"models = { "a" = { input = 1.0, output = 1.0 } }"#);
        t2.insert(
            "a",
            Price {
                input: 5.0,
                output: 5.0,
            },
        )
        .unwrap();
        assert_eq!(t2.lookup("a").unwrap().1.input, 5.0);
    }

    #[test]
    fn rejects_negative_prices_bad_globs_and_unknown_keys() {
        for bad in [
            r#"models = { "m" = { input = -1.0, output = 1.0 } }"#,
            r#"models = { "m[" = { input = 1.0, output = 1.0 } }"#,
            r#"models = { "m" = { input = 1.0, output = 1.0, cached = 0.1 } }"#,
            r#"modles = { }"#,
            r#"models = { "m" = { input = 1.0 } }"#,
        ] {
            assert!(
                matches!(
                    PriceTable::from_toml_str(bad, "t"),
                    Err(LlmError::Config(_))
                ),
                "accepted: {bad}"
            );
        }
    }
}
