"""Backend selection, lazy imports of the GPU adapters, and the device-side helpers shared by
them (input registry for timed reference calls, deferred host conversion, escaped-work
accounting, MLX kernel naming and dialects) - everything that needs neither torch nor mlx."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

import driver
from ksearch_harness import adapters
from ksearch_harness.adapters import cuda, device, mlx
from ksearch_harness.protocol import TaskError, TensorSpec, Violation, parse_request


@pytest.fixture(autouse=True)
def _no_active_adapter():
    """Adapters register themselves for task code (one per harness process); tests make many."""
    yield
    device.deactivate()


def _request(backend: str, workloads: list[dict] | None = None, op: str = "evaluate") -> object:
    req = driver.softmax_request("/tmp/k.c", "/tmp/b", backend=backend)
    req["op"] = op
    if workloads is not None:
        req["workloads"] = workloads
        req["task"]["entry"] = {"symbol": "scale", "args": ["x", "y", "n"]}
    return parse_request(req, op)


def test_create_picks_the_adapter_of_the_requested_backend():
    assert type(adapters.create(_request("cpu"))).__name__ == "CpuAdapter"
    assert isinstance(adapters.create(_request("cuda")), cuda.CudaAdapter)
    assert isinstance(adapters.create(_request("mlx")), mlx.MlxAdapter)
    device.deactivate()
    with pytest.raises(TaskError, match="known: cpu, cuda, mlx"):
        adapters.create(_request("rocm"))


LAZY_PROBE = """
import sys
sys.modules["torch"] = None   # present or not, importing it must not be needed
sys.modules["mlx"] = None
sys.modules["mlx.core"] = None
import ksearch_harness.worker, ksearch_harness.core
from ksearch_harness import adapters
from ksearch_harness.adapters import cuda, mlx, device
from ksearch_harness.protocol import parse_request
import json
req = json.loads(sys.argv[1])
for backend in ("cpu", "cuda", "mlx"):
    req["backend"] = backend
    adapters.create(parse_request(req, "build"))
print(json.dumps({"backends": adapters.available_backends(),
                  "torch": sys.modules.get("torch") is not None,
                  "mlx": sys.modules.get("mlx.core") is not None}))
