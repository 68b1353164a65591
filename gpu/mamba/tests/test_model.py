"""mlx-lm's Mamba with our scan (mamba_model.py), on MLX's CPU backend with a tiny config: the
chunked MLX-ops scan against the float64 recurrence (odd lengths, extreme decays, a state in and
out), the patched model against stock mlx-lm (prefill and step-by-step decode through the cache,
and our compiled forward), a candidate with only the task's entry point, and the bench's logits
check refusing a broken scan. Needs mlx and mlx-lm (mambapy and torch for the last test)."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="needs mlx (pip install 'mlx[cpu]==0.32.4')")
# find_spec, not an import: importing mlx_lm runs its __init__, which pulls in transformers.
if importlib.util.find_spec("mlx_lm") is None:
    pytest.skip("needs mlx-lm (pip install --no-deps mlx-lm==0.32.2)", allow_module_level=True)

import bench  # noqa: E402
import mamba_model as mm  # noqa: E402
from scan_ref import make_inputs, scan_ref  # noqa: E402


def to_mx(inp, keys=("u", "delta", "A", "B", "C", "D", "z", "delta_bias")):
    return [mx.array(inp[k]) for k in keys]


@pytest.mark.parametrize("L,chunk,regime", [(1, 64, "mixed"), (77, 16, "mixed"),
                                            (130, 64, "near1"), (65, 8, "near0"),
                                            (200, 200, "mixed")])
def test_ops_scan_equals_the_recurrence(L, chunk, regime):
    rng = np.random.default_rng(L)
    inp = make_inputs(rng, 2, 5, L, 16, regime=regime, channel_last=True, with_h0=True)
    scan = mm.MlxOpsScan(chunk=chunk)
    for h0 in (None, mx.array(inp["h0"])):
        y, h = scan(*to_mx(inp), h0)
        want = dict(inp) if h0 is not None else {k: v for k, v in inp.items() if k != "h0"}
        wy, wh = scan_ref(**want, channel_last=True)
        scale = np.abs(wy).max()
        assert np.abs(np.array(y) - wy).max() <= 2e-5 * scale
        assert np.abs(np.array(h) - wh).max() <= 2e-5 * max(1.0, np.abs(wh).max())


def test_task_entry_candidate_gets_state_in_closed_form():
    """A candidate with only `selective_scan` (zero state, [batch, dim, L]) still serves the
    model: y from a non-zero h0 and the final state follow from cumulative log-decays."""
    ops = mm.MlxOpsScan()

    class Candidate:
        @staticmethod
        def selective_scan(*, u, delta, A, B, C, D, z, delta_bias, batch, dim, L, N, has_z,
                           softplus):
            t = lambda v: mx.swapaxes(v, 1, 2)
            y, _ = ops(t(u), t(delta), A, t(B), t(C), D, t(z), delta_bias, None)
            return t(y)

    scan = mm.TaskEntryScan(Candidate)
    rng = np.random.default_rng(5)
    inp = make_inputs(rng, 1, 6, 90, 16, channel_last=True, with_h0=True)
    y, h = scan(*to_mx(inp), mx.array(inp["h0"]))
    wy, wh = scan_ref(**inp, channel_last=True)
    assert np.abs(np.array(y) - wy).max() <= 1e-4 * np.abs(wy).max()
    assert np.abs(np.array(h) - wh).max() <= 1e-4 * np.abs(wh).max()


@pytest.fixture(scope="module")
def models():
    stock = mm.build_stock(mm.TINY, seed=1, dtype=mx.float32)
    ours = mm.patched_copy(stock, mm.MlxOpsScan(chunk=16))
    return stock, ours


def rel(a, b):
    return float(mx.abs(a - b).max() / mx.abs(b).max())


def test_patched_model_matches_stock_mlx_lm(models):
    stock, ours = models
    # Stock is untouched: its blocks keep mlx-lm's class, ours share its weight arrays.
    assert type(stock.backbone.layers[0].mixer).__name__ == "MambaBlock"
    assert type(ours.backbone.layers[0].mixer).__name__ == "KsMambaBlock"
    assert ours.backbone.layers[0].mixer.in_proj.weight is stock.backbone.layers[0].mixer.in_proj.weight
    tokens = mx.array(np.random.default_rng(0).integers(0, 256, (1, 45)))
    cs, co = stock.make_cache(), ours.make_cache()
    assert rel(ours(tokens, cache=co), stock(tokens, cache=cs)) < 1e-5
    assert co[0][1].dtype == mx.float32 and co[0][1].shape == (1, 128, 16)
    for t in (3, 200, 17, 5):
        tok = mx.array([[t]])
        assert rel(ours(tok, cache=co), stock(tok, cache=cs)) < 1e-5
    # A prompt in two pieces (the state crosses the boundary) equals one piece.
    c1, c2 = ours.make_cache(), ours.make_cache()
    whole = ours(tokens, cache=c1)
    ours(tokens[:, :20], cache=c2)
    assert rel(ours(tokens[:, 20:], cache=c2), whole[:, 20:]) < 1e-5


def test_compiled_forward_matches_and_check_passes(models):
    stock, ours = models
    fwd = bench.OursForward(ours)
    check = bench.check_logits(stock, fwd, 256, prompt=24, steps=4, seed=3)
    assert check["passed"] and check["max_rel_diff"] < 1e-4 and fwd.compile
    assert check["positions"] == 24 + 4 and check["argmax_agreement"] == 1.0


def test_check_refuses_a_broken_scan(models):
    stock, _ = models
    ops = mm.MlxOpsScan(chunk=16)

    def forgetful(x, dt, A, B, C, D, z, bias, h0=None):
        # Drops the state carried into each call: right for a fresh prompt, wrong afterwards.
        return ops(x, dt, A, B, C, D, z, bias, None)

    broken = mm.patched_copy(stock, forgetful)
    check = bench.check_logits(stock, bench.OursForward(broken), 256, prompt=24, steps=4, seed=3)
    assert not check["passed"] and check["max_state_rel_diff"] > bench.CHECK_STATE_TOL


def test_mlx_lm_package_init_is_not_imported():
    # mamba_model imports mlx_lm.models.mamba through a bare package: transformers stays out
    # (CI may install mlx-lm without its dependencies).
    code = ("import sys, mamba_model as mm; mm.mamba_module(); "
            "print('mlx_lm.generate' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=mm.HERE, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_mambapy_gets_the_same_weights(models):
    torch = pytest.importorskip("torch", reason="mambapy needs torch")
    pytest.importorskip("mambapy", reason="needs mambapy==1.2.0")
    stock, _ = models
    lm = bench.mambapy_model(stock, "cpu")
    tokens = np.random.default_rng(2).integers(0, 256, (1, 33))
    want = stock(mx.array(tokens))[:, -1]
    with torch.no_grad():
        got = lm(torch.from_numpy(tokens)).numpy()
        assert np.abs(got - np.array(want)).max() <= 1e-4 * float(mx.abs(want).max())
        # Its cached step, fed the same tokens one by one, ends at the same logits.
        caches = [(None, torch.zeros(1, 128, 3)) for _ in range(2)]
        for t in tokens[0]:
            step, caches = lm.step(torch.tensor([int(t)]), caches)
    assert np.abs(step.numpy() - np.array(want)).max() <= 1e-4 * float(mx.abs(want).max())


class EmulatedKernels:
    """The rendered mlx family module with its CUDA kernels run by the CPU emulation
    (emu/fake_mlx.py), behind the real module's API on real MLX arrays: what KernelScan calls
    on a GPU."""

    def __init__(self, variant, tmp_path):
        from fake_mlx import FakeMx
        from ksearch_render import Family

        fam = Family("selective-scan", "mlx")
        path = tmp_path / f"{variant}.py"
        path.write_text(fam.render(fam.variants(mm.HERE / "variants.toml")[variant]))
        self.fake = FakeMx()
        self.mod = self.fake.load(path, f"ksm_model_{variant}")

    def _in(self, arrays):
        return [None if a is None else self.fake.array(np.array(a)) for a in arrays]

    def selective_scan_state(self, *arrays, channel_last=True, has_z=True, softplus=True):
        y, h = self.mod.selective_scan_state(*self._in(arrays), channel_last=channel_last,
                                             has_z=has_z, softplus=softplus)
        return mx.array(y.np), mx.array(h.np)

    def decode_step(self, *arrays, has_z=True, softplus=True):
        y, h = self.mod.decode_step(*self._in(arrays), has_z=has_z, softplus=softplus)
        return mx.array(y.np), mx.array(h.np)


@pytest.mark.parametrize("variant", ["chunked_fused", "seq_lanes16_fused"])
@pytest.mark.parametrize("channel_last", [True, False])
def test_model_with_our_kernels_on_the_emulation(models, variant, channel_last, tmp_path):
    """The GPU path of the model (KernelScan: the family's kernels, channel-last or through
    transposes, decode_step for single tokens) against stock mlx-lm, with the kernels run by
    the CPU emulation. mx.compile cannot trace the host round trip, so this also exercises the
    bench's fallback to an uncompiled forward."""
    import emu

    if emu.compiler() is None:
        pytest.skip("no C++20 compiler for the CPU emulation")
    stock, _ = models
    kernels = EmulatedKernels(variant, tmp_path)
    ours = mm.patched_copy(stock, mm.KernelScan(kernels, channel_last=channel_last))
    fwd = bench.OursForward(ours)
    check = bench.check_logits(stock, fwd, 256, prompt=40, steps=3, seed=4)
    assert check["passed"] and check["max_rel_diff"] < 1e-4, check
    assert check["max_state_rel_diff"] < 1e-4 and not fwd.compile
    decode = kernels.fake.kernels[-1]
    assert decode.name.startswith("ksm_decode_") and len(decode.calls) == 3 * 2  # steps x layers


