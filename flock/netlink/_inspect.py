"""Reads that compare the kernel with the desired state: ``check`` for one
pod, and the orphan scan behind ``cleanup`` (coroutines for ``_conn.run_blocking``)."""

from __future__ import annotations

import errno
import ipaddress
import threading
from typing import Any

import attrs
from pyroute2.netlink.exceptions import NetlinkError

from flock.faults import KernelRefused
from flock.netlink import _apply, _conn, _nsenter, _scan
from flock.netlink.desired import Address, DataplaneSettings, PodPlan, Route, Side


def _is_up(msg: Any) -> bool:
    return bool(msg["flags"] & 1)


def _mtu(msg: Any) -> int:
    return int(msg.get_attr("IFLA_MTU") or 0)


def _addrgenmode(msg: Any) -> int | None:
    spec = msg.get("IFLA_AF_SPEC")
    inet6 = spec.get("AF_INET6") if spec is not None else None
    return inet6.get("IFLA_INET6_ADDR_GEN_MODE") if inet6 is not None else None


def _compare_addresses(label: str, live: list, wanted: tuple[Address, ...]) -> list[str]:
    out = []
    have = {(a.address, a.prefixlen): a for a in live}
    for addr in wanted:
        got = have.get((addr.address, addr.prefixlen))
        if got is None:
            out.append(f"{label}: address {addr} missing")
        elif addr.nodad and not got.nodad:
            out.append(f"{label}: address {addr} lacks nodad")
    keep = {(a.address, a.prefixlen) for a in wanted}
    for key, got in sorted(have.items(), key=lambda kv: str(kv[1])):
        if key not in keep and not got.address.is_link_local:
            out.append(f"{label}: unexpected address {got}")
    return out


def _compare_routes(label: str, live: list[Route], wanted: tuple[Route, ...]) -> list[str]:
    out = []
    by_dst: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, list[Route]] = {}
    for r in live:
        by_dst.setdefault(r.dst, []).append(r)
    for route in wanted:
        found = by_dst.get(route.dst, [])
        if route in found:
            continue
        if not found:
            out.append(f"{label}: route {route} missing")
        else:
            out.append(f"{label}: route {route} differs: have {'; '.join(f'{r} proto {r.protocol}' for r in found)}")
    return out


async def check_pod(plan: PodPlan, *, pod_netns: int, host_netns: str | None, settings: DataplaneSettings) -> list[str]:
    """Every difference between *plan* and the kernel, one sentence each
    (empty list: in sync).  Raises KernelRefused only when the kernel cannot be read."""
    diffs: list[str] = []
    h_name, p_name = plan.veth.host, plan.veth.pod
    try:
        async with _conn.rtnl(host_netns) as host:
            h = await _conn.link_by_name(host, h_name)
            if h is None:
                diffs.append(f"host {h_name}: interface missing")
            else:
                hl = f"host {h_name}"
                if not _is_up(h):
                    diffs.append(f"{hl}: interface down")
                if plan.mtu and _mtu(h) != plan.mtu:
                    diffs.append(f"{hl}: MTU is {_mtu(h)}, ADD set {plan.mtu}")
                if _addrgenmode(h) != _conn.ADDRGENMODE_NONE:
                    diffs.append(f"{hl}: addrgenmode is {_addrgenmode(h)}, expected none")
                diffs += _compare_addresses(hl, await _conn.addresses(host, h["index"]), plan.addresses_on(Side.HOST))
                wanted_sysctls = plan.sysctls_on(Side.HOST)
                live_sysctls = _conn.read_sysctls(host_netns, [s.key for s in wanted_sysctls])
                for s in wanted_sysctls:
                    if live_sysctls[s.key] != s.value:
                        diffs.append(f"{hl}: sysctl {s.key} is {live_sysctls[s.key]}, expected {s.value}")
                live_routes = [lr.route for lr in await _conn.routes(host, Side.HOST, oif=h["index"])]
                diffs += _compare_routes("host", live_routes, plan.routes_on(Side.HOST))
                by_dst = {r.dst: r for r in live_routes}
                for m in plan.anycast:
                    dst = ipaddress.ip_network(f"{m.address}/{m.address.max_prefixlen}")
                    r = by_dst.get(dst)
                    if r is None or m.nexthop not in r.nexthops or r.protocol != settings.protocol:
                        diffs.append(
                            f"host: anycast route {dst} lacks nexthop {m.nexthop}" + (f" (have {r})" if r else "")
                        )
        try:
            async with _conn.rtnl(pod_netns) as pod:
                p = await _conn.link_by_name(pod, p_name)
                pl = f"pod {p_name}"
                if p is None:
                    diffs.append(f"{pl}: interface missing in {plan.netns}")
                    return diffs
                if h is not None and not _apply.peers_match(h, p):
                    diffs.append(f"{pl}: not the peer of host {h_name}")
                if not _is_up(p):
                    diffs.append(f"{pl}: interface down")
                if plan.mtu and _mtu(p) != plan.mtu:
                    diffs.append(f"{pl}: MTU is {_mtu(p)}, ADD set {plan.mtu}")
                elif h is not None and _mtu(p) != _mtu(h):
                    # ADD gives both ends one MTU: the host end (only the node's root changes it) says which.
                    diffs.append(f"{pl}: MTU is {_mtu(p)}, host {h_name} has {_mtu(h)} (ADD sets both ends alike)")
                diffs += _compare_addresses(pl, await _conn.addresses(pod, p["index"]), plan.addresses_on(Side.POD))
                diffs += _compare_routes(
                    pl, [lr.route for lr in await _conn.routes(pod, Side.POD)], plan.routes_on(Side.POD)
                )
        except _nsenter.NetnsMissing:
            diffs.append(f"pod: network namespace {plan.netns} missing")
    except (NetlinkError, OSError) as exc:
        raise KernelRefused("netlink check failed", f"container {plan.container_id}: {exc}") from exc
    return diffs


