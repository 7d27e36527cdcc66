"""ClusterNetworkPolicy apply → enforced: 100 CNPs + 1,000 NetworkPolicies × 250 pods, one change at a time.

The policy service runs as in the agent (PolicyEngine following the inputs'
journal, libnftables in-process) against the real kernel in a fresh network
namespace.  250 pods across 10 namespaces, all attached on this node (the
worst case for one node: every pod has chains), 1,000 NetworkPolicies
(bench/policy_apply.py's mix), --cluster-policies CNPs (about 2/3 Admin, 1/3
Baseline; subjects by namespace label or by pods; Deny/Accept/Pass rules with
namespaces, pods, networks and nodes peers, port numbers, ranges and named
ports) and 50 Nodes.  Per round, timed from the input change until
``PolicyService.wait_applied`` says the kernel holds it:

  (a) a new Admin CNP (Deny from one namespace to another) created,
  (b) its priority changed, (c) its tier changed to Baseline, (d) it deleted,
  (e) a namespace relabelled (team label: CNP subjects and peers move), and back,
  (f) a node relabelled under a ``nodes`` peer (its addresses move sets), and back.

CPU time is this process's (the nft thread included: libnftables runs in-process).

    .venv/bin/python bench/cluster_policy_apply.py --rounds 30     # prints figures, then one JSON line
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import random
import resource
import time

import attrs
import trio
from policy_apply import cluster as np_cluster
from prometheus_client import CollectorRegistry
from stats import summary

from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.policy import (
    ClusterNetworkPolicy,
    Kind,
    LibNftables,
    Namespace,
    NftApplier,
    PolicyInputs,
    PolicyMetrics,
    PolicyNode,
    PolicyService,
    RulesetChange,
)
from flock.testing.netns import netns_pool
from flock.testing.policy import MemoryLocalPods

ZONES = 5


def veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


def policy_nodes(n: int = 50) -> list[PolicyNode]:
    """*n* Nodes labelled zone=zK (and role=infra for a few), addresses from the documentation ranges."""
    return [
        PolicyNode.from_object(
            {
                "metadata": {
                    "name": f"node{i}",
                    "labels": {"zone": f"z{i % ZONES}", **({"role": "infra"} if i % 10 == 3 else {})},
                },
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": f"2001:db8:ffff::{i + 1:x}"},
                        {"type": "InternalIP", "address": f"198.51.100.{i + 1}"},
                        {"type": "Hostname", "address": f"node{i}"},
                    ]
                },
            }
        )
        for i in range(n)
    ]


def cluster_policies(n: int, *, teams: int, apps: int, seed: int = 11) -> list[ClusterNetworkPolicy]:
    """*n* realistic administrator policies: 2/3 Admin, 1/3 Baseline, priorities 0-1000 with a few ties."""
    rnd = random.Random(seed)

    def team() -> dict:
        return {"matchLabels": {"team": f"t{rnd.randrange(teams)}"}}

    def app() -> dict:
        return {"matchLabels": {"app": f"app{rnd.randrange(apps)}"}}

    def peer(direction: str) -> dict:
        kinds = ["namespaces", "pods"] + (["networks", "networks", "nodes"] if direction == "egress" else [])
        kind = rnd.choice(kinds)
        if kind == "namespaces":
            return {"namespaces": rnd.choice([team(), team(), {}])}
        if kind == "pods":
            return {"pods": {"namespaceSelector": rnd.choice([team(), {}]), "podSelector": app()}}
        if kind == "nodes":
            return {
                "nodes": rnd.choice(
                    [{"matchLabels": {"zone": f"z{rnd.randrange(ZONES)}"}}, {"matchLabels": {"role": "infra"}}]
                )
            }
        nets = []
        for _ in range(rnd.randint(1, 3)):
            if rnd.random() < 0.5:
                nets.append(
                    f"2001:db8:{rnd.randrange(0x100):x}:{rnd.randrange(0x10000):x}::/{rnd.choice([48, 56, 64])}"
                )
            else:
                base = rnd.choice(["192.0.2", "198.51.100", "203.0.113"])
                size = rnd.choice([24, 26, 28, 32])
                nets.append(f"{base}.{rnd.randrange(256) & (0xFF << (32 - size)) & 0xFF}/{size}")
        return {"networks": nets}

    def protocols() -> list[dict]:
        out = []
        for _ in range(rnd.randint(1, 3)):
            kind = rnd.choice(["number", "number", "range", "named"])
            if kind == "named":
                out.append({"destinationNamedPort": rnd.choice(["http", "dns"])})
                continue
            proto = rnd.choice(["tcp", "tcp", "udp", "sctp"])
            if kind == "range":
                start = rnd.choice([1000, 8000, 30000])
                out.append(
                    {proto: {"destinationPort": {"range": {"start": start, "end": start + rnd.randrange(1, 1000)}}}}
                )
            else:
                out.append({proto: {"destinationPort": {"number": rnd.choice([22, 53, 80, 443, 5432, 6379, 9090])}}})
        return out

    out = []
    for i in range(n):
        tier = "Baseline" if i % 3 == 2 else "Admin"
        # a few ties: every tenth policy takes one of a handful of round priorities
        priority = rnd.choice([0, 100, 500, 1000]) if i % 10 == 0 else rnd.randrange(1001)
        if rnd.random() < 0.7:
            subject: dict = {"namespaces": team()}
        else:
            subject = {"pods": {"namespaceSelector": rnd.choice([team(), {}]), "podSelector": app()}}
        actions = ["Deny", "Accept"] if tier == "Baseline" else ["Deny", "Accept", "Pass"]
        spec: dict = {"tier": tier, "priority": priority, "subject": subject}
        directions = rnd.choice([("ingress",), ("egress",), ("ingress", "egress")])
        for direction in directions:
            rules = []
            for r in range(rnd.randint(1, 4)):
                rule: dict = {
                    "name": f"{direction}-{r}",
                    "action": rnd.choice(actions),
                    "from" if direction == "ingress" else "to": [peer(direction) for _ in range(rnd.randint(1, 2))],
                }
                if rnd.random() < 0.7:
                    rule["protocols"] = protocols()
                rules.append(rule)
            spec[direction] = rules
        out.append(ClusterNetworkPolicy.from_object({"metadata": {"name": f"cnp{i:03d}"}, "spec": spec}))
    return out


def cpu() -> float:
    """CPU seconds of this process, every thread (the libnftables one too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@attrs.define(eq=False)
class RecordingApplier:
    """The agent's NftApplier, noting each transaction's mode and counts (so no change goes by unapplied)."""

    inner: NftApplier
    results: list = attrs.field(factory=list)

    async def apply_change(self, change: RulesetChange) -> object:
        result = await self.inner.apply_change(change)
        self.results.append(result)
        return result

    async def counters(self) -> dict[str, tuple[int, int]]:
        return await self.inner.counters()


def allocation(cid: str, ns: str, name: str, ip6: ipaddress.IPv6Address) -> Allocation:
    return Allocation(cid, ns, name, "uid", "eth0", "/run/netns/x", ip6, None)


async def kernel_chains(backend: LibNftables) -> set[str]:
    """The chains of ``table inet flock`` as the kernel lists them."""
    chains, table = set(), None
    for line in (await backend.run("list chains inet")).splitlines():
        words = line.split()
        if words[:1] == ["table"]:
            table = words[2]
        elif words[:1] == ["chain"] and table == "flock":
            chains.add(words[1])
    return chains


def deny_cnp(name: str, tier: str, priority: int, src: str, dst: str) -> ClusterNetworkPolicy:
    """Nothing from namespace *src* reaches namespace *dst*: denied at the source, as egress.

    (Egress, because the NetworkPolicies isolate nearly every pod for ingress, where a Baseline
    tier is then never reached and (c)/(d) would change nothing in the kernel; some pods of
    every namespace are not isolated for egress.)"""
    meta = "kubernetes.io/metadata.name"
    spec = {
        "tier": tier,
        "priority": priority,
        "subject": {"namespaces": {"matchLabels": {meta: src}}},
        "egress": [{"name": "deny-dst", "action": "Deny", "to": [{"namespaces": {"matchLabels": {meta: dst}}}]}],
    }
    return ClusterNetworkPolicy.from_object({"metadata": {"name": name}, "spec": spec})


async def run(args: argparse.Namespace) -> dict:
    policies, namespaces, pods = np_cluster(1, args.pods, args.policies)
    pods = [attrs.evolve(p, host_veth=None) for p in pods]  # as the watchers see them; the service sets it
    teams = len({dict(n.labels)["team"] for n in namespaces})
    cnps = cluster_policies(args.cluster_policies, teams=teams, apps=25)
    nodes = policy_nodes(args.nodes)
    inputs, local = PolicyInputs(), MemoryLocalPods()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in namespaces})
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    inputs.replace(Kind.CLUSTER_POLICY, {c.key: c for c in cnps})
    inputs.replace(Kind.NODE, {n.name: n for n in nodes})
    local.load([allocation(f"c{i}", p.namespace, p.name, p.addresses[0]) for i, p in enumerate(pods)])
    names = ("create", "priority", "tier", "delete", "ns_relabel", "node_relabel")
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpus: dict[str, list[float]] = {k: [] for k in names}
    modes: dict[str, dict[str, int]] = {k: {} for k in names}
    sizes: dict[str, dict] = {}
    out: dict = {
        "bench": "cluster_policy_apply",
        "pods": args.pods,
        "local_pods": args.pods,
        "policies": args.policies,
        "cluster_policies": args.cluster_policies,
        "admin": sum(1 for c in cnps if c.tier.value == "Admin"),
        "baseline": sum(1 for c in cnps if c.tier.value == "Baseline"),
        "nodes": args.nodes,
        "rounds": args.rounds,
    }
    # the namespace relabelled in (e), and a team whose CNPs then select it instead
    moved = namespaces[1]
    old_team = dict(moved.labels)["team"]
    new_team = f"t{(int(old_team[1:]) + 1) % teams}"
    relabelled = Namespace(moved.name, {**dict(moved.labels), "team": new_team})
    # the node relabelled in (f): a zone some nodes peer selects, moved to another
    zones_used = sorted(
        {
            dict(p.nodes.match_labels).get("zone")
            for c in cnps
            for r in c.egress
            for p in r.peers
            if p.nodes is not None and dict(p.nodes.match_labels).get("zone")
        }
    )
    assert zones_used, "no CNP has a nodes peer with a zone: (f) would measure nothing"
    node = next(n for n in nodes if n.label_map["zone"] == zones_used[0])
    other_zone = next(f"z{z}" for z in range(ZONES) if f"z{z}" != zones_used[0])
    node_moved = attrs.evolve(node, labels=tuple(sorted({**node.label_map, "zone": other_zone}.items())))

    def size(label: str) -> None:
        rs = service.applied
        assert rs is not None
        sizes[label] = {
            "rules": rs.rule_count,
            "chains": len(rs.chains),
            "tier_chains": sum(1 for c in rs.chains if c.startswith(("ta-", "tb-"))),
            "sets": rs.set_count,
        }

    async def timed(key: str, change) -> None:
        before = len(applier.results)
        began, c0 = time.perf_counter(), cpu()
        change()
        await service.wait_applied(inputs.generation)
        wall[key].append(time.perf_counter() - began)
        cpus[key].append(cpu() - c0)
        for result in applier.results[before:]:
            modes[key][result.mode] = modes[key].get(result.mode, 0) + 1
        await trio.sleep(0.02)  # let the service settle (metrics, log line) outside the figure

    with netns_pool("fl-bench-cnp-") as pool:
        backend = LibNftables(pool.create("node").path)
        applier = RecordingApplier(NftApplier(backend))
        service = PolicyService(
            inputs,
            local,
            applier,
            "bench",
            veth,
            metrics=PolicyMetrics(CollectorRegistry()),
            counters_every=3600.0,  # the 15 s counter reads are not what is measured here
        )
        try:
            async with trio.open_nursery() as nursery:
                t0 = time.perf_counter()
                await nursery.start(service.run)
                await service.wait_applied(inputs.generation)
                out["first_apply_ms"] = round((time.perf_counter() - t0) * 1000, 1)
                size("initial")
                # The kernel really holds the tier chains (else every figure below would be of nothing).
                in_kernel = await kernel_chains(backend)
                assert service.applied is not None
                want = set(service.applied.chains)
                tier_chains = {c for c in want if c.startswith(("ta-", "tb-"))}
                assert tier_chains and tier_chains <= in_kernel, (len(tier_chains), len(in_kernel & tier_chains))
                assert want <= in_kernel, sorted(want - in_kernel)[:5]
                out["kernel_chains"] = len(in_kernel)
                out["kernel_tier_chains"] = sum(1 for c in in_kernel if c.startswith(("ta-", "tb-")))
                rnd = random.Random(5)
                for r in range(args.rounds):
                    src, dst = rnd.sample([n.name for n in namespaces], 2)
                    # created before most Admin CNPs, then moved after them: (b) reorders its tier chains
                    prio, later = rnd.randrange(100), rnd.randrange(900, 1001)
                    name = f"bench-deny-{r}"
                    new = deny_cnp(name, "Admin", prio, src, dst)
                    await timed("create", lambda new=new: inputs.set_cluster_policy(new))
                    if r == 0:
                        size("with_new_cnp")
                        chains = await kernel_chains(backend)
                        assert set(service.applied.chains) <= chains
                    moved_prio = deny_cnp(name, "Admin", later, src, dst)
                    await timed("priority", lambda p=moved_prio: inputs.set_cluster_policy(p))
                    baseline = deny_cnp(name, "Baseline", later, src, dst)
                    await timed("tier", lambda p=baseline: inputs.set_cluster_policy(p))
                    await timed("delete", lambda name=name: inputs.delete(Kind.CLUSTER_POLICY, name))
                    await timed("ns_relabel", lambda: inputs.set_namespace(relabelled))
                    await timed("ns_relabel", lambda: inputs.set_namespace(moved))
                    await timed("node_relabel", lambda: inputs.set_node(node_moved))
                    await timed("node_relabel", lambda: inputs.set_node(node))
                size("final")
                nursery.cancel_scope.cancel()
        finally:
            backend.close()
    for key in names:
        # every timed change must have reached the kernel as a transaction, not "unchanged"
        assert modes[key].get("unchanged", 0) == 0 and sum(modes[key].values()) >= len(wall[key]), (key, modes[key])
    out["ruleset"] = sizes
    for key in names:
        out[f"{key}_ms"] = summary(wall[key], scale=1000)
        out[f"{key}_cpu_ms"] = summary(cpus[key], scale=1000)
        out[f"{key}_modes"] = modes[key]
    out["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=250)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--cluster-policies", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    logging.getLogger("flock.policy").setLevel(logging.ERROR)  # priority ties are wanted here, not their warnings
    out = trio.run(run, args)
    print(f"first apply (everything): {out['first_apply_ms']} ms")
    for key in ("create", "priority", "tier", "delete", "ns_relabel", "node_relabel"):
        wall, cpu_ = out[f"{key}_ms"], out[f"{key}_cpu_ms"]
        print(
            f"{key:13} median {wall['median']:8.2f} ms  p99 {wall['p99']:8.2f} ms"
            f"  cpu median {cpu_['median']:8.2f} ms  p99 {cpu_['p99']:8.2f} ms  (n={wall['n']})  {out[f'{key}_modes']}"
        )
    for label, fig in out["ruleset"].items():
        print(
            f"ruleset {label:13} {fig['rules']} rules, {fig['chains']} chains ({fig['tier_chains']} tier), {fig['sets']} sets"
        )
    print(
        f"kernel: {out['kernel_chains']} chains, {out['kernel_tier_chains']} tier chains  loadavg {out['loadavg_1m']}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
