"""``flockctl policy explain --verify``: one real packet, traced by the kernel, held to the explanation.

The packet: the query's first packet (a TCP SYN, an SCTP INIT, one UDP
datagram) from a socket made in the source pod's network namespace, bound to
its address and a source port the kernel picks.  Only a pod on this node can
send it (:func:`verify_plan` says why not otherwise).

Tracing that packet alone: a table of flock's own, ``inet flock-trace``
(:func:`trace_table`), sets ``meta nftrace`` in prerouting (priority -350,
before conntrack) for exactly its 5-tuple from the pod's veth (a TCP packet
only when it is a SYN), and two empty chains at the end of the forward and
input hooks (priority 1000) mark that it got through flock's chains there.
The kernel reports every rule a traced packet meets to the netfilter trace
group (``NFNLGRP_NFTRACE``); a netlink socket of the node's namespace, bound
to the group *before* the table goes in, reads them (:func:`parse_trace`):
chain, rule handle, verdict.  The rules' handles are named by a netlink dump
of ``table inet flock`` (:func:`parse_rules`, :func:`place_rules`): the
compiled rule each one is (a logged drop is two kernel rules: its log rule,
then the drop), or a base chain's fixed rule, or none of flock's.

Why netlink rather than ``nft monitor trace``: nft caches the whole ruleset
first, set elements included (130 MiB and most of a second at 200,000
elements, in the agent's cgroup, for every --verify), subscribes only some
time after it starts (a packet sent before is never shown), and buffers its
output in a pipe; 1.0.6 has no JSON for traces.  ``nft -f`` is used only for
the trace table's two small transactions.

Afterwards nothing stays: the trace table is deleted (also on cancellation:
shielded), the sockets closed, the probe's conntrack entry deleted.

:func:`kernel_trace` turns the events into the walk of each of flock's base
chains (``egress``, ``ingress`` in the forward hook, ``input``) and
:func:`verify` holds each walk to the explanation's trace of that direction:
the same rules in the same order and the same deciding rule, or the two part
and it says where.  Pure but for the last section (:class:`Tracer` and the
netlink it reads and writes).
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import trio

from flock.netns import call_in_netns

from ._backend import NftBackend, NftError
from ._counters import _HEADER, _attrs, _request
from ._explain import DirectionVerdict, Explanation, Verdict, kernel_step_text
from ._model import IPAddress, Protocol
from ._nft import EGRESS_CHAIN, FAMILY, INGRESS_CHAIN, INPUT_CHAIN, TABLE, _addr, _name, _port
from ._ruleset import Ruleset

T = TypeVar("T")

TRACE_TABLE = "flock-trace"
TRACE_WAIT_S = 2.0  # how long the kernel has, once the packet is sent, to show what became of it
CLEANUP_S = 10.0  # the trace table's removal, shielded from cancellation
PROBE_PAYLOAD = b"flock policy explain --verify\n"  # what a UDP probe carries
_BASE_CHAINS = (EGRESS_CHAIN, INGRESS_CHAIN, INPUT_CHAIN)
_END_CHAINS = {"fwd-end": "forward", "in-end": "input"}  # the trace table's markers → the hook they close
PROTOCOL_NUMBERS = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
_L4 = {6: "tcp", 17: "udp", 132: "sctp"}

# linux/netfilter/nfnetlink.h, nf_tables.h, nfnetlink_conntrack.h
NETLINK_NETFILTER = 12
NFNLGRP_NFTRACE = 9
_SOL_NETLINK, _NETLINK_ADD_MEMBERSHIP = 270, 1
_SUBSYS_CTNETLINK, _SUBSYS_NFTABLES = 1, 10
_NFT_MSG_NEWRULE, _NFT_MSG_TRACE = 6, 17
_IPCTNL_MSG_CT_DELETE = 2
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_DUMP_INTR = 0x1, 0x4, 0x10
_NLA_F_NESTED = 0x8000
_NFTA_TRACE_TABLE, _NFTA_TRACE_CHAIN, _NFTA_TRACE_RULE_HANDLE, _NFTA_TRACE_TYPE = 1, 2, 3, 4
_NFTA_TRACE_VERDICT, _NFTA_TRACE_ID = 5, 6
_NFTA_TRACE_NETWORK_HEADER, _NFTA_TRACE_TRANSPORT_HEADER = 8, 9
_NFTA_TRACE_NFPROTO, _NFTA_TRACE_POLICY = 15, 16
_TRACE_TYPES = {1: "policy", 2: "return", 3: "rule"}
_NFTA_VERDICT_CODE, _NFTA_VERDICT_CHAIN = 1, 2
_VERDICTS = {0: "drop", 1: "accept", 2: "stolen", 3: "queue", 4: "repeat", 5: "stop"}
_VERDICTS |= {-1: "continue", -2: "break", -3: "jump", -4: "goto", -5: "return"}
_NFTA_RULE_CHAIN, _NFTA_RULE_HANDLE, _NFTA_RULE_EXPRESSIONS = 2, 3, 4
_NFTA_LIST_ELEM, _NFTA_EXPR_NAME, _NFTA_EXPR_DATA = 1, 1, 2
_NFTA_IMMEDIATE_DREG, _NFTA_IMMEDIATE_DATA, _NFTA_DATA_VERDICT = 1, 2, 2
_NFTA_LOOKUP_DREG = 3
_NFT_REG_VERDICT = 0
_NFPROTO_IPV4, _NFPROTO_IPV6 = 2, 10
_CTA_TUPLE_ORIG, _CTA_TUPLE_IP, _CTA_TUPLE_PROTO = 1, 1, 2
_CTA_IP_V4_SRC, _CTA_IP_V6_SRC = 1, 3  # the destinations follow each
_CTA_PROTO_NUM, _CTA_PROTO_SRC_PORT, _CTA_PROTO_DST_PORT = 1, 2, 3
_DUMP_ATTEMPTS = 3


class TraceError(OSError):
    """The packet could not be sent or traced (the message says what failed): nothing verified."""


# -- the wire: pure -----------------------------------------------------------------------------


@attrs.frozen
class Flow:
    """A packet's 5-tuple (``protocol``: the IP protocol number)."""

    saddr: IPAddress
    daddr: IPAddress
    protocol: int
    sport: int
    dport: int

    def text(self) -> str:
        proto = _L4.get(self.protocol, str(self.protocol)).upper()
        return f"{proto} {_at(self.saddr, self.sport)} → {_at(self.daddr, self.dport)}"


