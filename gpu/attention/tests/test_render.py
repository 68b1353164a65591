"""The attention task's GPU families (tasks/attention/templates-cuda, templates-mlx) render with
jinja2, validate knobs, and agree with themselves and with minijinja (no GPU needed). ksearch's
own checks of the families are crates/knowledge/tests/gpu_families.rs."""

import re
import sys
from pathlib import Path

import pytest

jinja2 = pytest.importorskip("jinja2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from render import Family, FamilyError, knob_summary, load_variants, variant_id  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fam():
    return Family.load()


@pytest.fixture(scope="module")
def variants(fam):
    return load_variants(HERE / "variants.toml", fam)


def test_every_named_variant_renders_for_both_backends(fam, variants):
    assert len(variants) >= 10
    for name, knobs in variants.items():
        cuda = fam.render("cuda", knobs)
        assert 'extern "C" int attention_f16(' in cuda, name
        assert 'extern "C" int attention_bf16(' in cuda, name
        header, body = fam.render_mlx(knobs)
        # NVRTC (MLX) promises no standard headers; the host glue must not leak into the header.
        for banned in ("#include", 'extern "C"', "int64_t", "uint32_t", "cudaStream_t"):
            assert banned not in header, (name, banned)
        assert "q_shape[2]" in body and "::ksa::attn_body<T, HEAD_DIM, CAUSAL>" in body
        module = fam.render("mlx", knobs)
        assert header in module and body in module, name
        assert header in cuda, name  # one device code for both backends
        compile(module, name, "exec")
        for text in (cuda, header, body, module):
            assert "{{" not in text and "{%" not in text, name
        assert knob_summary(knobs) in cuda


def test_algorithms_select_distinct_code(fam):
    srcs = {a: fam.render("cuda", fam.resolve(k)) for a, k in {
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
    ({"algo": "flash"}, "not in domain"),
    ({"block_n": 48}, "not in domain"),
    ({"exp2": 1}, "not in domain"),          # an int is not a bool
    ({"tile": 3}, "unknown knob"),
    ({"algo": "mma", "block_m": 64, "warps": 8}, "constraint"),             # 8 rows per warp
    ({"algo": "mma", "cp_async": False, "stages": 2}, "constraint"),
    ({"algo": "wgmma", "block_m": 128, "warps": 4}, "constraint"),          # 2 warpgroups need 8 warps
    ({"algo": "mma", "overlap": True}, "constraint"),
    ({"algo": "mma", "block_m": 128, "warps": 4, "q_in_regs": True}, "constraint"),
    ({"k_transposed": True}, "constraint"),                               # naive ignores it
    ({"algo": "naive", "warps": 8}, "constraint"),
    ({"algo": "wgmma", "block_m": 64, "warps": 4}, "constraint"),           # wgmma needs cp.async
    ({"algo": "mma", "pingpong": True}, "constraint"),                      # a wgmma schedule
    ({"algo": "wgmma", "block_m": 64, "warps": 4, "cp_async": True, "stages": 2, "pingpong": True},
     "constraint"),                                                         # needs two warpgroups
    ({"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 1, "pingpong": True},
     "constraint"),                                                         # and two stages
    ({"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 2, "overlap": True,
      "pingpong": True}, "constraint"),                                     # not both schedules
])
def test_invalid_knobs_are_rejected(fam, overrides, message):
    with pytest.raises(FamilyError, match=message):
        fam.resolve(overrides)


def test_pingpong_renders_the_mbarrier_schedule_only_when_asked(fam):
    base = {"algo": "wgmma", "block_m": 128, "warps": 8, "cp_async": True, "stages": 2}
    plain = fam.render("cuda", fam.resolve(base))
    pp = fam.render("cuda", fam.resolve(dict(base, pingpong=True)))
    for text in ("cp.async.mbarrier.arrive.noinc.shared::cta.b64", "mbarrier.try_wait.parity",
                 "bar.sync %0, %1", "bar.arrive %0, %1", "fence.proxy.async.shared::cta"):
        assert text in pp, text
    assert "mbarrier" not in plain and "bar.arrive" not in plain
    # The mbarriers live behind the last stage: 16 bytes per stage on top of the tiles.
    d = fam.launch(fam.resolve(dict(base, pingpong=True)), 128)["smem_bytes"]
    assert d == fam.launch(fam.resolve(base), 128)["smem_bytes"] + 16 * 2


def _template_smem(source: str, knobs: dict, head_dim: int) -> int:
    m = re.search(r"constexpr int smem_bytes\(\) \{ return (.*?); \}", source)
    assert m, "smem_bytes<D>() not found"
    expr = m.group(1)
    values = {"BLOCK_M": knobs["block_m"], "BLOCK_N": knobs["block_n"], "D": head_dim,
              "STAGES": knobs["stages"] if knobs["algo"] in ("mma", "wgmma") else 1}
    for k, v in values.items():
        expr = re.sub(rf"\b{k}\b", str(v), expr)
    assert re.fullmatch(r"[0-9+*() ]+", expr), expr
    return eval(expr)  # noqa: S307 - digits and arithmetic only, checked above


def test_family_smem_formula_matches_the_kernel(fam, variants):
    # The mlx wrapper sizes dynamic shared memory from family.toml; the cuda launcher from the
    # template's smem_bytes<D>(). They must agree or one backend under-allocates.
    for name, knobs in variants.items():
        src = fam.render("cuda", knobs)
        for d in fam.head_dims:
            assert fam.launch(knobs, d)["smem_bytes"] == _template_smem(src, knobs, d), (name, d)


def test_grid_covers_every_row(fam):
    knobs = fam.resolve({"algo": "mma", "block_m": 128, "warps": 8})
    assert fam.grid(knobs, 2, 3, 1) == (1, 3, 2)
    assert fam.grid(knobs, 1, 32, 4096) == (32, 32, 1)
    assert fam.grid(knobs, 1, 1, 4097) == (33, 1, 1)


def test_variant_id_is_stable_and_sensitive(fam):
    a = fam.resolve({})
    b = fam.resolve({"block_m": 64})
    assert variant_id(a) == variant_id(dict(reversed(list(a.items()))))
    assert variant_id(a) != variant_id(b)


def test_family_file_follows_the_shared_schema(fam):
    # crates/knowledge loads family.toml with deny_unknown_fields; mirror its rules here so a
    # stray key is caught without building Rust (docs/offline-proposer.md).
    spec = fam.spec
    assert set(spec) <= {"family", "knob", "constraint", "forbid"}
    assert set(spec["family"]) <= {"name", "description", "entry", "include_dirs", "targets",
                                   "backends"}
    assert (fam.directory / spec["family"]["entry"]).is_file()
    assert spec["family"]["backends"] == ["cuda"]
    reserved = {"knobs", "knob_summary", "family", "target", "true", "false", "none", "and", "or",
                "not", "in", "is", "if", "else", "loop"}
    space = 1
    for k in spec["knob"]:
        assert set(k) <= {"name", "description", "values", "type", "default"}, k["name"]
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k["name"]) and k["name"] not in reserved
        assert ("values" in k) != (k.get("type") == "bool"), k["name"]
        assert k["default"] in fam.domain(k["name"]), k["name"]
        space *= len(fam.domain(k["name"]))
    for c in spec.get("constraint", []):
        assert set(c) <= {"expr", "message"}
    assert space <= 100_000
    # The defaults are the naive kernel, satisfy every rule, and render.
    d = fam.resolve({})
    assert d["algo"] == "naive" and fam.violations(d) == []
    assert 'extern "C" int attention_f16(' in fam.render("cuda", d)


def test_minijinja_renders_identically(fam, variants):
    # ksearch renders with minijinja, strict undefined, and only the knobs, knobs,
    # knob_summary, family (and target) in the context; the Python tools use jinja2. Same bytes
    # and same constraint verdicts, or the offline search would compile something nobody
    # measured.
    minijinja = pytest.importorskip("minijinja")
    templates = {p.name: p.read_text() for d in (fam.directory, fam.mlx_directory)
                 for p in d.glob("*.j2")}
    env = minijinja.Environment(
        templates=templates,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, undefined_behavior="strict",
    )
    mlx_entry = fam.mlx_spec()["family"]["entry"]
    for name, knobs in list(variants.items()) + [("defaults", fam.resolve({}))]:
        ctx = fam._context("cuda", knobs)
        assert env.render_template(fam.spec["family"]["entry"], **ctx) == fam.render("cuda", knobs), name
        ctx = fam._context("mlx", knobs)
        assert env.render_template(mlx_entry, **ctx) == fam.render("mlx", knobs), name
        for c in fam.spec["constraint"]:
            assert bool(env.eval_expr(c["expr"], **knobs)) == bool(fam.eval_expr(c["expr"], knobs)), (name, c)


def test_mlx_default_picks_name_measured_variants(fam, variants):
    # mlx_attention.attention() without knobs runs PICKS[(causal, D)]; read the literal without
    # importing mlx (not installable here) and check every pick is a valid named variant.
    import ast

    tree = ast.parse((HERE / "mlx_attention.py").read_text())
    picks = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                 if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "PICKS")
    assert {(c, d) for c in (False, True) for d in fam.head_dims} == set(picks)
    for name in picks.values():
        assert name in variants and variants[name]["algo"] == "wgmma"
