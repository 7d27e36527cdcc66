"""ADD and DEL latency through the CNI plugin, flock versus ptp + host-local, same run.

A one-node flock-lab (real agent, API server, bird2).  Every operation is one
exec of the plugin in the node's namespace, as a runtime does it (env + the
conflist's plugin config on stdin; DEL gets the cached result): for flock the
shim installed by flock-install-cni (its start-up, the RPC, IPAM, the SQLite
store, netlink), for the baseline Debian's /usr/lib/cni/ptp with host-local
IPAM.  Pod objects and namespaces are made untimed beforehand.

Modes: one at a time (ADD then DEL, ``--sequential`` pods) and 50 at once
(``--burst`` ADDs concurrently, then the DELs concurrently); v4-only and
dual stack.  ms, median and p99 of the operations.

``--floor`` adds, per stack, a plugin that is the host's ``python3 -IS``
doing nothing (bench/labkit.py FloorRuntime): what flock's shim costs at
the least, before any RPC, agent or kernel work.

``--kubelet-cgroups`` places the lab's processes and the plugin execs in
CPU cgroups as a kubelet-run node has them (bench/labkit.py kubelet_cgroups).

    python bench/lab_cni_latency.py [--sequential 30] [--burst 50] [--floor] [--kubelet-cgroups]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

import trio
from labkit import FlockRuntime, FloorRuntime, PtpRuntime, emit, ip, kubelet_cgroups, lab, stats_ms, timed

STACKS = {
    "v4": {"flock.fritzlab.net/ipv4": "true", "flock.fritzlab.net/ipv6": "false"},
    "dual": {"flock.fritzlab.net/ipv4": "true"},
}


async def one_at_a_time(rt, stack: str, count: int, tag: str) -> tuple[list[float], list[float]]:
    adds, dels = [], []
    for i in range(count):
        name = f"{tag}-s{i}"
        att = await rt.prepare("bench", name, STACKS[stack])
        await ip("netns", "add", att.netns.rsplit("/", 1)[1])
        try:
            out, t = await timed(rt.add, att)
            assert out.ok, out.stdout + out.stderr
            adds.append(t)
            out, t = await timed(rt.delete, att)
            assert out.ok, out.stdout + out.stderr
            dels.append(t)
        finally:
            await ip("netns", "del", att.netns.rsplit("/", 1)[1])
    return adds, dels


async def at_once(rt, stack: str, count: int, tag: str) -> tuple[list[float], list[float]]:
    atts = [await rt.prepare("bench", f"{tag}-b{i}", STACKS[stack]) for i in range(count)]
    for att in atts:
        await ip("netns", "add", att.netns.rsplit("/", 1)[1])
    adds: list[float] = []
    dels: list[float] = []

    async def run(fn, att, into: list[float]) -> None:
        out, t = await timed(fn, att)
        assert out.ok, out.stdout + out.stderr
        into.append(t)

    try:
        async with trio.open_nursery() as nursery:
            for att in atts:
                nursery.start_soon(run, rt.add, att, adds)
        async with trio.open_nursery() as nursery:
            for att in atts:
                nursery.start_soon(run, rt.delete, att, dels)
    finally:
        for att in atts:
            await ip("netns", "del", att.netns.rsplit("/", 1)[1])
    return adds, dels


async def main(args: argparse.Namespace) -> dict:
    figures: dict = {"sequential": args.sequential, "burst": args.burst}
    async with lab(1) as plan:
        with (
            kubelet_cgroups(plan) if args.kubelet_cgroups else contextlib.nullcontext(),
            tempfile.TemporaryDirectory(prefix="flab-hl-") as data,
        ):
            for stack in ("v4", "dual"):
                runtimes = [FlockRuntime(plan), PtpRuntime(plan, Path(data) / stack, dual=stack == "dual")]
                if args.floor:
                    (Path(data) / f"floor-{stack}").mkdir()
                    runtimes.append(FloorRuntime(plan, Path(data) / f"floor-{stack}"))
                for rt in runtimes:
                    tag = rt.tag + stack
                    seq_add, seq_del = await one_at_a_time(rt, stack, args.sequential, tag)
                    burst_add, burst_del = await at_once(rt, stack, args.burst, tag)
                    row = {
                        "add_1": stats_ms(seq_add),
                        "del_1": stats_ms(seq_del),
                        f"add_{args.burst}": stats_ms(burst_add),
                        f"del_{args.burst}": stats_ms(burst_del),
                    }
                    figures.setdefault(stack, {})[rt.name] = row
                    print(
                        f"{stack:<5} {rt.name:<15} "
                        + "  ".join(f"{k} {v['median']}/{v['p99']} ms" for k, v in row.items()),
                        flush=True,
                    )
    return figures


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sequential", type=int, default=30)
    p.add_argument("--burst", type=int, default=50)
    p.add_argument("--floor", action="store_true", help="also a do-nothing python3 -IS plugin (the floor)")
    p.add_argument("--kubelet-cgroups", action="store_true", help="CPU cgroups as under a kubelet (see labkit)")
    emit(trio.run(main, p.parse_args()))
