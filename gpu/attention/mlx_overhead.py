"""Where the time of one attention call through MLX goes, on the machine it runs on.

    python mlx_overhead.py --kernel pp.py [--json out.json] [--reps 20]

Two questions, one process:

1. Memory state. The harness reads every output back to the host between timed calls; MLX
   keeps arrays in CUDA managed memory and recycles freed buffers, so a later call can get a
   buffer whose pages sit on the host and fault them back inside its timed region. Each mode
   below times the same call (per call: flush, then wall clock around mx.eval + synchronize)
   after a different treatment of the buffers:
     steady        nothing read back (what `ksearch bench` does)
     host_read     the output read back after each call (what the harness does)
     clear         host_read, and mx.clear_cache() before each call
     clear_prime   clear, then one untimed call on other inputs before the timed one
     prefetch      host_read, and each read-back buffer prefetched back to the GPU
                   (cudaMemPrefetchAsync through ctypes) before it is freed
2. Fixed cost per call: an empty mx.fast.cuda_kernel (tiny and 32 MB output), a one-element
   native op, and back-to-back throughput (N calls in one mx.eval) of the kernel and of MLX's
   native attention; PyTorch's cuDNN and flash SDPA timed with CUDA events for the kernel-only
   time of the baseline MLX calls into.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import importlib.util
import json
import os
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

B, H, L, D = 1, 32, 4096, 128
FLUSH_BYTES = 256 << 20


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("candidate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Prefetcher:
    """cudaMemPrefetchAsync on MLX's managed buffers; None when no runtime library loads."""

    def __init__(self):
        self.lib, self.v2 = None, False
        names = [ctypes.util.find_library("cudart")] + sorted(
            glob.glob(os.path.join(os.path.dirname(mx.__file__), "..", "nvidia", "*", "lib",
                                   "libcudart.so*"))
            + glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
        for name in names:
            if not name:
                continue
            try:
                self.lib = ctypes.CDLL(name)
                self.name = name
                break
            except OSError:
                continue
        if self.lib is None:
            return
        ver = ctypes.c_int()
        self.lib.cudaRuntimeGetVersion(ctypes.byref(ver))
        self.version = ver.value

    def __call__(self, arr) -> int:
        view = np.asarray(arr)  # zero-copy view of the managed buffer when MLX allows it
        ptr, nbytes = view.ctypes.data, view.nbytes

        class Loc(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

        if self.version >= 13000:
            fn = self.lib.cudaMemPrefetchAsync
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, Loc, ctypes.c_uint, ctypes.c_void_p]
            err = fn(ptr, nbytes, Loc(1, 0), 0, None)
        else:
            fn = self.lib.cudaMemPrefetchAsync
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            err = fn(ptr, nbytes, 0, None)
        self.lib.cudaDeviceSynchronize()
        return int(err)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    mod = load_module(args.kernel)
    out: dict = {"mlx": mx.__version__, "env": {k: v for k, v in os.environ.items()
                                                 if k.startswith("MLX_")}}
    flush = [mx.zeros((FLUSH_BYTES // 4,), dtype=mx.int32)]

    def do_flush():
        flush[0] = flush[0] + 1
        mx.eval(flush[0])

    def inputs(seed):
        key = mx.random.key(seed)
        ks = mx.random.split(key, 3)
        xs = [mx.random.normal((B, H, L, D), key=k).astype(mx.float16) for k in ks]
        mx.eval(*xs)
        return xs

    sets = [inputs(s) for s in range(3)]
    pre = Prefetcher()
    out["prefetch_lib"] = getattr(pre, "name", None)

    def timed(fn, mode, causal, reps=args.reps):
        times = []
        for i in range(reps + 3):
            q, k, v = sets[i % 2]
            if mode in ("clear", "clear_prime"):
                mx.clear_cache()
            if mode == "clear_prime":
                a, b, c = sets[2]
                mx.eval(fn(a, b, c, causal))
            do_flush()
            mx.synchronize()
            t0 = time.perf_counter_ns()
            o = fn(q, k, v, causal)
            mx.eval(o)
            mx.synchronize()
            times.append(time.perf_counter_ns() - t0)
            if mode != "steady":
                np.array(o, copy=True)
            if mode == "prefetch":
                err = pre(o)
                if err:
                    raise RuntimeError(f"cudaMemPrefetchAsync error {err}")
            del o
        return statistics.median(times[3:]) / 1e6

    def ours(q, k, v, causal):
        return mod.attention(q=q, k=k, v=v, B=B, H=H, L=L, D=D, causal=int(causal))

    def native(q, k, v, causal):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5,
                                                    mask="causal" if causal else None)

    modes = ["steady", "host_read", "clear", "clear_prime"]
    if pre.lib is not None:
        modes.append("prefetch")
    rows = []
    for causal in (0, 1):
        for name, fn in (("ours", ours), ("native", native)):
            for mode in modes:
                try:
                    ms = timed(fn, mode, causal)
                except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                    ms = None
                    print(f"{name} {mode} causal={causal}: {e}", file=sys.stderr)
                rows.append({"impl": name, "causal": causal, "mode": mode, "ms": ms})
                print(f"{name:7s} causal={causal} {mode:12s} {ms}", flush=True)
    out["modes"] = rows

    # Back-to-back: N calls in one eval, no flush between them.
    def chain(fn, causal, n=10):
        q, k, v = sets[0]
        outs = [fn(q, k, v, causal) for _ in range(n)]
        mx.eval(*outs)
        mx.synchronize()
        t = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            outs = [fn(q, k, v, causal) for _ in range(n)]
            mx.eval(*outs)
            mx.synchronize()
            t.append((time.perf_counter_ns() - t0) / n)
            del outs
        return min(t) / 1e6

    out["chain_ms"] = {f"{name}-c{c}": chain(fn, c) for c in (0, 1)
                       for name, fn in (("ours", ours), ("native", native))}
    print("chain", out["chain_ms"], flush=True)

    # Fixed costs.
    empty = mx.fast.cuda_kernel(name="ksearch_probe_empty", input_names=["x"],
                                output_names=["y"], source="")
    x1 = mx.zeros((1,), dtype=mx.float32)
    mx.eval(x1)

    def fixed(make):
        mx.eval(make())
        mx.synchronize()
        t = []
        for _ in range(50):
            t0 = time.perf_counter_ns()
            mx.eval(make())
            mx.synchronize()
            t.append(time.perf_counter_ns() - t0)
        return statistics.median(t) / 1e3

    big = (B, H, L, D)
    out["fixed_us"] = {
        "sync_only": fixed(lambda: x1),
        "native_add_1elem": fixed(lambda: x1 + 1),
        "empty_kernel_tiny": fixed(lambda: empty(inputs=[x1], grid=(32, 1, 1),
                                                 threadgroup=(32, 1, 1), output_shapes=[(1,)],
                                                 output_dtypes=[mx.float32])[0]),
        "empty_kernel_32mb": fixed(lambda: empty(inputs=[x1], grid=(32, 1, 1),
                                                 threadgroup=(32, 1, 1), output_shapes=[big],
                                                 output_dtypes=[mx.float16])[0]),
    }
    print("fixed", out["fixed_us"], flush=True)

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        dev = torch.device("cuda")
        g = torch.Generator(device=dev).manual_seed(0)
        tq, tk, tv = (torch.randn(big, device=dev, dtype=torch.float16, generator=g)
                      for _ in range(3))
        tflush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
        res = {}
        for bname, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                               ("flash", SDPBackend.FLASH_ATTENTION)):
            for causal in (0, 1):
                try:
                    with sdpa_kernel([backend]):
                        ts = []
                        for i in range(args.reps + 3):
                            tflush.add_(1)
                            e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                            e0.record()
                            F.scaled_dot_product_attention(tq, tk, tv, is_causal=bool(causal))
                            e1.record()
                            torch.cuda.synchronize()
                            ts.append(e0.elapsed_time(e1))
                    res[f"{bname}-c{causal}"] = statistics.median(ts[3:])
                except Exception as e:  # noqa: BLE001
                    res[f"{bname}-c{causal}"] = f"error: {e}"[:200]
        out["torch_events_ms"] = res
        print("torch", res, flush=True)
    except ImportError as e:
        out["torch_events_ms"] = f"no torch: {e}"

    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
