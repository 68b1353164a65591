//! Checks on names and source text that task loading and workload resolution share:
//! identifiers, the dtype names that messages suggest, and the functions a Python module
//! defines (a text check: the Rust side never runs Python).

use crate::spec::DType;

/// The identifier `bytes` may use for the byte size of the workload's `dtype`.
pub(crate) const ELEM_BYTES: &str = "elem_bytes";

pub(crate) fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Does the Python source define a top-level function `name`? A text check: the Rust side
/// never runs Python, but a misspelt function name should fail at load, not mid-search.
pub(crate) fn python_defines(source: &str, name: &str) -> bool {
    source.lines().any(|line| {
        line.strip_prefix("def ")
            .map(str::trim_start)
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| rest.trim_start().starts_with('('))
    })
}

/// A hint for a dtype written the way other libraries spell it.
pub(crate) fn dtype_hint(s: &str) -> &'static str {
    match s.to_ascii_lowercase().as_str() {
        "float16" | "half" | "fp16" => " (did you mean \"f16\"?)",
        "bfloat16" | "bf" => " (did you mean \"bf16\"?)",
        "float32" | "float" | "fp32" => " (did you mean \"f32\"?)",
        "float64" | "double" | "fp64" => " (did you mean \"f64\"?)",
        "int32" | "int" => " (did you mean \"i32\"?)",
        "int64" | "long" => " (did you mean \"i64\"?)",
        _ => "",
    }
}

pub(crate) fn dtype_list() -> String {
    DType::ALL.map(|d| d.as_str()).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_defines_finds_top_level_functions_only() {
        let src = "import numpy as np\n\ndef reference(inputs, params):\n    def inner(x):\n        pass\n\ndef  baseline_numpy (a, b):\n    pass\n";
        assert!(python_defines(src, "reference"));
        assert!(python_defines(src, "baseline_numpy"));
        assert!(!python_defines(src, "inner"));
        assert!(!python_defines(src, "ref"));
        assert!(!python_defines(src, "numpy"));
    }
}
