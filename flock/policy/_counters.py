"""The rule counters of one ``inet`` table, read with one netlink dump of its rules.

``nft list table`` (1.0.6, Debian 12's) fetches every set's elements before it
prints a rule, even with ``--terse``: at 150,000 pods that is seconds of CPU
and hundreds of MiB for figures that live in the rules alone.  The kernel's
rule dump (``NFT_MSG_GETRULE``, filtered to the table) carries each rule's
expressions, counters included, and names sets without their elements.

Chains of ClusterNetworkPolicy tiers (``ta-``, ``tb-``) inline the rules of
several policies: their counters are also given rule by rule, as
``"<chain>#<i>"`` for the chain's *i*-th counted rule.

:func:`element_counters` reads the counters of one set's elements (a set or
map declared with ``counter``) the same way, with a set element dump.

The dumps are walked with :mod:`._nfnetlink`'s messages and attributes, as
``--verify``'s tracer walks it.  Call :func:`rule_counters` on a thread
inside the network namespace whose table it reads (the socket belongs to the
namespace it is opened in).
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from collections.abc import Callable

from ._nfnetlink import (
    NFGEN,
    NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS,
    NLM_F_DUMP_INTR,
    NLMSG_DONE,
    NLMSG_ERROR,
    Message,
    attributes,
    error_code,
    expressions,
    is_rule,
    is_setelem,
    is_table,
    messages,
    netfilter_socket,
    rule_dump_request,
    set_elements,
    setelem_dump_request,
    string,
    table_request,
)

_NFTA_COUNTER_BYTES, _NFTA_COUNTER_PACKETS = 1, 2
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


def _counter(data: dict[int, memoryview]) -> tuple[int, int]:
    p, b = data.get(_NFTA_COUNTER_PACKETS, b""), data.get(_NFTA_COUNTER_BYTES, b"")
    if len(p) != 8 or len(b) != 8:
        raise DumpError(errno.EPROTO, "a counter expression without its 64-bit packets and bytes")
    return int.from_bytes(p, "big"), int.from_bytes(b, "big")


def _rule(payload: memoryview) -> tuple[str, int, int, bool] | None:
    """(chain, packets, bytes, counted) of one rule message's payload (after nfgenmsg)."""
    chain, packets, nbytes, counted = None, 0, 0, False
    for kind, value in attributes(payload, NFGEN.size):
        if kind == NFTA_RULE_CHAIN:
            chain = string(value)
        elif kind == NFTA_RULE_EXPRESSIONS:
            for name, counter in expressions(value):
                if name != "counter":
                    continue
                p, b = _counter(counter)
                counted = True
                packets += p
                nbytes += b
    return (chain, packets, nbytes, counted) if chain is not None else None


def _dump(
    sock: socket.socket,
    request: Callable[[int], bytes],
    wanted: Callable[[Message], bool],
    what: str,
    *,
    missing_ok: bool,
) -> list[memoryview] | None:
    """The payloads of the *wanted* messages of one dump (None: no such table or set, when *missing_ok*),
    read again (up to :data:`_ATTEMPTS` times) while a concurrent change of the ruleset interrupts it."""
    for seq in range(1, _ATTEMPTS + 1):
        sock.send(request(seq))
        payloads: list[memoryview] = []
        interrupted = False
        done = False
        while not done:
            for message in messages(sock.recv(1 << 20)):
                if message is None:
                    raise DumpError(errno.EPROTO, "a truncated netlink message")
                if message.seq != seq:
                    continue
                if message.kind == NLMSG_DONE:
                    done = True
                    break
                if message.kind == NLMSG_ERROR:
                    code = error_code(message.payload)
                    if code == errno.ENOENT and missing_ok:
                        return None
                    if code:
                        raise DumpError(code, f"nftables {what} dump: {os.strerror(code)}")
                    continue
                interrupted = interrupted or bool(message.flags & NLM_F_DUMP_INTR)
                if wanted(message):
                    payloads.append(message.payload)
        if not interrupted or seq == _ATTEMPTS:
            return payloads
    raise AssertionError("unreachable")


def rule_counters(table: str) -> dict[str, tuple[int, int]]:
    """Packets and bytes per chain of ``inet <table>``, summed over the chain's counted rules ({}: no table),
    and per rule for the tier chains (``"<chain>#<i>"``).

    Blocking: run it on a thread in the table's network namespace."""
    with netfilter_socket() as sock:
        payloads = _dump(sock, lambda seq: rule_dump_request(table, seq), is_rule, "rule", missing_ok=False)
    totals: dict[str, tuple[int, int]] = {}
    for payload in payloads or ():
        rule = _rule(payload)
        if rule is not None and rule[3]:
            chain, p, b, _ = rule
            add_counter(totals, chain, p, b)
    return finish(totals)


def element_counters(table: str, name: str) -> dict[bytes, tuple[int, int]]:
    """Packets and bytes per element of set or map *name* of ``inet <table>``, by the element's key as the
    kernel holds it ({}: no such set, or its elements carry no counter).

    Blocking: run it on a thread in the table's network namespace."""
    with netfilter_socket() as sock:
        request = functools.partial(setelem_dump_request, table, name)
        payloads = _dump(sock, request, is_setelem, "set element", missing_ok=True)
    found: dict[bytes, tuple[int, int]] = {}
    for payload in payloads or ():
        for key, exprs in set_elements(payload):
            for expr, data in exprs:
                if expr == "counter":
                    found[key] = _counter(data)
    return found


def table_exists(table: str) -> bool:
    """``inet <table>`` is in this thread's network namespace: one request for that table alone (``nft list
    tables`` would read every table's sets and elements first: seconds beside a large policy table).
    Blocking."""
    with netfilter_socket() as sock:
        sock.send(table_request(table, 1))
        found = False
        while True:
            for message in messages(sock.recv(1 << 16)):
                if message is None:
                    raise DumpError(errno.EPROTO, "a truncated netlink message")
                if message.seq != 1:
                    continue
                if is_table(message):
                    found = True
                elif message.kind == NLMSG_ERROR:
                    code = error_code(message.payload)
                    if code == errno.ENOENT:
                        return False
                    if code:
                        raise DumpError(code, f"nftables table {table}: {os.strerror(code)}")
                    return found  # the acknowledgement, after the table
