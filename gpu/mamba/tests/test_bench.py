"""bench.py end to end on MLX's CPU backend with the tiny model: the JSON it writes has the shape
of the fixture the Rust renderer is snapshot-tested on, a task-entry candidate given with
--kernel is used, and a candidate whose output is wrong makes it refuse to report (exit 3)."""

import importlib.util
import json

import pytest

pytest.importorskip("mlx.core", reason="needs mlx (pip install 'mlx[cpu]==0.32.4')")
if importlib.util.find_spec("mlx_lm") is None:
    pytest.skip("needs mlx-lm (pip install --no-deps mlx-lm==0.32.2)", allow_module_level=True)

import bench  # noqa: E402
from conftest import HERE  # noqa: E402

FIXTURE = json.loads((HERE / "fixtures" / "bench_mamba.json").read_text())
QUICK = ["--config", "tiny", "--lengths", "8,20", "--decode-tokens", "3", "--decode-warmup", "1",
         "--decode-tune-tokens", "4", "--reps", "1", "--check-prompt", "12", "--check-steps", "2"]

HONEST = '''
import mlx.core as mx
import mamba_model


def selective_scan(*, u, delta, A, B, C, D, z, delta_bias, batch, dim, L, N, has_z, softplus):
    t = lambda v: mx.swapaxes(v, 1, 2)
    y, _ = mamba_model.MlxOpsScan()(t(u), t(delta), A, t(B), t(C), D, t(z), delta_bias, None)
    return t(y)
'''

ZEROS = '''
import mlx.core as mx


def selective_scan(*, u, delta, A, B, C, D, z, delta_bias, batch, dim, L, N, has_z, softplus):
    return mx.zeros(u.shape, dtype=u.dtype)
'''


def keys(d):
    return set(d) if isinstance(d, dict) else set()


def test_json_has_the_fixture_shape(tmp_path):
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--impls", "ksearch,mlx-lm", "--kernel-only", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["schema"] == FIXTURE["schema"] == bench.SCHEMA
    assert keys(got) == keys(FIXTURE)
    for part in ("model", "check", "targets"):
        assert keys(got[part]) == keys(FIXTURE[part]), part
    assert keys(got["kernel"]) <= keys(FIXTURE["kernel"]) | {"api", "scan"}
    assert [r["impl"] for r in got["rows"]] == ["ksearch", "mlx-lm"]
    for row in got["rows"]:
        assert keys(row) == keys(FIXTURE["rows"][0])
        assert set(row["prefill_tok_s"]) == {"8", "20"} and row["decode_tok_s"] > 0
        # The raw seconds behind every rate: prefill runs per length, one entry per decode step.
        raw = row["samples"]
        assert raw["seed"] == 0 and set(raw["prefill_s"]) == {"8", "20"}
        assert len(raw["decode_step_s"]) == 3
        assert abs(3 / sum(raw["decode_step_s"]) - row["decode_tok_s"]) < 1e-6 * row["decode_tok_s"]
        assert "decode loop: pipelined" in row["notes"]
    assert keys(got["kernel_only"][0]) == keys(FIXTURE["kernel_only"][0])
    assert got["check"]["passed"] and got["kernel"]["source"] == "mlx-ops"


