"""The policy service on a virtual clock: when it applies, the ADD gate, retries, readiness, metrics."""

from __future__ import annotations

import ipaddress

import attrs
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from flock.faults import PolicyNotEnforceable
from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.policy import (
    POLICY_GATE,
    ClusterNetworkPolicy,
    Kind,
    Namespace,
    NetworkPolicy,
    NftError,
    PolicyInputs,
    PolicyMetrics,
    PolicyPod,
    PolicyService,
    Ruleset,
    RulesetChange,
    compile_ruleset,
)
from flock.policy._service import WAITING_FOR_WATCHERS
from flock.testing.policy import GateRecorder, MemoryApplier, MemoryLocalPods, MemoryWatermark


@attrs.define(eq=False)
class ScriptedApplier:
    """Applies nothing; refuses the first *refuse* calls as nft would, records the rest (with the virtual time).

    What it records is each change's structure: what the service calls ``applied``."""

    refuse: int = 0
    applied: list[tuple[float, Ruleset]] = attrs.field(factory=list)
    calls: int = 0

    async def apply_change(self, change: RulesetChange) -> object:
        self.calls += 1
        await trio.sleep(0.001)  # a transaction takes a moment
        if self.calls <= self.refuse:
            raise NftError(1, "Error: Could not process rule: No such file or directory\nmore")
        self.applied.append((trio.current_time(), change.structure))
        return None

    async def counters(self) -> dict[str, tuple[int, int]]:
        return {}


def veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


def alloc(cid: str, key: str, ip6: str) -> Allocation:
    ns, name = key.split("/")
    return Allocation(cid, ns, name, "uid", "eth0", "/run/netns/x", ipaddress.IPv6Address(ip6), None)


