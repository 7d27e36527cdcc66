"""Test doubles and harnesses that behave like the real thing (real HTTP, real
namespaces), shipped like ``trio.testing``: the fake API server here, network
namespace helpers in ``flock.testing.netns``."""

from ._objects import nodeconfig_object, pod_object, secret_object
from ._resources import NODECONFIGS, PODS, SECRETS, Resource
from ._server import ApiServer, kubeconfig, write_kubeconfig
from ._service import serving
from ._source import StoreSource
from ._status import StatusError
from ._store import ObjectStore

__all__ = [
    "NODECONFIGS",
    "PODS",
    "SECRETS",
    "ApiServer",
    "ObjectStore",
    "Resource",
    "StatusError",
    "StoreSource",
    "kubeconfig",
    "nodeconfig_object",
    "pod_object",
    "secret_object",
    "serving",
    "write_kubeconfig",
]
