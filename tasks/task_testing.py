"""Shared helpers of the built-in tasks' own tests (`tasks/<name>/test_reference.py`): load a
task's `task.toml` and `reference.py`, draw inputs the way the harness does, apply the task's
f32 tolerance, and run its cpu seed kernel through ctypes."""

from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import subprocess
import tomllib

import numpy as np


class TaskUnderTest:
    def __init__(self, here: pathlib.Path):
        self.dir = here
        self.spec = tomllib.loads((here / "task.toml").read_text())
        name = "task_ref_" + here.name.replace("-", "_")
        loader = importlib.util.spec_from_file_location(name, here / "reference.py")
        self.ref = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(self.ref)
        self.tol = self.spec["tolerance"]["f32"]

    def make_inputs(self, params: dict, seed: int) -> dict[str, np.ndarray]:
        """Inputs drawn as the harness would: each input's `dist` from task.toml."""
        rng = np.random.default_rng(seed)
        out = {}
        for t in self.spec["inputs"]:
            shape = tuple(params[dim] for dim in t["shape"])
            d = t["dist"]
            if d["kind"] == "normal":
                x = rng.normal(d["mean"], d["std"], size=shape)
            else:
                assert d["kind"] == "custom", d
                x = getattr(self.ref, d.get("function", "make_" + t["name"]))(rng, shape, params)
                assert x.shape == shape
            out[t["name"]] = np.asarray(x, dtype=np.float32)
        return out

    def passes(self, out: np.ndarray, expected: np.ndarray) -> bool:
        """The harness's rule: |out - ref| <= atol * max|ref| + rtol * |ref|."""
        scale = np.max(np.abs(expected))
        err = np.abs(out.astype(np.float64) - expected.astype(np.float64))
        return bool(np.all(err <= self.tol["atol"] * scale + self.tol["rtol"] * np.abs(expected)))

    def run_seed(self, tmp_path: pathlib.Path, inputs: dict, output: str, params: dict):
        """Compiles the cpu seed kernel and calls it with the cpu convention (tensors as
        pointers, int axes as int64_t, in `args` order); returns the NaN-poisoned output after
        the call."""
        cpu = self.spec["backends"]["cpu"]
        lib_path = tmp_path / "seed.so"
        subprocess.run(
            ["cc", "-O3", "-march=native", "-shared", "-fPIC", "-std=c11",
             str(self.dir / cpu["seed"]), "-o", str(lib_path), "-lm"],
            check=True,
        )
        fn = getattr(ctypes.CDLL(str(lib_path)), cpu["entry"])
        fn.restype = None
        shape = next(t for t in self.spec["outputs"] if t["name"] == output)["shape"]
        out = np.full(tuple(params[d] for d in shape), np.nan, dtype=np.float32)
        arrays = {**inputs, output: out}
        fn.argtypes = [ctypes.c_void_p if a in arrays else ctypes.c_int64 for a in cpu["args"]]
        fn(*[arrays[a].ctypes.data if a in arrays else params[a] for a in cpu["args"]])
        return out
