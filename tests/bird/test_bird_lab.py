"""Real bird2 in namespaces: pods on two nodes reach each other over BGP-learned routes.

Topology (all created by the test, names ``fl-bird-*``)::

     pods pa, pa2                      pod pb
          |                              |
        node a ---- 2001:db8:ffff::/64 ---- node b
          \\         192.0.2.0/26          /
           2001:db8:ff01::/64   2001:db8:ff02::/64
                     \\          /
                      client c (its own BIRD, a ToR's role)

Pods are wired by flock's own :class:`NetlinkWorker` (so BIRD learns exactly
what the agent leaves in the kernel), and each namespace runs bird2 with the
config ``flock.bird.render`` makes. Node a starts without its anycast address
in the config; the real :class:`BirdReloader` adds it (``bird -p``, atomic
write, ``birdc configure``). Wall-clock waits poll for a condition under one
bounded deadline.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import pathlib
import re
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import trio

from flock.bird import BgpTimers, BirdInputs, BirdReloader, RenderSettings, render
from flock.model import Allocation, NodeConfig
from flock.netlink import ROUTE_PROTOCOL, NetlinkWorker, host_ifname
from flock.testing.netns import Netns, NetnsPool

SETTINGS = RenderSettings(route_protocol=ROUTE_PROTOCOL, bgp_timers=BgpTimers())
ANYCAST6, ANYCAST4 = "2001:db8:aaaa::1", "203.0.113.1"
A_LINK_C, B_LINK_C = "2001:db8:ff01::1", "2001:db8:ff02::2"
C_SRC6, C_SRC4 = "2001:db8:0:3::1", "203.0.113.129"


def node_config(
    name: str, cidr6: str, cidr4: str, asn: int, router_id: str, peers: list[tuple[str, str, int]]
) -> NodeConfig:
    return NodeConfig.from_object(
        {
            "metadata": {"name": name},
            "spec": {
                "cidr6": cidr6,
                "cidr4": cidr4,
                "bgp": {
                    "asn": asn,
                    "routerID": router_id,
                    "peers": [{"name": n, "address": a, "asn": s} for n, a, s in peers],
                },
            },
        }
    )


NODE_A = node_config(
    "a",
    "2001:db8:0:1::/64",
    "198.51.100.0/26",
    64512,
    "192.0.2.1",
    [("b", "2001:db8:ffff::2", 64513), ("c", "2001:db8:ff01::3", 64500)],
)
NODE_B = node_config(
    "b",
    "2001:db8:0:2::/64",
    "198.51.100.64/26",
    64513,
    "192.0.2.2",
    [("a", "2001:db8:ffff::1", 64512), ("c", "2001:db8:ff02::3", 64500)],
)
NODE_C = node_config(
    "c", "2001:db8:0:3::/64", "203.0.113.128/25", 64500, "192.0.2.3", [("a", A_LINK_C, 64512), ("b", B_LINK_C, 64513)]
)
ANYCAST = frozenset(ipaddress.ip_address(a) for a in (ANYCAST6, ANYCAST4))


def link(pool: NetnsPool, a: Netns, a_if: str, a_addrs: list[str], b: Netns, b_if: str, b_addrs: list[str]) -> None:
    pool.veth(a, a_if, b, b_if)
    for ns, ifname, addrs in ((a, a_if, a_addrs), (b, b_if, b_addrs)):
        for addr in addrs:
            ns.ip("addr", "add", addr, "dev", ifname, *(["nodad"] if ":" in addr else []))


def build(pool: NetnsPool) -> dict[str, Netns]:
    ns = {name: pool.create(name) for name in ("a", "b", "c")}
    link(
        pool,
        ns["a"],
        "ab",
        ["2001:db8:ffff::1/64", "192.0.2.1/26"],
        ns["b"],
        "ba",
        ["2001:db8:ffff::2/64", "192.0.2.2/26"],
    )
    link(pool, ns["a"], "ac", [A_LINK_C + "/64"], ns["c"], "ca", ["2001:db8:ff01::3/64"])
    link(pool, ns["b"], "bc", [B_LINK_C + "/64"], ns["c"], "cb", ["2001:db8:ff02::3/64"])
    ns["c"].ip("addr", "add", C_SRC6 + "/128", "dev", "lo")
    ns["c"].ip("addr", "add", C_SRC4 + "/32", "dev", "lo")
    return ns


def next_hops(ns: Netns, dst: str) -> list[set[str]]:
    """The gateways of each route to exactly ``dst`` in ``ns``, one set per route."""
    family = "-6" if ":" in dst else "-4"
    routes = json.loads(ns.ip("-j", family, "route", "show", "exact", dst) or "[]")
    out = []
    for route in routes:
        hops = route.get("nexthops") or [route]
        out.append({h.get("gateway") or h.get("via", {}).get("host") for h in hops})
    return out


def allocation(cid: str, pod: Netns, ip6: str, ip4: str) -> Allocation:
    return Allocation(
        container_id=cid,
        namespace="default",
        pod=cid,
        pod_uid="uid-" + cid,
        if_name="eth0",
        netns=pod.path,
        ip6=ipaddress.IPv6Address(ip6),
        ip4=ipaddress.IPv4Address(ip4),
        anycast=tuple(sorted(ANYCAST, key=str)),
    )


@contextlib.asynccontextmanager
async def running_bird(ns: str, conf: pathlib.Path, ctl: pathlib.Path) -> AsyncIterator[trio.Process]:
    """bird2 in the foreground in ``ns``; killed and reaped however the block ends."""
    async with await trio.open_file(conf.with_suffix(".log"), "wb") as log:
        # `ip netns exec` execs bird in place, so the pid we kill is bird's.
        proc = await trio.lowlevel.open_process(
            ["ip", "netns", "exec", ns, "bird", "-f", "-c", str(conf), "-s", str(ctl)],
            stdout=log.wrapped,
            stderr=log.wrapped,
        )
    try:
        yield proc
    finally:
        proc.kill()
        with trio.move_on_after(5, shield=True):
            await proc.wait()


async def bird_next_hops(ctl: pathlib.Path, dst: str) -> set[str]:
    """Gateways ("via") and interfaces ("dev") of BIRD's best route to ``dst``."""
    result = await trio.run_process(
        ["birdc", "-s", str(ctl), "show", "route", "for", dst, "primary"], capture_stdout=True, check=False
    )
    return set(re.findall(r"(?:via|dev) (\S+)", result.stdout.decode()))


