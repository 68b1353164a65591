"""The harness's own array work on large tensors (task_code.py, dtypes.py, core.py): block-wise
input generation that is reproducible from the seed whatever the number of threads, bf16
conversions, and the piecewise comparisons, each checked against the implementation it
replaced (copied here verbatim as `_old_*`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import driver
from ksearch_harness import core, draw_cache, dtypes, parallel, task_code
from ksearch_harness.core import Comparison, PhaseClock, close, close_all, compare
from ksearch_harness.protocol import Dist, Task, TaskError, TensorSpec, Tolerance, Workload
from ksearch_harness.task_code import TaskCode


# --------------------------------------------------------------------------------------------
# The previous implementations


def _old_f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    out[np.isnan(x)] = 0x7FC0
    return out


def _old_bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _old_encode(name: str, values) -> np.ndarray:
    dt = dtypes.get(name)
    if name == "bf16":
        return _old_f32_to_bf16_bits(np.asarray(values, dtype=np.float32))
    if name == "bool":
        return np.asarray(values).astype(bool)
    return np.asarray(values).astype(dt.storage)


def _old_draw(name: str, dist: Dist, rng: np.random.Generator, shape) -> np.ndarray:
    if dist.kind == "normal":
        values = rng.standard_normal(shape, dtype=np.float64) * dist.std + dist.mean
    elif dist.kind == "uniform":
        values = rng.uniform(dist.low, dist.high, size=shape)
    else:
        values = rng.integers(int(dist.low), int(dist.high), size=shape)
    if not dtypes.get(name).is_float:
        values = np.asarray(values)
        if values.dtype.kind == "f":
            values = np.rint(values)
    return np.ascontiguousarray(_old_encode(name, values))


def _old_close(x, y, truth, tol):
    finite = np.isfinite(truth)
    scale = float(np.max(np.abs(truth[finite]))) if finite.any() else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        bound = tol.atol * scale + tol.rtol * np.abs(truth)
        within = np.abs(x - y) <= bound
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    return np.where(finite, within | same, same)


def _old_compare(out, truth, tol):
    ok = _old_close(out, truth, truth, tol)
    finite = np.isfinite(truth)
    if not finite.any():
        return Comparison(bool(ok.all()), 0.0, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(out[finite] - truth[finite])
        scale = float(np.max(np.abs(truth[finite])))
        rel = diff / np.maximum(np.abs(truth[finite]), max(scale * 1e-6, 1e-300))
    max_abs = float(np.max(diff)) if not np.isnan(diff).any() else math.nan
    max_rel = float(np.max(rel)) if not np.isnan(rel).any() else math.nan
    return Comparison(bool(ok.all()), max_abs, max_rel)


# --------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(params=[1, 4], ids=["1-thread", "4-threads"])
def threads(request, monkeypatch):
    monkeypatch.setenv(parallel.THREADS_ENV, str(request.param))
    return request.param


def _task() -> TaskCode:
    return TaskCode(Task("host-work", str(driver.FIXTURES / "softmax"), "reference.py",
                         "reference", None, None, None, ()))


def _workload(*specs: TensorSpec) -> Workload:
    return Workload("w", False, {}, tuple(specs), (), 0.0, 0.0)


NORMAL = Dist("normal", mean=0.5, std=2.0)
UNIFORM = Dist("uniform", low=-3.0, high=5.0)
INTS = Dist("rand_int", low=-7, high=90)


def _same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# --------------------------------------------------------------------------------------------
# Input generation


def test_small_inputs_keep_the_values_of_the_previous_algorithm():
    task = _task()
    shapes = [(2, 3), (5,), (task_code.DRAW_BLOCK,)]  # the last is exactly one block: old path
    cases = [("f32", NORMAL), ("f16", Dist("normal")), ("bf16", UNIFORM), ("f64", NORMAL),
             ("i32", INTS), ("u8", Dist("rand_int", low=0, high=200)), ("bool",
             Dist("rand_int", low=0, high=2)), ("i16", NORMAL), ("f32", INTS)]
    specs = tuple(TensorSpec(f"x{i}", name, shapes[i % len(shapes)], dist)
                  for i, (name, dist) in enumerate(cases))
    got = task.make_inputs(_workload(*specs), 12345, 2).stored
    rng = np.random.default_rng([12345, 2])
    for spec in specs:
        want = _old_draw(spec.dtype, spec.dist, rng, spec.shape)
        assert got[spec.name].dtype == want.dtype and got[spec.name].shape == want.shape
        assert got[spec.name].tobytes() == want.tobytes(), spec


def test_small_inputs_match_recorded_values():
    # Drawn by the implementation before block-wise generation, from seed 12345, workload 2.
    got = _task().make_inputs(_workload(TensorSpec("a", "f32", (2, 3), NORMAL),
                                        TensorSpec("b", "f16", (5,), Dist("normal"))),
                              12345, 2).stored
    assert got["a"].view(np.uint32).tolist() == [[3224478448, 1062368903, 3218970549],
                                                 [1051211212, 1070218669, 1075944461]]
    assert got["b"].view(np.uint16).tolist() == [47616, 48594, 46214, 12827, 14710]


@pytest.mark.parametrize("name,dist", [("f16", NORMAL), ("bf16", NORMAL), ("f32", UNIFORM),
                                       ("f64", NORMAL), ("i32", INTS), ("i8", NORMAL),
                                       ("bf16", INTS)])
def test_large_inputs_are_reproducible_and_independent_of_threads(name, dist, monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 1000)
    specs = (TensorSpec("a", name, (7, 1001), dist), TensorSpec("b", name, (3, 4), dist))
    wl = _workload(*specs)
    task = _task()
    runs = []
    for n in (1, 4, 1, 3):
        monkeypatch.setenv(parallel.THREADS_ENV, str(n))
        runs.append(task.make_inputs(wl, 99, 1).stored)
    for other in runs[1:]:
        for s in specs:
            assert other[s.name].tobytes() == runs[0][s.name].tobytes()
    a = runs[0]["a"]
    assert a.shape == (7, 1001) and a.dtype == dtypes.get(name).storage
    values = dtypes.get(name).decode(a)
    if dist.kind == "normal" and dtypes.get(name).is_float:
        assert abs(values.mean() - dist.mean) < 0.2 and abs(values.std() - dist.std) < 0.2
    elif dist.kind == "rand_int":
        assert values.min() >= dist.low and values.max() < dist.high
    # Another seed, another workload index: other values.
    assert task.make_inputs(wl, 100, 1).stored["a"].tobytes() != a.tobytes()
    assert task.make_inputs(wl, 99, 0).stored["a"].tobytes() != a.tobytes()


@pytest.mark.parametrize("size", [999, 1000, 1001, 1999, 2000, 2001, 5500])
def test_blocks_are_drawn_from_spawned_generators(size, monkeypatch, threads):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 1000)
    spec = TensorSpec("a", "f32", (size,), NORMAL)
    got = _task().make_inputs(_workload(spec), 7, 3).stored["a"]
    rng = np.random.default_rng([7, 3])
    if size <= 1000:
        want = _old_draw("f32", NORMAL, rng, (size,))
    else:
        # One seed from the workload's generator, spawned into one generator per block.
        entropy = [int(e) for e in rng.integers(0, 1 << 63, size=2, dtype=np.int64)]
        children = np.random.SeedSequence(entropy).spawn(-(-size // 1000))
        blocks = []
        for i, child in enumerate(children):
            n = min(1000, size - i * 1000)
            x = np.random.Generator(np.random.PCG64(child)).standard_normal(n, dtype=np.float32)
            blocks.append(x * np.float32(2.0) + np.float32(0.5))
        want = np.concatenate(blocks)
    assert got.tobytes() == want.tobytes()


def test_bf16_blocks_round_like_the_previous_encoder(monkeypatch, threads):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 4096)
    spec = TensorSpec("a", "bf16", (3, 5000), Dist("normal", mean=0.0, std=1e3))
    got = _task().make_inputs(_workload(spec), 3, 0).stored["a"].reshape(-1)
    rng = np.random.default_rng([3, 0])
    entropy = [int(e) for e in rng.integers(0, 1 << 63, size=2, dtype=np.int64)]
    children = np.random.SeedSequence(entropy).spawn(4)
    f32 = np.concatenate([
        np.random.Generator(np.random.PCG64(c)).standard_normal(
            min(4096, 15000 - i * 4096), dtype=np.float32) * np.float32(1e3)
        for i, c in enumerate(children)])
    assert np.array_equal(got, _old_f32_to_bf16_bits(f32))


def test_full_size_block_boundary():
    # One element past a real block: two blocks, the second of one element.
    spec = TensorSpec("a", "f16", (task_code.DRAW_BLOCK + 1,), Dist("normal"))
    wl = _workload(spec)
    first = _task().make_inputs(wl, 5, 0).stored["a"]
    again = _task().make_inputs(wl, 5, 0).stored["a"]
    assert first.tobytes() == again.tobytes()
    assert np.isfinite(first).all() and abs(float(first.astype(np.float64).std()) - 1) < 0.01


# Large float inputs drawn on the device (TaskCode.device_draw; the cuda backend's judge)


class _RecordingDraw:
    """A DeviceDraw that fills from numpy with its seed and records every call."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, out, dtype_name, kind, a, b, seed):
        self.calls.append((out.shape, out.dtype, dtype_name, kind, a, b, seed))
        g = np.random.default_rng(seed)
        vals = (g.standard_normal(out.size) * b + a if kind == "normal"
                else g.uniform(a, b, size=out.size))
        out.reshape(-1)[...] = dtypes.get(dtype_name).encode(vals)


