"""mlx_prebuild: an mlx candidate's kernels recorded without a device, compiled into MLX's cache
format by a build ahead, and found by the accused of its evaluation (through the fake MLX, whose
kernels keep MLX's module cache: tests/fake_mlx)."""

from __future__ import annotations

import base64
import json
import os
import textwrap

import pytest

from ksearch_harness import mlx_prebuild, worker
from ksearch_harness.adapters import mlx as mlx_adapter
from ksearch_harness.protocol import parse_request
from test_gpu_mlx_fake import HONEST, _request, events, fake_mx  # noqa: F401 - a fixture

# Builds its kernel per call, with the dtype and the size as template arguments: one module per
# (dtype, n); its import alone builds nothing.
TEMPLATED = '''
import mlx.core as mx


def scale(*, x, n):
    kern = mx.fast.cuda_kernel(name="scale_t", input_names=["x"], output_names=["y"],
                               source="y[i] = 2 * x[i];")
    (y,) = kern(inputs=[x], output_shapes=[x.shape], output_dtypes=[x.dtype],
                grid=(n, 1, 1), threadgroup=(32, 1, 1), template=[("T", x.dtype), ("N", n)])
    return y
'''


def _plan(*sizes: tuple[str, int]) -> list[dict]:
    return [{"name": f"{d}-{n}", "params": {"n": n, "dtype": d},
             "inputs": [{"name": "x", "shape": [n], "dtype": d}]} for d, n in sizes]


def test_the_record_keeps_each_distinct_kernel_and_runs_none(tmp_path, fake_mx):
    cand = tmp_path / "c.py"
    cand.write_text(TEMPLATED)
    answer = mlx_prebuild.record(str(cand), _plan(("f16", 64), ("f16", 64), ("bf16", 100)),
                                 "scale", ["x", "n"])
    assert answer["problems"] == {}
    specs = [mlx_prebuild.KernelSpec.from_json(s) for s in answer["specs"]]
    # The same call twice is one kernel; another dtype and size is another.
    assert [(s.input_dtypes, s.template) for s in specs] == [
        (["float16"], [["T", "dtype", "float16"], ["N", "int", 64]]),
        (["bfloat16"], [["T", "dtype", "bfloat16"], ["N", "int", 100]])]
    assert specs[0].source == "y[i] = 2 * x[i];" and specs[0].input_ndims == [1]
    assert specs[0].output_dtypes == ["float16"]
    # Nothing was launched and no module compiled: the recorder stood in for the builder, on
    # the CPU.
    assert not [e for e in fake_mx.events if e[0] in ("kernel", "module")]
    assert fake_mx.default_device() == "cpu"


def test_a_candidate_that_fails_in_the_record_is_noted_per_workload(tmp_path, fake_mx):
    cand = tmp_path / "c.py"
    cand.write_text(TEMPLATED.replace("def scale(*, x, n):\n",
                                      "def scale(*, x, n):\n    assert n != 100\n"))
    answer = mlx_prebuild.record(str(cand), _plan(("f16", 64), ("bf16", 100)), "scale",
                                 ["x", "n"])
    assert list(answer["problems"]) == ["bf16-100"]
    assert len(answer["specs"]) == 1
    cand.write_text("raise ImportError('no')\n")
    answer = mlx_prebuild.record(str(cand), _plan(("f16", 64)), "scale", ["x", "n"])
    assert answer["specs"] == [] and "ImportError" in answer["problems"]["import"]


def test_the_compile_builds_each_spec_under_the_accuseds_name_on_an_empty_grid(tmp_path,
                                                                              fake_mx):
    cand = tmp_path / "c.py"
    cand.write_text(TEMPLATED)
    specs = [mlx_prebuild.KernelSpec.from_json(s) for s in mlx_prebuild.record(
        str(cand), _plan(("f16", 64)), "scale", ["x", "n"])["specs"]]
    cache = tmp_path / "cache"
    os.environ["MLX_PTX_CACHE_DIR"] = str(cache)
    try:
        answer = mlx_prebuild.compile_specs(specs, str(cache))
    finally:
        del os.environ["MLX_PTX_CACHE_DIR"]
    hashed = mlx_adapter.kernel_name("scale_t", "y[i] = 2 * x[i];")
    module = f"custom_kernel_{hashed}_float16_64"
    assert sorted(answer["files"]) == [module + ".ptx", module + ".txt"]
    assert [k["outcome"] for k in answer["kernels"]] == ["launched"]
    # The empty grid ran nothing.
    assert not [e for e in fake_mx.events if e[0] == "kernel"]


