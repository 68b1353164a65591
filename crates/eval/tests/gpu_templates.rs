//! The attention task's GPU template families through the real harness `build` op, as a run
//! builds every candidate before it is timed.
//!
//! - mlx (always, with a numpy-capable Python): the named variants and a sample of the family,
//!   both code targets, pass the harness's static checks for MLX modules and compile.
//! - cuda (`KSEARCH_TEST_CUDA_BUILD=1`, CI installs nvcc 13.0 from pip into the harness
//!   environment): every variant of `gpu/attention/variants.toml` plus a deterministic sample
//!   that covers every knob value is built by the cuda adapter for sm_90a, two at a time, and
//!   the ptxas report must be parsed (registers for every kernel instance, spills recorded).
//!   `KSEARCH_TEST_CUDA_BUILD_ALL=1` builds every valid setting (about 1 400, at several
//!   seconds each: hours on 2 cores).

mod common;
use common::{python, root};
use ksearch_eval::{EvalRequest, Evaluator, EvaluatorConfig, Status, TimingPreset, WorkloadSet};
use ksearch_knowledge::{KnobValue, Knobs, TemplateFamily};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn evaluator(python: PathBuf, work: &Path) -> Evaluator {
    Evaluator::new(EvaluatorConfig {
        python: Some(python),
        harness_dir: Some(root().join("harness")),
        work_dir: Some(work.to_path_buf()),
        // CI has no GPU: build for the H200, as the device will.
        knobs: vec![("KSEARCH_HARNESS_CUDA_ARCH".into(), "sm_90a".into())],
        ..EvaluatorConfig::default()
    })
    .unwrap()
}

fn family(backend: &str) -> TemplateFamily {
    TemplateFamily::load_for(&root().join("tasks/attention"), backend)
        .unwrap()
        .unwrap()
}

/// `gpu/attention/variants.toml`, each variant's knobs (all of them, min_blocks included).
fn variants() -> Vec<(String, Knobs)> {
    let text = std::fs::read_to_string(root().join("gpu/attention/variants.toml")).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    doc["variant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let t = v.as_table().unwrap();
            let knobs = t
                .iter()
                .filter(|(k, _)| *k != "name" && *k != "note")
                .map(|(k, v)| {
                    let value = match v {
                        toml::Value::Boolean(b) => KnobValue::Bool(*b),
                        toml::Value::Integer(i) => KnobValue::Int(*i),
                        toml::Value::String(s) => KnobValue::Str(s.clone()),
                        other => panic!("{k} = {other}"),
                    };
                    (k.clone(), value)
                })
                .collect();
            (t["name"].as_str().unwrap().to_string(), knobs)
        })
        .collect()
}

/// The defaults, each single-knob change from them (the family repairs the rest) and
/// `randoms` settings drawn with a fixed generator: every value of every knob appears.
fn sample(f: &TemplateFamily, randoms: usize) -> Vec<Knobs> {
    let defaults = f.default_knobs();
    let mut out = vec![defaults.clone()];
    for knob in f.knobs() {
        for value in knob.values() {
            let change = Knobs::from([(knob.name().to_string(), value.clone())]);
            out.push(f.apply(&defaults, &change).unwrap());
        }
    }
    let all = f.enumerate();
    let mut state: u64 = 0x005e_ed0f_a77e_u64;
    for _ in 0..randoms {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push(all[((state >> 33) % all.len() as u64) as usize].clone());
    }
    let mut seen = BTreeSet::new();
    out.retain(|k| seen.insert(k.clone()));
    for knob in f.knobs() {
        for value in knob.values() {
            assert!(
                out.iter().any(|k| k.get(knob.name()) == Some(value)),
                "the sample misses {}={value}",
                knob.name()
            );
        }
    }
    out
}

struct Built {
    label: String,
    result: ksearch_eval::EvalResult,
    seconds: f64,
}

