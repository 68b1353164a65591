//! `ksearch new-task`'s scaffold: what it writes loads as a task, a family and actions that fit
//! it, and every kernel of the family compiles; bad requests write nothing.

mod common;

use ksearch_knowledge::scaffold::{scaffold, ScaffoldError, ScaffoldOptions};
use ksearch_knowledge::{Catalog, TemplateFamily};
use std::process::Command;

fn opts(name: &str, templates: bool) -> ScaffoldOptions {
    ScaffoldOptions {
        name: name.into(),
        backend: "cpu".into(),
        templates,
    }
}

#[test]
fn the_scaffold_with_templates_is_a_searchable_task() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("my-norm");
    let files = scaffold(&dir, &opts("my-norm", true)).unwrap();
    let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    assert_eq!(
        names,
        [
            "task.toml",
            "reference.py",
            "seed/naive.c",
            "README.md",
            "templates-cpu/family.toml",
            "templates-cpu/kernel.c.j2",
            "knowledge/actions/my-norm.toml"
        ]
    );
    let task = ksearch_task::load_task(&dir).unwrap();
    assert_eq!((task.name(), task.kind()), ("my-norm", "my-norm"));
    assert_eq!(task.backend("cpu").unwrap().entry, "my_norm_f32");
    assert!(ksearch_task::check::check(&task).is_empty());

    let family = TemplateFamily::load_for(&dir, "cpu").unwrap().unwrap();
    let catalog = Catalog::for_task(&dir).unwrap();
    let actions = catalog.for_kind_on("my-norm", "cpu");
    assert_eq!(actions.len(), 4);
    assert!(catalog.check_family("my-norm", "cpu", &family).is_empty());

    // The defaults render the seed's kernel; every setting compiles cleanly.
    let Some(cc) = common::cc() else {
        eprintln!("no C compiler: skipping the compile check");
        return;
    };
    for knobs in family.enumerate() {
        let src = family.render(&knobs).unwrap();
        assert!(src.contains("void my_norm_f32(const float* x"), "{src}");
        let file = root.path().join("k.c");
        std::fs::write(&file, &src).unwrap();
        let out = Command::new(&cc)
            .args([
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-fopenmp",
                "-std=c11",
            ])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{knobs:?}: {}\n{src}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_scaffold_without_templates_has_no_family_or_actions() {
    let dir = tempfile::tempdir().unwrap();
    let files = scaffold(dir.path(), &opts("plain", false)).unwrap();
    assert_eq!(files.len(), 4);
    assert!(TemplateFamily::load_for(dir.path(), "cpu")
        .unwrap()
        .is_none());
    assert!(!dir.path().join("knowledge").exists());
    assert!(ksearch_task::load_task(dir.path()).is_ok());
}

#[test]
fn bad_requests_write_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("t");
    let e = scaffold(&dir, &opts("9lives", true)).unwrap_err();
    assert!(matches!(e, ScaffoldError::Name(_)), "{e}");
    let e = scaffold(
        &dir,
        &ScaffoldOptions {
            backend: "tpu".into(),
            ..opts("ok", true)
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("`tpu`"), "{e}");
    assert!(!dir.exists());

    // A directory with something in it is never written into.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let e = scaffold(&dir, &opts("ok", true)).unwrap_err();
    assert!(matches!(e, ScaffoldError::NotEmpty(_)), "{e}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}
