"""What BIRD's configuration depends on, gathered from the agent's state."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from flock.model import Allocation, IPAddress, NodeConfig


def _address_set(addresses: Iterable[IPAddress]) -> frozenset[IPAddress]:
    return frozenset(addresses)


@attrs.frozen
class BirdInputs:
    """The node and the anycast and extra pod addresses in use on it."""

    node: NodeConfig
    anycast: frozenset[IPAddress] = attrs.field(default=frozenset(), converter=_address_set)
    addresses: frozenset[IPAddress] = attrs.field(default=frozenset(), converter=_address_set)

    @classmethod
    def collect(cls, node: NodeConfig, allocations: Iterable[Allocation]) -> BirdInputs:
        """Anycast and extra addresses of every allocation, pending ones included.

        A pending pod's address in the config is harmless (BIRD announces it
        only once the kernel route exists) and means the route is announced
        the moment setup installs it, without waiting for another render.

        A pod whose own address lies outside the node's current blocks (the
        NodeConfig's block changed under running pods, which keep their
        addresses) is announced on its own, so it stays reachable until it goes.
        """
        blocks = [b for b in (node.cidr6, node.cidr4) if b is not None]
        anycast: set[IPAddress] = set()
        addresses: set[IPAddress] = set()
        for alloc in allocations:
            anycast.update(alloc.anycast)
            addresses.update(alloc.addresses)
            addresses.update(
                ip
                for ip in (alloc.ip6, alloc.ip4)
                if ip is not None and not any(ip.version == b.version and ip in b for b in blocks)
            )
        return cls(node, frozenset(anycast), frozenset(addresses))
