"""Run one packet through a :class:`Ruleset` in Python, as the kernel would.

For tests (against :func:`flock.policy.evaluate`) and for explaining a
verdict (:mod:`._explain`); the root tests check that the kernel agrees.
:func:`forward_verdict` and :func:`input_verdict` say yes or no;
:func:`trace_egress`, :func:`trace_ingress` and :func:`trace_input` say the
same for one base chain and record the way there: every rule that matched
(a jump included) and every chain left at its end, in the order the packet
met them, as ``nft monitor trace`` lists them.
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


@attrs.frozen
class TraceStep:
    """One rule of *chain* that matched (its index and verdict), or the chain's end (``rule`` = its
    length, ``verdict`` ""): back to the chain that jumped, or, for the base chain's own, the hook's policy."""

    chain: str
    rule: int
    verdict: str

    @property
    def end(self) -> bool:
        return not self.verdict


@attrs.frozen
class Trace:
    """One base chain's handling of a packet: where its verdict map sent it and what it met there.

    ``hook`` is ``"egress"`` or ``"ingress"`` (the forward hook's two base
    chains) or ``"input"``; ``chain`` the chain the map names for the
    interface (None: the interface is in no map, nothing filters it);
    ``verdict`` ``"accept"`` or ``"drop"`` (a chain falling through accepts:
    every base chain's policy is accept).
    """

    hook: str
    chain: str | None
    steps: tuple[TraceStep, ...] = ()
    verdict: str = "accept"

    @property
    def allowed(self) -> bool:
        return self.verdict != "drop"


def _run_chain(
    rs: Ruleset, chain: str, pkt: Packet, depth: int = 0, trace: list[TraceStep] | None = None
) -> str | None:
    """The final verdict ("accept"/"drop") a chain reaches, or None when it falls through (return).

    With *trace*, every rule that matches and every end reached is appended to it."""
    if depth > 16:
        raise RecursionError(f"chain {chain}: jumps nest too deep")
    rules = rs.chains[chain].rules
    for index, rule in enumerate(rules):
        if not _matches(rs, rule.match, pkt):
            continue
        if trace is not None:
            trace.append(TraceStep(chain, index, rule.verdict))
        if rule.verdict.startswith("jump "):
            verdict = _run_chain(rs, rule.verdict[5:], pkt, depth + 1, trace)
            if verdict is not None:
                return verdict
            continue
        if rule.verdict == "return":
            return None
        return rule.verdict
    if trace is not None:
        trace.append(TraceStep(chain, len(rules), ""))
    return None


def _trace(rs: Ruleset, hook: str, chain: str | None, pkt: Packet) -> Trace:
    if chain is None:
        return Trace(hook, None)
    steps: list[TraceStep] = []
    verdict = _run_chain(rs, chain, pkt, trace=steps)
    return Trace(hook, chain, tuple(steps), "drop" if verdict == "drop" else "accept")


def trace_egress(rs: Ruleset, pkt: Packet) -> Trace:
    """The forward hook's egress base chain (``iifname vmap @egress-pods``) for a packet from local pod ``iif``."""
    return _trace(rs, "egress", rs.egress_map.get(pkt.iif) if pkt.iif else None, pkt)


def trace_ingress(rs: Ruleset, pkt: Packet) -> Trace:
    """The forward hook's ingress base chain (``oifname vmap @ingress-pods``) for a packet to local pod ``oif``."""
    return _trace(rs, "ingress", rs.ingress_map.get(pkt.oif) if pkt.oif else None, pkt)


def trace_input(rs: Ruleset, pkt: Packet) -> Trace:
    """The input hook for a packet from local pod ``iif`` to this node's own address (link-local and
    multicast destinations are accepted before the map: no chain)."""
    if pkt.daddr.is_link_local or pkt.daddr.is_multicast:
        return Trace("input", None)
    return _trace(rs, "input", rs.node_map.get(pkt.iif) if pkt.iif else None, pkt)


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
