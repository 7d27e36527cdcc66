"""Denied traffic, logged: the Namespace switch, the log rules the compiler renders (only for those
namespaces' pods, never changing a verdict), the engine following the switch, the nflog wire format and
the reader's lines and counters (no root: crafted records through a socket pair)."""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
import struct

import attrs
import pytest
import trio
import trio.testing

from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.policy import (
    ClusterNetworkPolicy,
    Kind,
    Namespace,
    NetworkPolicy,
    PolicyEngine,
    PolicyInputs,
    PolicyPod,
    Protocol,
    compile_ruleset,
    pod_chain,
)
from flock.policy._compile import tier_chain
from flock.policy._denylog import (
    DENY_LOG_GROUP,
    DenyLogService,
    LoggedPacket,
    bind_messages,
    parse_messages,
    parse_packet,
)
from flock.policy._metrics import DeniedCounters
from flock.policy._model import LOG_DENIED_ANNOTATION, Direction
from flock.policy._nft import RenderError, render_change, render_full, render_rules, render_update
from flock.policy._ruleset import Denial, DenyLog, Match, Rule, Ruleset, RulesetChange
from flock.policy._simulate import Packet, forward_verdict, input_verdict
from flock.testing.policy import MemoryApplier, MemoryLocalPods

NODE = "n1"


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def veth(key: str) -> str:
    return f"flock{fnv1a_32(key):08x}"


def local(pod: PolicyPod) -> PolicyPod:
    return attrs.evolve(pod, host_veth=veth(pod.key))


def policy(ns: str, name: str, spec: dict) -> NetworkPolicy:
    return NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": name}, "spec": spec})


def cnp(name: str, tier: str, priority: int, subject: dict, **rules: list[dict]) -> ClusterNetworkPolicy:
    spec = {"tier": tier, "priority": priority, "subject": subject, **rules}
    return ClusterNetworkPolicy.from_object({"metadata": {"name": name}, "spec": spec})


