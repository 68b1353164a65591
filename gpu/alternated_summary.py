"""The summary of a device script that alternates two settings of one evaluation loop
(gpu/judge_check.sh, gpu/tree_check.sh): every `<name>-<setting>-<pair>.jsonl` in OUT, each
line one `ksearch eval --json-lines` result. Prints per evaluation its status, score, wall and
the harness's phase seconds, then per setting the median wall (and range) and the median of
each phase over the evaluations after each call's first, which pay the judge's and the
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
                print(f"{os.path.basename(path)} #{k}: {r.get('status')} score {r.get('score')} "
                      f"wall {wall:.2f} s  " + " ".join(
                          f"{p} {v:.2f}" for p, v in sorted(ph.items())
                          if v >= 0.05 and p != "total"))
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


if __name__ == "__main__":
    main(*sys.argv[1:3])
