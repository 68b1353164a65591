"""The summary of a device script that alternates two settings of one evaluation loop
(gpu/judge_check.sh, gpu/tree_check.sh): every `<name>-<setting>-<pair>.jsonl` in OUT, each
line one `ksearch eval --json-lines` result. Prints per evaluation its status, score and
interval, wall, the harness's phase seconds and, on the device clock, the accused's timed
calls (_timed_calls), then per setting the median wall (and range) and the median of each
phase over the evaluations after each call's first, which pay the judge's and the
yardstick's start.

    python3 gpu/alternated_summary.py OUT NAME
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import sys


def main(out: str, name: str) -> None:
    later: dict[str, list[float]] = {}
    phases: dict[str, dict[str, list[float]]] = {}
    for path in sorted(glob.glob(os.path.join(out, f"{name}-*.jsonl"))):
        setting = os.path.basename(path)[len(name) + 1:].split("-")[0]
        walls = later.setdefault(setting, [])
        with open(path) as f:
            for k, line in enumerate(f):
                r = json.loads(line).get("result") or {}
                ph = (r.get("diagnostics") or {}).get("phase_seconds") or {}
                wall = r.get("wall_seconds") or 0.0
                timing = _timed_calls(r)
                print(f"{os.path.basename(path)} #{k}: {r.get('status')} score {r.get('score')} "
                      f"interval {r.get('score_interval')} wall {wall:.2f} s  " + " ".join(
                          f"{p} {v:.2f}" for p, v in sorted(ph.items())
                          if v >= 0.05 and p != "total") + timing)
                if k > 0:
                    walls.append(wall)
                    for p, v in ph.items():
                        if p != "total":
                            phases.setdefault(setting, {}).setdefault(p, []).append(v)
    for setting, walls in later.items():
        if walls:
            print(f"{name} {setting}: median wall after each call's first evaluation "
                  f"{statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}) over "
                  f"{len(walls)}")
            parts = phases.get(setting, {})
            print(f"{name} {setting}: median phase seconds " + " ".join(
                f"{p} {statistics.median(v):.2f}" for p, v in sorted(
                    parts.items(), key=lambda kv: -statistics.median(kv[1]))
                if statistics.median(v) >= 0.05))


def _timed_calls(r: dict) -> str:
    """The candidate's timed calls in the accused where it timed them on the device clock:
    per workload in the order timed, the median of their host time under the profiler, of the
    judge's round trips and (where recorded) of the judge's own anchor calls' host time, and
    how many calls were charged above their device time (the judge's window less a round
    trip bounds a charge from below), which is where host work in the accused turns into
    score noise."""
    host, trips, anchor, over, calls = [], [], [], 0, 0
    for w in r.get("workloads") or []:
        parts = w.get("candidate_parts_ns") or {}
        device = parts.get("device_ns") or []
        if parts.get("profiled_host_ns"):
            host.append(statistics.median(parts["profiled_host_ns"]) / 1e6)
            trips.append(statistics.median(w.get("round_trip_ns") or [0]) / 1e6)
            judged = (w.get("anchor_parts_ns") or {}).get("profiled_host_ns")
            if judged:
                anchor.append(statistics.median(judged) / 1e6)
        for charged, dev in zip(w.get("candidate_ns") or [], device):
            calls += 1
            over += charged > dev + 50_000
    if not host:
        return ""
    judge = (f", the judge's anchor host {'/'.join(f'{a:.2f}' for a in anchor)}"
             if len(anchor) == len(host) else "")
    return (f"  | accused host ms by workload {'/'.join(f'{h:.2f}' for h in host)}, round trips "
            f"{'/'.join(f'{t:.2f}' for t in trips)}{judge}, charged above device "
            f"{over}/{calls}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
