"""shapes_report folds several `ksearch bench attention --json` reports into medians and spreads."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import shapes_report  # noqa: E402


def report(backend: str, kernel_ms: float, sdpa_ratio: float, correct: bool = True) -> dict:
    params = {"B": 1, "H": 32, "L": 4096, "D": 128, "causal": 0, "dtype": "f16"}
    return {"backend": backend, "kernel": "k.cu", "gpu": "H200", "workloads": [{
        "name": "x", "params": params, "contenders": {
            "kernel": {"median_ms": kernel_ms, "tflops": 100.0 / kernel_ms, "correct": correct},
            "sdpa": {"median_ms": kernel_ms * sdpa_ratio, "ratio": sdpa_ratio},
        }}]}


def test_runs_fold_into_median_and_range_per_shape(tmp_path):
    paths = []
    for i, (ms, r) in enumerate([(0.5, 1.0), (0.4, 1.2), (0.6, 0.9)]):
        p = tmp_path / f"cuda-{i}.json"
        p.write_text(json.dumps(report("cuda", ms, r)))
        paths.append(p)
    folded = shapes_report.fold(paths)
    shape = folded["cuda"]["shapes"]["B1 H32 L4096 D128 f16 non-causal"]
    assert folded["cuda"]["runs"] == 3
    assert sorted(shape["ms"]) == [0.4, 0.5, 0.6]
    text = shapes_report.table(folded)
    assert "| B1 H32 L4096 D128 f16 non-causal | 0.5 (0.4–0.6) |" in text
    assert "× sdpa 1.000 over 1 shapes" in text


def test_a_wrong_kernel_counts_as_a_failed_run_not_a_time(tmp_path):
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps(report("mlx", 0.5, 1.1)))
    bad.write_text(json.dumps(report("mlx", 0.1, 5.0, correct=False)))
    shape = shapes_report.fold([good, bad])["mlx"]["shapes"]["B1 H32 L4096 D128 f16 non-causal"]
    assert shape["ms"] == [0.5] and shape["failed"] == [1.0]
