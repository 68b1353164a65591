"""The built-in tasks' held-out workloads do their job, checked through ctypes without the
harness: every cpu seed passes them, kernels that rely on an undeclared divisibility or skip
the numerics the task describes pass every shown workload but fail a held-out one (the harness
would flag them as shape_specialisation), and every custom generator's declared `reach` holds
on the workloads that use it (`ksearch tasks --check` trusts that declaration).

Run: python -m pytest tasks
"""

import pathlib
import shutil

import numpy as np
import pytest

from task_testing import TaskUnderTest

TASKS = pathlib.Path(__file__).resolve().parent
NAMES = ("softmax", "attention", "selective-scan", "copy")
OUTPUT = {"softmax": "y", "attention": "out", "selective-scan": "y", "copy": "y"}
_loaded = {}


def task(name):
    if name not in _loaded:
        _loaded[name] = TaskUnderTest(TASKS / name)
    return _loaded[name]


def failures(t, name, lib, workloads, seed=5):
    """Names of the workloads on which `lib` is out of tolerance."""
    bad = []
    for i, w in enumerate(workloads):
        params = dict(w["params"])
        inputs = t.make_inputs(params, seed=seed + i, workload=w)
        before = {k: v.copy() for k, v in inputs.items()}
        out = t.call_cpu(lib, inputs, OUTPUT[name], params)
        assert all(np.array_equal(before[k], inputs[k]) for k in inputs)
        expected = t.ref.reference(inputs, params)[OUTPUT[name]]
        if not t.passes(out, expected):
            bad.append(w["name"])
    return bad


needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


@needs_cc
@pytest.mark.parametrize("name", NAMES)
def test_the_seed_passes_every_held_out_workload(tmp_path, name):
    t = task(name)
    lib = t.build(t.dir / t.spec["backends"]["cpu"]["seed"], tmp_path / "seed.so")
    held_out = t.workloads("cpu", held_out=True)
    assert held_out
    assert failures(t, name, lib, held_out) == []


# Lazy kernels, made from the seeds by one textual edit each: (task, what it assumes, edit,
# the held-out workloads that must catch it). Each passes every shown workload.
LAZY = [
    ("softmax", "no max subtraction", ("expf(xr[c] - m)", "expf(xr[c])"),
     {"r7c4099-hot", "r5c1031-cold", "r97c257-rows"}),
    ("softmax", "cols a multiple of 8", ("c < cols", "c < (cols & ~(int64_t)7)"),
     {"r1c2", "r3c7", "r333c1001"}),
    ("attention", "no max subtraction", ("expf(s[j] - m)", "expf(s[j])"),
     {"b1h3l257d7-causal-hot"}),
    ("attention", "D a multiple of 32", ("d < D", "d < (D & ~(int64_t)31)"),
     {"b3h5l97d40-causal", "b2h3l131d13", "b2h1l1d13-causal"}),
    ("selective-scan", "no softplus threshold",
     ("dt > 20.0f ? dt : log1pf(expf(dt))", "log1pf(expf(dt))"),
     {"b1d17l257n7-z-softplus-spikes"}),
    ("selective-scan", "N a multiple of 8", ("n < N", "n < (N & ~(int64_t)7)"),
     {"b3d7l61n5-z-softplus", "b2d5l1n1-z", "b1d17l257n7-z-softplus-spikes"}),
    ("selective-scan", "dim a multiple of 8", ("d < dim", "d < (dim & ~(int64_t)7)"),
     {"b3d7l61n5-z-softplus", "b1d33l1001-softplus", "b2d5l1n1-z"}),
    ("copy", "n a multiple of 8", ("(size_t)n * sizeof(float)",
                                   "(size_t)(n & ~(int64_t)7) * sizeof(float)"),
     {"f32-n3", "f32-n7", "f32-n1001", "f32-n65537"}),
]


@needs_cc
@pytest.mark.parametrize("name,what,edit,caught", LAZY, ids=[f"{n}: {w}" for n, w, _, _ in LAZY])
def test_a_lazy_kernel_passes_the_shown_workloads_and_fails_held_out_ones(
        tmp_path, name, what, edit, caught):
    t = task(name)
    seed = (t.dir / t.spec["backends"]["cpu"]["seed"]).read_text()
    old, new = edit
    assert old in seed, f"the {name} seed no longer contains {old!r}"
    source = tmp_path / "lazy.c"
    source.write_text(seed.replace(old, new))
    lib = t.build(source, tmp_path / "lazy.so")
    # Shown workloads: the smallest two are enough to show the edit is harmless there.
    shown = sorted(t.workloads("cpu", held_out=False),
                   key=lambda w: np.prod([v for v in w["params"].values()
                                          if isinstance(v, int) and v > 1]))[:2]
    assert failures(t, name, lib, shown) == [], f"{what}: fails a shown workload"
    bad = set(failures(t, name, lib, t.workloads("cpu", held_out=True)))
    assert caught <= bad, f"{what}: held-out workloads {sorted(caught - bad)} let it pass"


def declared_reaches():
    """(task, workload, input, reach) for every custom dist with a declared `reach`."""
    out = []
    for name in NAMES:
        t = task(name)
        for w in t.spec["workloads"]:
            for t_in in t.spec["inputs"]:
                dist = w.get("dist", {}).get(t_in["name"]) or t_in.get("dist", {})
                if dist.get("kind") == "custom" and "reach" in dist:
                    out.append((name, w["name"], t_in["name"], dist["reach"]))
    return out


REACHES = declared_reaches()


def test_some_workloads_declare_a_reach():
    assert {r[0] for r in REACHES} == {"softmax", "selective-scan"}


@pytest.mark.parametrize("name,workload,input,reach", REACHES,
                         ids=[f"{r[0]}/{r[1]}/{r[2]}" for r in REACHES])
def test_custom_generators_reach_what_they_declare(name, workload, input, reach):
    t = task(name)
    w = next(w for w in t.spec["workloads"] if w["name"] == workload)
    params = dict(w["params"])
    t_in = next(x for x in t.spec["inputs"] if x["name"] == input)
    dist = w["dist"][input]
    for seed in range(3):
        x = t.draw(dist, input, np.random.default_rng(seed), t.shape(t_in, params), params)
        if "low" in reach:
            assert x.min() <= reach["low"], (seed, float(x.min()))
        if "high" in reach:
            assert x.max() >= reach["high"], (seed, float(x.max()))
