"""mlx-lm's Mamba with its per-token scan loop replaced by ours.

mlx-lm's `MambaBlock._process_sequence` runs `ssm_step` once per token (about ten MLX ops per
token and layer). `KsMambaBlock` subclasses it and replaces only that method: the projections,
the convolution and the cache layout are mlx-lm's, and one scan call covers the whole sequence.
The scan is chosen when the model is built (`choose_scan`):

- on a CUDA device, the selective-scan mlx family's kernels (tasks/selective-scan/templates-mlx,
  rendered with `knobs` or a named variant) or a candidate module (`--kernel FILE`):
  `KernelScan`; with `variant="auto"` several settings, each call going to the one timed
  fastest for its length: `TunedScan`;
- anywhere else (MLX on CPU, Metal), `MlxOpsScan`: the same chunked scan written with MLX ops,
  which is what the CPU tests run.

`patched_copy(..., kernels, decode=...)` also replaces the ops around the scan with
model_kernels.py's kernels: the convolution, and for a single token either the conv and step
kernels beside MLX's matmuls (decode="conv"), the whole block in four launches ("fused"), in
one launch with a grid barrier ("layer"), or every block of the model in one launch ("model":
the weights stacked along a layer axis once, `model_decode`). `layer_forward` is one residual
block either way.

The SSM state in the cache is float32 (mlx-lm keeps it in the activation dtype); A, D and the
dt bias enter the scan in float32. `mamba_module()` imports `mlx_lm.models.mamba` without
running `mlx_lm/__init__.py`, which would import transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from steady_pick import ROUNDS, pick_steady, rotations

HERE = Path(__file__).resolve().parent

# mamba-370m (state-spaces/mamba-370m; the HF config of mamba-370m-hf).
MAMBA_370M = dict(model_type="mamba", vocab_size=50280, hidden_size=1024, intermediate_size=2048,
                  state_size=16, num_hidden_layers=48, conv_kernel=4, use_bias=False,
                  use_conv_bias=True, time_step_rank=64, tie_word_embeddings=True)
# A model small enough for CPU tests that keeps every code path (softplus, z gate, conv cache).
TINY = dict(MAMBA_370M, vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, time_step_rank=4)

# The family setting used when no kernel is given (names in variants.toml): the staged walk,
# the fastest scan in both layouts at every length from 512 on (docs/results/mamba-gpu).
DEFAULT_VARIANT = "staged_l16_t256"
# What `variant="auto"` chooses among, per sequence length, by timing them on the machine
# (TunedScan), in order of preference (a later one is picked only when it is clearly faster):
# the two staged walks, then the channel-tiled scans that came within reach of them through MLX
# (docs/results/mamba-gpu). The chunked scans are left out: in mlx-lm's channel-last layout
# they take three to seven times as long. MLX compiles its kernels without launch bounds, so a
# 512-thread block launches only where the compiler stays within 128 registers a thread:
# tiled_c16_t512 does at N = 16 (96-128 compiled that way), the tree fold with loads ahead does
# not (136-152), so its 256-thread setting is the one tried.
AUTO_VARIANTS = ("staged_l16_t256", "staged_l8_t128", "tiled_c16_t512", "tiled_c16_t256_tree_pf")


def mamba_module():
    """mlx_lm.models.mamba, imported without executing mlx_lm/__init__.py (which pulls in
    transformers through mlx_lm.generate)."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mlx-lm is not installed (pip install mlx-lm)")
        pkg = types.ModuleType("mlx_lm")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["mlx_lm"] = pkg
    return importlib.import_module("mlx_lm.models.mamba")


def _silu(x):
    return x * mx.sigmoid(x)


# --------------------------------------------------------------------------------------------
# Scans: (x, dt, A, B, C, D, z, dt_bias, h0) -> (y, h_last)
#   x, dt (before bias and softplus), z: [batch, T, dim] (channel-last, as mlx-lm has them);
#   B, C: [batch, T, N]; A: [dim, N] float32; D, dt_bias: [dim]; h0: [batch, dim, N] or None.
#   y = (sum_n h C + D x) * silu(z) in x's dtype; h_last float32.


