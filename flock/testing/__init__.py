"""Harnesses and strategies for flock's tests and benchmarks, shipped like
``trio.testing``: an in-process source for the watchers over the API server's
storage (:class:`StoreSource`), supervised services for the length of a block
(:func:`serving`), network namespaces (``flock.testing.netns``), an agent with
its shim (``flock.testing.agentlab``), a lab driven as the NetworkPolicy
stages drive it (``flock.testing.netpol``) and more.  The API server they run
is :mod:`flock.apiserver`; nothing in flock outside the tests imports this package."""

from ._service import serving
from ._source import StoreSource

__all__ = ["StoreSource", "serving"]
