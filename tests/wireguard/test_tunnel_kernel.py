"""Two nodes (network namespaces joined by a veth), each with a WireGuard device run by flock's device
layer over Debian's wireguard-go, routing the other's pod block through it.

Pod blocks are addresses on ``lo`` (this kernel has no dummy links): a = 2001:db8:1::1, 198.51.100.1;
b = 2001:db8:2::1, 198.51.100.129; the fabric is the veth, 2001:db8::1 and ::2 (192.0.2.1 and .2).
A Python AF_PACKET socket on a's veth sees every frame on the wire: only WireGuard's UDP may carry
anything to or from a pod block, and a marker sent in plaintext over TCP must never appear.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import os
import secrets
import signal
import socket
import stat
import struct
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import NamedTuple

import attrs
import pytest
import trio

from flock.logs import JsonFormatter
from flock.netns import call_in_netns
from flock.testing.netns import Netns, NetnsPool
from flock.wireguard import (
    Change,
    DeviceChoice,
    DeviceKind,
    KernelWireGuardMissing,
    KeyStore,
    NodeKey,
    NodeWireGuard,
    NotWireGuard,
    Peer,
    PrivateKey,
    Tools,
    WireGuardDevice,
    desired_peers,
)

pytestmark = pytest.mark.root

PORT = 51820
MARKER = b"flock-plaintext-marker-" + secrets.token_hex(4).encode()
ip_address, ip_network = ipaddress.ip_address, ipaddress.ip_network


@attrs.define
class Node:
    name: str
    ns: Netns
    veth: str
    fabric6: str
    fabric4: str
    pod6: str  # the pod block's one address (on lo)
    pod4: str
    block6: str
    block4: str
    store: KeyStore
    device: WireGuardDevice
    keys: NodeKey | None = None

    def info(self) -> NodeWireGuard:
        assert self.keys is not None
        return NodeWireGuard(
            self.name,
            self.keys.public_key,
            (ip_address(self.fabric6), ip_address(self.fabric4)),
            (ip_network(self.block6), ip_network(self.block4)),
        )


@attrs.define
class World:
    a: Node
    b: Node
    wg_log: str  # every argv the wg wrapper ran, one per line


def _wireguard_go_pids_in(ns: Netns) -> list[int]:
    """wireguard-go processes whose network namespace is *ns* (a safety net: deleting the namespace
    does not stop them, since they hold it)."""
    target = os.stat(ns.path)
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink(f"/proc/{pid}/exe").endswith("wireguard-go"):
                st = os.stat(f"/proc/{pid}/ns/net")
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture
def world(require_root: None, tmp_path, caplog: pytest.LogCaptureFixture) -> Iterator[World]:
    caplog.set_level(logging.DEBUG, logger="flock.wireguard")  # every record made (and checked for secrets)
    missing = Tools().missing(DeviceChoice.USERSPACE)
    if missing:
        pytest.fail("missing: " + ", ".join(missing) + " (scripts/bootstrap installs them)")
    # wg through a wrapper that records its argv and environment as the kernel shows them (/proc/self)
    wg_log = tmp_path / "wg.log"
    wrapper = tmp_path / "wg"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"{{ tr '\\0' ' ' < /proc/$$/cmdline; echo; tr '\\0' ' ' < /proc/$$/environ; echo; }} >> {wg_log}\n"
        f'exec {Tools().wg if "/" in Tools().wg else "/usr/bin/wg"} "$@"\n'
    )
    wrapper.chmod(0o755)
    wg_log.touch()
    tools = Tools(wg=str(wrapper))
    tag = secrets.token_hex(3)
    with NetnsPool("fl-wg-") as pool:
        nodes = []
        for name, i, veth in (("a", 1, "fab-a"), ("b", 2, "fab-b")):
            ns = pool.create(name)
            block4 = "198.51.100.0/25" if i == 1 else "198.51.100.128/25"
            pod4 = "198.51.100.1" if i == 1 else "198.51.100.129"
            device = WireGuardDevice(f"fw{name}{tag}", ns.path, DeviceChoice.AUTO, mtu=1420, tools=tools)
            store = KeyStore(tmp_path / f"keys-{name}")
            nodes.append(
                Node(
                    name,
                    ns,
                    veth,
                    f"2001:db8::{i}",
                    f"192.0.2.{i}",
                    f"2001:db8:{i}::1",
                    pod4,
                    f"2001:db8:{i}::/64",
                    block4,
                    store,
                    device,
                )
            )
        a, b = nodes
        pool.veth(a.ns, a.veth, b.ns, b.veth)
        for n in nodes:
            n.ns.ip("addr", "add", f"{n.fabric6}/64", "dev", n.veth, "nodad")
            n.ns.ip("addr", "add", f"{n.fabric4}/24", "dev", n.veth)
            n.ns.ip("addr", "add", f"{n.pod6}/128", "dev", "lo")
            n.ns.ip("addr", "add", f"{n.pod4}/32", "dev", "lo")
        for fabric in (b.fabric6, b.fabric4):  # neighbours resolved from the fabric addresses first
            assert _ping(a.ns, a.fabric6 if ":" in fabric else a.fabric4, fabric, 1)[:2] == (1, 1)
        try:
            yield World(a, b, str(wg_log))
        finally:
            for n in nodes:
                for pid in _wireguard_go_pids_in(n.ns):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(n.device.socket_path)


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


async def _eventually(condition: Callable[[], bool], seconds: float = 5) -> None:
    """Poll *condition* (a kernel or a process changing: no event to wait on) for at most *seconds*."""
    with trio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.02)


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def _link_exists(ns: Netns, name: str) -> bool:
    return subprocess.run(["ip", "-n", ns.name, "link", "show", name], capture_output=True).returncode == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


# -- traffic and the wire ---------------------------------------------------------------------------


class PingResult(NamedTuple):
    sent: int
    received: int
    max_ms: float  # the slowest answer (0: none)


def _ping(ns: Netns, src: str, dst: str, count: int = 3, interval: float = 0.05, wait: float = 1) -> PingResult:
    proc = ns.run(
        "ping", "-n", "-q", "-c", str(count), "-i", str(interval), "-W", str(wait), "-I", src, dst, check=False
    )
    sent = received = None
    max_ms = 0.0
    for line in proc.stdout.splitlines():
        if "transmitted" in line:
            parts = line.split()
            sent, received = int(parts[0]), int(parts[3])
        elif line.startswith("rtt"):
            max_ms = float(line.split("=")[1].split("/")[2])
    if sent is None or received is None:
        raise AssertionError(f"ping {dst}: {proc.stdout} {proc.stderr}")
    return PingResult(sent, received, max_ms)


def _tcp_exchange(client_ns: Netns, server_ns: Netns, src: str, dst: str, payload: bytes, timeout: float = 3) -> bytes:
    """*payload* sent over TCP from *src* (in *client_ns*) to *dst* (in *server_ns*) and echoed back."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    server = call_in_netns(server_ns.path, lambda: socket.socket(family, socket.SOCK_STREAM))
    client = call_in_netns(client_ns.path, lambda: socket.socket(family, socket.SOCK_STREAM))
    with server, client:
        server.bind((dst, 0))
        server.listen(1)
        client.settimeout(timeout)
        server.settimeout(timeout)
        client.bind((src, 0))
        client.connect((dst, server.getsockname()[1]))
        conn, _ = server.accept()
        with conn:
            conn.settimeout(timeout)
            client.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += conn.recv(4096)
            conn.sendall(got)
        back = b""
        while len(back) < len(payload):
            back += client.recv(4096)
        return back