A = local(PolicyPod("x", "a", {"app": "a"}, (ip("2001:db8:1::a"), ip("192.0.2.10")), node=NODE))
B = local(PolicyPod("x", "b", {"app": "b"}, (ip("2001:db8:1::b"),), node=NODE))
C = local(PolicyPod("y", "c", {"app": "c"}, (ip("2001:db8:1::c"),), node=NODE))
REMOTE = PolicyPod("y", "far", {"app": "c"}, (ip("2001:db8:2::f"),), node="n2")
DENY_X = policy("x", "deny", {"podSelector": {}})
Y_TO_A = policy(
    "x",
    "y-to-a",
    {
        "podSelector": {"matchLabels": {"app": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}], "ports": [{"port": 80}]}],
    },
)
DENY_C = policy("y", "deny", {"podSelector": {}, "policyTypes": ["Egress"]})
ADMIN = cnp(
    "no-81",
    "Admin",
    10,
    {"namespaces": {}},
    ingress=[
        {"name": "pass-80", "action": "Pass", "from": [{"namespaces": {}}], "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
        {"name": "deny-81", "action": "Deny", "from": [{"namespaces": {}}], "protocols": [{"tcp": {"destinationPort": {"number": 81}}}]},
        {"action": "Accept", "from": [{"networks": ["2001:db8:9::/48"]}]},
    ],
)  # fmt: skip
BASELINE = cnp(
    "baseline",
    "Baseline",
    1,
    {"namespaces": {}},
    egress=[{"name": "no-far", "action": "Deny", "to": [{"networks": ["2001:db8:2::/48"]}]}],
)


def namespaces(logging_: str = "x") -> list[Namespace]:
    return [Namespace("x", {"team": "x"}, log_denied="x" in logging_), Namespace("y", {"team": "y"}, "y" in logging_)]


def test_the_namespace_annotation_switches_it_on_and_anything_else_leaves_it_off() -> None:
    def ns(annotations: object) -> Namespace:
        return Namespace.from_object({"metadata": {"name": "x", "labels": {"a": "b"}, "annotations": annotations}})

    assert LOG_DENIED_ANNOTATION == "flock.fritzlab.net/log-denied"
    assert ns({LOG_DENIED_ANNOTATION: "true"}) == Namespace("x", {"a": "b"}, log_denied=True)
    assert ns({LOG_DENIED_ANNOTATION: " True "}).log_denied
    for off in ({LOG_DENIED_ANNOTATION: "false"}, {LOG_DENIED_ANNOTATION: "yes"}, {}, None, ["x"], {"other": "true"}):
        assert ns(off) == Namespace("x", {"a": "b"}), off


def test_log_rules_only_for_the_pods_of_logging_namespaces() -> None:
    rs = compile_ruleset([DENY_X, Y_TO_A, DENY_C], namespaces("x"), [REMOTE], [A, B, C])
    silent = compile_ruleset([DENY_X, Y_TO_A, DENY_C], namespaces(""), [REMOTE], [A, B, C])
    a_in = pod_chain(A.host_veth or "", Direction.INGRESS)
    b_in = pod_chain(B.host_veth or "", Direction.INGRESS)
    c_out = pod_chain(C.host_veth or "", Direction.EGRESS)
    assert rs.chains[a_in].rules[-1] == Rule(Match(), "drop", log=DenyLog(a_in, Direction.INGRESS))
    assert rs.chains[b_in].rules[-1] == Rule(Match(), "drop", log=DenyLog(b_in, Direction.INGRESS))
    assert rs.chains[c_out] == silent.chains[c_out]  # y does not log
    assert rs.denials == {
        # every policy isolating the pod, the one allowing nothing (no chain of its own) too
        a_in: Denial("NetworkPolicy", Direction.INGRESS, ("x/deny", "x/y-to-a")),
        b_in: Denial("NetworkPolicy", Direction.INGRESS, ("x/deny",)),
    }
    assert not silent.denials
    # but for the log rules, the same ruleset
    strip = {n: attrs.evolve(c, rules=tuple(attrs.evolve(r, log=None) for r in c.rules)) for n, c in rs.chains.items()}
    assert attrs.evolve(rs, chains=strip, denials={}) == silent


def test_tier_chains_have_a_logging_variant_whose_deny_rules_log() -> None:
    pods = [A, C]
    rs = compile_ruleset([], namespaces("x"), [REMOTE], pods, [ADMIN, BASELINE])
    loud = tier_chain(ADMIN.tier, Direction.INGRESS, (ADMIN.key,), log=True)
    quiet = tier_chain(ADMIN.tier, Direction.INGRESS, (ADMIN.key,))
    assert loud != quiet and {loud, quiet} <= rs.chains.keys()
    assert rs.ingress_map == {
        A.host_veth: pod_chain(A.host_veth or "", Direction.INGRESS),
        C.host_veth: pod_chain(C.host_veth or "", Direction.INGRESS),
    }
    assert rs.chains[pod_chain(A.host_veth or "", Direction.INGRESS)].rules[0].verdict == f"jump {loud}"
    assert rs.chains[pod_chain(C.host_veth or "", Direction.INGRESS)].rules[0].verdict == f"jump {quiet}"
    logged = [(i, r) for i, r in enumerate(rs.chains[loud].rules) if r.log is not None]
    assert logged and all(r.verdict == "drop" for _, r in logged)
    assert [r.log is None for r in rs.chains[quiet].rules] == [True] * len(rs.chains[quiet].rules)
    # the prefix is the chain and the rule's index among its counted rules: what tier_rules names
    for i, r in logged:
        assert r.log == DenyLog(f"{loud}#{i}", Direction.INGRESS)
        assert rs.tier_rules[loud][i] == ("no-81", "deny-81")
        assert rs.denials[f"{loud}#{i}"] == Denial("Admin", Direction.INGRESS, ("no-81",), "deny-81")
    baseline = tier_chain(BASELINE.tier, Direction.EGRESS, (BASELINE.key,), log=True)
    assert rs.denials[f"{baseline}#0"] == Denial("Baseline", Direction.EGRESS, ("baseline",), "no-far")
    # x/a egress (Admin has no egress rules): its Baseline chain is the logging one, y/c's the quiet one
    assert rs.egress_map[A.host_veth] == pod_chain(A.host_veth or "", Direction.EGRESS)
    assert {d.tier for d in rs.denials.values()} == {"Admin", "Baseline"}


def test_log_rules_change_no_verdict() -> None:
    """Every packet between the pods and a remote one, both families: the same verdict logged or not."""
    pods = [A, B, C]
    everyone = [*pods, REMOTE]
    args = ([DENY_X, Y_TO_A, DENY_C], [REMOTE], pods, [ADMIN, BASELINE])
    loud = compile_ruleset(args[0], namespaces("xy"), *args[1:])
    quiet = compile_ruleset(args[0], namespaces(""), *args[1:])
    assert loud.denials and loud != quiet
    checked = 0
    for src in everyone:
        for dst in everyone:
            for saddr in src.addresses:
                for daddr in (d for d in dst.addresses if d.version == saddr.version and src is not dst):
                    for proto, port in ((Protocol.TCP, 80), (Protocol.TCP, 81), (Protocol.UDP, 80)):
                        pkt = Packet(saddr, daddr, proto, port, src.host_veth or "", dst.host_veth or "")
                        assert forward_verdict(loud, pkt) == forward_verdict(quiet, pkt), pkt
                        assert input_verdict(loud, pkt) == input_verdict(quiet, pkt), pkt
                        checked += 1
    assert checked > 20


def test_rendered_the_log_rule_comes_before_its_drop_and_the_meters_only_with_it() -> None:
    rs = compile_ruleset([DENY_X], namespaces("x"), [], [A, B])
    text = render_full(rs)
    a_in = pod_chain(A.host_veth or "", Direction.INGRESS)
    log_line = (
        f'update @denylog-in {{ oifname limit rate 10/second burst 20 packets }} log prefix "{a_in}" '
        f"group {DENY_LOG_GROUP}"
    )
    lines = [line.strip() for line in text.splitlines()]
    at = lines.index(f"chain {a_in} {{")
    assert lines[at + 1 : at + 4] == [log_line, "counter drop", "}"]
    assert "set denylog-in { type ifname; size 4096; flags dynamic,timeout; timeout 1m; }" in lines
    assert "set denylog-eg { type ifname; size 4096; flags dynamic,timeout; timeout 1m; }" in lines
    quiet = compile_ruleset([DENY_X], namespaces(""), [], [A, B])
    assert "denylog" not in render_full(quiet) and "log" not in render_full(quiet).replace("hairpin", "")
    # egress: the source's veth keys the meter
    eg = compile_ruleset([policy("x", "out", {"podSelector": {}, "policyTypes": ["Egress"]})], namespaces("x"), [], [A])
    assert "update @denylog-eg { iifname limit rate" in render_full(eg)


def test_switching_a_namespace_changes_only_its_pods_chains() -> None:
    quiet = compile_ruleset([DENY_X, DENY_C], namespaces(""), [], [A, B, C])
    loud = compile_ruleset([DENY_X, DENY_C], namespaces("x"), [], [A, B, C])
    on = render_update(quiet, loud).splitlines()
    a_in, b_in = (pod_chain(p.host_veth or "", Direction.INGRESS) for p in (A, B))
    assert [line for line in on if line.startswith("flush chain")] == [
        f"flush chain inet flock {a_in}",
        f"flush chain inet flock {b_in}",
    ]
    assert on[:2] == [
        "add set inet flock denylog-eg { type ifname; size 4096; flags dynamic,timeout; timeout 1m; }",
        "add set inet flock denylog-in { type ifname; size 4096; flags dynamic,timeout; timeout 1m; }",
    ]
    off = render_update(loud, quiet).splitlines()
    assert [line for line in off if line.startswith("flush chain")] == [
        f"flush chain inet flock {a_in}",
        f"flush chain inet flock {b_in}",
    ]
    assert off[-2:] == ["delete set inet flock denylog-eg", "delete set inet flock denylog-in"]
    assert not any("denylog" in line for line in render_update(loud, loud).splitlines())


def test_only_flock_made_prefixes_and_drops_are_logged() -> None:
    for bad in (
        Rule(Match(), "accept", log=DenyLog("in-flock00000001", Direction.INGRESS)),
        Rule(Match(), "drop", log=DenyLog('x" accept; drop "', Direction.INGRESS)),
        Rule(Match(), "drop", log=DenyLog("ta-i-00#1#2", Direction.INGRESS)),
    ):
        with pytest.raises(RenderError):
            render_rules(bad)


def cluster(*pods: PolicyPod, spaces: list[Namespace], policies=(DENY_X, Y_TO_A, DENY_C)) -> PolicyInputs:
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in spaces})
    inputs.replace(Kind.POD, {p.key: attrs.evolve(p, host_veth=None) for p in pods})
    inputs.replace(Kind.CLUSTER_POLICY, {c.key: c for c in (ADMIN, BASELINE)})
    return inputs


