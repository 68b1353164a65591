"""What `ksearch bench` runs: ``python -m ksearch_harness.bench bench --result-fd N``.

One process, one run: for each workload of the request, the candidate kernel (built, loaded,
called and timed by its backend's adapter, as `evaluate` does), PyTorch's
``scaled_dot_product_attention`` and MLX's ``mx.fast.scaled_dot_product_attention`` (whichever
are importable and have a GPU), on the same inputs. Comparing them in one process removes the
run-to-run drift of clocks and of the MLX per-call overhead from the ratios.

This is a measurement, not a verdict: besides the static checks it only checks every output
against the task's reference with the request's tolerance (poisoned before the first call, and
the output of the last timed call again), and reports rather than stops on a failure.

Timing: `warmup` untimed rounds, then `reps` timed rounds; a round makes one call of every
contender, each after a cache flush, in an order that rotates from round to round (so clock and
per-call drift lands on all of them alike). Per contender the samples, their median and
10th/90th percentiles are reported (ns).
- kernel: the adapter's `time_call` (cuda: the longer of the device's time, CUDA events on the
  harness stream behind a stream hold, and the host time of the call itself; mlx: the span of
  its recorded device activity where MLX runs on CUDA (kernel_clock.py), else the wall clock
  around the call, `mx.eval` and `mx.synchronize()`);
- a native of the request's backend (sdpa on cuda, mlx on mlx): the same adapter's
  `time_call` after its flush, as an evaluation times the task's baseline (on cuda the same
  rule as the kernel's: the hold keeps PyTorch's dispatch out of the events, which bare events
  would add, docs/results/scores/README.md, run 9, and the dispatch counts only where it
  outlasts the device's work);
- a native of another backend: sdpa: CUDA events on the current stream; the flush writes
  max(2 x L2, flush_bytes); mlx: wall clock around the call, `mx.eval` and `mx.synchronize()`;
  the flush is an MLX add over flush_bytes.
TFLOP/s, fractions of peak and ratios are ksearch's to compute (it has the hardware profiles).

The request is an `evaluate` request (protocol v1, docs/ARCHITECTURE.md) with `op = "bench"`
and a `bench` object: {"warmup": int >= 0, "reps": int >= 1, "compare": ["sdpa", "mlx"]}.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

from . import PROTOCOL_VERSION, adapters, core, dtypes, machine, protocol
from .adapters import BuildFailed
from .protocol import (BuildError, CandidateRuntimeError, HarnessError, Request, TaskError,
                       Workload)
from .task_code import TRIAL, TaskCode, derive_seed

OP = "bench"
COMPARATORS = ("sdpa", "mlx")
DEFAULT_WARMUP = 5
DEFAULT_REPS = 20
# How the contenders' calls are ordered (Bench._interleave), reported with the settings.
ORDER = "interleaved"
# The attention inputs and flag a native attention needs.
ATTENTION_INPUTS = ("q", "k", "v")


def parse(obj: dict) -> tuple[Request, dict[str, Any]]:
    """The request (validated as an `evaluate` request) and the bench settings."""
    if obj.get("op") != OP:
        raise TaskError(f"op: request says `{obj.get('op')}` but this is the `{OP}` tool")
    bench = obj.get("bench", {})
    if not isinstance(bench, dict):
        raise TaskError("bench: must be an object")
    warmup = bench.get("warmup", DEFAULT_WARMUP)
    reps = bench.get("reps", DEFAULT_REPS)
    compare = bench.get("compare", list(COMPARATORS))
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise TaskError(f"bench.warmup: must be an integer >= 0, got {warmup!r}")
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise TaskError(f"bench.reps: must be an integer >= 1, got {reps!r}")
    if not isinstance(compare, list) or any(c not in COMPARATORS for c in compare):
        raise TaskError(f"bench.compare: must list some of {', '.join(COMPARATORS)}, "
                        f"got {compare!r}")
    as_eval = dict(obj, op="evaluate")
    as_eval.setdefault("correctness", {"trials": 1})
    timing = dict(obj.get("timing") or {})
    timing.update(warmup=warmup, min_reps=reps, max_reps=reps, target_seconds=0.0)
    as_eval["timing"] = timing
    req = protocol.parse_request(as_eval, "evaluate")
    return req, {"warmup": warmup, "reps": reps, "compare": list(compare)}


# --------------------------------------------------------------------------------------------
# Native attention implementations


class Native:
    """A comparator: builds a call on device copies of the inputs and times it."""

    name = "abstract"
    label = "abstract"
    timing = ""
    # The request backend whose adapter times this native as evaluations time the baseline.
    backend = ""

    def version(self) -> str | None:
        return None

    def prepare(self, stored: dict[str, np.ndarray], wl: Workload) -> Callable[[], Any]:
        raise NotImplementedError

    def to_host(self, value: Any) -> np.ndarray:
        from .adapters import device
        return np.asarray(device.to_numpy(value), dtype=np.float32)

    def time(self, fn: Callable[[], Any]) -> int:
        raise NotImplementedError


def attention_params(wl: Workload) -> tuple[str, bool, int] | None:
    """(dtype, causal, head dim) when `wl` is an attention workload a native can run."""
    names = {s.name for s in wl.inputs}
    if not set(ATTENTION_INPUTS) <= names or len(wl.outputs) != 1:
        return None
    q = next(s for s in wl.inputs if s.name == "q")
    if len(q.shape) != 4 or q.dtype not in ("f16", "bf16", "f32"):
        return None
    return q.dtype, bool(wl.params.get("causal", 0)), int(q.shape[-1])


class TorchSdpa(Native):
    name = "sdpa"
    label = "PyTorch SDPA"
    backend = "cuda"
    timing = "CUDA events on the current stream, L2 flush before each call"

    def __init__(self, flush_bytes: int):
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA device")
        self.torch = torch
        self.flush_bytes = flush_bytes
        self._flush: Any = None
        self._events = (torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True))

    def version(self) -> str | None:
        return str(self.torch.__version__)

    def prepare(self, stored, wl):
        from .adapters import device
        import torch.nn.functional as F
        dtype, causal, _ = attention_params(wl)  # type: ignore[misc]
        q, k, v = (device.torch_from_host(stored[n], dtype) for n in ATTENTION_INPUTS)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def time(self, fn):
        torch = self.torch
        if self._flush is None:
            props = torch.cuda.get_device_properties(0)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            n = max(2 * l2, self.flush_bytes, 1 << 20) // 4
            self._flush = torch.zeros(n, dtype=torch.int32, device="cuda")
        self._flush.add_(1)
        torch.cuda.synchronize()
        start, end = self._events
        start.record()
        fn()
        end.record()
        end.synchronize()
        return int(round(start.elapsed_time(end) * 1e6))


class MlxSdpa(Native):
    name = "mlx"
    label = "MLX native (mx.fast.scaled_dot_product_attention)"
    backend = "mlx"
    timing = "wall clock around the call, mx.eval and mx.synchronize, MLX flush before each call"

    def __init__(self, flush_bytes: int):
        from .adapters import device
        mx = device._import_mlx()
        gpu = False
        for backend in ("cuda", "metal"):
            mod = getattr(mx, backend, None)
            if mod is not None and mod.is_available():
                gpu = True
        if not gpu:
            raise RuntimeError("MLX sees no GPU")
        self.mx = mx
        self.flush_bytes = flush_bytes
        self._flush: Any = None

    def version(self) -> str | None:
        from .adapters.mlx import _mlx_version
        return _mlx_version()

    def prepare(self, stored, wl):
        from .adapters import device
        mx = self.mx
        dtype, causal, d = attention_params(wl)  # type: ignore[misc]
        q, k, v = (device.mlx_from_host(stored[n], dtype) for n in ATTENTION_INPUTS)
        scale = 1.0 / math.sqrt(d)
        mask = "causal" if causal else None
        return lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    def time(self, fn):
        mx = self.mx
        if self._flush is None:
            self._flush = mx.zeros((max(self.flush_bytes, 1 << 20) // 4,), dtype=mx.int32)
        self._flush = self._flush + 1
        mx.eval(self._flush)
        mx.synchronize()
        t0 = time.perf_counter_ns()
        out = fn()
        mx.eval(out)
        mx.synchronize()
        return time.perf_counter_ns() - t0


NATIVES: dict[str, type[Native]] = {"sdpa": TorchSdpa, "mlx": MlxSdpa}


# --------------------------------------------------------------------------------------------
# The run


def _stats(samples: list[int]) -> dict[str, Any]:
    s = core.stats(samples)
    return {"samples_ns": samples, "median_ns": s["median"], "p10_ns": s["p10"],
            "p90_ns": s["p90"]}


def _check(req: Request, wl: Workload, outs: dict[str, np.ndarray],
           truth: dict[str, np.ndarray]) -> dict[str, Any]:
    result = core.Comparison(True, 0.0, 0.0)
    for s in wl.outputs:
        result = result.merge(core.compare(outs[s.name], truth[s.name],
                                           core.tolerance_for(req, s.dtype)))
    return {"correct": result.ok, "max_abs_err": result.max_abs, "max_rel_err": result.max_rel}


class Bench:
    def __init__(self, req: Request, settings: dict[str, Any], adapter=None,
                 natives: dict[str, Native] | None = None):
        self.req = req
        self.settings = settings
        self.adapter = adapter
        self.natives = natives
        self.out = protocol.ResultBuilder(OP, req.nonce)
        self.out.data.update(backend=req.backend, comparators={},
                             settings=dict(settings, order=ORDER))

    def run(self) -> dict[str, Any]:
        try:
            self._run()
        except HarnessError as e:
            self.out.fail(e)
        return self.out.data

    def _run(self) -> None:
        req, out = self.req, self.out
        assert req.task is not None and req.task.entry is not None
        out.data["environment"].update(protocol_version=PROTOCOL_VERSION)
        task = adapters.task_code(req)
        source = core.read_candidate(req)
        core.run_static_checks(req, source)
        if self.adapter is None:
            self.adapter = adapters.create(req)
        adapter = self.adapter
        info = core.build_and_record(adapter, source, out)
        try:
            adapter.load(info, req.task.entry)
        except BuildFailed as e:
            raise BuildError(e.message) from None
        out.data["environment"].setdefault("gpu", _gpu_name())
        out.data["settings"]["kernel_timing"] = (
            "the longer of the device time (CUDA events on the harness stream behind a stream "
            "hold) and the call's own host time, L2 flush before each call"
            if req.backend == "cuda" else
            "wall clock around the call, mx.eval and mx.synchronize, cache flush before each call")
        natives = self._natives()
        for wi, wl in enumerate(req.workloads):
            out.data["workloads"].append(self._workload(task, wi, wl, natives))

    def _natives(self) -> dict[str, Native]:
        info = self.out.data["comparators"]
        if self.natives is not None:
            made = self.natives
        else:
            made = {}
            for name in self.settings["compare"]:
                try:
                    made[name] = NATIVES[name](self.req.timing.flush_bytes)
                except Exception as e:  # noqa: BLE001 - not importable: no column
                    info[name] = {"available": False, "label": NATIVES[name].label,
                                  "reason": f"{type(e).__name__}: {e}"}
        for name, n in made.items():
            timing = (f"{self.out.data['settings']['kernel_timing']}, as evaluations time "
                      f"the baseline" if n.backend == self.req.backend else n.timing)
            info[name] = {"available": True, "label": n.label, "version": n.version(),
                          "timing": timing}
        return made

    def _workload(self, task: TaskCode, wi: int, wl: Workload,
                  natives: dict[str, Native]) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": wl.name, "held_out": wl.held_out,
                                 "params": dict(wl.params), "flops": wl.flops,
                                 "bytes": wl.bytes, "results": {}}
        results = entry["results"]
        inputs = task.make_inputs(wl, derive_seed(self.req.secret_seed, TRIAL, wi), wi)
        truth = task.check_outputs(task.call_reference(inputs.for_reference(), wl), wl,
                                   "reference")
        timings: dict[str, _Timing] = {}
        for name, prepare in self._contenders(wl, inputs, truth, natives):
            made = self._measure(prepare)
            if isinstance(made, _Timing):
                timings[name] = made
            else:
                results[name] = made
        self._interleave(timings, results)
        for name, timing in timings.items():
            if name not in results:
                results[name] = self._measure(timing.finish)
        # The kernel first in the JSON, as before interleaving.
        entry["results"] = {n: results[n] for n in ["kernel", *natives] if n in results}
        return entry

    def _contenders(self, wl: Workload, inputs, truth, natives: dict[str, Native]
                    ) -> list[tuple[str, Callable[[], Any]]]:
        """(name, prepare) per contender; prepare returns a `_Timing` or an error result."""
        made: list[tuple[str, Callable[[], Any]]] = [
            ("kernel", lambda: self._kernel(wl, inputs, truth))]
        runnable = attention_params(wl) is not None
        for name, native in natives.items():
            if runnable:
                made.append((name, lambda n=native: self._native(n, wl, inputs, truth)))
            else:
                made.append((name, lambda: {"error": "not an attention workload (q, k, v "
                                                     "[B, H, L, D] and one output)"}))
        return made

    def _interleave(self, timings: dict[str, "_Timing"], results: dict[str, Any]) -> None:
        """Warm-up and timed calls of every contender, one call each per round.

        Timing the contenders one after another let the GPU's clocks and MLX's per-call cost
        drift between them (MLX native read 0.59 ms in one bench and 0.77 ms in the next,
        docs/gpu-attention.md); one call each per round puts the same drift into every
        contender's samples. Round r starts with contender r mod n, so that none always runs
        right after the same other one. A contender that raises is reported and dropped; the
        others go on."""
        warmup, reps = self.settings["warmup"], self.settings["reps"]
        order = list(timings)
        a = self.adapter
        for r in range(warmup + reps):
            k = r % len(order) if order else 0
            kernel_parts, native_parts = None, None
            for name in order[k:] + order[:k]:
                if name in results:
                    continue
                a.last_parts = None
                made = self._measure(lambda t=timings[name]: {"ns": t.once()})
                if "error" in made:
                    results[name] = made
                elif r >= warmup:
                    timings[name].samples.append(made["ns"])
                    parts = a.last_parts or {}
                    if name == "kernel":
                        kernel_parts = parts
                    elif timings[name].native:
                        native_parts = parts
            # The kernel is charged as an evaluation charges a candidate: its host time only
            # beyond the native's (the baseline's) in the same round.
            charged = adapters.charged_ns(kernel_parts, native_parts)
            if charged is not None and "kernel" not in results:
                timings["kernel"].samples[-1] = charged

    @staticmethod
    def _measure(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except HarnessError as e:
            return {"error": e.message, "status": e.status}
        except Exception as e:  # noqa: BLE001 - one failing contender must not end the bench
            traceback.print_exc()
            return {"error": f"{type(e).__name__}: {e}", "status": "runtime_error"}

    def _kernel(self, wl: Workload, inputs, truth) -> "_Timing":
        a = self.adapter
        ins = {s.name: a.alloc(s) for s in wl.inputs}
        outs = {s.name: a.alloc(s) for s in wl.outputs}
        for name, buf in ins.items():
            a.upload(buf, inputs.stored[name])
        for s in wl.outputs:
            a.upload(outs[s.name], dtypes.get(s.dtype).poison(s.shape, "a"))
        fn = a.bind(ins, outs, dict(wl.params))

        def read() -> dict[str, np.ndarray]:
            a.synchronize()
            return {s.name: dtypes.get(s.dtype).decode(a.to_host(outs[s.name]))
                    for s in wl.outputs}

        fn()
        first = _check(self.req, wl, read(), truth)

        def finish(samples: list[int]) -> dict[str, Any]:
            last = _check(self.req, wl, read(), truth)
            result = _stats(samples)
            result.update(first)
            # The timed calls must compute what the checked call did.
            result["correct"] = first["correct"] and last["correct"]
            result["max_rel_err"] = max(first["max_rel_err"], last["max_rel_err"])
            result["max_abs_err"] = max(first["max_abs_err"], last["max_abs_err"])
            return result

        return _Timing(self._adapter_timed(fn), finish)

    def _adapter_timed(self, fn: Callable[[], Any]) -> Callable[[], int]:
        """One flushed call of `fn` timed by the backend's adapter (ns), as evaluations time
        the candidate and the task's baseline."""
        a = self.adapter

        def once() -> int:
            a.flush_cache()
            ns, _ = a.time_call(fn)
            return ns

        return once

    def _native(self, native: Native, wl: Workload, inputs, truth) -> "_Timing":
        fn = native.prepare(inputs.stored, wl)
        (spec,) = wl.outputs
        check = _check(self.req, wl, {spec.name: native.to_host(fn())}, truth)

        def finish(samples: list[int]) -> dict[str, Any]:
            result = _stats(samples)
            result.update(check)
            return result

        if native.backend != self.req.backend:
            return _Timing(lambda: native.time(fn), finish)
        return _Timing(self._adapter_timed(fn), finish, native=True)


