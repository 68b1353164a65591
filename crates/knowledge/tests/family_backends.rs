//! Per-backend families on small synthetic tasks: `load_for` picks `templates-<backend>/` and
//! falls back to `templates/`, `include_dirs` share templates between sibling families (and
//! cannot leave the task), `targets` reach templates and constraints, and catalog actions are
//! scoped to backends.

use ksearch_knowledge::{Catalog, KnobValue, Knobs, TemplateFamily};
use std::path::Path;

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn family_toml(name: &str, extra: &str) -> String {
    format!(
        r#"
[family]
name = "{name}"
entry = "kernel.j2"
{extra}

[[knob]]
name = "width"
values = [1, 2, 4]
default = 1
"#
    )
}

fn load_err(dir: &Path, backend: &str) -> String {
    match TemplateFamily::load_for(dir, backend) {
        Err(e) => e.to_string(),
        Ok(f) => panic!("expected an error, got {f:?}"),
    }
}

#[test]
fn load_for_prefers_the_backends_own_directory() {
    let task = tempfile::tempdir().unwrap();
    let t = task.path();
    write(t, "templates/family.toml", &family_toml("c", ""));
    write(t, "templates/kernel.j2", "c {{ width }}\n");
    write(t, "templates-cuda/family.toml", &family_toml("cu", ""));
    write(t, "templates-cuda/kernel.j2", "cu {{ width }}\n");

    let cuda = TemplateFamily::load_for(t, "cuda").unwrap().unwrap();
    assert_eq!(cuda.name(), "cu");
    assert_eq!(cuda.render(&Knobs::new()).unwrap(), "cu 1\n");
    // No templates-cpu/, no templates-mlx/: the shared family serves both.
    assert_eq!(
        TemplateFamily::load_for(t, "cpu").unwrap().unwrap().name(),
        "c"
    );
    assert_eq!(
        TemplateFamily::load_for(t, "mlx").unwrap().unwrap().name(),
        "c"
    );
    // ... unless it says which backends it serves.
    write(
        t,
        "templates/family.toml",
        &family_toml("c", "backends = [\"cpu\"]"),
    );
    assert!(TemplateFamily::load_for(t, "mlx").unwrap().is_none());
    assert_eq!(
        TemplateFamily::load_for(t, "cpu").unwrap().unwrap().name(),
        "c"
    );
    // A backend directory whose family names other backends is a mistake, not a fallback.
    write(
        t,
        "templates-cuda/family.toml",
        &family_toml("cu", "backends = [\"mlx\"]"),
    );
    let e = load_err(t, "cuda");
    assert!(e.contains("family.backends") && e.contains("`cuda`"), "{e}");

    let empty = tempfile::tempdir().unwrap();
    assert!(TemplateFamily::load_for(empty.path(), "cuda")
        .unwrap()
        .is_none());
}

