"""The routes the fabric's BIRD holds: ``birdc show route all`` read into values (``flock-lab fabric routes``).

Per prefix, every path the fabric learned (which node announced it, its next hop, communities, local
preference) and which of them the fabric forwards over: the best ones — the highest local preference —
merged into one ECMP route in the fabric's kernel (``merge paths on``).  A leaving node's path carries
the graceful-shutdown community (65535, 0) and local preference 0, so it stays learned but unused while
another node announces the prefix.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flock.lab._fabric import birdc

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
GRACEFUL_SHUTDOWN = (65535, 0)

# "2001:db8:ee::/128    unicast [node1 01:09:48.295] * (100) [AS64513i]"; continuation lines start blank
_ROUTE = re.compile(r"^(?P<prefix>\S+)?\s+(?P<kind>\w+) \[(?P<proto>\S+) [^\]]*\](?P<best> \*)? \((?P<pref>\d+)\)")
_PAIR = re.compile(r"\((\d+),\s*(\d+)\)")
_TRIPLE = re.compile(r"\((\d+),\s*(\d+),\s*(\d+)\)")


@attrs.frozen
class FabricPath:
    """One announcement of a prefix the fabric learned."""

    source: str  # the BGP protocol it came from: the node's name (the fabric names its sessions so)
    next_hop: str
    local_preference: int | None = None
    communities: tuple[tuple[int, int], ...] = ()
    large_communities: tuple[tuple[int, int, int], ...] = ()
    best: bool = False  # BIRD's one best route ("*")

    @property
    def leaving(self) -> bool:
        return GRACEFUL_SHUTDOWN in self.communities


@attrs.frozen
class FabricRoute:
    prefix: IPNetwork
    paths: tuple[FabricPath, ...]

    @property
    def forwarding(self) -> tuple[FabricPath, ...]:
        """The paths the fabric's kernel gets (the highest local preference, merged: ECMP)."""
        top = max((p.local_preference or 0 for p in self.paths), default=0)
        return tuple(p for p in self.paths if (p.local_preference or 0) == top)

    def to_json(self) -> dict[str, Any]:
        forwarding = self.forwarding
        return {
            "prefix": str(self.prefix),
            "next_hops": [p.next_hop for p in forwarding],
            "from": [p.source for p in forwarding],
            "paths": [
                {
                    "from": p.source,
                    "next_hop": p.next_hop,
                    "local_preference": p.local_preference,
                    "communities": [f"{a}:{b}" for a, b in p.communities],
                    "large_communities": [f"{a}:{b}:{c}" for a, b, c in p.large_communities],
                    "best": p.best,
                    "forwarding": p in forwarding,
                }
                for p in self.paths
            ],
        }


def parse_routes(text: str) -> list[FabricRoute]:
    """``birdc show route all`` output → the routes, in BIRD's order (tables, then prefixes)."""
    routes: list[FabricRoute] = []
    prefix: IPNetwork | None = None
    paths: list[dict[str, Any]] = []

    def flush() -> None:
        if prefix is not None and paths:
            routes.append(FabricRoute(prefix, tuple(FabricPath(**p) for p in paths)))

    for line in text.splitlines():
        if not line.strip() or line.startswith(("BIRD ", "Table ")):
            continue
        m = _ROUTE.match(line)
        if m is not None and not line.startswith("\t"):
            if m["prefix"]:
                flush()
                prefix, paths = ipaddress.ip_network(m["prefix"]), []
            paths.append({"source": m["proto"], "next_hop": "", "best": bool(m["best"])})
            continue
        if not paths:
            continue
        field, _, value = line.strip().partition(" ")
        current = paths[-1]
        if field == "via" and not current["next_hop"]:
            current["next_hop"] = value.split(" on ")[0]
        elif field == "BGP.local_pref:":
            current["local_preference"] = int(value)
        elif field == "BGP.community:":
            current["communities"] = tuple((int(a), int(b)) for a, b in _PAIR.findall(value))
        elif field == "BGP.large_community:":
            current["large_communities"] = tuple((int(a), int(b), int(c)) for a, b, c in _TRIPLE.findall(value))
    flush()
    return routes


def named(routes: Iterable[FabricRoute], names: Mapping[str, str]) -> list[FabricRoute]:
    """*routes* with next hops that are node addresses given as ``node (address)``."""
    return [
        attrs.evolve(
            r,
            paths=tuple(
                attrs.evolve(p, next_hop=f"{names[p.next_hop]} ({p.next_hop})") if p.next_hop in names else p
                for p in r.paths
            ),
        )
        for r in routes
    ]


async def fabric_routes(ctl: Path) -> list[FabricRoute]:
    """What the fabric's BIRD behind *ctl* holds now."""
    return parse_routes(await birdc(ctl, "show", "route", "all"))


def routes_text(routes: Iterable[FabricRoute]) -> str:
    lines = []
    for route in routes:
        forwarding = route.forwarding
        lines.append(f"{route.prefix}  via {', '.join(p.source for p in forwarding) or '-'}")
        for p in route.paths:
            tags = []
            if p.local_preference is not None:
                tags.append(f"local-pref {p.local_preference}")
            if p.communities:
                tags.append("communities " + " ".join(f"{a}:{b}" for a, b in p.communities))
            if p.large_communities:
                tags.append("large " + " ".join(f"{a}:{b}:{c}" for a, b, c in p.large_communities))
            if p.leaving:
                tags.append("leaving (graceful shutdown)")
            mark = "→" if p in forwarding else " "
            lines.append(f"  {mark} from {p.source} next hop {p.next_hop}" + (f"  {', '.join(tags)}" if tags else ""))
    return "\n".join(lines) if lines else "the fabric holds no route"
