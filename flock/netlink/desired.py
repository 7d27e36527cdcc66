"""The kernel state a pod needs, as plain values (pure: no I/O, no root).

From an :class:`~flock.model.Allocation` and the node's
:class:`DataplaneSettings`, :func:`pod_plan` says which veth pair, sysctls,
addresses and routes make the pod reachable (DESIGN "ADD, DEL, startup").
Anycast routes are node-level — several local pods with one anycast address
share one multipath route — so :func:`anycast_routes` aggregates the members
of many plans; :func:`blackhole_routes` covers the node blocks.

Route protocol: flock marks every route it installs on the node with protocol
number 70 (0x46, "F").  It is unassigned in iproute2's ``rt_protos`` and in
``linux/rtnetlink.h`` (assigned: 0-4, 8-18, 42, 99, 186-192).  BIRD's
``protocol kernel`` learns per-pod routes by this number (``krt_source``), and
:func:`flock.netlink.cleanup` uses it to recognise what flock owns.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable

import attrs

from flock.faults import AllocationUnusable
from flock.fnv import fnv1a_32
from flock.model import Allocation, IPAddress

ROUTE_PROTOCOL = 70
HOST_IFACE_PREFIX = "flock"
GATEWAY6 = ipaddress.IPv6Address("fe80::1")
GATEWAY4 = ipaddress.IPv4Address("169.254.1.1")

_IFNAMSIZ = 15  # usable characters of a Linux interface name


def host_ifname(container_id: str, prefix: str = HOST_IFACE_PREFIX) -> str:
    """``flock`` + 8 hex digits of FNV-1a-32(container ID), e.g. ``flock1a2b3c4d``."""
    return f"{prefix}{fnv1a_32(container_id):08x}"


def is_host_ifname(name: str, prefix: str = HOST_IFACE_PREFIX) -> bool:
    tail = name[len(prefix) :]
    return name.startswith(prefix) and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail)


class Side(enum.Enum):
    HOST = "host"
    POD = "pod"


class Scope(enum.IntEnum):
    UNIVERSE = 0
    LINK = 253


@attrs.frozen
class DataplaneSettings:
    """Node-wide choices that shape every pod's kernel state."""

    host_prefix: str = HOST_IFACE_PREFIX
    protocol: int = ROUTE_PROTOCOL
    gateway6: ipaddress.IPv6Address = GATEWAY6
    gateway4: ipaddress.IPv4Address = GATEWAY4
    mtu: int | None = None

    def __attrs_post_init__(self) -> None:
        if not 1 <= len(self.host_prefix) <= _IFNAMSIZ - 8:
            raise ValueError(f"host_prefix {self.host_prefix!r}: expected 1..{_IFNAMSIZ - 8} characters")
        if not 0 < self.protocol < 256 or self.protocol in (1, 2, 3, 4):
            raise ValueError(f"protocol {self.protocol}: expected 5..255 (0-4 belong to the kernel)")


@attrs.frozen
class VethPair:
    host: str
    pod: str


@attrs.frozen
class Sysctl:
    """``/proc/sys/<key>`` = value, written in the namespace of *side*."""

    side: Side
    key: str
    value: str


@attrs.frozen
class Address:
    side: Side
    ifname: str
    address: IPAddress
    prefixlen: int
    nodad: bool = True

    @property
    def family(self) -> int:
        return self.address.version

    def __str__(self) -> str:
        return f"{self.address}/{self.prefixlen}"


@attrs.frozen
class Nexthop:
    ifname: str
    gateway: IPAddress | None = None

    def __str__(self) -> str:
        return f"via {self.gateway} dev {self.ifname}" if self.gateway else f"dev {self.ifname}"


@attrs.frozen
class Route:
    """One route.  ``nexthops`` has one entry for a plain route, several for
    ECMP, none for a blackhole."""

    side: Side
    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    nexthops: tuple[Nexthop, ...] = ()
    scope: Scope = Scope.UNIVERSE
    protocol: int = ROUTE_PROTOCOL
    blackhole: bool = False

    @property
    def family(self) -> int:
        return self.dst.version

    def __str__(self) -> str:
        if self.blackhole:
            return f"blackhole {self.dst}"
        hops = " ".join(f"nexthop {h}" for h in self.nexthops) if len(self.nexthops) > 1 else str(self.nexthops[0])
        return f"{self.dst} {hops}" + (" scope link" if self.scope == Scope.LINK else "")


