"""Test doubles and harnesses that behave like the real thing (real HTTP, real
namespaces), shipped like ``trio.testing``: the fake API server here, network
namespace helpers in ``flock.testing.netns``."""

from ._admission import NAME_LABEL
from ._objects import (
    cluster_network_policy_object,
    namespace_object,
    network_policy_object,
    node_object,
    nodeconfig_object,
    pod_object,
    secret_object,
)
from ._resources import (
    CLUSTERNETWORKPOLICIES,
    NAMESPACES,
    NETWORKPOLICIES,
    NODECONFIGS,
    NODES,
    PODS,
    RESOURCES,
    SECRETS,
    Resource,
)
from ._server import ApiServer, kubeconfig, write_kubeconfig
from ._service import serving
from ._source import StoreSource
from ._status import StatusError
from ._store import ObjectStore

__all__ = [
    "CLUSTERNETWORKPOLICIES",
    "NAMESPACES",
    "NAME_LABEL",
    "NETWORKPOLICIES",
    "NODECONFIGS",
    "NODES",
    "PODS",
    "RESOURCES",
    "SECRETS",
    "ApiServer",
    "ObjectStore",
    "Resource",
    "StatusError",
    "StoreSource",
    "cluster_network_policy_object",
    "kubeconfig",
    "namespace_object",
    "network_policy_object",
    "node_object",
    "nodeconfig_object",
    "pod_object",
    "secret_object",
    "serving",
    "write_kubeconfig",
]
