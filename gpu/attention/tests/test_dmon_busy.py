"""gpu/dmon_busy.py, the driver-sampled busy fraction that gpu/default_run_check.sh prints
beside `ksearch show`'s."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dmon_busy  # noqa: E402

DMON = """\
#Time         gpu     sm    mem    enc    dec    jpg    ofa
#HH:MM:SS     Idx      %      %      %      %      %      %
 23:59:58       0     90      1      0      0      0      0
 23:59:59       0     10      1      0      0      0      0
 00:00:00       0     40      3      0      0      0      0
 00:00:01       0      -      -      -      -      -      -
 00:00:02       0     20      0      0      0      0      0
"""


def test_only_the_samples_inside_the_span_count_and_a_span_may_pass_midnight():
    lines = DMON.splitlines()
    start, end = dmon_busy.seconds("23:59:59"), dmon_busy.seconds("00:00:02")
    assert dmon_busy.samples(lines, start, end) == [10, 40, 20]
    same_day = dmon_busy.samples(lines, dmon_busy.seconds("23:59:58"),
                                 dmon_busy.seconds("23:59:58"))
    assert same_day == [90]


def test_the_summary_is_the_mean_and_says_when_there_is_nothing(tmp_path, capsys):
    f = tmp_path / "dmon.txt"
    f.write_text(DMON)
    assert dmon_busy.main(["x", str(f), "23:59:59", "00:00:02"]) == 0
    assert "23.3%" in capsys.readouterr().out
    assert dmon_busy.main(["x", str(f), "12:00:00", "12:00:05"]) == 1
    assert "no dmon samples" in capsys.readouterr().out


def test_samples_of_several_gpus_are_refused(tmp_path, capsys):
    two = DMON + " 00:00:02       1      0      0      0      0      0      0\n"
    f = tmp_path / "dmon.txt"
    f.write_text(two)
    assert dmon_busy.main(["x", str(f), "23:59:59", "00:00:02"]) == 1
    assert "samples of 2 GPUs" in capsys.readouterr().out