def test_the_engine_follows_the_switch_and_a_walk_stays_equal_to_a_fresh_compile() -> None:
    rnd = random.Random(7)
    inputs = cluster(A, B, C, REMOTE, spaces=namespaces(""))
    journal = inputs.journal()
    engine = PolicyEngine(inputs)
    locals_ = [A, B, C]
    engine.load(locals_)
    applier = MemoryApplier()
    trio.run(applier.apply_change, engine.change())

    def fresh() -> Ruleset:
        return compile_ruleset(
            inputs.policies.values(),
            inputs.namespaces.values(),
            inputs.pods.values(),
            locals_,
            inputs.cluster_policies.values(),
        )

    def step() -> RulesetChange:
        before = engine.structure
        engine.update(journal.drain(), locals_)
        change = engine.change()
        render_change(before, change)  # renders
        trio.run(applier.apply_change, change)
        assert engine.ruleset() == fresh() == applier.applied
        return change

    quiet = engine.structure
    inputs.set_namespace(Namespace("x", {"team": "x"}, log_denied=True))
    change = step()
    changed = {n for n, c in change.structure.chains.items() if quiet.chains.get(n) != c}
    ta = tier_chain(ADMIN.tier, Direction.INGRESS, (ADMIN.key,), log=True)
    tb = tier_chain(BASELINE.tier, Direction.EGRESS, (BASELINE.key,), log=True)
    x_chains = {pod_chain(p.host_veth or "", d) for p in (A, B) for d in Direction}
    assert changed == {c for c in x_chains if c in change.structure.chains} | {ta, tb}
    assert change.structure.denials and not change.added and not change.removed
    # labels only: nothing about logging moves
    inputs.set_namespace(Namespace("x", {"team": "x", "more": "1"}, log_denied=True))
    assert step().structure.chains == change.structure.chains
    for _ in range(40):
        name = rnd.choice(["x", "y"])
        inputs.set_namespace(Namespace(name, {"team": name}, log_denied=rnd.random() < 0.5))
        if rnd.random() < 0.3:
            pol = rnd.choice([DENY_X, Y_TO_A, DENY_C])
            if pol.key in inputs.policies:
                inputs.delete(Kind.NETWORK_POLICY, pol.key)
            else:
                inputs.set_policy(pol)
        step()


