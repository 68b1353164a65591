//! The attention task's GPU template families (`tasks/attention/templates-cuda/`,
//! `templates-mlx/`): per-backend lookup, the two families in step, every valid setting renders
//! a complete candidate, the named variants of `gpu/attention/variants.toml` are valid, and the
//! rendered code passes the knowledge packs' lint for its target (cuda, mlx-cuda, mlx-metal).
//! Building the CUDA sources with nvcc is `crates/eval/tests/gpu_templates.rs`.

mod common;

use common::{repo_root, sample, task_dir};
use ksearch_knowledge::lint::{self, Severity};
use ksearch_knowledge::{KnobValue, Knobs, Packs, TemplateFamily};
use std::collections::BTreeSet;

fn gpu_family(backend: &str) -> TemplateFamily {
    match TemplateFamily::load_for(&task_dir("attention"), backend) {
        Ok(Some(f)) => f,
        Ok(None) => panic!("tasks/attention has no family for {backend}"),
        Err(e) => panic!("tasks/attention ({backend}): {e}"),
    }
}

/// `gpu/attention/variants.toml`: name and the full knob setting of each measured variant.
fn variants() -> Vec<(String, Knobs)> {
    let path = repo_root().join("gpu/attention/variants.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let mut out = Vec::new();
    for v in doc["variant"].as_array().unwrap() {
        let t = v.as_table().unwrap();
        let mut knobs = Knobs::new();
        for (k, val) in t {
            let value = match val {
                toml::Value::Boolean(b) => KnobValue::Bool(*b),
                toml::Value::Integer(i) => KnobValue::Int(*i),
                toml::Value::String(s) => KnobValue::Str(s.clone()),
                other => panic!("{k}: unexpected {other}"),
            };
            if k != "name" && k != "note" {
                knobs.insert(k.clone(), value);
            }
        }
        out.push((t["name"].as_str().unwrap().to_string(), knobs));
    }
    out
}

/// The knobs only the cuda family has: launch bounds and persistent tiles.
const CUDA_ONLY_KNOBS: [&str; 2] = ["min_blocks", "persistent"];

/// The knob setting of the mlx family for a cuda setting: everything but the cuda-only knobs.
fn for_mlx(knobs: &Knobs) -> Knobs {
    knobs
        .iter()
        .filter(|(k, _)| !CUDA_ONLY_KNOBS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether a cuda setting is one the mlx family cannot express: the TMA producer, whose tensor
/// maps the cuda entry point encodes on the host.
fn cuda_only(knobs: &Knobs) -> bool {
    matches!(&knobs["wg_schedule"], KnobValue::Str(s) if s == "producer_tma")
}

/// The line of the mlx header that bounds MLX's generated kernel for the producer schedule.
const MLX_LAUNCH_BOUNDS: &str =
    "#define __global__ __attribute__((global)) __launch_bounds__(::ksa::THREADS, 1)";

/// The text between `namespace ksa {` and `}  // namespace ksa`, both included.
fn device_code(src: &str) -> &str {
    let start = src.find("namespace ksa {").expect("no namespace ksa");
    let end = src
        .find("}  // namespace ksa")
        .expect("no end of namespace ksa");
    &src[start..end + "}  // namespace ksa".len()]
}

#[test]
fn each_backend_finds_its_own_family() {
    let dir = task_dir("attention");
    let cuda = gpu_family("cuda");
    assert_eq!(cuda.name(), "attention-cuda");
    assert!(cuda.dir().ends_with("templates-cuda"));
    assert!(cuda.targets().is_empty() && cuda.target().is_none());
    let mlx = gpu_family("mlx");
    assert_eq!(mlx.name(), "attention-mlx");
    assert_eq!(mlx.target(), Some("mlx-cuda"));
    // cpu has no templates-cpu/: the task's templates/ (the C family) serves it.
    let cpu = TemplateFamily::load_for(&dir, "cpu").unwrap().unwrap();
    assert_eq!(cpu.name(), "attention");
    assert_eq!(
        cpu.dir(),
        TemplateFamily::load(&dir).unwrap().unwrap().dir()
    );
    // Each GPU family declares the one backend it writes for.
    assert!(cuda.serves("cuda") && !cuda.serves("mlx") && !cuda.serves("cpu"));
    assert!(mlx.serves("mlx") && !mlx.serves("cuda"));
}

#[test]
fn the_mlx_family_has_the_cuda_knobs_but_launch_bounds_persistence_and_the_tma_producer() {
    let cuda = gpu_family("cuda");
    let mlx = gpu_family("mlx");
    let names = |f: &TemplateFamily| -> Vec<String> {
        f.knobs().iter().map(|k| k.name().to_string()).collect()
    };
    let mut expected = names(&cuda);
    expected.retain(|n| !CUDA_ONLY_KNOBS.contains(&n.as_str()));
    assert_eq!(names(&mlx), expected);
    let tma = KnobValue::Str("producer_tma".into());
    for k in mlx.knobs() {
        let c = cuda.knob(k.name()).unwrap();
        let mut values = c.values().to_vec();
        values.retain(|v| k.name() != "wg_schedule" || *v != tma);
        assert_eq!(k.values(), &values[..], "{}", k.name());
        assert_eq!(k.default_value(), c.default_value(), "{}", k.name());
    }
    // Same rules, plus the one that confines mlx-metal to the naive kernel, less the cuda
    // family's rules on min_blocks (launch bounds, which MLX's kernels do not have) and on
    // persistent tiles. The rules name the TMA producer on both, though only cuda's knob has
    // it.
    let rules = |f: &TemplateFamily| -> Vec<String> {
        f.rules()
            .iter()
            .map(|r| format!("{r:?}"))
            .filter(|r| !CUDA_ONLY_KNOBS.iter().any(|k| r.contains(k)))
            .collect()
    };
    let (c, m) = (rules(&cuda), rules(&mlx));
    assert!(
        cuda.rules().len() > c.len(),
        "the cuda family has a min_blocks rule"
    );
    assert_eq!(m.len(), c.len() + 1);
    assert_eq!(&m[..c.len()], &c[..]);
    assert!(m[c.len()].contains("mlx-metal"), "{}", m[c.len()]);
    // Every valid mlx-cuda setting is a valid cuda setting with min_blocks at its default,
    // and the reverse but for the TMA producer: one search space on both backends.
    let cuda_valid: BTreeSet<Knobs> = cuda
        .enumerate()
        .into_iter()
        .filter(|k| {
            k["min_blocks"] == KnobValue::Int(1)
                && k["persistent"] == KnobValue::Bool(false)
                && !cuda_only(k)
        })
        .map(|k| for_mlx(&k))
        .collect();
    let mlx_valid: BTreeSet<Knobs> = mlx.enumerate().into_iter().collect();
    assert_eq!(cuda_valid, mlx_valid);
    // 16 naive, 256 tiled, 912 mma, 256 wgmma and 64 wgmma ping-pong settings with both
    // values of min_blocks, less the 64 two-warpgroup wgmma settings at two blocks per SM
    // that spill (docs/gpu-attention.md), plus 32 producer and 64 producer_tma settings (with
    // and without persistent tiles) at one block per SM; 784 on mlx, which has neither
    // min_blocks, persistent tiles nor the TMA producer.
    assert_eq!(cuda.enumerate().len(), 1536);
    assert_eq!(mlx_valid.len(), 784);
}

#[test]
fn pingpong_is_a_wgmma_schedule_for_two_warpgroups() {
    let mlx = gpu_family("mlx");
    let on = KnobValue::Str("pingpong".into());
    let pp: Vec<Knobs> = mlx
        .enumerate()
        .into_iter()
        .filter(|k| k["wg_schedule"] == on)
        .collect();
    // block_n 64/128 x stages 2/3 x exp2 x causal_skip x schedule.
    assert_eq!(pp.len(), 32);
    for k in &pp {
        assert_eq!(k["algo"], KnobValue::Str("wgmma".into()));
        assert_eq!(k["block_m"], KnobValue::Int(128));
        assert_ne!(k["stages"], KnobValue::Int(1));
    }
    // Switching it on from the overlapped schedule repairs the rest into a valid setting.
    let named = variants();
    let (_, s9) = named.iter().find(|(n, _)| n == "s9_wgmma_overlap").unwrap();
    let change = Knobs::from([("wg_schedule".to_string(), on.clone())]);
    let repaired = mlx.apply(&for_mlx(s9), &change).unwrap();
    assert!(mlx.is_valid(&repaired) && repaired["wg_schedule"] == on);
}

#[test]
fn the_producer_schedules_run_at_one_block_per_sm_and_the_tma_one_is_cuda_only() {
    let (cuda, mlx) = (gpu_family("cuda"), gpu_family("mlx"));
    let named = variants();
    let (_, pp) = named.iter().find(|(n, _)| n == "wg_m128n128s3_pp").unwrap();
    let producer = Knobs::from([("wg_schedule".to_string(), KnobValue::Str("producer".into()))]);
    let mut two_blocks = pp.clone();
    two_blocks.insert("min_blocks".into(), KnobValue::Int(2));
    let applied = cuda.apply(&two_blocks, &producer).unwrap();
    let mut expected = pp.clone();
    expected.extend(producer.clone());
    assert_eq!(applied, expected, "min_blocks back to 1, nothing else");
    // MLX generates the kernel's signature without launch bounds: the mlx header redefines
    // __global__ for that kernel with the cuda entry point's bounds, and only for the
    // producer, whose register split needs them.
    let on_mlx = mlx.apply(&for_mlx(pp), &producer).unwrap();
    assert_eq!(on_mlx, for_mlx(&expected));
    let module = mlx.render(&on_mlx).unwrap();
    assert!(module.contains(MLX_LAUNCH_BOUNDS) && module.contains("\nTHREADS = 384\n"));
    assert!(module.contains("setmaxnreg.dec") && module.contains("setmaxnreg.inc"));
    let plain_module = mlx.render(&for_mlx(pp)).unwrap();
    assert!(
        !plain_module.contains("#define __global__") && plain_module.contains("\nTHREADS = 256\n")
    );
    // The cuda source has the producer warpgroup and its register split.
    let src = cuda.render(&expected).unwrap();
    assert!(
        src.contains("constexpr int THREADS = 384;"),
        "three warpgroups"
    );
    assert!(src.contains("constexpr bool PRODUCER = true;"));
    assert!(src.contains("setmaxnreg.dec") && src.contains("setmaxnreg.inc"));
    // The cuda entry point carries its own bounds.
    assert!(!src.contains("#define __global__"));
    let plain = cuda.render(pp).unwrap();
    assert!(
        plain.contains("constexpr int THREADS = 256;")
            && plain.contains("constexpr bool PRODUCER = false;")
    );
    assert!(!src.contains("cp.async.bulk.tensor") && !src.contains("CUtensorMap"));
    // producer_tma: the same warpgroups, their copies TMA bulk copies from tensor maps the
    // cuda entry point encodes; it does not exist on mlx.
    let tma = Knobs::from([(
        "wg_schedule".to_string(),
        KnobValue::Str("producer_tma".into()),
    )]);
    let with_tma = cuda.apply(&two_blocks, &tma).unwrap();
    assert_eq!(with_tma["min_blocks"], KnobValue::Int(1));
    let src = cuda.render(&with_tma).unwrap();
    assert!(src.contains("constexpr int THREADS = 384;") && src.contains("setmaxnreg.dec"));
    assert!(src.contains("cp.async.bulk.tensor.3d") && src.contains("mbarrier.arrive.expect_tx"));
    assert!(
        src.contains("__grid_constant__ CUtensorMap") && src.contains("cuTensorMapEncodeTiled")
    );
    assert!(mlx.apply(&for_mlx(pp), &tma).is_err());
    // Persistent tiles are a form of producer_tma: asked for on the ping-pong kernel, the
    // repair makes it producer_tma at one block per SM; the source launches one block per SM
    // and gives Q barriers of its own (two Q tiles where shared memory holds them). The mlx
    // family has no such knob.
    let persistent = Knobs::from([("persistent".to_string(), KnobValue::Bool(true))]);
    let pers = cuda.apply(&two_blocks, &persistent).unwrap();
    assert_eq!(pers["wg_schedule"], KnobValue::Str("producer_tma".into()));
    assert_eq!(pers["min_blocks"], KnobValue::Int(1));
    let src = cuda.render(&pers).unwrap();
    assert!(src.contains("tile_index<CAUSAL>") && src.contains("ksa_sm_count()"));
    assert!(
        src.contains("mbar_init(q_full(b), 1)") && src.contains("mbar_arrive(q_empty(tc % QB))")
    );
    assert!(src.contains("constexpr int QB = q_bufs<D>();"));
    let plain_tma = cuda.render(&with_tma).unwrap();
    assert!(!plain_tma.contains("tile_index") && !plain_tma.contains("q_full"));
    assert!(mlx.knob("persistent").is_none());
}

#[test]
fn pingpong_applied_under_two_blocks_per_sm_falls_back_to_one() {
    // An offline run on the H200 applied ping-pong to a wgmma m64n64 parent whose min_blocks
    // was 2: at 128 registers a thread the kernel spilled and scored a quarter of its parent.
    // The family's rule makes the repair set min_blocks back to 1, and nothing else.
    let cuda = gpu_family("cuda");
    let k = |pairs: &[(&str, KnobValue)]| -> Knobs {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect()
    };
    let (i, t) = (KnobValue::Int, KnobValue::Bool(true));
    let parent = cuda.with_defaults(&k(&[
        ("algo", KnobValue::Str("wgmma".into())),
        ("block_m", i(64)),
        ("block_n", i(64)),
        ("warps", i(4)),
        ("cp_async", t.clone()),
        ("stages", i(2)),
        ("min_blocks", i(2)),
    ]));
    assert!(
        cuda.validate(&parent).is_ok(),
        "one warpgroup may ask for two blocks per SM"
    );
    let pingpong = k(&[
        ("wg_schedule", KnobValue::Str("pingpong".into())),
        ("block_m", i(128)),
        ("warps", i(8)),
        ("stages", i(3)),
        ("block_n", i(128)),
    ]);
    let applied = cuda.apply(&parent, &pingpong).unwrap();
    assert_eq!(applied["min_blocks"], i(1));
    let mut expected = parent.clone();
    expected.extend(pingpong);
    expected.insert("min_blocks".into(), i(1));
    assert_eq!(applied, expected);
}

#[test]
fn the_named_variants_are_valid_and_start_from_naive() {
    let cuda = gpu_family("cuda");
    let mlx = gpu_family("mlx");
    let vs = variants();
    assert!(vs.len() >= 20, "{}", vs.len());
    for (name, knobs) in &vs {
        assert_eq!(
            knobs.len(),
            cuda.knobs().len(),
            "{name} spells out every knob"
        );
        assert!(cuda.is_valid(knobs), "{name}: {:?}", cuda.validate(knobs));
        // The TMA producer is cuda only; every other named setting is one of mlx's too.
        assert_eq!(mlx.is_valid(&for_mlx(knobs)), !cuda_only(knobs), "{name}");
    }
    let (first, knobs) = &vs[0];
    assert_eq!(first, "s0_naive");
    assert_eq!(knobs, &cuda.default_knobs());
    // Every algorithm of the family is measured.
    let algos: BTreeSet<&KnobValue> = vs.iter().map(|(_, k)| &k["algo"]).collect();
    assert_eq!(algos.len(), cuda.knob("algo").unwrap().values().len());
}

#[test]
fn every_valid_setting_renders_a_complete_candidate() {
    let cuda = gpu_family("cuda");
    let mut sources = BTreeSet::new();
    for knobs in cuda.enumerate() {
        let src = cuda.render(&knobs).unwrap();
        assert!(src.contains("extern \"C\" int attention_f16(const void* q, const void* k, const void* v, void* out, int64_t B, int64_t H,"));
        assert!(src.contains("extern \"C\" int attention_bf16("));
        assert!(src.contains(&ksearch_knowledge::format_knobs(&knobs)));
        assert!(!src.contains("{{") && !src.contains("{%"));
        sources.insert(src);
    }
    // Distinct settings are distinct kernels (the constraints pin every ignored knob).
    assert_eq!(sources.len(), cuda.enumerate().len());

    let mlx = gpu_family("mlx");
    for knobs in mlx.enumerate() {
        let src = mlx.render(&knobs).unwrap();
        assert!(src.contains("def attention(*, q, k, v, B, H, L, D, causal):"));
        assert!(src.contains("mx.fast.cuda_kernel(") && !src.contains("metal_kernel"));
        assert!(src.contains("::ksa::attn_body<T, HEAD_DIM, CAUSAL>"));
        // NVRTC promises no standard header and the host glue stays out of the header.
        let header = device_code(&src);
        for banned in ["#include", "extern \"C\"", "int64_t", "cudaStream_t"] {
            assert!(!header.contains(banned), "{banned} in the mlx header");
        }
    }
}

#[test]
fn both_backends_run_the_same_device_code() {
    let cuda = gpu_family("cuda");
    let mlx = gpu_family("mlx");
    // The cuda-only TMA producer has no mlx module to compare.
    for (name, knobs) in variants().into_iter().filter(|(_, k)| !cuda_only(k)) {
        let c = cuda.render(&knobs).unwrap();
        let m = mlx.render(&for_mlx(&knobs)).unwrap();
        assert_eq!(device_code(&c), device_code(&m), "{name}");
        // The mlx module sizes dynamic shared memory as the cuda launcher does: from
        // ksa::smem_bytes<D>(), which the SMEM table must reproduce.
        for d in [64, 128] {
            let table = m
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{d}: ")))
                .unwrap_or_else(|| panic!("{name}: no SMEM entry for {d}"));
            let bytes: i64 = table.trim_end_matches(',').parse().unwrap();
            assert_eq!(bytes, template_smem(&c, &knobs, d), "{name} D={d}");
        }
    }
}

/// Evaluates the template's `smem_bytes<D>()` (sums of products of the tile constants).
fn template_smem(src: &str, knobs: &Knobs, d: i64) -> i64 {
    let line = src
        .lines()
        .find(|l| l.starts_with("constexpr int smem_bytes() { return "))
        .expect("smem_bytes<D>() not found");
    let expr = line
        .trim_start_matches("constexpr int smem_bytes() { return ")
        .trim_end_matches("; }");
    let int = |k: &str| match &knobs[k] {
        KnobValue::Int(i) => *i,
        other => panic!("{k} = {other}"),
    };
    let tensor_core = matches!(&knobs["algo"], KnobValue::Str(a) if a == "mma" || a == "wgmma");
    let stages = if tensor_core { int("stages") } else { 1 };
    let spaced = expr.replace('(', " ( ").replace(')', " ) ");
    let tokens: Vec<String> = spaced
        .split_whitespace()
        .map(|t| match t {
            "BLOCK_M" => int("block_m").to_string(),
            "BLOCK_N" => int("block_n").to_string(),
            "STAGES" => stages.to_string(),
            "D" => d.to_string(),
            other => other.to_string(),
        })
        .collect();
    eval_arith(&tokens.join(" "))
}

/// `+`, `*` and parentheses over integers: all `smem_bytes` uses.
fn eval_arith(s: &str) -> i64 {
    fn sum(t: &[&str], i: &mut usize) -> i64 {
        let mut v = product(t, i);
        while *i < t.len() && t[*i] == "+" {
            *i += 1;
            v += product(t, i);
        }
        v
    }
    fn product(t: &[&str], i: &mut usize) -> i64 {
        let mut v = atom(t, i);
        while *i < t.len() && t[*i] == "*" {
            *i += 1;
            v *= atom(t, i);
        }
        v
    }
    fn atom(t: &[&str], i: &mut usize) -> i64 {
        let tok = t[*i];
        *i += 1;
        if tok == "(" {
            let v = sum(t, i);
            assert_eq!(t[*i], ")");
            *i += 1;
            v
        } else {
            tok.parse()
                .unwrap_or_else(|_| panic!("unexpected token {tok:?}"))
        }
    }
    let spaced = s.replace('(', " ( ").replace(')', " ) ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut i = 0;
    let v = sum(&tokens, &mut i);
    assert_eq!(i, tokens.len(), "{s}");
    v
}

#[test]
fn the_metal_target_renders_the_naive_kernel_only() {
    let mlx = gpu_family("mlx").with_target("mlx-metal").unwrap();
    assert_eq!(mlx.target(), Some("mlx-metal"));
    let all = mlx.enumerate();
    assert!(!all.is_empty());
    assert!(all
        .iter()
        .all(|k| k["algo"] == KnobValue::Str("naive".into())));
    let src = mlx.render(&mlx.default_knobs()).unwrap();
    assert!(src.contains("mx.fast.metal_kernel(") && !src.contains("cuda_kernel"));
    assert!(src.contains("thread_position_in_grid") && !src.contains("threadIdx"));
    let wgmma = Knobs::from([("algo".to_string(), KnobValue::Str("wgmma".into()))]);
    assert!(mlx.apply(&mlx.default_knobs(), &wgmma).is_err());
    let err = gpu_family("mlx")
        .with_target("metal")
        .unwrap_err()
        .to_string();
    assert!(err.contains("mlx-cuda, mlx-metal"), "{err}");
    assert!(gpu_family("cuda").with_target("mlx-cuda").is_err());
}

fn lint_errors(packs: &Packs, target: &str, src: &str) -> Vec<String> {
    let t = packs
        .lint_target(target)
        .unwrap_or_else(|| panic!("no lint target {target}"));
    lint::lint(&t, src)
        .into_iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| format!("{f:?}"))
        .collect()
}

#[test]
fn rendered_code_passes_the_lint_of_its_target() {
    // What `ksearch knowledge lint --target T` and the run's lint hook check: a proposal
    // with a lint error is never evaluated, so the offline search would stall on it.
    let packs = Packs::load(&repo_root().join("knowledge")).unwrap();
    let cuda = gpu_family("cuda");
    for knobs in sample(&cuda, 40, 7) {
        let src = cuda.render(&knobs).unwrap();
        let errors = lint_errors(&packs, "cuda", &src);
        assert!(errors.is_empty(), "cuda {knobs:?}: {errors:?}");
    }
    let mlx = gpu_family("mlx");
    for knobs in sample(&mlx, 40, 7) {
        let src = mlx.render(&knobs).unwrap();
        let errors = lint_errors(&packs, "mlx-cuda", &src);
        assert!(errors.is_empty(), "mlx-cuda {knobs:?}: {errors:?}");
    }
    let metal = gpu_family("mlx").with_target("mlx-metal").unwrap();
    for knobs in metal.enumerate() {
        let src = metal.render(&knobs).unwrap();
        let t = packs.lint_target("mlx-metal").unwrap();
        let findings = lint::lint(&t, &src);
        assert!(findings.is_empty(), "mlx-metal {knobs:?}: {findings:?}");
    }
}
