"""Which addresses a pod may claim with ``anycast``/``addresses`` (pure).

A claimed address is routed to the pod and announced by BGP, so a claim is a
route hijack unless it is held to ranges the operator handed out: the node's
pod blocks and NodeConfig ``spec.announceRanges``.  Inside those, the
addresses the node's routing depends on stay off limits (its own interface
addresses, its BGP router ID and peers, the blocks' network and broadcast
addresses), as does anything that is not global unicast.
"""

from __future__ import annotations

import ipaddress

from flock.model import IPAddress, NodeConfig

# At most this many anycast + addresses per pod (each is a route and a BGP prefix).
MAX_CLAIMS_PER_POD = 64

_BROADCAST4 = ipaddress.IPv4Address("255.255.255.255")
_RESERVED4 = ipaddress.ip_network("240.0.0.0/4")
_THIS_NETWORK4 = ipaddress.ip_network("0.0.0.0/8")


def allowed_ranges(node: NodeConfig) -> list[str]:
    """The ranges a pod may claim from, as text for error messages."""
    nets = [node.cidr6, *([node.cidr4] if node.cidr4 is not None else []), *node.announce_ranges]
    return [str(n) for n in nets]


def claim_refusal(addr: IPAddress, node: NodeConfig, node_addresses: frozenset[IPAddress] = frozenset()) -> str | None:
    """Why a pod may not claim *addr* on *node* (None: it may); *node_addresses*
    are the node's own interface addresses, as the agent last read them."""
    if addr.is_unspecified or addr.is_loopback or addr.is_link_local or addr.is_multicast:
        return "not a global unicast address"
    if addr.version == 4 and (addr == _BROADCAST4 or addr in _RESERVED4 or addr in _THIS_NETWORK4):
        return "not a global unicast address"
    if addr.version == 6 and getattr(addr, "ipv4_mapped", None) is not None:
        return "an IPv4-mapped IPv6 address"
    if addr in node_addresses:
        return "one of this node's own addresses"
    bgp = node.bgp
    if bgp is not None:
        if addr == bgp.router_id:
            return "this node's BGP router ID"
        for peer in bgp.peers:
            if addr == peer.address:
                return f"the address of BGP peer {peer.name}"
    ranges = [node.cidr6, *([node.cidr4] if node.cidr4 is not None else []), *node.announce_ranges]
    if not any(addr.version == net.version and addr in net for net in ranges):
        return "outside this node's pod blocks and spec.announceRanges"
    return None
