"""The rendered ruleset in the real kernel: loads, enforces what the reference says, updates in place.

A node namespace routes three pod namespaces (flock-named veths); Debian's nft
applies ``table inet flock`` there; Python sockets probe TCP and UDP over IPv6
and IPv4.  SCTP is checked as loaded rules (no SCTP sockets on this kernel).
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import itertools
from collections.abc import Iterator

import attrs
import pytest
import trio

from flock.model import Allocation
from flock.policy import (
    ClusterNetworkPolicy,
    Endpoint,
    Kind,
    Namespace,
    NetworkPolicy,
    PolicyInputs,
    PolicyPod,
    PolicyService,
    Protocol,
    compile_ruleset,
    evaluate,
)
from flock.policy import PolicyNode as ClusterNode
from flock.policy._apply import NftApplier, nft_available
from flock.policy._backend import LibNftables, NftCommand, NftError
from flock.testing.netns import NetnsPool
from flock.testing.policy import MemoryLocalPods
from flock.testing.policy_net import Pod, PolicyNode, held_echo, open_held, probe, stop

pytestmark = pytest.mark.root
PORTS = ((80, "tcp"), (81, "tcp"), (80, "udp"))
SERVE = ("80/tcp", "81/tcp", "80/udp")


@attrs.define
class World:
    node: PolicyNode
    pods: dict[str, Pod]
    policy_pods: dict[str, PolicyPod]
    applier: NftApplier
    namespaces: list[Namespace]


@pytest.fixture(params=["nft-command", "libnftables"])
def world(request: pytest.FixtureRequest, require_root: None) -> Iterator[World]:
    missing = nft_available()
    if missing:
        pytest.fail(missing)
    with NetnsPool("fl-pol-") as pool:
        node = PolicyNode(pool)
        try:
            specs = {
                "x/a": ("2001:db8:1::a", "192.0.2.10", {"app": "a"}),
                "x/b": ("2001:db8:1::b", "192.0.2.11", {"app": "b"}),
                "y/c": ("2001:db8:1::c", "192.0.2.12", {"app": "c"}),
            }
            pods, policy_pods = {}, {}
            for key, (ip6, ip4, labels) in specs.items():
                pod = node.add_pod(key, ip6, ip4, serve=SERVE)
                pods[key] = pod
                ns, name = key.split("/")
                policy_pods[key] = PolicyPod(
                    ns,
                    name,
                    labels,
                    (ipaddress.ip_address(ip6), ipaddress.ip_address(ip4)),
                    node="n1",
                    host_veth=pod.veth,
                )
            namespaces = [Namespace("x", {"team": "x"}), Namespace("y", {"team": "y"})]
            backend: NftCommand | LibNftables
            if request.param == "libnftables":
                backend = LibNftables(node.node.path)
            else:
                backend = NftCommand(("ip", "netns", "exec", node.node.name, "nft"))
            try:
                yield World(node, pods, policy_pods, NftApplier(backend), namespaces)
            finally:
                if isinstance(backend, LibNftables):
                    backend.close()
        finally:
            node.close()


def _policies(*docs: dict) -> list[NetworkPolicy]:
    return [NetworkPolicy.from_object(d) for d in docs]


DENY_X = {"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}}
ALLOW_Y_TO_A_80 = {
    "metadata": {"namespace": "x", "name": "y-to-a"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}], "ports": [{"port": 80}]}],
    },
}
B_EGRESS_UDP_TO_C = {
    "metadata": {"namespace": "x", "name": "b-out"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "b"}},
        "policyTypes": ["Egress"],
        "egress": [
            {
                "to": [{"ipBlock": {"cidr": "2001:db8:1::/64", "except": ["2001:db8:1::a/128"]}}],
                "ports": [{"protocol": "UDP", "port": 80}],
            },
            {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 81, "endPort": 90}]},
        ],
    },
}


def _matrix(
    w: World,
    policies: list[NetworkPolicy],
    cnps: list[ClusterNetworkPolicy] | None = None,
    nodes: list[ClusterNode] | None = None,
) -> list[tuple[str, str, str, int, str, bool, bool]]:
    """(src, dst, family, port, proto, expected, observed) for every pod pair, port and family
    (with *cnps*, every pod to the node's own addresses too: dst "node")."""
    cases = []
    if cnps is not None:
        node_ep = {6: w.node.node_ip6, 4: w.node.node_ip4}
        for (sk, src), fam, (port, proto) in itertools.product(w.pods.items(), (6, 4), PORTS):
            saddr = src.ip6 if fam == 6 else src.ip4
            want = evaluate(
                policies,
                w.namespaces,
                Endpoint(ipaddress.ip_address(saddr), w.policy_pods[sk]),
                Endpoint(ipaddress.ip_address(node_ep[fam]), node="n1"),
                port,
                Protocol(proto.upper()),
                cnps,
                nodes or (),
            )
            cases.append((sk, "node", fam, port, proto, want, src, node_ep[fam]))
    for (sk, src), (dk, dst) in itertools.permutations(w.pods.items(), 2):
        for fam, (port, proto) in itertools.product((6, 4), PORTS):
            daddr = dst.ip6 if fam == 6 else dst.ip4
            saddr = src.ip6 if fam == 6 else src.ip4
            want = evaluate(
                policies,
                w.namespaces,
                Endpoint(ipaddress.ip_address(saddr), w.policy_pods[sk]),
                Endpoint(ipaddress.ip_address(daddr), w.policy_pods[dk]),
                port,
                Protocol(proto.upper()),
                cnps or (),
                nodes or (),
            )
            cases.append((sk, dk, fam, port, proto, want, src, daddr))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        seen = list(pool.map(lambda c: probe(c[6].netns, c[7], c[3], c[4]), cases))
    return [(c[0], c[1], str(c[2]), c[3], c[4], c[5], got) for c, got in zip(cases, seen, strict=True)]


async def _apply(w: World, policies: list[NetworkPolicy], pods: dict[str, PolicyPod] | None = None):
    pods = pods if pods is not None else w.policy_pods
    rs = compile_ruleset(policies, w.namespaces, pods.values(), pods.values())
    return rs, await w.applier.apply(rs)


async def test_kernel_enforces_what_the_reference_says(world: World) -> None:
    w = world
    with trio.fail_after(120):
        open_matrix = await trio.to_thread.run_sync(_matrix, w, [])
        assert all(row[5] and row[6] for row in open_matrix), "without policies everything connects"

        policies = _policies(DENY_X, ALLOW_Y_TO_A_80, B_EGRESS_UDP_TO_C)
        _, result = await _apply(w, policies)
        assert result.mode == "full"
        rows = await trio.to_thread.run_sync(_matrix, w, policies)
        wrong = [r for r in rows if r[5] != r[6]]
        assert not wrong, wrong
        # the reference is not vacuous here: some pairs blocked, some allowed, per family and protocol
        assert any(r[5] for r in rows) and not all(r[5] for r in rows)
        assert ("y/c", "x/a", "6", 80, "tcp", True, True) in rows
        assert ("y/c", "x/a", "4", 81, "tcp", False, False) in rows
        assert ("x/b", "y/c", "6", 80, "udp", True, True) in rows
        assert ("x/b", "y/c", "6", 80, "tcp", False, False) in rows

        # the node reaches its isolated pods (kubelet probes) and they reach it
        node = w.node.node
        a = w.pods["x/a"]
        assert await trio.to_thread.run_sync(probe, node, a.ip6, 81, "tcp")
        assert await trio.to_thread.run_sync(probe, node, a.ip4, 80, "udp")

        counters = await w.applier.counters()
        policy_chains = {c: k for c, k in w.applier.applied.policy_chains.items()}  # type: ignore[union-attr]
        allowed_packets = sum(p for c, (p, _) in counters.items() if policy_chains.get(c) == "x/y-to-a")
        assert allowed_packets > 0
        # libnftables' backend reads them with a netlink rule dump: the same figures as nft's own listing
        listed = await NftCommand(("ip", "netns", "exec", w.node.node.name, "nft")).counters("flock")
        assert counters == listed and any(b for _, b in counters.values())


def _cnp(name: str, tier: str, priority: int, subject: dict, **rules: list[dict]) -> ClusterNetworkPolicy:
    spec = {"tier": tier, "priority": priority, "subject": subject, **rules}
    return ClusterNetworkPolicy.from_object({"metadata": {"name": name}, "spec": spec})


TCP81 = [{"tcp": {"destinationPort": {"number": 81}}}]
TIERS = [
    # Admin: nothing from y reaches x on 81/tcp, whatever a NetworkPolicy says
    _cnp("deny-y-81", "Admin", 10, {"namespaces": {"matchLabels": {"team": "x"}}},
         ingress=[{"name": "no-81", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": "y"}}}],
                   "protocols": TCP81}]),
    # Admin: x/a's ingress from anyone passes on to its NetworkPolicies (the Baseline below never sees it)
    _cnp("pass-a", "Admin", 20, {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "a"}}}},
         ingress=[{"action": "Pass", "from": [{"namespaces": {}}]}]),
    # Admin: y's pods reach no node on 80/tcp (their own included: the input hook) and not 192.0.2.10 on UDP
    _cnp("y-out", "Admin", 5, {"namespaces": {"matchLabels": {"team": "y"}}},
         egress=[{"name": "no-kubelet", "action": "Deny", "to": [{"nodes": {"matchLabels": {"zone": "a"}}}],
                  "protocols": [{"tcp": {"destinationPort": {"range": {"start": 79, "end": 80}}}}]},
                 {"action": "Deny", "to": [{"networks": ["192.0.2.10/32", "2001:db8:1::a/128"]}],
                  "protocols": [{"udp": {"destinationPort": {"number": 80}}}]},
                 {"action": "Accept", "to": [{"networks": ["::/0", "0.0.0.0/0"]}]}]),
    # Baseline: nothing reaches a pod labelled app=b from app=c — unless a NetworkPolicy isolates it
    _cnp("baseline-b", "Baseline", 1, {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "b"}}}},
         ingress=[{"action": "Deny", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "c"}}}}]}]),
]  # fmt: skip
NODE_N1 = ClusterNode.from_object(
    {
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "status": {"addresses": [{"type": "InternalIP", "address": a} for a in ("2001:db8:ffff::1", "198.51.100.1")]},
    }
)


