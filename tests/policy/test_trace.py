"""``flockctl policy explain --verify``'s pure parts (flock.policy._trace): the kernel's trace messages and
rule dump read from bytes the real kernel sent (captured from tests/policy/test_trace_kernel.py's world:
cli/client → srv/web, web isolated by a NetworkPolicy allowing clients on 80/TCP, srv logging its drops),
the handles named as compiled rules (a logged drop is two), the walks, and the kernel held to the
explanation: where they agree, where they part, and what cannot be verified."""

from __future__ import annotations

import ipaddress
import socket
import struct

import attrs
import pytest

from flock.fnv import fnv1a_32
from flock.policy import (
    AgentView,
    Captured,
    Flow,
    KernelTrace,
    Kind,
    Namespace,
    NetworkPolicy,
    PolicyPod,
    PolicySnapshot,
    Protocol,
    Query,
    Target,
    Verdict,
    compile_ruleset,
    explain,
    explanation_text,
    kernel_trace,
    place_rules,
    verification_of,
    verify,
    verify_plan,
)
from flock.policy._nfnetlink import KernelRule, TraceEvent, conntrack_delete_message, parse_rules, parse_trace
from flock.policy._nft import RenderError
from flock.policy._trace import KernelStep, KernelWalk
from flock.policy._tracer import trace_table

NODE = "n1"
# The keys of the --verify part of `flockctl policy explain --json` (add keys deliberately, never rename).
VERIFY_KEYS = {"egress", "ingress", "node", "notes", "probe", "status", "why"}
PROBE_KEYS = {"dport", "from", "protocol", "sport", "to", "trace_id"}
CHECK_KEYS = {"kernel", "status", "why"}
WALK_KEYS = {"chain", "steps", "verdict"}
STEP_KEYS = {"chain", "handle", "note", "part", "rule", "verdict"}


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def veth(key: str) -> str:
    return f"flock{fnv1a_32(key):08x}"


CLIENT = PolicyPod("cli", "client", {"app": "client"}, (ip("2001:db8:1::a"), ip("192.0.2.10")), node=NODE)
WEB = PolicyPod("srv", "web", {"app": "web"}, (ip("2001:db8:1::b"), ip("192.0.2.11")), node=NODE)
FAR = PolicyPod("srv", "far", {"app": "web"}, (ip("2001:db8:2::f"),), node="host002")
WEB_ALLOW = NetworkPolicy.from_object(
    {
        "metadata": {"namespace": "srv", "name": "web-allow", "resourceVersion": "7"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}],
                    "ports": [{"port": 80}],
                }
            ],
        },
    }
)
NAMESPACES = (Namespace("cli"), Namespace("srv", log_denied=True))
LISTED = frozenset({Kind.NETWORK_POLICY, Kind.NAMESPACE, Kind.POD, Kind.CLUSTER_POLICY})
WEB_IN = f"in-{veth('srv/web')}"  # in-flockf857c737
WEB_POLICY = "pi-0ae2e7b4b378d3df"  # web-allow's ingress chain


def view() -> AgentView:
    """The agent on n1, client and web its own pods, the ruleset in force compiled from the same inputs."""
    pods = (CLIENT, WEB, FAR)
    local = {p.key: attrs.evolve(p, host_veth=veth(p.key)) for p in pods if p.node == NODE}
    snap = PolicySnapshot(
        3, {WEB_ALLOW.key: WEB_ALLOW}, {n.name: n for n in NAMESPACES}, {p.key: p for p in pods}, LISTED, {}, {}
    )
    ruleset = compile_ruleset([WEB_ALLOW], NAMESPACES, pods, local.values())
    return AgentView(NODE, snap, local, ruleset, 7, 7)


def flow(sport: int, dport: int) -> Flow:
    return Flow(ip("2001:db8:1::a"), ip("2001:db8:1::b"), 6, sport, dport)


