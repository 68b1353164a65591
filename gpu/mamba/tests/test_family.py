"""The selective-scan GPU families (tasks/selective-scan/templates-cuda, templates-mlx) as ksearch
renders them for the tools here (gpu/ksearch_render.py): knobs in step between the backends,
constraints and ksearch's messages, seeds equal to the rendered defaults, every setting passing
the harness's static checks, knob values in the code they name, and the named variants."""

import re
import tomllib

import pytest

from conftest import MAMBA, REPO, model_constant  # noqa: E402
from ksearch_render import Family, RenderError  # noqa: E402

TASK = REPO / "tasks" / "selective-scan"
SPEC = tomllib.loads((TASK / "task.toml").read_text())


def load_variants(fam):
    return fam.variants(MAMBA / "variants.toml")


@pytest.fixture(scope="module")
def cuda():
    return Family("selective-scan", "cuda")


@pytest.fixture(scope="module")
def mlx():
    return Family("selective-scan", "mlx")


def test_backends_share_knobs_and_rules(cuda, mlx):
    c, m = cuda.describe(), mlx.describe()
    assert c["knobs"] == m["knobs"]
    assert c["rules"] == m["rules"]
    assert (c["backends"], m["backends"]) == (["cuda"], ["mlx"])
    assert (c["name"], m["name"]) == ("selective-scan-cuda", "selective-scan-mlx")
    assert m["targets"] == ["mlx-cuda"] and m["target"] == "mlx-cuda"


def test_space_defaults_and_constraints(cuda):
    assert cuda.describe()["space"] <= 100_000
    valid = cuda.enumerate()
    # sequential: threads x state_lanes x exp2 x fuse, less 512 threads with fewer than 8
    # lanes; chunked: threads x (items, vec) pairs with vec | items x exp2 x fuse, less
    # 512 threads x 16 items (both spill); tiled: threads x channels x exp2 x fuse x fold x
    # prefetch; staged: (state_lanes, threads) in (8, 128), (8, 256), (16, 256) x exp2 x fuse.
    assert len(valid) == (5 * 5 - 3) * 4 + (5 * 14 - 4) * 4 + 5 * 2 * 4 * 2 * 2 + 3 * 4
    d = cuda.resolve({})
    assert d["algo"] == "sequential" and d["exp2"] is False and d["fuse_epilogue"] is False
    for bad, msg in [({"items": 8}, "only apply to the chunked"),
                     ({"algo": "chunked", "state_lanes": 4}, "state_lanes only"),
                     ({"algo": "staged", "state_lanes": 4, "threads": 64}, "fewer than 8 lanes"),
                     ({"algo": "staged", "state_lanes": 16, "threads": 128}, "16 or 32 channels"),
                     ({"algo": "staged", "state_lanes": 8, "threads": 512}, "16 or 32 channels"),
                     ({"algo": "staged", "state_lanes": 16, "threads": 512}, "at most 256 threads"),
                     ({"algo": "chunked", "items": 4, "vec": 8}, "vec must divide"),
                     ({"threads": 512, "state_lanes": 4}, "128 registers"),
                     ({"algo": "chunked", "threads": 512, "items": 16}, "128 registers"),
                     ({"channels": 16}, "channels only applies"),
                     ({"fold": "tree"}, "fold and prefetch only apply to the tiled"),
                     ({"algo": "chunked", "prefetch": True}, "fold and prefetch only apply"),
                     ({"threads": 100}, r"`threads` = 100 is outside its domain \[32, 64"),
                     ({"exp2": 1}, r"`exp2` = 1 is outside its domain \[false, true\]"),
                     ({"warps": 4}, "family `selective-scan-cuda` has no knob `warps`")]:
        with pytest.raises(RenderError, match=msg):
            cuda.resolve(bad)
        with pytest.raises(RenderError, match=msg):
            cuda.render(bad)


def test_seeds_are_the_rendered_defaults(cuda, mlx):
    assert (TASK / "seed" / "naive.cu").read_text() == cuda.render({})
    assert (TASK / "seed" / "naive_mlx.py").read_text() == mlx.render({})
    backends = SPEC["backends"]
    assert backends["cuda"]["seed"] == "seed/naive.cu"
    assert backends["mlx"]["seed"] == "seed/naive_mlx.py"


