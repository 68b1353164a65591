"""Ground truth, baseline and a held-out input generator for the softmax task (see
task.toml)."""

import numpy as np


def reference(inputs, params):
    """Row softmax computed in float64, returned as float32."""
    x = np.asarray(inputs["x"], dtype=np.float64)
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    y = e / e.sum(axis=1, keepdims=True)
    return {"y": y.astype(np.float32)}


def baseline_numpy(inputs, params):
    """What a numpy user would write, in float32: the timed baseline."""
    x = inputs["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return {"y": e}


def make_x_rows(rng, shape, params):
    """Logits that break numerically careless kernels, in rows cycling through four kinds:
    at or above +100 (100 + |normal(0, 4)|: exp overflows float32 past 88.7 without the max
    subtraction), at or below -100 (every exp underflows, the row sums to 0), integers in
    [47, 53] (the maximum is tied many times) and constant rows (every output 1/cols, at a
    value in [-120, 120]). A kernel that subtracts one maximum for the whole matrix instead of
    each row's loses the -100 rows. Every draw of two rows or more has values at or below -100
    and at or above 100: the `reach` task.toml declares."""
    rows, cols = shape
    spread = np.abs(rng.normal(0.0, 4.0, size=shape))
    ties = rng.integers(47, 54, size=shape).astype(np.float64)
    level = rng.uniform(-120.0, 120.0, size=(rows, 1))
    kind = (np.arange(rows) % 4)[:, None]
    x = np.select([kind == 0, kind == 1, kind == 2],
                  [100.0 + spread, -100.0 - spread, ties],
                  np.broadcast_to(level, shape))
    return x.astype(np.float32)
