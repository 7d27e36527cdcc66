"""The fail-closed guard: pod traffic to another node's pod blocks leaves through the device or not at all.

One table of its own, ``table inet flock-wireguard``, not a chain in ``table inet flock``: the policy
engine owns that table whole and replaces it (``delete table`` and the new one, in one transaction)
at every start and after a refused increment, which would drop a chain another service put there;
and the guard must hold whatever the policy engine's state (DESIGN allows tables of flock's own named
``flock…``, as the service proxy's ``flock-services``).  A drop in any table is final, so the guard
holds whatever the policy table accepts.

Layout::

    counter plaintext-dropped                      packets the guard dropped (kept across updates)
    set local6 / local4                            this node's pod blocks (interval, auto-merge)
    set guarded6 / guarded4                        other nodes' pod blocks (but allowPlaintextTo's)
    chain guard  hook postrouting priority filter  ip6 saddr @local6 ip6 daddr @guarded6
                                                   oifname != DEVICE counter name plaintext-dropped drop
                                                   (the same for IPv4)

Postrouting sees both what the node forwards from its pods and what it sends itself from a pod
address; the tunnel's own datagrams come from node addresses and are never matched, and neither is
node traffic (BGP, the API server, kubelet, probes): it has no pod-block source.  An update is one
transaction that creates what is missing (``add`` of an existing object is no error), flushes the
sets and the chain and fills them again: the counter is never reset and no packet sees half a guard.
The table outlives the agent (an agent restart keeps it in force) and is deleted only when
encryption is switched off (:func:`render_remove`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from flock.wireguard._model import IPNetwork, network_order

TABLE = "flock-wireguard"
CHAIN = "guard"
COUNTER = "plaintext-dropped"
_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}\Z")
_COUNTER_LINE = re.compile(r"packets (\d+) bytes (\d+)")


def _sets(family: int) -> tuple[str, str]:
    return f"local{family}", f"guarded{family}"


def render_guard(device: str, local: Iterable[IPNetwork], guarded: Iterable[IPNetwork]) -> str:
    """The nft transaction that makes the guard drop what goes from *local* to *guarded* not by *device*."""
    if not _IFNAME.match(device):
        raise ValueError(f"device {device[:20]!r}: not an interface name")
    nets = [n for n in (*local, *guarded) if not isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network)]
    if nets:
        raise ValueError(f"not a network: {str(nets[0])[:48]!r}")
    local, guarded = list(local), list(guarded)
    t = f"inet {TABLE}"
    lines = [f"add table {t}", f"add counter {t} {COUNTER}"]
    for family, kind in ((6, "ipv6_addr"), (4, "ipv4_addr")):
        for name, members in zip(_sets(family), (local, guarded), strict=True):
            lines.append(f"add set {t} {name} {{ type {kind}; flags interval; auto-merge; }}")
            lines.append(f"flush set {t} {name}")
            elements = sorted((n for n in members if n.version == family), key=network_order)
            if elements:
                lines.append(f"add element {t} {name} {{ {', '.join(str(n) for n in elements)} }}")
    lines.append(f"add chain {t} {CHAIN} {{ type filter hook postrouting priority filter; policy accept; }}")
    lines.append(f"flush chain {t} {CHAIN}")
    for family, match in ((6, "ip6"), (4, "ip")):
        source, destination = _sets(family)
        lines.append(
            f"add rule {t} {CHAIN} {match} saddr @{source} {match} daddr @{destination} "
            f'oifname != "{device}" counter name "{COUNTER}" drop'
        )
    return "\n".join(lines) + "\n"


def render_remove() -> str:
    """The transaction that removes the guard (encryption switched off); no error when there is none."""
    return f"add table inet {TABLE}\ndelete table inet {TABLE}\n"


def render_read_counter() -> str:
    return f"list counter inet {TABLE} {COUNTER}\n"


def parse_counter(text: str) -> tuple[int, int]:
    """(packets, bytes) from ``nft list counter``'s output."""
    found = _COUNTER_LINE.search(text)
    if found is None:
        raise ValueError(f"no counter in nft's output: {text[:200]!r}")
    return int(found[1]), int(found[2])
