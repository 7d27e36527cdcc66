"""What BIRD's configuration depends on, gathered from the agent's state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from flock.model import Allocation, IPAddress, NodeConfig, PodInfo, ServiceRoutes


def _ips(values: Iterable[IPAddress]) -> frozenset[IPAddress]:
    return frozenset(values)


def pod_is_ready(alloc: Allocation, pods: Mapping[str, PodInfo]) -> bool:
    """Whether *alloc*'s pod counts as Ready for announcing its anycast addresses.

    The pod informer's cache (keyed "namespace/name") decides: its Ready
    condition, or ready when the pod carries no status conditions at all (not
    run by a kubelet). A pod the cache does not hold (no API server, an
    informer not synced yet after an agent restart, a container without a
    Kubernetes pod) keeps its announcement: withdrawing every anycast route
    while an agent restarts would defeat graceful restart. A cached pod of
    the same name but another UID is a successor: the allocation's own pod is
    gone, so it is not ready.
    """
    pod = pods.get(f"{alloc.namespace}/{alloc.pod}")
    if pod is None:
        return True
    if pod.uid and alloc.pod_uid and pod.uid != alloc.pod_uid:
        return False
    return pod.ready is not False


@attrs.frozen
class BirdInputs:
    """The node, the anycast and extra pod addresses to announce, and the BGP
    passwords read from Secrets (peer name → password; rendered only into the
    separate secrets file, never logged: ``repr`` hides them)."""

    node: NodeConfig
    anycast: frozenset[IPAddress] = attrs.field(default=frozenset(), converter=_ips)
    addresses: frozenset[IPAddress] = attrs.field(default=frozenset(), converter=_ips)
    #: Anycast addresses held only by local pods that are not Ready: routed
    #: locally, not announced.
    withheld: frozenset[IPAddress] = attrs.field(default=frozenset(), converter=_ips)
    passwords: Mapping[str, str] = attrs.field(factory=dict, repr=False, hash=False)
    #: Service addresses to announce, grouped by pool (flock.services' announcements, issue 34).
    services: tuple[ServiceRoutes, ...] = ()
    #: This node is leaving (drain, agent stopping): Service routes carry GRACEFUL_SHUTDOWN first.
    leaving: bool = False

    @classmethod
    def collect(
        cls,
        node: NodeConfig,
        allocations: Iterable[Allocation],
        *,
        pods: Mapping[str, PodInfo] | None = None,
        passwords: Mapping[str, str] | None = None,
    ) -> BirdInputs:
        """Anycast and extra addresses of every allocation, pending ones included.

        A pending pod's address in the config is harmless (BIRD announces it
        only once the kernel route exists) and means the route is announced
        the moment setup installs it, without waiting for another render.

        An anycast address is announced while at least one of its local pods
        is Ready (:func:`pod_is_ready` over *pods*, the pod informer's cache);
        the others are ``withheld``: their kernel routes stay, so the node
        itself still reaches them, but the fabric sends their traffic to
        nodes with a Ready replica.

        A pod whose own address lies outside the node's current blocks (the
        NodeConfig's block changed under running pods, which keep their
        addresses) is announced on its own, so it stays reachable until it goes.
        """
        blocks = [b for b in (node.cidr6, node.cidr4) if b is not None]
        anycast: set[IPAddress] = set()
        held: set[IPAddress] = set()
        addresses: set[IPAddress] = set()
        cache = pods if pods is not None else {}
        for alloc in allocations:
            held.update(alloc.anycast)
            if alloc.anycast and pod_is_ready(alloc, cache):
                anycast.update(alloc.anycast)
            addresses.update(alloc.addresses)
            addresses.update(
                ip
                for ip in (alloc.ip6, alloc.ip4)
                if ip is not None and not any(ip.version == b.version and ip in b for b in blocks)
            )
        return cls(node, anycast, addresses, held - anycast, dict(passwords or {}))
