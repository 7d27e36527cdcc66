"""NetworkPolicy enforcement latency: from ``apply`` to the kernel enforcing it on every node.

A flock-lab with N nodes; on node i a server pod x/s<i> (80/TCP) and, on the
next node, a client pod y/c<i>.  Namespace x denies all ingress.  Each round:

- allow: an ingress policy letting namespace y into x is written to the API
  server at t0; on every node a client starts a TCP connect to its server
  every 10 ms until one completes.  The node's latency is that connect's
  completion - t0; the round's figure is the slowest node.
- deny: the policy is deleted at t0; connects start every 10 ms until one
  gets no answer within the lab's 1 s probe budget.  The node's latency is
  that connect's start - t0 (10 ms resolution).
- policy wait: from t0 to every agent reporting the new resourceVersion
  applied (``flock-lab policy wait``: the agents' gauge, 0.2 s bookmarks).

    python bench/policy_enforce.py [--nodes 2] [--rounds 30]
    python bench/policy_enforce.py --cluster [--background-cnps 100 --background-policies 1000]

Goal (issue 15): ≤ 1 s p99 to enforcement on every node.

``--cluster`` (issue 24): the change is a ClusterNetworkPolicy instead: an
Admin tier policy denying namespace y into x is deleted (allow) and created
again (deny), over a NetworkPolicy that allows y into x, with background
load in the API server and in every agent's compiled state: 100
ClusterNetworkPolicies of both tiers whose subjects are every namespace
(their rules match other peers: Pass, Deny and Accept to networks and
namespaces no lab pod is in) and 1,000 NetworkPolicies in namespaces of
their own.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from flock.lab import (
    Endpoint,
    LabPlan,
    PortSpec,
    apply_objects,
    delete,
    load_pods,
    ns_add,
    pod_add,
    probe_one,
    server_version,
    wait_applied,
)
from flock.testing.benchkit import emit, lab, stats_ms

ATTEMPT_EVERY_S = 0.01
ROUND_LIMIT_S = 15.0
PORT = PortSpec(80, "TCP")
ALLOW = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"namespace": "x", "name": "allow-y"},
    "spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]},
}
DENY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"namespace": "x", "name": "deny"},
    "spec": {"podSelector": {}},
}


async def until_state(src: Endpoint, dst: Endpoint, connected: bool, t0: float) -> float:
    """Seconds from *t0* until a fresh connect from *src* to *dst* shows *connected*."""
    found: list[float] = []
    async with trio.open_nursery() as nursery:

        async def attempt(started: float) -> None:
            r = await probe_one(src, dst, PORT, 6)
            if r.error:
                raise RuntimeError(f"probe {src.label} → {dst.label}: {r.reason}")
            if r.connected == connected:
                found.append((time.perf_counter() if connected else started) - t0)
                nursery.cancel_scope.cancel()

        while not found:
            nursery.start_soon(attempt, time.perf_counter())
            await trio.sleep(ATTEMPT_EVERY_S)
    return min(found)


ADMIN_DENY = {
    "apiVersion": "policy.networking.k8s.io/v1alpha2",
    "kind": "ClusterNetworkPolicy",
    "metadata": {"name": "deny-y-into-x"},
    "spec": {
        "tier": "Admin",
        "priority": 500,
        "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
        "ingress": [{"name": "no-y", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}]}],
    },
}


def background(cnps: int, policies: int) -> list[dict[str, Any]]:
    """Load that selects the lab's pods (the CNPs) or not (the NetworkPolicies) but decides none of the probes."""
    docs: list[dict[str, Any]] = []
    for i in range(policies):
        docs.append(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"namespace": f"bg{i % 10}", "name": f"bg{i}"},
                "spec": {
                    "podSelector": {"matchLabels": {"app": f"a{i % 20}"}},
                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": f"t{i % 3}"}}}]}],
                },
            }
        )
    for i in range(cnps):
        action = ("Pass", "Deny", "Accept")[i % 3]
        to = [{"networks": [f"2001:db8:{0xBB00 + i:x}::/48", f"203.0.113.{i % 256}/32"]}]
        peers = [{"namespaces": {"matchLabels": {"team": f"t{i % 7}"}}}]
        docs.append(
            {
                "apiVersion": "policy.networking.k8s.io/v1alpha2",
                "kind": "ClusterNetworkPolicy",
                "metadata": {"name": f"bg-cnp{i}"},
                "spec": {
                    "tier": "Admin" if i % 3 else "Baseline",
                    "priority": i * 7 % 1000,
                    "subject": {"namespaces": {}},
                    "ingress": [
                        {
                            "action": action,
                            "from": peers,
                            "protocols": [{"tcp": {"destinationPort": {"number": 9000 + i}}}],
                        }
                    ],
                    "egress": [{"action": action, "to": to}],
                },
            }
        )
    return docs


