"""``--verify``'s machinery in the real kernel (flock.policy.Tracer): a node namespace routes three pod
namespaces (flock.testing.policy_net), the compiled ruleset is in ``table inet flock`` (NftApplier over
``nft -f -``), and one packet per case is sent from a pod with tracing on for it alone.  Allowed and denied
packets (a NetworkPolicy's, an Admin ClusterNetworkPolicy's Deny and Pass, a logged drop, IPv4 and IPv6,
TCP and UDP, the forward and input hooks) go the way their explanation says, rule handle by rule handle
as nft itself lists them; a rule put in by hand is where the two part; and after every trace, a
cancelled one too, nothing of it is left: the ruleset as it was, no conntrack entry of the probe, no
process."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Iterator

import attrs
import pytest
import trio

from flock.netns import call_in_netns
from flock.policy import (
    AgentView,
    ClusterNetworkPolicy,
    Explanation,
    Kind,
    Namespace,
    NetworkPolicy,
    PolicyPod,
    PolicySnapshot,
    Protocol,
    Query,
    Target,
    Tracer,
    Verdict,
    Verification,
    compile_ruleset,
    explain,
    verification_of,
    verify_plan,
)
from flock.policy import PolicyNode as ClusterNode  # a Node as policy sees it (not the test's node)
from flock.policy._apply import NftApplier, nft_available
from flock.policy._backend import NftCommand
from flock.policy._nfnetlink import Flow
from flock.policy._trace import TRACE_TABLE, Captured
from flock.testing.netns import NetnsPool
from flock.testing.policy_net import Pod, PolicyNode

pytestmark = pytest.mark.root

NODE = "n1"
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
GUARD = ClusterNetworkPolicy.from_object(
    {
        "metadata": {"name": "guard", "resourceVersion": "3"},
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"namespaces": {"matchLabels": {"team": "cli"}}},
            "egress": [
                {"name": "no-db", "action": "Deny", "to": [{"networks": ["2001:db8:1::c/128", "192.0.2.12/32"]}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 5432}}}]},
                {"name": "web-pass", "action": "Pass", "to": [{"networks": ["2001:db8:1::b/128", "192.0.2.11/32"]}],
                 "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
            ],
        },
    }
)  # fmt: skip
NAMESPACES = (Namespace("cli", {"team": "cli"}), Namespace("srv", log_denied=True))
SPECS = {
    "cli/client": ("2001:db8:1::a", "192.0.2.10", {"app": "client"}, ()),
    "srv/web": ("2001:db8:1::b", "192.0.2.11", {"app": "web"}, ("80/tcp", "82/udp")),
    "srv/db": ("2001:db8:1::c", "192.0.2.12", {"app": "db"}, ("5432/tcp",)),
}


@attrs.define
class World:
    node: PolicyNode
    pods: dict[str, Pod]
    view: AgentView
    tracer: Tracer

    def nft(self, *args: str) -> str:
        return self.node.node.run("nft", *args).stdout

    def kernel(self) -> str:
        """The whole ruleset of the node, without counters and set elements (a probe counts, and a logged
        drop of it puts its veth in the log's meter, as any packet's does: a minute's entry)."""
        return self.nft("-s", "-t", "list", "ruleset")

    def handles(self, chain: str) -> list[int]:
        """The handles of *chain*'s rules in order, as nft lists them."""
        listing = json.loads(self.nft("-j", "list", "chain", "inet", "flock", chain))
        return [item["rule"]["handle"] for item in listing["nftables"] if "rule" in item]

    def explain(self, src: str, dst: str, port: int, proto: Protocol = Protocol.TCP, family: int = 6) -> Explanation:
        return explain(self.view, Query(src, dst, port, proto, family))

    async def verify(self, explanation: Explanation) -> tuple[Verification, Captured]:
        target = verify_plan(explanation, NODE)
        assert isinstance(target, Target), target
        before = await trio.to_thread.run_sync(self.kernel)
        with trio.fail_after(30):
            captured = await self.tracer.trace(target, self.pods[target.pod].netns.path)
        assert await trio.to_thread.run_sync(self.kernel) == before  # nothing of the trace stays
        assert conntrack_of(self.node, captured.flow) == []
        assert children("nft", "nsenter") == []
        return verification_of(explanation, NODE, captured, self.view.ruleset), captured


def conntrack_of(node: PolicyNode, flow: Flow) -> list[object]:
    """The node's conntrack entries of *flow*'s protocol from its source port."""
    from pyroute2 import Conntrack
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    family = socket.AF_INET6 if flow.saddr.version == 6 else socket.AF_INET
    match = NFCTAttrTuple(family=family, proto=flow.protocol, sport=flow.sport)

    def dump() -> list[object]:
        ct = Conntrack(nfgen_family=family)
        try:
            return list(ct.dump_entries(tuple_orig=match))
        finally:
            ct.close()

    return call_in_netns(node.node.path, dump)


def children(*names: str) -> list[str]:
    """This process's child processes called one of *names*."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        comm, _, rest = stat.partition("(")[2].rpartition(")")
        if int(rest.split()[1]) == os.getpid() and comm in names:
            found.append(f"{pid} {comm}")
    return found


@pytest.fixture
def world(require_root: None) -> Iterator[World]:
    missing = nft_available()
    if missing:
        pytest.fail(missing)
    with NetnsPool("fl-trace-") as pool:
        node = PolicyNode(pool)
        try:
            pods, policy_pods = {}, {}
            for key, (ip6, ip4, labels, serve) in SPECS.items():
                pods[key] = node.add_pod(key, ip6, ip4, serve=serve)
                ns, name = key.split("/")
                addresses = (ipaddress.ip_address(ip6), ipaddress.ip_address(ip4))
                policy_pods[key] = PolicyPod(ns, name, labels, addresses, node=NODE, host_veth=pods[key].veth)
            ruleset = compile_ruleset([WEB_ALLOW], NAMESPACES, policy_pods.values(), policy_pods.values(), [GUARD])
            listed = frozenset({Kind.NETWORK_POLICY, Kind.NAMESPACE, Kind.POD, Kind.CLUSTER_POLICY})
            snap = PolicySnapshot(
                3,
                {WEB_ALLOW.key: WEB_ALLOW},
                {n.name: n for n in NAMESPACES},
                {k: attrs.evolve(p, host_veth=None) for k, p in policy_pods.items()},
                listed,
                {GUARD.key: GUARD},
                {},
            )
            nft = NftCommand(("ip", "netns", "exec", node.node.name, "nft"))
            trio.run(NftApplier(nft).apply, ruleset)
            yield World(node, pods, AgentView(NODE, snap, policy_pods, ruleset, 7, 7), Tracer(nft, node.node.path))
        finally:
            node.close()


def texts(verification: Verification, direction: str) -> list[str]:
    check = next(c for c in verification.checks if c.direction == direction)
    assert check.walk is not None, check
    return [s.text() for s in check.walk.steps]


def chain_of(w: World, key: str, direction: str) -> str:
    return f"{'in' if direction == 'ingress' else 'eg'}-{w.pods[key].veth}"


async def test_an_allowed_packet_goes_the_explained_way_handle_by_handle(world: World) -> None:
    w = world
    explanation = w.explain("cli/client", "srv/web", 80)
    assert explanation.verdict is Verdict.ALLOWED
    got, captured = await w.verify(explanation)
    assert (got.status, got.why, got.notes) == ("agrees", "", ()), got
    client, web = chain_of(w, "cli/client", "egress"), chain_of(w, "srv/web", "ingress")
    admin = explanation.egress.trace.steps[0].verdict.removeprefix("jump ")
    policy = explanation.ingress.trace.steps[0].verdict.removeprefix("jump ")
    assert admin.startswith("ta-e-") and policy.startswith("pi-")
    # nft's own listing: the handles the trace names are the rules the explanation names
    eg, ta, ing, pi = w.handles(client), w.handles(admin), w.handles(web), w.handles(policy)
    egress_vmap, ingress_vmap = w.handles("egress")[-1], w.handles("ingress")[-1]  # after ct state's
    assert texts(got, "egress") == [
        f"egress[handle {egress_vmap}] jump {client}",
        f"{client}[0, handle {eg[0]}] jump {admin}",
        f"{admin}[2, handle {ta[2]}] return",  # web-pass, IPv6: Pass
        f"{client}[1] end",
        "egress policy accept",
    ]
    assert texts(got, "ingress") == [
        f"ingress[handle {ingress_vmap}] jump {web}",
        f"{web}[0, handle {ing[0]}] jump {policy}",
        f"{policy}[0, handle {pi[0]}] accept",
    ]
    assert captured.flow.dport == 80 and not captured.changed and not captured.lost


async def test_denied_packets_stop_at_the_drop_their_explanation_names(world: World) -> None:
    w = world
    web, client = chain_of(w, "srv/web", "ingress"), chain_of(w, "cli/client", "egress")
    # isolated by web-allow, no rule for 81: web's own drop, logged (srv logs): a log rule, then the drop
    explanation = w.explain("cli/client", "srv/web", 81)
    assert explanation.verdict is Verdict.DENIED
    got, _ = await w.verify(explanation)
    assert got.status == "agrees", got
    ing = w.handles(web)
    assert len(ing) == 3 and texts(got, "ingress")[-2:] == [
        f"{web}[1, handle {ing[1]}] log",
        f"{web}[1, handle {ing[2]}] drop",
    ]
    # the same over UDP
    got, _ = await w.verify(w.explain("cli/client", "srv/web", 82, Protocol.UDP))
    assert got.status == "agrees" and texts(got, "ingress")[-1] == f"{web}[1, handle {ing[2]}] drop", got
    # the Admin tier's Deny on the way out, over IPv4 (cli does not log: one rule): ingress never reached
    explanation = w.explain("cli/client", "srv/db", 5432, family=4)
    assert explanation.verdict is Verdict.DENIED
    assert explanation.egress is not None and explanation.egress.decided_by == "Admin"
    got, captured = await w.verify(explanation)
    assert got.status == "agrees" and [c.status for c in got.checks] == ["agrees", "not-verified"], got
    assert got.checks[1].why == "ingress not verified: the packet was dropped before it"
    admin = texts(got, "egress")[1].rsplit(" ", 1)[1]
    assert texts(got, "egress")[1:] == [
        f"{client}[0, handle {w.handles(client)[0]}] jump {admin}",
        f"{admin}[1, handle {w.handles(admin)[1]}] drop",  # no-db, IPv4
    ]
    assert str(captured.flow.saddr) == "192.0.2.10"


async def test_a_pod_reaching_its_node_meets_the_input_hook(world: World) -> None:
    w = world
    # neither Nodes listed nor the node's own addresses known: the explanation takes the address for
    # someone else's, and the kernel says so
    got, _ = await w.verify(w.explain("cli/client", w.node.node_ip6, 22))
    assert got == Verification(
        "not-verified",
        "cannot verify: the kernel delivered the packet to this node itself (the input hook) where the "
        f"explanation has it forwarded: it does not know {w.node.node_ip6} for one of this node's addresses",
        NODE,
        got.flow,
        trace_id=got.trace_id,
    )
    # listed: the input hook's chain, the Admin tier alone (the node map names client's Admin chain)
    nodes = {NODE: ClusterNode(NODE, (), (ipaddress.ip_address(w.node.node_ip6),))}
    inputs = attrs.evolve(w.view.inputs, nodes=nodes, synced=w.view.inputs.synced | {Kind.NODE})
    w.view = attrs.evolve(w.view, inputs=inputs)
    explanation = w.explain("cli/client", w.node.node_ip6, 22)
    assert explanation.egress.hook == "input" and explanation.verdict is Verdict.ALLOWED
    got, _ = await w.verify(explanation)
    assert got.status == "agrees" and [c.status for c in got.checks] == ["agrees", "agrees"], got
    admin = explanation.egress.trace.chain
    assert admin is not None and admin.startswith("ta-e-")
    assert texts(got, "egress") == [
        f"input[handle {w.handles('input')[-1]}] jump {admin}",
        f"{admin}[4] end",
        "input policy accept",
    ]


async def test_a_rule_put_in_by_hand_is_where_the_kernel_and_the_explanation_part(world: World) -> None:
    w = world
    web = chain_of(w, "srv/web", "ingress")
    explanation = w.explain("cli/client", "srv/web", 80)
    policy = explanation.ingress.trace.steps[0].verdict.removeprefix("jump ")
    w.nft("insert", "rule", "inet", "flock", web, "meta", "l4proto", "tcp", "th", "dport", "80", "drop")
    inserted = w.handles(web)[0]
    try:
        got, _ = await w.verify(explanation)
    finally:
        w.nft("delete", "rule", "inet", "flock", web, "handle", str(inserted))
    assert got.status == "disagrees"
    assert got.why == (
        f"ingress: the kernel dropped it at {web} rule handle {inserted} (not a rule the ruleset in force has) "
        f"where the explanation says it is accepted at {policy}[0]"
    )
    again, _ = await w.verify(explanation)
    assert again.status == "agrees", again


async def test_a_cancelled_trace_leaves_nothing(world: World) -> None:
    w = world
    before = await trio.to_thread.run_sync(w.kernel)
    client = w.pods["cli/client"]
    # nowhere to go: the packet never gets through, so the trace waits until cancelled
    target = Target("cli/client", client.veth, ipaddress.ip_address(client.ip6), ipaddress.ip_address("2001:db8:99::1"),
                    Protocol.TCP, 80)  # fmt: skip
    tracer = attrs.evolve(w.tracer, wait=600.0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tracer.trace, target, client.netns.path)
            while TRACE_TABLE not in await trio.to_thread.run_sync(w.nft, "list", "tables"):  # noqa: ASYNC110
                await trio.sleep(0.01)  # the kernel's state, polled: no event to wait on
            nursery.cancel_scope.cancel()
    assert await trio.to_thread.run_sync(w.kernel) == before
    assert children("nft", "nsenter") == []