@attrs.define
class Capture:
    """Every frame on one interface (both directions), through an AF_PACKET socket in its namespace."""

    sock: socket.socket

    @classmethod
    def open(cls, ns: Netns, ifname: str) -> Capture:
        sock = call_in_netns(ns.path, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.bind((ifname, 0))
        sock.setblocking(False)
        return cls(sock)

    def frames(self) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536))
            except BlockingIOError:
                return out

    def close(self) -> None:
        self.sock.close()


@attrs.frozen
class WireReport:
    wireguard: int  # UDP datagrams of WireGuard's message types to or from PORT
    by_type: dict[int, int]  # WireGuard message type → count (1, 2: handshake; 3: cookie; 4: data)
    control: int  # ARP and ICMPv6 neighbour discovery between node addresses
    plaintext: list[str]  # anything else: a leak (what, source, destination)
    marker_seen: int


def _inspect(frames: list[bytes], blocks: list[str]) -> WireReport:
    nets = [ip_network(b) for b in blocks]
    wg = control = marker = 0
    by_type: collections.Counter[int] = collections.Counter()
    plaintext: list[str] = []
    for frame in frames:
        if MARKER in frame:
            marker += 1
        ethertype = struct.unpack("!H", frame[12:14])[0]
        if ethertype == 0x0806:
            control += 1
            continue
        if ethertype == 0x0800:
            ihl = (frame[14] & 0x0F) * 4
            proto, src, dst = frame[23], ip_address(frame[26:30]), ip_address(frame[30:34])
            payload = frame[14 + ihl :]
        elif ethertype == 0x86DD:
            proto, src, dst = frame[20], ip_address(frame[22:38]), ip_address(frame[38:54])
            payload = frame[54:]
            while proto in (0, 43, 60) and len(payload) >= 8:  # hop-by-hop (MLD's router alert), routing, options
                proto, payload = payload[0], payload[(payload[1] + 1) * 8 :]
        else:
            plaintext.append(f"ethertype {ethertype:#06x}")
            continue
        in_block = any(src in n or dst in n for n in nets)
        if proto == 17 and not in_block and PORT in struct.unpack("!HH", payload[:4]):
            kind = payload[8]
            if 1 <= kind <= 4 and payload[9:12] == b"\0\0\0":
                wg += 1
                by_type[kind] += 1
                continue
        if proto == 58 and not in_block and payload[0] in (133, 134, 135, 136, 143):
            control += 1
            continue
        if not in_block and _wireguard_unreachable(proto, payload):
            control += 1  # a node's port not yet open: the error quotes a WireGuard datagram
            continue
        what = f"icmpv6 type {payload[0]}" if proto == 58 else f"protocol {proto}"
        plaintext.append(f"{what} {src} -> {dst}")
    return WireReport(wg, dict(by_type), control, plaintext, marker)


def _wireguard_unreachable(proto: int, payload: bytes) -> bool:
    """An ICMP(v6) destination unreachable about a UDP datagram to or from the WireGuard port."""
    if proto == 58 and payload[:1] == b"\x01" and len(payload) >= 52 and payload[8 + 6] == 17:
        udp = payload[48:52]
    elif proto == 1 and payload[:1] == b"\x03" and len(payload) >= 28 and payload[8 + 9] == 17:
        udp = payload[8 + (payload[8] & 0x0F) * 4 :][:4]
    else:
        return False
    return len(udp) == 4 and PORT in struct.unpack("!HH", udp)


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