def _at(address: IPAddress, port: int) -> str:
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


@attrs.frozen
class TraceEvent:
    """One trace message: a rule that matched (``handle`` set: its verdict, ``continue`` for one that
    decides nothing), a chain left at its end (no handle; ``kind`` "rule", "return" on kernels before 6.x),
    or a base chain's policy (``kind`` "policy").  The first event of each base chain a packet enters
    carries the packet."""

    trace_id: int
    table: str
    chain: str
    kind: str  # "rule", "return", "policy"
    verdict: str  # "accept", "drop", "continue", "return", "jump <chain>", "goto <chain>"
    handle: int | None = None
    packet: Flow | None = None


def _messages(data: bytes) -> Iterator[tuple[int, int, int, memoryview]]:
    """(type, flags, seq, payload) of each netlink message in *data*."""
    view = memoryview(data)
    offset = 0
    while offset + _HEADER.size <= len(view):
        length, kind, flags, seq, _ = _HEADER.unpack_from(view, offset)
        if length < _HEADER.size or offset + length > len(view):
            return
        yield kind, flags, seq, view[offset + _HEADER.size : offset + length]
        offset += (length + 3) & ~3


def _string(value: memoryview) -> str:
    return bytes(value).split(b"\0", 1)[0].decode(errors="replace")


def _verdict(value: memoryview) -> str:
    fields = dict(_attrs(value))
    code = struct.unpack(">i", fields[_NFTA_VERDICT_CODE])[0] if _NFTA_VERDICT_CODE in fields else 1
    word = _VERDICTS.get(code, f"verdict {code}")
    chain = fields.get(_NFTA_VERDICT_CHAIN)
    return f"{word} {_string(chain)}" if chain is not None and word in ("jump", "goto") else word


def _packet(nfproto: int, network: bytes, transport: bytes) -> Flow | None:
    try:
        if nfproto == _NFPROTO_IPV6 and len(network) >= 40:
            saddr: IPAddress = ipaddress.IPv6Address(network[8:24])
            daddr: IPAddress = ipaddress.IPv6Address(network[24:40])
            protocol = network[6]
        elif nfproto == _NFPROTO_IPV4 and len(network) >= 20:
            saddr, daddr, protocol = (
                ipaddress.IPv4Address(network[12:16]),
                ipaddress.IPv4Address(network[16:20]),
                network[9],
            )
        else:
            return None
    except ValueError:
        return None
    sport, dport = struct.unpack(">HH", transport[:4]) if len(transport) >= 4 else (0, 0)
    return Flow(saddr, daddr, protocol, sport, dport)


