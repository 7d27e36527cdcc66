"""Kernel changes: pod setup and teardown, anycast membership, blackholes and
the node's proxy-ARP prerequisites (coroutines for ``_conn.run_blocking``;
:func:`setup_pod` is blocking itself).

Every function here is idempotent — create, accept "exists", re-read and
verify; delete, accept "not found" — so re-running one converges whatever an
earlier, interrupted run left behind.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWADDR, RTM_NEWLINK

from flock.faults import IfNameTaken, KernelRefused, NetnsUnusable, NodeUnprepared
from flock.netlink import _batch, _build, _conn, _nsenter
from flock.netlink.desired import (
    Address,
    AppliedPlan,
    DataplaneSettings,
    PodPlan,
    Route,
    Side,
    anycast_route,
    anycast_routes,
    blackhole_routes,
    host_ifname,
    is_host_ifname,
)

# The order setup applies things in; a fault hook is called after each.
STEPS = (
    "veth",
    "host-link",
    "host-sysctls",
    "host-address",
    "host-up",
    "pod-link",
    "pod-addresses",
    "pod-routes",
    "host-routes",
    "anycast",
)

log = logging.getLogger("flock.netlink")

FaultHook = Callable[[str], None]
RTPROT_STATIC = 4


def _fail(step: str, what: str, exc: BaseException) -> KernelRefused:
    return KernelRefused(f"netlink {step} failed", f"{what}: {exc}")


def ignore_codes(exc: NetlinkError, *codes: int) -> None:
    if exc.code not in codes:
        raise exc


def _netns_error(plan: PodPlan, why: str) -> NetnsUnusable:
    return NetnsUnusable("network namespace not found", f"netns={plan.netns!r}: {why}")


OWNER_PREFIX = "flock:"
_IFALIASZ = 255  # usable bytes of IFLA_IFALIAS


def owner_marker(container_id: str) -> str:
    """The ifalias flock sets on a host veth it made: ``flock:<container ID>``."""
    return (OWNER_PREFIX + container_id)[:_IFALIASZ]


def owned_by_flock(msg: Any, settings: DataplaneSettings, container_id: str | None = None) -> bool:
    """Whether the host link *msg* is provably flock's: a veth with flock's
    name (of *container_id*, if given) whose ifalias is flock's marker (of
    that container).  A veth with flock's name and no alias at all is one an
    agent made before it set markers, or one cut short between creation and
    marking (both flock's: nobody else picks these names and leaves no alias)."""
    return is_flock_link(
        msg.get_attr("IFLA_IFNAME") or "",
        link_kind(msg),
        msg.get_attr("IFLA_IFALIAS") or "",
        settings,
        container_id,
    )


# A link message's attributes are read with get_attr: pyroute2's get() looks
# each name up through its nested-path and field fallbacks, about twice the
# cost (a new pod's two link messages were read ten times).


def link_kind(msg: Any) -> str | None:
    """The link message's IFLA_INFO_KIND ("veth"), None without one."""
    info = msg.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info is not None else None


def link_mac(msg: Any) -> str:
    return msg.get_attr("IFLA_ADDRESS") or ""


def is_flock_link(
    name: str, kind: str | None, alias: str, settings: DataplaneSettings, container_id: str | None = None
) -> bool:
    """:func:`owned_by_flock` on the link's name, kind and alias."""
    if kind != "veth":
        return False
    if container_id is not None:
        if name != host_ifname(container_id, settings.host_prefix):
            return False
    elif not is_host_ifname(name, settings.host_prefix):
        return False
    if not alias:
        return True
    if container_id is not None:
        return alias == owner_marker(container_id)
    return alias.startswith(OWNER_PREFIX)


def peers_match(host_msg: Any, pod_msg: Any) -> bool:
    return (
        pod_msg is not None
        and host_msg.get_attr("IFLA_LINK") == pod_msg["index"]
        and pod_msg.get_attr("IFLA_LINK") == host_msg["index"]
        and link_kind(host_msg) == "veth"
        and link_kind(pod_msg) == "veth"
    )


async def _ensure_veth(
    host: AsyncIPRoute, pod: AsyncIPRoute, plan: PodPlan, pod_fd: int, settings: DataplaneSettings
) -> Any:
    """Host link message, pod link message for a verified pair, and whether
    this call created it (then nothing else of the pod's can exist yet)."""
    h_name, p_name = plan.veth.host, plan.veth.pod
    # A new pod has neither end yet: create the pair first and look only
    # afterwards (saves two link reads on the common path).  EEXIST — an
    # earlier attempt's pair, or a foreign ifName in the pod — goes to the
    # checks below, which decide as they would have without this try.
    try:
        await host.link("add", ifname=h_name, kind="veth", peer={"ifname": p_name, "net_ns_fd": pod_fd})
        created = True
    except NetlinkError as exc:
        ignore_codes(exc, errno.EEXIST)
        created = False
    for _attempt in range(0 if created else 2):
        h = await _conn.link_by_name(host, h_name)
        p = await _conn.link_by_name(pod, p_name)
        if h is not None:
            if not owned_by_flock(h, settings, plan.container_id):
                raise IfNameTaken(
                    "host interface name taken",
                    f"{h_name} exists on the node but is not flock's veth for container {plan.container_id}",
                )
            if peers_match(h, p):
                return h, p, False
            # A stale pair from an earlier attempt whose peer is not this
            # pod's ifName (other netns, other name): rebuild it.
            try:
                await host.link("del", index=h["index"])
            except NetlinkError as exc:
                ignore_codes(exc, errno.ENODEV)
            continue
        if p is not None:
            raise IfNameTaken(
                "interface already exists in the pod namespace",
                f"ifName={p_name!r} in netns={plan.netns!r} is not flock's veth {h_name}",
            )
        created = True
        try:
            await host.link("add", ifname=h_name, kind="veth", peer={"ifname": p_name, "net_ns_fd": pod_fd})
        except NetlinkError as exc:
            ignore_codes(exc, errno.EEXIST)  # a concurrent attempt won; verified below
            created = False
        break
    h = await _conn.link_by_name(host, h_name)
    p = await _conn.link_by_name(pod, p_name)
    if h is None or not peers_match(h, p):
        raise KernelRefused("netlink veth failed", f"{h_name} <-> {p_name}: pair did not verify after creation")
    return h, p, created


async def _ensure_addresses(ipr: AsyncIPRoute, index: int, wanted: tuple[Address, ...], *, fresh: bool) -> None:
    """Add *wanted* (with their nodad flag) and drop other global addresses;
    a *fresh* link has none yet, so it is not read first."""
    live = {} if fresh else {(a.address, a.prefixlen): a for a in await _conn.addresses(ipr, index)}
    for addr in wanted:
        have = live.get((addr.address, addr.prefixlen))
        if have is not None and have.nodad == addr.nodad:
            continue
        if have is not None:  # right address, wrong flags (DAD would delay traffic): re-add
            try:
                await ipr.addr("del", index=index, address=str(addr.address), prefixlen=addr.prefixlen)
            except NetlinkError as exc:
                ignore_codes(exc, errno.EADDRNOTAVAIL)
        try:
            await ipr.addr(
                "add",
                index=index,
                address=str(addr.address),
                prefixlen=addr.prefixlen,
                flags=_conn.IFA_F_NODAD if addr.nodad else 0,
            )
        except NetlinkError as exc:
            ignore_codes(exc, errno.EEXIST)
    if live:
        keep = {(a.address, a.prefixlen) for a in wanted}
        for key, have in live.items():
            if key not in keep and not have.address.is_link_local:
                try:
                    await ipr.addr("del", index=index, address=str(have.address), prefixlen=have.prefixlen)
                except NetlinkError as exc:
                    ignore_codes(exc, errno.EADDRNOTAVAIL)


async def _replace_route(ipr: AsyncIPRoute, route: Route, index_of: dict[str, int]) -> None:
    await ipr.route("replace", **_conn.route_kwargs(route, index_of))


async def delete_route(ipr: AsyncIPRoute, live: _conn.LiveRoute) -> None:
    kw = {"dst": str(live.route.dst), "table": _conn.MAIN_TABLE, "proto": live.route.protocol}
    if live.route.blackhole:
        kw["type"] = "blackhole"
    elif live.route.family == 4:
        kw["scope"] = int(live.route.scope)  # IPv4 delete matches on scope; pyroute2's default misses link routes
    try:
        await ipr.route("del", **kw)
    except NetlinkError as exc:
        ignore_codes(exc, errno.ESRCH, errno.ENOENT)


@attrs.define(eq=False)
class _Steps:
    """Where a setup is (the step a failure is reported under) and the fault
    hook, called after each step in order."""

    fault: FaultHook | None
    current: str = STEPS[0]

    def done(self, name: str) -> None:
        if self.fault is not None:
            self.fault(name)
        self.current = STEPS[min(STEPS.index(name) + 1, len(STEPS) - 1)]

    def apply(self, sock: _batch.RtnlSocket, groups: list[tuple[str, list[_batch.Request]]]) -> None:
        """Send the requests of consecutive steps in one datagram; the first
        refusal names its step (the kernel still ran the messages after it:
        re-running converges).  EEXIST of an address means it is there."""
        self.current = groups[0][0]
        replies = iter(sock.request([r for _, requests in groups for r in requests]))
        for name, requests in groups:
            self.current = name
            for request in requests:
                next(replies).unwrap(*((errno.EEXIST,) if request.msg_type == RTM_NEWADDR else ()))
            self.done(name)


def setup_pod(
    plan: PodPlan,
    *,
    pod_netns: int,
    host_netns: str | None,
    anycast_lock: threading.Lock,
    settings: DataplaneSettings,
    fault: FaultHook | None = None,
    netns_thread: _nsenter.NetnsThread | None = None,
) -> AppliedPlan:
    """Make the kernel match *plan* in the pod namespace *pod_netns* (a
    verified fd, borrowed).  A :mod:`flock.faults` error on failure; safe to
    re-run.  Blocking: for worker threads.  Sockets and sysctl writes in other
    namespaces go through *netns_thread* (None: a throw-away thread each).

    A new pod (creating the veth succeeds) has nothing to read or reconcile:
    its steps go out as a few batched requests on plain sockets
    (:func:`_setup_new`).  When the veth exists already (a retry, an
    interrupted attempt, a name taken) :func:`converge_pod` reads and repairs.
    """
    steps = _Steps(fault)
    enter = netns_thread.run if netns_thread is not None else _nsenter.run_in_netns
    h_name, p_name = plan.veth.host, plan.veth.pod
    try:
        with (
            _batch.RtnlSocket.open_in(host_netns, enter) as host,
            _pod_socket_early(pod_netns, netns_thread) as pod_socket,
        ):
            (created,) = host.request([_build.new_veth(h_name, p_name, pod_netns, plan.mtu)])
            if created.error is None or created.error.code != errno.EEXIST:
                created.unwrap()
                h = created_link(host, created, h_name)
                p = _setup_new(host, pod_socket, h, plan, host_netns=host_netns, enter=enter, steps=steps)
                if plan.anycast:
                    with anycast_lock:
                        _conn.run_blocking(_join_anycast_in, host_netns, plan, h["index"], settings)
                steps.done("anycast")
                return AppliedPlan(plan, link_mac(h), link_mac(p))
    except _nsenter.NetnsMissing as exc:
        raise _netns_error(plan, exc.strerror or str(exc)) from exc
    except (NetlinkError, OSError) as exc:
        raise _fail(steps.current, f"container {plan.container_id} ({h_name} <-> {plan.netns}:{p_name})", exc) from exc
    return _conn.run_blocking(
        converge_pod,
        plan,
        pod_netns=pod_netns,
        host_netns=host_netns,
        anycast_lock=anycast_lock,
        settings=settings,
        fault=fault,
    )


def created_link(host: _batch.RtnlSocket, created: _batch.Reply, name: str) -> Any:
    """The link message of *name*, just created by the request *created*
    answered: the kernel's echo of it (see :func:`_build.new_veth`), or a
    read when the kernel sent none."""
    for msg in created.msgs:
        if msg["header"]["type"] == RTM_NEWLINK and msg.get_attr("IFLA_IFNAME") == name:
            return msg
    (msg,) = host.one(_build.get_link(name))
    return msg


@contextlib.contextmanager
def _pod_socket_early(
    pod_netns: int, netns_thread: _nsenter.NetnsThread | None
) -> Iterator[Callable[[], _batch.RtnlSocket]]:
    """Start making a socket in the pod's namespace now, on *netns_thread*,
    while this thread waits for the kernel to create the veth; yields how to
    take it (the taker owns it); closes it if it was never taken."""
    if netns_thread is None:
        yield lambda: _batch.RtnlSocket.open_in(pod_netns)
        return
    pending = netns_thread.submit(pod_netns, _batch.socket_fd)
    taken = False

    def take() -> _batch.RtnlSocket:
        nonlocal taken
        taken = True
        return _batch.RtnlSocket(pending.result())

    try:
        yield take
    finally:
        if not taken:
            with contextlib.suppress(Exception):
                os.close(pending.result())


def _addr_gen_mode_key(ifname: str) -> str:
    """The sysctl of the link's IPv6 address generation mode (the field
    IFLA_INET6_ADDR_GEN_MODE sets)."""
    return f"net/ipv6/conf/{ifname}/addr_gen_mode"


def _setup_new(
    host: _batch.RtnlSocket,
    pod_socket: Callable[[], _batch.RtnlSocket],
    h: Any,
    plan: PodPlan,
    *,
    host_netns: str | None,
    enter: _batch.Enter,
    steps: _Steps,
) -> Any:
    """Every step but anycast for the veth just created (*h*: its host end,
    made with the MTU, both ends down); the pod end's link message."""
    h_name, p_name = plan.veth.host, plan.veth.pod
    with pod_socket() as pod:
        (p,) = pod.one(_build.get_link(p_name))
        if not peers_match(h, p):
            raise KernelRefused("netlink veth failed", f"{h_name} <-> {p_name}: pair did not verify after creation")
        steps.done("veth")
        hi, pi = h["index"], p["index"]
        # addrgenmode none before the link first goes up, so the kernel never
        # adds a link-local next to fe80::1: a sysctl written with the others
        # before the host link's one datagram (marker, address, up), so a
        # refused write stops the set-up with the link still down.  The
        # sysctls go ahead of the marker and are reported after it (the hooks
        # keep STEPS order).  A refused marker does not stop the link going
        # up: unmarked, it is still flock's (owned_by_flock); a re-run marks it.
        steps.current = "host-sysctls"
        sysctls = [(_addr_gen_mode_key(h_name), str(_conn.ADDRGENMODE_NONE))]
        sysctls += [(s.key, s.value) for s in plan.sysctls_on(Side.HOST)]
        _conn.write_sysctls(host_netns, sysctls, enter)
        steps.apply(
            host,
            [
                ("host-link", [_build.set_link(hi, alias=owner_marker(plan.container_id))]),
                ("host-sysctls", []),
                ("host-address", [_build.new_address(a, hi) for a in plan.addresses_on(Side.HOST)]),
                ("host-up", [_build.set_link(hi, up=True)]),
            ],
        )
        steps.apply(
            pod,
            [
                ("pod-link", [_build.set_link(pi, up=True)]),
                ("pod-addresses", [_build.new_address(a, pi) for a in plan.addresses_on(Side.POD)]),
                ("pod-routes", [_build.replace_route(r, pi) for r in plan.routes_on(Side.POD)]),
            ],
        )
    steps.apply(host, [("host-routes", [_build.replace_route(r, hi) for r in plan.routes_on(Side.HOST)])])
    return p


async def converge_pod(
    plan: PodPlan,
    *,
    pod_netns: int,
    host_netns: str | None,
    anycast_lock: threading.Lock,
    settings: DataplaneSettings,
    fault: FaultHook | None = None,
) -> AppliedPlan:
    """Make the kernel match *plan* whatever an earlier, interrupted attempt
    left: read what exists and change what differs (see :func:`setup_pod`)."""
    step = STEPS[0]

    def done(name: str) -> None:
        nonlocal step
        if fault is not None:
            fault(name)
        step = STEPS[min(STEPS.index(name) + 1, len(STEPS) - 1)]

    pod_fd = pod_netns
    try:
        async with _conn.rtnl(host_netns) as host, _conn.rtnl(pod_fd) as pod:
            h, p, fresh = await _ensure_veth(host, pod, plan, pod_fd, settings)
            hi, pi = h["index"], p["index"]
            done("veth")

            # The marker that lets teardown and cleanup prove the veth is flock's.
            marker = owner_marker(plan.container_id)
            if h.get("IFLA_IFALIAS") != marker:
                await host.link("set", index=hi, ifalias=marker)

            # addrgenmode none before the link first goes up, so the kernel never
            # adds its own link-local next to fe80::1.
            await host.link(
                "set",
                index=hi,
                IFLA_AF_SPEC={
                    "attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", _conn.ADDRGENMODE_NONE)]})]
                },
            )
            if plan.mtu:
                await host.link("set", index=hi, mtu=plan.mtu)
            done("host-link")

            _conn.write_sysctls(host_netns, [(s.key, s.value) for s in plan.sysctls_on(Side.HOST)])
            done("host-sysctls")

            await _ensure_addresses(host, hi, plan.addresses_on(Side.HOST), fresh=fresh)
            done("host-address")

            await host.link("set", index=hi, state="up")
            done("host-up")

            if plan.mtu:
                await pod.link("set", index=pi, mtu=plan.mtu)
            await pod.link("set", index=pi, state="up")
            done("pod-link")

            await _ensure_addresses(pod, pi, plan.addresses_on(Side.POD), fresh=fresh)
            done("pod-addresses")

            wanted = plan.routes_on(Side.POD)
            for route in wanted:
                await _replace_route(pod, route, {plan.veth.pod: pi})
            # A default route of a family the pod no longer has would blackhole it.
            for live in [] if fresh else await _conn.routes(pod, Side.POD, protocol=settings.protocol, oif=pi):
                if live.route not in wanted:
                    await delete_route(pod, live)
            done("pod-routes")

            wanted = plan.routes_on(Side.HOST)
            for route in wanted:
                await _replace_route(host, route, {plan.veth.host: hi})
            # Routes to addresses this pod no longer has (an earlier attempt
            # with other addresses) would misdirect traffic: drop them.
            wanted_dsts = {r.dst for r in wanted} | {
                ipaddress.ip_network(f"{m.address}/{m.address.max_prefixlen}") for m in plan.anycast
            }
            for live in [] if fresh else await _conn.routes(host, Side.HOST, protocol=settings.protocol, oif=hi):
                if live.oifs == (hi,) and live.route.dst not in wanted_dsts and not live.route.blackhole:
                    await delete_route(host, live)
            done("host-routes")

            with anycast_lock:
                await _join_anycast(host, plan, hi, fresh, settings)
            done("anycast")
            return AppliedPlan(plan, h.get("IFLA_ADDRESS", ""), p.get("IFLA_ADDRESS", ""))
    except _nsenter.NetnsMissing as exc:
        raise _netns_error(plan, exc.strerror or str(exc)) from exc
    except (NetlinkError, OSError) as exc:
        raise _fail(
            step, f"container {plan.container_id} ({plan.veth.host} <-> {plan.netns}:{plan.veth.pod})", exc
        ) from exc


