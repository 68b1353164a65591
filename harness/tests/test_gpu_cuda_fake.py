"""The cuda adapter end to end through core.evaluate, on a numpy stand-in for PyTorch.

CI has nvcc but no GPU (and no torch), so the candidates here are CUDA C++ sources whose entry
points run on the host: nvcc builds them exactly as it builds real kernels, and `FakeTorch`
hands out host buffers where PyTorch would hand out device memory. A device-wide synchronize
of the fake can be told to take time (work still running elsewhere) or to fail the way a
sticky CUDA error does. What this proves is the adapter's glue under every check of core.py:
`{dtype}` entry resolution per workload, the stream argument, error codes, sticky errors,
work escaping the stream, the registry of device inputs for timed reference calls. Real GPU
behaviour is checked by harness/tests/gpu_smoke.py on the device.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

import driver
from ksearch_harness import worker
from ksearch_harness.adapters import cuda, device
from ksearch_harness.protocol import Entry, parse_request

pytestmark = pytest.mark.skipif(cuda.find_nvcc() is None, reason="nvcc not installed")


FAKE_TORCH = Path(__file__).resolve().parent / "fake_torch"


def _load_fake_torch():
    """FakeTorch, loaded by path: putting fake_torch/ on sys.path would make `import torch`
    find the fake in every test that runs after these (the accused gets it on its PYTHONPATH,
    through the fixture below, instead)."""
    spec = importlib.util.spec_from_file_location("fake_torch_impl",
                                                  FAKE_TORCH / "fake_torch_impl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeTorch


FakeTorch = _load_fake_torch()


@pytest.fixture(params=["off", "emulate"])
def torch(monkeypatch, request):
    """The judge's fake (this process) and the accused's (a child importing the fake package
    from PYTHONPATH, configured through $KSEARCH_FAKE_TORCH by `accused_settings`). Every test
    runs twice: the judge reaching the accused's buffers through the host arena (`off`), and
    sharing their memory (device_share, `emulate`: a memfd stands in for device memory)."""
    monkeypatch.setenv("KSEARCH_HARNESS_DEVICE_SHARE", request.param)
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.cuda", fake.cuda)
    path = os.pathsep.join([str(FAKE_TORCH)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("KSEARCH_HARNESS_ACCUSED_ENV", "KSEARCH_FAKE_TORCH")
    monkeypatch.setenv("KSEARCH_FAKE_TORCH", "{}")
    yield fake
    device.deactivate()


def accused_settings(monkeypatch, **settings) -> None:
    monkeypatch.setenv("KSEARCH_FAKE_TORCH", json.dumps(settings))


def accused_syncs(capfd) -> int:
    captured = capfd.readouterr()
    return (captured.out + captured.err).count("FAKETORCH sync")


REFERENCE = '''
import numpy as np


def reference(inputs, params):
    return {"y": np.asarray(inputs["x"], dtype=np.float64) * 2}


def reference_torch(inputs, params):
    from ksearch_harness.adapters import device
    if not device.timed():
        return reference(inputs, params)
    t = device.torch_inputs(inputs, params)
    return {"y": device.host(t["x"].float() * 2.0)}


def baseline_torch(inputs, params):
    from ksearch_harness.adapters import device
    t = device.torch_inputs(inputs, params)
    return {"y": device.host(t["x"] * 2.0)}
'''

HEAD = """
#include <cuda_fp16.h>
#include <stdint.h>
#include <pthread.h>
#include <time.h>
"""

HONEST = HEAD + """
extern "C" int scale_f16(const void* x, void* y, int64_t n, void* stream) {
  if (stream == 0) return 1;
  for (int64_t i = 0; i < n; ++i)
    ((__half*)y)[i] = __float2half(2.f * __half2float(((const __half*)x)[i]));
  return 0;
}
extern "C" int scale_f32(const void* x, void* y, int64_t n, void* stream) {
  if (stream == 0) return 1;
  for (int64_t i = 0; i < n; ++i) ((float*)y)[i] = 2.f * ((const float*)x)[i];
  return 0;
}
"""

CANDIDATES = {
    # A launch that fails and says so.
    "bad_launch": HEAD + """
extern "C" int scale_f16(const void* x, void* y, int64_t n, void* s) { return 9; }
extern "C" int scale_f32(const void* x, void* y, int64_t n, void* s) { return 9; }
""",
    # An illegal address: the error code, and a context that fails every later call.
    "illegal_address": HEAD + """
