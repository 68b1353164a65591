"""Device check of the selective-scan GPU family, variant by variant, outside the harness: for a
GPU machine (PyTorch with CUDA, nvcc; MLX with CUDA for --backend mlx).

    python kernel_bench.py --backend cuda --json out.json [--variants s0_sequential,chunked_fused]
    python kernel_bench.py --backend cuda --layouts task,channel-last --variants tiled_c16_t512
    python kernel_bench.py --backend mlx --json out.json

cuda: every named variant (variants.toml) is rendered, built with nvcc for sm_90a (-Xptxas -v:
registers, spills) and called through ctypes on PyTorch tensors, in the task's layout
[batch, dim, L] and, with --layouts task,channel-last, also in mlx-lm's [batch, L, dim] (B and
C [batch, L, N]) through an entry this tool appends to the unit, which launches the same kernels
on channel-last strides; mlx: the rendered module is imported and both its task entry and its
channel-last, stateful entry (what the model calls) are run. Each variant is checked against
the float64 scan on the GPU (the task's tolerance: 2e-3 of max|y|; a NaN or an unwritten
output is wrong) on mamba-370m's shapes, the held-out lengths and both decay regimes, then
timed at L in --lengths: cuda with CUDA events after an L2 flush (median of --reps, with the
quartiles), mlx with --reps calls in one evaluation. Each time is set against the memory floor
(the bytes the task's roofline counts over the measured bandwidth)."""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import numpy as np  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from ksearch_render import Family  # noqa: E402

TOL = 2e-3


def log(msg):
    print(f"[kernel_bench] {msg}", file=sys.stderr, flush=True)


def task_reference():
    spec = importlib.util.spec_from_file_location(
        "ss_reference", REPO / "tasks" / "selective-scan" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = task_reference()


def host_inputs(batch, dim, L, N, has_z=1, softplus=1, decay="mixed", seed=0):
    """The task's input distributions (f16 where the task says so)."""
    rng = np.random.default_rng(seed)
    p = {"batch": batch, "dim": dim, "L": L, "N": N, "has_z": has_z, "softplus": softplus}
    if decay != "mixed":
        p["decay"] = decay
    f16 = lambda x: np.asarray(x, dtype=np.float16)
    return {"u": f16(rng.normal(size=(batch, dim, L))),
            "delta": f16(REF.make_delta(rng, (batch, dim, L), p)),
            "A": REF.make_A(rng, (dim, N), p),
            "B": f16(rng.normal(size=(batch, N, L))), "C": f16(rng.normal(size=(batch, N, L))),
            "D": rng.normal(1.0, 0.5, size=dim).astype(np.float32),
            "z": f16(rng.normal(size=(batch, dim, L))),
            "delta_bias": REF.make_delta_bias(rng, (dim,), p)}, p


def entry_params(p):
    """The task entry's int arguments (the decay regime only shapes the inputs)."""
    return {k: p[k] for k in ("batch", "dim", "L", "N", "has_z", "softplus")}


def floor_bytes(p) -> int:
    return (2 * (p["batch"] * p["dim"] * p["L"] * (3 + p["has_z"]) + 2 * p["batch"] * p["N"] * p["L"])
            + 4 * (p["dim"] * p["N"] + 2 * p["dim"]))


# (batch, dim, L, N, has_z, softplus, decay): the task's GPU workloads; "small" keeps their
# lengths and regimes on a few channels (for compute-sanitizer, which is slow), plus N = 40.
CHECKS = {
    "full": [(1, 2048, 1, 16, 1, 1, "mixed"), (1, 2048, 512, 16, 1, 1, "mixed"),
             (1, 2048, 4096, 16, 1, 1, "mixed"), (1, 2048, 1000, 16, 1, 1, "mixed"),
             (2, 1024, 77, 16, 0, 0, "mixed"), (1, 256, 513, 16, 0, 1, "near0"),
             (1, 512, 4096, 16, 1, 1, "near1")],
    "small": [(1, 8, 1, 16, 1, 1, "mixed"), (1, 4, 4097, 16, 1, 1, "mixed"),
              (2, 3, 77, 16, 0, 0, "mixed"), (1, 4, 513, 16, 0, 1, "near0"),
              (1, 2, 1000, 16, 1, 1, "near1"), (1, 3, 300, 40, 1, 1, "mixed")],
}


def truth_torch(inp, p):
    import torch

    t = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)).cuda() for k, v in inp.items()}
    return REF.scan_torch(t, p, torch.float64)


