"""Denied traffic, visible: the kernel's log of policy drops → one log line per denied flow, and counters.

For the pods of a Namespace annotated ``flock.fritzlab.net/log-denied: "true"``
(:data:`flock.policy._model.LOG_DENIED_ANNOTATION`) the compiler gives each
drop a :class:`flock.policy._ruleset.DenyLog`: before the drop, a rule sends
the packet to nflog group :data:`DENY_LOG_GROUP` with the drop's prefix, at
most 10 a second (burst 20) per pod and direction (a meter keyed by the pod's
veth, so a flood towards one pod costs the agent ten records a second and
the kernel one meter entry).  Only the first packets of connections meet a
drop (established ones are accepted first), so a record is a denied flow's
packet.

:class:`DenyLogService` reads the group on a netlink socket of the node's
network namespace (nfnetlink_log; the packet's first 128 bytes: its IP and
transport headers), looks the prefix up in the ruleset the policy service
last applied (:attr:`flock.policy._ruleset.Ruleset.denials`: the policy and
rule that deny, the direction), names both ends (this node's pods from their
allocations, the others from the policy inputs) and

- counts the packet: ``flock_policy_denied_packets_total{namespace, tier,
  policy, rule, direction}`` (see :class:`flock.policy._metrics.DeniedCounters`
  for the cardinality bound).  It counts the packets logged, so past the
  per-pod limit it counts fewer than were dropped: the kernel's own counts
  are ``flock_policy_dropped_packets_total`` (per pod) and
  ``flock_policy_cluster_rule_packets_total`` (per ClusterNetworkPolicy rule);
- logs one line (logger ``flock.policy.denied``, ``op`` "policy-denied") per
  denied flow — (drop, source, destination, protocol, destination port):
  a client retrying from new source ports is one flow — and again at most
  every :data:`REPEAT_AFTER_S` while it keeps being denied, saying how many
  packets were logged meanwhile (``repeats``).  The flows remembered are an
  LRU of :data:`FLOWS` entries: memory stays flat whatever the traffic.

The group is bound from the start, whether or not a namespace logs (an idle
socket; the kernel discards what nobody reads, and sends nothing while no
rule logs).  Error handling: a socket that cannot be opened or bound (no
nfnetlink_log, the group bound by another program: EPERM) is logged once
and retried here with backoff, never escalated: denied traffic is still
dropped, only not logged.
Records the kernel could not deliver (the socket full) are counted
(``flock_policy_denied_log_overruns_total``).  A bug propagates to the
supervisor.
"""

from __future__ import annotations

import collections
import errno
import functools
import ipaddress
import logging
import os
import random
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import attrs
import trio

from flock.netns import call_in_netns
from flock.nursery import Backoff

from ._inputs import InputJournal, PolicySource
from ._metrics import DeniedCounters, DeniedKey
from ._model import Direction, IPAddress, PolicyPod
from ._nfnetlink import (
    NFGEN,
    NLM_F_ACK,
    NLMSG_ERROR,
    SUBSYS_ULOG,
    attribute,
    attributes,
    error_code,
    messages,
    netfilter_socket,
    request,
)
from ._nft import DENY_LOG_GROUP
from ._ruleset import Denial, Ruleset
from ._service import LocalPods

log = logging.getLogger("flock.policy.denied")

REPEAT_AFTER_S = 10.0  # a flow still denied gets a line again after this long
FLOWS = 4096  # flows remembered for that (least recently seen forgotten first)
TIDY_EVERY_S = 30.0  # how often an idle reader lets go of what only logging needs, once logging is off
COPY_RANGE = 128  # bytes of each packet: IPv6 header, extension headers, ports
OPEN_BACKOFF = Backoff(initial=1.0, factor=2.0, cap=300.0, jitter=0.2)

# linux/netfilter/nfnetlink_log.h (the messages and attributes themselves: ._nfnetlink)
_NFULNL_MSG_PACKET, _NFULNL_MSG_CONFIG = 0, 1
_NFULA_CFG_CMD, _NFULA_CFG_MODE, _NFULA_CFG_TIMEOUT, _NFULA_CFG_QTHRESH = 1, 2, 4, 5
_NFULNL_CFG_CMD_BIND = 1
_NFULNL_COPY_PACKET = 2
_NFULA_PAYLOAD, _NFULA_PREFIX = 9, 10
# Records are batched by the kernel for at most 50 ms (or 16 records): a denial shows well within a second.
_FLUSH_CS = 5
_QUEUE_THRESHOLD = 16
_RECV_BUFFER = 1 << 16
_RECVS_PER_TURN = 64  # then let the other tasks run