extern "C" int scale_f16(const void* x, void* y, int64_t n, void* s) { return 700; }
extern "C" int scale_f32(const void* x, void* y, int64_t n, void* s) { return 700; }
""",
    # The work finishes after the call returns, the way a kernel on a side stream does.
    "escapes_the_stream": HEAD + """
struct job { const float* x; float* y; int64_t n; };
static void* late(void* p) {
  struct job* j = (struct job*)p;
  struct timespec t = {0, 20 * 1000 * 1000};
  nanosleep(&t, 0);
  for (int64_t i = 0; i < j->n; ++i) j->y[i] = 2.f * j->x[i];
  delete j;
  return 0;
}
static int start(const void* x, void* y, int64_t n) {
  pthread_t t;
  pthread_create(&t, 0, late, new job{(const float*)x, (float*)y, n});
  pthread_detach(t);
  return 0;
}
extern "C" int scale_f16(const void* x, void* y, int64_t n, void* s) { return start(x, y, n / 2); }
extern "C" int scale_f32(const void* x, void* y, int64_t n, void* s) { return start(x, y, n); }
""",
    # Writes into its input (on a GPU the input lives in the memory the judge shares).
    "writes_its_input": HEAD + """
extern "C" int scale_f16(const void* x, void* y, int64_t n, void* s) {
  for (int64_t i = 0; i < n; ++i)
    ((__half*)y)[i] = __float2half(2.f * __half2float(((const __half*)x)[i]));
  ((__half*)x)[n - 1] = __float2half(0.f);
  return 0;
}
extern "C" int scale_f32(const void* x, void* y, int64_t n, void* s) {
  for (int64_t i = 0; i < n; ++i) ((float*)y)[i] = 2.f * ((const float*)x)[i];
  ((float*)x)[n - 1] = 0.f;
  return 0;
}
""",
    # Only one of the two dtype entry points.
    "f32_only": HEAD + """
extern "C" int scale_f32(const void* x, void* y, int64_t n, void* stream) {
  for (int64_t i = 0; i < n; ++i) ((float*)y)[i] = 2.f * ((const float*)x)[i];
  return 0;
}
""",
}


def _workload(name: str, dtype: str, n: int, held_out: bool = False) -> dict:
    return {"name": name, "held_out": held_out, "params": {"n": n, "dtype": dtype},
            "inputs": [{"name": "x", "dtype": dtype, "shape": [n],
                        "dist": {"kind": "normal", "mean": 0.0, "std": 1.0}}],
            "outputs": [{"name": "y", "dtype": dtype, "shape": [n]}],
            "flops": float(n), "bytes": 4.0 * n}


def _evaluate(tmp_path: Path, source: str, scalar: bool = False) -> dict:
    """`scalar`: the workloads get a 0-d input `alpha` (an entry argument after `x`) that the
    reference multiplies in, as imported FlashInfer-Bench definitions' scalars are."""
    return worker.execute(_request(tmp_path, source, scalar), roofline_override=(1e15, 1e18))


def _request(tmp_path: Path, source: str, scalar: bool = False):
    task = tmp_path / "task"
    task.mkdir(exist_ok=True)
    (task / "reference.py").write_text(SCALAR_REFERENCE if scalar else REFERENCE)
    cand = tmp_path / "candidate.cu"
    cand.write_text(textwrap.dedent(source))
    raw = {
        "protocol": 1, "op": "evaluate", "nonce": driver.NONCE,
        "secret_seed": driver.SECRET_SEED, "backend": "cuda",
        "task": {"name": "scale", "dir": str(task),
                 "reference": {"module": "reference.py", "function": "reference_torch"},
                 "baseline": {"name": "torch", "function": "baseline_torch"},
                 "entry": {"symbol": "scale_f16", "args": ["x", "y", "n"]},
                 "forbidden": ["reference", "reference_torch", "baseline_torch"]},
        "candidate": {"path": str(cand), "language": "cuda"},
        "build_dir": str(tmp_path / "build"),
        "workloads": [_workload("f16-64", "f16", 64), _workload("f32-100", "f32", 100),
                      _workload("f32-37", "f32", 37, held_out=True)],
        "correctness": {"trials": 2},
        "timing": {"warmup": 1, "min_reps": 3, "max_reps": 4, "target_seconds": 0.001,
                   "flush_bytes": 1 << 16},
        "timeout_s": 120,
    }
    args: tuple[str, ...] = ("x", "y", "n")
    if scalar:
        args = ("x", "alpha", "y", "n")
        for wl in raw["workloads"]:
            wl["inputs"].append({"name": "alpha", "dtype": wl["params"]["dtype"], "shape": [],
                                 "dist": {"kind": "uniform", "low": 1.0, "high": 2.0}})
    req = parse_request(raw, "evaluate")
    # protocol.py still insists on a plain identifier; the adapters resolve `{dtype}` per
    # workload (docs/backends.md lists the protocol change this needs).
    return dataclasses.replace(req, task=dataclasses.replace(
        req.task, entry=Entry("scale_{dtype}", args)))


