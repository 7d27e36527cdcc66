"""A node namespace with routed pod namespaces behind flock-named veths, and probes between them.

For the policy applier's root tests and benchmarks: a pod is a namespace whose
``eth0`` pairs with ``flock%08x`` in the node namespace, routed the way
flock.netlink does it (/128 and /32 host routes, ``fe80::1`` and
``169.254.1.1`` as gateways).  Pods serve TCP (echo per line) and UDP (echo)
on the ports asked for; :func:`probe` connects with a 1 s timeout.
Blocking; call from a thread or synchronous code.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import attrs

from flock.fnv import fnv1a_32
from flock.testing.netns import Netns, NetnsPool

SERVER = textwrap.dedent(
    """
    import selectors, socket, sys
    sel = selectors.DefaultSelector()
    for spec in sys.argv[1:]:
        port, proto = spec.split("/")
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", int(port)))
        if proto == "tcp":
            s.listen(64)
        sel.register(s, selectors.EVENT_READ, proto)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if key.data == "tcp":
                c, _ = s.accept()
                sel.register(c, selectors.EVENT_READ, "conn")
            elif key.data == "udp":
                data, addr = s.recvfrom(65535)
                s.sendto(data, addr)
            else:
                try:
                    data = s.recv(65535)
                except OSError:
                    data = b""
                if data:
                    s.sendall(data)
                else:
                    sel.unregister(s)
                    s.close()
    """
)

# Connect (TCP) or send+receive (UDP); exit 0 connected, 1 blocked/timeout.  With --hold, keep the TCP
# connection: each line on stdin is sent and its echo printed ("echo ok"/"echo lost").
CLIENT = textwrap.dedent(
    """
    import socket, sys
    addr, port, proto = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    hold = "--hold" in sys.argv
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.settimeout(1.0)
    try:
        if proto == "tcp":
            s.connect((addr, port))
        else:
            s.sendto(b"probe", (addr, port))
            s.recvfrom(100)
    except OSError:
        print("blocked", flush=True)
        sys.exit(1)
    print("connected", flush=True)
    if hold:
        for line in sys.stdin:
            try:
                s.sendall(line.encode())
                s.recv(100)
                print("echo ok", flush=True)
            except OSError:
                print("echo lost", flush=True)
    """
)


@attrs.frozen
class Pod:
    netns: Netns
    key: str  # "ns/name"
    veth: str
    ip6: str
    ip4: str


def veth_for(key: str) -> str:
    return f"flock{fnv1a_32(key):08x}"


@attrs.define(eq=False)
class PolicyNode:
    """One node namespace and its pods; everything lives in *pool* and goes with it."""

    pool: NetnsPool
    node: Netns = attrs.field(init=False)
    node_ip6: str = "2001:db8:ffff::1"
    node_ip4: str = "198.51.100.1"
    _servers: list[subprocess.Popen] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        self.node = self.pool.create("pnode")
        self.node.run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1")
        self.node.ip("addr", "add", f"{self.node_ip6}/128", "dev", "lo")
        self.node.ip("addr", "add", f"{self.node_ip4}/32", "dev", "lo")

    def add_pod(self, key: str, ip6: str, ip4: str, serve: tuple[str, ...] = ()) -> Pod:
        ns = self.pool.create("ppod")
        veth = veth_for(key)
        self.pool.veth(self.node, veth, ns, "eth0")
        self.node.ip("-6", "addr", "add", "fe80::1/64", "dev", veth, "nodad")
        self.node.ip("addr", "add", "169.254.1.1/32", "dev", veth)
        self.node.ip("-6", "route", "add", f"{ip6}/128", "dev", veth)
        self.node.ip("route", "add", f"{ip4}/32", "dev", veth)
        ns.ip("-6", "addr", "add", f"{ip6}/128", "dev", "eth0", "nodad")
        ns.ip("addr", "add", f"{ip4}/32", "dev", "eth0")
        ns.ip("-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0")
        ns.ip("route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
        ns.ip("route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
        if serve:
            self._start(ns, serve)
        return Pod(ns, key, veth, ip6, ip4)

    def serve(self, serve: tuple[str, ...]) -> None:
        """Serve *serve* ("80/tcp" …) on the node's own addresses (what a pod reaching its node meets)."""
        self._start(self.node, serve)

    def _start(self, ns: Netns, serve: tuple[str, ...]) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns.name, sys.executable, "-c", SERVER, *serve],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._servers.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"server in {ns.name} did not start")

    def close(self) -> None:
        for proc in self._servers:
            stop(proc)
        self._servers.clear()


def probe(src: Netns, addr: str, port: int, proto: str) -> bool:
    """Can *src* connect to addr:port/proto (tcp or udp) within 1 s?"""
    done = subprocess.run(
        ["ip", "netns", "exec", src.name, sys.executable, "-c", CLIENT, addr, str(port), proto],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return done.returncode == 0


def open_held(src: Netns, addr: str, port: int) -> subprocess.Popen:
    """A TCP connection kept open: write a line to its stdin, read "echo ok"/"echo lost" from stdout."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", src.name, sys.executable, "-c", CLIENT, addr, str(port), "tcp", "--hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if first != "connected":
        stop(proc)
        raise RuntimeError(f"held connection to {addr}:{port}: {first or 'no answer'}")
    return proc


def held_echo(proc: subprocess.Popen) -> bool:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("ping\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip() == "echo ok"


def stop(proc: subprocess.Popen) -> None:
    """Kill a server or held client and close its pipes."""
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