async def _join_anycast_in(host_netns: str | None, plan: PodPlan, host_index: int, settings: DataplaneSettings) -> None:
    async with _conn.rtnl(host_netns) as host:
        await _join_anycast(host, plan, host_index, True, settings)


async def _join_anycast(
    host: AsyncIPRoute, plan: PodPlan, host_index: int, fresh: bool, settings: DataplaneSettings
) -> None:
    """Add this pod's nexthop to each of its anycast routes, and take it out
    of multipath routes for anycast addresses the pod no longer has."""
    links = _conn.Links(host)
    dsts = {ipaddress.ip_network(f"{m.address}/{m.address.max_prefixlen}"): m for m in plan.anycast}
    if not fresh:
        for live in await _conn.routes(host, Side.HOST, protocol=settings.protocol, oif=host_index):
            if len(live.oifs) > 1 and live.route.dst not in dsts:
                await _drop_nexthops(host, live, {plan.veth.host}, links, settings)
    if not dsts:
        return
    live_by_dst = {
        r.route.dst: r for r in await _conn.routes(host, Side.HOST, protocol=settings.protocol, dsts=set(dsts))
    }
    for dst, member in dsts.items():
        current = live_by_dst.get(dst)
        hops = await links.exist(current.route.nexthops) if current and not current.route.blackhole else []
        hops = [h for h in hops if h.ifname != member.nexthop.ifname] + [member.nexthop]
        route = anycast_route(member.address, hops, settings)
        if current is None or current.route != route:
            await _replace_route(host, route, await links.for_route(route))