def parse_trace(data: bytes) -> list[TraceEvent]:
    """The trace events in *data* (what one read of the trace group's socket returned)."""
    events = []
    for kind, _, _, payload in _messages(data):
        if kind != (_SUBSYS_NFTABLES << 8) | _NFT_MSG_TRACE:
            continue
        fields = dict(_attrs(payload, 4))
        if _NFTA_TRACE_ID not in fields or _NFTA_TRACE_CHAIN not in fields:
            continue
        kind_code = struct.unpack(">I", fields[_NFTA_TRACE_TYPE])[0] if _NFTA_TRACE_TYPE in fields else 0
        if _NFTA_TRACE_VERDICT in fields:
            verdict = _verdict(fields[_NFTA_TRACE_VERDICT])
        elif _NFTA_TRACE_POLICY in fields:
            verdict = _VERDICTS.get(struct.unpack(">i", fields[_NFTA_TRACE_POLICY])[0], "accept")
        else:
            verdict = "continue"
        handle = fields.get(_NFTA_TRACE_RULE_HANDLE)
        packet = None
        if _NFTA_TRACE_NETWORK_HEADER in fields:
            nfproto = struct.unpack(">I", fields[_NFTA_TRACE_NFPROTO])[0] if _NFTA_TRACE_NFPROTO in fields else 0
            transport = bytes(fields.get(_NFTA_TRACE_TRANSPORT_HEADER, b""))
            packet = _packet(nfproto, bytes(fields[_NFTA_TRACE_NETWORK_HEADER]), transport)
        events.append(
            TraceEvent(
                struct.unpack(">I", fields[_NFTA_TRACE_ID])[0],
                _string(fields.get(_NFTA_TRACE_TABLE, memoryview(b""))),
                _string(fields[_NFTA_TRACE_CHAIN]),
                _TRACE_TYPES.get(kind_code, "rule"),
                verdict,
                int.from_bytes(handle, "big") if handle is not None and len(handle) == 8 else None,
                packet,
            )
        )
    return events


@attrs.frozen
class KernelRule:
    """One rule of the table as the kernel holds it: its chain, handle, what it does (``accept``,
    ``drop``, ``return``, ``jump <chain>``, ``goto <chain>``, ``vmap``, ``log``; "" none of these) and
    its expressions' names."""

    chain: str
    handle: int
    action: str
    expressions: tuple[str, ...] = ()


def _kernel_rule(payload: memoryview) -> KernelRule | None:
    chain, handle, action, names = None, None, "", []
    for kind, value in _attrs(payload, 4):
        if kind == _NFTA_RULE_CHAIN:
            chain = _string(value)
        elif kind == _NFTA_RULE_HANDLE and len(value) == 8:
            handle = int.from_bytes(value, "big")
        elif kind == _NFTA_RULE_EXPRESSIONS:
            for elem_kind, elem in _attrs(value):
                if elem_kind != _NFTA_LIST_ELEM:
                    continue
                expr = dict(_attrs(elem))
                name = _string(expr.get(_NFTA_EXPR_NAME, memoryview(b"")))
                names.append(name)
                data = dict(_attrs(expr.get(_NFTA_EXPR_DATA, memoryview(b""))))
                if name == "log":
                    action = "log"
                elif name == "lookup" and _register(data.get(_NFTA_LOOKUP_DREG)) == _NFT_REG_VERDICT:
                    action = "vmap"
                elif name == "immediate" and _register(data.get(_NFTA_IMMEDIATE_DREG)) == _NFT_REG_VERDICT:
                    verdict = dict(_attrs(data.get(_NFTA_IMMEDIATE_DATA, memoryview(b"")))).get(_NFTA_DATA_VERDICT)
                    if verdict is not None:
                        action = _verdict(verdict)
    if chain is None or handle is None:
        return None
    return KernelRule(chain, handle, action, tuple(names))


def _register(value: memoryview | None) -> int | None:
    return struct.unpack(">I", value)[0] if value is not None and len(value) == 4 else None


