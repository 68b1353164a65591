"""The Mamba benchmark behind `ksearch bench mamba`: prefill and decode tokens/s of mamba-370m
for three implementations on the same weights,

- ksearch: mlx-lm's model with its per-token scan loop replaced by our scan (mamba_model.py);
  the whole forward (any number of tokens, from a cache) is one mx.compile'd function;
- mlx-lm: the stock model (its Python loop over tokens), driven as mlx_lm.generate drives it
  (prompt in pieces of 2048 tokens, the cache evaluated after each);
- mambapy: alxndrTL's mamba.py (`mambapy.mamba`, PyTorch; parallel scan for prefill, its cached
  `step` for decode), with our embedding and tied head around it.

Before timing anything it checks that our logits equal stock mlx-lm's on the same weights and
tokens (a prompt, then single-token steps through the cache) within the f16 tolerance, and
refuses to report (exit code 3) otherwise. Prefill tok/s = L / (time to the last position's
logits, cache included); decode tok/s = tokens / time of greedy single-token steps after a
warm-up. With --kernel-only it also times the scan alone per layer against its memory floor.

Writes one JSON object (schema "ksearch-bench-mamba/1") to --out or stdout; progress goes to
stderr. `ksearch bench mamba` renders it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MLX_ENABLE_TF32", "0")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import mamba_model as mm  # noqa: E402
from steady_pick import ROUNDS, pick_steady, rotations  # noqa: E402

SCHEMA = "ksearch-bench-mamba/1"
IMPLS = ("ksearch", "mlx-lm", "mambapy")
# Largest |ours - stock| over max|stock| accepted for the logits, per compared position. Stock
# mlx-lm runs the scan and its state in f16; over 48 layers its logits drift from a float32 run
# by 3e-3..7e-3 of their largest magnitude (random weights, measured on CPU), and ours by about
# the same, so twice the sum of those is the f16 tolerance of the whole model.
CHECK_TOL = 2e-2
# The same for every layer's SSM state after each call. Stock rounds its state to f16 at every
# step, so its error grows with the number of steps (1.3e-2 of max|state| after 72 tokens of
# mamba-370m, random weights, on CPU); a state carried wrongly is off by its whole size.
CHECK_STATE_TOL = 5e-2
# Fraction of positions whose argmax must agree.
CHECK_ARGMAX = 0.9
# Bytes the fused scan must move per token and layer at d_inner 2048, N 16, f16: u, delta, z, y
# (2 bytes x 2048 each) and B, C (2 bytes x 16 each).
TARGETS = {"prefill_512": 50_000, "prefill_4096": 100_000, "decode": 300}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def sync():
    mx.synchronize()


def scan_bytes_per_token(d_inner: int, n: int, elem: int = 2) -> int:
    return elem * (4 * d_inner + 2 * n)


# --------------------------------------------------------------------------------------------
# Check


def check_logits(stock, ours_forward, vocab: int, prompt: int, steps: int, seed: int) -> dict:
    """Stock mlx-lm through its cache against our compiled forward through ours: every prompt
    position's logits, then `steps` single-token steps fed the same tokens; after each call also
    every layer's SSM state (with random weights the D x skip dominates the logits, so a state
    carried wrongly shows in the states first)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(1, prompt + steps))
    worst, worst_state, agree, count, scale = 0.0, 0.0, 0, 0, 0.0
    cache = stock.make_cache()
    state = None
    for k in range(steps + 1):
        tok = mx.array(tokens[:, :prompt] if k == 0 else tokens[:, prompt + k - 1:prompt + k])
        ref = stock(tok, cache=cache).astype(mx.float32)
        got, state = ours_forward(tok, state, all_positions=True)
        got = got.astype(mx.float32)
        mx.eval(ref, got, state)
        m = float(mx.abs(ref).max())
        diff = mx.abs(got - ref).max(axis=-1) / m
        # NaN compares false with everything, so max() would drop it: count it as infinite.
        d = float(diff.max())
        worst = max(worst, d if math.isfinite(d) else math.inf)
        scale = max(scale, m)
        agree += int((mx.argmax(got, -1) == mx.argmax(ref, -1)).sum())
        count += got.shape[1]
        for c, h in zip(cache, state[1]):
            want = c[1].astype(mx.float32)
            d = float(mx.abs(h - want).max() / mx.abs(want).max())
            worst_state = max(worst_state, d if math.isfinite(d) else math.inf)
    return {"passed": worst <= CHECK_TOL and worst_state <= CHECK_STATE_TOL
            and agree >= CHECK_ARGMAX * count,
            "prompt_tokens": prompt, "decode_steps": steps, "positions": count,
            "max_rel_diff": worst, "max_state_rel_diff": worst_state, "tolerance": CHECK_TOL,
            "state_tolerance": CHECK_STATE_TOL,
            "argmax_agreement": agree / count, "argmax_required": CHECK_ARGMAX,
            "max_abs_logit": scale}


