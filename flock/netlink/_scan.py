"""Whole-namespace reads for start-up: one netlink dump each, on a plain socket.

pyroute2's ``AsyncIPRoute`` dumps (an asyncio loop, request processors,
client-side filters) and its per-interface lookups cost a node's start-up
about half a second of CPU with 250 pod veths, most of it reads whose answer
is "nothing to do".  Start-up needs a handful of fields — interface index,
name, kind and alias; a route's destination, type, protocol and next hops;
an address — so these dumps go out on a blocking NETLINK_ROUTE socket, one
each, and ask the kernel for less: routes filtered in the kernel (table,
protocol, type: strict checking), links without their IPv6 statistics
(``IFLA_EXT_MASK``: 3.3 KB a veth instead of 7.8).  pyroute2 encodes every
request and decodes every reply (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``;
``MarshalRtnl``), and only the fields above are read out.  Changes are
still made through pyroute2's API, by the callers, only when a read finds
one due.

Blocking: call on a worker thread.  The socket is opened in the namespace
on a throw-away thread (``_nsenter``), so the calling thread never changes
namespace.  A dump the kernel marks interrupted (the table changed while it
was read) is read again.  Errors: OSError (the kernel's error code).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import attrs
from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_GETROUTE, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from flock.netlink import _batch
from flock.netlink.desired import Nexthop, Route, Scope, Side

RTEXT_FILTER_SKIP_STATS = 1 << 3  # linux/rtnetlink.h; pyroute2 names no RTEXT_FILTER_*
RTN_UNICAST, RTN_BLACKHOLE = 1, 6
MAIN_TABLE = 254

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


@attrs.frozen
class Link:
    index: int
    name: str
    kind: str | None  # IFLA_INFO_KIND: "veth", …; None without link info
    alias: str


@attrs.frozen
class Address:
    index: int
    address: IP
    prefixlen: int
    flags: int


@attrs.frozen
class RawRoute:
    """A main-table route: next hops as (interface index, gateway or None)."""

    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    type: int
    protocol: int
    scope: int
    hops: tuple[tuple[int, IP | None], ...]

    def route(self, names: dict[int, str]) -> Route:
        """As flock's :class:`Route` (host side), interface names from *names* ("#n" when unknown)."""
        hops = [Nexthop(names.get(oif, f"#{oif}"), gw) for oif, gw in self.hops]
        return Route(
            side=Side.HOST,
            dst=self.dst,
            nexthops=tuple(sorted(hops, key=lambda h: (h.ifname, str(h.gateway)))) if len(hops) > 1 else tuple(hops),
            scope=Scope(self.scope) if self.scope in (0, 253) else Scope.UNIVERSE,
            protocol=self.protocol,
            blackhole=self.type == RTN_BLACKHOLE,
        )


def _ip(text: str | None) -> IP | None:
    return ipaddress.ip_address(text) if text else None


def link_request() -> ifinfmsg:
    """Every interface, without IPv6 statistics (IFLA_INET6_STATS, IFLA_INET6_ICMP6STATS)."""
    msg = ifinfmsg()
    msg["family"] = socket.AF_UNSPEC
    msg["attrs"] = [("IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS)]
    return msg


def address_request(family: int) -> ifaddrmsg:
    msg = ifaddrmsg()
    msg["family"] = family
    return msg


def route_request(family: int, protocol: int, route_type: int) -> rtmsg:
    """Main-table routes of *protocol* (and *route_type*, 0: any): the kernel's filter, with strict checking."""
    msg = rtmsg()
    msg["family"] = family
    msg["table"] = MAIN_TABLE
    msg["proto"] = protocol
    msg["type"] = route_type
    return msg


@attrs.define(eq=False)
class Scanner:
    """One netlink route socket in a namespace, for dumps (see the module doc).  Close it."""

    netns: str | int | None
    _rtnl: _batch.RtnlSocket = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._rtnl = _batch.RtnlSocket.open_in(self.netns, strict=True)

    def close(self) -> None:
        self._rtnl.close()

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def dump(self, msg_type: int, build: Callable[[], Any]) -> list[Any]:
        """Every message of one dump (see :meth:`_batch.RtnlSocket.dump`)."""
        return self._rtnl.dump(msg_type, build)

    def links(self) -> list[Link]:
        """Every interface: index, name, kind, alias (IPv6 statistics are not asked for)."""
        out = []
        for msg in self.dump(RTM_GETLINK, link_request):
            if msg["header"]["type"] != RTM_NEWLINK:
                continue
            info = msg.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
            out.append(Link(msg["index"], msg.get_attr("IFLA_IFNAME", ""), kind, msg.get_attr("IFLA_IFALIAS", "")))
        return out

    def addresses(self) -> list[Address]:
        """Every address on every interface, both families."""
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in self.dump(RTM_GETADDR, functools.partial(address_request, family)):
                if msg["header"]["type"] != RTM_NEWADDR:
                    continue
                chosen = _ip(msg.get_attr("IFA_ADDRESS") or msg.get_attr("IFA_LOCAL"))
                if chosen is not None:
                    flags = msg.get_attr("IFA_FLAGS", msg["flags"])
                    out.append(Address(msg["index"], chosen, msg["prefixlen"], flags))
        return out

    def routes(self, protocol: int, route_type: int = 0) -> list[RawRoute]:
        """Main-table unicast and blackhole routes of *protocol* (both families), only
        *route_type* ones when given: the kernel filters, nothing else is read."""
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in self.dump(RTM_GETROUTE, functools.partial(route_request, family, protocol, route_type)):
                if msg["header"]["type"] != RTM_NEWROUTE:
                    continue
                rtype, proto = msg["type"], msg["proto"]
                if rtype not in (RTN_UNICAST, RTN_BLACKHOLE) or proto != protocol:
                    continue
                if route_type and rtype != route_type:
                    continue
                if msg.get_attr("RTA_TABLE", msg["table"]) != MAIN_TABLE:
                    continue
                hops: tuple[tuple[int, IP | None], ...] = ()
                if rtype != RTN_BLACKHOLE:
                    multipath = msg.get_attr("RTA_MULTIPATH")
                    if multipath:
                        hops = tuple((hop["oif"], _ip(hop.get_attr("RTA_GATEWAY"))) for hop in multipath)
                    else:
                        hops = ((msg.get_attr("RTA_OIF", 0), _ip(msg.get_attr("RTA_GATEWAY"))),)
                dst = msg.get_attr("RTA_DST") or ("::" if msg["family"] == socket.AF_INET6 else "0.0.0.0")
                network = ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False)
                out.append(RawRoute(network, rtype, proto, msg["scope"], hops))
        return out