def test_honest_candidate_passes_with_dtype_resolved_per_workload(tmp_path, torch, capfd):
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    assert r["build"]["ptxas"]["kernels"] == []  # host code only
    assert r["build"]["arch"].startswith("sm_")
    env = r["environment"]
    assert env["gpu"] == "Fake H200" and env["compute_capability"] == "9.0"
    assert env["compiler"].startswith("nvcc")
    timed = [w for w in r["workloads"] if not w["held_out"]]
    assert all(len(w["candidate_ns"]) >= 3 and w["baseline_median_ns"] for w in timed)
    # Each figure the accused reported is the longer of its two parts, both on record.
    for w in timed:
        parts = w["candidate_parts_ns"]
        assert list(zip(parts["device_ns"], parts["host_ns"]))
        assert [max(d, h) for d, h in zip(parts["device_ns"], parts["host_ns"])] == \
            w["candidate_reported_ns"]
        # The judge's own timed calls of the anchor keep their parts too: its figure is the
        # device part, and its host part is what the candidate's charge is set against.
        anchor = w["anchor_parts_ns"]
        assert anchor["device_ns"] == w[f"{w['anchor']}_ns"]
        assert len(anchor["host_ns"]) == len(w["candidate_ns"])
    # Every untimed call in the accused was followed by a device-wide synchronize (the stream
    # check).
    assert accused_syncs(capfd) > 2 * 2 * 3


def test_the_judge_draws_large_inputs_on_the_device(tmp_path, torch, monkeypatch):
    """The cuda judge draws large float inputs with the device's generator (here the fake's,
    drawing with numpy): an evaluation passes on them, and its trials still differ."""
    from ksearch_harness import task_code
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 50)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    assert torch.generators_made >= 2 * 3  # two trials of three workloads at least


SCALAR_REFERENCE = '''
import numpy as np


def reference(inputs, params):
    assert np.shape(inputs["alpha"]) == (), np.shape(inputs["alpha"])
    return {"y": np.asarray(inputs["x"], dtype=np.float64) * np.float64(inputs["alpha"])}


def reference_torch(inputs, params):
    from ksearch_harness.adapters import device
    if not device.timed():
        return reference(inputs, params)
    t = device.torch_inputs(inputs, params)
    return {"y": device.host(t["x"].float() * t["alpha"].float())}


def baseline_torch(inputs, params):
    from ksearch_harness.adapters import device
    t = device.torch_inputs(inputs, params)
    return {"y": device.host(t["x"] * t["alpha"])}
'''

SCALED = HEAD + """
extern "C" int scale_f16(const void* x, const void* a, void* y, int64_t n, void* stream) {
  float alpha = __half2float(*(const __half*)a);
  for (int64_t i = 0; i < n; ++i)
    ((__half*)y)[i] = __float2half(alpha * __half2float(((const __half*)x)[i]));
  return 0;
}
extern "C" int scale_f32(const void* x, const void* a, void* y, int64_t n, void* stream) {
  for (int64_t i = 0; i < n; ++i) ((float*)y)[i] = *(const float*)a * ((const float*)x)[i];
  return 0;
}
"""


def test_a_scalar_input_keeps_its_shape_on_the_device(tmp_path, torch):
    """A 0-d input travels as a 0-d device tensor, in correctness and in the timed reference
    and baseline calls (np.ascontiguousarray alone made it shape (1,), which torch's copy_
    into a 0-d tensor refuses)."""
    r = _evaluate(tmp_path, SCALED, scalar=True)
    assert r["status"] == "passed", (r["status"], r["message"])
    timed = [w for w in r["workloads"] if not w.get("held_out")]
    assert timed and all(w["baseline_ns"] for w in timed)