def test_the_judge_keeps_only_mlx_custom_kernel_modules(tmp_path):
    def answer(**files: bytes) -> dict:
        return {"files": {k: base64.b64encode(v).decode() for k, v in files.items()}}

    ok = mlx_prebuild.CachedModules.from_answer(
        answer(**{"custom_kernel_a_1.ptx": b"\x7fELF", "custom_kernel_a_1.txt": b"a\t_Za\n"}))
    ok.write(str(tmp_path / "m"))
    assert sorted(os.listdir(tmp_path / "m")) == ["custom_kernel_a_1.ptx",
                                                 "custom_kernel_a_1.txt"]
    # MLX's own modules, sources, paths: refused, the whole answer with them.
    for bad in ("binary_ops_float.ptx", "custom_kernel_a.cu", "../custom_kernel_a.ptx",
                "custom_kernel_a/b.ptx"):
        with pytest.raises(ValueError):
            mlx_prebuild.CachedModules.from_answer(answer(**{bad: b"x"}))
    with pytest.raises(ValueError):
        mlx_prebuild.CachedModules.from_answer({"files": {"custom_kernel_a.ptx": "not base64!"}})
    with pytest.raises(ValueError):
        mlx_prebuild.CachedModules.from_answer({"files": []})


def test_copying_into_the_accused_takes_module_files_only(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "custom_kernel_k_1.ptx").write_bytes(b"cubin")
    (src / "custom_kernel_k_1.txt").write_bytes(b"k\t_Zk\n")
    (src / "compiled_fused.ptx").write_bytes(b"not ours")
    (tmp_path / "secret").write_text("key")
    os.symlink(tmp_path / "secret", src / "custom_kernel_s.ptx")
    assert mlx_prebuild.copy_modules(str(src), str(dst)) == 2
    assert sorted(os.listdir(dst)) == ["custom_kernel_k_1.ptx", "custom_kernel_k_1.txt"]
    assert mlx_prebuild.copy_modules(str(tmp_path / "missing"), str(dst)) == 0


def test_a_spec_whose_counts_disagree_is_refused():
    base = {"name": "k", "input_names": ["a", "b"], "output_names": ["o"], "source": "",
            "input_dtypes": ["float16"], "input_ndims": [1, 1], "output_dtypes": ["float16"]}
    with pytest.raises(ValueError):
        mlx_prebuild.KernelSpec.from_json(base)
    with pytest.raises(ValueError):
        mlx_prebuild.KernelSpec.from_json({**base, "input_dtypes": ["float16", "float16"],
                                           "template": [["T", "string", "x"]]})


def test_a_build_ahead_leaves_modules_the_accused_loads_instead_of_compiling(
        tmp_path, fake_mx, monkeypatch, capfd):
    """End to end through both ops: the `build` op records and compiles in sandboxed steps of
    their own; the evaluation's accused finds every module in its cache directory."""
    monkeypatch.setattr(mlx_adapter, "_nvidia_gpu", lambda: True)
    source = textwrap.dedent(TEMPLATED)
    built = worker.execute(parse_request(_request(tmp_path, source, "build"), "build"))
    assert built["status"] == "passed", (built["status"], built.get("message"))
    note = built["build"]["prebuild"]
    # Three workloads (two f16 sizes and a bf16 one): three modules.
    assert note.get("kernels") == 3 and note.get("modules") == 3, note
    artifact = built["build"]["artifact"]
    assert len(os.listdir(mlx_adapter.prebuilt_dir(artifact))) == 6
    capfd.readouterr()

    r = worker.execute(parse_request(_request(tmp_path, source, "evaluate"), "evaluate"),
                       roofline_override=(1e15, 1e18))
    assert r["status"] == "passed", (r["status"], r["message"])
    assert r["diagnostics"]["mlx_modules_prebuilt"] == 6
    captured = capfd.readouterr()
    modules = [e for e in events(captured.out + captured.err) if e[0] == "module"]
    assert modules and all(e[2] == "cached" for e in modules), modules

    # Built again: the modules are there, nothing is recorded or compiled.
    again = worker.execute(parse_request(_request(tmp_path, source, "build"), "build"))
    assert again["build"]["prebuild"]["cached"] is True


def test_an_evaluation_without_a_build_ahead_compiles_in_the_accused(tmp_path, fake_mx, capfd):
    r = worker.execute(parse_request(_request(tmp_path, textwrap.dedent(TEMPLATED),
                                              "evaluate"), "evaluate"),
                       roofline_override=(1e15, 1e18))
    assert r["status"] == "passed", (r["status"], r["message"])
    assert r["diagnostics"]["mlx_modules_prebuilt"] == 0
    captured = capfd.readouterr()
    modules = [e for e in events(captured.out + captured.err) if e[0] == "module"]
    assert modules and all(e[2] == "compiled" for e in modules)


def test_a_build_without_an_nvidia_gpu_notes_why_it_compiled_nothing(tmp_path, fake_mx,
                                                                     monkeypatch):
    monkeypatch.setattr(mlx_adapter, "_nvidia_gpu", lambda: False)
    built = worker.execute(parse_request(_request(tmp_path, HONEST, "build"), "build"))
    assert built["status"] == "passed"
    assert "skipped" in built["build"]["prebuild"]
    assert json.dumps(built["build"]["prebuild"])
