"""Talking into the lab's namespaces from the host: commands, TCP and HTTP.

Commands run under ``nsenter --net`` (network namespace only, as a container
runtime runs a CNI plugin on its node).  A TCP connection into a namespace is
made on a fresh OS thread that enters the namespace, creates and connects the
socket and ends (:func:`flock.netns.call_in_netns`), so no thread that other
work reuses ever changes namespace; the socket keeps its namespace wherever it
is used afterwards.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from flock.netns import call_in_netns

NETNS_DIR = "/run/netns"


def netns_path(name: str) -> str:
    return f"{NETNS_DIR}/{name}"


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """*argv* run inside *netns* (a name under /run/netns), network namespace only."""
    return ["nsenter", f"--net={netns_path(netns)}", "--", *argv]


async def run_in(
    netns: str, argv: Sequence[str], *, stdin: bytes = b"", env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run *argv* in *netns* to completion; a non-zero exit is returned, not raised."""
    return await trio.run_process(
        in_netns(netns, argv), stdin=stdin, env=env, capture_stdout=True, capture_stderr=True, check=False
    )


def connect_in(netns: str, host: str, port: int, connect_timeout: float) -> socket.socket:
    """A TCP socket connected to host:port from inside *netns* (blocking)."""
    return call_in_netns(netns, lambda: socket.create_connection((host, port), timeout=connect_timeout))


def socket_in(netns: str, family: int, kind: int) -> socket.socket:
    """A new non-blocking socket of *netns* (blocking call; the socket stays in *netns* wherever it is used)."""

    def make() -> socket.socket:
        sock = socket.socket(family, kind)
        sock.setblocking(False)
        return sock

    return call_in_netns(netns, make)


def http_in(
    netns: str,
    host: str,
    port: int,
    method: str,
    path: str,
    body: Any = None,
    io_timeout: float = 5.0,
    content_type: str = "application/json",
) -> tuple[int, bytes]:
    """One HTTP/1.1 request from inside *netns*; (status, body). Blocking."""
    sock = connect_in(netns, host, port, io_timeout)
    conn = http.client.HTTPConnection(host, port, timeout=io_timeout)
    conn.sock = sock
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = (
            {"Content-Type": content_type, "Accept": "application/json"}
            if payload is not None
            else {"Accept": "application/json"}
        )
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()
