"""What one mx.fast.cuda_kernel call costs beside MLX's native attention (issue 23: where the
per-call cost of an mlx candidate goes). Needs MLX on CUDA; run on the GPU machine:

    python3 gpu/ksearch_render.py attention mlx --variants-backend cuda \
        --variants gpu/attention/variants.toml --name wg_m128n128s3_pp -o /tmp/pp.py
    python3 gpu/attention/probe/mlx_call_cost.py /tmp/pp.py [--json out.json]

For each shape and contender, three figures (medians over CALLS calls, after a warm-up):
- `synced_ms`: one call, then mx.eval and mx.synchronize, timed from the host (what a bench
  that synchronizes every call sees);
- `build_us`: the Python call alone, which only builds the lazy graph;
- `batched_ms`: CALLS calls built, then evaluated together, per call (launches back to back,
  so host costs hide behind the device's work).
Contenders: MLX's native attention, the candidate module's `attention`, an empty custom kernel
(one thread writes one element) with and without `ensure_row_contiguous`, and `q + 1`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import mlx.core as mx

CALLS = 60
SHAPES = [(16, 32, 256, 64, 0), (1, 32, 4096, 128, 0), (8, 16, 1024, 128, 1), (4, 8, 256, 128, 0)]
EMPTY_SOURCE = "if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = q[0];"


def _empty_kernel(contiguous: bool):
    return mx.fast.cuda_kernel(name=f"probe_empty_{int(contiguous)}", input_names=["q"],
                               output_names=["out"], source=EMPTY_SOURCE,
                               ensure_row_contiguous=contiguous)


def _per_call(fn) -> dict[str, float]:
    for _ in range(5):
        mx.eval(fn())
    mx.synchronize()
    synced, build = [], []
    for _ in range(CALLS):
        t = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        synced.append(time.perf_counter() - t)
    for _ in range(CALLS):
        t = time.perf_counter()
        out = fn()
        build.append(time.perf_counter() - t)
        mx.eval(out)
    mx.synchronize()
    t = time.perf_counter()
    outs = [fn() for _ in range(CALLS)]
    mx.eval(outs)
    mx.synchronize()
    batched = (time.perf_counter() - t) / CALLS
    return {"synced_ms": statistics.median(synced) * 1e3,
            "build_us": statistics.median(build) * 1e6, "batched_ms": batched * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("candidate", help="a rendered mlx attention module (attention(*, q, k, v, ...))")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("candidate", args.candidate)
    cand = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cand)
    empty = {c: _empty_kernel(c) for c in (True, False)}

    def run_empty(q, contiguous):
        return empty[contiguous](inputs=[q], template=[("T", q.dtype)], grid=(256, 1, 1),
                                 threadgroup=(256, 1, 1), output_shapes=[(16,)],
                                 output_dtypes=[q.dtype])[0]

    rows = []
    for B, H, L, D, causal in SHAPES:
        q, k, v = (mx.random.normal((B, H, L, D)).astype(mx.float16) for _ in range(3))
        mx.eval(q, k, v)
        contenders = {
            "native": lambda: mx.fast.scaled_dot_product_attention(
                q, k, v, scale=D ** -0.5, mask="causal" if causal else None),
            "candidate": lambda: cand.attention(q=q, k=k, v=v, B=B, H=H, L=L, D=D,
                                                causal=causal),
            "empty kernel": lambda: run_empty(q, True),
            "empty kernel, no contiguity check": lambda: run_empty(q, False),
            "q + 1": lambda: q + 1,
        }
        print(f"B{B} H{H} L{L} D{D} causal={causal}: synced ms | build us | batched ms")
        for name, fn in contenders.items():
            row = {"shape": [B, H, L, D, causal], "contender": name, **_per_call(fn)}
            rows.append(row)
            print(f"  {name:34s} {row['synced_ms']:8.3f} {row['build_us']:9.1f} "
                  f"{row['batched_ms']:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": CALLS, "mlx": mx.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