def _device_task(draw) -> TaskCode:
    t = _task()
    t.device_draw = draw
    return t


def test_large_float_inputs_are_drawn_by_the_device_from_one_seed_of_the_stream(monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 1000)
    specs = (TensorSpec("a", "f16", (3, 700), NORMAL), TensorSpec("b", "f32", (10,), UNIFORM),
             TensorSpec("c", "bf16", (2001,), UNIFORM))
    wl = _workload(*specs)
    draw = _RecordingDraw()
    got = _device_task(draw).make_inputs(wl, 7, 2).stored
    host = _task().make_inputs(wl, 7, 2).stored
    # Two large inputs went to the device, each with its distribution's parameters and a seed
    # made from the two integers the blocked draw would have taken from the workload's stream.
    assert [c[:6] for c in draw.calls] == [
        ((3, 700), dtypes.get("f16").storage, "f16", "normal", 0.5, 2.0),
        ((2001,), dtypes.get("bf16").storage, "bf16", "uniform", -3.0, 5.0)]
    rng = np.random.default_rng([7, 2])
    entropy = [int(e) for e in rng.integers(0, 1 << 63, size=2, dtype=np.int64)]
    hi, lo = (int(x) for x in np.random.SeedSequence(entropy).generate_state(2, np.uint32))
    assert draw.calls[0][6] == ((hi << 32) | lo) & ((1 << 63) - 1)
    # So the small input after it, drawn on the host, is the host path's value exactly.
    assert got["b"].tobytes() == host["b"].tobytes()
    assert got["a"].tobytes() != host["a"].tobytes()
    # The same seed again: the same bytes; another seed or workload: others.
    again = _device_task(_RecordingDraw()).make_inputs(wl, 7, 2).stored
    assert all(again[n].tobytes() == got[n].tobytes() for n in ("a", "b", "c"))
    assert _device_task(_RecordingDraw()).make_inputs(wl, 8, 2).stored["a"].tobytes() \
        != got["a"].tobytes()


