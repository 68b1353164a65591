"""The mlx adapter end to end through core.evaluate, on a numpy stand-in for `mlx.core`.

MLX is not installed in CI and the GPU is not ours to use, so `FakeMx` implements the slice of
the MLX API the adapter, the device helpers and the candidates below use (arrays with f16/bf16
/f32 dtypes, eval/synchronize, views, a `fast.cuda_kernel` whose kernels double their input).
What this proves is the adapter's glue under every check of core.py: uploads and read-back,
keyword calls, lazy-output and dtype rejection, kernel renaming, dialect checks, the registry
of device inputs for timed reference calls, and that result caching is still caught. The
behaviour of real MLX is checked by harness/tests/gpu_smoke.py on the device.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import driver
from ksearch_harness import dtypes, worker
from ksearch_harness.adapters import device
from ksearch_harness.protocol import parse_request


FAKE_MLX = Path(__file__).resolve().parent / "fake_mlx"


@pytest.fixture
def fake_mx(monkeypatch, tmp_path):
    """The fake MLX for the judge (this process) and for the accused (a child that finds it
    on PYTHONPATH). Its events, from both, are read back with `events()`."""
    for name in [m for m in sys.modules if m == "mlx" or m.startswith("mlx.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKE_MLX))
    path = os.pathsep.join([str(FAKE_MLX)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("KSEARCH_FAKE_MLX_EVENTS", "1")
    monkeypatch.setenv("KSEARCH_HARNESS_ACCUSED_ENV", "KSEARCH_FAKE_MLX_EVENTS")
    import mlx.core as mx
    yield mx
    device.deactivate()
    for name in [m for m in sys.modules if m == "mlx" or m.startswith("mlx.")]:
        del sys.modules[name]


@pytest.fixture
def judge_torch(monkeypatch):
    """PyTorch with a CUDA device for the judge only (this process): the numpy stand-in of
    test_gpu_cuda_fake.py, as test_bench.py takes it."""
    from test_gpu_cuda_fake import FakeTorch
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.cuda", fake.cuda)
    monkeypatch.delenv("KSEARCH_HARNESS_DEVICE_CHECKS", raising=False)  # the default: auto
    return fake


def events(captured: str, of_accused: bool = True) -> list[tuple]:
    """The fake's events in captured stderr, from the accused process (or from this one)."""
    out = []
    for line in captured.splitlines():
        if not line.startswith("FAKEMLX "):
            continue
        pid, *event = json.loads(line[len("FAKEMLX "):])
        if (pid != os.getpid()) == of_accused:
            out.append(tuple(event))
    return out


REFERENCE = '''
import numpy as np


def reference(inputs, params):
    return {"y": np.asarray(inputs["x"], dtype=np.float64) * 2}


def reference_mlx(inputs, params):
    from ksearch_harness.adapters import device
    if not device.timed():
        return reference(inputs, params)
    import mlx.core as mx
    a = device.mlx_inputs(inputs, params)
    return {"y": device.host(a["x"].astype(mx.float32) * 2)}


def baseline_mlx(inputs, params):
    from ksearch_harness.adapters import device
    a = device.mlx_inputs(inputs, params)
    return {"y": device.host(a["x"] * 2)}
'''

HONEST = '''
import mlx.core as mx

_KERNEL = mx.fast.cuda_kernel(name="scale", input_names=["x"], output_names=["y"],
                              source="y[i] = 2 * x[i];")


def scale(*, x, n):
    (y,) = _KERNEL(inputs=[x], output_shapes=[x.shape], output_dtypes=[x.dtype],
                   grid=(n, 1, 1), threadgroup=(32, 1, 1))
    return y
'''

CANDIDATES = {
    "returns_a_list": '''
import mlx.core as mx


def scale(*, x, n):
    return [x * 2]
''',
    "wrong_dtype": '''
import mlx.core as mx


def scale(*, x, n):
    return (x * 2).astype(mx.float32)
''',
    "caches_by_shape": '''
import mlx.core as mx

_cache = {}


def scale(*, x, n):
    if x.shape not in _cache:
        _cache[x.shape] = x * 2
    return _cache[x.shape]
''',
    # Writes into its input's device memory (the stand-in's array holds it in `_a`), as a
    # kernel that casts away its input's constness would.
    "mutates_input": '''
import mlx.core as mx


def scale(*, x, n):
    y = x * 2
    x._a[0] = x._a[0] + 1
    return y
''',
    # Off by a quarter everywhere: far beyond the tolerance.
    "offset": '''
import mlx.core as mx


def scale(*, x, n):
    return x * 2 + 0.25
''',
    "metal_only": '''
import mlx.core as mx

_K = mx.fast.metal_kernel(name="s", input_names=["x"], output_names=["y"], source="y[0]=x[0];")


def scale(*, x, n):
    return x * 2
''',
    "raises_at_import": '''
import mlx.core as mx

LIMIT = 1 // 0


def scale(*, x, n):
    return x * 2
''',
    "no_entry": '''
import mlx.core as mx


def scale_wrong_name(*, x, n):
    return x * 2
''',
}


