"""bench_report folds several `ksearch bench mamba --save` reports into medians and spreads."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_report  # noqa: E402


def report(p512: float, decode: float, us: float, env: dict, passed: bool = True,
           floor: float = 10.0) -> dict:
    return {"rows": [{"impl": "ksearch", "prefill_tok_s": {"512": p512, "4096": 2 * p512},
                      "decode_tok_s": decode},
                     {"impl": "mlx-lm", "prefill_tok_s": {"512": 1.0}}],
            "kernel_only": [{"L": 512, "us_per_layer": us, "floor_us": floor,
                             "fraction_of_floor": floor / us}],
            "kernel": {"source": "tuned", "tuning": {"picks": {"512": "staged_l16_t256"}},
                       "decode_path": "one kernel",
                       "decode_tuning": {"pick": "model",
                                         "tok_s": {"model": 812.4, "layer": 330.0}}},
            "check": {"passed": passed}, "versions": {"mlx_env": env}}


def test_runs_fold_into_median_and_spread_of_our_rows_only():
    f = bench_report.fold([report(40_000, 270, 50, {}),
                           report(50_000, 250, 40, {"MLX_USE_CUDA_GRAPHS": "0"}),
                           report(45_000, 260, 45, {}, passed=False)])
    assert f["prefill"]["512"] == [40_000, 50_000, 45_000]
    text = bench_report.table(f)
    assert "| prefill L=512, tok/s | 45,000 (40,000–50,000, 25%) |" in text
    assert "| decode, tok/s | 260.0 (250.0–270.0, 8%) |" in text
    assert "| scan alone L=512, share of the floor (best pass) | 22.2% (20.0%–25.0%, 25%) |" in text
    assert "MLX_USE_CUDA_GRAPHS=0" in text and "MLX's defaults" in text
    assert "FAILED" in text
    assert "| model (one kernel) | model 812, layer 330 |" in text


def test_the_scan_is_set_against_the_floor_of_the_best_bandwidth_pass():
    # The second run's bandwidth pass read half: its own floor doubled, its scan did not move.
    f = bench_report.fold([report(40_000, 270, 50, {}),
                           report(50_000, 250, 40, {}, floor=20.0),
                           report(45_000, 260, 45, {})])
    assert f["scan_floor"][512] == [10.0 / 50, 10.0 / 40, 10.0 / 45]
    assert ("| scan alone L=512, share of the floor (best pass) | 22.2% (20.0%–25.0%, 25%) |"
            in bench_report.table(f))