def parse_rules(data: bytes, seq: int) -> tuple[list[KernelRule], bool, bool]:
    """The rules in one read of a rule dump answering request *seq*: (rules, done, interrupted).
    Raises OSError for the kernel's refusal."""
    rules: list[KernelRule] = []
    done = interrupted = False
    for kind, flags, msg_seq, payload in _messages(data):
        if msg_seq != seq:
            continue
        if kind == _NLMSG_DONE:
            done = True
        elif kind == _NLMSG_ERROR:
            code = -struct.unpack_from("=i", payload)[0]
            if code:
                raise OSError(code, f"nftables rule dump: {os.strerror(code)}")
        elif kind == (_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWRULE:
            interrupted = interrupted or bool(flags & _NLM_F_DUMP_INTR)
            rule = _kernel_rule(payload)
            if rule is not None:
                rules.append(rule)
    return rules, done, interrupted


def conntrack_delete_message(flow: Flow, seq: int) -> bytes:
    """ctnetlink's request deleting the conntrack entry whose original direction is *flow* (acknowledged)."""

    def attr(kind: int, data: bytes) -> bytes:
        return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * (-len(data) % 4)

    src = _CTA_IP_V6_SRC if flow.saddr.version == 6 else _CTA_IP_V4_SRC
    ip = attr(src, flow.saddr.packed) + attr(src + 1, flow.daddr.packed)
    proto = attr(_CTA_PROTO_NUM, bytes([flow.protocol]))
    proto += attr(_CTA_PROTO_SRC_PORT, struct.pack(">H", flow.sport)) + attr(
        _CTA_PROTO_DST_PORT, struct.pack(">H", flow.dport)
    )
    tuple_ = attr(_CTA_TUPLE_IP | _NLA_F_NESTED, ip) + attr(_CTA_TUPLE_PROTO | _NLA_F_NESTED, proto)
    family = socket.AF_INET6 if flow.saddr.version == 6 else socket.AF_INET
    body = struct.pack("=BBH", family, 0, 0) + attr(_CTA_TUPLE_ORIG | _NLA_F_NESTED, tuple_)
    kind = (_SUBSYS_CTNETLINK << 8) | _IPCTNL_MSG_CT_DELETE
    return _HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK, seq, 0) + body


# -- the trace table: pure ------------------------------------------------------------------------


@attrs.frozen
class Target:
    """What --verify sends: the query's first packet from the source pod (``pod``, on this node, behind
    host veth ``iif``) to the destination's address."""

    pod: str
    iif: str
    saddr: IPAddress
    daddr: IPAddress
    protocol: Protocol
    dport: int


def trace_table(target: Target, sport: int) -> str:
    """The nft transaction that (re)makes ``inet flock-trace`` for the packet from *sport*."""
    ip = "ip6" if target.saddr.version == 6 else "ip"
    proto = _L4[PROTOCOL_NUMBERS[target.protocol]]
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
                for chain, hook in _END_CHAINS.items()
                for line in (f"\tchain {chain} {{", f"\t\ttype filter hook {hook} priority 1000; policy accept;", "\t}")
            ),
            "}",
            "",
        ]
    )


DROP_TRACE_TABLE = f"add table {FAMILY} {TRACE_TABLE}\ndelete table {FAMILY} {TRACE_TABLE}\n"


# -- naming the kernel's rules: pure --------------------------------------------------------------


@attrs.frozen
class RulePlace:
    """What a kernel rule of ``table inet flock`` is: rule ``index`` of its compiled chain (``part``
    "rule", or "log": a logged drop's log rule), a base chain's fixed rule (``part`` "base", ``note``
    "established", "vmap" or "always"), or none of the ruleset's (``part`` "foreign", ``note`` why)."""

    chain: str
    handle: int
    part: str
    index: int | None = None
    note: str = ""


@attrs.frozen
class Places:
    """Every rule of the table by handle, and per compiled chain how many rules it has (for its end)."""

    rules: Mapping[int, RulePlace] = attrs.field(factory=dict)
    lengths: Mapping[str, int] = attrs.field(factory=dict)


def _expected(ruleset: Ruleset, chain: str) -> list[tuple[int, str, str]]:
    """(compiled index, part, kernel action) of each kernel rule *chain* should hold."""
    out = []
    for i, rule in enumerate(ruleset.chains[chain].rules):
        if rule.log is not None:
            out.append((i, "log", "log"))
        out.append((i, "rule", rule.verdict))
    return out