async def _drop_nexthops(
    host: AsyncIPRoute, live: _conn.LiveRoute, ifnames: set[str], links: _conn.Links, settings: DataplaneSettings
) -> None:
    rest = await links.exist([h for h in live.route.nexthops if h.ifname not in ifnames])
    if rest:
        route = anycast_route(live.route.dst.network_address, rest, settings)
        await _replace_route(host, route, await links.for_route(route))
    else:
        await delete_route(host, live)


async def leave_routes(
    host: AsyncIPRoute, ifnames: set[str], settings: DataplaneSettings, *, oif: int | None = None
) -> list[str]:
    """Remove *ifnames* from every flock route: shrink multipath routes to
    the remaining nexthops, delete routes left with none.  Must run before the
    interfaces go: deleting one device kills a whole IPv4 multipath route.
    *oif* (the index of the one name) lets the kernel filter the dump and
    spares reading that name back."""
    changed = []
    links = _conn.Links(host)
    # The one interface's index is known: no need to read its name back.
    known = {oif: next(iter(ifnames))} if oif is not None and len(ifnames) == 1 else {}
    for live in await _conn.routes(
        host, Side.HOST, protocol=settings.protocol, oif=oif, all_links=oif is None, names=known
    ):
        r = live.route
        if r.blackhole or not any(h.ifname in ifnames for h in r.nexthops):
            continue
        await _drop_nexthops(host, live, ifnames, links, settings)
        changed.append(str(r))
    return changed