def _workload(name: str, dtype: str, n: int, held_out: bool = False) -> dict:
    return {"name": name, "held_out": held_out, "params": {"n": n, "dtype": dtype},
            "inputs": [{"name": "x", "dtype": dtype, "shape": [n],
                        "dist": {"kind": "normal", "mean": 0.0, "std": 1.0}}],
            "outputs": [{"name": "y", "dtype": dtype, "shape": [n]}],
            "flops": float(n), "bytes": 4.0 * n}


def _evaluate(tmp_path: Path, source: str) -> dict:
    task = tmp_path / "task"
    task.mkdir(exist_ok=True)
    reference = task / "reference.py"
    if not reference.exists() or reference.read_text() != REFERENCE:
        # Written once: a task file rewritten would give the draw cache new keys.
        reference.write_text(REFERENCE)
    cand = tmp_path / "candidate.py"
    cand.write_text(textwrap.dedent(source))
    req = {
        "protocol": 1, "op": "evaluate", "nonce": driver.NONCE,
        "secret_seed": driver.SECRET_SEED, "backend": "mlx",
        "task": {"name": "scale", "dir": str(task),
                 "reference": {"module": "reference.py", "function": "reference_mlx"},
                 "baseline": {"name": "mlx", "function": "baseline_mlx"},
                 "entry": {"symbol": "scale", "args": ["x", "n"]},
                 "forbidden": ["reference", "reference_mlx", "baseline_mlx"]},
        "candidate": {"path": str(cand), "language": "python"},
        "build_dir": str(tmp_path / "build"),
        "workloads": [_workload("f16-64", "f16", 64), _workload("bf16-100", "bf16", 100),
                      _workload("f16-37", "f16", 37, held_out=True)],
        "tolerance": {"f16": {"rtol": 2e-3, "atol": 2e-3},
                      "bf16": {"rtol": 1.6e-2, "atol": 1.6e-2}},
        "correctness": {"trials": 2},
        "timing": {"warmup": 1, "min_reps": 3, "max_reps": 4, "target_seconds": 0.001,
                   "flush_bytes": 1 << 16},
        "timeout_s": 60,
    }
    return worker.execute(parse_request(req, "evaluate"), roofline_override=(1e15, 1e18))


def test_honest_candidate_passes_every_check(tmp_path, fake_mx, monkeypatch, capfd):
    verified = []
    real = device.DeviceAdapter.verify_reference_inputs

    def spy(self):
        verified.append(len(self._pending))
        real(self)

    monkeypatch.setattr(device.DeviceAdapter, "verify_reference_inputs", spy)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    assert r["build"]["kernel_dialects"] == ["cuda"]
    assert r["environment"]["kernel_dialects"] == ["cuda"]
    # The kernel was built (in the accused) under a name carrying the hash of its source.
    captured = capfd.readouterr()  # the accused writes to the log (fd 1 here), the judge to fd 2
    names = [e[1] for e in events(captured.out + captured.err) if e[0] == "kernel_name"]
    assert names and names[0].startswith("scale_")
    assert len(names[0]) == len("scale_") + 12
    timed = [w for w in r["workloads"] if not w["held_out"]]
    assert all(len(w["candidate_ns"]) >= 3 and w["baseline_median_ns"] for w in timed)
    assert r["workloads"][2]["correct"] and "candidate_ns" not in r["workloads"][2]
    # Timed reference and baseline calls read the registered device inputs (one per call),
    # and each was checked after its call.
    assert sum(verified) >= 2 * 3 * len(timed)
    assert r["score"] is not None


def test_a_kept_input_set_keeps_the_judges_mlx_arrays(tmp_path, fake_mx, monkeypatch):
    """In a persistent judge (draw cache on) the judge's own MLX arrays of an input set, which
    its timed reference and baseline calls read, are made with the set and reused by the
    evaluations after it instead of being uploaded again in every repetition."""
    from ksearch_harness import draw_cache
    from ksearch_harness.adapters import mlx as mlx_adapter
    made, uploaded, verified = [], [], []
    real_make = mlx_adapter.MlxAdapter.device_array
    real_upload = mlx_adapter.MlxAdapter.upload
    real_verify = device.DeviceAdapter.verify_reference_inputs

    def make(self, host, spec):
        made.append(spec.name)
        return real_make(self, host, spec)

    def upload(self, buf, host):
        uploaded.append(buf.spec.name)
        real_upload(self, buf, host)

    def verify(self):
        verified.append(len(self._pending))
        real_verify(self)

    # This process is the judge; the accused, a child, has its own adapter.
    monkeypatch.setattr(mlx_adapter.MlxAdapter, "device_array", make)
    monkeypatch.setattr(mlx_adapter.MlxAdapter, "upload", upload)
    monkeypatch.setattr(device.DeviceAdapter, "verify_reference_inputs", verify)
    draw_cache.clear()
    draw_cache.enable()
    try:
        first = _evaluate(tmp_path, HONEST)
        made_first, verified_first = len(made), sum(verified)
        kept_first = draw_cache.stats()["device_entries"]
        second = _evaluate(tmp_path, HONEST)
        kept = draw_cache.stats()["device_entries"]
    finally:
        draw_cache.enable(False)
        draw_cache.clear()
    assert first["status"] == second["status"] == "passed", (first["message"],
                                                             second["message"])
    # One input per set here, so an array made is a set staged. The second evaluation made
    # arrays only for sets that were not kept before it: those the draw cache does not keep
    # (the probes', as many as in the first) and any it drew for the first time.
    made_second = len(made) - made_first
    assert kept_first > 0
    assert made_second <= (made_first - kept_first) + (kept - kept_first), (
        made_first, made_second, kept_first, kept)
    assert made_second < made_first
    assert not uploaded, "the judge staged an input by uploading it"
    # The timed reference and baseline calls of the second evaluation read the kept arrays
    # (registered as uploads of the same host bytes) and were checked against them.
    assert sum(verified) - verified_first >= 2 * 3 * 2


