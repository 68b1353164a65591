"""Honest kernels pass, with a complete result: timings, seeds, environment, build record."""

from __future__ import annotations

import math

import numpy as np

import pytest

import driver


@pytest.fixture(scope="module")
def honest_runs(tmp_path_factory):
    runs = {}
    for name in ("naive.c", "optimised.c", "threads_joined.c"):
        d = tmp_path_factory.mktemp(name[:-2])
        runs[name] = driver.run_harness("evaluate",
                                        driver.softmax_request(driver.HONEST / name, d))
    return runs


@pytest.mark.parametrize("name", ["naive.c", "optimised.c", "threads_joined.c"])
def test_honest_kernel_passes(honest_runs, name):
    res = honest_runs[name].result
    assert res["status"] == "passed", res["message"]
    assert res["violation"] is None
    assert res["nonce"] == driver.NONCE
    assert res["score"] is not None and res["score"] > 0
    by_name = {w["name"]: w for w in res["workloads"]}
    assert set(by_name) == {"r8c64", "r13c200", "r7c333"}
    for w in res["workloads"]:
        assert w["correct"] is True
        assert w["max_abs_err"] < 1e-5
    held = by_name["r7c333"]
    assert held["held_out"] and held.get("candidate_median_ns") is None
    timing = driver.softmax_request(None, "/x")["timing"]
    speedups = []
    for name_ in ("r8c64", "r13c200"):
        w = by_name[name_]
        n = len(w["candidate_ns"])
        assert timing["min_reps"] <= n <= timing["max_reps"]
        assert len(w["reference_ns"]) == n == len(w["baseline_ns"])
        assert all(s > 0 for s in w["candidate_ns"])
        assert w["candidate_p10_ns"] <= w["candidate_median_ns"] <= w["candidate_p90_ns"]
        # A median of ratios paired within each repetition (intervals.py).
        paired = [b / c for b, c in zip(w["baseline_ns"], w["candidate_ns"])]
        assert math.isclose(w["speedup_vs_baseline"], float(np.median(paired)))
        lo, hi = w["speedup_interval"]
        assert lo <= w["speedup_vs_baseline"] <= hi
        assert 0 < w["floor_ns"] < w["candidate_median_ns"]
        assert 0 < w["roofline_fraction"] < 1
        speedups.append(w["speedup_vs_baseline"])
    assert math.isclose(res["score"], math.sqrt(speedups[0] * speedups[1]))


def test_result_records_environment_build_and_seeds(honest_runs):
    res = honest_runs["naive.c"].result
    env = res["environment"]
    for key in ("cpu_model", "cores", "python", "numpy", "compiler", "hostname",
                "mem_bandwidth_gbs", "peak_gflops"):
        assert env.get(key), key
    build = res["build"]
    assert build["command"][0] and "-O3" in build["command"] and "-fopenmp" in build["command"]
    assert "-march=native" in build["command"] and "-std=c11" in build["command"]
    assert build["compiler"] and build["seconds"] >= 0
    seeds = res["seeds"]
    assert seeds["secret_seed"] == driver.SECRET_SEED
    assert len(seeds["trial_seeds"]) == 2 and len(set(seeds["trial_seeds"])) == 2
    for wl in ("r8c64", "r13c200"):
        n = len(res["workloads"][0]["candidate_ns"]) if wl == "r8c64" else \
            len(res["workloads"][1]["candidate_ns"])
        # warm-up seeds first, then one per timed repetition
        assert len(seeds["timing_seeds"][wl]) == n + 1
    assert "r7c333" not in seeds["timing_seeds"]
    assert res["diagnostics"]["candidate_calls"] >= 18
    phases = res["diagnostics"]["phase_seconds"]
    for key in ("task", "build", "inputs", "reference", "upload", "candidate", "checks",
                "timed_calls", "total"):
        assert phases[key] >= 0, key
    assert phases["timed_calls"] > 0 and phases["candidate"] > 0
    assert sum(v for k, v in phases.items() if k != "total") <= phases["total"] + 1e-3


def test_diagnostics_survive_a_failed_check(tmp_path):
    res = driver.run_harness("evaluate", driver.softmax_request(
        driver.CHEATS / "mutates_input.c", tmp_path)).result
    assert res["status"] == "integrity_violation"
    diag = res["diagnostics"]
    assert diag["candidate_calls"] >= 1  # counted up to the verdict, not only up to the load
    assert diag["phase_seconds"]["candidate"] > 0


def test_the_judges_threads_are_not_the_candidates(tmp_path):
    """The judge's worker pool lives in the judge; the accused process the candidate runs in
    has its own threads only, whatever size the pool is."""
    counts = {}
    for n in (1, 4):
        res = driver.run_harness("evaluate", driver.softmax_request(
            driver.HONEST / "naive.c", tmp_path / str(n)),
            env={"KSEARCH_HARNESS_THREADS": str(n)}).result
        assert res["status"] == "passed", res["message"]
        diag = res["diagnostics"]
        assert diag["threads_max_after_call"] == diag["threads_before_first_call"]
        counts[n] = diag["threads_before_first_call"]
    assert counts[4] == counts[1]


def test_seeds_are_derived_from_the_secret(honest_runs, tmp_path):
    first = honest_runs["naive.c"].result["seeds"]
    again = driver.run_harness("check-task", driver.softmax_request(
        None, tmp_path, op="check-task")).result["seeds"]
    assert again["trial_seeds"] == first["trial_seeds"]
    other = driver.run_harness("check-task", driver.softmax_request(
        None, tmp_path, op="check-task", secret_seed=7)).result["seeds"]
    assert set(other["trial_seeds"]).isdisjoint(first["trial_seeds"])


def test_custom_distribution_and_cpp(tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text((driver.HONEST / "naive.c").read_text().replace(
        "void softmax_f32", 'extern "C" void softmax_f32'))
    req = driver.softmax_request(src, tmp_path / "b")
    req["candidate"]["language"] = "c++"
    for w in req["workloads"]:
        w["inputs"][0]["dist"] = {"kind": "custom"}  # make_x: outliers of +90
    res = driver.run_harness("evaluate", req).result
    assert res["status"] == "passed", res["message"]
    assert "-std=c++17" in res["build"]["command"]
