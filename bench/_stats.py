"""Statistics shared by the benchmarks: a median with a bootstrap interval, and a verdict
that says "not resolved" when the noise is larger than the distance to the goal."""

from __future__ import annotations

import numpy as np


def median_ci(values: list[float], resamples: int = 4000) -> tuple[float, float, float]:
    """Median and a 95% percentile-bootstrap confidence interval of the median."""
    data = np.asarray(values)
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(data, size=(resamples, data.size), replace=True), axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(np.median(data)), float(low), float(high)


def verdict(low: float, high: float, threshold: float) -> str:
    """Whether an interval lies below a ceiling, above it, or straddles it."""
    if high <= threshold:
        return "met"
    if low > threshold:
        return "NOT met"
    return "not resolved (the interval contains the threshold)"
