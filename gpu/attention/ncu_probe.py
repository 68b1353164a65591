"""One call of a built attention variant for Nsight Compute to profile.

    ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:ksa_attention \
        python3 ncu_probe.py --so ../../.gpu-build/wg_m128n128s3_pp.so [--causal] [--d 128]

Calls the variant twice on B1 H32 L4096 (the first call loads the module and is skipped by
`--launch-skip 1`), checks the second output against PyTorch's SDPA in f32 and prints the
error, so a profile of a wrong kernel is never taken for a profile of the right one.
Without ncu it also prints CUDA-event times of the variant (median of 20, L2 flushed).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

from bench import TOL, CudaVariant, check, time_torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--so", required=True)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--d", type=int, default=128, choices=[64, 128])
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--time", action="store_true", help="also time 20 calls with CUDA events")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    shape = (1, 32, args.length, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    kernel = CudaVariant("probe", args.so)
    for _ in range(2):
        kernel("f16", q, k, v, out, args.causal)
    torch.cuda.synchronize()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=args.causal)
    ok, rel, why = check(out, ref, "f16")
    print(f"{args.so}: D{args.d} causal={int(args.causal)} max rel err {rel:.2e} "
          f"({'ok' if ok else 'WRONG ' + why}, tol {TOL['f16']})", flush=True)
    if args.time:
        flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        ms = time_torch(lambda: kernel("f16", q, k, v, out, args.causal), 20, flush)
        print(f"events: median {statistics.median(ms):.4f} ms (min {min(ms):.4f})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