def test_rendered_entry_points_match_the_task(cuda, mlx):
    cu = cuda.render({"algo": "chunked", "items": 4})
    for dtype in ("f16", "bf16"):
        sig = SPEC["backends"]["cuda"]["signature"].replace("{dtype}", dtype)
        # The declared prototype, modulo whitespace, opens the definition.
        flat = re.sub(r"\s+", " ", cu)
        assert sig.split("(")[0] + "(" in flat
        params = sig[sig.index("(") + 1:sig.rindex(")")]
        assert params in flat, dtype
    py = mlx.render({})
    args = SPEC["backends"]["mlx"]["args"]
    assert "def selective_scan(*, " + ", ".join(args) + "):" in py


def covering_sample(fam):
    """Valid settings in which every value of every knob occurs at least once."""
    out, seen = [], set()
    for knobs in fam.enumerate():
        new = {(k, v) for k, v in knobs.items()} - seen
        if new:
            out.append(knobs)
            seen |= new
    return out + list(load_variants(fam).values())


def test_settings_pass_the_static_checks(cuda, mlx):
    from ksearch_harness.static_checks import check_python, check_source, kernel_dialects

    forbid_cuda = SPEC["backends"]["cuda"]["forbidden"]
    forbid_mlx = SPEC["backends"]["mlx"]["forbidden"]
    sample = covering_sample(cuda)
    for knobs, cu, src in zip(sample, cuda.render_many(sample), mlx.render_many(sample)):
        assert check_source(cu, forbid_cuda, "cuda") == [], knobs
        assert check_python(src, forbid_mlx) == [], knobs
        assert kernel_dialects(src) == {"cuda"}
        compile(src, "scan_mlx.py", "exec")


def test_knobs_change_the_code_they_name(cuda):
    base = cuda.render({"algo": "chunked", "items": 8})
    assert "__shfl_up_sync" in base and "__syncthreads" in base and "ex2.approx" not in base
    assert "ksm_epilogue_kernel" in base
    assert "ex2.approx" in cuda.render({"algo": "chunked", "items": 8, "exp2": True})
    fused = cuda.render({"algo": "chunked", "items": 8, "fuse_epilogue": True})
    assert "ksm_epilogue_kernel" not in fused and "finish(" in fused
    assert "Pack<T, 4>" in cuda.render({"algo": "chunked", "items": 8, "vec": 4})
    seq = cuda.render({})
    assert "__shfl" not in seq and "__syncthreads" not in seq
    assert "__shfl_xor_sync" in cuda.render({"state_lanes": 16})
    tiled = cuda.render({"algo": "tiled"})
    assert "off <<= 1" not in tiled and "fetch_states" not in tiled
    assert "off <<= 1" in cuda.render({"algo": "tiled", "fold": "tree"})
    assert "fetch_states(" in cuda.render({"algo": "tiled", "prefetch": True})
    staged = cuda.render({"algo": "staged", "state_lanes": 16, "threads": 256})
    assert "reduce_half<STEPS, STEPS / 16>" in staged and "constexpr int LANES = 16;" in staged
    # The decode kernel is only for the mlx module.
    assert "decode_body" not in seq
    assert "decode_body" in Family("selective-scan", "mlx").render({})


def test_knob_values_land_where_the_templates_put_them(cuda, mlx):
    src = cuda.render({"algo": "chunked", "threads": 256, "items": 4})
    assert "constexpr int THREADS = 256;" in src and "constexpr int ITEMS = 4;" in src
    summary = cuda.setting({"algo": "chunked", "threads": 256, "items": 4})["knob_summary"]
    assert f"// Knobs: {summary}\n" in src
    assert "threads=256" in summary and 'algo="chunked"' in summary
    device = mlx.render({"algo": "chunked", "items": 4}, template="scan_device.cuh.j2")
    assert "decode_body" in device and "extern \"C\"" not in device


def test_named_variants_are_valid(cuda):
    variants = load_variants(cuda)
    assert len(variants) >= 10
    for name, knobs in variants.items():
        # Complete settings: every knob, as ksearch checked them.
        assert set(knobs) == set(cuda.knob_names), name
    assert model_constant("DEFAULT_VARIANT") in variants
