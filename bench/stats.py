"""Summaries every bench reports: median and p99 (nearest rank) of samples."""

from __future__ import annotations

import math
import statistics


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[float], *, scale: float = 1.0, digits: int = 2) -> dict:
    """``{"median", "p99", "n"}`` of *samples* multiplied by *scale* (1000: s → ms)."""
    values = [s * scale for s in samples]
    return {"median": round(statistics.median(values), digits), "p99": round(percentile(values, 0.99), digits), "n": len(values)}
