"""Pool usage and free ranges of a node's blocks (pure: from allocations and the NodeConfig)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from flock.model import Allocation, NodeConfig

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LARGEST_FREE = 3


def usable(block: Network) -> tuple[int, int]:
    """First and last address the IPAM hands out in *block*, as ints (see flock.ipam)."""
    base = int(block.network_address)
    if block.version == 4:
        return base + 2, int(block.broadcast_address) - 1  # network, .1 (gateway side) and broadcast excluded
    return base + 1, int(block.broadcast_address)  # the all-zero identifier is never handed out


def free_ranges(block: Network, used: Iterable[int]) -> list[tuple[int, int]]:
    """The free runs of *block* (first, last), given the used addresses."""
    first, last = usable(block)
    out, cur = [], first
    for value in sorted(set(v for v in used if first <= v <= last)):
        if value > cur:
            out.append((cur, value - 1))
        cur = value + 1
    if cur <= last:
        out.append((cur, last))
    return out


def _addr(version: int, value: int) -> str:
    return str(ipaddress.ip_address(value) if version == 4 else ipaddress.IPv6Address(value))


def pool_report(node: NodeConfig | None, allocations: Iterable[Allocation]) -> dict[str, Any]:
    """``{"blocks": [...], "outside": [...]}``: per node block its size, used,
    free and largest free ranges; addresses held outside the blocks (fixed
    addresses from annotations) listed with their holder."""
    allocs = list(allocations)
    blocks: list[Network] = []
    if node is not None:
        blocks.append(node.cidr6)
        if node.cidr4 is not None:
            blocks.append(node.cidr4)
    exclusive: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, str]] = []
    anycast: dict[ipaddress.IPv4Address | ipaddress.IPv6Address, list[str]] = {}
    for a in allocs:
        for addr in (a.ip6, a.ip4, *a.addresses):
            if addr is not None:
                exclusive.append((addr, a.container_id))
        for addr in a.anycast:
            anycast.setdefault(addr, []).append(a.container_id)
    out_blocks = []
    for block in blocks:
        inside = [int(addr) for addr, _ in exclusive if addr.version == block.version and addr in block]
        first, last = usable(block)
        size = last - first + 1
        runs = free_ranges(block, inside)
        runs.sort(key=lambda r: (r[0] - r[1], r[0]))
        out_blocks.append(
            {
                "family": f"ipv{block.version}",
                "cidr": str(block),
                "default": bool(node and (node.families.ipv6 if block.version == 6 else node.families.ipv4)),
                "usable": size,
                "used": len(set(inside)),
                "free": size - len(set(inside)),
                "anycast": sum(1 for addr in anycast if addr.version == block.version and addr in block),
                "largest_free": [
                    {"first": _addr(block.version, a), "last": _addr(block.version, b), "size": b - a + 1}
                    for a, b in runs[:LARGEST_FREE]
                ],
            }
        )
    outside = [
        {"address": str(addr), "container_id": cid}
        for addr, cid in sorted(exclusive, key=lambda x: (x[0].version, int(x[0])))
        if not any(addr.version == b.version and addr in b for b in blocks)
    ]
    return {"blocks": out_blocks, "outside": outside}


def cidr_usage(cidr: Network, allocations: Iterable[Allocation], pods: int) -> dict[str, Any]:
    """One annotation CIDR: how many of its addresses are held (by anyone) and free, and by how many pods' requests."""
    inside = {
        int(addr)
        for a in allocations
        for addr in (a.ip6, a.ip4, *a.addresses)
        if addr is not None and addr.version == cidr.version and addr in cidr
    }
    first, last = usable(cidr)
    size = max(0, last - first + 1)
    runs = sorted(free_ranges(cidr, inside), key=lambda r: (r[0] - r[1], r[0])) if size else []
    return {
        "family": f"ipv{cidr.version}",
        "cidr": str(cidr),
        "pods": pods,
        "usable": size,
        "used": len(inside),
        "free": max(0, size - len(inside)),
        "largest_free": [
            {"first": _addr(cidr.version, a), "last": _addr(cidr.version, b), "size": b - a + 1}
            for a, b in runs[:LARGEST_FREE]
        ],
    }