# sport of the captured probes: [(49407, 80), (46269, 81)]
TRACE_80 = bytes.fromhex(
    "c4000000110a000000000000000000000100000008000f000000000a0800040000000003080006004a95b63e080002007072650010000100"
    "666c6f636b2d7472616365000c00030000000000000000040c00050008000100ffffffff08000a000000000206000b00000100002c000800"
    "600eed560028064020010db800010000000000000000000a20010db800010000000000000000000b18000900c0ff0050751b770f00000000"
    "a002fd205bb70000120007002eb8ac900176ae117eaa52ce86dd000050000000110a000000000000000000000100000008000f000000000a"
    "0800040000000003080006004a95b63e080002007072650010000100666c6f636b2d7472616365000c00050008000100ffffffff4c000000"
    "110a000000000000000000000100000008000f000000000a0800040000000001080006004a95b63e080002007072650010000100666c6f63"
    "6b2d7472616365000800100000000001d8000000110a000000000000000000000100000008000f000000000a080004000000000308000600"
    "4a95b63e11000200686f7374706f72742d707265000000000a000100666c6f636b0000000c00050008000100ffffffff08000a0000000002"
    "06000b00000100002c000800600eed560028064020010db800010000000000000000000a20010db800010000000000000000000b18000900"
    "c0ff0050751b770f00000000a002fd205bb70000120007002eb8ac900176ae117eaa52ce86dd000008001500000000080500130000000000"
    "08001200f115697e54000000110a000000000000000000000100000008000f000000000a0800040000000001080006004a95b63e11000200"
    "686f7374706f72742d707265000000000a000100666c6f636b0000000800100000000001e8000000110a0000000000000000000001000000"
    "08000f000000000a0800040000000003080006004a95b63e0b00020065677265737300000a000100666c6f636b0000000c00050008000100"
    "ffffffff08000a000000000206000b000001000008000c000000000306000d00000100002c000800600eed560028063f20010db800010000"
    "000000000000000a20010db800010000000000000000000b18000900c0ff0050751b770f00000000a002fd205bb70000120007002eb8ac90"
    "0176ae117eaa52ce86dd00000800150000000008050013000000000008001200f115697e08001400000001004c000000110a000000000000"
    "000000000100000008000f000000000a0800040000000001080006004a95b63e0b00020065677265737300000a000100666c6f636b000000"
    "08001000000000010c010000110a000000000000000000000100000008000f000000000a0800040000000003080006004a95b63e0c000200"
    "696e6772657373000a000100666c6f636b0000000c000300000000000000001a2400050008000100fffffffd15000200696e2d666c6f636b"
    "66383537633733370000000008000a000000000206000b000001000008000c000000000306000d00000100002c000800600eed560028063f"
    "20010db800010000000000000000000a20010db800010000000000000000000b18000900c0ff0050751b770f00000000a002fd205bb70000"
    "120007002eb8ac900176ae117eaa52ce86dd00000800150000000008050013000000000008001200f115697e080014000000010080000000"
    "110a000000000000000000000100000008000f000000000a0800040000000003080006004a95b63e15000200696e2d666c6f636b66383537"
    "63373337000000000a000100666c6f636b0000000c000300000000000000002c2400050008000100fffffffd1800020070692d3061653265"
    "37623462333738643364660068000000110a000000000000000000000100000008000f000000000a0800040000000003080006004a95b63e"
    "1800020070692d30616532653762346233373864336466000a000100666c6f636b0000000c000300000000000000002f0c00050008000100"
    "00000001ec000000110a000000000000000000000100000008000f000000000a0800040000000003080006004a95b63e0c0002006677642d"
    "656e640010000100666c6f636b2d7472616365000c00050008000100ffffffff08000a000000000206000b000001000008000c0000000003"
    "06000d00000100002c000800600eed560028063f20010db800010000000000000000000a20010db800010000000000000000000b18000900"
    "c0ff0050751b770f00000000a002fd205bb70000120007002eb8ac900176ae117eaa52ce86dd000008001500000000080500130000000000"
    "08001200f115697e0800140000000100"
)
TRACE_81 = bytes.fromhex(
    "c4000000110a000000000000000000000100000008000f000000000a0800040000000003080006007c2ce45f080002007072650010000100"
    "666c6f636b2d7472616365000c00030000000000000000040c00050008000100ffffffff08000a000000000206000b00000100002c000800"
    "600165340028064020010db800010000000000000000000a20010db800010000000000000000000b18000900b4bd005111423a1300000000"
    "a002fd205bb70000120007002eb8ac900176ae117eaa52ce86dd000050000000110a000000000000000000000100000008000f000000000a"
    "0800040000000003080006007c2ce45f080002007072650010000100666c6f636b2d7472616365000c00050008000100ffffffff4c000000"
    "110a000000000000000000000100000008000f000000000a0800040000000001080006007c2ce45f080002007072650010000100666c6f63"
    "6b2d7472616365000800100000000001d8000000110a000000000000000000000100000008000f000000000a080004000000000308000600"
    "7c2ce45f11000200686f7374706f72742d707265000000000a000100666c6f636b0000000c00050008000100ffffffff08000a0000000002"
    "06000b00000100002c000800600165340028064020010db800010000000000000000000a20010db800010000000000000000000b18000900"
    "b4bd005111423a1300000000a002fd205bb70000120007002eb8ac900176ae117eaa52ce86dd000008001500000000080500130000000000"
    "080012000413d39454000000110a000000000000000000000100000008000f000000000a0800040000000001080006007c2ce45f11000200"
    "686f7374706f72742d707265000000000a000100666c6f636b0000000800100000000001e8000000110a0000000000000000000001000000"
    "08000f000000000a0800040000000003080006007c2ce45f0b00020065677265737300000a000100666c6f636b0000000c00050008000100"
    "ffffffff08000a000000000206000b000001000008000c000000000306000d00000100002c000800600165340028063f20010db800010000"
    "000000000000000a20010db800010000000000000000000b18000900b4bd005111423a1300000000a002fd205bb70000120007002eb8ac90"
    "0176ae117eaa52ce86dd000008001500000000080500130000000000080012000413d39408001400000001004c000000110a000000000000"
    "000000000100000008000f000000000a0800040000000001080006007c2ce45f0b00020065677265737300000a000100666c6f636b000000"
    "08001000000000010c010000110a000000000000000000000100000008000f000000000a0800040000000003080006007c2ce45f0c000200"
    "696e6772657373000a000100666c6f636b0000000c000300000000000000001a2400050008000100fffffffd15000200696e2d666c6f636b"
    "66383537633733370000000008000a000000000206000b000001000008000c000000000306000d00000100002c000800600165340028063f"
    "20010db800010000000000000000000a20010db800010000000000000000000b18000900b4bd005111423a1300000000a002fd205bb70000"
    "120007002eb8ac900176ae117eaa52ce86dd000008001500000000080500130000000000080012000413d394080014000000010080000000"
    "110a000000000000000000000100000008000f000000000a0800040000000003080006007c2ce45f15000200696e2d666c6f636b66383537"
    "63373337000000000a000100666c6f636b0000000c000300000000000000002c2400050008000100fffffffd1800020070692d3061653265"
    "3762346233373864336466005c000000110a000000000000000000000100000008000f000000000a0800040000000003080006007c2ce45f"
    "1800020070692d30616532653762346233373864336466000a000100666c6f636b0000000c00050008000100ffffffff68000000110a0000"
    "00000000000000000100000008000f000000000a0800040000000003080006007c2ce45f15000200696e2d666c6f636b6638353763373337"
    "000000000a000100666c6f636b0000000c000300000000000000002d0c00050008000100ffffffff68000000110a00000000000000000000"
    "0100000008000f000000000a0800040000000003080006007c2ce45f15000200696e2d666c6f636b6638353763373337000000000a000100"
    "666c6f636b0000000c000300000000000000002e0c0005000800010000000000"
)
RULE_DUMP = bytes.fromhex(
    "04010000060a020801000000792c0000010000060a000100666c6f636b0000000b00020065677265737300000c0003000000000000000017"
    "cc00040020000100070001006374000014000200080001000000000108000200000000004c0001000c00010062697477697365003c000200"
    "08000100000000010800020000000001080003000000000408000600000000000c00040008000100060000000c0005000800010000000000"
    "2c00010008000100636d700020000200080001000000000108000200000000010c0003000800010000000000300001000e000100696d6d65"
    "64696174650000001c0002000800010000000000100002000c0002000800010000000001a8000000060a020801000000792c000001000006"
    "0a000100666c6f636b0000000b00020065677265737300000c00030000000000000000180c00060000000000000000176400040024000100"
    "090001006d6574610000000014000200080002000000000608000100000000013c0001000b0001006c6f6f6b757000002c00020010000100"
    "6567726573732d706f64730008000200000000010800030000000000080005000000000004010000060a020801000000792c000001000006"
    "0a000100666c6f636b0000000c000200696e6772657373000c0003000000000000000019cc00040020000100070001006374000014000200"
    "080001000000000108000200000000004c0001000c00010062697477697365003c0002000800010000000001080002000000000108000300"
    "0000000408000600000000000c00040008000100060000000c00050008000100000000002c00010008000100636d70002000020008000100"
    "0000000108000200000000010c0003000800010000000000300001000e000100696d6d6564696174650000001c0002000800010000000000"
    "100002000c0002000800010000000001ac000000060a020801000000792c0000010000060a000100666c6f636b0000000c000200696e6772"
    "657373000c000300000000000000001a0c00060000000000000000196800040024000100090001006d657461000000001400020008000200"
    "000000070800010000000001400001000b0001006c6f6f6b757000003000020011000100696e67726573732d706f64730000000008000200"
    "000000010800030000000000080005000000000004010000060a020801000000792c0000010000060a000100666c6f636b0000000a000200"
    "696e7075740000000c000300000000000000001bcc0004002000010007000100637400001400020008000100000000010800020000000000"
    "4c0001000c00010062697477697365003c00020008000100000000010800020000000001080003000000000408000600000000000c000400"
    "08000100060000000c00050008000100000000002c00010008000100636d700020000200080001000000000108000200000000010c000300"
    "0800010000000000300001000e000100696d6d6564696174650000001c0002000800010000000000100002000c0002000800010000000001"
    "c8000000060a020801000000792c0000010000060a000100666c6f636b0000000a000200696e7075740000000c000300000000000000001c"
    "0c000600000000000000001b8400040024000100090001006d6574610000000014000200080002000000001308000100000000012c000100"
    "08000100636d700020000200080001000000000108000200000000010c0003000500010000000000300001000e000100696d6d6564696174"
    "650000001c0002000800010000000000100002000c000200080001000000000198010000060a020801000000792c0000010000060a000100"
    "666c6f636b0000000a000200696e7075740000000c000300000000000000001d0c000600000000000000001c540104002400010009000100"
    "6d6574610000000014000200080002000000000f08000100000000012c00010008000100636d700020000200080001000000000108000200"
    "000000000c000300050001000a000000340001000c0001007061796c6f616400240002000800010000000001080002000000000108000300"
    "000000180800040000000010640001000c000100626974776973650054000200080001000000000108000200000000010800030000000010"
    "08000600000000001800040014000100ffc00000000000000000000000000000180005001400010000000000000000000000000000000000"
    "3800010008000100636d70002c000200080001000000000108000200000000001800030014000100fe800000000000000000000000000000"
    "300001000e000100696d6d6564696174650000001c0002000800010000000000100002000c000200080001000000000128010000060a0208"
    "01000000792c0000010000060a000100666c6f636b0000000a000200696e7075740000000c000300000000000000001e0c00060000000000"
    "0000001de400040024000100090001006d6574610000000014000200080002000000000f08000100000000012c00010008000100636d7000"
    "20000200080001000000000108000200000000000c0003000500010002000000340001000c0001007061796c6f6164002400020008000100"
    "000000010800020000000001080003000000001008000400000000022c00010008000100636d700020000200080001000000000108000200"
    "000000000c00030006000100a9fe0000300001000e000100696d6d6564696174650000001c0002000800010000000000100002000c000200"
    "0800010000000001a8000000060a020801000000792c0000010000060a000100666c6f636b0000000a000200696e7075740000000c000300"
    "000000000000001f0c000600000000000000001e6400040024000100090001006d6574610000000014000200080002000000000608000100"
    "000000013c0001000b0001006c6f6f6b757000002c0002000e0001006e6f64652d706f647300000008000200000000010800030000000000"
    "080005000000000090000000060a020801000000792c0000010000060a000100666c6f636b00000015000200696e2d666c6f636b66383537"
    "63373337000000000c000300000000000000002c4c000400480001000e000100696d6d656469617465000000340002000800010000000000"
    "280002002400020008000100fffffffd1800020070692d306165326537623462333738643364660034010000060a020801000000792c0000"
    "010000060a000100666c6f636b00000015000200696e2d666c6f636b6638353763373337000000000c000300000000000000002d0c000600"
    "000000000000002ce400040024000100090001006d6574610000000014000200080002000000000708000100000000018c0001000b000100"
    "64796e73657400007c000200080004000000000108000300000000010f00010064656e796c6f672d696e00000c0006000000000000000000"
    "440007000a0001006c696d6974000000340002000c000100000000000000000a0c0002000000000000000001080003000000001408000400"
    "000000000800050000000000080009000000000030000100080001006c6f67002400020015000200696e2d666c6f636b6638353763373337"
    "0000000006000100666c0000b0000000060a020801000000792c0000010000060a000100666c6f636b00000015000200696e2d666c6f636b"
    "6638353763373337000000000c000300000000000000002e0c000600000000000000002d600004002c0001000c000100636f756e74657200"
    "1c0002000c00010000000000000000500c0002000000000000000001300001000e000100696d6d6564696174650000001c00020008000100"
    "00000000100002000c000200080001000000000018020000060a020801000000792c0000010000060a000100666c6f636b00000018000200"
    "70692d30616532653762346233373864336466000c000300000000000000002fd401040024000100090001006d6574610000000014000200"
    "080002000000000f08000100000000012c00010008000100636d700020000200080001000000000108000200000000000c00030005000100"
    "0a000000340001000c0001007061796c6f616400240002000800010000000001080002000000000108000300000000080800040000000010"
    "400001000b0001006c6f6f6b757000003000020019000100702d633935343330613136333335366161342d36000000000800020000000001"
    "080005000000000024000100090001006d6574610000000014000200080002000000001008000100000000012c00010008000100636d7000"
    "20000200080001000000000108000200000000000c0003000500010006000000340001000c0001007061796c6f6164002400020008000100"
    "000000010800020000000002080003000000000208000400000000022c00010008000100636d700020000200080001000000000108000200"
    "000000000c00030006000100005000002c0001000c000100636f756e746572001c0002000c00010000000000000000500c00020000000000"
    "00000001300001000e000100696d6d6564696174650000001c0002000800010000000000100002000c000200080001000000000124020000"
    "060a020801000000792c0000010000060a000100666c6f636b0000001800020070692d30616532653762346233373864336466000c000300"
    "00000000000000300c000600000000000000002fd401040024000100090001006d6574610000000014000200080002000000000f08000100"
    "000000012c00010008000100636d700020000200080001000000000108000200000000000c0003000500010002000000340001000c000100"
    "7061796c6f6164002400020008000100000000010800020000000001080003000000000c0800040000000004400001000b0001006c6f6f6b"
    "757000003000020019000100702d633935343330613136333335366161342d34000000000800020000000001080005000000000024000100"
    "090001006d6574610000000014000200080002000000001008000100000000012c00010008000100636d7000200002000800010000000001"
    "08000200000000000c0003000500010006000000340001000c0001007061796c6f6164002400020008000100000000010800020000000002"
    "080003000000000208000400000000022c00010008000100636d700020000200080001000000000108000200000000000c00030006000100"
    "005000002c0001000c000100636f756e746572001c0002000c00010000000000000000000c0002000000000000000000300001000e000100"
    "696d6d6564696174650000001c0002000800010000000000100002000c0002000800010000000001140000000300020001000000792c0000"
    "00000000"
)