PROTOCOLS = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}
_PORTED = frozenset({6, 17, 33, 132, 136})  # TCP, UDP, DCCP, SCTP, UDP-Lite: ports first in their header
_ICMP = frozenset({1, 58})
_IPV6_EXTENSIONS = frozenset({0, 43, 60})  # hop-by-hop, routing, destination options: (len + 1) * 8 bytes
_IPV6_FRAGMENT, _IPV6_AUTH = 44, 51


class NflogUnavailable(OSError):
    """The kernel refused to bind the nflog group (errno set): no nfnetlink_log, or another program has it."""


# -- the wire: pure -----------------------------------------------------------------------------


def config_message(group: int, seq: int, setting: bytes) -> bytes:
    """One NFULNL_MSG_CONFIG request for *group* (acknowledged) carrying the attribute *setting*."""
    body = NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(group)) + setting  # res_id: the group
    return request((SUBSYS_ULOG << 8) | _NFULNL_MSG_CONFIG, NLM_F_ACK, seq, body)


def bind_messages(group: int) -> list[bytes]:
    """Bind *group*, copy each packet's first :data:`COPY_RANGE` bytes, deliver within 50 ms."""
    return [
        config_message(group, 1, attribute(_NFULA_CFG_CMD, bytes([_NFULNL_CFG_CMD_BIND]))),
        config_message(group, 2, attribute(_NFULA_CFG_MODE, struct.pack(">IBB", COPY_RANGE, _NFULNL_COPY_PACKET, 0))),
        config_message(group, 3, attribute(_NFULA_CFG_QTHRESH, struct.pack(">I", _QUEUE_THRESHOLD))),
        config_message(group, 4, attribute(_NFULA_CFG_TIMEOUT, struct.pack(">I", _FLUSH_CS))),
    ]


@attrs.frozen(slots=True)
class LoggedPacket:
    """One packet the kernel logged: the drop's prefix and what the packet's headers say."""

    prefix: str
    family: int  # 4 or 6
    saddr: IPAddress
    daddr: IPAddress
    protocol: int  # IP protocol number (the transport header's, past IPv6 extension headers)
    sport: int | None = None
    dport: int | None = None
    icmp: tuple[int, int] | None = None  # (type, code)


def parse_messages(data: bytes | memoryview) -> Iterator[LoggedPacket | None]:
    """The logged packets in a netlink datagram (None for a record that cannot be read)."""
    packet_kind = (SUBSYS_ULOG << 8) | _NFULNL_MSG_PACKET
    for message in messages(data):
        if message is None:
            yield None
            return
        if message.kind == packet_kind and len(message.payload) >= NFGEN.size:
            family = message.payload[0]
            prefix, payload = b"", None
            for attr_kind, value in attributes(message.payload, NFGEN.size):
                if attr_kind == _NFULA_PREFIX:
                    prefix = bytes(value).split(b"\0", 1)[0]
                elif attr_kind == _NFULA_PAYLOAD:
                    payload = value
            yield parse_packet(prefix.decode("ascii", "replace"), family, payload) if payload is not None else None


def parse_packet(prefix: str, family: int, packet: bytes | memoryview) -> LoggedPacket | None:
    """*packet* (from its IP header on; *family*: AF_INET or AF_INET6) as a :class:`LoggedPacket`."""
    b = bytes(packet)
    if family == socket.AF_INET6 and len(b) >= 40 and b[0] >> 4 == 6:
        saddr: IPAddress = ipaddress.IPv6Address(b[8:24])
        daddr: IPAddress = ipaddress.IPv6Address(b[24:40])
        proto, offset, fragment = b[6], 40, False
        for _ in range(8):  # extension headers: a few at most in practice
            if proto in _IPV6_EXTENSIONS and offset + 8 <= len(b):
                proto, offset = b[offset], offset + (b[offset + 1] + 1) * 8
            elif proto == _IPV6_FRAGMENT and offset + 8 <= len(b):
                fragment = struct.unpack_from(">H", b, offset + 2)[0] & 0xFFF8 != 0
                proto, offset = b[offset], offset + 8
            elif proto == _IPV6_AUTH and offset + 8 <= len(b):
                proto, offset = b[offset], offset + (b[offset + 1] + 2) * 4
            else:
                break
        version = 6
    elif family == socket.AF_INET and len(b) >= 20 and b[0] >> 4 == 4:
        saddr, daddr = ipaddress.IPv4Address(b[12:16]), ipaddress.IPv4Address(b[16:20])
        proto, offset = b[9], (b[0] & 0x0F) * 4
        fragment = struct.unpack_from(">H", b, 6)[0] & 0x1FFF != 0
        version = 4
    else:
        return None
    sport = dport = None
    icmp = None
    if not fragment and offset + 4 <= len(b):
        if proto in _PORTED:
            sport, dport = struct.unpack_from(">HH", b, offset)
        elif proto in _ICMP:
            icmp = (b[offset], b[offset + 1])
    return LoggedPacket(prefix, version, saddr, daddr, proto, sport, dport, icmp)


