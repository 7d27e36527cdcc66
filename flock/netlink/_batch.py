"""A blocking rtnetlink socket that sends several requests in one datagram.

The kernel handles the messages of one ``send`` in order: a pod's addresses
and routes cost one round trip, not one each.  A failed message does not
stop the ones after it; each reply says which succeeded.  Messages are
pyroute2's (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``), built and encoded by
pyroute2 directly, without its request processors (they cost more than the
kernel's work) and without an event loop.

One socket per caller thread: never shared, closed after use.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import attrs
from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_GETROUTE
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from flock.netlink import _nsenter

SOL_NETLINK = 270
NETLINK_EXT_ACK = 11  # error acks carry the kernel's reason ("Nexthop device is not up")
NETLINK_GET_STRICT_CHK = 12
_DUMP_ATTEMPTS = 5
RECV_SIZE = 1 << 16
_GETS = frozenset({RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE})
NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence number, port id

# How to call a function in a namespace: _nsenter.run_in_netns or NetnsThread.run.
Enter = Callable[[str | int | None, Callable[[], Any]], Any]


def socket_fd() -> int:
    """A new NETLINK_ROUTE socket's fd, in this thread's namespace."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE).detach()


@attrs.frozen
class Request:
    """One message: its type, flags (besides NLM_F_REQUEST and the batch's
    NLM_F_ACK), what it does in words, and how to make it: *build* (a pure
    function) called with *args* (hashable) returns the pyroute2 message."""

    msg_type: int
    flags: int
    what: str
    build: Callable[..., Any]
    args: tuple = ()

    @property
    def answers(self) -> bool:
        """Whether the kernel answers it even when it succeeds (a GET)."""
        return self.msg_type in _GETS


@functools.lru_cache(maxsize=1024)
def _encoded(build: Callable[..., Any], args: tuple, msg_type: int, flags: int, seq: int) -> bytes:
    """The message as pyroute2 encodes it.  Pure, so remembered: a new pod's
    socket numbers its requests alike every time and its interface is
    usually index 2, so most of the pod side (link up, the default routes)
    encodes to the same bytes pod after pod."""
    msg = build(*args)
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data)


@attrs.define(eq=False)
class Reply:
    """The kernel's answer to one :class:`Request`: the messages it sent
    back (a GET's answer) and the error, None when it succeeded."""

    msgs: list = attrs.field(factory=list)
    error: NetlinkError | None = None

    what: str = ""

    def unwrap(self, *ignored: int) -> list:
        """The messages; raise the error (naming the request) unless its code
        is in *ignored*."""
        if self.error is not None and self.error.code not in ignored:
            reason = (
                self.error.args[1] if len(self.error.args) > 1 and self.error.args[1] else os.strerror(self.error.code)
            )
            raise NetlinkError(self.error.code, f"{self.what}: {reason}" if self.what else reason)
        return self.msgs