# --------------------------------------------------------------------------------------------
# ksearch: our model, one compiled forward


class OursForward:
    """forward(tokens, state) -> (logits, state) over our patched model; state is (conv
    states, ssm states) per layer or None. The function is mx.compile'd (one trace per token
    count) unless compile is off or tracing fails, in which case it runs eagerly.

    With the whole-model decode (patched_copy(..., decode="model")) a single token goes through
    every block in one launch (mm.model_decode) and the state it returns is the two stacked
    arrays [layers, ...], which index and iterate per layer like the lists; the first such
    step stacks a list state once, a prompt after it splits a stacked one into views."""

    def __init__(self, model, compile: bool = True):
        self.model = model
        self.args = model.args
        self._fns = {}
        self._seen = set()
        self.compile = compile
        self.compile_error = None

    def _fn(self, all_positions: bool):
        key = all_positions
        if key in self._fns:
            return self._fns[key]
        model = self.model
        layers = model.backbone.layers

        def forward(tokens, conv_states, ssm_states):
            x = model.backbone.embeddings(tokens)
            new_conv, new_ssm = [], []
            for layer, conv, ssm in zip(layers, conv_states, ssm_states):
                x, (conv2, ssm2) = mm.layer_forward(layer, x, conv, ssm)
                new_conv.append(conv2)
                new_ssm.append(ssm2)
            if not all_positions:
                x = x[:, -1:]
            x = model.backbone.norm_f(x)
            return model.backbone.embeddings.as_linear(x), new_conv, new_ssm

        fn = mx.compile(forward) if self.compile else forward
        self._fns[key] = fn
        return fn

    def _decode_fn(self):
        if "model" in self._fns:
            return self._fns["model"]
        model = self.model

        def decode(tokens, conv_all, ssm_all):
            x = model.backbone.embeddings(tokens)[:, 0]
            x, conv2, ssm2 = mm.model_decode(model, x, conv_all, ssm_all)
            x = model.backbone.norm_f(x[:, None])
            return model.backbone.embeddings.as_linear(x), conv2, ssm2

        fn = mx.compile(decode) if self.compile else decode
        self._fns["model"] = fn
        return fn

    def initial_state(self, batch: int = 1):
        a = self.args
        dtype = self.model.backbone.embeddings.weight.dtype
        # One zero-filled array per kind, a view of it per layer: a fresh prompt's states
        # then cost two fills instead of one per layer and kind (96 primitives for
        # mamba-370m, at MLX's ~11 us each 1 ms of a 10 ms prefill). Nothing writes a state
        # in place: every call returns new ones.
        n = a.num_hidden_layers
        conv_all = mx.zeros((n, batch, a.conv_kernel - 1, a.intermediate_size), dtype=dtype)
        ssm_all = mx.zeros((n, batch, a.intermediate_size, a.state_size), dtype=mx.float32)
        return [conv_all[i] for i in range(n)], [ssm_all[i] for i in range(n)]

    def __call__(self, tokens, state=None, all_positions=False):
        conv, ssm = state if state is not None else self.initial_state(tokens.shape[0])
        whole = tokens.shape[1] == 1 and getattr(self.model, "ks_stack", None) is not None
        if whole and isinstance(conv, list):
            conv, ssm = mx.stack(conv), mx.stack(ssm)
        elif not whole and not isinstance(conv, list):
            conv, ssm = ([conv[i] for i in range(conv.shape[0])],
                         [ssm[i] for i in range(ssm.shape[0])])
        key = (all_positions, tokens.shape)
        try:
            fn = self._decode_fn() if whole else self._fn(all_positions)
            logits, conv2, ssm2 = fn(tokens, conv, ssm)
            if self.compile and key not in self._seen:
                # A compiled graph can also fail when it first runs: try each shape once here.
                mx.eval(logits, conv2, ssm2)
                self._seen.add(key)
        except Exception as e:  # mx.compile could not trace or run it: say so, run eagerly
            if not self.compile:
                raise
            self.compile_error = f"{type(e).__name__}: {e}"
            log(f"mx.compile failed ({self.compile_error}); running uncompiled")
            self.compile = False
            self._fns.clear()
            fn = self._decode_fn() if whole else self._fn(all_positions)
            logits, conv2, ssm2 = fn(tokens, conv, ssm)
        if not all_positions:
            logits = logits[:, -1]
        return logits, (conv2, ssm2)


# --------------------------------------------------------------------------------------------
# Timing (MLX)


def time_prefill_ours(fwd: OursForward, L: int, vocab: int, reps: int, step: int, seed: int):
    rng = np.random.default_rng(seed + L)
    tokens = mx.array(rng.integers(0, vocab, size=(1, L)))
    mx.eval(tokens)

    def once():
        state = None
        logits = None
        for s in range(0, L, step):
            logits, state = fwd(tokens[:, s:s + step], state)
            if s + step < L:
                mx.eval(state)
        mx.eval(logits, state)
        return logits

    once()  # warm-up: kernel JIT, compile traces, CUDA graphs
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        once()
        sync()
        times.append(time.perf_counter() - t0)
    return L / statistics.median(times), times


