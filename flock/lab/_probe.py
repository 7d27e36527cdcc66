"""``flock-lab probe`` and ``matrix``: TCP connects and UDP echoes from inside the lab's namespaces.

A probe's socket is made in its source namespace (a pod's or a node's) on a
fresh OS thread that enters the namespace, creates the socket and ends
(:func:`flock.lab._nsio.socket_in`); the socket keeps its namespace, so every
probe of a matrix then runs concurrently on one Trio loop.

Connected means: TCP, the handshake completed within the timeout; UDP, the
echo of a random token came back.  Blocked means: no answer in time,
connection refused, or the network said unreachable (a REJECT).  Anything
else (an address this source cannot use, a port it cannot bind) is an error.
"""

from __future__ import annotations

import errno
import ipaddress
import secrets
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from flock.lab._nsio import socket_in
from flock.lab._plan import INTERNET, INTERNET4, INTERNET6, LabPlan
from flock.lab._pods import LabPod, load_pods
from flock.lab._ports import PortSpec
from flock.lab._state import LabError

PROBE_TIMEOUT_S = 1.0
PARALLEL_PROBES = 400  # sockets open at once (the lab's fd limit is 1024)
# The network says no: a REJECT's ICMP/TCP reset, or no route.
_BLOCKED_ERRNOS = {
    errno.ECONNREFUSED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EACCES,
    errno.EPERM,
    errno.ECONNRESET,
    errno.ETIMEDOUT,
}


@attrs.frozen
class Endpoint:
    """Where a probe starts (a namespace) or ends (an address), and what to call it."""

    label: str  # "x/a", "node1" or an address
    netns: str | None  # where a probe from it runs
    addresses: tuple[str, ...] = ()  # by preference: the first of the wanted family is used

    def address(self, family: int) -> str | None:
        for a in self.addresses:
            if ipaddress.ip_address(a).version == family:
                return a
        return None


@attrs.frozen
class ProbeResult:
    source: str
    target: str
    port: str  # "80/TCP"
    family: int
    connected: bool
    reason: str  # "connected", "timeout", "refused", "unreachable", or what went wrong
    address: str = ""
    error: bool = False  # the probe could not be made (exit 2)
    seen_as: str = ""  # the source address the server saw (after any NAT on the way); TCP: when asked for
    served_by: str = ""  # who answered (a lab pod's NS/NAME, a node's name, internet): through a Service, which pod

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "port": self.port,
            "family": self.family,
            "connected": self.connected,
        }


def endpoint_for(plan: LabPlan, text: str, pods: Sequence[LabPod], *, source: bool) -> Endpoint:
    """NS/POD, a node name, ``internet`` (the lab's, if it has one), or (as a target) an address."""
    if "/" in text:
        for pod in pods:
            if pod.key == text:
                return Endpoint(pod.key, pod.netns, tuple(pod.addresses(6) + pod.addresses(4)))
        raise LabError(f"no pod {text} in this lab (see `flock-lab status`)")
    for node in plan.nodes:
        if node.name == text:
            return Endpoint(node.name, node.netns, (str(node.addr6), str(node.addr4)))
    if text == INTERNET:
        if plan.internet_netns is None:
            raise LabError("this lab has no internet: `flock-lab up --internet` makes one")
        return Endpoint(INTERNET, plan.internet_netns, (str(INTERNET6), str(INTERNET4)))
    if not source:
        try:
            return Endpoint(text, None, (str(ipaddress.ip_address(text)),))
        except ValueError:
            pass
    what = "NS/POD, a node name or internet" if source else "NS/POD, a node name, internet or an address"
    raise LabError(f"{text!r}: expected {what} (nodes: {', '.join(n.name for n in plan.nodes)})")


def _identity(data: bytes) -> tuple[str, str]:
    """(who answered, the peer it saw): the two lines of the lab server's answer (:mod:`flock.lab._serve`)."""
    lines = data.decode(errors="replace").splitlines()
    return (lines[0].strip() if lines else ""), (lines[1].strip() if len(lines) > 1 else "")


