"""What NetworkPolicy adds to ADD: the policy gate, from "allocation stored" to "its rules are in the kernel".

ADD awaits :meth:`flock.policy.PolicyService.ensure` after the netlink setup;
everything else on ADD's path is unchanged, so the gate's latency is what
policy adds.  The service runs as in the agent (caching Compiler,
libnftables in-process) against the real kernel in a fresh network
namespace, with a cluster of --pods pods (a tenth local) and --policies
policies already applied.  Measured per new pod, two cases: no policy in
its namespace (only set memberships move: it joins peer sets), a policy
selecting it (its chains, map entries and memberships); in three clusters:
with the policies, with the policies and --cluster-policies
ClusterNetworkPolicies (bench/cluster_policy_apply.py's mix: 2/3 Admin, 1/3
Baseline, every kind of peer and port, 50 Nodes under ``nodes`` peers) and,
for comparison, without any policy at all.  The three services run side by
side (a netns each) and the rounds alternate between them, so a busy
machine's drift falls on all three alike.  The new pod's namespace has team
label t0, which some CNPs select: with them, the "unselected" pod (no
NetworkPolicy selects it) gets Admin/Baseline tier chains; the JSON line says
how many CNPs select each case's pod.

    .venv/bin/python bench/policy_add.py --rounds 50     # prints figures, then one JSON line
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import random
import statistics
import time

import attrs
import trio
from cluster_policy_apply import cluster_policies, policy_nodes
from prometheus_client import CollectorRegistry
from stats import percentile, summary

from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.policy import (
    Kind,
    LibNftables,
    NamedPort,
    Namespace,
    NetworkPolicy,
    NftApplier,
    PolicyInputs,
    PolicyMetrics,
    PolicyPod,
    PolicyService,
    Protocol,
)
from flock.testing.netns import netns_pool
from flock.testing.policy import MemoryLocalPods

TEAMS, APPS = 3, 20
PORTS = (NamedPort("http", Protocol.TCP, 8080), NamedPort("dns", Protocol.UDP, 53))  # for destinationNamedPort
CONFIGS = ("with_policies_ms", "with_cluster_ms", "no_policies_ms")
CASES = (("unselected", "ns9", {"app": "none"}), ("selected", "ns0", {"app": "app0"}))


def veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


def cluster(n_pods: int, n_policies: int) -> tuple[list[NetworkPolicy], list[Namespace], list[PolicyPod]]:
    rnd = random.Random(7)
    namespaces = [Namespace(f"ns{i}", {"team": f"t{i % TEAMS}"}) for i in range(10)]
    pods = [
        PolicyPod(
            f"ns{i % 10}",
            f"pod{i}",
            {"app": f"app{rnd.randrange(APPS)}"},
            (ipaddress.ip_address(f"2001:db8:1::{i + 1:x}"),),
            PORTS,
            node="bench" if i % 10 == 0 else "other",
        )
        for i in range(n_pods)
    ]
    policies = [
        NetworkPolicy.from_object(
            {
                "metadata": {"namespace": f"ns{i % 9}", "name": f"pol{i}"},  # ns9 has no policy
                "spec": {
                    "podSelector": {"matchLabels": {"app": f"app{rnd.randrange(APPS)}"}},
                    "ingress": [
                        {
                            "from": [{"namespaceSelector": {"matchLabels": {"team": f"t{rnd.randrange(TEAMS)}"}}}],
                            "ports": [{"port": 80}, {"port": 8080, "endPort": 8090}],
                        }
                    ],
                },
            }
        )
        for i in range(n_policies)
    ]
    return policies, namespaces, pods


def allocation(cid: str, key: str, n: int) -> Allocation:
    ns, name = key.split("/")
    return Allocation(cid, ns, name, "uid", "eth0", "/run/netns/x", ipaddress.IPv6Address(f"2001:db8:2::{n:x}"), None)


@attrs.define(eq=False)
class Setup:
    """One cluster's policy service, running."""

    inputs: PolicyInputs
    local: MemoryLocalPods
    service: PolicyService
    selecting: dict[str, int]  # case → CNPs whose subject the new pod is


