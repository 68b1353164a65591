//! The shipped action catalog and hardware profiles, and the loader's checks on bad files.

mod common;

use common::{repo_root, task_dir, KINDS};
use ksearch_knowledge::templates::{KnobValue, Knobs};
use ksearch_knowledge::{Catalog, DeviceKind, HardwareProfile, TemplateFamily};
use std::path::Path;

fn builtin() -> Catalog {
    Catalog::load(&repo_root().join("knowledge")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn builtin_catalog_loads_through_the_asset_locator() {
    let located = Catalog::builtin().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(located.actions(), builtin().actions());
}

/// Every (kind, backend) the catalog has actions for, with the task family they must fit:
/// the C families on cpu, the attention task's CUDA and MLX families on cuda and mlx.
fn scopes(c: &Catalog) -> Vec<(String, String, TemplateFamily)> {
    let pairs = c.kind_backends();
    for kind in KINDS {
        assert!(pairs.contains(&(*kind, "cpu")), "{kind} has no cpu actions");
    }
    for backend in ["cuda", "mlx"] {
        assert!(
            pairs.contains(&("attention", backend)),
            "attention has no {backend} actions"
        );
    }
    pairs
        .into_iter()
        .map(|(kind, backend)| {
            let f = TemplateFamily::load_for(&task_dir(kind), backend)
                .unwrap_or_else(|e| panic!("{kind}/{backend}: {e}"))
                .unwrap_or_else(|| panic!("{kind} has actions for {backend} but no family"));
            (kind.to_string(), backend.to_string(), f)
        })
        .collect()
}

#[test]
fn each_kind_has_a_meaningful_tree() {
    let c = builtin();
    for (kind, backend, _) in scopes(&c) {
        let actions = c.for_kind_on(&kind, &backend);
        assert!(
            (6..=18).contains(&actions.len()),
            "{kind}/{backend}: {} actions",
            actions.len()
        );
        assert!(actions
            .iter()
            .all(|a| a.applies_to_backend(&kind, &backend)));
        // Some actions are roots, some are children: the tree has depth.
        let roots = actions.iter().filter(|a| a.requires.is_empty()).count();
        assert!(
            roots >= 3 && roots < actions.len(),
            "{kind}/{backend}: {roots} roots"
        );
        // Priors differ, so the selection policy has something to rank.
        let factors: std::collections::BTreeSet<u64> = actions
            .iter()
            .map(|a| (a.expected_factor * 100.0) as u64)
            .collect();
        assert!(factors.len() >= 3, "{kind}/{backend}: priors are all alike");
    }
    assert!(c.for_kind("no-such-kind").is_empty());
    assert!(KINDS.iter().all(|k| c.kinds().contains(k)));
    // Actions written for the C families never reach a GPU run, and the reverse.
    assert!(c
        .for_kind_on("attention", "cuda")
        .iter()
        .all(|a| !c.for_kind_on("attention", "cpu").contains(a)));
}

#[test]
fn every_action_fits_the_family_of_each_kind_and_backend_it_lists() {
    let c = builtin();
    for (kind, backend, f) in scopes(&c) {
        let problems = c.check_family(&kind, &backend, &f);
        assert!(
            problems.is_empty(),
            "{kind}/{backend}:\n{}",
            problems.join("\n")
        );
        for a in c.for_kind_on(&kind, &backend) {
            assert!(!a.knobs.is_empty(), "{}: sets no knob", a.id);
            // Applying the action (after its requirements) to the defaults changes the kernel.
            let knobs = c.cumulative_knobs(&a.id);
            let applied = f.apply(&f.default_knobs(), &knobs).unwrap();
            assert_ne!(
                applied,
                f.default_knobs(),
                "{}: no effect on {kind}/{backend}",
                a.id
            );
            assert_ne!(
                f.render(&applied).unwrap(),
                f.render(&f.default_knobs()).unwrap(),
                "{}: same source on {kind}/{backend}",
                a.id
            );
        }
    }
}

#[test]
fn a_family_missing_an_actions_knob_is_reported_per_backend() {
    // The GPU actions name knobs the C family lacks: checked against it, each is a problem.
    let c = builtin();
    let cpu = TemplateFamily::load_for(&task_dir("attention"), "cpu")
        .unwrap()
        .unwrap();
    let problems = c.check_family("attention", "cuda", &cpu);
    assert!(
        problems.iter().any(|p| p.contains("has no knob `algo`")),
        "{problems:?}"
    );
    assert!(c.check_family("attention", "cpu", &cpu).is_empty());
}

#[test]
fn requirements_chain_knobs() {
    let c = builtin();
    let k = c.cumulative_knobs("scan-state-blocking");
    assert_eq!(k["loop_order"], "t_inner".into());
    assert_eq!(k["n_block"], 8i64.into());
    let children: Vec<&str> = c
        .dependents("attention", "attn-query-block")
        .iter()
        .map(|a| a.id.as_str())
        .collect();
    assert!(children.contains(&"attn-k-transpose"), "{children:?}");
}

#[test]
fn hardware_profiles_load_and_resolve_by_name_or_alias() {
    let c = builtin();
    for name in ["generic-x86-cpu", "h100", "h200"] {
        let p = c
            .hardware_profile(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(p.name, name);
        assert!(!p.source.is_empty());
        assert!(p.peak_flops("f32").unwrap() > 0.0);
    }
    let h200 = c.hardware_profile("nvidia h200").unwrap();
    assert_eq!(h200.name, "h200");
    assert_eq!(h200.kind, DeviceKind::Gpu);
    assert_eq!(h200.parallelism.simd_width, 32);
    // Same compute die, faster memory: the H200's ridge point sits lower.
    let h100 = c.hardware_profile("h100").unwrap();
    assert!(h200.ridge_point("bf16").unwrap() < h100.ridge_point("bf16").unwrap());
    assert!(h200.memory.bandwidth_gbs > h100.memory.bandwidth_gbs);
    let cpu = c.hardware_profile("generic-x86-cpu").unwrap();
    assert_eq!(cpu.kind, DeviceKind::Cpu);
    assert!(c.hardware_profile("tpu-v9").is_none());
}

/// A profile asked for by name must exist; the reported device's is taken when there is one.
#[test]
fn the_profile_for_a_measurement_is_the_one_asked_for_else_the_devices() {
    let c = builtin();
    let name = |p: Option<&HardwareProfile>| p.map(|p| p.name.clone());
    let got = c.hardware_for(Some("h100"), Some("NVIDIA H200")).unwrap();
    assert_eq!(name(got).as_deref(), Some("h100"));
    let got = c.hardware_for(None, Some("NVIDIA H200")).unwrap();
    assert_eq!(name(got).as_deref(), Some("h200"));
    assert!(c
        .hardware_for(None, Some("a GPU of 2040"))
        .unwrap()
        .is_none());
    assert!(c.hardware_for(None, None).unwrap().is_none());
    let err = c
        .hardware_for(Some("tpu-v9"), None)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "no hardware profile `tpu-v9` in knowledge/hardware");
}

/// A knowledge dir with one actions file and the given hardware files.
fn pack(actions: &str, hardware: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("actions")).unwrap();
    std::fs::create_dir_all(dir.path().join("hardware")).unwrap();
    std::fs::write(dir.path().join("actions/a.toml"), actions).unwrap();
    for (name, text) in hardware {
        std::fs::write(dir.path().join("hardware").join(name), text).unwrap();
    }
    dir
}

const ACTION: &str = r#"
[[action]]
id = "one"
title = "One"
rationale = "why"
kinds = ["softmax"]
difficulty = 2
impacts = { memory_bandwidth = 1, register_pressure = 2, compute_intensity_and_hw_fit = 3 }
expected_factor = 1.5
knobs = { simd = true }
"#;

fn second(id: &str, requires: &str) -> String {
    ACTION
        .replace("id = \"one\"", &format!("id = \"{id}\""))
        .replace("knobs = {", &format!("requires = [{requires}]\nknobs = {{"))
}

fn err(dir: &Path) -> String {
    match Catalog::load(dir) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn catalog_errors_name_the_file_and_the_field() {
    let ok = pack(&format!("{ACTION}{}", second("two", "\"one\"")), &[]);
    let c = Catalog::load(ok.path()).unwrap();
    assert_eq!(c.actions().len(), 2);
    assert_eq!(c.cumulative_knobs("two").len(), 1);

    let e = err(pack(&format!("{ACTION}{ACTION}"), &[]).path());
    assert!(
        e.contains("a.toml") && e.contains("action[1].id") && e.contains("already defined"),
        "{e}"
    );

    let e = err(pack(&format!("{ACTION}{}", second("two", "\"nope\"")), &[]).path());
    assert!(
        e.contains("action \"two\".requires") && e.contains("nope"),
        "{e}"
    );

    let cyc = format!("{}{}", second("x", "\"y\""), second("y", "\"x\""));
    let e = err(pack(&cyc, &[]).path());
    assert!(e.contains("cycle"), "{e}");

    let e = err(pack(&ACTION.replace("difficulty = 2", "difficulty = 9"), &[]).path());
    assert!(e.contains("action[0] (one).difficulty"), "{e}");

    let e = err(pack(
        &ACTION.replace("register_pressure = 2", "register_pressure = 12"),
        &[],
    )
    .path());
    assert!(e.contains("impacts.register_pressure"), "{e}");

    let e = err(pack(&ACTION.replace("rationale", "rationle"), &[]).path());
    assert!(e.contains("a.toml") && e.contains("rationle"), "{e}");

    // A requirement must cover every kind of the action that needs it.
    let mixed = format!(
        "{ACTION}{}",
        second("two", "\"one\"").replace(
            "kinds = [\"softmax\"]",
            "kinds = [\"softmax\", \"attention\"]"
        )
    );
    let e = err(pack(&mixed, &[]).path());
    assert!(e.contains("does not apply to kind \"attention\""), "{e}");
}

#[test]
fn a_conditional_prior_holds_for_kernels_with_its_knobs() {
    let when = format!(
        "{ACTION}[[action.when]]\nknobs = {{ simd = false, unroll = 4 }}\nexpected_factor = 2.5\n\
         [[action.when]]\nknobs = {{ simd = false }}\nexpected_factor = 0.8\n"
    );
    let c = Catalog::load(pack(&when, &[]).path()).unwrap();
    let a = c.action("one").unwrap();
    let knobs = |pairs: &[(&str, KnobValue)]| -> Knobs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    // No knobs (a seed that is no template setting): the unconditional prior.
    assert_eq!(a.expected_factor_from(&Knobs::new()), 1.5);
    // The first entry the kernel matches wins, in file order.
    let both = knobs(&[("simd", false.into()), ("unroll", 4i64.into())]);
    assert_eq!(a.expected_factor_from(&both), 2.5);
    let one = knobs(&[("simd", false.into()), ("unroll", 2i64.into())]);
    assert_eq!(a.expected_factor_from(&one), 0.8);
    assert_eq!(
        a.expected_factor_from(&knobs(&[("simd", true.into())])),
        1.5
    );

    let e = err(pack(
        &format!("{ACTION}[[action.when]]\nknobs = {{}}\nexpected_factor = 2.0\n"),
        &[],
    )
    .path());
    assert!(e.contains("when[0].knobs"), "{e}");
    let e = err(pack(
        &format!("{ACTION}[[action.when]]\nknobs = {{ simd = false }}\nexpected_factor = 0\n"),
        &[],
    )
    .path());
    assert!(e.contains("when[0].expected_factor"), "{e}");
}

#[test]
fn a_conditional_prior_on_a_knob_the_family_lacks_is_reported() {
    let cuda = TemplateFamily::load_for(&task_dir("attention"), "cuda")
        .unwrap()
        .unwrap();
    let gpu = ACTION
        .replace(
            "kinds = [\"softmax\"]",
            "kinds = [\"attention\"]\nbackends = [\"cuda\"]",
        )
        .replace("knobs = { simd = true }", "knobs = { exp2 = true }");
    let when =
        |cond: &str| format!("{gpu}[[action.when]]\nknobs = {{ {cond} }}\nexpected_factor = 1.2\n");
    let ok = Catalog::load(pack(&when("algo = \"wgmma\""), &[]).path()).unwrap();
    assert_eq!(
        ok.check_family("attention", "cuda", &cuda),
        Vec::<String>::new()
    );
    let bad = Catalog::load(pack(&when("nope = 1"), &[]).path()).unwrap();
    let problems = bad.check_family("attention", "cuda", &cuda);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`when` condition") && p.contains("has no knob `nope`")),
        "{problems:?}"
    );
    let bad = Catalog::load(pack(&when("algo = \"fft\""), &[]).path()).unwrap();
    let problems = bad.check_family("attention", "cuda", &cuda);
    assert!(
        problems.iter().any(|p| p.contains("outside the domain")),
        "{problems:?}"
    );
}

const HW: &str = r#"
name = "toy"
title = "Toy"
kind = "cpu"
source = ["made up for a test"]
[memory]
bandwidth_gbs = 10.0
[peak_tflops]
f32 = 0.1
[parallelism]
compute_units = 2
simd_width = 8
"#;

#[test]
fn new_hardware_files_are_picked_up_and_checked() {
    let dir = pack(
        ACTION,
        &[
            ("toy.toml", HW),
            ("other.toml", &HW.replace("\"toy\"", "\"other\"")),
        ],
    );
    let profiles = HardwareProfile::load_all(&dir.path().join("hardware")).unwrap();
    let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["other", "toy"]);
    assert!(HardwareProfile::find(&profiles, "TOY").is_some());

    let e = err(pack(ACTION, &[("wrong.toml", HW)]).path());
    assert!(e.contains("wrong.toml") && e.contains("`name`"), "{e}");
    let e = err(pack(
        ACTION,
        &[(
            "toy.toml",
            &HW.replace("source = [\"made up for a test\"]", "source = []"),
        )],
    )
    .path());
    assert!(e.contains("`source`"), "{e}");
    let e = err(pack(
        ACTION,
        &[("toy.toml", &HW.replace("f32 = 0.1", "f32 = -1.0"))],
    )
    .path());
    assert!(e.contains("peak_tflops.f32"), "{e}");
    let e = err(pack(
        ACTION,
        &[("toy.toml", &HW.replace("kind = \"cpu\"", "kind = \"fpga\""))],
    )
    .path());
    assert!(e.contains("toy.toml"), "{e}");
}