def time_prefill_stock(model, L: int, vocab: int, step: int, seed: int):
    rng = np.random.default_rng(seed + L)
    tokens = mx.array(rng.integers(0, vocab, size=(1, L)))
    mx.eval(tokens)
    sync()
    t0 = time.perf_counter()
    cache = model.make_cache()
    mm.prefill(model, tokens, cache, step)
    sync()
    dt = time.perf_counter() - t0
    return L / dt, [dt]


def mlx_decode(step, tok, state, n: int, pipelined: bool):
    """Times n greedy steps of `step(tok, state) -> (next token, state)` (lazy MLX arrays);
    returns (tok/s, seconds per step, the tokens). sync: each step is evaluated before the next
    is built. pipelined: as mlx_lm.generate decodes, step t+1 is built and queued
    (mx.async_eval) before step t's token is read, so building and dispatching one step
    overlaps the GPU running the previous one."""
    steps: list[float] = []
    tokens: list[int] = []
    sync()
    t0 = time.perf_counter()
    if not pipelined:
        for _ in range(n):
            tok, state = step(tok, state)
            mx.eval(tok, state)  # the next token needs this one
            tokens.append(int(tok[0, 0].item()))
            t1 = time.perf_counter()
            steps.append(t1 - t0)
            t0 = t1
    else:
        nxt, state = step(tok, state)
        mx.async_eval(nxt, state)
        for i in range(n):
            cur = nxt
            if i + 1 < n:
                nxt, state = step(cur, state)
                mx.async_eval(nxt, state)
            tokens.append(int(cur[0, 0].item()))  # waits for this token only
            t1 = time.perf_counter()
            steps.append(t1 - t0)
            t0 = t1
    sync()
    return n / sum(steps), steps, tokens


def time_decode_ours(fwd: OursForward, vocab: int, prompt: int, warmup: int, n: int, seed: int,
                     pipelined: bool = True):
    rng = np.random.default_rng(seed)
    logits, state = fwd(mx.array(rng.integers(0, vocab, size=(1, prompt))))
    tok = mx.argmax(logits, axis=-1)[:, None]
    mx.eval(tok, state)

    def step(tok, state):
        logits, state = fwd(tok, state)
        return mx.argmax(logits, axis=-1)[:, None], state

    for _ in range(warmup):
        tok, state = step(tok, state)
        mx.eval(tok, state)
    return mlx_decode(step, tok, state, n, pipelined)


def time_decode_stock(model, vocab: int, prompt: int, warmup: int, n: int, seed: int,
                      pipelined: bool = True):
    rng = np.random.default_rng(seed)
    cache = model.make_cache()
    logits = mm.prefill(model, mx.array(rng.integers(0, vocab, size=(1, prompt))), cache)
    tok = mx.argmax(logits, axis=-1)[:, None]
    mx.eval(tok)

    def step(tok, _state):
        # The cache is updated in place; its arrays are what has to be evaluated.
        logits = mm.logits_last(model, tok, cache)
        return mx.argmax(logits, axis=-1)[:, None], [c.state for c in cache]

    for _ in range(warmup):
        tok, states = step(tok, None)
        mx.eval(tok, states)
    return mlx_decode(step, tok, None, n, pipelined)


# --------------------------------------------------------------------------------------------
# mambapy (PyTorch)


def mambapy_model(stock, device: str):
    """mambapy.mamba.Mamba with stock's weights, plus the embedding, final norm and tied head
    (mambapy.lm is not used: its generate re-runs the whole sequence per token)."""
    import torch
    from mambapy.mamba import Mamba, MambaConfig, RMSNorm

    a = stock.args
    cfg = MambaConfig(d_model=a.hidden_size, n_layers=a.num_hidden_layers,
                      dt_rank=int(a.time_step_rank), d_state=a.state_size,
                      expand_factor=a.intermediate_size // a.hidden_size, d_conv=a.conv_kernel,
                      bias=a.use_bias, conv_bias=a.use_conv_bias, pscan=True)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(a.vocab_size, a.hidden_size)
            self.mamba = Mamba(cfg)
            self.norm_f = RMSNorm(a.hidden_size, 1e-5)

        def head(self, x):
            return torch.nn.functional.linear(self.norm_f(x), self.embedding.weight)

        def forward(self, tokens):
            return self.head(self.mamba(self.embedding(tokens))[:, -1])

        def step(self, token, caches):
            x, caches = self.mamba.step(self.embedding(token), caches)
            return self.head(x), caches

    lm = LM()
    t = lambda v: torch.from_numpy(np.array(v.astype(mx.float32)))
    bb = stock.backbone
    state = {"embedding.weight": t(bb.embeddings.weight), "norm_f.weight": t(bb.norm_f.weight)}
    for i, layer in enumerate(bb.layers):
        p, mix = f"mamba.layers.{i}.", layer.mixer
        state[p + "norm.weight"] = t(layer.norm.weight)
        for name in ("in_proj", "x_proj", "out_proj", "dt_proj"):
            state[p + f"mixer.{name}.weight"] = t(getattr(mix, name).weight)
        state[p + "mixer.dt_proj.bias"] = t(mix.dt_proj.bias)
        # MLX keeps a depthwise conv weight as [out, K, 1]; PyTorch as [out, 1, K].
        state[p + "mixer.conv1d.weight"] = t(mix.conv1d.weight).permute(0, 2, 1).contiguous()
        if a.use_conv_bias:
            state[p + "mixer.conv1d.bias"] = t(mix.conv1d.bias)
        state[p + "mixer.A_log"] = t(mix.A_log)
        state[p + "mixer.D"] = t(mix.D)
    missing, unexpected = lm.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"mambapy weight mapping: missing {missing}, unexpected {unexpected}")
    return lm.to(device).eval()


