"""The lab pod's server: every declared port answered, on IPv6 and IPv4.

``flock-lab pod add … --port 80/TCP --port 81/UDP`` starts this inside the
pod's network namespace (``ip netns exec``), as a container would run::

    python -m flock.lab._serve --name x/a --ready FILE --tcp 80 --udp 81

A TCP port accepts and answers the pod's name and, on a second line, the
address the connection came from as this end sees it (``x/a\\n192.0.2.11\\n``:
what a NAT on the way made of the peer), then closes; a UDP port echoes every
datagram to its sender followed by the same two lines (``<datagram>\\nx/a\\n192.0.2.11\\n``),
so a probe through a Service learns which pod answered.  Each socket is one dual-stack
IPv6 socket (``IPV6_V6ONLY`` off), so IPv4 peers reach it as mapped
addresses.  It writes *FILE* once every socket is bound, and exits 0 on
SIGTERM.  Standard library only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import selectors
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path


def _bound(kind: int, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, kind)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    if kind == socket.SOCK_STREAM:
        sock.listen(128)
    sock.setblocking(False)
    return sock


def unmapped(address: str) -> str:
    """An IPv4 peer of a dual-stack socket as IPv4 (``::ffff:192.0.2.11`` → ``192.0.2.11``)."""
    ip = ipaddress.ip_address(address)
    return str(ip.ipv4_mapped) if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else str(ip)


def serve(name: str, tcp: Sequence[int], udp: Sequence[int], ready: Path | None) -> int:
    selector = selectors.DefaultSelector()
    for port in tcp:
        selector.register(_bound(socket.SOCK_STREAM, port), selectors.EVENT_READ, "tcp")
    for port in udp:
        selector.register(_bound(socket.SOCK_DGRAM, port), selectors.EVENT_READ, "udp")
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    selector.register(stop_r, selectors.EVENT_READ, "stop")
    if ready is not None:
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(f"{os.getpid()}\n")
        os.replace(tmp, ready)
    while True:
        for key, _ in selector.select():
            if key.data == "stop":
                return 0
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if key.data == "tcp":
                    conn, peer = sock.accept()
                    with conn:
                        conn.setblocking(False)
                        try:
                            conn.send(f"{name}\n{unmapped(peer[0])}\n".encode())
                        except OSError:
                            pass  # the prober only needs the handshake; it may be gone already
                else:
                    data, peer = sock.recvfrom(65535)
                    sock.sendto(data + f"\n{name}\n{unmapped(peer[0])}\n".encode(), peer)
            except (BlockingIOError, InterruptedError, ConnectionError):
                continue


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flock.lab._serve", description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="what a TCP connection is answered with (the pod's NS/NAME)")
    p.add_argument("--tcp", type=int, action="append", default=[], metavar="PORT")
    p.add_argument("--udp", type=int, action="append", default=[], metavar="PORT")
    p.add_argument("--ready", type=Path, help="written once every port is bound")
    args = p.parse_args(argv)
    try:
        return serve(args.name, args.tcp, args.udp, args.ready)
    except OSError as exc:
        print(f"flock-lab serve {args.name}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