def place_rules(rules: Iterable[KernelRule], ruleset: Ruleset | None) -> Places:
    """Name each of *rules* (``table inet flock`` in the kernel, in chain order) from *ruleset* (the one in
    force).  A compiled chain's kernel rules are matched to its rules in order by what they do; a kernel
    rule that matches none (put there by hand, say) is "foreign"."""
    chains: dict[str, list[KernelRule]] = {}
    for rule in rules:
        chains.setdefault(rule.chain, []).append(rule)
    compiled = ruleset.chains if ruleset is not None else {}
    places: dict[int, RulePlace] = {}
    for chain, held in chains.items():
        if chain in _BASE_CHAINS:
            for r in held:
                if "ct" in r.expressions and r.action == "accept":
                    places[r.handle] = RulePlace(chain, r.handle, "base", note="established")
                elif r.action == "vmap":
                    places[r.handle] = RulePlace(chain, r.handle, "base", note="vmap")
                elif chain == INPUT_CHAIN and r.action == "accept":
                    places[r.handle] = RulePlace(chain, r.handle, "base", note="always")
                else:
                    places[r.handle] = RulePlace(chain, r.handle, "foreign", note="not one of the base chain's rules")
            continue
        if chain not in compiled:
            for r in held:
                places[r.handle] = RulePlace(
                    chain, r.handle, "foreign", note="a chain the ruleset in force does not have"
                )
            continue
        assert ruleset is not None
        want = _expected(ruleset, chain)
        k = 0
        for r in held:
            if k < len(want) and want[k][2] == r.action:
                places[r.handle] = RulePlace(chain, r.handle, want[k][1], want[k][0])
                k += 1
            else:
                places[r.handle] = RulePlace(chain, r.handle, "foreign", note="not a rule the ruleset in force has")
        if k < len(want):  # not the compiled chain with rules added: name none of it
            why = f"the chain holds {len(held)} rules in the kernel, {len(want)} in the ruleset in force"
            for r in held:
                places[r.handle] = RulePlace(chain, r.handle, "foreign", note=why)
    lengths = {name: len(c.rules) for name, c in compiled.items()}
    return Places(places, lengths)


# -- the kernel's walk: pure -------------------------------------------------------------------------


@attrs.frozen
class KernelStep:
    """One event of a walk, named: a rule that matched (``handle``; ``index``/``part``/``note`` as
    :class:`RulePlace`), a chain's end (``part`` "end", ``index`` its length when known) or the base
    chain's policy (``part`` "policy")."""

    chain: str
    verdict: str
    handle: int | None = None
    index: int | None = None
    part: str = "rule"
    note: str = ""

    def text(self) -> str:
        return kernel_step_text(self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "handle": self.handle,
            "rule": self.index,
            "part": self.part,
            "verdict": self.verdict,
            "note": self.note,
        }


@attrs.frozen
class KernelWalk:
    """One of flock's base chains as the kernel walked the packet through it; ``verdict`` "accept" or "drop"."""

    chain: str
    steps: tuple[KernelStep, ...]
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {"chain": self.chain, "verdict": self.verdict, "steps": [s.to_json() for s in self.steps]}


@attrs.frozen
class KernelTrace:
    """What the kernel did with the probe: ``seen`` (it was traced at all), flock's base chains it met
    (``walks``), the hooks it got through flock's chains of (``passed``: "forward", "input"), and a drop
    by a table not flock's (``dropped_elsewhere``)."""

    flow: Flow
    seen: bool = False
    walks: Mapping[str, KernelWalk] = attrs.field(factory=dict)
    passed: frozenset[str] = frozenset()
    dropped_elsewhere: str = ""
    trace_id: int | None = None

    @property
    def complete(self) -> bool:
        """Its fate is known: through a hook, or dropped."""
        return (
            bool(self.passed) or bool(self.dropped_elsewhere) or any(w.verdict == "drop" for w in self.walks.values())
        )


def _step(event: TraceEvent, places: Places) -> KernelStep:
    if event.kind == "policy":
        return KernelStep(event.chain, event.verdict, part="policy")
    if event.handle is None:
        return KernelStep(event.chain, event.verdict, index=places.lengths.get(event.chain), part="end")
    place = places.rules.get(event.handle)
    if place is None or place.chain != event.chain:
        return KernelStep(
            event.chain, event.verdict, event.handle, part="foreign", note="a rule not in the table's dump"
        )
    return KernelStep(event.chain, event.verdict, event.handle, place.index, place.part, place.note)


def kernel_trace(events: Iterable[TraceEvent], flow: Flow, places: Places) -> KernelTrace:
    """The probe's way through the node's chains, from the trace *events* (in the order read): the
    events of the first trace that carries *flow*, each base chain's from the event carrying the packet."""
    trace_id = None
    walks: dict[str, KernelWalk] = {}
    passed: set[str] = set()
    elsewhere = ""
    current: str | None = None  # the flock base chain being walked (None: another chain)
    steps: list[KernelStep] = []

    def close() -> None:
        if current is not None:
            verdict = "drop" if steps and steps[-1].verdict == "drop" else "accept"
            walks[current] = KernelWalk(current, tuple(steps), verdict)

    for event in events:
        if trace_id is None:
            if event.packet != flow:
                continue
            trace_id = event.trace_id
        elif event.trace_id != trace_id:
            continue
        if event.packet is not None:  # a base chain's first event
            close()
            current = event.chain if event.table == TABLE and event.chain in _BASE_CHAINS else None
            steps = []
        if event.table == TRACE_TABLE:
            if event.chain in _END_CHAINS:
                passed.add(_END_CHAINS[event.chain])
            continue
        if current is not None and event.table == TABLE:
            if event.handle is None and event.kind != "policy" and event.chain == current:
                continue  # the base chain's end: its policy follows
            steps.append(_step(event, places))
        elif event.table != TABLE and event.verdict == "drop" and not elsewhere:
            where = f" rule handle {event.handle}" if event.handle is not None else f" ({event.kind})"
            elsewhere = f"table {event.table} chain {event.chain}{where}"
    close()
    return KernelTrace(flow, trace_id is not None, walks, frozenset(passed), elsewhere, trace_id)


