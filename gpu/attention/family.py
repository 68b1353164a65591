"""The attention task's GPU families as the tools here (build.py, bench.py, mlx_attention.py)
use them: rendered by ksearch (gpu/ksearch_render.py, a client of `ksearch tasks --render`), and
the launch geometry of gpu.toml, which ksearch does not need (the mlx module it renders carries
its own launch arithmetic).

    cuda = family.cuda()                              # tasks/attention/templates-cuda
    knobs = cuda.resolve({"algo": "mma"})             # ksearch's checks and defaults
    src = cuda.render(knobs)                          # extern "C" attention_f16 / attention_bf16
    header, body = family.render_mlx(knobs)           # for mx.fast.cuda_kernel
    named = family.load_variants()                    # variants.toml: name -> cuda knobs
    family.launch(knobs, 128), family.grid(knobs, B, H, L)
"""

from __future__ import annotations

import sys
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from ksearch_render import Family, RenderError  # noqa: E402

GPU = tomllib.loads((HERE / "gpu.toml").read_text())
HEAD_DIMS: list[int] = list(GPU["backends"]["head_dims"])
VARIANTS = HERE / "variants.toml"

__all__ = ["Family", "RenderError", "HERE", "HEAD_DIMS", "cuda", "mlx", "mlx_knobs", "on_mlx",
           "render_mlx", "load_variants", "launch", "grid"]


@lru_cache(maxsize=None)
def cuda() -> Family:
    return Family("attention", "cuda")


@lru_cache(maxsize=None)
def mlx() -> Family:
    """The mlx family (target mlx-cuda): the cuda family's knobs less min_blocks."""
    return Family("attention", "mlx", target="mlx-cuda")


def mlx_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """A cuda setting as the mlx family's: MLX writes its kernel's signature itself, so the mlx
    family has no min_blocks (its header bounds the producer schedule's kernel to one block)."""
    return mlx().restrict(knobs)


def on_mlx(knobs: dict[str, Any]) -> bool:
    """Whether the mlx family can express a cuda setting: every value it keeps lies in the mlx
    family's domain (the TMA producer is cuda only)."""
    domains = {k["name"]: k["values"] for k in mlx().describe()["knobs"]}
    return all(v in domains[k] for k, v in mlx_knobs(knobs).items())


def render_mlx(knobs: dict[str, Any]) -> tuple[str, str]:
    """The device code (the `header` of mx.fast.cuda_kernel) and the body MLX wraps, rendered
    by ksearch from the mlx family's templates named in gpu.toml, in one call."""
    setting = mlx_knobs(knobs)
    replies = mlx().batch([{"knobs": setting, "template": GPU["backends"][t]}
                           for t in ("mlx_header", "mlx_body")])
    for r in replies:
        if "error" in r:
            raise RenderError(r["error"])
    return replies[0]["source"], replies[1]["source"]


def load_variants(path: Path = VARIANTS) -> dict[str, dict[str, Any]]:
    """The named cuda settings of a variants file, completed and checked by ksearch."""
    return cuda().variants(path)


# gpu.toml's formulas are Python expressions over the knobs (plus head_dim, or B, H, L); they
# are compiled once, since the mlx wrapper computes its grid on every call.
_CODE: dict[str, Any] = {}


def _eval(expr: str, ctx: dict[str, Any]) -> int:
    code = _CODE.get(expr)
    if code is None:
        code = _CODE[expr] = compile(expr, "gpu.toml", "eval")
    return int(eval(code, {"__builtins__": {}}, ctx))  # noqa: S307 - gpu.toml beside this file


def launch(knobs: dict[str, Any], head_dim: int) -> dict[str, int]:
    """Threads per block and dynamic shared-memory bytes for one head dim."""
    ctx = dict(knobs, head_dim=head_dim)
    ctx["q_bufs"] = _eval(GPU["launch"]["q_bufs"], ctx)
    return {"threads": _eval(GPU["launch"]["threads"], ctx),
            "smem_bytes": _eval(GPU["launch"]["smem_bytes"], ctx)}


def grid(knobs: dict[str, Any], B: int, H: int, L: int) -> tuple[int, int, int]:
    ctx = dict(knobs, B=B, H=H, L=L)
    gx, gy, gz = (_eval(e, ctx) for e in GPU["launch"]["grid"])
    return gx, gy, gz
