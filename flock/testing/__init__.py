"""Test doubles and harnesses that behave like the real thing (real HTTP, real
namespaces), shipped like ``trio.testing``: the fake API server here, network
namespace helpers in ``flock.testing.netns``."""

from ._admission import NAME_LABEL
from ._objects import namespace_object, network_policy_object, nodeconfig_object, pod_object, secret_object
from ._resources import NAMESPACES, NETWORKPOLICIES, NODECONFIGS, PODS, RESOURCES, SECRETS, Resource
from ._server import ApiServer, kubeconfig, write_kubeconfig
from ._service import serving
from ._source import StoreSource
from ._status import StatusError
from ._store import ObjectStore

__all__ = [
    "NAMESPACES",
    "NAME_LABEL",
    "NETWORKPOLICIES",
    "NODECONFIGS",
    "PODS",
    "RESOURCES",
    "SECRETS",
    "ApiServer",
    "ObjectStore",
    "Resource",
    "StatusError",
    "StoreSource",
    "kubeconfig",
    "namespace_object",
    "network_policy_object",
    "nodeconfig_object",
    "pod_object",
    "secret_object",
    "serving",
    "write_kubeconfig",
]