/// A task directory whose `knowledge/actions/local.toml` holds `actions`.
fn task_with_actions(actions: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let actions_dir = dir.path().join(ksearch_knowledge::TASK_ACTIONS_DIR);
    std::fs::create_dir_all(&actions_dir).unwrap();
    std::fs::write(actions_dir.join("local.toml"), actions).unwrap();
    dir
}

#[test]
fn task_actions_are_merged_over_the_pack_and_win_on_a_shared_id() {
    let base = || Catalog::load(pack(ACTION, &[]).path()).unwrap();
    // A new kind's actions join the pack; one may require a built-in action.
    let local = ACTION
        .replace("id = \"one\"", "id = \"mine\"")
        .replace("knobs = {", "requires = [\"one\"]\nknobs = {");
    let task = task_with_actions(&local);
    let c = base().with_task(task.path()).unwrap();
    assert_eq!(c.actions().len(), 2);
    assert!(c.origin("mine").unwrap().task_local);
    assert!(!c.origin("one").unwrap().task_local);
    assert_eq!(c.origin("mine").unwrap().line, Some(2));

    // Same id: the task's action replaces the pack's.
    let task = task_with_actions(&ACTION.replace("expected_factor = 1.5", "expected_factor = 3.0"));
    let c = base().with_task(task.path()).unwrap();
    assert_eq!(c.actions().len(), 1);
    assert_eq!(c.action("one").unwrap().expected_factor, 3.0);
    assert!(c.origin("one").unwrap().task_local);

    // A task without knowledge/actions changes nothing.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        base().with_task(empty.path()).unwrap().actions(),
        base().actions()
    );
}