@attrs.frozen
class AnycastMember:
    """This pod's share of the multipath route to an anycast address."""

    address: IPAddress
    nexthop: Nexthop


@attrs.frozen
class PodPlan:
    """Everything the kernel must hold for one pod interface."""

    container_id: str
    netns: str
    veth: VethPair
    sysctls: tuple[Sysctl, ...]
    addresses: tuple[Address, ...]
    routes: tuple[Route, ...]  # pod side first, then the host's routes to the pod
    anycast: tuple[AnycastMember, ...]
    mtu: int | None = None

    def addresses_on(self, side: Side) -> tuple[Address, ...]:
        return tuple(a for a in self.addresses if a.side is side)

    def routes_on(self, side: Side) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.side is side)

    def sysctls_on(self, side: Side) -> tuple[Sysctl, ...]:
        return tuple(s for s in self.sysctls if s.side is side)


@attrs.frozen
class AppliedPlan:
    """What setup made: the plan, and the MAC addresses the kernel gave the
    veth ends (for the CNI result's ``interfaces``)."""

    plan: PodPlan
    host_mac: str
    pod_mac: str

    @property
    def host_ifname(self) -> str:
        return self.plan.veth.host

    @property
    def pod_ifname(self) -> str:
        return self.plan.veth.pod


def _host_net(addr: IPAddress) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    # From the integer, not from text: the string round trip was half a pod's plan.
    if addr.version == 4:
        return ipaddress.IPv4Network((int(addr), 32))
    return ipaddress.IPv6Network((int(addr), 128))


_DEFAULT6 = ipaddress.IPv6Network("::/0")
_DEFAULT4 = ipaddress.IPv4Network("0.0.0.0/0")


def _invalid(alloc: Allocation, field: str, value: object, expected: str) -> AllocationUnusable:
    return AllocationUnusable(
        "cannot plan pod network",
        f"container {alloc.container_id}: {field}={value!r}: expected {expected}",
    )


def _anycast_nexthop(alloc: Allocation, host: str, addr: IPAddress) -> Nexthop:
    if addr.version == 4:
        return Nexthop(host)
    # Linux refuses device-only IPv6 multipath nexthops, so the pod's own
    # /128 (reachable through its host route) is the gateway.
    gw = alloc.ip6 or next((a for a in alloc.addresses if a.version == 6), None)
    if gw is None:
        raise _invalid(alloc, "anycast", str(addr), "an IPv6 anycast address only on a pod that has an IPv6 address")
    return Nexthop(host, gw)


