"""Compile + apply time of NetworkPolicy: 1,000 policies × 250 pods, then one pod's churn.

A synthetic cluster (10 namespaces, 250 pods, all attached on this node — the
worst case for one node: every pod has chains) and 1,000 policies mixing
pod/namespace selectors, matchExpressions, ipBlocks with except, numeric,
range and named ports, ingress and egress.  Applied by Debian's nft in a fresh
network namespace (the host is never touched).

    .venv/bin/python bench/policy_apply.py --rounds 20     # prints figures, then one JSON line

Figures: compile (pure), render, full apply (compile + render + ``nft -f``
of the whole table), churn (one peer pod added/removed elsewhere: compile +
incremental apply) and local churn (one pod attached here: its chains, map
entries and set memberships), policy edit (one policy's rules change; the
other 999 are reused by the agent's caching Compiler).  CPU time (this process
and nft) is the steadier figure on a busy machine.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import resource
import time

import attrs
import trio
from stats import summary

from flock.fnv import fnv1a_32
from flock.policy import Compiler, NamedPort, Namespace, NetworkPolicy, PolicyPod, Protocol, compile_ruleset
from flock.policy._apply import NftApplier
from flock.policy._backend import LibNftables, NftCommand
from flock.policy._nft import render_full
from flock.testing.netns import netns_pool

APPS = [f"app{i}" for i in range(25)]


def cluster(
    seed: int, n_pods: int, n_policies: int, dual_stack: bool = False
) -> tuple[list[NetworkPolicy], list[Namespace], list[PolicyPod]]:
    rnd = random.Random(seed)
    namespaces = [Namespace(f"ns{i}", {"team": f"t{i % 4}", "env": rnd.choice(["prod", "dev"])}) for i in range(10)]
    pods = []
    for i in range(n_pods):
        ns = f"ns{i % 10}"
        labels = {"app": rnd.choice(APPS), "tier": rnd.choice(["web", "db", "cache"]), "pod": f"p{i}"}
        addrs: tuple = (ipaddress.ip_address(f"2001:db8:1::{i + 1:x}"),)
        if dual_stack:
            addrs += (ipaddress.ip_address(f"10.1.{i // 250}.{i % 250 + 1}"),)
        ports = (NamedPort("http", Protocol.TCP, rnd.choice([80, 8080])), NamedPort("dns", Protocol.UDP, 53))
        key = f"{ns}/pod{i}"
        pods.append(PolicyPod(ns, f"pod{i}", labels, addrs, ports, node="bench", host_veth=f"flock{fnv1a_32(key):08x}"))
    policies = []
    for i in range(n_policies):
        ns = f"ns{i % 10}"
        block = rnd.randrange(16)
        peers: list[dict] = [
            {"podSelector": {"matchLabels": {"app": rnd.choice(APPS)}}},
            {"namespaceSelector": {"matchLabels": {"team": f"t{rnd.randrange(4)}"}}},
            {
                "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
                "podSelector": {"matchLabels": {"tier": rnd.choice(["web", "db"])}},
            },
            {"ipBlock": {"cidr": f"2001:db8:{block:x}::/48", "except": [f"2001:db8:{block:x}:f::/64"]}},
        ]
        spec: dict = {
            "podSelector": {"matchLabels": {"app": rnd.choice(APPS)}},
            "ingress": [
                {"from": rnd.sample(peers, 2), "ports": [{"port": rnd.choice([80, 443])}, {"port": "http"}]},
                {"from": [peers[0]], "ports": [{"port": 8000, "endPort": 8100}, {"protocol": "UDP", "port": 53}]},
            ],
        }
        if i % 3 == 0:
            spec["egress"] = [{"to": [peers[rnd.randrange(4)]], "ports": [{"port": "dns", "protocol": "UDP"}]}]
            spec["policyTypes"] = ["Ingress", "Egress"]
        policies.append(NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": f"pol{i}"}, "spec": spec}))
    return policies, namespaces, pods


def cpu() -> float:
    """CPU seconds of this process and its children (nft): steadier than wall time on a busy machine."""
    own = time.process_time()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + kids.ru_utime + kids.ru_stime


async def run(args: argparse.Namespace) -> dict:
    policies, namespaces, pods = cluster(1, args.pods, args.policies, args.dual_stack)
    compile_s, render_s, full_s, churn_s, local_s = [], [], [], [], []
    full_cpu, churn_cpu, local_cpu = [], [], []
    policy_s, policy_cpu = [], []
    with netns_pool("fl-bench-pol-") as pool:
        node = pool.create("node")
        backend: LibNftables | NftCommand
        if args.backend == "libnftables":
            backend = LibNftables(node.path)
        else:
            backend = NftCommand(("ip", "netns", "exec", node.name, "nft"))
        applier = NftApplier(backend)
        rs = None
        for r in range(args.rounds):
            t0 = time.perf_counter()
            rs = compile_ruleset(policies, namespaces, pods, pods)
            t1 = time.perf_counter()
            render_full(rs)
            t2 = time.perf_counter()
            fresh = NftApplier(applier.backend)  # a new agent: full replace of an existing table
            c0 = cpu()
            await fresh.apply(compile_ruleset(policies, namespaces, pods, pods))
            t3 = time.perf_counter()
            full_cpu.append(cpu() - c0)
            compile_s.append(t1 - t0)
            render_s.append(t2 - t1)
            full_s.append(t3 - t2)
            if r == 0:
                await applier.apply(rs)
        assert rs is not None
        compiler = Compiler()  # what the agent's service uses: rules cached while policies stay
        compiler.compile(policies, namespaces, pods, pods)
        stats = {"rules": rs.rule_count, "sets": rs.set_count, "chains": len(rs.chains)}
        peer = PolicyPod(
            "ns3",
            "remote",
            {"app": APPS[3], "tier": "web"},
            (ipaddress.ip_address("2001:db8:2::1"), *([ipaddress.ip_address("10.2.0.1")] if args.dual_stack else [])),
            (NamedPort("http", Protocol.TCP, 80),),
            node="other",
        )
        for r in range(args.rounds):
            # a peer pod appears on another node, then goes away: set elements only
            for cluster_pods in ([*pods, peer], pods):
                t0, c0 = time.perf_counter(), cpu()
                result = await applier.apply(compiler.compile(policies, namespaces, cluster_pods, pods))
                churn_s.append(time.perf_counter() - t0)
                churn_cpu.append(cpu() - c0)
                assert result.mode == "incremental", result
            # a pod is attached here (chains + map entries + memberships), then detached
            new = attrs.evolve(peer, name=f"local{r}", node="bench", host_veth=f"flock{fnv1a_32(f'l{r}'):08x}")
            for local in ([*pods, new], pods):
                t0, c0 = time.perf_counter(), cpu()
                result = await applier.apply(compiler.compile(policies, namespaces, local, local))
                local_s.append(time.perf_counter() - t0)
                local_cpu.append(cpu() - c0)
                assert result.mode == "incremental", result
        # one policy edited (its ports), then edited back: that policy's chain is rewritten, nothing else
        for r in range(args.rounds):
            edited = NetworkPolicy.from_object(
                {
                    "metadata": {"namespace": policies[7].namespace, "name": policies[7].name},
                    "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 9000 + r}]}]},
                }
            )
            for pols in ([*policies[:7], edited, *policies[8:]], policies):
                t0, c0 = time.perf_counter(), cpu()
                result = await applier.apply(compiler.compile(pols, namespaces, pods, pods))
                policy_s.append(time.perf_counter() - t0)
                policy_cpu.append(cpu() - c0)
                assert result.mode == "incremental", result
    return {
        "bench": "policy_apply",
        "policies": args.policies,
        "pods": args.pods,
        "rounds": args.rounds,
        "dual_stack": args.dual_stack,
        "backend": args.backend,
        **stats,
        "compile_ms": summary(compile_s, scale=1000),
        "render_ms": summary(render_s, scale=1000),
        "full_apply_ms": summary(full_s, scale=1000),
        "peer_churn_ms": summary(churn_s, scale=1000),
        "local_pod_churn_ms": summary(local_s, scale=1000),
        "policy_edit_ms": summary(policy_s, scale=1000),
        "full_apply_cpu_ms": summary(full_cpu, scale=1000),
        "policy_edit_cpu_ms": summary(policy_cpu, scale=1000),
        "peer_churn_cpu_ms": summary(churn_cpu, scale=1000),
        "local_pod_churn_cpu_ms": summary(local_cpu, scale=1000),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--backend", choices=["libnftables", "nft-command"], default="libnftables")
    ap.add_argument("--dual-stack", action="store_true", help="pods get an IPv4 address too (default: IPv6 only)")
    args = ap.parse_args()
    out = trio.run(run, args)
    keys = ("compile_ms", "render_ms", "full_apply_ms", "peer_churn_ms", "local_pod_churn_ms", "policy_edit_ms")
    for key in (*keys, "full_apply_cpu_ms", "peer_churn_cpu_ms", "local_pod_churn_cpu_ms", "policy_edit_cpu_ms"):
        print(f"{key:24} median {out[key]['median']:8.2f}  p99 {out[key]['p99']:8.2f}  (n={out[key]['n']})")
    print(f"ruleset: {out['rules']} rules, {out['sets']} sets, {out['chains']} chains")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
