"""GPU smoke test of the cuda and mlx backends through the real harness code, for a machine with
an NVIDIA GPU, PyTorch, nvcc and (optionally) mlx. Not collected by pytest (CI has no GPU).

    PYTHONPATH=harness python3 harness/tests/gpu_smoke.py [--json out.json] [--skip-mlx]

It evaluates the attention task's seeds (tasks/attention/seed/naive.cu, naive_mlx.py) on small
f16/bf16 workloads against the task's own reference.py (PyTorch/MLX references, SDPA
baselines), and a few cheats built from the seed: work on a side stream, work on the legacy
default stream, an illegal address (a sticky error: that harness process dies, the next one
works), a module calling MLX's native attention, one returning a non-array. Each case prints
its verdict; the exit status is 1 if any case differs from its expectation.

Two paths are used. "in-process" runs worker.execute with the adapter's device roofline, which
is what core.py needs for GPU floors. "process" runs `python -m ksearch_harness evaluate`
exactly as ksearch does; until core.py takes its roofline from the adapter (docs/backends.md,
"Integration"), a process-path evaluation of an honest kernel may end in `impossible_time`
because the floor is computed from the host CPU; those cases are reported, not judged.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import driver  # noqa: E402
from ksearch_harness import worker  # noqa: E402
from ksearch_harness.adapters import device  # noqa: E402
from ksearch_harness.protocol import Entry, parse_request  # noqa: E402

TASK_DIR = REPO / "tasks" / "attention"
SEED_CU = (TASK_DIR / "seed" / "naive.cu").read_text()
SEED_MLX = (TASK_DIR / "seed" / "naive_mlx.py").read_text()
ARGS = ["q", "k", "v", "out", "B", "H", "L", "D", "causal"]
TOLERANCE = {"f16": {"rtol": 2e-3, "atol": 2e-3}, "bf16": {"rtol": 1.6e-2, "atol": 1.6e-2},
             "f32": {"rtol": 2e-5, "atol": 1e-5}}

# (B, H, L, D, causal, held_out)
F16 = [(1, 4, 256, 64, 0, False), (1, 4, 256, 128, 1, False), (1, 2, 100, 64, 1, True)]
BF16 = [(2, 2, 128, 64, 1, False), (1, 4, 256, 128, 0, False), (1, 3, 77, 128, 0, True)]


def workload(B, H, L, D, causal, held_out, dtype):
    shape = [B, H, L, D]
    normal = {"kind": "normal", "mean": 0.0, "std": 1.0}
    return {"name": f"b{B}h{H}l{L}d{D}-{dtype}{'-causal' if causal else ''}",
            "held_out": held_out,
            "params": {"B": B, "H": H, "L": L, "D": D, "causal": causal, "dtype": dtype},
            "inputs": [{"name": n, "dtype": dtype, "shape": shape, "dist": normal}
                       for n in ("q", "k", "v")],
            "outputs": [{"name": "out", "dtype": dtype, "shape": shape}],
            "flops": 4.0 * B * H * L * L * D / (1 + causal),
            "bytes": 4.0 * 2 * B * H * L * D}


def request(backend, candidate, build_dir, shapes, dtype, symbol):
    if backend == "cuda":
        ref, base = "reference_torch", "baseline_torch_sdpa"
        entry = {"symbol": symbol, "args": ARGS}
        language = "cuda"
        forbidden = ["reference", "reference_torch", "baseline_torch_sdpa"]
    else:
        ref, base = "reference_mlx", "baseline_mlx_native"
        entry = {"symbol": symbol, "args": [a for a in ARGS if a != "out"]}
        language = "python"
        forbidden = ["reference", "reference_mlx", "baseline_mlx_native",
                     "scaled_dot_product_attention"]
    return {
        "protocol": 1, "op": "evaluate", "nonce": driver.NONCE,
        "secret_seed": int.from_bytes(os.urandom(6), "little"), "backend": backend,
        "task": {"name": "attention", "dir": str(TASK_DIR),
                 "reference": {"module": "reference.py", "function": ref},
                 "baseline": {"name": base.removeprefix("baseline_"), "function": base},
                 "entry": entry, "forbidden": forbidden},
        "candidate": {"path": str(candidate), "language": language},
        "build_dir": str(build_dir),
        "workloads": [workload(*s, dtype) for s in shapes],
        "tolerance": TOLERANCE,
        "correctness": {"trials": 2},
        "timing": {"warmup": 1, "min_reps": 3, "max_reps": 5, "target_seconds": 0.05,
                   "flush_bytes": 64 << 20},
        "timeout_s": 400,
    }


# -- cheats derived from the seed --------------------------------------------------------------

SPIN = """
__global__ void ksmoke_spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
static cudaStream_t ksmoke_side() {
  static cudaStream_t s = 0;
  if (!s) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  return s;
}
"""
LAUNCH = "naive_attention<T, D><<<(unsigned)blocks, threads, 0, stream>>>("


def seed_variant(kind: str) -> str:
    src = SEED_CU.replace("template <typename T, int D>\nstatic int launch",
                          SPIN + "\ntemplate <typename T, int D>\nstatic int launch", 1)
    assert LAUNCH in src, "the seed's launch line changed; update gpu_smoke.py"
    if kind == "side_stream":
        # Delayed work on a stream of its own, never joined back into `stream`.
        new = ("ksmoke_spin<<<1, 1, 0, ksmoke_side()>>>(20000000LL);\n  "
               "naive_attention<T, D><<<(unsigned)blocks, threads, 0, ksmoke_side()>>>(")
    elif kind == "default_stream":
        # Ignores `stream` and launches on the legacy default stream.
        new = ("ksmoke_spin<<<1, 1, 0, 0>>>(20000000LL);\n  "
               "naive_attention<T, D><<<(unsigned)blocks, threads, 0, 0>>>(")
    elif kind == "writes_input":
        # Zeroes the first bytes of `q` after its kernel: inputs are read-only (on the cuda
        # backend they live in device memory the judge shares and checks on the device).
        tail = "  return (int)cudaGetLastError();"
        assert src.count(tail) == 1, "the seed's launch changed; update gpu_smoke.py"
        return src.replace(tail, "  cudaMemsetAsync((void*)q, 0, 64, stream);\n" + tail, 1)
    elif kind == "illegal_address":
        return src.replace("(T*)out, rows", "(T*)out + (1LL << 40), rows", 1)
    elif kind == "escape_attempts":
        # The cpu corpus's sandbox escapes (tests/cheats/escape_attempts.c), tried from a cuda
        # accused, whose sandbox differs (device files, a unix socket, writes in its /proc).
        return ESCAPES + src.replace(LAUNCH, "ksmoke_escape();\n  " + LAUNCH, 1)
    elif kind == "timer_patch":
        # On its first call, reaches the interpreter of its process through the Python C API
        # (names built at run time) and makes CUDA events report a tenth of the truth.
        return TIMER_PATCH + src.replace(LAUNCH, "ksmoke_patch();\n  " + LAUNCH, 1)
    else:
        raise ValueError(kind)
    return src.replace(LAUNCH, new, 1)


_ESCAPE_C = (HERE / "cheats" / "escape_attempts.c").read_text()
ESCAPES = (_ESCAPE_C[_ESCAPE_C.index("#define _GNU_SOURCE"):_ESCAPE_C.index("void softmax_f32")]
           .replace("#define _GNU_SOURCE\n", "")
           + "static void ksmoke_escape() {\n  static int done = 0;\n"
           "  if (!done) { done = 1; attempts(); }\n}\n")

TIMER_PATCH = r"""
#define KSMOKE_J(a, b) a##b
extern "C" void* KSMOKE_J(dl, sym)(void* handle, const char* name);
static void ksmoke_name(char* out, const char* shifted) {
  int i = 0;
  for (; shifted[i]; ++i) out[i] = (char)(shifted[i] - 1);
  out[i] = 0;
}
static void ksmoke_patch() {
  static int done = 0;
  if (done) return;
  done = 1;
  char ensure[64], run[64], release[64];
  ksmoke_name(ensure, "QzHJMTubuf`Fotvsf");
  ksmoke_name(run, "QzSvo`TjnqmfTusjoh");
  ksmoke_name(release, "QzHJMTubuf`Sfmfbtf");
  int (*gil_ensure)() = (int (*)())KSMOKE_J(dl, sym)(0, ensure);
  int (*run_string)(const char*) = (int (*)(const char*))KSMOKE_J(dl, sym)(0, run);
  void (*gil_release)(int) = (void (*)(int))KSMOKE_J(dl, sym)(0, release);
  if (!gil_ensure || !run_string || !gil_release) return;
  int state = gil_ensure();
  run_string("import torch\n_e = torch.cuda.Event.elapsed_time\n"
             "torch.cuda.Event.elapsed_time = lambda s, e: _e(s, e) / 10\n");
  gil_release(state);
}
"""

MLX_NATIVE = """
import math
import mlx.core as mx


