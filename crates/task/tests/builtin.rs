//! Every built-in task loads, and every workload resolves for every backend it declares.

use ksearch_task::{builtin, resolve, DType, Distribution, ParamValue, TaskError};

#[test]
fn every_builtin_task_loads_and_resolves() {
    let tasks = builtin::list().expect("built-in tasks load");
    let names: Vec<&str> = tasks.iter().map(|t| t.name()).collect();
    for expected in ["attention", "copy", "selective-scan", "softmax"] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    for task in &tasks {
        assert!(task.dir().is_absolute());
        assert!(!task.backend_names().is_empty(), "{}", task.name());
        for backend in task.backend_names() {
            let spec = task.backend(backend).unwrap();
            let seed = spec.seed.as_ref().expect("built-in tasks ship a seed");
            assert!(seed.is_file(), "{}", seed.display());
            assert!(spec.forbidden.contains(&task.spec().reference.function));
            let workloads = task.workloads(backend).unwrap();
            assert!(workloads.iter().any(|w| !w.held_out), "{}", task.name());
            assert!(workloads.iter().any(|w| w.held_out), "{}", task.name());
            for w in &workloads {
                // A copy does no arithmetic: the calibration task counts no FLOPs.
                if task.kind() == "copy" {
                    assert_eq!(w.flops, 0.0, "{}/{}", task.name(), w.name);
                } else {
                    assert!(w.flops > 0.0, "{}/{}", task.name(), w.name);
                }
                assert!(w.bytes > 0.0, "{}/{}", task.name(), w.name);
                // Every kernel argument is bound: a tensor or an int param.
                for arg in &spec.args {
                    let bound = w.inputs.iter().chain(&w.outputs).any(|t| &t.name == arg)
                        || matches!(w.params.get(arg), Some(ParamValue::Int(_)));
                    assert!(bound, "{}/{}: arg {arg} unbound", task.name(), w.name);
                }
                for t in w.inputs.iter().chain(&w.outputs) {
                    assert!(t.shape.iter().all(|&d| d > 0));
                }
                assert!(w.inputs.iter().all(|t| t.dist.is_some()));
                assert!(w.outputs.iter().all(|t| t.dist.is_none()));
                // The byte formula counts at least the outputs the kernel must write.
                let out_bytes: i64 = w.outputs.iter().map(|t| t.size_bytes()).sum();
                assert!(w.bytes >= out_bytes as f64, "{}/{}", task.name(), w.name);
            }
        }
        // The f32 default unless the task widens it for long reductions (softmax does).
        let rtol = task.tolerance(DType::F32).rtol;
        assert!((2e-5..=1e-4).contains(&rtol), "{}: {rtol}", task.name());
    }
}

#[test]
fn attention_workloads_match_the_protocol_example() {
    let task = resolve("attention").unwrap();
    assert_eq!(task.kind(), "attention");
    let w = task.workloads("cpu").unwrap();
    let first = &w[0];
    let json = serde_json::to_value(first).unwrap();
    assert_eq!(json["name"], "b1h4l256d64");
    assert_eq!(json["held_out"], false);
    assert_eq!(
        json["params"],
        serde_json::json!({"B": 1, "H": 4, "L": 256, "D": 64, "causal": 0})
    );
    assert_eq!(
        json["inputs"][0],
        serde_json::json!({"name": "q", "dtype": "f32", "shape": [1, 4, 256, 64],
                           "dist": {"kind": "normal", "mean": 0.0, "std": 1.0}})
    );
    assert_eq!(
        json["outputs"][0],
        serde_json::json!({"name": "out", "dtype": "f32", "shape": [1, 4, 256, 64]})
    );
    // 4·B·H·L²·D: two matrix products of 2·L²·D each per head.
    assert_eq!(json["flops"], 4.0 * 4.0 * 256.0 * 256.0 * 64.0);
    assert_eq!(json["bytes"], 1048576.0);
    // Causal halves the FLOPs.
    assert_eq!(w[1].flops, first.flops / 2.0);
    let back: ksearch_task::ResolvedWorkload = serde_json::from_value(json).unwrap();
    assert_eq!(&back, first);
}

