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

Goal (issue 15): ≤ 1 s p99 to enforcement on every node.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
from labkit import emit, lab, stats_ms

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


async def one_change(plan: LabPlan, pairs: list[tuple[str, Endpoint, Endpoint]], allow: bool) -> dict[str, Any]:
    per_node: dict[str, float] = {}
    t0 = time.perf_counter()
    if allow:
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
        await apply_objects(plan, [DENY])
        await wait_applied(plan, await server_version(plan), {})
        samples: dict[str, list[float]] = {"allow": [], "deny": [], "policy_wait": []}
        for r in range(args.rounds):
            for allow in (True, False):
                doc = await one_change(plan, pairs, allow)
                kind = "allow" if allow else "deny"
                samples[kind].append(doc["every_node"])
                samples["policy_wait"].append(doc["policy_wait"])
                emit({"round": r, "change": kind, **{k: round(v * 1000, 1) for k, v in doc["nodes"].items()}})
        emit(
            {
                "bench": "policy_enforce",
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
    trio.run(main, ap.parse_args())
