"""The service proxy (kube-proxy's job, nftables mode): Services and EndpointSlices → table ``inet flock-services``.

Pure layers, not yet wired into the agent:

- :mod:`._model`: :class:`Service`, :class:`EndpointSlice` (validating ``from_object``);
- :mod:`._select`: endpoint choice per Service port and family, as kube-proxy's ``CategorizeEndpoints``;
- :mod:`._compile`: :func:`compile_table` → :class:`ServicesTable` (the desired table as a value);
- :mod:`._nft`: :func:`render_full` and :func:`render_update` (old → new, one transaction);
- :mod:`._kubeproxy`: :func:`find_kube_proxy` — the proxy never turns on while kube-proxy's own
  tables, chains or IPVS interface are on the node.
"""

from ._compile import NodeView, ServicesConfig, compile_table
from ._health import HealthChecks
from ._inputs import ENDPOINT_SLICES, SERVICES, ServiceInputs
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
from ._proxy import ServiceProxy
from ._select import Backend, Categorized, PortPolicy, backends, categorize, port_policy
from ._table import TABLE, AffinitySet, HealthCheck, ServicesTable, Skeleton

__all__ = [
    "ENDPOINT_SLICES",
    "SERVICES",
    "TABLE",
    "AffinitySet",
    "Backend",
    "Categorized",
    "Endpoint",
    "EndpointPort",
    "EndpointSlice",
    "Family",
    "HealthCheck",
    "HealthChecks",
    "NodeView",
    "PortPolicy",
    "Service",
    "ServiceInputs",
    "ServicePort",
    "ServiceProxy",
    "ServiceType",
    "ServicesConfig",
    "ServicesTable",
    "Skeleton",
    "TrafficPolicy",
    "backends",
    "categorize",
    "compile_table",
    "find_kube_proxy",
    "kube_proxy_traces",
    "port_policy",
    "render_full",
    "render_update",
]