class MlxOpsScan:
    """The chunked scan with MLX ops (float32): within each chunk of `chunk` steps the pairs
    (exp(dt A), dt B x) are combined by a log-depth (Hillis-Steele) scan, vectorised over all
    chunks at once; the state is then carried from chunk to chunk, as the GPU kernel does."""

    name = "mlx-ops"

    def __init__(self, chunk: int = 64):
        self.chunk = chunk

    def __call__(self, x, dt, A, B, C, D, z, dt_bias, h0=None):
        f = mx.float32
        batch, T, dim = x.shape
        N = A.shape[1]
        u = x.astype(f)
        dt = nn.softplus(dt.astype(f) + dt_bias.astype(f))
        chunk = min(self.chunk, T)
        n_chunks = -(-T // chunk)
        pad = n_chunks * chunk - T
        Bf, Cf = B.astype(f), C.astype(f)
        if pad:
            # Padded steps have dt = 0: the identity pair (1, 0).
            dt = mx.pad(dt, [(0, 0), (0, pad), (0, 0)])
            u = mx.pad(u, [(0, 0), (0, pad), (0, 0)])
            Bf = mx.pad(Bf, [(0, 0), (0, pad), (0, 0)])
            Cf = mx.pad(Cf, [(0, 0), (0, pad), (0, 0)])
        shape = (batch, n_chunks, chunk)
        dt_c = dt.reshape(*shape, dim)
        a = mx.exp(dt_c[..., None] * A.astype(f))                                  # [b, c, t, d, n]
        b = (dt_c * u.reshape(*shape, dim))[..., None] * Bf.reshape(*shape, 1, N)
        s = 1
        while s < chunk:
            widths = [(0, 0), (0, 0), (s, 0), (0, 0), (0, 0)]
            b = a * mx.pad(b[:, :, :-s], widths) + b
            a = a * mx.pad(a[:, :, :-s], widths, constant_values=1.0)
            s *= 2
        h = mx.zeros((batch, dim, N), dtype=f) if h0 is None else h0.astype(f)
        carries = []
        for c in range(n_chunks):
            carries.append(h)
            h = a[:, c, -1] * h + b[:, c, -1]
        states = a * mx.stack(carries, axis=1)[:, :, None] + b                 # [b, c, t, d, n]
        y = (states * Cf.reshape(*shape, 1, N)).sum(-1).reshape(batch, n_chunks * chunk, dim)
        y = y[:, :T] + D.astype(f) * x.astype(f)
        y = y * _silu(z.astype(f))
        return y.astype(x.dtype), h


def load_module(path: Path, name: str | None = None):
    """Imports a kernel module (a rendered family module or a search candidate) from a file."""
    name = name or f"ksm_kernel_{abs(hash(str(path))):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render_client():
    """gpu/ksearch_render.py, the client of `ksearch tasks --render`: one level up in a checkout,
    beside this file in the copy `ksearch bench mamba` extracts (which sets KSEARCH_BIN to
    itself, so the renders come from the running ksearch)."""
    for d in (HERE, HERE.parent):
        if (d / "ksearch_render.py").is_file() and str(d) not in sys.path:
            sys.path.insert(0, str(d))
    import ksearch_render

    return ksearch_render


def render_module(knobs: dict[str, Any] | None = None, variant: str | None = None):
    """The selective-scan mlx family rendered by ksearch with `knobs` (or a named variant of
    variants.toml), imported, and the complete setting."""
    fam = render_client().Family("selective-scan", "mlx")
    if knobs is None:
        knobs = fam.variants(HERE / "variants.toml")[variant or DEFAULT_VARIANT]
    reply = fam.ask({"knobs": knobs})
    tmp = Path(tempfile.mkdtemp(prefix="ksm-mlx-")) / "scan_mlx.py"
    tmp.write_text(reply["source"])
    return load_module(tmp), reply["knobs"]


class KernelScan:
    """A kernel module with the state API of the mlx family (`selective_scan_state`, and
    `decode_step` for single tokens). `channel_last=False` hands the kernels the task's layout
    ([batch, dim, T]) through transposes instead."""

    def __init__(self, module, channel_last: bool = True, name: str = "kernel"):
        self.module = module
        self.channel_last = channel_last
        self.name = name
        self.decode = getattr(module, "decode_step", None)

    def __call__(self, x, dt, A, B, C, D, z, dt_bias, h0=None):
        batch, T, dim = x.shape
        N = A.shape[1]
        if T == 1 and self.decode is not None and N <= 32 and N & (N - 1) == 0:
            if h0 is None:
                h0 = mx.zeros((batch, dim, N), dtype=mx.float32)
            y, h = self.decode(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, z[:, 0], dt_bias, h0)
            return y[:, None], h
        if self.channel_last:
            return self.module.selective_scan_state(x, dt, A, B, C, D, z, dt_bias, h0,
                                                    channel_last=True)
        t = lambda v: mx.swapaxes(v, 1, 2)
        y, h = self.module.selective_scan_state(t(x), t(dt), A, t(B), t(C), D, t(z), dt_bias, h0,
                                                channel_last=False)
        return t(y), h


class TaskEntryScan:
    """A candidate that only has the task's entry point (`selective_scan`, [batch, dim, L], state
    starting at zero). The kernel computes y from a zero state; the effect of a non-zero h0 on y
    and the final state follow in closed form with MLX ops: with cs_t = sum_{s<=t} dt_s A,
    h_t = exp(cs_t) h0 + (the kernel's zero-state h_t), and every exp(cs_t - cs_s) <= 1."""

    def __init__(self, module, name: str = "candidate"):
        self.entry = module.selective_scan
        self.name = name

    def __call__(self, x, dt, A, B, C, D, z, dt_bias, h0=None):
        f = mx.float32
        batch, T, dim = x.shape
        N = A.shape[1]
        t = lambda v: mx.swapaxes(v, 1, 2)
        y = self.entry(u=t(x), delta=t(dt), A=A.astype(f), B=t(B), C=t(C), D=D.astype(f),
                       z=t(z), delta_bias=dt_bias.astype(f), batch=batch, dim=dim, L=T, N=N,
                       has_z=1, softplus=1)
        y = t(y)
        dtf = nn.softplus(dt.astype(f) + dt_bias.astype(f))                       # [b, T, d]
        cs = mx.cumsum(dtf[..., None] * A.astype(f), axis=1)                      # [b, T, d, n]
        contrib = (dtf * x.astype(f))[..., None] * B.astype(f)[:, :, None, :]     # [b, T, d, n]
        h_last = (mx.exp(cs[:, -1:] - cs) * contrib).sum(1)
        if h0 is not None:
            h0 = h0.astype(f)
            h_last = h_last + mx.exp(cs[:, -1]) * h0
            extra = (mx.exp(cs) * h0[:, None] * C.astype(f)[:, :, None, :]).sum(-1)
            y = (y.astype(f) + extra * _silu(z.astype(f))).astype(x.dtype)
        return y, h_last


class TunedScan:
    """Several scans, each call going to the one picked for the nearest tuned length (a cache
    keyed by shape, filled by `tune` before any traced forward, since timing cannot happen
    inside one): the first listed whose median time is within PICK_MARGIN of the fastest
    (steady_pick). Untuned, every call goes to the first scan."""

    name = "tuned"

    def __init__(self, scans: dict[str, Any]):
        if not scans:
            raise ValueError("TunedScan needs at least one scan")
        self.scans = scans
        self.picks: dict[int, str] = {}

    def pick(self, T: int) -> str:
        if not self.picks:
            return next(iter(self.scans))
        nearest = min(self.picks, key=lambda k: (abs(math.log(k) - math.log(max(T, 1))), k))
        return self.picks[nearest]

    def tune(self, lengths, time_one: Callable[[Any, int], float],
             rounds: int = ROUNDS) -> dict[str, Any]:
        """Times every scan at every length (time_one(scan, T) -> seconds per call) in
        `rounds` interleaved passes, each starting at the next scan, and picks per length by
        the medians (pick_steady); returns the medians (microseconds), each scan's range, and
        the picks."""
        table: dict[str, dict[str, float]] = {}
        ranges: dict[str, dict[str, list[float]]] = {}
        errors: dict[str, str] = {}
        names = list(self.scans)
        for T in sorted(set(int(t) for t in lengths)):
            samples: dict[str, list[float]] = {}
            for order in rotations(names, rounds):
                for name in order:
                    if name in errors:
                        continue
                    try:
                        samples.setdefault(name, []).append(time_one(self.scans[name], T))
                    except Exception as e:  # a setting that does not build or run here drops out
                        errors[name] = f"{type(e).__name__}: {e}"[:1000]
                        samples.pop(name, None)
            if not samples:
                raise RuntimeError(f"no scan ran at T = {T}: {errors}")
            medians = {n: statistics.median(samples[n]) for n in names if n in samples}
            table[str(T)] = {n: t * 1e6 for n, t in medians.items()}
            ranges[str(T)] = {n: [min(v) * 1e6, max(v) * 1e6] for n, v in samples.items()}
            self.picks[T] = pick_steady(medians)
        report = {"us_per_call": table, "us_per_call_range": ranges, "rounds": max(1, rounds),
                  "picks": {str(k): v for k, v in self.picks.items()}}
        if errors:
            report["errors"] = errors
        return report

    def __call__(self, x, dt, A, B, C, D, z, dt_bias, h0=None):
        return self.scans[self.pick(x.shape[1])](x, dt, A, B, C, D, z, dt_bias, h0)


def choose_scan(kernel: Path | None = None, knobs: dict[str, Any] | None = None,
                variant: str | None = None, channel_last: bool = True, force_ops: bool = False):
    """(scan, description): our kernels on a CUDA device, the MLX-ops scan elsewhere."""
    if kernel is not None:
        module = load_module(Path(kernel))
        if hasattr(module, "selective_scan_state"):
            return KernelScan(module, channel_last, name=f"file:{kernel}"), {"source": str(kernel), "api": "state"}
        if hasattr(module, "selective_scan"):
            return TaskEntryScan(module, name=f"file:{kernel}"), {"source": str(kernel), "api": "task-entry"}
        raise ImportError(f"{kernel} defines neither selective_scan_state nor selective_scan")
    if force_ops or not mx.cuda.is_available():
        return MlxOpsScan(), {"source": "mlx-ops", "api": "ops"}
    if variant == "auto" and knobs is None:
        scans = {name: KernelScan(render_module(variant=name)[0], channel_last, name=name)
                 for name in AUTO_VARIANTS}
        return TunedScan(scans), {"source": "family", "api": "state",
                                  "variants": list(AUTO_VARIANTS)}
    module, full = render_module(knobs, variant)
    return KernelScan(module, channel_last, name="family"), {"source": "family", "knobs": full,
                                                              "api": "state"}


# --------------------------------------------------------------------------------------------
# The model


def make_block_class():
    mamba = mamba_module()

    class KsMambaBlock(mamba.MambaBlock):
        """mlx-lm's MambaBlock whose sequence loop is one scan call (the rest is theirs)."""

        ks_scan: Callable = None

        def _process_sequence(self, x, conv_cache, state_cache):
            xz = self.in_proj(x)
            x, z = xz.split(indices_or_sections=2, axis=-1)
            K = self.conv_kernel_size
            if conv_cache is not None:
                x_full = mx.concatenate([conv_cache, x], axis=1)
            else:
                x_full = mx.pad(x, [(0, 0), (K - 1, 0), (0, 0)])
            new_conv_cache = x_full[:, -(K - 1):, :]
            x = nn.silu(self.conv1d(x_full))
            A = -mx.exp(self.A_log.astype(mx.float32))
            delta, B, C = mx.split(self.x_proj(x), [self.time_step_rank,
                                                   self.time_step_rank + self.ssm_state_size],
                                   axis=-1)
            if self.use_bcdt_rms:
                eps = self.args.mixer_rms_eps
                delta = mx.fast.rms_norm(delta, weight=None, eps=eps)
                B = mx.fast.rms_norm(B, weight=None, eps=eps)
                C = mx.fast.rms_norm(C, weight=None, eps=eps)
            # dt_proj without its bias: the bias and softplus happen inside the scan (f32).
            dt = delta @ self.dt_proj.weight.T
            y, state = self.ks_scan(x, dt, A, B, C, self.D, z, self.dt_proj.bias, state_cache)
            return self.out_proj(y), (new_conv_cache, state)

        def ks_mix(self, h, residual, conv_cache, state_cache):
            """residual + the block's output for normed input h, and the new caches; with
            `ks_kernels` (model_kernels.py) the convolution is one kernel, a single token's
            dt projection and state update another, and out_proj adds the residual in its
            matmul. Without them: `_process_sequence` plus the residual."""
            kern = self.ks_kernels
            if kern is None or self.use_bcdt_rms:
                out, caches = self._process_sequence(h, conv_cache, state_cache)
                return residual + out, caches
            batch, steps, _ = h.shape
            dim, K = self.intermediate_size, self.conv_kernel_size
            xz = self.in_proj(h)
            if conv_cache is None:
                conv_cache = mx.zeros((batch, K - 1, dim), dtype=xz.dtype)
            conv_bias = self.conv1d.bias if "bias" in self.conv1d else mx.zeros((dim,), xz.dtype)
            xc, new_conv = kern.conv_silu(xz, conv_cache, self.conv1d.weight, conv_bias)
            dbc = self.x_proj(xc)
            A, D, dt_bias = self.ks_consts.arrays
            N = self.ssm_state_size
            if steps == 1 and N <= 32 and N & (N - 1) == 0:
                h0 = state_cache if state_cache is not None else mx.zeros((batch, dim, N), mx.float32)
                y, state = kern.ssm_step(xc[:, 0], dbc[:, 0], self.dt_proj.weight, dt_bias, A, D,
                                         xz[:, 0], h0)
                y = y[:, None]
            else:
                R = self.time_step_rank
                delta, B, C = mx.split(dbc, [R, R + N], axis=-1)
                dt = delta @ self.dt_proj.weight.T
                z = xz[..., dim:]
                y, state = self.ks_scan(xc, dt, A, B, C, self.D, z, self.dt_proj.bias,
                                        state_cache)
            if "bias" in self.out_proj or not _ADDMM_WORKS:
                return residual + self.out_proj(y), (new_conv, state)
            d_model = residual.shape[-1]
            out = mx.addmm(residual.reshape(-1, d_model), y.reshape(-1, dim),
                           self.out_proj.weight.T)
            return out.reshape(residual.shape), (new_conv, state)

    KsMambaBlock.ks_kernels = None
    KsMambaBlock.ks_consts = None
    KsMambaBlock.ks_decode = "conv"
    KsMambaBlock.ks_grid = None
    return KsMambaBlock


# How a single token goes through a block with our kernels (patched_copy's `decode`). "model"
# is a decode step of the whole model in one launch (model_decode, through the bench's
# forward); a single token that reaches a block on its own then takes the four-launch path.
DECODE_PATHS = ("model", "layer", "fused", "conv")


def _plain(mixer) -> bool:
    """Whether a block has the form the fused decode kernels implement: no projection biases,
    no B/C/dt norms, a power-of-two state size up to 32."""
    N = mixer.ssm_state_size
    return (not mixer.use_bcdt_rms and "bias" not in mixer.in_proj
            and "bias" not in mixer.out_proj and N <= 32 and N & (N - 1) == 0)


def layer_forward(layer, x, conv_cache, state_cache):
    """One residual block of our model: (x + block(norm(x)), (conv cache, state)). A single
    token goes through `model_kernels.fused_layer_decode` (one launch for the whole block) or
    `fused_decode` (four) when patched_copy chose that path and the block has its plain form
    (no projection biases, no B/C/dt norms); everything else through the mixer's ks_mix."""
    mixer = layer.mixer
    kern, N = mixer.ks_kernels, mixer.ssm_state_size
    if (x.shape[1] == 1 and mixer.ks_decode in ("model", "layer", "fused") and kern is not None
            and _plain(mixer)):
        batch = x.shape[0]
        dim, K = mixer.intermediate_size, mixer.conv_kernel_size
        if conv_cache is None:
            conv_cache = mx.zeros((batch, K - 1, dim), dtype=x.dtype)
        if state_cache is None:
            state_cache = mx.zeros((batch, dim, N), dtype=mx.float32)
        A, D, dt_bias = mixer.ks_consts.arrays
        conv_b = mixer.conv1d.bias if "bias" in mixer.conv1d else mx.zeros((dim,), x.dtype)
        args = (x[:, 0], layer.norm.weight, mixer.ks_consts.eps, mixer.in_proj.weight,
                conv_cache, mixer.conv1d.weight, conv_b, mixer.x_proj.weight,
                mixer.dt_proj.weight, dt_bias, A, D, mixer.out_proj.weight, state_cache)
        if mixer.ks_decode == "layer":
            g = mixer.ks_grid
            x_out, new_conv, h = kern.fused_layer_decode(*args, g.barrier, g.poison,
                                                         blocks=g.blocks)
        else:
            x_out, new_conv, h = kern.fused_decode(*args)
        return x_out[:, None], (new_conv, h)
    return mixer.ks_mix(layer.norm(x), x, conv_cache, state_cache)


# Whether mx.addmm runs on the default device; probed by patched_copy (outside any traced
# function), since a failure inside a compiled forward would only show when it first runs.
_ADDMM_WORKS = True


def _probe_addmm() -> bool:
    try:
        out = mx.addmm(mx.ones((2, 4)), mx.ones((2, 3)), mx.ones((3, 4)))
        mx.eval(out)
        return bool(mx.all(out == 4).item())
    except Exception:
        return False


def _float32_consts(mixer):
    f = mx.float32
    return (-mx.exp(mixer.A_log.astype(f)), mixer.D.astype(f), mixer.dt_proj.bias.astype(f))


class _Grid:
    """The one-kernel decode's grid-barrier state of one block (a plain holder, for the same
    reason as _Consts): its own barrier array, the model's poison flag, the grid size."""

    def __init__(self, barrier, poison, blocks):
        self.barrier = barrier
        self.poison = poison
        self.blocks = blocks


class GridBarrierTimeout(RuntimeError):
    """A grid-barrier wait of the one-kernel decode gave up: its blocks were not all resident."""


def check_grid(model) -> None:
    """Raises GridBarrierTimeout if any grid-barrier wait of `model`'s one-kernel decode (per
    block or whole model) has timed out since patched_copy built it (its results since then
    are garbage). One device synchronisation: call it after a check or a run, not per token.
    No-op for other paths."""
    grids = [l.mixer.ks_grid for l in model.backbone.layers
             if getattr(l.mixer, "ks_decode", None) == "layer" and l.mixer.ks_grid is not None]
    stack = getattr(model, "ks_stack", None)
    if stack is not None:
        grids.append(stack.grid)
    if not grids:
        return
    kern = model.backbone.layers[0].mixer.ks_kernels
    if kern.grid_failed(grids[0].poison):  # one poison flag per model, shared by its grids
        raise GridBarrierTimeout(
            f"a grid barrier of the one-kernel decode timed out: its {grids[0].blocks} blocks "
            "were not all resident on the GPU at once (fewer blocks, or another decode path)")


class _Stack:
    """The whole-model decode's arrays (a plain holder, for the same reason as _Consts): every
    block's weights and float32 constants stacked along a leading layer axis (norm_w, eps,
    w_in, conv_w, conv_b, w_x, w_dt, dt_bias, A, D, w_out: model_decode's order); its grid (_Grid: the launch
    site's barrier, the model's poison flag, the grid size); the kernels."""

    def __init__(self, arrays, grid, kernels):
        self.arrays = arrays
        self.grid = grid
        self.kernels = kernels


def _stack_blocks(model, kernels, grid) -> _Stack:
    """Stacks the blocks' decode weights once (a copy of them: about 13 MB a block for
    mamba-370m in f16), evaluated here so that a compiled forward sees constants."""
    mixers = [l.mixer for l in model.backbone.layers]
    if not all(_plain(m) for m in mixers):
        raise ValueError("the one-launch model decode needs every block in its plain form (no "
                         "projection biases, no B/C/dt norms, a power-of-two state size up to 32)")
    layers = model.backbone.layers

    def conv_b(m):
        dim = m.intermediate_size
        return m.conv1d.bias if "bias" in m.conv1d else mx.zeros((dim,), m.in_proj.weight.dtype)

    stack = lambda get: mx.stack([get(m) for m in mixers])
    arrays = [
        mx.stack([l.norm.weight for l in layers]),
        mx.concatenate([m.ks_consts.eps for m in mixers]),  # each block's is [1]
        stack(lambda m: m.in_proj.weight),
        stack(lambda m: m.conv1d.weight),
        stack(conv_b),
        stack(lambda m: m.x_proj.weight),
        stack(lambda m: m.dt_proj.weight),
        stack(lambda m: m.ks_consts.arrays[2]),  # dt bias
        stack(lambda m: m.ks_consts.arrays[0]),  # A
        stack(lambda m: m.ks_consts.arrays[1]),  # D
        stack(lambda m: m.out_proj.weight),
    ]
    mx.eval(arrays)
    return _Stack(tuple(arrays), grid, kernels)


def model_decode(model, x, conv_all, ssm_all):
    """One token through every block of `model` (patched_copy(..., decode="model")) in one
    launch: x [batch, DM] the embedded token, conv_all [NL, batch, K-1, dim] and ssm_all [NL,
    batch, dim, N] f32 the stacked caches -> (the residual stream after the last block
    [batch, DM], the new stacked caches)."""
    st = model.ks_stack
    norm_w, eps, w_in, conv_w, conv_b, w_x, w_dt, dt_bias, A, D, w_out = st.arrays
    return st.kernels.fused_model_decode(x, norm_w, eps, w_in, conv_all, conv_w, conv_b, w_x,
                                         w_dt, dt_bias, A, D, w_out, ssm_all, st.grid.barrier,
                                         st.grid.poison, blocks=st.grid.blocks)


class _Consts:
    """A plain holder (an mlx Module would register a tuple of arrays as parameters): the
    float32 (A, D, dt bias) and the block norm's eps as a float32 array."""

    def __init__(self, arrays, eps):
        self.arrays = arrays
        self.eps = eps


def build_stock(config: dict | None = None, weights: Path | None = None, seed: int = 0,
                dtype=mx.float16):
    """mlx-lm's Model: random weights (mlx-lm's initialisation, seeded) or a local directory
    with config.json and *.safetensors (a mamba-*-hf checkout)."""
    mamba = mamba_module()
    if weights is not None:
        weights = Path(weights)
        config = json.loads((weights / "config.json").read_text())
        args = mamba.ModelArgs.from_dict(config)
        model = mamba.Model(args)
        tensors = {}
        for f in sorted(weights.glob("*.safetensors")):
            tensors.update(mx.load(str(f)))
        if not tensors:
            raise FileNotFoundError(f"no *.safetensors in {weights}")
        tensors = model.sanitize(tensors)
        if args.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        model.load_weights(list(tensors.items()))
    else:
        args = mamba.ModelArgs.from_dict(dict(config or MAMBA_370M))
        mx.random.seed(seed)
        model = mamba.Model(args)
        init_dt_bias(model)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def init_dt_bias(model, dt_min: float = 1e-3, dt_max: float = 0.1):
    """Mamba's initialisation of the dt bias (mamba_ssm and mamba.py do this; mlx-lm's Linear
    default does not): softplus(bias) log-uniform in [dt_min, dt_max], so random weights give
    states that remember tens to thousands of steps, as trained models have, instead of
    forgetting within a step or two (softplus(~0) = 0.7 with A = -1..-16)."""
    for layer in model.backbone.layers:
        dt_proj = layer.mixer.dt_proj
        dim = dt_proj.bias.shape[0]
        dt = mx.exp(mx.random.uniform(math.log(dt_min), math.log(dt_max), (dim,)))
        dt_proj.bias = dt + mx.log(-mx.expm1(-dt))  # the inverse of softplus


def patched_copy(stock, scan, kernels=None, decode: str | None = None, *, fused_decode=False,
                 blocks: int | None = None):
    """A second mlx-lm Model sharing `stock`'s weight arrays, whose blocks use `scan` and, when
    given, the model kernels (`model_kernels` or a stand-in with its functions). `decode` picks
    how a single token goes through a block with kernels: "conv" (the default: the conv and
    step kernels beside MLX's matmuls), "fused" (four launches per block; `fused_decode=True`
    is the older spelling), "layer" (one launch per block over a grid of `blocks` blocks,
    default one per SM; check_grid(model) then tells whether its barrier ever timed out),
    "model" (one launch per token for every block, through `model_decode` with the caches
    stacked: the bench's forward does that; the blocks' stacked weights are `model.ks_stack`,
    and a token given to a block alone takes the "fused" path)."""
    global _ADDMM_WORKS
    if isinstance(decode, bool):  # the fourth positional argument used to be fused_decode
        decode, fused_decode = None, decode
    if decode is None:
        decode = "fused" if fused_decode else "conv"
    if decode not in DECODE_PATHS:
        raise ValueError(f"decode must be one of {DECODE_PATHS}, got {decode!r}")
    mamba = mamba_module()
    block_cls = make_block_class()
    model = mamba.Model(stock.args)
    model.update(stock.parameters())
    poison = None
    if kernels is not None:
        _ADDMM_WORKS = _probe_addmm()
        if decode in ("layer", "model"):
            blocks = int(blocks or kernels.sm_count())
            poison = kernels.grid_state()
    # A block's own single-token path; "model" decodes through model_decode, and a token given
    # to a block alone takes the four-launch path.
    block_decode = "conv" if kernels is None else "fused" if decode == "model" else decode
    for layer in model.backbone.layers:
        layer.mixer.__class__ = block_cls
        layer.mixer.ks_scan = scan
        layer.mixer.ks_kernels = kernels
        layer.mixer.ks_decode = block_decode
        if poison is not None and decode == "layer":
            # One barrier per layer (see fused_layer_decode for why), one poison flag in all.
            layer.mixer.ks_grid = _Grid(kernels.grid_state(), poison, blocks)
        if kernels is not None:
            # Computed here, outside any traced function, so that a compiled forward sees
            # constants rather than ops; the weights do not change while a model generates.
            consts = _float32_consts(layer.mixer)
            eps = mx.array([float(getattr(layer.norm, "eps", 1e-5))], dtype=mx.float32)
            mx.eval(consts, eps)
            layer.mixer.ks_consts = _Consts(consts, eps)
    model.ks_stack = None
    if kernels is not None and decode == "model":
        model.ks_stack = _stack_blocks(model, kernels, _Grid(kernels.grid_state(), poison, blocks))
    return model


def model_kernels():
    """gpu/mamba/model_kernels.py, imported (it builds its kernels with mx.fast.cuda_kernel, so
    only where MLX has a CUDA device)."""
    return load_module(HERE / "model_kernels.py", "ksm_model_kernels")


def logits_last(model, tokens, cache):
    """The forward pass with the head applied to the last position only (what generation
    needs; the other positions' logits would be a [T, vocab] product nobody reads)."""
    h = model.backbone(tokens, cache)
    return model.backbone.embeddings.as_linear(h[:, -1:])[:, 0]


def prefill(model, tokens, cache, step: int = 2048):
    """Processes the prompt in pieces of `step` tokens, evaluating the cache after each, as
    mlx_lm.generate does (prefill_step_size); returns the last position's logits."""
    T = tokens.shape[1]
    start = 0
    while T - start > step:
        model.backbone(tokens[:, start:start + step], cache)
        mx.eval([c.state[0] for c in cache])
        start += step
    logits = logits_last(model, tokens[:, start:], cache)
    mx.eval(logits, [c.state[0] for c in cache])
    return logits


def cache_arrays(cache):
    return [c[0] for c in cache], [c[1] for c in cache]
