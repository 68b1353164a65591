//! Template-family semantics on small synthetic families: loading errors name the file and the
//! field, constraints and forbidden combinations, neighbours, enumeration and repair.

mod common;

use common::{knob, product};
use ksearch_knowledge::{Knobs, KnowledgeError, TemplateError, TemplateFamily};
use std::path::Path;

const TEMPLATE: &str = "// {{ knob_summary }}\nint x = {{ width }};\n{% if fast %}int fast;\n{% endif %}{% include \"part.j2\" %}\n";

fn write_family(dir: &Path, family_toml: &str) {
    let t = dir.join("templates");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("family.toml"), family_toml).unwrap();
    std::fs::write(t.join("kernel.c.j2"), TEMPLATE).unwrap();
    std::fs::write(t.join("part.j2"), "/* {{ mode }} */").unwrap();
}

const GOOD: &str = r#"
[family]
name = "toy"

[[knob]]
name = "width"
values = [1, 2, 4, 8]
default = 1

[[knob]]
name = "fast"
type = "bool"
default = false

[[knob]]
name = "mode"
values = ["a", "b", "c"]
default = "a"

[[constraint]]
expr = "width >= 4 or not fast"
message = "fast needs width >= 4"

[[forbid]]
knobs = { mode = "c", width = 8 }
message = "mode c cannot be that wide"
"#;

fn load(toml: &str) -> Result<Option<TemplateFamily>, KnowledgeError> {
    let dir = tempfile::tempdir().unwrap();
    write_family(dir.path(), toml);
    TemplateFamily::load(dir.path())
}

fn toy() -> TemplateFamily {
    load(GOOD).unwrap().unwrap()
}