# -- held to the explanation: pure ---------------------------------------------------------------


@attrs.frozen
class Decision:
    """What decided a direction: ``verdict`` at ``chain`` rule ``index`` (a step), or nothing (chain None:
    no rule of flock's decided, the packet went on)."""

    verdict: str  # "accept" / "drop"
    chain: str | None = None
    index: int | None = None
    step: KernelStep | None = None  # the kernel's

    def same(self, other: Decision) -> bool:
        return (self.verdict, self.chain, self.index) == (other.verdict, other.chain, other.index)

    def kernel_text(self) -> str:
        s = self.step
        if s is None:
            return "let it through (no rule of flock's decided)"
        verb = "dropped" if self.verdict == "drop" else "accepted"
        if s.part == "policy":
            return f"dropped it by {s.chain}'s policy"
        if s.part == "base" and s.note == "established":
            return f"accepted it as a flow conntrack already knows ({s.chain}'s ct state rule, handle {s.handle})"
        if s.part == "base":
            return f"accepted it before any policy ({s.chain}'s rule handle {s.handle})"
        if s.index is None:
            return f"{verb} it at {s.chain} rule handle {s.handle} ({s.note})"
        return f"{verb} it at {s.chain}[{s.index}] (rule handle {s.handle})"

    def expected_text(self) -> str:
        if self.chain is None:
            return "it goes through (no rule decides)"
        return f"it is {'dropped' if self.verdict == 'drop' else 'accepted'} at {self.chain}[{self.index}]"


def _expected_decision(d: DirectionVerdict) -> Decision:
    trace = d.trace
    if trace is None or trace.chain is None:
        return Decision("accept")
    matched = [s for s in trace.steps if not s.end]
    if matched and matched[-1].verdict in ("accept", "drop"):
        return Decision(matched[-1].verdict, matched[-1].chain, matched[-1].rule)
    return Decision("accept")


def _kernel_decision(walk: KernelWalk) -> Decision:
    last = walk.steps[-1] if walk.steps else None
    if last is None or last.verdict not in ("accept", "drop") or (last.part == "policy" and last.verdict == "accept"):
        return Decision("accept")
    # a base chain's own rule or policy decides no direction the explanation names: never the same as its
    where = f"{last.chain}:{last.note or last.part}" if last.part in ("base", "policy") else last.chain
    return Decision(last.verdict, where, last.index, last)


@attrs.frozen
class DirectionCheck:
    """One direction held to the kernel: ``status`` "agrees", "disagrees" or "not-verified" (``why``)."""

    direction: str
    status: str
    why: str = ""
    walk: KernelWalk | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "why": self.why,
            "kernel": self.walk.to_json() if self.walk is not None else None,
        }


def _check(d: DirectionVerdict, base: str | None, kernel: KernelTrace, here: str, hook: str) -> DirectionCheck:
    """Direction *d* against the kernel's walk of flock's *base* chain (None: the packet meets none for it)."""
    name = d.direction
    if d.hook is not None and d.node != here:
        other = "ingress" if name == "egress" else "egress"
        return DirectionCheck(
            name,
            "not-verified",
            f"{name} not verified: {d.subject} is on {d.node or 'no node'}, whose kernel enforces it "
            f"(the packet can be sent only from a pod on this node, and traced only where it passes); "
            f"the {other} part was verified",
        )
    walk = kernel.walks.get(base) if base is not None else None
    expected = _expected_decision(d)
    if walk is None:
        if hook in kernel.passed:  # through the hook and no chain of flock's for it: nothing filtered it
            if expected.chain is None:
                return DirectionCheck(name, "agrees")
            return DirectionCheck(
                name,
                "disagrees",
                f"{name}: the kernel let it through without meeting flock's {base or hook} chain "
                f"where the explanation says {expected.expected_text()}",
            )
        if kernel.dropped_elsewhere or any(w.verdict == "drop" for w in kernel.walks.values()):
            return DirectionCheck(name, "not-verified", f"{name} not verified: the packet was dropped before it")
        return DirectionCheck(
            name, "not-verified", f"{name} not verified: the kernel did not show the packet in flock's {base} chain"
        )
    got = _kernel_decision(walk)
    entry = _entry_parting(d, walk)
    if not got.same(expected):
        why = f"{name}: the kernel {got.kernel_text()} where the explanation says {expected.expected_text()}"
        return DirectionCheck(name, "disagrees", why + (f" ({entry})" if entry else ""), walk)
    parted = entry or _parting(d, walk)
    if parted:
        return DirectionCheck(name, "disagrees", f"{name}: {parted}", walk)
    return DirectionCheck(name, "agrees", walk=walk)


