//! Writing `task.toml` text by hand, in the order and layout of the built-in tasks (the `toml`
//! crate's serializer would reorder keys and inline the tables). Values are quoted by `toml`
//! itself, so no string can break out of its quotes.

/// A TOML basic string holding `s`, escaped.
pub(crate) fn string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// `["a", "b"]`.
pub(crate) fn string_list<S: AsRef<str>>(items: &[S]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", quoted.join(", "))
}

/// A bare key when `key` is one, else a quoted key.
pub(crate) fn key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        string(key)
    }
}

/// `{ a = 1, b = 2 }`.
pub(crate) fn inline_ints(pairs: &[(String, i64)]) -> String {
    let items: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{} = {v}", key(k)))
        .collect();
    format!("{{ {} }}", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_keys_are_quoted_so_they_parse_back() {
        let nasty = "a \"quoted\" \\ value\nwith a newline";
        let doc = format!(
            "x = {}\nlist = {}\n{} = 1\n",
            string(nasty),
            string_list(&["p", "q\"r"]),
            key("not bare")
        );
        let parsed: toml::Table = doc.parse().unwrap();
        assert_eq!(parsed["x"].as_str(), Some(nasty));
        assert_eq!(parsed["list"][1].as_str(), Some("q\"r"));
        assert_eq!(parsed["not bare"].as_integer(), Some(1));
        assert_eq!(key("batch_size"), "batch_size");
        let t: toml::Table = format!(
            "p = {}",
            inline_ints(&[("a".into(), 1), ("b c".into(), -2)])
        )
        .parse()
        .unwrap();
        assert_eq!(t["p"]["b c"].as_integer(), Some(-2));
    }
}
