"""``flock-lab check``: all-pairs reachability between pods, and anycast from every node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import trio

from flock.lab._nsio import run_in
from flock.lab._plan import LabPlan
from flock.lab._pods import LabPod

PING_TRIES = 3  # the first packet to a new neighbour may be lost while it resolves
PARALLEL_PINGS = 16


@attrs.frozen
class Probe:
    source: str  # a pod key, or a node name for anycast probes
    target: str  # a pod key, or "anycast"
    address: str
    version: int
    ok: bool


async def ping(netns: str, address: str) -> bool:
    for _ in range(PING_TRIES):
        proc = await run_in(netns, ["ping", "-n", "-q", "-c", "1", "-W", "1", address])
        if proc.returncode == 0:
            return True
    return False


async def reachability(plan: LabPlan, pods: Sequence[LabPod]) -> list[Probe]:
    """Every pod pings every other pod's first address of each family both have;
    every node pings every anycast address any pod carries."""
    wanted: list[tuple[str, str, str, str, int]] = []  # netns, source, target, address, version
    for src in pods:
        for dst in pods:
            if src is dst:
                continue
            for version in (6, 4):
                if src.addresses(version) and dst.addresses(version):
                    wanted.append((src.netns, src.key, dst.key, dst.addresses(version)[0], version))
    anycast = sorted({a for p in pods for a in p.anycast}, key=lambda a: (":" not in a, a))
    for node in plan.nodes:
        for address in anycast:
            wanted.append((node.netns, node.name, "anycast", address, 6 if ":" in address else 4))
    results: dict[int, bool] = {}
    limiter = trio.CapacityLimiter(PARALLEL_PINGS)

    async def one(i: int, netns: str, address: str) -> None:
        async with limiter:
            results[i] = await ping(netns, address)

    async with trio.open_nursery() as nursery:
        for i, (netns, _, _, address, _) in enumerate(wanted):
            nursery.start_soon(one, i, netns, address)
    return [Probe(src, dst, addr, v, results[i]) for i, (_, src, dst, addr, v) in enumerate(wanted)]


def summary(probes: Sequence[Probe]) -> dict[str, Any]:
    failed = [attrs.asdict(p) for p in probes if not p.ok]
    return {
        "probes": len(probes),
        "passed": len(probes) - len(failed),
        "failed": failed,
        "ok": not failed and bool(probes),
    }


def matrix_text(pods: Sequence[LabPod], probes: Sequence[Probe]) -> str:
    """Row *i* pings column *i*; a cell lists each family tried: ``6ok 4ok``, ``6FAIL``."""
    by_pair: dict[tuple[str, str], list[Probe]] = {}
    for p in probes:
        by_pair.setdefault((p.source, p.target), []).append(p)

    def cell(probes_here: list[Probe]) -> str:
        return (
            " ".join(f"{p.version}{'ok' if p.ok else 'FAIL'}" for p in sorted(probes_here, key=lambda p: -p.version))
            or "."
        )

    cells = [["-" if dst is src else cell(by_pair.get((src.key, dst.key), [])) for dst in pods] for src in pods]
    labels = [f"{i:>2} {p.key} ({p.node})" for i, p in enumerate(pods, 1)]
    width = max([len(label) for label in labels] + [12])
    col = max([len(c) for row in cells for c in row] + [3]) + 2
    lines = ["pod to pod: row pings column (6 = IPv6, 4 = IPv4, . = no common family)"]
    lines.append(" " * (width + 2) + "".join(f"{i:<{col}}" for i in range(1, len(pods) + 1)))
    for label, row in zip(labels, cells, strict=True):
        lines.append(f"{label:<{width}}  " + "".join(f"{c:<{col}}" for c in row))
    anycast = [p for p in probes if p.target == "anycast"]
    if anycast:
        addresses = sorted({p.address for p in anycast}, key=lambda a: (":" not in a, a))
        nodes = sorted({p.source for p in anycast})
        col = max(len(a) for a in addresses) + 2
        lines.append("")
        lines.append("anycast: every node pings every anycast address")
        lines.append(" " * (width + 2) + "".join(f"{a:<{col}}" for a in addresses))
        for node in nodes:
            marks = [
                "ok" if all(p.ok for p in anycast if p.source == node and p.address == a) else "FAIL" for a in addresses
            ]
            lines.append(f"{node:<{width}}  " + "".join(f"{m:<{col}}" for m in marks))
    s = summary(probes)
    lines.append("")
    lines.append(f"{s['passed']}/{s['probes']} probes passed" + ("" if s["ok"] else " — FAILED"))
    return "\n".join(lines)


async def has_route(netns: str, address: str) -> bool:
    """*netns*'s kernel has a route for exactly this host address (learned or local)."""
    prefix = f"{address}/128" if ":" in address else f"{address}/32"
    proc = await run_in(netns, ["ip", "-6" if ":" in address else "-4", "route", "show", "exact", prefix])
    return proc.returncode == 0 and bool(proc.stdout.strip())


async def wait_anycast_routes(plan: LabPlan, pods: Sequence[LabPod]) -> None:
    """Until every node routes every anycast address (the caller bounds the wait)."""
    wanted = [(n.netns, a) for n in plan.nodes for a in {a for p in pods for a in p.anycast}]
    while True:
        missing = [w for w in wanted if not await has_route(*w)]
        if not missing:
            return
        wanted = missing
        await trio.sleep(0.05)