@pytest.mark.parametrize("name,status,cls", [
    ("returns_a_list", "integrity_violation", "lazy_output"),
    ("wrong_dtype", "incorrect", None),
    ("caches_by_shape", "integrity_violation", "stale_output"),
    ("mutates_input", "integrity_violation", "input_mutated"),
    ("metal_only", "build_error", None),
    ("raises_at_import", "build_error", None),
    ("no_entry", "build_error", None),
])
def test_broken_and_cheating_candidates(tmp_path, fake_mx, name, status, cls):
    r = _evaluate(tmp_path, CANDIDATES[name])
    assert r["status"] == status, (name, r["status"], r["message"])
    assert (r["violation"] or {}).get("class") == cls, r["violation"]
    if name == "metal_only":
        assert "builds only metal kernels" in r["message"]
    if name == "raises_at_import":
        assert "ZeroDivisionError" in r["message"] and "line 4" in r["message"]
    if name == "no_entry":
        assert "no function `scale`" in r["message"]
    if name == "mutates_input":
        assert "input `x` was modified" in r["message"] and "byte(s) differ" in r["message"]


def test_inputs_are_checked_in_the_accused_without_reading_them_back(tmp_path, fake_mx,
                                                                     monkeypatch):
    """With MLX the judge cannot read the accused's memory: after each call the accused
    compares every input with the device copy it made at upload and answers a count, so
    the judge reads back outputs only. A candidate that writes into its input is still
    caught (test_broken_and_cheating_candidates)."""
    from ksearch_harness.accused_client import AccusedAdapter
    reads: list[str] = []
    counted: list[int] = []
    real_read, real_count = AccusedAdapter.to_host, AccusedAdapter.inputs_changed

    def read(self, buf):
        reads.append(buf.role)
        return real_read(self, buf)

    def count(self, bufs):
        got = real_count(self, bufs)
        counted.append(len(got))
        return got

    monkeypatch.setattr(AccusedAdapter, "to_host", read)
    monkeypatch.setattr(AccusedAdapter, "inputs_changed", count)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    assert counted and all(n == 1 for n in counted), counted
    assert reads and set(reads) == {"output"}, set(reads)
    # The deferred-work check asks the accused too: one read of the outputs per call.
    assert r["diagnostics"]["outputs_read_to_host"] == r["diagnostics"]["candidate_calls"]


def test_outputs_are_released_in_the_accused_not_poisoned_through_the_arena(tmp_path, fake_mx,
                                                                            monkeypatch):
    """An MLX candidate returns new output arrays, so poison copied into its output buffers
    never reached it: the judge has the accused drop the previous outputs instead, once per
    correctness call and around each priming call, and uploads inputs only."""
    from ksearch_harness.accused_client import AccusedAdapter
    uploaded: list[str] = []
    released: list[int] = []
    real_upload, real_release = AccusedAdapter.upload, AccusedAdapter.release_outputs

    def upload(self, buf, host):
        uploaded.append(buf.role)
        real_upload(self, buf, host)

    def release(self, bufs):
        released.append(len(bufs))
        real_release(self, bufs)

    monkeypatch.setattr(AccusedAdapter, "upload", upload)
    monkeypatch.setattr(AccusedAdapter, "release_outputs", release)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    assert uploaded and set(uploaded) == {"input"}, set(uploaded)
    assert len(released) >= r["diagnostics"]["candidate_calls"], (
        len(released), r["diagnostics"]["candidate_calls"])
    assert set(released) == {1}


def test_a_released_output_reads_as_poison_until_a_call_replaces_it(fake_mx):
    from ksearch_harness.adapters import mlx as mlx_adapter
    from ksearch_harness.protocol import TensorSpec
    spec = TensorSpec("y", "f16", (64,))
    a = mlx_adapter.MlxAdapter.__new__(mlx_adapter.MlxAdapter)
    buf = mlx_adapter.MlxBuffer(spec, array=fake_mx.array(np.ones(spec.shape, np.float16)))
    a.release(buf)
    got = a.to_host(buf)
    assert buf.array is None
    assert dtypes.get(spec.dtype).poison_mask(got, "a").all()


