"""model_kernels.py's kernels themselves, without MLX: the module runs on the stand-in for
`mlx.core` (emu/fake_mlx.py), its kernels on the CPU emulation. The one-kernel decode against the
four-kernel one (to the bit, any grid), its grid barrier on its own (every block sees every
other block's writes of the previous phase, over several barriers and launches; without it they
do not; a block that never arrives makes the others give up and poison the state), and, where
nvcc is installed, every model kernel compiled for sm_90a as MLX would assemble it. Needs a
C++20 compiler (g++); nvcc for the last test."""

import time

import numpy as np
import pytest

import emu  # noqa: E402

if emu.compiler() is None:
    pytest.skip("no C++20 compiler (g++ or $CXX) for the CPU emulation", allow_module_level=True)

from conftest import MAMBA  # noqa: E402
from fake_mlx import FakeMx  # noqa: E402


@pytest.fixture(scope="module")
def fake():
    f = FakeMx()
    return f, f.load(MAMBA / "model_kernels.py", "ksm_model_kernels_direct")


def block_inputs(f, dtype, batch=2, DM=64, DI=128, N=16, R=4, K=4, seed=0):
    rng = np.random.default_rng(seed)
    t = lambda *s: f.array((rng.normal(size=s) * 0.3).astype(dtype))
    f32 = lambda a: f.array(np.asarray(a, dtype=np.float32))
    return [t(batch, DM), t(DM), f32([1e-5]), t(2 * DI, DM), t(batch, K - 1, DI), t(DI, K, 1),
            t(DI), t(R + 2 * N, DI), t(DI, R), f32(rng.normal(size=DI)),
            f32(-np.exp(rng.normal(size=(DI, N)))), f32(rng.normal(size=DI)), t(DM, DI),
            f32(rng.normal(size=(batch, DI, N)))]


@pytest.mark.parametrize("dtype,DM,DI,grids", [(np.float32, 64, 128, (1, 3, 7)),
                                               (np.float16, 64, 128, (1, 3, 7)),
                                               (np.float16, 256, 512, (2, 5))],
                         ids=["f32", "f16", "f16-vector-rows"])
def test_one_kernel_decode_equals_the_four_kernels(fake, dtype, DM, DI, grids):
    """Same phases, same order of summation: the same bits, for grids of 1 to 7 blocks (7
    blocks have more warps than x_proj has rows); rows of a multiple of 256 take the loads-first
    product (warp_dot_n), shorter ones the plain one. The barrier state ends where it began but
    for the generation, which moved once per barrier."""
    f, mod = fake
    args = block_inputs(f, dtype, DM=DM, DI=DI)
    want = mod.fused_decode(*args)
    for blocks in grids:
        barrier, poison = mod.grid_state(), mod.grid_state()
        for launch in (1, 2):
            got = mod.fused_layer_decode(*args, barrier, poison, blocks=blocks, with_status=True)
            for g, w in zip(got[:3], want):
                assert g.shape == w.shape and g.dtype == w.dtype
                assert np.array_equal(g.np, w.np), blocks
            assert got[3].np.tolist() == [0] * blocks
            assert barrier.np.tolist() == [0, 3 * launch, 0, 0]
            assert poison.np.tolist() == [0, 0, 0, 0] and not mod.grid_failed(poison)


def stacked_inputs(f, dtype, layers, batch=2, DM=64, DI=128, seed=0):
    """block_inputs of `layers` blocks (different weights each) and their stacked form:
    (x, [per-layer argument lists without x], stacked arguments without x)."""
    per = [block_inputs(f, dtype, batch=batch, DM=DM, DI=DI, seed=seed + i) for i in range(layers)]
    x = per[0][0]
    rest = [p[1:] for p in per]
    stack = [f.array(np.stack([np.asarray(r[k].np) for r in rest]).reshape(
        (layers,) + (rest[0][k].shape if k != 1 else ()))) for k in range(len(rest[0]))]
    return x, rest, stack


@pytest.mark.parametrize("dtype,DM,DI,layers,grids", [(np.float32, 64, 128, 3, (1, 4)),
                                                      (np.float16, 64, 128, 2, (3,)),
                                                      (np.float16, 256, 512, 2, (2,))],
                         ids=["f32", "f16", "f16-vector-rows"])
