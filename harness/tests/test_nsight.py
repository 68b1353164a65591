"""ksearch_harness.nsight: ncu's raw CSV page read into the counters ksearch interprets.

The fixture is ncu 2025.3.1's raw page for a PyTorch program on the H200 (one fill kernel, then
two cuBLAS half-precision 4096x4096 matmuls), recorded with this module's metrics of that time
and cut to the columns the module reads.
"""
from pathlib import Path

import pytest

from ksearch_harness import nsight

FIXTURE = Path(__file__).parent / "fixtures" / "nsight" / "h200-torch-randn-and-matmul-raw.csv"


def launches():
    return nsight.parse_raw_csv("==PROF== Connected to process 4388\n" + FIXTURE.read_text())


def test_every_launch_is_read_with_its_numbers_and_the_units_row_is_not_a_launch():
    ls = launches()
    assert len(ls) == 3
    assert ls[0]["kernel"].startswith("void at::<unnamed>::distribution_elementwise")
    assert [l["kernel"] for l in ls[1:]] == ["nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"] * 2
    # Thousands separators are dropped.
    assert ls[1][nsight.METRICS["dram_bytes"]] == 111_251_968
    assert ls[1][nsight.TIME] == 220_928
    assert ls[1][nsight.METRICS["registers"]] == 168
    # Metrics the page does not have are absent, not zero.
    assert nsight.LIMITS["registers"] not in ls[1]


def test_the_candidates_launches_are_reduced_and_the_others_ignored():
    c = nsight.reduce(launches(), lambda k: k.startswith("nvjet"))
    assert c["launches"] == 2
    # cuBLAS's tensor-core matmul: the SM and the tensor pipe busy, DRAM barely.
    w1, w2 = 220_928, 224_576
    assert c["compute_pct"] == pytest.approx((90.34 * w1 + 90.52 * w2) / (w1 + w2))
    assert c["tensor_pct"] == pytest.approx((95.26 * w1 + 95.28 * w2) / (w1 + w2))
    assert c["dram_pct"] == pytest.approx((10.47 * w1 + 10.37 * w2) / (w1 + w2))
    assert c["occupancy_pct"] == pytest.approx(14.63)
    assert c["registers"] == 168
    assert c["dram_bytes"] == 111_251_968 + 112_026_624
    assert "occupancy_limiter" not in c
    fill = nsight.reduce(launches(), lambda k: "distribution" in k)
    assert (fill["launches"], fill["registers"]) == (1, 44)
    assert fill["compute_pct"] == pytest.approx(73.07)
    assert nsight.reduce(launches(), lambda k: False) == {}


def test_the_occupancy_limiter_is_the_smallest_limit_of_the_longest_launch():
    def launch(time, regs, smem):
        return {"kernel": "k", nsight.TIME: time, nsight.LIMITS["registers"]: regs,
                nsight.LIMITS["shared memory"]: smem, nsight.LIMITS["warps"]: 8.0,
                nsight.LIMITS["blocks"]: 32.0}
    c = nsight.reduce([launch(1.0, 1.0, 4.0), launch(9.0, 3.0, 2.0)], lambda k: True)
    assert c["occupancy_limiter"] == "shared memory"
    c = nsight.reduce([launch(9.0, 1.0, 4.0), launch(1.0, 3.0, 2.0)], lambda k: True)
    assert c["occupancy_limiter"] == "registers"


def test_output_without_the_raw_page_is_an_error():
    with pytest.raises(nsight.NsightError):
        nsight.parse_raw_csv("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")


def test_the_command_collects_every_metric_into_the_log_file():
    cmd = nsight.command("/usr/local/cuda/bin/ncu", "/tmp/x.csv", ["python3", "run.py"],
                         kernel_regex="attn_.*")
    assert cmd[0] == "/usr/local/cuda/bin/ncu" and cmd[-2:] == ["python3", "run.py"]
    assert cmd[cmd.index("--log-file") + 1] == "/tmp/x.csv"
    assert set(cmd[cmd.index("--metrics") + 1].split(",")) == set(nsight.ALL_METRICS)
    assert cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:attn_.*"
    assert "--kernel-name" not in nsight.command("ncu", "l", ["a"])
    assert "--profile-from-start" not in cmd
    later = nsight.command("ncu", "l", ["a"], from_start=False)
    assert later[later.index("--profile-from-start") + 1] == "off" and later[-1] == "a"


def test_scaled_units_are_refused_and_a_second_page_is_read_with_its_own_columns():
    text = FIXTURE.read_text()
    scaled = text.replace('"","","","","byte",', '"","","","","Mbyte",', 1)
    with pytest.raises(nsight.NsightError, match="base units"):
        nsight.parse_raw_csv(scaled)
    # A second page whose columns come in another order.
    second = ('"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread"\n'
              '"","","ns","register/thread"\n"3","k2","1,000","32"\n')
    ls = nsight.parse_raw_csv(text + "==PROF== Disconnected\n" + second)
    assert len(ls) == 4
    assert (ls[3]["kernel"], ls[3][nsight.TIME], ls[3][nsight.METRICS["registers"]]) == ("k2", 1000, 32)
    assert nsight.METRICS["dram_bytes"] not in ls[3]


STALLS = Path(__file__).parent / "fixtures" / "nsight" / "h200-torch-matmul-stalls-raw.csv"


def test_the_top_stall_reasons_are_shares_of_all_stall_cycles():
    # The same cuBLAS matmul, profiled for the warp-state metrics (ncu 2025.3.1 on the H200): a
    # warp waits 6.02 cycles per issued instruction at barriers, 3.79 on the wgmma pipe and
    # 3.38 on long scoreboard, of 18.38 cycles of stalls in all.
    c = nsight.reduce(nsight.parse_raw_csv(STALLS.read_text()), lambda k: k.startswith("nvjet"))
    assert [name for name, _ in c["stalls"]] == ["barrier", "gmma", "long scoreboard"]
    assert [share for _, share in c["stalls"]] == pytest.approx([32.75, 20.62, 18.39], abs=0.01)


def test_stall_shares_are_weighted_by_time_and_absent_without_stall_metrics():
    def launch(time, long_scoreboard, barrier):
        return {"kernel": "k", nsight.TIME: time,
                nsight.STALLS["long scoreboard"]: long_scoreboard, nsight.STALLS["barrier"]: barrier}
    # The long launch waits on memory, the short one at barriers: memory leads.
    c = nsight.reduce([launch(9.0, 4.0, 0.0), launch(1.0, 0.0, 4.0)], lambda k: True)
    assert c["stalls"] == [["long scoreboard", pytest.approx(90.0)], ["barrier", pytest.approx(10.0)]]
    assert "stalls" not in nsight.reduce([{"kernel": "k", nsight.TIME: 1.0}], lambda k: True)
    assert "stalls" not in nsight.reduce([launch(1.0, 0.0, 0.0)], lambda k: True)
