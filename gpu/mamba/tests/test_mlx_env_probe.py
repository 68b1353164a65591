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
        # The median of three measurements, each in a child of its own.
        per_round = [m["compiled_us_per_op"] for m in r["rounds"]]
        assert len(per_round) == 3 and r["compiled_us_per_op"] == sorted(per_round)[1]
    picked = probe.best(list(rows.values()))
    assert result["best"] == picked["label"]
    printed = capsys.readouterr().out.split()
    assert printed == [f"{k}={v}" for k, v in picked["env"].items()]


def test_a_setting_that_fails_is_reported_and_never_picked():
    rows = [{"label": "a", "env": {}, "error": "exit code 1"},
            {"label": "b", "env": {"X": "1"}, "compiled_us_per_op": 9.0},
            {"label": "c", "env": {}, "compiled_us_per_op": 4.0}]
    assert probe.best(rows)["label"] == "c"
    assert probe.best(rows[:1]) is None
    # Within the margin of the cheapest, the setting listed first (MLX's defaults) stays.
    close = [{"label": "d", "env": {}, "compiled_us_per_op": 10.2},
             {"label": "e", "env": {}, "compiled_us_per_op": 10.0}]
    assert probe.best(close)["label"] == "d"
    assert probe.best(close, margin=0.0)["label"] == "e"
    row = probe.measure("slow", {}, ops=5, reps=1, timeout=0.001)
    assert "timed out" in row["error"]


def test_unknown_labels_are_refused():
    with pytest.raises(SystemExit):
        probe.main(["--only", "warp-speed"])


def test_rounds_are_interleaved_and_a_failed_setting_is_not_measured_again(monkeypatch, tmp_path):
    order = []
    figures = {"defaults": iter([10.0, 14.0, 10.3]), "graph-5": iter([9.0, 10.1, 10.2]),
               "graph-100": iter([20.0, 21.0, 19.0])}

    def fake(label, env, ops, reps, timeout):
        order.append(label)
        if label == "no-graphs":
            return {"label": label, "env": env, "error": "exit code 1"}
        c = next(figures[label])
        return {"label": label, "env": env, "compiled_us_per_op": c, "eager_us_per_op": 2 * c}

    monkeypatch.setattr(probe, "measure", fake)
    out = tmp_path / "probe.json"
    assert probe.main(["--only", "defaults,no-graphs,graph-100,graph-5", "--json",
                       str(out)]) == 0
    # Each round starts one setting later (SETTINGS order); the failed one drops out.
    assert order == ["defaults", "no-graphs", "graph-100", "graph-5",
                     "graph-100", "graph-5", "defaults",
                     "graph-100", "graph-5", "defaults"]
    result = json.loads(out.read_text())
    rows = {r["label"]: r for r in result["rows"]}
    assert rows["defaults"]["compiled_us_per_op"] == 10.3
    assert rows["defaults"]["compiled_us_range"] == [10.0, 14.0]
    assert rows["graph-5"]["compiled_us_per_op"] == 10.1
    assert "error" in rows["no-graphs"] and len(rows["no-graphs"]["rounds"]) == 1
    # graph-5's median is 2% under the defaults': inside the margin, so the defaults stay,
    # where its single fastest draw (9.0 against 10.0) would have picked it.
    assert result["best"] == "defaults" and result["rounds"] == 3
