"""The rendered mlx module itself, without MLX: imported with a stand-in for `mlx.core`
(emu/fake_mlx.py) whose `mx.fast.cuda_kernel` compiles the module's own body strings the way
MLX's CUDA backend assembles a custom kernel and runs them on the CPU emulation, with MLX's
grid rule. This checks what the other tests cannot: the bodies (names, shapes, layouts,
template constants), the Python launch arithmetic, the epilogue pass and the decode kernel, for
the task entry, the stateful channel-last entry and one decode step."""

import numpy as np
import pytest

import emu  # noqa: E402
from conftest import MAMBA, model_constant  # noqa: E402
from fake_mlx import FakeMx  # noqa: E402
from ksearch_render import Family  # noqa: E402
from scan_ref import make_inputs, scan_ref  # noqa: E402

if emu.compiler() is None:
    pytest.skip("no C++20 compiler (g++ or $CXX) for the CPU emulation", allow_module_level=True)

VARIANTS = ["s0_sequential", "seq_lanes16_fused", "chunked_fused", "s6_vec", "tiled_c16_t256",
            "staged_l16_t256"]
KEYS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def load(name, tmp_path):
    path = tmp_path / f"{name}.py"
    fam = Family("selective-scan", "mlx")
    path.write_text(fam.render(fam.variants(MAMBA / "variants.toml")[name]))
    fake = FakeMx()
    return fake, fake.load(path, f"ksm_{name}")


def f16(inp):
    return {k: (v.astype(np.float16) if k in ("u", "delta", "B", "C", "z") else v)
            for k, v in inp.items()}


def ok(got, want, tol=2e-3):
    scale = np.abs(want).max()
    return np.all(np.abs(got.astype(np.float64) - want) <= tol * scale + tol * np.abs(want))