def test_the_model_kernel_equals_a_layer_launch_per_block(fake, dtype, DM, DI, layers, grids):
    """The whole-model decode against fused_layer_decode launched block after block, each
    feeding the next its residual stream: the same bits for the output, every block's conv
    cache and state. Its barrier state moves four generations per block but one (three within
    a block, one between blocks) and ends with its count at 0."""
    f, mod = fake
    x, rest, stack = stacked_inputs(f, dtype, layers, DM=DM, DI=DI)
    xs, caches, states = x, [], []
    for args in rest:
        xs, c, h = mod.fused_layer_decode(xs, *args, mod.grid_state(), mod.grid_state(),
                                          blocks=2)
        caches.append(c.np)
        states.append(h.np)
    for blocks in grids:
        barrier, poison = mod.grid_state(), mod.grid_state()
        for launch in (1, 2):
            out, cache, state, status = mod.fused_model_decode(x, *stack, barrier, poison,
                                                               blocks=blocks, with_status=True)
            assert out.shape == xs.shape and out.dtype == xs.dtype
            assert np.array_equal(out.np, xs.np), blocks
            assert cache.shape == (layers,) + caches[0].shape
            assert np.array_equal(cache.np, np.stack(caches))
            assert state.dtype == f.float32 and np.array_equal(state.np, np.stack(states))
            assert status.np.tolist() == [0] * blocks
            assert barrier.np.tolist() == [0, (4 * layers - 1) * launch, 0, 0]
            assert not mod.grid_failed(poison)


def test_the_model_kernel_checks_its_stacks(fake):
    f, mod = fake
    x, _, stack = stacked_inputs(f, np.float32, 2)
    with pytest.raises(ValueError, match="layer count 2: w_out"):
        mod.fused_model_decode(x, *stack[:-2], f.array(stack[-2].np[:1]), stack[-1],
                               mod.grid_state(), mod.grid_state(), blocks=2)
    short_eps = list(stack)
    short_eps[1] = f.array(np.zeros((2, 1), np.float32))
    with pytest.raises(ValueError, match="eps"):
        mod.fused_model_decode(x, *short_eps, mod.grid_state(), mod.grid_state(), blocks=2)
    with pytest.raises(ValueError, match="barrier must be a uint32"):
        mod.fused_model_decode(x, *stack, f.zeros((4,)), mod.grid_state(), blocks=2)


def test_the_four_kernels_need_no_state_and_the_one_kernel_checks_it(fake):
    f, mod = fake
    args = block_inputs(f, np.float32)
    with pytest.raises(ValueError, match="uint32 \\[4\\]"):
        mod.fused_layer_decode(*args, f.zeros((4,)), mod.grid_state(), blocks=2)
    with pytest.raises(ValueError, match="blocks >= 1"):
        mod.fused_layer_decode(*args, mod.grid_state(), mod.grid_state(), blocks=2, spin_limit=0)
    assert mod.sm_count() == mod.DEFAULT_BLOCKS  # the stand-in has no device_info


def test_sm_count_matches_known_names_as_whole_words(fake, monkeypatch):
    _, mod = fake
    for name, want in (("NVIDIA H200", 132), ("NVIDIA A100-SXM4-80GB", 108),
                       ("NVIDIA RTX A1000", mod.DEFAULT_BLOCKS), ("NVIDIA H100 PCIe", 114),
                       ("NVIDIA GH200 480GB", 132)):
        monkeypatch.setattr(mod.mx, "device_info", lambda n=name: {"device_name": n},
                            raising=False)
        assert mod.sm_count() == want, name
    monkeypatch.setattr(mod.mx, "device_info", lambda: {"device_name": "x", "num_sms": 7},
                        raising=False)
    assert mod.sm_count() == 7


# Each block marks every phase and, after the barrier, counts the blocks whose mark of that
# phase it cannot see. SKIP: a block that leaves before its first barrier (-1: none).
BARRIER_BODY = r"""
  unsigned int* const bar = const_cast<unsigned int*>(barrier);
  unsigned int* const bad = const_cast<unsigned int*>(poison);
  const int G = gridDim.x;
  int failed = ksm_model::grid_begin<ON>(bad);
  int errors = 0;
  for (int p = 0; p < PHASES; ++p) {
    if ((int)blockIdx.x == SKIP) return;
    if (threadIdx.x == 0) marks[p * G + blockIdx.x] = p + 1;
    ksm_model::grid_sync<ON, LIMIT>(bar, bad, failed);
    if (threadIdx.x == 0) {
      for (int j = 0; j < G; ++j) errors += marks[p * G + j] != p + 1;
    }
  }
  if (threadIdx.x == 0) {
    status[blockIdx.x] = failed;
    errs[blockIdx.x] = errors;
  }
"""


def barrier_kernel(f, mod):
    return f.fast.cuda_kernel(name="ksm_barrier_test", input_names=["barrier", "poison"],
                              output_names=["marks", "status", "errs"], source=BARRIER_BODY,
                              header=mod.HEADER)