def _torch_ctx(device: str):
    import contextlib

    import torch

    if device == "cuda":
        # Weights stay float32 and matrix products run in f16, as mambapy's README suggests
        # for mixed precision; its scan promotes to float32 by itself.
        return torch.autocast(device_type="cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _tsync(device: str):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_prefill_mambapy(lm, device: str, L: int, vocab: int, reps: int, seed: int):
    import torch

    rng = np.random.default_rng(seed + L)
    tokens = torch.from_numpy(rng.integers(0, vocab, size=(1, L))).to(device)
    times = []
    with torch.no_grad(), _torch_ctx(device):
        lm(tokens[:, :min(L, 64)])
        for _ in range(reps):
            _tsync(device)
            t0 = time.perf_counter()
            lm(tokens)
            _tsync(device)
            times.append(time.perf_counter() - t0)
    return L / statistics.median(times), times


def time_decode_mambapy(lm, device: str, vocab: int, prompt: int, warmup: int, n: int,
                        seed: int):
    import torch

    a = lm.mamba.config
    rng = np.random.default_rng(seed)
    caches = [(None, torch.zeros(1, a.d_inner, a.d_conv - 1, device=device))
              for _ in range(a.n_layers)]
    with torch.no_grad(), _torch_ctx(device):
        logits = None
        for t in rng.integers(0, vocab, size=prompt):
            logits, caches = lm.step(torch.tensor([int(t)], device=device), caches)
        tok = logits.argmax(-1)
        for _ in range(warmup):
            logits, caches = lm.step(tok, caches)
            tok = logits.argmax(-1)
        _tsync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            logits, caches = lm.step(tok, caches)
            tok = logits.argmax(-1)  # stays on the device: PyTorch queues the next step
        _tsync(device)
        total = time.perf_counter() - t0
    return n / total, total


# --------------------------------------------------------------------------------------------
# The scan alone


def launch_overhead(ops: int = 200, reps: int = 5) -> dict[str, float]:
    """Microseconds per MLX primitive when the work is negligible: a chain of `ops` dependent
    [1, 64] x [64, 64] matmuls (which mx.compile cannot fuse), compiled and eager, median of
    `reps` evaluations. Decode of a 48-layer model is bound by this times the primitives per
    token once the GPU work per token is small."""
    w = mx.random.normal((64, 64)) * 0.1
    x0 = mx.random.normal((1, 64))
    mx.eval(w, x0)

    def chain(x):
        for _ in range(ops):
            x = x @ w
        return x

    out = {}
    for name, fn in (("compiled", mx.compile(chain)), ("eager", chain)):
        mx.eval(fn(x0))
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            mx.eval(fn(x0))
            sync()
            times.append(time.perf_counter() - t0)
        out[f"{name}_us_per_op"] = statistics.median(times) / ops * 1e6
    return out


# Seconds of dense device work before a timing that follows host-side work or tiny ops.
WARM_S = 0.3


def warm_device(seconds: float = WARM_S, x=None, mib: int = 256) -> None:
    """Elementwise passes over `x` (else a fresh `mib` MiB) until `seconds` have passed, so that
    a timing that follows host-side work or tiny ops (the model's construction, the
    per-primitive probe) does not start on a GPU that sat idle. In one bench run without it
    the bandwidth pass measured half of what the runs before and after it measured, and the
    scans timed right after it were slow as well, then recovered (docs/results/mamba-gpu, "The
    whole-model decode on a device"); clocks still low after idling would explain it, which
    was not confirmed."""
    if x is None:
        x = mx.zeros(((mib << 20) // 2,), dtype=mx.float16)
        mx.eval(x)
    sync()
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        mx.eval(x + 1)
        sync()


def measure_bandwidth(warm_s: float = WARM_S, passes: int = 10, mib: int = 512) -> float:
    """GB/s of an elementwise pass over `mib` MiB (read + write), the best of `passes` after
    `warm_s` seconds of warm-up on the same array (warm_device)."""
    n = (mib << 20) // 2
    x = mx.random.normal((n,)).astype(mx.float16)
    mx.eval(x)
    warm_device(warm_s, x)
    best = math.inf
    for _ in range(passes):
        sync()
        t0 = time.perf_counter()
        mx.eval(x + 1)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n * 2 / best / 1e9


def time_scan(scan, d_inner: int, n: int, L: int, reps: int = 20) -> float:
    """Seconds per call of the scan on random inputs of shape [1, L, d_inner] (channel-last,
    as the model calls it) from a zero state: `reps` calls chained in one evaluation (per-eval
    overhead amortised), after the same untimed: that one compiles the kernel and has MLX's
    allocator hold `reps` output buffers of this size, so the timed one does not pay for
    first-touching fresh memory (the suspected cause of an L=4096 time 8.6x the L=2048 one
    when only one call warmed up)."""
    rng = mx.random
    shp = (1, L, d_inner)
    x, z = rng.normal(shp).astype(mx.float16), rng.normal(shp).astype(mx.float16)
    dt = (rng.normal(shp) - 2.0).astype(mx.float16)
    B, C = rng.normal((1, L, n)).astype(mx.float16), rng.normal((1, L, n)).astype(mx.float16)
    A = -mx.exp(rng.uniform(math.log(0.5), math.log(16.0), (d_inner, n)))
    D, bias = rng.normal((d_inner,)), rng.uniform(-0.5, 0.5, (d_inner,))
    h0 = mx.zeros((1, d_inner, n), dtype=mx.float32)
    mx.eval(x, z, dt, B, C, A, D, bias, h0)
    call = lambda: scan(x, dt, A, B, C, D, z, bias, h0)
    mx.eval([call() for _ in range(reps)])
    sync()
    t0 = time.perf_counter()
    mx.eval([call() for _ in range(reps)])
    sync()
    return (time.perf_counter() - t0) / reps


def kernel_only(scan, d_inner: int, n: int, lengths: list[int], bandwidth: float, reps: int = 20):
    """Per layer: the scan alone at mamba-370m's shapes (time_scan), against bytes / bandwidth."""
    rows = []
    for L in lengths:
        per = time_scan(scan, d_inner, n, L, reps)
        moved = L * scan_bytes_per_token(d_inner, n)
        floor = moved / (bandwidth * 1e9)
        rows.append({"L": L, "us_per_layer": per * 1e6, "floor_us": floor * 1e6,
                     "bytes": moved, "fraction_of_floor": floor / per})
        log(f"scan alone L={L}: {per * 1e6:.1f} us/layer (floor {floor * 1e6:.1f} us)")
    return rows


# --------------------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    out = {"python": platform.python_version(), "mlx": mx.__version__,
           "mlx_device": str(mx.default_device()), "cuda": bool(mx.cuda.is_available()),
           # MLX's launch settings (MLX_USE_CUDA_GRAPHS, MLX_MAX_OPS_PER_BUFFER, ...) change
           # every MLX implementation's numbers, so they belong to the result.
           "mlx_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MLX_")}}
    for mod in ("mlx_lm", "mambapy", "torch"):
        try:
            from importlib.metadata import version

            out[mod] = version(mod.replace("_", "-"))
        except Exception:
            out[mod] = None
    try:
        info = mx.device_info()
        out["gpu"] = info.get("device_name")
        out["gpu_architecture"] = info.get("architecture")
    except Exception:
        pass
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--kernel", type=Path, help="an mlx candidate module (the task's entry, or "
                     "the family's state API) to use as our scan")
    src.add_argument("--variant", default="auto",
                     help="a named setting of gpu/mamba/variants.toml, or auto (default): the "
                     "fastest of mamba_model.AUTO_VARIANTS per prompt length, timed here")
    src.add_argument("--knobs", help="family knobs as JSON")
    ap.add_argument("--weights", type=Path, help="a local mamba-*-hf directory (config.json, "
                    "*.safetensors); random weights otherwise")
    ap.add_argument("--config", choices=("370m", "tiny"), default="370m",
                    help="model shape for random weights (tiny: 2 layers, for tests)")
    ap.add_argument("--lengths", default="512,1024,2048,4096")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--decode-warmup", type=int, default=8)
    ap.add_argument("--decode-tune-tokens", type=int, default=24,
                    help="tokens per path and round when --model-kernels auto times the paths")
    ap.add_argument("--decode-loop", choices=("pipelined", "sync"), default="pipelined",
                    help="MLX decode loops: pipelined (as mlx_lm.generate: the next step is "
                    "queued before this token is read) or sync (each step evaluated first)")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prefill-step", type=int, default=2048,
                    help="prompt piece size for the MLX models (mlx_lm.generate's default)")
    ap.add_argument("--stock-budget", type=float, default=120.0,
                    help="skip a stock mlx-lm length whose estimated time exceeds this (s)")
    ap.add_argument("--check-prompt", type=int, default=64)
    ap.add_argument("--check-steps", type=int, default=8)
    ap.add_argument("--kernel-only", action="store_true", help="also time the scan alone")
    ap.add_argument("--channel-first", action="store_true",
                    help="hand our kernels the task's [batch, dim, L] layout (transposes)")
    ap.add_argument("--ops-scan", action="store_true",
                    help="use the MLX-ops scan even where our kernels could run")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--model-kernels", choices=("auto", "model", "layer", "fused", "conv",
                                                "off"),
                    default="auto",
                    help="our kernels around the scan (model_kernels.py). conv: the convolution "
                    "and a fused dt/state/gate decode step beside MLX's matmuls; fused: also a "
                    "whole block per token in four launches; layer: in one launch (a grid "
                    "barrier between its phases); model: every block of a decode step in one "
                    "launch; off: mlx-lm's ops; auto: every kernel path that builds, matches "
                    "stock and (model, layer) never times out a barrier, the fastest at decode "
                    "on this machine, where MLX has a CUDA device; else off")
    ap.add_argument("--layer-blocks", type=int, default=None,
                    help="grid of the one-kernel decodes, model and layer (default: one block "
                    "per SM as far as MLX tells, else 64); all blocks must be resident at once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    impls = [x for x in args.impls.split(",") if x]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        print(f"unknown implementations {sorted(unknown)} (known: {', '.join(IMPLS)})",
              file=sys.stderr)
        return 2
    config = mm.MAMBA_370M if args.config == "370m" else mm.TINY
    knobs = json.loads(args.knobs) if args.knobs else None
    log(f"building the model ({'weights ' + str(args.weights) if args.weights else 'random weights'})")
    stock = mm.build_stock(config, args.weights, seed=args.seed)
    scan, kernel_info = mm.choose_scan(args.kernel, knobs, args.variant,
                                       channel_last=not args.channel_first,
                                       force_ops=args.ops_scan)
    a = stock.args
    if isinstance(scan, mm.TunedScan):
        # The scan lengths the forward will see: each prompt in pieces of --prefill-step.
        seen = sorted({min(L, args.prefill_step) for L in lengths}
                      | {L % args.prefill_step for L in lengths if L % args.prefill_step})
        if args.kernel_only:
            # The scan alone is timed at every length, also past --prefill-step (4096): tuned
            # there too, or it would run the pick of the nearest prompt piece length.
            seen = sorted(set(seen) | set(lengths))
        log(f"tuning the scan: {', '.join(scan.scans)} at T = {seen}")
        warm_device()
        kernel_info["tuning"] = scan.tune(
            seen, lambda s, T: time_scan(s, a.intermediate_size, a.state_size, T, reps=10))
        log(f"picked {kernel_info['tuning']['picks']}")
    mode, ours, fwd, check = choose_model(stock, scan, args, kernel_info)
    kernel_info["model_kernels"] = mode != "off"
    kernel_info["decode_path"] = {"off": "mlx-lm ops", "conv": "conv and step kernels",
                                  "fused": "four kernels per block",
                                  "layer": "one kernel per block",
                                  "model": "one kernel per token"}[mode]
    if mode == "layer":
        kernel_info["layer_blocks"] = ours.backbone.layers[0].mixer.ks_grid.blocks
    elif mode == "model":
        kernel_info["layer_blocks"] = ours.ks_stack.grid.blocks
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "model": {"name": "mamba-370m" if args.config == "370m" and not args.weights else
                  (args.weights.name if args.weights else "tiny"),
                  "d_model": a.hidden_size, "n_layer": a.num_hidden_layers,
                  "vocab": a.vocab_size, "d_inner": a.intermediate_size,
                  "d_state": a.state_size, "dtype": "float16",
                  "weights": str(args.weights) if args.weights else f"random (seed {args.seed})"},
        "versions": versions(),
        "kernel": {**kernel_info, "scan": scan.name if hasattr(scan, "name") else str(scan),
                   "channel_last": not args.channel_first},
        "lengths": lengths,
        "decode_tokens": args.decode_tokens,
        "targets": TARGETS,
        "rows": [],
    }
    check["compiled"] = fwd.compile
    result["check"] = check
    log(f"check: logits max rel diff {check['max_rel_diff']:.2e}, states "
        f"{check['max_state_rel_diff']:.2e} (tol {CHECK_TOL}, {CHECK_STATE_TOL}), argmax "
        f"{check['argmax_agreement']:.3f} -> {'passed' if check['passed'] else 'FAILED'}")
    if not check["passed"]:
        emit(result, args.out)
        return 3
    for impl in impls:
        row: dict[str, Any] = {"impl": impl, "prefill_tok_s": {}, "decode_tok_s": None,
                               "skipped": {}, "notes": [], "samples": {}}
        result["rows"].append(row)
        try:
            run_impl(impl, row, stock, fwd, args, lengths)
        except Exception as e:  # a broken or missing implementation is reported, not fatal
            row["error"] = f"{type(e).__name__}: {e}"
            log(f"{impl}: {row['error']}")
    if "ksearch" in impls:
        try:
            mm.check_grid(ours)  # once more: a barrier that timed out while timing spoils decode
        except mm.GridBarrierTimeout as e:
            row = next(r for r in result["rows"] if r["impl"] == "ksearch")
            row["error"] = f"decode not reported: {e}"
            row["decode_tok_s"] = None
            log(row["error"])
    result["kernel"]["compiled"] = fwd.compile
    if fwd.compile_error:
        result["kernel"]["compile_error"] = fwd.compile_error
    if "ksearch" in impls:
        result["mlx_launch_overhead"] = launch_overhead()
        log("MLX per-primitive cost with negligible work: "
            + ", ".join(f"{k} {v:.1f}" for k, v in result["mlx_launch_overhead"].items()))
    if args.kernel_only:
        bw = measure_bandwidth()
        result["bandwidth_gbs"] = bw
        result["kernel_only"] = kernel_only(scan, a.intermediate_size, a.state_size, lengths, bw)
        # How much of our prefill time the scans take (48 of them), i.e. what bounds it.
        ours = next((r for r in result["rows"] if r["impl"] == "ksearch"), None)
        for k in result["kernel_only"]:
            tps = ours["prefill_tok_s"].get(str(k["L"])) if ours else None
            k["share_of_ksearch_prefill"] = (k["us_per_layer"] * 1e-6 * a.num_hidden_layers
                                             / (k["L"] / tps)) if tps else None
    emit(result, args.out)
    return 0


