"""Render and compile the named variants of variants.toml into shared libraries for the cuda backend.

    python build.py --out .gpu-build [--nvcc PATH] [--only NAME ...] [--jobs 2] [--mlx-wrap]

Writes <out>/<name>.cu, <out>/<name>.so and <out>/build.json (per variant: knobs, variant id,
nvcc command, and the ptxas report per kernel: registers, spill bytes, stack frame).
Targets sm_90a through -gencode (the -arch=sm_90a shorthand also runs an sm_90 pass).

--mlx-wrap also compiles each variant the way the mlx backend runs it, without MLX: the header
(device code) and body of mx.fast.cuda_kernel in a __global__ function of our own that, like
MLX's, follows the header, is written without __launch_bounds__ (the producer schedule's header
adds them by redefining __global__) and gets T, HEAD_DIM and CAUSAL as constexpr lines. Its ptxas
report goes to build.json under "mlx_kernels", with "mlx_regs_fit" (registers x threads within
the 65536 of an SM).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import family
from family import HERE

PTXAS_ENTRY = re.compile(r"Compiling entry function '(\S+)' for")
PTXAS_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")
MANGLED = re.compile(r"ksa_attention_kernelI(\w+?)Li(\d+)ELb([01])E")


def parse_ptxas(log: str) -> list[dict]:
    kernels: list[dict] = []
    cur: dict | None = None
    for line in log.splitlines():
        m = PTXAS_ENTRY.search(line)
        if m:
            mm = MANGLED.search(m.group(1))
            cur = {"symbol": m.group(1)}
            if mm:
                cur.update(dtype="bf16" if "bfloat16" in mm.group(1) else "f16", head_dim=int(mm.group(2)),
                           causal=mm.group(3) == "1")
            kernels.append(cur)
            continue
        if cur is None:
            continue
        m = PTXAS_PROPS.search(line)
        if m:
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = PTXAS_REGS.search(line)
        if m:
            cur["registers"] = int(m.group(1))
    return kernels


PTXAS_PERF = re.compile(r"\((C75\d\d)\) Potential Performance Loss: (.*?)(?: in the function '\S+')?$")


def perf_warnings(log: str) -> list[str]:
    """ptxas's 'Potential Performance Loss' notes (e.g. C7518: wgmma serialised), one per kind."""
    return sorted({f"{m.group(1)}: {m.group(2)}" for m in map(PTXAS_PERF.search, log.splitlines()) if m})