ALLOWED, DENIED = flow(49407, 80), flow(46269, 81)


def walks(kernel: KernelTrace) -> dict[str, list[str]]:
    return {name: [s.text() for s in w.steps] for name, w in kernel.walks.items()}


def captured(data: bytes, f: Flow) -> KernelTrace:
    rules, done, _ = parse_rules(RULE_DUMP, 1)
    assert done
    return kernel_trace(parse_trace(data), f, place_rules(rules, view().ruleset))


# ---- the wire ---------------------------------------------------------------------------------------


def test_the_kernels_trace_messages_are_read_event_by_event() -> None:
    events = parse_trace(TRACE_81)
    assert len({e.trace_id for e in events}) == 1
    assert [(e.table, e.chain, e.kind, e.verdict, e.handle) for e in events] == [
        ("flock-trace", "pre", "rule", "continue", 4),  # meta nftrace set 1
        ("flock-trace", "pre", "rule", "continue", None),  # the chain's end
        ("flock-trace", "pre", "policy", "accept", None),
        ("flock", "hostport-pre", "rule", "continue", None),
        ("flock", "hostport-pre", "policy", "accept", None),
        ("flock", "egress", "rule", "continue", None),
        ("flock", "egress", "policy", "accept", None),
        ("flock", "ingress", "rule", f"jump {WEB_IN}", 26),  # oifname vmap @ingress-pods
        ("flock", WEB_IN, "rule", f"jump {WEB_POLICY}", 44),
        ("flock", WEB_POLICY, "rule", "continue", None),
        ("flock", WEB_IN, "rule", "continue", 45),  # the log rule
        ("flock", WEB_IN, "rule", "drop", 46),
    ]
    # each base chain's first event carries the packet
    assert [e.chain for e in events if e.packet is not None] == ["pre", "hostport-pre", "egress", "ingress"]
    assert {e.packet for e in events if e.packet is not None} == {DENIED}
    assert DENIED.text() == "TCP [2001:db8:1::a]:46269 → [2001:db8:1::b]:81"


