//! API keys, kept in a type that cannot be printed by accident.

use std::fmt;

/// An API key. `Debug` and `Display` print `***`; the only way to the value is
/// [`Secret::expose`], which is called exactly where a request header is built.
///
/// It implements neither `Serialize` nor `Deserialize`, so it cannot end up in
/// a transcript, the cache or a config dump.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// Reads the key from the environment variable `var`.
    ///
    /// Unset, non-UTF-8 and blank values count as absent, so that an exported
    /// but empty variable does not send `Authorization: Bearer `.
    pub fn from_env(var: &str) -> Option<Secret> {
        let value = std::env::var(var).ok()?;
        let value = value.trim();
        if value.is_empty() {
            None
        } else {
            Some(Secret(value.to_string()))
        }
    }

    /// The raw key, for building a request header. Never log the result.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of the key in `text` with `***`.
    ///
    /// Used on every server message and body excerpt that may become part of
    /// an error, since some servers echo the key they rejected.
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_string();
        }
        text.replace(&self.0, "***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Redacts `text` with an optional key.
pub(crate) fn redact_opt(secret: Option<&Secret>, text: &str) -> String {
    match secret {
        Some(s) => s.redact(text),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_value() {
        let s = Secret::new("sk-live-abcdef123456");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(***)");
        assert_eq!(s.expose(), "sk-live-abcdef123456");
    }

    #[test]
    fn redact_replaces_every_occurrence() {
        let s = Secret::new("KEY42");
        assert_eq!(s.redact("bad key KEY42, KEY42!"), "bad key ***, ***!");
        assert_eq!(Secret::new("").redact("unchanged"), "unchanged");
    }
}