def test_a_task_entry_candidate_is_benched(tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(HONEST)
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--impls", "ksearch", "--kernel", str(cand), "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["kernel"]["api"] == "task-entry" and got["check"]["passed"]


def test_wrong_logits_are_not_reported(tmp_path):
    cand = tmp_path / "zeros.py"
    cand.write_text(ZEROS)
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--kernel", str(cand), "--out", str(out)]) == 3
    got = json.loads(out.read_text())
    assert not got["check"]["passed"] and got["rows"] == []


def test_auto_model_kernels_fall_back_when_they_fail(tmp_path, monkeypatch):
    """On a CUDA device `--model-kernels auto` tries the whole-model and the per-block
    one-kernel decodes, the four-kernel decode, then the conv and step kernels, then mlx-lm's
    ops; a path whose kernels raise gives way and is recorded."""
    import mamba_model as mm

    class Broken:
        def __getattr__(self, name):
            def fail(*args, **kw):
                raise RuntimeError(f"{name}: NVRTC said no")
            return fail

    monkeypatch.setattr(bench.mx.cuda, "is_available", lambda: True)
    loads = []

    def load():
        # The first load fails outright (as an import that NVRTC or MLX refuses would), the
        # second gives kernels that raise when called.
        loads.append(1)
        if len(loads) == 1:
            raise ImportError("cannot build the kernel module")
        return Broken()

    monkeypatch.setattr(mm, "model_kernels", load)
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--impls", "ksearch", "--ops-scan", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [f["mode"] for f in got["kernel"]["fallbacks"]] == ["model", "layer", "fused", "conv"]
    assert "cannot build the kernel module" in got["kernel"]["fallbacks"][0]["problem"]
    assert all("NVRTC said no" in f["problem"] for f in got["kernel"]["fallbacks"][1:])
    assert got["kernel"]["decode_path"] == "mlx-lm ops" and got["check"]["passed"]
    assert got["rows"][0]["decode_tok_s"] > 0


def _emulated_cuda(monkeypatch, resident: int) -> None:
    """The bench as if MLX had a CUDA device, with model_kernels.py run by the CPU emulation
    on a GPU that holds `resident` blocks at once (0: any number)."""
    import emu
    import mamba_model as mm
    from emulated import EmulatedModelKernels

    if emu.compiler() is None:
        pytest.skip("no C++20 compiler for the CPU emulation")
    monkeypatch.setattr(bench.mx.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mm, "model_kernels", lambda: EmulatedModelKernels(resident))


@pytest.mark.parametrize("resident", [0, 2], ids=["grids-pass", "grids-time-out"])
def test_auto_times_every_decode_path_that_passes_and_uses_the_fastest(tmp_path, monkeypatch,
                                                                       resident):
    """`--model-kernels auto` with model_kernels.py run by the CPU emulation and a grid of 3
    blocks. When the emulated GPU holds all 3 blocks at once, the two one-launch paths (the
    whole model, one block) pass their checks and are timed beside the four-kernel and conv
    paths. When it holds 2, their barriers time out: the bench names that and times the other
    two. The path used is the fastest timed one, whatever its place in the order."""
    _emulated_cuda(monkeypatch, resident)
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--impls", "ksearch", "--ops-scan", "--layer-blocks", "3",
                               "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["check"]["passed"]
    assert got["rows"][0]["decode_tok_s"] > 0 and "error" not in got["rows"][0]
    tuning = got["kernel"]["decode_tuning"]
    timed = tuning["tok_s"]
    assert set(timed) == ({"fused", "conv"} if resident else {"model", "layer", "fused", "conv"})
    assert all(v > 0 for v in timed.values()) and tuning["rounds"] == 3
    assert all(lo <= timed[m] <= hi for m, (lo, hi) in tuning["tok_s_range"].items())
    # The first listed whose median is within the margin of the fastest.
    order = [m for m in ("model", "layer", "fused", "conv") if m in timed]
    fastest = max(timed.values())
    assert tuning["pick"] == next(m for m in order if timed[m] * 1.03 >= fastest)
    names = {"model": "one kernel per token", "layer": "one kernel per block",
             "fused": "four kernels per block", "conv": "conv and step kernels"}
    assert got["kernel"]["decode_path"] == names[tuning["pick"]]
    if resident:
        fallbacks = got["kernel"]["fallbacks"]
        assert [f["mode"] for f in fallbacks] == ["model", "layer"]
        for fallback in fallbacks:
            assert "GridBarrierTimeout" in fallback["problem"]
            assert "not all resident" in fallback["problem"]
    else:
        assert "fallbacks" not in got["kernel"]


def test_a_decode_path_that_fails_while_timed_drops_out(tmp_path, monkeypatch):
    """A path that passed its check but fails while its decode is timed (its barrier timing
    out, say) is recorded and left out; the fastest of the others is used."""
    _emulated_cuda(monkeypatch, 0)
    real = bench.time_decode_ours

    def flaky(fwd, *a, **k):
        if fwd.model.backbone.layers[0].mixer.ks_decode == "layer":
            raise RuntimeError("made-up failure while timing")
        return real(fwd, *a, **k)

    monkeypatch.setattr(bench, "time_decode_ours", flaky)
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--impls", "ksearch", "--ops-scan", "--layer-blocks", "3",
                               "--decode-tokens", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["kernel"]["decode_tuning"]["tok_s"]) == {"model", "fused", "conv"}
    (fallback,) = got["kernel"]["fallbacks"]
    assert fallback["mode"] == "layer" and "made-up failure" in fallback["problem"]


