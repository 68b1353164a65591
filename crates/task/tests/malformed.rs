//! Malformed tasks: each case breaks one thing in a small valid task and snapshots the error,
//! which must name the file, the field and (when known) the line.

mod common;

use common::Fixture;
use ksearch_task::{load_task, DType, Distribution, ParamValue, TaskError};

const TASK: &str = r#"format = 1
name = "mini"
kind = "softmax"
description = "row softmax"

[axes.rows]
description = "rows"

[axes.cols]
description = "columns"

[[inputs]]
name = "x"
dtype = "f32"
shape = ["rows", "cols"]
dist = { kind = "normal", mean = 0.0, std = 4.0 }

[[outputs]]
name = "y"
dtype = "f32"
shape = ["rows", "cols"]

[[workloads]]
name = "small"
params = { rows = 4, cols = 8 }

[[workloads]]
name = "odd"
params = { rows = 3, cols = 7 }
held_out = true

[roofline]
flops = "5 * rows * cols"
bytes = "8 * rows * cols"

[backends.cpu]
entry = "softmax_f32"
args = ["x", "y", "rows", "cols"]
signature = "void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols)"
seed = "seed/naive.c"
baseline = "baseline_numpy"
"#;

const REFERENCE: &str = "import numpy as np\n\ndef reference(inputs, params):\n    pass\n\ndef baseline_numpy(inputs, params):\n    pass\n";

/// A valid task in a temporary directory, to be broken by one edit.
fn fixture() -> Fixture {
    Fixture::new(
        TASK,
        &[
            ("reference.py", REFERENCE),
            ("seed/naive.c", "void softmax_f32(void) {}\n"),
        ],
    )
}

macro_rules! malformed {
    ($($name:ident => $fixture:expr;)+) => {
        $(
            #[test]
            fn $name() {
                let fixture: Fixture = $fixture;
                insta::assert_snapshot!(stringify!($name), fixture.error());
            }
        )+
    };
}