def _emulation_or_skip():
    import emu

    if emu.compiler() is None:
        pytest.skip("no C++20 compiler for the CPU emulation")


@pytest.mark.parametrize("decode,blocks", [("conv", None), ("fused", None), ("layer", 3),
                                           ("layer", 1), ("model", 3), ("model", 1)],
                         ids=["conv", "fused", "layer-3-blocks", "layer-1-block",
                              "model-3-blocks", "model-1-block"])
def test_model_kernels_on_the_emulation(models, decode, blocks):
    """The convolution kernel (prompt, continuation and single tokens) and the four decode
    paths against stock mlx-lm: the conv and step kernels with the residual folded into
    out_proj's matmul, the block in four launches, the block in one launch (a grid of several
    blocks with grid barriers between the phases, and of one block), every block of the model
    in one launch (its state stacked; a prompt after decode steps splits it again)."""
    _emulation_or_skip()
    from emulated import EmulatedModelKernels

    stock, _ = models
    kernels = EmulatedModelKernels()
    ours = mm.patched_copy(stock, mm.MlxOpsScan(chunk=16), kernels, decode=decode, blocks=blocks)
    fwd = bench.OursForward(ours)
    check = bench.check_logits(stock, fwd, 256, prompt=40, steps=3, seed=4)
    assert check["passed"] and check["max_rel_diff"] < 1e-4, check
    assert check["max_state_rel_diff"] < 1e-4
    layers = len(stock.backbone.layers)
    steps = 3 * layers
    # The prompt's convolution, then every step through the path's kernels.
    want = {"conv": {"conv_silu": (1 + 3) * layers, "ssm_step": steps},
            "fused": {"conv_silu": layers, "ssm_step": steps, "in_conv": steps, "xproj": steps,
                      "out_res": steps},
            "layer": {"conv_silu": layers, "layer": steps},
            "model": {"conv_silu": layers, "model": 3}}[decode]
    got = {k: v for k, v in kernels.calls().items() if v}
    assert got == want
    if decode == "layer":
        mm.check_grid(ours)  # no wait timed out
        launch = next(k for k in kernels.fake.kernels if k.name.startswith("ksm_layer_"))
        assert {c["blocks"][0] for c in launch.calls} == {blocks}
        # Three barriers per launch, each leaving its count at 0; the poison flag never set.
        for layer in ours.backbone.layers:
            g = layer.mixer.ks_grid
            assert kernels.grid_words(g.barrier) == [0, 3 * 3, 0, 0]
            assert kernels.grid_words(g.poison) == [0, 0, 0, 0] and g.blocks == blocks
    if decode == "model":
        mm.check_grid(ours)
        g = ours.ks_stack.grid
        # Per launch three barriers in each block and one between blocks.
        assert kernels.grid_words(g.barrier) == [0, (4 * layers - 1) * 3, 0, 0]
        assert kernels.grid_words(g.poison) == [0, 0, 0, 0] and g.blocks == blocks
        assert all(l.mixer.ks_grid is None for l in ours.backbone.layers)
        # The decode steps' state is stacked; a prompt continuing from it gets the same
        # logits as one continuing from the per-layer state of the same tokens.
        toks = mx.array(np.random.default_rng(6).integers(0, 256, (1, 12)))
        _, st = fwd(toks[:, :10], None, all_positions=True)
        for i in (10, 11):
            _, st = fwd(toks[:, i:i + 1], st, all_positions=True)
        assert not isinstance(st[0], list) and st[0].shape[0] == layers
        more = mx.array([[7, 9, 11]])
        cont, _ = fwd(more, st, all_positions=True)
        ref_cont, _ = fwd(more, ([c for c in st[0]], [h for h in st[1]]), all_positions=True)
        assert rel(cont, ref_cont) == 0.0
    # A prompt in two pieces: the second starts from the first one's conv cache and state.
    tokens = mx.array(np.random.default_rng(5).integers(0, 256, (1, 30)))
    whole, _ = fwd(tokens, None, all_positions=True)
    _, state = fwd(tokens[:, :13], None, all_positions=True)
    rest, _ = fwd(tokens[:, 13:], state, all_positions=True)
    assert rel(rest, whole[:, 13:]) < 1e-5


