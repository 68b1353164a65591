"""The device code itself, run on the CPU: each variant is rendered (for mlx-cuda, so the decode
kernel is there too), compiled with the CUDA stand-in of emu/cuda_emu.h (std::threads per block,
barriers for __syncthreads and shuffles) and launched the way the cuda entry points and the mlx
module launch it. Results are compared with the float64 reference: lengths that are not
multiples of the chunk, a chunk plus one, one step, odd state sizes, both layouts, a state in and
out, decays near 0 and near 1, f32 I/O (tight) and f16 I/O (the task's tolerance)."""

import json

import numpy as np
import pytest

import emu  # noqa: E402
from conftest import MAMBA  # noqa: E402
from ksearch_render import Family  # noqa: E402
from scan_ref import make_inputs, scan_ref  # noqa: E402

if emu.compiler() is None:
    pytest.skip("no C++20 compiler (g++ or $CXX) for the CPU emulation", allow_module_level=True)

# Target mlx-cuda (the family's only one), so the device code has the decode kernel too.
FAM = Family("selective-scan", "mlx")


def _key(knobs):
    # Complete settings from ksearch: their sorted JSON names them.
    return json.dumps(knobs, sort_keys=True)


def _variants():
    """Every value of every knob at least once, plus the ladder of named variants."""
    picked, seen = {}, set()
    for knobs in FAM.enumerate():
        new = set(knobs.items()) - seen
        if new:
            picked[_key(knobs)] = knobs
            seen |= new
    for name, knobs in FAM.variants(MAMBA / "variants.toml").items():
        if name.startswith(("s", "tiled", "staged")) or name == "chunked_fused":
            picked[_key(knobs)] = knobs
    return list(picked.values())


VARIANTS = _variants()
# Test ids: ksearch's knob summaries, asked for all settings in one call.
SUMMARY = {_key(r["knobs"]): r["knob_summary"]
           for r in FAM.batch([{"knobs": k, "source": False} for k in VARIANTS])}
_BUILT = {}


def build(knobs):
    """The emulated variant; the first call compiles every variant the tests use at once."""
    knobs = FAM.resolve(knobs)
    if not _BUILT:
        wanted = VARIANTS + [FAM.resolve({"exp2": e}) for e in (False, True)]
        unique = {_key(k): k for k in wanted}
        codes = FAM.render_many(list(unique.values()), template="scan_device.cuh.j2")
        built = emu.build_many([(code, k["fuse_epilogue"], True)
                                for code, k in zip(codes, unique.values())])
        _BUILT.update(zip(unique, built))
    return _BUILT[_key(knobs)]


def chunk_of(knobs):
    if knobs["algo"] == "chunked":
        return knobs["threads"] * knobs["items"]
    if knobs["algo"] == "tiled":
        return knobs["threads"] // knobs["channels"] * 3  # three steps per time segment
    if knobs["algo"] == "staged":
        # Steps per staged chunk at N <= 16 (staged_steps: 64 with one state per thread, 32
        # with two).
        return 64 if knobs["state_lanes"] == 16 else 32
    return 64


def close(got, want, tol):
    scale = np.abs(want).max()
    err = np.abs(np.asarray(got, dtype=np.float64) - want)
    return bool(np.all(err <= tol * scale + tol * np.abs(want))), float(err.max() / scale)


