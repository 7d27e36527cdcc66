"""The netlink worker: the one owner of kernel changes on the node.

Every operation runs its pyroute2 calls on a Trio worker thread
(``trio.to_thread.run_sync``), in a private asyncio loop there (pyroute2's
``AsyncIPRoute`` is asyncio-native; the loop lives and dies with the call) —
except a new pod's setup, the hot path, which sends batched requests on plain
blocking sockets (``_batch``).  A :class:`trio.CapacityLimiter` bounds how
many run at once.  Those threads never change namespace: sockets and sysctl
writes for another namespace are opened on a dedicated short-lived thread,
or for a new pod on one long-lived thread that returns home after each call
(see ``_nsenter``), so a reused worker thread is always in the agent's
namespace.

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

import contextlib
import functools
import ipaddress
import logging
import os
import threading
from collections.abc import Iterable, Iterator

import attrs
import trio

from flock import errors, faults
from flock.model import Allocation, UplinkMtu
from flock.netlink import _apply, _conn, _conntrack, _inspect, _nsenter, _scan, _uplink
from flock.netlink.desired import AppliedPlan, DataplaneSettings, PodPlan, host_ifname, pod_plan

log = logging.getLogger("flock.netlink")

DEFAULT_PARALLEL_SETUPS = 8


class NetnsNotFound(faults.NetnsUnusable):
    """The pod's namespace path does not exist."""


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
    # Namespaces no pod may be set up in: the agent's own, PID 1's, host_netns.
    _refused: frozenset[tuple[int, int]] = attrs.field(init=False)
    # Opens each new pod's netlink socket in its namespace (see _nsenter).
    _netns_thread: _nsenter.NetnsThread = attrs.field(init=False, factory=_nsenter.NetnsThread)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.max_parallel)
        self._refused = _nsenter.node_netns_ids(self.host_netns)

    @contextlib.contextmanager
    def pod_netns(self, alloc: Allocation, netns_fd: int | None) -> Iterator[int]:
        """The pod's namespace as a verified fd: *netns_fd* (the one the shim
        sent, borrowed) or, when there is none, the allocation's path opened
        here (and closed after).  Either must be a network namespace other
        than the node's: :class:`~flock.faults.NetnsUnusable` naming the path
        and why (:class:`NetnsNotFound` when the path does not exist)."""
        where = f"netns={errors.quote(alloc.netns)}"
        try:
            if netns_fd is not None:
                _nsenter.check_netns_fd(netns_fd, self._refused)
                fd, owned = netns_fd, False
            else:
                fd, owned = _nsenter.open_checked_netns(alloc.netns, self._refused), True
        except _nsenter.NetnsMissing:
            raise NetnsNotFound("network namespace not found", f"{where}: no such file") from None
        except _nsenter.NetnsUnusable as exc:
            raise faults.NetnsUnusable("unusable network namespace", f"{where}: {exc.reason}") from None
        except OSError as exc:  # fstat of a received fd
            raise faults.NetnsUnusable("unusable network namespace", f"{where}: {exc}") from None
        try:
            yield fd
        finally:
            if owned:
                os.close(fd)

    async def _run(self, fn, *args, **kwargs):
        """Run the kernel coroutine *fn* on a worker thread (see module doc)."""
        return await self._run_sync(_conn.run_blocking, fn, *args, **kwargs)

    async def _run_sync(self, fn, *args, **kwargs):
        """Run the blocking kernel function *fn* on a worker thread."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)

    @property
    def gateway6(self) -> ipaddress.IPv6Address:
        return self.settings.gateway6

    @property
    def gateway4(self) -> ipaddress.IPv4Address:
        return self.settings.gateway4

    def host_ifname(self, container_id: str) -> str:
        """The host-side veth name of a container's pod."""
        return host_ifname(container_id, self.settings.host_prefix)

    def plan(self, alloc: Allocation, mtu: int | None = None) -> PodPlan:
        """The pod's kernel state; *mtu* for both veth ends (None: ``settings.mtu``)."""
        settings = self.settings if mtu is None else attrs.evolve(self.settings, mtu=mtu)
        return pod_plan(alloc, settings)

    async def setup(self, alloc: Allocation, netns_fd: int | None = None, *, mtu: int | None = None) -> AppliedPlan:
        """Create or converge the pod's veth, addresses, sysctls and routes,
        and add it to the multipath route of each of its anycast addresses.
        *netns_fd*: the pod's namespace as the shim sent it (see :meth:`pod_netns`);
        *mtu*: both veth ends' (None: ``settings.mtu``, else the kernel's 1500)."""
        plan = self.plan(alloc, mtu)
        with self.pod_netns(alloc, netns_fd) as fd:
            applied = await self._run_sync(
                _apply.setup_pod,
                plan,
                pod_netns=fd,
                host_netns=self.host_netns,
                anycast_lock=self._anycast_lock,
                settings=self.settings,
                fault=self.fault,
                netns_thread=self._netns_thread,
            )
        log.debug("pod network set up", extra={"container_id": alloc.container_id, "host_iface": plan.veth.host})
        return applied

    async def teardown(
        self, container_id: str, netns: str | None = None, if_name: str | None = None, *, routes: bool = True
    ) -> None:
        """Remove the pod's veth and its share of flock routes; anything
        already gone (netns, interface, route) is success.  By container ID
        alone: *netns* and *if_name* are accepted for the callers' sake and
        never used (the pod's namespace is not entered, see ``teardown_pod``).
        *routes*=False skips leaving flock's routes first: right for a pod
        without anycast addresses, or one that has left them already
        (:meth:`leave_routes`); the kernel drops its single-path routes with the veth."""
        if not routes:
            await self._run_sync(
                _apply.remove_veth,
                container_id,
                host_netns=self.host_netns,
                settings=self.settings,
                enter=self._netns_thread.run,
            )
            return
        await self._teardown(container_id, routes=routes)

    async def leave_routes(self, container_id: str) -> None:
        """Take the pod's host veth (if flock's) out of every flock route, and
        leave the veth: what must happen before an anycast pod's veth goes
        (an IPv4 multipath route dies whole with any one of its devices)."""
        await self._teardown(container_id, link=False)

    async def _teardown(self, container_id: str, **what: bool) -> None:
        await self._run(
            _apply.teardown_pod,
            container_id,
            host_netns=self.host_netns,
            anycast_lock=self._anycast_lock,
            settings=self.settings,
            **what,
        )

    async def check(self, alloc: Allocation, netns_fd: int | None = None, *, mtu: int | None = None) -> list[str]:
        """Differences between the allocation's desired state and the kernel,
        one precise sentence each; empty when in sync.  The veth ends' MTU
        must be equal (ADD sets both) and, when *mtu* is given (what ADD
        reported), be it; the MTU in force now is not compared: existing pods
        keep theirs."""
        plan = self.plan(alloc, mtu)
        try:
            with self.pod_netns(alloc, netns_fd) as fd:
                return await self._run(
                    _inspect.check_pod, plan, pod_netns=fd, host_netns=self.host_netns, settings=self.settings
                )
        except NetnsNotFound:
            return [f"pod: network namespace {errors.quote(alloc.netns)} missing"]

    async def macs(self, alloc: Allocation, netns_fd: int | None = None) -> tuple[str, str]:
        """The live MAC addresses of the pod's host and pod interfaces ("" where
        missing, the pod's namespace included); *netns_fd* as for :meth:`check`."""
        plan = self.plan(alloc)
        try:
            with self.pod_netns(alloc, netns_fd) as fd:
                return await self._run(_inspect.read_macs, plan, pod_netns=fd, host_netns=self.host_netns)
        except faults.NetnsUnusable:
            return await self._run(_inspect.read_macs, plan, pod_netns=None, host_netns=self.host_netns)

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
        if not any(p.anycast for p in plans):
            # Nothing to compare (and a pyroute2 socket opened but never used is never closed).
            return []

        async def apply() -> list[str]:
            with self._anycast_lock:
                async with _conn.rtnl(self.host_netns) as host:
                    return await _apply.ensure_anycast(host, plans, self.settings)

        return await self._run(apply)

    async def uplink_mtu(self) -> UplinkMtu:
        """The MTU of the interface holding the node's default route (IPv6
        first, else IPv4; 1500 without one): :class:`~flock.faults.KernelRefused`
        when the kernel cannot be read."""
        try:
            return await trio.to_thread.run_sync(_uplink.read_uplink_mtu, self.host_netns, limiter=self._limiter)
        except OSError as exc:
            raise faults.KernelRefused("netlink default route read failed", str(exc)) from exc

    async def node_addresses(self) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        """The node's own interface addresses (no pod may claim one)."""

        def read() -> list[_scan.Address]:
            with _scan.Scanner(self.host_netns) as scanner:
                return scanner.addresses()

        try:
            # One dump on a plain socket (see _scan): every pod veth has an address (fe80::1).
            return frozenset(a.address for a in await trio.to_thread.run_sync(read, limiter=self._limiter))
        except OSError as exc:
            raise faults.KernelRefused("netlink address dump failed", str(exc)) from exc

    async def forget_flows(self, ports: Iterable[tuple[str, int]]) -> int:
        """Delete the conntrack entries of UDP and SCTP flows to these host ports ((protocol, port)),
        in the node's namespace: a new hostPort mapping then catches clients that were already
        sending (see :mod:`flock.netlink._conntrack`).  How many; :class:`~flock.faults.KernelRefused`
        when conntrack cannot be read."""
        wanted = tuple((p, port) for p, port in ports if p in _conntrack.PROTOCOLS)
        if not wanted:
            return 0

        def run() -> int:
            return _nsenter.run_in_netns(self.host_netns, functools.partial(_conntrack.forget, wanted))

        try:
            return await trio.to_thread.run_sync(run, limiter=self._limiter)
        except (OSError, _nsenter.NetnsMissing) as exc:
            raise faults.KernelRefused("conntrack entries could not be deleted", str(exc)[:300]) from exc

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
