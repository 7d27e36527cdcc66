"""The IPAM as the agent uses it: one node, its allocator, its ip-algo default."""

from __future__ import annotations

import ipaddress
import random

import attrs

from flock.ipam._allocator import Addresses, Allocator
from flock.ipam._identity import pod_identity
from flock.ipam._layout import Layout, LayoutError, parse_layout
from flock.ipam._request import PodRequest, parse_request
from flock.model import IPAddress, NodeConfig, PodInfo


def node_layout(node: NodeConfig) -> Layout | None:
    """The node-level ip-algo, or None; raises :class:`LayoutError` when it
    is invalid or wider than the node's IPv6 block."""
    if node.ip_algo is None:
        return None
    layout = parse_layout(node.ip_algo)
    host_bits = 128 - node.cidr6.prefixlen
    if layout.bits > host_bits:
        raise LayoutError(node.ip_algo, f"needs {layout.bits} bits but {node.cidr6} has {host_bits} host bits")
    return layout


@attrs.define(eq=False)
class Ipam:
    """Turns pods into addresses on one node.

    An invalid node-level ip-algo is ignored (pods fall back to random
    identifiers) and kept in :attr:`layout_problem` for the caller to report;
    everything else that goes wrong propagates from :meth:`allocate` as an
    :class:`~flock.ipam.IpamError`.  Pure: no logging, no I/O.
    """

    node: NodeConfig
    rng: random.Random = attrs.field(factory=random.Random)
    _allocator: Allocator = attrs.field(init=False)
    _layout: Layout | None = attrs.field(init=False, default=None)
    _layout_problem: LayoutError | None = attrs.field(init=False, default=None)
    _node_addresses: frozenset[IPAddress] = attrs.field(init=False, factory=frozenset)

    def __attrs_post_init__(self) -> None:
        self._allocator = Allocator(self.rng)
        self._resolve_layout()

    @property
    def allocator(self) -> Allocator:
        return self._allocator

    @property
    def default_layout(self) -> Layout | None:
        return self._layout

    @property
    def layout_problem(self) -> LayoutError | None:
        """Why the node-level ip-algo is ignored (None: there is none, or it is valid)."""
        return self._layout_problem

    def set_node(self, node: NodeConfig) -> None:
        """Adopt a changed NodeConfig.  Holdings carry over; a changed block
        starts a fresh allocator (seeded with every holding) so no pool of
        the old block lingers."""
        old, self.node = self.node, node
        if (old.cidr6, old.cidr4) != (node.cidr6, node.cidr4):
            fresh = Allocator(self.rng)
            for container_id in list(self._allocator.containers()):
                held = self._allocator.held(container_id)
                assert held is not None  # containers() are exactly the holders
                fresh.mark_in_use(container_id, held)
            self._allocator = fresh
        self._resolve_layout()

    def set_node_addresses(self, addresses: frozenset[IPAddress]) -> None:
        """The node's own interface addresses, which no pod may claim."""
        self._node_addresses = frozenset(addresses)

    def full_blocks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """The node blocks of the default families with no free address left:
        non-empty means STATUS should report the pool exhausted."""
        blocks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = (
            [self.node.cidr6] if self.node.families.ipv6 else []
        )
        if self.node.families.ipv4 and self.node.cidr4 is not None:
            blocks.append(self.node.cidr4)
        return tuple(b for b in blocks if not self._allocator.has_free(b))

    def request(self, pod: PodInfo) -> PodRequest:
        return parse_request(pod.annotations, self.node, self._layout, self._node_addresses)

    def allocate(self, container_id: str, pod: PodInfo) -> Addresses:
        """Parse *pod*'s annotations and allocate; see :meth:`Allocator.allocate`."""
        request = self.request(pod)
        return self._allocator.allocate(container_id, request, pod_identity(pod, self.node.name, container_id))

    def release(self, container_id: str) -> Addresses | None:
        return self._allocator.release(container_id)

    def mark_in_use(self, container_id: str, held: Addresses) -> None:
        self._allocator.mark_in_use(container_id, held)

    def _resolve_layout(self) -> None:
        try:
            self._layout, self._layout_problem = node_layout(self.node), None
        except LayoutError as exc:
            self._layout, self._layout_problem = None, exc
