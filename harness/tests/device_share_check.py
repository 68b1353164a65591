"""Whether the judge can share device memory with an accused process on this GPU (not a test;
run by hand on a CUDA machine, CI has none):

    PYTHONPATH=harness python3 harness/tests/device_share_check.py [--mib 256] [--json out.json]

The judge allocates MIB of exportable device memory (device_share.create) and fills it; a
child launched in the accused's sandbox (sandbox.launch with accused_policy, then the stage-2
lock-down, as accused.py does before it maps anything) imports the descriptor, checks the
bytes and writes new ones; the judge checks those. For comparison the same is tried with
PyTorch's legacy CUDA IPC (cudaIpcGetMemHandle, what torch.multiprocessing uses). Prints what
worked, what each step cost, and the judge's device-side compare of MIB (torch.equal) against
a device-to-host copy of the same bytes, the step sharing replaces. Last, device_checks with
PyTorch on the device against core.py's host checks on outputs of 16M elements (f16, bf16, f32;
near the tolerance, one far element, NaN and infinities): the verdicts and error figures must
agree, and each side's time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "harness"))


def _child(args: argparse.Namespace) -> int:
    out: dict = {}
    try:
        import torch
        torch.zeros(1, device="cuda")
        from ksearch_harness import device_share, sandbox
        out["lockdown"] = sandbox.lock_down().to_json()
        if args.mode == "vmm":
            t0 = time.perf_counter()
            m = device_share.open_shared(args.fd, args.size)
            out["open_s"] = time.perf_counter() - t0
            v = m.tensor(0, args.size, torch.uint8, (args.size,))
        else:
            blob = b""
            with os.fdopen(args.fd, "rb") as f:
                blob = f.read()
            fn, fargs = pickle.loads(blob)
            t0 = time.perf_counter()
            v = fn(*fargs)
            out["open_s"] = time.perf_counter() - t0
        out["sum_seen"] = int(v.to(torch.int64).sum().item())
        v.add_(1)
        torch.cuda.synchronize()
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {e}"
        out["trace"] = traceback.format_exc()[-2000:]
    os.write(args.result_fd, json.dumps(out).encode())
    return 0


def _launch(mode: str, fd: int, size: int, workdir: str) -> dict:
    from ksearch_harness import sandbox
    from ksearch_harness.accused_client import accused_environment, accused_policy
    r, w = os.pipe()
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", mode,
            "--fd", str(fd), "--size", str(size), "--result-fd", str(w)]
    env = accused_environment(workdir, "cuda")
    env["PYTHONPATH"] = str(ROOT / "harness")
    policy = accused_policy("cuda", workdir, "best-effort", (str(ROOT),), 0, None)
    started = time.perf_counter()
    proc = sandbox.launch(argv, policy, env=env, pass_fds=(fd, w), cwd=workdir)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    code = proc.wait(timeout=120)
    res = json.loads(data) if data else {"ok": False, "error": "no answer"}
    res["exit"] = code
    res["wall_s"] = time.perf_counter() - started
    res["layers"] = [x.to_json() for x in proc.report]
    return res


def _checks_agree() -> list[dict]:
    import math
    import numpy as np
    import torch
    from ksearch_harness import core, device_checks, dtypes
    from ksearch_harness.protocol import Tolerance
    tol = Tolerance(rtol=2e-2, atol=2e-3)
    rng = np.random.default_rng(11)
    n = 1 << 24
    rows = []
    for name in ("f16", "bf16", "f32"):
        dt = dtypes.get(name)
        t = rng.standard_normal(n).astype(np.float32)
        t[[5, 6, 7]] = [np.nan, np.inf, -np.inf]
        truth = dt.decode_exact(dt.encode(t))
        for case in ("near", "far", "nan"):
            x = t * (1 + 1e-3 * rng.standard_normal(n)).astype(np.float32)
            x[[5, 6, 7]] = [np.nan, np.inf, -np.inf]
            if case == "far":
                x[1234] += 10.0
            if case == "nan":
                x[999] = np.nan
            stored = dt.encode(x)
            t0 = time.perf_counter()
            host = core.compare(dt.decode_exact(stored), truth, tol)
            host_s = time.perf_counter() - t0
            bits = torch.from_numpy(stored.view(np.dtype(f"i{stored.itemsize}"))).cuda()
            tdev = torch.from_numpy(truth).cuda()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ok, max_abs, max_rel = device_checks.compare(
                torch, device_checks.decode(bits, name), tdev, tol.atol, tol.rtol)
            dev_s = time.perf_counter() - t0
            same = (ok == host.ok and all(
                (math.isnan(a) and math.isnan(b)) or a == b
                for a, b in ((max_abs, host.max_abs), (max_rel, host.max_rel))))
            rows.append({"dtype": name, "case": case, "agree": same, "host_ok": host.ok,
                         "device_ok": ok, "host_s": host_s, "device_s": dev_s})
            print(f"checks {name} {case}: agree {same} (host {host.ok} {host.max_abs:.3g} "
                  f"{host.max_rel:.3g}, device {ok} {max_abs:.3g} {max_rel:.3g}); "
                  f"host {host_s * 1e3:.1f} ms, device {dev_s * 1e3:.1f} ms")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--mode", default="vmm")
    ap.add_argument("--fd", type=int, default=-1)
    ap.add_argument("--size", type=int, default=0)
    ap.add_argument("--result-fd", type=int, default=-1)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.child:
        return _child(args)

    import torch
    from ksearch_harness import device_share
    torch.zeros(1, device="cuda")
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    ok, why = device_share.available()
    report["available"] = {"ok": ok, "why": why}
    nbytes = args.mib << 20
    work = tempfile.mkdtemp(prefix="ksearch-share-")
    os.chmod(work, 0o777)

    def pattern(n: int):
        return (torch.arange(n, device="cuda", dtype=torch.int64) % 251).to(torch.uint8)

    if ok:
        t0 = time.perf_counter()
        m, fd = device_share.create(nbytes)
        report["create_s"] = time.perf_counter() - t0
        v = m.tensor(0, m.size, torch.uint8, (m.size,))
        v.copy_(pattern(m.size))
        torch.cuda.synchronize()
        want = int(v.to(torch.int64).sum().item())
        res = _launch("vmm", fd, m.size, work)
        os.close(fd)
        res["sum_expected"] = want
        res["judge_sees_write"] = bool(torch.equal(v, pattern(m.size) + 1))
        report["vmm"] = res
        # What sharing replaces: a device-to-host copy of the bytes and a host compare,
        # against a compare on the device.
        other = v.clone()
        timings: dict[str, list[float]] = {"device_equal_s": [], "d2h_s": []}
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            bool(torch.equal(v, other))
            timings["device_equal_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            v.cpu()
            timings["d2h_s"].append(time.perf_counter() - t0)
        report["costs"] = {k: sorted(x)[len(x) // 2] for k, x in timings.items()}
        del v, other
        m.close()

    legacy = pattern(nbytes)
    try:
        from torch.multiprocessing.reductions import reduce_tensor
        fn, fargs = reduce_tensor(legacy)
        r, w = os.pipe()
        blob = pickle.dumps((fn, fargs))
        os.set_inheritable(r, True)
        res = {}
        import threading
        writer = threading.Thread(target=lambda: (os.write(w, blob), os.close(w)))
        writer.start()
        res = _launch("legacy", r, nbytes, work)
        writer.join()
        os.close(r)
        res["judge_sees_write"] = bool(torch.equal(legacy, pattern(nbytes) + 1))
    except Exception as e:  # noqa: BLE001 - reported
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    report["legacy_ipc"] = res

    report["checks"] = _checks_agree()

    for key in ("vmm", "legacy_ipc"):
        if key in report:
            r = report[key]
            print(f"{key}: ok {r.get('ok')} judge sees the write {r.get('judge_sees_write')} "
                  f"open {r.get('open_s')} error {r.get('error')}")
    print(json.dumps({k: v for k, v in report.items() if k not in ("vmm", "legacy_ipc")}))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
