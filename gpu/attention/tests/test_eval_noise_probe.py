"""gpu/attention/eval_noise_probe.py end to end on MLX's CPU device, small: every mode runs for
both contenders and reports its samples (the probe's numbers on the H200 are in
docs/gpu-attention.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

HERE = Path(__file__).resolve().parents[1]

KERNEL = '''
import mlx.core as mx

def attention(*, q, k, v, B, H, L, D, causal):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5,
                                                mask="causal" if causal else None)
'''


def test_every_mode_is_timed_for_both_contenders(tmp_path):
    kernel = tmp_path / "k.py"
    kernel.write_text(KERNEL)
    out = tmp_path / "probe.json"
    subprocess.run([sys.executable, str(HERE / "eval_noise_probe.py"), "--kernel", str(kernel),
                    "--reps", "2", "--length", "16", "--json", str(out)],
                   check=True, cwd=HERE, timeout=600)
    res = json.loads(out.read_text())
    modes = ["bench", "fresh", "readback", "clear_prime", "no_gc"]
    assert set(res["modes"]) == {f"{who}/{m}" for who in ("ours", "native") for m in modes}
    for name, r in res["modes"].items():
        assert len(r["samples"]) == 2, name
        assert all(s > 0 for s in r["samples"]), name
        assert r["p10"] <= r["median"] <= r["p90"], name
