"""Ground truth and baseline for the softmax task (see task.toml)."""

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
