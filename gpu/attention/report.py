"""Markdown tables from a bench.py --json file, or from one of the bench files kept in a
compressed results bundle (docs/results/attention-gpu/, the `files` object of its JSON):

    python report.py out/bench.json
    python report.py ../../docs/results/attention-gpu/standalone-bench-r1-r3.json.gz results/r3/bench.json
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import defaultdict

LADDER = ["s0_naive", "s1_tiled", "s2_tiled_exp2", "s3_tiled_kt", "s4_mma", "s5_mma_cpasync", "s6_mma_tile",
          "s7_causal_skip", "s8_wgmma", "s9_wgmma_overlap"]


def fmt(x, spec=".3f"):
    return "–" if x is None else format(x, spec)


def load(path: str, key: str | None = None) -> dict:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        data = json.load(f)
    if "files" in data:  # a results bundle: {"about": ..., "files": {former path: content}}
        benches = [k for k, v in data["files"].items() if isinstance(v, dict) and "rows" in v]
        if key not in benches:
            sys.exit(f"name one of the bundle's bench files: {', '.join(benches)}")
        data = data["files"][key]
    return data


def main(path: str, key: str | None = None) -> int:
    data = load(path, key)
    rows = data["rows"]
    by_cfg = defaultdict(list)
    for r in rows:
        by_cfg[(r["shape"], r["dtype"], r["causal"])].append(r)

    def first(cfg, impl, backend):
        # The first measurement of a configuration (later ones repeat the baselines).
        for r in by_cfg[cfg]:
            if r["impl"] == impl and r["backend"] == backend and r.get("ms"):
                return r
        return None

    print(f"meta: {json.dumps(data['meta'])}\n")
    for causal in (False, True):
        cfg = ("B1H32L4096D128", "f16", causal)
        mlx = first(cfg, "mlx_native", "mlx")
        sdpa = first(cfg, "torch_sdpa", "torch")
        print(f"### Per-step, B1 H32 L4096 D128 f16, causal={int(causal)} "
              f"(MLX native {fmt(mlx and mlx['ms'])} ms per call, {fmt(mlx and mlx.get('chain_ms'))} ms chained; "
              f"SDPA {fmt(sdpa and sdpa['ms'])} ms)\n")
        print("| step | ms (cuda) | TFLOP/s | × MLX native | × SDPA | max err / max ref |")
        print("|---|---|---|---|---|---|")
        for name in LADDER:
            r = first(cfg, name, "cuda")
            if r:
                print(f"| {name} | {fmt(r['ms'])} | {fmt(r['tflops'], '.0f')} | {fmt(r.get('vs_mlx'), '.2f')} | "
                      f"{fmt(r.get('vs_sdpa'), '.2f')} | {fmt(r.get('rel_err'), '.1e')} |")
        print()
    print("### Sweep (cuda backend, f16)\n")
    names = sorted({r["impl"] for r in rows if r["backend"] == "cuda"} - set(LADDER[:4]))
    shapes = sorted({(r["shape"], r["causal"]) for r in rows if r["dtype"] == "f16" and not r["held_out"]})
    print("| variant | " + " | ".join(f"{s} c{int(c)}" for s, c in shapes) + " |")
    print("|---|" + "---|" * len(shapes))
    for n in names:
        cells = []
        for s, c in shapes:
            r = first((s, "f16", c), n, "cuda")
            cells.append(fmt(r and r["ms"]) + ("" if not r or r["ok"] else " ✗"))
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    print("### Picks through both backends, every workload\n")
    picks = data["meta"].get("picks", {})
    print(f"picks: {picks}\n")
    print("| workload | dtype | causal | SDPA ms | MLX native ms (chained) | pick | cuda ms | × MLX | × SDPA | mlx ms (chained) | × MLX native | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cfg in by_cfg:
        shape, dt, causal = cfg
        d = int(shape.split("D")[-1])
        pick = picks.get(f"causal={int(causal)},D={d}") or picks.get(str(int(causal)))  # r2 format: per causal only
        sdpa, nat = first(cfg, "torch_sdpa", "torch"), first(cfg, "mlx_native", "mlx")
        c, m = first(cfg, pick, "cuda"), first(cfg, pick, "mlx")
        if not (c or m):
            continue
        held = " (held out)" if by_cfg[cfg][0]["held_out"] else ""
        ok = all(r["ok"] for r in (c, m) if r)
        print(f"| {shape}{held} | {dt} | {int(causal)} | {fmt(sdpa and sdpa['ms'])} | {fmt(nat and nat['ms'])} "
              f"({fmt(nat and nat.get('chain_ms'))}) | {pick} | {fmt(c and c['ms'])} | {fmt(c and c.get('vs_mlx'), '.2f')} | "
              f"{fmt(c and c.get('vs_sdpa'), '.2f')} | {fmt(m and m['ms'])} ({fmt(m and m.get('chain_ms'))}) | "
              f"{fmt(m and m.get('vs_mlx'), '.2f')} | {'yes' if ok else 'NO'} |")
    bad = [r for r in rows if r.get("ms") and not r.get("ok")]
    failed = [r for r in rows if not r.get("ms") and r.get("error")]
    print(f"\nrows: {len(rows)}; incorrect: {len(bad)}; not measured: {len(failed)}")
    for r in failed[:10]:
        print(f"- {r['impl']}/{r['backend']}/{r['shape']}/{r['dtype']}/c{int(r['causal'])}: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
