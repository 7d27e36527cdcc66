"""Which endpoints a Service port sends traffic to, from this node: pure, as kube-proxy chooses.

:func:`backends` merges a Service's EndpointSlices of one family into the
endpoints of one Service port (matched by port name and protocol, as the
EndpointSlice controller wrote them, one entry per address and port however
many slices repeat it).  :func:`categorize` is kube-proxy's
``CategorizeEndpoints`` (pkg/proxy/topology.go) without topology hints:

- usable endpoints are the ready ones; when none is ready, the serving and
  terminating ones (KEP-1669), chosen independently for Cluster and Local;
- cluster endpoints are computed when the port uses them (internal policy
  Cluster, or externally reachable at all: with eTP Local, traffic from pods
  and from the node itself still short-circuits to the cluster endpoints);
- local endpoints (this node's) when internal or external policy is Local;
- ``has_any``: some usable endpoint exists anywhere in the cluster (with none,
  clients are refused; with some but none local, Local traffic is dropped).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._model import EndpointSlice, Family, IPAddress, Service, ServicePort, TrafficPolicy


@attrs.frozen(cache_hash=True, order=True)
class Backend:
    """One endpoint address and port of one Service port."""

    address: IPAddress = attrs.field(order=lambda a: (a.version, a))
    port: int
    ready: bool = attrs.field(default=True, eq=True, order=False)
    serving: bool = attrs.field(default=True, order=False)
    terminating: bool = attrs.field(default=False, order=False)
    local: bool = attrs.field(default=False, order=False)
    # on this node, or on no node the slice names: a connection from it to its own Service may hairpin here
    maybe_local: bool = attrs.field(default=False, eq=False, order=False)

    @property
    def serving_terminating(self) -> bool:
        return self.serving and self.terminating


@attrs.frozen
class PortPolicy:
    """kube-proxy's ServicePort predicates, for one port and the addresses flock translates for it."""

    externally_accessible: bool
    external_local: bool
    internal_local: bool

    @property
    def uses_cluster(self) -> bool:
        return not self.internal_local or self.externally_accessible

    @property
    def uses_local(self) -> bool:
        return self.internal_local or self.external_local


def port_policy(service: Service, port: ServicePort, *, external_addresses: bool) -> PortPolicy:
    """*external_addresses*: the port has externalIPs or load-balancer addresses that are translated."""
    accessible = port.node_port is not None or external_addresses
    return PortPolicy(
        externally_accessible=accessible,
        external_local=accessible and service.external_traffic_policy is TrafficPolicy.LOCAL,
        internal_local=service.internal_traffic_policy is TrafficPolicy.LOCAL,
    )


@attrs.frozen
class Categorized:
    cluster: tuple[Backend, ...] = ()
    local: tuple[Backend, ...] = ()
    has_any: bool = False

    @property
    def reachable(self) -> tuple[Backend, ...]:
        """Every endpoint some chain of this port may send to (cluster ∪ local), in a stable order."""
        if not self.local or self.local == self.cluster:
            return self.cluster  # already in order (no set of 100,000 endpoints to hash)
        if not self.cluster:
            return self.local
        return tuple(sorted(set(self.cluster) | set(self.local), key=_order))


def backends(
    service: Service, port: ServicePort, family: Family, slices: Iterable[EndpointSlice], node_name: str
) -> tuple[Backend, ...]:
    """The endpoints of *port* in *family*, deduplicated (a ready copy wins), sorted by address and port."""
    chosen: dict[tuple[IPAddress, int], Backend] = {}
    for eps in sorted(slices, key=lambda s: s.name):
        if eps.namespace != service.namespace or eps.service != service.name or eps.family is not family:
            continue
        for slice_port in eps.ports:
            if slice_port.name != port.name or slice_port.protocol is not port.protocol:
                continue
            for ep in eps.endpoints:
                backend = Backend(
                    ep.address,
                    slice_port.port,
                    ready=ep.ready,
                    serving=ep.serving,
                    terminating=ep.terminating,
                    local=ep.node_name is not None and ep.node_name == node_name,
                    maybe_local=ep.node_name is None or ep.node_name == node_name,
                )
                key = (backend.address, backend.port)
                if key not in chosen or (backend.ready and not chosen[key].ready):
                    chosen[key] = backend
    return tuple(sorted(chosen.values(), key=_order))


def _order(backend: Backend) -> tuple[int, int, int]:
    """The order Backend's own comparison gives (family, address, port), as plain ints: sorting 100,000
    endpoints through attrs' and ipaddress' comparisons costs seconds."""
    return (backend.address.version, int(backend.address), backend.port)


def categorize(endpoints: tuple[Backend, ...], policy: PortPolicy) -> Categorized:
    if not endpoints:
        return Categorized()
    cluster: tuple[Backend, ...] = ()
    has_any = False
    if policy.uses_cluster:
        cluster = tuple(ep for ep in endpoints if ep.ready)
        if not cluster:
            cluster = tuple(ep for ep in endpoints if ep.serving_terminating)
        has_any = bool(cluster)
    if not policy.uses_local:
        return Categorized(cluster, (), has_any)
    has_any = has_any or any(ep.ready or ep.serving_terminating for ep in endpoints)
    local = tuple(ep for ep in endpoints if ep.local and ep.ready)
    if not local:
        local = tuple(ep for ep in endpoints if ep.local and ep.serving_terminating)
    return Categorized(cluster, local, has_any)
