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


def parallel_rounds(ap, args) -> tuple[list[int], list[int]]:
    """``--parallel 1,10 --rounds 20,5`` as two lists of equal length (argparse error otherwise)."""
    parallel = [int(x) for x in args.parallel.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    if len(parallel) != len(rounds):
        ap.error("--parallel and --rounds need the same number of entries")
    return parallel, rounds