malformed! {
    toml_syntax_error => fixture().replace("name = \"mini\"", "name = \"mini");
    unknown_field => fixture().replace("held_out = true", "held_ot = true");
    missing_format => fixture().replace("format = 1\n", "");
    unsupported_format => fixture().replace("format = 1", "format = 2");
    missing_name => fixture().replace("name = \"mini\"\n", "");
    unknown_axis_in_params => fixture().replace("{ rows = 4, cols = 8 }", "{ rows = 4, cols = 8, depth = 2 }");
    missing_axis_value => fixture().replace("{ rows = 3, cols = 7 }", "{ rows = 3 }");
    wrong_param_type => fixture().replace("cols = 8", "cols = \"8\"");
    float_param => fixture().replace("cols = 8", "cols = 8.0");
    bad_axis_type => fixture().replace("description = \"rows\"", "description = \"rows\"\ntype = \"float\"");
    shape_parse_error => fixture().replace("shape = [\"rows\", \"cols\"]\ndist", "shape = [\"rows\", \"cols *\"]\ndist");
    unknown_identifier_in_shape => fixture().replace("shape = [\"rows\", \"cols\"]\n\n[[work", "shape = [\"rows\", \"colz\"]\n\n[[work");
    non_integer_shape => fixture().replace("shape = [\"rows\", \"cols\"]\ndist", "shape = [\"rows\", \"cols / 2\"]\ndist");
    non_positive_shape => fixture().replace("shape = [\"rows\", \"cols\"]\ndist", "shape = [\"rows\", \"cols - 8\"]\ndist");
    negative_literal_shape => fixture().replace("shape = [\"rows\", \"cols\"]\ndist", "shape = [\"rows\", -3]\ndist");
    str_axis_in_expression => fixture()
        .replace("description = \"columns\"", "description = \"columns\"\n\n[axes.mode]\ntype = \"str\"")
        .replace("{ rows = 4, cols = 8 }", "{ rows = 4, cols = 8, mode = \"a\" }")
        .replace("{ rows = 3, cols = 7 }", "{ rows = 3, cols = 7, mode = \"b\" }")
        .replace("flops = \"5 * rows * cols\"", "flops = \"5 * rows * mode\"");
    unknown_dtype => fixture().replace("dtype = \"f32\"\nshape = [\"rows\", \"cols\"]\ndist", "dtype = \"float32\"\nshape = [\"rows\", \"cols\"]\ndist");
    dtype_param_without_str_axis => fixture().replace("dtype = \"f32\"\nshape = [\"rows\", \"cols\"]\ndist", "dtype = \"$dtype\"\nshape = [\"rows\", \"cols\"]\ndist");
    dtype_param_not_a_dtype => fixture()
        .replace("description = \"columns\"", "description = \"columns\"\n\n[axes.dtype]\ntype = \"str\"")
        .replace("dtype = \"f32\"\nshape = [\"rows\", \"cols\"]\ndist", "dtype = \"$dtype\"\nshape = [\"rows\", \"cols\"]\ndist")
        .replace("{ rows = 4, cols = 8 }", "{ rows = 4, cols = 8, dtype = \"f32\" }")
        .replace("{ rows = 3, cols = 7 }", "{ rows = 3, cols = 7, dtype = \"fp8\" }");
    elem_bytes_without_dtype_axis => fixture().replace("bytes = \"8 * rows * cols\"", "bytes = \"2 * elem_bytes * rows * cols\"");
    bad_dist_kind => fixture().replace("kind = \"normal\", mean = 0.0, std = 4.0", "kind = \"gauss\", mean = 0.0, std = 4.0");
    bad_dist_value => fixture().replace("std = 4.0", "std = -1.0");
    dist_not_a_table => fixture().replace("dist = { kind = \"normal\", mean = 0.0, std = 4.0 }", "dist = \"normal\"");
    custom_dist_without_generator => fixture().replace("kind = \"normal\", mean = 0.0, std = 4.0", "kind = \"custom\"");
    duplicate_tensor_name => fixture().replace("name = \"y\"", "name = \"x\"");
    tensor_named_like_an_axis => fixture().replace("name = \"y\"", "name = \"rows\"");
    args_naming_nothing => fixture().replace("args = [\"x\", \"y\", \"rows\", \"cols\"]", "args = [\"x\", \"y\", \"rows\", \"colls\"]");
    args_missing_output => fixture().replace("args = [\"x\", \"y\", \"rows\", \"cols\"]", "args = [\"x\", \"rows\", \"cols\"]");
    args_twice => fixture().replace("args = [\"x\", \"y\", \"rows\", \"cols\"]", "args = [\"x\", \"y\", \"rows\", \"rows\", \"cols\"]");
    signature_without_entry => fixture().replace("entry = \"softmax_f32\"", "entry = \"softmax\"");
    seed_file_missing => fixture().replace("seed = \"seed/naive.c\"", "seed = \"seed/fast.c\"");
    baseline_not_defined => fixture().replace("baseline = \"baseline_numpy\"", "baseline = \"baseline_torch\"");
    empty_allowed_kernel => fixture().replace("baseline = \"baseline_numpy\"", "baseline = \"baseline_numpy\"\nallowed_kernels = [\"copy_v\", \" \"]");
    unknown_backend_table => fixture().replace("[backends.cpu]", "[backends.gpu]");
    no_backends => fixture().replace(&TASK[TASK.find("[backends.cpu]").unwrap()..], "");
    no_workloads => fixture()
        .replace("[[workloads]]\nname = \"small\"\nparams = { rows = 4, cols = 8 }\n\n", "")
        .replace("[[workloads]]\nname = \"odd\"\nparams = { rows = 3, cols = 7 }\nheld_out = true\n\n", "");
    held_out_only_workloads => fixture().replace("params = { rows = 4, cols = 8 }", "params = { rows = 4, cols = 8 }\nheld_out = true");
    duplicate_workload_names => fixture().replace("name = \"odd\"", "name = \"small\"");
    workload_names_unknown_backend => fixture().replace("held_out = true", "held_out = true\nbackends = [\"cuda\"]");
    missing_roofline => fixture().replace("[roofline]\nflops = \"5 * rows * cols\"\nbytes = \"8 * rows * cols\"\n", "");
    division_by_zero_in_formula => fixture().replace("flops = \"5 * rows * cols\"", "flops = \"5 * rows / (cols - 7)\"");
    unknown_tolerance_dtype => fixture().replace("[roofline]", "[tolerance.float32]\nrtol = 1e-3\n\n[roofline]");
    negative_tolerance => fixture().replace("[roofline]", "[tolerance.f32]\natol = -1.0\n\n[roofline]");
    unknown_tolerance_rule => fixture().replace("[roofline]", "[tolerance.f32]\nrule = \"loose\"\n\n[roofline]");
    matched_ratio_above_one => fixture().replace("[roofline]", "[tolerance.f32]\nmatched_ratio = 1.5\n\n[roofline]");
    integer_input_with_normal_dist => fixture().replace("dtype = \"f32\"\nshape = [\"rows\", \"cols\"]\ndist", "dtype = \"i32\"\nshape = [\"rows\", \"cols\"]\ndist");
}

