"""Is kube-proxy's dataplane on this node?  Then flock's service proxy stays off.

Two service proxies on one node fight: both translate a ClusterIP, whichever
hook runs first wins, and a Service's endpoints follow whichever proxy saw the
last change.  So the agent turns its proxy on only where kube-proxy has left
nothing behind, and otherwise says why (log, ``/readyz`` note, ``flockctl
status``) and changes nothing.

What kube-proxy leaves, by mode:

- **nftables** (KEP-3866): the tables ``ip kube-proxy`` and ``ip6 kube-proxy``;
- **iptables** through iptables-nft: chains ``KUBE-SERVICES``, ``KUBE-NODEPORTS``
  (and the canary ``KUBE-PROXY-CANARY``) in the ``ip``/``ip6`` ``nat`` and
  ``filter`` tables, visible to ``nft list chains``;
- **iptables** through the legacy x_tables backend: the same chains, visible
  only to ``iptables-legacy-save`` (asked when that program exists);
- **IPVS**: the dummy interface ``kube-ipvs0`` holding every ClusterIP.

:func:`kube_proxy_traces` is pure (the listings in, the reasons out);
:func:`find_kube_proxy` gathers the listings in the node's network namespace.
"""

from __future__ import annotations

import re
import shutil
import socket
from collections.abc import Iterable

import trio

from flock.netns import call_in_netns, netns_path

KUBE_PROXY_TABLE = "kube-proxy"
KUBE_CHAINS = frozenset({"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY", "KUBE-EXTERNAL-SERVICES"})
IPVS_LINK = "kube-ipvs0"

_TABLE = re.compile(r"^\s*table\s+(\S+)\s+(\S+)\s*\{", re.M)
_CHAIN = re.compile(r"^\s*chain\s+(\S+)\s*\{", re.M)
_LEGACY_CHAIN = re.compile(r"^:(\S+)\s", re.M)


def kube_proxy_traces(nft_chains: str, links: Iterable[str], legacy_nat: str = "") -> list[str]:
    """What of kube-proxy is on the node, one short reason each (empty: nothing).

    *nft_chains*: ``nft list chains`` (every table, every family); *links*: the
    node's interface names; *legacy_nat*: ``iptables-legacy-save -t nat`` and
    ``ip6tables-legacy-save -t nat`` (empty when there is no legacy backend)."""
    found: list[str] = []
    table: tuple[str, str] | None = None
    chains_seen: set[tuple[str, str, str]] = set()
    for line in nft_chains.splitlines():
        if (m := _TABLE.match(line)) is not None:
            table = (m.group(1), m.group(2))
            if table[1] == KUBE_PROXY_TABLE:
                found.append(f"nftables table {table[0]} {table[1]} (kube-proxy's nftables mode)")
        elif (m := _CHAIN.match(line)) is not None and table is not None and m.group(1) in KUBE_CHAINS:
            chains_seen.add((table[0], table[1], m.group(1)))
    for family, name, chain in sorted(chains_seen):
        if name != KUBE_PROXY_TABLE:
            found.append(f"chain {chain} in nftables table {family} {name} (kube-proxy's iptables mode)")
    legacy = sorted({m.group(1) for m in _LEGACY_CHAIN.finditer(legacy_nat)} & KUBE_CHAINS)
    found += [f"chain {chain} in the legacy iptables nat table (kube-proxy's iptables mode)" for chain in legacy]
    if IPVS_LINK in set(links):
        found.append(f"interface {IPVS_LINK} (kube-proxy's IPVS mode)")
    return found


async def find_kube_proxy(netns: str | None = None) -> list[str]:
    """:func:`kube_proxy_traces` for the node: the namespace this process runs in (the agent is
    hostNetwork), or *netns* (a path or a name under /run/netns).  A listing that cannot be had
    counts as a trace: the proxy must not turn on beside a kube-proxy it could not rule out."""
    enter = [] if netns is None else ["nsenter", f"--net={netns_path(netns)}"]
    chains = await _output([*enter, "nft", "list", "chains"])
    if chains is None:
        return ["cannot list nftables chains (nft list chains failed): kube-proxy not ruled out"]
    legacy = ""
    for save in ("iptables-legacy-save", "ip6tables-legacy-save"):
        if shutil.which(save) is not None:
            legacy += await _output([*enter, save, "-t", "nat"]) or ""
    names = await trio.to_thread.run_sync(call_in_netns, netns, socket.if_nameindex)
    return kube_proxy_traces(chains, [name for _, name in names], legacy)


async def _output(argv: list[str]) -> str | None:
    try:
        proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    except OSError:
        return None
    if proc.returncode != 0:
        # iptables-legacy-save on a kernel without x_tables' nat table answers non-zero: nothing there.
        return "" if argv[-3].endswith("-save") else None
    return proc.stdout.decode(errors="replace")
