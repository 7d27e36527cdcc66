"""Two nodes (network namespaces joined by a veth), each with a WireGuard device run by flock's device
layer over Debian's wireguard-go, routing the other's pod block through it.

Pod blocks are addresses on ``lo`` (this kernel has no dummy links): a = 2001:db8:1::1, 198.51.100.1;
b = 2001:db8:2::1, 198.51.100.129; the fabric is the veth, 2001:db8::1 and ::2 (192.0.2.1 and .2).
A Python AF_PACKET socket on a's veth sees every frame on the wire: only WireGuard's UDP may carry
anything to or from a pod block, and a marker sent in plaintext over TCP must never appear.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import signal
import stat
import time
from collections.abc import AsyncIterator, Iterator

import attrs
import pytest
import trio

from flock.logs import JsonFormatter
from flock.testing.wireguard import (
    MARKER,
    PORT,
    Capture,
    Node,
    PingResult,
    ToolsMissing,
    World,
    two_nodes,
)
from flock.testing.wireguard import alive as _alive
from flock.testing.wireguard import eventually as _eventually
from flock.testing.wireguard import inspect as _inspect
from flock.testing.wireguard import link_exists as _link_exists
from flock.testing.wireguard import ping as _ping
from flock.testing.wireguard import read_text as _read
from flock.testing.wireguard import tcp_exchange as _tcp_exchange
from flock.wireguard import (
    Change,
    DeviceChoice,
    DeviceKind,
    KernelWireGuardMissing,
    NotWireGuard,
    Peer,
    PrivateKey,
    WireGuardDevice,
    desired_peers,
)

pytestmark = pytest.mark.root
ip_address, ip_network = ipaddress.ip_address, ipaddress.ip_network


@pytest.fixture
def world(require_root: None, tmp_path, caplog: pytest.LogCaptureFixture) -> Iterator[World]:
    caplog.set_level(logging.DEBUG, logger="flock.wireguard")  # every record made (and checked for secrets)
    try:
        with two_nodes(tmp_path) as world:
            yield world
    except ToolsMissing as exc:
        pytest.fail(str(exc))


def _route_through(node: Node, other: Node) -> None:
    node.ns.ip("-6", "route", "replace", other.block6, "dev", node.device.name, "src", node.pod6)
    node.ns.ip("-4", "route", "replace", other.block4, "dev", node.device.name, "src", node.pod4)


async def _configure(node: Node, world: World, fabric_family: int = 6) -> Change:
    plan = desired_peers(node.name, [world.a.info(), world.b.info()], fabric_family=fabric_family, listen_port=PORT)
    assert plan.refusals == ()
    assert node.keys is not None
    return await node.device.configure(node.keys.current, PORT, plan.peer_list)


@contextlib.asynccontextmanager
async def open_tunnel(world: World) -> AsyncIterator[World]:
    """Both devices up, keyed, each with the other as its peer, the blocks routed through them;
    deleted on the way out (and their wireguard-go processes gone)."""
    for n in (world.a, world.b):
        n.keys = await trio.to_thread.run_sync(n.store.load_or_create)
        assert await n.device.ensure() == DeviceKind.USERSPACE  # no WireGuard in this kernel
    for n, other in ((world.a, world.b), (world.b, world.a)):
        _route_through(n, other)
        await _configure(n, world)
    try:
        yield world
    finally:
        pids = [await n.device.userspace_pid() for n in (world.a, world.b)]
        for n in (world.a, world.b):
            await n.device.delete()
        # wireguard-go exits once its TUN device is gone
        await _eventually(lambda: not any(pid is not None and _alive(pid) for pid in pids))


@pytest.fixture
async def tunnel(world: World) -> AsyncIterator[World]:
    async with open_tunnel(world):
        yield world


async def _traffic_both_families(world: World) -> None:
    a, b = world.a, world.b
    for src, dst in ((a.pod6, b.pod6), (a.pod4, b.pod4)):
        sent, received, _ = await trio.to_thread.run_sync(_ping, a.ns, src, dst)
        assert (sent, received) == (3, 3), f"ping {src} -> {dst}"
        payload = MARKER * 20
        echoed = await trio.to_thread.run_sync(_tcp_exchange, a.ns, b.ns, src, dst, payload)
        assert echoed == payload


# -- the tests ---------------------------------------------------------------------------------------


async def test_the_capture_sees_plaintext_without_the_tunnel(world: World) -> None:
    """The probe's own check: routed over the veth in the clear, the marker and the pings are seen."""
    a, b = world.a, world.b
    a.ns.ip("-6", "route", "add", b.block6, "via", b.fabric6, "src", a.pod6)
    b.ns.ip("-6", "route", "add", a.block6, "via", a.fabric6, "src", b.pod6)
    capture = Capture.open(a.ns, a.veth)
    try:
        assert (await trio.to_thread.run_sync(_ping, a.ns, a.pod6, b.pod6))[:2] == (3, 3)
        assert await trio.to_thread.run_sync(_tcp_exchange, a.ns, b.ns, a.pod6, b.pod6, MARKER) == MARKER
        report = _inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    assert report.marker_seen >= 2 and report.wireguard == 0
    assert sum("icmpv6 type 12" in p for p in report.plaintext) >= 6  # three echo requests (128), three replies (129)
    assert any("protocol 6" in p for p in report.plaintext)


