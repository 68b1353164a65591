//! The shipped template families: they load, their spaces are small and well-formed, every
//! valid combination renders C that compiles, and neighbours stay inside the space.

mod common;

use common::{cc, family, knob, product, sample, task_dir, KINDS};
use ksearch_knowledge::{Knobs, TemplateError, TemplateFamily};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn every_family_loads_with_a_small_space() {
    for kind in KINDS {
        let f = family(kind);
        assert_eq!(f.name(), *kind);
        let all = f.enumerate();
        assert!(!all.is_empty());
        assert!(
            all.len() <= 5000,
            "{kind}: {} combinations is more than a few thousand",
            all.len()
        );
        // A real search space: several knobs, each with a choice.
        assert!(f.knobs().len() >= 5, "{kind}: too few knobs");
        for k in f.knobs() {
            assert!(
                k.values().len() >= 2,
                "{kind}: knob {} has no choice",
                k.name()
            );
            assert!(
                !k.description().is_empty(),
                "{kind}: knob {} undocumented",
                k.name()
            );
        }
    }
}

#[test]
fn enumerate_is_exactly_the_valid_settings() {
    for kind in KINDS {
        let f = family(kind);
        let all = f.enumerate();
        let unique: BTreeSet<&Knobs> = all.iter().collect();
        assert_eq!(unique.len(), all.len(), "{kind}: duplicates");
        assert!(
            all.iter().all(|k| f.is_valid(k)),
            "{kind}: invalid setting enumerated"
        );
        // Brute force over the raw product: the valid ones are exactly the enumerated ones.
        let product = product(&f);
        assert_eq!(product.len() as u64, f.space_size());
        // In the product's order, too (the last knob fastest).
        let valid: Vec<Knobs> = product.into_iter().filter(|k| f.is_valid(k)).collect();
        assert_eq!(valid, all, "{kind}");
    }
}

#[test]
fn defaults_are_the_naive_kernel() {
    for kind in KINDS {
        let f = family(kind);
        let src = f.render(&f.default_knobs()).unwrap();
        assert!(
            !src.contains("omp parallel"),
            "{kind}: defaults are threaded"
        );
        assert!(!src.contains("omp simd"), "{kind}: defaults are vectorised");
        assert!(
            src.contains("return expf(x)"),
            "{kind}: defaults do not use libm"
        );
    }
}

#[test]
fn neighbours_move_one_knob_one_step_and_stay_valid() {
    for kind in KINDS {
        let f = family(kind);
        // The defaults and a handful of enumerated settings as starting points.
        let all = f.enumerate();
        let starts: Vec<Knobs> = std::iter::once(f.default_knobs())
            .chain(all.iter().step_by(all.len() / 7 + 1).cloned())
            .collect();
        for start in &starts {
            let next = f.neighbours(start);
            assert!(!next.is_empty(), "{kind}: no neighbours of {start:?}");
            for n in &next {
                assert!(f.is_valid(n), "{kind}: invalid neighbour {n:?}");
                let changed: Vec<&String> =
                    n.keys().filter(|name| n[*name] != start[*name]).collect();
                assert_eq!(changed.len(), 1, "{kind}: {start:?} -> {n:?}");
                let k = f.knob(changed[0]).unwrap();
                let (i, j) = (
                    k.position(&start[changed[0]]).unwrap(),
                    k.position(&n[changed[0]]).unwrap(),
                );
                assert_eq!(i.abs_diff(j), 1, "{kind}: {} jumped", k.name());
            }
            // Every valid one-step move is offered.
            let expected = all
                .iter()
                .filter(|c| {
                    let diff: Vec<_> = c.keys().filter(|name| c[*name] != start[*name]).collect();
                    diff.len() == 1 && {
                        let k = f.knob(diff[0]).unwrap();
                        k.position(&c[diff[0]])
                            .unwrap()
                            .abs_diff(k.position(&start[diff[0]]).unwrap())
                            == 1
                    }
                })
                .count();
            assert_eq!(next.len(), expected, "{kind}: neighbours of {start:?}");
        }
    }
}

