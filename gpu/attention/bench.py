"""Correctness and timing of the attention-gpu variants on the GPU, against PyTorch SDPA and MLX native.

Run on the device (the H200), from gpu/attention/:
    python bench.py --build-dir ../../.gpu-build --json "$OUT/bench.json"

For each workload (issue shapes + held-out shapes with L not a multiple of 64), dtype and causal
flag it measures PyTorch SDPA and mx.fast.scaled_dot_product_attention, then each variant through
the cuda backend (the prebuilt .so, extern "C" attention_f16/bf16) and the chosen ones through the
mlx backend (mlx_attention.MlxAttention). Every candidate output is checked against SDPA computed
in f32 on the same inputs (max|err| <= tol * max|ref|, tol 2e-3 f16, 1.6e-2 bf16), with the output
poisoned with NaN before the call.

Timing: cuda/torch with CUDA events, one pair per repetition, after an L2 flush (256 MB write) and
a device-wide synchronize; median of --reps. MLX: wall clock around `out = f(); mx.eval(out);
mx.synchronize()` after warm-up and an L2 flush, inputs created on the GPU by mx.random; median.
TFLOP/s counts 4*B*H*L^2*D, halved when causal. Ratios are baseline_time / our_time (>1: faster).

MLX's cost per call: `--mlx-shapes B,H,L,D ...` times the picks through mlx on more shapes (short
sequences, many heads: where a call costs most next to its work), and `--mlx-compiled` times each
mlx call also through mx.compile, interleaved with the plain call (`extra.compiled` of its row):
how much of the per-call cost a candidate removes by compiling its call.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import family
from family import HERE

TOL = {"f16": 2e-3, "bf16": 1.6e-2}
TORCH_DT = {"f16": torch.float16, "bf16": torch.bfloat16}
ISSUE_SHAPES = [(1, 32, 4096, 128), (4, 32, 1024, 128), (1, 32, 4096, 64), (8, 32, 512, 128)]
HELD_OUT = [(2, 8, 1000, 64), (1, 16, 777, 128), (3, 4, 130, 128), (1, 4, 33, 64), (2, 3, 1, 64)]
MAIN = (1, 32, 4096, 128)
MAIN64 = (1, 32, 4096, 64)
LADDER = ["s0_naive", "s1_tiled", "s2_tiled_exp2", "s3_tiled_kt", "s4_mma", "s5_mma_cpasync", "s6_mma_tile",
          "s7_causal_skip", "s8_wgmma", "s9_wgmma_overlap"]


def flops(B, H, L, D, causal):
    f = 4.0 * B * H * L * L * D
    return f / 2 if causal else f


def shape_name(s):
    return "B{}H{}L{}D{}".format(*s)


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def passed(self):
        return time.monotonic() > self.end


# ------------------------------------------------------------------------------------------- cuda
class CudaVariant:
    def __init__(self, name, so_path):
        self.name = name
        self.lib = ctypes.CDLL(str(so_path))
        self.fns = {}
        for dt in ("f16", "bf16"):
            fn = getattr(self.lib, f"attention_{dt}")
            fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 5 + [ctypes.c_void_p]
            fn.restype = ctypes.c_int
            self.fns[dt] = fn

    def __call__(self, dt, q, k, v, out, causal):
        B, H, L, D = q.shape
        rc = self.fns[dt](q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), B, H, L, D, int(causal),
                          ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if rc != 0:
            raise RuntimeError(f"{self.name}: attention_{dt} returned CUDA error {rc}")


def time_torch(fn, reps, flush, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        flush.zero_()
        torch.cuda.synchronize()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def check(out, ref, dt):
    if not torch.isfinite(out).all():
        return False, float("nan"), "non-finite output (unwritten or NaN)"
    err = (out.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    rel = err / max(scale, 1e-30)
    return rel <= TOL[dt], rel, ""


# -------------------------------------------------------------------------------------------- mlx
def try_mlx():
    try:
        import mlx.core as mx

        if not mx.cuda.is_available():
            return None
        return mx
    except Exception as e:  # noqa: BLE001 - any import failure means "no mlx column"
        print(f"[mlx] unavailable: {e!r}", flush=True)
        return None


def time_mlx(mx, fn, reps, flush_state, warmup=5):
    for _ in range(warmup):
        mx.eval(fn())
    mx.synchronize()
    ts = []
    for _ in range(reps):
        flush_state[0] = flush_state[0] + 1.0
        mx.eval(flush_state[0])
        mx.synchronize()
        t0 = time.perf_counter()
        out = fn()
        mx.eval(out)
        mx.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def time_mlx_interleaved(mx, fns, reps, flush_state, warmup=5):
    """time_mlx of several callables, one repetition of each in turn (the order rotating), so
    a drifting clock or cache weighs on all of them alike. Returns one list of ms per fn."""
    for fn in fns:
        for _ in range(warmup):
            mx.eval(fn())
    mx.synchronize()
    ts = [[] for _ in fns]
    for r in range(reps):
        for j in range(len(fns)):
            i = (r + j) % len(fns)
            flush_state[0] = flush_state[0] + 1.0
            mx.eval(flush_state[0])
            mx.synchronize()
            t0 = time.perf_counter()
            out = fns[i]()
            mx.eval(out)
            mx.synchronize()
            ts[i].append((time.perf_counter() - t0) * 1e3)
    return ts


def time_mlx_chain(mx, fn, n=10):
    """n calls in one eval: amortises per-eval dispatch overhead (no flush between calls)."""
    mx.eval(*[fn() for _ in range(2)])
    mx.synchronize()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        outs = [fn() for _ in range(n)]
        mx.eval(*outs)
        mx.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3 / n)
    return min(ts)


def compiled_call(mx, impl, q, k, v, causal, plain, reps, flush_state, ref, dt):
    """The same kernel called through mx.compile (which replays the traced call: no Python
    wrapper and no kernel source assembled per call), timed interleaved with the plain call,
    and its output checked. What part of MLX's per-call cost a candidate can remove this way."""
    compiled = mx.compile(lambda a, b, c: impl(a, b, c, causal))
    f = lambda: compiled(q, k, v)  # noqa: E731
    out = f()
    mx.eval(out)
    ok, rel, why = check(mlx_to_torch(mx, out), ref, dt)
    plain_ts, comp_ts = time_mlx_interleaved(mx, [plain, f], reps, flush_state)
    return {"ok": ok, "max_rel_err": rel, "why": why,
            "ms": statistics.median(comp_ts), "plain_ms": statistics.median(plain_ts),
            "ms_range": [min(comp_ts), max(comp_ts)],
            "plain_ms_range": [min(plain_ts), max(plain_ts)],
            "chain_ms": time_mlx_chain(mx, f), "plain_chain_ms": time_mlx_chain(mx, plain)}


