"""The admin socket: a unix socket (0600, root's), one JSON request and one JSON reply per connection.

Never on the network.  Each connection is confined: garbage, a silent or
flooding client, an op that fails or overruns its deadline gets an error
reply (where it can still be heard) and a log line, never the agent.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.rpc.server import SocketInUse

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
    _inode: tuple[int, int] | None = attrs.field(init=False, default=None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listener = await self._listen()
        try:
            task_status.started()
            log.info("admin socket listening", extra={"socket": str(self.path)})
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await listener.accept()
                    nursery.start_soon(self._serve, conn)
        finally:
            listener.close()
            self._remove()

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

    async def _listen(self) -> trio.socket.SocketType:
        directory = self.path.parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        await self._refuse_live()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            await sock.bind(str(tmp))
            os.chmod(tmp, 0o600)
            sock.listen(16)
            os.replace(tmp, self.path)
        except BaseException:
            sock.close()
            tmp.unlink(missing_ok=True)
            raise
        st = self.path.stat()
        self._inode = (st.st_dev, st.st_ino)
        return sock

    async def _refuse_live(self) -> None:
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUse(f"{self.path} exists and is not a socket; refusing to replace it")
        probe = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        with probe:
            try:
                with trio.fail_after(1.0):
                    await probe.connect(str(self.path))
            except (ConnectionRefusedError, FileNotFoundError):
                return
            except (OSError, trio.TooSlowError) as exc:
                raise SocketInUse(f"{self.path} is busy ({exc!r}); another flock-agent may be running") from exc
        raise SocketInUse(f"another flock-agent answers on {self.path}")

    def _remove(self) -> None:
        if self._inode is None:
            return
        try:
            st = self.path.lstat()
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self._inode = None
