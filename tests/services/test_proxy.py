"""The service proxy's loop (virtual time, an nft that records): off removes the table, kube-proxy
keeps it off and says why, nothing from half a view, changes as small updates, a refusal retried
as a whole replacement; the healthCheckNodePort answers as kube-proxy's (real sockets, root)."""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Iterator

import attrs
import pytest
import trio

from flock.netns import call_in_netns
from flock.policy import NftError
from flock.services import EndpointSlice, NodeView, Service, ServiceChanges, ServicesConfig, compile_table
from flock.services._health import HealthChecks, health_answer
from flock.services._inputs import ENDPOINT_SLICES, SERVICES, ServiceInputs
from flock.services._proxy import DROP_TABLE, ServiceProxy
from flock.services._table import HealthCheck
from flock.testing.netns import Netns, netns_pool
from flock.testing.services import endpoint, endpoint_slice, port, service, slice_port

NODE = NodeView("node-a", (ipaddress.ip_address("2001:db8:ffff::101"),))
WEB = Service.from_object(service("web", ["fd00:10:96::a"], [port("http", 80)]))


def web_slice(*ready: bool) -> EndpointSlice:
    eps = [endpoint(f"2001:db8:0:1::{i + 1:x}", ready=r) for i, r in enumerate(ready)]
    return EndpointSlice.from_object(endpoint_slice("web", eps, [slice_port("http", 8080)]))


@attrs.define
class RecordingNft:
    """An nft that keeps every script it is given; refuses the next *refuse* ones."""

    scripts: list[str] = attrs.field(factory=list)
    times: list[float] = attrs.field(factory=list)  # when each script went in (trio's clock)
    refuse: int = 0

    table_there: bool = True  # "list tables" finds the services table (a restart); False: a first start

    async def run(self, script: str | bytes) -> str:
        text = script.decode() if isinstance(script, bytes) else script
        if self.refuse:
            self.refuse -= 1
            raise NftError(1, "Error: Could not process rule: No such file or directory")
        self.scripts.append(text)
        self.times.append(trio.current_time())
        return ""

    async def counters(self, table: str) -> dict[str, tuple[int, int]]:
        return {}

    elements: dict[str, dict[str, tuple[int, int]]] = attrs.field(factory=dict)  # map → key → counters

    async def has_table(self, table: str) -> bool:
        return self.table_there

    async def element_counters(
        self, table: str, name: str, decode: Callable[[bytes], str | None]
    ) -> dict[str, tuple[int, int]]:
        return dict(self.elements.get(name, {}))


@attrs.define
class World:
    inputs: ServiceInputs = attrs.field(factory=ServiceInputs)
    nft: RecordingNft = attrs.field(factory=RecordingNft)
    notes: list[str | None] = attrs.field(factory=list)
    traces: list[str] = attrs.field(factory=list)

    async def node(self) -> NodeView:
        return NODE

    async def kube_proxy(self) -> list[str]:
        return list(self.traces)

    def proxy(self, **kw: object) -> ServiceProxy:
        return ServiceProxy(
            self.inputs,
            self.nft,
            self.node,
            lambda: ServicesConfig(pod_cidrs=(ipaddress.ip_network("2001:db8::/48"),)),
            self.kube_proxy,
            self.notes.append,
            **kw,  # type: ignore[arg-type]
        )


@pytest.fixture
def world() -> World:
    return World()


async def test_off_removes_an_earlier_table_and_does_nothing_else(world: World, autojump_clock):
    async with trio.open_nursery() as nursery:
        await nursery.start(world.proxy(enabled=False).run)
        world.inputs.replace(SERVICES, {WEB.key: WEB})
        world.inputs.replace(ENDPOINT_SLICES, {})
        await trio.sleep(120)
        nursery.cancel_scope.cancel()
    assert world.nft.scripts == [DROP_TABLE]