def mlx_to_torch(mx, a):
    import numpy as np

    return torch.from_numpy(np.array(a.astype(mx.float32))).cuda()


# ------------------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", type=Path, default=HERE.parent.parent / ".gpu-build")
    ap.add_argument("--variants", type=Path, default=HERE / "variants.toml")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=420, help="stop starting new measurements after this")
    ap.add_argument("--no-mlx", action="store_true")
    ap.add_argument("--quick", action="store_true", help="main shape f16 only")
    ap.add_argument("--smoke", action="store_true", help="all variants, main shape and tails, cuda only")
    ap.add_argument("--sanitize", action="store_true",
                    help="correctness only, small tail shapes, no timing (for compute-sanitizer)")
    ap.add_argument("--check-shapes", nargs="*", metavar="B,H,L,D",
                    help="with --sanitize: these shapes, each in f16 and bf16, causal and not, instead of "
                         "the three default configurations")
    ap.add_argument("--only", nargs="*", help="restrict to these variants")
    ap.add_argument("--mlx-extra", nargs="*", default=["s7_causal_skip"], help="variants always run through mlx")
    ap.add_argument("--mlx-shapes", nargs="*", metavar="B,H,L,D",
                    help="after the picks, time them through mlx on these shapes (f16, causal and not)")
    ap.add_argument("--mlx-compiled", action="store_true",
                    help="also time each mlx call through mx.compile, interleaved with the plain call")
    args = ap.parse_args(argv)

    deadline = Deadline(args.budget_s)
    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    knobs = family.load_variants(args.variants)
    if args.only:
        knobs = {k: v for k, v in knobs.items() if k in args.only}
    mx = None if args.no_mlx else try_mlx()
    meta = {
        "device": dev.name, "sms": dev.multi_processor_count, "torch": torch.__version__,
        "cuda": torch.version.cuda, "mlx": getattr(mx, "__version__", None) if mx else None,
        "reps": args.reps, "argv": sys.argv[1:], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(json.dumps(meta), flush=True)

    variants, load_errors = {}, {}
    for name in knobs:
        so = args.build_dir / f"{name}.so"
        try:
            variants[name] = CudaVariant(name, so)
        except OSError as e:
            load_errors[name] = str(e)
            print(f"[load] {name}: {e}", flush=True)

    rows = []
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    mlx_flush = [mx.zeros((256 * 1024 * 1024 // 4,), dtype=mx.float32)] if mx else None
    mlx_impls = {}

    def save():
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"meta": meta, "load_errors": load_errors, "rows": rows}, indent=1))

    def run_config(shape, dt, causal, cuda_names, mlx_names, held_out):
        B, H, L, D = shape
        tdt = TORCH_DT[dt]
        q, k, v = (torch.randn(shape, device="cuda", dtype=tdt) for _ in range(3))
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
        fl = flops(B, H, L, D, causal)
        base = {"shape": shape_name(shape), "B": B, "H": H, "L": L, "D": D, "dtype": dt, "causal": bool(causal),
                "held_out": held_out, "flops": fl}
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))  # noqa: E731
        ok, rel, _ = check(sdpa(), ref, dt)
        sdpa_ms = statistics.median(time_torch(sdpa, args.reps, flush))
        rows.append(dict(base, impl="torch_sdpa", backend="torch", ms=sdpa_ms, tflops=fl / sdpa_ms / 1e9,
                         ok=ok, rel_err=rel))
        mlx_ms = None
        if mx is not None:
            mdt = mx.float16 if dt == "f16" else mx.bfloat16
            mq, mk, mv = (mx.random.normal(shape).astype(mdt) for _ in range(3))
            mx.eval(mq, mk, mv)
            mref = F.scaled_dot_product_attention(*(mlx_to_torch(mx, a) for a in (mq, mk, mv)),
                                                  is_causal=bool(causal))
            native = lambda: mx.fast.scaled_dot_product_attention(  # noqa: E731
                mq, mk, mv, scale=1.0 / math.sqrt(D), mask="causal" if causal else None)
            nok, nrel, _ = check(mlx_to_torch(mx, native()), mref, dt)
            mlx_ms = statistics.median(time_mlx(mx, native, args.reps, mlx_flush))
            rows.append(dict(base, impl="mlx_native", backend="mlx", ms=mlx_ms, tflops=fl / mlx_ms / 1e9, ok=nok,
                             rel_err=nrel, chain_ms=time_mlx_chain(mx, native)))
        print(f"\n== {base['shape']} {dt} causal={int(causal)}{' held-out' if held_out else ''}: "
              f"sdpa {sdpa_ms:.3f} ms ({fl / sdpa_ms / 1e9:.0f} TF/s)"
              + (f", mlx native {mlx_ms:.3f} ms ({fl / mlx_ms / 1e9:.0f} TF/s)" if mlx_ms else ""), flush=True)

        def record(name, backend, ms, ok, rel, err="", extra=None):
            r = dict(base, impl=name, backend=backend, ms=ms, ok=ok, rel_err=rel, error=err)
            if ms:
                r.update(tflops=fl / ms / 1e9, vs_sdpa=sdpa_ms / ms, vs_mlx=(mlx_ms / ms) if mlx_ms else None)
            r.update(extra or {})
            rows.append(r)
            if ms:
                print(f"  {name:<20} {backend:<4} {ms:8.3f} ms {fl / ms / 1e9:6.1f} TF/s  x{sdpa_ms / ms:5.2f} sdpa"
                      + (f"  x{mlx_ms / ms:5.2f} mlx" if mlx_ms else "") + f"  err {rel:.1e} {'ok' if ok else 'FAIL'}",
                      flush=True)
            else:
                print(f"  {name:<20} {backend:<4} {'-':>8}             {err}", flush=True)

        for name in cuda_names:
            if name not in variants:
                continue
            if deadline.passed():
                record(name, "cuda", None, False, None, "skipped: time budget")
                continue
            fn = variants[name]
            out = torch.full_like(q, float("nan"))
            try:
                fn(dt, q, k, v, out, causal)
                torch.cuda.synchronize()
                ok, rel, why = check(out, ref, dt)
                # A slow variant gets fewer repetitions so the ladder fits the lease.
                t0 = time.perf_counter()
                fn(dt, q, k, v, out, causal)
                torch.cuda.synchronize()
                one = time.perf_counter() - t0
                reps = args.reps if one < 0.02 else max(5, min(args.reps, int(1.0 / one)))
                ms = statistics.median(time_torch(lambda: fn(dt, q, k, v, out, causal), reps, flush, warmup=1))
                ok2, rel2, _ = check(out, ref, dt)  # the timed calls' output too
                record(name, "cuda", ms, ok and ok2, max(rel, rel2), why, {"reps": reps})
            except Exception as e:  # noqa: BLE001 - record and go on: one bad variant must not end the run
                record(name, "cuda", None, False, None, repr(e)[:300])
                torch.cuda.synchronize()

        if mx is not None:
            for name in mlx_names:
                if deadline.passed():
                    record(name, "mlx", None, False, None, "skipped: time budget")
                    continue
                try:
                    from mlx_attention import MlxAttention

                    impl = mlx_impls.get(name) or mlx_impls.setdefault(name, MlxAttention(knobs[name]))
                    f = lambda: impl(mq, mk, mv, bool(causal))  # noqa: E731
                    t0 = time.perf_counter()
                    res = f()
                    mx.eval(res)
                    first = time.perf_counter() - t0
                    ok, rel, why = check(mlx_to_torch(mx, res), mref, dt)
                    ms = statistics.median(time_mlx(mx, f, args.reps, mlx_flush))
                    extra = {"chain_ms": time_mlx_chain(mx, f), "first_call_s": first,
                             "kernel": impl.source_hash}
                    if args.mlx_compiled:
                        extra["compiled"] = compiled_call(mx, impl, mq, mk, mv, bool(causal), f,
                                                          args.reps, mlx_flush, mref, dt)
                    record(name, "mlx", ms, ok, rel, why, extra)
                except Exception as e:  # noqa: BLE001
                    record(name, "mlx", None, False, None, repr(e)[:500])
        save()

    sweep = [n for n in knobs if n not in LADDER]
    mma_all = ["s4_mma", "s5_mma_cpasync", "s6_mma_tile", "s7_causal_skip", "s8_wgmma", "s9_wgmma_overlap"] + sweep

    def best(shape, dt, causal):
        # The fastest cuda kernel that the mlx backend can also run (the picks go through mlx;
        # the TMA producer is cuda only).
        cands = [r for r in rows if r["shape"] == shape_name(shape) and r["dtype"] == dt and r["causal"] == causal
                 and r["backend"] == "cuda" and r.get("ok") and r.get("ms") and family.on_mlx(knobs[r["impl"]])]
        return min(cands, key=lambda r: r["ms"])["impl"] if cands else "s7_causal_skip"

    picks = {}
    if args.sanitize:
        configs = [((3, 4, 130, 128), "bf16", 1), ((1, 4, 33, 64), "f16", 0), ((2, 2, 200, 64), "f16", 1)]
        if args.check_shapes:
            configs = [(tuple(int(x) for x in s.split(",")), dt, causal)
                       for s in args.check_shapes for dt in ("f16", "bf16") for causal in (0, 1)]
        failed = 0
        for shape, dt, causal in configs:
            q, k, v = (torch.randn(shape, device="cuda", dtype=TORCH_DT[dt]) for _ in range(3))
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
            for name, fn in variants.items():
                # The name goes out before the launch: a kernel that hangs is the last line's.
                print(f"[sanitize] {name} {shape_name(shape)} {dt} c{causal}: ", end="", flush=True)
                out = torch.full_like(q, float("nan"))
                try:
                    fn(dt, q, k, v, out, causal)
                    torch.cuda.synchronize()
                    ok, rel, why = check(out, ref, dt)
                except Exception as e:  # noqa: BLE001 - report it, count it, go on with the next one
                    ok, rel, why = False, float("nan"), repr(e)[:200]
                failed += not ok
                print(f"{'ok' if ok else 'FAIL'} {rel:.1e} {why}", flush=True)
        print(f"[sanitize] {len(configs) * len(variants)} checks, {failed} failed", flush=True)
        return 1 if failed else 0
    if args.smoke:
        # Every variant on the main shape and on tails, few repetitions, cuda only.
        for shape, dt, causal in [(MAIN, "f16", 0), (MAIN, "f16", 1), ((3, 4, 130, 128), "bf16", 1),
                                  ((1, 4, 33, 64), "f16", 0), ((2, 8, 1000, 64), "bf16", 1), ((2, 3, 1, 64), "f16", 1)]:
            run_config(shape, dt, causal, list(knobs), [], shape != MAIN)
        save()
        return 0
    # 1. main shapes f16: the whole ladder and sweep on cuda (D=128), the tensor-core sweep (D=64);
    #    the fastest correct variant per (causal, D) is the pick, measured through mlx too.
    for causal in (0, 1):
        run_config(MAIN, "f16", causal, LADDER + sweep, [], False)
        run_config(MAIN64, "f16", causal, mma_all, [], False)
        picks[(causal, 128)] = best(MAIN, "f16", causal)
        picks[(causal, 64)] = best(MAIN64, "f16", causal)
        run_config(MAIN, "f16", causal, [], list(dict.fromkeys([picks[(causal, 128)]] + args.mlx_extra)), False)
    meta["picks"] = {f"causal={c},D={d}": p for (c, d), p in picks.items()}
    print(f"\n[picks] {meta['picks']}", flush=True)
    # --mlx-shapes: the picks through mlx (and MLX native, SDPA) on the shapes given, f16.
    for spec in args.mlx_shapes or []:
        shape = tuple(int(x) for x in spec.split(","))
        for causal in (0, 1):
            if not deadline.passed():
                names = list(dict.fromkeys([picks[(causal, shape[3])]] + args.mlx_extra))
                run_config(shape, "f16", causal, [], names, False)
    if not args.quick:
        # 2. every issue shape in f16 and bf16, and the held-out shapes: the picks on both backends.
        todo = [(s, dt) for dt in ("f16", "bf16") for s in ISSUE_SHAPES + HELD_OUT if (s, dt) != (MAIN, "f16")]
        for shape, dt in todo:
            for causal in (0, 1):
                if deadline.passed():
                    print(f"[budget] skipped {shape_name(shape)} {dt} c{causal}", flush=True)
                    continue
                names = list(dict.fromkeys([picks[(causal, shape[3])]] + args.mlx_extra))
                run_config(shape, dt, causal, names, names, shape in HELD_OUT)
        # 3. the rest of the mma sweep on the other issue shapes, while the budget lasts.
        for shape in [s for s in ISSUE_SHAPES if s not in (MAIN, MAIN64)]:
            for causal in (0, 1):
                rest = [n for n in mma_all if n not in (picks[(causal, shape[3])], *args.mlx_extra)]
                if not deadline.passed():
                    run_config(shape, "f16", causal, rest, [], False)
    save()

    # Summary: the issue's target line.
    print("\n== summary (B1 H32 L4096 D128 f16)")
    for causal in (0, 1):
        for r in rows:
            if r["shape"] == shape_name(MAIN) and r["dtype"] == "f16" and r["causal"] == bool(causal) \
                    and r["impl"] in (picks.get((causal, 128)), "mlx_native", "torch_sdpa") and r.get("ms"):
                print(f"  causal={causal} {r['impl']:<18} {r['backend']:<5} {r['ms']:.3f} ms "
                      f"vs_mlx={r.get('vs_mlx')} vs_sdpa={r.get('vs_sdpa')} ok={r['ok']}")
    bad = [r for r in rows if r.get("ms") and not r.get("ok")]
    print(f"\nrows={len(rows)} incorrect={len(bad)}: " + ", ".join(
        f"{r['impl']}/{r['backend']}/{r['shape']}/{r['dtype']}/c{int(r['causal'])}" for r in bad[:20]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
