"""A tiny HTTP/1.0 responder for /healthz, /readyz and /metrics (kubelet probes, Prometheus).

Only GET (and HEAD) of those three paths; every connection gets one answer
and is closed.  Trio sockets directly: no web framework on the Trio side.
"""

from __future__ import annotations

import logging
from typing import Protocol

import attrs
import trio

from flock.health._metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("flock.health")

# A probe that does not send its request line within this is dropped.
READ_DEADLINE_S = 2.0
MAX_REQUEST_BYTES = 8192


class Readiness(Protocol):
    """What /readyz reports (the agent's :class:`flock.state.NodeState`)."""

    def not_ready(self) -> list[str]:
        """What is not ready yet; empty when ready."""
        ...

    def notes(self) -> list[str]:
        """Degraded states that do not stop ADD."""
        ...


@attrs.frozen
class _Reply:
    status: str
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


@attrs.define(eq=False)
class HealthServer:
    """Serves on *host*:*port* (port 0: any; see :attr:`port` once started).

    ``/healthz``: 200 while the tree runs (the server is part of it).
    ``/readyz``: 200 when ``readiness.not_ready()`` lists nothing, else 503
    with the list; either way followed by ``readiness.notes()``: degraded
    states that do not stop ADD.
    ``/metrics``: the Prometheus text format of ``metrics``' registry.
    Error handling: a bad or slow client only loses its own connection;
    failing to bind propagates to the supervisor.
    """

    host: str
    port: int
    readiness: Readiness
    metrics: Metrics
    bound_port: int | None = attrs.field(init=False, default=None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.bound_port = listeners[0].socket.getsockname()[1]
        log.info("health server listening", extra={"address": f"{self.host}:{self.bound_port}"})
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._serve, listeners)
                task_status.started()
        finally:
            self.bound_port = None

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.move_on_after(READ_DEADLINE_S):
                    data = b""
                    while b"\r\n\r\n" not in data and b"\n\n" not in data and len(data) < MAX_REQUEST_BYTES:
                        chunk = await stream.receive_some(4096)
                        if not chunk:
                            break
                        data += chunk
                    reply, head = self._answer(data)
                    payload = reply.body
                    header = (
                        f"HTTP/1.0 {reply.status}\r\nContent-Type: {reply.content_type}\r\n"
                        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                    ).encode()
                    await stream.send_all(header + (b"" if head else payload))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def _answer(self, data: bytes) -> tuple[_Reply, bool]:
        parts = data.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _Reply("400 Bad Request", b"expected an HTTP request line\n"), False
        method, target = parts[0].decode("latin-1"), parts[1].decode("latin-1").split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _Reply("405 Method Not Allowed", f"{method} is not supported\n".encode()), False
        head = method == "HEAD"
        if target == "/healthz":
            return _Reply("200 OK", b"ok\n"), head
        if target == "/readyz":
            missing, notes = self.readiness.not_ready(), self.readiness.notes()
            noted = "notes:\n" + "".join(f"- {n}\n" for n in notes) if notes else ""
            if missing:
                body = "not ready:\n" + "".join(f"- {m}\n" for m in missing) + noted
                return _Reply("503 Service Unavailable", body.encode()), head
            return _Reply("200 OK", ("ready\n" + noted).encode()), head
        if target == "/metrics":
            return _Reply("200 OK", self.metrics.exposition(), CONTENT_TYPE), head
        return _Reply("404 Not Found", f"no such path {target}; try /healthz, /readyz or /metrics\n".encode()), head