@pytest.mark.parametrize("name", VARIANTS)
def test_module_entries_on_the_emulation(name, tmp_path):
    fake, mod = load(name, tmp_path)
    names = [k.name for k in fake.kernels]
    assert len(set(names)) == len(names) and all(n.startswith("ksm_") for n in names)
    rng = np.random.default_rng(11)

    # The task's entry, [batch, dim, L], from a zero state; a length past one chunk.
    L = 1100 if mod.CHUNKED else 70
    inp = f16(make_inputs(rng, 2, 3, L, 16))
    arrays = {k: fake.array(inp[k]) for k in KEYS}
    y = mod.selective_scan(**arrays, batch=2, dim=3, L=L, N=16, has_z=1, softplus=1)
    assert y.shape == (2, 3, L) and y.dtype is fake.float16
    assert ok(y.np, scan_ref(**inp)[0])
    scan = fake.kernels[0]
    if mod.CHUNKED:
        grid = (3 * mod.THREADS, 2, 1)
    elif mod.TILED or mod.STAGED:
        grid = (-(-3 // mod.CHANNELS) * mod.THREADS, 2, 1)
    else:
        grid = (-(-2 * 3 * mod.LANES // mod.THREADS) * mod.THREADS, 1, 1)
    assert scan.calls[-1]["grid"] == grid
    assert ("NS", 16) in scan.calls[-1]["template"]
    # Without z and softplus.
    inp["delta"] = rng.uniform(0.01, 0.2, size=inp["delta"].shape).astype(np.float16)
    inp["delta_bias"] = rng.uniform(0.0, 0.05, size=3).astype(np.float32)
    arrays = {k: fake.array(inp[k]) for k in KEYS}
    y = mod.selective_scan(**arrays, batch=2, dim=3, L=L, N=16, has_z=0, softplus=0)
    assert ok(y.np, scan_ref(**inp, has_z=False, softplus_dt=False)[0])

    # The model's entry: channel-last, from a state, returning the last state.
    inp = f16(make_inputs(rng, 1, 5, 300, 16, regime="near1", channel_last=True, with_h0=True))
    a = {k: fake.array(inp[k]) for k in KEYS}
    y, h = mod.selective_scan_state(*(a[k] for k in KEYS), fake.array(inp["h0"]),
                                    channel_last=True)
    want_y, want_h = scan_ref(**inp, channel_last=True)
    assert y.shape == (1, 300, 5) and h.shape == (1, 5, 16) and h.dtype is fake.float32
    assert ok(y.np, want_y) and ok(h.np, want_h, 2e-4)
    # No state given: it starts from zeros.
    y0, _ = mod.selective_scan_state(*(a[k] for k in KEYS), None, channel_last=True)
    no_h0 = {k: v for k, v in inp.items() if k != "h0"}
    assert ok(y0.np, scan_ref(**no_h0, channel_last=True)[0])

    # One decode step from that state.
    step = f16(make_inputs(rng, 1, 5, 1, 16, channel_last=True))
    step["h0"] = want_h.astype(np.float32)
    two_d = {k: (step[k][:, 0] if k in ("u", "delta", "B", "C", "z") else step[k]) for k in KEYS}
    y1, h1 = mod.decode_step(*(fake.array(two_d[k]) for k in KEYS), fake.array(step["h0"]))
    want_y1, want_h1 = scan_ref(**step, channel_last=True)
    assert y1.shape == (1, 5) and ok(y1.np, want_y1[:, 0]) and ok(h1.np, want_h1, 2e-4)


@pytest.mark.parametrize("name", ["staged_l16_t256", "staged_l8_t128"])
@pytest.mark.parametrize("N", [8, 40])
def test_staged_walk_with_the_state_size_as_mlx_instantiates_it(name, N, tmp_path):
    """MLX compiles the body with NS = N exactly, not the cuda backend's 16 or 64: a state size
    below the lanes (64-step chunks, lanes with no state) and one between 32 and 64 (staged
    rows past N), channel-last from a state, over more than one chunk and a partial one."""
    fake, mod = load(name, tmp_path)
    rng = np.random.default_rng(N)
    inp = f16(make_inputs(rng, 2, 21, 150, N, channel_last=True, with_h0=True))
    a = {k: fake.array(inp[k]) for k in KEYS}
    y, h = mod.selective_scan_state(*(a[k] for k in KEYS), fake.array(inp["h0"]),
                                    channel_last=True)
    want_y, want_h = scan_ref(**inp, channel_last=True)
    assert ("NS", N) in fake.kernels[1].calls[-1]["template"]
    assert ok(y.np, want_y) and ok(h.np, want_h, 2e-4)


def test_the_auto_variants_fit_a_block_as_mlx_compiles_them(tmp_path):
    """MLX compiles a custom kernel without launch bounds, so the compiler may give a thread up
    to 255 registers, and a block of 512 threads cannot launch beyond 128. Every setting the
    bench's tuned scan tries (mamba_model.AUTO_VARIANTS) is compiled here as MLX assembles the
    stateful channel-last scan at mamba-370m's N = 16 (nvcc for sm_90a standing in for NVRTC):
    registers times threads must fit the 65 536 of a block. Skipped without nvcc."""
    import subprocess

    import cuda_compile

    nvcc = cuda_compile.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc ($NVCC, PATH, $CUDA_HOME or nvidia/cu13 in site-packages)")
    auto = model_constant("AUTO_VARIANTS")
    parts, threads = [cuda_compile.PRELUDE], {}
    for i, name in enumerate(auto):
        _, mod = load(name, tmp_path)
        threads[f"ksm_auto{i}"] = (name, mod.THREADS)
        parts.append(f"namespace v{i} {{\n{mod.HEADER}\n}}")
        body = mod.SCAN_STATE_BODY.replace("ksm::", f"v{i}::ksm::")
        ins = [(n, "float" if n in ("A", "D", "delta_bias", "h0") else "__half")
               for n in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")]
        parts.append(cuda_compile.kernel_source(
            f"ksm_auto{i}", body, ins, [("y", "__half"), ("h_last", "float")],
            [("T", "__half"), ("NS", 16), ("CHANNEL_LAST", True), ("HAS_Z", True),
             ("SOFTPLUS", True)]))
    src = tmp_path / "auto.cu"
    src.write_text("\n".join(parts))
    proc = subprocess.run([nvcc, "-cubin", "-std=c++17", "-arch=sm_90a", "-O3", "-Xptxas", "-v",
                           str(src), "-o", str(tmp_path / "auto.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = cuda_compile.parse_ptxas(proc.stderr + proc.stdout, list(threads))
    assert set(report) == set(threads), report
    for kernel, (name, n) in threads.items():
        regs = report[kernel]["registers"]
        assert regs * n <= 65536, f"{name}: {regs} registers x {n} threads"