"""


def test_gpu_adapters_import_and_construct_without_torch_or_mlx():
    req = driver.softmax_request("/tmp/k.c", "/tmp/b", op="build")
    out = subprocess.run([sys.executable, "-c", LAZY_PROBE, json.dumps(req)],
                         capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(driver.HARNESS_DIR), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    assert facts == {"backends": ["cpu"], "torch": False, "mlx": False}


def test_a_gpu_evaluation_without_torch_or_mlx_is_a_task_error(monkeypatch):
    """Where PyTorch (mlx) is missing, the backend says so instead of crashing."""
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    try:
        with pytest.raises(TaskError, match="needs PyTorch"):
            cuda.CudaAdapter(_request("cuda")).alloc(TensorSpec("x", "f32", (4,)))
        with pytest.raises(TaskError, match="needs the mlx package"):
            mlx.MlxAdapter(_request("mlx")).synchronize()
    finally:
        device.deactivate()


# -- device registry -----------------------------------------------------------------------------


class FakeDeviceAdapter(device.DeviceAdapter):
    """Host arrays stand in for device buffers; enough to exercise the registry."""

    name = "cuda"

    def build(self, source):
        raise NotImplementedError

    def load(self, build, entry):
        pass

    def alloc(self, spec):
        return {"spec": spec, "data": None}

    def upload(self, buf, host):
        buf["data"] = host.copy()
        self.note_upload(buf["spec"], buf, host)

    def to_host(self, buf):
        return buf["data"].copy()

    def call(self, inputs, outputs, params):
        pass

    def flush_cache(self):
        pass

    def _fresh(self, stored, spec):
        return {"spec": spec, "data": stored.copy(), "fresh": True}


def _workload(dtype: str, n: int = 8) -> dict:
    return {"name": f"w{dtype}", "held_out": False, "params": {"n": n, "dtype": dtype},
            "inputs": [{"name": "x", "dtype": dtype, "shape": [n]}],
            "outputs": [{"name": "y", "dtype": dtype, "shape": [n]}]}


@pytest.fixture
def fake():
    req = _request("cuda", [_workload("f16"), _workload("bf16")])
    adapter = FakeDeviceAdapter(req)
    yield adapter
    device.deactivate()


def test_timed_reference_calls_get_the_uploaded_buffer(fake):
    from ksearch_harness import dtypes
    values = np.linspace(-2, 2, 8)
    stored = dtypes.get("bf16").encode(values)
    buf = fake.alloc(TensorSpec("x", "bf16", (8,)))
    fake.upload(buf, stored)
    given = {"x": dtypes.get("bf16").reference_view(stored).copy()}  # what reference.py sees
    params = {"n": 8, "dtype": "bf16"}
    assert device.backend() == "cuda" and not device.timed()
    got = fake.reference_inputs(given, params)["x"]
    assert got.get("fresh") and np.array_equal(got["data"], stored)  # untimed: a fresh copy

    seen = {}

    def timed_reference():
        seen["timed"] = device.timed()
        seen["x"] = device.torch_inputs(given, params)["x"]

    fake.timed_region(timed_reference)
    assert seen["timed"] and seen["x"] is buf  # the candidate-side buffer, no transfer
    fake.verify_reference_inputs()  # the buffer held exactly these inputs


def test_a_stale_registry_entry_is_never_used_silently(fake):
    from ksearch_harness import dtypes
    f16 = dtypes.get("f16")
    buf = fake.alloc(TensorSpec("x", "f16", (8,)))
    fake.upload(buf, f16.encode(np.arange(8.0)))
    params = {"n": 8, "dtype": "f16"}
    # A different input set: the quick sample already disagrees, so a fresh copy is made.
    other = {"x": np.arange(8.0).astype(np.float16) + np.float16(1)}
    got = fake.timed_region(lambda: fake.reference_inputs(other, params))["x"]
    assert got.get("fresh")
    # Same sampled values but one element changed (a near-duplicate input set): the full
    # comparison after the timed call catches it.
    near = {"x": np.arange(8.0).astype(np.float16)}
    near["x"][3] = 100
    with np.errstate(all="ignore"):
        monkey_quick = device._quick_match
        device._quick_match = lambda up, x: True
        try:
            got = fake.timed_region(lambda: fake.reference_inputs(near, params))["x"]
        finally:
            device._quick_match = monkey_quick
    assert got is buf
    with pytest.raises(TaskError, match="did not hold that call's inputs"):
        fake.verify_reference_inputs()


def test_reference_inputs_must_match_a_workload(fake):
    with pytest.raises(TaskError, match="match no workload"):
        fake.reference_inputs({"x": np.zeros(8, np.float16)}, {"n": 9, "dtype": "f16"})
    with pytest.raises(TaskError, match="not an input"):
        fake.reference_inputs({"z": np.zeros(8, np.float16)}, {"n": 8, "dtype": "f16"})


def test_outputs_are_not_registered(fake):
    from ksearch_harness import dtypes
    out = fake.alloc(TensorSpec("y", "f16", (8,)))
    fake.upload(out, dtypes.get("f16").poison((8,), "a"))
    assert "y" not in fake._uploads


def test_host_later_converts_only_when_read():
    calls = []

    class Device:
        def __array__(self, dtype=None, copy=None):
            calls.append(dtype)
            return np.arange(3, dtype=np.float32)

    later = device.host(Device())
    assert calls == []
    arr = np.asarray(later, dtype=np.float64)
    assert arr.dtype == np.float64 and arr.tolist() == [0.0, 1.0, 2.0] and len(calls) == 1


# -- cuda: escaped work in timed calls -------------------------------------------------------


def _escape_verdict(event_ns: int, tail_ns: int, wall_ns: int, calls: int,
                    hold_ns: int = 0) -> Violation | None:
    """Feeds `calls` timed calls of these times to a fresh cuda adapter's escape check; the
    violation it raised, if any (no call follows it)."""
    a = cuda.CudaAdapter(_request("cuda"))
    device.deactivate()
    for _ in range(calls):
        try:
            a._check_escape(event_ns, tail_ns, wall_ns, hold_ns)
        except Violation as v:
            return v
    return None


def test_escape_check_needs_a_majority_of_suspicious_timed_calls():
    a = cuda.CudaAdapter(_request("cuda"))
    device.deactivate()
    # Honest: the device is idle microseconds after the stream's end event, except once when
    # the host thread was preempted for 2 ms between the two synchronizes.
    for tail_ns in [5_000] * 6 + [2_000_000]:
        a._check_escape(10_000, tail_ns, 40_000 + tail_ns, 50_000)
    # A side stream: ~2 us of work on the harness stream, the device busy for 1.5 ms more.
    assert _escape_verdict(2_000, 1_500_000, 1_530_000, calls=2) is None
    v = _escape_verdict(2_000, 1_500_000, 1_530_000, calls=3, hold_ns=250_000)
    assert v is not None and v.violation == "deferred_work" and "1500.0 us more" in v.message
    assert "behind a 250.0 us stream hold" in v.message
    # Long kernels on the stream leave no tail.
    assert _escape_verdict(5_000_000, 8_000, 5_050_000, calls=5) is None
    # The naive seed on the H200: 42.5 ms on the stream, then 145 us until the device was idle,
    # every call. Under 1% of the call: not a verdict.
    assert _escape_verdict(42_469_200, 145_300, 42_699_300, calls=5) is None
    # The same tail after a 2 ms call is 7% of it: that is hidden work, on the third call.
    assert _escape_verdict(2_000_000, 145_300, 2_230_000, calls=2) is None
    assert _escape_verdict(2_000_000, 145_300, 2_230_000, calls=3) is not None
    # Half the work moved off a 40 ms call is caught as well.
    assert _escape_verdict(20_000_000, 20_000_000, 40_100_000, calls=2) is None
    assert _escape_verdict(20_000_000, 20_000_000, 40_100_000, calls=3) is not None


# -- cuda: the stream check of untimed calls --------------------------------------------------


class _Tensor:
    def __init__(self, values):
        self.a = np.array(values)

    def clone(self):
        return _Tensor(self.a)


def _stream_check_adapter(late_write=None):
    """A cuda adapter over a stand-in for torch whose device-wide synchronize runs
    `late_write` (work that finished outside the harness stream)."""
    import contextlib
    import types
    a = cuda.CudaAdapter(_request("cuda"))
    device.deactivate()
    syncs = []

    def synchronize():
        syncs.append("device")
        if late_write is not None:
            late_write()

    a._torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(stream=lambda s: contextlib.nullcontext(),
                                   synchronize=synchronize),
        equal=lambda x, y: bool(np.array_equal(x.a, y.a)))
    a._stream = types.SimpleNamespace(synchronize=lambda: syncs.append("stream"))
    return a, syncs


def test_the_stream_check_compares_copies_taken_on_the_stream_after_a_device_sync():
    out = _Tensor([1.0, 2.0])
    a, syncs = _stream_check_adapter()
    a._stream_copies = a._copy_on_stream([out])
    a.check_after_call()
    assert syncs == ["stream", "device"] and a._stream_copies is None
    a.check_after_call()  # nothing pending: nothing to check, nothing synchronized
    assert syncs == ["stream", "device"]

    def late():
        out.a[1] = 7.0

    a, _ = _stream_check_adapter(late)
    a._stream_copies = a._copy_on_stream([out])
    with pytest.raises(Violation) as v:
        a.check_after_call()
    assert v.value.violation == "deferred_work" and "outside that stream" in v.value.message


# -- mlx: kernel names and dialects ---------------------------------------------------------


def test_kernel_names_carry_a_hash_of_the_code():
    a = mlx.kernel_name("attn", "out[0] = 1;")
    assert a.startswith("attn_") and len(a) == len("attn_") + mlx.KERNEL_HASH_CHARS
    assert a == mlx.kernel_name("attn", "out[0] = 1;")
    assert a != mlx.kernel_name("attn", "out[0] = 2;")
    assert a != mlx.kernel_name("attn", "out[0] = 1;", header="#define X 1")


def test_builders_are_wrapped_once_and_rename_kernels():
    made = []

    def cuda_kernel(name, input_names, output_names, source, header="", **kw):
        made.append((name, source, kw))
        return name

    fast = types.SimpleNamespace(cuda_kernel=cuda_kernel)
    mlx.install_hashing_builders(fast)
    mlx.install_hashing_builders(fast)  # idempotent
    name = fast.cuda_kernel("k", ["q"], ["out"], "out[0] = q[0];", shared_memory=64)
    assert name == mlx.kernel_name("k", "out[0] = q[0];")
    assert made == [(name, "out[0] = q[0];", {"shared_memory": 64})]
    name2 = fast.cuda_kernel(name="k", input_names=["q"], output_names=["out"],
                             source="out[0] = 2 * q[0];")
    assert name2 != name and name2.startswith("k_")
    assert not hasattr(fast, "metal_kernel")


def _mx(cuda_ok: bool, metal_ok: bool):
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: cuda_ok),
                                 metal=types.SimpleNamespace(is_available=lambda: metal_ok))


def test_machine_dialect_and_mismatches():
    assert mlx.machine_dialect(_mx(True, False), "linux") == "cuda"
    assert mlx.machine_dialect(_mx(False, True), "darwin") == "metal"
    assert mlx.machine_dialect(_mx(False, True), "linux") is None
    assert mlx.machine_dialect(_mx(False, False), "darwin") is None
    assert mlx.dialect_problem({"cuda"}, "cuda") is None
    assert mlx.dialect_problem({"cuda", "metal"}, "metal") is None
    assert mlx.dialect_problem(set(), "cuda") is None
    assert "builds only metal kernels" in mlx.dialect_problem({"metal"}, "cuda")
    assert "no GPU" in mlx.dialect_problem({"cuda"}, None)


def _uploaded_f16_input(fake):
    """One f16 input `x` uploaded to `fake`: its device buffer, the workload's params, and the
    host arrays a reference call would be given (equal to the upload, another array object)."""
    from ksearch_harness import dtypes
    buf = fake.alloc(TensorSpec("x", "f16", (8,)))
    fake.upload(buf, dtypes.get("f16").encode(np.arange(8.0)))
    return buf, {"n": 8, "dtype": "f16"}, {"x": np.arange(8.0).astype(np.float16)}


def test_inputs_matched_before_a_timed_call_cost_it_no_matching(fake, monkeypatch):
    buf, params, given = _uploaded_f16_input(fake)
    fake.expect_reference_inputs(given, params)  # untimed: the sampled comparison runs here

    def no_matching(up, x):
        raise AssertionError("matched inside the timed region")

    monkeypatch.setattr(device, "_quick_match", no_matching)
    got = fake.timed_region(lambda: fake.reference_inputs(given, params))["x"]
    assert got is buf
    fake.verify_reference_inputs()  # the full comparison still runs after the call
    # The expectation lasts one timed call: the next one matches again (and here fails to).
    with pytest.raises(AssertionError, match="inside the timed region"):
        fake.timed_region(lambda: fake.reference_inputs(given, params))


def test_an_expected_array_changed_before_the_call_is_still_caught(fake):
    buf, params, given = _uploaded_f16_input(fake)
    fake.expect_reference_inputs(given, params)
    given["x"][5] = 99  # the same array object, other values
    got = fake.timed_region(lambda: fake.reference_inputs(given, params))["x"]
    assert got is buf
    with pytest.raises(TaskError, match="did not hold that call's inputs"):
        fake.verify_reference_inputs()


class _DeviceClock:
    """A stand-in for torch.cuda with a device clock: `_sleep` queues busy work, events
    record when the queue reaches them, and host time (perf_counter) passes as the test says."""

    def __init__(self, monkeypatch):
        import time as _time
        import types
        self.host = 0
        self.queue_end = 0  # when the device finishes what is queued
        self.sleeps: list[int] = []
        monkeypatch.setattr(_time, "perf_counter_ns", lambda: self.host)
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = 0

            def record(self, stream=None):
                clock.queue_end = max(clock.queue_end, clock.host)
                self.t = clock.queue_end

            def synchronize(self):
                clock.host = max(clock.host, self.t)

            def elapsed_time(self, end):
                return (end.t - self.t) / 1e6

        def _sleep(cycles):
            clock.sleeps.append(cycles)
            clock.queue_end = max(clock.queue_end, clock.host) + cycles  # 1 cycle per ns
            clock.host += clock.sleep_launch_ns

        self.sleep_launch_ns = 0  # host time of the hold's launch

        self.cuda = types.SimpleNamespace(
            Event=Event, _sleep=_sleep, synchronize=lambda: None,
            Stream=lambda: types.SimpleNamespace(synchronize=lambda: None),
            set_stream=lambda s: None)

    def launch(self, host_ns: int, device_ns: int):
        """A call that spends `host_ns` on the host, then queues `device_ns` of work."""
        def fn():
            self.host += host_ns
            self.queue_end = max(self.queue_end, self.host) + device_ns
        return fn


def test_timed_cuda_calls_hold_the_stream_while_the_host_enqueues(monkeypatch):
    """The start event waits behind a busy kernel long enough for the enqueue, so the host's
    launch overhead stays out of the device time; a candidate's call reports the longer of its
    device time and its own host time (host work hidden behind the hold), the task's calls
    their device time; the harness's own work in the timed region (the hold's launch, input
    lookups) is no one's host time."""
    clock = _DeviceClock(monkeypatch)
    a = cuda.CudaAdapter(_request("cuda"))
    monkeypatch.setattr(a, "_torch_mod", lambda: clock)
    monkeypatch.setattr(a, "_device_sync", lambda when: None)
    monkeypatch.setattr(a, "verify_reference_inputs", lambda: None)
    monkeypatch.setattr(a, "_check_escape", lambda *args: None)
    a._stream = object()
    a._events = (clock.cuda.Event(), clock.cuda.Event())
    a._hold_ns = cuda.HOLD_MARGIN_NS
    a._cycles_per_ns = 1.0
    # The first call's enqueue (300 us) outlasts the initial hold: the device idled after the
    # start event. The hold grows from what it saw.
    first, _ = a.time_call(clock.launch(host_ns=300_000, device_ns=100_000))
    assert first > 100_000
    assert a._hold_ns == int(cuda.HOLD_FACTOR * 300_000) + cuda.HOLD_MARGIN_NS
    assert clock.sleeps[-1] < a._hold_ns
    # Behind the grown hold, a call queued in 50 us counts its 100 us on the device ...
    for _ in range(3):
        quick = clock.launch(host_ns=50_000, device_ns=100_000)
        quick.ksearch_candidate = True
        ns, _ = a.time_call(quick)
        assert ns == 100_000
    assert clock.sleeps[-1] == a._hold_ns
    # ... and a candidate whose call does 2 ms of host work to queue 10 us reports the 2 ms;
    # the task's own code counts its device time, its host part kept for the judge.
    slow = clock.launch(host_ns=2_000_000, device_ns=10_000)
    slow.ksearch_candidate = True
    a._hold_ns = cuda.HOLD_MAX_NS
    ns, _ = a.time_call(slow)
    assert ns == 2_000_000 and a.last_parts == {"device_ns": 10_000, "host_ns": 2_000_000,
                                                "tail_ns": 0, "hold_ns": cuda.HOLD_MAX_NS}
    ns, _ = a.time_call(clock.launch(host_ns=2_000_000, device_ns=10_000))
    assert ns == 10_000 and a.last_parts["host_ns"] == 2_000_000
    # The harness's input lookups inside the task's call are not the task's host time: 200 us
    # of lookup and 10 us of dispatch.
    dispatch = clock.launch(host_ns=10_000, device_ns=100_000)

    def baseline():
        clock.host += 200_000
        a.helper_ns += 200_000
        dispatch()
    ns, _ = a.time_call(baseline)
    assert ns == 100_000 and a.last_parts["host_ns"] == 10_000
    # The harness's own launches are not the candidate's: with a hold launch that takes
    # 150 us of host time (a profiler attached), a 100 us kernel queued in 10 us counts 100 us.
    clock.sleep_launch_ns = 150_000
    quick = clock.launch(host_ns=10_000, device_ns=100_000)
    quick.ksearch_candidate = True
    a._hold_ns = cuda.HOLD_MARGIN_NS
    for _ in range(3):
        ns, _ = a.time_call(quick)
    assert ns == 100_000