async def test_pod_traffic_between_nodes_is_only_wireguard_on_the_wire(world: World) -> None:
    capture = Capture.open(world.a.ns, world.a.veth)
    try:
        async with open_tunnel(world):
            await _traffic_both_families(world)
            state_a = await world.a.device.show()
            report = _inspect(capture.frames(), [world.a.block6, world.a.block4, world.b.block6, world.b.block4])
    finally:
        capture.close()
    assert report.plaintext == [] and report.marker_seen == 0
    assert report.by_type.get(1, 0) >= 1 and report.by_type.get(2, 0) >= 1 and report.by_type[4] >= 12
    assert world.b.keys is not None
    peer = state_a.peers[world.b.keys.public_key]
    assert peer.allowed_ips == {ip_network(world.b.block6), ip_network(world.b.block4)}
    assert str(peer.endpoint) == f"[{world.b.fabric6}]:{PORT}"
    assert peer.latest_handshake is not None and peer.rx_bytes > 0 and peer.tx_bytes > 0


async def test_devices_adopted_and_the_kernel_choice_refused(tunnel: World) -> None:
    a = tunnel.a
    pid = await a.device.userspace_pid()
    assert pid is not None and _alive(pid)
    # an agent restart: a new device object adopts the running one, changes nothing, keeps the session
    before = await a.device.show()
    again = WireGuardDevice(a.device.name, a.ns.path, tools=a.device.tools)
    assert await again.ensure() == DeviceKind.USERSPACE and await again.userspace_pid() == pid
    assert a.keys is not None
    plan = desired_peers("a", [tunnel.a.info(), tunnel.b.info()], fabric_family=6, listen_port=PORT)
    assert not await again.configure(a.keys.current, PORT, plan.peer_list)
    assert (await again.show()).peers.keys() == before.peers.keys()
    # the kernel module asked for on this kernel: a clear error
    kernel = WireGuardDevice("fwk" + secrets.token_hex(3), a.ns.path, DeviceChoice.KERNEL)
    with pytest.raises(KernelWireGuardMissing, match="Unknown device type"):
        await kernel.ensure()
    # the same name from another namespace: its socket is served from a's namespace, refused
    other = WireGuardDevice(a.device.name, tunnel.b.ns.path, DeviceChoice.USERSPACE)
    with pytest.raises(NotWireGuard, match="another network namespace"):
        await other.ensure()
    assert await a.device.ensure() == DeviceKind.USERSPACE


async def test_private_key_never_in_argv_environment_or_log(tunnel: World, caplog: pytest.LogCaptureFixture) -> None:
    a, b = tunnel.a, tunnel.b
    assert a.keys is not None and b.keys is not None
    secret_texts = [n.keys.current.reveal_base64() for n in (a, b) if n.keys is not None]
    log = _read(tunnel.wg_log)
    assert " set " in log and "private-key /dev/stdin" in log
    for pid in [await n.device.userspace_pid() for n in (a, b)]:
        for what in ("cmdline", "environ"):
            log += _read(f"/proc/{pid}/{what}")
    formatter = JsonFormatter()
    records = [formatter.format(r) for r in caplog.records if r.name.startswith("flock.wireguard")]
    assert any("WireGuard device configured" in r for r in records) and any("key created" in r for r in records)
    log += "\n".join(records)
    for secret in secret_texts:
        assert secret not in log
    # the key files stay private
    for n in (a, b):
        assert stat.S_IMODE(os.stat(n.store.directory / "private.key").st_mode) == 0o600


async def test_a_peer_with_the_wrong_key_gets_nothing_through(tunnel: World) -> None:
    a, b = tunnel.a, tunnel.b
    assert a.keys is not None and b.keys is not None
    wrong = PrivateKey.generate().public_key
    peer = Peer(wrong, None, {ip_network(a.block6), ip_network(a.block4)})
    await b.device.configure(b.keys.current, PORT, [peer])  # b believes a's key is another
    capture = Capture.open(a.ns, a.veth)
    try:
        sent, received, _ = await trio.to_thread.run_sync(lambda: _ping(a.ns, a.pod6, b.pod6, 3, 0.05, 0.3))
        assert (sent, received) == (3, 0)
        with pytest.raises(OSError):
            await trio.to_thread.run_sync(_tcp_exchange, a.ns, b.ns, a.pod4, b.pod4, MARKER, 0.5)
        report = _inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    # a's data on its old session and its new handshakes, all WireGuard; b never answers one
    assert report.plaintext == [] and report.marker_seen == 0 and report.wireguard > 0 and 2 not in report.by_type
    state = await b.device.show()
    assert state.peers[wrong].latest_handshake is None and state.peers[wrong].rx_bytes == 0


