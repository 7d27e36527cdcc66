"""Real bird2 in namespaces: pods on two nodes reach each other over BGP-learned routes.

Topology (all created by the test, names ``fl-bird-<run>-*``)::

        pod pa                         pod pb
          |                              |
        node a ---- 2001:db8:ffff::/64 ---- node b
          \\         192.0.2.0/26          /
           2001:db8:ff01::/64   2001:db8:ff02::/64
                     \\          /
                      client c (its own BIRD, a ToR's role)

Each namespace runs bird2 with the config ``flock.bird.render`` makes. Node a
starts without its anycast address in the config; the real
:class:`BirdReloader` adds it (``bird -p``, atomic write, ``birdc configure``).
Wall-clock waits poll for a condition under one bounded deadline.
"""

from __future__ import annotations

import contextlib
import ipaddress
import pathlib
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import trio
from bird_lab import Lab, unique_prefix

from flock.bird import BgpTimers, BirdInputs, BirdReloader, RenderSettings, render
from flock.model import NodeConfig

ROUTE_PROTOCOL = 252
SETTINGS = RenderSettings(route_protocol=ROUTE_PROTOCOL, bgp_timers=BgpTimers())
ANYCAST6, ANYCAST4 = "2001:db8:aaaa::1", "203.0.113.1"
A_LINK_C, B_LINK_C = "2001:db8:ff01::1", "2001:db8:ff02::2"
C_SRC6, C_SRC4 = "2001:db8:0:3::1", "203.0.113.129"


def node_config(name: str, cidr6: str, cidr4: str, asn: int, router_id: str, peers: list[tuple[str, str, int]]) -> NodeConfig:
    return NodeConfig.from_object(
        {
            "metadata": {"name": name},
            "spec": {
                "cidr6": cidr6,
                "cidr4": cidr4,
                "bgp": {"asn": asn, "routerID": router_id, "peers": [{"name": n, "address": a, "asn": s} for n, a, s in peers]},
            },
        }
    )


NODE_A = node_config("a", "2001:db8:0:1::/64", "198.51.100.0/26", 64512, "192.0.2.1", [("b", "2001:db8:ffff::2", 64513), ("c", "2001:db8:ff01::3", 64500)])
NODE_B = node_config("b", "2001:db8:0:2::/64", "198.51.100.64/26", 64513, "192.0.2.2", [("a", "2001:db8:ffff::1", 64512), ("c", "2001:db8:ff02::3", 64500)])
NODE_C = node_config("c", "2001:db8:0:3::/64", "203.0.113.128/25", 64500, "192.0.2.3", [("a", A_LINK_C, 64512), ("b", B_LINK_C, 64513)])
ANYCAST = frozenset(ipaddress.ip_address(a) for a in (ANYCAST6, ANYCAST4))


def build(lab: Lab) -> dict[str, str]:
    a, b, c = lab.node("a"), lab.node("b"), lab.ns("c")
    lab.link(a, "ab", ["2001:db8:ffff::1/64", "192.0.2.1/26"], b, "ba", ["2001:db8:ffff::2/64", "192.0.2.2/26"])
    lab.link(a, "ac", [A_LINK_C + "/64"], c, "ca", ["2001:db8:ff01::3/64"])
    lab.link(b, "bc", [B_LINK_C + "/64"], c, "cb", ["2001:db8:ff02::3/64"])
    lab.add_loopback_address(c, C_SRC6 + "/128")
    lab.add_loopback_address(c, C_SRC4 + "/32")
    lab.node_blackholes(a, "2001:db8:0:1::/64", "198.51.100.0/26")
    lab.node_blackholes(b, "2001:db8:0:2::/64", "198.51.100.64/26")
    return {"a": a, "b": b, "c": c}


@contextlib.asynccontextmanager
async def running_bird(ns: str, conf: pathlib.Path, ctl: pathlib.Path) -> AsyncIterator[trio.Process]:
    """bird2 in the foreground in ``ns``; killed and reaped however the block ends."""
    with open(conf.with_suffix(".log"), "wb") as log:
        # `ip netns exec` execs bird in place, so the pid we kill is bird's.
        proc = await trio.lowlevel.open_process(["ip", "netns", "exec", ns, "bird", "-f", "-c", str(conf), "-s", str(ctl)], stdout=log, stderr=log)
    try:
        yield proc
    finally:
        proc.kill()
        with trio.move_on_after(5, shield=True):
            await proc.wait()