#[test]
fn task_action_errors_name_the_file_and_the_line() {
    let base = || Catalog::load(pack(ACTION, &[]).path()).unwrap();
    let bad = format!(
        "# two actions\n{}{}",
        ACTION.replace("id = \"one\"", "id = \"a\""),
        ACTION
            .replace("id = \"one\"", "id = \"b\"")
            .replace("difficulty = 2", "difficulty = 9")
    );
    let task = task_with_actions(&bad);
    let e = base().with_task(task.path()).unwrap_err().to_string();
    // The second [[action]] header is on line 13: a comment line, a blank line, 10 lines of
    // the first action, then the second's blank line.
    let file = task.path().join("knowledge/actions/local.toml");
    assert!(
        e.starts_with(&format!("{}:13:", file.display())) && e.contains("difficulty"),
        "{e}"
    );

    let task = task_with_actions(&ACTION.replace("knobs = {", "requires = [\"nope\"]\nknobs = {"));
    let e = base().with_task(task.path()).unwrap_err().to_string();
    assert!(
        e.contains("local.toml:2:") && e.contains("unknown action \"nope\""),
        "{e}"
    );

    // A TOML syntax error keeps toml's own line and column.
    let task = task_with_actions("[[action]]\nid = \n");
    let e = base().with_task(task.path()).unwrap_err().to_string();
    assert!(e.contains("local.toml") && e.contains("line 2"), "{e}");
}

#[test]
fn task_actions_are_checked_against_the_family_they_drive() {
    let c = builtin();
    let family = common::family("softmax");
    let task = task_with_actions(
        &ACTION
            .replace("id = \"one\"", "id = \"local-simd\"")
            .replace("simd = true", "no_such_knob = true"),
    );
    let c = c.with_task(task.path()).unwrap();
    let e = c
        .check_task_actions("softmax", "cpu", &family)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("local.toml:2:") && e.contains("no knob `no_such_knob`"),
        "{e}"
    );
    // The built-in actions are not the task's to answer for.
    let c = builtin();
    assert!(c.check_task_actions("softmax", "cpu", &family).is_ok());
}