# Interleaved rounds of the decode paths' timing in choose_model.
DECODE_ROUNDS = ROUNDS


def choose_model(stock, scan, args, kernel_info: dict):
    """Our model for the bench: (decode mode, model, forward, logits check).

    auto: every path with our kernels is checked (model, layer, fused, conv); one whose kernels
    fail to build or run, or whose logits disagree with stock mlx-lm, drops out (recorded in
    kernel.fallbacks), and of those left the fastest at decode on this machine is used
    (kernel.decode_tuning: DECODE_ROUNDS interleaved rounds of --decode-tune-tokens (24) per
    path, the first listed within steady_pick's margin of the fastest median): the one-launch
    path per block is not always the fastest (measured on the H200: 209 tok/s against 262 for
    four launches per block). mlx-lm's own ops ("off") only run when no kernel path passed. A mode given by name is checked alone; when the last resort
    fails its check, that check is returned (failed) and nothing is timed."""
    a = stock.args
    auto = args.model_kernels == "auto"
    if auto:
        modes = ["model", "layer", "fused", "conv", "off"] if mx.cuda.is_available() else ["off"]
    else:
        modes = [args.model_kernels]
    log("checking our logits against stock mlx-lm")
    passed: list[tuple[str, Any, OursForward, dict]] = []
    for i, mode in enumerate(modes):
        if mode == "off" and passed:
            break
        try:
            # Loading the kernel module belongs to the attempt: it may fail here too.
            ours = mm.patched_copy(stock, scan, mm.model_kernels() if mode != "off" else None,
                                   decode=mode if mode in mm.DECODE_PATHS else "conv",
                                   blocks=args.layer_blocks)
            fwd = OursForward(ours, compile=not args.no_compile)
            check = check_logits(stock, fwd, a.vocab_size, args.check_prompt, args.check_steps,
                                 args.seed)
            # A grid barrier that timed out (layer) is named before the logits it spoiled.
            mm.check_grid(ours)
            problem = None if check["passed"] else f"logits check failed: {check}"
        except Exception as e:
            if i == len(modes) - 1 and not passed:
                raise
            check, problem = None, f"{type(e).__name__}: {e}"
        if problem is None:
            passed.append((mode, ours, fwd, check))
            if not auto:
                break
            continue
        if i == len(modes) - 1 and not passed:
            break  # the last resort failed its check: reported below, nothing is timed
        kernel_info.setdefault("fallbacks", []).append({"mode": mode, "problem": problem[:2000]})
        log(f"model kernels `{mode}`: {problem[:300]}"
            + (f"; trying `{modes[i + 1]}`" if i + 1 < len(modes) else ""))
    if len(passed) > 1:
        # Interleaved rounds (each starting one path later), each path's median, and the
        # first listed within steady_pick's margin of the fastest: one draw per path let two
        # paths within a few percent of each other trade places from run to run.
        draws: dict[str, list[float]] = {m: [] for m, _, _, _ in passed}
        by_mode = {m: (model, f) for m, model, f, _ in passed}
        for order in rotations(list(by_mode), DECODE_ROUNDS):
            for m in order:
                if m not in draws:
                    continue  # dropped out in an earlier round
                model, f = by_mode[m]
                try:
                    rate, _, _ = time_decode_ours(f, a.vocab_size, prompt=16, warmup=4,
                                                  n=args.decode_tune_tokens, seed=args.seed,
                                                  pipelined=args.decode_loop == "pipelined")
                    # A barrier that timed out while being timed leaves a poisoned model that
                    # skips its waits: fast and wrong, so it must not win.
                    mm.check_grid(model)
                    draws[m].append(rate)
                except Exception as e:
                    del draws[m]
                    problem = f"while timing decode: {type(e).__name__}: {e}"
                    kernel_info.setdefault("fallbacks", []).append({"mode": m,
                                                                    "problem": problem[:2000]})
                    log(f"model kernels `{m}`: {problem[:300]}")
        if not draws:
            raise RuntimeError(f"no decode path could be timed: {kernel_info['fallbacks']}")
        rates = {m: statistics.median(d) for m, d in draws.items()}
        kernel_info["decode_tuning"] = {
            "tok_s": rates, "tok_s_range": {m: [min(d), max(d)] for m, d in draws.items()},
            "tokens": args.decode_tune_tokens, "rounds": DECODE_ROUNDS,
            # pick_steady wants times: the seconds per token of each median.
            "pick": pick_steady({m: 1.0 / r for m, r in rates.items()})}
        log("decode paths (median tok/s): " + ", ".join(f"{m} {r:.0f}" for m, r in rates.items())
            + f"; using {kernel_info['decode_tuning']['pick']}")
        mode, ours, fwd, check = next(t for t in passed
                                      if t[0] == kernel_info["decode_tuning"]["pick"])
    elif passed:
        mode, ours, fwd, check = passed[0]
    return mode, ours, fwd, check


