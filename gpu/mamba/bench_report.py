"""The table of gpu/mamba/bench_check.sh: reports of `ksearch bench mamba --save` (one per run)
folded into the median and spread (min–max, and max/min − 1) over runs of our prefill tok/s per
length, decode tok/s and the scan alone per layer (µs, and share of the memory floor at the
best of the runs' bandwidth passes), plus what each run picked (MLX setting, scan per length,
decode path, with the decode rate of every path it timed) and whether its logits check passed.

    python3 gpu/mamba/bench_report.py OUT/bench-*.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med) + " (1 run)"
    lo, hi = min(values), max(values)
    rel = f", {100 * (hi / lo - 1):.0f}%" if lo > 0 else ""
    return f"{fmt.format(med)} ({fmt.format(lo)}–{fmt.format(hi)}{rel})"


def fold(reports: list[dict]) -> dict:
    prefill: dict[str, list[float]] = defaultdict(list)
    decode: list[float] = []
    scan_us: dict[int, list[float]] = defaultdict(list)
    floor_us: dict[int, list[float]] = defaultdict(list)
    picks = []
    for r in reports:
        ours = next((row for row in r.get("rows", []) if row.get("impl") == "ksearch"), {})
        for length, v in (ours.get("prefill_tok_s") or {}).items():
            prefill[length].append(v)
        if ours.get("decode_tok_s") is not None:
            decode.append(ours["decode_tok_s"])
        for k in r.get("kernel_only") or []:
            scan_us[k["L"]].append(k["us_per_layer"])
            floor_us[k["L"]].append(k["floor_us"])
        kernel = r.get("kernel") or {}
        picks.append({
            "setting": " ".join(f"{k}={v}" for k, v in
                                ((r.get("versions") or {}).get("mlx_env") or {}).items())
                       or "MLX's defaults",
            "scan": ((kernel.get("tuning") or {}).get("picks")) or kernel.get("source"),
            "decode_path": " ".join(x for x in (
                (kernel.get("decode_tuning") or {}).get("pick"),
                f"({kernel['decode_path']})" if kernel.get("decode_path") else None) if x),
            "decode_paths": ", ".join(
                f"{m} {v:,.0f}" for m, v in
                ((kernel.get("decode_tuning") or {}).get("tok_s") or {}).items()) or "–",
            "check": (r.get("check") or {}).get("passed"),
        })
    # Each run's floor is the scan's bytes over its own bandwidth pass, so one slow pass would
    # make that run's scan look closer to its floor; every run's time is set against the floor
    # of the runs' best pass instead, and the share moves with the scan's time alone.
    scan_floor = {L: [min(floor_us[L]) / us for us in times] for L, times in scan_us.items()}
    return {"prefill": prefill, "decode": decode, "scan_us": scan_us, "scan_floor": scan_floor,
            "picks": picks, "runs": len(reports)}


def table(f: dict) -> str:
    lines = [f"{f['runs']} run(s); median (min–max, spread)", "",
             "| figure | value |", "|---|---|"]
    for length in sorted(f["prefill"], key=int):
        lines.append(f"| prefill L={length}, tok/s | {spread(f['prefill'][length])} |")
    lines.append(f"| decode, tok/s | {spread(f['decode'], '{:,.1f}')} |")
    for length in sorted(f["scan_us"]):
        lines.append(f"| scan alone L={length}, µs per layer | "
                     f"{spread(f['scan_us'][length], '{:.1f}')} |")
        lines.append(f"| scan alone L={length}, share of the floor (best pass) | "
                     f"{spread([100 * x for x in f['scan_floor'][length]], '{:.1f}%')} |")
    lines += ["", "| run | MLX setting | scan | decode path | decode paths timed, tok/s | "
              "logits check |", "|---|---|---|---|---|---|"]
    for i, p in enumerate(f["picks"], 1):
        lines.append(f"| {i} | {p['setting']} | {json.dumps(p['scan'])} | {p['decode_path']} | "
                     f"{p['decode_paths']} | "
                     f"{'passed' if p['check'] else 'FAILED' if p['check'] is False else '–'} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    reports = []
    for a in argv:
        try:
            reports.append(json.loads(Path(a).read_text()))
        except (OSError, ValueError) as e:
            print(f"skipped {a}: {e}", file=sys.stderr)
    print(table(fold(reports)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