def test_the_accused_counts_changed_bytes_against_its_copies(fake_mx, tmp_path):
    """Accused.unchanged: an input against its copy at upload, an output against its copy at
    the last read; a poisoned output has nothing to be compared with."""
    import mmap

    from ksearch_harness import accused
    from ksearch_harness.adapters.mlx import MlxAdapter
    raw = driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx")
    one = accused.Accused("mlx")
    one.adapter = MlxAdapter(parse_request(raw, "evaluate"))
    one.arenas.append(mmap.mmap(-1, 1 << 12))
    slot = accused.Slot({})
    spec_x, spec_y = (device.TensorSpec(n, "f16", (8,)) for n in ("x", "y"))
    slot.inputs["x"], slot.outputs["y"] = one.adapter.alloc(spec_x), one.adapter.alloc(spec_y)
    slot.views["x"] = np.frombuffer(one.arenas[0], np.float16, 8, 0)
    slot.views["y"] = np.frombuffer(one.arenas[0], np.float16, 8, 64)
    slot.views["x"][:] = np.arange(8)
    one.slots[0] = slot
    ask = {"op": "unchanged", "slot": 0, "names": ["x", "y"]}
    one.handle({"op": "h2d", "slot": 0, "names": ["x", "y"]}, [])
    assert one.handle(ask, []) == {"changed": {"x": 0}, "unchecked": ["y"]}
    slot.outputs["y"].array = slot.inputs["x"].array * 2  # what a call leaves
    one.handle({"op": "d2h", "slot": 0, "names": ["y"]}, [])
    assert np.array_equal(slot.views["y"], 2 * np.arange(8))
    assert one.handle(ask, []) == {"changed": {"x": 0, "y": 0}, "unchecked": []}
    slot.inputs["x"].array._a[3] = -3  # written behind MLX's back: the sign bit's byte
    slot.outputs["y"].array._a[1:3] = -2  # 2.0 and 4.0: the sign bit's byte of each
    assert one.handle(ask, []) == {"changed": {"x": 1, "y": 2}, "unchecked": []}
    one.handle({"op": "h2d", "slot": 0, "names": ["y"]}, [])  # poisoned
    assert one.handle(ask, [])["unchecked"] == ["y"]


def test_each_timed_call_follows_a_priming_call_on_the_previous_inputs(tmp_path, fake_mx,
                                                                      capfd):
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    timed = [w for w in r["workloads"] if not w["held_out"]]
    # Every contender's timed call was primed once per kept repetition, and the durations
    # of those calls are kept beside the samples. The contenders are the candidate and its
    # anchor, the baseline; the reference runs untimed, unprimed.
    for w in timed:
        assert set(w["prime_ns"]) == {"candidate", "baseline"}
        assert all(len(v) == len(w["candidate_ns"]) for v in w["prime_ns"].values())
    captured = capfd.readouterr()
    err = captured.out + captured.err
    ev = [e for e in events(err) if e[0] != "kernel_name"]
    first_clear = next(i for i, e in enumerate(ev) if e[0] == "clear")
    primed = []  # (priming call's input, timed call's input)
    for i in range(first_clear, len(ev) - 2):
        if ev[i][0] == "clear" and ev[i + 1][0] == "kernel":
            # The candidate's timed call follows its priming call with nothing between: no
            # cache reset, and no buffer read on the host going back to the cache.
            assert ev[i + 2][0] == "kernel", ev[i:i + 3]
            primed.append((ev[i + 1][1], ev[i + 2][1]))
    assert not any(e[0] == "kernel" for e in events(err, of_accused=False))
    warmup, reps = 1, [len(w["candidate_ns"]) for w in timed]
    assert len(primed) == sum(n + warmup for n in reps)
    # A priming call never sees the inputs of the call it precedes; within a workload it
    # gets the previous repetition's.
    start = 0
    for n in reps:
        mine = primed[start:start + n + warmup]
        assert all(p != t for p, t in mine)
        assert all(mine[j + 1][0] == mine[j][1] for j in range(len(mine) - 1))
        start += n + warmup


def test_bf16_round_trips_through_the_device_helpers(fake_mx):
    stored = dtypes.get("bf16").encode(np.array([1.5, -2.25, 3e-3, 7.0]))
    arr = device.mlx_from_host(stored, "bf16")
    assert arr.dtype is fake_mx.bfloat16 and arr.shape == (4,)
    assert np.array_equal(device.mlx_to_host(arr, np.dtype(np.uint16)), stored)
    assert np.allclose(device.to_numpy(arr), dtypes.get("bf16").decode(stored))


def test_large_uploads_go_in_pieces(fake_mx, monkeypatch):
    monkeypatch.setattr(device, "MLX_UPLOAD_CHUNK_BYTES", 64)
    made = []
    real = fake_mx.array

    def from_host(data, dtype=None):  # arrays made from host memory: the managed path
        made.append(np.asarray(data).nbytes)
        return real(data, dtype)

    monkeypatch.setattr(fake_mx, "array", from_host)
    stored = np.arange(100, dtype=np.float16).reshape(4, 25)
    arr = device.mlx_from_host(stored, "f16")
    assert arr.shape == (4, 25) and np.array_equal(np.asarray(arr), stored)
    assert max(made) <= 64 and sum(made) == stored.nbytes and len(made) == 4


