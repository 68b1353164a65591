"""The protocol around the checks: request validation, nonce, private result fd, stdin,
build / check-task / probe ops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import driver


def _task_error(run, needle: str):
    assert run.result is not None, run.stderr
    assert run.result["status"] == "task_error", run.result
    assert needle in run.result["message"], run.result["message"]
    return run.result


def test_invalid_json_is_a_task_error(tmp_path):
    res = _task_error(driver.run_harness("evaluate", b"{not json"), "not valid JSON")
    assert res["nonce"] is None and res["protocol"] == 1


def test_missing_nonce_is_a_task_error_without_nonce(tmp_path):
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    del req["nonce"]
    res = _task_error(driver.run_harness("evaluate", req), "nonce: missing")
    assert res["nonce"] is None


def test_bad_fields_name_their_path(tmp_path):
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    req["workloads"][1]["inputs"][0]["dtype"] = "f23"
    res = _task_error(driver.run_harness("evaluate", req), "workloads[1].inputs[0].dtype")
    assert res["nonce"] == driver.NONCE

    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path, protocol=2)
    _task_error(driver.run_harness("evaluate", req), "protocol")

    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    req["task"]["entry"]["args"] = ["x", "y", "rows", "depth"]
    _task_error(driver.run_harness("evaluate", req), "`depth`")

    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path, op="build")
    _task_error(driver.run_harness("evaluate", req), "started for `evaluate`")


def test_task_errors_from_reference_module(tmp_path):
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    req["task"]["reference"]["function"] = "no_such_function"
    _task_error(driver.run_harness("evaluate", req), "no_such_function")
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    req["workloads"][0]["outputs"][0]["shape"] = [8, 65]
    _task_error(driver.run_harness("evaluate", req), "shape")


def test_result_on_private_fd_while_candidate_prints_junk(tmp_path):
    run = driver.run_harness("evaluate", driver.softmax_request(driver.HONEST / "chatty.c",
                                                                tmp_path))
    assert run.result["status"] == "passed", run.result["message"]
    assert run.result["nonce"] == driver.NONCE
    assert run.stdout == "" and run.stderr == ""  # fd 1 and 2 went to the log
    assert '"nonce":"junk"' in run.result["log_tail"]
    assert "chatty kernel" in run.result["log_tail"]
    assert (tmp_path / "harness-evaluate.log").read_text().count("chatty kernel") >= 18


def test_stdin_is_closed_before_the_candidate_runs(tmp_path):
    src = tmp_path / "reader.c"
    src.write_text(
        (driver.HONEST / "naive.c").read_text()
        .replace("#include <math.h>", "#define _POSIX_C_SOURCE 200809L\n#include <math.h>\n"
                 "#include <stdio.h>\n#include <unistd.h>")
        .replace("for (int64_t r = 0; r < rows; r++) {",
                 "{ char b[256]; ssize_t n = read(0, b, sizeof b);\n"
                 "  fprintf(stderr, \"stdin gave %zd bytes\\n\", n); }\n"
                 "    for (int64_t r = 0; r < rows; r++) {", 1))
    run = driver.run_harness("evaluate", driver.softmax_request(src, tmp_path / "b"))
    assert run.result["status"] == "passed", run.result["message"]
    assert "stdin gave 0 bytes" in run.result["log_tail"]


def test_build_op_then_evaluate_reuses_the_artifact(tmp_path):
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path, op="build")
    res = driver.run_harness("build", req).result
    assert res["status"] == "passed", res["message"]
    artifact = res["build"]["artifact"]
    assert os.path.isfile(artifact) and artifact.startswith(str(tmp_path))
    assert res["build"]["cached"] is False
    ev = driver.run_harness("evaluate", driver.softmax_request(driver.HONEST / "naive.c",
                                                               tmp_path)).result
    assert ev["status"] == "passed"
    assert ev["build"]["cached"] is True and ev["build"]["artifact"] == artifact


def test_build_error_carries_the_compiler_log(tmp_path):
    src = tmp_path / "broken.c"
    src.write_text("void softmax_f32(const float* x) { return x; }\nint oops(\n")
    res = driver.run_harness("build", driver.softmax_request(src, tmp_path / "b",
                                                             op="build")).result
    assert res["status"] == "build_error"
    assert "error" in res["build"]["log"] and res["message"]


def test_build_op_runs_static_checks(tmp_path):
    res = driver.run_harness("build", driver.softmax_request(
        driver.CHEATS / "calls_reference.c", tmp_path, op="build")).result
    assert res["status"] == "static_check_failed"
    assert res["violation"]["class"] == "reference_call"


def test_missing_entry_symbol_is_a_build_error(tmp_path):
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    req["task"]["entry"]["symbol"] = "softmax_f64"
    res = driver.run_harness("evaluate", req).result
    assert res["status"] == "build_error" and "softmax_f64" in res["message"]


def test_check_task_accepts_a_sound_task(tmp_path):
    res = driver.run_harness("check-task", driver.softmax_request(
        None, tmp_path, op="check-task")).result
    assert res["status"] == "passed", res["message"]
    assert [w["name"] for w in res["workloads"]] == ["r8c64", "r13c200", "r7c333"]
    assert all(w["zero_output_rejected"] and w["constant_output_rejected"]
               and w["baseline_matches"] for w in res["workloads"])


def test_check_task_rejects_loose_tolerance_and_constant_task(tmp_path):
    loose = driver.softmax_request(None, tmp_path, op="check-task",
                                   tolerance={"f32": {"rtol": 0.0, "atol": 1.0}})
    res = _task_error(driver.run_harness("check-task", loose), "all-zero output passes")
    assert [w["zero_output_rejected"] for w in res["workloads"]] == [False] * 3
    const = driver.softmax_request(None, tmp_path, op="check-task",
                                   task_dir=driver.FIXTURES / "constant")
    const["task"]["baseline"] = None
    _task_error(driver.run_harness("check-task", const), "constant output")


def test_evaluate_refuses_a_broken_task_before_building(tmp_path):
    req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path,
                                 tolerance={"f32": {"rtol": 0.0, "atol": 1.0}})
    res = _task_error(driver.run_harness("evaluate", req), "sanity")
    assert res["build"] is None


def test_probe_never_fails():
    for payload in (b"", b"garbage",
                    json.dumps({"protocol": 1, "op": "probe", "nonce": "n1"}).encode()):
        run = driver.run_harness("probe", payload)
        res = run.result
        assert res["status"] == "passed"
        p = res["probe"]
        assert p["python"] and p["numpy"] and p["cores"] >= 1 and p["cpu_model"]
        assert "torch" in p and "mlx" in p and "nvcc" in p and isinstance(p["gpus"], list)
    assert res["nonce"] == "n1"


def test_probe_survives_a_broken_compiler():
    run = driver.run_harness("probe", b"", env={"CC": "/nonexistent/cc"})
    assert run.result["status"] == "passed" and run.result["probe"]["cc"] is None


def test_closed_result_fd_is_reported_on_stderr():
    proc = subprocess.run([sys.executable, "-m", "ksearch_harness", "probe",
                           "--result-fd", "97"], input=b"", capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(driver.HARNESS_DIR)})
    assert proc.returncode == 2 and b"not open" in proc.stderr


def test_a_passing_task_sanity_check_is_remembered_and_a_changed_task_checked_again(tmp_path):
    import shutil

    cache = tmp_path / "sanity"
    env = {"KSEARCH_HARNESS_SANITY_CACHE": str(cache)}

    def evaluate(task_dir, sub, **overrides):
        req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path / sub,
                                     task_dir=task_dir, **overrides)
        res = driver.run_harness("evaluate", req, env=env).result
        return res

    task = tmp_path / "task"
    shutil.copytree(driver.FIXTURES / "softmax", task)
    workloads = len(driver.SHOWN) + len(driver.HELD_OUT)
    first = evaluate(task, "a")
    assert first["status"] == "passed", first["message"]
    assert first["diagnostics"]["task_sanity_cached"] is False
    assert first["diagnostics"]["task_sanity_checked"] == workloads
    assert len(list(cache.glob("*.json"))) == workloads
    again = evaluate(task, "b")
    assert again["status"] == "passed" and again["diagnostics"]["task_sanity_cached"] is True
    assert again["diagnostics"]["task_sanity_checked"] == 0
    # Any change to the task's code is a new task.
    (task / "reference.py").write_text((task / "reference.py").read_text() + "\n# changed\n")
    changed = evaluate(task, "c")
    assert changed["diagnostics"]["task_sanity_cached"] is False
    # A failing check is never remembered: the broken task is refused every time.
    for sub in ("d", "e"):
        res = evaluate(task, sub, tolerance={"f32": {"rtol": 0.0, "atol": 1.0}})
        assert res["status"] == "task_error" and "sanity" in res["message"], res["message"]
    assert len(list(cache.glob("*.json"))) == 2 * workloads


def test_an_evaluation_of_more_workloads_checks_only_those_not_checked_before(tmp_path):
    """A winner's re-check adds the held-out workloads to those the search evaluated: the
    task sanity check runs for the added ones only."""
    env = {"KSEARCH_HARNESS_SANITY_CACHE": str(tmp_path / "sanity")}
    full = driver.softmax_request(driver.HONEST / "naive.c", tmp_path / "a")
    shown = [w for w in full["workloads"] if not w["held_out"]]
    some = driver.softmax_request(driver.HONEST / "naive.c", tmp_path / "a", workloads=shown)
    first = driver.run_harness("evaluate", some, env=env).result
    assert first["status"] == "passed", first["message"]
    assert first["diagnostics"]["task_sanity_checked"] == len(shown)
    more = driver.run_harness("evaluate", full, env=env).result
    assert more["status"] == "passed", more["message"]
    assert more["diagnostics"]["task_sanity_cached"] is False
    assert more["diagnostics"]["task_sanity_checked"] == len(full["workloads"]) - len(shown)


def test_sanity_cache_keys_skip_what_cannot_be_read_and_need_a_directory(tmp_path, monkeypatch):
    import shutil

    from ksearch_harness import sanity_cache

    task = tmp_path / "task"
    shutil.copytree(driver.FIXTURES / "softmax", task)
    raw = driver.softmax_request(None, tmp_path, task_dir=task)
    monkeypatch.delenv(sanity_cache.ENV, raising=False)
    assert sanity_cache.keys(raw, str(task)) is None  # no directory: nothing is computed
    monkeypatch.setenv(sanity_cache.ENV, str(tmp_path / "cache"))
    k = sanity_cache.keys(raw, str(task))
    assert k is not None and set(k) == {w["name"] for w in raw["workloads"]}
    assert len(set(k.values())) == len(k)  # one verdict per workload
    # An editor's lock file is a dangling link: skipped, the keys unchanged.
    (task / ".#reference.py").symlink_to(tmp_path / "nowhere")
    assert sanity_cache.keys(raw, str(task)) == k
    # Data files count, not only Python.
    (task / "table.bin").write_bytes(b"\x00\x01")
    changed = sanity_cache.keys(raw, str(task))
    assert changed is not None and not set(changed.values()) & set(k.values())
    # A workload keeps its key in a request of other workloads; without a name there is none.
    alone = sanity_cache.keys({**raw, "workloads": raw["workloads"][:1]}, str(task))
    first = raw["workloads"][0]["name"]
    assert alone == {first: changed[first]}
    nameless = [{k2: v for k2, v in raw["workloads"][0].items() if k2 != "name"}]
    assert sanity_cache.keys({**raw, "workloads": nameless}, str(task)) is None
    assert not sanity_cache.known_sane(None)
    sanity_cache.remember(None)
    assert not (tmp_path / "cache").exists()
