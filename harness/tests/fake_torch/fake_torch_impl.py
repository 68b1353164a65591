"""A numpy stand-in for PyTorch (`FakeTorch`); `torch/` beside this file makes it importable
as `torch` by the accused process (tests put this directory on PYTHONPATH). It hands out host buffers where PyTorch would hand out
device memory, so CUDA C++ whose entry points run on the host can be evaluated without a GPU. A
device-wide synchronize can be told to take time (work still running elsewhere) or to fail the
way a sticky CUDA error does; in the accused those settings come from $KSEARCH_FAKE_TORCH."""

from __future__ import annotations

import contextlib
import json
import os
import time
import types

import numpy as np

from ksearch_harness import dtypes


class FakeTorch(types.ModuleType):
    def __init__(self):
        super().__init__("torch")
        self.__version__ = "0.0-fake"
        self.version = types.SimpleNamespace(cuda="13.0")
        self.sync_delay_s = 0.0
        self.sticky: str | None = None
        self.device_syncs = 0
        self.announce = False  # print `FAKETORCH sync` per device-wide synchronize
        for name, np_dtype, is_float in [
                ("float16", np.float16, True), ("bfloat16", np.uint16, True),
                ("float32", np.float32, True), ("float64", np.float64, True),
                ("int8", np.int8, False), ("int16", np.int16, False),
                ("int32", np.int32, False), ("int64", np.int64, False),
                ("uint8", np.uint8, False), ("bool", np.bool_, False)]:
            setattr(self, name, types.SimpleNamespace(name=name, np=np.dtype(np_dtype),
                                                      is_float=is_float))
        torch = self

        class Tensor:
            # is_cuda: False, as the fake's memory is the host's; a test may set it to take a
            # tensor for the GPU's (views keep it).
            def __init__(self, a, dtype, is_cuda=False):
                self.a, self.dtype, self.is_cuda = a, dtype, is_cuda

            @property
            def shape(self):
                return self.a.shape

            def view(self, dtype):
                return Tensor(self.a.view(dtype.np), dtype, self.is_cuda)

            def reshape(self, shape):
                return Tensor(self.a.reshape(shape), self.dtype)

            def copy_(self, src):
                # As torch: `src` broadcasts to this tensor's shape, never the other way.
                shape = np.broadcast_shapes(self.a.shape, src.a.shape)
                if shape != self.a.shape:
                    raise RuntimeError(f"output with shape {list(self.a.shape)} doesn't match "
                                       f"the broadcast shape {list(shape)}")
                np.copyto(self.a, np.broadcast_to(src.a, self.a.shape))
                return self

            def data_ptr(self):
                return self.a.ctypes.data

            def clone(self):
                return Tensor(self.a.copy(), self.dtype)

            def detach(self):
                return self

            def cpu(self):
                return self

            def numpy(self):
                return self.a

            def element_size(self):
                return self.a.itemsize

            def is_floating_point(self):
                return self.dtype.is_float

            def add_(self, k):
                self.a += k
                return self

            def float(self):
                values = (dtypes.get("bf16").decode(self.a) if self.dtype is torch.bfloat16
                          else self.a)
                return Tensor(np.asarray(values, dtype=np.float32), torch.float32)

            # What the judge's device checks use (device_checks, core's device snapshots):
            # elementwise arithmetic, comparisons, reductions and masks, in numpy.
            def to(self, what):
                if isinstance(what, str):
                    return self  # a device: the fake's memory is the host's
                if what is torch.bfloat16 and self.dtype is not torch.bfloat16:
                    return Tensor(dtypes.get("bf16").encode(self.a), what)
                return Tensor(self.a.astype(what.np), what)

            # The generator's fills (adapters/device.py torch_draw_into), from numpy.
            def normal_(self, mean=0.0, std=1.0, generator=None):
                g = generator.rng if generator is not None else np.random.default_rng()
                self.a[...] = g.standard_normal(self.a.shape) * std + mean
                return self

            def uniform_(self, low=0.0, high=1.0, generator=None):
                g = generator.rng if generator is not None else np.random.default_rng()
                self.a[...] = g.uniform(low, high, size=self.a.shape)
                return self

            def numel(self):
                return int(self.a.size)

            def all(self):
                return Tensor(np.asarray(self.a.all()), torch.bool)

            def any(self):
                return Tensor(np.asarray(self.a.any()), torch.bool)

            def max(self):
                return Tensor(np.asarray(self.a.max()), self.dtype)

            def __bool__(self):
                return bool(self.a)

            def __float__(self):
                return float(self.a)

            def __getitem__(self, mask):
                return Tensor(self.a[mask.a if isinstance(mask, Tensor) else mask], self.dtype)

            def _binary(self, other, op, dtype=None):
                b = other.a if isinstance(other, Tensor) else other
                with np.errstate(invalid="ignore", over="ignore"):
                    r = op(self.a, b)
                return Tensor(r, dtype or self.dtype)

            def __sub__(self, other):
                return self._binary(other, np.subtract)

            def __rmul__(self, k):
                return self._binary(k, np.multiply)

            def __add__(self, other):
                return self._binary(other, np.add)

            __radd__ = __add__

            def __truediv__(self, other):
                return self._binary(other, np.divide)

            def __le__(self, other):
                return self._binary(other, np.less_equal, torch.bool)

            def __eq__(self, other):
                return self._binary(other, np.equal, torch.bool)

            __hash__ = object.__hash__

            def __mul__(self, k):
                # As torch: a product with a tensor broadcasts (a 0-d one is a scalar).
                other = k.a if isinstance(k, Tensor) else np.float32(k)
                return Tensor((self.a * other).astype(self.a.dtype), self.dtype)

        Tensor.__module__ = "torch"
        self.Tensor = Tensor

        class Generator:
            def __init__(self, device=None):
                self.device = device
                self.rng = np.random.default_rng(0)
                torch.generators_made += 1

            def manual_seed(self, seed):
                self.rng = np.random.default_rng(int(seed))
                return self

        self.Generator = Generator
        self.generators_made = 0

        class Stream:
            cuda_stream = 0x5EED

            def synchronize(self):
                pass  # host code is done when it returns: the harness stream is idle

        class Event:
            def __init__(self, enable_timing=False):
                self.t = 0

            def record(self, stream=None):
                self.t = time.perf_counter_ns()

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.t - self.t) / 1e6

        def synchronize():
            torch.device_syncs += 1
            if torch.announce:
                os.write(2, b"FAKETORCH sync\n")
            if torch.sync_delay_s:
                time.sleep(torch.sync_delay_s)
            if torch.sticky:
                raise RuntimeError(f"CUDA error: {torch.sticky}")

        props = types.SimpleNamespace(name="Fake H200", major=9, minor=0,
                                      multi_processor_count=132, total_memory=141 << 30,
                                      L2_cache_size=60 << 20)
        self.cuda = types.SimpleNamespace(
            is_available=lambda: True, Stream=Stream, Event=Event, synchronize=synchronize,
            set_stream=lambda s: None, stream=lambda s: contextlib.nullcontext(),
            get_device_properties=lambda i: props,
            init=lambda: None)

    def empty(self, shape, dtype, device=None):
        return self.Tensor(np.empty(shape, dtype=dtype.np), dtype)

    def zeros(self, n, dtype=None, device=None):
        dtype = dtype or self.float32
        return self.Tensor(np.zeros(n, dtype=dtype.np), dtype)

    def from_numpy(self, a):
        for d in (self.uint8, self.int16, self.int32, self.int64, self.float16, self.float32,
                  self.float64):
            if d.np == a.dtype:
                return self.Tensor(a, d)
        raise TypeError(a.dtype)

    def equal(self, x, y):
        return bool(np.array_equal(x.a, y.a))

    def _wrap(self, a, dtype):
        return self.Tensor(np.asarray(a), dtype)

    def abs(self, x):
        return self._wrap(np.abs(x.a), x.dtype)

    def isfinite(self, x):
        return self._wrap(np.isfinite(x.a), self.bool)

    def isnan(self, x):
        return self._wrap(np.isnan(x.a), self.bool)

    def logical_or(self, x, y):
        return self._wrap(np.logical_or(x.a, y.a), self.bool)

    def logical_and(self, x, y):
        return self._wrap(np.logical_and(x.a, y.a), self.bool)

    def where(self, c, x, y):
        return self._wrap(np.where(c.a, x.a, y.a), x.dtype)

    def maximum(self, x, y):
        return self._wrap(np.maximum(x.a, y.a), x.dtype)

    def full_like(self, x, value):
        return self._wrap(np.full_like(x.a, value), x.dtype)

    @classmethod
    def from_env(cls) -> "FakeTorch":
        """The fake as the accused process gets it: the test's settings arrive in
        $KSEARCH_FAKE_TORCH (JSON: sync_delay_s, sticky), and every device-wide synchronize is
        announced on stderr so the test can count them."""
        fake = cls()
        settings = json.loads(os.environ.get("KSEARCH_FAKE_TORCH") or "{}")
        fake.sync_delay_s = float(settings.get("sync_delay_s", 0.0))
        fake.sticky = settings.get("sticky")
        fake.announce = True
        return fake
