"""``flockctl policy explain --verify``, the kernel half: one real packet, traced by the kernel.

The packet: the query's first packet (a TCP SYN, an SCTP INIT, one UDP
datagram) from a socket made in the source pod's network namespace, bound to
its address and a source port the kernel picks (:class:`flock.policy._trace.Target`).

Tracing that packet alone: a table of flock's own, ``inet flock-trace``
(:func:`trace_table`), sets ``meta nftrace`` in prerouting (priority -350,
before conntrack) for exactly its 5-tuple from the pod's veth (a TCP packet
only when it is a SYN), and two empty chains at the end of the forward and
input hooks (priority 1000) mark that it got through flock's chains there.
The kernel reports every rule a traced packet meets to the netfilter trace
group (``NFNLGRP_NFTRACE``); a netlink socket of the node's namespace, bound
to the group *before* the table goes in, reads them
(:func:`flock.policy._nfnetlink.parse_trace`), and a netlink dump of
``table inet flock`` (:func:`dump_rules`) gives the rules their handles name.
What the kernel showed (:class:`flock.policy._trace.Captured`) is held to the
explanation in :mod:`._trace`, purely.

Why netlink rather than ``nft monitor trace``: nft caches the whole ruleset
first, set elements included (130 MiB and most of a second at 200,000
elements, in the agent's cgroup, for every --verify), subscribes only some
time after it starts (a packet sent before is never shown), and buffers its
output in a pipe; 1.0.6 has no JSON for traces.  ``nft -f`` is used only for
the trace table's two small transactions.

Every socket is made on a fresh thread that enters its namespace and ends
(:func:`flock.netns.call_in_netns`); afterwards nothing stays: the trace
table is deleted (also on cancellation: shielded), the sockets closed, the
probe's conntrack entry deleted.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import struct
from collections.abc import Callable
from typing import TypeVar

import attrs
import trio

from flock.netns import call_in_netns

from ._backend import NftBackend, NftError
from ._model import Protocol
from ._nfnetlink import (
    L4_NAMES,
    NETLINK_ADD_MEMBERSHIP,
    NFNLGRP_NFTRACE,
    NLMSG_ERROR,
    SOL_NETLINK,
    Flow,
    KernelRule,
    TraceEvent,
    conntrack_delete_message,
    error_code,
    messages,
    netfilter_socket,
    parse_rules,
    parse_trace,
    rule_dump_request,
)
from ._nft import FAMILY, TABLE, _addr, _name, _port
from ._trace import TRACE_END_CHAINS, TRACE_TABLE, Captured, Places, Target, kernel_trace

T = TypeVar("T")

TRACE_WAIT_S = 2.0  # how long the kernel has, once the packet is sent, to show what became of it
CLEANUP_S = 10.0  # the trace table's removal, shielded from cancellation
PROBE_PAYLOAD = b"flock policy explain --verify\n"  # what a UDP probe carries
PROTOCOL_NUMBERS = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
_DUMP_ATTEMPTS = 3


class TraceError(OSError):
    """The packet could not be sent or traced (the message says what failed): nothing verified."""


# -- the trace table: pure ------------------------------------------------------------------------


def trace_table(target: Target, sport: int) -> str:
    """The nft transaction that (re)makes ``inet flock-trace`` for the packet from *sport*."""
    ip = "ip6" if target.saddr.version == 6 else "ip"
    proto = L4_NAMES[PROTOCOL_NUMBERS[target.protocol]]
    match = (
        f'iifname "{_name(target.iif)}" {ip} saddr {_addr(target.saddr)} {ip} daddr {_addr(target.daddr)} '
        f"meta l4proto {proto} th sport {_port(sport)} th dport {_port(target.dport)}"
    )
    if target.protocol is Protocol.TCP:
        match += " tcp flags & (syn | ack) == syn"  # the SYN alone, not what follows it
    t = f"{FAMILY} {TRACE_TABLE}"
    return "\n".join(
        [
            f"add table {t}",
            f"delete table {t}",
            f"table {t} {{",
            "\tchain pre {",
            "\t\ttype filter hook prerouting priority -350; policy accept;",
            f"\t\t{match} meta nftrace set 1",
            "\t}",
            *(
                line
                for chain, hook in TRACE_END_CHAINS.items()
                for line in (f"\tchain {chain} {{", f"\t\ttype filter hook {hook} priority 1000; policy accept;", "\t}")
            ),
            "}",
            "",
        ]
    )


DROP_TRACE_TABLE = f"add table {FAMILY} {TRACE_TABLE}\ndelete table {FAMILY} {TRACE_TABLE}\n"


# -- the kernel -----------------------------------------------------------------------------------


def _in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """``fn()`` on a fresh thread that enters *netns* (a path) and ends (None: on this thread).  Blocking."""
    return call_in_netns(netns, fn, name="flock-trace")


def trace_socket() -> socket.socket:
    """A non-blocking netlink socket of this thread's namespace, a member of the trace group."""
    sock = netfilter_socket()
    try:
        sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTRACE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def dump_rules(table: str = TABLE) -> list[KernelRule]:
    """Every rule of ``inet <table>`` in chain order ([]: no table), with one netlink dump (no set elements).
    Blocking: run it on a thread in the table's namespace."""
    with netfilter_socket() as sock:
        for seq in range(1, _DUMP_ATTEMPTS + 1):
            sock.send(rule_dump_request(table, seq))
            rules: list[KernelRule] = []
            interrupted = False
            while True:
                got, done, cut = parse_rules(sock.recv(1 << 20), seq)
                rules += got
                interrupted = interrupted or cut
                if done:
                    break
            if not interrupted:
                break
        return rules


