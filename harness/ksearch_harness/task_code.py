"""The task's Python side: its reference module, input generation from derived seeds, and the
reference and baseline calls.

reference.py contract: ``reference(inputs, params) -> {output: array}`` (float64 truth; it may
cast to the output dtype), ``baseline_<name>(inputs, params) -> {output: array}``, and for
inputs whose ``dist.kind`` is ``custom`` a ``make_<input>(rng, shape, params) -> array``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import traceback
from typing import Any, Callable

import numpy as np

from . import draw_cache, dtypes, parallel
from .protocol import Dist, Task, TaskError, TensorSpec, Workload

# Purposes of derived seeds; each stream is independent of the others.
TRIAL, PROBE, TIMING, WARMUP, ORDER, PRIME, AUDIT, PROFILE = range(8)

# Generated inputs with more elements than this are drawn in blocks of this many elements, each
# from its own generator (see _draw_blocked), so that the blocks can be filled in parallel and
# the values still depend on nothing but the seed; or, where the backend draws on its device
# (TaskCode.device_draw: cuda), float ones in one piece there. Smaller inputs are drawn in one
# piece from the workload's generator, as they always were.
DRAW_BLOCK = 1 << 20
_NARROW_FLOATS = (np.dtype(np.float16), np.dtype(np.float32))
# Float types a DeviceDraw fills.
DEVICE_DRAWN = ("f16", "bf16", "f32", "f64")


def derive_seed(secret: int, *path: int) -> int:
    """A 63-bit seed for one purpose (trial t, timing repetition r of workload w, ...), derived
    from the secret with numpy's SeedSequence so that streams never overlap."""
    spawn_key = tuple(int(p) for p in path)
    return _seed63(np.random.SeedSequence(entropy=secret, spawn_key=spawn_key))


def _seed63(ss: np.random.SeedSequence) -> int:
    """A 63-bit seed from the first 64 bits of `ss`'s state."""
    hi, lo = (int(x) for x in ss.generate_state(2, dtype=np.uint32))
    return ((hi << 32) | lo) & ((1 << 63) - 1)


def rng_for(seed: int, workload_index: int) -> np.random.Generator:
    return np.random.default_rng([seed, workload_index])


class Inputs:
    """One input set: what the candidate's buffers receive (`stored`) and what reference.py
    gets (`view`, a private copy per call so a careless reference cannot alter it)."""

    def __init__(self, stored: dict[str, np.ndarray], specs: tuple[TensorSpec, ...]):
        self.stored = stored
        self.specs = specs

    def for_reference(self, shared: bool = False) -> dict[str, np.ndarray]:
        """The reference's inputs: private copies, or with `shared`, for a set whose arrays
        are read-only (kept across evaluations: draw_cache), read-only views made once
        (DType.shared_reference_view). Shared views are for calls that take their device
        copies from the adapter's registry (the GPU backends' timed calls): a task function
        that writes into its host inputs fails there, instead of changing a kept set."""
        out = {}
        for s in self.specs:
            stored = self.stored[s.name]
            dt = dtypes.get(s.dtype)
            view = dt.shared_reference_view(stored) if shared else None
            if view is None:
                view = dt.reference_view(stored)
                # bf16's view is already a new array; copying it again would only cost time.
                view = parallel.copy(view) if np.may_share_memory(view, stored) else view
            out[s.name] = view
        return out


# How a large generated float input may be drawn off the host: (storage array to fill, dtype
# name, "normal" or "uniform", mean or low, std or high, seed). adapters.large_input_drawer
# picks it per backend.
DeviceDraw = Callable[[np.ndarray, str, str, float, float, int], None]