def test_the_rule_dump_says_what_each_rule_does() -> None:
    rules, done, interrupted = parse_rules(RULE_DUMP, 1)
    assert done and not interrupted
    assert [(r.chain, r.handle, r.action) for r in rules] == [
        ("egress", 23, "accept"),
        ("egress", 24, "vmap"),
        ("ingress", 25, "accept"),
        ("ingress", 26, "vmap"),
        *[("input", h, "accept") for h in (27, 28, 29, 30)],
        ("input", 31, "vmap"),
        (WEB_IN, 44, f"jump {WEB_POLICY}"),
        (WEB_IN, 45, "log"),
        (WEB_IN, 46, "drop"),
        (WEB_POLICY, 47, "accept"),
        (WEB_POLICY, 48, "accept"),
    ]
    assert rules[0].expressions[0] == "ct" and rules[9].expressions == ("immediate",)
    assert parse_rules(RULE_DUMP, 2) == ([], False, False)  # another request's answer


def test_a_refused_dump_raises_the_kernels_error() -> None:
    header = struct.Struct("=IHHII")
    error = header.pack(header.size + 4, 2, 0, 5, 0) + struct.pack("=i", -1)  # NLMSG_ERROR, EPERM
    with pytest.raises(OSError, match="nftables rule dump") as refused:
        parse_rules(error, 5)
    assert refused.value.errno == 1


