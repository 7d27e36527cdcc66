"""UDP conntrack entries a Service change leaves stale, and deleting them (as kube-proxy does).

A UDP "connection" is a conntrack entry that every datagram refreshes: a client that keeps
sending to a ClusterIP keeps its entry, and with it the endpoint NAT chose for its first datagram,
for as long as it sends.  So when an endpoint stops being used, the entries of flows translated to
it are deleted (the client's next datagram is translated anew, to an endpoint still there); and
when a Service port that had no endpoint gets one, the entries of its untranslated flows (created
while nothing translated them) are deleted too.  TCP and SCTP need nothing: their connections end,
and a new one is translated anew.

:meth:`flock.services.ServicesEngine.take_stale` says what a change made stale (pure);
:func:`forget_stale` deletes it (blocking: pyroute2's conntrack socket, on a thread in the node's
network namespace).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

import attrs

from ._model import Family, IPAddress

UdpTarget = tuple[IPAddress | None, int, IPAddress]  # (service address, None: a NodePort; port; endpoint)


@attrs.frozen
class StaleFlows:
    """UDP flows of *family* to *address* (None: any, a NodePort) and *port*, translated to *endpoint*
    (None: not translated at all)."""

    family: Family
    address: IPAddress | None
    port: int
    endpoint: IPAddress | None = None


def stale_flows(old: frozenset[UdpTarget], new: frozenset[UdpTarget]) -> list[StaleFlows]:
    """What a Service going from *old* to *new* UDP targets leaves stale (in a stable order)."""

    def family(t: UdpTarget) -> Family:
        return Family.IPV4 if t[2].version == 4 else Family.IPV6

    stale = [StaleFlows(family(t), t[0], t[1], t[2]) for t in old - new]
    had = {(family(t), t[0], t[1]) for t in old}
    stale += [StaleFlows(f, address, port) for f, address, port in {(family(t), t[0], t[1]) for t in new} - had]
    return sorted(stale, key=lambda s: (s.family.version, str(s.address), s.port, str(s.endpoint)))


def forget_stale(flows: Iterable[StaleFlows]) -> int:
    """Delete the conntrack entries of *flows* in this thread's network namespace; how many.  Blocking."""
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    deleted = 0
    by_family: dict[Family, list[StaleFlows]] = {}
    for flow in flows:
        by_family.setdefault(flow.family, []).append(flow)
    for family, wanted in sorted(by_family.items(), key=lambda item: item[0].version):
        af = socket.AF_INET if family is Family.IPV4 else socket.AF_INET6
        ct = Conntrack(nfgen_family=af)
        by_port: dict[int, list[StaleFlows]] = {}
        for flow in wanted:
            by_port.setdefault(flow.port, []).append(flow)
        try:
            # one dump of the family's UDP entries (pyroute2 matches the protocol; addresses are compared here,
            # as values: its text of an address is not always ours)
            for entry in list(ct.dump_entries(tuple_orig=NFCTAttrTuple(family=af, proto=socket.IPPROTO_UDP))):
                candidates = by_port.get(entry.tuple_orig.dport)
                if not candidates:
                    continue
                source = ipaddress.ip_address(entry.tuple_reply.saddr)
                target = ipaddress.ip_address(entry.tuple_orig.daddr)
                if not any(_matches(flow, target, source) for flow in candidates):
                    continue
                try:
                    ct.delete(entry)
                    deleted += 1
                except OSError:  # gone meanwhile (expired)
                    pass
        finally:
            ct.close()
    return deleted


def _matches(flow: StaleFlows, target: IPAddress, source: IPAddress) -> bool:
    """An entry to *target* (original destination) answered by *source* is one of *flow*'s."""
    if flow.address is not None and target != flow.address:
        return False
    return source == (flow.endpoint if flow.endpoint is not None else target)
