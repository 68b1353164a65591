//! `Task::resolve_workload`: workloads that are not in task.toml (bench shapes, knowledge-pack
//! assertion workloads) get the checks and the resolution of the task's own.

mod common;

use common::Fixture;
use ksearch_task::{CustomWorkload, DType, Distribution, ParamValue, TaskError, WorkloadError};
use std::collections::BTreeMap;

const TASK: &str = r#"format = 1
name = "mini"
kind = "softmax"

[axes.rows]
max = 4294967296

[axes.cols]

[axes.dtype]
type = "str"
default = "f32"

[[inputs]]
name = "x"
dtype = "$dtype"
shape = ["rows", "cols"]

[[outputs]]
name = "y"
dtype = "f32"
shape = ["rows", "ceil_div(cols, 2)"]

[[workloads]]
name = "small"
params = { rows = 4, cols = 8 }

[[workloads]]
name = "half"
params = { rows = 3, cols = 7, dtype = "f16" }
held_out = true
dist = { x = { kind = "uniform", low = -2.0, high = 2.0 } }

[roofline]
flops = "rows + cols"
bytes = "elem_bytes * (rows + cols)"

[backends.cpu]
entry = "k"
args = ["x", "y", "rows", "cols"]
signature = "void k(const void* x, float* y, int64_t rows, int64_t cols)"
"#;

fn fixture() -> Fixture {
    Fixture::new(
        TASK,
        &[(
            "reference.py",
            "def reference(inputs, params):\n    pass\n\ndef make_x(rng, shape, params):\n    pass\n",
        )],
    )
}

fn task() -> ksearch_task::Task {
    fixture().load().unwrap_or_else(|e| panic!("{e}"))
}

fn params(pairs: &[(&str, ParamValue)]) -> BTreeMap<String, ParamValue> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn custom(pairs: &[(&str, ParamValue)]) -> CustomWorkload {
    CustomWorkload {
        name: "w".into(),
        params: params(pairs),
        ..CustomWorkload::default()
    }
}

fn int(v: i64) -> ParamValue {
    ParamValue::Int(v)
}

fn text(v: &str) -> ParamValue {
    ParamValue::Str(v.into())
}

/// The workload error of `w`, or a panic.
fn error(w: &CustomWorkload) -> WorkloadError {
    match task().resolve_workload("cpu", w) {
        Err(TaskError::Workload(e)) => *e,
        other => panic!("expected a workload error, got {other:?}"),
    }
}

#[test]
fn a_custom_workload_resolves_like_the_task_own() {
    let task = task();
    for own in task.workloads("cpu").unwrap() {
        let made = task
            .resolve_workload(
                "cpu",
                &CustomWorkload {
                    name: own.name.clone(),
                    params: own.params.clone(),
                    held_out: own.held_out,
                    dist: task
                        .spec()
                        .workloads
                        .iter()
                        .find(|w| w.name == own.name)
                        .unwrap()
                        .dist
                        .clone(),
                },
            )
            .unwrap();
        assert_eq!(made, own);
    }
    // The defaulted dtype applies unlisted.
    let w = task
        .resolve_workload("cpu", &custom(&[("rows", int(2)), ("cols", int(5))]))
        .unwrap();
    assert_eq!(w.params, params(&[("rows", int(2)), ("cols", int(5))]));
    assert_eq!(w.inputs[0].dtype, DType::F32);
    assert_eq!(w.outputs[0].shape, [2, 3]);
    assert_eq!((w.flops, w.bytes), (7.0, 28.0));
    assert_eq!(w.inputs[0].dist, Some(Distribution::default()));
}

#[test]
fn the_element_count_overflow_check_applies() {
    let big = 1 << 32;
    let e = error(&custom(&[("rows", int(big)), ("cols", int(big))]));
    assert_eq!((e.field.as_str(), e.in_task), ("inputs[0].shape", true));
    assert_eq!(e.message, "the element count of `x` overflows");
    assert_eq!(
        e.to_string(),
        "task mini, workload `w`: task.toml inputs[0].shape: the element count of `x` overflows"
    );
    // One less and it fits.
    assert!(task()
        .resolve_workload(
            "cpu",
            &custom(&[("rows", int(big)), ("cols", int(big / 2 - 1))])
        )
        .is_ok());
    // The same check, with the same message, for a workload of task.toml.
    let err = fixture()
        .replace(
            "{ rows = 4, cols = 8 }",
            "{ rows = 4294967296, cols = 4294967296 }",
        )
        .error();
    assert!(
        err.starts_with("<task>/task.toml:17:9: inputs[0].shape: in workload `small` (workloads[0]): the element count of `x` overflows"),
        "{err}"
    );
}