async def ensure_anycast(host: AsyncIPRoute, plans: list[PodPlan], settings: DataplaneSettings) -> list[str]:
    """Install the multipath route of every anycast address over the local
    pods (of *plans*) whose host veth exists; returns the routes rewritten.

    Repairs what the kernel does on its own when a pod's veth vanishes with
    its namespace: an IPv4 multipath route dies whole with any one device.
    """
    links = _conn.Links(host)
    wanted = anycast_routes([p for p in plans if p.anycast and await links.index(p.veth.host) is not None], settings)
    if not wanted:
        return []  # nothing to compare: spare the dump of every pod's routes
    live = {
        r.route.dst: r.route
        for r in await _conn.routes(host, Side.HOST, protocol=settings.protocol, dsts={r.dst for r in wanted})
    }
    changed = []
    for route in wanted:
        if live.get(route.dst) != route:
            await _replace_route(host, route, await links.for_route(route))
            changed.append(str(route))
    return changed


def remove_veth(
    container_id: str,
    *,
    host_netns: str | None,
    settings: DataplaneSettings,
    enter: _batch.Enter = _nsenter.run_in_netns,
) -> None:
    """Delete the pod's host veth if flock can prove it made it (see
    :func:`owned_by_flock`); gone already counts as removed.  Routes are not
    touched: for a pod without anycast addresses (or one that has left its
    multipath routes, :func:`teardown_pod` with ``link=False``) the kernel
    drops its single-path routes with the device.  Blocking, two requests on
    a plain socket (:mod:`._batch`): the deferred DEL's whole kernel part."""
    name = host_ifname(container_id, settings.host_prefix)
    try:
        with _batch.RtnlSocket.open_in(host_netns, enter) as host:
            found = host.one(_build.get_link(name), errno.ENODEV)
            if not found:
                return
            (msg,) = found
            if not owned_by_flock(msg, settings, container_id):
                log.warning(
                    "not deleting a link flock cannot prove it made",
                    extra={"container_id": container_id, "interface": name, "alias": msg.get("IFLA_IFALIAS")},
                )
                return
            host.one(_build.del_link(msg["index"], name), errno.ENODEV)
    except (NetlinkError, OSError) as exc:
        raise _fail("teardown", f"container {container_id} ({name})", exc) from exc