def test_the_kernel_clock_times_calls_by_their_device_activity(fake_mx, monkeypatch):
    """With the kernel clock chosen and working, a timed call's figure is the span of its
    recorded device activity, not the wall clock around it, for every contender. The host
    time under the profiler is reported beside it as evidence, not as `host_ns`: the judge
    then charges a candidate its device time bounded by its window (adapters.charged_ns has
    nothing to set against an anchor), which still makes host work that shows in the window
    pay."""
    import time as _time

    from ksearch_harness import kernel_clock
    from ksearch_harness.accused_client import TimedCall
    from ksearch_harness.adapters import charged_ns
    from ksearch_harness.adapters.mlx import MlxAdapter

    def record(fn, sync):
        value = fn()
        sync()
        return value, [(10_000, 2_010_000)]  # 2 ms on the device

    monkeypatch.setenv(kernel_clock.CLOCK_ENV, "kernels")
    monkeypatch.setattr(kernel_clock, "CLOCK", kernel_clock.KernelClock(record))
    raw = driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx")
    a = MlxAdapter(parse_request(raw, "evaluate"))

    def baseline():
        _time.sleep(0.005)  # 5 ms on the host, say a slow dispatch: not the device's time
        return {}
    ns, _ = a.time_call(baseline)
    assert ns == 2_000_000
    anchor = dict(a.last_parts)
    assert anchor["device_ns"] == 2_000_000 and anchor["profiled_host_ns"] >= 5_000_000

    def candidate():
        _time.sleep(0.005)
        return {}
    candidate.ksearch_candidate = True
    ns, _ = a.time_call(candidate)
    assert ns == 2_000_000
    parts = dict(a.last_parts)
    assert "host_ns" not in parts and charged_ns(parts, anchor) is None
    assert a.environment()["mlx_clock"]["used"] == "kernels"
    # In an evaluation: the accused reports its device time; what the judge saw beyond a round
    # trip is charged where it is longer.
    honest = TimedCall(counted_ns=2_000_000, reported_ns=2_000_000, window_ns=6_000_000,
                       parts=parts, floor_ns=0)
    assert honest.charged(anchor) == 2_000_000
    hiding = TimedCall(counted_ns=4_000_000, reported_ns=2_000_000, window_ns=9_000_000,
                       parts=parts, floor_ns=4_000_000)
    assert hiding.charged(anchor) == 4_000_000


def test_a_timed_noop_on_the_kernel_clock_is_a_round_trip_not_an_error(fake_mx, monkeypatch):
    """The judge times empty commands (noop) to learn what a round trip costs. On the kernel
    clock they launch its tiny test op; should the clock record nothing of it, their device
    time is zero, not a ClockError (which made every mlx evaluation on the kernel clock fail at
    its calibration on the H200, docs/results/scores, mlx run 5). A candidate call that ran
    nothing on the device is still an error."""
    from ksearch_harness import accused, kernel_clock
    from ksearch_harness.adapters.mlx import MlxAdapter

    activity = [(0, 1_000)]  # the clock's test launches ran something

    def record(fn, sync):
        value = fn()
        sync()
        return value, list(activity)

    monkeypatch.setenv(kernel_clock.CLOCK_ENV, "kernels")
    monkeypatch.setattr(kernel_clock, "CLOCK", kernel_clock.KernelClock(record))
    raw = driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx")
    one = accused.Accused("mlx")
    one.adapter = MlxAdapter(parse_request(raw, "evaluate"))
    assert one.adapter._device_clock() is not None  # prepared: the kernel clock is in use
    clock = kernel_clock.CLOCK
    touched = []
    probe = clock.touch
    clock.touch = lambda: touched.append(1) or probe()
    activity.clear()  # from here on nothing is recorded on the device
    assert one.handle({"op": "noop", "timed": True}, []) == {"ns": 0}
    assert one.adapter.last_parts["device_ns"] == 0
    # The round trip ran the clock's test op: the profiler's cost of a session with device
    # activity is part of what a round trip costs on this clock.
    assert touched == [1]
    activity.append((5_000, 7_000))
    assert one.handle({"op": "noop", "timed": True}, []) == {"ns": 2_000}
    activity.clear()

    def candidate():
        return {}
    candidate.ksearch_candidate = True
    with pytest.raises(kernel_clock.ClockError, match="no device activity"):
        one.adapter.time_call(candidate)


def test_without_a_working_profiler_the_kernel_clock_falls_back_to_the_wall_clock(
        tmp_path, fake_mx, monkeypatch):
    """CI has no PyTorch: choosing the kernel clock still evaluates, with the wall clock, and
    the result says which clock timed it and why."""
    from ksearch_harness import kernel_clock
    monkeypatch.setenv(kernel_clock.CLOCK_ENV, "kernels")
    monkeypatch.setattr(kernel_clock, "CLOCK", kernel_clock.KernelClock(
        lambda fn, sync: (fn(), [])))  # records nothing, as a profiler without CUPTI
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    clock = r["environment"]["mlx_clock"]
    assert clock["chosen"] == "kernels" and clock["used"] == "wall"
    assert "recorded no device activity" in clock["detail"]


