//! Declared assumptions, per-workload distributions and `ksearch_task::check::check`: what a
//! kernel may assume is declared and enforced at load, everything else must be varied by the
//! workloads, and inputs must reach what `must_reach` says matters.

mod common;

use common::Fixture;
use ksearch_task::check::check;
use ksearch_task::{builtin, Distribution, Reach, SpecError};

/// A small valid task whose workloads pass the check: cols vary in divisibility, x reaches
/// +-100 through a held-out workload's own distribution.
const TASK: &str = r#"format = 1
name = "mini"
kind = "softmax"

[axes.rows]

[axes.cols]

[[inputs]]
name = "x"
dtype = "f32"
shape = ["rows", "cols"]
dist = { kind = "normal", mean = 0.0, std = 4.0 }
must_reach = { low = -100.0, high = 100.0 }

[[outputs]]
name = "y"
dtype = "f32"
shape = ["rows", "cols"]

[[workloads]]
name = "shown"
params = { rows = 4, cols = 64 }

[[workloads]]
name = "odd"
params = { rows = 3, cols = 7 }
held_out = true

[[workloads]]
name = "wide"
params = { rows = 2, cols = 1000 }
held_out = true
dist = { x = { kind = "uniform", low = -120.0, high = 120.0 } }

[roofline]
flops = "5 * rows * cols"
bytes = "8 * rows * cols"

[backends.cpu]
entry = "softmax_f32"
args = ["x", "y", "rows", "cols"]
signature = "void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols)"
"#;

const REFERENCE: &str = "import numpy as np\n\ndef reference(inputs, params):\n    pass\n\ndef make_rows(rng, shape, params):\n    pass\n";

fn fixture() -> Fixture {
    Fixture::new(TASK, &[("reference.py", REFERENCE)])
}

fn problems_of(f: &Fixture) -> Vec<SpecError> {
    check(&f.load().unwrap_or_else(|e| panic!("loads: {e}")))
}

fn render(problems: &[SpecError], dir: &std::path::Path) -> String {
    let root = dir.canonicalize().unwrap().display().to_string();
    problems
        .iter()
        .map(|p| p.to_string().replace(&root, "<task>"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_builtin_tasks_pass() {
    for task in builtin::list().unwrap() {
        let problems = check(&task);
        assert!(
            problems.is_empty(),
            "{}:\n{}",
            task.name(),
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[test]
fn the_fixture_passes() {
    assert!(problems_of(&fixture()).is_empty());
}

#[test]
fn an_undeclared_shared_divisor_fails_with_the_axis_line() {
    let f = fixture().replace("cols = 7 }", "cols = 8 }");
    let problems = problems_of(&f);
    assert_eq!(problems.len(), 1);
    let p = &problems[0];
    assert_eq!(p.field, "axes.cols");
    assert_eq!(p.line, Some(7));
    assert_eq!(
        render(&problems, f.path()),
        "<task>/task.toml:7:7: axes.cols: backend `cpu`: every value of `cols` (8, 64, 1000) is \
         a multiple of 8, which the task does not declare: add a held-out workload whose `cols` \
         is not a multiple of 8 (an odd or prime size), or declare `multiple_of = 8`\n 7 | \
         [axes.cols]\n           ^"
    );
}

#[test]
fn a_declared_divisor_passes_and_a_smaller_one_does_not() {
    let even = fixture().replace("cols = 7 }", "cols = 8 }");
    let declared = even.replace("[axes.cols]\n", "[axes.cols]\nmultiple_of = 8\n");
    assert!(problems_of(&declared).is_empty());

    let too_weak = fixture()
        .replace("cols = 7 }", "cols = 8 }")
        .replace("[axes.cols]\n", "[axes.cols]\nmultiple_of = 4\n");
    let problems = problems_of(&too_weak);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].message.contains(
            "is a multiple of 8, but the task declares only `multiple_of = 4`: add a held-out \
             workload whose `cols` is a multiple of 4 but not of 8"
        ),
        "{}",
        problems[0]
    );
}

#[test]
fn an_axis_with_one_value_fails_unless_its_values_are_declared() {
    let f = fixture()
        .replace("rows = 3, cols = 7", "rows = 4, cols = 7")
        .replace("rows = 2, cols = 1000", "rows = 4, cols = 1000");
    let problems = problems_of(&f);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].field, "axes.rows");
    assert!(problems[0].message.contains(
        "every workload has `rows` = 4, so a kernel may hard-code it: add a held-out workload \
         with another `rows`, or declare `values = [4]`"
    ));
    let declared = f.replace("[axes.rows]\n", "[axes.rows]\nvalues = [4]\n");
    assert!(problems_of(&declared).is_empty());
}

#[test]
fn no_held_out_workload_fails() {
    let f = fixture()
        .replace("held_out = true\n\n[[workloads]]", "\n[[workloads]]")
        .replace("held_out = true\ndist", "dist");
    let problems = problems_of(&f);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].field, "workloads");
    assert!(problems[0]
        .message
        .starts_with("backend `cpu`: no held-out workload"));
}