async def test_kernel_enforces_the_tiers_as_the_reference_says(world: World) -> None:
    """Admin Deny over a NetworkPolicy allow, Admin Pass to NetworkPolicy, Baseline where no NetworkPolicy
    isolates, nodes and networks peers (a pod reaching its own node: the input hook), ranges; and the
    per-rule counters name the ClusterNetworkPolicy and its rule."""
    w = world
    w.node.serve(SERVE)
    policies = _policies(ALLOW_Y_TO_A_80, {**DENY_X, "metadata": {"namespace": "x", "name": "deny"}})
    policies = [p for p in policies if p.name == "y-to-a"]  # x/a isolated (ingress), x/b not: Baseline's
    with trio.fail_after(120):
        pods = w.policy_pods
        rs = compile_ruleset(policies, w.namespaces, pods.values(), pods.values(), TIERS, [NODE_N1])
        assert (await w.applier.apply(rs)).mode == "full"
        rows = await trio.to_thread.run_sync(_matrix, w, policies, TIERS, [NODE_N1])
        wrong = [r for r in rows if r[5] != r[6]]
        assert not wrong, wrong
        assert ("y/c", "x/a", "6", 80, "tcp", True, True) in rows  # Pass → the NetworkPolicy allows it
        assert ("y/c", "x/a", "6", 81, "tcp", False, False) in rows  # Admin Deny
        assert ("x/b", "x/a", "4", 80, "tcp", False, False) in rows  # Pass → the NetworkPolicy denies it
        assert ("y/c", "x/b", "6", 80, "tcp", False, False) in rows  # Baseline deny (x/b not isolated)
        assert ("x/a", "x/b", "6", 80, "tcp", True, True) in rows
        assert ("y/c", "node", "6", 80, "tcp", False, False) in rows  # its own node, in the input hook
        assert ("y/c", "node", "4", 81, "tcp", True, True) in rows
        assert ("x/a", "node", "6", 80, "tcp", True, True) in rows
        assert ("y/c", "x/a", "4", 80, "udp", False, False) in rows  # networks, IPv4
        assert ("y/c", "x/a", "6", 80, "udp", False, False) in rows  # networks, IPv6
        # the node still reaches every pod (kubelet probes), and NDP/ARP to the gateway still work
        for pod in w.pods.values():
            assert await trio.to_thread.run_sync(probe, w.node.node, pod.ip6, 80, "tcp")
        counters = await w.applier.counters()
        per_rule: dict[tuple[str, str], int] = {}
        for chain, owners in rs.tier_rules.items():
            for i, owner in enumerate(owners):
                per_rule[owner] = per_rule.get(owner, 0) + counters.get(f"{chain}#{i}", (0, 0))[0]
        assert per_rule[("deny-y-81", "no-81")] > 0 and per_rule[("y-out", "no-kubelet")] > 0
        listed = await NftCommand(("ip", "netns", "exec", w.node.node.name, "nft")).counters("flock")
        assert counters == listed


