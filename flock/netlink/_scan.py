"""Whole-namespace reads for start-up: one raw netlink dump each, decoded by hand.

pyroute2 decodes every attribute of every message it reads (a veth's link
message carries some fifty, statistics included): reading a node's 250 pod
veths and their routes that way cost start-up about half a second of CPU,
most of it in dumps and per-interface lookups whose answer is "nothing to
do".  Start-up needs a handful of fields — interface index, name, kind and
alias; a route's destination, type, protocol and next hops; an address — so
these dumps read the raw messages and pick those out, and let the kernel
filter routes (by table, protocol and type: strict checking).  Changes are
still made through pyroute2, by the callers, only when a read finds one due.

Blocking: call on a worker thread.  The socket is opened in the namespace
on a throw-away thread (``_nsenter``), so the calling thread never changes
namespace.  A dump the kernel marks interrupted (the table changed while it
was read) is read again.  Errors: OSError (the kernel's error code).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator

import attrs

from flock.netlink import _nsenter
from flock.netlink.desired import Nexthop, Route, Scope, Side

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port
_RTATTR = struct.Struct("=HH")  # length, type
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst len, src len, tos, table, protocol, scope, type, flags
_RTNEXTHOP = struct.Struct("=HBBi")  # length, flags, hops, interface index
_U32 = struct.Struct("=I")

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_DUMP_INTR, NLM_F_DUMP = 0x1, 0x2, 0x10, 0x300
RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = 16, 18, 20, 22, 24, 26
IFLA_IFNAME, IFLA_LINKINFO, IFLA_IFALIAS, IFLA_EXT_MASK = 3, 18, 20, 29
IFLA_INFO_KIND = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_MULTIPATH, RTA_TABLE = 1, 4, 5, 9, 15
RTN_UNICAST, RTN_BLACKHOLE = 1, 6
MAIN_TABLE = 254
SOL_NETLINK, NETLINK_GET_STRICT_CHK = 270, 12
_NLA_TYPE_MASK = 0x3FFF
_RECV_BYTES = 1 << 16  # the kernel fills dump batches of at most 32 KiB
_DUMP_ATTEMPTS = 5


@attrs.frozen
class Link:
    index: int
    name: str
    kind: str | None  # IFLA_INFO_KIND: "veth", …; None without link info
    alias: str


@attrs.frozen
class Address:
    index: int
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    prefixlen: int
    flags: int


@attrs.frozen
class RawRoute:
    """A main-table route: next hops as (interface index, gateway or None)."""

    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    type: int
    protocol: int
    scope: int
    hops: tuple[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address | None], ...]

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


def _attrs(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each attribute in data[start:end]."""
    while start + 4 <= end:
        length, kind = _RTATTR.unpack_from(data, start)
        if length < 4 or start + length > end:
            return
        yield kind & _NLA_TYPE_MASK, start + 4, start + length
        start += (length + 3) & ~3


def _text(data: bytes, start: int, end: int) -> str:
    return data[start:end].split(b"\0", 1)[0].decode("utf-8", "replace")