async def _tcp_answer(sock: trio.socket.SocketType) -> tuple[str, str]:
    data = b""
    while chunk := await sock.recv(256):
        data += chunk
        if data.count(b"\n") >= 2 or len(data) > 4096:
            break
    return _identity(data)


async def probe_one(src: Endpoint, dst: Endpoint, port: PortSpec, family: int, *, peer: bool = False) -> ProbeResult:
    """One probe with the lab's 1 s budget.  A UDP probe's echo says who answered (``served_by``)
    and the source address it saw (``seen_as``); with *peer*, a TCP probe reads the same from the
    server's answer ("" when it did not say within the budget)."""

    def result(
        connected: bool, reason: str, address: str = "", error: bool = False, seen: str = "", by: str = ""
    ) -> ProbeResult:
        return ProbeResult(src.label, dst.label, port.label, family, connected, reason, address, error, seen, by)

    address = dst.address(family)
    if address is None:
        return result(False, f"{dst.label} has no IPv{family} address", error=True)
    if src.netns is None:
        return result(False, f"{src.label} is not a pod or a node", error=True)
    if port.protocol == "SCTP":
        return result(False, "SCTP cannot be probed: this kernel has no SCTP sockets", address, True)
    kind = socket.SOCK_STREAM if port.protocol == "TCP" else socket.SOCK_DGRAM
    af = socket.AF_INET6 if family == 6 else socket.AF_INET
    try:
        raw = await trio.to_thread.run_sync(socket_in, src.netns, af, kind)
    except OSError as exc:
        return result(False, f"cannot make a socket in {src.label}: {exc}", address, True)
    with trio.socket.from_stdlib_socket(raw) as sock:
        try:
            connected = False
            with trio.move_on_after(PROBE_TIMEOUT_S):
                await sock.connect((address, port.port))
                if kind == socket.SOCK_STREAM:
                    connected = True
                else:
                    token = secrets.token_bytes(16)
                    await sock.send(token)
                    while True:
                        answer = await sock.recv(4096)
                        if answer.startswith(token):  # the echo, then who echoed it and whom it saw
                            by, seen = _identity(answer[len(token) + 1 :])
                            return result(True, "connected", address, seen=seen, by=by)
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return result(False, "refused", address)
            if exc.errno in _BLOCKED_ERRNOS:
                return result(False, "unreachable", address)
            return result(False, f"{type(exc).__name__}: {exc}", address, True)
        if not connected:
            return result(False, "timeout", address)
        by = seen = ""
        if peer:
            with trio.move_on_after(PROBE_TIMEOUT_S):
                try:
                    by, seen = await _tcp_answer(sock)
                except OSError:
                    pass  # connected all the same; the server did not say
        return result(True, "connected", address, seen=seen, by=by)


async def probe_all(wanted: Sequence[tuple[Endpoint, Endpoint, PortSpec, int]], retries: int = 1) -> list[ProbeResult]:
    """Every probe concurrently; what did not connect is tried again *retries* times
    (a blocked probe costs a timeout, so a matrix takes about (1 + retries) s)."""
    results: list[ProbeResult | None] = [None] * len(wanted)
    limiter = trio.CapacityLimiter(PARALLEL_PROBES)

    async def one(i: int) -> None:
        async with limiter:
            results[i] = await probe_one(*wanted[i])

    todo = list(range(len(wanted)))
    for _ in range(1 + retries):
        async with trio.open_nursery() as nursery:
            for i in todo:
                nursery.start_soon(one, i)
        todo = [i for i in todo if (r := results[i]) is not None and not r.connected and not r.error]
        if not todo:
            break
    return [r for r in results if r is not None]