/// Renders and builds `settings` through the harness `build` op, `jobs` at a time.
fn build_all(
    ev: &Evaluator,
    fam: &TemplateFamily,
    backend: &str,
    ext: &str,
    settings: &[(String, Knobs)],
    dir: &Path,
    jobs: usize,
) -> Vec<Built> {
    let task = ksearch_task::load_task(&root().join("tasks/attention")).unwrap();
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((label, knobs)) = settings.get(i) else {
                    break;
                };
                let src = fam.render(knobs).unwrap_or_else(|e| panic!("{label}: {e}"));
                let path = dir.join(format!("{i:04}.{ext}"));
                std::fs::write(&path, src).unwrap();
                let mut req = EvalRequest::from_task(
                    &task,
                    backend,
                    &path,
                    WorkloadSet::Search,
                    1,
                    TimingPreset::Quick,
                )
                .unwrap();
                req.timeout = Duration::from_secs(600);
                let t0 = Instant::now();
                let result = ev.build(&req).unwrap();
                let seconds = t0.elapsed().as_secs_f64();
                done.lock().unwrap().push(Built {
                    label: label.clone(),
                    result,
                    seconds,
                });
            });
        }
    });
    done.into_inner().unwrap()
}

fn describe(b: &Built) -> String {
    let log = b
        .result
        .build
        .as_ref()
        .map(|x| x.log.chars().take(3000).collect::<String>())
        .unwrap_or_default();
    format!(
        "{}: {} {}\n{log}\n{}",
        b.label, b.result.status, b.result.message, b.result.log_tail
    )
}

#[test]
fn mlx_modules_pass_the_harness_static_checks_and_compile() {
    let Some(python) = python() else { return };
    let work = tempfile::tempdir().unwrap();
    let ev = evaluator(python, &work.path().join("work"));
    let cuda_fam = family("mlx");
    // The named variants less the cuda-only ones (the producer schedules, which the mlx family
    // does not have), as mlx settings.
    let mut settings: Vec<(String, Knobs)> = variants()
        .into_iter()
        .filter(|(_, k)| {
            !matches!(&k["wg_schedule"], KnobValue::Str(s) if s == "producer" || s == "producer_tma")
        })
        .map(|(n, mut k)| {
            k.remove("min_blocks");
            k.remove("persistent");
            (n, k)
        })
        .collect();
    settings.extend(
        sample(&cuda_fam, 10)
            .into_iter()
            .map(|k| (ksearch_knowledge::format_knobs(&k), k)),
    );
    let built = build_all(&ev, &cuda_fam, "mlx", "py", &settings, work.path(), 2);
    assert_eq!(built.len(), settings.len());
    for b in &built {
        assert_eq!(b.result.status, Status::Passed, "{}", describe(b));
        let build = b.result.build.as_ref().unwrap();
        assert_eq!(
            build.extra["kernel_dialects"],
            serde_json::json!(["cuda"]),
            "{}",
            b.label
        );
    }
    // The Metal target: passes the same checks and builds (it cannot load here).
    let metal = family("mlx").with_target("mlx-metal").unwrap();
    let settings: Vec<(String, Knobs)> = metal
        .enumerate()
        .into_iter()
        .map(|k| (format!("metal {}", ksearch_knowledge::format_knobs(&k)), k))
        .collect();
    for b in build_all(&ev, &metal, "mlx", "py", &settings, work.path(), 2) {
        assert_eq!(b.result.status, Status::Passed, "{}", describe(&b));
        let build = b.result.build.as_ref().unwrap();
        assert_eq!(build.extra["kernel_dialects"], serde_json::json!(["metal"]));
    }
}

