"""Which Service addresses this node announces over BGP, and why (pure; issue 34's announcement rules).

Given the cluster's Services and EndpointSlices, this node's name and the operator's pools (the
allow-list), :func:`announcements` says, per address, whether this node announces it as an exact
route (/128 or /32) and why, or why not:

- the addresses are a Service's load-balancer addresses (``status.loadBalancer.ingress``, whoever
  wrote them: flock's controller, MetalLB's, a cloud's) and its ``externalIPs``;
- only addresses inside a pool the Service may use are ever announced (CVE-2020-8554: whoever may
  create a Service may name any address; announced over BGP, that would capture the fabric's
  traffic to it) — the :class:`AllowList` says which pool, if any (:mod:`._pools`);
- ``externalTrafficPolicy: Cluster``: every node that translates the Service announces it, while the
  Service has an endpoint to send to (ready, or serving and terminating while none is ready); with
  none, every node withdraws (``withdraw_without_endpoints``, on by default: a fabric that keeps
  sending to an address nothing answers blackholes the clients that a withdrawal would fail over to
  another announcement — another cluster's, or the next hop's default);
- ``externalTrafficPolicy: Local``: only a node with a ready endpoint of the Service announces it,
  or one with a serving and terminating endpoint while none is ready (the endpoints kube-proxy's
  health check counts), so traffic never lands on a node that would drop it;
- an address two Services share (a sharing key) is announced while either wants it;
- the ClusterIP ranges, when configured, are announced as they are (aggregates).

Each announcement carries its pool's communities and local preference, for the BIRD config.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import attrs

from flock.model import Communities

from ._compile import slice_owner
from ._model import EndpointSlice, Family, IPAddress, Service, TrafficPolicy, family_of
from ._pools import AllowList, AnnouncePool
from ._select import backends, categorize, port_policy

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
NOT_IN_POOL = "in no pool this Service may use"


@attrs.frozen
class Announcement:
    """One exact route this node announces: *prefix*, from *pool*, for *services* (``namespace/name``)."""

    prefix: IPNetwork
    pool: str
    services: tuple[str, ...]
    why: str
    communities: Communities = attrs.field(factory=Communities)
    local_preference: int | None = None
    alone: bool = False  # no other node announces it (Local, every usable endpoint here)


@attrs.frozen
class NotAnnounced:
    """An address of *service* this node does not announce, and why (for ``flockctl services``)."""

    address: IPAddress
    service: str
    why: str


@attrs.frozen
class Announcements:
    routes: tuple[Announcement, ...] = ()
    not_announced: tuple[NotAnnounced, ...] = ()

    def prefixes(self) -> frozenset[IPNetwork]:
        return frozenset(r.prefix for r in self.routes)


def _exact(address: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(f"{address}/{address.max_prefixlen}")


def _wanted(
    service: Service, slices: Iterable[EndpointSlice], family: Family, node_name: str
) -> tuple[bool, str, bool]:
    """Whether this node wants *service*'s addresses of *family* announced, why (or why not), and
    whether no other node announces them (Local, every usable endpoint here: a leaving node keeps it)."""
    local = service.external_traffic_policy is TrafficPolicy.LOCAL
    any_usable = False
    here_ready = here_serving = False
    elsewhere = False
    for port in service.ports:
        policy = port_policy(service, port, external_addresses=True)
        found = backends(service, port, family, slices, node_name)
        any_usable = any_usable or bool(categorize(found, policy).cluster)
        ready = [b for b in found if b.ready]
        # the endpoints new flows should reach: the ready ones; while none is ready anywhere, the serving
        # and terminating ones (a node whose endpoint is terminating withdraws once another is ready, and
        # its proxy still delivers the flows that arrive meanwhile: kube-proxy's local fallback)
        usable = ready or [b for b in found if b.serving_terminating]
        here_ready = here_ready or any(b.local for b in ready)
        here_serving = here_serving or any(b.local for b in usable)
        elsewhere = elsewhere or any(not b.local for b in usable)
    if local:
        if here_ready:
            return True, "externalTrafficPolicy Local: a ready endpoint on this node", not elsewhere
        if here_serving:
            return (
                True,
                "externalTrafficPolicy Local: a serving and terminating endpoint here, none ready",
                not elsewhere,
            )
        return False, "externalTrafficPolicy Local: no ready endpoint on this node", False
    if any_usable:
        return True, "externalTrafficPolicy Cluster: the Service has an endpoint", False
    return False, "no endpoint is ready or serving anywhere: withdrawn on every node", False


def announcements(
    services: Iterable[Service],
    slices: Iterable[EndpointSlice],
    node_name: str,
    allow: AllowList,
    *,
    withdraw_without_endpoints: bool = True,
    cluster_ip_ranges: Iterable[tuple[IPNetwork, AnnouncePool | None]] = (),
) -> Announcements:
    """What this node announces of the Services (see the module doc), in a stable order."""
    by_service: dict[tuple[str, str], list[EndpointSlice]] = {}
    for eps in slices:
        owner = slice_owner(eps)
        if owner is not None:
            by_service.setdefault(owner, []).append(eps)
    wanted: dict[IPNetwork, tuple[AnnouncePool, list[str], list[str]]] = {}  # prefix → pool, services, whys
    shared_elsewhere: set[IPNetwork] = set()  # announced by another node for some Service
    refused: list[NotAnnounced] = []
    for service in sorted(services, key=lambda s: (s.namespace, s.name)):
        if not service.proxied:
            continue
        mine = by_service.get((service.namespace, service.name), [])
        addresses = sorted({*service.load_balancer_ips, *service.external_ips}, key=lambda a: (a.version, a))
        for address in addresses:
            pool = allow.pool_for(service, address)
            if pool is None:
                refused.append(NotAnnounced(address, service.key, NOT_IN_POOL))
                continue
            family = family_of(address)
            if service.cluster_ip(family) is None:
                refused.append(NotAnnounced(address, service.key, f"the Service has no {family.value} ClusterIP"))
                continue
            want, why, alone = _wanted(service, mine, family, node_name)
            if not want:
                kept = not withdraw_without_endpoints and service.external_traffic_policy is TrafficPolicy.CLUSTER
                if not kept:
                    refused.append(NotAnnounced(address, service.key, why))
                    continue
                why = "externalTrafficPolicy Cluster without an endpoint (--keep-service-routes-without-endpoints)"
            if not alone:
                shared_elsewhere.add(_exact(address))
            held = wanted.setdefault(_exact(address), (pool, [], []))
            held[1].append(service.key)
            held[2].append(why)
    routes = [
        Announcement(
            prefix,
            pool.name,
            tuple(names),
            "; ".join(dict.fromkeys(whys)),
            pool.communities,
            pool.local_preference,
            alone=prefix not in shared_elsewhere,
        )
        for prefix, (pool, names, whys) in wanted.items()
    ]
    for net, pool in cluster_ip_ranges:
        routes.append(
            Announcement(
                net,
                pool.name if pool is not None else "",
                (),
                "the ClusterIP range, as configured",
                pool.communities if pool is not None else Communities(),
                pool.local_preference if pool is not None else None,
            )
        )
    routes.sort(key=lambda r: (r.prefix.version, r.prefix.network_address, r.prefix.prefixlen))
    # an address another Service of it announces is announced: not refused for it
    announced = {r.prefix for r in routes}
    refused = [n for n in refused if _exact(n.address) not in announced or n.why == NOT_IN_POOL]
    return Announcements(tuple(routes), tuple(refused))


def routes_by_pool(
    result: Announcements, pools: Iterable[AnnouncePool]
) -> list[tuple[AnnouncePool, tuple[IPNetwork, ...]]]:
    """The announced prefixes grouped by pool, each with the pool (its communities and local
    preference): what BIRD's config is made of (``flock.bird.ServiceRoutes``)."""
    known = {p.name: p for p in pools}
    groups: dict[str, list[IPNetwork]] = {}
    for route in result.routes:
        groups.setdefault(route.pool, []).append(route.prefix)
    out = []
    for name, prefixes in sorted(groups.items()):
        pool = known.get(name) or AnnouncePool(name or "cluster-ips", ())
        out.append((pool, tuple(prefixes)))
    return out
