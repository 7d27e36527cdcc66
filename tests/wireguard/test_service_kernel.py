"""The agent's WireGuard service on two nodes (namespaces, real wireguard-go, real nftables): peers, routes
and the fail-closed guard from what the cluster says, and nothing in the clear when the device or a peer
goes.

Each node also has the route BIRD would install for the other's pod blocks (over the fabric, protocol
bird, in the main table): the device's routes (table 71, looked up from the pods' addresses) must win
while they exist, and when they go the guard must drop what that route would carry in the clear.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio

from flock.agent._wireguard import ClusterView, GuardRemoval, WireGuardService
from flock.logs import JsonFormatter
from flock.policy import NftCommand
from flock.state import PodMtu
from flock.testing.wireguard import (
    MARKER,
    PORT,
    Capture,
    Node,
    PingResult,
    ToolsMissing,
    WireReport,
    World,
    eventually,
    inspect,
    ping,
    read_text,
    tcp_exchange,
    two_nodes,
)
from flock.wireguard import GUARD_TABLE, UNKEYED
from flock.wireguard._cluster import EncryptionSettings, NodeAddresses, NodeConfigWireGuard
from flock.wireguard._routes import ROUTE_PROTOCOL, ROUTE_TABLE, DeviceRoutes

pytestmark = pytest.mark.root


@attrs.define
class Cluster:
    world: World
    services: dict[str, WireGuardService]
    scopes: dict[str, trio.CancelScope] = attrs.field(factory=dict)  # each service's: stop one alone

    def node(self, name: str) -> Node:
        return self.world.a if name == "a" else self.world.b

    def nodeconfig(self, name: str, *, key: bool = True) -> dict[str, Any]:
        n, service = self.node(name), self.services[name]
        obj: dict[str, Any] = {"metadata": {"name": name}, "spec": {"cidr6": n.block6, "cidr4": n.block4}}
        if key and service.public_key is not None:
            obj["status"] = {"wireguard": {"publicKey": service.public_key.base64}}
        return obj

    def tell_everyone(self, name: str, *, key: bool = True) -> None:
        for service in self.services.values():
            service.cluster.put_nodeconfig(name, NodeConfigWireGuard.read(self.nodeconfig(name, key=key)))


def _bird_route(node: Node, other: Node) -> None:
    """What BIRD installs for the other node's blocks: over the fabric, in the clear."""
    node.ns.ip("-6", "route", "add", other.block6, "via", other.fabric6, "proto", "bird", "metric", "32")
    node.ns.ip("-4", "route", "add", other.block4, "via", other.fabric4, "proto", "bird", "metric", "32")


@pytest.fixture
async def cluster(require_root: None, tmp_path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Cluster]:
    caplog.set_level(logging.DEBUG, logger="flock.wireguard")
    try:
        with two_nodes(tmp_path) as world:
            async with trio.open_nursery() as nursery:
                services = {}
                scopes: dict[str, trio.CancelScope] = {}
                guard_calls: list[str] = []
                for n in (world.a, world.b):
                    services[n.name] = WireGuardService(
                        node=n.name,
                        store=n.store,
                        device=n.device,
                        routes=DeviceRoutes(n.device.name, n.ns.path, tools=n.device.tools),
                        nft=NftCommand(("ip", "netns", "exec", n.ns.name, "nft")),
                        cluster=ClusterView(),
                        settings=EncryptionSettings(PORT, 6),
                        resync_seconds=1.0,
                        debounce_seconds=0.02,
                        guarded=functools.partial(guard_calls.append, n.name),
                    )
                    await nursery.start(_run_in_scope, services[n.name], scopes, n.name)
                assert guard_calls == []  # a first start: no guard before the cluster is known
                # nor a key to publish: the device has none before the first pass
                assert all(s.device_key is None and s.public_key is not None for s in services.values())
                c = Cluster(world, services, scopes)
                _bird_route(world.a, world.b)
                _bird_route(world.b, world.a)
                for n in (world.a, world.b):
                    c.tell_everyone(n.name)
                    for service in services.values():
                        service.cluster.put_node(
                            n.name,
                            NodeAddresses.read(
                                {
                                    "metadata": {"name": n.name},
                                    "status": {
                                        "addresses": [
                                            {"type": "InternalIP", "address": n.fabric6},
                                            {"type": "InternalIP", "address": n.fabric4},
                                        ]
                                    },
                                }
                            ),
                        )
                for service in services.values():
                    service.cluster.mark_listed(nodeconfigs=True, nodes=True)
                await eventually(lambda: all(s.reconciles > 0 for s in services.values()))
                assert {"a", "b"} <= set(guard_calls)  # each told ADD may be served: its guard is written
                assert all(s.device_key == s.public_key for s in services.values())  # publishable now
                try:
                    yield c
                finally:
                    nursery.cancel_scope.cancel()
            for n in (world.a, world.b):
                await n.device.delete()
    except ToolsMissing as exc:
        pytest.fail(str(exc))