def _entry_parting(d: DirectionVerdict, walk: KernelWalk) -> str:
    """The base chain's map sending the packet to another chain than the explanation's ("" the same)."""
    entry = next((s for s in walk.steps if s.part == "base" and s.note == "vmap"), None)
    named = entry.verdict.removeprefix("jump ").removeprefix("goto ") if entry is not None else None
    want = d.trace.chain if d.trace is not None else None
    if named == want:
        return ""
    return (
        f"the kernel's {walk.chain} chain sent it to {named or 'no chain'} where the explanation names {want or 'none'}"
    )


def _parting(d: DirectionVerdict, walk: KernelWalk) -> str:
    """Where the kernel's rules and the explanation's part ("" nowhere)."""
    trace = d.trace
    expected = [(s.chain, s.rule, s.verdict) for s in (trace.steps if trace is not None else ()) if not s.end]
    met = [s for s in walk.steps if s.handle is not None and s.part not in ("base", "log") and s.verdict != "continue"]
    for i in range(max(len(expected), len(met))):
        e = expected[i] if i < len(expected) else None
        k = met[i] if i < len(met) else None
        if k is not None and e is not None and (k.chain, k.index, k.verdict) == e:
            continue
        kernel = f"met {k.text()}" if k is not None else "met no further rule"
        explained = f"{e[0]}[{e[1]}] {e[2]}" if e is not None else "no further rule"
        return f"the kernel {kernel} where the explanation meets {explained}"
    return ""


@attrs.frozen
class Verification:
    """The kernel held to an explanation: ``status`` "agrees" (every direction it could check),
    "disagrees" (``why``: where they part) or "not-verified" (``why``)."""

    status: str
    why: str = ""
    node: str = ""
    flow: Flow | None = None
    checks: tuple[DirectionCheck, ...] = ()
    notes: tuple[str, ...] = ()
    trace_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        by = {c.direction: c.to_json() for c in self.checks}
        flow = self.flow
        return {
            "status": self.status,
            "why": self.why,
            "node": self.node,
            "probe": None
            if flow is None
            else {
                "from": str(flow.saddr),
                "to": str(flow.daddr),
                "protocol": _L4.get(flow.protocol, str(flow.protocol)).upper(),
                "sport": flow.sport,
                "dport": flow.dport,
                "trace_id": f"{self.trace_id:08x}" if self.trace_id is not None else None,
            },
            "egress": by.get("egress"),
            "ingress": by.get("ingress"),
            "notes": list(self.notes),
        }


def verify_plan(explanation: Explanation, here: str) -> Target | str:
    """The packet to send for *explanation* from node *here*, or why none can be."""
    src, dst = explanation.source, explanation.destination
    if explanation.verdict is Verdict.UNKNOWN:
        return "cannot verify: the explanation cannot tell, so there is nothing to hold the kernel to"
    if src.pod is None or src.address is None or dst.address is None:
        return "cannot verify: the source is no pod (the packet is sent from inside the source pod)"
    if not src.local or src.pod.host_veth is None:
        where = f"; run it on {src.node}" if src.node and src.node != here else ""
        return f"cannot verify: the source is not on this node{where}"
    if dst.pod is not None and dst.pod.key == src.pod.key:
        return "nothing to verify: a pod reaching itself never leaves its network namespace"
    return Target(
        src.pod.key, src.pod.host_veth, src.address, dst.address, explanation.query.protocol, explanation.query.port
    )


