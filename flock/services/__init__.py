"""The service proxy (kube-proxy's job, nftables mode): Services and EndpointSlices → table ``inet flock-services``.

Pure layers, and the loop that applies them (:class:`ServiceProxy`):

- :mod:`._model`: :class:`Service`, :class:`EndpointSlice` (validating ``from_object``);
- :mod:`._select`: endpoint choice per Service port and family, as kube-proxy's ``CategorizeEndpoints``;
- :mod:`._compile`: :func:`compile_table` → :class:`ServicesTable` (the desired table as a value), from
  one :class:`ServicePiece` per Service (:func:`compile_service`);
- :mod:`._engine`: :class:`ServicesEngine` — the table kept change by change (only the Services the
  written keys touch are compiled again), each change a :class:`TableDelta`; held to compile_table;
- :mod:`._counters`: :func:`service_connections` — the kernel's per-element counters → per Service port,
  and :class:`ServiceMetrics` (their series on /metrics);
- :mod:`._pools`: :class:`AllowList` — the LoadBalancerPools (and ``--service-external-cidr``): which
  external addresses a Service may have translated and announced;
- :mod:`._announce`: :func:`announcements` — which Service addresses this node announces over BGP
  and why (issue 34's rules);
- :mod:`._nft`: :func:`render_full` and :func:`render_update` (old → new, one transaction);
- :mod:`._kubeproxy`: :func:`find_kube_proxy` — the proxy never turns on while kube-proxy's own
  tables, chains or IPVS interface are on the node.
"""

from ._announce import Announcement, Announcements, NotAnnounced, announcements
from ._compile import NodeView, ServicePiece, ServicesConfig, compile_service, compile_table
from ._conntrack import StaleFlows, forget_stale, stale_flows
from ._counters import ServiceMetrics, ServicePortCounts, ServicePortKey, decode_key, service_connections
from ._engine import ServicesEngine, TableDelta
from ._health import HealthChecks
from ._inputs import ENDPOINT_SLICES, KINDS, POOLS, SERVICES, ServiceChanges, ServiceInputs, ServiceJournal
from ._kubeproxy import find_kube_proxy, kube_proxy_traces
from ._model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Family,
    Service,
    ServicePort,
    ServiceType,
    TrafficPolicy,
)
from ._nft import render_full, render_update
from ._pools import FLAG_POOL, AllowList, AnnouncePool
from ._proxy import ServiceProxy
from ._select import Backend, Categorized, PortPolicy, backends, categorize, port_policy
from ._table import TABLE, AffinitySet, Counted, HealthCheck, ServicesTable, Skeleton

__all__ = [
    "ENDPOINT_SLICES",
    "FLAG_POOL",
    "KINDS",
    "POOLS",
    "SERVICES",
    "TABLE",
    "AffinitySet",
    "AllowList",
    "AnnouncePool",
    "Announcement",
    "Announcements",
    "Backend",
    "Categorized",
    "Counted",
    "Endpoint",
    "EndpointPort",
    "EndpointSlice",
    "Family",
    "HealthCheck",
    "HealthChecks",
    "NodeView",
    "NotAnnounced",
    "PortPolicy",
    "Service",
    "ServiceChanges",
    "ServiceInputs",
    "ServiceJournal",
    "ServiceMetrics",
    "ServicePiece",
    "ServicePort",
    "ServicePortCounts",
    "ServicePortKey",
    "ServiceProxy",
    "ServiceType",
    "ServicesConfig",
    "ServicesEngine",
    "ServicesTable",
    "Skeleton",
    "StaleFlows",
    "TableDelta",
    "TrafficPolicy",
    "announcements",
    "backends",
    "categorize",
    "compile_service",
    "compile_table",
    "decode_key",
    "find_kube_proxy",
    "forget_stale",
    "kube_proxy_traces",
    "port_policy",
    "render_full",
    "render_update",
    "service_connections",
    "stale_flows",
]