class _Timing:
    """One contender on one workload, ready to time: `once()` flushes and times one call (ns);
    `finish(samples)` makes its result, with the checks that come after the timed calls."""

    def __init__(self, once: Callable[[], int], finish: Callable[[list[int]], dict[str, Any]],
                 native: bool = False):
        self.once = once
        self._finish = finish
        self.samples: list[int] = []
        # A native of the request's backend, timed by its adapter as evaluations time the
        # task's baseline: its parts are what the kernel's charge is set against
        # (adapters.charged_ns).
        self.native = native

    def finish(self) -> dict[str, Any]:
        return self._finish(self.samples)


def _gpu_name() -> str | None:
    """The GPU's name as a hardware profile knows it (`NVIDIA H200`), without creating a
    device context when none exists yet."""
    try:
        from .adapters.cuda import visible_gpus
        gpus = visible_gpus()
    except Exception:  # noqa: BLE001
        gpus = []
    if gpus:
        # "GPU 0: NVIDIA H200 (UUID: GPU-...)"
        text = gpus[0].split(":", 1)[-1]
        return text.split("(UUID")[0].strip() or None
    return None


# --------------------------------------------------------------------------------------------
# Process entry


def serve(result_fd: int) -> int:
    try:
        channel = protocol.ResultChannel.claim(result_fd)
    except OSError as e:
        print(f"ksearch_harness.bench: --result-fd {result_fd} is not open: {e}", file=sys.stderr)
        return 2
    raw = protocol.read_stdin_and_close()
    nonce = None
    log_path = None
    try:
        obj = protocol.decode_request(raw)
        nonce = protocol.request_nonce(obj)
        req, settings = parse(obj)
        assert req.build_dir is not None
        os.makedirs(req.build_dir, exist_ok=True)
        log_path = os.path.join(req.build_dir, "harness-bench.log")
        protocol.redirect_output(log_path)
        with machine.collector_paused():
            result = Bench(req, settings).run()
    except HarnessError as e:
        result = protocol.error_result(OP, nonce, e)
    except Exception as e:  # noqa: BLE001 - a result must always be sent
        traceback.print_exc()
        result = protocol.error_result(OP, nonce, CandidateRuntimeError(
            f"harness failure: {type(e).__name__}: {e}"))
    result["log_tail"] = protocol.log_tail(log_path)
    try:
        channel.send(protocol.encode_result(result))
    except OSError as e:
        print(f"ksearch_harness.bench: cannot write the result: {e}", file=sys.stderr)
        return 2
    channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ksearch_harness.bench",
                                     description="ksearch bench: a kernel against native "
                                                 "attention, one process")
    parser.add_argument("op", choices=[OP])
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(args.result_fd)


if __name__ == "__main__":
    sys.exit(main())