async def pings(ns: str, dst: str, src: str | None = None) -> bool:
    argv = ["ip", "netns", "exec", ns, "ping", "-c1", "-W1", *(["-I", src] if src else []), dst]
    return (await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)).returncode == 0


@attrs.define(eq=False)
class Waits:
    """Polls conditions under the test's one deadline, remembering what it waits for."""

    current: str = "the lab to be built"

    async def until(self, what: str, condition: Callable[[], Awaitable[bool]]) -> None:
        self.current = what
        # Conditions on the kernel and BIRD: nothing in this process to wait on.
        while not await condition():  # noqa: ASYNC110
            await trio.sleep(0.05)
        self.current = "the next step"


async def test_pods_reach_each_other_and_anycast_across_nodes(require_root: None, require_bird: None) -> None:
    pool = NetnsPool("fl-bird-")
    # Unix socket paths are limited to 108 bytes: keep the directory short.
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="fl-bird-"))
    waits = Waits()
    try:
        with trio.fail_after(40):
            ns = await trio.to_thread.run_sync(build, pool)
            workers = {name: NetlinkWorker(host_netns=ns[name].path) for name in ("a", "b")}
            for name, uplink, node in (("a", "ab", NODE_A), ("b", "ba", NODE_B)):
                await workers[name].prepare_node(uplink=uplink)
                await workers[name].ensure_blackholes([node.cidr6, node.cidr4])
            pod_ns = {name: await trio.to_thread.run_sync(pool.create, name) for name in ("pa", "pa2", "pb")}
            pa = allocation("pa", pod_ns["pa"], "2001:db8:0:1::a", "198.51.100.10")
            pa2 = allocation("pa2", pod_ns["pa2"], "2001:db8:0:1::a2", "198.51.100.12")
            pb = allocation("pb", pod_ns["pb"], "2001:db8:0:2::b", "198.51.100.74")
            # Two pods of node a share the anycast addresses: BIRD learns one multipath route.
            await workers["a"].setup(pa)
            await workers["a"].setup(pa2)
            await workers["b"].setup(pb)
            configs = {
                "a": render(NODE_A, settings=SETTINGS),  # the reloader adds the anycast set below
                "b": render(NODE_B, anycast=ANYCAST, settings=SETTINGS),
                "c": render(NODE_C, settings=SETTINGS),
            }
            async with contextlib.AsyncExitStack() as stack:
                for name, text in configs.items():
                    (workdir / f"{name}.conf").write_text(text)
                    await stack.enter_async_context(
                        running_bird(ns[name].name, workdir / f"{name}.conf", workdir / f"{name}.ctl")
                    )
                reloader = BirdReloader(
                    workdir / "a.conf", workdir / "a.ctl", SETTINGS, lambda: BirdInputs(NODE_A, anycast=ANYCAST)
                )
                nursery = await stack.enter_async_context(trio.open_nursery())
                await nursery.start(reloader.run)

                async def hops(where: str, dst: str) -> list[set[str]]:
                    return await trio.to_thread.run_sync(next_hops, ns[where], dst)

                pa_ns, pb_ns, c_ns = pod_ns["pa"].name, pod_ns["pb"].name, ns["c"].name
                # Pod to pod across nodes, both families (IPv4 rides the IPv6 sessions).
                await waits.until("pa pings pb over IPv6", lambda: pings(pa_ns, str(pb.ip6)))
                await waits.until("pb pings pa over IPv4", lambda: pings(pb_ns, str(pa.ip4)))
                assert await pings(pa_ns, str(pb.ip4)) and await pings(pb_ns, str(pa.ip6))

                # The anycast address is served by both nodes: c has one route, two next hops.
                async def both_announce() -> bool:
                    return await hops("c", ANYCAST6 + "/128") == [{A_LINK_C, B_LINK_C}] and await hops(
                        "c", ANYCAST4 + "/32"
                    ) == [{A_LINK_C, B_LINK_C}]

                await waits.until("c has a two-way multipath route to the anycast addresses", both_announce)
                assert reloader.reloads == 1 and ANYCAST6 + "/128" in (workdir / "a.conf").read_text()
                assert await bird_next_hops(workdir / "a.ctl", ANYCAST6) == {str(pa.ip6), str(pa2.ip6)}
                assert await bird_next_hops(workdir / "a.ctl", ANYCAST4) == {host_ifname("pa"), host_ifname("pa2")}
                assert await pings(c_ns, ANYCAST6, C_SRC6) and await pings(c_ns, ANYCAST4, C_SRC4)

                # Removing pb withdraws b's anycast route; a's pod still answers.
                await workers["b"].teardown("pb", pb.netns, pb.if_name)
                await trio.to_thread.run_sync(pool.delete, pod_ns["pb"])

                async def only_a_announces() -> bool:
                    return await hops("c", ANYCAST6 + "/128") == [{A_LINK_C}] and await hops("c", ANYCAST4 + "/32") == [
                        {A_LINK_C}
                    ]

                await waits.until("b's anycast route is withdrawn", only_a_announces)
                assert await pings(c_ns, ANYCAST6, C_SRC6) and await pings(c_ns, ANYCAST4, C_SRC4)

                # One of a's two anycast pods leaving changes nothing outside node a.
                await workers["a"].teardown("pa", pa.netns, pa.if_name)

                async def a_learned_only_pa2() -> bool:
                    return await bird_next_hops(workdir / "a.ctl", ANYCAST6) == {str(pa2.ip6)} and await bird_next_hops(
                        workdir / "a.ctl", ANYCAST4
                    ) == {host_ifname("pa2")}

                await waits.until("a's BIRD routes the anycast addresses to pa2 alone", a_learned_only_pa2)
                assert await only_a_announces()
                assert await pings(c_ns, ANYCAST6, C_SRC6) and await pings(c_ns, ANYCAST4, C_SRC4)

                # Removing pa2 too: nobody announces the anycast addresses any more.
                await workers["a"].teardown("pa2", pa2.netns, pa2.if_name)

                async def nobody_announces() -> bool:
                    return await hops("c", ANYCAST6 + "/128") == [] and await hops("c", ANYCAST4 + "/32") == []

                await waits.until("every anycast route is withdrawn", nobody_announces)
                nursery.cancel_scope.cancel()
    except trio.TooSlowError:
        raise AssertionError(f"timed out waiting until {waits.current}") from None
    finally:
        pool.close()
        with trio.move_on_after(10, shield=True):
            for path in await trio.Path(workdir).iterdir():
                await path.unlink()
            await trio.Path(workdir).rmdir()
