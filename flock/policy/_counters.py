"""The rule counters of one ``inet`` table, read with one netlink dump of its rules.

``nft list table`` (1.0.6, Debian 12's) fetches every set's elements before it
prints a rule, even with ``--terse``: at 150,000 pods that is seconds of CPU
and hundreds of MiB for figures that live in the rules alone.  The kernel's
rule dump (``NFT_MSG_GETRULE``, filtered to the table) carries each rule's
expressions, counters included, and names sets without their elements.

Chains of ClusterNetworkPolicy tiers (``ta-``, ``tb-``) inline the rules of
several policies: their counters are also given rule by rule, as
``"<chain>#<i>"`` for the chain's *i*-th counted rule.

Call :func:`rule_counters` on a thread inside the network namespace whose
table it reads (the socket belongs to the namespace it is opened in).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator

NETLINK_NETFILTER = 12
NFPROTO_INET = 1
_NFT_MSG_NEWRULE, _NFT_MSG_GETRULE = 6, 7
_SUBSYS_NFTABLES = 10
_NLM_F_REQUEST, _NLM_F_DUMP, _NLM_F_DUMP_INTR = 0x1, 0x300, 0x10
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NFTA_RULE_TABLE, _NFTA_RULE_CHAIN, _NFTA_RULE_EXPRESSIONS = 1, 2, 4
_NFTA_LIST_ELEM = 1
_NFTA_EXPR_NAME, _NFTA_EXPR_DATA = 1, 2
_NFTA_COUNTER_BYTES, _NFTA_COUNTER_PACKETS = 1, 2
_NLA_TYPE_MASK = 0x3FFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_ATTEMPTS = 3  # a dump interrupted by a concurrent change of the ruleset is read again
PER_RULE = ("ta-", "tb-")  # chains whose counters are also given per rule


def add_counter(totals: dict[str, tuple[int, int]], chain: str, packets: int, nbytes: int) -> None:
    """Count one rule's counter into *totals*: its chain's sum, and the rule alone for :data:`PER_RULE` chains."""
    p0, b0 = totals.get(chain, (0, 0))
    totals[chain] = (p0 + packets, b0 + nbytes)
    if chain.startswith(PER_RULE):
        index = totals.get(chain + "#", (0, 0))[0]
        totals[chain + "#"] = (index + 1, 0)  # the next rule's index, removed at the end
        totals[f"{chain}#{index}"] = (packets, nbytes)


def finish(totals: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {k: v for k, v in totals.items() if not k.endswith("#")}


class DumpError(OSError):
    """The kernel refused the rule dump (errno)."""


def _attrs(data: bytes | memoryview, offset: int = 0) -> Iterator[tuple[int, memoryview]]:
    view = memoryview(data)
    while offset + 4 <= len(view):
        length, kind = struct.unpack_from("=HH", view, offset)
        if length < 4:
            return
        yield kind & _NLA_TYPE_MASK, view[offset + 4 : offset + length]
        offset += (length + 3) & ~3


def _rule(payload: memoryview) -> tuple[str, int, int, bool] | None:
    """(chain, packets, bytes, counted) of one rule message's payload (after nfgenmsg)."""
    chain, packets, nbytes, counted = None, 0, 0, False
    for kind, value in _attrs(payload, 4):
        if kind == _NFTA_RULE_CHAIN:
            chain = bytes(value).rstrip(b"\0").decode()
        elif kind == _NFTA_RULE_EXPRESSIONS:
            for elem_kind, elem in _attrs(value):
                if elem_kind != _NFTA_LIST_ELEM:
                    continue
                expr = dict(_attrs(elem))
                if bytes(expr.get(_NFTA_EXPR_NAME, b"")).rstrip(b"\0") != b"counter":
                    continue
                counter = dict(_attrs(expr.get(_NFTA_EXPR_DATA, b"")))
                p, b = counter.get(_NFTA_COUNTER_PACKETS, b""), counter.get(_NFTA_COUNTER_BYTES, b"")
                if len(p) != 8 or len(b) != 8:
                    raise DumpError(errno.EPROTO, "a counter expression without its 64-bit packets and bytes")
                counted = True
                packets += int.from_bytes(p, "big")
                nbytes += int.from_bytes(b, "big")
    return (chain, packets, nbytes, counted) if chain is not None else None


def _request(table: str, seq: int) -> bytes:
    name = table.encode() + b"\0"
    attr = struct.pack("=HH", 4 + len(name), _NFTA_RULE_TABLE) + name + b"\0" * (-len(name) % 4)
    body = struct.pack("=BBH", NFPROTO_INET, 0, 0) + attr
    kind = (_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETRULE
    return _HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + body


def _dump(sock: socket.socket, table: str, seq: int) -> tuple[dict[str, tuple[int, int]], bool]:
    sock.send(_request(table, seq))
    totals: dict[str, tuple[int, int]] = {}
    interrupted = False
    while True:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, flags, msg_seq, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                raise DumpError(errno.EPROTO, "a truncated netlink message")
            payload = memoryview(data)[offset + _HEADER.size : offset + length]
            offset += (length + 3) & ~3
            if msg_seq != seq:
                continue
            if kind == _NLMSG_DONE:
                return finish(totals), interrupted
            if kind == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", payload)[0]
                if code:
                    raise DumpError(code, f"nftables rule dump: {os.strerror(code)}")
                continue
            interrupted = interrupted or bool(flags & _NLM_F_DUMP_INTR)
            if kind != (_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWRULE:
                continue
            rule = _rule(payload)
            if rule is not None and rule[3]:
                chain, p, b, _ = rule
                add_counter(totals, chain, p, b)


def rule_counters(table: str) -> dict[str, tuple[int, int]]:
    """Packets and bytes per chain of ``inet <table>``, summed over the chain's counted rules ({}: no table),
    and per rule for the tier chains (``"<chain>#<i>"``).

    Blocking: run it on a thread in the table's network namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER) as sock:
        sock.bind((0, 0))
        for seq in range(1, _ATTEMPTS):
            totals, interrupted = _dump(sock, table, seq)
            if not interrupted:
                return totals
        return _dump(sock, table, _ATTEMPTS)[0]