def test_timed_calls_pair_the_candidate_with_the_baseline(tmp_path, torch):
    """On a GPU backend the candidate's timed calls are paired with the baseline's (the
    anchor); the reference runs in every repetition for the outputs the timed call is
    checked against, untimed, and the speedup is the median of the paired ratios."""
    from ksearch_harness import intervals
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    for w in (w for w in r["workloads"] if not w.get("held_out")):
        assert w["anchor"] == "baseline"
        assert w["reference_ns"] == [] and len(w["baseline_ns"]) == len(w["candidate_ns"]) >= 3
        paired = intervals.paired_ratios(w["baseline_ns"], w["candidate_ns"])
        assert w["speedup_vs_baseline"] == intervals.median(paired)


def test_by_default_host_outputs_are_compared_on_the_device(tmp_path, torch, monkeypatch):
    """KSEARCH_HARNESS_DEVICE_CHECKS unset (`auto`): outputs read back through the host arena
    (sharing off) are compared on the judge's device; shared outputs are there already and
    count as none. The honest candidate passes and the offset one fails, either way."""
    monkeypatch.delenv("KSEARCH_HARNESS_DEVICE_CHECKS", raising=False)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", r["message"]
    shared = os.environ["KSEARCH_HARNESS_DEVICE_SHARE"] == "emulate"
    assert (r["diagnostics"]["host_outputs_compared_on_device"] > 0) == (not shared)
    off_by_one = HONEST.replace("2.f * __half2float", "1.f + 2.f * __half2float")
    wrong = _evaluate(tmp_path, off_by_one)
    assert wrong["status"] == "incorrect", wrong["message"]


def test_error_codes_are_runtime_errors(tmp_path, torch):
    r = _evaluate(tmp_path, CANDIDATES["bad_launch"])
    assert r["status"] == "runtime_error"
    assert "returned CUDA error 9 (cudaErrorInvalidConfiguration)" in r["message"]


def test_sticky_error_ends_the_evaluation(tmp_path, torch, monkeypatch, capfd):
    accused_settings(monkeypatch, sticky="an illegal memory access was encountered")
    r = _evaluate(tmp_path, CANDIDATES["illegal_address"])
    assert r["status"] == "runtime_error"
    assert "illegal memory access" in r["message"] and "fresh one" in r["message"]
    assert accused_syncs(capfd) == 1  # nothing touched the lost context afterwards


def test_work_escaping_the_stream_is_deferred_work(tmp_path, torch, monkeypatch):
    accused_settings(monkeypatch, sync_delay_s=0.1)  # the wait outlasts the late writes
    r = _evaluate(tmp_path, CANDIDATES["escapes_the_stream"])
    assert r["status"] == "integrity_violation"
    assert r["violation"]["class"] == "deferred_work"
    assert "outside that stream" in r["message"]


def test_a_missing_dtype_entry_point_is_a_build_error(tmp_path, torch):
    r = _evaluate(tmp_path, CANDIDATES["f32_only"])
    assert r["status"] == "build_error"
    assert "does not export `scale_f16`" in r["message"]


def test_device_busy_after_the_stream_in_timed_calls_is_deferred_work(tmp_path, torch,
                                                                    monkeypatch):
    """Outputs already final on the stream, yet the device stays busy after each call (a
    side-stream kernel whose work does not show in the outputs checked): the timed calls'
    tails give it away."""
    accused_settings(monkeypatch, sync_delay_s=0.002)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "integrity_violation", (r["status"], r["message"])
    assert r["violation"]["class"] == "deferred_work"
    assert "still busy after the harness stream had finished" in r["message"]


def test_the_judge_shares_the_accused_device_memory_where_it_can(tmp_path, torch):
    """With sharing (emulated here) every buffer the candidate sees lives in memory the judge
    maps too, and the result says so; with it turned off, the host arena carries the data."""
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    share = r["diagnostics"]["device_share"]
    reads = r["diagnostics"]["outputs_read_to_host"]
    if os.environ["KSEARCH_HARNESS_DEVICE_SHARE"] == "emulate":
        assert share == {"active": True, "detail": ""}
        # Every check of an honest kernel's outputs ran where the outputs are.
        assert reads == 0
    else:
        assert share["active"] is False and "turned off" in share["detail"]
        assert reads >= r["diagnostics"]["candidate_calls"]


