"""The yardstick: each workload's baseline and reference, timed once for many candidates.

A candidate's score is the baseline's time divided by the candidate's. Timing the baseline
again in every evaluation, with the few samples an evaluation affords, made the score as noisy
as the baseline's worst draw (the search kept whichever candidate drew a slow baseline). The
`yardstick` op times the task's baseline and reference, interleaved in a shuffled order, with
the same flush and clock warm-up as a timed candidate call, until the median's interval is tight
(or a time budget is spent), and reports for each:

- `samples_ns`, `median_ns` and `lo_ns`/`hi_ns` (intervals.median_interval);
- `block_medians_ns`: the medians of `BLOCKS` consecutive runs of samples, `spread`, their
  relative half-range, and `spread_p`, how often shuffled samples spread as far
  (intervals.drift_p): a spread with a large `spread_p` is noise, a small one says the
  machine drifted while the yardstick was measured;

and, for tasks with a baseline, `baseline_over_reference`: the median of the ratio of the two
timed back to back in each repetition (`median`, `lo`, `hi`, `spread`).

Evaluations given the yardstick (`yardstick` in an evaluate request) time the candidate paired
with one contender, the `anchor` (function `anchor`): on the cpu the reference, not the
baseline, and their speedup over the baseline is the yardstick's baseline/reference ratio times
their own paired reference/candidate ratio, so a machine that runs slower during the evaluation
slows the reference and the candidate alike and the score stays put; on the GPUs the baseline
itself, paired directly. The anchor's median over the yardstick's is reported as the `drift`
(core.Evaluation._record_timing). No candidate
code runs in this op, and it runs in the judge, so nothing a candidate leaves behind can reach
the baseline's time.

The inputs come from a small pool of sets drawn once per workload (the baseline and reference
are the task's own code, which has no reason to cache): drawing large inputs on the host for
every repetition would cost more than the timing.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import adapters, intervals
from .protocol import Request, ResultBuilder, TaskError, Workload
from .task_code import Inputs, TaskCode, derive_seed

# Consecutive runs of samples whose medians measure drift.
BLOCKS = 5
# Stop once the median's interval is this tight (relative half-width) ...
TARGET_HALF_WIDTH = 0.005
# ... after at least this many samples per contender, or once the contenders' timed calls of
# one workload add up to the request's timing.target_seconds, or at timing.max_reps samples.
MIN_SAMPLES = 3 * BLOCKS
# Input sets per workload, used round robin.
POOL = 3
# Tag of the yardstick's input seeds (task_code's tags are 0-6).
YARDSTICK_SEEDS = 64


def anchor(task: TaskCode, adapter: Any) -> str:
    """What an evaluation pairs the candidate's timed calls with: `baseline` where the task has
    one and the backend pairs with it (Adapter.pairs_with_baseline), else `reference`."""
    return ("baseline" if task.baseline_fn is not None
            and getattr(adapter, "pairs_with_baseline", False) else "reference")


def measure(req: Request, out: ResultBuilder, adapter: Any = None) -> None:
    if req.task is None:
        raise TaskError("yardstick: the request has no task")
    out.stage = "task"
    task = adapters.task_code(req)
    a = adapter if adapter is not None else adapters.create(req)
    out.stage = "timing"
    a.open_device()
    # Other judges of the device are stopped (the worker holds the gate alone); kernels they
    # left queued are waited out.
    from .device_gate import wait_for_idle
    idle = wait_for_idle(a)
    contenders = ["reference"] + (["baseline"] if task.baseline_fn is not None else [])
    tm = req.timing
    started = time.monotonic()
    workloads: dict[str, Any] = {}
    for wi, wl in enumerate(req.workloads):
        workloads[wl.name] = _workload(req, task, a, wi, wl, contenders, tm)
        if time.monotonic() - started > 0.8 * req.timeout_s:
            raise TaskError(f"yardstick: {time.monotonic() - started:.0f} s spent after "
                            f"`{wl.name}`, too close to the limit of {req.timeout_s:.0f} s")
    env = out.data.setdefault("environment", {})
    env.update({"backend": req.backend, **a.environment()})
    out.data["yardstick"] = {
        "version": 1,
        "backend": req.backend,
        "baseline": task.baseline_fn is not None,
        "anchor": anchor(task, a),
        "secret_seed": req.secret_seed,
        "workloads": workloads,
        "seconds": round(time.monotonic() - started, 3),
    }
    if idle:
        out.data.setdefault("diagnostics", {})["gate"] = idle


def _workload(req: Request, task: TaskCode, a: Any, wi: int, wl: Workload,
              contenders: list[str], tm: Any) -> dict[str, Any]:
    pool = [task.make_inputs(wl, derive_seed(req.secret_seed, YARDSTICK_SEEDS, wi, k), wi)
            for k in range(POOL)]
    staged = [({s.name: a.alloc(s) for s in wl.inputs} if a.stages_reference_inputs else {})
              for _ in pool]
    rng = np.random.default_rng(derive_seed(req.secret_seed, YARDSTICK_SEEDS, wi, POOL))
    samples: dict[str, list[int]] = {c: [] for c in contenders}
    started = time.monotonic()
    rep = -tm.warmup
    while True:
        n = max(rep, 0)
        if n >= max(tm.max_reps, MIN_SAMPLES):
            break
        # The budget is wall time (flushes and input uploads included), so a slow flush
        # cannot stretch the op.
        if n >= MIN_SAMPLES and (time.monotonic() - started >= tm.target_seconds
                                 or _tight(samples)):
            break
        k = (rep + tm.warmup) % len(pool)
        inputs = pool[k]
        for name, buf in staged[k].items():
            a.upload(buf, inputs.stored[name])
        prev = (rep + tm.warmup - 1) % len(pool)
        order = list(contenders)
        rng.shuffle(order)
        for c in order:
            if a.primes_before_timing and rep + tm.warmup > 0:
                _call(a, task, c, pool[prev], wl, prime=True)
            ns = _call(a, task, c, inputs, wl, prime=False)
            if rep >= 0:
                samples[c].append(ns)
        rep += 1
    out = {c: _summary(s) for c, s in samples.items()}
    if "baseline" in samples:
        out["baseline_over_reference"] = _summary(
            intervals.paired_ratios(samples["baseline"], samples["reference"]), unit="")
    return out


def _call(a: Any, task: TaskCode, contender: str, inputs: Inputs, wl: Workload,
          prime: bool) -> int:
    args = inputs.for_reference(shared=a.stages_reference_inputs)
    a.expect_reference_inputs(args, wl.params)
    fn = ((lambda: task.call_reference(args, wl)) if contender == "reference"
          else (lambda: task.call_baseline(args, wl)))
    if prime:
        return a.prime(fn)
    a.warm_up_clocks()
    a.flush_cache()
    ns, _ = a.time_call(fn)
    return ns


def _tight(samples: dict[str, list[int]]) -> bool:
    return all(intervals.tight(s, TARGET_HALF_WIDTH) for s in samples.values())


def _summary(samples: list[Any], unit: str = "_ns") -> dict[str, Any]:
    iv = intervals.median_interval(samples)
    blocks = intervals.block_medians(samples, BLOCKS)
    return {
        "samples" + unit: samples,
        "median" + unit: intervals.median(samples),
        "lo" + unit: iv[0] if iv else None,
        "hi" + unit: iv[1] if iv else None,
        "block_medians" + unit: blocks,
        "spread": intervals.block_spread([b for b in blocks if b is not None]),
        "spread_p": intervals.drift_p(samples, BLOCKS),
    }