def test_the_probes_conntrack_entry_is_deleted_by_its_5_tuple() -> None:
    message = conntrack_delete_message(ALLOWED, 9)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", message)
    assert (length, kind, flags, seq) == (len(message), (1 << 8) | 2, 0x1 | 0x4, 9)
    assert message[16] == socket.AF_INET6
    body = message[20:]
    assert body[2:4] == struct.pack("=H", 0x8000 | 1)  # CTA_TUPLE_ORIG, nested
    assert ALLOWED.saddr.packed in body and ALLOWED.daddr.packed in body
    assert struct.pack(">H", 49407) in body and struct.pack(">H", 80) in body and bytes([6]) in body
    v4 = conntrack_delete_message(Flow(ip("192.0.2.10"), ip("192.0.2.11"), 17, 40000, 53), 1)
    assert v4[16] == socket.AF_INET and ip("192.0.2.11").packed in v4


def test_the_trace_table_traces_that_packet_alone_and_marks_the_ends_of_the_hooks() -> None:
    target = Target("cli/client", veth("cli/client"), ip("2001:db8:1::a"), ip("2001:db8:1::b"), Protocol.TCP, 80)
    assert trace_table(target, 40000) == (
        "add table inet flock-trace\n"
        "delete table inet flock-trace\n"
        "table inet flock-trace {\n"
        "\tchain pre {\n"
        "\t\ttype filter hook prerouting priority -350; policy accept;\n"
        f'\t\tiifname "{veth("cli/client")}" ip6 saddr 2001:db8:1::a ip6 daddr 2001:db8:1::b meta l4proto tcp '
        "th sport 40000 th dport 80 tcp flags & (syn | ack) == syn meta nftrace set 1\n"
        "\t}\n"
        "\tchain fwd-end {\n"
        "\t\ttype filter hook forward priority 1000; policy accept;\n"
        "\t}\n"
        "\tchain in-end {\n"
        "\t\ttype filter hook input priority 1000; policy accept;\n"
        "\t}\n"
        "}\n"
    )
    udp = attrs.evolve(target, saddr=ip("192.0.2.10"), daddr=ip("192.0.2.11"), protocol=Protocol.UDP, dport=53)
    assert "ip saddr 192.0.2.10 ip daddr 192.0.2.11 meta l4proto udp th sport 1 th dport 53 meta" in trace_table(udp, 1)
    with pytest.raises(RenderError):
        trace_table(attrs.evolve(target, iif='eth0" accept; #'), 1)


