"""Compiles model_kernels.py's mx.fast.cuda_kernel bodies with nvcc for a real GPU target, as
MLX's CUDA backend would assemble them, and reports ptxas's registers, spills and shared memory.
This catches syntax, type and inline-PTX errors on a machine without a GPU (the CPU emulation
compiles the same bodies with g++, but its KSM_EMULATION branches replace the PTX).

    python gpu/mamba/cuda_compile.py [--nvcc PATH] [--arch sm_90a] [--json]

What MLX's backend (mlx/backend/cuda/custom_kernel.cpp) puts around a body, and what this file
mimics: its default header (here: the CUDA half/bfloat16 headers, cooperative groups and MLX's
`Shape`, a cuda::std::array of int32), the kernel's `header`, then `__global__ void NAME(...)` in
namespace mlx::core::cu with each input as `const T* name` (and `const __grid_constant__ Shape
name_shape` when the body uses it), each output as `T* name`, the template arguments as
`constexpr int/bool` lines and `using` aliases, then the body. nvcc stands in for NVRTC.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

PRELUDE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda/std/array>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 8>;
}
using mlx::core::cu::Shape;
"""

CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
          "int32": "int32_t", "uint32": "uint32_t"}


def find_nvcc() -> str | None:
    """$NVCC, nvcc on PATH, $CUDA_HOME/bin, then the pip layout (nvidia/cu13/bin) of this
    interpreter's site-packages or of the repository's .venv."""
    env = os.environ.get("NVCC")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    patterns = [os.path.join(p, "nvidia", "cu13", "bin", "nvcc") for p in sys.path if p]
    patterns.append(str(REPO / ".venv" / "lib" / "python3*" / "site-packages" / "nvidia" / "cu13"
                        / "bin" / "nvcc"))
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if os.access(path, os.X_OK):
                return path
    return None


def kernel_source(name: str, body: str, inputs: list[tuple[str, str]],
                  outputs: list[tuple[str, str]], template: list[tuple[str, object]]) -> str:
    """One kernel as MLX's CUDA backend assembles it (without the shared prelude and header).
    inputs/outputs: (name, C type); template: (name, int | bool | C type name)."""
    params = []
    for n, t in inputs:
        params.append(f"    const {t}* {n}")
        if f"{n}_shape" in body:
            params.append(f"    const __grid_constant__ Shape {n}_shape")
    params += [f"    {t}* {n}" for n, t in outputs]
    consts = []
    for n, v in template:
        if isinstance(v, bool):
            consts.append(f"  constexpr bool {n} = {'true' if v else 'false'};")
        elif isinstance(v, int):
            consts.append(f"  constexpr int {n} = {v};")
        else:
            consts.append(f"  using {n} = {v};")
    return "\n".join(["namespace mlx::core::cu {", f"__global__ void {name}(",
                      ",\n".join(params) + ") {", *consts, body, "}", "}  // namespace mlx::core::cu",
                      ""])


def model_kernel_unit(module, dtype: str = "float16", d_model: int = 1024, dim: int = 2048,
                      n: int = 16, rank: int = 64, k: int = 4,
                      layers: int = 48) -> tuple[str, list[str]]:
    """(source, kernel names): every kernel of model_kernels.py at mamba-370m's shapes."""
    t = CTYPES[dtype]
    f, u, i = "float", "uint32_t", "int32_t"
    specs = [
        ("ksm_conv_silu", module.CONV_BODY, [("xz", t), ("cache", t), ("weight", t), ("bias", t)],
         [("xc", t), ("new_cache", t)], [("T", t), ("K", k)]),
        ("ksm_ssm_step", module.STEP_BODY,
         [("xc", t), ("dbc", t), ("w_dt", t), ("dt_bias", f), ("A", f), ("D", f), ("xz", t),
          ("h0", f)], [("y", t), ("h_out", f)],
         [("T", t), ("NS", n), ("R", rank), ("XS", 2 * dim)]),
        ("ksm_in_conv", module.IN_CONV_BODY,
         [("x", t), ("norm_w", t), ("eps", f), ("w_in", t), ("cache", t), ("conv_w", t),
          ("conv_b", t)], [("xcz", t), ("new_cache", t)], [("T", t), ("DM", d_model), ("K", k)]),
        ("ksm_xproj", module.XPROJ_BODY, [("xcz", t), ("w_x", t)], [("dbc", t)],
         [("T", t), ("DI", dim)]),
        ("ksm_out_res", module.OUT_BODY, [("x", t), ("y", t), ("w_out", t)], [("x_out", t)],
         [("T", t), ("DM", d_model), ("DI", dim)]),
        ("ksm_layer", module.LAYER_BODY,
         [("x", t), ("norm_w", t), ("eps", f), ("w_in", t), ("cache", t), ("conv_w", t),
          ("conv_b", t), ("w_x", t), ("w_dt", t), ("dt_bias", f), ("A", f), ("D", f),
          ("w_out", t), ("h0", f), ("barrier", u), ("poison", u)],
         [("x_out", t), ("new_cache", t), ("h_out", f), ("xcz", t), ("dbc", t), ("y", t),
          ("status", i)],
         [("T", t), ("DM", d_model), ("DI", dim), ("K", k), ("NS", n), ("R", rank),
          ("SPIN_LIMIT", module.SPIN_LIMIT), ("GRID_SYNC", True)]),
        ("ksm_model", module.MODEL_BODY,
         [("x", t), ("norm_w", t), ("eps", f), ("w_in", t), ("cache", t), ("conv_w", t),
          ("conv_b", t), ("w_x", t), ("w_dt", t), ("dt_bias", f), ("A", f), ("D", f),
          ("w_out", t), ("h0", f), ("barrier", u), ("poison", u)],
         [("x_out", t), ("new_cache", t), ("h_out", f), ("xs", t), ("xcz", t), ("dbc", t),
          ("y", t), ("status", i)],
         [("T", t), ("NL", layers), ("DM", d_model), ("DI", dim), ("K", k), ("NS", n),
          ("R", rank), ("SPIN_LIMIT", module.SPIN_LIMIT), ("GRID_SYNC", True)]),
    ]
    parts = [PRELUDE, module.HEADER]
    names = []
    for name, body, ins, outs, template in specs:
        parts.append(kernel_source(name, body, ins, outs, template))
        names.append(name)
    return "\n".join(parts), names