def test_the_one_kernel_decode_needs_its_grid_barriers(models):
    """The mutation that shows the barriers matter: the same kernel compiled without them
    (GRID_SYNC = false) lets a block read what other blocks have not written yet, and the logits
    check fails; with one block, where no other block exists, the same kernel passes."""
    _emulation_or_skip()
    from emulated import EmulatedModelKernels

    stock, _ = models
    for blocks, passes in ((3, False), (1, True)):
        kernels = EmulatedModelKernels(grid_sync=False)
        ours = mm.patched_copy(stock, mm.MlxOpsScan(chunk=16), kernels, decode="layer",
                               blocks=blocks)
        check = bench.check_logits(stock, bench.OursForward(ours), 256, prompt=16, steps=2,
                                   seed=4)
        assert check["passed"] == passes, (blocks, check)
        assert kernels.calls()["layer"] == 2 * len(stock.backbone.layers)


def test_a_grid_that_is_not_resident_raises(models):
    """A grid of 3 blocks on an emulated GPU that holds 2 at once: the first two wait at the
    first barrier for a block that cannot start, give up after the spin limit and poison the
    model; check_grid then raises, and later launches skip their waits instead of each
    timing out again."""
    _emulation_or_skip()
    from emulated import EmulatedModelKernels

    stock, _ = models
    kernels = EmulatedModelKernels(resident_blocks=2)
    ours = mm.patched_copy(stock, mm.MlxOpsScan(chunk=16), kernels, decode="layer", blocks=3)
    fwd = bench.OursForward(ours)
    check = bench.check_logits(stock, fwd, 256, prompt=16, steps=2, seed=4)
    with pytest.raises(mm.GridBarrierTimeout, match="not all resident"):
        mm.check_grid(ours)
    assert not check["passed"]
    grids = [l.mixer.ks_grid for l in ours.backbone.layers]
    assert kernels.grid_words(grids[0].poison)[0] == 1
    # Layer 0's first launch timed out with two arrivals counted; every later launch saw the
    # poison flag at its start and never arrived.
    assert [kernels.grid_words(g.barrier)[:2] for g in grids] == [[2, 0]] + [[0, 0]] * (len(grids) - 1)