# ---- the kernel's rules named ------------------------------------------------------------------------


def test_a_logged_drop_is_two_kernel_rules_of_one_compiled_rule() -> None:
    rules, _, _ = parse_rules(RULE_DUMP, 1)
    places = place_rules(rules, view().ruleset).rules
    named = {h: (p.chain, p.index, p.part, p.note) for h, p in places.items()}
    assert named == {
        23: ("egress", None, "base", "established"),
        24: ("egress", None, "base", "vmap"),
        25: ("ingress", None, "base", "established"),
        26: ("ingress", None, "base", "vmap"),
        27: ("input", None, "base", "established"),
        **{h: ("input", None, "base", "always") for h in (28, 29, 30)},
        31: ("input", None, "base", "vmap"),
        44: (WEB_IN, 0, "rule", ""),
        45: (WEB_IN, 1, "log", ""),
        46: (WEB_IN, 1, "rule", ""),
        47: (WEB_POLICY, 0, "rule", ""),
        48: (WEB_POLICY, 1, "rule", ""),
    }


def test_a_rule_put_in_by_hand_is_named_no_rule_of_the_ruleset() -> None:
    rules, _, _ = parse_rules(RULE_DUMP, 1)
    at = next(i for i, r in enumerate(rules) if r.chain == WEB_IN)
    inserted = [*rules[:at], KernelRule(WEB_IN, 99, "drop", ("payload", "cmp", "immediate")), *rules[at:]]
    places = place_rules(inserted, view().ruleset).rules
    assert (places[99].part, places[99].note) == ("foreign", "not a rule the ruleset in force has")
    assert [(places[h].index, places[h].part) for h in (44, 45, 46)] == [(0, "rule"), (1, "log"), (1, "rule")]
    # a chain that lost a rule, or one the ruleset has not: nothing of it is named
    short = [r for r in rules if r.handle != 46] + [KernelRule("in-flock00000000", 70, "drop")]
    places = place_rules(short, view().ruleset).rules
    assert places[44].part == places[45].part == "foreign"
    assert places[44].note == "the chain holds 2 rules in the kernel, 3 in the ruleset in force"
    assert places[70].note == "a chain the ruleset in force does not have"
    assert place_rules(rules, None).rules[47].part == "foreign"  # nothing compiled yet


# ---- the walks ----------------------------------------------------------------------------------------


def test_the_kernels_walks_of_an_allowed_and_a_denied_packet() -> None:
    allowed = captured(TRACE_80, ALLOWED)
    assert allowed.seen and allowed.complete and allowed.passed == {"forward"} and not allowed.dropped_elsewhere
    assert walks(allowed) == {
        "egress": ["egress policy accept"],  # client is isolated by nothing: not in the egress map
        "ingress": [
            f"ingress[handle 26] jump {WEB_IN}",
            f"{WEB_IN}[0, handle 44] jump {WEB_POLICY}",
            f"{WEB_POLICY}[0, handle 47] accept",
        ],
    }
    assert allowed.walks["ingress"].verdict == "accept"
    denied = captured(TRACE_81, DENIED)
    assert denied.complete and denied.passed == frozenset()
    assert walks(denied)["ingress"] == [
        f"ingress[handle 26] jump {WEB_IN}",
        f"{WEB_IN}[0, handle 44] jump {WEB_POLICY}",
        f"{WEB_POLICY}[2] end",
        f"{WEB_IN}[1, handle 45] log",
        f"{WEB_IN}[1, handle 46] drop",
    ]
    assert denied.walks["ingress"].verdict == "drop"
    # another packet's trace is not this one's
    assert not captured(TRACE_80, DENIED).seen


def test_a_trace_ends_when_the_packets_fate_is_known() -> None:
    events = parse_trace(TRACE_80)
    until = next(i for i, e in enumerate(events) if e.table == "flock-trace" and e.chain == "fwd-end")
    rules, _, _ = parse_rules(RULE_DUMP, 1)
    places = place_rules(rules, view().ruleset)
    assert not kernel_trace(events[:until], ALLOWED, places).complete
    assert kernel_trace(events[: until + 1], ALLOWED, places).complete


# ---- held to the explanation --------------------------------------------------------------------------


def ask(src: str, dst: str, port: int, proto: Protocol = Protocol.TCP):
    return explain(view(), Query(src, dst, port, proto))


