"""The selective-scan GPU families (tasks/selective-scan/templates-cuda, templates-mlx): schema,
knobs in step between the backends, constraints, seeds equal to the rendered defaults, every
setting passing the harness's static checks, parity with minijinja (what the Rust proposer
renders with), and the named variants."""

import re
import tomllib

import pytest

jinja2 = pytest.importorskip("jinja2", reason="jinja2 renders the families (pip install jinja2)")

from conftest import REPO  # noqa: E402
from render import Family, FamilyError, load_variants  # noqa: E402

TASK = REPO / "tasks" / "selective-scan"
SPEC = tomllib.loads((TASK / "task.toml").read_text())


@pytest.fixture(scope="module")
def cuda():
    return Family("cuda")


@pytest.fixture(scope="module")
def mlx():
    return Family("mlx")


def test_backends_share_knobs_and_rules(cuda, mlx):
    assert cuda.knobs == mlx.knobs
    assert cuda.constraints == mlx.constraints
    for fam, backend in ((cuda, "cuda"), (mlx, "mlx")):
        spec = tomllib.loads((fam.dir / "family.toml").read_text())
        assert spec["family"]["backends"] == [backend]
        assert set(spec["family"]) <= {"name", "description", "entry", "backends",
                                       "include_dirs", "targets"}
        for k in spec["knob"]:
            assert set(k) <= {"name", "description", "values", "type", "default"}


def test_space_defaults_and_constraints(cuda):
    space = 1
    for k in cuda.knobs.values():
        space *= len(k["values"])
    assert space <= 100_000
    valid = cuda.enumerate()
    # sequential: threads x state_lanes x exp2 x fuse, less 512 threads with fewer than 8
    # lanes; chunked: threads x (items, vec) pairs with vec | items x exp2 x fuse, less
    # 512 threads x 16 items (both spill); tiled: threads x channels x exp2 x fuse.
    assert len(valid) == (5 * 5 - 3) * 4 + (5 * 14 - 4) * 4 + 5 * 2 * 4
    d = cuda.resolve({})
    assert d["algo"] == "sequential" and d["exp2"] is False and d["fuse_epilogue"] is False
    for bad, msg in [({"items": 8}, "only apply to the chunked"),
                     ({"algo": "chunked", "state_lanes": 4}, "state_lanes only"),
                     ({"algo": "chunked", "items": 4, "vec": 8}, "vec must divide"),
                     ({"threads": 512, "state_lanes": 4}, "128 registers"),
                     ({"algo": "chunked", "threads": 512, "items": 16}, "128 registers"),
                     ({"channels": 16}, "channels only applies"),
                     ({"threads": 100}, "outside its domain"),
                     ({"exp2": 1}, "outside its domain"),
                     ({"warps": 4}, "unknown knobs")]:
        with pytest.raises(FamilyError, match=msg):
            cuda.resolve(bad)


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
    return out + list(load_variants().values())


def test_settings_pass_the_static_checks(cuda, mlx):
    from ksearch_harness.static_checks import check_python, check_source, kernel_dialects

    forbid_cuda = SPEC["backends"]["cuda"]["forbidden"]
    forbid_mlx = SPEC["backends"]["mlx"]["forbidden"]
    for knobs in covering_sample(cuda):
        assert check_source(cuda.render(knobs), forbid_cuda, "cuda") == [], knobs
        src = mlx.render(knobs)
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
    # The decode kernel is only for the mlx module.
    assert "decode_body" not in seq
    assert "decode_body" in Family("mlx").render({})


def test_named_variants_are_valid(cuda):
    variants = load_variants()
    assert len(variants) >= 10
    for name, knobs in variants.items():
        cuda.resolve(knobs)
    # mamba_model needs mlx; read its default from the source.
    import ast

    tree = ast.parse((REPO / "gpu" / "mamba" / "mamba_model.py").read_text())
    default = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "DEFAULT_VARIANT")
    assert default in variants


def test_minijinja_renders_identically(cuda, mlx):
    # The Rust proposer renders with minijinja (strict undefined; knobs, knobs map,
    # knob_summary, family and, for families with targets, target); the Python tools render
    # with jinja2. Same bytes and the same rule verdicts, or the offline search would compile
    # something nobody tested.
    minijinja = pytest.importorskip("minijinja", reason="pip install minijinja for the parity check")
    variants = list(load_variants().values()) + [{}]
    for fam in (cuda, mlx):
        templates = {}
        for d in [fam.dir] + fam.include_dirs:
            templates.update({p.name: p.read_text() for p in d.glob("*.j2")})
        env = minijinja.Environment(templates=templates, trim_blocks=True, lstrip_blocks=True,
                                    keep_trailing_newline=True, undefined_behavior="strict")
        for knobs in variants:
            full = fam.resolve(knobs)
            assert env.render_template(fam.entry, **fam.context(full)) == fam.render(knobs), knobs
        for knobs in fam.enumerate()[::11] + [{"items": 8}, {"algo": "chunked", "vec": 2}]:
            full = dict(fam.defaults(), **knobs)
            for expr, _ in fam.constraints:
                assert bool(env.eval_expr(expr, **full)) == bool(
                    fam.env().compile_expression(expr)(**full)), (knobs, expr)