async def probe(plan: LabPlan, source: str, target: str, port_text: str, family: int | None) -> ProbeResult:
    pods = load_pods(plan)
    src = endpoint_for(plan, source, pods, source=True)
    dst = endpoint_for(plan, target, pods, source=False)
    port = PortSpec.parse(port_text, named=False)
    if family is None:
        family = ipaddress.ip_address(dst.addresses[0]).version if dst.netns is None else 6
    return await probe_one(src, dst, port, family, peer=True)


def matrix_ports(pods: Sequence[LabPod], given: Sequence[str]) -> list[PortSpec]:
    """The ports asked for, or every probeable port any pod declares."""
    if given:
        ports = [PortSpec.parse(p, named=False) for p in given]
    else:
        declared = {(p.port, p.protocol) for pod in pods for p in pod.port_specs}
        ports = [PortSpec(port, proto) for port, proto in sorted(declared)]
    return [p for p in ports if p.protocol != "SCTP"]


async def matrix(
    plan: LabPlan, port_texts: Sequence[str], family: int, targets: Sequence[str] = ()
) -> tuple[list[LabPod], list[PortSpec], list[ProbeResult]]:
    """Every pod to every pod (itself included, as upstream) on every port; with
    *targets* (NS/POD, node names, addresses), every pod to each of those instead."""
    pods = sorted(load_pods(plan), key=lambda p: (p.namespace, p.name))
    ports = matrix_ports(pods, port_texts)
    ends = [Endpoint(p.key, p.netns, tuple(p.addresses(6) + p.addresses(4))) for p in pods]
    dests = [endpoint_for(plan, t, pods, source=False) for t in targets] if targets else ends
    wanted = [(src, dst, port, family) for port in ports for src in ends for dst in dests]
    return pods, ports, await probe_all(wanted)


def truth_tables(
    pods: Sequence[LabPod],
    ports: Sequence[PortSpec],
    results: Sequence[ProbeResult],
    family: int,
    targets: Sequence[str] | None = None,
    blocked_by: Mapping[tuple[str, str, str], str] | None = None,
) -> str:
    """One table per port, rows probing columns (the pods, or *targets*), as the upstream
    e2e prints them: ``.`` connected, ``X`` blocked, ``?`` could not probe.  With *blocked_by*
    ((from, to, port) → what blocked it), a blocked cell is ``X<n>``, and a legend under the
    table says what each ``n`` is (one number per cause, the same in every table)."""
    by_key = {(r.source, r.target, r.port): r for r in results}
    notes: dict[str, int] = {}  # cause → its number
    keys = [p.key for p in pods]
    columns = list(targets) if targets is not None else keys
    width = max([len(k) for k in keys + columns] + [4])
    lines: list[str] = []
    for port in ports:
        lines.append(f"reachability on {port.label}, IPv{family} (row → column; . connected, X blocked, ? error)")
        lines.append("-" + " " * width + "".join(f"{k:>{width + 1}}" for k in columns))
        used: list[int] = []
        for src in keys:
            cells = []
            for dst in columns:
                r = by_key.get((src, dst, port.label))
                cell = "?" if r is None or r.error else "." if r.connected else "X"
                cause = (blocked_by or {}).get((src, dst, port.label)) if cell == "X" else None
                if cause is not None:
                    n = notes.setdefault(cause, len(notes) + 1)
                    used += [] if n in used else [n]
                    cell += str(n)
                cells.append(cell)
            lines.append(f"{src:<{width + 1}}" + "".join(f"{c:>{width + 1}}" for c in cells))
        if used:
            lines.append("blocked by (as the agents explain it):")
            causes = {n: cause for cause, n in notes.items()}
            lines += [f"{n:>4}: {causes[n]}" for n in sorted(used)]
        lines.append("")
    connected = sum(r.connected for r in results)
    errors = sum(r.error for r in results)
    lines.append(
        f"{len(results)} probes: {connected} connected, {len(results) - connected - errors} blocked, {errors} errors"
    )
    return "\n".join(lines)