#[test]
fn copy_is_a_calibration_task_on_every_backend() {
    let task = resolve("copy").unwrap();
    assert_eq!(task.kind(), "copy");
    assert_eq!(task.backend_names(), vec!["cpu", "cuda", "mlx"]);
    let labels: Vec<_> = ["cpu", "cuda", "mlx"]
        .iter()
        .map(|b| {
            task.backend(b)
                .unwrap()
                .baseline_label()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(labels, ["numpy", "torch_copy", "mlx_copy"]);
    // On mlx a candidate may run MLX's own copy kernel, as the baseline does; nowhere else.
    let allowed: Vec<_> = ["cpu", "cuda", "mlx"]
        .iter()
        .map(|b| task.backend(b).unwrap().allowed_kernels.clone())
        .collect();
    assert_eq!(
        allowed,
        [vec![], vec![], vec!["mlx::core::cu::copy_v<".to_string()]]
    );
    // The cpu workloads leave the dtype axis at its default, so the harness sees only `n`.
    for w in task.workloads("cpu").unwrap() {
        assert_eq!(w.params.len(), 1, "{}", w.name);
        assert_eq!(w.inputs[0].dtype, DType::F32);
    }
    let cuda = task.backend("cuda").unwrap();
    let gpu = task.workloads("cuda").unwrap();
    assert_eq!(gpu, task.workloads("mlx").unwrap());
    for w in &gpu {
        let n = match w.params.get("n") {
            Some(ParamValue::Int(n)) => *n as f64,
            other => panic!("{}: n = {other:?}", w.name),
        };
        let elem = w.inputs[0].dtype.size_bytes() as f64;
        // One read and one write of n elements, no arithmetic.
        assert_eq!((w.bytes, w.flops), (2.0 * elem * n, 0.0), "{}", w.name);
        let entry = cuda.entry_for(&w.params).unwrap();
        assert!(entry == "copy_f32" || entry == "copy_f16", "{entry}");
    }
    // The bandwidth-bound GPU workloads: 64 and 256 MiB per buffer are shown, not held out.
    let big: Vec<_> = gpu
        .iter()
        .filter(|w| !w.held_out && w.inputs[0].size_bytes() >= 64 << 20)
        .map(|w| w.inputs[0].size_bytes() >> 20)
        .collect();
    assert!(big.contains(&64) && big.contains(&256), "{big:?}");
}

#[test]
fn selective_scan_uses_custom_generators() {
    let task = resolve("selective-scan").unwrap();
    let w = &task.workloads("cpu").unwrap()[0];
    let a = w.inputs.iter().find(|t| t.name == "A").unwrap();
    assert_eq!(a.shape, vec![256, 16]);
    assert_eq!(
        a.dist,
        Some(Distribution::Custom {
            function: "make_A".into(),
            reach: None,
        })
    );
    let json = serde_json::to_value(a.dist.as_ref().unwrap()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"kind": "custom", "function": "make_A"})
    );
    // bytes = 4 * (1*256*1024*(3+1) + 2*1*16*1024 + 256*16 + 2*256)
    assert_eq!(w.bytes, 4.0 * (1048576.0 + 32768.0 + 4096.0 + 512.0));
    assert_eq!(w.flops, 9.0 * 256.0 * 1024.0 * 16.0);
}

#[test]
fn lookups_fail_helpfully() {
    match builtin::find("atention") {
        Err(e @ TaskError::UnknownTask { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("attention") && msg.contains("softmax"),
                "{msg}"
            );
        }
        other => panic!("expected UnknownTask, got {other:?}"),
    }
    let task = resolve("softmax").unwrap();
    let err = task.backend("cuda").unwrap_err();
    assert_eq!(
        err.to_string(),
        "task `softmax` has no `cuda` backend; it has: cpu"
    );
    assert!(task.workloads("metal").is_err());
    assert!(matches!(
        resolve("./no/such/dir"),
        Err(TaskError::Io { .. })
    ));
    let empty = tempfile::tempdir().unwrap();
    let err = resolve(empty.path().to_str().unwrap()).unwrap_err();
    assert!(matches!(err, TaskError::NotATaskDir { .. }), "{err}");
}

#[test]
fn resolve_accepts_directories_and_task_files() {
    let dir = builtin::dir().unwrap().join("softmax");
    let by_dir = resolve(dir.to_str().unwrap()).unwrap();
    let by_file = resolve(dir.join("task.toml").to_str().unwrap()).unwrap();
    assert_eq!(by_dir.name(), "softmax");
    assert_eq!(by_file.dir(), by_dir.dir());
    assert_eq!(
        by_dir.backend("cpu").unwrap().baseline_label(),
        Some("numpy")
    );
}

#[test]
fn tolerance_table_serializes_as_the_protocol_object() {
    let task = resolve("softmax").unwrap();
    let json = serde_json::to_value(task.tolerance_table()).unwrap();
    assert_eq!(json["f32"], serde_json::json!({"rtol": 1e-4, "atol": 1e-5}));
    assert_eq!(
        json["bf16"],
        serde_json::json!({"rtol": 2e-2, "atol": 1e-2})
    );
    assert_eq!(json["i64"], serde_json::json!({"rtol": 0.0, "atol": 0.0}));
}