def test_the_kernel_clock_is_the_default_only_where_mlx_runs_on_cuda(fake_mx, monkeypatch):
    """With no setting the kernel clock is chosen; where MLX does not run on an NVIDIA GPU
    (Apple silicon, MLX's CPU backend) the profiler is not even started and the result says
    the wall clock timed it and why."""
    import types

    from ksearch_harness import kernel_clock
    from ksearch_harness.adapters.mlx import MlxAdapter
    monkeypatch.delenv(kernel_clock.CLOCK_ENV, raising=False)
    started = []
    monkeypatch.setattr(kernel_clock, "CLOCK", kernel_clock.KernelClock(
        lambda fn, sync: (started.append(1), fn(), [(0, 1)])[1:]))
    raw = driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx")
    monkeypatch.setattr(fake_mx, "cuda", types.SimpleNamespace(is_available=lambda: False))
    a = MlxAdapter(parse_request(raw, "evaluate"))
    assert a._device_clock() is None and not started
    clock = a.environment()["mlx_clock"]
    assert clock["chosen"] == "kernels" and clock["used"] == "wall"
    assert "does not run on an NVIDIA GPU" in clock["detail"]
    monkeypatch.setattr(fake_mx, "cuda", types.SimpleNamespace(is_available=lambda: True))
    assert a._device_clock() is not None and started
    assert a.environment()["mlx_clock"]["used"] == "kernels"


def test_a_judge_on_the_kernel_clock_refuses_candidate_times_taken_with_the_wall_clock(
        tmp_path, fake_mx, monkeypatch):
    """The judge's baseline on the kernel clock and the accused's candidate on the wall clock
    (its profiler did not start: CI's accused has no PyTorch) would pair two clocks in one
    ratio: the evaluation stops with a task error that says so instead."""
    from ksearch_harness import kernel_clock
    monkeypatch.setenv(kernel_clock.CLOCK_ENV, "kernels")
    monkeypatch.setattr(kernel_clock, "CLOCK", kernel_clock.KernelClock(
        lambda fn, sync: (fn(), [(0, 50_000)])))
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "task_error", (r["status"], r["message"])
    assert "kernel clock" in r["message"] and "without device activity" in r["message"]


def test_a_timed_call_that_returns_a_bare_array_is_evaluated_inside_the_timed_region(
        fake_mx, monkeypatch):
    """`ksearch bench`'s MLX native returns the attention's output array itself, not a dict:
    it must be computed inside the timed region (on the H200 the unevaluated graph timed MLX's
    attention at 0.054 ms for 137 GFLOP)."""
    from ksearch_harness.adapters.mlx import MlxAdapter
    raw = driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx")
    a = MlxAdapter(parse_request(raw, "evaluate"))
    evaluated_inside = []
    real_sync = fake_mx.synchronize

    def sync(stream=None):
        evaluated_inside.append(fake_mx.evals)
        return real_sync(stream)

    monkeypatch.setattr(fake_mx, "synchronize", sync)
    for make in (lambda: fake_mx.zeros((4,)), lambda: [fake_mx.zeros((4,))],
                 lambda: {"y": fake_mx.zeros((4,))}):
        before = fake_mx.evals
        evaluated_inside.clear()
        a.time_call(make)
        # The synchronize that ends the timed region came after the evaluation.
        assert evaluated_inside[-1] == before + 1, make


def test_the_idle_probe_times_a_tiny_piece_of_the_judges_own_work(fake_mx):
    from ksearch_harness.adapters.mlx import MlxAdapter
    raw = driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx")
    a = MlxAdapter(parse_request(raw, "evaluate"))
    probes = [a.idle_probe_seconds() for _ in range(3)]
    assert all(isinstance(p, float) and 0 <= p < 1 for p in probes)


# Wrong and cheating candidates whose verdicts must not depend on where the judge checks them.
WRONG_OR_CHEATING = [
    ("offset", "incorrect", None),
    ("wrong_dtype", "incorrect", None),
    ("caches_by_shape", "integrity_violation", "stale_output"),
    ("mutates_input", "integrity_violation", "input_mutated"),
]


def _same_verdicts(on: dict, off: dict, name: str, status: str, cls: str | None) -> list:
    """Asserts that two results of one candidate have its expected verdict and the same
    message and error figures; returns the first's error figures per workload."""
    for r in (on, off):
        assert r["status"] == status, (name, r["status"], r["message"])
        assert (r["violation"] or {}).get("class") == cls, r["violation"]
    assert on["message"] == off["message"]
    errors = [[(w.get("max_abs_err"), w.get("max_rel_err")) for w in r["workloads"]]
              for r in (on, off)]
    assert errors[0] == errors[1]
    return errors[0]


def _spy_device_compares(monkeypatch) -> list:
    """The array namespaces device_checks.compare is called with, one entry per output."""
    from ksearch_harness import device_checks
    compared: list = []
    real = device_checks.compare

    def spy(xp, out, truth, atol, rtol):
        compared.append(xp)
        return real(xp, out, truth, atol, rtol)

    monkeypatch.setattr(device_checks, "compare", spy)
    return compared