async def _run_in_scope(
    service: WireGuardService,
    scopes: dict[str, trio.CancelScope],
    name: str,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.CancelScope() as scopes[name]:
        await service.run(task_status=task_status)


async def _until_forgotten(service: WireGuardService, seconds: float) -> None:
    """Until the service has forgotten the previous key (the file goes first, on a worker thread; the
    service's own state after it: what flockctl shows)."""
    with trio.fail_after(seconds):
        while (await service.admin_status())["rotation_pending"]:  # noqa: ASYNC110  its loop's state
            await trio.sleep(0.05)


async def _pings(c: Cluster, count: int = 3, wait: float = 1) -> list[int]:
    a, b = c.world.a, c.world.b
    out = []
    for src, dst in ((a.pod6, b.pod6), (a.pod4, b.pod4)):
        out.append((await trio.to_thread.run_sync(lambda s=src, d=dst: ping(a.ns, s, d, count, 0.05, wait))).received)
    return out


async def _pings_seen(c: Cluster, count: int = 3, wait: float = 1) -> tuple[list[int], WireReport]:
    """:func:`_pings` with a capture on a's side of the fabric veth: what answered, and what the wire saw."""
    a, b = c.world.a, c.world.b
    capture = Capture.open(a.ns, a.veth)
    try:
        received = await _pings(c, count, wait)
        return received, inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()


async def _until_flowing(c: Cluster, seconds: float = 10) -> None:
    """A new device or session: pings until one gets through each way (the handshake), at most *seconds*."""
    with trio.fail_after(seconds):
        while await _pings(c, 1, 0.5) != [1, 1]:
            pass


async def _dropped(c: Cluster, name: str) -> int:
    found = await c.services[name].dropped()
    assert found is not None
    return found[0]


def _routes(n: Node) -> list[dict[str, Any]]:
    out = []
    for family in ("-6", "-4"):
        shown = n.ns.ip("-j", family, "route", "show", "table", str(ROUTE_TABLE), "proto", str(ROUTE_PROTOCOL))
        out += json.loads(shown or "[]")
    return out


async def test_peers_routes_and_guard_from_the_cluster(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    a, b = cluster.world.a, cluster.world.b
    capture = Capture.open(a.ns, a.veth)
    try:
        assert await _pings(cluster) == [3, 3]
        echoed = await trio.to_thread.run_sync(tcp_exchange, a.ns, b.ns, a.pod6, b.pod6, MARKER * 10)
        assert echoed == MARKER * 10
        report = inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    assert report.plaintext == [] and report.marker_seen == 0 and report.by_type[4] >= 6
    # the device's routes: b's blocks, protocol 71, in table 71, used for what comes from a's pods
    routes = _routes(a)
    assert sorted(r["dst"] for r in routes) == sorted([b.block6, b.block4])
    assert all(r["dev"] == a.device.name for r in routes)
    rules = json.loads(a.ns.ip("-j", "-6", "rule", "show", "table", str(ROUTE_TABLE)))
    block = ipaddress.ip_network(a.block6)
    assert [(r["src"], r["srclen"], r["protocol"]) for r in rules] == [(str(block[0]), block.prefixlen, "71")]
    assert a.device.name in a.ns.ip("-6", "route", "get", b.pod6, "from", a.pod6)
    # node ↔ pod stays outside the tunnel (b's WireGuard would drop a source outside a's pod blocks):
    # BIRD's route carries it, the guard lets it pass, and it is answered
    assert a.device.name not in a.ns.ip("-6", "route", "get", b.pod6)
    assert (await trio.to_thread.run_sync(ping, a.ns, a.fabric6, b.pod6)).received == 3
    assert (await trio.to_thread.run_sync(ping, a.ns, a.fabric4, b.pod4)).received == 3
    assert await _dropped(cluster, "a") == 0
    # what flockctl will show: peers by node, a handshake, never the private key
    status = await cluster.services["a"].peer_status()
    assert [(p.node, p.endpoint) for p in status] == [("b", f"[{b.fabric6}]:{PORT}")]
    assert status[0].latest_handshake is not None
    secret = a.keys.current.reveal_base64() if a.keys else cluster.services["a"]._keys.current.reveal_base64()  # type: ignore[union-attr]
    records = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert secret not in repr(status) and secret not in records and secret not in read_text(cluster.world.wg_log)


async def test_device_gone_traffic_dropped_and_counted_never_in_the_clear(cluster: Cluster) -> None:
    a, b = cluster.world.a, cluster.world.b
    assert await _pings(cluster) == [3, 3]
    capture = Capture.open(a.ns, a.veth)
    try:
        await a.device.delete()  # wireguard-go died, the module was unloaded: its routes go with it
        assert await _pings(cluster, 3, 0.3) == [0, 0]  # BIRD's route is there, the guard drops
        dropped = await _dropped(cluster, "a")
        assert dropped >= 6
        report = inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    assert report.plaintext == [] and report.marker_seen == 0, report.plaintext
    # node traffic never enters the tunnel: the fabric still works
    assert (await trio.to_thread.run_sync(ping, a.ns, a.fabric6, b.fabric6)).received == 3
    assert (await trio.to_thread.run_sync(ping, a.ns, a.fabric4, b.fabric4)).received == 3
    # the service's periodic full reconcile makes the device again: traffic flows, encrypted
    await eventually(lambda: any(r["dev"] == a.device.name for r in _routes(a)), seconds=10)
    await _until_flowing(cluster)  # a new device: its first packets wait for the handshake
    assert await _pings(cluster) == [3, 3]
    assert await _dropped(cluster, "a") == dropped


async def test_a_peer_without_a_key_is_removed_alone_and_its_traffic_dropped(cluster: Cluster) -> None:
    a = cluster.world.a
    service = cluster.services["a"]
    assert await _pings(cluster) == [3, 3]
    updates, sets = service.peer_updates, read_text(cluster.world.wg_log).count(" set ")
    cluster.tell_everyone("b", key=False)  # b's key vanished from its NodeConfig's status
    await eventually(lambda: service.peer_updates > updates and _routes(a) == [])
    assert service.peer_updates == updates + 1  # one node's change: one wg set
    assert not (await a.device.show()).peers
    received, report = await _pings_seen(cluster, 3, 0.3)
    assert received == [0, 0]
    assert report.plaintext == [] and await _dropped(cluster, "a") >= 6
    cluster.tell_everyone("b")
    await eventually(lambda: bool(_routes(a)))
    await _until_flowing(cluster)  # a new session: its first packets wait for the handshake
    assert await _pings(cluster) == [3, 3]
    assert read_text(cluster.world.wg_log).count(" set ") - sets <= 4  # per-node updates, both nodes


async def test_allow_plaintext_to_lets_the_bird_route_carry_it(cluster: Cluster) -> None:
    a = cluster.world.a
    service = cluster.services["a"]
    before = {name: s.reconciles for name, s in cluster.services.items()}
    service.settings = EncryptionSettings(PORT, 6, frozenset({"b"}))
    cluster.services["b"].settings = EncryptionSettings(PORT, 6, frozenset({"a"}))
    cluster.tell_everyone("b", key=False)  # neither encrypts towards the other (a migration)
    cluster.tell_everyone("a", key=False)
    await eventually(lambda: all(s.reconciles > before[name] + 1 for name, s in cluster.services.items()))
    assert service.dataplane is not None and not service.dataplane.guarded and _routes(a) == []
    received, report = await _pings_seen(cluster)
    assert received == [3, 3]
    assert report.plaintext  # in the clear, as named: the capture sees it
    assert await _dropped(cluster, "a") == 0


async def test_the_device_takes_the_pods_mtu_and_a_fabric_too_small_is_refused_closed(cluster: Cluster) -> None:
    a = cluster.world.a
    service = cluster.services["a"]
    notes: dict[str, str | None] = {}
    assert json.loads(a.ns.ip("-j", "link", "show", a.device.name))[0]["mtu"] == 1420  # 1500 less 80
    service.note = notes.__setitem__
    service.mtu = lambda: PodMtu(
        1280, "nodeconfig, less 80", "the fabric's MTU 1300 less 80 is 1220: encryption refused"
    )
    cluster.tell_everyone("b")  # a change: a reconcile
    await eventually(lambda: service.last_error is not None)
    assert "encryption refused" in (service.last_error or "") and "encryption refused" in (notes["wireguard"] or "")
    await a.device.delete()  # nothing brings it back while refused, and nothing leaves in the clear
    assert await _pings(cluster, 3, 0.3) == [0, 0] and await _dropped(cluster, "a") >= 6
    service.mtu = lambda: PodMtu(1360, "nodeconfig, less 80")
    await eventually(lambda: service.last_error is None and bool(_routes(a)), seconds=10)
    assert notes["wireguard"] is None
    assert json.loads(a.ns.ip("-j", "link", "show", a.device.name))[0]["mtu"] == 1360
    await _until_flowing(cluster)  # a new device: its first packets wait for the handshake
    assert await _pings(cluster) == [3, 3]


async def test_rotation_under_a_ping_stream_then_the_previous_key_forgotten(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """a rotates (flockctl wireguard rotate); b reads a's new key PUBLISH_S later, as if from a's NodeConfig
    status.  The stream's loss is stated and bounded (≤ 1 s); nothing in the clear; once b has shaken hands
    with the new key, a forgets the previous one."""
    a, b = cluster.world.a, cluster.world.b
    service = cluster.services["a"]
    count, interval, publish_s = 200, 0.01, 0.25
    capture = Capture.open(a.ns, a.veth)
    try:
        result: list[PingResult] = []
        async with trio.open_nursery() as nursery:

            async def stream() -> None:
                result.append(await trio.to_thread.run_sync(ping, a.ns, a.pod6, b.pod6, count, interval, 2))

            nursery.start_soon(stream)
            await trio.sleep(0.4)
            old = service.public_key
            keys = await service.rotate()
            assert keys.previous is not None and keys.previous.public_key == old
            await trio.sleep(publish_s)
            for other in cluster.services.values():  # what a's publisher and everyone's watch would do
                other.cluster.put_nodeconfig("a", NodeConfigWireGuard.read(cluster.nodeconfig("a")))
        report = inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    sent, received, max_ms = result[0]
    lost = sent - received
    print(
        f"rotation through the service: {lost} of {sent} pings lost at {interval * 1000:.0f} ms "
        f"({lost * interval:.2f} s), slowest answer {max_ms:.0f} ms, b learning the key {publish_s * 1000:.0f} ms later"
    )
    assert sent == count and lost * interval <= 1.0
    assert report.plaintext == [] and report.marker_seen == 0
    assert keys.public_key in (await b.device.show()).peers
    assert (await service.admin_status())["rotation_pending"] in (True, False)
    await _until_forgotten(service, 10)
    assert not (a.store.directory / "private.key.previous").exists()
    status = await service.admin_status()
    assert status["rotation_pending"] is False and status["public_key"] == keys.public_key.base64
    assert status["guard"]["counter"] == "plaintext-dropped" and status["peers"][0]["node"] == "b"
    # the private keys, old and new, nowhere in what flockctl shows or the log says
    records = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    for secret in (keys.current.reveal_base64(), keys.previous.reveal_base64()):
        assert secret not in json.dumps(status) and secret not in records
        assert secret not in read_text(cluster.world.wg_log)


async def test_a_peer_that_never_learns_the_new_key_does_not_block_the_next_rotation(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """a rotates and b never reads a's new key (a node down): no handshake with the new key, so the
    rotation stays pending — until ``forget_after``, when a forgets the previous key anyway, names b in
    a warning, and a second rotation is accepted."""
    service = cluster.services["a"]
    service.forget_after = 2.5
    await trio.sleep(1.1)  # the peers' first handshake a whole second before the rotation (wg's resolution)
    keys = await service.rotate()
    assert keys.previous is not None and (await service.admin_status())["rotation_pending"]
    await trio.sleep(1.2)
    assert (await service.admin_status())["rotation_pending"]  # b has not shaken hands: still pending
    await _until_forgotten(service, 5)
    assert not (cluster.world.a.store.directory / "private.key.previous").exists()
    (warning,) = [r for r in caplog.records if "have not shaken hands" in r.getMessage()]
    assert warning.nodes == ["b"]  # type: ignore[attr-defined]
    again = await service.rotate()
    assert again.previous is not None and again.previous.public_key == keys.public_key


async def test_switched_off_the_rules_routes_and_guard_go(cluster: Cluster) -> None:
    """a's agent restarted with ``--encryption off``: its rules to table 71, the routes in it and the
    guard table are removed (the device is left, idle), so a's pods reach b's over BIRD's route — in the
    clear, as a node without encryption does — instead of being dropped."""
    a, b = cluster.world.a, cluster.world.b
    assert await _pings(cluster) == [3, 3]
    cluster.scopes["a"].cancel()
    routes = DeviceRoutes(a.device.name, a.ns.path, tools=a.device.tools)
    nft = NftCommand(("ip", "netns", "exec", a.ns.name, "nft"))
    assert await nft.has_table(GUARD_TABLE) and await routes.live_rules() and await routes.live()
    await GuardRemoval(nft, routes).run()
    assert not await nft.has_table(GUARD_TABLE)
    assert await routes.live_rules() == [] and await routes.live() == [] and _routes(a) == []
    assert a.device.name not in a.ns.ip("-6", "route", "get", b.pod6, "from", a.pod6)
    received, report = await _pings_seen(cluster)
    assert received == [3, 3]
    assert report.plaintext, "switched off, a's pod traffic goes over BIRD's route in the clear"
    await GuardRemoval(nft, routes).run()  # again: nothing left to remove, no error


async def test_switching_a_running_cluster_on_node_by_node(cluster: Cluster) -> None:
    """``--allow-plaintext-to '*'``: b does not encrypt yet (its service stopped, switched off, no key
    published): a reaches b's pods in the clear and nothing is dropped.  b switches on and publishes its
    key: a peers with it and the traffic moves into the tunnel, nothing in the clear from then on."""
    a, b = cluster.world.a, cluster.world.b
    for service in cluster.services.values():
        service.settings = EncryptionSettings(PORT, 6, frozenset({UNKEYED}))
    cluster.scopes["b"].cancel()
    b_routes = DeviceRoutes(b.device.name, b.ns.path, tools=b.device.tools)
    await GuardRemoval(NftCommand(("ip", "netns", "exec", b.ns.name, "nft")), b_routes).run()
    await b.device.delete()
    updates = cluster.services["a"].peer_updates
    cluster.tell_everyone("b", key=False)
    await eventually(lambda: cluster.services["a"].peer_updates > updates and _routes(a) == [])
    dp = cluster.services["a"].dataplane
    assert dp is not None and not dp.guarded  # b has no key: reached in the clear, as '*' says
    received, report = await _pings_seen(cluster)
    assert received == [3, 3]
    assert report.plaintext and await _dropped(cluster, "a") == 0
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.services["b"].run)  # b's agent with encryption on
        await eventually(lambda: cluster.services["b"].device_key is not None, seconds=10)
        cluster.tell_everyone("b")  # its publisher's patch, as every agent's watch brings it
        await eventually(lambda: bool(_routes(a)), seconds=10)
        await _until_flowing(cluster)
        received, report = await _pings_seen(cluster)
        assert received == [3, 3]
        assert report.plaintext == [] and report.by_type.get(4, 0) >= 6
        dp = cluster.services["a"].dataplane
        assert dp is not None and dp.guarded == {ipaddress.ip_network(b.block6), ipaddress.ip_network(b.block4)}
        nursery.cancel_scope.cancel()