def attention(*, q, k, v, B, H, L, D, causal):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(D),
                                                mask="causal" if causal else None)
"""

MLX_LIST = SEED_MLX.replace("    return out\n", "    return [out]\n")

# MLX's native attention reached at run time under a name built from pieces: the static checks
# do not see it; the kernel audit must.
MLX_HIDDEN_NATIVE = """
import math
import operator
import mlx.core as mx

_OP = operator.attrgetter("scaled_dot_" + "product_attention")(mx.fast)


def attention(*, q, k, v, B, H, L, D, causal):
    return _OP(q, k, v, scale=1 / math.sqrt(D), mask="causal" if causal else None)
"""


# -- running -----------------------------------------------------------------------------------


class Cases:
    def __init__(self, root: Path, only: list[str] | None = None):
        self.root = root
        self.rows: list[dict] = []
        self.only = only or []

    def path(self, name: str, text: str, suffix: str) -> Path:
        p = self.root / f"{name}{suffix}"
        p.write_text(text)
        return p

    def record(self, name, path_kind, result, expect, judged=True):
        status = result.get("status")
        cls = (result.get("violation") or {}).get("class")
        got = f"{status}/{cls}" if cls else status
        ok = (not judged) or got in expect
        row = {"case": name, "path": path_kind, "got": got, "expect": expect, "ok": ok,
               "judged": judged, "message": (result.get("message") or "")[:300]}
        ws = [w for w in result.get("workloads", []) if w.get("candidate_median_ns")]
        row["timings"] = [
            {"workload": w["name"], "candidate_us": w["candidate_median_ns"] / 1e3,
             "baseline_us": (w.get("baseline_median_ns") or 0) / 1e3,
             "reference_us": (w.get("reference_median_ns") or 0) / 1e3,
             "max_abs_err": w.get("max_abs_err")} for w in ws]
        env = result.get("environment") or {}
        row["roofline"] = {k: env.get(k) for k in ("mem_bandwidth_gbs", "peak_gflops")}
        row["handshake"] = env.get("handshake")
        row["sandbox"] = {x["name"]: x["active"] for x in result.get("sandbox") or []}
        row["kernel_audit"] = result.get("kernel_audit")
        row["phase_seconds"] = (result.get("diagnostics") or {}).get("phase_seconds")
        if isinstance(result.get("build"), dict) and result["build"].get("ptxas"):
            row["ptxas"] = [(k["name"][:60], k["registers"], k["spill_store_bytes"])
                            for k in result["build"]["ptxas"]["kernels"]]
        self.rows.append(row)
        mark = "ok  " if ok else "FAIL"
        if not judged:
            mark = "info"
        print(f"[{mark}] {name:32s} {path_kind:10s} {got:40s} expect {' | '.join(expect)}",
              flush=True)
        if not ok or not judged:
            print(f"       {row['message']}", flush=True)
        if row["sandbox"]:
            off = [n for n, a in row["sandbox"].items() if not a]
            print(f"       sandbox: {len(row['sandbox']) - len(off)} layers active"
                  f"{'; inactive: ' + ', '.join(off) if off else ''}", flush=True)
        if row["kernel_audit"]:
            ka = row["kernel_audit"]
            print(f"       kernel audit: {'on' if ka.get('active') else 'off'} "
                  f"({ka.get('detail')}); kernels: {ka.get('kernels')}", flush=True)
        if row["handshake"]:
            print(f"       round trip: median {row['handshake']['median_ns'] / 1e3:.1f} us, "
                  f"p95 {row['handshake']['p95_ns'] / 1e3:.1f} us; phases "
                  f"{row['phase_seconds']}", flush=True)
        for t in row["timings"]:
            print(f"       {t['workload']:28s} cand {t['candidate_us']:9.1f} us  base "
                  f"{t['baseline_us']:8.1f} us  ref {t['reference_us']:8.1f} us  err "
                  f"{t['max_abs_err']:.2e}", flush=True)

    def wanted(self, name: str) -> bool:
        return not self.only or any(part in name for part in self.only)

    def in_process(self, name, raw, expect, roofline, entry=None):
        if not self.wanted(name):
            return {}
        req = parse_request(raw, "evaluate")
        if entry is not None:
            req = dataclasses.replace(req, task=dataclasses.replace(req.task, entry=entry))
        t0 = time.monotonic()
        try:
            result = worker.execute(req, roofline_override=roofline)
        finally:
            device.deactivate()
        print(f"       ({time.monotonic() - t0:.1f} s)", flush=True)
        self.record(name, "in-process", result, expect)
        return result

    def process(self, name, raw, expect, judged=True):
        if not self.wanted(name):
            return {}
        t0 = time.monotonic()
        run = driver.run_harness("evaluate", raw, timeout=raw["timeout_s"] + 60)
        result = run.result or {"status": run.verdict, "message": run.stderr[-300:]}
        print(f"       ({time.monotonic() - t0:.1f} s)", flush=True)
        self.record(name, "process", result, expect, judged)
        return result


def device_roofline(backend: str) -> tuple[float, float]:
    from ksearch_harness.adapters import create
    raw = request(backend, "/dev/null", "/tmp", F16[:1], "f16", "x")
    adapter = create(parse_request(raw, "evaluate"))
    try:
        bw, peak = adapter.roofline()
    finally:
        device.deactivate()
    print(f"[{backend}] device roofline: {bw / 1e9:.0f} GB/s, {peak / 1e12:.0f} TFLOP/s "
          f"(f16 matmul)", flush=True)
    return bw, peak


def run_cuda(c: Cases) -> None:
    import torch
    print(f"[cuda] torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    roof = device_roofline("cuda")
    seed = c.path("seed", SEED_CU, ".cu")
    passed = ["passed"]

    c.in_process("seed f16", request("cuda", seed, c.root / "b1", F16, "f16", "attention_f16"),
                 passed, roof)
    # f16 and bf16 in one request, through the `{dtype}` entry (protocol.py does not accept
    # the placeholder yet, so the parsed request gets it afterwards).
    mixed = request("cuda", seed, c.root / "b2", F16[:1] + BF16, "f16", "attention_f16")
    mixed["workloads"] = [workload(*F16[0], "f16")] + [workload(*s, "bf16") for s in BF16]
    c.in_process("seed f16+bf16 {dtype}", mixed, passed, roof,
                 entry=Entry("attention_{dtype}", tuple(ARGS)))
    c.process("seed f16", request("cuda", seed, c.root / "b3", F16, "f16", "attention_f16"),
              ["passed", "integrity_violation/impossible_time"], judged=False)

    deferred = ["integrity_violation/deferred_work"]
    for kind in ("side_stream", "default_stream"):
        src = c.path(kind, seed_variant(kind), ".cu")
        c.process(f"cheat {kind}", request("cuda", src, c.root / f"b-{kind}", F16, "f16",
                                           "attention_f16"), deferred)
    src = c.path("writes_input", seed_variant("writes_input"), ".cu")
    c.process("cheat writes its input", request("cuda", src, c.root / "b-wi", F16, "f16",
                                                "attention_f16"),
              ["integrity_violation/input_mutated"])
    escapes = c.path("escapes", seed_variant("escape_attempts"), ".cu")
    result = c.process("cheat escape attempts", request("cuda", escapes, c.root / "b-esc", F16,
                                                        "f16", "attention_f16"), ["passed"])
    # GPU accused processes have no address-space limit (CUDA reserves far more than it uses;
    # the memory cgroup bounds what is touched), so reserving 64 GiB succeeds by design.
    escaped = [e for e in re.findall(r"^ESCAPE (\w+) ok$", result.get("log_tail", ""), re.M)
               if e != "reserve_64gib"]
    if result and (escaped or "LEAKED" in result.get("log_tail", "")):
        c.rows[-1]["ok"] = False
        print(f"[FAIL] the cuda accused managed {escaped}", flush=True)
    patched = c.path("timer_patch", seed_variant("timer_patch"), ".cu")
    # Calls of several milliseconds: a tenth of that falls short of the judge's window by far
    # more than round trips vary, whereas calls under a millisecond can hide within a round
    # trip's slack (docs/results/evaluation-speed).
    raw = request("cuda", patched, c.root / "b-timer", [(1, 4, 512, 128, 0, False)], "f16",
                  "attention_f16")
    raw["timing"].update(min_reps=8, max_reps=8)
    c.process("cheat patched event clock", raw, ["integrity_violation/timer_tampering"])
    bad = c.path("illegal", seed_variant("illegal_address"), ".cu")
    c.process("illegal address (sticky)", request("cuda", bad, c.root / "b-ill", F16, "f16",
                                                 "attention_f16"), ["runtime_error"])
    # The next evaluation runs in a fresh process, unaffected.
    after = c.process("seed after the sticky error", request(
        "cuda", seed, c.root / "b4", F16[:1], "f16", "attention_f16"),
        ["passed", "integrity_violation/impossible_time"], judged=False)
    if not after:
        return
    c.rows[-1]["ok"] = after.get("status") != "runtime_error"
    if not c.rows[-1]["ok"]:
        print("[FAIL] the evaluation after the sticky error failed too", flush=True)


def run_mlx(c: Cases) -> None:
    os.environ.setdefault("MLX_ENABLE_TF32", "0")
    import mlx.core as mx
    if not mx.cuda.is_available():
        print("[mlx] MLX runs without CUDA here; skipping", flush=True)
        return
    print(f"[mlx] mlx {mx.__version__}", flush=True)
    roof = device_roofline("mlx")
    seed = c.path("seed_mlx", SEED_MLX, ".py")
    c.in_process("mlx seed f16", request("mlx", seed, c.root / "m1", F16, "f16", "attention"),
                 ["passed"], roof)
    c.in_process("mlx seed bf16", request("mlx", seed, c.root / "m2", BF16, "bf16",
                                          "attention"), ["passed"], roof)
    native = c.path("mlx_native", MLX_NATIVE, ".py")
    c.in_process("mlx cheat native attention", request("mlx", native, c.root / "m3", F16, "f16",
                                                       "attention"),
                 ["static_check_failed/reference_call"], roof)
    hidden = c.path("mlx_hidden_native", MLX_HIDDEN_NATIVE, ".py")
    c.in_process("mlx cheat hidden native attention",
                 request("mlx", hidden, c.root / "m6", F16, "f16", "attention"),
                 ["integrity_violation/forbidden_kernel"], roof)
    lazy = c.path("mlx_list", MLX_LIST, ".py")
    c.in_process("mlx cheat non-array output", request("mlx", lazy, c.root / "m4", F16, "f16",
                                                       "attention"),
                 ["integrity_violation/lazy_output"], roof)
    c.process("mlx seed f16", request("mlx", seed, c.root / "m5", F16, "f16", "attention"),
              ["passed", "integrity_violation/impossible_time"], judged=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write every case's result here")
    ap.add_argument("--skip-mlx", action="store_true")
    ap.add_argument("--skip-cuda", action="store_true")
    ap.add_argument("--cases", nargs="*", help="run only the cases whose names contain one of "
                                               "these")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ksearch-gpu-smoke-"))
    cases = Cases(root, args.cases)
    for name, fn, skip in (("cuda", run_cuda, args.skip_cuda), ("mlx", run_mlx, args.skip_mlx)):
        if skip:
            continue
        try:
            fn(cases)
        except Exception:  # noqa: BLE001 - report and go on to the other backend
            traceback.print_exc()
            cases.rows.append({"case": f"{name} setup", "ok": False, "judged": True})
    failed = [r for r in cases.rows if r.get("judged", True) and not r["ok"]]
    print(f"\n{len(cases.rows)} cases, {len(failed)} failed; work dir {root}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(cases.rows, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