def test_integer_custom_and_small_inputs_stay_on_the_host(monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 100)
    draw = _RecordingDraw()
    specs = (TensorSpec("i", "i32", (20, 20), INTS), TensorSpec("x", "f32", (4, 50), Dist("custom")),
             TensorSpec("s", "f32", (99,), NORMAL))
    wl = _workload(*specs)
    got = _device_task(draw).make_inputs(wl, 3, 0).stored
    want = _task().make_inputs(wl, 3, 0).stored
    assert draw.calls == []
    assert all(got[n].tobytes() == want[n].tobytes() for n in ("i", "x", "s"))


def test_a_device_drawn_input_is_kept_without_another_copy(monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 100)
    draw_cache.enable(True)
    try:
        drawn = _device_task(_RecordingDraw()).make_inputs(
            _workload(TensorSpec("a", "f32", (400,), NORMAL)), 1, 0)
        kept = draw_cache.put(("inputs", "device-drawn"), drawn.stored, lambda c: c)
        assert kept["a"] is drawn.stored["a"] and not kept["a"].flags.writeable
        # An array on the heap is still copied off it.
        heap = np.arange(400, dtype=np.float32)
        other = draw_cache.put(("inputs", "heap"), {"a": heap}, lambda c: c)
        assert other["a"] is not heap and np.array_equal(other["a"], heap)
        assert heap.flags.writeable
    finally:
        draw_cache.clear()
        draw_cache.enable(False)