def test_a_candidate_is_charged_host_time_only_beyond_its_anchors():
    """adapters.charged_ns: device time, or the host time beyond the anchor's in the same
    repetition where longer, never below the judge's window bound less the anchor's host time
    that its device time did not hide; without parts or the anchor's host time the reported
    figure stands (TimedCall.charged)."""
    from ksearch_harness.accused_client import TimedCall
    from ksearch_harness.adapters import charged_ns
    # The copy task on the H200 (cuda): 12 us on the device, 40 us to enqueue, the baseline's
    # clone 45 us to enqueue: the device time.
    clone = {"device_ns": 12_000, "host_ns": 45_000}
    assert charged_ns({"device_ns": 12_000, "host_ns": 40_000}, clone) == 12_000
    # 2 ms of host work behind a 10 us launch: all but the anchor's 50 us.
    assert charged_ns({"device_ns": 10_000, "host_ns": 2_000_000},
                      {"device_ns": 10_000, "host_ns": 50_000}) == 1_950_000
    # A device-bound anchor (its launch hidden behind 700 us on the device): the window bound
    # stands whole, so a forged device time is charged the window less a round trip.
    sdpa = {"device_ns": 700_000, "host_ns": 30_000}
    assert charged_ns({"device_ns": 1_000, "host_ns": 20_000}, sdpa, floor_ns=650_000) == 650_000
    # A launch-bound anchor (1.2 ms on the host for 10 us on the device) and a candidate like
    # it: the window bound less the anchor's unhidden host time leaves the device time.
    copy = {"device_ns": 10_000, "host_ns": 1_200_000}
    assert charged_ns({"device_ns": 10_000, "host_ns": 1_190_000}, copy,
                      floor_ns=1_150_000) == 10_000
    # ... and a candidate that forges its device time is still charged the window's excess.
    assert charged_ns({"device_ns": 10_000, "host_ns": 1_190_000}, copy,
                      floor_ns=1_190_000 + 500_000) == 500_000
    assert charged_ns({"device_ns": 12_000}, clone) is None
    assert charged_ns({"device_ns": 12_000, "host_ns": 40_000}, None) is None
    assert charged_ns({"device_ns": 12_000, "host_ns": 40_000}, {"device_ns": 1}) is None
    t = TimedCall(counted_ns=40_000, reported_ns=40_000, window_ns=300_000,
                  parts={"device_ns": 12_000, "host_ns": 40_000}, floor_ns=5_000)
    assert t.charged(clone) == 12_000 and t.charged(None) == 40_000
    assert TimedCall(counted_ns=40_000, reported_ns=40_000, window_ns=300_000
                     ).charged({"host_ns": 1}) == 40_000


