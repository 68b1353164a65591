"""Intervals around medians and the ratios built from them.

A time is reported as the median of its samples with a distribution-free confidence interval
from order statistics (no assumption about the shape of timing noise, which is skewed and often
multimodal). A speedup is a ratio of two medians; its interval takes the worst pairing of the
two intervals and is widened by the machine's drift between blocks of samples (the yardstick's
`spread`), which the within-evaluation samples cannot see. A geometric mean over workloads takes
the geometric means of the bounds: the workloads' errors are not assumed independent, so the
interval does not shrink with their number.
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


def median(samples: Sequence[float]) -> float | None:
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        return None
    mid = n // 2
    return xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def block_spread(block_medians: Sequence[float]) -> float:
    """Relative half-range of the medians of consecutive blocks of samples: how far the
    machine drifts between measurements taken some time apart (0 for fewer than two)."""
    xs = [float(x) for x in block_medians if x and x > 0]
    if len(xs) < 2:
        return 0.0
    return (max(xs) / min(xs) - 1.0) / 2.0


def ratio_interval(num: tuple[float, float], den: tuple[float, float], spread: float = 0.0
                   ) -> tuple[float, float] | None:
    """Interval of num/den from the intervals of numerator and denominator (times in the same
    unit), widened by the relative `spread` on each side."""
    (nlo, nhi), (dlo, dhi) = num, den
    if min(nlo, nhi, dlo, dhi) <= 0:
        return None
    widen = 1.0 + max(spread, 0.0)
    return nlo / dhi / widen, nhi / dlo * widen


def widen_by_drift(interval: tuple[float, float], drift: float) -> tuple[float, float]:
    """A speedup interval measured while the machine ran `drift` times slower (> 1) or
    faster (< 1) than when its denominator was timed: slower makes the candidate look slower,
    so the upper bound moves up by `drift`; faster moves the lower bound down."""
    lo, hi = interval
    if drift > 1.0:
        return lo, hi * drift
    return lo * drift, hi


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