def test_only_maps_the_cache_made_are_kept_without_a_copy():
    # A map another process could write (the arena, shared device memory) or any map the
    # draw cache did not make is copied like a heap array.
    import mmap
    shared = np.frombuffer(mmap.mmap(-1, 4096), dtype=np.float32)
    own = draw_cache.off_heap_empty((1024,), np.dtype(np.float32))
    assert draw_cache.off_heap(shared) is not shared and shared.flags.writeable
    assert draw_cache.off_heap(own) is own and not own.flags.writeable
    # A view of part of one of its maps is no whole map either.
    part = draw_cache.off_heap_empty((1024,), np.dtype(np.float32))[:512]
    assert draw_cache.off_heap(part) is not part


def test_a_failing_device_draw_is_a_task_error(monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 100)

    def broken(*_):
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(TaskError, match="on the device failed.*out of memory"):
        _device_task(broken).make_inputs(_workload(TensorSpec("a", "f16", (200,), NORMAL)), 1, 0)


def test_the_cuda_backend_draws_on_the_device_and_the_others_on_the_host():
    from ksearch_harness import adapters
    from ksearch_harness.adapters import device
    assert adapters.large_input_drawer("cuda") is device.torch_draw_into
    assert adapters.large_input_drawer("mlx") is None
    assert adapters.large_input_drawer("cpu") is None


