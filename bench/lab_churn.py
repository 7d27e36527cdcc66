"""Churn: pods per second through the installed shim, ADD + DEL of --pods pods,
with Debian's ptp + host-local doing the same on the same node in the same run.

A one-node flock-lab; dual-stack pods, or IPv4-only ones with --stack v4 (ptp + host-local
then gets one IPv4 range, so both sides do the same work).  The Pod objects are created first (untimed: that is
the API server's work, not the node's); then --parallel workers each take the
next pod and do what a runtime does per pod sandbox: make its network
namespace, CNI ADD, CNI DEL (with the cached result), remove the namespace.
The rate is pods / wall time of the whole churn.

``--floor`` also runs the same churn with a plugin that is the host's
``python3 -IS`` doing nothing (bench/labkit.py FloorRuntime): the most any
CNI whose plugin is a Python interpreter could reach in this harness.

``--kubelet-cgroups`` places the lab's processes and the plugin execs in
CPU cgroups as a kubelet-run node has them (bench/labkit.py kubelet_cgroups).

    python bench/lab_churn.py [--pods 500] [--parallel 10] [--stack dual|v4] [--no-baseline] [--floor]
                              [--kubelet-cgroups]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import trio
from labkit import FlockRuntime, FloorRuntime, PtpRuntime, emit, ip, kubelet_cgroups, lab, stats_ms, timed

# The pod annotations per stack (as bench/lab_cni_latency.py).
STACKS = {
    "v4": {"flock.fritzlab.net/ipv4": "true", "flock.fritzlab.net/ipv6": "false"},
    "dual": {"flock.fritzlab.net/ipv4": "true"},
}


async def churn(rt, args: argparse.Namespace) -> dict:
    atts = [await rt.prepare("churn", f"{rt.tag}{i}", STACKS[args.stack]) for i in range(args.pods)]
    queue = list(reversed(atts))
    adds: list[float] = []
    dels: list[float] = []
    failures: list[str] = []

    async def worker() -> None:
        while queue:
            att = queue.pop()
            name = att.netns.rsplit("/", 1)[1]
            await ip("netns", "add", name)
            out, t = await timed(rt.add, att)
            (adds.append(t) if out.ok else failures.append(out.stdout))
            out, t = await timed(rt.delete, att)
            (dels.append(t) if out.ok else failures.append(out.stdout))
            await ip("netns", "del", name)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(args.parallel):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - t0
    doc = {
        "seconds": round(elapsed, 2),
        "pods_per_s": round(args.pods / elapsed, 1),
        "add_ms": stats_ms(adds),
        "del_ms": stats_ms(dels),
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
    }
    print(
        f"{rt.name:<15} {args.pods} pods ADD+DEL, {args.parallel} at a time: {doc['pods_per_s']} pods/s; ADD {doc['add_ms']}, DEL {doc['del_ms']} ms; failures {len(failures)}",
        flush=True,
    )
    return doc


async def main(args: argparse.Namespace) -> dict:
    doc: dict = {"pods": args.pods, "parallel": args.parallel, "stack": args.stack}
    async with lab(1) as plan:
        with kubelet_cgroups(plan) if args.kubelet_cgroups else contextlib.nullcontext():
            doc["flock"] = await churn(FlockRuntime(plan), args)
            if args.baseline:
                with tempfile.TemporaryDirectory(prefix="flab-hl-") as data:
                    doc["ptp+host-local"] = await churn(PtpRuntime(plan, Path(data), dual=args.stack == "dual"), args)
            if args.floor:
                with tempfile.TemporaryDirectory(prefix="flab-floor-") as bin_dir:
                    doc["python3 -IS floor"] = await churn(FloorRuntime(plan, Path(bin_dir)), args)
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=500)
    p.add_argument("--parallel", type=int, default=10)
    p.add_argument("--stack", choices=sorted(STACKS), default="dual", help="pod address families (default dual)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="flock only")
    p.add_argument("--floor", action="store_true", help="also a do-nothing python3 -IS plugin (the floor)")
    p.add_argument("--kubelet-cgroups", action="store_true", help="CPU cgroups as under a kubelet (see labkit)")
    emit(trio.run(main, p.parse_args()))