/// A built variant's report: sm_90a, one kernel instance per dtype x head dim x causal flag,
/// registers for each, spills recorded and summed.
fn check_cuda_build(b: &Built) -> Result<(), String> {
    let fail = |what: String| Err(format!("{what}\n{}", describe(b)));
    if b.result.status != Status::Passed {
        return fail("not built".into());
    }
    let Some(build) = b.result.build.as_ref() else {
        return fail("no build report".into());
    };
    if build.extra["arch"] != "sm_90a" {
        return fail(format!("arch {}", build.extra["arch"]));
    }
    let ptxas = &build.extra["ptxas"];
    let Some(kernels) = ptxas["kernels"].as_array() else {
        return fail(format!("no ptxas kernels: {ptxas}"));
    };
    if kernels.len() != 8 {
        return fail(format!(
            "{} kernel instances, expected 8: {ptxas}",
            kernels.len()
        ));
    }
    let mut total = 0;
    for k in kernels {
        let regs = k["registers"].as_u64().unwrap_or(0);
        let (Some(stores), Some(loads)) = (
            k["spill_store_bytes"].as_u64(),
            k["spill_load_bytes"].as_u64(),
        ) else {
            return fail(format!("spills not recorded: {k}"));
        };
        total += stores + loads;
        let named = k["name"]
            .as_str()
            .is_some_and(|n| n.contains("ksa_attention_kernel"));
        if !(1..=255).contains(&regs) || k["arch"] != "sm_90a" || !named {
            return fail(format!("kernel report: {k}"));
        }
    }
    if ptxas["max_registers"].as_u64().unwrap_or(0) == 0
        || ptxas["spill_bytes"].as_u64() != Some(total)
    {
        return fail(format!("totals: {ptxas}"));
    }
    Ok(())
}

#[test]
fn cuda_variants_build_for_sm90a_with_a_parsed_ptxas_report() {
    if std::env::var_os("KSEARCH_TEST_CUDA_BUILD").is_none() {
        eprintln!(
            "skipped: set KSEARCH_TEST_CUDA_BUILD=1 (and nvcc in the harness Python's \
             site-packages or on PATH) to build the CUDA templates"
        );
        return;
    }
    let Some(python) = python() else {
        panic!("KSEARCH_TEST_CUDA_BUILD is set but no Python with numpy was found");
    };
    let work = tempfile::tempdir().unwrap();
    let ev = evaluator(python, &work.path().join("work"));
    let fam = family("cuda");
    let mut settings = variants();
    let everything = std::env::var_os("KSEARCH_TEST_CUDA_BUILD_ALL").is_some();
    let extra = if everything {
        fam.enumerate()
    } else {
        // The one-knob changes cover every value; a few random settings add combinations.
        sample(&fam, 4)
    };
    let named: BTreeSet<Knobs> = settings.iter().map(|(_, k)| k.clone()).collect();
    settings.extend(
        extra
            .into_iter()
            .filter(|k| !named.contains(k))
            .map(|k| (ksearch_knowledge::format_knobs(&k), k)),
    );
    let t0 = Instant::now();
    let built = build_all(&ev, &fam, "cuda", "cu", &settings, work.path(), 2);
    let wall = t0.elapsed().as_secs_f64();
    assert_eq!(built.len(), settings.len());
    let mut slowest = built.iter().map(|b| b.seconds).fold(0.0, f64::max);
    if slowest.is_nan() {
        slowest = 0.0;
    }
    eprintln!(
        "built {} CUDA variants in {wall:.0} s (2 jobs; slowest {slowest:.1} s)",
        built.len()
    );
    // Every variant is checked before the test fails, so one CI run names all broken ones.
    let mut problems = Vec::new();
    for b in &built {
        if let Err(why) = check_cuda_build(b) {
            problems.push(why);
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} variants failed:\n{}",
        problems.len(),
        built.len(),
        problems.join("\n\n")
    );
    // What the device notes say about the measured variants (docs/gpu-attention.md): the naive
    // kernel spills its f32 row, the best wgmma tile does not.
    let by_name = |n: &str| -> &Value {
        &built
            .iter()
            .find(|b| b.label == n)
            .unwrap()
            .result
            .build
            .as_ref()
            .unwrap()
            .extra["ptxas"]
    };
    assert!(by_name("s0_naive")["spill_bytes"].as_u64().unwrap() > 0);
    assert_eq!(by_name("wg_m128n128s2")["spill_bytes"].as_u64().unwrap(), 0);
}