def test_tuned_scan_dispatches_to_the_fastest_per_length():
    calls = []

    def named(name):
        def scan(x, *rest):
            calls.append((name, x.shape[1]))
            return name
        return scan

    tuned = mm.TunedScan({"a": named("a"), "b": named("b")})
    x = lambda T: mx.zeros((1, T, 4))
    assert tuned(x(7), *[None] * 7) == "a"  # untuned: the first
    # "b" is faster at long lengths only.
    cost = {("a", 512): 1.0, ("b", 512): 2.0, ("a", 2048): 9.0, ("b", 2048): 3.0}
    report = tuned.tune([2048, 512, 512], lambda s, T: cost[(s(x(T)), T)])
    assert report["picks"] == {"512": "a", "2048": "b"}
    assert report["us_per_call"]["2048"] == {"a": 9e6, "b": 3e6}
    calls.clear()
    for T, want in [(1, "a"), (600, "a"), (1500, "b"), (4096, "b")]:
        assert tuned(x(T), *[None] * 7) == want, T


def test_tuning_interleaves_passes_and_picks_by_medians_with_a_margin():
    order = []
    # "a" and "b" alike but for one slow and one fast draw; "c" fails to run; "d" is slow.
    draws = {"a": iter([1.00, 1.30, 1.01]), "b": iter([0.90, 1.02, 0.99]),
             "d": iter([3.0, 3.1, 2.9])}

    def time_one(name, T):
        order.append(name)
        if name == "c":
            raise RuntimeError("no build here")
        return next(draws[name])

    tuned = mm.TunedScan({n: n for n in "abcd"})
    report = tuned.tune([512], time_one, rounds=3)
    # Each pass starts one scan later; a scan that failed is not timed again.
    assert order == ["a", "b", "c", "d", "b", "d", "a", "d", "a", "b"]
    assert report["us_per_call"]["512"] == {"a": 1.01e6, "b": 0.99e6, "d": 3.0e6}
    assert report["us_per_call_range"]["512"]["a"] == [1.0e6, 1.3e6]
    assert "c" in report["errors"] and report["rounds"] == 3
    # b's median is 2% under a's: inside the margin, so the earlier-listed a is kept; one
    # draw per scan (b's 0.90 against a's 1.00) would have picked b.
    assert report["picks"] == {"512": "a"}
    assert mm.pick_steady({"a": 1.0, "b": 0.9}) == "b"
    assert mm.pick_steady({"a": 1.0, "b": 0.98, "c": 0.5}) == "c"
    assert mm.pick_steady({"a": 1.02, "b": 1.0}, margin=0.0) == "b"