def _fake_torch(monkeypatch):
    """The tests' numpy stand-in for PyTorch (tests/fake_torch), as `torch` in this process."""
    import importlib.util
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parent / "fake_torch" / "fake_torch_impl.py"
    spec = importlib.util.spec_from_file_location("fake_torch_impl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fake = module.FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake


def test_a_device_tensor_read_to_the_host_lands_in_a_map_the_cache_keeps(monkeypatch):
    from ksearch_harness.adapters import device
    fake = _fake_torch(monkeypatch)
    values = np.random.default_rng(3).standard_normal((4, 1000)).astype(np.float32)
    t = fake.from_numpy(values.copy())
    t.is_cuda = True  # the fake's memory is the host's; the function takes it for the GPU's
    got = device.torch_to_host(t, np.dtype(np.float32))
    assert np.array_equal(got, values) and draw_cache._whole_map(got)
    draw_cache.enable(True)
    try:
        kept = draw_cache.put(("truth", "read"), {"out": got}, lambda c: c)
        assert kept["out"] is got  # kept without another copy
    finally:
        draw_cache.clear()
        draw_cache.enable(False)
    # A host tensor's storage is copied, as before: the caller owns what it gets.
    h = fake.from_numpy(values)
    again = device.torch_to_host(h, np.dtype(np.float32))
    assert np.array_equal(again, values) and not np.shares_memory(again, values)


def test_a_cuda_error_in_a_device_draw_marks_the_judges_device_lost(monkeypatch):
    from ksearch_harness import worker
    from ksearch_harness.adapters import device
    fake = _fake_torch(monkeypatch)

    def sticky(self, *args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(type(fake.empty((1,), fake.float32)), "normal_", sticky)
    out = np.zeros(100, dtype=np.float32)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        device.torch_draw_into(out, "f32", "normal", 0.0, 1.0, 7)
    # The persistent judge's worker sees it after the request and hands the next to a fresh
    # worker; the mark is read once.
    assert worker._forget_device() is True
    assert worker._forget_device() is False
    # Any other failure of a draw (not CUDA's) leaves the device as it was.
    monkeypatch.setattr(type(fake.empty((1,), fake.float32)), "normal_",
                        lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("bad shape")))
    with pytest.raises(RuntimeError, match="bad shape"):
        device.torch_draw_into(out, "f32", "normal", 0.0, 1.0, 7)
    assert worker._forget_device() is False


@pytest.mark.parametrize("name,dist", [("f16", NORMAL), ("bf16", NORMAL), ("f32", UNIFORM),
                                       ("bf16", UNIFORM)])
def test_torch_draw_fills_storage_bits_from_the_seeded_generator(monkeypatch, name, dist):
    # PyTorch's part runs on the device (gpu/ checks); here the fake stands in, which draws
    # with numpy, to check what the function does around the generator: seeding, the
    # conversion to the dtype's storage bits, and the copy into the host array.
    from ksearch_harness.adapters import device
    fake = _fake_torch(monkeypatch)
    dt = dtypes.get(name)
    a, b = (dist.mean, dist.std) if dist.kind == "normal" else (dist.low, dist.high)
    out = np.zeros((64, 1000), dtype=dt.storage)
    device.torch_draw_into(out, name, dist.kind, a, b, 1234)
    again = np.zeros_like(out)
    device.torch_draw_into(again, name, dist.kind, a, b, 1234)
    assert fake.generators_made == 2 and out.tobytes() == again.tobytes()
    values = dt.decode(out).astype(np.float64)
    if dist.kind == "normal":
        assert abs(values.mean() - a) < 0.05 and abs(values.std() - b) < 0.05
    else:
        assert values.min() >= a and values.max() <= b
        assert abs(values.mean() - (a + b) / 2) < 0.1
    # The values are the generator's float32 draws rounded to the dtype.
    g = np.random.default_rng(1234)
    f32 = (g.standard_normal(out.size) * b + a if dist.kind == "normal"
           else g.uniform(a, b, size=out.size)).astype(np.float32)
    assert np.array_equal(out.reshape(-1), dt.encode(f32))


def test_custom_inputs_are_untouched(monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 10)
    task = _task()
    spec = TensorSpec("x", "f32", (4, 50), Dist("custom"))
    got = task.make_inputs(_workload(spec), 11, 0).stored["x"]
    want = np.asarray(task.module.make_x(np.random.default_rng([11, 0]), (4, 50), {}),
                      dtype=np.float32)
    assert got.tobytes() == want.tobytes()


def test_perturb_of_a_large_input_changes_one_element(monkeypatch):
    monkeypatch.setattr(task_code, "DRAW_BLOCK", 100)
    task = _task()
    wl = _workload(TensorSpec("a", "bf16", (30, 30), Dist("normal")))
    inputs = task.make_inputs(wl, 1, 0)
    probe = task.perturb(inputs, wl, 2, 0)
    assert probe is not None
    assert int(np.count_nonzero(probe.stored["a"] != inputs.stored["a"])) == 1


def test_reference_inputs_are_private_copies():
    task = _task()
    wl = _workload(TensorSpec("a", "bf16", (4, 4), Dist("normal")),
                   TensorSpec("b", "f16", (4, 4), Dist("normal")),
                   TensorSpec("c", "f32", (4, 4), Dist("normal")))
    inputs = task.make_inputs(wl, 1, 0)
    before = {k: v.copy() for k, v in inputs.stored.items()}
    ref = inputs.for_reference()
    assert ref["a"].dtype == np.float32 and ref["b"].dtype == np.float16
    assert np.array_equal(ref["a"], _old_bf16_bits_to_f32(before["a"]))
    for v in ref.values():
        v[...] = 0
    for k, v in inputs.stored.items():
        assert v.tobytes() == before[k].tobytes()


def test_check_outputs_keeps_narrow_floats_exactly():
    task = _task()
    spec = TensorSpec("y", "f32", (3,))
    wl = Workload("w", False, {}, (), (spec,), 0.0, 0.0)
    for value, want in [(np.array([1.5, -2.0, np.nan], np.float32), np.float32),
                        (np.array([1.5, -2.0, np.inf], np.float16), np.float32),
                        (np.array([1.5, -2.0, 1e300]), np.float64),
                        ([1, 2, 3], np.float64), (np.array([1, 2, 3], np.int64), np.float64)]:
        got = task.check_outputs({"y": value}, wl, "reference")["y"]
        assert got.dtype == want
        assert np.array_equal(got.astype(np.float64), np.asarray(value, dtype=np.float64),
                              equal_nan=True)


# --------------------------------------------------------------------------------------------
# bf16


def _bf16_edge_values() -> np.ndarray:
    bits = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
            0x7FBFFFFF, 0xFFFFFFFF, 0xFFFF8000, 0x7FFF8000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
            0x7F7F7FFF, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F817FFF, 0x00000001, 0x00008000,
            0x00018000, 0x807FFFFF, 0x00800000, 0x3F800000, 0xBF800000, 0x4049_0FDB]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def test_bf16_encoding_matches_the_previous_implementation(threads):
    rng = np.random.default_rng(1)
    patterns = rng.integers(0, 1 << 32, size=300_000, dtype=np.uint64).astype(np.uint32)
    # Every low half-word at a few exponents: all tie and carry cases.
    low = np.arange(1 << 16, dtype=np.uint32)
    sweeps = np.concatenate([(hi << 16) | low for hi in
                             np.array([0x3F80, 0x3F81, 0x7F7F, 0xFF7F, 0x0000, 0x7F80, 0xFFC0],
                                      dtype=np.uint32)])
    for x in (_bf16_edge_values(), patterns.view(np.float32), sweeps.view(np.float32),
              # above the size where the conversion is spread over threads
              np.tile(patterns.view(np.float32), 5)):
        want = _old_f32_to_bf16_bits(x)
        got = dtypes.get("bf16").encode(x)
        assert got.dtype == np.uint16 and got.shape == x.shape
        assert np.array_equal(got, want)
    # float64 values round to float32 first, as before
    x64 = rng.standard_normal(10_000) * 1e5
    x64[::97] = np.nan
    x64[::101] = np.inf
    assert np.array_equal(dtypes.get("bf16").encode(x64), _old_encode("bf16", x64))
    # shapes are kept
    x2 = rng.standard_normal((3, 4, 5)).astype(np.float32)
    assert np.array_equal(dtypes.get("bf16").encode(x2), _old_f32_to_bf16_bits(x2))


