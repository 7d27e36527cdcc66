"""The policy service's metrics, in a prometheus-client registry the composition root passes in."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ._model import Direction
from ._ruleset import Ruleset


@attrs.define(eq=False)
class _KernelCounters(Collector):
    """Per-policy and per-pod packet/byte counters as last read from the kernel (by the service)."""

    # (namespace, policy, direction) → (packets, bytes); (namespace, pod, direction) → dropped (packets, bytes)
    policies: dict[tuple[str, str, str], tuple[int, int]] = attrs.field(factory=dict)
    drops: dict[tuple[str, str, str], tuple[int, int]] = attrs.field(factory=dict)
    # (ClusterNetworkPolicy, rule, tier, direction) → (packets, bytes) its rule matched (whatever its action)
    cluster_rules: dict[tuple[str, str, str, str], tuple[int, int]] = attrs.field(factory=dict)

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "policy", "direction"]
        packets = CounterMetricFamily(
            "flock_policy_accepted_packets",
            "New connections' packets a NetworkPolicy accepted on this node.",
            labels=labels,
        )
        octets = CounterMetricFamily("flock_policy_accepted_bytes", "Bytes of those packets.", labels=labels)
        for (ns, name, direction), (p, b) in sorted(self.policies.items()):
            packets.add_metric([ns, name, direction], p)
            octets.add_metric([ns, name, direction], b)
        dropped = CounterMetricFamily(
            "flock_policy_dropped_packets",
            "Packets of new connections dropped because no policy allowed them, by local pod.",
            labels=["namespace", "pod", "direction"],
        )
        for (ns, pod, direction), (p, _) in sorted(self.drops.items()):
            dropped.add_metric([ns, pod, direction], p)
        tier_labels = ["policy", "rule", "tier", "direction"]
        rule_packets = CounterMetricFamily(
            "flock_policy_cluster_rule_packets",
            "Packets of new connections a ClusterNetworkPolicy rule matched on this node (and acted on).",
            labels=tier_labels,
        )
        rule_bytes = CounterMetricFamily(
            "flock_policy_cluster_rule_bytes", "Bytes of those packets.", labels=tier_labels
        )
        for key, (p, b) in sorted(self.cluster_rules.items()):
            rule_packets.add_metric(list(key), p)
            rule_bytes.add_metric(list(key), b)
        yield packets
        yield octets
        yield dropped
        yield rule_packets
        yield rule_bytes


# (namespace of the local pod, tier, policy, rule, direction): the labels of a denied-packets series
DeniedKey = tuple[str, str, str, str, str]


@attrs.define(eq=False)
class DeniedCounters(Collector):
    """What the denied-traffic log read (flock.policy._denylog): packets by who denied them, and records lost.

    Cardinality: a series per (local pod's namespace, denying rule) that logged a packet, where a denying
    rule is a logged drop of this node's ruleset (a Deny rule of a ClusterNetworkPolicy, or "isolated by
    these NetworkPolicies"): never a pod, an address or a port.  Series of drops gone from the ruleset are
    dropped with them (:meth:`keep`).
    """

    packets: dict[DeniedKey, int] = attrs.field(factory=dict)
    overruns: int = 0  # the kernel found the agent's socket full: records lost (how many, it does not say)
    unmatched: int = 0  # records naming no drop of the rulesets the agent knows

    def count(self, key: DeniedKey) -> None:
        self.packets[key] = self.packets.get(key, 0) + 1

    def keep(self, alive: Callable[[DeniedKey], bool]) -> None:
        """Forget the series *alive* says are gone."""
        for key in [k for k in self.packets if not alive(k)]:
            del self.packets[key]

    def collect(self) -> Iterator[Metric]:
        denied = CounterMetricFamily(
            "flock_policy_denied_packets",
            "Packets policy dropped and logged (namespaces with the log-denied annotation; at most "
            "10 a second per pod and direction are logged), by the local pod's namespace and who denied them.",
            labels=["namespace", "tier", "policy", "rule", "direction"],
        )
        for key, n in sorted(self.packets.items()):
            denied.add_metric(list(key), n)
        yield denied
        yield CounterMetricFamily(
            "flock_policy_denied_log_overruns",
            "Times the kernel had denied-traffic log records for the agent and no room in its socket (records lost).",
            value=self.overruns,
        )
        yield CounterMetricFamily(
            "flock_policy_denied_log_unmatched",
            "Denied-traffic log records naming no drop of the rulesets the agent knows (or unreadable).",
            value=self.unmatched,
        )


@attrs.define(eq=False)
class PolicyMetrics:
    registry: CollectorRegistry
    rules: Gauge = attrs.field(init=False)
    sets: Gauge = attrs.field(init=False)
    chains: Gauge = attrs.field(init=False)
    isolated: Gauge = attrs.field(init=False)
    apply_seconds: Gauge = attrs.field(init=False)
    applies: Counter = attrs.field(init=False)
    failures: Counter = attrs.field(init=False)
    applied_resource_version: Gauge = attrs.field(init=False)
    cluster_policies: Gauge = attrs.field(init=False)
    failing_closed: Gauge = attrs.field(init=False)
    priority_ties: Gauge = attrs.field(init=False)
    kernel: _KernelCounters = attrs.field(init=False, factory=_KernelCounters)
    denied: DeniedCounters = attrs.field(init=False, factory=DeniedCounters)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.rules = Gauge("flock_policy_rules", "Rules in table inet flock.", registry=r)
        self.sets = Gauge("flock_policy_sets", "Named sets and maps in table inet flock.", registry=r)
        self.chains = Gauge(
            "flock_policy_chains", "Chains in table inet flock (besides the two base chains).", registry=r
        )
        self.isolated = Gauge(
            "flock_policy_isolated_pods", "Local pods isolated by some policy, by direction.", ["direction"], registry=r
        )
        self.apply_seconds = Gauge(
            "flock_policy_last_apply_seconds", "How long the last applied change took (compile + nft).", registry=r
        )
        self.applies = Counter(
            "flock_policy_applies", "Rulesets applied, by mode (full, incremental).", ["mode"], registry=r
        )
        self.failures = Counter("flock_policy_apply_failures", "Transactions nftables refused.", registry=r)
        self.applied_resource_version = Gauge(
            "flock_policy_applied_resource_version",
            "The API resourceVersion through which every NetworkPolicy, Namespace and Pod is in this node's kernel.",
            registry=r,
        )
        self.cluster_policies = Gauge(
            "flock_policy_cluster_policies",
            "ClusterNetworkPolicies the agent compiles with, by tier (refused ones are the watchers' count).",
            ["tier"],
            registry=r,
        )
        self.failing_closed = Gauge(
            "flock_policy_cluster_rules_failing_closed",
            "ClusterNetworkPolicy rules flock cannot read: Accept ones match nothing, Deny and Pass ones deny all.",
            registry=r,
        )
        self.priority_ties = Gauge(
            "flock_policy_cluster_priority_ties",
            "ClusterNetworkPolicies sharing their tier and priority with another (ordered by name).",
            registry=r,
        )
        r.register(self.kernel)
        r.register(self.denied)

    def applied(self, ruleset: Ruleset, mode: str, seconds: float) -> None:
        self.rules.set(ruleset.rule_count)
        self.sets.set(ruleset.set_count)
        self.chains.set(len(ruleset.chains))
        self.isolated.labels(direction="Ingress").set(len(ruleset.ingress_map))
        self.isolated.labels(direction="Egress").set(len(ruleset.egress_map))
        self.apply_seconds.set(seconds)
        if mode != "unchanged":
            self.applies.labels(mode=mode).inc()

    def counters(
        self, ruleset: Ruleset, per_chain: Mapping[str, tuple[int, int]], pods_by_veth: Mapping[str, tuple[str, str]]
    ) -> None:
        """Turn the kernel's per-chain counters into per-policy and per-pod figures."""
        policies: dict[tuple[str, str, str], tuple[int, int]] = {}
        for chain, key in ruleset.policy_chains.items():
            ns, _, name = key.partition("/")
            direction = Direction.INGRESS.value if chain.startswith("pi-") else Direction.EGRESS.value
            policies[(ns, name, direction)] = per_chain.get(chain, (0, 0))
        drops: dict[tuple[str, str, str], tuple[int, int]] = {}
        for direction, vmap in (
            (Direction.INGRESS.value, ruleset.ingress_map),
            (Direction.EGRESS.value, ruleset.egress_map),
        ):
            for veth, chain in vmap.items():
                ns, name = pods_by_veth.get(veth, ("", veth))
                drops[(ns, name, direction)] = per_chain.get(chain, (0, 0))
        cluster: dict[tuple[str, str, str, str], tuple[int, int]] = {}
        for chain, owners in ruleset.tier_rules.items():
            tier = "Admin" if chain.startswith("ta-") else "Baseline"
            direction = Direction.INGRESS.value if chain[3:5] == "i-" else Direction.EGRESS.value
            for i, (owner, rule) in enumerate(owners):
                p, b = per_chain.get(f"{chain}#{i}", (0, 0))
                p0, b0 = cluster.get((owner, rule, tier, direction), (0, 0))
                cluster[(owner, rule, tier, direction)] = (p0 + p, b0 + b)
        self.kernel.policies = policies
        self.kernel.drops = drops
        self.kernel.cluster_rules = cluster
