"""Picking among settings by noisy timings (the bench's scan variants, mamba_model.TunedScan, and
MLX's launch settings, mlx_env_probe.py): each is timed in interleaved rounds, and the pick
moves off a setting listed earlier only when a later one is faster by more than the
measurements move. Picks by one measurement per setting changed from run to run
(docs/results/mamba-gpu)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

# Interleaved timing rounds per setting.
ROUNDS = 3
# How far over the fastest median a setting listed earlier may be and still be picked.
PICK_MARGIN = 0.03


def rotations(items: Sequence[T], rounds: int) -> Iterator[list[T]]:
    """`items` once per round, round r starting at item r (mod their count), so no setting is
    always timed first or right after the same one."""
    for r in range(max(1, rounds)):
        k = r % len(items) if items else 0
        yield list(items[k:]) + list(items[:k])


def pick_steady(medians: dict[str, float], margin: float = PICK_MARGIN) -> str:
    """The first of `medians` (in their order) within `margin` of the fastest."""
    fastest = min(medians.values())
    return next(n for n, t in medians.items() if t <= fastest * (1 + margin))
