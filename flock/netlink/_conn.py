"""Netlink sockets in a chosen namespace, and live kernel state read as values.

Blocking: call from a worker thread, never from the Trio thread.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
from collections.abc import Iterator

import attrs
from pyroute2 import IPRoute
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


def _netlink_socket_fd() -> int:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE).detach()


@contextlib.contextmanager
def rtnl(netns: str | None) -> Iterator[IPRoute]:
    """An IPRoute whose socket lives in *netns* (a path; None: this thread's).

    The socket is opened on a throw-away thread (see _nsenter), so the calling
    thread never changes namespace and a missing namespace is never created.
    Strict checking lets the kernel filter dumps (by interface, protocol,
    table), so a pod's setup does not read every other pod's routes.
    """
    if netns is None:
        ipr = IPRoute(strict_check=True)
    else:
        ipr = IPRoute(fileno=_nsenter.run_in_netns(netns, _netlink_socket_fd), strict_check=True)
    try:
        yield ipr
    finally:
        ipr.close()


def write_sysctls(netns: str | None, values: "list[tuple[str, str]] | tuple") -> None:
    """Write ``/proc/sys/<key>`` = value for each pair, inside *netns*.

    /proc/sys/net resolves against the namespace of the thread that opens the
    file, so the writes run where the namespace is entered.
    """

    def write() -> None:
        for key, value in values:
            with open(os.path.join("/proc/sys", key), "w") as f:
                f.write(value)

    _nsenter.run_in_netns(netns, write)


def read_sysctls(netns: str | None, keys: "list[str] | tuple") -> dict[str, str | None]:
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


def link_by_name(ipr: IPRoute, name: str):
    """The link message for *name*, or None."""
    try:
        (msg,) = ipr.link("get", ifname=name)
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.ENOENT):
            return None
        raise
    return msg


def link_names(ipr: IPRoute) -> dict[int, str]:
    return {m["index"]: m.get("IFLA_IFNAME") for m in ipr.link("dump")}


class Indexes(dict):
    """name → ifindex, looked up on first use; KeyError for a missing link."""

    def __init__(self, ipr: IPRoute) -> None:
        super().__init__()
        self.ipr = ipr

    def __missing__(self, name: str) -> int:
        msg = link_by_name(self.ipr, name) if not name.startswith("#") else None
        if msg is None:
            raise KeyError(name)
        self[name] = msg["index"]
        return msg["index"]

    def __contains__(self, name: object) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True


@attrs.frozen
class LiveAddress:
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    prefixlen: int
    nodad: bool

    def __str__(self) -> str:
        return f"{self.address}/{self.prefixlen}"


def _dump(ipr: IPRoute, msg, msg_type: int):
    """A kernel-filtered dump: *msg*'s header fields and attributes are the
    filter (pyroute2's own dump filters run client-side, after reading all)."""
    # IPRoute has no public sync wrapper for nlm_request in 0.9.7 (its sync
    # nlm_request raises KeyError); this is the wrapper its own methods use.
    return ipr._run_force_sync(ipr.asyncore.nlm_request, msg, msg_type=msg_type, msg_flags=NLM_F_REQUEST | NLM_F_DUMP)


def addresses(ipr: IPRoute, index: int) -> list[LiveAddress]:
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        req = ifaddrmsg()
        req["family"] = family
        req["index"] = index
        out += _addresses_from(m for m in _dump(ipr, req, RTM_GETADDR) if m["index"] == index)
    return out


def _addresses_from(msgs) -> list[LiveAddress]:
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


class Names(dict):
    """ifindex → name, looked up on first use (no full link dump)."""

    def __init__(self, ipr: IPRoute) -> None:
        super().__init__()
        self.ipr = ipr

    def __missing__(self, index: int) -> str:
        try:
            (msg,) = self.ipr.link("get", index=index)
            name = msg.get("IFLA_IFNAME")
        except NetlinkError:
            name = f"#{index}"  # gone meanwhile
        self[index] = name
        return name


def _dst_of(msg) -> "ipaddress.IPv4Network | ipaddress.IPv6Network":
    dst_raw = msg.get("RTA_DST") or ("::" if msg["family"] == socket.AF_INET6 else "0.0.0.0")
    return ipaddress.ip_network(f"{dst_raw}/{msg['dst_len']}", strict=False)


def _route_from_msg(msg, names: "dict[int, str]", side: Side) -> LiveRoute:
    dst = _dst_of(msg)
    hops = []
    oifs = []
    if msg["type"] != RTN_BLACKHOLE:
        multipath = msg.get("RTA_MULTIPATH")
        raw_hops = [(h["oif"], h.get("RTA_GATEWAY")) for h in multipath] if multipath else [(msg.get("RTA_OIF"), msg.get("RTA_GATEWAY"))]
        for oif, gw in raw_hops:
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


def routes(
    ipr: IPRoute,
    side: Side,
    *,
    protocol: int | None = None,
    oif: int | None = None,
    dsts: "set[ipaddress.IPv4Network | ipaddress.IPv6Network] | None" = None,
    all_links: bool = False,
) -> list[LiveRoute]:
    """Unicast and blackhole routes of the main table (both families),
    optionally only *protocol*'s and only those with a nexthop via *oif*
    (filtered by the kernel), only those to *dsts* (filtered here, before
    decoding).  Interface names come from one link dump when *all_links*
    (many routes), else from a lookup per interface seen."""
    names = Names(ipr)
    if all_links:
        names.update(link_names(ipr))
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        req = rtmsg()
        req["family"] = family
        req["table"] = MAIN_TABLE
        if protocol is not None:
            req["proto"] = protocol
        if oif is not None:
            req["attrs"] = [("RTA_OIF", oif)]
        for msg in _dump(ipr, req, RTM_GETROUTE):
            if msg.get("RTA_TABLE", msg["table"]) != MAIN_TABLE or msg["type"] not in (RTN_UNICAST, RTN_BLACKHOLE):
                continue
            if protocol is not None and msg["proto"] != protocol:
                continue
            if dsts is not None and _dst_of(msg) not in dsts:
                continue
            out.append(_route_from_msg(msg, names, side))
    return out


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
    else:
        kw["multipath"] = [
            {"oif": index_of[h.ifname], **({"gateway": str(h.gateway)} if h.gateway is not None else {})}
            for h in route.nexthops
        ]
    return kw
