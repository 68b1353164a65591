"""An mlx candidate's CUDA kernels compiled ahead of its evaluation (the `build` op, which a
search writes ahead while the device times another candidate).

MLX compiles a `mx.fast.cuda_kernel` with NVRTC the first time it runs, inside the accused, and
keeps the result in its PTX cache directory (`MLX_PTX_CACHE_DIR`), one `<module>.ptx` (a cubin
where NVRTC can target the device) and `<module>.txt` (the mangled kernel name) per module,
read by name before it would compile. On the H100 that compile was most of an mlx candidate's
start (docs/results/evaluation-speed). This module fills such a directory before the accused
exists, in two steps, each a process in a build sandbox of its own (`toolchain.run_confined`):

1. **record** (candidate code, no device files: it cannot reach the GPU). Imports the candidate
   with MLX on the CPU and `mx.fast.cuda_kernel` replaced by a recorder, then calls the entry
   once per workload with zero inputs of the workload's shapes and dtypes. A recorded kernel
   runs nothing: its call returns zero outputs of the shapes asked for. What comes out is data,
   a list of kernel specs: everything MLX's generated source depends on (name, argument names,
   source, header, input dtypes and whether each input has dimensions, output dtypes, template
   arguments, the two flags). Grid, block and shapes do not enter the source.
2. **compile** (only this module's code, the GPU visible). Builds every spec with the real
   builder under the name the accused's builder gives it (`adapters.mlx.kernel_name`) and calls
   it once on one-element inputs with an empty grid: MLX generates the source itself and
   compiles it into the cache directory before the launch, which has no blocks to run. The
   process answers the cache files it made, as one JSON document.

The judge keeps `custom_kernel_*.ptx` / `.txt` files of that answer (`CachedModules`) beside the
build's artifact and copies them into the accused's cache directory before the candidate loads.
Only names MLX gives custom kernels are copied, so nothing of the candidate's build can stand
in for a module MLX builds for itself. A kernel the record did not see (a spec that depends on
input values, not shapes) compiles in the accused as before; the prebuild never changes what
runs, only where its compile happened. Two specs under one module name (the same kernel called
with other input dtypes and no template argument that tells them apart) are one module to MLX
in any process: the first compiled is what runs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

# What the judge accepts of a compile step's answer: MLX's custom-kernel modules only, each at
# most this large, at most this many.
MODULE_FILE = re.compile(r"^custom_kernel_[A-Za-z0-9_]{1,200}\.(ptx|txt)$")
MAX_FILE_BYTES = 32 << 20
MAX_FILES = 512
# Specs a record keeps at most (a candidate building a kernel per call would otherwise grow it
# without bound).
MAX_SPECS = 256
# The grid of the compile step's launch: no blocks.
EMPTY_GRID = (0, 1, 1)


@dataclass
class KernelSpec:
    """One kernel as MLX's CUDA source generator sees it (mx.fast.cuda_kernel's arguments plus
    one call's dtypes and template)."""
    name: str
    input_names: list[str]
    output_names: list[str]
    source: str
    header: str = ""
    ensure_row_contiguous: bool = True
    atomic_outputs: bool = False
    input_dtypes: list[str] = field(default_factory=list)
    input_ndims: list[int] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    # [name, kind, value]: kind is "int", "bool" or "dtype" (value: the dtype's name).
    template: list[list[Any]] = field(default_factory=list)

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(obj: dict[str, Any]) -> "KernelSpec":
        spec = KernelSpec(
            name=str(obj["name"]), input_names=[str(n) for n in obj["input_names"]],
            output_names=[str(n) for n in obj["output_names"]], source=str(obj["source"]),
            header=str(obj.get("header", "")),
            ensure_row_contiguous=bool(obj.get("ensure_row_contiguous", True)),
            atomic_outputs=bool(obj.get("atomic_outputs", False)),
            input_dtypes=[str(d) for d in obj.get("input_dtypes", [])],
            input_ndims=[int(n) for n in obj.get("input_ndims", [])],
            output_dtypes=[str(d) for d in obj.get("output_dtypes", [])],
            template=[[str(t[0]), str(t[1]), t[2]] for t in obj.get("template", [])])
        if len(spec.input_dtypes) != len(spec.input_names) or \
                len(spec.input_ndims) != len(spec.input_names) or \
                len(spec.output_dtypes) != len(spec.output_names):
            raise ValueError(f"kernel spec `{spec.name}`: argument counts disagree")
        for t in spec.template:
            if t[1] not in ("int", "bool", "dtype"):
                raise ValueError(f"kernel spec `{spec.name}`: template kind `{t[1]}`")
        return spec


def dtype_name(mx: Any, dtype: Any) -> str:
    """`float16` for mx.float16: the attribute of mlx.core that is this dtype."""
    for name in ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32",
                 "int64", "uint8", "uint16", "uint32", "uint64", "bool_", "complex64"):
        if getattr(mx, name, None) == dtype:
            return name
    raise ValueError(f"unknown MLX dtype {dtype!r}")