#[test]
fn render_rejects_bad_knobs_with_clear_messages() {
    let f = family("attention");
    let err = f.render(&Knobs::from([knob("q_blok", 4i64)])).unwrap_err();
    assert!(matches!(err, TemplateError::UnknownKnob { .. }));
    assert!(err.to_string().contains("q_blok") && err.to_string().contains("q_block"));

    let err = f.render(&Knobs::from([knob("q_block", 3i64)])).unwrap_err();
    assert!(matches!(err, TemplateError::OutOfDomain { .. }), "{err}");
    assert!(err.to_string().contains("1, 4, 8, 16, 32"), "{err}");

    // Wrong type is outside the domain too.
    let err = f
        .render(&Knobs::from([knob("threads", "yes")]))
        .unwrap_err();
    assert!(matches!(err, TemplateError::OutOfDomain { .. }), "{err}");

    let s = family("selective-scan");
    let err = s.render(&Knobs::from([knob("n_block", 4i64)])).unwrap_err();
    let TemplateError::Constraint { message, .. } = &err else {
        panic!("expected a constraint error, got {err}");
    };
    assert!(message.contains("t_inner"), "{err}");
    // apply() repairs the same request by switching the loop order.
    let fixed = s
        .apply(&s.default_knobs(), &Knobs::from([knob("n_block", 4i64)]))
        .unwrap();
    assert_eq!(fixed["loop_order"], "t_inner".into());
    assert_eq!(fixed["n_block"], 4i64.into());
    assert!(s.render(&fixed).is_ok());
}

#[test]
fn knob_values_reach_the_source() {
    let f = family("attention");
    let a = f.render(&Knobs::from([knob("q_block", 16i64)])).unwrap();
    let b = f.render(&Knobs::from([knob("q_block", 32i64)])).unwrap();
    assert!(a.contains("#define QB 16") && b.contains("#define QB 32"));
    let poly = f.render(&Knobs::from([knob("exp_impl", "poly")])).unwrap();
    assert!(poly.contains("fmaf(p, r") && !poly.contains("return expf(x)"));
}

/// Renders every valid combination of every family; identical sources are kept once.
fn all_sources() -> Vec<(String, String, String)> {
    let mut seen = HashMap::new();
    let mut out = Vec::new();
    for kind in KINDS {
        let f = family(kind);
        for knobs in f.enumerate() {
            let src = f.render(&knobs).unwrap_or_else(|e| panic!("{kind}: {e}"));
            if seen.insert(src.clone(), ()).is_none() {
                out.push((
                    kind.to_string(),
                    ksearch_knowledge::format_knobs(&knobs),
                    src,
                ));
            }
        }
    }
    out
}

fn includes(src: &str) -> Vec<&str> {
    src.lines().filter(|l| l.starts_with("#include")).collect()
}