def rel_err(got, want):
    import torch

    got = got.double()
    scale = want.abs().max()
    # Written as "not within", so that a NaN (an unwritten output keeps the NaN it was filled
    # with) counts as wrong: every comparison with NaN is false.
    bad = ~((got - want).abs() <= TOL * scale + TOL * want.abs())
    return float(((got - want).abs().max() / scale).item()), int(bad.sum().item())


# --------------------------------------------------------------------------------------------
# cuda


PTXAS = re.compile(r"Compiling entry function '(\w+)'.*?Used (\d+) registers.*?"
                   r"(\d+) bytes spill stores, (\d+) bytes spill loads", re.S)
PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")


def nvcc_build(nvcc: str, src: Path, out: Path) -> dict:
    root = Path(nvcc).resolve().parent.parent
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
           "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", str(src), "-o", str(out)]
    if (root / "lib").is_dir():
        cmd += [f"-L{root / 'lib'}"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    info = {"rc": proc.returncode, "seconds": time.time() - t0,
            "registers": [int(x) for x in PTXAS_REGS.findall(proc.stderr)],
            "spill_bytes": sum(int(a) + int(b) for _, a, b in PTXAS_SPILL.findall(proc.stderr)),
            "stack_bytes": max([int(s) for s, _, _ in PTXAS_SPILL.findall(proc.stderr)] or [0])}
    if proc.returncode:
        info["log"] = proc.stderr[-3000:]
    return info


# The cuda family's entry points take the task's layout; this one, appended to a rendered unit,
# launches the same kernels on mlx-lm's channel-last strides (ksm::set_layout(p, true)).
CHANNEL_LAST_ENTRY = r"""
extern "C" int selective_scan_channel_last_f16(
    const void* u, const void* delta, const void* A, const void* B, const void* C, const void* D,
    const void* z, const void* delta_bias, void* y, int64_t batch, int64_t dim, int64_t L,
    int64_t N, int64_t has_z, int64_t softplus, void* stream) {
  if (batch < 1 || dim < 1 || L < 1 || N < 1 || N > 64) return (int)cudaErrorInvalidValue;
  ksm::ScanArgs<__half> p;
  p.u = (const __half*)u; p.delta = (const __half*)delta; p.A = (const float*)A;
  p.B = (const __half*)B; p.C = (const __half*)C; p.D = (const float*)D;
  p.z = (const __half*)z; p.delta_bias = (const float*)delta_bias; p.y = (__half*)y;
  p.h0 = nullptr; p.h_last = nullptr;
  p.batch = batch; p.dim = dim; p.L = L; p.N = N;
  p.has_z = has_z != 0; p.softplus = softplus != 0;
  ksm::set_layout(p, true);
  const ksm::Launch l = ksm::scan_launch(batch, dim);
  const dim3 grid(l.grid_x, l.grid_y);
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 16) {
    ksm_scan_kernel<__half, 16><<<grid, l.block, 0, s>>>(p);
  } else {
    ksm_scan_kernel<__half, 64><<<grid, l.block, 0, s>>>(p);
  }
EPILOGUE
  return (int)cudaGetLastError();
}
"""
EPILOGUE_LAUNCH = """  const int64_t total = batch * dim * L;
  ksm_epilogue_kernel<__half><<<(unsigned int)((total + 255) / 256), 256, 0, s>>>(p);"""
LAYOUTS = ("task", "channel-last")
CHANNEL_LAST = ("u", "delta", "z", "B", "C")  # [b, x, L] -> [b, L, x]


def with_channel_last_entry(source: str, knobs: dict) -> str:
    epilogue = "" if knobs.get("fuse_epilogue") else EPILOGUE_LAUNCH
    return source + CHANNEL_LAST_ENTRY.replace("EPILOGUE", epilogue)


def run_cuda(args, variants):
    import ctypes

    import torch

    work = Path(tempfile.mkdtemp(prefix="ksm-cuda-"))
    fam = Family("selective-scan", "cuda")
    srcs = {}
    for (name, knobs), source in zip(variants.items(), fam.render_many(list(variants.values()))):
        srcs[name] = work / f"{name}.cu"
        srcs[name].write_text(with_channel_last_entry(source, knobs))
    with concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        builds = dict(zip(srcs, pool.map(lambda n: nvcc_build(args.nvcc, srcs[n], work / f"{n}.so"),
                                         srcs)))
    dev = torch.device("cuda")
    stream = torch.cuda.Stream()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    # Device bandwidth: a 1 GiB device-to-device copy, best of 5.
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    best = math.inf
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    bandwidth = 2 * a.numel() / best
    del a, b
    log(f"device bandwidth {bandwidth / 1e9:.0f} GB/s")
    checks = [(c, host_inputs(*c[:6], decay=c[6], seed=i)) for i, c in enumerate(CHECKS[args.checks])]
    truths = [truth_torch(inp, p) for _, (inp, p) in checks]
    out = {"bandwidth_gbs": bandwidth / 1e9, "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "variants": {}}
    for name, knobs in variants.items():
        row = {"knobs": knobs, "build": builds[name], "checks": [], "timings": {}}
        out["variants"][name] = row
        if builds[name]["rc"]:
            log(f"{name}: build failed")
            continue
        lib = ctypes.CDLL(str(work / f"{name}.so"))
        entries = {"task": lib.selective_scan_f16,
                   "channel-last": lib.selective_scan_channel_last_f16}
        for fn in entries.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 6 + [ctypes.c_void_p]

        def call(layout, t, p, y):
            ptr = lambda k: ctypes.c_void_p(t[k].data_ptr())
            return entries[layout](
                ptr("u"), ptr("delta"), ptr("A"), ptr("B"), ptr("C"), ptr("D"), ptr("z"),
                ptr("delta_bias"), ctypes.c_void_p(y.data_ptr()), p["batch"], p["dim"],
                p["L"], p["N"], p["has_z"], p["softplus"], ctypes.c_void_p(stream.cuda_stream))

        def device_inputs(inp, layout):
            t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in inp.items()}
            if layout == "channel-last":
                t.update({k: t[k].transpose(1, 2).contiguous() for k in CHANNEL_LAST})
            # The copies ran on the current stream, the kernel runs on `stream`.
            torch.cuda.synchronize()
            return t

        def task_layout(y, layout):
            return y if layout == "task" else y.transpose(1, 2)

        ok = True
        for layout in args.layouts:
            for (case, (inp, p)), want in zip(checks, truths):
                t = device_inputs(inp, layout)
                y = torch.full(t["u"].shape, float("nan"), dtype=torch.float16, device=dev)
                with torch.cuda.stream(stream):
                    rc = call(layout, t, p, y)
                stream.synchronize()
                err, bad = rel_err(task_layout(y, layout), want)
                row["checks"].append({"case": list(case), "layout": layout, "rc": rc,
                                      "max_rel_err": err, "bad": bad})
                ok = ok and rc == 0 and bad == 0
        row["correct"] = ok
        log(f"{name}: {'correct' if ok else 'WRONG'}; regs {builds[name]['registers']}, "
            f"spills {builds[name]['spill_bytes']} B")
        for layout in args.layouts if args.reps > 0 else ():
            timings = row["timings"] if layout == "task" else row.setdefault(
                "timings_channel_last", {})
            for L in args.lengths:
                inp, p = host_inputs(1, 2048, L, 16, seed=L)
                t = device_inputs(inp, layout)
                y = torch.empty(t["u"].shape, dtype=torch.float16, device=dev)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                samples = []
                for i in range(args.reps + 2):
                    flush.zero_()
                    torch.cuda.synchronize()
                    with torch.cuda.stream(stream):
                        start.record(stream)
                        call(layout, t, p, y)
                        end.record(stream)
                    end.synchronize()
                    if i >= 2:
                        samples.append(start.elapsed_time(end) * 1e3)
                us = statistics.median(samples)
                q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (us,) * 3
                floor = floor_bytes(p) / bandwidth * 1e6
                timings[str(L)] = {"us": us, "us_quartiles": [q1, q3], "floor_us": floor,
                                   "fraction_of_floor": floor / us}
            log(f"{name} ({layout}): " + ", ".join(f"L={L} {timings[str(L)]['us']:.1f} us"
                                                   for L in args.lengths))
    if args.reps == 0:
        return out
    # The task's timed reference and baseline at one length, for scale.
    inp, p = host_inputs(1, 2048, 512, 16, seed=1)
    t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in inp.items()}
    for label, fn in (("reference_torch_f32", lambda: REF.scan_torch(t, p, torch.float32)),
                      ("baseline_torch_loop", lambda: REF.loop_torch(t, p))):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out[f"{label}_L512_us"] = (time.perf_counter() - t0) * 1e6
    return out


