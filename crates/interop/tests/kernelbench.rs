//! KernelBench problems imported as ksearch tasks, from what the problem's introspection
//! printed (recorded under examples/kernelbench/introspected; with `KSEARCH_TEST_TORCH_PYTHON`
//! naming an interpreter with PyTorch, the recording is checked against a real run).

use ksearch_interop::kernelbench::{self, Introspection};
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernelbench")
}

fn recorded(stem: &str) -> Introspection {
    let text =
        std::fs::read_to_string(examples().join(format!("introspected/{stem}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn problem(stem: &str) -> PathBuf {
    examples().join(format!("level1/{stem}.py"))
}

#[test]
fn a_problem_with_parameters_becomes_a_task_whose_inputs_include_them() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("t");
    let stem = "2_Linear_GELU";
    let imported = kernelbench::import(&problem(stem), &recorded(stem), &dir).unwrap();
    let spec = imported.task.spec();
    assert_eq!(spec.name, "kernelbench_2_Linear_GELU");
    let inputs: Vec<(&str, Vec<String>)> = spec
        .inputs
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.shape.iter().map(|e| e.source().to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        inputs,
        [
            ("x", vec!["128".to_string(), "1024".into()]),
            ("linear_weight", vec!["4096".into(), "1024".into()]),
            ("linear_bias", vec!["4096".into()]),
        ]
    );
    let cuda = imported.task.backend("cuda").unwrap();
    assert_eq!(cuda.entry, "kernelbench_2_Linear_GELU");
    assert_eq!(cuda.args, ["x", "linear_weight", "linear_bias", "out"]);
    assert!(cuda.signature.ends_with("void* out, void* stream)"));
    let w = imported.task.workloads("cuda").unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].outputs[0].shape, [128, 4096]);
    let t = imported.task.tolerance(ksearch_task::DType::F32);
    assert_eq!(
        (t.rule, t.rtol, t.atol),
        (ksearch_task::ToleranceRule::Either, 1e-4, 1e-4)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("problem.py")).unwrap(),
        std::fs::read_to_string(problem(stem)).unwrap()
    );
    let reference = std::fs::read_to_string(dir.join("reference.py")).unwrap();
    assert!(reference.contains("def make_linear_weight(rng, shape, params):\n    return _model_tensor(rng, \"linear.weight\")"));
    assert!(
        reference.contains("def make_x(rng, shape, params):\n    return _forward_input(rng, 0)")
    );

    // reference.py imports without PyTorch (numpy only) and names what it loads.
    if let Some(python) = std::env::var_os("KSEARCH_TEST_PYTHON") {
        let script = "import importlib.util, sys\n\
            spec = importlib.util.spec_from_file_location('r', sys.argv[1])\n\
            m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n\
            print(m.FORWARD, m.MODEL_TENSORS, m.OUTPUTS)";
        let run = std::process::Command::new(python)
            .args(["-c", script])
            .arg(dir.join("reference.py"))
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&run.stdout).trim(),
            "['x'] [('linear_weight', 'linear.weight'), ('linear_bias', 'linear.bias')] ['out']"
        );
    }
}

#[test]
fn an_elementwise_problem_becomes_a_one_input_task() {
    let out = tempfile::tempdir().unwrap();
    let imported = kernelbench::import(
        &problem("1_ReLU"),
        &recorded("1_ReLU"),
        &out.path().join("t"),
    )
    .unwrap();
    let cuda = imported.task.backend("cuda").unwrap();
    assert_eq!(cuda.args, ["x", "out"]);
    assert!(imported
        .notes
        .iter()
        .any(|n| n.contains("nothing is held out")));
}

#[test]
fn what_a_task_cannot_hold_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let mut seen = recorded("1_ReLU");
    seen.inputs[0].dtype = Some("bool".into());
    let err = kernelbench::import(&problem("1_ReLU"), &seen, &out.path().join("a"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("dtype bool is not supported"), "{err}");
    let not_a_problem = out.path().join("x.py");
    std::fs::write(&not_a_problem, "def f():\n    pass\n").unwrap();
    let err = kernelbench::import(&not_a_problem, &recorded("1_ReLU"), &out.path().join("b"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a KernelBench problem"), "{err}");
    let mut no_output = recorded("1_ReLU");
    no_output.outputs.clear();
    let err = kernelbench::import(&problem("1_ReLU"), &no_output, &out.path().join("c"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("returned no tensor"), "{err}");
}

#[test]
fn the_recordings_match_a_real_introspection_where_pytorch_is_installed() {
    let Some(python) = std::env::var_os("KSEARCH_TEST_TORCH_PYTHON") else {
        eprintln!("skipped: set KSEARCH_TEST_TORCH_PYTHON to an interpreter with PyTorch");
        return;
    };
    for stem in ["1_ReLU", "2_Linear_GELU"] {
        let seen = kernelbench::introspect(Path::new(&python), &problem(stem)).unwrap();
        assert_eq!(seen, recorded(stem), "{stem}");
    }
}