def test_host_outputs_are_compared_on_the_judges_gpu_where_it_has_one(tmp_path, fake_mx,
                                                                     judge_torch, monkeypatch):
    """By default (`KSEARCH_HARNESS_DEVICE_CHECKS=auto`) a judge with a CUDA device of its own
    compares the outputs it read back from the accused there (device_checks) instead of with
    numpy; `off` keeps them on the host. Both ways pass the honest candidate."""
    compared = _spy_device_compares(monkeypatch)
    on = _evaluate(tmp_path, HONEST)
    assert on["status"] == "passed", on["message"]
    # Every output read back and compared with its truth, on the judge's device (one output
    # per workload here).
    assert len(compared) == on["diagnostics"]["host_outputs_compared_on_device"] > 0
    assert on["diagnostics"]["outputs_read_to_host"] > 0
    assert all(xp is judge_torch for xp in compared)
    assert on["diagnostics"]["device_checks_error"] is None

    compared.clear()
    monkeypatch.setenv("KSEARCH_HARNESS_DEVICE_CHECKS", "off")
    off = _evaluate(tmp_path, HONEST)
    assert off["status"] == "passed", off["message"]
    assert off["diagnostics"]["host_outputs_compared_on_device"] == 0
    assert not compared


def test_a_judge_without_a_cuda_device_compares_host_outputs_on_the_host(tmp_path, fake_mx,
                                                                         judge_torch,
                                                                         monkeypatch):
    compared = _spy_device_compares(monkeypatch)
    monkeypatch.setattr(judge_torch.cuda, "is_available", lambda: False)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", r["message"]
    assert r["diagnostics"]["host_outputs_compared_on_device"] == 0 and not compared


def test_a_failing_judge_device_moves_the_comparisons_to_the_host(tmp_path, fake_mx,
                                                                  judge_torch, monkeypatch):
    """The judge's device out of memory (the accused beside it may hold the rest): the
    evaluation goes on with host comparisons and the same verdicts, and says why."""
    def empty(shape, dtype, device=None):
        raise RuntimeError("CUDA out of memory. Tried to allocate 128.00 MiB")

    monkeypatch.setattr(judge_torch, "empty", empty)
    honest = _evaluate(tmp_path, HONEST)
    assert honest["status"] == "passed", honest["message"]
    assert honest["diagnostics"]["host_outputs_compared_on_device"] == 0
    assert "out of memory" in honest["diagnostics"]["device_checks_error"]
    wrong = _evaluate(tmp_path, CANDIDATES["offset"])
    assert wrong["status"] == "incorrect", wrong["message"]


@pytest.mark.parametrize("name,status,cls", WRONG_OR_CHEATING)
def test_checks_on_the_judges_gpu_reach_the_hosts_verdicts(tmp_path, fake_mx, judge_torch,
                                                           monkeypatch, name, status, cls):
    """Wrong and cheating candidates get the same verdict, message and error figures whether
    the judge compares their outputs on its GPU or on the host."""
    compared = _spy_device_compares(monkeypatch)
    on = _evaluate(tmp_path, CANDIDATES[name])
    on_device = len(compared)
    monkeypatch.setenv("KSEARCH_HARNESS_DEVICE_CHECKS", "off")
    off = _evaluate(tmp_path, CANDIDATES[name])
    assert len(compared) == on_device  # none with `off`
    errors = _same_verdicts(on, off, name, status, cls)
    if name in ("offset", "caches_by_shape"):
        # Their wrong outputs were found by the comparisons on the judge's device.
        assert on_device == on["diagnostics"]["host_outputs_compared_on_device"] > 0
    if name == "offset":
        assert any(a is not None and a >= 0.2 for a, _ in errors), errors


@pytest.fixture
def staged(fake_mx, judge_torch, monkeypatch):
    """mlx with device memory shared as staging (device_share, emulated: a memfd stands in for
    the device's memory, in the judge, with its PyTorch stand-in, and in the accused, which
    is told so). Yields the judge's commands to the accused as (op, staged) pairs."""
    from ksearch_harness import accused_client
    monkeypatch.setenv("KSEARCH_HARNESS_DEVICE_SHARE", "emulate")
    monkeypatch.setenv("KSEARCH_HARNESS_ACCUSED_ENV",
                       "KSEARCH_FAKE_MLX_EVENTS,KSEARCH_HARNESS_DEVICE_SHARE")
    ops: list[tuple[str, bool]] = []
    real = accused_client.AccusedProcess.rpc

    def rpc(self, op, **fields):
        ops.append((op, bool(fields.get("staged"))))
        return real(self, op, **fields)

    monkeypatch.setattr(accused_client.AccusedProcess, "rpc", rpc)
    return ops


def test_shared_memory_the_accused_cannot_map_is_the_harness_failure(fake_mx):
    """A slot whose shared device memory comes without its size, or on a descriptor that
    cannot be mapped, is refused as the harness's failure (`task`), not the candidate's, and
    the descriptor is closed either way."""
    import mmap

    from ksearch_harness import accused
    from ksearch_harness.adapters.mlx import MlxAdapter
    one = accused.Accused("mlx")
    one.adapter = MlxAdapter(parse_request(
        driver.softmax_request("/tmp/k.py", "/tmp/b", backend="mlx"), "evaluate"))
    one.arenas.append(mmap.mmap(-1, 1 << 12))
    tensors = [{"name": "x", "role": "input", "dtype": "f16", "shape": [8], "offset": 0,
                "nbytes": 16, "device_offset": 0}]
    for share, why in (({"emulated": True}, "without its size"),
                       ({"size": 1 << 12, "emulated": True}, "cannot map")):
        read, write = os.pipe()  # a pipe maps nowhere
        os.close(write)
        with pytest.raises(accused.CommandFailed, match=why) as failed:
            one.handle({"op": "alloc", "slot": 0, "params": {}, "tensors": tensors,
                        "device_share": share}, [read])
        assert failed.value.error == "task"
        with pytest.raises(OSError):
            os.fstat(read)
    assert 0 not in one.slots