# -- the wire -------------------------------------------------------------------------------------


def nflog_record(prefix: str, packet: bytes, family: int = socket.AF_INET6, group: int = DENY_LOG_GROUP) -> bytes:
    """An NFULNL_MSG_PACKET as the kernel sends it (packet header, prefix, payload)."""

    def attr(kind: int, data: bytes) -> bytes:
        return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * (-len(data) % 4)

    body = struct.pack("=BBH", family, 0, socket.htons(group))
    body += attr(1, struct.pack(">HBB", 0x86DD if family == socket.AF_INET6 else 0x0800, 2, 0))
    body += attr(10, prefix.encode() + b"\0")
    body += attr(9, packet)
    return struct.pack("=IHHII", 16 + len(body), 4 << 8, 0, 0, 0) + body


def ipv6(src: str, dst: str, next_header: int, after: bytes) -> bytes:
    return (
        struct.pack(">IHBB", 6 << 28, len(after), next_header, 64)
        + ipaddress.IPv6Address(src).packed
        + ipaddress.IPv6Address(dst).packed
        + after
    )


def ipv4(src: str, dst: str, proto: int, after: bytes, fragment: int = 0) -> bytes:
    header = struct.pack(">BBHHHBBH", 0x45, 0, 20 + len(after), 1, fragment, 64, proto, 0)
    return header + ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address(dst).packed + after