def test_decode_paths_are_timed_in_interleaved_rounds_and_picked_with_a_margin(tmp_path,
                                                                             monkeypatch):
    """Three rounds, each starting one path later; the pick is the first path listed whose
    median is within the margin of the fastest median. Here the first draws would pick
    `layer` (520 against 500) and the largest median too (518 against 510); `model`, listed
    first and within 3%, is the steady pick."""
    _emulated_cuda(monkeypatch, 0)
    draws = {"model": [500.0, 900.0, 510.0], "layer": [520.0, 515.0, 518.0],
             "fused": [300.0] * 3, "conv": [200.0] * 3}
    order = []

    def fake(fwd, *a, **k):
        m = ("model" if getattr(fwd.model, "ks_stack", None) is not None
             else fwd.model.backbone.layers[0].mixer.ks_decode)
        order.append(m)
        return (draws[m].pop(0) if draws[m] else 100.0), [0.01], []

    monkeypatch.setattr(bench, "time_decode_ours", fake)
    out = tmp_path / "b.json"
    assert bench.main(QUICK + ["--impls", "ksearch", "--ops-scan", "--layer-blocks", "3",
                               "--out", str(out)]) == 0
    tuning = json.loads(out.read_text())["kernel"]["decode_tuning"]
    assert order[:12] == ["model", "layer", "fused", "conv", "layer", "fused", "conv", "model",
                          "fused", "conv", "model", "layer"]
    assert tuning["tok_s"] == {"model": 510.0, "layer": 518.0, "fused": 300.0, "conv": 200.0}
    assert tuning["tok_s_range"]["model"] == [500.0, 900.0]
    assert tuning["pick"] == "model"


def test_the_decode_loops_feed_each_step_its_predecessor():
    """mlx_decode's two loops on a step whose output depends on its token and its state: the
    same sequence, the one computed by hand."""
    mx = bench.mx

    def step(tok, state):
        return (tok * 7 + state) % 251, state + 1

    want, tok, state = [], 5, 0
    for _ in range(6):
        tok, state = (tok * 7 + state) % 251, state + 1
        want.append(tok)
    for pipelined in (False, True):
        tok0 = mx.array([[5]])
        rate, steps, tokens = bench.mlx_decode(step, tok0, mx.array(0), 6, pipelined)
        assert tokens == want and len(steps) == 6 and rate > 0, pipelined


def test_pipelined_and_sync_decode_generate_the_same_tokens():
    """The pipelined loop (next step queued before this token is read) changes only when the
    host waits, not what is computed: both loops give the same greedy tokens, for our model
    and for stock mlx-lm, and the two models agree."""
    import mamba_model as mm

    stock = mm.build_stock(mm.TINY, seed=2, dtype=bench.mx.float32)
    fwd = bench.OursForward(mm.patched_copy(stock, mm.MlxOpsScan(chunk=16)))
    runs = {}
    for pipelined in (False, True):
        for name, fn in (("ours", lambda p: bench.time_decode_ours(fwd, 256, 10, 2, 6, 3, p)),
                         ("stock", lambda p: bench.time_decode_stock(stock, 256, 10, 2, 6, 3, p))):
            rate, steps, tokens = fn(pipelined)
            assert rate > 0 and len(steps) == len(tokens) == 6
            runs[(name, pipelined)] = tokens
    assert runs[("ours", False)] == runs[("ours", True)] == runs[("stock", True)]
    assert runs[("stock", False)] == runs[("stock", True)]


def test_the_bandwidth_pass_is_timed_after_a_warm_up(monkeypatch):
    events = []
    monkeypatch.setattr(bench, "warm_device",
                        lambda seconds, x: events.append(("warm", seconds, x.size)))
    real_eval = bench.mx.eval

    def recorded_eval(*arrays):
        events.append(("eval",))
        return real_eval(*arrays)

    monkeypatch.setattr(bench.mx, "eval", recorded_eval)
    gbs = bench.measure_bandwidth(warm_s=0.25, passes=3, mib=4)
    assert gbs > 0 and gbs != float("inf")
    # The input is made, then the device warmed on it, then the timed passes.
    assert events == [("eval",), ("warm", 0.25, (4 << 20) // 2), ("eval",), ("eval",),
                      ("eval",)]


def test_the_warm_up_keeps_the_device_working_for_its_time(monkeypatch):
    passes = []
    real_eval = bench.mx.eval
    monkeypatch.setattr(bench.mx, "eval", lambda *a: (passes.append(1), real_eval(*a))[1])
    started = bench.time.perf_counter()
    bench.warm_device(0.2, mib=1)
    assert bench.time.perf_counter() - started >= 0.2
    assert len(passes) >= 3  # the zeros, then passes until the time is up