fn knobs(pairs: &[(&str, ksearch_knowledge::KnobValue)]) -> Knobs {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

#[test]
fn renders_with_defaults_filled_in_and_includes() {
    let f = toy();
    let src = f.render(&Knobs::from([knob("width", 4i64)])).unwrap();
    assert!(src.contains("int x = 4;"), "{src}");
    assert!(src.contains("/* a */"), "{src}");
    assert!(!src.contains("int fast"), "{src}");
    assert!(src.contains("fast=false mode=\"a\" width=4"), "{src}");
}

#[test]
fn constraints_and_forbidden_combinations_are_enforced() {
    let f = toy();
    let err = f.render(&Knobs::from([knob("fast", true)])).unwrap_err();
    assert!(err.to_string().contains("fast needs width >= 4"), "{err}");
    assert!(f
        .render(&Knobs::from([knob("fast", true), knob("width", 4i64)]))
        .is_ok());
    let err = f
        .render(&Knobs::from([knob("mode", "c"), knob("width", 8i64)]))
        .unwrap_err();
    assert!(matches!(err, TemplateError::Constraint { .. }));
    assert!(
        err.to_string().contains("mode c cannot be that wide"),
        "{err}"
    );
}

#[test]
fn enumerate_counts_the_valid_product() {
    let f = toy();
    // 4 widths x 2 x 3 = 24; fast needs width 4 or 8 (removes 2 widths x 3 modes = 6);
    // mode c with width 8 is forbidden (removes 2 fast values) -> 16.
    assert_eq!(f.space_size(), 24);
    let all = f.enumerate();
    assert_eq!(all.len(), 16);
    assert!(all.iter().all(|k| f.is_valid(k)));
}

#[test]
fn neighbours_step_along_the_declared_order() {
    let f = toy();
    let start = knobs(&[
        ("width", 4i64.into()),
        ("fast", true.into()),
        ("mode", "b".into()),
    ]);
    let mut got: Vec<String> = f
        .neighbours(&start)
        .iter()
        .map(ksearch_knowledge::format_knobs)
        .collect();
    got.sort();
    // width 2 would break "fast needs width >= 4"; 8 is fine; fast off; mode a and c.
    let mut want = vec![
        "fast=true mode=\"b\" width=8",
        "fast=false mode=\"b\" width=4",
        "fast=true mode=\"a\" width=4",
        "fast=true mode=\"c\" width=4",
    ];
    want.sort();
    assert_eq!(got, want);
    // Settings the family does not know have no neighbours.
    assert!(f.neighbours(&Knobs::from([knob("depth", 1i64)])).is_empty());
}

#[test]
fn apply_repairs_with_the_fewest_changes() {
    let f = toy();
    let base = f.default_knobs();
    // fast=true alone breaks the width rule: the nearest repair is width 4 (two steps from 1),
    // not width 8 (three).
    let out = f.apply(&base, &Knobs::from([knob("fast", true)])).unwrap();
    assert_eq!(out["width"], 4i64.into());
    assert_eq!(out["mode"], "a".into());
    // A change that no setting allows is an error, not a silent drop.
    let impossible = Knobs::from([knob("mode", "c"), knob("width", 8i64), knob("fast", true)]);
    assert!(matches!(
        f.apply(&base, &impossible),
        Err(TemplateError::Unsatisfiable { .. })
    ));
    assert!(matches!(
        f.apply(&base, &Knobs::from([knob("width", 3i64)])),
        Err(TemplateError::OutOfDomain { .. })
    ));
}

#[test]
fn knobs_round_trip_through_json() {
    let k = knobs(&[
        ("width", 4i64.into()),
        ("fast", true.into()),
        ("mode", "b".into()),
    ]);
    let text = serde_json::to_string(&k).unwrap();
    assert_eq!(text, r#"{"fast":true,"mode":"b","width":4}"#);
    let back: Knobs = serde_json::from_str(&text).unwrap();
    assert_eq!(back, k);
}

fn load_err(toml: &str) -> String {
    match load(toml) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected an error for:\n{toml}"),
    }
}

#[test]
fn loading_errors_name_the_file_and_the_field() {
    let e = load_err(&GOOD.replace("default = 1", "default = 3"));
    assert!(
        e.contains("family.toml") && e.contains("knob[0] (width).default"),
        "{e}"
    );
    assert!(e.contains("not in the domain"), "{e}");

    let e = load_err(&GOOD.replace("values = [1, 2, 4, 8]", "values = [1, \"two\"]"));
    assert!(
        e.contains("knob[0] (width).values") && e.contains("mixes types"),
        "{e}"
    );

    let e = load_err(&GOOD.replace("width >= 4 or not fast", "widht >= 4 or not fast"));
    assert!(
        e.contains("constraint[0].expr") && e.contains("widht"),
        "{e}"
    );

    let e = load_err(&GOOD.replace("width >= 4 or not fast", "width >= >= 4"));
    assert!(
        e.contains("constraint[0].expr") && e.contains("does not parse"),
        "{e}"
    );

    let e = load_err(&GOOD.replace(
        "knobs = { mode = \"c\", width = 8 }",
        "knobs = { mode = \"z\" }",
    ));
    assert!(e.contains("forbid[0].knobs"), "{e}");

    let e = load_err(&GOOD.replace("name = \"fast\"", "name = \"width\""));
    assert!(e.contains("declared twice"), "{e}");

    let e = load_err(&GOOD.replace("name = \"mode\"", "name = \"knobs\""));
    assert!(e.contains("reserved"), "{e}");

    let e = load_err(&GOOD.replace("type = \"bool\"", "type = \"boolean\""));
    assert!(e.contains("knob[1] (fast).type"), "{e}");

    // A typo in a field name is caught, with the TOML position.
    let e = load_err(&GOOD.replace("message = \"fast needs", "mesage = \"fast needs"));
    assert!(e.contains("family.toml") && e.contains("mesage"), "{e}");

    // Defaults must satisfy the rules.
    let e = load_err(&GOOD.replace("default = false", "default = true"));
    assert!(
        e.contains("knob.default") && e.contains("fast needs width >= 4"),
        "{e}"
    );

    let e = load_err(&GOOD.replace(
        "[family]\nname = \"toy\"",
        "[family]\nname = \"toy\"\nentry = \"missing.j2\"",
    ));
    assert!(
        e.contains("family.entry") && e.contains("missing.j2"),
        "{e}"
    );
}

#[test]
fn template_errors_name_the_template() {
    let dir = tempfile::tempdir().unwrap();
    write_family(dir.path(), GOOD);
    // A syntax error in an included file.
    std::fs::write(dir.path().join("templates/part.j2"), "{% if mode %}").unwrap();
    let e = TemplateFamily::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("part.j2"), "{e}");
    // An undefined name is an error, not an empty string.
    std::fs::write(dir.path().join("templates/part.j2"), "{{ mdoe }}").unwrap();
    let e = TemplateFamily::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("mdoe") && e.contains("undefined"), "{e}");
}

#[test]
fn a_templates_dir_without_family_toml_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("templates")).unwrap();
    let e = TemplateFamily::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("family.toml"), "{e}");
}

#[test]
fn families_and_catalogs_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<TemplateFamily>();
    shareable::<ksearch_knowledge::Catalog>();
    // And a shared family renders from several threads at once.
    let f = toy();
    std::thread::scope(|s| {
        for w in [1i64, 2, 4, 8] {
            let f = &f;
            s.spawn(move || {
                let src = f.render(&Knobs::from([knob("width", w)])).unwrap();
                assert!(src.contains(&format!("int x = {w};")));
            });
        }
    });
}

#[test]
fn enumerate_checks_each_rule_once_its_knobs_are_set_and_keeps_the_product_order() {
    // enumerate walks the knobs depth first and checks a rule as soon as the knobs it reads are
    // set: one on the first and the last knob waits for the last, one that reads no knob holds
    // from the start. The result is the valid part of the product, in the product's order (the
    // last knob fastest).
    let toml = GOOD.to_string()
        + r#"
[[constraint]]
expr = "mode != 'b' or width <= 2"
message = "mode b is narrow"

[[constraint]]
expr = "true"
message = "always"
"#;
    let f = load(&toml).unwrap().unwrap();
    let valid: Vec<Knobs> = product(&f).into_iter().filter(|k| f.is_valid(k)).collect();
    // 16 as above, less mode b at width 4 and 8 (two fast values each): 12.
    assert_eq!(valid.len(), 12);
    assert_eq!(f.enumerate(), valid);
}
