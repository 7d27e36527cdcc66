"""The requests of a pod's set-up as pyroute2 message objects, built directly
from the desired values (pure: no I/O).

What pyroute2's ``link``/``addr``/``route`` request processors would send
for the same call, without their cost: the kernel results are identical
(tests/netlink compare them).  Each request carries the function that makes
its message and that function's hashable arguments, so that
:mod:`flock.netlink._batch` can encode a message it has seen before once.
"""

from __future__ import annotations

import socket
from typing import Any

from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_GETLINK, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from flock.netlink import _conn
from flock.netlink._batch import Request
from flock.netlink.desired import Address, Route, Scope

NLM_F_ECHO = 0x08
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
RT_SCOPE_UNIVERSE = 0


def new_veth(host: str, pod: str, pod_netns: int, mtu: int | None) -> Request:
    """Create the pair, the pod end in *pod_netns*, both ends down: the host
    end's addrgenmode must be set before it goes up and the kernel refuses
    IFLA_AF_SPEC at creation (EAFNOSUPPORT); the pod end cannot be created
    up (veth's open finds no peer yet: ENOTCONN).  Both on kernel 6.18.
    NLM_F_ECHO: the kernel answers with the host end's link message, as a
    read of it would (kernels that do not echo a new link ignore the flag;
    the peer's, made in another namespace, is never echoed)."""
    return Request(
        RTM_NEWLINK,
        NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO,
        f"create veth {host} <-> {pod}",
        _veth_msg,
        (host, pod, pod_netns, mtu),
    )


def _veth_msg(host: str, pod: str, pod_netns: int, mtu: int | None) -> Any:
    mtu_attr = [("IFLA_MTU", mtu)] if mtu else []
    peer = {"attrs": [("IFLA_IFNAME", pod), ("IFLA_NET_NS_FD", pod_netns), *mtu_attr]}
    msg = ifinfmsg()
    msg["attrs"] = [
        ("IFLA_IFNAME", host),
        *mtu_attr,
        (
            "IFLA_LINKINFO",
            {"attrs": [("IFLA_INFO_KIND", "veth"), ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", peer)]})]},
        ),
    ]
    return msg


def get_link(name: str) -> Request:
    return Request(RTM_GETLINK, 0, f"read link {name}", _get_link_msg, (name,))


def get_link_index(index: int) -> Request:
    return Request(RTM_GETLINK, 0, f"read link #{index}", _get_link_index_msg, (index,))


def _get_link_index_msg(index: int) -> Any:
    msg = ifinfmsg()
    msg["index"] = index
    msg["attrs"] = [("IFLA_EXT_MASK", 1 << 3)]  # RTEXT_FILTER_SKIP_STATS: no IPv6 statistics
    return msg


def del_link(index: int, name: str) -> Request:
    """Delete the link *index* (its veth peer goes with it); *name* is for the error text."""
    return Request(RTM_DELLINK, 0, f"delete link {name} (#{index})", _del_link_msg, (index,))


def _del_link_msg(index: int) -> Any:
    msg = ifinfmsg()
    msg["index"] = index
    return msg


def _get_link_msg(name: str) -> Any:
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_IFNAME", name)]
    return msg


def set_link(
    index: int, *, alias: str | None = None, addrgenmode_none: bool = False, mtu: int | None = None, up: bool = False
) -> Request:
    """Change the link *index*.  The kernel applies the flags before
    IFLA_AF_SPEC: never ask for *up* together with *addrgenmode_none*."""
    if up and addrgenmode_none:
        raise ValueError("addrgenmode none must be set before the link goes up, in an earlier message")
    changes = [f"alias {alias}" if alias is not None else "", f"mtu {mtu}" if mtu else ""]
    changes += ["addrgenmode none" if addrgenmode_none else "", "up" if up else ""]
    what = f"set link #{index} " + " ".join(c for c in changes if c)
    return Request(RTM_NEWLINK, 0, what, _set_link_msg, (index, alias, addrgenmode_none, mtu, up))


def _set_link_msg(index: int, alias: str | None, addrgenmode_none: bool, mtu: int | None, up: bool) -> Any:
    msg = ifinfmsg()
    msg["index"] = index
    if up:
        msg["flags"] = msg["change"] = IFF_UP
    attrs: list = []
    if alias is not None:
        attrs.append(("IFLA_IFALIAS", alias))
    if mtu:
        attrs.append(("IFLA_MTU", mtu))
    if addrgenmode_none:
        gen = [("IFLA_INET6_ADDR_GEN_MODE", _conn.ADDRGENMODE_NONE)]
        attrs.append(("IFLA_AF_SPEC", {"attrs": [("AF_INET6", {"attrs": gen})]}))
    msg["attrs"] = attrs
    return msg


def new_address(addr: Address, index: int) -> Request:
    """*addr* on *index*.  IPv4 takes IFA_LOCAL (the kernel copies it to
    IFA_ADDRESS, as for ``ip addr add``), IPv6 IFA_ADDRESS."""
    what = f"add address {addr} to link #{index}"
    return Request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, what, _address_msg, (addr, index))


def _address_msg(addr: Address, index: int) -> Any:
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET6 if addr.family == 6 else socket.AF_INET
    msg["prefixlen"] = addr.prefixlen
    msg["flags"] = _conn.IFA_F_NODAD if addr.nodad else 0
    msg["scope"] = RT_SCOPE_UNIVERSE
    msg["index"] = index
    msg["attrs"] = [("IFA_LOCAL" if addr.family == 4 else "IFA_ADDRESS", str(addr.address))]
    return msg


def replace_route(route: Route, oif: int) -> Request:
    """``ip route replace`` of a single-nexthop unicast *route* (main table)
    out of the link *oif*."""
    if route.blackhole or len(route.nexthops) != 1:
        raise ValueError(f"{route}: expected one nexthop")
    return Request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, f"replace route {route}", _route_msg, (route, oif))


def _route_msg(route: Route, oif: int) -> Any:
    (hop,) = route.nexthops
    msg = rtmsg()
    msg["family"] = socket.AF_INET6 if route.family == 6 else socket.AF_INET
    msg["dst_len"] = route.dst.prefixlen
    msg["table"] = _conn.MAIN_TABLE  # fits the header's byte: no RTA_TABLE
    msg["proto"] = route.protocol
    msg["scope"] = int(Scope.LINK) if route.scope == Scope.LINK else RT_SCOPE_UNIVERSE
    msg["type"] = _conn.RTN_UNICAST
    attrs: list = []
    if route.dst.prefixlen:
        attrs.append(("RTA_DST", str(route.dst.network_address)))
    attrs.append(("RTA_OIF", oif))
    if hop.gateway is not None:
        attrs.append(("RTA_GATEWAY", str(hop.gateway)))
        if _conn.onlink(hop.gateway):
            msg["flags"] = _conn.RTNH_F_ONLINK
    msg["attrs"] = attrs
    return msg