#[test]
fn inputs_must_reach_what_the_task_says_matters() {
    // Without the wide workload's own distribution, std-4 logits reach only +-12.
    let f = fixture().replace(
        "dist = { x = { kind = \"uniform\", low = -120.0, high = 120.0 } }\n",
        "",
    );
    let problems = problems_of(&f);
    let text = render(&problems, f.path());
    assert_eq!(problems.len(), 2, "{text}");
    assert_eq!(problems[0].field, "inputs[0].must_reach.low");
    assert_eq!(problems[1].field, "inputs[0].must_reach.high");
    assert!(
        text.contains(
            "backend `cpu`: no workload draws `x` at or below -100: the lowest is -12 (shown: \
             normal(mean 0, std 4) reaching mean ± 3 std)"
        ),
        "{text}"
    );
    assert_eq!(problems[0].line, Some(14), "{text}");

    // A normal draw reaches mean +- 3 std.
    let normal = f.replace(
        "held_out = true\n\n[roofline]",
        "held_out = true\ndist = { x = { kind = \"normal\", mean = 0.0, std = 34.0 } }\n\n[roofline]",
    );
    assert!(
        problems_of(&normal).is_empty(),
        "{:?}",
        problems_of(&normal)
    );

    // A custom generator reaches only what it declares.
    let custom = fixture().replace(
        "{ kind = \"uniform\", low = -120.0, high = 120.0 }",
        "{ kind = \"custom\", function = \"make_rows\" }",
    );
    let problems = problems_of(&custom);
    assert_eq!(problems.len(), 2);
    assert!(
        problems[1].message.contains(
            "custom generators without a declared `reach` count as drawing nothing (wide)"
        ),
        "{}",
        problems[1]
    );
    let declared = custom.replace(
        "function = \"make_rows\" }",
        "function = \"make_rows\", reach = { low = -100.0, high = 100.0 } }",
    );
    assert!(problems_of(&declared).is_empty());
    let one_sided = custom.replace(
        "function = \"make_rows\" }",
        "function = \"make_rows\", reach = { high = 100.0 } }",
    );
    let problems = problems_of(&one_sided);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].field, "inputs[0].must_reach.low");
}

#[test]
fn a_workloads_own_distribution_reaches_the_harness() {
    let task = fixture().load().unwrap();
    let w = task.workloads("cpu").unwrap();
    assert_eq!(
        w[0].inputs[0].dist,
        Some(Distribution::Normal {
            mean: 0.0,
            std: 4.0
        })
    );
    assert_eq!(
        w[2].inputs[0].dist,
        Some(Distribution::Uniform {
            low: -120.0,
            high: 120.0
        })
    );
    assert_eq!(
        task.spec().inputs[0].must_reach,
        Some(Reach {
            low: Some(-100.0),
            high: Some(100.0)
        })
    );
    // A declared reach travels with a custom dist; the harness ignores it.
    let custom = fixture()
        .replace(
            "{ kind = \"uniform\", low = -120.0, high = 120.0 }",
            "{ kind = \"custom\", function = \"make_rows\", reach = { high = 100.0 } }",
        )
        .load()
        .unwrap();
    let json = serde_json::to_value(&custom.workloads("cpu").unwrap()[2].inputs[0]).unwrap();
    assert_eq!(
        json["dist"],
        serde_json::json!({"kind": "custom", "function": "make_rows", "reach": {"high": 100.0}})
    );
}

#[test]
fn backend_assumptions_apply_to_their_backend_only() {
    let two = fixture()
        .replace("cols = 7 }", "cols = 8 }")
        .replace("name = \"shown\"\n", "name = \"shown\"\nbackends = [\"cpu\"]\n")
        .replace("name = \"odd\"\n", "name = \"odd\"\nbackends = [\"cpu\"]\n")
        .replace("name = \"wide\"\n", "name = \"wide\"\nbackends = [\"cpu\"]\n")
        .replace(
            "[roofline]",
            "[[workloads]]\nname = \"gpu\"\nparams = { rows = 5, cols = 64 }\nbackends = [\"cuda\"]\n\n\
             [[workloads]]\nname = \"gpu-odd\"\nparams = { rows = 5, cols = 128 }\nheld_out = true\n\
             backends = [\"cuda\"]\ndist = { x = { kind = \"normal\", std = 40.0 } }\n\n[roofline]",
        )
        .replace(
            "[backends.cpu]",
            "[backends.cuda]\nentry = \"softmax_f32\"\nargs = [\"x\", \"y\", \"rows\", \"cols\"]\n\
             signature = \"int softmax_f32(void)\"\nassume = { cols = { values = [64, 128] } }\n\n\
             [backends.cpu]",
        );
    let problems = problems_of(&two);
    // cuda declares its cols; cpu's still share 8 (and its rows are fine; cuda's rows are 5).
    let fields: Vec<String> = problems
        .iter()
        .map(|p| format!("{} {}", p.field, p.message.split(':').next().unwrap()))
        .collect();
    assert_eq!(
        fields,
        ["axes.cols backend `cpu`", "axes.rows backend `cuda`"],
        "{problems:?}"
    );
    let task = two.load().unwrap();
    assert_eq!(
        task.spec().assumption_text("cuda", "cols").as_deref(),
        Some("one of 64, 128")
    );
    assert_eq!(task.spec().assumption_text("cpu", "cols"), None);
}

