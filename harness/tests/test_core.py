"""Unit tests of the backend-neutral pieces: comparisons, dtypes, seeds, statistics, request
validation."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import driver
from ksearch_harness import dtypes
from ksearch_harness.core import close, compare, geomean, roofline, stats
from ksearch_harness.protocol import (TaskError, Tolerance, Workload, encode_result,
                                      parse_request)
from ksearch_harness.task_code import derive_seed


def test_tolerance_is_scaled_by_the_largest_reference_value():
    truth = np.array([100.0, 1.0, 0.0])
    tol = Tolerance(rtol=0.0, atol=1e-3)
    assert close(truth + 0.099, truth, truth, tol).all()  # 0.099 <= 1e-3 * 100
    assert not close(truth + 0.101, truth, truth, tol).all()


def test_relative_part_uses_each_element():
    truth = np.array([100.0, 1.0])
    tol = Tolerance(rtol=1e-2, atol=0.0)
    assert close(np.array([100.9, 1.009]), truth, truth, tol).all()
    assert not close(np.array([100.0, 1.02]), truth, truth, tol).all()


def test_nan_and_inf_handling():
    truth = np.array([1.0, np.inf, np.nan])
    tol = Tolerance(1e-3, 1e-3)
    assert close(np.array([1.0, np.inf, np.nan]), truth, truth, tol).all()
    assert not close(np.array([np.nan, np.inf, np.nan]), truth, truth, tol)[0]
    assert not close(np.array([1.0, 1e300, np.nan]), truth, truth, tol)[1]
    assert not close(np.array([1.0, np.inf, 0.0]), truth, truth, tol)[2]
    c = compare(np.array([np.nan, np.inf, np.nan]), truth, tol)
    assert not c.ok and math.isnan(c.max_abs)


def test_compare_reports_errors():
    truth = np.array([2.0, 4.0])
    c = compare(np.array([2.0, 4.4]), truth, Tolerance(1e-5, 1e-5))
    assert not c.ok and math.isclose(c.max_abs, 0.4) and math.isclose(c.max_rel, 0.1)


def test_either_rule_fails_an_element_only_when_both_errors_exceed_their_bounds():
    # FlashInfer-Bench's rule: atol is absolute, and an element within either bound passes.
    truth = np.array([100.0, 1e-3, 0.0])
    tol = Tolerance(rtol=1e-2, atol=1e-2, rule="either")
    assert close(np.array([100.9, 1e-3 + 0.009, 0.0099]), truth, truth, tol).all()
    got = close(np.array([101.5, 0.02, 0.02]), truth, truth, tol)
    assert list(got) == [False, False, False]
    # The scaled rule on the same numbers: atol scaled by max|truth| = 100 lets all pass.
    assert close(np.array([101.5, 0.02, 0.02]), truth, truth,
                 Tolerance(rtol=1e-2, atol=1e-2)).all()


def test_a_matched_ratio_lets_a_few_elements_miss_but_never_a_nan():
    truth = np.arange(1.0, 21.0)
    tol = Tolerance(rtol=1e-2, atol=1e-2, rule="either", matched_ratio=0.95)
    one_off = truth.copy()
    one_off[3] += 5.0
    assert compare(one_off, truth, tol).ok  # 19 of 20 elements: 95%
    two_off = one_off.copy()
    two_off[7] += 5.0
    c = compare(two_off, truth, tol)
    assert not c.ok and math.isclose(c.max_abs, 5.0)
    with_nan = truth.copy()
    with_nan[0] = np.nan
    assert not compare(with_nan, truth, tol).ok
    # A ratio works under the scaled rule too.
    assert compare(one_off, truth, Tolerance(1e-5, 1e-5, matched_ratio=0.95)).ok
    assert not compare(one_off, truth, Tolerance(1e-5, 1e-5)).ok


def test_the_request_carries_the_rule_and_ratio(tmp_path):
    raw = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    raw["tolerance"]["f32"].update(rule="either", matched_ratio=0.9)
    req = parse_request(raw, "evaluate")
    assert req.tolerance["f32"] == Tolerance(2e-5, 1e-5, "either", 0.9)
    for field, value, needle in [("rule", "loose", "must be one of"),
                                 ("matched_ratio", 0.0, "must be in (0, 1]")]:
        bad = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
        bad["tolerance"]["f32"][field] = value
        with pytest.raises(TaskError, match=re.escape(needle)):
            parse_request(bad, "evaluate")


@pytest.mark.parametrize("name", sorted(dtypes.DTYPES))
def test_poison_patterns_are_distinct_and_detectable(name):
    dt = dtypes.get(name)
    a, b = dt.poison((3, 2), "a"), dt.poison((3, 2), "b")
    assert a.dtype == dt.storage and a.shape == (3, 2)
    assert dt.poison_mask(a, "a").all() and not dt.poison_mask(a, "b").any()
    assert dt.poison_mask(b, "b").all()
    if dt.is_float:
        assert np.isnan(dt.decode(a)).all() and np.isnan(dt.decode(b)).all()
        computed_nan = dt.encode(np.array([np.nan, np.inf - np.inf]))
        assert not dt.poison_mask(computed_nan, "a").any()


def test_bf16_rounds_to_nearest_even():
    bf = dtypes.get("bf16")
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 3.0e38], dtype=np.float32)
    got = bf.decode(bf.encode(x))
    assert list(got[:4]) == [1.0, 1.0, 1.0 + 2**-6, -2.5]
    assert abs(got[4] - 3.0e38) / 3.0e38 < 2**-8


def test_derived_seeds_are_stable_and_distinct():
    a = derive_seed(123, 0, 1)
    assert a == derive_seed(123, 0, 1)
    others = {derive_seed(123, 0, 2), derive_seed(123, 1, 1), derive_seed(124, 0, 1),
              derive_seed(123, 0, 1, 0)}
    assert a not in others and len(others) == 4
    assert 0 <= a < 2**63


def test_stats_and_geomean():
    s = stats([5, 1, 3, 2, 4])
    assert s["median"] == 3 and s["p10"] < s["median"] < s["p90"]
    assert stats([])["median"] is None
    assert math.isclose(geomean([2.0, 8.0]), 4.0)
    assert geomean([2.0, None]) is None and geomean([]) is None


def test_roofline_floor_and_slack():
    wl = Workload("w", False, {}, (), (), flops=4e9, bytes=8e9)
    floor, ideal = roofline(wl, bandwidth=8e9, peak=1e9)  # 1 s of bytes, 4 s of flops
    assert math.isclose(ideal, 4e9)
    assert math.isclose(floor, max(1e9 / 4, 4e9 / 2))
    assert roofline(Workload("w", False, {}, (), (), 0.0, 0.0), 1e9, 1e9) == (0.0, 0.0)


def test_parse_request_builds_typed_fields(tmp_path):
    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path),
                        "evaluate")
    assert req.nonce == driver.NONCE and req.trials == 2 and req.timing.warmup == 1
    assert req.workloads[2].held_out and req.workloads[0].inputs[0].shape == (8, 64)
    assert req.task.entry.args == ("x", "y", "rows", "cols")
    assert req.tolerance["f32"] == Tolerance(2e-5, 1e-5)


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.update(secret_seed=-1), "secret_seed"),
    (lambda r: r.update(secret_seed="12"), "secret_seed: expected an integer"),
    (lambda r: r.update(build_dir="relative/dir"), "build_dir"),
    (lambda r: r["workloads"][0].update(params={"rows": [1]}), "params.rows"),
    (lambda r: r["workloads"][0]["inputs"][0].update(shape=[8, 0]), "shape[1]"),
    (lambda r: r["workloads"][0]["inputs"][0].update(dist={"kind": "zipf"}), "zipf"),
    (lambda r: r["workloads"].append(dict(r["workloads"][0])), "duplicate"),
    (lambda r: r.update(timing={"min_reps": 5, "max_reps": 2}), "max_reps"),
    (lambda r: r.update(tolerance={"f33": {"rtol": 1, "atol": 1}}), "tolerance.f33"),
    (lambda r: r["candidate"].update(language="fortran"), "fortran"),
    (lambda r: r.update(workloads=[]), "workloads: empty"),
    (lambda r: r.update(timeout_s=0), "timeout_s"),
])
def test_parse_request_rejects(tmp_path, mutate, needle):
    raw = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
    mutate(raw)
    with pytest.raises(TaskError) as e:
        parse_request(raw, "evaluate")
    assert needle in e.value.message


def test_results_are_strict_json():
    line = encode_result({"a": float("nan"), "b": np.float32(1.5), "c": [np.int64(2)],
                          "d": float("inf")})
    assert line == b'{"a":null,"b":1.5,"c":[2],"d":null}\n'
