"""mlx backend of the attention-gpu family: the same device code as the cuda entry points, built
with mx.fast.cuda_kernel (header = the rendered device functions, source = the body MLX wraps).

    from mlx_attention import MlxAttention
    attn = MlxAttention({"algo": "wgmma", "block_m": 128, "block_n": 128, "warps": 8, "cp_async": True, "stages": 2})
    out = attn(q, k, v, causal=True)                     # q, k, v: mx.array [B, H, L, D] f16/bf16

The kernel name carries a hash of header + body, because MLX before 0.32.1 silently reused the
first kernel compiled under a name, and a search compiles many bodies.
"""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx

import family

_DTYPES = {mx.float16: "f16", mx.bfloat16: "bf16"}


class FamilyError(ValueError):
    """Inputs the kernels do not take (shape, dtype, head dim)."""


class MlxAttention:
    def __init__(self, knobs: dict[str, Any] | None = None):
        # ksearch completes and checks the setting (family.RenderError otherwise), renders it.
        self.knobs = family.cuda().resolve(dict(knobs or {}))
        self.header, self.body = family.render_mlx(self.knobs)
        self.source_hash = hashlib.sha256((self.header + "\0" + self.body).encode()).hexdigest()[:12]
        self._kernels: dict[int, Any] = {}
        self._launch: dict[tuple[int, int, int, int], tuple[int, tuple[int, int, int]]] = {}

    def _kernel(self, head_dim: int):
        # Dynamic shared memory is fixed when the kernel object is made, and depends on D.
        kern = self._kernels.get(head_dim)
        if kern is None:
            smem = family.launch(self.knobs, head_dim)["smem_bytes"]
            kern = mx.fast.cuda_kernel(
                name=f"ksa_attention_{self.source_hash}_d{head_dim}",
                input_names=["q", "k", "v"],
                output_names=["out"],
                source=self.body,
                header=self.header,
                ensure_row_contiguous=True,
                shared_memory=smem,
            )
            self._kernels[head_dim] = kern
        return kern

    def __call__(self, q: mx.array, k: mx.array, v: mx.array, causal: bool = False) -> mx.array:
        if q.ndim != 4 or q.shape != k.shape or q.shape != v.shape:
            raise FamilyError(f"q, k, v must share one [B, H, L, D] shape, got {q.shape}, {k.shape}, {v.shape}")
        if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
            raise FamilyError(f"dtype must be float16 or bfloat16 for all inputs, got {q.dtype}, {k.dtype}, {v.dtype}")
        B, H, L, D = q.shape
        if D not in family.HEAD_DIMS:
            raise FamilyError(f"head dim {D} not in {family.HEAD_DIMS}")
        if B == 0 or H == 0 or L == 0:
            return mx.zeros(q.shape, dtype=q.dtype)
        if B > 65535 or H > 65535:
            raise FamilyError("B and H must be at most 65535 (grid y/z)")
        launch = self._launch.get((B, H, L, D))
        if launch is None:
            threads = family.launch(self.knobs, D)["threads"]
            launch = self._launch[(B, H, L, D)] = (threads, family.grid(self.knobs, B, H, L))
        threads, (gx, gy, gz) = launch
        (out,) = self._kernel(D)(
            inputs=[q, k, v],
            template=[("T", q.dtype), ("HEAD_DIM", D), ("CAUSAL", bool(causal))],
            grid=(gx * threads, gy, gz),  # MLX's grid counts threads
            threadgroup=(threads, 1, 1),
            output_shapes=[q.shape],
            output_dtypes=[q.dtype],
        )
        return out


# The default variant per (causal, head dim): names in variants.toml. Through MLX on an H200
# the producer schedule beat ping-pong from L 2048 up and stayed within a few percent of it on
# the shorter of gpu/attention/shapes_check.sh's twelve shapes, at both head dims, causal or not
# (docs/results/attention-gpu, "The producer schedule through MLX, two Q tiles, and the default
# search"). Re-measure elsewhere.
PICKS: dict[tuple[bool, int], str] = {
    (False, 128): "wg_m128n128s3_prod",
    (False, 64): "wg_m128n128s3_prod",
    (True, 128): "wg_m128n128s3_prod",
    (True, 64): "wg_m128n128s3_prod",
}

_CACHE: dict[str, MlxAttention] = {}
_VARIANTS: dict[str, dict[str, Any]] = {}


def _named_variants() -> dict[str, dict[str, Any]]:
    if not _VARIANTS:
        _VARIANTS.update(family.load_variants())
    return _VARIANTS


def attention(q: mx.array, k: mx.array, v: mx.array, causal: bool = False,
              knobs: dict[str, Any] | None = None) -> mx.array:
    """Attention forward, scale 1/sqrt(D): `knobs`, else the measured pick for (causal, D)."""
    if knobs is None:
        pick = PICKS.get((bool(causal), q.shape[-1] if q.ndim == 4 else 0), PICKS[(bool(causal), 128)])
        knobs = _named_variants()[pick]
    key = repr(sorted(knobs.items()))
    impl = _CACHE.get(key)
    if impl is None:
        impl = _CACHE[key] = MlxAttention(knobs)
    return impl(q, k, v, causal)
