"""Which step of the harness's timing loop makes MLX timed calls slow and noisy.

    python eval_noise_probe.py --kernel pp.py [--reps 25] [--json out.json]

`ksearch eval` times our kernels and MLX native 0.3-0.5 ms slower than `ksearch bench`, with a
spread of several times the kernel's time (docs/gpu-attention.md, session 4). The bench keeps one
set of inputs on the GPU and reads nothing back; the eval draws fresh inputs on the host every
repetition, uploads them, reads outputs and inputs back for its checks, empties MLX's cache and
primes each contender. Each mode below adds one of those steps to the previous one and times the
same call (flush, then wall clock around mx.eval + synchronize), B1 H32 L4096 D128 f16 causal:
    bench        fixed inputs made on the GPU, nothing read back
    fresh        new inputs each repetition, drawn by numpy and uploaded as the harness does
                 (ksearch_harness.adapters.device.mlx_from_host)
    readback     fresh, and the output and the inputs read on the host after the call
    clear_prime  readback, and mx.clear_cache() then one call on the previous inputs before
                 the flush (the harness's priming)
    no_gc        clear_prime with Python's garbage collector off during the timed call
Prints the median, p10 and p90 per mode for the kernel and for MLX native.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import mlx.core as mx
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harness"))
from ksearch_harness.adapters.device import mlx_from_host  # noqa: E402
# The same shape, flush size and module loading as the earlier probe of MLX's call costs.
from mlx_overhead import FLUSH_BYTES, B, D, H, L, load_module  # noqa: E402

MODES = ["bench", "fresh", "readback", "clear_prime", "no_gc"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--json")
    ap.add_argument("--length", type=int, default=L, help="sequence length (a smaller one tests the script)")
    args = ap.parse_args()
    shape = (B, H, args.length, D)
    mod = load_module(args.kernel)
    rng = np.random.default_rng(0)
    flush = [mx.zeros((FLUSH_BYTES // 4,), dtype=mx.int32)]

    def do_flush():
        flush[0] = flush[0] + 1
        mx.eval(flush[0])
        mx.synchronize()

    def host_inputs():
        return [rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
                for _ in range(3)]

    fixed = [mx.random.normal(shape).astype(mx.float16) for _ in range(3)]
    mx.eval(*fixed)

    def ours(q, k, v):
        return mod.attention(q=q, k=k, v=v, B=B, H=H, L=args.length, D=D, causal=1)

    def native(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask="causal")

    def timed(fn, mode):
        times = []
        prev = fixed
        for i in range(args.reps + 3):
            if mode == "bench":
                xs = fixed
            else:
                xs = [mlx_from_host(h, "f16") for h in host_inputs()]
            if mode in ("clear_prime", "no_gc"):
                mx.clear_cache()
                mx.eval(fn(*prev))
                mx.synchronize()
            do_flush()
            if mode == "no_gc":
                gc.disable()
            t0 = time.perf_counter_ns()
            out = fn(*xs)
            mx.eval(out)
            mx.synchronize()
            times.append(time.perf_counter_ns() - t0)
            gc.enable()
            if mode in ("readback", "clear_prime", "no_gc"):
                np.array(out, copy=True)
                for x in xs:
                    np.array(x, copy=True)
            del out
            prev = xs
        t = np.array(times[3:]) / 1e6
        return {"median": float(np.median(t)), "p10": float(np.percentile(t, 10)),
                "p90": float(np.percentile(t, 90)), "samples": t.round(4).tolist()}

    res = {"mlx": mx.__version__, "reps": args.reps, "modes": {}}
    for mode in MODES:
        for name, fn in (("ours", ours), ("native", native)):
            r = timed(fn, mode)
            res["modes"][f"{name}/{mode}"] = r
            print(f"{name:6s} {mode:12s} median {r['median']:.3f}  p10 {r['p10']:.3f}  "
                  f"p90 {r['p90']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