def _ip(family: int, data: bytes, start: int, end: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = data[start:end]
    return ipaddress.IPv6Address(raw) if family == socket.AF_INET6 else ipaddress.IPv4Address(raw)


@attrs.define(eq=False)
class Scanner:
    """One netlink route socket in a namespace, for dumps (see the module doc).  Close it."""

    netns: str | int | None
    _sock: socket.socket = attrs.field(init=False)
    _seq: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        fd = _nsenter.run_in_netns(self.netns, _route_socket_fd)
        self._sock = socket.socket(fileno=fd)
        try:
            self._sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self._sock.bind((0, 0))
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _dump(self, msg_type: int, body: bytes) -> list[tuple[int, bytes, int, int]]:
        """Every message of one dump: (type, buffer, body start, end).  Read again when interrupted."""
        for _ in range(_DUMP_ATTEMPTS):
            self._seq += 1
            seq = self._seq
            self._sock.send(_NLMSGHDR.pack(16 + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
            out: list[tuple[int, bytes, int, int]] = []
            interrupted = False
            done = False
            while not done:
                data, _, flags, _ = self._sock.recvmsg(_RECV_BYTES)
                if flags & socket.MSG_TRUNC:
                    raise OSError(errno.EMSGSIZE, "netlink dump message larger than the receive buffer")
                offset = 0
                while offset + 16 <= len(data):
                    length, kind, nl_flags, got_seq, _port = _NLMSGHDR.unpack_from(data, offset)
                    if length < 16 or offset + length > len(data):
                        raise OSError(errno.EPROTO, "malformed netlink message")
                    if got_seq == seq:
                        interrupted |= bool(nl_flags & NLM_F_DUMP_INTR)
                        if kind == NLMSG_DONE:
                            done = True
                        elif kind == NLMSG_ERROR:
                            (code,) = struct.unpack_from("=i", data, offset + 16)
                            if code:
                                raise OSError(-code, os.strerror(-code))
                            done = True
                        else:
                            out.append((kind, data, offset + 16, offset + length))
                    offset += (length + 3) & ~3
            if not interrupted:
                return out
        raise OSError(errno.EINTR, f"netlink dump interrupted {_DUMP_ATTEMPTS} times in a row")

    def links(self) -> list[Link]:
        """Every interface: index, name, kind, alias (statistics are not asked for)."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _RTATTR.pack(8, IFLA_EXT_MASK)
        body += _U32.pack(RTEXT_FILTER_SKIP_STATS)
        out = []
        for kind, data, start, end in self._dump(RTM_GETLINK, body):
            if kind != RTM_NEWLINK:
                continue
            _family, _type, index, _flags, _change = _IFINFOMSG.unpack_from(data, start)
            name, link_kind, alias = "", None, ""
            for attr, a, b in _attrs(data, start + _IFINFOMSG.size, end):
                if attr == IFLA_IFNAME:
                    name = _text(data, a, b)
                elif attr == IFLA_IFALIAS:
                    alias = _text(data, a, b)
                elif attr == IFLA_LINKINFO:
                    for sub, c, d in _attrs(data, a, b):
                        if sub == IFLA_INFO_KIND:
                            link_kind = _text(data, c, d)
            out.append(Link(index, name, link_kind, alias))
        return out

    def addresses(self) -> list[Address]:
        """Every address on every interface, both families."""
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for kind, data, start, end in self._dump(RTM_GETADDR, _IFADDRMSG.pack(family, 0, 0, 0, 0)):
                if kind != RTM_NEWADDR:
                    continue
                fam, prefixlen, flags, _scope, index = _IFADDRMSG.unpack_from(data, start)
                address = local = None
                for attr, a, b in _attrs(data, start + _IFADDRMSG.size, end):
                    if attr == IFA_ADDRESS:
                        address = _ip(fam, data, a, b)
                    elif attr == IFA_LOCAL:
                        local = _ip(fam, data, a, b)
                    elif attr == IFA_FLAGS:
                        (flags,) = _U32.unpack_from(data, a)
                chosen = address or local
                if chosen is not None:
                    out.append(Address(index, chosen, prefixlen, flags))
        return out

    def routes(self, protocol: int, route_type: int = 0) -> list[RawRoute]:
        """Main-table unicast and blackhole routes of *protocol* (both families), only
        *route_type* ones when given: the kernel filters, nothing else is read."""
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            request = _RTMSG.pack(family, 0, 0, 0, MAIN_TABLE, protocol, 0, route_type, 0)
            for kind, data, start, end in self._dump(RTM_GETROUTE, request):
                if kind != RTM_NEWROUTE:
                    continue
                fam, dst_len, _src, _tos, table, proto, scope, rtype, _flags = _RTMSG.unpack_from(data, start)
                if rtype not in (RTN_UNICAST, RTN_BLACKHOLE) or proto != protocol:
                    continue
                if route_type and rtype != route_type:
                    continue
                dst = None
                oif = 0
                gateway = None
                hops: list[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address | None]] = []
                for attr, a, b in _attrs(data, start + _RTMSG.size, end):
                    if attr == RTA_DST:
                        dst = _ip(fam, data, a, b)
                    elif attr == RTA_OIF:
                        (oif,) = _U32.unpack_from(data, a)
                    elif attr == RTA_GATEWAY:
                        gateway = _ip(fam, data, a, b)
                    elif attr == RTA_TABLE:
                        (table,) = _U32.unpack_from(data, a)
                    elif attr == RTA_MULTIPATH:
                        hops += _nexthops(fam, data, a, b)
                if table != MAIN_TABLE:
                    continue
                if dst is None:
                    dst = ipaddress.IPv6Address(0) if fam == socket.AF_INET6 else ipaddress.IPv4Address(0)
                if rtype == RTN_BLACKHOLE:
                    hops = []
                elif not hops:
                    hops = [(oif, gateway)]
                out.append(
                    RawRoute(ipaddress.ip_network(f"{dst}/{dst_len}", strict=False), rtype, proto, scope, tuple(hops))
                )
        return out


def _nexthops(
    family: int, data: bytes, start: int, end: int
) -> list[tuple[int, ipaddress.IPv4Address | ipaddress.IPv6Address | None]]:
    hops = []
    while start + _RTNEXTHOP.size <= end:
        length, _flags, _hops, oif = _RTNEXTHOP.unpack_from(data, start)
        if length < _RTNEXTHOP.size:
            break
        gateway = None
        for attr, a, b in _attrs(data, start + _RTNEXTHOP.size, min(start + length, end)):
            if attr == RTA_GATEWAY:
                gateway = _ip(family, data, a, b)
        hops.append((oif, gateway))
        start += (length + 3) & ~3
    return hops


def _route_socket_fd() -> int:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE).detach()