async def test_sctp_rules_are_loaded(world: World) -> None:
    w = world
    pol = _policies(
        {
            "metadata": {"namespace": "x", "name": "sctp"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 9000, "endPort": 9100}]}]},
        }
    )
    with trio.fail_after(60):
        await _apply(w, pol)
        listing = await trio.to_thread.run_sync(lambda: w.node.node.run("nft", "list", "table", "inet", "flock").stdout)
    assert "sctp dport 9000-9100 counter" in listing
    assert listing.count("jump pi-") == 2  # both pods of x jump to the policy's ingress chain


async def test_incremental_update_keeps_established_flows(world: World) -> None:
    w = world
    with trio.fail_after(120):
        allow_c = _policies(DENY_X, ALLOW_Y_TO_A_80)
        rs1, r1 = await _apply(w, allow_c)
        assert r1.mode == "full"
        c, a = w.pods["y/c"], w.pods["x/a"]
        held = await trio.to_thread.run_sync(open_held, c.netns, a.ip6, 80)
        try:
            assert await trio.to_thread.run_sync(held_echo, held)

            # pod churn: a new peer pod in y joins the namespace set; elements only, no rule rewritten
            extra = PolicyPod("y", "d", {"app": "d"}, (ipaddress.ip_address("2001:db8:2::d"),), node="n2")
            pods = {**w.policy_pods, "y/d": extra}
            rs2 = compile_ruleset(allow_c, w.namespaces, pods.values(), w.policy_pods.values())
            assert rs2.structure() == rs1.structure()
            r2 = await w.applier.apply(rs2)
            assert r2.mode == "incremental" and r2.summary["elements_added"] == 1
            assert await trio.to_thread.run_sync(held_echo, held)

            # the allowing policy goes away: new connections are refused, the established one lives on
            r3 = await w.applier.apply(
                compile_ruleset(_policies(DENY_X), w.namespaces, pods.values(), w.policy_pods.values())
            )
            assert r3.mode == "incremental"
            assert not await trio.to_thread.run_sync(probe, c.netns, a.ip6, 80, "tcp")
            assert await trio.to_thread.run_sync(held_echo, held)
        finally:
            stop(held)


