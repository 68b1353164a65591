"""A stand-in for the parts of `mlx.core` that the selective-scan mlx module uses, which runs
its `mx.fast.cuda_kernel` kernels on the CPU emulation: the module's own body strings and
launch arithmetic, compiled the way MLX's CUDA backend builds a custom kernel (inputs as
pointers, `<input>_shape` when the body names it, the template arguments as constexpr lines
and `using` aliases, then the body) and launched with MLX's rule: block = min(threadgroup,
grid), grid = ceil(grid / block).

    fake = FakeMx()
    module = fake.load(path)          # imports the module with `mlx.core` = fake
    y = module.selective_scan(u=fake.array(u_np), ...)
    y.np                              # the numpy result
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np

from emu import compile_unit

MAX_NDIM = 10


class Dtype:
    def __init__(self, name: str, np_dtype, c_type: str):
        self.name, self.np, self.c = name, np.dtype(np_dtype), c_type

    def __repr__(self):
        return f"mlx.core.{self.name}"


FLOAT16 = Dtype("float16", np.float16, "__half")
FLOAT32 = Dtype("float32", np.float32, "float")
INT32 = Dtype("int32", np.int32, "int32_t")
UINT32 = Dtype("uint32", np.uint32, "uint32_t")
_BY_NP = {d.np: d for d in (FLOAT16, FLOAT32, INT32, UINT32)}


class Array:
    def __init__(self, data: np.ndarray):
        self.np = np.ascontiguousarray(data)

    @property
    def shape(self):
        return self.np.shape

    @property
    def ndim(self):
        return self.np.ndim

    @property
    def dtype(self):
        return _BY_NP[self.np.dtype]

    def astype(self, dtype: Dtype) -> "Array":
        return Array(self.np.astype(dtype.np))

    def tolist(self):
        return self.np.tolist()


class Kernel:
    """What mx.fast.cuda_kernel returns: compiled (once per template) and run on call."""

    def __init__(self, name, input_names, output_names, source, header="",
                 ensure_row_contiguous=True, shared_memory=0):
        if not name.isidentifier():
            raise ValueError(f"kernel name {name!r} is not an identifier")
        self.name, self.inputs, self.outputs = name, list(input_names), list(output_names)
        self.source, self.header = source, header
        self.calls = []
        self._libs = {}
        self.resident_blocks = lambda: 0  # FakeMx sets this to read its own setting

    def _library(self, in_types, out_types, template):
        key = (tuple(in_types), tuple(out_types), tuple(template))
        if key in self._libs:
            return self._libs[key]
        params = []
        for n, t in zip(self.inputs, in_types):
            params.append(f"const {t}* {n}")
            if f"{n}_shape" in self.source:
                params.append(f"const Shape {n}_shape")
        params += [f"{t}* {n}" for n, t in zip(self.outputs, out_types)]
        consts = []
        for n, v in template:
            if isinstance(v, Dtype):
                consts.append(f"  using {n} = {v.c};")
            elif isinstance(v, bool):
                consts.append(f"  constexpr bool {n} = {'true' if v else 'false'};")
            else:
                consts.append(f"  constexpr int {n} = {int(v)};")
        args = []
        for i, n in enumerate(self.inputs):
            args.append(f"static_cast<const {in_types[i]}*>(ptrs[{i}])")
            if f"{n}_shape" in self.source:
                args.append(f"shape_of(shapes + {i} * {MAX_NDIM})")
        args += [f"static_cast<{t}*>(ptrs[{len(self.inputs) + i}])" for i, t in enumerate(out_types)]
        unit = "\n".join([
            '#include "cuda_emu.h"', "#include <array>",
            f"typedef std::array<int32_t, {MAX_NDIM}> Shape;",
            self.header,
            f"static void kernel_body({', '.join(params)}) {{", *consts, self.source, "}",
            f"static Shape shape_of(const int32_t* s) {{ Shape r{{}}; for (int i = 0; i < {MAX_NDIM}; ++i) r[i] = s[i]; return r; }}",
            'extern "C" void run(void** ptrs, const int32_t* shapes, unsigned gx, unsigned gy, '
            "unsigned block, unsigned resident) {",
            "  emu::max_resident = resident;",
            f"  emu::launch(dim3{{gx, gy, 1}}, block, [&] {{ kernel_body({', '.join(args)}); }});",
            "}", ""])
        lib = compile_unit(unit, "mlxk", ("cuda_emu.h",), f"kernel {self.name} does not compile")
        fn = ctypes.CDLL(str(lib)).run
        fn.restype = None
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int32),
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint]
        self._libs[key] = fn
        return fn

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup,
                 template=None, init_value=None, verbose=False, stream=None):
        if len(inputs) != len(self.inputs):
            raise ValueError(f"{self.name}: {len(inputs)} inputs for {self.inputs}")
        template = list(template or [])
        for n, v in template:
            if not isinstance(v, (bool, int, Dtype)):
                raise ValueError(f"template value {n}={v!r} must be bool, int or Dtype")
        ins = [a if isinstance(a, Array) else Array(np.asarray(a)) for a in inputs]
        # Fresh outputs hold garbage, as MLX's do: NaN, or all bits set for integers.
        outs = [Array(np.full(tuple(s), np.nan, dtype=d.np) if d.np.kind == "f"
                      else np.full(tuple(s), -1, dtype=np.int64).astype(d.np))
                for s, d in zip(output_shapes, output_dtypes)]
        fn = self._library([a.dtype.c for a in ins], [d.c for d in output_dtypes], template)
        ptrs = (ctypes.c_void_p * (len(ins) + len(outs)))(
            *[a.np.ctypes.data for a in ins + outs])
        shapes = np.zeros((len(ins), MAX_NDIM), dtype=np.int32)
        for i, a in enumerate(ins):
            shapes[i, :a.ndim] = a.shape
        block = [min(t, g) for t, g in zip(threadgroup, grid)]
        if block[1] != 1 or block[2] != 1 or grid[2] != 1:
            raise ValueError("the emulation launches 1-D blocks and 2-D grids")
        blocks = [-(-g // b) for g, b in zip(grid, block)]
        self.calls.append({"grid": tuple(grid), "threadgroup": tuple(threadgroup),
                           "template": template, "blocks": tuple(blocks)})
        fn(ptrs, shapes.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), blocks[0], blocks[1],
           block[0], self.resident_blocks())
        return outs


class FakeMx(types.ModuleType):
    """`mlx.core` for the module under test: arrays, dtypes, zeros, fast.cuda_kernel."""

    float16, float32, int32, uint32 = FLOAT16, FLOAT32, INT32, UINT32

    def __init__(self):
        super().__init__("mlx.core")
        self.kernels: list[Kernel] = []
        self.fast = types.SimpleNamespace(cuda_kernel=self._cuda_kernel)
        self.resident_blocks = 0

    def _cuda_kernel(self, **kw):
        k = Kernel(**kw)
        k.resident_blocks = lambda: self.resident_blocks
        self.kernels.append(k)
        return k

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def zeros(shape, dtype=FLOAT32):
        return Array(np.zeros(tuple(shape), dtype=dtype.np))

    @staticmethod
    def array(data, dtype=None):
        return Array(np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype.np))

    def load(self, path: Path, name: str = "ksm_fake_module"):
        mlx_pkg = types.ModuleType("mlx")
        mlx_pkg.core = self
        saved = {k: sys.modules.get(k) for k in ("mlx", "mlx.core")}
        sys.modules["mlx"], sys.modules["mlx.core"] = mlx_pkg, self
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
        return module
