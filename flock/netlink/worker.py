"""The netlink worker: the one owner of kernel changes on the node.

Every operation runs its pyroute2 calls on a Trio worker thread
(``trio.to_thread.run_sync``), in a private asyncio loop there (pyroute2's
``AsyncIPRoute`` is asyncio-native; the loop lives and dies with the call); a
:class:`trio.CapacityLimiter` bounds how many run at once.  Those threads
never change namespace: sockets and sysctl writes for another namespace are
opened on a dedicated short-lived thread (see ``_nsenter``), so a reused
worker thread is always in the agent's namespace.

Error handling: nothing is retried here.  Kernel refusals propagate as
:class:`~flock.faults.KernelRefused`, a missing or invalid pod namespace as
:class:`~flock.faults.NetnsUnusable`, an unusable allocation as
:class:`~flock.faults.AllocationUnusable` (typed errors: the CNI code is
chosen at the CNI boundary, :mod:`flock.pods._cni_codes`), to the
caller (the ADD/DEL orchestration), which owns retries and deadlines.  Every
operation is idempotent, so retrying means calling it again.  Cancellation
takes effect when the running thread returns (threads are not abandoned), so
a retry never races an earlier attempt on the same kernel objects.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import threading
from collections.abc import Iterable

import attrs
import trio

from flock.model import Allocation
from flock.netlink import _apply, _conn, _inspect
from flock.netlink.desired import Attachment, DataplaneSettings, PodPlan, host_ifname, pod_plan

log = logging.getLogger("flock.netlink")

DEFAULT_PARALLEL_SETUPS = 8


@attrs.define(eq=False)
class NetlinkWorker:
    """Applies pod plans to the kernel of *host_netns* (None: the agent's own).

    ``fault`` is a test hook: called with each setup step's name (see
    ``STEPS``) after the step succeeded; whatever it raises aborts the setup
    there, as a crash would.
    """

    settings: DataplaneSettings = DataplaneSettings()
    host_netns: str | None = None
    max_parallel: int = DEFAULT_PARALLEL_SETUPS
    fault: _apply.FaultHook | None = None
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    # Anycast routes are read-modify-write across pods; worker threads
    # serialize on this lock (held only around those few netlink calls).
    _anycast_lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.max_parallel)

    async def _run(self, fn, *args, **kwargs):
        """Run the kernel coroutine *fn* on a worker thread (see module doc)."""
        return await trio.to_thread.run_sync(
            functools.partial(_conn.run_blocking, fn, *args, **kwargs), limiter=self._limiter
        )

    @property
    def gateway6(self) -> ipaddress.IPv6Address:
        return self.settings.gateway6

    @property
    def gateway4(self) -> ipaddress.IPv4Address:
        return self.settings.gateway4

    def host_ifname(self, container_id: str) -> str:
        """The host-side veth name of a container's pod."""
        return host_ifname(container_id, self.settings.host_prefix)

    def plan(self, alloc: Allocation) -> PodPlan:
        return pod_plan(alloc, self.settings)

    async def setup(self, alloc: Allocation) -> Attachment:
        """Create or converge the pod's veth, addresses, sysctls and routes,
        and add it to the multipath route of each of its anycast addresses."""
        plan = self.plan(alloc)
        attachment = await self._run(
            _apply.setup_pod,
            plan,
            host_netns=self.host_netns,
            anycast_lock=self._anycast_lock,
            settings=self.settings,
            fault=self.fault,
        )
        log.debug("pod network set up", extra={"container_id": alloc.container_id, "host_iface": plan.veth.host})
        return attachment

    async def teardown(self, container_id: str, netns: str | None = None, if_name: str | None = None) -> None:
        """Remove the pod's veth and its share of flock routes; anything
        already gone (netns, interface, route) is success."""
        await self._run(
            _apply.teardown_pod,
            container_id,
            netns,
            if_name,
            host_netns=self.host_netns,
            anycast_lock=self._anycast_lock,
            settings=self.settings,
        )

    async def check(self, alloc: Allocation) -> list[str]:
        """Differences between the allocation's desired state and the kernel,
        one precise sentence each; empty when in sync."""
        plan = self.plan(alloc)
        return await self._run(_inspect.check_pod, plan, host_netns=self.host_netns, settings=self.settings)

    async def cleanup(self, explained_container_ids: Iterable[str]) -> _inspect.CleanupReport:
        """Remove flock-owned host veths and routes no allocation explains."""
        explained = {host_ifname(cid, self.settings.host_prefix) for cid in explained_container_ids}
        report = await self._run(
            _inspect.cleanup,
            explained,
            host_netns=self.host_netns,
            anycast_lock=self._anycast_lock,
            settings=self.settings,
        )
        if report.interfaces or report.routes:
            log.info("removed orphans", extra={"interfaces": list(report.interfaces), "routes": list(report.routes)})
        return report

    async def inventory(self) -> _inspect.Inventory:
        """flock's host veths and routes as the kernel has them (read-only, for flockctl)."""
        return await self._run(_inspect.inventory, host_netns=self.host_netns, settings=self.settings)

    async def ensure_anycast(self, allocations: Iterable[Allocation]) -> list[str]:
        """Rewrite each anycast address's multipath route over all local pods
        in *allocations* whose veth exists (returns the routes rewritten).
        Call after a DEL whose pod namespace was already gone, and at startup:
        the kernel drops a whole IPv4 multipath route when one veth vanishes."""
        plans = [self.plan(a) for a in allocations]

        async def apply() -> list[str]:
            with self._anycast_lock:
                async with _conn.rtnl(self.host_netns) as host:
                    return await _apply.ensure_anycast(host, plans, self.settings)

        return await self._run(apply)

    async def ensure_blackholes(self, cidrs: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network | None]) -> None:
        """Blackhole routes for exactly these node blocks (others of flock's go)."""
        nets = tuple(c for c in cidrs if c is not None)

        async def apply() -> None:
            async with _conn.rtnl(self.host_netns) as host:
                await _apply.ensure_blackholes(host, nets, self.settings)

        await self._run(apply)

    async def prepare_node(self, uplink: str | None = None) -> None:
        """Forwarding on, and a unicast route to the IPv4 gateway out of a
        non-flock interface (added via *uplink* if missing) — what proxy ARP
        needs.  :class:`~flock.faults.NodeUnprepared` when neither exists."""

        async def apply() -> None:
            async with _conn.rtnl(self.host_netns) as host:
                await _apply.prepare_node(host, self.host_netns, uplink, self.settings)

        await self._run(apply)