async def test_restart_replaces_atomically_and_leaves_other_tables(world: World) -> None:
    w = world
    run = w.node.node.run
    with trio.fail_after(60):
        await trio.to_thread.run_sync(lambda: run("nft", "add", "table", "inet", "other"))
        await trio.to_thread.run_sync(lambda: run("nft", "add", "chain", "inet", "other", "keep"))
        await _apply(w, _policies(DENY_X))
        a, b = w.pods["x/a"], w.pods["x/b"]
        assert not await trio.to_thread.run_sync(probe, b.netns, a.ip6, 80, "tcp")
        # a new agent: knows nothing applied, the old table still enforces until it replaces it
        fresh = NftApplier(w.applier.backend)
        assert not await trio.to_thread.run_sync(probe, b.netns, a.ip6, 80, "tcp")
        rs = compile_ruleset(_policies(ALLOW_Y_TO_A_80), w.namespaces, w.policy_pods.values(), w.policy_pods.values())
        result = await fresh.apply(rs)
        assert result.mode == "full"
        listing = await trio.to_thread.run_sync(lambda: run("nft", "list", "ruleset").stdout)
        assert "table inet other" in listing and "chain keep" in listing
        assert listing.count("table inet flock") == 1

        # a transaction nft refuses changes nothing: the applied state stays, the error propagates
        broken = attrs.evolve(
            rs, chains={**rs.chains, "pe-x": attrs.evolve(next(iter(rs.chains.values())), name="pe-x")}
        )
        broken = attrs.evolve(broken, ingress_map={**rs.ingress_map, w.pods["x/b"].veth: "pe-missing"})
        with pytest.raises(NftError):
            await fresh.apply(broken)
        assert fresh.applied is None
        after = await trio.to_thread.run_sync(lambda: run("nft", "list", "table", "inet", "flock").stdout)
        assert "pe-x" not in after and "jump pi-" in after


