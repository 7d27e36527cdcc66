"""Netlink sockets in a chosen namespace, and live kernel state read as values.

The kernel code is written against pyroute2's ``AsyncIPRoute`` (about twice
as fast per call as the sync ``IPRoute`` wrapper, which spins an event loop
per call) and runs to completion in a private asyncio loop on a Trio worker
thread: :func:`run_blocking`.  Never call it from the Trio thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import attrs
from pyroute2 import AsyncIPRoute
from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from flock.netlink import _nsenter
from flock.netlink.desired import Nexthop, Route, Scope, Side

MAIN_TABLE = 254
IFA_F_NODAD = 0x02
ADDRGENMODE_NONE = 1
RTN_UNICAST = 1
RTN_BLACKHOLE = 6

T = TypeVar("T")


def run_blocking(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kwargs: Any) -> T:
    """Run the coroutine function to completion here, in a fresh asyncio loop
    (blocking: for worker threads)."""
    # A plain selector loop, never the process's event loop policy: in
    # flock-agent that policy is trio-asyncio's (installed by the watchers),
    # whose loops outside Trio start a Trio run on a thread of their own —
    # about 1.2 ms of CPU per loop and every socket callback routed through
    # Trio, which was 40 % of the agent's CPU per pod.
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(fn(*args, **kwargs))


def _netlink_socket_fd() -> int:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE).detach()


@contextlib.asynccontextmanager
async def rtnl(netns: str | int | None) -> AsyncIterator[AsyncIPRoute]:
    """An AsyncIPRoute whose socket lives in *netns* (a path, a borrowed
    namespace fd; None: this thread's).

    The socket is opened on a throw-away thread (see _nsenter), so the calling
    thread never changes namespace and a missing namespace is never created.
    Strict checking lets the kernel filter dumps (by interface, protocol,
    table), so a pod's setup does not read every other pod's routes.  The
    socket is closed on exit, used or not.
    """
    if netns is None:
        ipr = AsyncIPRoute(strict_check=True)
    else:
        fd = _nsenter.run_in_netns(netns, _netlink_socket_fd)
        try:
            ipr = AsyncIPRoute(fileno=fd, strict_check=True)
        except BaseException:
            os.close(fd)
            raise
    try:
        if netns is not None:
            # pyroute2 takes *fd* over (and so closes it) only when it first
            # uses its socket: make it do so now, or an unused one would leak.
            ipr.fileno()
        yield ipr
    finally:
        ipr.close()


PROC_SYS = "/proc/sys"
# A container without privilege has /proc/sys mounted read-only; the DaemonSet
# mounts the host's /proc/sys/net here instead (docs/install.md, "Privileges").  Any view of
# /proc/sys/net shows the network namespace of the thread that opens the file.
HOST_PROC_SYS = "/host/proc/sys"


@functools.cache
def _proc_sys_writable() -> bool:
    return not os.statvfs(PROC_SYS).f_flag & os.ST_RDONLY


def sysctl_path(key: str) -> str:
    """Where to write the sysctl *key* (``net/ipv6/...``): /proc/sys, or the host's
    /proc/sys/net mounted at /host/proc/sys/net when /proc/sys is read-only."""
    if key.startswith("net/") and not _proc_sys_writable() and os.path.isdir(os.path.join(HOST_PROC_SYS, "net")):
        return os.path.join(HOST_PROC_SYS, key)
    return os.path.join(PROC_SYS, key)


def write_sysctls(
    netns: str | None,
    values: list[tuple[str, str]] | tuple,
    enter: Callable[[str | None, Callable[[], None]], None] = _nsenter.run_in_netns,
) -> None:
    """Write ``/proc/sys/<key>`` = value for each pair, inside *netns* (see :func:`sysctl_path`).

    /proc/sys/net resolves against the namespace of the thread that opens the
    file, so the writes run where the namespace is entered (by *enter*).
    """

    def write() -> None:
        for key, value in values:
            # Unbuffered: open, write, close (a text file adds an fstat, an ioctl and its wrappers).
            fd = os.open(sysctl_path(key), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)

    enter(netns, write)


def read_sysctls(netns: str | None, keys: list[str] | tuple) -> dict[str, str | None]:
    def read() -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for key in keys:
            try:
                with open(os.path.join("/proc/sys", key)) as f:
                    out[key] = f.read().strip()
            except FileNotFoundError:
                out[key] = None
        return out

    return _nsenter.run_in_netns(netns, read)


async def _get_link(ipr: AsyncIPRoute, **key: Any) -> Any:
    try:
        (msg,) = await ipr.link("get", **key)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return msg


async def link_by_name(ipr: AsyncIPRoute, name: str) -> Any:
    """The link message for *name*, or None."""
    return await _get_link(ipr, ifname=name)


async def link_names(ipr: AsyncIPRoute) -> dict[int, str]:
    return {m["index"]: m.get("IFLA_IFNAME") async for m in await ipr.link("dump")}


@attrs.define(eq=False)
class Links:
    """Interface names and indexes, looked up on first use (no full dump)."""

    ipr: AsyncIPRoute
    names: dict[int, str] = attrs.field(factory=dict)
    indexes: dict[str, int | None] = attrs.field(factory=dict)

    async def name(self, index: int) -> str:
        if index not in self.names:
            msg = await _get_link(self.ipr, index=index)
            self.names[index] = msg.get("IFLA_IFNAME") if msg is not None else f"#{index}"  # "#n": gone meanwhile
        return self.names[index]

    async def index(self, name: str) -> int | None:
        if name not in self.indexes:
            msg = None if name.startswith("#") else await link_by_name(self.ipr, name)
            self.indexes[name] = msg["index"] if msg is not None else None
        return self.indexes[name]

    async def exist(self, hops: Any) -> list:
        return [h for h in hops if await self.index(h.ifname) is not None]

    async def for_route(self, route: Route) -> dict[str, int]:
        """name → index for *route*'s nexthops (KeyError names a missing one)."""
        out = {}
        for hop in route.nexthops:
            index = await self.index(hop.ifname)
            if index is None:
                raise KeyError(hop.ifname)
            out[hop.ifname] = index
        return out


@attrs.frozen
class LiveAddress:
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    prefixlen: int
    nodad: bool

    def __str__(self) -> str:
        return f"{self.address}/{self.prefixlen}"


async def _dump(ipr: AsyncIPRoute, msg: Any, msg_type: int) -> list:
    """A kernel-filtered dump: *msg*'s header fields and attributes are the
    filter (pyroute2's own dump filters run client-side, after reading all)."""
    return [m async for m in await ipr.nlm_request(msg, msg_type=msg_type, msg_flags=NLM_F_REQUEST | NLM_F_DUMP)]


async def addresses(ipr: AsyncIPRoute, index: int) -> list[LiveAddress]:
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        req = ifaddrmsg()
        req["family"] = family
        req["index"] = index
        out += _addresses_from(m for m in await _dump(ipr, req, RTM_GETADDR) if m["index"] == index)
    return out


def _addresses_from(msgs: Any) -> list[LiveAddress]:
    out = []
    for msg in msgs:
        raw = msg.get("IFA_ADDRESS") or msg.get("IFA_LOCAL")
        flags = msg.get("IFA_FLAGS", msg["flags"])
        out.append(LiveAddress(ipaddress.ip_address(raw), msg["prefixlen"], bool(flags & IFA_F_NODAD)))
    return out


@attrs.frozen
class LiveRoute:
    """A main-table route as the kernel reports it, with interface names."""

    route: Route
    oifs: tuple[int, ...]


def _dst_of(msg: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    dst_raw = msg.get("RTA_DST") or ("::" if msg["family"] == socket.AF_INET6 else "0.0.0.0")
    return ipaddress.ip_network(f"{dst_raw}/{msg['dst_len']}", strict=False)


def _raw_hops(msg: Any) -> list[tuple[int, str | None]]:
    if msg["type"] == RTN_BLACKHOLE:
        return []
    multipath = msg.get("RTA_MULTIPATH")
    if multipath:
        return [(h["oif"], h.get("RTA_GATEWAY")) for h in multipath]
    return [(msg.get("RTA_OIF"), msg.get("RTA_GATEWAY"))]


def _route_from_msg(msg: Any, names: dict[int, str], side: Side) -> LiveRoute:
    dst = _dst_of(msg)
    hops = []
    oifs = []
    for oif, gw in _raw_hops(msg):
        oifs.append(oif)
        hops.append(Nexthop(names[oif], ipaddress.ip_address(gw) if gw else None))
    route = Route(
        side=side,
        dst=dst,
        nexthops=tuple(sorted(hops, key=lambda h: (h.ifname, str(h.gateway)))) if len(hops) > 1 else tuple(hops),
        scope=Scope(msg["scope"]) if msg["scope"] in (0, 253) else Scope.UNIVERSE,
        protocol=msg["proto"],
        blackhole=msg["type"] == RTN_BLACKHOLE,
    )
    return LiveRoute(route, tuple(oifs))


async def routes(
    ipr: AsyncIPRoute,
    side: Side,
    *,
    protocol: int | None = None,
    route_type: int | None = None,
    oif: int | None = None,
    dsts: set[ipaddress.IPv4Network | ipaddress.IPv6Network] | None = None,
    all_links: bool = False,
    names: dict[int, str] | None = None,
) -> list[LiveRoute]:
    """Unicast and blackhole routes of the main table (both families),
    optionally only *protocol*'s, only those of *route_type* and only those
    with a nexthop via *oif* (filtered by the kernel), only those to *dsts* (filtered here, before
    decoding).  Interface names come from *names* (index → name the caller
    already knows), then from one link dump when *all_links* (many routes),
    else from a lookup per interface seen."""
    links = Links(ipr, names=dict(names or {}))
    if all_links:
        links.names.update(await link_names(ipr))
    msgs = []
    for family in (socket.AF_INET, socket.AF_INET6):
        req = rtmsg()
        req["family"] = family
        req["table"] = MAIN_TABLE
        if protocol is not None:
            req["proto"] = protocol
        if route_type is not None:
            req["type"] = route_type
        if oif is not None:
            req["attrs"] = [("RTA_OIF", oif)]
        for msg in await _dump(ipr, req, RTM_GETROUTE):
            if msg.get("RTA_TABLE", msg["table"]) != MAIN_TABLE or msg["type"] not in (RTN_UNICAST, RTN_BLACKHOLE):
                continue
            if protocol is not None and msg["proto"] != protocol:
                continue
            if route_type is not None and msg["type"] != route_type:
                continue
            if dsts is not None and _dst_of(msg) not in dsts:
                continue
            msgs.append(msg)
    for msg in msgs:
        for oif, _gw in _raw_hops(msg):
            await links.name(oif)
    return [_route_from_msg(msg, links.names, side) for msg in msgs]


RTNH_F_ONLINK = 4


def onlink(gateway: Any) -> bool:
    # A gateway that is a pod's own /128 is not on any host interface's
    # prefix: without ``onlink`` BIRD's kernel protocol calls the next hop
    # "strange" and never announces the route (seen with bird 2.0.12).
    return gateway is not None and not gateway.is_link_local


def route_kwargs(route: Route, index_of: dict[str, int]) -> dict:
    """pyroute2 arguments that install *route* (main table)."""
    kw: dict = {"dst": str(route.dst), "table": MAIN_TABLE}
    if route.protocol:
        kw["proto"] = route.protocol
    if route.blackhole:
        kw["type"] = "blackhole"
        return kw
    if route.scope == Scope.LINK:
        kw["scope"] = int(Scope.LINK)
    if len(route.nexthops) == 1:
        (hop,) = route.nexthops
        kw["oif"] = index_of[hop.ifname]
        if hop.gateway is not None:
            kw["gateway"] = str(hop.gateway)
        if onlink(hop.gateway):
            kw["flags"] = RTNH_F_ONLINK
    else:
        kw["multipath"] = [
            {
                "oif": index_of[h.ifname],
                **({"gateway": str(h.gateway)} if h.gateway is not None else {}),
                **({"flags": RTNH_F_ONLINK} if onlink(h.gateway) else {}),
            }
            for h in route.nexthops
        ]
    return kw