class TaskCode:
    def __init__(self, task: Task, device_draw: DeviceDraw | None = None):
        self.task = task
        self.device_draw = device_draw
        path = os.path.join(task.dir, task.reference_module)
        if not os.path.isfile(path):
            raise TaskError(f"task reference module not found: {path}")
        mod_name = "ksearch_task_" + "".join(c if c.isalnum() else "_" for c in task.name)
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise TaskError(f"cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, task.dir)  # so reference.py can import helpers beside it
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise TaskError(f"importing {path} failed: {_describe(e)}") from None
        finally:
            try:
                sys.path.remove(task.dir)
            except ValueError:
                pass
        self.module = module
        self.reference_fn = self._function(task.reference_function, "reference")
        self.baseline_fn: Callable | None = None
        if task.baseline_function:
            self.baseline_fn = self._function(task.baseline_function, "baseline")

    def _function(self, name: str, role: str) -> Callable:
        fn = getattr(self.module, name, None)
        if not callable(fn):
            raise TaskError(f"{self.task.reference_module} has no {role} function `{name}`")
        return fn

    # -- inputs --------------------------------------------------------------------------

    def make_inputs(self, wl: Workload, seed: int, workload_index: int) -> Inputs:
        rng = rng_for(seed, workload_index)
        stored = {}
        for spec in wl.inputs:
            stored[spec.name] = self._draw(spec, wl, rng, spec.shape)
        return Inputs(stored, wl.inputs)

    def _draw(self, spec: TensorSpec, wl: Workload, rng: np.random.Generator,
              shape: tuple[int, ...]) -> np.ndarray:
        dt = dtypes.get(spec.dtype)
        dist = spec.dist
        if dist is None:
            dist = _default_dist(dt)
        if dist.kind != "custom" and math.prod(shape) > DRAW_BLOCK:
            if (self.device_draw is not None and dist.kind in ("normal", "uniform")
                    and dt.name in DEVICE_DRAWN):
                return self._draw_on_device(dt, dist, rng, shape)
            return _draw_blocked(dt, dist, rng, shape)
        if dist.kind == "normal":
            values: Any = rng.standard_normal(shape, dtype=np.float64) * dist.std + dist.mean
        elif dist.kind == "uniform":
            values = rng.uniform(dist.low, dist.high, size=shape)
        elif dist.kind == "rand_int":
            values = rng.integers(int(dist.low), int(dist.high), size=shape)
        else:
            fn = getattr(self.module, dist.function or f"make_{spec.name}", None)
            if not callable(fn):
                raise TaskError(f"input `{spec.name}` has a custom distribution but "
                                f"{self.task.reference_module} defines no "
                                f"`{dist.function or 'make_' + spec.name}`")
            try:
                values = fn(rng, tuple(shape), dict(wl.params))
            except Exception as e:
                raise TaskError(f"generator for input `{spec.name}` raised: {_describe(e)}") \
                    from None
            values = np.asarray(values)
            if values.shape != tuple(shape):
                raise TaskError(f"generator for input `{spec.name}` returned shape "
                                f"{values.shape}, expected {tuple(shape)}")
        if not dt.is_float:
            values = np.asarray(values)
            if values.dtype.kind == "f":
                values = np.rint(values)
        return dtypes.contiguous(dt.encode(values))

    def _draw_on_device(self, dt: dtypes.DType, dist: Dist, rng: np.random.Generator,
                        shape: tuple[int, ...]) -> np.ndarray:
        """A large float input drawn by `device_draw` from one seed, which takes from `rng`
        what _draw_blocked takes (so the inputs after it see the same stream), written into an
        off-heap array the draw cache can keep without copying it again."""
        assert self.device_draw is not None
        seed = _seed63(np.random.SeedSequence(_block_entropy(rng)))
        out = draw_cache.off_heap_empty(shape, dt.storage)
        if dist.kind == "normal":
            a, b = dist.mean, dist.std
        else:
            a, b = dist.low, dist.high
        try:
            self.device_draw(out, dt.name, dist.kind, float(a), float(b), seed)
        except Exception as e:
            raise TaskError(f"drawing a {dt.name} input of shape {tuple(shape)} on the device "
                            f"failed: {_describe(e)}") from None
        return out

    def perturb(self, inputs: Inputs, wl: Workload, seed: int, workload_index: int
                ) -> Inputs | None:
        """A near-duplicate of `inputs`: one element of each generated input redrawn (and made
        clearly different). A result cache keyed on a few sampled input values answers it with
        the previous set's output. Inputs from custom generators keep their values, since
        mixing two draws could break the structure the generator guarantees."""
        rng = rng_for(seed, workload_index)
        stored = {k: v.copy() for k, v in inputs.stored.items()}
        changed = False
        for spec in wl.inputs:
            dist = spec.dist or _default_dist(dtypes.get(spec.dtype))
            if dist.kind == "custom":
                continue
            dt = dtypes.get(spec.dtype)
            flat = stored[spec.name].reshape(-1)
            idx = int(rng.integers(0, flat.size))
            old = float(dt.decode(flat[idx:idx + 1])[0])
            if dist.kind == "normal":
                spread = max(dist.std, 1e-3 * max(1.0, abs(dist.mean)))
            elif dist.kind == "uniform":
                spread = (dist.high - dist.low) / 4
            else:
                spread = 1.0
            for _ in range(16):
                new = dt.decode(self._draw(spec, wl, rng, (1,)))[0]
                if abs(new - old) >= 0.5 * spread or (not dt.is_float and new != old):
                    break
            else:
                continue
            flat[idx:idx + 1] = dt.encode(np.array([new]))
            changed = True
        return Inputs(stored, wl.inputs) if changed else None

    # -- reference and baseline ----------------------------------------------------------

    def reference(self, inputs: Inputs, wl: Workload) -> dict[str, np.ndarray]:
        """The truth for `inputs`: float arrays of the output shapes (float32 where the
        reference returned float16 or float32, float64 otherwise)."""
        return self.check_outputs(self.call_reference(inputs.for_reference(), wl), wl,
                                  "reference")

    def call_reference(self, ref_inputs: dict, wl: Workload) -> Any:
        try:
            return self.reference_fn(ref_inputs, dict(wl.params))
        except Exception as e:
            raise TaskError(f"reference `{self.task.reference_function}` raised on workload "
                            f"`{wl.name}`: {_describe(e)}") from None

    def call_baseline(self, ref_inputs: dict, wl: Workload) -> Any:
        assert self.baseline_fn is not None
        try:
            return self.baseline_fn(ref_inputs, dict(wl.params))
        except Exception as e:
            raise TaskError(f"baseline `{self.task.baseline_function}` raised on workload "
                            f"`{wl.name}`: {_describe(e)}") from None

    def check_outputs(self, result: Any, wl: Workload, role: str) -> dict[str, np.ndarray]:
        if not isinstance(result, dict):
            raise TaskError(f"{role} must return a dict of outputs, returned "
                            f"{type(result).__name__}")
        out = {}
        for spec in wl.outputs:
            if spec.name not in result:
                raise TaskError(f"{role} returned no output `{spec.name}` on workload "
                                f"`{wl.name}` (keys: {sorted(result)})")
            try:
                arr = np.asarray(result[spec.name])
                # float16 and float32 results stay float32, which holds them exactly: half
                # the memory of float64 for every comparison against this truth.
                arr = (arr.astype(np.float32, copy=False) if arr.dtype in _NARROW_FLOATS
                       else np.asarray(arr, dtype=np.float64))
            except (TypeError, ValueError) as e:
                raise TaskError(f"{role} output `{spec.name}` is not numeric: {e}") from None
            if arr.shape != spec.shape:
                raise TaskError(f"{role} output `{spec.name}` on workload `{wl.name}` has "
                                f"shape {arr.shape}, expected {spec.shape}")
            out[spec.name] = arr
        return out


def _draw_blocked(dt: dtypes.DType, dist: Dist, rng: np.random.Generator,
                  shape: tuple[int, ...]) -> np.ndarray:
    """A large generated input: one seed drawn from `rng` is spawned into a generator per block
    of DRAW_BLOCK elements (SeedSequence.spawn: independent streams), and each block is drawn
    and encoded into its place in the output by whichever pool thread takes it. The values
    depend on the seed and the block index only, never on the number of threads."""
    size = math.prod(shape)
    n_blocks = -(-size // DRAW_BLOCK)
    children = np.random.SeedSequence(_block_entropy(rng)).spawn(n_blocks)
    out = np.empty(size, dtype=dt.storage)

    def fill(i: int) -> None:
        block = out[i * DRAW_BLOCK:(i + 1) * DRAW_BLOCK]
        _fill_block(np.random.Generator(np.random.PCG64(children[i])), dt, dist, block)

    parallel.map_items(fill, n_blocks)
    return out.reshape(shape)


def _block_entropy(rng: np.random.Generator) -> list[int]:
    """The one seed a large input takes from the workload's generator (two 63-bit integers),
    whether its blocks are drawn on the host or it is drawn whole on the device."""
    return [int(e) for e in rng.integers(0, 1 << 63, size=2, dtype=np.int64)]


def _fill_block(g: np.random.Generator, dt: dtypes.DType, dist: Dist, out: np.ndarray) -> None:
    """Draws out.size values from `g` and writes them encoded into `out` (1-d storage)."""
    n = out.size
    if dt.is_float and dist.kind in ("normal", "uniform"):
        # Drawn and scaled in place in float32 for every float type narrower than f64: no
        # float64 temporaries, and still finer than any of them (f16 keeps 11 bits, bf16 8,
        # f32 24).
        work = np.dtype(np.float64 if dt.name == "f64" else np.float32)
        vals = out if out.dtype == work else np.empty(n, dtype=work)
        if dist.kind == "normal":
            g.standard_normal(dtype=work, out=vals)
            scale, shift = dist.std, dist.mean
        else:
            g.random(dtype=work, out=vals)
            scale, shift = dist.high - dist.low, dist.low
        if scale != 1.0:
            vals *= work.type(scale)
        if shift != 0.0:
            vals += work.type(shift)
        if dt.name == "bf16":
            dtypes.bf16_round_into(vals, out)
        elif vals is not out:
            np.copyto(out, vals, casting="unsafe")  # float32 -> f16, rounding to nearest even
        return
    # Integer types, and integer draws into float types: the formula of the small path.
    if dist.kind == "normal":
        values: Any = g.standard_normal(n, dtype=np.float64) * dist.std + dist.mean
    elif dist.kind == "uniform":
        values = g.uniform(dist.low, dist.high, size=n)
    else:
        values = g.integers(int(dist.low), int(dist.high), size=n)
    if not dt.is_float and values.dtype.kind == "f":
        values = np.rint(values)
    out[...] = dt.encode(values)


def _default_dist(dt: dtypes.DType) -> Dist:
    if dt.is_float:
        return Dist("normal", mean=0.0, std=1.0)
    if dt.name == "bool":
        return Dist("rand_int", low=0, high=2)
    return Dist("rand_int", low=0, high=100)


def _describe(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"