WEB = PolicyPod("x", "web", {"app": "web"}, (ipaddress.ip_address("2001:db8:9::1"),), node="n1")  # API's view
DENY = NetworkPolicy.from_object({"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}})


def complete(inputs: PolicyInputs, policies=(), pods=()) -> None:
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    inputs.replace(Kind.NAMESPACE, {"x": Namespace("x")})
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    inputs.replace(Kind.CLUSTER_POLICY, {})


def service(inputs, local, applier, **kw) -> PolicyService:
    return PolicyService(inputs, local, applier, "n1", veth, rand=lambda: 0.0, **kw)


async def test_nothing_applied_before_every_kind_is_listed(autojump_clock: trio.abc.Clock) -> None:
    inputs, local, applier, gates = PolicyInputs(), MemoryLocalPods(), ScriptedApplier(), GateRecorder()
    svc = service(inputs, local, applier, readiness=gates)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            inputs.replace(Kind.NETWORK_POLICY, {DENY.key: DENY})
            inputs.replace(Kind.NAMESPACE, {})
            inputs.replace(Kind.CLUSTER_POLICY, {})
            await trio.sleep(5)
            assert applier.applied == [] and gates.gates[POLICY_GATE] == WAITING_FOR_WATCHERS
            inputs.replace(Kind.POD, {})
            await trio.sleep(1)
            assert len(applier.applied) == 1 and gates.gates[POLICY_GATE] is None
            nursery.cancel_scope.cancel()


async def test_nothing_applied_before_start_up_rebuilt_the_nodes_attachments(autojump_clock: trio.abc.Clock) -> None:
    # After a restart the allocation view is empty until the store is read: a table compiled from it
    # would drop every running pod's chains, so the previous agent's table stays until then.
    inputs, applier = PolicyInputs(), ScriptedApplier()
    local = MemoryLocalPods(loaded=False)
    svc = service(inputs, local, applier)
    complete(inputs, [DENY], [WEB])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await trio.sleep(5)
            assert applier.applied == []
            local.load([alloc("c1", "x/web", "2001:db8:1::1")])
            await trio.sleep(1)
            assert [rs.ingress_map for _, rs in applier.applied] == [{veth("c1"): f"in-{veth('c1')}"}]
            nursery.cancel_scope.cancel()


async def test_add_waits_for_its_chain_and_the_pods_labels(autojump_clock: trio.abc.Clock) -> None:
    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    svc = service(inputs, local, applier)
    complete(inputs, [DENY])
    a = alloc("c1", "x/web", "2001:db8:1::1")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await trio.sleep(1)
            local.put(a)  # the handler stored the pending allocation; the watchers do not know the pod yet
            with trio.move_on_after(3) as waited:
                await svc.ensure(a)
            assert waited.cancelled_caught, "ensure returned before the pod's labels were known"
            inputs.set_pod(WEB)
            began = trio.current_time()
            await svc.ensure(a)
            assert trio.current_time() - began < 0.01
            rs = applier.applied[-1][1]
            assert rs.ingress_map == {veth("c1"): f"in-{veth('c1')}"}
            # the allocation's address, not the API's (podIPs is not set until ADD returns)
            assert svc.applied is rs
            # DEL: the chain goes with the allocation
            local.drop("c1")
            await trio.sleep(1)
            assert applier.applied[-1][1].ingress_map == {}
            nursery.cancel_scope.cancel()


async def test_local_pods_follow_label_and_address_changes(autojump_clock: trio.abc.Clock) -> None:
    # The local PolicyPods are reused while neither the allocation nor the watchers' pod changed:
    # a change of either must still reach the ruleset and what ensure() checks.
    web_only = NetworkPolicy.from_object(
        {"metadata": {"namespace": "x", "name": "web"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}}}
    )
    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    svc = service(inputs, local, applier)
    other = attrs.evolve(WEB, labels={"app": "other"})
    complete(inputs, [web_only], [other])
    first = alloc("c1", "x/web", "2001:db8:1::1")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(first)
            await svc.ensure(first)
            assert applier.applied[-1][1].ingress_map == {}  # not selected: app=other
            inputs.set_pod(WEB)  # relabelled app=web
            await trio.sleep(1)
            assert applier.applied[-1][1].ingress_map == {veth("c1"): f"in-{veth('c1')}"}
            again = alloc("c1", "x/web", "2001:db8:1::2")  # the same container with another address
            local.put(again)
            await svc.ensure(again)
            assert svc.applied is applier.applied[-1][1]
            inputs.set_pod(other)
            await trio.sleep(1)
            assert applier.applied[-1][1].ingress_map == {}
            nursery.cancel_scope.cancel()


async def test_add_of_a_container_without_a_pod_does_not_wait(autojump_clock: trio.abc.Clock) -> None:
    # podman/nerdctl attachments have no Pod object: no policy selects them, no label will ever come.
    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    svc = service(inputs, local, applier)
    complete(inputs, [DENY])
    podless = Allocation(
        "c2", "", "web-container", "", "eth0", "/run/netns/y", ipaddress.IPv6Address("2001:db8:1::2"), None
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(podless)
            began = trio.current_time()
            await svc.ensure(podless)
            assert trio.current_time() == began
            nursery.cancel_scope.cancel()


async def test_refused_transactions_retry_with_backoff_and_close_readiness(autojump_clock: trio.abc.Clock) -> None:
    inputs, local, gates = PolicyInputs(), MemoryLocalPods(), GateRecorder()
    applier = ScriptedApplier(refuse=3)
    metrics = PolicyMetrics(CollectorRegistry())
    svc = service(inputs, local, applier, readiness=gates, metrics=metrics)
    complete(inputs, [DENY], [WEB])
    local.put(alloc("c1", "x/web", "2001:db8:1::1"))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await trio.sleep(0.1)
            assert (
                gates.gates[POLICY_GATE]
                == "nftables refused the ruleset: Error: Could not process rule: No such file or directory"
            )
            assert svc.last_error is not None and svc.applied is None
            await trio.sleep(5)
            # rand() = 0 draws the low edge of the ±20 % band: delays 0.16, 0.32, 0.64 s (0.2 s doubling),
            # so attempts at 0, 0.161, 0.482, 1.123, each taking 1 ms
            assert [round(t, 3) for t, _ in applier.applied] == [1.124]
            assert gates.gates[POLICY_GATE] is None and svc.last_error is None
            assert metrics.registry.get_sample_value("flock_policy_apply_failures_total") == 3
            assert metrics.registry.get_sample_value("flock_policy_rules") == 1  # the pod chain's drop
            nursery.cancel_scope.cancel()


async def test_add_answers_retry_at_once_while_nft_refuses(autojump_clock: trio.abc.Clock) -> None:
    # Fail closed and fast: not 25 s per ADD (and a pending row each) while the ruleset is refused.
    inputs, local = PolicyInputs(), MemoryLocalPods()
    applier = ScriptedApplier(refuse=3)
    svc = service(inputs, local, applier)
    complete(inputs, [DENY], [WEB])
    a = alloc("c1", "x/web", "2001:db8:1::1")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(a)
            began = trio.current_time()
            with pytest.raises(PolicyNotEnforceable, match="cannot be enforced"):
                await svc.ensure(a)
            assert trio.current_time() - began < 0.01
            await trio.sleep(5)  # the service's retries succeed: the next ADD is served
            await svc.ensure(a)
            nursery.cancel_scope.cancel()


async def test_applied_resource_version_follows_bookmarks_only_when_current(autojump_clock: trio.abc.Clock) -> None:
    inputs, local, applier, mark = PolicyInputs(), MemoryLocalPods(), ScriptedApplier(), MemoryWatermark()
    metrics = PolicyMetrics(CollectorRegistry())
    svc = service(inputs, local, applier, watermark=mark, metrics=metrics)
    mark.move(10)
    complete(inputs)

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("flock_policy_applied_resource_version")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await trio.sleep(1)
            assert gauge() == 10
            mark.move(12)  # a bookmark: nothing changed, the kernel still reflects everything
            await trio.testing.wait_all_tasks_blocked()
            assert gauge() == 12
            nursery.cancel_scope.cancel()
    # a change the service has not applied yet holds the gauge back
    inputs2, applier2, mark2 = PolicyInputs(), ScriptedApplier(refuse=1000), MemoryWatermark()
    svc2 = service(inputs2, MemoryLocalPods(), applier2, watermark=mark2, metrics=PolicyMetrics(CollectorRegistry()))
    complete(inputs2)
    mark2.move(20)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc2.run)
            await trio.sleep(1)
            mark2.move(25)
            await trio.sleep(1)
            assert svc2.applied_resource_version == 0
            nursery.cancel_scope.cancel()


async def test_bookmarks_during_an_apply_are_published_once_it_is_in(autojump_clock: trio.abc.Clock) -> None:
    # Found by the lab's policy wait: the watermark moved while nft ran, and nothing moved it again.
    inputs, mark = PolicyInputs(), MemoryWatermark()

    @attrs.define(eq=False)
    class BookmarkedApplier(ScriptedApplier):
        async def apply_change(self, change: RulesetChange) -> object:
            mark.move(mark.watermark + 5)  # the other kinds' bookmarks catch up meanwhile
            return await super().apply_change(change)

    metrics = PolicyMetrics(CollectorRegistry())
    svc = service(inputs, MemoryLocalPods(), BookmarkedApplier(), watermark=mark, metrics=metrics)
    mark.move(10)
    complete(inputs)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await trio.sleep(1)
            assert svc.applied_resource_version == 15
            inputs.set_policy(DENY)  # a change: applied with the watermark of its snapshot, then the moved one
            await trio.sleep(1)
            assert svc.applied_resource_version == 20
            assert metrics.registry.get_sample_value("flock_policy_applied_resource_version") == 20
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("burst", [1, 20])
async def test_a_burst_of_changes_is_one_apply_after_the_current(autojump_clock: trio.abc.Clock, burst: int) -> None:
    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    svc = service(inputs, local, applier)
    complete(inputs, [], [WEB])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            await trio.sleep(1)
            for i in range(burst):
                inputs.set_pod(attrs.evolve(WEB, name=f"p{i}"))
            await trio.sleep(1)
            assert len(applier.applied) == 2
            nursery.cancel_scope.cancel()


async def test_remote_churn_reaches_the_table_as_element_changes(autojump_clock: trio.abc.Clock) -> None:
    # The strict in-memory table: every change must fit what it holds; a refused one is followed
    # by the whole table, and the service's view, the table and a fresh compile agree throughout.
    allow = NetworkPolicy.from_object(
        {
            "metadata": {"namespace": "x", "name": "from-y"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"t": "y"}}}]}]},
        }
    )
    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), MemoryApplier()
    svc = service(inputs, local, applier)
    peers = [PolicyPod("y", f"p{i}", {"app": "a"}, (ipaddress.ip_address(f"2001:db8:2::{i + 1:x}"),)) for i in range(5)]
    complete(inputs, [allow], [WEB, *peers])
    inputs.set_namespace(Namespace("y", {"t": "y"}))
    a = alloc("c1", "x/web", "2001:db8:1::1")

    def agreed() -> None:
        ours = attrs.evolve(WEB, addresses=(ipaddress.ip_address("2001:db8:1::1"),), host_veth=veth("c1"))
        want = compile_ruleset([allow], inputs.namespaces.values(), inputs.pods.values(), [ours])
        assert svc.ruleset() == applier.applied == want

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(a)
            await svc.ensure(a)
            agreed()
            transactions = applier.transactions
            inputs.set_pod(attrs.evolve(peers[0], addresses=(ipaddress.ip_address("2001:db8:2::ff"),)))
            inputs.delete(Kind.POD, peers[1].key)
            await svc.wait_applied(inputs.generation)
            assert applier.transactions == transactions + 1  # one incremental transaction for both
            agreed()
            applier.refuse = 1
            inputs.set_namespace(Namespace("y"))  # y's pods leave the set; the transaction is refused
            await svc.wait_applied(inputs.generation)  # the retry (after backoff): the whole table
            agreed()
            assert not any(applier.applied.address_sets[n].elements for n in applier.applied.address_sets)
            nursery.cancel_scope.cancel()