async def pings(ns: str, dst: str, src: str | None = None) -> bool:
    argv = ["ip", "netns", "exec", ns, "ping", "-c1", "-W1", *(["-I", src] if src else []), dst]
    return (await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)).returncode == 0


@attrs.define(eq=False)
class Waits:
    """Polls conditions under the test's one deadline, remembering what it waits for."""

    current: str = "the lab to be built"

    async def until(self, what: str, condition: Callable[[], Awaitable[bool]]) -> None:
        self.current = what
        while not await condition():
            await trio.sleep(0.05)
        self.current = "the next step"


async def test_pods_reach_each_other_and_anycast_across_nodes(require_root: None, require_bird: None) -> None:
    lab = Lab(unique_prefix(), ROUTE_PROTOCOL)
    # Unix socket paths are limited to 108 bytes: keep the directory short.
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="fl-bird-"))
    waits = Waits()
    try:
        with trio.fail_after(40):
            ns = await trio.to_thread.run_sync(build, lab)
            pa = await trio.to_thread.run_sync(lambda: lab.pod(ns["a"], "pa", "2001:db8:0:1::a", "198.51.100.10", (ANYCAST6, ANYCAST4)))
            pb = await trio.to_thread.run_sync(lambda: lab.pod(ns["b"], "pb", "2001:db8:0:2::b", "198.51.100.74", (ANYCAST6, ANYCAST4)))
            configs = {
                "a": render(NODE_A, settings=SETTINGS),  # the reloader adds the anycast set below
                "b": render(NODE_B, anycast=ANYCAST, settings=SETTINGS),
                "c": render(NODE_C, settings=SETTINGS),
            }
            async with contextlib.AsyncExitStack() as stack:
                for name, text in configs.items():
                    (workdir / f"{name}.conf").write_text(text)
                    await stack.enter_async_context(running_bird(ns[name], workdir / f"{name}.conf", workdir / f"{name}.ctl"))
                reloader = BirdReloader(workdir / "a.conf", workdir / "a.ctl", SETTINGS, lambda: BirdInputs(NODE_A, anycast=ANYCAST))
                nursery = await stack.enter_async_context(trio.open_nursery())
                await nursery.start(reloader.run)

                async def hops(where: str, dst: str) -> list[set[str]]:
                    return await trio.to_thread.run_sync(lab.routes, ns[where], dst)

                # Pod to pod across nodes, both families (IPv4 rides the IPv6 sessions).
                await waits.until("pa pings pb over IPv6", lambda: pings(pa.ns, str(pb.ip6)))
                await waits.until("pb pings pa over IPv4", lambda: pings(pb.ns, str(pa.ip4)))
                assert await pings(pa.ns, str(pb.ip4)) and await pings(pb.ns, str(pa.ip6))

                # The anycast address is served by both nodes: c has one route, two next hops.
                async def both_announce() -> bool:
                    return await hops("c", ANYCAST6 + "/128") == [{A_LINK_C, B_LINK_C}] and await hops("c", ANYCAST4 + "/32") == [{A_LINK_C, B_LINK_C}]

                await waits.until("c has a two-way multipath route to the anycast addresses", both_announce)
                assert reloader.reloads == 1 and ANYCAST6 + "/128" in (workdir / "a.conf").read_text()
                assert await pings(ns["c"], ANYCAST6, C_SRC6) and await pings(ns["c"], ANYCAST4, C_SRC4)

                # Removing pb withdraws b's anycast route; a's pod still answers.
                await trio.to_thread.run_sync(lab.remove_pod, pb)

                async def only_a_announces() -> bool:
                    return await hops("c", ANYCAST6 + "/128") == [{A_LINK_C}] and await hops("c", ANYCAST4 + "/32") == [{A_LINK_C}]

                await waits.until("b's anycast route is withdrawn", only_a_announces)
                assert await pings(ns["c"], ANYCAST6, C_SRC6) and await pings(ns["c"], ANYCAST4, C_SRC4)
                assert not await pings(pa.ns, str(pb.ip6))  # b's block is still announced, the pod is gone

                # Removing pa too: nobody announces the anycast addresses any more.
                await trio.to_thread.run_sync(lab.remove_pod, pa)

                async def nobody_announces() -> bool:
                    return await hops("c", ANYCAST6 + "/128") == [] and await hops("c", ANYCAST4 + "/32") == []

                await waits.until("every anycast route is withdrawn", nobody_announces)
                nursery.cancel_scope.cancel()
    except trio.TooSlowError:
        raise AssertionError(f"timed out waiting until {waits.current}") from None
    finally:
        lab.close()
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()