#[test]
fn a_workload_that_breaks_a_declared_assumption_does_not_load() {
    let f = fixture().replace("[axes.cols]\n", "[axes.cols]\nmin = 2\nmax = 999\n");
    assert_eq!(
        f.error(),
        "<task>/task.toml:34:29: workloads[2].params.cols: cols = 1000 breaks what kernels may \
         assume: `axes.cols` says <= 999 (limit the workload's `backends`, or change the \
         declaration)\n 34 | params = { rows = 2, cols = 1000 }\n                                  ^"
    );
}

#[test]
fn malformed_declarations_are_reported_with_their_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[axes.cols]\n",
            "[axes.cols]\nmultiple_of = 1\n",
            "axes.cols.multiple_of: multiple_of = 1 says nothing; it must be at least 2",
        ),
        (
            "[axes.cols]\n",
            "[axes.cols]\nvalues = []\n",
            "axes.cols.values: an empty `values` list admits no workload",
        ),
        (
            "[axes.cols]\n",
            "[axes.cols]\nvalues = [7, 64, 7]\n",
            "axes.cols.values: 7 is listed twice",
        ),
        (
            "[axes.cols]\n",
            "[axes.cols]\nmin = 10\nmax = 2\n",
            "axes.cols.min: min = 10 is above max = 2",
        ),
        (
            "[axes.cols]\n",
            "[axes.cols]\nvalues = [7, 64, 1000]\nmultiple_of = 2\n",
            "axes.cols.values: 7 is not a multiple of 2, which this axis also declares",
        ),
        (
            "[axes.cols]\n",
            "[axes.cols]\nmultiple_of = \"8\"\n",
            "axes.cols.multiple_of: invalid type: string \"8\", expected i64",
        ),
        (
            "[axes.cols]\n",
            "[axes.cols]\n\n[axes.dtype]\ntype = \"str\"\ndefault = \"f32\"\nvalues = [1]\n",
            "axes.dtype.values: `dtype` is a str axis; only int axes take",
        ),
        (
            "signature = \"void",
            "assume = { width = { min = 1 } }\nsignature = \"void",
            "backends.cpu.assume.width: `width` is not an axis (int axes: rows, cols)",
        ),
        (
            "signature = \"void",
            "assume = { cols = {} }\nsignature = \"void",
            "backends.cpu.assume.cols: an empty assumption",
        ),
        (
            "must_reach = { low = -100.0, high = 100.0 }",
            "must_reach = {}",
            "inputs[0].must_reach: needs `low`",
        ),
        (
            "must_reach = { low = -100.0, high = 100.0 }",
            "must_reach = { low = 100.0, high = -100.0 }",
            "inputs[0].must_reach.low: low = 100 is not below high = -100",
        ),
        (
            "must_reach = { low = -100.0, high = 100.0 }",
            "must_reach = { highest = 100.0 }",
            "unknown field `highest`",
        ),
        (
            "dist = { x = { kind = \"uniform\"",
            "dist = { z = { kind = \"uniform\"",
            "workloads[2].dist.z: `z` is not an input (inputs: x)",
        ),
        (
            "{ kind = \"uniform\", low = -120.0, high = 120.0 }",
            "{ kind = \"custom\", function = \"make_cols\" }",
            "workloads[2].dist.x: reference.py defines no function `make_cols`",
        ),
        (
            "{ kind = \"uniform\", low = -120.0, high = 120.0 }",
            "{ kind = \"normal\", std = -1.0 }",
            "workloads[2].dist.x: normal needs a finite mean and a positive std",
        ),
        (
            "{ kind = \"uniform\", low = -120.0, high = 120.0 }",
            "{ kind = \"custom\", function = \"make_rows\", reach = [0, 1] }",
            "workloads[2].dist.x",
        ),
    ];
    for (from, to, want) in cases {
        let f = fixture().replace(from, to);
        assert!(f.load().is_err(), "{to:?} loads");
        let err = f.error();
        assert!(err.contains(want), "{to:?}:\n{err}\nwanted: {want}");
        assert!(err.starts_with("<task>/task.toml:"), "{err}");
    }
}
