"""Run one packet through a :class:`Ruleset` in Python, as the kernel would.

For tests (against :func:`flock.policy.evaluate`) and for explaining a
verdict while debugging; the root tests check that the kernel agrees.
"""

from __future__ import annotations

import attrs

from ._model import IPAddress, Protocol
from ._ruleset import Match, Ruleset


@attrs.frozen
class Packet:
    """The first packet of a new connection crossing this node's forward hook."""

    saddr: IPAddress
    daddr: IPAddress
    protocol: Protocol
    dport: int
    iif: str = ""  # host veth it came in on, "" from the uplink
    oif: str = ""  # host veth it goes out on, "" to the uplink


def _matches(rs: Ruleset, m: Match, pkt: Packet) -> bool:
    if m.family is not None and pkt.saddr.version != m.family:
        return False
    if m.saddr is not None and not _in_set(rs, m.saddr, pkt.saddr):
        return False
    if m.daddr is not None and not _in_set(rs, m.daddr, pkt.daddr):
        return False
    if m.protocol is not None:
        if pkt.protocol is not m.protocol:
            return False
        if m.ports and not any(lo <= pkt.dport <= hi for lo, hi in m.ports):
            return False
    if m.portset is not None and not any(
        proto is pkt.protocol and lo <= pkt.dport <= hi for proto, lo, hi in rs.port_sets[m.portset].elements
    ):
        return False
    if m.service is not None:
        return (pkt.daddr, pkt.protocol, pkt.dport) in rs.service_sets[m.service].elements
    return True


def _in_set(rs: Ruleset, name: str, addr: IPAddress) -> bool:
    s = rs.address_sets[name]
    if s.family != addr.version:
        return False
    if s.interval:
        return any(addr in net for net in s.elements)  # type: ignore[operator]
    return addr in s.elements


def _run_chain(rs: Ruleset, chain: str, pkt: Packet, depth: int = 0) -> str | None:
    """The final verdict ("accept"/"drop") a chain reaches, or None when it falls through (return)."""
    if depth > 16:
        raise RecursionError(f"chain {chain}: jumps nest too deep")
    for rule in rs.chains[chain].rules:
        if not _matches(rs, rule.match, pkt):
            continue
        if rule.verdict.startswith("jump "):
            verdict = _run_chain(rs, rule.verdict[5:], pkt, depth + 1)
            if verdict is not None:
                return verdict
            continue
        if rule.verdict == "return":
            return None
        return rule.verdict
    return None


def input_verdict(rs: Ruleset, pkt: Packet) -> bool:
    """Does the input hook let a packet from a local pod (``iif``) to this node's own address through?"""
    if pkt.daddr.is_link_local or pkt.daddr.is_multicast:
        return True
    chain = rs.node_map.get(pkt.iif) if pkt.iif else None
    return chain is None or _run_chain(rs, chain, pkt) != "drop"


def forward_verdict(rs: Ruleset, pkt: Packet) -> bool:
    """Does the forward hook of this node let the packet through (egress base chain, then ingress)?"""
    for vmap, iface in ((rs.egress_map, pkt.iif), (rs.ingress_map, pkt.oif)):
        chain = vmap.get(iface) if iface else None
        if chain is not None and _run_chain(rs, chain, pkt) == "drop":
            return False
    return True