# --------------------------------------------------------------------------------------------
# mlx


def run_mlx(args, variants):
    import mlx.core as mx
    import torch

    import mamba_model as mm

    if not mx.cuda.is_available():
        raise SystemExit("MLX runs without CUDA here")
    checks = [(c, host_inputs(*c[:6], decay=c[6], seed=i)) for i, c in enumerate(CHECKS[args.checks])]
    truths = [truth_torch(inp, p).cpu() for _, (inp, p) in checks]
    out = {"mlx": mx.__version__, "variants": {}}
    for name, knobs in variants.items():
        module, full = mm.render_module(knobs)
        row = {"knobs": full, "checks": [], "timings": {}}
        out["variants"][name] = row
        ok = True
        try:
            for (case, (inp, p)), want in zip(checks, truths):
                a = {k: mx.array(v) for k, v in inp.items()}
                y = module.selective_scan(**a, **entry_params(p))
                # The same scan channel-last with a zero state (the model's entry point).
                t = lambda v: mx.swapaxes(v, 1, 2)
                y2, _ = module.selective_scan_state(t(a["u"]), t(a["delta"]), a["A"], t(a["B"]),
                                                    t(a["C"]), a["D"], t(a["z"]), a["delta_bias"],
                                                    None, channel_last=True,
                                                    has_z=p["has_z"], softplus=p["softplus"])
                mx.eval(y, y2)
                err, bad = rel_err(torch.from_numpy(np.array(y.astype(mx.float32))), want)
                err2, bad2 = rel_err(torch.from_numpy(np.array(t(y2).astype(mx.float32))), want)
                row["checks"].append({"case": list(case), "max_rel_err": err, "bad": bad,
                                      "channel_last_max_rel_err": err2, "channel_last_bad": bad2})
                ok = ok and bad == 0 and bad2 == 0
        except Exception as e:  # a variant that does not compile under NVRTC is reported
            row["error"] = f"{type(e).__name__}: {e}"
            ok = False
        row["correct"] = ok
        log(f"{name}: {'correct' if ok else 'WRONG'} {row.get('error', '')}")
        if "error" in row or args.reps == 0:
            continue
        for L in args.lengths:
            inp, p = host_inputs(1, 2048, L, 16, seed=L)
            a = {k: mx.array(v) for k, v in inp.items()}
            cl = {k: (mx.swapaxes(v, 1, 2) if v.ndim == 3 else v) for k, v in a.items()}
            cl = {k: mx.contiguous(v) for k, v in cl.items()}
            mx.eval(a, cl)
            timings = {}
            for label, call in (
                    ("task", lambda: module.selective_scan(**a, **entry_params(p))),
                    ("channel_last", lambda: module.selective_scan_state(
                        cl["u"], cl["delta"], cl["A"], cl["B"], cl["C"], cl["D"], cl["z"],
                        cl["delta_bias"], None, channel_last=True)[0])):
                mx.eval(call())
                mx.synchronize()
                t0 = time.perf_counter()
                mx.eval([call() for _ in range(args.reps)])
                mx.synchronize()
                timings[label] = (time.perf_counter() - t0) / args.reps * 1e6
            row["timings"][str(L)] = timings
        log(f"{name}: " + ", ".join(f"L={L} {row['timings'][str(L)]['task']:.1f}/"
                                    f"{row['timings'][str(L)]['channel_last']:.1f} us"
                                    for L in args.lengths))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "mlx"), required=True)
    ap.add_argument("--variants", default="all", help="comma-separated names of variants.toml")
    ap.add_argument("--lengths", default="1,512,1024,2048,4096")
    ap.add_argument("--reps", type=int, default=20,
                    help="timed calls per length; 0: check only (under a sanitizer, say)")
    ap.add_argument("--layouts", default="task",
                    help="cuda: comma-separated layouts to check and time: task, channel-last")
    ap.add_argument("--checks", choices=sorted(CHECKS), default="full")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    if args.reps < 0:
        ap.error("--reps: 0 (check only) or more")
    args.layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    unknown = sorted(set(args.layouts) - set(LAYOUTS))
    if unknown or not args.layouts:
        ap.error(f"--layouts: {', '.join(unknown) or 'none given'}; known: {', '.join(LAYOUTS)}")
    named = Family("selective-scan", args.backend).variants(HERE / "variants.toml")
    names = list(named) if args.variants == "all" else args.variants.split(",")
    variants = {n: named[n] for n in names}
    result = run_cuda(args, variants) if args.backend == "cuda" else run_mlx(args, variants)
    result["backend"] = args.backend
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    wrong = [n for n, r in result["variants"].items() if not r.get("correct")]
    if wrong:
        log(f"incorrect or broken: {', '.join(wrong)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