async def test_reconcile_with_the_same_peers_keeps_the_session(tunnel: World) -> None:
    a, b = tunnel.a, tunnel.b
    assert a.keys is not None and b.keys is not None
    await _traffic_both_families(tunnel)
    before = (await a.device.show()).peers[b.keys.public_key]
    sets_before = _read(tunnel.wg_log).count(" set ")
    for n in (a, b):
        await _configure(n, tunnel)  # nothing changed: no wg set at all
    assert _read(tunnel.wg_log).count(" set ") == sets_before
    # an in-place change (one more block for b on a) is one wg set that leaves the session alone
    extra = ip_network("2001:db8:22::/64")
    plan = desired_peers("a", [a.info(), b.info()], fabric_family=6, listen_port=PORT)
    peers = [attrs.evolve(p, allowed_ips=p.allowed_ips | {extra}) for p in plan.peer_list]
    change = await a.device.configure(a.keys.current, PORT, peers)
    assert change.updated == (b.keys.public_key,) and not change.added and not change.removed
    await _traffic_both_families(tunnel)
    after = (await a.device.show()).peers[b.keys.public_key]
    assert after.latest_handshake == before.latest_handshake
    assert after.rx_bytes > before.rx_bytes and extra in after.allowed_ips


async def test_key_rotation_under_a_ping_stream(tunnel: World) -> None:
    """a rotates its key; b learns a's new key PUBLISH_S later (as if through the API): no plaintext,
    and the stream's loss and delay stated (wireguard-go holds what a sends while no session is up)."""
    a, b = tunnel.a, tunnel.b
    assert b.keys is not None
    capture = Capture.open(a.ns, a.veth)
    count, interval, publish_s = 150, 0.01, 0.25
    try:
        async with trio.open_nursery() as nursery:
            result: list[PingResult] = []

            async def stream() -> None:
                result.append(await trio.to_thread.run_sync(_ping, a.ns, a.pod6, b.pod6, count, interval, 2))

            nursery.start_soon(stream)
            await trio.sleep(0.4)  # the stream flows through the tunnel first
            old = a.keys
            a.keys = await trio.to_thread.run_sync(a.store.rotate)
            started = time.monotonic()
            await _configure(a, tunnel)  # a's device switches to the new key: b still expects the old
            await trio.sleep(publish_s)
            await _configure(b, tunnel)  # b's peer for a: old key removed, new key added, one wg set
            window = time.monotonic() - started
        report = _inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    sent, received, max_ms = result[0]
    lost = sent - received
    print(
        f"rotation: {lost} of {sent} pings lost at {interval * 1000:.0f} ms intervals ({lost * interval:.2f} s),"
        f" slowest answer {max_ms:.0f} ms, a's switch to b's update {window * 1000:.0f} ms"
    )
    assert sent == count and lost * interval <= 1.0
    assert report.plaintext == [] and report.marker_seen == 0
    state_b = await b.device.show()
    assert a.keys is not None and old is not None
    assert a.keys.public_key in state_b.peers and old.public_key not in state_b.peers
    assert a.keys.previous == old.current  # kept until told
    await _traffic_both_families(tunnel)


async def test_wireguard_go_gone_is_created_again(tunnel: World) -> None:
    a = tunnel.a
    pid = await a.device.userspace_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await _eventually(lambda: not _link_exists(a.ns, a.device.name))
    assert await a.device.userspace_pid() is None
    # the traffic has nowhere to go: the routes went with the interface (the next slice's nftables
    # rules keep it from leaving by another route)
    assert await a.device.ensure() == DeviceKind.USERSPACE
    assert await a.device.userspace_pid() not in (None, pid)
    _route_through(a, tunnel.b)
    await _configure(a, tunnel)
    await _traffic_both_families(tunnel)


async def test_an_ipv4_fabric(tunnel: World) -> None:
    """The same peers over the IPv4 node addresses: the endpoint changes in place, the rest holds."""
    a, b = tunnel.a, tunnel.b
    assert b.keys is not None
    capture = Capture.open(a.ns, a.veth)
    try:
        changes = [await _configure(n, tunnel, fabric_family=4) for n in (a, b)]
        await _traffic_both_families(tunnel)
        report = _inspect(capture.frames(), [a.block6, a.block4, b.block6, b.block4])
    finally:
        capture.close()
    assert [(len(c.updated), c.added, c.removed) for c in changes] == [(1, (), ()), (1, (), ())]
    assert report.plaintext == [] and report.marker_seen == 0 and report.by_type[4] >= 12
    assert str((await a.device.show()).peers[b.keys.public_key].endpoint) == f"{b.fabric4}:{PORT}"
