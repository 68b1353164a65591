"""CPU tests of gpu/mamba and the selective-scan GPU families. The families are rendered by
ksearch (gpu/ksearch_render.py: $KSEARCH_BIN, else ksearch on PATH, else this checkout's build).
Optional packages (mlx, mlx-lm, torch, mambapy, a C++20 compiler) are skipped with a reason when
absent: run `python -m pytest gpu/mamba/tests -rs` to see which."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAMBA = HERE.parent
REPO = MAMBA.parents[1]
for p in (MAMBA, MAMBA / "emu", REPO / "harness", REPO / "gpu"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def model_constant(name: str):
    """A literal constant of mamba_model.py (DEFAULT_VARIANT, AUTO_VARIANTS), read from its
    source: importing the module needs MLX."""
    import ast

    tree = ast.parse((MAMBA / "mamba_model.py").read_text())
    return next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == name)