async def test_service_gate_returns_with_the_pods_rules_in_the_kernel(world: World) -> None:
    """The policy service over the real kernel: ensure() returns when the new pod is enforced."""
    w = world
    inputs, local = PolicyInputs(), MemoryLocalPods()
    policies = _policies(DENY_X, ALLOW_Y_TO_A_80)
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in w.namespaces})
    inputs.replace(Kind.CLUSTER_POLICY, {})
    inputs.replace(Kind.POD, {k: attrs.evolve(p, host_veth=None) for k, p in w.policy_pods.items()})
    veths = {f"cid-{k}": w.pods[k].veth for k in w.pods}
    svc = PolicyService(inputs, local, w.applier, "n1", veths.__getitem__)

    def allocation(key: str) -> Allocation:
        pod = w.pods[key]
        ns, name = key.split("/")
        return Allocation(
            f"cid-{key}",
            ns,
            name,
            "uid",
            "eth0",
            pod.netns.path,
            ipaddress.IPv6Address(pod.ip6),
            ipaddress.IPv4Address(pod.ip4),
        )

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(allocation("y/c"))
            await svc.ensure(allocation("y/c"))
            c, a = w.pods["y/c"], w.pods["x/a"]
            assert await trio.to_thread.run_sync(probe, c.netns, a.ip6, 81, "tcp"), "x/a not attached yet: open"
            local.put(allocation("x/a"))
            await svc.ensure(allocation("x/a"))
            # no waiting, no polling: the moment ensure() returns, x/a is isolated as its policies say
            assert not await trio.to_thread.run_sync(probe, c.netns, a.ip6, 81, "tcp")
            assert await trio.to_thread.run_sync(probe, c.netns, a.ip4, 80, "tcp")
            nursery.cancel_scope.cancel()


async def test_nothing_isolated_means_no_table(world: World) -> None:
    w = world

    def listing() -> str:
        return w.node.node.run("nft", "list", "tables").stdout

    with trio.fail_after(60):
        nothing = compile_ruleset([], w.namespaces, w.policy_pods.values(), w.policy_pods.values())
        assert (await w.applier.apply(nothing)).mode == "removed"
        assert "flock" not in await trio.to_thread.run_sync(listing)
        assert (await w.applier.apply(nothing)).mode == "unchanged"
        assert await w.applier.counters() == {}
        _, result = await _apply(w, _policies(DENY_X))
        assert result.mode == "full" and "inet flock" in await trio.to_thread.run_sync(listing)
        # a new agent whose policies were all deleted meanwhile: the old table goes, in one transaction
        fresh = NftApplier(w.applier.backend)
        assert (await fresh.apply(nothing)).mode == "removed"
        assert "flock" not in await trio.to_thread.run_sync(listing)
