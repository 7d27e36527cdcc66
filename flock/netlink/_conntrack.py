"""Conntrack entries of flows to a host port, deleted when a hostPort mapping appears (as the
reference portmap plugin does): a UDP or SCTP client that kept sending to the port before the
mapping existed, or while it led to a pod now gone, owns a conntrack entry that NAT never looks at
again — every datagram refreshes it, so it would never end.  TCP needs nothing: a new connection
gets a new entry.

Blocking (pyroute2's conntrack socket); the worker runs it on a thread in the node's namespace.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

PROTOCOLS = {"udp": socket.IPPROTO_UDP, "sctp": socket.IPPROTO_SCTP}


def forget(ports: Iterable[tuple[str, int]], *, every_port: str | None = None) -> int:
    """Delete every entry whose original direction goes to one of *ports* ((protocol, port), udp or
    sctp), any address, both families; how many were deleted.  *every_port* ("udp", "sctp"): every
    entry of that protocol instead (test labs, between cases)."""
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    wanted: list[tuple[int, int | None]] = sorted({(PROTOCOLS[p], port) for p, port in ports if p in PROTOCOLS})
    if every_port is not None:
        wanted = [(PROTOCOLS[every_port], None)]
    deleted = 0
    for family in (socket.AF_INET, socket.AF_INET6):
        ct = Conntrack(nfgen_family=family)
        try:
            for proto, port in wanted:
                match = (
                    NFCTAttrTuple(family=family, proto=proto)
                    if port is None
                    else NFCTAttrTuple(family=family, proto=proto, dport=port)
                )
                for entry in list(ct.dump_entries(tuple_orig=match)):
                    try:
                        ct.delete(entry)
                        deleted += 1
                    except OSError:  # gone meanwhile (expired, or the flow ended)
                        pass
        finally:
            ct.close()
    return deleted