def test_bf16_nan_rounding_edges():
    enc = dtypes.get("bf16").encode(_bf16_edge_values())
    as_dict = dict(zip(_bf16_edge_values().view(np.uint32).tolist(), enc.tolist()))
    assert as_dict[0x7F800001] == 0x7FC0 and as_dict[0xFFFFFFFF] == 0x7FC0  # NaN stays NaN
    assert as_dict[0x7F7FFFFF] == 0x7F80  # the largest float32 rounds to inf
    assert as_dict[0x3F808000] == 0x3F80 and as_dict[0x3F818000] == 0x3F82  # ties to even
    assert as_dict[0xFF800000] == 0xFF80 and as_dict[0x80000000] == 0x8000


def test_bf16_decoding_matches_the_previous_implementation():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for b in (every, every.reshape(256, 256), np.tile(every, 20)):
        got = dtypes.get("bf16").decode_exact(b)
        want = _old_bf16_bits_to_f32(b)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
        with np.errstate(invalid="ignore"):  # signalling NaNs
            assert dtypes.get("bf16").decode(b).tobytes() == \
                want.astype(np.float64).tobytes()


@pytest.mark.parametrize("name", ["f16", "bf16", "f32", "f64", "i32", "u8", "bool"])
def test_decode_exact_holds_the_decoded_values(name):
    dt = dtypes.get(name)
    stored = dt.encode(np.array([0.0, -1.5, 3.0, 65504.0, 100.0, 1.0]))
    exact = dt.decode_exact(stored)
    assert exact.dtype == (np.float32 if name in ("f16", "bf16", "f32") else np.float64)
    assert np.array_equal(exact.astype(np.float64), dt.decode(stored))


# --------------------------------------------------------------------------------------------
# Comparisons


def _assert_same_comparison(got: Comparison, want: Comparison) -> None:
    assert got.ok == want.ok
    assert _same_float(got.max_abs, want.max_abs), (got, want)
    assert _same_float(got.max_rel, want.max_rel), (got, want)


