"""``healthCheckNodePort``: what a load balancer asks each node about an ``externalTrafficPolicy:
Local`` Service, answered as kube-proxy answers it.

For each such Service the node listens on its health check port (every address, both
families) and answers ``GET`` with kube-proxy's JSON::

    {"service": {"namespace": "shop", "name": "web"}, "localEndpoints": 2, "serviceProxyHealthy": true}

200 while this node has a local endpoint (and the proxy has applied the Service), else 503; the
header ``X-Load-Balancing-Endpoint-Weight`` carries the count, as kube-proxy's does.  A load
balancer thus sends traffic only to nodes that keep the client's address and have somewhere to
deliver it.  Ports open and close as Services come and go (:meth:`HealthChecks.update`, called
with each applied table's ``health_checks``).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping

import attrs
import trio

from flock.netns import call_in_netns

from ._table import HealthCheck

log = logging.getLogger("flock.services")

REQUEST_LIMIT = 8192  # bytes of request head read before answering
REQUEST_TIMEOUT_S = 5.0


def health_answer(check: HealthCheck, healthy: bool = True) -> bytes:
    """The whole HTTP response for *check*."""
    body = json.dumps(
        {
            "service": {"namespace": check.namespace, "name": check.name},
            "localEndpoints": check.local_endpoints,
            "serviceProxyHealthy": healthy,
        }
    ).encode()
    ok = check.local_endpoints > 0 and healthy
    status = b"200 OK" if ok else b"503 Service Unavailable"
    head = (
        b"HTTP/1.1 " + status + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Content-Type-Options: nosniff\r\n"
        b"X-Load-Balancing-Endpoint-Weight: " + str(check.local_endpoints).encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n"
        b"Connection: close\r\n\r\n"
    )
    return head + body


def _listening_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too, as ::ffff:a.b.c.d
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.listen(64)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@attrs.define(eq=False)
class HealthChecks:
    """The health check ports of this node's eTP Local Services; a supervised service (``run``).

    *netns*: the node's network namespace (a path or name; None: this process's)."""

    netns: str | None = None
    checks: dict[int, HealthCheck] = attrs.field(factory=dict)
    _scopes: dict[int, trio.CancelScope] = attrs.field(init=False, factory=dict)
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)

    def update(self, checks: Mapping[int, HealthCheck]) -> None:
        """The ports and answers wanted now (an applied table's ``health_checks``)."""
        if dict(checks) != self.checks:
            self.checks = dict(checks)
            self._changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await self._sync()
                self._changed = trio.Event()
                await self._changed.wait()

    async def _sync(self) -> None:
        assert self._nursery is not None
        for port in [p for p in self._scopes if p not in self.checks]:
            self._scopes.pop(port).cancel()
        for port in [p for p in self.checks if p not in self._scopes]:
            try:
                sock = await trio.to_thread.run_sync(call_in_netns, self.netns, lambda p=port: _listening_socket(p))
            except OSError as exc:
                log.error("health check port %d: cannot listen: %s", port, exc, extra={"op": "services"})
                continue
            scope = trio.CancelScope()
            self._scopes[port] = scope
            self._nursery.start_soon(self._serve, port, trio.socket.from_stdlib_socket(sock), scope)

    async def _serve(self, port: int, sock: trio.socket.SocketType, scope: trio.CancelScope) -> None:
        with scope, sock:
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await sock.accept()
                    nursery.start_soon(self._answer, port, trio.SocketStream(conn))

    async def _answer(self, port: int, stream: trio.SocketStream) -> None:
        async with stream:
            head = b""
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                while b"\r\n\r\n" not in head and len(head) < REQUEST_LIMIT:
                    data = await stream.receive_some(REQUEST_LIMIT)
                    if not data:
                        break
                    head += data
            check = self.checks.get(port)
            if check is None or not head:
                return
            try:
                await stream.send_all(health_answer(check))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
