"""Times rendered template kernels on a task's workload shapes (a development aid: it shows
whether a family is a real search space, i.e. whether the best knob setting depends on the
machine and the shape).

usage: python bench_family.py MANIFEST.json [--labels-from FILE] [--limit N] [--seconds S]

MANIFEST.json is what `cargo run -p ksearch-knowledge --example render -- tasks/<t> --emit DIR`
writes. Each kernel is compiled like the harness compiles candidates and timed (median of
repetitions after a warm-up) on the shapes below. One JSON line per kernel goes to stdout:
{"label", "times_ms": {workload: median ms}, "geomean_ms"}.
"""

import argparse
import ctypes
import json
import math
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-std=c11", "-fopenmp"]
F32P = ctypes.POINTER(ctypes.c_float)
I64 = ctypes.c_int64

# Shapes taken from the tasks' visible workloads.
WORKLOADS = {
    "softmax": [(64, 1000), (512, 4096), (2048, 1024)],
    "attention": [(1, 4, 256, 64, 0), (1, 4, 256, 64, 1), (2, 8, 128, 64, 0), (1, 2, 512, 128, 1)],
    "selective-scan": [(1, 256, 1024, 16, 1, 1), (1, 512, 512, 16, 0, 1),
                       (1, 1024, 256, 16, 0, 0), (2, 256, 2048, 16, 1, 1)],
}


def ptr(a):
    return a.ctypes.data_as(F32P)


def calls(task, lib, rng):
    """(workload name, zero-argument callable) pairs."""
    out = []
    f = np.float32
    if task == "softmax":
        fn = lib.softmax_f32
        fn.argtypes = [F32P, F32P, I64, I64]
        for rows, cols in WORKLOADS[task]:
            x = rng.standard_normal((rows, cols)).astype(f)
            y = np.empty_like(x)
            out.append((f"r{rows}c{cols}", lambda fn=fn, x=x, y=y, r=rows, c=cols: fn(ptr(x), ptr(y), r, c)))
    elif task == "attention":
        fn = lib.attention_f32
        fn.argtypes = [F32P] * 4 + [I64] * 5
        for B, H, L, D, causal in WORKLOADS[task]:
            q, k, v = (rng.standard_normal((B, H, L, D)).astype(f) for _ in range(3))
            o = np.empty_like(q)
            name = f"b{B}h{H}l{L}d{D}" + ("-causal" if causal else "")
            out.append((name, lambda fn=fn, q=q, k=k, v=v, o=o, s=(B, H, L, D, causal): fn(ptr(q), ptr(k), ptr(v), ptr(o), *s)))
    else:
        fn = lib.selective_scan_f32
        fn.argtypes = [F32P] * 9 + [I64] * 6
        for batch, dim, L, N, has_z, softplus in WORKLOADS[task]:
            u = rng.standard_normal((batch, dim, L)).astype(f)
            delta = rng.normal(-2.0, 1.0, (batch, dim, L)).astype(f)
            A = (-np.exp(rng.uniform(np.log(0.5), np.log(16.0), (dim, N)))).astype(f)
            B = rng.standard_normal((batch, N, L)).astype(f)
            C = rng.standard_normal((batch, N, L)).astype(f)
            D = rng.standard_normal(dim).astype(f)
            z = rng.standard_normal((batch, dim, L)).astype(f)
            db = rng.uniform(-0.5, 0.5, dim).astype(f)
            y = np.empty_like(u)
            args = [ptr(a) for a in (u, delta, A, B, C, D, z, db, y)]
            keep = (u, delta, A, B, C, D, z, db, y)
            name = f"b{batch}d{dim}l{L}" + ("-z" if has_z else "")
            out.append((name, lambda fn=fn, args=args, keep=keep, s=(batch, dim, L, N, has_z, softplus): fn(*args, *s)))
    return out


def median_ms(call, seconds):
    call()
    samples = []
    start = time.perf_counter()
    while len(samples) < 3 or (time.perf_counter() - start < seconds and len(samples) < 200):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return 1000.0 * samples[len(samples) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--labels-from", help="only kernels whose label is a line of this file")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=0.3, help="time budget per workload")
    args = ap.parse_args()
    with open(args.manifest) as fh:
        kernels = json.load(fh)["kernels"]
    if args.labels_from:
        with open(args.labels_from) as fh:
            wanted = {line.strip() for line in fh if line.strip()}
        kernels = [k for k in kernels if k["label"] in wanted]
    if args.limit:
        kernels = kernels[: args.limit]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        def build(ik):
            i, k = ik
            so = os.path.join(tmp, f"k{i}.so")
            r = subprocess.run(["cc", *CFLAGS, k["source"], "-o", so, "-lm"], capture_output=True)
            return so if r.returncode == 0 else None
        for k, so in zip(kernels, pool.map(build, enumerate(kernels))):
            if so is None:
                print(json.dumps({"label": k["label"], "error": "build failed"}), flush=True)
                continue
            lib = ctypes.CDLL(so)
            times = {name: median_ms(c, args.seconds)
                     for name, c in calls(k["task"], lib, np.random.default_rng(0))}
            geo = math.exp(sum(math.log(t) for t in times.values()) / len(times))
            print(json.dumps({"label": k["label"], "times_ms": times, "geomean_ms": geo}), flush=True)


if __name__ == "__main__":
    main()