def _template_entry(mx: Any, name: Any, value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [str(name), "bool", value]
    if isinstance(value, int):
        return [str(name), "int", value]
    return [str(name), "dtype", dtype_name(mx, value)]


# -- step 1: record ----------------------------------------------------------------------------

class Recorder:
    """Stands in for `mx.fast.cuda_kernel` while the candidate is recorded: a kernel it builds
    records each distinct call and returns zero outputs without running anything."""

    def __init__(self, mx: Any):
        self.mx = mx
        self.specs: dict[str, KernelSpec] = {}

    def builder(self, name: str, input_names: Any, output_names: Any, source: str,
                header: str = "", ensure_row_contiguous: bool = True,
                atomic_outputs: bool = False, **_: Any) -> Any:
        mx, specs = self.mx, self.specs
        base = dict(name=str(name), input_names=[str(n) for n in input_names],
                    output_names=[str(n) for n in output_names], source=str(source),
                    header=str(header or ""), ensure_row_contiguous=bool(ensure_row_contiguous),
                    atomic_outputs=bool(atomic_outputs))

        def kernel(*, inputs: Any, output_shapes: Any, output_dtypes: Any, template: Any = None,
                   **_: Any) -> list[Any]:
            arrays = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
            spec = KernelSpec(
                **base, input_dtypes=[dtype_name(mx, a.dtype) for a in arrays],
                input_ndims=[int(a.ndim) for a in arrays],
                output_dtypes=[dtype_name(mx, d) for d in output_dtypes],
                template=[_template_entry(mx, n, v) for n, v in (template or [])])
            if len(specs) < MAX_SPECS:
                specs.setdefault(spec.key(), spec)
            return [mx.zeros(tuple(s), dtype=d) for s, d in zip(output_shapes, output_dtypes)]

        return kernel


def record(candidate: str, workloads: list[dict[str, Any]], entry_symbol: str,
           entry_args: list[str]) -> dict[str, Any]:
    """Runs the candidate at `candidate` on the CPU with the recorder in place, once per
    workload (`name`, `params`, `inputs`: [{name, shape, dtype}]); answers the specs and, per
    workload, what stopped its call (the record is best effort: a candidate that fails here
    fails again, with the judge watching, in its evaluation)."""
    import mlx.core as mx
    mx.set_default_device(mx.cpu)
    recorder = Recorder(mx)
    builder = mx.fast.cuda_kernel
    mx.fast.cuda_kernel = recorder.builder
    try:
        return _record_with(recorder, mx, candidate, workloads, entry_symbol, entry_args)
    finally:
        mx.fast.cuda_kernel = builder


def _record_with(recorder: Recorder, mx: Any, candidate: str, workloads: list[dict[str, Any]],
                 entry_symbol: str, entry_args: list[str]) -> dict[str, Any]:
    import importlib.util

    from .adapters.device import mlx_dtype, resolve_entry
    spec = importlib.util.spec_from_file_location("ksearch_recorded_candidate", candidate)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    problems: dict[str, str] = {}
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the candidate's
        return {"specs": [], "problems": {"import": f"{type(e).__name__}: {e}"}}
    for wl in workloads:
        params = dict(wl.get("params", {}))
        try:
            fn = getattr(module, resolve_entry(entry_symbol, params))
            arrays = {t["name"]: mx.zeros(tuple(t["shape"]), dtype=mlx_dtype(t["dtype"]))
                      for t in wl.get("inputs", [])}
            kwargs = {a: arrays[a] if a in arrays else params[a]
                      for a in entry_args if a in arrays or a in params}
            fn(**kwargs)
        except Exception as e:  # noqa: BLE001 - the candidate's
            problems[str(wl.get("name"))] = f"{type(e).__name__}: {str(e)[:300]}"
    return {"specs": [asdict(s) for s in recorder.specs.values()], "problems": problems}


# -- step 2: compile ---------------------------------------------------------------------------

def compile_specs(specs: list[KernelSpec], cache_dir: str) -> dict[str, Any]:
    """Builds each spec with MLX's builder and launches it on an empty grid, so that MLX writes
    its module into `cache_dir` (MLX_PTX_CACHE_DIR, set before MLX is imported); answers the
    module files and per spec the launch's outcome."""
    import numpy as np

    import mlx.core as mx

    from .adapters.mlx import kernel_name
    os.makedirs(cache_dir, exist_ok=True)
    outcomes = []
    for spec in specs:
        t0 = time.monotonic()
        name = kernel_name(spec.name, spec.source, spec.header)
        try:
            kern = mx.fast.cuda_kernel(
                name=name, input_names=spec.input_names, output_names=spec.output_names,
                source=spec.source, header=spec.header,
                ensure_row_contiguous=spec.ensure_row_contiguous,
                atomic_outputs=spec.atomic_outputs)
            inputs = []
            for d, n in zip(spec.input_dtypes, spec.input_ndims):
                a = mx.array(np.zeros((1,) * n, dtype=np.float32)).astype(getattr(mx, d),
                                                                          stream=mx.cpu)
                inputs.append(a)
            mx.eval(*inputs)
            template = [(t[0], getattr(mx, t[2]) if t[1] == "dtype" else t[2])
                        for t in spec.template]
            outs = kern(inputs=inputs, output_shapes=[(1,)] * len(spec.output_names),
                        output_dtypes=[getattr(mx, d) for d in spec.output_dtypes],
                        grid=EMPTY_GRID, threadgroup=(1, 1, 1), template=template or None)
            try:
                mx.eval(*outs)
                mx.synchronize()
                outcome = "launched"
            except Exception as e:  # noqa: BLE001 - an empty grid may be refused at launch
                outcome = f"launch refused: {str(e)[:200]}"
        except Exception as e:  # noqa: BLE001 - a kernel that does not compile
            outcome = f"failed: {type(e).__name__}: {str(e)[:500]}"
        outcomes.append({"name": name, "outcome": outcome,
                         "seconds": round(time.monotonic() - t0, 3)})
    files = {}
    for fname in sorted(os.listdir(cache_dir)):
        path = os.path.join(cache_dir, fname)
        if MODULE_FILE.match(fname) and os.path.isfile(path) and \
                os.path.getsize(path) <= MAX_FILE_BYTES and len(files) < MAX_FILES:
            with open(path, "rb") as fh:
                files[fname] = base64.b64encode(fh.read()).decode("ascii")
    return {"kernels": outcomes, "files": files}


# -- the judge's side --------------------------------------------------------------------------

@dataclass
class CachedModules:
    """The module files a compile step answered, checked: names of MLX custom-kernel modules,
    bounded sizes and count."""
    files: dict[str, bytes]

    @staticmethod
    def from_answer(answer: dict[str, Any]) -> "CachedModules":
        raw = answer.get("files")
        if not isinstance(raw, dict) or len(raw) > MAX_FILES:
            raise ValueError("the compile step's answer has no file table")
        files = {}
        for name, data in raw.items():
            if not isinstance(name, str) or not MODULE_FILE.match(name) or \
                    not isinstance(data, str):
                raise ValueError(f"the compile step answered a file it may not: {name!r}")
            content = base64.b64decode(data, validate=True)
            if len(content) > MAX_FILE_BYTES:
                raise ValueError(f"{name}: larger than {MAX_FILE_BYTES} bytes")
            files[name] = content
        return CachedModules(files)

    def write(self, directory: str) -> None:
        """Writes the modules into `directory` (made if missing), each through a rename."""
        os.makedirs(directory, exist_ok=True)
        for name, content in self.files.items():
            tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}")
            with open(tmp, "wb") as fh:
                fh.write(content)
            os.chmod(tmp, 0o444)
            os.replace(tmp, os.path.join(directory, name))