def run_barrier(f, kernel, barrier, poison, blocks, phases=5, on=True, skip=-1,
                limit=1 << 20, threads=64):
    marks, status, errs = kernel(
        inputs=[barrier, poison], template=[("ON", on), ("PHASES", phases), ("SKIP", skip),
                                            ("LIMIT", limit)],
        grid=(blocks * threads, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=[(phases * blocks,), (blocks,), (blocks,)],
        output_dtypes=[f.int32, f.int32, f.int32])
    return status.np.tolist(), errs.np.tolist()


def test_the_grid_barrier_orders_the_phases(fake):
    """Five barriers per launch, two launches on one state: every block sees every mark of the
    phase before, the count is back at 0 after each launch, the generation moved once per
    barrier. The same kernel without the barrier (ON = false) misses marks."""
    f, mod = fake
    kernel = barrier_kernel(f, mod)
    for blocks in (1, 2, 5):
        barrier, poison = mod.grid_state(), mod.grid_state()
        for launch in (1, 2):
            status, errs = run_barrier(f, kernel, barrier, poison, blocks)
            assert status == [0] * blocks and errs == [0] * blocks
            assert barrier.np.tolist() == [0, 5 * launch, 0, 0]
    status, errs = run_barrier(f, kernel, mod.grid_state(), mod.grid_state(), 5, on=False)
    assert sum(errs) > 0


def test_a_block_that_never_arrives_makes_the_others_give_up(fake):
    """Block 1 leaves before the first barrier: blocks 0 and 2 wait, give up (the emulation
    fast-forwards a grid in which every block only polls to the spin limit, as the device gets
    there by polling), report it in status and poison the state. A later launch on the poisoned
    state skips its waits: every block reports failure at once and the count is untouched."""
    f, mod = fake
    kernel = barrier_kernel(f, mod)
    barrier, poison = mod.grid_state(), mod.grid_state()
    t0 = time.perf_counter()
    status, errs = run_barrier(f, kernel, barrier, poison, 3, skip=1)
    assert time.perf_counter() - t0 < 60
    assert status[0] == status[2] == 1 and errs[0] > 0 and errs[2] > 0
    assert barrier.np.tolist()[0] == 2 and poison.np.tolist() == [1, 0, 0, 0]
    assert mod.grid_failed(poison)
    status, _ = run_barrier(f, kernel, barrier, poison, 3)
    assert status == [1, 1, 1] and barrier.np.tolist()[0] == 2


def test_the_spin_limit_counts_polls_not_arrivals(fake):
    """A limit of one poll is still enough when the last block arrives before the waiter's
    next look (the generation is checked before the limit), and a block that waits for a
    block the emulated GPU cannot hold times out at that limit."""
    f, mod = fake
    kernel = barrier_kernel(f, mod)
    barrier, poison = mod.grid_state(), mod.grid_state()
    status, errs = run_barrier(f, kernel, barrier, poison, 3, limit=1)
    assert status == [0, 0, 0] and errs == [0, 0, 0] and poison.np.tolist()[0] == 0
    f.resident_blocks = 2
    try:
        status, _ = run_barrier(f, kernel, mod.grid_state(), poison, 3, limit=3)
    finally:
        f.resident_blocks = 0
    assert status == [1, 1, 1] and poison.np.tolist()[0] == 1


def test_model_kernels_compile_for_sm90a():
    """Every model kernel, assembled as MLX's CUDA backend assembles a custom kernel, compiled
    by nvcc for sm_90a (f16, mamba-370m's shapes): no errors, no spills, no stack. Skipped
    without nvcc; `python gpu/mamba/cuda_compile.py` prints the same report."""
    import cuda_compile

    nvcc = cuda_compile.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc ($NVCC, PATH, $CUDA_HOME or nvidia/cu13 in site-packages)")
    report = cuda_compile.build(nvcc)
    assert report["rc"] == 0, report.get("log")
    kernels = report["kernels"]
    assert set(kernels) == {"ksm_conv_silu", "ksm_ssm_step", "ksm_in_conv", "ksm_xproj",
                            "ksm_out_res", "ksm_layer", "ksm_model"}
    for name, k in kernels.items():
        assert k["spill_store_bytes"] == k["spill_load_bytes"] == k["stack_bytes"] == 0, name
    # One block per SM must always fit: 256 threads, a few KB of shared memory.
    for name in ("ksm_layer", "ksm_model"):
        assert kernels[name]["registers"] <= 255
        assert kernels[name]["smem_bytes"] <= 48 * 1024