def verify(explanation: Explanation, here: str, kernel: KernelTrace) -> Verification:
    """Hold each direction of *explanation* to what *kernel* shows on node *here*."""
    egress, ingress = explanation.egress, explanation.ingress
    assert egress is not None and ingress is not None
    flow = kernel.flow
    if not kernel.seen:
        why = "cannot verify: the kernel never showed the packet (no trace of it within the wait)"
        return Verification("not-verified", why, here, flow)
    if not kernel.walks and not kernel.passed and not kernel.dropped_elsewhere:
        why = (
            f"cannot verify: the packet came into the node but met none of flock's chains and did not get "
            f"through them within the wait (no route to {flow.daddr}?)"
        )
        return Verification("not-verified", why, here, flow, trace_id=kernel.trace_id)
    into_node = egress.hook == "input"
    if not into_node and EGRESS_CHAIN not in kernel.walks and (INPUT_CHAIN in kernel.walks or "input" in kernel.passed):
        why = (
            f"cannot verify: the kernel delivered the packet to this node itself (the input hook) where the "
            f"explanation has it forwarded: it does not know {flow.daddr} for one of this node's addresses"
        )
        return Verification("not-verified", why, here, flow, trace_id=kernel.trace_id)
    notes = []
    checks = (
        _check(egress, INPUT_CHAIN if into_node else EGRESS_CHAIN, kernel, here, "input" if into_node else "forward"),
        _check(ingress, None if into_node else INGRESS_CHAIN, kernel, here, "input" if into_node else "forward"),
    )
    if not kernel.complete:
        notes.append("the kernel did not show the packet leaving flock's chains within the wait")
    if kernel.dropped_elsewhere:
        notes.append(f"{kernel.dropped_elsewhere} dropped it: that table is not flock's")
    disagree = [c.why for c in checks if c.status == "disagrees"]
    if disagree:
        return Verification("disagrees", "; ".join(disagree), here, flow, checks, tuple(notes), kernel.trace_id)
    if any(c.status == "agrees" for c in checks):
        notes += [c.why for c in checks if c.status == "not-verified"]
        return Verification("agrees", "", here, flow, checks, tuple(notes), kernel.trace_id)
    why = "; ".join(c.why for c in checks if c.why) or "cannot verify"
    return Verification("not-verified", why, here, flow, checks, tuple(notes), kernel.trace_id)


# -- the kernel ---------------------------------------------------------------------------------------


def _call_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """``fn()`` on a fresh thread that enters *netns* (a path) and ends (None: on this thread).  Blocking."""
    return call_in_netns(netns, fn, name="flock-trace")


def _netlink() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
    sock.bind((0, 0))
    return sock


def trace_socket() -> socket.socket:
    """A non-blocking netlink socket of this thread's namespace, a member of the trace group."""
    sock = _netlink()
    try:
        sock.setsockopt(_SOL_NETLINK, _NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTRACE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def dump_rules(table: str = TABLE) -> list[KernelRule]:
    """Every rule of ``inet <table>`` in chain order ([]: no table), with one netlink dump (no set elements).
    Blocking: run it on a thread in the table's namespace."""
    with _netlink() as sock:
        for seq in range(1, _DUMP_ATTEMPTS + 1):
            sock.send(_request(table, seq))
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
    with _netlink() as sock:
        sock.send(conntrack_delete_message(flow, 1))
        for kind, _, seq, payload in _messages(sock.recv(1 << 16)):
            if kind == _NLMSG_ERROR and seq == 1:
                code = -struct.unpack_from("=i", payload)[0]
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


@attrs.frozen
class Captured:
    """What one traced packet left: its flow, the trace events read, ``table inet flock``'s rules when it
    was sent, whether they changed meanwhile, and whether trace messages were lost (the socket full)."""

    flow: Flow
    events: tuple[TraceEvent, ...]
    rules: tuple[KernelRule, ...]
    changed: bool = False
    lost: bool = False


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
        return await trio.to_thread.run_sync(_call_in_netns, self.node_netns, fn)

    async def trace(self, target: Target, pod_netns: str) -> Captured:
        """Send *target*'s packet from *pod_netns* (the source pod's network namespace, a path) and trace it."""
        try:
            probe = await trio.to_thread.run_sync(_call_in_netns, pod_netns, functools.partial(_probe_socket, target))
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


def verification_of(explanation: Explanation, here: str, captured: Captured, ruleset: Ruleset | None) -> Verification:
    """:func:`verify` for what :meth:`Tracer.trace` captured, its rules named from *ruleset* (the one in force)."""
    if captured.changed:
        why = "cannot verify: flock's table changed while the packet was traced: run it again"
        return Verification("not-verified", why, here, captured.flow)
    kernel = kernel_trace(captured.events, captured.flow, place_rules(captured.rules, ruleset))
    result = verify(explanation, here, kernel)
    if captured.lost:
        result = attrs.evolve(result, notes=(*result.notes, "some trace messages were lost (the socket was full)"))
    return result