def test_device_checks_of_a_call_run_inside_its_settle_window(tmp_path, torch, monkeypatch):
    """Where the outputs are checked on the device, each correctness call's comparison runs
    while the judge watches the accused after the call (its settle window) rather than after
    it; host checks keep waiting for the window to close."""
    from ksearch_harness import accused_client, core
    windows = {"with": 0, "without": 0}
    settle = accused_client.AccusedProcess.settle

    def counting(self, seconds, during=None):
        if seconds == core.SETTLE_SHORT_S:  # a correctness call's window (timed calls: shorter)
            windows["with" if during is not None else "without"] += 1
        return settle(self, seconds, during)

    monkeypatch.setattr(accused_client.AccusedProcess, "settle", counting)
    r = _evaluate(tmp_path, HONEST)
    assert r["status"] == "passed", (r["status"], r["message"])
    assert windows["with"] + windows["without"] > 0
    if os.environ["KSEARCH_HARNESS_DEVICE_SHARE"] == "emulate":
        assert windows["without"] == 0, windows
    else:
        assert windows["with"] == 0, windows


def test_a_candidate_writing_its_input_is_caught(tmp_path, torch):
    """The judge checks the accused's inputs after every call: against its own device copy
    where the memory is shared, against the drawn set otherwise."""
    r = _evaluate(tmp_path, CANDIDATES["writes_its_input"])
    assert r["status"] == "integrity_violation", (r["status"], r["message"])
    assert r["violation"]["class"] == "input_mutated"
    assert "input `x` was modified" in r["message"]


