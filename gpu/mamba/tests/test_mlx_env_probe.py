"""mlx_env_probe: each MLX launch setting measured in its own process, the cheapest named."""

import json

import pytest

mx = pytest.importorskip("mlx.core", reason="mlx measures its own launch cost")
import mlx_env_probe as probe  # noqa: E402


def test_probe_measures_each_setting_in_a_child_and_picks_the_cheapest(tmp_path, capsys):
    out = tmp_path / "probe.json"
    rc = probe.main(["--only", "defaults,graph-5", "--ops", "5", "--reps", "1", "--json",
                     str(out), "--print-best"])
    assert rc == 0
    result = json.loads(out.read_text())
    rows = {r["label"]: r for r in result["rows"]}
    assert set(rows) == {"defaults", "graph-5"}
    assert rows["graph-5"]["env"] == {"MLX_MAX_OPS_PER_BUFFER": "5"}
    for r in rows.values():
        assert r["compiled_us_per_op"] > 0 and r["eager_us_per_op"] > 0, r
    cheapest = min(rows.values(), key=lambda r: r["compiled_us_per_op"])
    assert result["best"] == cheapest["label"]
    printed = capsys.readouterr().out.split()
    assert printed == [f"{k}={v}" for k, v in cheapest["env"].items()]


def test_a_setting_that_fails_is_reported_and_never_picked():
    rows = [{"label": "a", "env": {}, "error": "exit code 1"},
            {"label": "b", "env": {"X": "1"}, "compiled_us_per_op": 9.0},
            {"label": "c", "env": {}, "compiled_us_per_op": 4.0}]
    assert probe.best(rows)["label"] == "c"
    assert probe.best(rows[:1]) is None
    row = probe.measure("slow", {}, ops=5, reps=1, timeout=0.001)
    assert "timed out" in row["error"]


def test_unknown_labels_are_refused():
    with pytest.raises(SystemExit):
        probe.main(["--only", "warp-speed"])
