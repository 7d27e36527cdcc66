"""Anycast propagation: from a pod's ADD returning on node1 to the anycast
route being in node2's kernel (node1's BIRD reloads its config — debounced —
and announces; the fabric's route server passes it on; node2's BIRD installs
it), and back: from DEL being called to the route leaving node2's kernel
(BIRD withdraws as soon as the kernel route goes, before DEL returns).

A two-node flock-lab.  node2's routes are watched with ``ip monitor route``
started before each ADD, so the time is when the kernel reported the change.
Each sample uses a fresh anycast address (a config change every time).

    python bench/lab_anycast.py [--samples 10] [--family 4|6]
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import time

import trio
from labkit import FlockRuntime, emit, ip, lab, stats_ms

from flock.lab import in_netns

WAIT_S = 10.0


async def watch_for(
    netns: str, address: str, deleted: bool, started: trio.Event, seen: list[float], found: trio.Event
) -> None:
    """Record the time ``ip monitor`` in *netns* reports a route to *address* (or its deletion)."""
    proc = await trio.lowlevel.open_process(
        in_netns(netns, ["ip", "monitor", "route"]), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        started.set()
        buf = b""
        async for chunk in proc.stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                text = line.decode()
                if address in text and text.startswith("Deleted") == deleted:
                    seen.append(time.perf_counter())
                    found.set()
                    return
    finally:
        proc.kill()
        await proc.wait()


async def sample(rt: FlockRuntime, node2: str, i: int, address: str) -> tuple[float | None, float | None]:
    att = await rt.prepare(
        "anycast", f"a{i}", {"flock.fritzlab.net/ipv4": "true", "flock.fritzlab.net/anycast": address}
    )
    name = att.netns.rsplit("/", 1)[1]
    await ip("netns", "add", name)
    times: list[float | None] = []
    try:
        for op, deleted in (("ADD", False), ("DEL", True)):
            seen: list[float] = []
            found = trio.Event()
            async with trio.open_nursery() as nursery:
                started = trio.Event()
                nursery.start_soon(watch_for, node2, address, deleted, started, seen, found)
                await started.wait()
                await trio.sleep(0.05)  # ip monitor subscribed
                called = time.perf_counter()
                out = await (rt.add(att) if op == "ADD" else rt.delete(att))
                assert out.ok, out.stdout
                returned = time.perf_counter()
                with trio.move_on_after(WAIT_S):
                    await found.wait()
                nursery.cancel_scope.cancel()
            # The announcement waits for the reloader (after ADD returns); the
            # withdrawal follows the kernel route's removal during DEL itself.
            times.append((seen[0] - (returned if op == "ADD" else called)) if seen else None)
    finally:
        await ip("netns", "del", name)
    return times[0], times[1]


async def main(args: argparse.Namespace) -> dict:
    base = ipaddress.ip_address("192.0.2.160" if args.family == 4 else "2001:db8:53::100")
    announce: list[float] = []
    withdraw: list[float] = []
    missed = 0
    async with lab(2) as plan:
        rt = FlockRuntime(plan, 0)
        node2 = plan.nodes[1].netns
        for i in range(args.samples):
            up_s, down_s = await sample(rt, node2, i, str(base + i))
            if up_s is None or down_s is None:
                missed += 1
            if up_s is not None:
                announce.append(up_s)
            if down_s is not None:
                withdraw.append(down_s)
    doc = {
        "family": args.family,
        "samples": args.samples,
        "announce_ms": stats_ms(announce) if announce else None,
        "withdraw_ms": stats_ms(withdraw) if withdraw else None,
        "not_seen_within_s": {"wait": WAIT_S, "count": missed},
    }
    print(
        f"IPv{args.family} anycast: ADD → route on the other node {doc['announce_ms']} ms; DEL called → withdrawn {doc['withdraw_ms']} ms; not seen {missed}",
        flush=True,
    )
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--family", type=int, choices=(4, 6), default=4)
    emit(trio.run(main, p.parse_args()))