async def read_macs(plan: PodPlan, *, pod_netns: int | None, host_netns: str | None) -> tuple[str, str]:
    """The MAC addresses of the pod's veth ends as the kernel has them now
    (host side, pod side); "" for an end that is missing or not the other's
    peer (*pod_netns* None: the pod's namespace is gone).  Raises
    KernelRefused only when the kernel cannot be read."""
    try:
        async with _conn.rtnl(host_netns) as host:
            h = await _conn.link_by_name(host, plan.veth.host)
        if h is None:
            return "", ""
        host_mac = h.get("IFLA_ADDRESS", "") or ""
        if pod_netns is None:
            return host_mac, ""
        try:
            async with _conn.rtnl(pod_netns) as pod:
                p = await _conn.link_by_name(pod, plan.veth.pod)
        except _nsenter.NetnsMissing:
            return host_mac, ""
        return host_mac, (p.get("IFLA_ADDRESS", "") or "") if _apply.peers_match(h, p) else ""
    except (NetlinkError, OSError) as exc:
        raise KernelRefused("netlink read failed", f"container {plan.container_id}: {exc}") from exc


@attrs.frozen
class CleanupReport:
    """What cleanup removed: orphan host interfaces and flock routes."""

    interfaces: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()


async def cleanup(
    explained_ifnames: set[str], *, host_netns: str | None, anycast_lock: threading.Lock, settings: DataplaneSettings
) -> CleanupReport:
    """Remove flock-named host veths outside *explained_ifnames*, their share
    of multipath routes, and flock unicast routes through no explained veth.
    Blackholes are left to ensure_blackholes.

    One cheap read first (:mod:`._scan`: a link dump and a dump of flock's
    routes): on a node whose kernel matches the store — every restart but
    one after a crash — nothing is due and nothing more is read."""
    if not _orphans_seen(explained_ifnames, host_netns, settings):
        return CleanupReport()
    try:
        async with _conn.rtnl(host_netns) as host:
            orphans = {
                m.get("IFLA_IFNAME")
                async for m in await host.link("dump")
                if m.get("IFLA_IFNAME") not in explained_ifnames and _apply.owned_by_flock(m, settings)
            }
            with anycast_lock:
                routes = await _apply.leave_routes(host, orphans, settings)
                for live in await _conn.routes(host, Side.HOST, protocol=settings.protocol, all_links=True):
                    r = live.route
                    if r.blackhole or any(h.ifname in explained_ifnames for h in r.nexthops):
                        continue
                    await _apply.delete_route(host, live)
                    routes.append(str(r))
            for name in sorted(orphans):
                link = await _conn.link_by_name(host, name)
                if link is not None:
                    try:
                        await host.link("del", index=link["index"])
                    except NetlinkError as exc:
                        _apply.ignore_codes(exc, errno.ENODEV)
    except (NetlinkError, OSError) as exc:
        raise KernelRefused("netlink cleanup failed", str(exc)) from exc
    return CleanupReport(tuple(sorted(orphans)), tuple(routes))


def _orphans_seen(explained_ifnames: set[str], host_netns: str | None, settings: DataplaneSettings) -> bool:
    """Whether a flock veth or a flock unicast route is not explained by *explained_ifnames*."""
    try:
        with _scan.Scanner(host_netns) as scanner:
            links = scanner.links()
            routes = scanner.routes(settings.protocol)
    except OSError as exc:
        raise KernelRefused("netlink cleanup failed", str(exc)) from exc
    if any(
        link.name not in explained_ifnames and _apply.is_flock_link(link.name, link.kind, link.alias, settings)
        for link in links
    ):
        return True
    names = {link.index: link.name for link in links}
    return any(
        route.type != _scan.RTN_BLACKHOLE and not any(names.get(oif) in explained_ifnames for oif, _gw in route.hops)
        for route in routes
    )


@attrs.frozen
class Inventory:
    """What flock owns in the host namespace right now (read-only): its host
    veths and its own routes (protocol ``settings.protocol``), as text."""

    interfaces: tuple[str, ...] = ()
    routes: tuple[tuple[str, tuple[str, ...], bool], ...] = ()  # (dst, nexthop interfaces, blackhole)


async def inventory(*, host_netns: str | None, settings: DataplaneSettings) -> Inventory:
    """flock's host veths and routes, for flockctl (changes nothing)."""
    try:
        async with _conn.rtnl(host_netns) as host:
            names = sorted(
                [m.get("IFLA_IFNAME") async for m in await host.link("dump") if _apply.owned_by_flock(m, settings)]
            )
            routes = tuple(
                (str(live.route.dst), tuple(sorted(h.ifname or "" for h in live.route.nexthops)), live.route.blackhole)
                for live in await _conn.routes(host, Side.HOST, protocol=settings.protocol, all_links=True)
            )
    except (NetlinkError, OSError) as exc:
        raise KernelRefused("netlink inventory failed", str(exc)) from exc
    return Inventory(tuple(names), routes)