PTXAS_FUNC = re.compile(r"Compiling entry function '(\w+)'")
PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")
PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str, names: list[str]) -> dict[str, dict]:
    """Per kernel (matched by the names it was declared with): registers, shared memory bytes,
    stack frame and spill bytes."""
    report: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        m = PTXAS_FUNC.search(line)
        if m:
            current = next((n for n in names if n in m.group(1)), m.group(1))
            report[current] = {}
            continue
        if current is None:
            continue
        m = PTXAS_SPILL.search(line)
        if m:
            report[current].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                                   spill_load_bytes=int(m.group(3)))
        m = PTXAS_USED.search(line)
        if m:
            report[current].update(registers=int(m.group(1)), smem_bytes=int(m.group(2) or 0))
    return report


def load_bodies():
    """model_kernels.py's strings without importing MLX: the module is executed with a stand-in
    for `mlx.core` whose cuda_kernel only records its arguments."""
    sys.path.insert(0, str(HERE / "emu"))
    try:
        from fake_mlx import FakeMx
    finally:
        sys.path.remove(str(HERE / "emu"))
    return FakeMx().load(HERE / "model_kernels.py", "ksm_model_kernels_nvcc")


def build(nvcc: str, arch: str = "sm_90a", dtype: str = "float16", keep: Path | None = None) -> dict:
    """Compiles every model kernel (one translation unit, -cubin) for `arch` with -Xptxas -v.
    Returns {"rc", "nvcc", "arch", "kernels": {name: ptxas figures}, "log" (on failure)}."""
    unit, names = model_kernel_unit(load_bodies(), dtype)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="ksm-nvcc-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "model_kernels.cu"
    src.write_text(unit)
    number = arch.removeprefix("sm_")
    cmd = [nvcc, "-std=c++17", "-cubin", f"-gencode=arch=compute_{number},code=sm_{number}",
           "-Xptxas", "-v", str(src), "-o", str(work / "model_kernels.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = {"rc": proc.returncode, "nvcc": nvcc, "arch": arch, "dtype": dtype, "command": cmd,
           "kernels": parse_ptxas(proc.stderr + proc.stdout, names)}
    if proc.returncode:
        out["log"] = (proc.stderr + proc.stdout)[-6000:]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", default=None)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--keep", type=Path, help="write the .cu and .cubin here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    nvcc = args.nvcc or find_nvcc()
    if nvcc is None:
        print("no nvcc found ($NVCC, PATH, $CUDA_HOME, nvidia/cu13 in site-packages)",
              file=sys.stderr)
        return 2
    report = build(nvcc, args.arch, args.dtype, args.keep)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        if report["rc"]:
            print(report["log"], file=sys.stderr)
        for name, k in report["kernels"].items():
            print(f"{name:16s} {k.get('registers', '?'):>4} registers  "
                  f"{k.get('smem_bytes', 0):>6} B smem  {k.get('stack_bytes', 0):>4} B stack  "
                  f"{k.get('spill_store_bytes', 0) + k.get('spill_load_bytes', 0):>4} B spills")
    return 1 if report["rc"] else 0


if __name__ == "__main__":
    sys.exit(main())
