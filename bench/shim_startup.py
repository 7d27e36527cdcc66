"""Shim start-up: `CNI_COMMAND=VERSION flock` against a bare `python3 -I -S -c pass`.

Every variant runs in the same process, interleaved round by round, so machine
noise hits them alike.  Variants:

- baseline:       <python> -I -S -c pass
- bundle-IS:      the one-file shim (a script, flock.cni_fastpath + embedded modules) with shebang `<python> -IS`
- bundle-env:     the one-file shim with the default shebang `/usr/bin/env python3`
                  (PATH is set so `python3` is <python>)
- console-script: the venv's `flock` entry point (site-packages, editable install)

Usage: .venv/bin/python bench/shim_startup.py [--iterations N] [--python /usr/bin/python3]
Prints a table, then the figures as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flock.shim_bundle import build_shim

STDIN = b'{"cniVersion": "1.1.0"}'


def _child_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run; CPU time is the steadier figure on a busy machine."""
    cpu0, began = _child_cpu_s(), time.perf_counter_ns()
    proc = subprocess.run(argv, input=STDIN, env=env, capture_output=True)
    wall, cpu = (time.perf_counter_ns() - began) / 1e6, (_child_cpu_s() - cpu0) * 1e3
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed: {proc.stderr.decode()}")
    return wall, cpu


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    wall = sorted(w for w, _ in samples)
    cpu = sorted(c for _, c in samples)
    return {
        "median_ms": round(statistics.median(wall), 2),
        "p99_ms": round(wall[min(len(wall) - 1, int(len(wall) * 0.99))], 2),
        "cpu_median_ms": round(statistics.median(cpu), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument(
        "--python", default="/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    )
    opts = parser.parse_args()

    python = opts.python
    env = {"CNI_COMMAND": "VERSION", "PATH": f"{Path(python).parent}:/usr/bin:/bin"}
    with tempfile.TemporaryDirectory() as tmp:
        fast, default = Path(tmp) / "flock-IS", Path(tmp) / "flock-env"
        build_shim(fast, python=f"{python} -IS")
        build_shim(default)
        variants = {
            "baseline": [python, "-I", "-S", "-c", "pass"],
            "bundle-IS": [str(fast)],
            "bundle-env": [str(default)],
            "console-script": [str(Path(sys.executable).parent / "flock")],
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for argv in variants.values():  # warm the page cache
            measure(argv, env)
        for _ in range(opts.iterations):
            for name, argv in variants.items():
                samples[name].append(measure(argv, env))

    results = {name: summary(s) for name, s in samples.items()}
    base, base_cpu = results["baseline"]["median_ms"], results["baseline"]["cpu_median_ms"]
    for name, r in results.items():
        r["over_baseline_ms"] = round(r["median_ms"] - base, 2)
        r["cpu_over_baseline_ms"] = round(r["cpu_median_ms"] - base_cpu, 2)
        print(
            f"{name:15} wall median {r['median_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  (+{r['over_baseline_ms']:.2f})"
            f"   cpu median {r['cpu_median_ms']:6.2f} ms (+{r['cpu_over_baseline_ms']:.2f})"
        )
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {
                "bench": "shim_startup",
                "iterations": opts.iterations,
                "python": python,
                "python_version": version,
                "builder_version": sys.version.split()[0],
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
