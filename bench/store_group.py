"""The allocation store under concurrent writers: W Trio tasks, each running a
pod's store traffic (put pending → commit → delete, each a transaction at the
store's synchronous setting) over and over, against this checkout's store and, with
``--before DIR``, another checkout's (e.g. one without group commit), in
the same run, taking turns.  Each variant runs in its own process, on a fresh
database in ``--dir`` (default: a temporary directory under /var/tmp, i.e. on
disk).

Prints a human summary, then the figures as a final JSON line.

    python bench/store_group.py [--writers 1,10] [--pods 400] [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(state_dir: str, writers: int, pods: int) -> dict:
    import ipaddress

    import trio

    from flock.model import Allocation, AllocationState
    from flock.store import open_store

    latencies: list[float] = []

    async def writer(store, w: int) -> None:
        for i in range(pods // writers):
            n = w * 1_000_000 + i
            alloc = Allocation(
                container_id=f"c{n:08d}",
                namespace="bench",
                pod=f"p{n}",
                pod_uid=f"u{n}",
                if_name="eth0",
                netns=f"/var/run/netns/{n}",
                ip6=ipaddress.IPv6Address(0x20010DB8 << 96 | n),
                ip4=None,
                anycast=(),
                addresses=(),
                state=AllocationState.PENDING,
                created=float(n),
                updated=float(n),
            )
            t0 = time.perf_counter()
            await store.put(alloc)
            await store.commit(alloc.container_id, now=float(n) + 0.5)
            await store.delete(alloc.container_id)
            latencies.append((time.perf_counter() - t0) * 1000)

    async def main() -> float:
        async with open_store(state_dir) as store:
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for w in range(writers):
                    nursery.start_soon(writer, store, w)
            return time.perf_counter() - t0

    wall = trio.run(main)
    return {
        "pods_per_s": round(len(latencies) / wall, 1),
        "pod_ms_median": round(statistics.median(latencies), 3),
        "pod_ms_p99": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))], 3),
    }


def run_variant(source: str, state_dir: str, writers: int, pods: int) -> dict:
    """One run in a process of its own importing flock from *source* (PYTHONPATH
    comes before the venv's editable install of this checkout)."""
    argv = [sys.executable, os.path.abspath(__file__), "--child", json.dumps([source, state_dir, writers, pods])]
    env = {**os.environ, "PYTHONPATH": source}
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd="/", env=env)
    return json.loads(out.stdout.splitlines()[-1])


def run_child(args: str) -> None:
    source, state_dir, writers, pods = json.loads(args)
    import flock

    if not flock.__file__ or not flock.__file__.startswith(source):
        raise SystemExit(f"imported flock from {flock.__file__}, not from {source}")
    print(json.dumps(child(state_dir, writers, pods)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", default="1,10", help="comma-separated numbers of concurrent writers")
    ap.add_argument("--pods", type=int, default=400, help="pods' worth of store traffic per run")
    ap.add_argument("--rounds", type=int, default=3, help="runs per variant and writer count (taking turns)")
    ap.add_argument("--before", metavar="DIR", help="also run the store of the flock checkout in DIR")
    ap.add_argument("--dir", default="/var/tmp", help="where the databases go (default: %(default)s)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one run (see run_variant)
    args = ap.parse_args()
    if args.child:
        run_child(args.child)
        return
    variants = {"flock": HERE}
    if args.before:
        variants["flock-before"] = os.path.abspath(args.before)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="fl-bench-store-", dir=args.dir) as tmp:
        for writers in (int(x) for x in args.writers.split(",")):
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            for r in range(args.rounds):
                for name, source in variants.items():
                    runs[name].append(
                        run_variant(source, os.path.join(tmp, f"{name}-{writers}-{r}"), writers, args.pods)
                    )
            for name, figs in runs.items():
                best = sorted(figs, key=lambda f: f["pods_per_s"])[len(figs) // 2]  # the median run
                results.setdefault(name, {})[f"W={writers}"] = best
                print(
                    f"{name:12} W={writers:<3} {best['pods_per_s']:8.1f} pods/s  per pod (put+commit+delete) median "
                    f"{best['pod_ms_median']:7.3f} ms  p99 {best['pod_ms_p99']:7.3f} ms",
                    flush=True,
                )
    print(
        json.dumps(
            {
                "bench": "store_group",
                "pods": args.pods,
                "rounds": args.rounds,
                "before": args.before,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
