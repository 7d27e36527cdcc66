"""The kernel's per-element counters → new connections per Service port (pure).

The maps a new connection is looked up in first carry a counter per element (``counter`` in their
declaration): ``service-ips`` (a ClusterIP, externalIP or load-balancer address, and port) and
``service-nodeports`` in the NAT hooks, which see a connection's first packet only, so their
packets are the port's new connections sent to an endpoint; ``no-endpoint-services`` and
``no-endpoint-nodeports`` in the filter hooks count, the same way, the new connections refused or
dropped for want of an endpoint (their packets: a client retrying its SYN counts again).  An
element stays while its Service port has an endpoint to send to, whatever the endpoints do, so the
counts survive endpoint changes; a port's count starts again from zero when its element goes (its
last endpoint gone, or the Service deleted) and comes back, which Prometheus reads as a counter
reset.

One series per Service port, never per endpoint, address or family: the agent exports these as
``flock_service_connections_total{namespace,service,port}`` (and the rejected ones beside them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping

import attrs
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from flock.policy import Protocol

from . import _nft
from ._model import Family
from ._table import Counted

# the maps whose elements carry counters (see the module doc)
COUNTED_MAPS = tuple(
    _nft.per_family(base, family)
    for base in (_nft.SERVICE_IPS, _nft.SERVICE_NODEPORTS, _nft.NO_ENDPOINT_SERVICES, _nft.NO_ENDPOINT_NODEPORTS)
    for family in Family
)
_PROTOCOLS = {6: Protocol.TCP, 17: Protocol.UDP, 132: Protocol.SCTP}

ServicePortKey = tuple[str, str, str]  # (namespace, service, port: its name, or its number when unnamed)


@attrs.frozen
class ServicePortCounts:
    connections: int = 0  # new connections sent to an endpoint
    rejected: int = 0  # new connections' packets refused or dropped: no endpoint they may use


def service_connections(
    per_element: Mapping[tuple[str, str], tuple[int, int]], counted: Mapping[tuple[str, str], Counted]
) -> dict[ServicePortKey, ServicePortCounts]:
    """*per_element*: (map, key) → (packets, bytes), the counted maps' elements as the kernel holds them
    (:func:`flock.services.element_counters`); *counted*: the counted elements of the table in the
    kernel (``ServicesTable.counted`` or ``ServicesEngine.counted``).

    Every counted Service port is in the answer (zero when the kernel has no figure for its elements yet)."""
    totals: dict[ServicePortKey, list[int]] = {}
    for element, what in counted.items():
        packets = per_element.get(element, (0, 0))[0]
        counts = totals.setdefault((what.namespace, what.service, what.port), [0, 0])
        counts[0 if what.kind == "connections" else 1] += packets
    return {key: ServicePortCounts(c, r) for key, (c, r) in sorted(totals.items())}


def decode_key(raw: bytes) -> str | None:
    """A counted map's key as the kernel holds it → its text as the table writes it (None: not one of ours).

    Each part of a concatenation fills whole 32-bit registers: an address (16 or 4 bytes), the protocol
    (1 byte, then padding), the port (2 bytes, big-endian, then padding)."""
    if len(raw) == 8:
        protocol = _PROTOCOLS.get(raw[0])
        return _nft.nodeport_key(protocol, int.from_bytes(raw[4:6], "big")) if protocol is not None else None
    if len(raw) not in (24, 12):
        return None
    size = 16 if len(raw) == 24 else 4
    address: ipaddress.IPv4Address | ipaddress.IPv6Address = (
        ipaddress.IPv6Address(raw[:16]) if size == 16 else ipaddress.IPv4Address(raw[:4])
    )
    protocol = _PROTOCOLS.get(raw[size])
    port = int.from_bytes(raw[size + 4 : size + 6], "big")
    if protocol is None or not port:
        return None
    return _nft.service_key(address, protocol, port)


@attrs.define(eq=False)
class _Connections(Collector):
    counts: dict[ServicePortKey, ServicePortCounts] = attrs.field(factory=dict)

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "service", "port"]
        connections = CounterMetricFamily(
            "flock_service_connections",
            "New connections to a Service port this node sent to an endpoint (any of its addresses).",
            labels=labels,
        )
        rejected = CounterMetricFamily(
            "flock_service_rejected",
            "Packets of new connections to a Service port this node refused or dropped: no endpoint they may use.",
            labels=labels,
        )
        for key, counts in sorted(self.counts.items()):
            connections.add_metric(list(key), counts.connections)
            rejected.add_metric(list(key), counts.rejected)
        yield connections
        yield rejected


@attrs.define(eq=False)
class ServiceMetrics:
    """The service proxy's metrics, in the registry the composition root passes in: one series per Service
    port (never per endpoint), read from the kernel every few seconds, and the table's size."""

    registry: CollectorRegistry
    services: Gauge = attrs.field(init=False)
    chains: Gauge = attrs.field(init=False)
    elements: Gauge = attrs.field(init=False)
    _connections: _Connections = attrs.field(init=False, factory=_Connections)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.services = Gauge("flock_services", "Services this node translates (ClusterIP and beyond).", registry=r)
        self.chains = Gauge(
            "flock_service_chains", "Chains in table inet flock-services (besides its skeleton).", registry=r
        )
        self.elements = Gauge(
            "flock_service_elements", "Map and set elements in table inet flock-services.", registry=r
        )
        r.register(self._connections)

    def counts(self, counts: Mapping[ServicePortKey, ServicePortCounts]) -> None:
        self._connections.counts = dict(counts)
