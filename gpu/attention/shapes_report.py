"""The table of gpu/attention/shapes_check.sh: `ksearch bench attention --json` reports of one
or more runs per backend, folded into the median and spread (min–max) over runs of the kernel's
time, its TFLOP/s and its ratio against each native (native time / kernel time: above 1 is
faster than the native), per shape, plus the geometric mean of the per-shape medians.

    tar -xzf OUT/benches.tgz && python3 gpu/attention/shapes_report.py benches/*.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def shape_label(params: dict) -> str:
    causal = "causal" if int(params.get("causal", 0)) else "non-causal"
    return (f"B{params.get('B')} H{params.get('H')} L{params.get('L')} D{params.get('D')} "
            f"{params.get('dtype')} {causal}")


def spread(values: list[float]) -> str:
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.3g} (1 run)"
    return f"{med:.3g} ({min(values):.3g}–{max(values):.3g})"


def fold(paths: list[Path]) -> dict[str, dict]:
    """backend -> {kernel, gpu, runs, shapes: label -> metric -> [values]}"""
    out: dict[str, dict] = {}
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"skipped {path}: {e}", file=sys.stderr)
            continue
        b = out.setdefault(doc.get("backend", "?"), {
            "kernel": doc.get("kernel"), "gpu": doc.get("gpu"), "runs": 0,
            "shapes": defaultdict(lambda: defaultdict(list))})
        b["runs"] += 1
        for w in doc.get("workloads", []):
            label = shape_label(w.get("params", {}))
            c = w.get("contenders", {})
            k = c.get("kernel", {})
            if k.get("median_ms") is None or k.get("correct") is False:
                b["shapes"][label]["failed"].append(1.0)
                continue
            b["shapes"][label]["ms"].append(k["median_ms"])
            if k.get("tflops") is not None:
                b["shapes"][label]["tflops"].append(k["tflops"])
            for native in ("sdpa", "mlx"):
                r = (c.get(native) or {}).get("ratio")
                if r is not None:
                    b["shapes"][label][native].append(r)
    return out


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0]
    return statistics.geometric_mean(values) if values else None


def table(folded: dict[str, dict]) -> str:
    lines = []
    for backend, b in folded.items():
        lines.append(f"### {backend}: {b['kernel']} on {b['gpu']}, {b['runs']} run(s)\n")
        lines.append("| shape | kernel ms | TFLOP/s | × SDPA | × MLX native | failed runs |")
        lines.append("|---|---|---|---|---|---|")
        medians: dict[str, list[float]] = defaultdict(list)
        for label, m in b["shapes"].items():
            lines.append(f"| {label} | {spread(m['ms'])} | {spread(m['tflops'])} | "
                         f"{spread(m['sdpa'])} | {spread(m['mlx'])} | {len(m['failed'])} |")
            for native in ("sdpa", "mlx"):
                if m[native]:
                    medians[native].append(statistics.median(m[native]))
        g = {n: geomean(v) for n, v in medians.items()}
        lines.append("")
        lines.append("geometric mean of the per-shape medians: "
                     + ", ".join(f"× {n} {g[n]:.3f} over {len(medians[n])} shapes"
                                 for n in ("sdpa", "mlx") if g.get(n)))
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(table(fold([Path(a) for a in argv])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
