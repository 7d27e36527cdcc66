"""flock-agent's side of the wire: a Trio unix-socket server, one request per connection.

Imported explicitly (not from :mod:`flock.rpc`), so the shim's bundle stays
free of Trio and attrs.
"""

from __future__ import annotations

import array
import errno
import logging
import os
import socket
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from flock import logs
from flock.errors import INTERNAL, INVALID_ENV, NOT_AVAILABLE, TRY_AGAIN_LATER, CniError, quote
from flock.rpc._unixsocket import PrivateSocket, SocketInUse
from flock.rpc.wire import LineReader, Request, encode_error, encode_result

__all__ = ["Handler", "NotReadyHandler", "PrivateSocket", "RpcServer", "SocketInUse"]

log = logging.getLogger("flock.rpc")

# Backstop over one whole request; the ADD flow has its own, shorter 25 s deadline.
REQUEST_DEADLINE_S = 30.0
# A client gets this long to send its request line; silent clients are dropped.
READ_DEADLINE_S = 5.0
# At shutdown, requests already being handled get this long to finish.
DRAIN_DEADLINE_S = 2.0
# Answering a request whose handler ran out of time must not hang either.
LATE_REPLY_DEADLINE_S = 0.5
# After refusing a request, how long / how much of the rest we read and drop.
LINGER_S = 0.5
LINGER_BYTES = 4 << 20
# Ancillary room per read: a request carries at most one fd; room for a few
# more lets the agent see (and close) extra ones instead of the kernel
# truncating silently.
_MAX_FDS = 4
_ANCILLARY_BYTES = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
# accept() errors that mean "out of resources right now", not "broken socket".
_TRANSIENT_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1
# Longest request string put into the log context as it is (longer: its quoted head).
_MAX_LOG_FIELD = 512


class Handler(Protocol):
    """Serves one decoded request: the CNI result (or ``{}``), or raises CniError."""

    async def __call__(self, request: Request) -> dict[str, Any]: ...


@attrs.define(eq=False)
class NotReadyHandler:
    """What the agent answers before the pod handler is installed.

    ADD → 11 (try again later); STATUS → 50; DEL, CHECK and GC succeed, as
    nothing can have been set up by an agent that never served an ADD.
    """

    reason: str = "flock-agent has not finished starting"

    async def __call__(self, request: Request) -> dict[str, Any]:
        if request.op == "ADD":
            raise CniError(TRY_AGAIN_LATER, "agent not ready", self.reason)
        if request.op == "STATUS":
            raise CniError(NOT_AVAILABLE, "agent not ready", self.reason)
        return {}


