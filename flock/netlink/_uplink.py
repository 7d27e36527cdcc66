"""What the node's uplink carries: the MTU of the interface holding the
default route (blocking: for worker threads).

The default route is found in a dump of the main table's unicast routes, one
per family, filtered in the kernel (strict checking: table and type) but not
by prefix length — the kernel cannot — so on a node that learns a route per
remote node block the dump is long.  Its messages are read undecoded
(:meth:`_batch.RtnlSocket.dump_raw`): only a default route's are parsed,
the rest cost a header unpacked.  Then one link read per interface found.

Which route: IPv6 first, else IPv4; among several default routes of a
family the one the kernel uses (lowest metric, ``RTA_PRIORITY``), and a
source-specific one (``from …``) only when there is no plain one.  A
multipath default route counts with its smallest interface MTU; a route MTU
(``ip route … mtu N``) below the link's wins.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

import attrs
from pyroute2.netlink.rtnl import RTM_GETROUTE, RTM_NEWROUTE

from flock.model import MTU_DEFAULT, UplinkMtu
from flock.netlink import _batch, _build, _nsenter

MAIN_TABLE = 254
RTN_UNICAST = 1
RTA_OIF, RTA_PRIORITY, RTA_METRICS, RTA_MULTIPATH, RTA_TABLE = 4, 6, 8, 9, 15
RTAX_MTU = 2
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTA = struct.Struct("=HH")  # length, type
_RTNH = struct.Struct("=HBBi")  # length, flags, hops, ifindex
_U32 = struct.Struct("=I")


@attrs.frozen
class DefaultRoute:
    """One default route: its metric, the interfaces of its next hops, its route MTU (0: none)."""

    src_len: int
    priority: int
    oifs: tuple[int, ...]
    mtu: int = 0


def _attrs(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    offset = 0
    while offset + _RTA.size <= len(data):
        length, kind = _RTA.unpack_from(data, offset)
        if length < _RTA.size:
            return
        yield kind & 0x3FFF, data[offset + _RTA.size : offset + length]  # without NLA_F_NESTED/BYTEORDER
        offset += (length + 3) & ~3


def _hops(data: memoryview) -> Iterator[int]:
    offset = 0
    while offset + _RTNH.size <= len(data):
        length, _flags, _hops, index = _RTNH.unpack_from(data, offset)
        if length < _RTNH.size:
            return
        yield index
        offset += (length + 3) & ~3


def default_route(payload: memoryview) -> DefaultRoute | None:
    """The route message (after its netlink header) as a :class:`DefaultRoute`,
    None unless it is a main-table unicast default route."""
    if len(payload) < _RTMSG.size:
        return None
    _family, dst_len, src_len, _tos, table, _proto, _scope, rtype, _flags = _RTMSG.unpack_from(payload)
    if dst_len != 0 or rtype != RTN_UNICAST:
        return None
    oifs: list[int] = []
    priority = mtu = 0
    for kind, value in _attrs(payload[_RTMSG.size :]):
        if kind == RTA_TABLE:
            table = _U32.unpack_from(value)[0]
        elif kind == RTA_OIF:
            oifs.append(_U32.unpack_from(value)[0])
        elif kind == RTA_PRIORITY:
            priority = _U32.unpack_from(value)[0]
        elif kind == RTA_MULTIPATH:
            oifs.extend(_hops(value))
        elif kind == RTA_METRICS:
            mtu = next((_U32.unpack_from(v)[0] for k, v in _attrs(value) if k == RTAX_MTU), 0)
    if table != MAIN_TABLE or not oifs:
        return None
    return DefaultRoute(src_len, priority, tuple(oifs), mtu)


def _route_request(family: int) -> bytes:
    return _RTMSG.pack(family, 0, 0, 0, MAIN_TABLE, 0, 0, RTN_UNICAST, 0)


def read_uplink_mtu(host_netns: str | None, enter: _batch.Enter = _nsenter.run_in_netns) -> UplinkMtu:
    """The MTU of the interface holding the node's default route (see the
    module doc); :data:`~flock.model.MTU_DEFAULT` and no interface when the
    node has none.  OSError when the kernel cannot be read."""
    with _batch.RtnlSocket.open_in(host_netns, enter, strict=True) as rtnl:
        for family, version in ((socket.AF_INET6, 6), (socket.AF_INET, 4)):
            routes = [
                r
                for kind, payload in rtnl.dump_raw(RTM_GETROUTE, _route_request(family))
                if kind == RTM_NEWROUTE and (r := default_route(payload)) is not None
            ]
            if not routes:
                continue
            best = min(routes, key=lambda r: (r.src_len != 0, r.priority))
            names, mtus = [], []
            for index in dict.fromkeys(best.oifs):
                found = rtnl.one(_build.get_link_index(index), errno.ENODEV)  # gone since the dump
                if found:
                    names.append(found[0].get_attr("IFLA_IFNAME") or f"#{index}")
                    mtus.append(found[0].get_attr("IFLA_MTU") or MTU_DEFAULT)
            if not mtus:
                continue
            mtu = min(mtus) if not best.mtu else min(*mtus, best.mtu)
            return UplinkMtu(mtu, ",".join(names), version)
    return UplinkMtu()
