"""Intervals around medians and the speedups built from them.

A time is reported as the median of its samples with a distribution-free confidence interval
from order statistics (no assumption about the shape of timing noise, which is skewed and often
multimodal). A speedup is the median of paired ratios (two contenders timed back to back in one
repetition), with the same kind of interval: a moment of machine load slows both members of a
pair and cancels. A product of two such ratios (the yardstick's baseline/reference times an
evaluation's reference/candidate) multiplies the bounds and is widened by the yardstick's
`spread` between blocks. A geometric mean over workloads takes the geometric means of the
bounds: the workloads' errors are not assumed independent, so the interval does not shrink with
their number.
"""

from __future__ import annotations

import math
from typing import Sequence

# Coverage of the median intervals. With fewer than 6 samples no pair of order statistics
# reaches it; the interval is then the full range (93.75% for 5 samples).
CONFIDENCE = 0.95


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2.0 ** n


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE
                    ) -> tuple[float, float] | None:
    """(lo, hi): the narrowest symmetric pair of order statistics (x_(j), x_(n+1-j)) that
    covers the population median with at least `confidence`, or the full range when no pair
    does. `None` for no samples."""
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        return None
    # Coverage of (x_(j), x_(n+1-j)) (1-based) is 1 - 2 P(X <= j-1): the largest j that keeps it.
    j = 1
    while j + 1 <= (n + 1) // 2 and 1.0 - 2.0 * _binom_cdf(j, n) >= confidence:
        j += 1
    return xs[j - 1], xs[n - j]


# The fewest samples whose extremes cover the median with CONFIDENCE (1 - 2 / 2^n >= 0.95).
MIN_COVERED = 6


def tight(samples: Sequence[float], half_width: float) -> bool:
    """Whether the median's interval (median_interval) is at most 2 x `half_width` of the
    median wide: enough samples for a figure of that relative precision. Never with fewer than
    MIN_COVERED samples, whose full range is not yet a 95% interval."""
    if len(samples) < MIN_COVERED:
        return False
    iv, med = median_interval(samples), median(samples)
    return (iv is not None and med is not None and med > 0
            and (iv[1] - iv[0]) / 2 <= half_width * med)


def median(samples: Sequence[float]) -> float | None:
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        return None
    mid = n // 2
    return xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def block_medians(samples: Sequence[float], blocks: int) -> list[float]:
    """Medians of `blocks` consecutive, nearly equal runs of `samples` (fewer if there are
    fewer samples)."""
    n = len(samples)
    k = min(blocks, n)
    out = []
    for i in range(k):
        m = median(samples[i * n // k:(i + 1) * n // k])
        if m is not None:
            out.append(m)
    return out


def block_spread(block_medians: Sequence[float]) -> float:
    """Relative half-range of the medians of consecutive blocks of samples: how far the
    machine drifts between measurements taken some time apart (0 for fewer than two)."""
    xs = [float(x) for x in block_medians if x and x > 0]
    if len(xs) < 2:
        return 0.0
    return (max(xs) / min(xs) - 1.0) / 2.0


# Shuffles behind drift_p: enough to tell p < 0.05 from p > 0.1 reliably, cheap for the few
# hundred samples a yardstick takes.
PERMUTATIONS = 200


def drift_p(samples: Sequence[float], blocks: int) -> float:
    """How often shuffled samples spread their block medians at least as far as the samples in
    the order they were taken: a permutation p-value for drift between blocks. A small one
    means the machine changed while the samples were taken; a large one means the blocks
    differ by no more than noise does (with a few samples per block, noise alone spreads block
    medians by several percent). Deterministic (a fixed shuffle seed), so it is reproducible
    from the stored samples. 1.0 for fewer than two blocks."""
    import random
    xs = [float(x) for x in samples]
    observed = block_spread(block_medians(xs, blocks))  # 0 for fewer than two blocks
    if observed <= 0:
        return 1.0
    rng = random.Random(0x5EED)
    at_least = 0
    for _ in range(PERMUTATIONS):
        rng.shuffle(xs)
        if block_spread(block_medians(xs, blocks)) >= observed:
            at_least += 1
    return (1 + at_least) / (1 + PERMUTATIONS)


def paired_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """num[i] / den[i] for samples taken together (one repetition each)."""
    return [float(a) / float(b) for a, b in zip(num, den) if a > 0 and b > 0]


def product_interval(a: tuple[float, float], b: tuple[float, float], spread: float = 0.0
                     ) -> tuple[float, float]:
    """Interval of a product of two positive quantities from theirs, widened by the relative
    `spread` on each side."""
    widen = 1.0 + max(spread, 0.0)
    return a[0] * b[0] / widen, a[1] * b[1] * widen


def geomean_interval(intervals: Sequence[tuple[float, float] | None]
                     ) -> tuple[float, float] | None:
    """The geometric means of the lower and of the upper bounds; `None` if any is missing."""
    if not intervals or any(iv is None for iv in intervals):
        return None
    los = [iv[0] for iv in intervals]  # type: ignore[index]
    his = [iv[1] for iv in intervals]  # type: ignore[index]
    if min(los) <= 0:
        return None
    return (math.exp(sum(map(math.log, los)) / len(los)),
            math.exp(sum(map(math.log, his)) / len(his)))


def contains(interval: Sequence[float] | None, value: float | None) -> bool:
    return (interval is not None and value is not None
            and interval[0] <= value <= interval[1])