#[test]
fn include_dirs_share_templates_within_the_task() {
    let task = tempfile::tempdir().unwrap();
    let t = task.path();
    write(t, "templates-cuda/family.toml", &family_toml("cu", ""));
    write(
        t,
        "templates-cuda/kernel.j2",
        "{% include \"body.j2\" %}host\n",
    );
    write(t, "templates-cuda/body.j2", "body {{ width }}\n");
    write(
        t,
        "templates-mlx/family.toml",
        &family_toml(
            "py",
            "include_dirs = [\"../templates-cuda\"]\nbackends = [\"mlx\"]",
        ),
    );
    // The mlx family's own entry has the same name as the cuda one: a clash.
    write(
        t,
        "templates-mlx/kernel.j2",
        "BODY = '''{% include \"body.j2\" %}'''\n",
    );
    let e = load_err(t, "mlx");
    assert!(
        e.contains("include_dirs[0]") && e.contains("clashes"),
        "{e}"
    );

    std::fs::remove_file(t.join("templates-mlx/kernel.j2")).unwrap();
    write(
        t,
        "templates-mlx/family.toml",
        &family_toml("py", "include_dirs = [\"../templates-cuda\"]")
            .replace("kernel.j2", "module.py.j2"),
    );
    write(
        t,
        "templates-mlx/module.py.j2",
        "BODY = '''{% include \"body.j2\" %}'''\n",
    );
    let mlx = TemplateFamily::load_for(t, "mlx").unwrap().unwrap();
    let knobs = Knobs::from([("width".to_string(), KnobValue::Int(4))]);
    assert_eq!(mlx.render(&knobs).unwrap(), "BODY = '''body 4\n'''\n");

    for (bad, why) in [
        ("..", "leaves the task directory"),
        ("../..", "leaves the task directory"),
        ("/tmp", "relative"),
        ("../nowhere", "not a directory"),
    ] {
        write(
            t,
            "templates-mlx/family.toml",
            &family_toml("py", &format!("include_dirs = [{bad:?}]"))
                .replace("kernel.j2", "module.py.j2"),
        );
        let e = load_err(t, "mlx");
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn targets_reach_templates_and_constraints() {
    let task = tempfile::tempdir().unwrap();
    let t = task.path();
    let toml = family_toml("py", "targets = [\"fast\", \"slow\"]")
        + r#"
[[constraint]]
expr = "target == 'fast' or width == 1"
message = "slow only has width 1"
"#;
    write(t, "templates-mlx/family.toml", &toml);
    write(t, "templates-mlx/kernel.j2", "{{ target }} {{ width }}\n");
    let fam = TemplateFamily::load_for(t, "mlx").unwrap().unwrap();
    assert_eq!(fam.targets(), ["fast", "slow"]);
    assert_eq!(fam.target(), Some("fast"));
    assert_eq!(fam.enumerate().len(), 3);
    let wide = Knobs::from([("width".to_string(), KnobValue::Int(4))]);
    assert_eq!(fam.render(&wide).unwrap(), "fast 4\n");

    let slow = fam.with_target("slow").unwrap();
    assert_eq!(slow.enumerate().len(), 1);
    let e = slow.render(&wide).unwrap_err().to_string();
    assert!(e.contains("slow only has width 1"), "{e}");
    assert_eq!(slow.render(&Knobs::new()).unwrap(), "slow 1\n");
    assert!(slow.neighbours(&slow.default_knobs()).is_empty());

    let fam = TemplateFamily::load_for(t, "mlx").unwrap().unwrap();
    let e = fam.with_target("medium").unwrap_err().to_string();
    assert!(e.contains("medium") && e.contains("fast, slow"), "{e}");

    // The defaults must be valid under every target.
    write(
        t,
        "templates-mlx/family.toml",
        &toml.replace("default = 1", "default = 2"),
    );
    let e = load_err(t, "mlx");
    assert!(e.contains("(target slow)"), "{e}");
    // Without targets, `target` is not a name constraints may use; and never a knob name.
    write(
        t,
        "templates-mlx/family.toml",
        &(family_toml("py", "") + "[[constraint]]\nexpr = \"target == 'x'\"\n"),
    );
    assert!(load_err(t, "mlx").contains("unknown knobs: target"));
    write(
        t,
        "templates-mlx/family.toml",
        &family_toml("py", "").replace("name = \"width\"", "name = \"target\""),
    );
    assert!(load_err(t, "mlx").contains("reserved"));
    write(
        t,
        "templates-mlx/family.toml",
        &family_toml("py", "targets = [\"a\", \"a\"]"),
    );
    assert!(load_err(t, "mlx").contains("listed twice"));
}

const ACTION: &str = r#"
[[action]]
id = "ID"
title = "t"
rationale = "r"
kinds = ["attention"]
BACKENDS
difficulty = 2
impacts = { memory_bandwidth = 1, register_pressure = 2, compute_intensity_and_hw_fit = 3 }
expected_factor = 1.5
knobs = { width = 2 }
REQUIRES
"#;

fn action(id: &str, backends: &str, requires: &str) -> String {
    ACTION
        .replace("ID", id)
        .replace("BACKENDS", backends)
        .replace("REQUIRES", requires)
}

fn catalog(text: &str) -> Result<Catalog, String> {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "actions/a.toml", text);
    Catalog::load(dir.path()).map_err(|e| e.to_string())
}

#[test]
fn actions_are_scoped_to_backends() {
    let c = catalog(
        &[
            action("plain", "", ""),
            action("gpu", "backends = [\"cuda\", \"mlx\"]", ""),
            action("gpu-child", "backends = [\"cuda\"]", "requires = [\"gpu\"]"),
        ]
        .concat(),
    )
    .unwrap();
    // Left out, `backends` means the C families: cpu.
    assert_eq!(c.action("plain").unwrap().backends, ["cpu"]);
    let ids = |b: &str| -> Vec<String> {
        c.for_kind_on("attention", b)
            .iter()
            .map(|a| a.id.clone())
            .collect()
    };
    assert_eq!(ids("cpu"), ["plain"]);
    assert_eq!(ids("cuda"), ["gpu", "gpu-child"]);
    assert_eq!(ids("mlx"), ["gpu"]);
    assert_eq!(c.for_kind("attention").len(), 3);
    assert_eq!(
        c.kind_backends().into_iter().collect::<Vec<_>>(),
        [
            ("attention", "cpu"),
            ("attention", "cuda"),
            ("attention", "mlx")
        ]
    );

    // A requirement must apply on every backend of its dependent.
    let e = catalog(
        &[
            action("gpu", "backends = [\"cuda\"]", ""),
            action(
                "child",
                "backends = [\"cuda\", \"mlx\"]",
                "requires = [\"gpu\"]",
            ),
        ]
        .concat(),
    )
    .unwrap_err();
    assert!(
        e.contains("\"gpu\" does not apply to backend \"mlx\""),
        "{e}"
    );
    let e = catalog(&action("none", "backends = []", "")).unwrap_err();
    assert!(e.contains("backends"), "{e}");
}