def forget_flow(flow: Flow) -> bool:
    """Delete the conntrack entry of *flow* in this thread's namespace (False: there was none).  Blocking."""
    with netfilter_socket() as sock:
        sock.send(conntrack_delete_message(flow, 1))
        for message in messages(sock.recv(1 << 16)):
            if message is not None and message.kind == NLMSG_ERROR and message.seq == 1:
                code = error_code(message.payload)
                if code in (errno.ENOENT, 0):
                    return code == 0
                raise OSError(code, f"conntrack delete: {os.strerror(code)}")
    return False


def _probe_socket(target: Target) -> socket.socket:
    family = socket.AF_INET6 if target.saddr.version == 6 else socket.AF_INET
    kind, proto = {
        Protocol.TCP: (socket.SOCK_STREAM, 0),
        Protocol.UDP: (socket.SOCK_DGRAM, 0),
        Protocol.SCTP: (socket.SOCK_STREAM, socket.IPPROTO_SCTP),
    }[target.protocol]
    sock = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
    try:
        sock.setblocking(False)
        if target.protocol is not Protocol.UDP:  # closed at once, with no lingering handshake
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.bind((str(target.saddr), 0))
    except BaseException:
        sock.close()
        raise
    return sock


def _send(sock: socket.socket, target: Target) -> None:
    address = (str(target.daddr), target.dport)
    if target.protocol is Protocol.UDP:
        sock.sendto(PROBE_PAYLOAD, address)
        return
    code = sock.connect_ex(address)
    if code not in (0, errno.EINPROGRESS):
        raise OSError(code, os.strerror(code))


@attrs.define(eq=False)
class Tracer:
    """Sends the probe for a :class:`Target` and reads what the kernel did with it.

    *nft* runs the trace table's transactions in the node's network namespace *node_netns* (a path; None:
    the agent's own), where the trace group and the rules are read too.  *wait*: how long the kernel has,
    once the packet is sent, to show its fate (the packet's last event ends the wait sooner).

    Error handling: a packet that cannot be sent or traced raises :class:`TraceError` (nothing verified);
    the trace table's removal failing propagates as :class:`flock.policy.NftError`.  Cleanup runs on every
    way out, cancellation included (shielded, at most :data:`CLEANUP_S`).
    """

    nft: NftBackend
    node_netns: str | None = None
    wait: float = TRACE_WAIT_S

    async def _in_node(self, fn: Callable[[], T]) -> T:
        return await trio.to_thread.run_sync(_in_netns, self.node_netns, fn)

    async def trace(self, target: Target, pod_netns: str) -> Captured:
        """Send *target*'s packet from *pod_netns* (the source pod's network namespace, a path) and trace it."""
        try:
            probe = await trio.to_thread.run_sync(_in_netns, pod_netns, functools.partial(_probe_socket, target))
        except OSError as exc:
            raise TraceError(exc.errno, f"cannot make the probe's socket in {target.pod}'s namespace: {exc}") from None
        flow = Flow(target.saddr, target.daddr, PROTOCOL_NUMBERS[target.protocol], probe.getsockname()[1], target.dport)
        try:
            try:
                listener = trio.socket.from_stdlib_socket(await self._in_node(trace_socket))
            except OSError as exc:
                raise TraceError(exc.errno, f"cannot read the kernel's trace: {exc}") from None
            with listener:
                before = tuple(await self._rules())
                try:
                    await self.nft.run(trace_table(target, flow.sport))
                except NftError as exc:  # one transaction, refused: nothing of it is in
                    raise TraceError(errno.EINVAL, f"nft refused the trace table: {exc.stderr.strip()[:300]}") from None
                except BaseException:  # cancelled while nft ran: it may be in
                    await self._drop_table()
                    raise
                try:
                    try:
                        _send(probe, target)
                    except OSError as exc:
                        raise TraceError(exc.errno, f"{target.pod} cannot send the packet: {exc}") from None
                    events, lost = await self._collect(listener, flow)
                finally:
                    await self._drop_table()
                after = tuple(await self._rules())
        finally:
            probe.close()
            with trio.move_on_after(CLEANUP_S, shield=True):
                try:
                    await self._in_node(functools.partial(forget_flow, flow))
                except OSError:
                    pass  # no conntrack here (nothing to forget); an entry would expire on its own
        return Captured(flow, tuple(events), before, after != before, lost)

    async def _rules(self) -> list[KernelRule]:
        try:
            return await self._in_node(dump_rules)
        except OSError as exc:
            raise TraceError(exc.errno, f"cannot read flock's rules: {exc}") from None

    async def forget_leftovers(self) -> None:
        """Delete a trace table an agent killed in the middle of ``--verify`` left behind (start-up)."""
        await self._drop_table()

    async def _drop_table(self) -> None:
        """Delete the trace table (there or not), whatever else is going on."""
        with trio.move_on_after(CLEANUP_S, shield=True) as scope:
            await self.nft.run(DROP_TRACE_TABLE)
        if scope.cancelled_caught:
            raise NftError(-1, f"table {FAMILY} {TRACE_TABLE} not removed within {CLEANUP_S:g} s: delete it by hand")

    async def _collect(self, listener: trio.socket.SocketType, flow: Flow) -> tuple[list[TraceEvent], bool]:
        events: list[TraceEvent] = []
        lost = False
        with trio.move_on_after(self.wait):
            while True:
                try:
                    data = await listener.recv(1 << 16)
                except OSError as exc:
                    if exc.errno != errno.ENOBUFS:
                        raise TraceError(exc.errno, f"reading the kernel's trace: {exc}") from None
                    lost = True  # messages dropped: the socket was full
                    continue
                events += parse_trace(data)
                if kernel_trace(events, flow, Places()).complete:
                    break
        return events, lost