def _cases(rng: np.random.Generator, n: int):
    truth = rng.standard_normal(n).astype(np.float32).astype(np.float64) * 10
    good = truth * (1 + rng.standard_normal(n) * 1e-4)
    yield "close", good, truth
    bad = good.copy()
    bad[n // 3] += 5.0
    yield "one-off", bad, truth
    t = truth.copy()
    t[[1, n // 2, n - 1]] = [np.inf, -np.inf, np.nan]
    o = good.copy()
    o[[1, n // 2, n - 1]] = [np.inf, -np.inf, np.nan]
    yield "non-finite-truth-matched", o, t
    o2 = o.copy()
    o2[n // 2] = np.inf
    yield "inf-sign-wrong", o2, t
    o3 = good.copy()
    o3[n // 4] = np.nan
    yield "nan-output", o3, truth
    o4 = good.copy()
    o4[n // 5] = np.inf
    yield "inf-output", o4, truth
    o5 = o3.copy()
    o5[n // 6] = np.inf
    yield "nan-and-inf-output", o5, truth
    yield "all-nan-truth", good, np.full(n, np.nan)
    yield "all-nan-both", np.full(n, np.nan), np.full(n, np.nan)
    z = truth.copy()
    z[: n // 2] = 0.0
    yield "zeros", np.zeros(n), z
    yield "tiny", truth * 1e-310, truth * 1e-310 * (1 + 1e-9)
    with np.errstate(over="ignore"):
        huge = truth * 1e307, truth * 1e307 * 1.5  # some overflow to inf
    yield "huge", *huge
    yield "signed-zero", np.full(n, -0.0), np.zeros(n)
    yield "empty", np.zeros(0), np.zeros(0)


@pytest.mark.parametrize("n", [3, 7, 1000, 5003])
def test_compare_and_close_match_the_previous_implementation(n, monkeypatch, threads):
    # Small pieces put the special values in different pieces, and many pieces on the pool.
    monkeypatch.setattr(core, "COMPARE_PIECE", 64)
    rng = np.random.default_rng(n)
    tols = [Tolerance(2e-3, 2e-3), Tolerance(0.0, 0.0), Tolerance(1e-2, 0.0),
            Tolerance(0.0, 1e-1)]
    for label, out, truth in _cases(rng, n):
        for tol in tols:
            want = _old_compare(out, truth, tol)
            _assert_same_comparison(compare(out, truth, tol), want)
            other = out[::-1].copy() if out.size else out
            want_close = _old_close(out, other, truth, tol)
            got_close = close(out, other, truth, tol)
            assert got_close.shape == want_close.shape
            assert np.array_equal(got_close, want_close), label
            assert close_all(out, other, truth, tol) == bool(want_close.all())


def test_float32_operands_compare_as_their_float64_values(monkeypatch, threads):
    monkeypatch.setattr(core, "COMPARE_PIECE", 256)
    rng = np.random.default_rng(5)
    n = 4099
    truth = (rng.standard_normal(n) * 3).astype(np.float32)
    for dt in ("f16", "bf16", "f32"):
        d = dtypes.get(dt)
        stored = d.encode(truth * np.float32(1.0 + 3e-3) + np.float32(1e-3))
        stored[::500] = d.encode(np.array([np.nan]))[0]
        out32 = d.decode_exact(stored)
        out64 = d.decode(stored)
        assert out32.dtype == np.float32
        for tol in (Tolerance(2e-3, 2e-3), Tolerance(1.6e-2, 1.6e-2), Tolerance(5e-3, 0.0)):
            want = _old_compare(out64, truth.astype(np.float64), tol)
            _assert_same_comparison(compare(out32, truth, tol), want)
            want_close = _old_close(out64, out64[::-1], truth.astype(np.float64), tol)
            assert np.array_equal(close(out32, out32[::-1], truth, tol), want_close)
        # Differences that float32 arithmetic would round away still count.
        t = np.array([1.0, 16777216.0], dtype=np.float32)
        o = np.array([1.0 + 2.0 ** -23, 16777218.0], dtype=np.float32)
        tight = Tolerance(0.0, 0.0)
        _assert_same_comparison(compare(o, t, tight),
                                _old_compare(o.astype(np.float64), t.astype(np.float64),
                                             tight))


def test_broadcast_operands_are_still_accepted():
    truth = np.array([[1.0, 2.0], [3.0, np.inf]])
    tol = Tolerance(1e-3, 1e-3)
    for x in (np.array([1.0, 2.0]), np.array([3.0]), np.float32(2.0), np.array([[np.inf]])):
        assert np.array_equal(close(x, truth, truth, tol), _old_close(x, truth, truth, tol))
        assert close_all(x, truth, truth, tol) == bool(_old_close(x, truth, truth, tol).all())
    # a single value against a large truth, as the task sanity check compares them
    big = np.random.default_rng(0).standard_normal(20_000)
    for v in (0.0, float(big.mean()), 5.0):
        want = _old_close(np.full(big.shape, v), big, big, tol)
        assert np.array_equal(close(np.full(1, v), big, big, tol), want)
        assert close_all(np.full(1, v), big, big, tol) == bool(want.all())


def test_large_comparison_uses_the_pool_and_agrees(threads):
    rng = np.random.default_rng(9)
    n = 3 * core.COMPARE_PIECE + 17
    truth = rng.standard_normal(n).astype(np.float32)
    out = (truth * np.float32(1.001)).astype(np.float32)
    out[n - 1] = np.nan
    tol = Tolerance(1e-3, 1e-3)
    _assert_same_comparison(compare(out, truth, tol),
                            _old_compare(out.astype(np.float64), truth.astype(np.float64), tol))


# --------------------------------------------------------------------------------------------
# Odds and ends


@pytest.mark.parametrize("a,b", [
    (np.arange(10, dtype=np.uint16), np.arange(10, dtype=np.uint16)),
    (np.arange(10, dtype=np.uint16), np.arange(1, 11, dtype=np.uint16)),
    (np.arange(7, dtype=np.uint8), np.arange(7, dtype=np.uint8)),
    (np.zeros(3, dtype=np.float32), np.full(3, -0.0, dtype=np.float32)),
    (np.full(3, np.nan, dtype=np.float32), np.full(3, np.nan, dtype=np.float32)),
    (np.zeros((2, 3)), np.zeros((3, 2))),
    (np.zeros(4), np.zeros(3)),
    (np.zeros(0), np.zeros(0)),
    (np.arange(12.0).reshape(3, 4)[:, ::2], np.array([[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]])),
])
def test_same_bytes_is_a_byte_comparison(a, b):
    assert dtypes.same_bytes(a, b) == (a.tobytes() == b.tobytes())


def test_thread_count_knob(monkeypatch):
    monkeypatch.setenv(parallel.THREADS_ENV, "3")
    assert parallel.threads() == 3
    for junk in ("0", "-2", "many", ""):
        monkeypatch.setenv(parallel.THREADS_ENV, junk)
        assert 1 <= parallel.threads() <= parallel.DEFAULT_MAX_THREADS
    monkeypatch.setenv(parallel.THREADS_ENV, "4")
    assert parallel.map_ranges(lambda lo, hi: (lo, hi), 10, 3) == [(0, 3), (3, 6), (6, 9),
                                                                   (9, 10)]
    assert parallel.map_items(lambda i: i * i, 5) == [0, 1, 4, 9, 16]
    # work split from inside a pool thread runs inline instead of waiting on the pool
    assert parallel.map_items(lambda i: parallel.map_items(lambda j: i + j, 3), 4) == \
        [[i + j for j in range(3)] for i in range(4)]


def test_phase_clock_attributes_nested_time_to_the_inner_phase(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(core.time, "perf_counter", lambda: now[0])
    clock = PhaseClock()
    with clock("checks"):
        now[0] += 1.0
        with clock("inputs"):
            now[0] += 2.0
        now[0] += 0.5
        with clock("inputs"):
            now[0] += 0.25
    now[0] += 4.0
    assert clock.snapshot() == {"checks": 1.5, "inputs": 2.25, "total": 7.75}


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "absent"


def _thp_eligible(addr: int) -> bool | None:
    """THPeligible of the mapping of this process that holds `addr` (/proc/self/smaps; the
    kernel may have merged it with a neighbour of the same flags): whether the kernel may back
    it with huge pages (whether it finds free ones at a fault is up to the machine's memory at
    that moment)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "THPeligible:":
            return line.split()[1] == "1"
    return None


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"),
                    reason="the kernel gives no transparent huge pages here")
def test_large_kept_arrays_live_on_huge_pages():
    # A kept array (draw_cache.off_heap) of several huge pages may be backed by them; a small
    # one stays on ordinary pages.
    big = draw_cache.off_heap(np.ones(8 << 20, dtype=np.float32))  # 32 MiB
    small = draw_cache.off_heap(np.ones(1 << 10, dtype=np.float32))
    drawn = draw_cache.off_heap_empty((4 << 20,), np.dtype(np.float64))
    drawn[...] = 1.0
    cases = [(big, True), (drawn, True)]
    if _thp_mode() == "madvise":  # under `always` any anonymous map may be eligible
        cases.append((small, False))
    for arr, want_huge in cases:
        eligible = _thp_eligible(arr.ctypes.data)
        assert eligible is not None, "mapping not found"
        assert eligible == want_huge, (arr.nbytes, eligible)
