"""The service proxy in the agent: the watchers it needs, the proxy, its health check ports.

Built by :func:`flock.agent.compose` from :class:`AgentSettings`:

- ``--service-proxy`` off (the default): one child, ``services``, removes ``table inet
  flock-services`` if an earlier run left it, and idles; no watcher runs.
- on: the API link runs a :class:`flock.watchers.ServiceWatcher` (every Service and
  EndpointSlice → :class:`ServiceInputs`) and a :class:`flock.watchers.PoolWatcher` (the
  LoadBalancerPools and the namespaces' labels → the allow-list, to which
  ``--service-external-cidr`` adds its ranges); ``services`` is the :class:`ServiceProxy` (refused
  while kube-proxy is on the node, see :mod:`flock.services._kubeproxy`); ``health-checks``
  answers the healthCheckNodePorts of this node's ``externalTrafficPolicy: Local`` Services.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence

import attrs
import trio
from prometheus_client import CollectorRegistry

from flock.netlink import NetlinkWorker
from flock.netns import call_in_netns
from flock.nursery import ChildSpec
from flock.policy import NftBackend
from flock.services import (
    KINDS,
    POOLS,
    HealthChecks,
    NodeView,
    ServiceInputs,
    ServiceMetrics,
    ServiceProxy,
    ServicesConfig,
    StaleFlows,
    find_kube_proxy,
    forget_stale,
)
from flock.state import NodeState
from flock.watchers import KubeClient, PoolWatcher, ServiceWatcher

from ._cli import AgentSettings

NOTE = "service-proxy"


def _usable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address a NodePort answers on: the node's own, reachable from elsewhere."""
    return not (address.is_link_local or address.is_loopback or address.is_multicast or address.is_unspecified)


async def _forget(netns: str | None, stale: list[StaleFlows]) -> int:
    """Delete stale UDP conntrack entries in the node's namespace, on a thread."""
    return await trio.to_thread.run_sync(call_in_netns, netns, functools.partial(forget_stale, stale))


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def pod_ranges(networks: Sequence[Network]) -> tuple[Network, ...]:
    """The node's pod blocks and the cluster ranges as the proxy's "from a pod" set takes them:
    collapsed per family, IPv6 first.  A node's block lies inside a cluster range as a rule
    (2001:db8:0:1::/64 in 2001:db8::/48), and an nftables interval set refuses overlapping
    elements ("conflicting intervals specified": the whole table would be refused)."""
    out: list[Network] = []
    for version in (6, 4):
        same = [n for n in networks if n.version == version]
        out += list(ipaddress.collapse_addresses(same))  # type: ignore[type-var]
    return tuple(out)


@attrs.define(eq=False)
class ServicesPart:
    """What the composition root adds for Services: children, an API watcher factory, the inputs."""

    inputs: ServiceInputs
    proxy: ServiceProxy
    health: HealthChecks | None
    pools: PoolWatcher | None = None  # the allow-list's watcher, once the API link made it

    def watchers(self, client: KubeClient) -> Sequence[ChildSpec]:
        self.pools = PoolWatcher(client.load_balancer_pools(), client.namespaces(), self.inputs)
        return [
            ChildSpec("service-watchers", ServiceWatcher(client.services(), client.endpoint_slices(), self.inputs).run),
            ChildSpec("pool-watcher", self.pools.run),
        ]

    def children(self) -> list[ChildSpec]:
        children = [ChildSpec("services", self.proxy.run)]
        if self.health is not None:
            children.append(ChildSpec("health-checks", self.health.run))
        return children


def services_part(
    settings: AgentSettings,
    state: NodeState,
    netlink: NetlinkWorker,
    backend: NftBackend,
    registry: CollectorRegistry | None = None,
) -> ServicesPart:
    # the proxy waits for the allow-list too: a restart must not drop the external addresses meanwhile
    inputs = ServiceInputs(required=frozenset((*KINDS, POOLS)))

    async def node() -> NodeView:
        addresses = sorted((a for a in await netlink.node_addresses() if _usable(a)), key=lambda a: (a.version, a))
        return NodeView(settings.node, tuple(addresses))

    def config() -> ServicesConfig:
        nodeconfig = state.nodeconfig
        pods: tuple[Network, ...] = ()
        if nodeconfig is not None:
            blocks = (nodeconfig.cidr6, *((nodeconfig.cidr4,) if nodeconfig.cidr4 is not None else ()))
            pods = pod_ranges((*blocks, *nodeconfig.cluster_ranges))
        return ServicesConfig(pod_cidrs=pods, allow=inputs.allow.with_cidrs(settings.service_external_cidrs))

    health = HealthChecks(settings.host_netns) if settings.service_proxy else None
    proxy = ServiceProxy(
        inputs=inputs,
        backend=backend,
        node=node,
        config=config,
        kube_proxy=functools.partial(find_kube_proxy, settings.host_netns),
        note=functools.partial(state.set_note, NOTE),
        enabled=settings.service_proxy,
        on_health=health.update if health is not None else None,
        metrics=ServiceMetrics(registry) if registry is not None and settings.service_proxy else None,
        forget=functools.partial(_forget, settings.host_netns),
        on_announce=state.set_service_routes if settings.bird else None,
        cluster_ip_ranges=settings.announce_cluster_ip_ranges,
        withdraw_without_endpoints=settings.withdraw_without_endpoints,
    )
    return ServicesPart(inputs, proxy, health)