@attrs.define(eq=False)
class RpcServer:
    """Listens on *path* and hands each request to *handler* (given at construction;
    without one, :class:`NotReadyHandler` answers).

    Error handling: every per-connection failure — garbage, a half line, a
    line over the request limit, an fd that does not match the line, a client that says nothing for ``read_deadline`` or
    hangs up, a handler that raises or overruns ``request_deadline`` or the
    drain's ``drain_deadline`` (code 11, "shutting down") — is
    answered with a CniError where the client can still hear it, logged,
    and confined to that connection.  accept() running out of file
    descriptors is retried locally.  Failing to bind, or finding a live agent
    on the socket (:class:`SocketInUse`), propagates to the supervisor.
    """

    path: Path = attrs.field(converter=Path)
    handler: Handler = attrs.field(factory=NotReadyHandler, on_setattr=attrs.setters.frozen)
    request_deadline: float = REQUEST_DEADLINE_S
    read_deadline: float = READ_DEADLINE_S
    drain_deadline: float = DRAIN_DEADLINE_S
    _accepting: trio.CancelScope | None = attrs.field(init=False, default=None)
    _reading: set[trio.CancelScope] = attrs.field(init=False, factory=set)
    _handling: set[trio.CancelScope] = attrs.field(init=False, factory=set)  # requests in the handler
    _draining: bool = attrs.field(init=False, default=False)
    _drained: trio.Event = attrs.field(init=False, factory=trio.Event)
    _socket: PrivateSocket = attrs.field(init=False)

    @_socket.default
    def _private_socket(self) -> PrivateSocket:
        return PrivateSocket(self.path)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; after :meth:`drain` it stays idle until cancelled
        (so a supervisor never mistakes a drained server for one that exited)."""
        listener = await self._socket.listen()
        try:
            # Listening already: the kernel queues connections from here on.
            self._accepting = trio.CancelScope()
            if self._draining:
                self._accepting.cancel()
            task_status.started()
            log.info("listening", extra={"socket": str(self.path)})
            async with trio.open_nursery() as connections:
                with self._accepting:
                    await self._accept_loop(listener, connections)
                # Draining: no new connections from here; in-flight ones get a deadline.
                listener.close()
                self._socket.remove()
                cutoff = trio.current_time() + self.drain_deadline
                for handling in self._handling:
                    handling.deadline = min(handling.deadline, cutoff)
                # Backstop: a request cut off at the cutoff still gets its short "shutting down" reply.
                connections.cancel_scope.deadline = cutoff + LATE_REPLY_DEADLINE_S
            log.info("drained", extra={"socket": str(self.path)})
            self._drained.set()
            await trio.sleep_forever()
        finally:
            self._accepting = None
            listener.close()
            self._socket.remove()

    async def drain(self) -> None:
        """Stop accepting, drop connections that have not sent a request, give
        requests in flight ``drain_deadline`` to finish, remove the socket file.
        Returns when that is done (at once if the server is not running)."""
        self._draining = True
        for scope in list(self._reading):
            scope.cancel()
        if self._accepting is None:
            return
        self._accepting.cancel()
        await self._drained.wait()

    async def _accept_loop(self, listener: trio.socket.SocketType, connections: trio.Nursery) -> None:
        while True:
            try:
                sock, _ = await listener.accept()
            except OSError as exc:
                if exc.errno not in _TRANSIENT_ACCEPT_ERRNOS:
                    raise
                log.error("accept failed, retrying", extra={"error": str(exc)})
                await trio.sleep(_ACCEPT_RETRY_S)
                continue
            connections.start_soon(self._serve, sock)

    async def _serve(self, sock: trio.socket.SocketType) -> None:
        began = trio.current_time()
        fields: dict[str, str] = {}  # the request's log context, for the late reply's log line too
        fds: list[int] = []  # fds that came with the request; closed whatever happens
        async with trio.SocketStream(sock) as stream:
            try:
                with trio.move_on_after(self.request_deadline) as handling:
                    line = await self._receive_request(stream, fds)
                    if line is None:
                        return
                    try:
                        if len(fds) > 1:
                            raise CniError(
                                INVALID_ENV,
                                "unexpected file descriptor",
                                f"{len(fds)} fds arrived; at most one is taken",
                            )
                        request = Request.decode(line, fds[0] if fds else None)
                    except CniError as err:
                        log.warning("bad request", extra={"code": err.code, "error": str(err)})
                        await stream.send_all(encode_error(err))
                        return
                    context = {"op": request.op, "container_id": request.container_id, "pod": request.pod}
                    # A DEL's CNI_ARGS is not checked (it needs none): a huge pod name stays out of the logs.
                    fields = {
                        k: v if len(v) <= _MAX_LOG_FIELD else quote(v, _MAX_LOG_FIELD) for k, v in context.items() if v
                    }
                    with logs.bound(**fields):
                        self._handling.add(handling)
                        try:
                            reply = await self._answer(request, began)
                        finally:
                            self._handling.discard(handling)
                        await stream.send_all(reply)
                        return
                # The request deadline passed, or the drain cut the handler off.
                if self._draining:
                    late = CniError(
                        TRY_AGAIN_LATER,
                        "flock-agent is shutting down",
                        f"the request was still running after the {self.drain_deadline:g} s drain; retry it",
                    )
                else:
                    late = CniError(
                        TRY_AGAIN_LATER, "request timed out", f"no answer within {self.request_deadline:g} s"
                    )
                with logs.bound(**fields):
                    log.warning("request cut off", extra={"code": late.code, "error": str(late)})
                with trio.move_on_after(LATE_REPLY_DEADLINE_S):
                    await stream.send_all(encode_error(late))
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                log.debug("client went away", extra={"error": str(exc)})
            finally:
                for fd in fds:
                    os.close(fd)

    async def _receive_request(self, stream: trio.SocketStream, fds: list[int]) -> bytes | None:
        """The request line; None for a client that said nothing in time, or an
        error reply already sent for one that sent garbage.  Fds that arrive
        with it (SCM_RIGHTS) are appended to *fds*, which the caller closes."""
        reader = LineReader()
        with trio.move_on_after(self.read_deadline) as reading:
            self._reading.add(reading)
            if self._draining:
                reading.cancel()
            try:
                while True:
                    chunk, ancdata, flags, _ = await stream.socket.recvmsg(65536, _ANCILLARY_BYTES)
                    fds.extend(_received_fds(ancdata))
                    if flags & socket.MSG_CTRUNC:
                        raise CniError(
                            INVALID_ENV, "unexpected file descriptor", "more fds arrived than a request may carry"
                        )
                    if not chunk:
                        raise reader.eof()
                    line = reader.feed(chunk)
                    if line is not None:
                        return line
            except CniError as err:
                log.warning("bad request", extra={"code": err.code, "error": str(err)})
                await stream.send_all(encode_error(err))
                await _linger(stream)
                return None
            finally:
                self._reading.discard(reading)
        log.debug("client sent no request", extra={"bytes": reader.pending})
        return None

    async def _answer(self, request: Request, began: float) -> bytes:
        try:
            result = await self.handler(request)
        except CniError as err:
            log.info("request failed", extra={"code": err.code, "error": str(err), "ms": _ms_since(began)})
            return encode_error(err)
        except Exception as exc:  # a handler bug fails this request, never the server
            log.exception("handler crashed")
            return encode_error(CniError(INTERNAL, "internal error in flock-agent", repr(exc)))
        if not isinstance(result, dict):
            log.error("handler returned a non-object result", extra={"result": repr(result)})
            return encode_error(
                CniError(
                    INTERNAL,
                    "internal error in flock-agent",
                    f"handler returned {type(result).__name__}, not an object",
                )
            )
        log.info("request served", extra={"code": 0, "ms": _ms_since(began)})
        return encode_result(result)


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The fds in SCM_RIGHTS ancillary data (already ours: the caller closes them)."""
    out: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            out.extend(fds)
    return out


async def _linger(stream: trio.SocketStream) -> None:
    """Read and drop what a flooding client still sends, briefly, before closing.

    Closing a unix socket with unread data resets the peer, and the reset can
    overtake the error we just sent; lingering lets the client read it.
    """
    await stream.send_eof()
    dropped = 0
    with trio.move_on_after(LINGER_S):
        while dropped < LINGER_BYTES:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            dropped += len(chunk)


def _ms_since(began: float) -> float:
    return round((trio.current_time() - began) * 1000, 1)