async def start(nursery: trio.Nursery, args: argparse.Namespace, backend: LibNftables, config: str) -> Setup:
    n_policies = 0 if config == "no_policies_ms" else args.policies
    policies, namespaces, pods = cluster(args.pods, n_policies)
    cnps = cluster_policies(args.cluster_policies, teams=TEAMS, apps=APPS) if config == "with_cluster_ms" else []
    inputs, local = PolicyInputs(), MemoryLocalPods()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in namespaces})
    inputs.replace(Kind.CLUSTER_POLICY, {c.key: c for c in cnps})
    if cnps:
        inputs.replace(Kind.NODE, {n.name: n for n in policy_nodes(50)})
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    for i, p in enumerate(pods):
        if p.node == "bench":
            local.put(allocation(f"c{i}", p.key, 0x1000 + i))
    service = PolicyService(
        inputs, local, NftApplier(backend), "bench", veth, metrics=PolicyMetrics(CollectorRegistry())
    )
    await nursery.start(service.run)
    await service.ensure(next(iter(local.allocations.values())))  # the first ruleset is in
    if cnps:
        assert service.applied is not None and any(c.startswith(("ta-", "tb-")) for c in service.applied.chains)
    ns_labels = {n.name: n.label_map for n in namespaces}
    selecting = {
        case: sum(1 for c in cnps if c.selects(PolicyPod(ns, "new", labels, (), PORTS), ns_labels[ns]))
        for case, ns, labels in CASES
    }
    return Setup(inputs, local, service, selecting)


async def add_one(setup: Setup, ns: str, labels: dict, r: int) -> float:
    """One ADD's policy gate: seconds from "allocation stored" until ensure() returns."""
    key = f"{ns}/new{r}"
    setup.inputs.set_pod(PolicyPod(ns, f"new{r}", labels, (), PORTS, node="bench"))  # the watchers saw it first
    await trio.sleep(0.05)
    alloc = allocation(f"new{r}", key, r + 1)
    began = time.perf_counter()
    setup.local.put(alloc)
    await setup.service.ensure(alloc)
    seconds = time.perf_counter() - began
    setup.local.drop(alloc.container_id)
    setup.inputs.delete(Kind.POD, key)
    await trio.sleep(0.05)
    return seconds


async def run(args: argparse.Namespace) -> dict:
    out: dict = {
        "bench": "policy_add",
        "pods": args.pods,
        "policies": args.policies,
        "cluster_policies": args.cluster_policies,
        "rounds": args.rounds,
    }
    figures: dict[str, dict[str, list[float]]] = {k: {"unselected": [], "selected": []} for k in CONFIGS}
    backends: list[LibNftables] = []
    with netns_pool("fl-bench-padd-") as pool:
        try:
            async with trio.open_nursery() as nursery:
                setups = {}
                for i, config in enumerate(CONFIGS):
                    backends.append(LibNftables(pool.create(f"node{i}").path))
                    setups[config] = await start(nursery, args, backends[-1], config)
                for r in range(args.rounds):
                    # "selected": label app0 in ns0 — some policy there selects it when policies exist
                    for case, ns, labels in CASES:
                        for config, setup in setups.items():
                            if config == "no_policies_ms" and case == "selected":
                                continue
                            figures[config][case].append(await add_one(setup, ns, labels, r))
                nursery.cancel_scope.cancel()
        finally:
            for backend in backends:
                backend.close()
    for config in CONFIGS:
        out[config] = {case: summary(samples, scale=1000) for case, samples in figures[config].items() if samples}
    out["cnps_selecting_new_pod"] = setups["with_cluster_ms"].selecting
    # What the CNPs add: the difference of the same statistic, with and without them (same run, same rounds)
    out["cluster_added_ms"] = {
        case: {
            stat: round(
                (fn(figures["with_cluster_ms"][case]) - fn(figures["with_policies_ms"][case])) * 1000,
                2,
            )
            for stat, fn in (("median", statistics.median), ("p99", lambda s: percentile(s, 0.99)))
        }
        for case, _, _ in CASES
    }
    out["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=250)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--cluster-policies", type=int, default=100, help="ClusterNetworkPolicies of with_cluster_ms")
    args = ap.parse_args()
    logging.getLogger("flock.policy").setLevel(logging.ERROR)  # priority ties are wanted here, not their warnings
    out = trio.run(run, args)
    for key in CONFIGS:
        for case, fig in out[key].items():
            print(f"{key:18} {case:11} median {fig['median']:7.2f} ms  p99 {fig['p99']:7.2f} ms  (n={fig['n']})")
    for case, fig in out["cluster_added_ms"].items():
        n = out["cnps_selecting_new_pod"][case]
        print(
            f"{case}: cluster policies add {fig['median']:.2f} ms (median), {fig['p99']:.2f} ms (p99)  ({n} CNPs select it)"
        )
    print(f"loadavg {out['loadavg_1m']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