@attrs.define(eq=False)
class RtnlSocket:
    """A NETLINK_ROUTE socket: *fd* (owned from here on; its namespace is
    the one it was made in) or, None, a new one in this thread's namespace."""

    fd: int | None = None
    # Strict checking: the kernel filters dumps by the request's header fields
    # and attributes (table, protocol, type, …) instead of sending everything.
    strict: bool = False
    _sock: socket.socket = attrs.field(init=False)
    _marshal: MarshalRtnl = attrs.field(init=False, factory=MarshalRtnl)
    _seq: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if self.fd is None:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        else:
            self._sock = socket.socket(fileno=self.fd)
        try:
            self._sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            if self.strict:
                self._sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self._sock.bind((0, 0))
        except BaseException:
            self._sock.close()
            raise

    @classmethod
    def open_in(
        cls, netns: str | int | None, enter: Enter = _nsenter.run_in_netns, *, strict: bool = False
    ) -> RtnlSocket:
        """A socket in *netns* (a path, a borrowed namespace fd; None: this
        thread's), made by *enter* on another thread when elsewhere (see _nsenter)."""
        if netns is None:
            return cls(strict=strict)
        fd = enter(netns, socket_fd)
        try:
            return cls(fd, strict=strict)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RtnlSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _encode(self, request: Request, ack: bool) -> tuple[int, bytes]:
        self._seq += 1
        flags = NLM_F_REQUEST | request.flags | (NLM_F_ACK if ack else 0)
        return self._seq, _encoded(request.build, request.args, request.msg_type, flags, self._seq)

    def request(self, requests: list[Request] | tuple[Request, ...]) -> list[Reply]:
        """Send *requests* in one datagram; their replies, in order.  Raises
        only for a socket error: a refused message is its Reply's error.

        Only the last message asks for an ack, and not even it when it is a
        GET (its answer is enough): the kernel runs the messages in order and
        answers each in order (a refusal always), so the last answer comes
        after everything the others caused, and a success needs no message
        of its own to read.  A request with NLM_F_ECHO gets the kernel's
        notification of what it did among its messages (before the ack, when
        it is the last).  Not for dumps (their answers have no end here)."""
        if any(r.answers and r.flags & NLM_F_DUMP for r in requests):
            raise ValueError("request() sends no dumps")
        seqs = []
        data = b""
        for i, request in enumerate(requests):
            seq, raw = self._encode(request, ack=i == len(requests) - 1 and not request.answers)
            seqs.append(seq)
            data += raw
        replies = {seq: Reply(what=r.what) for seq, r in zip(seqs, requests, strict=True)}
        self._sock.send(data)
        last = seqs[-1]
        # The last answer: a GET's one message, else the ack (an echo comes before it).
        last_is_ack = not requests[-1].answers
        while True:
            for msg in self._marshal.parse(self._sock.recv(RECV_SIZE)):
                header = msg["header"]
                reply = replies.get(header["sequence_number"])
                if reply is None:
                    continue  # an earlier, abandoned request's late answer
                if header["type"] == NLMSG_ERROR:
                    reply.error = header["error"]
                else:
                    reply.msgs.append(msg)
                if header["sequence_number"] == last and (header["type"] == NLMSG_ERROR or not last_is_ack):
                    return [replies[seq] for seq in seqs]

    def one(self, request: Request, *ignored: int) -> list:
        """One request; its answer messages.  Raises its NetlinkError unless
        the code is in *ignored*."""
        (reply,) = self.request([request])
        return reply.unwrap(*ignored)

    def dump(self, msg_type: int, build: Callable[[], Any]) -> list[Any]:
        """Every message of one dump (pyroute2's, decoded), *build* making the
        request (a fresh pyroute2 message).  Read again when interrupted (the
        table changed while it was read).  OSError for the kernel's error."""
        for _ in range(_DUMP_ATTEMPTS):
            self._seq += 1
            seq = self._seq
            request = build()
            request["header"]["type"] = msg_type
            request["header"]["flags"] = NLM_F_REQUEST | NLM_F_DUMP
            request["header"]["sequence_number"] = seq
            request["header"]["pid"] = 0
            request.encode()
            self._sock.send(request.data)
            out: list[Any] = []
            interrupted = False
            done = False
            while not done:
                data, _, flags, _ = self._sock.recvmsg(RECV_SIZE)
                if flags & socket.MSG_TRUNC:
                    raise OSError(errno.EMSGSIZE, "netlink dump message larger than the receive buffer")
                for msg in self._marshal.parse(data):
                    header = msg["header"]
                    if header["sequence_number"] != seq:
                        continue  # an earlier, abandoned dump's late answer
                    interrupted |= bool(header["flags"] & NLM_F_DUMP_INTR)
                    error = header.get("error")  # pyroute2's NetlinkError (an OSError for ENOBUFS)
                    if error is not None:
                        code = getattr(error, "code", None) or getattr(error, "errno", None) or errno.EPROTO
                        raise OSError(code, os.strerror(code))
                    if header["type"] in (NLMSG_DONE, NLMSG_ERROR):
                        done = True
                    else:
                        out.append(msg)
            if not interrupted:
                return out
        raise OSError(errno.EINTR, f"netlink dump interrupted {_DUMP_ATTEMPTS} times in a row")

    def dump_raw(self, msg_type: int, body: bytes) -> list[tuple[int, memoryview]]:
        """Every message of one dump as (type, bytes after the netlink header),
        undecoded: for reads that look at a few fields of many messages (the
        default route among every route).  *body* is the request after its
        netlink header.  Read again when interrupted; OSError for the kernel's error."""
        for _ in range(_DUMP_ATTEMPTS):
            self._seq += 1
            seq = self._seq
            self._sock.send(
                NLMSGHDR.pack(NLMSGHDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body
            )
            out: list[tuple[int, memoryview]] = []
            interrupted = False
            done = False
            while not done:
                data, _, flags, _ = self._sock.recvmsg(RECV_SIZE)
                if flags & socket.MSG_TRUNC:
                    raise OSError(errno.EMSGSIZE, "netlink dump message larger than the receive buffer")
                view = memoryview(data)
                offset = 0
                while offset + NLMSGHDR.size <= len(data):
                    length, kind, msg_flags, msg_seq, _pid = NLMSGHDR.unpack_from(data, offset)
                    if length < NLMSGHDR.size:
                        break
                    payload = view[offset + NLMSGHDR.size : offset + length]
                    offset += (length + 3) & ~3
                    if msg_seq != seq:
                        continue  # an earlier, abandoned dump's late answer
                    interrupted |= bool(msg_flags & NLM_F_DUMP_INTR)
                    if kind in (NLMSG_ERROR, NLMSG_DONE):
                        # Both carry an error code (0, or minus the errno) first.
                        code = struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else 0
                        if code < 0:
                            raise OSError(-code, os.strerror(-code))
                        done = True
                    else:
                        out.append((kind, payload))
            if not interrupted:
                return out
        raise OSError(errno.EINTR, f"netlink dump interrupted {_DUMP_ATTEMPTS} times in a row")