def pod_plan(alloc: Allocation, settings: DataplaneSettings = DataplaneSettings()) -> PodPlan:
    """The kernel state for *alloc*; :class:`~flock.faults.AllocationUnusable` names a bad field."""
    if (
        not alloc.if_name
        or len(alloc.if_name) > _IFNAMSIZ
        or "/" in alloc.if_name
        or alloc.if_name.strip() != alloc.if_name
    ):
        raise _invalid(alloc, "ifName", alloc.if_name, "an interface name of 1..15 characters without '/' or spaces")
    if not alloc.netns:
        raise _invalid(alloc, "netns", alloc.netns, "a network namespace path")
    if alloc.ip6 is None and alloc.ip4 is None:
        raise _invalid(alloc, "ip6/ip4", None, "at least one pod address")
    host = host_ifname(alloc.container_id, settings.host_prefix)
    pod = alloc.if_name
    p = settings.protocol
    sysctls = (
        Sysctl(Side.HOST, f"net/ipv4/conf/{host}/proxy_arp", "1"),
        Sysctl(Side.HOST, f"net/ipv4/neigh/{host}/proxy_delay", "0"),
        Sysctl(Side.HOST, f"net/ipv4/conf/{host}/forwarding", "1"),
        Sysctl(Side.HOST, f"net/ipv6/conf/{host}/forwarding", "1"),
    )
    addresses = [Address(Side.HOST, host, settings.gateway6, 64)]
    pod_routes: list[Route] = []
    host_routes: list[Route] = []
    seen: set[IPAddress] = set()

    def own(addr: IPAddress, field: str) -> None:
        if addr in seen:
            raise _invalid(alloc, field, str(addr), "each address once per pod")
        seen.add(addr)
        # IPv4 has no DAD; IPv6 addresses skip it (it would hold traffic ~2 s).
        addresses.append(Address(Side.POD, pod, addr, addr.max_prefixlen, nodad=addr.version == 6))

    if alloc.ip6 is not None:
        own(alloc.ip6, "ip6")
    if alloc.ip4 is not None:
        own(alloc.ip4, "ip4")
    for extra in alloc.addresses:
        own(extra, "addresses")
    for addr in alloc.anycast:
        own(addr, "anycast")

    families = {a.version for a in seen}
    if 6 in families:
        pod_routes.append(Route(Side.POD, _DEFAULT6, (Nexthop(pod, settings.gateway6),), Scope.UNIVERSE, p))
    if 4 in families:
        pod_routes.append(Route(Side.POD, _host_net(settings.gateway4), (Nexthop(pod),), Scope.LINK, p))
        pod_routes.append(Route(Side.POD, _DEFAULT4, (Nexthop(pod, settings.gateway4),), Scope.UNIVERSE, p))

    unicast = [a for a in (alloc.ip6, alloc.ip4) if a is not None] + list(alloc.addresses)
    for addr in unicast:
        # IPv6 routes have no scope in Linux (always universe); IPv4 device routes are link-scoped.
        scope = Scope.LINK if addr.version == 4 else Scope.UNIVERSE
        host_routes.append(Route(Side.HOST, _host_net(addr), (Nexthop(host),), scope, p))
    anycast = tuple(AnycastMember(a, _anycast_nexthop(alloc, host, a)) for a in alloc.anycast)
    return PodPlan(
        container_id=alloc.container_id,
        netns=alloc.netns,
        veth=VethPair(host, pod),
        sysctls=sysctls,
        addresses=tuple(addresses),
        routes=tuple(pod_routes + host_routes),
        anycast=anycast,
        mtu=settings.mtu,
    )


def anycast_route(
    address: IPAddress,
    nexthops: list[Nexthop] | tuple[Nexthop, ...],
    settings: DataplaneSettings = DataplaneSettings(),
) -> Route:
    """The host route to *address* over *nexthops* (sorted: order-independent)."""
    hops = tuple(sorted(set(nexthops), key=lambda h: (h.ifname, str(h.gateway))))
    if not hops:
        raise ValueError(f"anycast {address}: expected at least one nexthop")
    scope = Scope.LINK if address.version == 4 and all(h.gateway is None for h in hops) else Scope.UNIVERSE
    return Route(Side.HOST, _host_net(address), hops, scope, settings.protocol)


def anycast_routes(
    plans: list[PodPlan] | tuple[PodPlan, ...], settings: DataplaneSettings = DataplaneSettings()
) -> tuple[Route, ...]:
    """One route per anycast address, multipath over every local pod holding it."""
    members: dict[IPAddress, list[Nexthop]] = {}
    for plan in plans:
        for m in plan.anycast:
            members.setdefault(m.address, []).append(m.nexthop)
    return tuple(
        anycast_route(addr, hops, settings)
        for addr, hops in sorted(members.items(), key=lambda kv: (kv[0].version, kv[0]))
    )


def blackhole_routes(
    cidrs: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network | None],
    settings: DataplaneSettings = DataplaneSettings(),
) -> tuple[Route, ...]:
    """Blackholes for the node blocks: traffic to an unassigned pod address
    stops here instead of following the default route back out."""
    nets = sorted({ipaddress.ip_network(c) for c in cidrs if c is not None}, key=lambda n: (n.version, n))
    return tuple(Route(Side.HOST, n, (), Scope.UNIVERSE, settings.protocol, blackhole=True) for n in nets)
