"""pyroute2 message objects for a pod's set-up, built directly from the
desired values (pure: no I/O).

What pyroute2's ``link``/``addr``/``route`` request processors would send
for the same call, without their cost: the kernel results are identical
(tests/netlink compare them).
"""

from __future__ import annotations

import socket

from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from flock.netlink import _conn
from flock.netlink._batch import Request
from flock.netlink.desired import Address, Route, Scope

NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
RT_SCOPE_UNIVERSE = 0


def new_veth(host: str, pod: str, pod_netns: int, mtu: int | None) -> Request:
    """Create the pair, the pod end in *pod_netns*, both ends down: the host
    end's addrgenmode must be set before it goes up and the kernel refuses
    IFLA_AF_SPEC at creation (EAFNOSUPPORT); the pod end cannot be created
    up (veth's open finds no peer yet: ENOTCONN).  Both on kernel 6.18."""
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
    return Request(msg, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, f"create veth {host} <-> {pod}")


def get_link(name: str) -> Request:
    msg = ifinfmsg()
    msg["attrs"] = [("IFLA_IFNAME", name)]
    return Request(msg, RTM_GETLINK, what=f"read link {name}")


def set_link(
    index: int, *, alias: str | None = None, addrgenmode_none: bool = False, mtu: int | None = None, up: bool = False
) -> Request:
    """Change the link *index*.  The kernel applies the flags before
    IFLA_AF_SPEC: never ask for *up* together with *addrgenmode_none*."""
    if up and addrgenmode_none:
        raise ValueError("addrgenmode none must be set before the link goes up, in an earlier message")
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
    changes = [f"alias {alias}" if alias is not None else "", f"mtu {mtu}" if mtu else ""]
    changes += ["addrgenmode none" if addrgenmode_none else "", "up" if up else ""]
    return Request(msg, RTM_NEWLINK, what=f"set link #{index} " + " ".join(c for c in changes if c))


def new_address(addr: Address, index: int) -> Request:
    """*addr* on *index*.  IPv4 takes IFA_LOCAL (the kernel copies it to
    IFA_ADDRESS, as for ``ip addr add``), IPv6 IFA_ADDRESS."""
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET6 if addr.family == 6 else socket.AF_INET
    msg["prefixlen"] = addr.prefixlen
    msg["flags"] = _conn.IFA_F_NODAD if addr.nodad else 0
    msg["scope"] = RT_SCOPE_UNIVERSE
    msg["index"] = index
    text = str(addr.address)
    msg["attrs"] = [("IFA_LOCAL" if addr.family == 4 else "IFA_ADDRESS", text)]
    return Request(msg, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, f"add address {addr} to link #{index}")


def replace_route(route: Route, index_of: dict[str, int]) -> Request:
    """``ip route replace`` of a single-nexthop unicast *route* (main table)."""
    if route.blackhole or len(route.nexthops) != 1:
        raise ValueError(f"{route}: expected one nexthop")
    (hop,) = route.nexthops
    msg = rtmsg()
    msg["family"] = socket.AF_INET6 if route.family == 6 else socket.AF_INET
    msg["dst_len"] = route.dst.prefixlen
    msg["table"] = _conn.MAIN_TABLE
    msg["proto"] = route.protocol
    msg["scope"] = int(Scope.LINK) if route.scope == Scope.LINK else RT_SCOPE_UNIVERSE
    msg["type"] = _conn.RTN_UNICAST
    attrs: list = []  # the table fits the header's byte: no RTA_TABLE
    if route.dst.prefixlen:
        attrs.append(("RTA_DST", str(route.dst.network_address)))
    attrs.append(("RTA_OIF", index_of[hop.ifname]))
    if hop.gateway is not None:
        attrs.append(("RTA_GATEWAY", str(hop.gateway)))
        if _conn.onlink(hop.gateway):
            msg["flags"] = _conn.RTNH_F_ONLINK
    msg["attrs"] = attrs
    return Request(msg, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, f"replace route {route}")