def find_nvcc(explicit: str | None) -> str:
    for cand in (explicit, os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    raise SystemExit("nvcc not found: pass --nvcc or set NVCC")


def build_one(nvcc: str, name: str, setting: dict, out: Path) -> dict:
    """`setting`: a reply of ksearch (knobs, variant_id, source of the cuda family)."""
    knobs = setting["knobs"]
    src = out / f"{name}.cu"
    so = out / f"{name}.so"
    src.write_text(setting["source"])
    cmd = [nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Xptxas", "-v",
           "-shared", "-Xcompiler", "-fPIC", "-o", str(so), str(src)]
    # pip-installed nvcc (nvidia-cuda-nvcc wheels) keeps libcudart_static.a in ../lib, not lib64.
    pip_lib = Path(nvcc).resolve().parent.parent / "lib"
    if (pip_lib / "libcudart_static.a").exists():
        cmd[1:1] = ["-L" + str(pip_lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode == 0 and shutil.which("strip"):
        # The static cudart makes each library ~1 MB; symbols are dead weight in the 64 MiB carry.
        subprocess.run(["strip", "--strip-unneeded", str(so)], check=False)
    return {
        "name": name,
        "variant_id": setting["variant_id"],
        "knobs": knobs,
        "ok": proc.returncode == 0,
        "command": cmd,
        "kernels": parse_ptxas(log),
        "perf_warnings": perf_warnings(log),
        "smem_bytes": {str(d): family.launch(knobs, d)["smem_bytes"] for d in family.HEAD_DIMS},
        "log": "" if proc.returncode == 0 else log[-4000:],
    }


MLX_WRAP = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
{header}
struct KsaShape {{
  int d[4];
  __device__ int operator[](int i) const {{ return d[i]; }}
}};
{kernels}"""
MLX_KERNEL = """__global__ void ksa_attention_kernel_mlx_{ty}_{d}_{c}(const {ty}* q, const {ty}* k, const {ty}* v,
                                                      const KsaShape q_shape, {ty}* out) {{
  using T = {ty};
  constexpr int HEAD_DIM = {d};
  constexpr bool CAUSAL = {causal};
{body}
}}
"""
MLX_MANGLED = re.compile(r"ksa_attention_kernel_mlx_(\w+?)_(\d+)_([01])")


def build_mlx_wrap(nvcc: str, name: str, knobs: dict, out: Path) -> dict:
    """The header and body of the mlx backend in a __global__ function written as MLX writes
    its kernel (no launch bounds of its own), compiled as the harness compiles (-arch=sm_90a:
    the sm_90a code and a compute_90 pass)."""
    header, body = family.render_mlx(knobs)
    kernels = "".join(
        MLX_KERNEL.format(ty=ty, d=d, c=int(c), causal="true" if c else "false", body=body)
        for ty in ("__half", "__nv_bfloat16") for d in family.HEAD_DIMS for c in (False, True))
    src = out / f"{name}.mlx.cu"
    src.write_text(MLX_WRAP.format(header=header, kernels=kernels))
    cmd = [nvcc, "-arch=sm_90a", "-O3", "-std=c++17", "-Xptxas", "-v", "-c", "-o", str(out / f"{name}.mlx.o"),
           str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    kernels_report = []
    for k in parse_ptxas(log):
        m = MLX_MANGLED.search(k["symbol"])
        if m:
            k.update(dtype="bf16" if "bfloat16" in m.group(1) else "f16", head_dim=int(m.group(2)),
                     causal=m.group(3) == "1")
        kernels_report.append(k)
    threads = family.launch(knobs, family.HEAD_DIMS[0])["threads"]
    regs = max((k.get("registers", 0) for k in kernels_report), default=0)
    return {"mlx_ok": proc.returncode == 0, "mlx_kernels": kernels_report, "mlx_perf_warnings": perf_warnings(log),
            "mlx_regs_fit": regs * threads <= 65536, "mlx_log": "" if proc.returncode == 0 else log[-4000:]}


def build_probe(nvcc: str, knobs: dict, out: Path) -> int:
    """The probe launches one warpgroup (128 threads), so it needs a variant whose THREADS is 128."""
    header, _ = family.render_mlx(knobs)
    (out / "wgmma_device.cuh").write_text(header)
    cmd = [nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-O2", "-std=c++17", f"-I{out}",
           str(HERE / "probe" / "wgmma_probe.cu"), "-o", str(out / "wgmma_probe")]
    pip_lib = Path(nvcc).resolve().parent.parent / "lib"
    if (pip_lib / "libcudart_static.a").exists():
        cmd[1:1] = ["-L" + str(pip_lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    print(f"wgmma_probe            {'ok ' if proc.returncode == 0 else 'ERR'}")
    if proc.returncode != 0:
        print(proc.stdout + proc.stderr, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nvcc")
    ap.add_argument("--variants", type=Path, default=HERE / "variants.toml")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--probe", action="store_true", help="also build probe/wgmma_probe.cu against wg_m64n64s2")
    ap.add_argument("--mlx-wrap", action="store_true",
                    help="also compile each variant as the mlx backend's kernel (MLX's signature)")
    args = ap.parse_args(argv)
    nvcc = find_nvcc(args.nvcc)
    variants = family.load_variants(args.variants)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    # ksearch renders every variant in one call; nvcc then runs in parallel.
    replies = family.cuda().batch([{"name": n, "knobs": k} for n, k in variants.items()])
    for r in replies:
        if "error" in r:
            raise SystemExit(f"{r['name']}: {r['error']}")
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda r: build_one(nvcc, r["name"], r, args.out), replies))
        if args.mlx_wrap:
            # Settings the mlx family cannot express (cuda only) have no mlx wrap.
            on_mlx = {n: k for n, k in variants.items() if family.on_mlx(k)}
            wraps = dict(zip(on_mlx, pool.map(lambda kv: build_mlx_wrap(nvcc, kv[0], kv[1], args.out),
                                              on_mlx.items())))
            for r in results:
                r.update(wraps.get(r["name"], {"mlx_ok": None}))
    report = args.out / "build.json"
    # --only rebuilds a subset; keep the other variants' entries.
    merged = {r["name"]: r for r in (json.loads(report.read_text()) if report.exists() else [])}
    merged.update({r["name"]: r for r in results})
    report.write_text(json.dumps(list(merged.values()), indent=1))
    failed = 0
    if args.probe:
        failed += build_probe(nvcc, family.load_variants(args.variants)["wg_m64n64s2"], args.out)
    for r in results:
        worst = max(r["kernels"], key=lambda k: k.get("registers", 0), default={})
        spills = sum(k.get("spill_stores", 0) + k.get("spill_loads", 0) for k in r["kernels"])
        print(f"{r['name']:<22} {'ok ' if r['ok'] else 'ERR'} max_regs={worst.get('registers', '?'):>4} "
              f"spill_bytes={spills:<6} smem={r['smem_bytes']}")
        if not r["ok"]:
            failed += 1
            print(r["log"], file=sys.stderr)
        for w in r["perf_warnings"] + r.get("mlx_perf_warnings", []):
            print(f"{'':<22} ptxas {w}")
        if r.get("mlx_ok") is not None:  # None: a cuda-only setting, no mlx wrap
            mk = [k for k in r["mlx_kernels"] if "head_dim" in k]
            mregs = max((k.get("registers", 0) for k in mk), default="?")
            mspill = sum(k.get("spill_stores", 0) + k.get("spill_loads", 0) for k in mk)
            print(f"{'  mlx wrap':<22} {'ok ' if r['mlx_ok'] else 'ERR'} max_regs={mregs:>4} "
                  f"spill_bytes={mspill:<6} regs_x_threads_fit={r['mlx_regs_fit']}")
            if not r["mlx_ok"] or not r["mlx_regs_fit"]:
                failed += 1
                print(r["mlx_log"], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