def test_a_gpu_judge_starts_the_next_accused_ahead(tmp_path, torch, monkeypatch):
    """A persistent judge (spare_accused and draw_cache on) starts the next evaluation's
    accused during the current one: the second evaluation takes it, finds its input sets kept
    (with a device copy of each where the memory is shared), and its result is the same;
    closing the judge leaves no process directory or log behind."""
    import tempfile

    from ksearch_harness import spare_accused

    def ours() -> set[str]:
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("ksearch-accused")}

    from ksearch_harness import draw_cache

    from ksearch_harness.task_code import Inputs
    views = []
    real = Inputs.for_reference

    def recorded(self, shared=False):
        out = real(self, shared)
        if shared:
            views.append((self, out))
        return out

    monkeypatch.setattr(Inputs, "for_reference", recorded)
    # While an evaluation is timed, the spare it started (still starting or ready) is stopped,
    # every thread of it; it goes on afterwards.
    from ksearch_harness import core
    from ksearch_harness.accused_client import thread_states
    untimed = core.Evaluation.timing
    spare_states = []

    def timing(self):
        spares = spare_accused._spares
        assert len(spares) == 2  # the pinned depth
        spare_states.append({s for spare in spares
                             for s, _ in thread_states(spare.process.pid).values()})
        return untimed(self)

    monkeypatch.setattr(core.Evaluation, "timing", timing)
    noted: list[float] = []
    note_ready = spare_accused.note_ready
    monkeypatch.setattr(spare_accused, "note_ready",
                        lambda seconds: (noted.append(seconds), note_ready(seconds)))
    before = ours()
    # Two spares (a depth pinned by the environment: the measured one is
    # test_persistent_judge's), so that a 2-core machine starts few processes.
    monkeypatch.setenv(spare_accused.ENV, "2")
    spare_accused.enable()
    draw_cache.clear()
    draw_cache.enable()
    try:
        req = _request(tmp_path, HONEST)  # one task on disk: the draw cache's keys hold
        first = worker.execute(req, roofline_override=(1e15, 1e18))
        second = worker.execute(req, roofline_override=(1e15, 1e18))
        # With shared device memory the kept input sets keep a device copy too, which the
        # second evaluation copied from (on the device).
        kept = [v for k, v in draw_cache._entries.items() if k[0] == "inputs"]
        assert kept and second["diagnostics"]["draw_cache"]["hits"] > 0
        shared = os.environ["KSEARCH_HARNESS_DEVICE_SHARE"] == "emulate"
        assert all(draw_cache.device_kept(v) == shared for v in kept)
        # So do the truths the checks on the device compare with: shared outputs, or, with
        # sharing off, outputs read to the host and copied up (device_checks, by default).
        kept_truths = [v for k, v in draw_cache._entries.items() if k[0] != "inputs"]
        assert any(draw_cache.device_kept(t) for t in kept_truths)
        # Their timed baseline calls were handed the kept sets' shared read-only views, made
        # once, not a private copy per call (Inputs.for_reference).
        handed = [(inputs, out) for inputs, out in views if any(inputs is k for k in kept)]
        assert handed and all(not x.flags.writeable for _, out in handed for x in out.values())
        seen: dict = {}
        for inputs, out in handed:  # the same objects every time a set is handed over
            assert all(x is seen.setdefault((id(inputs), n), x) for n, x in out.items())
        assert len(handed) > len(seen) / len(handed[0][1])  # and sets were handed over again
    finally:
        spare_accused.enable(False)
        draw_cache.clear()
        draw_cache.enable(False)
    assert first["status"] == second["status"] == "passed", (first["message"],
                                                            second["message"])
    assert first["diagnostics"]["accused_prestarted"] is False
    assert second["diagnostics"]["accused_prestarted"] is True
    assert spare_states and all(states and states <= set("Tt") for states in spare_states), \
        spare_states
    # Where each accused's start-up went: from the launch to the harness's main, the device's
    # steps, the lock-down, and how long the judge waited for it.
    for result in (first, second):
        start = result["diagnostics"]["accused_start_seconds"]
        assert {"main", "import", "lockdown", "waited"} <= set(start), start
        assert all(v >= 0 for v in start.values()), start
        assert result["diagnostics"]["spare_accused_depth"] == 2
    # Each accused's launch-to-ready went into the measured depth, once.
    assert len(noted) == 2 and all(n > 0 for n in noted), noted
    assert noted[1] == pytest.approx(sum(v for k, v in second["diagnostics"][
        "accused_start_seconds"].items() if k != "waited"), abs=1e-3)
    errors = [(w["name"], w["max_abs_err"]) for w in first["workloads"]]
    assert [(w["name"], w["max_abs_err"]) for w in second["workloads"]] == errors
    assert ours() - before == set()


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_staged_inputs_filled_on_the_device_hold_the_set_and_serve_timed_calls(torch, dtype):
    """A kept input set's device copy (core._device_copy, storage bits) fills the judge's
    staged inputs on the device (upload_bits): the buffer then holds the set bit for bit, and a
    timed reference call handed the set gets that buffer, checked in full after the call."""
    import numpy as np

    from ksearch_harness import core, dtypes
    from ksearch_harness.protocol import TensorSpec

    wl = {"name": "w", "held_out": False, "params": {"n": 8},
          "inputs": [{"name": "x", "dtype": dtype, "shape": [8]}],
          "outputs": [{"name": "y", "dtype": dtype, "shape": [8]}]}
    raw = driver.softmax_request("/tmp/k.cu", "/tmp/b", backend="cuda")
    raw["workloads"] = [wl]
    raw["task"]["entry"] = {"symbol": "scale", "args": ["x", "y", "n"]}
    req = parse_request(raw, "evaluate")
    a = cuda.CudaAdapter(req)
    spec = TensorSpec("x", dtype, (8,))
    stored = dtypes.get(dtype).encode(np.linspace(-3, 3, 8))
    buf = a.alloc(spec)
    a.upload_bits(buf, core._device_copy(stored, spec), stored)
    assert dtypes.same_bytes(a.to_host(buf), stored)
    given = {"x": dtypes.get(dtype).reference_view(stored).copy()}
    got = a.timed_region(lambda: device.torch_inputs(given, {"n": 8}))["x"]
    assert got is buf.tensor
    a.verify_reference_inputs()


def test_the_idle_probe_times_a_tiny_piece_of_the_judges_own_work(torch):
    """What the device gate's wait for an idle device asks (device_gate.wait_for_idle): a
    duration in seconds, of the judge's own work on its device, each time."""
    raw = driver.softmax_request("/tmp/k.cu", "/tmp/b", backend="cuda")
    a = cuda.CudaAdapter(parse_request(raw, "evaluate"))
    probes = [a.idle_probe_seconds() for _ in range(3)]
    assert all(isinstance(p, float) and 0 <= p < 1 for p in probes)
    assert a._probe is not None  # one buffer, made once
