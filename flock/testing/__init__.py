"""Test doubles that behave like the real thing, shipped like ``trio.testing``."""

from ._objects import nodeconfig_object, pod_object
from ._resources import NODECONFIGS, PODS, Resource
from ._status import StatusError
from ._source import StoreSource
from ._store import Store
from ._service import serving
from ._server import ApiServer, kubeconfig, write_kubeconfig

__all__ = ["ApiServer", "NODECONFIGS", "PODS", "Resource", "Store", "StoreSource", "StatusError", "kubeconfig", "nodeconfig_object", "pod_object", "serving", "write_kubeconfig"]