def test_the_kernel_agrees_with_the_explanation_of_an_allowed_and_a_denied_packet() -> None:
    allowed = verify(ask("cli/client", "srv/web", 80), NODE, captured(TRACE_80, ALLOWED))
    assert (allowed.status, allowed.why, allowed.notes) == ("agrees", "", ())
    assert [(c.direction, c.status) for c in allowed.checks] == [("egress", "agrees"), ("ingress", "agrees")]
    explanation = ask("cli/client", "srv/web", 81)
    assert explanation.verdict is Verdict.DENIED
    denied = verify(explanation, NODE, captured(TRACE_81, DENIED))
    assert denied.status == "agrees" and denied.checks[1].walk is not None
    doc = denied.to_json()
    assert set(doc) == VERIFY_KEYS and set(doc["probe"]) == PROBE_KEYS and set(doc["ingress"]) == CHECK_KEYS
    assert set(doc["ingress"]["kernel"]) == WALK_KEYS and all(
        set(s) == STEP_KEYS for s in doc["ingress"]["kernel"]["steps"]
    )
    assert doc["probe"] == {
        "from": "2001:db8:1::a",
        "to": "2001:db8:1::b",
        "protocol": "TCP",
        "sport": 46269,
        "dport": 81,
        "trace_id": f"{parse_trace(TRACE_81)[0].trace_id:08x}",
    }
    assert doc["ingress"]["kernel"]["steps"][-1] == {
        "chain": WEB_IN,
        "handle": 46,
        "rule": 1,
        "part": "rule",
        "verdict": "drop",
        "note": "",
    }


def test_the_kernel_is_printed_next_to_the_explanations_chains() -> None:
    explanation = ask("cli/client", "srv/web", 81)
    doc = explanation.to_json()
    doc["verify"] = verify(explanation, NODE, captured(TRACE_81, DENIED)).to_json()
    lines = explanation_text(doc).splitlines()
    chains = next(i for i, line in enumerate(lines) if line.strip().startswith(f"chains: {WEB_IN}"))
    assert lines[chains + 1] == "           the ruleset in force on n1 agrees"
    assert lines[chains + 2] == (
        f"           kernel agrees: ingress[handle 26] jump {WEB_IN} → {WEB_IN}[0, handle 44] jump {WEB_POLICY} → "
        f"{WEB_POLICY}[2] end → {WEB_IN}[1, handle 45] log → {WEB_IN}[1, handle 46] drop"
    )
    assert "           kernel agrees: egress policy accept" in lines
    trace_id = doc["verify"]["probe"]["trace_id"]
    assert lines[-2] == (
        f"kernel   agrees: one TCP packet 2001:db8:1::a port 46269 → 2001:db8:1::b port 81, traced on n1 "
        f"(trace id {trace_id})"
    )
    assert lines[-1].startswith("inputs   ")
    assert explanation_text(explanation.to_json()) == explanation.text()  # without --verify: as before


def _hand_put(data: bytes, f: Flow, events_after_vmap: list[TraceEvent], rules: list[KernelRule]) -> KernelTrace:
    """The trace of *data* with what follows the ingress vmap replaced, the table with *rules* added."""
    events = parse_trace(data)
    vmap = next(i for i, e in enumerate(events) if e.chain == "ingress" and e.handle == 26)
    dump, _, _ = parse_rules(RULE_DUMP, 1)
    at = next(i for i, r in enumerate(dump) if r.chain == WEB_IN)
    places = place_rules([*dump[:at], *rules, *dump[at:]], view().ruleset)
    return kernel_trace([*events[: vmap + 1], *events_after_vmap], f, places)


def test_a_drop_the_explanation_does_not_know_is_where_the_two_part() -> None:
    trace_id = parse_trace(TRACE_80)[0].trace_id
    dropped = TraceEvent(trace_id, "flock", WEB_IN, "rule", "drop", 99)
    kernel = _hand_put(TRACE_80, ALLOWED, [dropped], [KernelRule(WEB_IN, 99, "drop")])
    got = verify(ask("cli/client", "srv/web", 80), NODE, kernel)
    assert got.status == "disagrees" and got.checks[0].status == "agrees", got
    assert got.why == (
        f"ingress: the kernel dropped it at {WEB_IN} rule handle 99 (not a rule the ruleset in force has) "
        f"where the explanation says it is accepted at {WEB_POLICY}[0]"
    )
    lines = explanation_text({**ask("cli/client", "srv/web", 80).to_json(), "verify": got.to_json()}).splitlines()
    assert f"           kernel DISAGREES: ingress[handle 26] jump {WEB_IN} → {WEB_IN}[?, handle 99] drop" in lines
    assert f"kernel   DISAGREES: {got.why}" in lines