TCP_80 = struct.pack(">HHIIHHHH", 40000, 80, 1, 0, 0x5002, 64240, 0, 0)


def test_records_parse_to_the_packets_headers() -> None:
    data = (
        nflog_record("in-flock00000001", ipv6("2001:db8::1", "2001:db8::2", 6, TCP_80))
        + nflog_record("ta-e-0123456789abcdef#3", ipv4("192.0.2.1", "198.51.100.7", 17, struct.pack(">HHHH", 5353, 53, 8, 0)), socket.AF_INET)
        + nflog_record("eg-flock00000001", ipv6("2001:db8::1", "2001:db8::2", 58, bytes([128, 0, 0, 0])))
        # a hop-by-hop header, then UDP
        + nflog_record("x", ipv6("2001:db8::1", "2001:db8::2", 0, bytes([17, 0, 1, 4, 0, 0, 0, 0]) + struct.pack(">HH", 1, 2)))
        # a later fragment: no ports to read
        + nflog_record("y", ipv4("192.0.2.1", "192.0.2.2", 6, TCP_80, fragment=100), socket.AF_INET)
    )  # fmt: skip
    got = list(parse_messages(data))
    assert got == [
        LoggedPacket("in-flock00000001", 6, ip("2001:db8::1"), ip("2001:db8::2"), 6, 40000, 80),
        LoggedPacket("ta-e-0123456789abcdef#3", 4, ip("192.0.2.1"), ip("198.51.100.7"), 17, 5353, 53),
        LoggedPacket("eg-flock00000001", 6, ip("2001:db8::1"), ip("2001:db8::2"), 58, icmp=(128, 0)),
        LoggedPacket("x", 6, ip("2001:db8::1"), ip("2001:db8::2"), 17, 1, 2),
        LoggedPacket("y", 4, ip("192.0.2.1"), ip("192.0.2.2"), 6),
    ]
    assert parse_packet("p", socket.AF_INET6, b"\x45" + bytes(40)) is None  # not IPv6 after all
    assert parse_packet("p", socket.AF_INET, b"\x45\x00") is None
    assert list(parse_messages(nflog_record("p", b"")[:-4] + b"\xff\xff")) == [None]  # cut short


def test_bind_messages_bind_the_group_then_set_copy_mode_threshold_and_flush() -> None:
    messages = bind_messages(DENY_LOG_GROUP)
    assert len(messages) == 4
    for seq, message in enumerate(messages, 1):
        length, kind, flags, got_seq, _ = struct.unpack_from("=IHHII", message)
        assert (length, kind, flags, got_seq) == (len(message), (4 << 8) | 1, 0x5, seq)
        assert struct.unpack_from(">H", message, 18)[0] == DENY_LOG_GROUP
    assert messages[0][20:25] == struct.pack("=HHB", 5, 1, 1)  # NFULA_CFG_CMD: bind


