"""The nfnetlink wire: netlink messages and attributes, and what flock reads and writes of nf_tables and ctnetlink.

Every byte flock exchanges with netfilter over netlink is walked and built
here, once: the messages of a datagram (:func:`messages`), the attributes of
a payload (:func:`attributes`, :func:`attribute`), a request
(:func:`request`), and an error's code (:func:`error_code`).  On top of them,
what the kernel's own formats say:

- nf_tables: the trace group's events (:func:`parse_trace`), a rule dump of
  one table (:func:`rule_dump_request`, :func:`parse_rules`), read by the
  tracer of ``--verify`` (:mod:`._tracer`) and the rule counters
  (:mod:`._counters`), and a dump of one set's elements
  (:func:`setelem_dump_request`, :func:`set_elements`) for its element counters;
- ctnetlink: deleting one flow's conntrack entry (:func:`conntrack_delete_message`).

The deny-log reader (:mod:`._denylog`) speaks nfnetlink_log with the same
messages and attributes.  All of it is pure but :func:`netfilter_socket`,
which opens a socket in the calling thread's network namespace (entering
another is :mod:`flock.netns`'s).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

import attrs

from ._model import IPAddress

# linux/netlink.h, linux/netfilter/nfnetlink.h, nf_tables.h, nfnetlink_conntrack.h
NETLINK_NETFILTER = 12
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
NFNLGRP_NFTRACE = 9
NFPROTO_INET, NFPROTO_IPV4, NFPROTO_IPV6 = 1, 2, 10
SUBSYS_CTNETLINK, SUBSYS_ULOG, SUBSYS_NFTABLES = 1, 4, 10
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP_INTR, NLM_F_DUMP = 0x1, 0x4, 0x10, 0x300
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
NFGEN = struct.Struct("=BBH")  # nfgenmsg: family, version, res_id (big-endian)
L4_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}  # the IP protocols a probe can be

_NFT_MSG_NEWRULE, _NFT_MSG_GETRULE, _NFT_MSG_NEWSETELEM, _NFT_MSG_GETSETELEM, _NFT_MSG_TRACE = 6, 7, 12, 13, 17
_NFT_MSG_NEWTABLE, _NFT_MSG_GETTABLE, _NFTA_TABLE_NAME = 0, 1, 1
_NFTA_SET_ELEM_LIST_TABLE, _NFTA_SET_ELEM_LIST_SET, _NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
_NFTA_SET_ELEM_KEY, _NFTA_SET_ELEM_EXPR, _NFTA_SET_ELEM_EXPRESSIONS = 1, 7, 11
_NFTA_DATA_VALUE = 1
_IPCTNL_MSG_CT_DELETE = 2
_NFTA_TRACE_TABLE, _NFTA_TRACE_CHAIN, _NFTA_TRACE_RULE_HANDLE, _NFTA_TRACE_TYPE = 1, 2, 3, 4
_NFTA_TRACE_VERDICT, _NFTA_TRACE_ID = 5, 6
_NFTA_TRACE_NETWORK_HEADER, _NFTA_TRACE_TRANSPORT_HEADER = 8, 9
_NFTA_TRACE_NFPROTO, _NFTA_TRACE_POLICY = 15, 16
_TRACE_TYPES = {1: "policy", 2: "return", 3: "rule"}
_NFTA_VERDICT_CODE, _NFTA_VERDICT_CHAIN = 1, 2
_VERDICTS = {0: "drop", 1: "accept", 2: "stolen", 3: "queue", 4: "repeat", 5: "stop"}
_VERDICTS |= {-1: "continue", -2: "break", -3: "jump", -4: "goto", -5: "return"}
NFTA_RULE_TABLE, NFTA_RULE_CHAIN, NFTA_RULE_HANDLE, NFTA_RULE_EXPRESSIONS = 1, 2, 3, 4
NFTA_LIST_ELEM, NFTA_EXPR_NAME, NFTA_EXPR_DATA = 1, 1, 2
_NFTA_IMMEDIATE_DREG, _NFTA_IMMEDIATE_DATA, _NFTA_DATA_VERDICT = 1, 2, 2
_NFTA_LOOKUP_DREG = 3
_NFT_REG_VERDICT = 0
_CTA_TUPLE_ORIG, _CTA_TUPLE_IP, _CTA_TUPLE_PROTO = 1, 1, 2
_CTA_IP_V4_SRC, _CTA_IP_V6_SRC = 1, 3  # the destinations follow each
_CTA_PROTO_NUM, _CTA_PROTO_SRC_PORT, _CTA_PROTO_DST_PORT = 1, 2, 3


# -- messages and attributes ----------------------------------------------------------------------


class Message(NamedTuple):
    """One netlink message: its type (``kind``), flags, sequence number and payload (after the header)."""

    kind: int
    flags: int
    seq: int
    payload: memoryview


def messages(data: bytes | memoryview) -> Iterator[Message | None]:
    """Each netlink message in *data* (one datagram), in order; None for one whose length is impossible
    (shorter than its header, or past the datagram's end), after which nothing can be read."""
    view = memoryview(data)
    offset = 0
    while offset + HEADER.size <= len(view):
        length, kind, flags, seq, _ = HEADER.unpack_from(view, offset)
        if length < HEADER.size or offset + length > len(view):
            yield None
            return
        yield Message(kind, flags, seq, view[offset + HEADER.size : offset + length])
        offset += (length + 3) & ~3


def attributes(data: bytes | memoryview, offset: int = 0) -> Iterator[tuple[int, memoryview]]:
    """(type, value) of each netlink attribute in *data* from *offset* (the type without its flags)."""
    view = memoryview(data)
    while offset + 4 <= len(view):
        length, kind = struct.unpack_from("=HH", view, offset)
        if length < 4:
            return
        yield kind & NLA_TYPE_MASK, view[offset + 4 : offset + length]
        offset += (length + 3) & ~3


def attribute(kind: int, data: bytes) -> bytes:
    """One netlink attribute (for a nested one, *kind* | :data:`NLA_F_NESTED` and *data* its attributes)."""
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * (-len(data) % 4)


def request(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    """One netlink message of type *kind* (:data:`NLM_F_REQUEST` added to *flags*)."""
    return HEADER.pack(HEADER.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body


def error_code(payload: memoryview) -> int:
    """The errno an ``NLMSG_ERROR`` message carries (0: an acknowledgement)."""
    return -struct.unpack_from("=i", payload)[0]


def string(value: memoryview) -> str:
    """A NUL-terminated string attribute."""
    return bytes(value).split(b"\0", 1)[0].decode(errors="replace")


def netfilter_socket() -> socket.socket:
    """A bound, blocking ``NETLINK_NETFILTER`` socket of the calling thread's network namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
    try:
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


# -- nf_tables: trace events ----------------------------------------------------------------------


@attrs.frozen
class Flow:
    """A packet's 5-tuple (``protocol``: the IP protocol number)."""

    saddr: IPAddress
    daddr: IPAddress
    protocol: int
    sport: int
    dport: int

    @property
    def protocol_name(self) -> str:
        """ "TCP", "UDP", "SCTP" (another protocol: its number)."""
        return L4_NAMES.get(self.protocol, str(self.protocol)).upper()

    def text(self) -> str:
        return f"{self.protocol_name} {_at(self.saddr, self.sport)} → {_at(self.daddr, self.dport)}"


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


def _verdict(value: memoryview) -> str:
    fields = dict(attributes(value))
    code = struct.unpack(">i", fields[_NFTA_VERDICT_CODE])[0] if _NFTA_VERDICT_CODE in fields else 1
    word = _VERDICTS.get(code, f"verdict {code}")
    chain = fields.get(_NFTA_VERDICT_CHAIN)
    return f"{word} {string(chain)}" if chain is not None and word in ("jump", "goto") else word


def _packet(nfproto: int, network: bytes, transport: bytes) -> Flow | None:
    try:
        if nfproto == NFPROTO_IPV6 and len(network) >= 40:
            saddr: IPAddress = ipaddress.IPv6Address(network[8:24])
            daddr: IPAddress = ipaddress.IPv6Address(network[24:40])
            protocol = network[6]
        elif nfproto == NFPROTO_IPV4 and len(network) >= 20:
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
    for message in messages(data):
        if message is None or message.kind != (SUBSYS_NFTABLES << 8) | _NFT_MSG_TRACE:
            continue
        fields = dict(attributes(message.payload, NFGEN.size))
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
                string(fields.get(_NFTA_TRACE_TABLE, memoryview(b""))),
                string(fields[_NFTA_TRACE_CHAIN]),
                _TRACE_TYPES.get(kind_code, "rule"),
                verdict,
                int.from_bytes(handle, "big") if handle is not None and len(handle) == 8 else None,
                packet,
            )
        )
    return events


# -- nf_tables: rule dumps ------------------------------------------------------------------------


def rule_dump_request(table: str, seq: int) -> bytes:
    """``NFT_MSG_GETRULE``: dump every rule of ``inet <table>`` (no set elements)."""
    body = NFGEN.pack(NFPROTO_INET, 0, 0) + attribute(NFTA_RULE_TABLE, table.encode() + b"\0")
    return request((SUBSYS_NFTABLES << 8) | _NFT_MSG_GETRULE, NLM_F_DUMP, seq, body)


def table_request(table: str, seq: int) -> bytes:
    """``NFT_MSG_GETTABLE`` for ``inet <table>`` alone: answered by the table (NEWTABLE) or ENOENT."""
    body = NFGEN.pack(NFPROTO_INET, 0, 0) + attribute(_NFTA_TABLE_NAME, table.encode() + b"\0")
    return request((SUBSYS_NFTABLES << 8) | _NFT_MSG_GETTABLE, NLM_F_ACK, seq, body)


def is_table(message: Message) -> bool:
    return message.kind == (SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWTABLE


def setelem_dump_request(table: str, name: str, seq: int) -> bytes:
    """``NFT_MSG_GETSETELEM``: dump the elements of set (or map) *name* of ``inet <table>``."""
    body = (
        NFGEN.pack(NFPROTO_INET, 0, 0)
        + attribute(_NFTA_SET_ELEM_LIST_TABLE, table.encode() + b"\0")
        + attribute(_NFTA_SET_ELEM_LIST_SET, name.encode() + b"\0")
    )
    return request((SUBSYS_NFTABLES << 8) | _NFT_MSG_GETSETELEM, NLM_F_DUMP, seq, body)


def is_setelem(message: Message) -> bool:
    """*message* is a batch of elements of a set element dump (``NFT_MSG_NEWSETELEM``)."""
    return message.kind == (SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWSETELEM


def set_elements(payload: memoryview) -> Iterator[tuple[bytes, list[tuple[str, dict[int, memoryview]]]]]:
    """(key bytes, its expressions as (name, data attributes)) of each element of one dump message."""
    for kind, value in attributes(payload, NFGEN.size):
        if kind != _NFTA_SET_ELEM_LIST_ELEMENTS:
            continue
        for elem_kind, elem in attributes(value):
            if elem_kind != NFTA_LIST_ELEM:
                continue
            key, exprs = b"", []
            for attr, data in attributes(elem):
                if attr == _NFTA_SET_ELEM_KEY:
                    key = bytes(dict(attributes(data)).get(_NFTA_DATA_VALUE, memoryview(b"")))
                elif attr == _NFTA_SET_ELEM_EXPR:  # the element's one expression
                    expr = dict(attributes(data))
                    name = string(expr.get(NFTA_EXPR_NAME, memoryview(b"")))
                    exprs.append((name, dict(attributes(expr.get(NFTA_EXPR_DATA, memoryview(b""))))))
                elif attr == _NFTA_SET_ELEM_EXPRESSIONS:  # several
                    exprs.extend(expressions(data))
            yield key, exprs


def is_rule(message: Message) -> bool:
    """*message* is one rule of a dump (``NFT_MSG_NEWRULE``)."""
    return message.kind == (SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWRULE


@attrs.frozen
class KernelRule:
    """One rule of the table as the kernel holds it: its chain, handle, what it does (``accept``,
    ``drop``, ``return``, ``jump <chain>``, ``goto <chain>``, ``vmap``, ``log``; "" none of these) and
    its expressions' names."""

    chain: str
    handle: int
    action: str
    expressions: tuple[str, ...] = ()


def expressions(rule: memoryview) -> Iterator[tuple[str, dict[int, memoryview]]]:
    """(name, data attributes) of each expression of a rule's ``NFTA_RULE_EXPRESSIONS`` attribute."""
    for elem_kind, elem in attributes(rule):
        if elem_kind != NFTA_LIST_ELEM:
            continue
        expr = dict(attributes(elem))
        name = string(expr.get(NFTA_EXPR_NAME, memoryview(b"")))
        yield name, dict(attributes(expr.get(NFTA_EXPR_DATA, memoryview(b""))))


def _kernel_rule(payload: memoryview) -> KernelRule | None:
    chain, handle, action, names = None, None, "", []
    for kind, value in attributes(payload, NFGEN.size):
        if kind == NFTA_RULE_CHAIN:
            chain = string(value)
        elif kind == NFTA_RULE_HANDLE and len(value) == 8:
            handle = int.from_bytes(value, "big")
        elif kind == NFTA_RULE_EXPRESSIONS:
            for name, data in expressions(value):
                names.append(name)
                if name == "log":
                    action = "log"
                elif name == "lookup" and _register(data.get(_NFTA_LOOKUP_DREG)) == _NFT_REG_VERDICT:
                    action = "vmap"
                elif name == "immediate" and _register(data.get(_NFTA_IMMEDIATE_DREG)) == _NFT_REG_VERDICT:
                    immediate = dict(attributes(data.get(_NFTA_IMMEDIATE_DATA, memoryview(b""))))
                    verdict = immediate.get(_NFTA_DATA_VERDICT)
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
    for message in messages(data):
        if message is None or message.seq != seq:
            continue
        if message.kind == NLMSG_DONE:
            done = True
        elif message.kind == NLMSG_ERROR:
            code = error_code(message.payload)
            if code:
                raise OSError(code, f"nftables rule dump: {os.strerror(code)}")
        elif is_rule(message):
            interrupted = interrupted or bool(message.flags & NLM_F_DUMP_INTR)
            rule = _kernel_rule(message.payload)
            if rule is not None:
                rules.append(rule)
    return rules, done, interrupted


# -- ctnetlink ------------------------------------------------------------------------------------


def conntrack_delete_message(flow: Flow, seq: int) -> bytes:
    """ctnetlink's request deleting the conntrack entry whose original direction is *flow* (acknowledged)."""
    src = _CTA_IP_V6_SRC if flow.saddr.version == 6 else _CTA_IP_V4_SRC
    ip = attribute(src, flow.saddr.packed) + attribute(src + 1, flow.daddr.packed)
    proto = attribute(_CTA_PROTO_NUM, bytes([flow.protocol]))
    proto += attribute(_CTA_PROTO_SRC_PORT, struct.pack(">H", flow.sport))
    proto += attribute(_CTA_PROTO_DST_PORT, struct.pack(">H", flow.dport))
    tuple_ = attribute(_CTA_TUPLE_IP | NLA_F_NESTED, ip) + attribute(_CTA_TUPLE_PROTO | NLA_F_NESTED, proto)
    family = socket.AF_INET6 if flow.saddr.version == 6 else socket.AF_INET
    body = NFGEN.pack(family, 0, 0) + attribute(_CTA_TUPLE_ORIG | NLA_F_NESTED, tuple_)
    return request((SUBSYS_CTNETLINK << 8) | _IPCTNL_MSG_CT_DELETE, NLM_F_ACK, seq, body)
