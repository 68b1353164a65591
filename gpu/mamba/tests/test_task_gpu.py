"""The selective-scan task's GPU side (task.toml [backends.cuda] / [backends.mlx] and the GPU
functions of reference.py), checked on the CPU: the workloads the issue asks for, the cpu
backend left as it was, the decay regimes, and every GPU reference and baseline computed with
PyTorch / MLX on the CPU against the float64 reference."""

import importlib.util
import tomllib

import numpy as np
import pytest

from conftest import REPO
from scan_ref import scan_ref

TASK_DIR = REPO / "tasks" / "selective-scan"
SPEC = tomllib.loads((TASK_DIR / "task.toml").read_text())


def _reference_module():
    spec = importlib.util.spec_from_file_location("ss_reference", TASK_DIR / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _reference_module()


def workloads(backend):
    return [w for w in SPEC["workloads"] if backend in w.get("backends", [backend])]


def test_cpu_backend_is_unchanged():
    """The cpu backend's shown workloads stay what the search was tuned on; its held-out ones
    vary what a kernel could assume (odd dims, state sizes, one step, softplus spikes)."""
    cpu = workloads("cpu")
    assert [(w["name"], w.get("held_out", False)) for w in cpu] == [
        ("b1d256l1024-z-softplus", False), ("b1d512l512-softplus", False),
        ("b1d1024l256-plain", False), ("b1d256l2048-z-softplus", False),
        ("b1d384l1000-z-softplus", True), ("b2d200l77-z", True),
        ("b3d7l61n5-z-softplus", True), ("b1d33l1001-softplus", True),
        ("b2d5l1n1-z", True), ("b1d17l257n7-z-softplus-spikes", True)]
    for w in cpu:
        assert "dtype" not in w["params"] and "decay" not in w["params"]
    assert SPEC["axes"]["dtype"]["default"] == "f32" and SPEC["axes"]["decay"]["default"] == "mixed"
    assert SPEC["backends"]["cpu"]["entry"] == "selective_scan_f32"
    # The roofline's bytes with elem_bytes = 4 are the old float32 formula.
    old = "4 * (batch * dim * L * (3 + has_z) + 2 * batch * N * L + dim * N + 2 * dim)"
    for w in cpu:
        p = dict(w["params"], elem_bytes=4)
        assert eval(SPEC["roofline"]["bytes"], {}, p) == eval(old, {}, p)


def test_gpu_workloads_cover_the_issue():
    for backend in ("cuda", "mlx"):
        ws = workloads(backend)
        shown = [w["params"] for w in ws if not w.get("held_out")]
        assert sorted(p["L"] for p in shown) == [1, 512, 1024, 2048, 4096]
        for p in shown:
            assert (p["batch"], p["dim"], p["N"], p["has_z"], p["softplus"], p["dtype"]) == (
                1, 2048, 16, 1, 1, "f16")
        held = [w["params"] for w in ws if w.get("held_out")]
        assert {p.get("decay", "mixed") for p in held} == {"mixed", "near0", "near1"}
        # Lengths that are not a multiple of any power-of-two chunk.
        assert any(p["L"] % 2 for p in held) and any(p["L"] % 64 for p in held)
        assert any(p["L"] >= 4096 and p.get("decay") == "near1" for p in held)
        assert all(p["dtype"] == "f16" for p in shown + held)
    assert SPEC["tolerance"]["f16"] == {"rtol": 2e-3, "atol": 2e-3}


def test_decay_regimes():
    rng = np.random.default_rng(0)
    for regime, lo, hi, typical in (("near0", 0.0, 0.45, 0.01), ("near1", 0.75, 1.0, 0.98)):
        p = {"softplus": 1, "decay": regime}
        delta = ref.make_delta(rng, (1, 256, 2048), p)
        bias = ref.make_delta_bias(rng, (256,), p)
        A = ref.make_A(rng, (256, 16), p)
        dt = np.log1p(np.exp(delta.astype(np.float64) + bias[None, :, None]))
        decay = np.exp(dt[0, :, :, None] * A[:, None, :])
        assert lo < decay.min() and decay.max() < hi
        assert np.median(decay) < typical if regime == "near0" else np.median(decay) > typical
    with pytest.raises(ValueError, match="softplus"):
        ref.make_delta(rng, (1, 2, 3), {"softplus": 0, "decay": "near1"})
    with pytest.raises(ValueError, match="unknown decay"):
        ref.make_delta(rng, (1, 2, 3), {"softplus": 1, "decay": "slow"})
    # Without a regime the draws are the cpu backend's, value for value.
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    assert np.array_equal(ref.make_delta(a, (2, 3), {"softplus": 1}),
                          b.normal(-2.0, 1.0, size=(2, 3)).astype(np.float32))


def inputs(batch, dim, L, N, has_z, softplus, decay="mixed", seed=0):
    rng = np.random.default_rng(seed)
    p = {"batch": batch, "dim": dim, "L": L, "N": N, "has_z": has_z, "softplus": softplus}
    if decay != "mixed":
        p["decay"] = decay
    f16 = lambda x: np.asarray(x, dtype=np.float16)
    inp = {"u": f16(rng.normal(size=(batch, dim, L))),
           "delta": f16(ref.make_delta(rng, (batch, dim, L), p)),
           "A": ref.make_A(rng, (dim, N), p),
           "B": f16(rng.normal(size=(batch, N, L))), "C": f16(rng.normal(size=(batch, N, L))),
           "D": rng.normal(1.0, 0.5, size=dim).astype(np.float32),
           "z": f16(rng.normal(size=(batch, dim, L))),
           "delta_bias": ref.make_delta_bias(rng, (dim,), p)}
    return inp, p


CASES = [(2, 5, 77, 16, 1, 1, "mixed"), (1, 7, 300, 16, 0, 0, "mixed"),
         (1, 4, 513, 16, 0, 1, "near0"), (1, 3, 1000, 16, 1, 1, "near1"), (1, 6, 1, 16, 1, 1, "mixed")]


@pytest.mark.parametrize("case", CASES)
def test_blocked_truth_and_the_state_reference(case, monkeypatch):
    inp, p = inputs(*case)
    full = ref.reference(inp, p)["y"]
    assert np.array_equal(ref.reference_blocked(inp, p)["y"], full)
    monkeypatch.setattr(ref, "_TRUTH_BLOCK", 500)     # a few channels per block
    assert np.array_equal(ref.reference_blocked(inp, p)["y"], full)
    y, _ = scan_ref(**inp, has_z=bool(p["has_z"]), softplus_dt=bool(p["softplus"]))
    assert np.abs(y - full).max() <= 1e-6 * np.abs(full).max()


@pytest.mark.parametrize("case", CASES)
def test_torch_reference_and_baseline(case):
    torch = pytest.importorskip("torch", reason="the cuda backend's reference uses PyTorch")
    inp, p = inputs(*case)
    want = ref._scan(inp, p, np.float64)
    scale = np.abs(want).max()
    t64 = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in inp.items()}
    t32 = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in inp.items()}
    assert np.abs(ref.scan_torch(t64, p, torch.float64).numpy() - want).max() <= 1e-9 * scale
    assert np.abs(ref.scan_torch(t32, p, torch.float32).numpy() - want).max() <= 2e-6 * scale
    assert np.abs(ref.loop_torch(t32, p).numpy() - want).max() <= 2e-6 * scale


@pytest.mark.parametrize("case", CASES)
def test_mlx_reference_and_baseline(case):
    mx = pytest.importorskip("mlx.core", reason="the mlx backend's reference uses MLX")
    inp, p = inputs(*case)
    want = ref._scan(inp, p, np.float64)
    scale = np.abs(want).max()
    a = {k: mx.array(np.asarray(v, dtype=np.float32)) for k, v in inp.items()}
    assert np.abs(np.array(ref.scan_mlx(a, p)) - want).max() <= 2e-6 * scale
    assert np.abs(np.array(ref.loop_mlx(a, p)) - want).max() <= 2e-6 * scale