async def teardown_pod(
    container_id: str,
    *,
    host_netns: str | None,
    anycast_lock: threading.Lock,
    settings: DataplaneSettings,
    routes: bool = True,
    link: bool = True,
) -> None:
    """Remove the pod's host veth (its peer in the pod goes with it) and flock
    routes through it.  Anything already gone counts as removed.

    Works by container ID alone and never enters the pod's namespace: the
    namespace may be gone, unopenable or not the pod's at all, and the only
    interface flock may delete is the host veth it can prove it made (name,
    kind and ownership marker, see :func:`owned_by_flock`).  A same-named
    link that is not flock's is left alone.

    *routes*: take the veth out of flock's routes first (a dump and a
    rewrite per route).  Only multipath (anycast) routes need it — the
    kernel drops a single-path route with its device, but a whole IPv4
    multipath route with any one of its devices — so a pod without anycast
    addresses skips it.  *link*: delete the veth (False: only leave the
    routes, the deferred DEL's synchronous part).
    """
    name = host_ifname(container_id, settings.host_prefix)
    try:
        async with _conn.rtnl(host_netns) as host:
            found = await _conn.link_by_name(host, name)
            if found is None:
                return
            if not owned_by_flock(found, settings, container_id):
                log.warning(
                    "not deleting a link flock cannot prove it made",
                    extra={"container_id": container_id, "interface": name, "alias": found.get("IFLA_IFALIAS")},
                )
                return
            if routes:
                with anycast_lock:
                    await leave_routes(host, {name}, settings, oif=found["index"])
            if link:
                try:
                    await host.link("del", index=found["index"])
                except NetlinkError as exc:
                    ignore_codes(exc, errno.ENODEV)
    except (NetlinkError, OSError) as exc:
        raise _fail("teardown", f"container {container_id} ({name})", exc) from exc


