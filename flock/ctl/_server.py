"""The admin socket: a unix socket (0600, root's), one JSON request and one JSON reply per connection.

Never on the network.  Each connection is confined: garbage, a silent or
flooding client, an op that fails or overruns its deadline gets an error
reply (where it can still be heard) and a log line, never the agent.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.rpc.server import PrivateSocket

from ._ops import AdminOps, OpRefused, Peer
from ._protocol import ADMIN_PROTOCOL_VERSION, MAX_REQUEST_BYTES, OPS, encode

log = logging.getLogger("flock.ctl")

READ_DEADLINE_S = 5.0
OP_DEADLINE_S = 60.0
MAX_CONNECTIONS = 8  # flockctl is run by people and scripts, not by the kubelet


def peer_of(sock: trio.socket.SocketType) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def _error(error: str, details: str = "") -> bytes:
    return encode({"ok": False, "error": error, "details": details})


@attrs.define(eq=False)
class AdminServer:
    """Serves :class:`AdminOps` on *path* (supervised child "admin")."""

    path: Path = attrs.field(converter=Path)
    ops: AdminOps
    read_deadline: float = READ_DEADLINE_S
    op_deadline: float = OP_DEADLINE_S
    _limit: trio.CapacityLimiter = attrs.field(init=False, factory=lambda: trio.CapacityLimiter(MAX_CONNECTIONS))
    _socket: PrivateSocket = attrs.field(init=False)

    @_socket.default
    def _private_socket(self) -> PrivateSocket:
        return PrivateSocket(self.path, backlog=16, tighten_directory=False)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.ops.forget_leftovers()
        listener = await self._socket.listen()
        try:
            task_status.started()
            log.info("admin socket listening", extra={"socket": str(self.path)})
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await listener.accept()
                    nursery.start_soon(self._serve, conn)
        finally:
            listener.close()
            self._socket.remove()

    async def _serve(self, conn: trio.socket.SocketType) -> None:
        async with self._limit:
            try:
                peer = peer_of(conn)
            except OSError:
                peer = Peer(pid=0, uid=-1, gid=-1)
            async with trio.SocketStream(conn) as stream:
                try:
                    reply = await self._answer(stream, peer)
                    with trio.move_on_after(self.read_deadline):
                        await stream.send_all(reply)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    log.debug("admin client went away")

    async def _answer(self, stream: trio.SocketStream, peer: Peer) -> bytes:
        buf = b""
        with trio.move_on_after(self.read_deadline):
            while b"\n" not in buf and len(buf) <= MAX_REQUEST_BYTES:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                buf += chunk
        line = buf.partition(b"\n")[0]
        if len(line) > MAX_REQUEST_BYTES:
            return _error("request too large", f"more than {MAX_REQUEST_BYTES} bytes")
        try:
            request: Any = json.loads(line)
        except ValueError:
            return _error("bad request", "expected one line of JSON")
        if not isinstance(request, dict):
            return _error("bad request", "expected a JSON object")
        if request.get("version") != ADMIN_PROTOCOL_VERSION:
            return _error(
                "incompatible admin protocol",
                f"version={str(request.get('version'))[:16]!r}; this agent speaks {ADMIN_PROTOCOL_VERSION}",
            )
        op = request.get("op")
        if op not in OPS:
            return _error("unknown op", f"op={str(op)[:32]!r}; expected one of {', '.join(OPS)}")
        fields = {"op": f"admin {op}", "peer_uid": peer.uid, "peer_pid": peer.pid}
        with trio.move_on_after(self.op_deadline):
            try:
                result = await self.ops.dispatch(op, request, peer)
            except OpRefused as exc:
                log.info("admin op refused", extra={**fields, "error": exc.error, "details": exc.details})
                return _error(exc.error, exc.details)
            except Exception as exc:
                log.exception("admin op failed", extra=fields)
                return _error("internal error in flock-agent", repr(exc)[:500])
            log.debug("admin op served", extra=fields)
            return encode({"ok": True, "result": result})
        return _error("timed out", f"op {op} did not finish within {self.op_deadline:g} s")
