"""The attention task's GPU families (tasks/attention/templates-cuda, templates-mlx) as the tools
here get them from ksearch (family.py over gpu/ksearch_render.py, a client of `ksearch tasks
--render`): rendered content, ksearch's knob checks and messages, and gpu.toml's launch geometry
against the kernels' own (no GPU needed). ksearch's own checks of the families are
crates/knowledge/tests/gpu_families.rs."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import family  # noqa: E402
from family import RenderError  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cuda():
    return family.cuda()


@pytest.fixture(scope="module")
def variants():
    return family.load_variants()


def test_every_named_variant_renders_for_both_backends(cuda, variants):
    assert len(variants) >= 10
    # The mlx family lacks the TMA producer: it is cuda only, and the only one.
    cuda_only = [n for n in variants if not family.on_mlx(variants[n])]
    assert cuda_only == [n for n in variants if variants[n]["wg_schedule"] == "producer_tma"]
    assert cuda_only, "a named cuda-only setting"
    for n in cuda_only:
        with pytest.raises(RenderError, match="outside its domain"):
            family.mlx().resolve(family.mlx_knobs(variants[n]))
    names = [n for n in variants if n not in cuda_only]
    for reply in cuda.batch([{"name": n, "knobs": variants[n]} for n in cuda_only]):
        assert 'extern "C" int attention_f16(' in reply["source"], reply["name"]
    replies = cuda.batch([{"name": n, "knobs": variants[n]} for n in names])
    modules = family.mlx().render_many([family.mlx_knobs(variants[n]) for n in names])
    for reply, module in zip(replies, modules):
        name, knobs, cu = reply["name"], reply["knobs"], reply["source"]
        assert knobs == variants[name]
        assert 'extern "C" int attention_f16(' in cu, name
        assert 'extern "C" int attention_bf16(' in cu, name
        header, body = family.render_mlx(knobs)
        # NVRTC (MLX) promises no standard headers; the host glue must not leak into the header.
        for banned in ("#include", 'extern "C"', "int64_t", "uint32_t", "cudaStream_t"):
            assert banned not in header, (name, banned)
        assert "q_shape[2]" in body and "::ksa::attn_body<T, HEAD_DIM, CAUSAL>" in body
        assert header in module and body in module, name
        # One device code for both backends; the mlx header adds MLX's launch bounds for the
        # producer schedule (the cuda entry point has its own).
        end = header.index("}  // namespace ksa") + len("}  // namespace ksa")
        assert header[:end] in cu, name
        assert ("#define __global__" in header) == (knobs["wg_schedule"] == "producer"), name
        assert "#define __global__" not in cu, name
        compile(module, name, "exec")
        for text in (cu, header, body, module):
            assert "{{" not in text and "{%" not in text, name
        # The template prints the knob summary ksearch gives it; the variant id is ksearch's.
        assert f"// Knobs: {reply['knob_summary']}\n" in cu
        assert re.fullmatch(r"[0-9a-f]{10}", reply["variant_id"])
    assert len({r["variant_id"] for r in replies}) == len(replies)


def test_algorithms_select_distinct_code(cuda):
    srcs = {a: cuda.render(k) for a, k in {
        "naive": {"algo": "naive", "block_m": 128},
        "tiled": {"algo": "tiled", "block_m": 64, "block_n": 32, "warps": 4},
        "mma": {"algo": "mma"},
        "wgmma": {"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 2},
    }.items()}
    assert "mma.sync.aligned.m16n8k16" in srcs["mma"] and "wgmma" not in srcs["mma"]
    assert "wgmma.mma_async.sync.aligned.m64n64k16" in srcs["wgmma"]
    assert "mma.sync.aligned" not in srcs["tiled"] and "mma.sync.aligned" not in srcs["naive"]
    assert "K_TRANSPOSED" in srcs["tiled"]


@pytest.mark.parametrize("overrides, message", [
    ({"algo": "flash"}, '`algo` = "flash" is outside its domain'),
    ({"block_n": 48}, r"`block_n` = 48 is outside its domain \[32, 64, 128\]"),
    ({"exp2": 1}, r"`exp2` = 1 is outside its domain \[false, true\]"),  # an int is no bool
    ({"tile": 3}, "family `attention-cuda` has no knob `tile`"),
    ({"algo": "mma", "block_m": 64, "warps": 8}, "each warp owns one or two 16-row MMA tiles"),
    ({"algo": "mma", "cp_async": False, "stages": 2}, "constraint"),
    ({"algo": "wgmma", "block_m": 128, "warps": 4}, "constraint"),          # 2 warpgroups need 8 warps
    ({"algo": "mma", "wg_schedule": "overlap"}, "constraint"),
    ({"algo": "mma", "block_m": 128, "warps": 4, "q_in_regs": True}, "constraint"),
    ({"k_transposed": True}, "constraint"),                               # naive ignores it
    ({"algo": "naive", "warps": 8}, "constraint"),
    ({"algo": "wgmma", "block_m": 64, "warps": 4}, "constraint"),           # wgmma needs cp.async
    ({"algo": "mma", "wg_schedule": "pingpong"}, "constraint"),             # a wgmma schedule
    ({"algo": "wgmma", "block_m": 64, "warps": 4, "cp_async": True, "stages": 2,
      "wg_schedule": "pingpong"}, "constraint"),                            # needs two warpgroups
    ({"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 1,
      "wg_schedule": "pingpong"}, "constraint"),                            # and two stages
    ({"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 2,
      "wg_schedule": "producer", "min_blocks": 2}, "constraint"),           # one block per SM
    ({"wg_schedule": "ping-pong"}, '`wg_schedule` = "ping-pong" is outside its domain'),
])
def test_invalid_knobs_get_ksearchs_error(cuda, overrides, message):
    # "violated:" is how ksearch names the broken rule; the others quote the knob.
    with pytest.raises(RenderError, match=message if message != "constraint" else "violated: "):
        cuda.resolve(overrides)
    with pytest.raises(RenderError, match=message if message != "constraint" else "violated: "):
        cuda.render(overrides)


def test_pingpong_renders_the_mbarrier_schedule_only_when_asked(cuda):
    base = {"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 2}
    plain, pp, prod = cuda.render_many([base, dict(base, wg_schedule="pingpong"),
                                        dict(base, wg_schedule="producer")])
    for text in ("cp.async.mbarrier.arrive.noinc.shared::cta.b64", "mbarrier.try_wait.parity",
                 "bar.sync %0, %1", "bar.arrive %0, %1", "fence.proxy.async.shared::cta"):
        assert text in pp and text in prod, text
    assert "mbarrier" not in plain and "bar.arrive" not in plain
    # The producer schedule: a third warpgroup and the register split; ping-pong has neither.
    assert "constexpr bool PRODUCER = true;" in prod and "constexpr bool PRODUCER = false;" in pp
    assert "constexpr int THREADS = 384;" in prod and "constexpr int THREADS = 256;" in pp
    # The mbarriers live behind the last stage: 16 bytes per stage on top of the tiles.
    for schedule in ("pingpong", "producer"):
        launch = family.launch(cuda.resolve(dict(base, wg_schedule=schedule)), 128)
        assert launch["smem_bytes"] == family.launch(cuda.resolve(base), 128)["smem_bytes"] + 16 * 2
        assert launch["threads"] == (384 if schedule == "producer" else 256)


def _arithmetic(expr: str, values: dict[str, int]) -> int:
    for k, v in values.items():
        expr = re.sub(rf"\b{k}\b", str(v), expr)
    assert re.fullmatch(r"[0-9+*() ]+", expr), expr
    return eval(expr)  # noqa: S307 - digits and arithmetic only, checked above


def _template_smem(source: str, knobs: dict, head_dim: int) -> int:
    m = re.search(r"constexpr int smem_bytes\(\) \{ return (.*?); \}", source)
    assert m, "smem_bytes<D>() not found"
    expr = m.group(1)
    values = {"BLOCK_M": knobs["block_m"], "BLOCK_N": knobs["block_n"], "D": head_dim,
              "STAGES": knobs["stages"] if knobs["algo"] in ("mma", "wgmma") else 1}
    if "q_bufs<D>()" in expr:
        # Persistent tiles: two Q tiles where they fit (q_bufs<D>(), "X <= SMEM_MAX ? 2 : 1").
        q = re.search(r"constexpr int q_bufs\(\) \{ return (.*?) <= SMEM_MAX \? 2 : 1; \}", source)
        limit = re.search(r"constexpr int SMEM_MAX = (.*?);", source)
        assert q and limit, "q_bufs<D>() or SMEM_MAX not found"
        fits = _arithmetic(q.group(1), values) <= _arithmetic(limit.group(1), {})
        expr = expr.replace("q_bufs<D>()", "2" if fits else "1")
    return _arithmetic(expr, values)


def test_family_smem_formula_matches_the_kernel(cuda, variants):
    # The mlx wrapper sizes dynamic shared memory from gpu.toml; the cuda launcher from the
    # template's smem_bytes<D>(). They must agree or one backend under-allocates.
    srcs = cuda.render_many(list(variants.values()))
    for (name, knobs), src in zip(variants.items(), srcs):
        for d in family.HEAD_DIMS:
            assert family.launch(knobs, d)["smem_bytes"] == _template_smem(src, knobs, d), (name, d)


def test_every_launch_of_a_block_has_the_kernels_thread_count(cuda, variants):
    # One formula (templates-cuda/launch.j2) sizes the block for the cuda device code and the
    # mlx wrapper; gpu.toml repeats it for the GPU tools. A block launched with other than
    # THREADS threads leaves a warpgroup out of the kernel's barriers or its register split.
    names = list(variants)
    srcs = cuda.render_many([variants[n] for n in names])
    on_mlx = [n for n in names if family.on_mlx(variants[n])]
    modules = dict(zip(on_mlx, family.mlx().render_many(
        [family.mlx_knobs(variants[n]) for n in on_mlx])))
    for name, src in zip(names, srcs):
        want = family.launch(variants[name], 128)["threads"]
        assert f"constexpr int THREADS = {want};" in src, name
        if name in modules:
            assert f"\nTHREADS = {want}\n" in modules[name], name
            assert f"in blocks of {want}," in modules[name], name
    assert {family.launch(variants[n], 128)["threads"] for n in names} >= {256, 384}


def test_grid_and_threads_follow_the_knobs(cuda):
    knobs = cuda.resolve({"algo": "mma", "block_m": 128, "warps": 8})
    assert family.grid(knobs, 2, 3, 1) == (1, 3, 2)
    assert family.grid(knobs, 1, 32, 4096) == (32, 32, 1)
    assert family.grid(knobs, 1, 1, 4097) == (33, 1, 1)
    assert family.launch(knobs, 64)["threads"] == 8 * 32
    assert family.launch(cuda.resolve({}), 64) == {"threads": 128, "smem_bytes": 0}  # naive


def test_variant_id_and_summary_come_from_ksearch(cuda):
    a = cuda.setting({})
    b = cuda.setting({"block_m": 64})
    assert cuda.setting(dict(reversed(list(a["knobs"].items()))))["variant_id"] == a["variant_id"]
    assert a["variant_id"] != b["variant_id"]
    assert 'algo="naive"' in a["knob_summary"] and "block_m=64" in b["knob_summary"]


def test_knob_values_land_where_the_templates_put_them(cuda):
    # A knob set on the command line of the client is the value the template prints.
    src = cuda.render({"algo": "tiled", "block_m": 64, "block_n": 32, "k_transposed": True})
    assert "constexpr int BLOCK_M = 64;" in src and "constexpr int BLOCK_N = 32;" in src
    assert "constexpr bool K_TRANSPOSED = true;" in src
    assert "constexpr bool K_TRANSPOSED = false;" in cuda.render({"algo": "tiled", "block_m": 64})
    assert family.mlx().render({}, target="mlx-metal").count("mx.fast.metal_kernel") >= 1
    with pytest.raises(RenderError, match="mx.fast.metal_kernel \\(mlx-metal\\) has only the naive"):
        family.mlx().render({"algo": "mma"}, target="mlx-metal")


def test_family_description_and_defaults(cuda):
    desc = cuda.describe()
    assert desc["name"] == "attention-cuda" and desc["backends"] == ["cuda"]
    assert desc["entry"] == "attention.cu.j2" and desc["space"] <= 250_000  # MAX_SPACE
    assert cuda.knob_names[0] == "algo" and "min_blocks" in cuda.knob_names
    assert "min_blocks" not in family.mlx().knob_names and "persistent" not in family.mlx().knob_names
    assert cuda.defaults() == cuda.resolve({}) and cuda.defaults()["algo"] == "naive"
    assert family.mlx_knobs(cuda.defaults()) == family.mlx().resolve({})


def test_mlx_default_picks_name_measured_variants(variants):
    # mlx_attention.attention() without knobs runs PICKS[(causal, D)]; read the literal without
    # importing mlx (not installable here) and check every pick is a valid named variant.
    import ast

    tree = ast.parse((HERE / "mlx_attention.py").read_text())
    picks = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                 if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "PICKS")
    assert {(c, d) for c in (False, True) for d in family.HEAD_DIMS} == set(picks)
    for name in picks.values():
        assert name in variants and variants[name]["algo"] == "wgmma"
