"""Shared helpers of the built-in tasks' own tests (`tasks/<name>/test_reference.py`,
`tasks/test_held_out.py`) and of the template families' correctness check
(`crates/knowledge/tests/check_kernels.py`): load a task's `task.toml` and `reference.py`, list
its workloads, draw inputs the way the harness does (a workload's own `dist` for an input
replaces the input's), apply the task's f32 tolerance, and call cpu kernels through ctypes."""

from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import subprocess
import tomllib

import numpy as np

CFLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c11"]


class TaskUnderTest:
    def __init__(self, here: pathlib.Path):
        self.dir = here
        self.spec = tomllib.loads((here / "task.toml").read_text())
        name = "task_ref_" + here.name.replace("-", "_")
        loader = importlib.util.spec_from_file_location(name, here / "reference.py")
        self.ref = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(self.ref)
        self.tol = self.spec["tolerance"]["f32"]

    def workloads(self, backend: str = "cpu", held_out: bool | None = None) -> list[dict]:
        """The workloads that apply to `backend` (all, or only the held-out or shown ones)."""
        return [w for w in self.spec["workloads"]
                if backend in w.get("backends", [backend])
                and (held_out is None or w.get("held_out", False) == held_out)]

    def shape(self, tensor: dict, params: dict) -> tuple:
        """A tensor's shape for `params`; entries are ints or axis names in the built-ins."""
        return tuple(d if isinstance(d, int) else params[d] for d in tensor["shape"])

    def draw(self, dist: dict, name: str, rng, shape: tuple, params: dict) -> np.ndarray:
        kind = dist["kind"]
        if kind == "normal":
            return rng.normal(dist.get("mean", 0.0), dist.get("std", 1.0), size=shape)
        if kind == "uniform":
            return rng.uniform(dist.get("low", 0.0), dist.get("high", 1.0), size=shape)
        if kind in ("rand_int", "randint"):
            return rng.integers(dist["low"], dist["high"], size=shape)
        assert kind == "custom", dist
        x = getattr(self.ref, dist.get("function", "make_" + name))(rng, shape, params)
        assert x.shape == shape, (name, x.shape, shape)
        return x

    def make_inputs(self, params: dict, seed: int, workload: dict | None = None
                    ) -> dict[str, np.ndarray]:
        """Inputs drawn as the harness would: each input's `dist` from task.toml, or the
        workload's own `dist` for it. float32 (the cpu backend's dtype); the exact values
        differ from the harness's, which draws from its own seeds."""
        own = (workload or {}).get("dist", {})
        rng = np.random.default_rng(seed)
        out = {}
        for t in self.spec["inputs"]:
            dist = own.get(t["name"]) or t.get("dist") or {"kind": "normal"}
            x = self.draw(dist, t["name"], rng, self.shape(t, params), params)
            out[t["name"]] = np.asarray(x, dtype=np.float32)
        return out

    def passes(self, out: np.ndarray, expected: np.ndarray) -> bool:
        """The harness's rule: |out - ref| <= atol * max|ref| + rtol * |ref|."""
        return self.worst(out, expected) <= 1.0

    def worst(self, out: np.ndarray, expected: np.ndarray) -> float:
        """The largest |out - ref| / (atol * max|ref| + rtol * |ref|): at most 1 passes;
        infinite for a non-finite output."""
        out = out.astype(np.float64)
        expected = expected.astype(np.float64)
        if not np.all(np.isfinite(out)):
            return float("inf")
        scale = np.max(np.abs(expected))
        bound = self.tol["atol"] * scale + self.tol["rtol"] * np.abs(expected)
        err = np.abs(out - expected)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(err == 0, 0.0, err / bound)
        return float(np.max(ratio)) if ratio.size else 0.0

    def build(self, source: pathlib.Path, lib_path: pathlib.Path, cc: str = "cc",
              flags: list[str] | None = None) -> ctypes.CDLL:
        """Compiles a cpu kernel into a shared library and loads it."""
        subprocess.run([cc, *(flags or CFLAGS), str(source), "-o", str(lib_path), "-lm"],
                       check=True, capture_output=True)
        return ctypes.CDLL(str(lib_path))

    def call_cpu(self, lib: ctypes.CDLL, inputs: dict, output: str, params: dict) -> np.ndarray:
        """Calls the cpu entry of `lib` with the cpu convention (tensors as pointers, int axes
        as int64_t, in `args` order) on a NaN-poisoned output; returns the output."""
        cpu = self.spec["backends"]["cpu"]
        fn = getattr(lib, cpu["entry"])
        fn.restype = None
        spec = next(t for t in self.spec["outputs"] if t["name"] == output)
        out = np.full(self.shape(spec, params), np.nan, dtype=np.float32)
        arrays = {**inputs, output: out}
        fn.argtypes = [ctypes.c_void_p if a in arrays else ctypes.c_int64 for a in cpu["args"]]
        fn(*[arrays[a].ctypes.data if a in arrays else params[a] for a in cpu["args"]])
        return out

    def run_seed(self, tmp_path: pathlib.Path, inputs: dict, output: str, params: dict):
        """Compiles the cpu seed kernel and calls it (see `call_cpu`)."""
        lib = self.build(self.dir / self.spec["backends"]["cpu"]["seed"], tmp_path / "seed.so")
        return self.call_cpu(lib, inputs, output, params)