async def one_change(
    plan: LabPlan, pairs: list[tuple[str, Endpoint, Endpoint]], allow: bool, cluster: bool = False
) -> dict[str, Any]:
    per_node: dict[str, float] = {}
    t0 = time.perf_counter()
    if cluster:
        if allow:
            await delete(plan, "clusternetworkpolicy", "deny-y-into-x")
        else:
            await apply_objects(plan, [ADMIN_DENY])
    elif allow:
        await apply_objects(plan, [ALLOW])
    else:
        await delete(plan, "networkpolicy", "x/allow-y")
    target = await server_version(plan)
    waited: list[float] = []
    applied: dict[str, int | None] = {}

    async def node(name: str, src: Endpoint, dst: Endpoint) -> None:
        per_node[name] = await until_state(src, dst, allow, t0)

    async def policy_wait() -> None:
        await wait_applied(plan, target, applied)
        waited.append(time.perf_counter() - t0)

    with trio.move_on_after(ROUND_LIMIT_S):
        async with trio.open_nursery() as nursery:
            for name, src, dst in pairs:
                nursery.start_soon(node, name, src, dst)
            nursery.start_soon(policy_wait)
    missing = [name for name, _, _ in pairs if name not in per_node] + ([] if waited else ["policy wait"])
    if missing:
        raise RuntimeError(
            f"not seen within {ROUND_LIMIT_S:g} s: {', '.join(missing)} (target {target}, agents at {applied})"
        )
    return {"every_node": max(per_node.values()), "nodes": per_node, "policy_wait": waited[0]}


async def main(args: argparse.Namespace) -> None:
    async with lab(args.nodes) as plan:
        await ns_add(plan, "x", {"ns": "x"})
        await ns_add(plan, "y", {"ns": "y"})
        n = len(plan.nodes)
        for i, node in enumerate(plan.nodes):
            await pod_add(plan, node.name, f"x/s{i + 1}", labels={"pod": "s"}, ports=[PORT])
            await pod_add(plan, plan.nodes[(i + 1) % n].name, f"y/c{i + 1}", labels={"pod": "c"}, ports=[PORT])
        pods = {p.key: p for p in load_pods(plan)}

        def end(key: str) -> Endpoint:
            p = pods[key]
            return Endpoint(p.key, p.netns, tuple(p.addresses(6) + p.addresses(4)))

        pairs = [(node.name, end(f"y/c{i + 1}"), end(f"x/s{i + 1}")) for i, node in enumerate(plan.nodes)]
        if args.cluster:
            for i in range(10):
                await ns_add(plan, f"bg{i}", {"team": f"t{i % 3}"})
            load = background(args.background_cnps, args.background_policies)
            for start in range(0, len(load), 200):
                await apply_objects(plan, load[start : start + 200])
            await apply_objects(plan, [DENY, ALLOW, ADMIN_DENY])  # x isolated, y allowed in, the Admin tier denies
        else:
            await apply_objects(plan, [DENY])
        await wait_applied(plan, await server_version(plan), {})
        samples: dict[str, list[float]] = {"allow": [], "deny": [], "policy_wait": []}
        for r in range(args.rounds):
            for allow in (True, False):
                doc = await one_change(plan, pairs, allow, args.cluster)
                kind = "allow" if allow else "deny"
                samples[kind].append(doc["every_node"])
                samples["policy_wait"].append(doc["policy_wait"])
                emit({"round": r, "change": kind, **{k: round(v * 1000, 1) for k, v in doc["nodes"].items()}})
        emit(
            {
                "bench": "policy_enforce",
                "change": "ClusterNetworkPolicy" if args.cluster else "NetworkPolicy",
                "background": {"cnps": args.background_cnps, "policies": args.background_policies}
                if args.cluster
                else None,
                "nodes": n,
                "rounds": args.rounds,
                "allow_every_node_ms": stats_ms(samples["allow"]) | {"max": round(max(samples["allow"]) * 1000, 1)},
                "deny_every_node_ms": stats_ms(samples["deny"]) | {"max": round(max(samples["deny"]) * 1000, 1)},
                "policy_wait_ms": stats_ms(samples["policy_wait"]),
            }
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--cluster", action="store_true", help="toggle an Admin ClusterNetworkPolicy (issue 24)")
    ap.add_argument("--background-cnps", type=int, default=100)
    ap.add_argument("--background-policies", type=int, default=1000)
    trio.run(main, ap.parse_args())
