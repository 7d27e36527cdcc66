"""The kernel's per-chain counters → new connections per Service port (pure).

Each Service port's entry chains (``svc`` for cluster endpoints, ``loc`` for this node's, per
family) open with a ``counter`` rule: NAT chains see a connection's first packet only, so their
packets are the port's new connections sent to an endpoint, whichever way they came (ClusterIP,
externalIP, load-balancer address or NodePort: the ``ext`` chains go on to one of them).  The
``rej`` chains count, the same way, the new connections refused or dropped for want of an endpoint
(their packets: a client retrying its SYN counts again).  Endpoint changes rewrite only the
``pick`` chains, so the counts survive them; a port's count starts again from zero when its entry
chain goes (its last endpoint gone) and comes back, which Prometheus reads as a counter reset.

One series per Service port, never per endpoint or per family: the agent exports these as
``flock_service_connections_total{namespace,service,port}`` (and the rejected ones beside them).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ._table import CountedChain

ServicePortKey = tuple[str, str, str]  # (namespace, service, port: its name, or its number when unnamed)


@attrs.frozen
class ServicePortCounts:
    connections: int = 0  # new connections sent to an endpoint
    rejected: int = 0  # new connections' packets refused or dropped: no endpoint they may use


def service_connections(
    per_chain: Mapping[str, tuple[int, int]], counted: Mapping[str, CountedChain]
) -> dict[ServicePortKey, ServicePortCounts]:
    """*per_chain*: ``NftBackend.counters(table)`` (chain → (packets, bytes)); *counted*: the counted
    chains of the table in the kernel (``ServicesTable.counted`` or ``ServicesEngine.counted``).

    Every counted Service port is in the answer (zero when the kernel has no figure for its chains yet)."""
    totals: dict[ServicePortKey, list[int]] = {}
    for chain, what in counted.items():
        packets = per_chain.get(chain, (0, 0))[0]
        counts = totals.setdefault((what.namespace, what.service, what.port), [0, 0])
        counts[0 if what.kind == "connections" else 1] += packets
    return {key: ServicePortCounts(c, r) for key, (c, r) in sorted(totals.items())}
