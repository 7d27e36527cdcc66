"""Denied traffic, logged, in the real kernel: the log rules load (whole and as updates, both backends),
a denied packet becomes one nflog record the reader maps to the policy and rule that denied it, the
per-pod limit holds a flood to a few records, and the agent's reader turns a blocked probe into one line
and one count within a second.

A node namespace routes three pod namespaces (flock.testing.policy_net); namespace x logs, y does not.
Probes are single packets sent from sockets made in the pods' namespaces (no reply awaited): a record,
when one is due, follows within the reader's 50 ms flush.  "No record" is shown by order: a packet that
must be logged is sent after the ones that must not, and is the first record read.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import select
import socket
import time
from collections.abc import Iterator

import attrs
import pytest
import trio

from flock.model import Allocation
from flock.netns import call_in_netns
from flock.policy import (
    ClusterNetworkPolicy,
    Kind,
    Namespace,
    NetworkPolicy,
    PolicyInputs,
    PolicyPod,
    Ruleset,
    compile_ruleset,
    pod_chain,
)
from flock.policy._apply import NftApplier, nft_available
from flock.policy._backend import LibNftables, NftCommand
from flock.policy._denylog import (
    DenyLogService,
    LoggedPacket,
    NflogUnavailable,
    nflog_socket,
    open_nflog,
    parse_messages,
)
from flock.policy._metrics import DeniedCounters
from flock.policy._model import Direction
from flock.policy._ruleset import Denial
from flock.testing.netns import NetnsPool
from flock.testing.policy import MemoryLocalPods
from flock.testing.policy_net import Pod, PolicyNode

pytestmark = pytest.mark.root


@attrs.define
class World:
    node: PolicyNode
    pods: dict[str, Pod]
    policy_pods: dict[str, PolicyPod]
    applier: NftApplier


@pytest.fixture(params=["nft-command", "libnftables"])
def world(request: pytest.FixtureRequest, require_root: None) -> Iterator[World]:
    missing = nft_available()
    if missing:
        pytest.fail(missing)
    with NetnsPool("fl-dlog-") as pool:
        node = PolicyNode(pool)
        try:
            specs = {
                "x/a": ("2001:db8:1::a", "192.0.2.10", {"app": "a"}),
                "x/b": ("2001:db8:1::b", "192.0.2.11", {"app": "b"}),
                "y/c": ("2001:db8:1::c", "192.0.2.12", {"app": "c"}),
            }
            pods, policy_pods = {}, {}
            for key, (ip6, ip4, labels) in specs.items():
                pod = node.add_pod(key, ip6, ip4, serve=("80/tcp",))
                pods[key] = pod
                ns, name = key.split("/")
                addresses = (ipaddress.ip_address(ip6), ipaddress.ip_address(ip4))
                policy_pods[key] = PolicyPod(ns, name, labels, addresses, node="n1", host_veth=pod.veth)
            backend: NftCommand | LibNftables
            if request.param == "libnftables":
                backend = LibNftables(node.node.path)
            else:
                backend = NftCommand(("ip", "netns", "exec", node.node.name, "nft"))
            try:
                yield World(node, pods, policy_pods, NftApplier(backend))
            finally:
                if isinstance(backend, LibNftables):
                    backend.close()
        finally:
            node.close()


def _policy(doc: dict) -> NetworkPolicy:
    return NetworkPolicy.from_object(doc)


DENY_X = _policy({"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}})
Y_TO_A = _policy(
    {
        "metadata": {"namespace": "x", "name": "y-to-a"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}], "ports": [{"port": 80}]}],
        },
    }
)
DENY_Y = _policy({"metadata": {"namespace": "y", "name": "deny"}, "spec": {"podSelector": {}}})
ADMIN = ClusterNetworkPolicy.from_object(
    {
        "metadata": {"name": "guard-x"},
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"namespaces": {"matchLabels": {"team": "x"}}},
            "ingress": [
                {"name": "no-81", "action": "Deny", "from": [{"namespaces": {}}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 81}}}]},
            ],
            "egress": [
                {"name": "no-udp-out", "action": "Deny", "to": [{"networks": ["2001:db8:1::/64", "192.0.2.0/24"]}],
                 "protocols": [{"udp": {"destinationPort": {"number": 5000}}}]},
            ],
        },
    }
)  # fmt: skip


def namespaces(logging_: str) -> list[Namespace]:
    return [Namespace("x", {"team": "x"}, "x" in logging_), Namespace("y", {"team": "y"}, "y" in logging_)]


def compile_for(w: World, policies: list[NetworkPolicy], logging_: str, cnps=()) -> Ruleset:
    pods = w.policy_pods.values()
    return compile_ruleset(policies, namespaces(logging_), pods, pods, cnps)


def send(src: Pod, addr: str, port: int, proto: str = "udp", count: int = 1) -> None:
    """*count* packets from *src* to addr:port: UDP datagrams from one socket, or TCP connection
    attempts (each its SYN, nothing awaited)."""
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
    if proto == "udp":
        sock = call_in_netns(src.netns.name, lambda: socket.socket(fam, kind))
        with sock:
            for _ in range(count):
                sock.sendto(b"denied?", (addr, port))
        return
    for _ in range(count):
        sock = call_in_netns(src.netns.name, lambda: socket.socket(fam, kind))
        with sock:
            sock.setblocking(False)
            try:
                sock.connect((addr, port))
            except BlockingIOError:
                pass


def records(sock: socket.socket, want: int, within: float = 2.0) -> list[LoggedPacket | None]:
    """Read *sock* until *want* records came (or *within* s passed: then what came)."""
    got: list[LoggedPacket | None] = []
    deadline = time.monotonic() + within
    while len(got) < want and (left := deadline - time.monotonic()) > 0:
        if select.select([sock], [], [], left)[0]:
            got.extend(parse_messages(sock.recv(1 << 16)))
    return got


def drain(sock: socket.socket) -> list[LoggedPacket | None]:
    """Whatever the socket holds now."""
    got: list[LoggedPacket | None] = []
    while True:
        try:
            got.extend(parse_messages(sock.recv(1 << 16)))
        except BlockingIOError:
            return got


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


async def test_a_denied_packet_is_one_record_naming_the_policy_that_denied_it(world: World) -> None:
    w = world
    a, b, c = w.pods["x/a"], w.pods["x/b"], w.pods["y/c"]
    rs = compile_for(w, [DENY_X, Y_TO_A, DENY_Y], "x", [ADMIN])
    with trio.fail_after(60):
        assert (await w.applier.apply(rs)).mode == "full"
    with open_nflog(netns=w.node.node.path) as sock:
        # not logged: allowed (y → a:80), denied in y (which does not log), then logged: c → a:82/udp
        send(c, a.ip6, 80, "tcp")
        send(a, c.ip6, 80, "tcp")
        send(c, a.ip6, 82)
        (first,) = records(sock, 1)
        a_in = pod_chain(a.veth, Direction.INGRESS)
        assert first == LoggedPacket(a_in, 6, ip(c.ip6), ip(a.ip6), 17, first.sport, 82)  # type: ignore[union-attr]
        assert rs.denials[a_in] == Denial("NetworkPolicy", Direction.INGRESS, ("x/deny", "x/y-to-a"))
        # the Admin tier's Deny, over IPv4: its rule by name
        send(c, b.ip4, 81, "tcp")
        (admin,) = records(sock, 1)
        assert admin is not None and (admin.family, admin.saddr, admin.daddr, admin.dport) == (
            4,
            ip(c.ip4),
            ip(b.ip4),
            81,
        )
        assert rs.denials[admin.prefix] == Denial("Admin", Direction.INGRESS, ("guard-x",), "no-81")
        # egress: x/b's own packet, denied on its way out
        send(b, c.ip6, 5000)
        (out,) = records(sock, 1)
        assert out is not None and rs.denials[out.prefix] == Denial(
            "Admin", Direction.EGRESS, ("guard-x",), "no-udp-out"
        )
        assert (out.saddr, out.daddr, out.protocol, out.dport) == (ip(b.ip6), ip(c.ip6), 17, 5000)
        assert drain(sock) == []
    # the log rules count nothing: the tier chain's per-rule counters still index its counted rules
    counters = await w.applier.counters()
    chain, index = admin.prefix.split("#")
    assert rs.tier_rules[chain][int(index)] == ("guard-x", "no-81")
    per_rule = {k: p for k, (p, _) in counters.items() if k.startswith(f"{chain}#")}
    assert len(per_rule) == len(rs.tier_rules[chain]) and per_rule[admin.prefix] == sum(per_rule.values()) == 1


async def test_a_flood_towards_one_pod_is_a_few_records_and_the_group_is_ours_alone(world: World) -> None:
    w = world
    a, c = w.pods["x/a"], w.pods["y/c"]
    with trio.fail_after(60):
        await w.applier.apply(compile_for(w, [DENY_X], "x"))
    with open_nflog(netns=w.node.node.path) as sock:
        with pytest.raises(NflogUnavailable) as taken:
            open_nflog(netns=w.node.node.path)
        assert taken.value.errno == errno.EPERM and "bound by another socket" in str(taken.value)
        started = time.monotonic()
        send(c, a.ip6, 9, count=3000)
        seconds = time.monotonic() - started
        got = records(sock, 1000, within=1.0)
        # burst 20, then 10 a second
        assert 20 <= len(got) <= 21 + 10 * (seconds + 1.0), (len(got), seconds)
        assert {p.prefix for p in got if p is not None} == {pod_chain(a.veth, Direction.INGRESS)}


async def test_switching_a_namespace_on_and_off_updates_the_table_in_place(world: World) -> None:
    w = world
    a, c = w.pods["x/a"], w.pods["y/c"]
    policies = [DENY_X, DENY_Y]

    def listing() -> str:
        return w.node.node.run("nft", "list", "table", "inet", "flock").stdout

    with trio.fail_after(60), open_nflog(netns=w.node.node.path) as sock:
        await w.applier.apply(compile_for(w, policies, ""))
        assert "denylog" not in await trio.to_thread.run_sync(listing)
        assert (await w.applier.apply(compile_for(w, policies, "x"))).mode == "incremental"
        assert "set denylog-in" in await trio.to_thread.run_sync(listing)
        send(c, a.ip6, 80)
        (on,) = records(sock, 1)
        assert on is not None and on.prefix == pod_chain(a.veth, Direction.INGRESS)
        # x off, y on: a's drop is silent, c's logged (and read first)
        assert (await w.applier.apply(compile_for(w, policies, "y"))).mode == "incremental"
        send(c, a.ip6, 80)
        send(a, c.ip6, 80)
        (first,) = records(sock, 1)
        assert first is not None and first.prefix == pod_chain(c.veth, Direction.INGRESS)
        # nobody logs: the log rules and the meters go
        assert (await w.applier.apply(compile_for(w, policies, ""))).mode == "incremental"
        text = await trio.to_thread.run_sync(listing)
        assert "denylog" not in text and " log " not in text
        assert drain(sock) == []


async def test_the_agents_reader_logs_a_blocked_probe_once_and_counts_it_within_a_second(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    w = world
    a, c = w.pods["x/a"], w.pods["y/c"]
    rs = compile_for(w, [DENY_X, Y_TO_A], "x")
    local = MemoryLocalPods()
    local.load(
        [
            Allocation(f"cid-{key}", *key.split("/"), "uid", "eth0", "/run/netns/p", ip6=ip(p.ip6), ip4=ip(p.ip4))  # type: ignore[arg-type]
            for key, p in w.pods.items()
        ]
    )
    inputs = PolicyInputs()
    inputs.replace(Kind.POD, {k: attrs.evolve(p, host_veth=None) for k, p in w.policy_pods.items()})
    counters = DeniedCounters()

    @attrs.define
    class Applied:
        applied: Ruleset

    svc = DenyLogService(Applied(rs), local, inputs, counters, open_socket=lambda: nflog_socket(netns=w.node.node.path))
    caplog.set_level(logging.INFO, "flock.policy.denied")
    key = ("x", "NetworkPolicy", "deny,y-to-a", "", "Ingress")
    with trio.fail_after(60):
        await w.applier.apply(rs)
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            sent = trio.current_time()
            await trio.to_thread.run_sync(send, c, a.ip6, 81, "tcp")
            with trio.fail_after(1.0):
                while not svc.lines:  # noqa: ASYNC110  (the kernel's record, read: no event to wait on)
                    await trio.sleep(0.005)
            took = trio.current_time() - sent
            assert counters.packets == {key: 1}
            (line,) = caplog.records
            assert line.getMessage() == "denied ingress y/c → x/a TCP/81: NetworkPolicy x/deny, x/y-to-a"
            assert (line.pod, line.src_pod, line.policies) == ("x/a", "y/c", ["x/deny", "x/y-to-a"])  # type: ignore[attr-defined]
            # the client retries (a new connection, another source port): the same flow, counted, no line
            await trio.to_thread.run_sync(send, c, a.ip6, 81, "tcp")
            with trio.fail_after(1.0):
                while counters.packets[key] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.005)
            assert svc.lines == 1 and len(caplog.records) == 1
            nursery.cancel_scope.cancel()
    assert took < 1.0