async def test_kube_proxy_keeps_it_off_and_named_until_it_is_gone(world: World, autojump_clock):
    world.traces = ["nftables table ip kube-proxy (kube-proxy's nftables mode)"]
    world.inputs.replace(SERVICES, {WEB.key: WEB})
    world.inputs.replace(ENDPOINT_SLICES, {"default/web-ipv6": web_slice(True)})
    proxy = world.proxy(recheck_s=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(100)
        assert world.nft.scripts == []  # nothing changed beside kube-proxy
        assert world.notes and world.notes[-1] is not None and "kube-proxy is on this node" in world.notes[-1]
        assert "table ip kube-proxy" in world.notes[-1]
        world.traces = []  # the operator removed kube-proxy and its rules
        await trio.sleep(31)
        assert world.notes[-1] is None
        assert len(world.nft.scripts) == 1 and "table inet flock-services" in world.nft.scripts[0]
        nursery.cancel_scope.cancel()


async def test_nothing_is_applied_from_half_a_view_then_changes_are_small_updates(world: World, autojump_clock):
    proxy = world.proxy()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        world.inputs.replace(SERVICES, {WEB.key: WEB})
        await trio.sleep(5)
        assert world.nft.scripts == []  # the slices are not listed yet: web would refuse connections
        world.inputs.replace(ENDPOINT_SLICES, {"default/web-ipv6": web_slice(True, True)})
        await trio.sleep(0.1)
        assert len(world.nft.scripts) == 1
        full = world.nft.scripts[0]
        assert "delete table inet flock-services" in full and "fd00:10:96::a" in full
        world.inputs.set(ENDPOINT_SLICES, "default/web-ipv6", web_slice(True, False))  # one endpoint unready
        await trio.sleep(0.1)
        assert len(world.nft.scripts) == 2
        update = world.nft.scripts[1]
        assert "delete table" not in update and 0 < update.count("\n") <= 10, update
        assert proxy.applied_generation == world.inputs.generation
        world.inputs.set(ENDPOINT_SLICES, "default/web-ipv6", web_slice(True, False))  # the same again: no change
        await trio.sleep(60)
        assert len(world.nft.scripts) == 2  # the node's addresses were read again, nothing to apply
        nursery.cancel_scope.cancel()


async def test_a_refused_transaction_is_retried_whole_with_backoff_and_noted(world: World, autojump_clock):
    world.inputs.replace(SERVICES, {WEB.key: WEB})
    world.inputs.replace(ENDPOINT_SLICES, {"default/web-ipv6": web_slice(True)})
    proxy = world.proxy()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(0.1)
        world.nft.refuse = 3
        world.inputs.set(ENDPOINT_SLICES, "default/web-ipv6", web_slice(False))
        start = trio.current_time()
        await trio.sleep(5)
        assert world.nft.refuse == 0 and len(world.nft.scripts) == 2
        waited = world.nft.times[1] - start
        assert 0.8 * 1.4 <= waited <= 1.2 * 1.4  # three refusals: backoff 0.2 + 0.4 + 0.8 s (±20 % jitter)
        assert "delete table inet flock-services" in world.nft.scripts[1]  # replaced whole, not patched
        refused = [n for n in world.notes if n is not None]
        assert len(refused) == 3 and all("nft refused the table" in n for n in refused)
        assert world.notes[-1] is None
        nursery.cancel_scope.cancel()


async def test_changes_follow_the_journal_health_checks_when_they_change_config_as_a_difference(
    world: World, autojump_clock
):
    local = Service.from_object(
        service("local", ["fd00:10:96::b"], [port("http", 80, node_port=30080)], type="NodePort", etp="Local",
                health_check_node_port=32000)
    )  # fmt: skip
    local_slice = EndpointSlice.from_object(
        endpoint_slice("local", [endpoint("2001:db8:0:2::1")], [slice_port("http", 8080)])
    )
    world.inputs.replace(SERVICES, {WEB.key: WEB, local.key: local})
    world.inputs.replace(ENDPOINT_SLICES, {"default/web-ipv6": web_slice(True), "default/local-ipv6": local_slice})
    health: list[dict[int, HealthCheck]] = []
    pods = [ipaddress.ip_network("2001:db8::/48")]
    proxy = world.proxy(on_health=lambda checks: health.append(dict(checks)))
    proxy.config = lambda: ServicesConfig(pod_cidrs=tuple(pods))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(0.1)
        assert health == [{32000: HealthCheck("default", "local", 1)}]
        world.inputs.set(ENDPOINT_SLICES, "default/web-ipv6", web_slice(True, True))  # web only: no health change
        await trio.sleep(0.1)
        assert len(world.nft.scripts) == 2 and "local" not in world.nft.scripts[1] and len(health) == 1
        assert proxy.engine is not None and proxy.in_kernel
        moved = attrs.evolve(local_slice, endpoints=(attrs.evolve(local_slice.endpoints[0], node_name="node-b"),))
        world.inputs.set(ENDPOINT_SLICES, "default/local-ipv6", moved)  # its endpoint went to another node
        await trio.sleep(0.1)
        assert health[-1] == {32000: HealthCheck("default", "local", 0)}
        pods.append(ipaddress.ip_network("192.0.2.0/24"))  # the config changes: read again at the next wake-up
        await trio.sleep(31)
        assert len(world.nft.scripts) == 4
        assert "delete table" not in world.nft.scripts[3] and "192.0.2.0/24" in world.nft.scripts[3]
        assert proxy.engine.table() == compile_table(
            world.inputs.services.values(), world.inputs.slices.values(), NODE, proxy.config()
        )
        nursery.cancel_scope.cancel()


def test_the_journal_names_each_key_written_once_and_a_relist_only_what_differs():
    inputs = ServiceInputs()
    inputs.set(SERVICES, WEB.key, WEB)
    journal = inputs.journal()
    assert not journal.drain()
    other = attrs.evolve(WEB, name="other")
    inputs.set(SERVICES, WEB.key, WEB)  # equal: no write
    inputs.set(ENDPOINT_SLICES, "default/web-ipv6", web_slice(True))
    inputs.set(ENDPOINT_SLICES, "default/web-ipv6", web_slice(False))
    inputs.delete(SERVICES, "default/nothing")
    assert journal.drain() == ServiceChanges(frozenset(), frozenset({"default/web-ipv6"}))
    generation = inputs.generation
    inputs.replace(SERVICES, {WEB.key: WEB, other.key: other})
    inputs.replace(ENDPOINT_SLICES, {})
    assert journal.drain() == ServiceChanges(frozenset({other.key}), frozenset({"default/web-ipv6"}))
    assert inputs.generation == generation + 2
    inputs.replace(SERVICES, {WEB.key: WEB, other.key: other})  # listed again, nothing new
    assert not journal.drain() and inputs.generation == generation + 2


def test_the_health_answer_is_kube_proxys():
    check = HealthCheck("shop", "web", 2)
    head, body = health_answer(check).split(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"X-Load-Balancing-Endpoint-Weight: 2" in head
    assert json.loads(body) == {
        "service": {"namespace": "shop", "name": "web"},
        "localEndpoints": 2,
        "serviceProxyHealthy": True,
    }
    assert health_answer(HealthCheck("shop", "web", 0)).startswith(b"HTTP/1.1 503 Service Unavailable")


@pytest.fixture
def node_ns(require_root) -> Iterator[Netns]:
    with netns_pool("fl-hc-") as pool:
        ns = pool.create("node")
        ns.ip("addr", "add", "2001:db8:ffff::101/64", "dev", "lo", "nodad")
        ns.ip("addr", "add", "192.0.2.11/32", "dev", "lo")
        yield ns


def _get(ns: Netns, host: str, port: int) -> bytes:
    def get() -> bytes:
        with socket.create_connection((host, port), timeout=5) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\nHost: node\r\n\r\n")
            answer = b""
            while chunk := conn.recv(4096):
                answer += chunk
            return answer

    return call_in_netns(ns.path, get)


async def test_health_check_ports_open_answer_and_close_with_the_services(node_ns: Netns):
    checks = HealthChecks(node_ns.path)
    async with trio.open_nursery() as nursery:
        await nursery.start(checks.run)
        checks.update({31001: HealthCheck("shop", "web", 1), 31002: HealthCheck("shop", "idle", 0)})
        await trio.sleep(0.2)
        ok = await trio.to_thread.run_sync(_get, node_ns, "2001:db8:ffff::101", 31001)
        assert ok.startswith(b"HTTP/1.1 200 OK") and json.loads(ok.split(b"\r\n\r\n")[1])["localEndpoints"] == 1
        none = await trio.to_thread.run_sync(_get, node_ns, "192.0.2.11", 31002)  # IPv4 too
        assert none.startswith(b"HTTP/1.1 503")
        checks.update({31002: HealthCheck("shop", "idle", 3)})
        await trio.sleep(0.2)
        assert (await trio.to_thread.run_sync(_get, node_ns, "192.0.2.11", 31002)).startswith(b"HTTP/1.1 200")
        with pytest.raises(ConnectionRefusedError):
            await trio.to_thread.run_sync(_get, node_ns, "2001:db8:ffff::101", 31001)
        nursery.cancel_scope.cancel()


async def test_connections_per_service_port_reach_the_metrics(world: World, autojump_clock):
    from prometheus_client import CollectorRegistry, generate_latest

    from flock.services import ServiceMetrics

    registry = CollectorRegistry()
    udp = Service.from_object(service("dns", ["fd00:10:96::b"], [port("dns", 53, protocol="UDP")]))
    world.inputs.replace(SERVICES, {WEB.key: WEB, udp.key: udp})
    world.inputs.replace(ENDPOINT_SLICES, {"default/web-ipv6": web_slice(True)})
    world.nft.elements = {
        "service-ips6": {"fd00:10:96::a . tcp . 80": (7, 420), "fd00:10:96::99 . tcp . 80": (5, 0)},  # and a stranger
        "no-endpoint-services6": {"fd00:10:96::b . udp . 53": (3, 90)},
    }
    proxy = world.proxy(metrics=ServiceMetrics(registry), counters_every=15.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(16)
        text = generate_latest(registry).decode()
        nursery.cancel_scope.cancel()
    assert 'flock_service_connections_total{namespace="default",port="http",service="web"} 7.0' in text
    assert 'flock_service_rejected_total{namespace="default",port="dns",service="dns"} 3.0' in text
    assert 'flock_service_connections_total{namespace="default",port="dns",service="dns"} 0.0' in text
    assert "fd00:10:96::99" not in text and "flock_services 2.0" in text


async def test_an_endpoint_gone_hands_its_udp_flows_to_be_forgotten(world: World, autojump_clock):
    forgotten: list[list[object]] = []

    async def forget(stale: list[object]) -> int:
        forgotten.append(stale)
        return len(stale)

    dns = Service.from_object(service("dns", ["fd00:10:96::b"], [port("dns", 53, protocol="UDP")]))
    world.inputs.replace(SERVICES, {dns.key: dns})
    eps = [endpoint(f"2001:db8:0:1::{i + 1:x}") for i in range(2)]
    slice_ = EndpointSlice.from_object(endpoint_slice("dns", eps, [slice_port("dns", 53, "UDP")]))
    world.inputs.replace(ENDPOINT_SLICES, {"default/dns-ipv6": slice_})
    proxy = world.proxy(forget=forget)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(1)
        # the first load: the port's untranslated flows (sent before anything translated them) are forgotten
        assert [[(str(s.address), s.port, s.endpoint) for s in stale] for stale in forgotten] == [  # type: ignore[attr-defined]
            [("fd00:10:96::b", 53, None)]
        ]
        forgotten.clear()
        one = EndpointSlice.from_object(endpoint_slice("dns", eps[:1], [slice_port("dns", 53, "UDP")]))
        world.inputs.set(ENDPOINT_SLICES, "default/dns-ipv6", one)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    (stale,) = forgotten
    assert [(str(s.address), s.port, str(s.endpoint)) for s in stale] == [  # type: ignore[attr-defined]
        ("fd00:10:96::b", 53, "2001:db8:0:1::2")
    ]


async def test_a_first_start_loads_in_steps_and_ends_at_the_whole_table(world: World, autojump_clock):
    from flock.services import render_update

    world.nft.table_there = False
    services = {}
    slices = {}
    for i in range(1200):
        svc = Service.from_object(service(f"s{i:04}", [f"fd00:10:96::{i + 1:x}"], [port("http", 80)]))
        eps = [endpoint(f"2001:db8:0:{i + 1:x}::{j + 1:x}") for j in range(2)]
        slice_ = EndpointSlice.from_object(endpoint_slice(f"s{i:04}", eps, [slice_port("http", 8080)]))
        services[svc.key], slices[slice_.key] = svc, slice_
    world.inputs.replace(SERVICES, services)
    world.inputs.replace(ENDPOINT_SLICES, slices)
    proxy = world.proxy()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    skeleton, *steps = world.nft.scripts
    assert "delete table inet flock-services" in skeleton and "fd00:10:96::1 " not in skeleton
    assert len(steps) == 3 and all("delete table" not in s and "add element" in s for s in steps)  # 500 a step
    assert "fd00:10:96::1 . tcp . 80" in steps[0] and "fd00:10:96::4b0 . tcp . 80" in steps[2]
    assert proxy.in_kernel and proxy.applied_generation == world.inputs.generation
    whole = compile_table(services.values(), slices.values(), NODE, proxy.config())
    assert proxy.engine is not None and proxy.engine.table() == whole
    assert render_update(whole, proxy.engine.table()) == ""


async def test_a_refused_step_of_a_first_load_ends_in_a_whole_replacement(world: World, autojump_clock):
    world.nft.table_there = False
    world.inputs.replace(SERVICES, {WEB.key: WEB})
    world.inputs.replace(ENDPOINT_SLICES, {"default/web-ipv6": web_slice(True)})
    world.nft.refuse = 1  # the skeleton
    proxy = world.proxy()
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert len(world.nft.scripts) == 1 and "delete table inet flock-services" in world.nft.scripts[0]
    assert "fd00:10:96::a . tcp . 80" in world.nft.scripts[0]  # the whole table, Services and all
    assert proxy.in_kernel


async def test_announced_routes_follow_the_endpoints(world: World, autojump_clock):
    from flock.model import Communities, ServiceRoutes
    from flock.services import AllowList, AnnouncePool

    pool = AnnouncePool("public", (ipaddress.ip_network("2001:db8:ee::/64"),), Communities(((64512, 7),)), 120)
    lb = Service.from_object(
        service(
            "lb",
            ["fd00:10:96::c"],
            [port("http", 80)],
            type="LoadBalancer",
            lb_ips=["2001:db8:ee::7", "2001:db8:99::9"],
        )
    )
    world.inputs.replace(SERVICES, {WEB.key: WEB, lb.key: lb})
    ready = EndpointSlice.from_object(endpoint_slice("lb", [endpoint("2001:db8:0:1::1")], [slice_port("http", 8080)]))
    world.inputs.replace(ENDPOINT_SLICES, {"default/lb-ipv6": ready})
    handed: list[tuple[ServiceRoutes, ...]] = []
    proxy = world.proxy(on_announce=handed.append)
    proxy.config = lambda: ServicesConfig(allow=AllowList.build([pool]))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(1)
        # only the address inside the pool, with the pool's communities and local preference
        assert handed == [
            (ServiceRoutes("public", (ipaddress.ip_network("2001:db8:ee::7/128"),), pool.communities, 120),)
        ]
        gone = EndpointSlice.from_object(
            endpoint_slice("lb", [endpoint("2001:db8:0:1::1", ready=False)], [slice_port("http", 8080)])
        )
        world.inputs.set(ENDPOINT_SLICES, "default/lb-ipv6", gone)
        await trio.sleep(1)
        assert handed[-1] == ()  # no endpoint anywhere: withdrawn
        world.inputs.set(SERVICES, WEB.key, WEB)  # a change elsewhere: nothing handed again
        await trio.sleep(1)
        assert len(handed) == 2
        nursery.cancel_scope.cancel()


async def test_the_proxy_waits_for_the_pools_and_follows_them_without_a_whole_load(world: World, autojump_clock):
    from flock.services import KINDS, POOLS, AllowList, AnnouncePool

    world.inputs = ServiceInputs(required=frozenset((*KINDS, POOLS)))
    lb = Service.from_object(
        service("lb", ["fd00:10:96::c"], [port("http", 80)], type="LoadBalancer", lb_ips=["2001:db8:ee::7"])
    )
    world.inputs.replace(SERVICES, {WEB.key: WEB, lb.key: lb})
    world.inputs.replace(ENDPOINT_SLICES, {})
    proxy = world.proxy()
    proxy.config = lambda: ServicesConfig(allow=world.inputs.allow)
    pool = AnnouncePool("public", (ipaddress.ip_network("2001:db8:ee::/64"),))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(5)
        assert world.nft.scripts == []  # a restart must not drop the external addresses before the pools are read
        world.inputs.set_allow(AllowList())
        await trio.sleep(1)
        assert len(world.nft.scripts) == 1 and "2001:db8:ee::7" not in world.nft.scripts[0]
        world.inputs.set_allow(AllowList.build([pool]))
        await trio.sleep(1)
        (update,) = world.nft.scripts[1:]
        assert "2001:db8:ee::7 . tcp . 80" in update and "delete table" not in update  # elements, not a reload
        assert "fd00:10:96::a" not in update  # WEB has no external address: not compiled again
        nursery.cancel_scope.cancel()


async def test_the_cluster_ip_range_is_announced_when_configured(world: World, autojump_clock):
    from flock.model import ServiceRoutes

    world.inputs.replace(SERVICES, {WEB.key: WEB})
    world.inputs.replace(ENDPOINT_SLICES, {})
    handed: list[tuple[ServiceRoutes, ...]] = []
    cluster = ipaddress.ip_network("fd00:10:96::/112")
    proxy = world.proxy(on_announce=handed.append, cluster_ip_ranges=(cluster,))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(1)
        assert handed == [(ServiceRoutes("cluster-ips", (cluster,)),)]
        nursery.cancel_scope.cancel()


async def test_routes_without_endpoints_are_kept_when_asked(world: World, autojump_clock):
    from flock.model import ServiceRoutes
    from flock.services import AllowList, AnnouncePool

    pool = AnnouncePool("public", (ipaddress.ip_network("2001:db8:ee::/64"),))
    lb = Service.from_object(
        service("lb", ["fd00:10:96::c"], [port("http", 80)], type="LoadBalancer", lb_ips=["2001:db8:ee::7"])
    )
    world.inputs.replace(SERVICES, {lb.key: lb})
    world.inputs.replace(ENDPOINT_SLICES, {})  # no endpoint anywhere
    handed: list[tuple[ServiceRoutes, ...]] = []
    proxy = world.proxy(on_announce=handed.append, withdraw_without_endpoints=False)
    proxy.config = lambda: ServicesConfig(allow=AllowList.build([pool]))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        await trio.sleep(1)
        assert [r.nets for r in handed[-1]] == [(ipaddress.ip_network("2001:db8:ee::7/128"),)]
        (miss,) = [a for a in proxy.announcements.routes]
        assert "keep-service-routes-without-endpoints" in miss.why
        nursery.cancel_scope.cancel()