# -- the reader -----------------------------------------------------------------------------------


@attrs.define
class Applied:
    applied: Ruleset | None = None


def reader(rs: Ruleset, **kw: object) -> tuple[DenyLogService, DeniedCounters, Applied]:
    pods = MemoryLocalPods()
    pods.load(
        [
            Allocation(f"c-{p.name}", p.namespace, p.name, "uid", "eth0", "/run/netns/x", ip6=p.addresses[0])  # type: ignore[arg-type]
            for p in (A, B, C)
        ]
    )
    inputs = cluster(A, B, C, REMOTE, spaces=namespaces("x"))
    counters = DeniedCounters()
    rules = Applied(rs)
    return DenyLogService(rules, pods, inputs, counters, **kw), counters, rules  # type: ignore[arg-type]


def denied(rs: Ruleset, prefix: str, src: str, dst: str, dport: int, sport: int = 40000) -> LoggedPacket:
    assert prefix in rs.denials
    return LoggedPacket(prefix, 6, ip(src), ip(dst), 6, sport, dport)


async def test_one_line_per_flow_and_interval_and_a_count_per_packet(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    rs = compile_ruleset([DENY_X, Y_TO_A], namespaces("x"), [REMOTE], [A, B, C])
    svc, counters, _ = reader(rs)
    a_in = pod_chain(A.host_veth or "", Direction.INGRESS)
    caplog.set_level(logging.INFO, "flock.policy.denied")
    with trio.fail_after(60):
        probe = denied(rs, a_in, "2001:db8:2::f", "2001:db8:1::a", 81)
        await svc.handle([probe])
        # the client retries from other source ports: the same flow
        await svc.handle([attrs.evolve(probe, sport=40001), attrs.evolve(probe, sport=40002)])
        assert [r.getMessage() for r in caplog.records] == [
            "denied ingress y/far → x/a TCP/81: NetworkPolicy x/deny, x/y-to-a"
        ]
        line = caplog.records[0]
        assert (line.op, line.direction, line.tier, line.policies, line.pod) == (  # type: ignore[attr-defined]
            "policy-denied",
            "Ingress",
            "NetworkPolicy",
            ["x/deny", "x/y-to-a"],
            "x/a",
        )
        assert (line.src_pod, line.dst_pod, line.dport, line.protocol, line.family) == (  # type: ignore[attr-defined]
            "y/far",
            "x/a",
            81,
            "TCP",
            "IPv6",
        )
        assert counters.packets == {("x", "NetworkPolicy", "deny,y-to-a", "", "Ingress"): 3}
        await trio.sleep(10)
        await svc.handle([probe])  # the interval passed: a line again, with what it left out
        assert len(caplog.records) == 2 and caplog.records[1].repeats == 2  # type: ignore[attr-defined]
        # another port is another flow
        await svc.handle([attrs.evolve(probe, dport=82)])
        assert len(caplog.records) == 3 and svc.lines == 3 and svc.records == 5


async def test_counters_name_the_cluster_policy_rule_and_a_record_of_no_known_drop_is_unmatched(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    rs = compile_ruleset([], namespaces("x"), [REMOTE], [A, B, C], [ADMIN, BASELINE])
    svc, counters, rules = reader(rs)
    loud = tier_chain(ADMIN.tier, Direction.INGRESS, (ADMIN.key,), log=True)
    prefix = next(p for p in rs.denials if p.startswith(loud))
    caplog.set_level(logging.INFO, "flock.policy.denied")
    with trio.fail_after(60):
        await svc.handle([denied(rs, prefix, "2001:db8:1::c", "2001:db8:1::b", 81), None])
        await svc.handle([LoggedPacket("in-flock99999999", 6, ip("::1"), ip("::2"), 6, 1, 2)])
        assert counters.packets == {("x", "Admin", "no-81", "deny-81", "Ingress"): 1}
        assert counters.unmatched == 2
        (line,) = caplog.records
        assert line.getMessage() == "denied ingress y/c → x/b TCP/81: Admin no-81 rule deny-81"
        assert line.rule == "deny-81"  # type: ignore[attr-defined]
        # the namespace stops logging: the next ruleset has no such drop, yet a record still in flight
        # names one of the previous ruleset's; the one after that forgets it, and its series
        rules.applied = compile_ruleset([], namespaces(""), [REMOTE], [A, B, C], [ADMIN, BASELINE])
        await svc.handle([denied(rs, prefix, "2001:db8:1::c", "2001:db8:1::b", 81)])
        assert counters.packets == {("x", "Admin", "no-81", "deny-81", "Ingress"): 2}
        rules.applied = attrs.evolve(rules.applied)
        await svc.handle([denied(rs, prefix, "2001:db8:1::c", "2001:db8:1::b", 81)])
        assert counters.packets == {} and counters.unmatched == 3


async def test_the_flows_remembered_are_bounded(autojump_clock: trio.abc.Clock) -> None:
    rs = compile_ruleset([DENY_X], namespaces("x"), [REMOTE], [A, B, C])
    svc, counters, _ = reader(rs, flows=8)
    a_in = pod_chain(A.host_veth or "", Direction.INGRESS)
    with trio.fail_after(60):
        # a scan from many addresses: every flow a line, only the last 8 remembered
        await svc.handle([denied(rs, a_in, f"2001:db8:5::{i:x}", "2001:db8:1::a", 80) for i in range(100)])
        assert svc.lines == 100 and len(svc._seen) == 8
        await svc.handle([denied(rs, a_in, "2001:db8:5::63", "2001:db8:1::a", 80)])  # remembered: no line
        await svc.handle([denied(rs, a_in, "2001:db8:5::0", "2001:db8:1::a", 80)])  # forgotten: a line
        assert svc.lines == 101 and sum(counters.packets.values()) == 102


async def test_the_service_reads_its_socket_retries_one_it_cannot_open_and_tidies_when_idle(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    rs = compile_ruleset([DENY_X], namespaces("x"), [REMOTE], [A, B, C])
    reading, writing = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    reading.setblocking(False)
    attempts: list[float] = []

    async def open_socket() -> socket.socket:
        await trio.lowlevel.checkpoint()
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise OSError(16, "Device or resource busy")  # the group is another program's
        return reading

    svc, counters, rules = reader(rs, open_socket=open_socket, rand=lambda: 0.5)
    a_in = pod_chain(A.host_veth or "", Direction.INGRESS)
    caplog.set_level(logging.DEBUG, "flock.policy.denied")
    with trio.fail_after(60), writing:
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)  # started at once: the agent does not wait for it
            assert attempts == [0.0]
            await trio.sleep(3.5)
            assert attempts == [0.0, 1.0, 3.0]  # backoff 1 s, 2 s
            writing.send(nflog_record(a_in, ipv6("2001:db8:1::c", "2001:db8:1::a", 6, TCP_80)))
            await trio.testing.wait_all_tasks_blocked()
            assert counters.packets == {("x", "NetworkPolicy", "deny", "", "Ingress"): 1}
            assert svc.lines == 1 and svc._cluster._journal is not None and svc._seen
            # logging switched off: once idle, the series, the flows and the pod index go
            rules.applied = compile_ruleset([DENY_X], namespaces(""), [REMOTE], [A, B, C])
            await trio.sleep(30.5)
            assert counters.packets == {} and not svc._seen and svc._cluster._journal is None
            nursery.cancel_scope.cancel()
    assert reading.fileno() == -1  # closed with the service
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "retrying in 1 s" in warnings[0].getMessage()
