"""A numpy stand-in for `mlx.core`, importable as `mlx.core` by the judge and by the accused
process (tests put this directory on PYTHONPATH). It implements the slice of the MLX API the mlx
adapter, the device helpers and the test candidates use: arrays with f16/bf16/f32 dtypes,
eval/synchronize, views, a `fast.cuda_kernel` whose kernels double their input. Events (kernel
launches, cache clears, host reads) are recorded in memory and, with the recording process's
pid, as `FAKEMLX <json>` lines on stderr when $KSEARCH_FAKE_MLX_EVENTS is set."""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np

from ksearch_harness import dtypes


class _Events(list):
    """Recorded in memory and, when $KSEARCH_FAKE_MLX_EVENTS is set, written to stderr as
    `FAKEMLX <json>` lines with the recording process's pid: the accused process may write
    nothing but its log."""

    def append(self, event):
        super().append(event)
        if os.environ.get("KSEARCH_FAKE_MLX_EVENTS"):
            record = [os.getpid()] + [e.hex() if isinstance(e, bytes) else e for e in event]
            os.write(2, ("FAKEMLX " + json.dumps(record) + "\n").encode())


class Dtype:
    def __init__(self, name: str, np_dtype):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.size = self.np.itemsize

    def __repr__(self) -> str:
        return f"mlx.core.{self.name}"


class FakeMx(types.ModuleType):
    def __init__(self):
        super().__init__("mlx.core")
        self.float16 = Dtype("float16", np.float16)
        self.bfloat16 = Dtype("bfloat16", np.uint16)  # holds raw bits
        self.float32 = Dtype("float32", np.float32)
        self.int32 = Dtype("int32", np.int32)
        self.int64 = Dtype("int64", np.int64)
        self.int8 = Dtype("int8", np.int8)
        self.int16 = Dtype("int16", np.int16)
        self.uint8 = Dtype("uint8", np.uint8)
        self.uint16 = Dtype("uint16", np.uint16)
        self.uint32 = Dtype("uint32", np.uint32)
        self.uint64 = Dtype("uint64", np.uint64)
        self.bool_ = Dtype("bool_", np.bool_)
        self.evals = 0
        self.kernel_names: list[str] = []
        # ("clear",) for clear_cache, ("kernel", input bytes) for each kernel launch; also
        # appended to $KSEARCH_FAKE_MLX_EVENTS, with this process's pid, since the candidate's
        # calls happen in the accused process.
        self.events: list[tuple] = _Events()
        mx = self

        class array:  # noqa: N801 - the real class is mlx.core.array
            def __init__(self, data, dtype=None):
                if isinstance(data, array):
                    data, dtype = data._a, dtype or data.dtype
                a = np.asarray(data)
                self.dtype = dtype or mx._from_np(a.dtype)
                self._a = np.ascontiguousarray(a.astype(self.dtype.np, copy=False))

            @property
            def shape(self):
                return tuple(self._a.shape)

            def _values(self):
                if self.dtype is mx.bfloat16:
                    return dtypes.get("bf16").decode(self._a).astype(np.float32)
                return self._a.astype(np.float32)

            def astype(self, dtype):
                return mx._from_values(self._values(), dtype)

            def reshape(self, shape):
                return array(self._a.reshape(shape), self.dtype)

            def __mul__(self, k):
                return mx._from_values(self._values() * k, self.dtype)

            def __add__(self, k):
                return array(self._a + (k._a if isinstance(k, array) else k), self.dtype)

            def __array__(self, dtype=None, copy=None):
                if self.dtype is mx.bfloat16:
                    raise TypeError("numpy has no bfloat16")
                self._host_read = True
                return self._a if dtype is None else self._a.astype(dtype)

            def __del__(self):
                # Real MLX recycles this buffer with its pages on the host.
                if getattr(self, "_host_read", False):
                    mx.events.append(("free_host_read",))

        array.__module__ = "mlx.core"
        self.array = array
        self._cls = array  # what the fake's own device-side ops construct
        self.cuda = types.SimpleNamespace(is_available=lambda: True)
        self.metal = types.SimpleNamespace(is_available=lambda: False)

        def cuda_kernel(name, input_names, output_names, source, header="", **kw):
            mx.kernel_names.append(name)
            mx.events.append(("kernel_name", name))

            def run(*, inputs, output_shapes, output_dtypes, **launch):
                mx.events.append(("kernel", inputs[0]._a.tobytes()))
                return [mx._from_values(inputs[0]._values() * 2, output_dtypes[0])]
            return run

        def metal_kernel(*a, **k):
            raise RuntimeError("[metal_kernel] Only supports the Metal backend")

        self.fast = types.ModuleType("mlx.core.fast")
        self.fast.cuda_kernel = cuda_kernel
        self.fast.metal_kernel = metal_kernel

    def _from_np(self, dt):
        for d in (self.float16, self.float32, self.int32, self.int64, self.int8, self.int16,
                  self.uint8, self.uint16, self.uint32, self.uint64, self.bool_):
            if d.np == dt:
                return d
        return self.float32

    def _from_values(self, values, dtype):
        if dtype is self.bfloat16:
            return self._cls(dtypes.get("bf16").encode(values), self.bfloat16)
        return self._cls(np.asarray(values).astype(dtype.np), dtype)

    def eval(self, *arrays):
        self.evals += 1

    def synchronize(self, stream=None):
        pass

    def clear_cache(self):
        self.events.append(("clear",))

    def zeros(self, shape, dtype=None):
        return self._cls(np.zeros(shape, (dtype or self.float32).np), dtype or self.float32)

    def array_equal(self, a, b):
        return bool(a._a.shape == b._a.shape and np.array_equal(a._a, b._a))

    def concatenate(self, arrays):
        return self._cls(np.concatenate([a._a for a in arrays]), arrays[0].dtype)

    def view(self, a, dtype):
        return self._cls(a._a.view(dtype.np), dtype)


_mx = FakeMx()
sys.modules["mlx.core.fast"] = _mx.fast
sys.modules[__name__] = _mx
