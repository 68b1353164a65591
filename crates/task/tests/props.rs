//! Property tests: random TOML-ish mutations of the built-in `task.toml` files (lines dropped,
//! duplicated or swapped, values replaced, tokens inserted, the text cut short) never panic the
//! loader; every error has a message, and a spec error names the file and a field or a line; a
//! task that still loads answers its queries. (`crates/fuzz` fuzzes the same loader with
//! coverage guidance; this runs in every `cargo test`.)

use std::path::{Path, PathBuf};

use ksearch_task::{load_task, DType, TaskError};
use proptest::prelude::*;

const TASKS: &[&str] = &["attention", "copy", "selective-scan", "softmax"];

/// Values and fragments a mutation puts into the text.
const TOKENS: &[&str] = &[
    "0",
    "-1",
    "1.5",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "nan",
    "inf",
    "true",
    "\"\"",
    "\"x\"",
    "\"f32\"",
    "\"bf16\"",
    "\"{dtype}\"",
    "\"rows * 0\"",
    "\"1 // 0\"",
    "\"ceil_div(L, 0)\"",
    "\"min(\"",
    "\"L * L * L * L * L * L * L * L\"",
    "[]",
    "[1, \"a\"]",
    "{}",
    "{ kind = \"custom\", function = \"nope\" }",
    "{ kind = \"uniform\", low = 1.0, high = 0.0 }",
    "\"../../etc/passwd\"",
    "\"/abs/path.c\"",
    "[[workloads]]",
    "[backends.cuda]",
    "[backends.bogus]",
    "[axes.L]",
    "[tolerance.f16]",
    "=",
    "\"\"\"",
    "'",
    "#",
    "\u{e9}",
];

#[derive(Clone, Debug)]
enum Mutation {
    DropLine(usize),
    DupLine(usize),
    SwapLines(usize, usize),
    /// Replaces what follows the first `=` of a line.
    ReplaceValue(usize, usize),
    /// Inserts a token at a byte offset (snapped to a char boundary).
    Insert(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let i = any::<usize>();
    let t = 0..TOKENS.len();
    prop_oneof![
        2 => i.prop_map(Mutation::DropLine),
        1 => i.prop_map(Mutation::DupLine),
        1 => (i, i).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        5 => (i, t.clone()).prop_map(|(a, b)| Mutation::ReplaceValue(a, b)),
        2 => (i, t).prop_map(|(a, b)| Mutation::Insert(a, b)),
        1 => i.prop_map(Mutation::Truncate),
    ]
}

fn apply(text: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = lines.len().max(1);
    match *m {
        Mutation::DropLine(i) if !lines.is_empty() => {
            lines.remove(i % n);
        }
        Mutation::DupLine(i) if !lines.is_empty() => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        Mutation::SwapLines(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
        Mutation::ReplaceValue(i, t) => {
            // The i-th line that has a value.
            let with_value: Vec<usize> = (0..lines.len())
                .filter(|&k| lines[k].contains('='))
                .collect();
            if let Some(&k) = with_value.get(i % with_value.len().max(1)) {
                let key = lines[k].split('=').next().unwrap_or("").to_string();
                lines[k] = format!("{key}= {}", TOKENS[t]);
            }
        }
        Mutation::Insert(at, t) => {
            let mut s = lines.join("\n");
            let mut at = at % (s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            s.insert_str(at, TOKENS[t]);
            return s;
        }
        Mutation::Truncate(at) => {
            let s = lines.join("\n");
            let mut at = at % (s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            return s[..at].to_string();
        }
        _ => {}
    }
    lines.join("\n")
}

/// A copy of a built-in task's directory for one case (a `static` would never be dropped and
/// would leave its directories behind).
fn fixture(task: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(
        &ksearch_task::builtin::dir().unwrap().join(task),
        tmp.path(),
    );
    tmp
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn original(task: &str) -> String {
    let dir: PathBuf = ksearch_task::builtin::dir().unwrap().join(task);
    std::fs::read_to_string(dir.join("task.toml")).unwrap()
}

fn check(dir: &Path, text: &str) -> Result<(), TestCaseError> {
    std::fs::write(dir.join("task.toml"), text).unwrap();
    match load_task(dir) {
        Ok(task) => {
            for backend in task.backend_names() {
                let spec = task.backend(backend).unwrap();
                task.reference_for(backend).unwrap();
                for w in task.workloads(backend).unwrap() {
                    prop_assert!(
                        spec.entry_for(&w.params).is_some(),
                        "entry `{}` unfilled for `{}`",
                        spec.entry,
                        w.name
                    );
                    prop_assert!(w.flops.is_finite() && w.bytes.is_finite());
                }
            }
            for d in DType::ALL {
                let _ = task.tolerance(d);
            }
        }
        Err(e) => {
            let shown = e.to_string();
            prop_assert!(!shown.trim().is_empty(), "an error without a message");
            if let TaskError::Invalid(spec) = &e {
                prop_assert!(!spec.message.trim().is_empty(), "{}", shown);
                prop_assert!(
                    spec.file.starts_with(dir.canonicalize().unwrap()),
                    "names a file outside the task: {}",
                    shown
                );
                prop_assert!(
                    !spec.field.is_empty() || spec.line.is_some(),
                    "names neither a field nor a line: {}",
                    shown
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_builtin_task_files_never_panic_and_errors_say_where(
        task in 0..TASKS.len(),
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let name = TASKS[task];
        let mut text = original(name);
        for m in &mutations {
            text = apply(&text, m);
        }
        check(fixture(name).path(), &text)?;
    }

    /// Arbitrary short text, mostly TOML-shaped, as a whole file.
    #[test]
    fn arbitrary_task_files_never_panic(
        text in "(format = 1\n)?(name = \"[a-z]{0,4}\"\n)?([a-z\\[\\]\\.=\" 0-9{},\n]{0,200})",
    ) {
        check(fixture("softmax").path(), &text)?;
    }
}