def _cnp(name: str, tier: str, priority: int, **rules: list) -> ClusterNetworkPolicy:
    spec = {"tier": tier, "priority": priority, "subject": {"namespaces": {}}, **rules}
    return ClusterNetworkPolicy.from_object({"metadata": {"name": name}, "spec": spec})


FROM_ALL = [{"namespaces": {}}]


async def test_cluster_policies_alone_isolate_and_report_ties_and_rules_failing_closed(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """No NetworkPolicy at all: an Admin tier policy alone gives the pod its chains (ADD waits for them);
    two policies sharing tier and priority, and a rule flock cannot read, are logged once and counted."""
    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    metrics = PolicyMetrics(CollectorRegistry())
    svc = service(inputs, local, applier, metrics=metrics)
    complete(inputs, [], [WEB])
    deny = _cnp("a-deny", "Admin", 5, ingress=[{"action": "Deny", "from": FROM_ALL}])
    twin = _cnp("b-twin", "Admin", 5, egress=[{"action": "Pass", "to": [{"domainNames": ["example.org"]}]}])
    base = _cnp("base", "Baseline", 5, ingress=[{"name": "open", "action": "Accept", "from": FROM_ALL}])
    a = alloc("c1", "x/web", "2001:db8:1::1")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(a)
            await svc.ensure(a)
            assert applier.applied[-1][1].ingress_map == {}  # nothing selects the pod yet
            for cnp in (deny, twin, base):
                inputs.set_cluster_policy(cnp)
            await trio.sleep(1)
            rs = applier.applied[-1][1]
            v = veth("c1")
            assert set(rs.ingress_map) == set(rs.egress_map) == set(rs.node_map) == {v}
            ingress = [r.verdict for r in rs.chains[rs.ingress_map[v]].rules]
            assert [t[:5] for t in ingress] == ["jump "] * 2 and [t[5:10] for t in ingress] == ["ta-i-", "tb-i-"]
            egress = [r.verdict for r in rs.chains[rs.egress_map[v]].rules]
            assert egress == [f"jump {rs.node_map[v]}"] and rs.node_map[v].startswith("ta-e-")  # no drop: no NP
            assert set(rs.tier_rules) == {rs.node_map[v], *(t[5:] for t in ingress)}
            registry = metrics.registry
            assert registry.get_sample_value("flock_policy_cluster_policies", {"tier": "Admin"}) == 2
            assert registry.get_sample_value("flock_policy_cluster_policies", {"tier": "Baseline"}) == 1
            assert registry.get_sample_value("flock_policy_cluster_priority_ties") == 2
            assert registry.get_sample_value("flock_policy_cluster_rules_failing_closed") == 1
            warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert sum("share tier Admin and priority 5" in w for w in warnings) == 1
            assert sum("b-twin: 1 rule(s) fail closed" in w for w in warnings) == 1
            inputs.set_pod(attrs.evolve(WEB, labels={"app": "web", "v": "2"}))  # another change: no new lines
            await trio.sleep(1)
            assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == warnings
            nursery.cancel_scope.cancel()


def test_per_rule_counters_are_summed_by_policy_and_rule_over_the_chains_that_inline_them() -> None:
    metrics = PolicyMetrics(CollectorRegistry())
    owners = (("deny", "no-81"), ("deny", "no-81"), ("deny", "ingress[1]"))
    rs = Ruleset(tier_rules={"ta-i-0001": owners, "ta-i-0002": owners[:1], "tb-e-0003": (("base", "open"),)})
    per_chain = {"ta-i-0001#0": (3, 300), "ta-i-0001#1": (1, 100), "ta-i-0001#2": (7, 0), "ta-i-0002#0": (2, 20)}
    metrics.counters(rs, {**per_chain, "tb-e-0003#0": (5, 50)}, {})
    get = metrics.registry.get_sample_value
    labels = {"policy": "deny", "rule": "no-81", "tier": "Admin", "direction": "Ingress"}
    assert get("flock_policy_cluster_rule_packets_total", labels) == 6
    assert get("flock_policy_cluster_rule_bytes_total", labels) == 420
    assert get("flock_policy_cluster_rule_packets_total", {**labels, "rule": "ingress[1]"}) == 7
    base = {"policy": "base", "rule": "open", "tier": "Baseline", "direction": "Egress"}
    assert get("flock_policy_cluster_rule_packets_total", base) == 5


async def test_host_ports_are_in_the_table_before_add_returns_and_churn_keeps_the_structure(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A pod's hostPorts (and a podman container's, which has no Pod to wait for) are in the applied
    ruleset when ensure() returns; remote pod churn leaves the structure object alone (a set-element
    update); the pod's removal takes its DNAT with it."""
    from flock.model import PortMapping
    from flock.policy._ruleset import HostPort
    from flock.policy._service import hostports_of

    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    svc = service(inputs, local, applier)
    peers = [PolicyPod("x", f"p{i}", {"app": "a"}, (ipaddress.ip_address(f"2001:db8:2::{i + 1:x}"),)) for i in range(3)]
    complete(inputs, [DENY], [WEB, *peers])
    web = attrs.evolve(alloc("c1", "x/web", "2001:db8:1::1"), port_mappings=(PortMapping(8080, 80),))
    podless = Allocation(
        "c2", "", "ctr", "", "eth0", "/run/netns/y", ipaddress.IPv6Address("2001:db8:1::2"), ipaddress.IPv4Address("192.0.2.2"),
        port_mappings=(PortMapping(53, 53, "udp"),),
    )  # fmt: skip
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(web)
            await svc.ensure(web)
            assert svc.applied is not None and svc.applied.hostports == hostports_of(web)
            local.put(podless)
            began = trio.current_time()
            await svc.ensure(podless)  # waits for its DNAT (not for labels: it has no Pod)
            assert trio.current_time() > began
            both = tuple(sorted((*hostports_of(web), *hostports_of(podless)), key=HostPort.sort_key))
            assert svc.applied.hostports == both and len(both) == 3
            structure = svc.applied
            inputs.set_pod(attrs.evolve(peers[0], labels={"app": "b"}))
            await svc.wait_applied(inputs.generation)
            assert svc.applied is structure  # remote churn: elements only
            local.drop(web.container_id)
            while svc.applied.hostports != tuple(sorted(hostports_of(podless), key=HostPort.sort_key)):  # noqa: ASYNC110
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


async def test_new_udp_and_sctp_host_ports_clear_their_flows_once_they_are_in(autojump_clock: trio.abc.Clock) -> None:
    """After the apply that mapped them, and a moment later (off ADD's window; pods starting together share one walk)."""
    from flock.model import PortMapping

    inputs, local, applier = PolicyInputs(), MemoryLocalPods(), ScriptedApplier()
    forgotten: list[tuple[float, tuple[tuple[str, int], ...], int]] = []

    async def forget(ports: tuple[tuple[str, int], ...]) -> int:
        forgotten.append((trio.current_time(), ports, len(applier.applied)))  # after the apply that mapped them
        return 1

    svc = service(inputs, local, applier, forget_flows=forget)
    complete(inputs, [], [WEB])
    web = attrs.evolve(
        alloc("c1", "x/web", "2001:db8:1::1"),
        port_mappings=(PortMapping(53, 53, "udp"), PortMapping(80, 80), PortMapping(9, 9, "sctp")),
    )
    dns = attrs.evolve(alloc("c2", "x/web", "2001:db8:1::2"), port_mappings=(PortMapping(5353, 53, "udp"),))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            local.put(web)
            await svc.ensure(web)
            began = trio.current_time()
            local.put(dns)
            await svc.ensure(dns)
            await trio.sleep(1)
            (when, ports, applies), *more = forgotten
            assert not more and ports == (("sctp", 9), ("udp", 53), ("udp", 5353))  # one walk; not TCP's 80
            assert applies >= 2 and when - began == pytest.approx(svc.forget_after, abs=0.01)
            local.put(attrs.evolve(web, pod_uid="other"))  # a change that keeps the mappings: nothing again
            await trio.sleep(1)
            assert len(forgotten) == 1
            nursery.cancel_scope.cancel()
