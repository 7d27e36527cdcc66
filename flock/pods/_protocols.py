"""What the pod handler and the node bring-up drive, as small protocols.

The concrete classes are chosen by the composition root (flock.agent):
:class:`flock.store.Store` (allocations), :class:`flock.netlink.NetlinkWorker`
(dataplane), the API link's pod watcher (pod lookup).  Tests pass the
in-memory ones from :mod:`flock.testing.pods`.  Nothing here imports pyroute2
or kubernetes-asyncio, so neither does :mod:`flock.pods`.

Errors: the store raises :class:`flock.faults.StoreUnavailable`, the
dataplane the other :mod:`flock.faults` kinds (NetnsUnusable, KernelRefused,
…), a pod lookup :class:`flock.pods.PodLookupFailed`; the CNI table
(``_cni_codes``) gives each its code.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Protocol

from flock.model import Allocation, AllocationState, PodInfo


class AllocationStore(Protocol):
    """The durable allocation rows (one per container ID)."""

    async def get(self, container_id: str) -> Allocation | None: ...
    async def put(self, allocation: Allocation) -> None: ...
    async def commit(self, container_id: str, *, now: float | None = None) -> Allocation: ...
    async def delete(self, container_id: str) -> bool: ...
    async def list(self, state: AllocationState | None = None) -> list[Allocation]: ...


class CleanupReport(Protocol):
    """What a cleanup removed (host interface names, routes as text)."""

    @property
    def interfaces(self) -> Sequence[str]: ...
    @property
    def routes(self) -> Sequence[str]: ...


class Dataplane(Protocol):
    """The kernel side: idempotent setup/teardown/check of a pod's network."""

    @property
    def gateway6(self) -> ipaddress.IPv6Address: ...
    @property
    def gateway4(self) -> ipaddress.IPv4Address: ...
    def host_ifname(self, container_id: str) -> str: ...
    async def setup(self, alloc: Allocation, netns_fd: int | None = None, *, mtu: int | None = None) -> object:
        """Converge the kernel, both veth ends at *mtu* (None: the dataplane's
        default); returns what it made, with ``host_mac``/``pod_mac``."""
        ...

    async def teardown(
        self, container_id: str, netns: str | None = None, if_name: str | None = None, *, routes: bool = True
    ) -> None:
        """Remove the pod's veth; *routes*: leave flock's (multipath) routes first."""
        ...

    async def leave_routes(self, container_id: str) -> None:
        """Take the pod's veth out of flock's routes and keep it (before a deferred removal)."""
        ...

    async def check(self, alloc: Allocation, netns_fd: int | None = None) -> list[str]: ...
    async def macs(self, alloc: Allocation, netns_fd: int | None = None) -> tuple[str, str]: ...
    async def node_addresses(self) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]: ...
    async def cleanup(self, explained_container_ids: Iterable[str]) -> CleanupReport: ...
    async def ensure_anycast(self, allocations: Iterable[Allocation]) -> list[str]: ...

    async def ensure_blackholes(
        self, cidrs: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network | None]
    ) -> None: ...


class PodLookup(Protocol):
    """This node's pods: ``lookup`` may wait for a cache, ``fetch_pod`` asks the
    API server directly; both return None for a pod the server does not have
    and raise :class:`flock.pods.PodLookupFailed` when it cannot be asked."""

    async def lookup(self, namespace: str, name: str) -> PodInfo | None: ...
    async def fetch_pod(self, namespace: str, name: str) -> PodInfo | None: ...


class PolicyGate(Protocol):
    """NetworkPolicy before the pod runs: ADD awaits :meth:`ensure` after the
    netlink setup and before it commits (flock.policy.PolicyService is one).
    It returns once this node's kernel enforces the pod's policies; ADD's
    deadline bounds the wait."""

    async def ensure(self, alloc: Allocation) -> None: ...


class NoPolicy:
    """No NetworkPolicy enforcement (tests of ADD alone)."""

    async def ensure(self, alloc: Allocation) -> None:
        return None


class Checkpoint(Protocol):
    """Told each named step of ADD as it is reached (the crash tests kill the agent there)."""

    def reached(self, point: str) -> None: ...


class NoCheckpoint:
    def reached(self, point: str) -> None:
        return None