def test_staged_inputs_and_outputs_cross_on_the_device(tmp_path, staged, monkeypatch):
    """With shared device memory an mlx judge writes each input set into the slot's staging
    and the accused copies it into new MLX arrays there; each output is copied back into the
    staging and compared on the judge's device. Nothing crosses through the host arena."""
    from ksearch_harness.adapters import mlx as mlx_adapter
    compared = _spy_device_compares(monkeypatch)
    made: list[str] = []
    for how in ("device_array", "device_array_from_bits"):
        real = getattr(mlx_adapter.MlxAdapter, how)

        def spy(self, source, spec, how=how, real=real):
            made.append(how)
            return real(self, source, spec)

        monkeypatch.setattr(mlx_adapter.MlxAdapter, how, spy)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", r["message"]
    assert r["diagnostics"]["device_share"]["active"] is True
    # The judge's own arrays (for its reference and baseline) come from its device copy of
    # each set too, not from the host.
    assert made and set(made) == {"device_array_from_bits"}
    copies = [(op, s) for op, s in staged if op in ("h2d", "d2h")]
    assert {op for op, _ in copies} == {"h2d", "d2h"}
    assert all(s for _, s in copies), copies
    # Every call's outputs were compared on the device: the two correctness calls of each
    # trial and every timed call's, from the staging's copies (no host outputs to copy up).
    assert len(compared) >= r["diagnostics"]["candidate_calls"] > 0
    assert r["diagnostics"]["host_outputs_compared_on_device"] == 0
    # An output that stays the same after the settle window is seen so by copying it out
    # again, not by the accused's own count (`unchanged` is for the inputs only).
    calls = sum(1 for op, _ in staged if op == "call")
    assert sum(1 for op, _ in copies if op == "d2h") >= calls


@pytest.mark.parametrize("name,status,cls", WRONG_OR_CHEATING)
def test_staging_reaches_the_verdicts_of_copies_through_the_host(tmp_path, staged, monkeypatch,
                                                                 name, status, cls):
    """Wrong and cheating candidates get the same verdict, message and error figures with
    their tensors staged on the device as through the host arena."""
    on = _evaluate(tmp_path, CANDIDATES[name])
    assert any(s for _, s in staged)
    staged.clear()
    monkeypatch.setenv("KSEARCH_HARNESS_DEVICE_SHARE", "off")
    off = _evaluate(tmp_path, CANDIDATES[name])
    assert not any(s for _, s in staged)
    assert on["diagnostics"]["device_share"]["active"] is True
    assert off["diagnostics"]["device_share"]["active"] is False
    _same_verdicts(on, off, name, status, cls)


def test_an_mlx_judge_without_a_cuda_device_does_not_stage(tmp_path, fake_mx, judge_torch,
                                                            monkeypatch):
    """Sharing asked for (`auto`) where PyTorch sees no CUDA device (MLX on Apple silicon):
    the tensors go through the host arena, and the result says why."""
    from ksearch_harness import core, device_share
    monkeypatch.setattr(device_share, "available", lambda device=0: (True, ""))
    monkeypatch.setattr(judge_torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("KSEARCH_HARNESS_DEVICE_SHARE", "auto")
    assert core._device_share_available("mlx") == (
        False, "PyTorch has no CUDA device in the judge")
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", r["message"]
    assert r["diagnostics"]["device_share"]["active"] is False


def test_an_accused_without_the_driver_gets_its_tensors_through_the_arena(tmp_path, staged,
                                                                          monkeypatch):
    """The judge could share memory, but the accused could not load the CUDA driver that
    copies its arrays (here: no GPU, and not told of the emulation); it says so when ready,
    and its tensors go through the host arena."""
    monkeypatch.setenv("KSEARCH_HARNESS_ACCUSED_ENV", "KSEARCH_FAKE_MLX_EVENTS")
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", r["message"]
    assert r["diagnostics"]["device_share"] == {
        "active": False, "detail": "the accused cannot stage arrays on the device"}
    assert staged and not any(s for _, s in staged)


def test_an_arrays_address_and_layout_come_from_its_dlpack_export():
    """mlx_data_pointer reads DLPack's DLTensor, which MLX and numpy export alike: the first
    element's address, and whether the elements are one row-major block (only then does the
    staging copy them as bytes; otherwise MLX makes such a copy first)."""
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    assert device.mlx_data_pointer(a) == (a.ctypes.data, True)
    t = a.transpose(0, 2, 1)
    assert device.mlx_data_pointer(t) == (a.ctypes.data, False)
    s = a[1, 1:, :]
    assert device.mlx_data_pointer(s) == (s.ctypes.data, True)
    assert s.ctypes.data != a.ctypes.data
    assert device.mlx_data_pointer(a[:, :, ::2])[1] is False
    # A dimension of one may have any stride.
    assert device.mlx_data_pointer(a[:, 1:2, :])[1] is False
    assert device.mlx_data_pointer(a[1:2, 1:2, :])[1] is True