async def ensure_blackholes(
    host: AsyncIPRoute,
    cidrs: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network | None],
    settings: DataplaneSettings,
) -> None:
    wanted = {r.dst: r for r in blackhole_routes(cidrs, settings)}
    # The kernel filters by type: the pods' routes (one per pod) are not read.
    for live in await _conn.routes(host, Side.HOST, protocol=settings.protocol, route_type=_conn.RTN_BLACKHOLE):
        if live.route.blackhole and live.route.dst not in wanted:
            await delete_route(host, live)
        elif live.route.blackhole:
            wanted.pop(live.route.dst)
    for route in wanted.values():
        await _replace_route(host, route, {})


async def prepare_node(
    host: AsyncIPRoute, host_netns: str | None, uplink: str | None, settings: DataplaneSettings
) -> None:
    """Node prerequisites for proxy ARP on 169.254.1.1 and for routing pods:
    ip_forward=1, IPv6 forwarding on, and a unicast route to 169.254.1.1 out
    of a non-flock interface (proxy ARP answers only for a destination the
    node would forward elsewhere).  The route is added via *uplink* when the
    node has none, with protocol static so cleanup never takes it for a pod's.
    """
    _conn.write_sysctls(
        host_netns,
        [
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
            ("net/ipv6/conf/default/forwarding", "1"),
        ],
    )
    gw = str(settings.gateway4)
    try:
        (msg,) = await host.route("get", dst=gw)
        dev = await _conn.Links(host).name(msg.get("RTA_OIF")) if msg.get("RTA_OIF") else ""
        if msg["type"] == _conn.RTN_UNICAST and not dev.startswith(settings.host_prefix):
            return
    except NetlinkError as exc:
        ignore_codes(exc, errno.ENETUNREACH, errno.EHOSTUNREACH)
    if uplink is None:
        raise NodeUnprepared(
            "node has no route for the pod gateway",
            f"proxy ARP for {gw} needs a unicast route to it out of a non-flock interface; set an uplink",
        )
    link = await _conn.link_by_name(host, uplink)
    if link is None:
        raise NodeUnprepared("uplink interface not found", f"uplink={uplink!r}")
    await host.route(
        "replace", dst=f"{gw}/32", oif=link["index"], scope=253, proto=RTPROT_STATIC, table=_conn.MAIN_TABLE
    )