# -- the socket ---------------------------------------------------------------------------------


def _bind(sock: socket.socket, group: int) -> None:
    for seq, message in enumerate(bind_messages(group), 1):
        sock.send(message)
        while (code := _acknowledgement(sock.recv(_RECV_BUFFER), seq)) is None:
            pass  # records may come before it once the group is bound
        if code == errno.EPERM:  # what the kernel answers for a group another socket has bound
            raise NflogUnavailable(code, f"nflog group {group} is bound by another socket of this namespace")
        if code:
            raise NflogUnavailable(code, f"nflog group {group}: {os.strerror(code)}")


def _acknowledgement(reply: bytes, seq: int) -> int | None:
    """The errno (0: none) answering request *seq* in *reply* (None: no answer to it there)."""
    for message in messages(reply):
        if message is not None and message.kind == NLMSG_ERROR and message.seq == seq and len(message.payload) >= 4:
            return error_code(message.payload)
    return None


def open_nflog(group: int = DENY_LOG_GROUP, netns: str | None = None) -> socket.socket:
    """A non-blocking netlink socket bound to nflog *group* in the network namespace *netns* (a path;
    None: this thread's).  Blocking; raises OSError (:class:`NflogUnavailable` when the bind is refused).

    The namespace is entered on a thread of its own, which ends with the call
    (:func:`flock.netns.call_in_netns`): the socket stays in the namespace it was made in, usable from
    any thread."""

    def make() -> socket.socket:
        sock = netfilter_socket()
        try:
            _bind(sock, group)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    return call_in_netns(netns, make, name="flock-nflog")


async def nflog_socket(group: int = DENY_LOG_GROUP, netns: str | None = None) -> socket.socket:
    """:func:`open_nflog` on a worker thread."""
    return await trio.to_thread.run_sync(functools.partial(open_nflog, group, netns))


# -- the service --------------------------------------------------------------------------------


class AppliedRuleset(Protocol):
    """What the policy service has in the kernel (flock.policy.PolicyService is one)."""

    @property
    def applied(self) -> Ruleset | None: ...


@attrs.define(eq=False)
class _PodsByAddress:
    """The cluster's selectable pods by address, built when first asked and then kept by the inputs'
    journal (O(changes)); let go of while nothing is logged."""

    source: PolicySource
    _journal: InputJournal | None = attrs.field(init=False, default=None)
    _pods: dict[IPAddress, PolicyPod] = attrs.field(init=False, factory=dict)

    async def refresh(self) -> None:
        if self._journal is None:
            self._journal = self.source.journal()
            pods = list(self.source.pods.values())  # with the journal: nothing can come between them
            for i in range(0, len(pods), 5000):
                for pod in pods[i : i + 5000]:
                    self._add(pod)
                await trio.lowlevel.checkpoint()  # 150,000 pods: a few 10 ms turns, not one long one
        changes = self._journal.drain()
        for key, before in changes.pods.items():
            if before is not None:
                for address in before.addresses:
                    if self._pods.get(address) is before:
                        del self._pods[address]
            after = self.source.pods.get(key)
            if after is not None:
                self._add(after)

    def _add(self, pod: PolicyPod) -> None:
        if pod.selectable:  # hostNetwork pods have the node's addresses; finished ones none of their own
            for address in pod.addresses:
                self._pods[address] = pod

    def get(self, address: IPAddress) -> PolicyPod | None:
        return self._pods.get(address)

    def forget(self) -> None:
        self._journal, self._pods = None, {}


@attrs.define(slots=True)
class _Seen:
    at: float  # when its last line was logged
    repeats: int = 0  # packets logged since, without a line


def _policy_label(denial: Denial) -> str:
    """The metric's policy label: a ClusterNetworkPolicy's name, or the isolating NetworkPolicies' names
    (the namespace label says whose)."""
    return ",".join(key.rpartition("/")[2] for key in denial.policies)


