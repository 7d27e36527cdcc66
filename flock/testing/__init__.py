"""Test doubles that behave like the real thing, shipped like ``trio.testing``."""

from ._resources import NODECONFIGS, PODS, Resource
from ._status import StatusError
from ._store import Store
from .apiserver import ApiServer, kubeconfig, write_kubeconfig

__all__ = ["ApiServer", "NODECONFIGS", "PODS", "Resource", "Store", "StatusError", "kubeconfig", "write_kubeconfig"]