#[test]
fn missing_reference_module() {
    let f = fixture();
    std::fs::remove_file(f.path().join("reference.py")).unwrap();
    let msg = f.error();
    assert!(msg.starts_with("<task>/task.toml: reference.module: cannot read the reference module <task>/reference.py"), "{msg}");
}

#[test]
fn not_a_task_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_task(dir.path()).unwrap_err();
    assert!(matches!(err, TaskError::NotATaskDir { .. }), "{err}");
    assert!(err
        .to_string()
        .ends_with("not a task directory (no task.toml)"));
}

#[test]
fn unknown_backend_lookup() {
    let task = fixture().load().unwrap();
    insta::assert_snapshot!(
        "unknown_backend_lookup",
        task.backend("cuda").unwrap_err().to_string()
    );
    insta::assert_snapshot!(
        "unknown_backend_workloads",
        task.workloads("mlx").unwrap_err().to_string()
    );
}

#[test]
fn errors_carry_structured_locations() {
    let f = fixture().replace("cols = 8", "cols = \"8\"");
    match f.load() {
        Err(TaskError::Invalid(e)) => {
            assert!(e.file.ends_with("task.toml"));
            assert_eq!(e.field, "workloads[0].params.cols");
            assert_eq!(e.line, Some(25));
            assert_eq!(e.column, Some(29));
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn the_valid_fixture_loads_with_defaults_filled_in() {
    let task = fixture().load().unwrap();
    assert_eq!(task.name(), "mini");
    assert_eq!(task.kind(), "softmax");
    let axes: Vec<&str> = task.spec().axes.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(
        axes,
        ["rows", "cols"],
        "declaration order, not alphabetical"
    );
    let cpu = task.backend("cpu").unwrap();
    assert_eq!(cpu.language, "c");
    assert_eq!(cpu.forbidden, ["reference", "baseline_numpy"]);
    assert!(cpu.seed.as_ref().unwrap().is_absolute());
    assert_eq!(task.tolerance(DType::F32).rtol, 2e-5);
    assert_eq!(task.tolerance(DType::BF16).atol, 1e-2);
    assert_eq!(task.tolerance_table().len(), 6);
    assert_eq!(
        task.tolerance(DType::F32).rule,
        ksearch_task::ToleranceRule::Scaled
    );
    assert_eq!(task.tolerance(DType::F32).matched_ratio, 1.0);
    let either = fixture()
        .replace(
            "[roofline]",
            "[tolerance.f32]\nrule = \"either\"\nmatched_ratio = 0.95\n\n[roofline]",
        )
        .load()
        .unwrap();
    let t = either.tolerance(DType::F32);
    assert_eq!(
        (t.rule, t.matched_ratio, t.rtol),
        (ksearch_task::ToleranceRule::Either, 0.95, 2e-5)
    );
    let w = task.workloads("cpu").unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!((w[0].flops, w[0].bytes), (160.0, 256.0));
    assert_eq!(w[1].inputs[0].shape, [3, 7]);
    assert!(w[1].held_out);
}

#[test]
fn dtype_params_tolerances_filters_and_int_inputs() {
    let task = fixture()
        .replace("description = \"columns\"", "description = \"columns\"\n\n[axes.dtype]\ntype = \"str\"")
        .replace("dtype = \"f32\"\nshape = [\"rows\", \"cols\"]\ndist", "dtype = \"$dtype\"\nshape = [\"rows\", \"cols\"]\ndist")
        .replace("{ rows = 4, cols = 8 }", "{ rows = 4, cols = 8, dtype = \"f16\" }")
        .replace("{ rows = 3, cols = 7 }", "{ rows = 3, cols = 7, dtype = \"bf16\" }")
        .replace("bytes = \"8 * rows * cols\"", "bytes = \"(elem_bytes + 4) * rows * cols\"")
        .replace("[roofline]", "[tolerance.f16]\nrtol = 0.05\n\n[roofline]")
        .replace("held_out = true", "held_out = true\nbackends = [\"cpu\"]")
        .replace(
            "[[outputs]]",
            "[[inputs]]\nname = \"idx\"\ndtype = \"i64\"\nshape = [\"ceil_div(cols, 4)\"]\ndist = { kind = \"rand_int\", low = 0, high = 5 }\n\n[[outputs]]",
        )
        .replace("args = [\"x\", \"y\"", "args = [\"x\", \"idx\", \"y\"")
        .load()
        .unwrap();
    let w = task.workloads("cpu").unwrap();
    assert_eq!(w[0].params["dtype"], ParamValue::Str("f16".into()));
    assert_eq!(w[0].inputs[0].dtype, DType::F16);
    assert_eq!(w[1].inputs[0].dtype, DType::BF16);
    assert_eq!(w[0].outputs[0].dtype, DType::F32);
    assert_eq!(w[0].bytes, 6.0 * 32.0);
    assert_eq!(w[1].inputs[1].shape, [2]);
    assert_eq!(
        w[1].inputs[1].dist,
        Some(Distribution::RandInt { low: 0, high: 5 })
    );
    // A partial override keeps the other field's default.
    assert_eq!(task.tolerance(DType::F16).rtol, 0.05);
    assert_eq!(task.tolerance(DType::F16).atol, 5e-3);
    let json = serde_json::to_value(&w[0]).unwrap();
    assert_eq!(json["params"]["dtype"], "f16");
    assert_eq!(json["inputs"][1]["dist"]["kind"], "rand_int");
}

/// Loading never panics, whatever prefix of a task file it is given.
#[test]
fn every_truncation_loads_or_fails_cleanly() {
    let f = fixture();
    let mut errors = 0;
    for (cut, _) in TASK.char_indices().step_by(3) {
        std::fs::write(f.path().join("task.toml"), &TASK[..cut]).unwrap();
        if load_task(f.path()).is_err() {
            errors += 1;
        }
    }
    // Only prefixes that already hold the whole task (up to the last line) can load.
    assert!(errors > TASK.len() / 3 - 20, "{errors}");
}

/// Non-ASCII text in values and expressions is reported, not a panic on a char boundary.
#[test]
fn non_ascii_expressions_are_reported() {
    let msg = fixture()
        .replace("flops = \"5 * rows * cols\"", "flops = \"5 × rows × cols\"")
        .error();
    assert!(
        msg.contains("roofline.flops") && msg.contains("unexpected character `×`"),
        "{msg}"
    );
}