def copy_modules(src_dir: str, dst_dir: str) -> int:
    """Copies the custom-kernel modules of `src_dir` (a prebuild beside an artifact) into
    `dst_dir` (an accused's MLX cache directory); answers how many files."""
    if not os.path.isdir(src_dir):
        return 0
    os.makedirs(dst_dir, exist_ok=True)
    n = 0
    for name in os.listdir(src_dir):
        path = os.path.join(src_dir, name)
        if MODULE_FILE.match(name) and os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as fh:
                content = fh.read(MAX_FILE_BYTES + 1)
            if len(content) > MAX_FILE_BYTES:
                continue
            with open(os.path.join(dst_dir, name), "wb") as fh:
                fh.write(content)
            n += 1
    return n


# -- the steps' processes ----------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """`record CANDIDATE REQUEST OUT` (REQUEST: {workloads, entry_symbol, entry_args}) or
    `compile SPECS OUT` (MLX_PTX_CACHE_DIR set by the caller); OUT receives the JSON answer."""
    try:
        if len(argv) == 3 and argv[0] == "compile":
            with open(argv[1], encoding="utf-8") as fh:
                specs = [KernelSpec.from_json(s) for s in json.load(fh)["specs"]]
            answer = compile_specs(specs, os.environ["MLX_PTX_CACHE_DIR"])
        elif len(argv) == 4 and argv[0] == "record":
            with open(argv[2], encoding="utf-8") as fh:
                req = json.load(fh)
            answer = record(argv[1], req["workloads"], req["entry_symbol"], req["entry_args"])
        else:
            print(main.__doc__, file=sys.stderr)
            return 2
    except Exception:  # noqa: BLE001 - reported, the build goes on without the prebuild
        traceback.print_exc()
        return 1
    with open(argv[-1], "w", encoding="utf-8") as fh:
        json.dump(answer, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