def run_impl(impl: str, row: dict, stock, fwd: OursForward, args, lengths: list[int]) -> None:
    """Fills `row` with the implementation's rates and, in row["samples"], the raw seconds
    they come from: each timed prefill run per length and each timed decode step (mambapy:
    the decode loop's total, since PyTorch queues its steps), with the tokens drawn from
    --seed, so the run can be repeated."""
    vocab = stock.args.vocab_size
    pipelined = args.decode_loop == "pipelined"
    samples: dict[str, Any] = {"seed": args.seed, "prefill_s": {}, "decode_step_s": []}
    row["samples"] = samples
    if impl == "ksearch":
        for L in lengths:
            tps, times = time_prefill_ours(fwd, L, vocab, args.reps, args.prefill_step, args.seed)
            row["prefill_tok_s"][str(L)] = tps
            samples["prefill_s"][str(L)] = times
            log(f"ksearch prefill L={L}: {tps:,.0f} tok/s")
        row["decode_tok_s"], samples["decode_step_s"], _ = time_decode_ours(
            fwd, vocab, 16, args.decode_warmup, args.decode_tokens, args.seed, pipelined)
        row["notes"].append(f"decode loop: {args.decode_loop}")
        row["notes"].append("one mx.compile'd forward; prompt in pieces of "
                            f"{args.prefill_step}" if fwd.compile else "uncompiled")
    elif impl == "mlx-lm":
        time_prefill_stock(stock, 16, vocab, args.prefill_step, args.seed)  # warm-up
        rate = None
        for L in lengths:
            if rate is not None and L / rate > args.stock_budget:
                row["skipped"][str(L)] = f"estimated {L / rate:.0f} s > budget {args.stock_budget:.0f} s"
                continue
            rate, times = time_prefill_stock(stock, L, vocab, args.prefill_step, args.seed)
            row["prefill_tok_s"][str(L)] = rate
            samples["prefill_s"][str(L)] = times
            log(f"mlx-lm prefill L={L}: {rate:,.1f} tok/s")
        row["decode_tok_s"], samples["decode_step_s"], _ = time_decode_stock(
            stock, vocab, 16, args.decode_warmup, args.decode_tokens, args.seed, pipelined)
        row["notes"].append(f"decode loop: {args.decode_loop}")
        row["notes"].append("one run per length (its per-token loop); prompt in pieces of "
                            f"{args.prefill_step}")
    elif impl == "mambapy":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        lm = mambapy_model(stock, device)
        for L in lengths:
            tps, times = time_prefill_mambapy(lm, device, L, vocab, max(1, args.reps - 1),
                                              args.seed)
            row["prefill_tok_s"][str(L)] = tps
            samples["prefill_s"][str(L)] = times
            log(f"mambapy prefill L={L}: {tps:,.0f} tok/s")
        row["decode_tok_s"], samples["decode_total_s"] = time_decode_mambapy(
            lm, device, vocab, 16, args.decode_warmup, args.decode_tokens, args.seed)
        del samples["decode_step_s"]
        row["notes"].append(f"torch {torch.__version__} on {device}"
                            + (", f16 autocast" if device == "cuda" else ", float32"))
    log(f"{impl} decode: {row['decode_tok_s']:,.1f} tok/s")


def emit(result: dict, out: Path | None) -> None:
    text = json.dumps(result, indent=1)
    if out is None:
        print(text)
    else:
        out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