def test_a_kept_read_only_set_shares_one_read_only_view_per_input():
    """Kept input sets are read-only (draw_cache); their reference views are made once and
    shared, read-only, so repeated timed calls neither copy nor decode them again. A writable
    set still gets private copies."""
    import gc

    from ksearch_harness import dtypes
    from ksearch_harness.protocol import TensorSpec
    from ksearch_harness.task_code import Inputs

    specs = (TensorSpec("x", "bf16", (8,)), TensorSpec("y", "f16", (8,)))
    stored = {"x": dtypes.get("bf16").encode(np.linspace(-1, 1, 8)),
              "y": dtypes.get("f16").encode(np.linspace(0, 2, 8))}
    writable = Inputs({k: v.copy() for k, v in stored.items()}, specs)
    a, b = writable.for_reference(shared=True), writable.for_reference(shared=True)
    assert a["x"] is not b["x"] and a["y"] is not b["y"] and a["y"].flags.writeable

    for v in stored.values():
        v.flags.writeable = False
    kept = Inputs(stored, specs)
    a, b = kept.for_reference(shared=True), kept.for_reference(shared=True)
    assert a["x"] is b["x"] and a["y"] is b["y"]
    assert a["x"].dtype == np.float32 and np.array_equal(
        a["x"], dtypes.get("bf16").reference_view(stored["x"]))
    with pytest.raises(ValueError):
        a["x"][0] = 5  # a task function cannot change a kept set through its view
    # Without `shared`, private copies as before.
    assert kept.for_reference()["y"] is not a["y"]
    # A view leaves with its array.
    before = len(dtypes._SHARED_VIEWS)
    del kept, a, b, stored, v
    gc.collect()
    assert len(dtypes._SHARED_VIEWS) == before - 2


def test_a_timed_call_handed_the_shared_view_of_the_uploaded_set_needs_no_comparison(
        fake, monkeypatch):
    from ksearch_harness import dtypes
    stored = dtypes.get("bf16").encode(np.linspace(-2, 2, 8))
    stored.flags.writeable = False
    buf = fake.alloc(TensorSpec("x", "bf16", (8,)))
    fake.upload(buf, stored)
    params = {"n": 8, "dtype": "bf16"}
    view = dtypes.get("bf16").shared_reference_view(stored)
    compared = []
    real = dtypes.same_bytes
    monkeypatch.setattr(dtypes, "same_bytes", lambda *a: compared.append(1) or real(*a))
    got = fake.timed_region(lambda: device.torch_inputs({"x": view}, params))["x"]
    assert got is buf
    fake.verify_reference_inputs()
    assert compared == []
    # Any other array still gets the full comparison, and a different one is caught.
    other = view.copy()
    other[2] = 7
    monkeypatch.setattr(device, "_quick_match", lambda up, x: True)
    fake.timed_region(lambda: device.torch_inputs({"x": other}, params))
    with pytest.raises(TaskError, match="did not hold that call's inputs"):
        fake.verify_reference_inputs()