/// Names a kernel defines at file scope: functions, typedefs and macros, which would clash
/// when several kernels share one translation unit.
fn file_scope_names(src: &str) -> (Vec<String>, Vec<String>) {
    let mut symbols = Vec::new();
    let mut macros = Vec::new();
    for line in src.lines() {
        if let Some(rest) = line.strip_prefix("#define ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            macros.push(name);
        } else if line.starts_with("static ") || line.starts_with("void ") {
            if let Some(open) = line.find('(') {
                let head = line[..open].trim_end();
                let name = head
                    .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .next()
                    .unwrap_or("");
                symbols.push(name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("} ") {
            if let Some(name) = rest.strip_suffix(';') {
                symbols.push(name.to_string());
            }
        }
    }
    (symbols, macros)
}

/// Many kernels in one translation unit, each under a `#line` marker naming it, with its
/// file-scope names suffixed and its macros undefined afterwards. One compiler process per
/// batch instead of per kernel: process start-up dominates a syntax check.
fn merged_unit(kernels: &[(String, &str)]) -> String {
    let mut out = String::new();
    for (i, (name, src)) in kernels.iter().enumerate() {
        let (symbols, macros) = file_scope_names(src);
        // The renames carry the kernel's name too: diagnostics inside a macro expansion point
        // at the macro's definition.
        out.push_str(&format!("#line 1 \"{name}\"\n"));
        for s in &symbols {
            out.push_str(&format!("#define {s} {s}__k{i}\n"));
        }
        out.push_str(&format!("#line 1 \"{name}\"\n{src}\n"));
        for name in symbols.iter().chain(&macros) {
            out.push_str(&format!("#undef {name}\n"));
        }
    }
    out
}

fn compile_units(cc: &str, files: Vec<PathBuf>, args: &[&str]) -> Vec<String> {
    let next = std::sync::Mutex::new(files.into_iter());
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some(file) = next.lock().unwrap().next() else {
                    return;
                };
                let out = Command::new(cc).args(args).arg(&file).output().unwrap();
                if !out.status.success() {
                    failures
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&out.stderr).into_owned());
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

#[test]
fn every_valid_combination_compiles() {
    let Some(cc) = cc() else {
        eprintln!("SKIPPED every_valid_combination_compiles: no working `cc` on PATH");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sources = all_sources();
    // Kernels share a unit only with kernels of the same family and the same headers, so no
    // kernel can lean on a header that only a neighbour includes.
    type Group<'a> = (String, Vec<&'a str>);
    let mut groups: BTreeMap<Group, Vec<(String, &str)>> = BTreeMap::new();
    let mut labels = Vec::new();
    for (i, (kind, label, src)) in sources.iter().enumerate() {
        let name = format!("{kind}-{i}.c");
        labels.push(format!("{name}: {label}"));
        groups
            .entry((kind.clone(), includes(src)))
            .or_default()
            .push((name, src.as_str()));
    }
    let mut files = Vec::new();
    for (g, kernels) in groups.values().enumerate() {
        for (b, batch) in kernels.chunks(48).enumerate() {
            let path = dir.path().join(format!("unit-{g}-{b}.c"));
            std::fs::write(&path, merged_unit(batch)).unwrap();
            files.push(path);
        }
    }
    let failures = compile_units(
        &cc,
        files,
        &[
            "-fsyntax-only",
            "-std=c11",
            "-fopenmp",
            "-Wall",
            "-Wextra",
            "-Werror",
        ],
    );
    if !failures.is_empty() {
        // Name the knob settings of the kernels the compiler complained about.
        let text = failures.join("\n");
        let named: Vec<&String> = labels
            .iter()
            .filter(|l| text.contains(&format!("{}:", l.split(':').next().unwrap())))
            .take(10)
            .collect();
        panic!(
            "{} units failed; settings: {named:#?}\n{}",
            failures.len(),
            &text[..text.len().min(4000)]
        );
    }
    eprintln!("{} distinct kernels passed cc -fsyntax-only", sources.len());
}

#[test]
fn merging_keeps_errors_attributable() {
    let Some(cc) = cc() else {
        eprintln!("SKIPPED merging_keeps_errors_attributable: no working `cc` on PATH");
        return;
    };
    // Two renders of one family share a unit without clashes; a broken one is named.
    let f = family("softmax");
    let a = f.render(&f.default_knobs()).unwrap();
    let b = f.render(&f.enumerate()[5]).unwrap();
    let broken = a.replace("row_max(x, n)", "row_max(x, n, n)");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.c");
    std::fs::write(
        &good,
        merged_unit(&[("a.c".into(), &a), ("b.c".into(), &b)]),
    )
    .unwrap();
    let bad = dir.path().join("bad.c");
    std::fs::write(
        &bad,
        merged_unit(&[("a.c".into(), &a), ("broken.c".into(), &broken)]),
    )
    .unwrap();
    let args = [
        "-fsyntax-only",
        "-std=c11",
        "-fopenmp",
        "-Wall",
        "-Wextra",
        "-Werror",
    ];
    assert!(compile_units(&cc, vec![good], &args).is_empty());
    let failures = compile_units(&cc, vec![bad], &args);
    assert_eq!(failures.len(), 1);
    assert!(
        failures[0].contains("broken.c:") && !failures[0].contains("a.c:"),
        "{}",
        failures[0]
    );
}

#[test]
fn a_sample_builds_as_a_shared_library() {
    let Some(cc) = cc() else {
        eprintln!("SKIPPED a_sample_builds_as_a_shared_library: no working `cc` on PATH");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for kind in KINDS {
        let f = family(kind);
        let knobs = sample(&f, 2, 7);
        // The defaults, the first single-knob change and the random tail: a few per family.
        for (i, k) in knobs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < 2 || *i + 2 >= knobs.len())
        {
            let c = dir.path().join(format!("{kind}-{i}.c"));
            let so = dir.path().join(format!("{kind}-{i}.so"));
            std::fs::write(&c, f.render(k).unwrap()).unwrap();
            let out = Command::new(&cc)
                .args([
                    "-O3",
                    "-march=native",
                    "-fPIC",
                    "-shared",
                    "-std=c11",
                    "-fopenmp",
                ])
                .arg(&c)
                .arg("-o")
                .arg(&so)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{kind} {k:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let nm = Command::new("nm")
                .args(["-D", "--defined-only"])
                .arg(&so)
                .output();
            if let Ok(nm) = nm {
                let symbols = String::from_utf8_lossy(&nm.stdout);
                let entry = format!("{}_f32", kind.replace('-', "_"));
                assert!(symbols.contains(&entry), "{kind}: {entry} not exported");
            }
        }
    }
}

#[test]
fn a_task_without_templates_has_no_family() {
    let dir = tempfile::tempdir().unwrap();
    assert!(TemplateFamily::load(dir.path()).unwrap().is_none());
    assert!(TemplateFamily::load(Path::new("/nonexistent/task"))
        .unwrap()
        .is_none());
    assert!(task_dir("softmax").join("templates/family.toml").is_file());
}
