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

Each setting is measured `--rounds` times, the rounds interleaved (each starts one setting
later), and compared by its median. The first setting is MLX's defaults (no variables); the
pick is the first setting whose median is within PICK_MARGIN of the cheapest (`best`,
steady_pick), so the defaults stay unless another setting is cheaper by more than that, and
"best" is never worse than the defaults by more than it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from steady_pick import PICK_MARGIN, ROUNDS, pick_steady, rotations

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
# The measured figures of a child, summarised over rounds.
FIGURES = ("compiled_us_per_op", "eager_us_per_op")


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


def summarize(label: str, env: dict[str, str], rounds: list[dict]) -> dict:
    """One setting's row: the median of each figure over its rounds, their ranges, and the
    rounds themselves; an error when any round failed or lacks a figure (never picked)."""
    row: dict = {"label": label, "env": env, "rounds": rounds}
    failed = [r for r in rounds if "error" in r]
    if failed:
        row["error"] = failed[0]["error"]
        return row
    for key in FIGURES:
        values = [r.get(key) for r in rounds]
        if not rounds or not all(isinstance(v, (int, float)) for v in values):
            row["error"] = f"incomplete measurement: {rounds}"
            return row
        row[key] = statistics.median(values)
        row[key.replace("_per_op", "_range")] = [min(values), max(values)]
    return row


def best(rows: list[dict], margin: float = PICK_MARGIN) -> dict | None:
    """The first row (in SETTINGS order) whose compiled cost is within `margin` of the
    cheapest; None when no setting was measured."""
    ok = {r["label"]: r for r in rows if "error" not in r and "compiled_us_per_op" in r}
    if not ok:
        return None
    return ok[pick_steady({k: r["compiled_us_per_op"] for k, r in ok.items()}, margin)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help=f"measurements of each setting, interleaved (default {ROUNDS})")
    ap.add_argument("--timeout", type=float, default=60.0, help="per measurement (s)")
    ap.add_argument("--only", help="comma-separated labels to measure (default: all)")
    ap.add_argument("--json", type=Path, help="write the rows and the pick here")
    ap.add_argument("--print-best", action="store_true",
                    help="print the best setting's variables as KEY=VALUE lines on stdout")
    args = ap.parse_args(argv)
    if args.ops < 1 or args.reps < 1 or args.rounds < 1:
        ap.error("--ops, --reps and --rounds must be at least 1")
    if args.child:
        return child(args.ops, args.reps)
    wanted = set(args.only.split(",")) if args.only else None
    settings = [s for s in SETTINGS if wanted is None or s[0] in wanted]
    if not settings:
        ap.error(f"--only names no setting (known: {', '.join(s[0] for s in SETTINGS)})")
    measured: dict[str, list[dict]] = {label: [] for label, _ in settings}
    failed: set[str] = set()
    for order in rotations(settings, args.rounds):
        for label, env in order:
            if label in failed:
                continue  # a setting that failed once is not picked; spare its time
            one = measure(label, env, args.ops, args.reps, args.timeout)
            measured[label].append(one)
            failed.update([label] if "error" in one else [])
    rows = [summarize(label, env, measured[label]) for label, env in settings]
    for row in rows:
        shown = (f"compiled {row['compiled_us_per_op']:.2f} us/op "
                 f"({row['compiled_us_range'][0]:.2f}-{row['compiled_us_range'][1]:.2f}), "
                 f"eager {row['eager_us_per_op']:.2f} us/op" if "error" not in row
                 else row["error"])
        print(f"[mlx_env_probe] {row['label']:<10} {shown}", file=sys.stderr)
    pick = best(rows)
    # `controls`: the variables the settings vary, which a caller must clear before applying
    # the pick (the children ran without the caller's values of them).
    result = {"ops": args.ops, "reps": args.reps, "rounds": args.rounds, "rows": rows,
              "margin": PICK_MARGIN, "controls": KEYS,
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