#[test]
fn integer_inputs_need_an_integer_distribution() {
    // `$dtype` = i32 with the input's default normal draw.
    let e = error(&custom(&[
        ("rows", int(2)),
        ("cols", int(3)),
        ("dtype", text("i32")),
    ]));
    assert_eq!((e.field.as_str(), e.in_task), ("inputs[0].dist", true));
    assert_eq!(
        e.message,
        "integer input `x` (i32) needs a `rand_int` or `custom` dist"
    );
    // The workload's own normal draw is the workload's fault.
    let mut w = custom(&[("rows", int(2)), ("cols", int(3)), ("dtype", text("i64"))]);
    w.dist.insert(
        "x".into(),
        Distribution::Normal {
            mean: 0.0,
            std: 1.0,
        },
    );
    let e = error(&w);
    assert_eq!((e.field.as_str(), e.in_task), ("dist.x", false));
    // A rand_int draw suits it.
    w.dist
        .insert("x".into(), Distribution::RandInt { low: 0, high: 9 });
    let r = task().resolve_workload("cpu", &w).unwrap();
    assert_eq!(r.inputs[0].dtype, DType::I64);
}

#[test]
fn params_distributions_and_assumptions_are_checked() {
    let e = error(&custom(&[("rows", int(2))]));
    assert_eq!(e.field, "params.cols");
    assert_eq!(e.message, "missing a value for axis `cols`");
    let e = error(&custom(&[("rows", int(2)), ("cols", text("3"))]));
    assert_eq!(
        e.message,
        "expected an integer for int axis `cols`, found a string"
    );
    let e = error(&custom(&[
        ("rows", int(2)),
        ("cols", int(3)),
        ("nope", int(1)),
    ]));
    assert_eq!(e.field, "params.nope");
    let e = error(&custom(&[
        ("rows", int(2)),
        ("cols", int(3)),
        ("dtype", text("float")),
    ]));
    assert!(e.message.starts_with("`float` is not a dtype"), "{e}");
    let e = error(&custom(&[("rows", int(1 << 33)), ("cols", int(1))]));
    assert_eq!(e.field, "params.rows");
    assert!(e.message.contains("breaks what kernels may assume"), "{e}");
    let e = error(&custom(&[("rows", int(2)), ("cols", int(0))]));
    assert_eq!((e.field.as_str(), e.in_task), ("inputs[0].shape[1]", true));
    assert_eq!(e.message, "`cols` = 0; a dimension must be positive");

    let mut w = custom(&[("rows", int(2)), ("cols", int(3))]);
    w.dist.insert(
        "x".into(),
        Distribution::Normal {
            mean: 0.0,
            std: -1.0,
        },
    );
    assert_eq!(error(&w).field, "dist.x");
    w.dist.clear();
    w.dist.insert(
        "x".into(),
        Distribution::Custom {
            function: "make_nothing".into(),
            reach: None,
        },
    );
    assert!(error(&w)
        .message
        .contains("defines no function `make_nothing`"));
    w.dist.clear();
    w.dist
        .insert("y".into(), Distribution::RandInt { low: 0, high: 1 });
    assert_eq!(error(&w).message, "`y` is not an input (inputs: x)");

    assert!(matches!(
        task().resolve_workload("cuda", &custom(&[("rows", int(2)), ("cols", int(3))])),
        Err(TaskError::UnknownBackend { .. })
    ));
}

#[test]
fn params_parse_from_axis_value_text() {
    let task = task();
    assert_eq!(
        task.parse_params(" rows=4, cols = 8,dtype=f16 ").unwrap(),
        params(&[("rows", int(4)), ("cols", int(8)), ("dtype", text("f16"))])
    );
    let message = |text: &str| match task.parse_params(text) {
        Err(TaskError::Workload(e)) => {
            assert_eq!(e.workload, text);
            e.message
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(message("rows=x"), "rows = `x` is not an integer");
    assert!(message("rows=1,nope=2").starts_with("unknown axis `nope`"));
    assert_eq!(message("rows=1,rows=2"), "`rows` is given twice");
    assert_eq!(message("rows"), "`rows` is not AXIS=VALUE");
}
