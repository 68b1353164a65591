"""MLX's cost per primitive under each of its launch-path settings, each in a fresh process.

MLX's CUDA backend reads two settings from the environment once, at start-up: whether it
records work into CUDA graphs (MLX_USE_CUDA_GRAPHS, default on) and how many nodes a graph
gets before it is launched (MLX_MAX_OPS_PER_BUFFER, default 20). Decoding one token of a
48-layer model costs a fixed number of primitives whose GPU work is tiny, so the cost per
primitive bounds decode; this measures it (bench.launch_overhead: a chain of dependent small
matmuls, compiled and eager) under each setting and names the cheapest, which the device
script then exports for the whole-model bench (all implementations run under it, and the bench
records it).

    python mlx_env_probe.py --json probe.json            # table on stderr, JSON to the file
    python mlx_env_probe.py --print-best                 # also: KEY=VALUE lines of the best

The first setting is MLX's defaults (no variables), so "best" is never worse than them by the
measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (label, variables). Each runs in its own process.
SETTINGS: list[tuple[str, dict[str, str]]] = [
    ("defaults", {}),
    ("no-graphs", {"MLX_USE_CUDA_GRAPHS": "0"}),
    ("graph-100", {"MLX_MAX_OPS_PER_BUFFER": "100"}),
    ("graph-250", {"MLX_MAX_OPS_PER_BUFFER": "250"}),
    ("graph-5", {"MLX_MAX_OPS_PER_BUFFER": "5"}),
]
KEYS = sorted({k for _, env in SETTINGS for k in env})


def child(ops: int, reps: int) -> int:
    sys.path.insert(0, str(HERE))
    import bench  # noqa: PLC0415 (imports MLX, which reads the settings now)

    out = bench.launch_overhead(ops=ops, reps=reps)
    print(json.dumps(out))
    return 0


def measure(label: str, env: dict[str, str], ops: int, reps: int, timeout: float) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in KEYS}
    full.update(env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--ops", str(ops),
           "--reps", str(reps)]
    row: dict = {"label": label, "env": env}
    try:
        p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {timeout:.0f} s"
        return row
    if p.returncode != 0:
        row["error"] = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        return row
    try:
        row.update(json.loads(p.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        row["error"] = f"unreadable output: {p.stdout[-200:]!r}"
    return row


def best(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if "error" not in r and "compiled_us_per_op" in r]
    return min(ok, key=lambda r: r["compiled_us_per_op"]) if ok else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0, help="per setting (s)")
    ap.add_argument("--only", help="comma-separated labels to measure (default: all)")
    ap.add_argument("--json", type=Path, help="write the rows and the pick here")
    ap.add_argument("--print-best", action="store_true",
                    help="print the best setting's variables as KEY=VALUE lines on stdout")
    args = ap.parse_args(argv)
    if args.ops < 1 or args.reps < 1:
        ap.error("--ops and --reps must be at least 1")
    if args.child:
        return child(args.ops, args.reps)
    wanted = set(args.only.split(",")) if args.only else None
    settings = [s for s in SETTINGS if wanted is None or s[0] in wanted]
    if not settings:
        ap.error(f"--only names no setting (known: {', '.join(s[0] for s in SETTINGS)})")
    rows = []
    for label, env in settings:
        row = measure(label, env, args.ops, args.reps, args.timeout)
        rows.append(row)
        if "error" not in row and not all(isinstance(row.get(k), (int, float))
                                          for k in ("compiled_us_per_op", "eager_us_per_op")):
            row["error"] = f"incomplete measurement: {row}"
        shown = (f"compiled {row['compiled_us_per_op']:.2f} us/op, eager "
                 f"{row['eager_us_per_op']:.2f} us/op" if "error" not in row else row["error"])
        print(f"[mlx_env_probe] {label:<10} {shown}", file=sys.stderr)
    pick = best(rows)
    # `controls`: the variables the settings vary, which a caller must clear before applying
    # the pick (the children ran without the caller's values of them).
    result = {"ops": args.ops, "reps": args.reps, "rows": rows, "controls": KEYS,
              "best": pick["label"] if pick else None}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if pick is None:
        print("[mlx_env_probe] no setting could be measured", file=sys.stderr)
        return 1
    print(f"[mlx_env_probe] best: {pick['label']}", file=sys.stderr)
    if args.print_best:
        for k, v in pick["env"].items():
            print(f"{k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