@attrs.define(eq=False)
class DenyLogService:
    """Supervised service: nflog group :data:`DENY_LOG_GROUP` → log lines and counters (see the module doc).

    *rules*: what the kernel holds (the policy service); *local*: this node's attachments (their pods
    by address); *inputs*: the cluster's pods (the other ends' names); *open_socket*: the bound,
    non-blocking nflog socket of the node's namespace (:func:`nflog_socket`)."""

    rules: AppliedRuleset
    local: LocalPods
    inputs: PolicySource
    counters: DeniedCounters | None = None
    open_socket: Callable[[], Awaitable[socket.socket]] = nflog_socket
    repeat_after: float = REPEAT_AFTER_S
    flows: int = FLOWS
    tidy_every: float = TIDY_EVERY_S
    backoff: Backoff = OPEN_BACKOFF
    rand: Callable[[], float] = random.random
    _cluster: _PodsByAddress = attrs.field(init=False)
    _seen: collections.OrderedDict[tuple[object, ...], _Seen] = attrs.field(init=False, factory=collections.OrderedDict)
    _local_version: int = attrs.field(init=False, default=-1)
    _local_pods: dict[IPAddress, str] = attrs.field(init=False, factory=dict)
    # the ruleset applied last seen, and the one before (a record may name a drop its successor removed)
    _current: Ruleset | None = attrs.field(init=False, default=None)
    _previous: Ruleset | None = attrs.field(init=False, default=None)
    _buffer: bytearray = attrs.field(init=False, factory=lambda: bytearray(_RECV_BUFFER))
    records: int = attrs.field(init=False, default=0)  # logged packets read (tests, benchmarks)
    lines: int = attrs.field(init=False, default=0)  # log lines written

    def __attrs_post_init__(self) -> None:
        self._cluster = _PodsByAddress(self.inputs)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the group and read it; started() after the first attempt to bind, bound or not (what
        fails is retried here with backoff: the rest of the agent does not wait for denied-traffic logs)."""
        attempt, started = 0, False
        while True:
            try:
                sock = await self.open_socket()
            except OSError as exc:
                delay = self.backoff.delay(attempt, self.rand())
                (log.warning if attempt == 0 else log.debug)(
                    "cannot read the denied-traffic log (nflog group %d): retrying in %.0f s",
                    DENY_LOG_GROUP,
                    delay,
                    extra={"op": "policy-denied", "error": str(exc)[:300], "attempt": attempt + 1},
                )
                attempt += 1
                if not started:
                    task_status.started()
                    started = True
                await trio.sleep(delay)
                continue
            with sock:
                if attempt:
                    log.info("reading the denied-traffic log", extra={"op": "policy-denied"})
                if not started:
                    task_status.started()
                    started = True
                began = trio.current_time()
                failed = await self._read(sock)
            # a socket that fails at once again and again is reopened with backoff, not in a loop
            attempt = 0 if trio.current_time() - began > self.backoff.cap else attempt + 1
            delay = self.backoff.delay(attempt - 1, self.rand()) if attempt else 0.0
            log.warning(
                "the denied-traffic log socket failed: opening it again in %.1f s",
                delay,
                extra={"op": "policy-denied", "error": str(failed)[:300]},
            )
            await trio.sleep(delay)

    async def _read(self, sock: socket.socket) -> OSError:
        """Read *sock* until it fails (the error)."""
        view = memoryview(self._buffer)
        while True:
            with trio.move_on_after(self.tidy_every) as idle:
                await trio.lowlevel.wait_readable(sock)
            if idle.cancelled_caught:
                self._tidy()
                continue
            batch: list[LoggedPacket | None] = []
            for _ in range(_RECVS_PER_TURN):
                try:
                    n = sock.recv_into(self._buffer)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:  # the kernel dropped records; the socket goes on
                        if self.counters is not None:
                            self.counters.overruns += 1
                        continue
                    return exc
                batch.extend(parse_messages(view[:n]))
            await self.handle(batch)

    async def handle(self, batch: list[LoggedPacket | None]) -> None:
        """Count and log *batch* (None: a record that could not be read)."""
        if not batch:
            return
        self._follow_rules()
        await self._cluster.refresh()
        self._follow_local()
        now = trio.current_time()
        for packet in batch:
            self.records += 1
            denial = self._denial(packet.prefix) if packet is not None else None
            if packet is None or denial is None:
                if self.counters is not None:
                    self.counters.unmatched += 1
                continue
            self._one(packet, denial, now)

    def _one(self, packet: LoggedPacket, denial: Denial, now: float) -> None:
        ingress = denial.direction is Direction.INGRESS
        pod = self._local_pods.get(packet.daddr if ingress else packet.saddr)
        namespace = pod.partition("/")[0] if pod is not None else ""
        if self.counters is not None:
            key: DeniedKey = (namespace, denial.tier, _policy_label(denial), denial.rule, denial.direction.value)
            self.counters.count(key)
        flow = (packet.prefix, packet.saddr, packet.daddr, packet.protocol, packet.dport, packet.icmp)
        seen = self._seen.get(flow)
        if seen is not None and now - seen.at < self.repeat_after:
            seen.repeats += 1
            self._seen.move_to_end(flow)
            return
        repeats = seen.repeats if seen is not None else 0
        self._seen[flow] = _Seen(now)
        self._seen.move_to_end(flow)
        while len(self._seen) > self.flows:
            self._seen.popitem(last=False)
        self._line(packet, denial, pod, repeats)

    def _line(self, packet: LoggedPacket, denial: Denial, pod: str | None, repeats: int) -> None:
        src, dst = self._name(packet.saddr), self._name(packet.daddr)
        protocol = PROTOCOLS.get(packet.protocol, str(packet.protocol))
        fields: dict[str, object] = {
            "op": "policy-denied",
            "direction": denial.direction.value,
            "tier": denial.tier,
            "policies": list(denial.policies),
            "pod": pod,
            "family": f"IPv{packet.family}",
            "protocol": protocol,
            "src": str(packet.saddr),
            "dst": str(packet.daddr),
        }
        if denial.rule:
            fields["rule"] = denial.rule
        if src is not None:
            fields["src_pod"] = src
        if dst is not None:
            fields["dst_pod"] = dst
        if packet.dport is not None:
            fields["sport"], fields["dport"] = packet.sport, packet.dport
        if packet.icmp is not None:
            fields["icmp_type"], fields["icmp_code"] = packet.icmp
        if repeats:
            fields["repeats"] = repeats
        service = f"{protocol}/{packet.dport}" if packet.dport is not None else protocol
        who = ", ".join(denial.policies) + (f" rule {denial.rule}" if denial.rule else "")
        self.lines += 1
        log.info(
            "denied %s %s → %s %s: %s %s",
            denial.direction.value.lower(),
            src or packet.saddr,
            dst or packet.daddr,
            service,
            denial.tier,
            who,
            extra=fields,
        )

    def _name(self, address: IPAddress) -> str | None:
        local = self._local_pods.get(address)
        if local is not None:
            return local
        pod = self._cluster.get(address)
        return pod.key if pod is not None else None

    def _denial(self, prefix: str) -> Denial | None:
        for ruleset in (self._current, self._previous):
            if ruleset is not None and (denial := ruleset.denials.get(prefix)) is not None:
                return denial
        return None

    def _follow_rules(self) -> None:
        """Take the ruleset now applied (the one before kept for records in flight); series of drops
        neither has go (at most the drops of two rulesets stay)."""
        applied = self.rules.applied
        if applied is not self._current:
            self._previous, self._current = self._current, applied
            self._prune()

    def _prune(self) -> None:
        if self.counters is not None:
            alive = {
                (d.tier, _policy_label(d), d.rule, d.direction.value)
                for rs in (self._previous, self._current)
                if rs is not None
                for d in rs.denials.values()
            }
            self.counters.keep(lambda key: key[1:] in alive)

    def _follow_local(self) -> None:
        if self.local.version == self._local_version:
            return
        self._local_version = self.local.version
        pods: dict[IPAddress, str] = {}
        for alloc in self.local.allocations.values():
            if alloc.namespace:
                key = f"{alloc.namespace}/{alloc.pod}"
                for address in (alloc.ip6, alloc.ip4, *alloc.addresses):
                    if address is not None:
                        pods[address] = key
        self._local_pods = pods

    def _tidy(self) -> None:
        """Idle for a while: no record of the previous ruleset is in flight any more (its drops' series
        go); once nothing is logged, let go of the indices and the flows."""
        self._follow_rules()
        if self._previous is not None:
            self._previous = None
            self._prune()
        if self._current is None or not self._current.denials:
            self._cluster.forget()
            self._seen.clear()
            self._local_pods, self._local_version = {}, -1
