"""What the benchmarks (``bench/*.py``) share, installed with flock so that a
bench imports only installed, public modules (never a sibling script off
``sys.path``): median/p99 summaries, one JSON line per figure, and a
flock-lab of its own in a temporary directory.

Light to import: the lab's modules are imported by :func:`lab`, when a bench
asks for one.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flock.lab import LabPlan


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after *timeout* seconds: a process a bench started, gone; its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def percentile(samples: list[float], q: float) -> float:
    """The *q*-quantile of *samples* (nearest rank: a value that occurred)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[float], *, scale: float = 1.0, digits: int = 2) -> dict[str, Any]:
    """``{"median", "p99", "n"}`` of *samples* multiplied by *scale* (1000: s → ms)."""
    values = [s * scale for s in samples]
    return {
        "median": round(statistics.median(values), digits),
        "p99": round(percentile(values, 0.99), digits),
        "n": len(values),
    }


def stats_ms(samples: list[float]) -> dict[str, Any]:
    """:func:`summary` of samples in seconds, in milliseconds to 0.1 ms."""
    return summary(samples, scale=1000, digits=1)


def emit(doc: dict[str, Any]) -> None:
    """One figure: *doc* as one compact JSON line on stdout, flushed."""
    print(json.dumps(doc, separators=(",", ":")), flush=True)


@contextlib.asynccontextmanager
async def lab(nodes: int, agent_program: list[str] | None = None) -> AsyncIterator[LabPlan]:
    """A flock-lab of *nodes* nodes, up for the block and taken down (and its
    directory removed) after it, also when the block fails or is cancelled."""
    import shutil

    import trio

    from flock.lab import LabPlan, down, up

    directory = Path(tempfile.mkdtemp(prefix="flab-b-"))  # short: unix socket paths
    plan = LabPlan.make(directory, nodes)
    try:
        await up(plan, agent_program=agent_program)
        yield plan
    finally:
        with trio.move_on_after(60, shield=True):
            await down(directory)
        shutil.rmtree(directory, ignore_errors=True)
