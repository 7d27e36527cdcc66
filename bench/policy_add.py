"""What NetworkPolicy adds to ADD: the policy gate, from "allocation stored" to "its rules are in the kernel".

ADD awaits :meth:`flock.policy.PolicyService.ensure` after the netlink setup;
everything else on ADD's path is unchanged, so the gate's latency is what
policy adds.  The service runs as in the agent (caching Compiler,
libnftables in-process) against the real kernel in a fresh network
namespace, with a cluster of --pods pods (a tenth local) and --policies
policies already applied.  Measured per new pod, three ways: no policy in
its namespace (only set memberships move: it joins peer sets), a policy
selecting it (its chains, map entries and memberships), and for comparison
a cluster without any policy at all.

    .venv/bin/python bench/policy_add.py --rounds 50     # prints figures, then one JSON line
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import time

import trio
from prometheus_client import CollectorRegistry
from stats import summary

from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.policy import (
    Kind,
    LibNftables,
    Namespace,
    NetworkPolicy,
    NftApplier,
    PolicyInputs,
    PolicyMetrics,
    PolicyPod,
    PolicyService,
)
from flock.testing.netns import netns_pool
from flock.testing.policy import MemoryLocalPods


def veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


def cluster(n_pods: int, n_policies: int) -> tuple[list[NetworkPolicy], list[Namespace], list[PolicyPod]]:
    rnd = random.Random(7)
    namespaces = [Namespace(f"ns{i}", {"team": f"t{i % 3}"}) for i in range(10)]
    pods = [
        PolicyPod(
            f"ns{i % 10}",
            f"pod{i}",
            {"app": f"app{rnd.randrange(20)}"},
            (ipaddress.ip_address(f"2001:db8:1::{i + 1:x}"),),
            node="bench" if i % 10 == 0 else "other",
        )
        for i in range(n_pods)
    ]
    policies = [
        NetworkPolicy.from_object(
            {
                "metadata": {"namespace": f"ns{i % 9}", "name": f"pol{i}"},  # ns9 has no policy
                "spec": {
                    "podSelector": {"matchLabels": {"app": f"app{rnd.randrange(20)}"}},
                    "ingress": [
                        {
                            "from": [{"namespaceSelector": {"matchLabels": {"team": f"t{rnd.randrange(3)}"}}}],
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


async def measure(args: argparse.Namespace, netns: str, with_policies: bool) -> dict[str, dict]:
    policies, namespaces, pods = cluster(args.pods, args.policies if with_policies else 0)
    inputs, local = PolicyInputs(), MemoryLocalPods()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in namespaces})
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    for i, p in enumerate(pods):
        if p.node == "bench":
            local.put(allocation(f"c{i}", p.key, 0x1000 + i))
    backend = LibNftables(netns)
    service = PolicyService(
        inputs, local, NftApplier(backend), "bench", veth, metrics=PolicyMetrics(CollectorRegistry())
    )
    figures: dict[str, list[float]] = {"unselected": [], "selected": []}
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.ensure(next(iter(local.allocations.values())))  # the first ruleset is in
            for r in range(args.rounds):
                # "selected": label app0 in ns0 — some policy there selects it when policies exist
                for case, ns, labels in (("unselected", "ns9", {"app": "none"}), ("selected", "ns0", {"app": "app0"})):
                    if not with_policies and case == "selected":
                        continue
                    key = f"{ns}/new{r}"
                    pod = PolicyPod(ns, f"new{r}", labels, node="bench")
                    inputs.set_pod(pod)  # the watchers saw the pod before its ADD (the kubelet's order)
                    await trio.sleep(0.05)
                    alloc = allocation(f"new{r}", key, r + 1)
                    began = time.perf_counter()
                    local.put(alloc)
                    await service.ensure(alloc)
                    figures[case].append(time.perf_counter() - began)
                    local.drop(alloc.container_id)
                    inputs.delete(Kind.POD, key)
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        backend.close()
    return {case: summary(samples, scale=1000) for case, samples in figures.items() if samples}


async def run(args: argparse.Namespace) -> dict:
    out: dict = {"bench": "policy_add", "pods": args.pods, "policies": args.policies, "rounds": args.rounds}
    with netns_pool("fl-bench-padd-") as pool:
        out["with_policies_ms"] = await measure(args, pool.create("node").path, True)
        out["no_policies_ms"] = await measure(args, pool.create("node").path, False)
    out["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=250)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    out = trio.run(run, args)
    for key in ("with_policies_ms", "no_policies_ms"):
        for case, fig in out[key].items():
            print(f"{key:18} {case:11} median {fig['median']:7.2f} ms  p99 {fig['p99']:7.2f} ms  (n={fig['n']})")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