@pytest.mark.parametrize("knobs", VARIANTS, ids=lambda k: SUMMARY[_key(k)])
def test_variant_matches_the_reference(knobs):
    v = build(knobs)
    rng = np.random.default_rng(7)
    chunk = chunk_of(knobs)
    cases = [
        # (batch, dim, L, N, layout, state, has_z, softplus, regime, dtype)
        (2, 3, 2 * chunk + 3 if chunk <= 1024 else 333, 16, False, False, 1, 1, "mixed", np.float32),
        (1, 2, chunk + 1, 5, True, True, 0, 0, "mixed", np.float32),
        (1, 3, 1, 16, True, True, 1, 1, "mixed", np.float32),
        (1, 2, 77, 40, False, True, 1, 1, "near0", np.float32),
        (1, 4, 700, 16, True, True, 1, 1, "near1", np.float16),
        (2, 2, 129, 16, False, False, 1, 1, "mixed", np.float16),
    ]
    if knobs["algo"] == "tiled":
        # Several blocks of channels, the last one partly past dim, and fewer steps than
        # segments (empty segments must pass the state on unchanged).
        cases += [(2, 37, chunk + 5, 16, True, True, 1, 1, "mixed", np.float32),
                  (1, 33, 3, 16, True, True, 1, 1, "mixed", np.float32)]
    if knobs["algo"] == "staged":
        # Several blocks of channels, the last one partly past dim, in both layouts; chunks
        # whole and cut short; a state size past 16 (the N <= 64 instantiation, 32 steps per
        # chunk).
        cases += [(2, 37, 2 * chunk, 16, True, True, 1, 1, "mixed", np.float32),
                  (1, 70, chunk + 7, 16, False, True, 1, 0, "mixed", np.float32),
                  (1, 33, 3, 40, True, True, 0, 1, "mixed", np.float32),
                  (1, 20, 2 * 32 + 5, 40, True, True, 1, 1, "mixed", np.float32)]
    for batch, dim, L, N, cl, state, hz, sp, regime, dtype in cases:
        inp = make_inputs(rng, batch, dim, L, N, regime=regime, channel_last=cl, with_h0=state)
        if not sp:
            # Without softplus dt = delta + bias must stay positive, or the state grows.
            inp["delta"] = rng.uniform(0.01, 0.2, size=inp["delta"].shape).astype(np.float32)
            inp["delta_bias"] = rng.uniform(0.0, 0.05, size=dim).astype(np.float32)
        if dtype == np.float16:
            for k in ("u", "delta", "B", "C", "z"):
                inp[k] = inp[k].astype(np.float16).astype(np.float32)
        y, h = v.scan(inp, dtype=dtype, channel_last=cl, has_z=bool(hz), softplus=bool(sp),
                      with_state=state)
        want_y, want_h = scan_ref(**inp, has_z=bool(hz), softplus_dt=bool(sp), channel_last=cl)
        tol = 2e-5 if dtype == np.float32 else 2e-3
        ok, rel = close(y, want_y, tol)
        label = (batch, dim, L, N, cl, state, hz, sp, regime, np.dtype(dtype).name)
        assert ok, f"y off by {rel:.2e} of its scale for {label}"
        if state:
            ok, rel = close(h, want_h, 2e-5 if dtype == np.float32 else 2e-4)
            assert ok, f"h_last off by {rel:.2e} for {label}"


@pytest.mark.parametrize("exp2", [False, True])
@pytest.mark.parametrize("N", [4, 16])
def test_decode_step_updates_the_state(exp2, N):
    v = build({"exp2": exp2})
    rng = np.random.default_rng(N)
    batch, dim = 2, 5
    seq = make_inputs(rng, batch, dim, 1, N, channel_last=True, with_h0=True)
    step = {k: (seq[k][:, 0] if k in ("u", "delta", "z", "B", "C") else seq[k]) for k in seq}
    y, h = v.decode(step)
    want_y, want_h = scan_ref(**seq, channel_last=True)
    assert close(y, want_y[:, 0], 2e-5)[0] and close(h, want_h, 2e-5)[0]
    # A second step from the new state, as decode runs token after token.
    seq2 = make_inputs(rng, batch, dim, 1, N, channel_last=True)
    seq2["h0"] = want_h.astype(np.float32)
    step2 = {k: (seq2[k][:, 0] if k in ("u", "delta", "z", "B", "C") else seq2[k]) for k in seq2}
    y2, h2 = v.decode(step2)
    want_y2, want_h2 = scan_ref(**seq2, channel_last=True)
    assert close(y2, want_y2[:, 0], 2e-5)[0] and close(h2, want_h2, 2e-5)[0]


def test_a_broken_combine_is_caught():
    """The harness's point: the comparison above fails a kernel whose warp combine takes its
    operands in the wrong order (the earlier pair on the left)."""
    knobs = FAM.resolve({"algo": "chunked", "threads": 64, "items": 2})
    code = FAM.render(knobs, template="scan_device.cuh.j2")
    good = "          tb = ta * pb + tb;\n          ta = ta * pa;"
    assert good in code
    broken = emu.EmuVariant.build(code.replace(good, "          tb = pa * tb + pb;\n          ta = ta * pa;"),
                                  fused=False, decode=True)
    rng = np.random.default_rng(3)
    inp = make_inputs(rng, 1, 2, 300, 16, regime="near0")
    y, _ = broken.scan(inp)
    assert not close(y, scan_ref(**inp)[0], 2e-3)[0]
