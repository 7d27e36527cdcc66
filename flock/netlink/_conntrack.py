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


def forget(ports: Iterable[tuple[str, int]]) -> int:
    """Delete every entry whose original direction goes to one of *ports* ((protocol, port), udp or
    sctp), any address, both families; how many were deleted."""
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    wanted = sorted({(PROTOCOLS[p], port) for p, port in ports if p in PROTOCOLS})
    deleted = 0
    for family in (socket.AF_INET, socket.AF_INET6):
        ct = Conntrack(nfgen_family=family)
        try:
            for proto, port in wanted:
                match = NFCTAttrTuple(family=family, proto=proto, dport=port)
                for entry in list(ct.dump_entries(tuple_orig=match)):
                    try:
                        ct.delete(entry)
                        deleted += 1
                    except OSError:  # gone meanwhile (expired, or the flow ended)
                        pass
        finally:
            ct.close()
    return deleted
