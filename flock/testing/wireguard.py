"""Two nodes for WireGuard tests: network namespaces joined by a veth, a WireGuard device each (run by
flock's device layer over Debian's wireguard-go), and what checks the wire.

Pod blocks are addresses on ``lo`` (this kernel has no dummy links): a = 2001:db8:1::1, 198.51.100.1;
b = 2001:db8:2::1, 198.51.100.129; the fabric is the veth, 2001:db8::1 and ::2 (192.0.2.1 and .2).
A Python AF_PACKET socket (:class:`Capture`) on a veth sees every frame on the wire; :func:`inspect`
sorts them into WireGuard, neighbour discovery and plaintext.  Used by tests/wireguard (root).
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import struct
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import attrs
import trio

from flock.netns import call_in_netns
from flock.testing.netns import Netns, NetnsPool
from flock.wireguard import DeviceChoice, KeyStore, NodeKey, NodeWireGuard, Tools, WireGuardDevice

PORT = 51820
MARKER = b"flock-plaintext-marker-" + secrets.token_hex(4).encode()
ip_address, ip_network = ipaddress.ip_address, ipaddress.ip_network


class ToolsMissing(RuntimeError):
    """wg or wireguard-go is not installed (the message names the Debian packages)."""


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


def wireguard_go_pids_in(ns: Netns) -> list[int]:
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


@contextlib.contextmanager
def two_nodes(tmp_path: Path) -> Iterator[World]:
    """Nodes a and b, their fabric addressed and their neighbours resolved; wireguard-go processes in their
    namespaces killed on the way out.  Tools are not checked here: see :class:`ToolsMissing`."""
    missing = Tools().missing(DeviceChoice.USERSPACE)
    if missing:
        raise ToolsMissing("missing: " + ", ".join(missing) + " (scripts/bootstrap installs them)")
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
            assert ping(a.ns, a.fabric6 if ":" in fabric else a.fabric4, fabric, 1)[:2] == (1, 1)
        try:
            yield World(a, b, str(wg_log))
        finally:
            for n in nodes:
                for pid in wireguard_go_pids_in(n.ns):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(n.device.socket_path)


async def eventually(condition: Callable[[], bool], seconds: float = 5) -> None:
    """Poll *condition* (a kernel or a process changing: no event to wait on) for at most *seconds*."""
    with trio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.02)


def read_text(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def link_exists(ns: Netns, name: str) -> bool:
    return subprocess.run(["ip", "-n", ns.name, "link", "show", name], capture_output=True).returncode == 0


def alive(pid: int) -> bool:
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


def ping(ns: Netns, src: str, dst: str, count: int = 3, interval: float = 0.05, wait: float = 1) -> PingResult:
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


def tcp_exchange(client_ns: Netns, server_ns: Netns, src: str, dst: str, payload: bytes, timeout: float = 3) -> bytes:
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
    def open(cls, ns: Netns | str, ifname: str) -> Capture:
        """On *ifname* of *ns* (a test's namespace, or a namespace's name or path)."""
        where = ns.path if isinstance(ns, Netns) else ns
        sock = call_in_netns(where, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)))
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


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpPacket = tuple[int, IpAddress, IpAddress, bytes]


def ip_packet(frame: bytes) -> IpPacket | int:
    """An Ethernet frame's IP packet as (protocol, source, destination, payload) — IPv6's hop-by-hop, routing
    and destination options skipped — or the ethertype of a frame that is not IP."""
    ethertype = struct.unpack("!H", frame[12:14])[0]
    if ethertype == 0x0800:
        ihl = (frame[14] & 0x0F) * 4
        return frame[23], ip_address(frame[26:30]), ip_address(frame[30:34]), frame[14 + ihl :]
    if ethertype == 0x86DD:
        proto, payload = frame[20], frame[54:]
        while proto in (0, 43, 60) and len(payload) >= 8:  # hop-by-hop (MLD's router alert), routing, options
            proto, payload = payload[0], payload[(payload[1] + 1) * 8 :]
        return proto, ip_address(frame[22:38]), ip_address(frame[38:54]), payload
    return ethertype


def wireguard_message(proto: int, payload: bytes, port: int = PORT) -> int | None:
    """The WireGuard message type (1, 2: handshake; 3: cookie; 4: data) of a UDP datagram to or from *port*."""
    if proto == 17 and len(payload) >= 12 and port in struct.unpack("!HH", payload[:4]):
        kind = payload[8]
        if 1 <= kind <= 4 and payload[9:12] == b"\0\0\0":
            return kind
    return None


def inspect(frames: list[bytes], blocks: list[str]) -> WireReport:
    nets = [ip_network(b) for b in blocks]
    wg = control = marker = 0
    by_type: collections.Counter[int] = collections.Counter()
    plaintext: list[str] = []
    for frame in frames:
        if MARKER in frame:
            marker += 1
        packet = ip_packet(frame)
        if isinstance(packet, int):
            if packet == 0x0806:
                control += 1
            else:
                plaintext.append(f"ethertype {packet:#06x}")
            continue
        proto, src, dst, payload = packet
        in_block = any(src in n or dst in n for n in nets)
        kind = wireguard_message(proto, payload)
        if kind is not None and not in_block:
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


@attrs.define
class WireTally:
    """What crossed a lab's fabric link, sorted as it arrives (a stream is too long to keep every frame):
    pod ↔ pod packets of two nodes in the clear (*plaintext*, the first few kept as text), WireGuard
    datagrams by message type, and node ↔ pod packets (node traffic: outside the tunnel by design)."""

    pod_blocks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]  # every node's, each node's own apart
    plaintext: int = 0
    plaintext_by_family: collections.Counter[int] = attrs.field(factory=collections.Counter)
    samples: list[str] = attrs.field(factory=list)
    wireguard: collections.Counter[int] = attrs.field(factory=collections.Counter)
    node_pod: int = 0
    frames: int = 0

    def block_of(self, address: IpAddress) -> int | None:
        for i, block in enumerate(self.pod_blocks):
            if address.version == block.version and address in block:
                return i
        return None

    def add(self, frame: bytes) -> None:
        self.frames += 1
        packet = ip_packet(frame)
        if isinstance(packet, int):
            return
        proto, src, dst, payload = packet
        kind = wireguard_message(proto, payload)
        if kind is not None:
            self.wireguard[kind] += 1
            return
        ends = self.block_of(src), self.block_of(dst)
        if None not in ends:
            self.plaintext += 1
            self.plaintext_by_family[src.version] += 1
            if len(self.samples) < 10:
                self.samples.append(f"protocol {proto} {src} -> {dst}")
        elif ends != (None, None):
            self.node_pod += 1

    def summary(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "plaintext_pod_to_pod": self.plaintext,
            "by_family": dict(self.plaintext_by_family),
            "samples": self.samples,
            "wireguard_by_type": dict(self.wireguard),
            "node_pod": self.node_pod,
        }


@contextlib.asynccontextmanager
async def tap(netns: str, ifname: str, pod_blocks: list[str]) -> AsyncIterator[WireTally]:
    """Every frame on *ifname* in *netns* (both directions), tallied while the block runs (AF_PACKET)."""
    tally = WireTally([ip_network(b) for b in pod_blocks])
    capture = Capture.open(netns, ifname)

    def drain() -> None:
        for frame in capture.frames():
            tally.add(frame)

    async def read() -> None:
        while True:
            await trio.lowlevel.wait_readable(capture.sock)
            drain()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            yield tally
            await trio.sleep(0.2)  # the last frames of what the block sent
            drain()
            nursery.cancel_scope.cancel()
    finally:
        capture.close()