def test_the_same_verdict_by_another_way_is_a_parting_too() -> None:
    trace_id = parse_trace(TRACE_81)[0].trace_id
    # the kernel drops at web's own drop without having asked the policy's chain first
    straight = [TraceEvent(trace_id, "flock", WEB_IN, "rule", "drop", 46)]
    got = verify(ask("cli/client", "srv/web", 81), NODE, _hand_put(TRACE_81, DENIED, straight, []))
    assert got.status == "disagrees"
    assert got.why == (
        f"ingress: the kernel met {WEB_IN}[1, handle 46] drop where the explanation meets {WEB_IN}[0] jump {WEB_POLICY}"
    )
    # the ingress map sending it to another chain
    events = parse_trace(TRACE_80)
    vmap = next(i for i, e in enumerate(events) if e.handle == 26)
    events[vmap] = attrs.evolve(events[vmap], verdict="jump in-flock00000000")
    rules, _, _ = parse_rules(RULE_DUMP, 1)
    kernel = kernel_trace(events[: vmap + 1], ALLOWED, place_rules(rules, view().ruleset))
    got = verify(ask("cli/client", "srv/web", 80), NODE, kernel)
    assert got.status == "disagrees"
    assert got.why == (
        f"ingress: the kernel let it through (no rule of flock's decided) where the explanation says it is "
        f"accepted at {WEB_POLICY}[0] (the kernel's ingress chain sent it to in-flock00000000 where the "
        f"explanation names {WEB_IN})"
    )


def test_what_cannot_be_verified_says_why() -> None:
    v = view()
    assert verify_plan(explain(v, Query("srv/far", "cli/client", 80, Protocol.TCP)), NODE) == (
        "cannot verify: the source is not on this node; run it on host002"
    )
    assert verify_plan(explain(v, Query("2001:db8:9::1", "srv/web", 80, Protocol.TCP)), NODE) == (
        "cannot verify: the source is no pod (the packet is sent from inside the source pod)"
    )
    assert verify_plan(explain(v, Query("cli/client", "cli/client", 80, Protocol.TCP)), NODE) == (
        "nothing to verify: a pod reaching itself never leaves its network namespace"
    )
    unknown = explain(v, Query("cli/nobody", "srv/web", 80, Protocol.TCP))
    assert verify_plan(unknown, NODE).startswith("cannot verify: the explanation cannot tell")
    assert verify_plan(ask("cli/client", "srv/web", 80), NODE) == Target(
        "cli/client", veth("cli/client"), ip("2001:db8:1::a"), ip("2001:db8:1::b"), Protocol.TCP, 80
    )
    # never seen; seen, but it met none of flock's chains (no route)
    explanation = ask("cli/client", "srv/web", 80)
    assert verify(explanation, NODE, KernelTrace(ALLOWED)).why.startswith("cannot verify: the kernel never showed")
    lost = verify(explanation, NODE, KernelTrace(ALLOWED, seen=True))
    assert lost.status == "not-verified" and "(no route to 2001:db8:1::b?)" in lost.why


def test_a_remote_destinations_ingress_is_not_verified_here_and_its_egress_is() -> None:
    explanation = ask("cli/client", "srv/far", 80)
    through = KernelWalk("egress", (KernelStep("egress", "accept", part="policy"),), "accept")
    elsewhere = KernelWalk("ingress", (KernelStep("ingress", "accept", part="policy"),), "accept")
    far = Flow(ip("2001:db8:1::a"), ip("2001:db8:2::f"), 6, 40000, 80)
    kernel = KernelTrace(far, True, {"egress": through, "ingress": elsewhere}, frozenset({"forward"}))
    got = verify(explanation, NODE, kernel)
    assert got.status == "agrees" and [c.status for c in got.checks] == ["agrees", "not-verified"]
    assert got.notes == (
        "ingress not verified: srv/far is on host002, whose kernel enforces it (the packet can be sent only "
        "from a pod on this node, and traced only where it passes); the egress part was verified",
    )
    text = explanation_text({**explanation.to_json(), "verify": got.to_json()})
    assert "kernel   agrees: one TCP packet 2001:db8:1::a port 40000 → 2001:db8:2::f port 80" in text
    assert f"note     {got.notes[0]}" in text


def test_an_egress_drop_leaves_the_ingress_unverified() -> None:
    explanation = ask("cli/client", "srv/web", 80)
    dropped = KernelWalk("egress", (KernelStep("egress", "drop", 5, part="foreign", note="x"),), "drop")
    got = verify(explanation, NODE, KernelTrace(ALLOWED, True, {"egress": dropped}))
    assert got.status == "disagrees" and [c.status for c in got.checks] == ["disagrees", "not-verified"]
    assert got.checks[1].why == "ingress not verified: the packet was dropped before it"
    assert got.why == (
        "egress: the kernel dropped it at egress rule handle 5 (x) where the explanation says it goes through "
        "(no rule decides)"
    )


def test_a_table_changed_while_tracing_verifies_nothing() -> None:
    rules, _, _ = parse_rules(RULE_DUMP, 1)
    explanation = ask("cli/client", "srv/web", 80)
    events = tuple(parse_trace(TRACE_80))
    same = verification_of(explanation, NODE, Captured(ALLOWED, events, tuple(rules)), view().ruleset)
    assert same.status == "agrees"
    changed = verification_of(explanation, NODE, Captured(ALLOWED, events, tuple(rules), changed=True), None)
    assert changed.status == "not-verified" and "changed while the packet was traced" in changed.why
    lost = verification_of(explanation, NODE, Captured(ALLOWED, events, tuple(rules), lost=True), view().ruleset)
    assert lost.notes == ("some trace messages were lost (the socket was full)",)
