"""NetworkPolicy at cluster scale: what a change elsewhere in the cluster costs one agent.

A synthetic cluster of N pods (~30 a node over N/30 nodes, N/75 namespaces
with one NetworkPolicy each, Deployments of 1-5 replicas labelled as
kubectl and Helm label them: app, app.kubernetes.io/name and /instance,
tier, pod-template-hash; named ports http and metrics; kube-dns in
kube-system, prometheus in monitoring) is written into one PolicyInputs, as
the watchers would.  The node measured has 30 pods in 10 namespaces; their
policies use scoped pod selectors, team and env namespace selectors, the
monitoring and kube-dns peers, named ports (ingress; and every 5th policy
egress to a team's api pods on "http"), and (ns0000 and every 50th
namespace) ``namespaceSelector: {}``: a set of every pod in the cluster.
The agent's PolicyService runs over it (in process, no API server), with
libnftables in a fresh network namespace (root) or the in-memory applier.

Measured, one change at a time, each awaited until applied (CPU: this
process, all threads, libnftables included; wall: write → applied):

- ``pod label``: a random remote pod's tier label flips (web ↔ api);
- ``pod IP``: a random remote pod gets a new address (element delete + add
  in the cluster-wide sets);
- ``ns label``: a random namespace's team or env label flips (namespace
  selectors re-checked; its pods join or leave the team/env sets);
- ``new policy``: a NetworkPolicy with new selectors selecting local pods,
  on a port number and the named ports http and metrics, from write to
  enforced (then deleted again);
- memory (tracemalloc, a pass of its own): what the policy engine keeps per
  pod (groups, indices), apart from the pod values the watchers own and the
  inputs' table; and the Python peak of a whole table (built and rendered:
  the first apply, or one after a refused transaction);
- with nft, the process's peak RSS over its steady RSS during a whole-table
  apply (an incremental transaction refused, then the table replaced:
  libnftables' parse included) and what stays after it; and one read of the
  rule counters (the service's every 15 s);
- the first apply (the engine built from the inputs, the whole table loaded).

    .venv/bin/python bench/policy_scale.py                          # N = 3,000, 30,000, 150,000; nft and memory
    .venv/bin/python bench/policy_scale.py --pods 30000 --backend memory --rounds 500
"""

from __future__ import annotations

import argparse
import functools
import gc
import ipaddress
import json
import os
import random
import time
import tracemalloc
from collections.abc import Callable

import attrs
import trio
from stats import summary

from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.policy import (
    Kind,
    LibNftables,
    NamedPort,
    Namespace,
    NetworkPolicy,
    NftApplier,
    NftBackend,
    NftError,
    PolicyEngine,
    PolicyInputs,
    PolicyPod,
    PolicyService,
    Protocol,
)
from flock.policy._model import labels_of
from flock.policy._nft import render_full
from flock.testing.policy import MemoryApplier, MemoryLocalPods

NODE = "bench"
LOCAL_PODS = 30
LOCAL_NAMESPACES = 10
TIERS = ("web", "api", "db", "cache")
HTTP = NamedPort("http", Protocol.TCP, 8080)
METRICS = NamedPort("metrics", Protocol.TCP, 9090)


def veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


@attrs.define
class Cluster:
    policies: list[NetworkPolicy]
    namespaces: list[Namespace]
    pods: list[PolicyPod]
    local: list[PolicyPod]
    shared: dict[tuple, tuple]  # label sets, shared as the watchers share them

    def share(self, labels: dict[str, str]) -> tuple:
        pairs = labels_of(labels)
        return self.shared.setdefault(pairs, pairs)


def _pod(ns: str, name: str, labels: tuple, address: ipaddress.IPv6Address, ports: tuple, node: str) -> PolicyPod:
    pod = PolicyPod(ns, name, (), (address,), ports, node=node)
    object.__setattr__(pod, "labels", labels)  # the watchers' shared label set (flock.watchers' PodTransform)
    return pod


def _policy(ns: str, i: int, rnd: random.Random) -> NetworkPolicy:
    ingress: list[dict] = [
        {"from": [{"podSelector": {"matchLabels": {"app": f"app{rnd.randrange(25)}"}}}], "ports": [{"port": "http"}]},
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "podSelector": {"matchLabels": {"app": "prometheus"}},
                }
            ],
            "ports": [{"port": "metrics"}],
        },
        {"from": [{"namespaceSelector": {"matchLabels": {"team": f"t{rnd.randrange(20)}"}}}]},
    ]
    if i % 3 == 0:
        ingress.append(
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"env": "prod"}},
                        "podSelector": {"matchLabels": {"tier": "api"}},
                    }
                ],
                "ports": [{"port": 8443}],
            }
        )
    if i % 50 == 0:
        ingress.append({"from": [{"namespaceSelector": {}}], "ports": [{"port": 443}]})
    spec: dict = {"podSelector": {} if i % 4 == 0 else {"matchLabels": {"tier": rnd.choice(TIERS)}}, "ingress": ingress}
    if i % 5 == 0:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}],
            },
            {"to": [{"podSelector": {}}]},
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"team": f"t{i * 7 % 20}"}},
                        "podSelector": {"matchLabels": {"tier": "api"}},
                    }
                ],
                "ports": [{"port": "http"}],
            },
        ]
    return NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": "default"}, "spec": spec})


def cluster(n_pods: int, seed: int = 1) -> Cluster:
    rnd = random.Random(seed)
    c = Cluster([], [], [], [], {})
    n_ns = max(LOCAL_NAMESPACES, n_pods // 75)
    nodes = [f"node-{i:04d}" for i in range(max(1, n_pods // 30))]
    names = [f"ns{i:04d}" for i in range(n_ns)]
    for i, ns in enumerate(names):
        c.namespaces.append(Namespace(ns, {"team": f"t{i % 20}", "env": "dev" if i % 3 == 0 else "prod"}))
        c.policies.append(_policy(ns, i, rnd))
    c.namespaces += [Namespace("kube-system"), Namespace("monitoring")]
    address = int(ipaddress.IPv6Address("2001:db8:100::1"))
    count = 0

    def add(ns: str, name: str, labels: tuple, ports: tuple) -> None:
        nonlocal count
        c.pods.append(_pod(ns, name, labels, ipaddress.IPv6Address(address + count), ports, rnd.choice(nodes)))
        count += 1

    for i in range(2):
        add("kube-system", f"coredns-{i}", c.share({"k8s-app": "kube-dns", "pod-template-hash": "5d78c9869d"}), ())
    add("monitoring", "prometheus-0", c.share({"app": "prometheus"}), (METRICS,))
    per_ns = max(1, (n_pods - count) // n_ns)
    for ns in names:
        placed, d = 0, 0
        while placed < per_ns:
            app, tier = f"app{d % 25}", TIERS[d % 4]
            labels = c.share(
                {
                    "app": app,
                    "app.kubernetes.io/name": app,
                    "app.kubernetes.io/instance": f"{ns}-{app}",
                    "tier": tier,
                    "pod-template-hash": f"{fnv1a_32(f'{ns}/{app}/{d}'):08x}"[:10],
                }
            )
            ports = (HTTP, METRICS) if tier in ("web", "api") else (METRICS,)
            for r in range(min(rnd.randint(1, 5), per_ns - placed)):
                add(ns, f"{app}-{d}-{r}", labels, ports)
                placed += 1
            d += 1
    # this node's pods: 3 in each of the first namespaces (ns0000's policy has the cluster-wide peer)
    by_ns: dict[str, list[int]] = {}
    for i, p in enumerate(c.pods):
        by_ns.setdefault(p.namespace, []).append(i)
    for ns in names[:LOCAL_NAMESPACES]:
        for i in by_ns[ns][: LOCAL_PODS // LOCAL_NAMESPACES]:
            c.pods[i] = attrs.evolve(c.pods[i], node=NODE)
            c.local.append(c.pods[i])
    return c


def allocation(pod: PolicyPod) -> Allocation:
    return Allocation(f"c-{pod.key}", pod.namespace, pod.name, "uid", "eth0", "/run/netns/x", pod.addresses[0], None)


def cpu() -> float:
    return time.process_time()  # every thread of this process: trio's and libnftables'


def rss_mib() -> tuple[float, float]:
    """This process's (resident, peak resident) MiB."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size (VmHWM) starts again from the resident size now


@attrs.define
class Refusing:
    """A backend that refuses the next *refuse* transactions, as nft refuses one (the applier then replaces)."""

    backend: NftBackend
    refuse: int = 0

    async def run(self, script: str | bytes) -> str:
        if self.refuse > 0:
            self.refuse -= 1
            raise NftError(1, "Error: refused by the benchmark\n")
        return await self.backend.run(script)

    async def counters(self, table: str) -> dict[str, tuple[int, int]]:
        return await self.backend.counters(table)


@attrs.define
class Figures:
    cpu_ms: list[float] = attrs.Factory(list)
    wall_ms: list[float] = attrs.Factory(list)

    def summary(self) -> dict:
        return {"cpu_ms": summary(self.cpu_ms), "wall_ms": summary(self.wall_ms)}


async def _timed(service: PolicyService, inputs: PolicyInputs, write: Callable[[], None], into: Figures) -> None:
    c0, w0 = cpu(), time.perf_counter()
    write()
    await service.wait_applied(inputs.generation)
    into.cpu_ms.append((cpu() - c0) * 1000)
    into.wall_ms.append((time.perf_counter() - w0) * 1000)


def inputs_of(c: Cluster) -> PolicyInputs:
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in c.policies})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in c.namespaces})
    inputs.replace(Kind.CLUSTER_POLICY, {})
    inputs.replace(Kind.POD, {p.key: p for p in c.pods})
    return inputs


def memory(c: Cluster) -> dict:
    """What the engine keeps per pod, and the transient peak of a whole table (its value and its script)."""
    inputs = inputs_of(c)
    local = [attrs.evolve(p, host_veth=veth(f"c-{p.key}")) for p in c.local]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    engine = PolicyEngine(inputs)
    engine.load(local)
    engine.change()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.reset_peak()
    script = render_full(engine.ruleset())
    peak = tracemalloc.get_traced_memory()[1] - base - held
    tracemalloc.stop()
    return {
        "engine_bytes_per_pod": round(held / len(c.pods)),
        "whole_table_peak_mib": round(peak / 2**20, 1),
        "script_mib": round(len(script) / 2**20, 1),
    }


async def measure(c: Cluster, rounds: int, policy_rounds: int, netns: str | None) -> dict:
    out: dict = {"pods": len(c.pods), "namespaces": len(c.namespaces), "policies": len(c.policies)}
    out["nodes"] = max(1, len(c.pods) // 30)
    inputs, local = inputs_of(c), MemoryLocalPods()
    for p in c.local:
        local.put(allocation(p))
    backend = LibNftables(netns) if netns is not None else None
    refusing = Refusing(backend) if backend is not None else None
    applier = NftApplier(refusing) if refusing is not None else MemoryApplier()
    service = PolicyService(inputs, local, applier, NODE, veth)
    rnd = random.Random(2)
    remote = [p.key for p in c.pods if p.node != NODE]
    try:
        async with trio.open_nursery() as nursery:
            w0 = time.perf_counter()
            await nursery.start(service.run)
            await service.wait_applied(inputs.generation)
            out["first_apply_s"] = round(time.perf_counter() - w0, 2)
            rs = service.ruleset()
            assert rs is not None
            out["sets"] = len(rs.address_sets) + len(rs.service_sets)
            out["set_elements"] = sum(len(s.elements) for s in (*rs.address_sets.values(), *rs.service_sets.values()))
            out["chains"] = len(rs.chains)
            del rs

            label, address, namespace, new_policy = Figures(), Figures(), Figures(), Figures()
            fresh = int(ipaddress.IPv6Address("2001:db8:200::1"))
            for r in range(rounds):
                key = rnd.choice(remote)
                pod = inputs.pods[key]
                labels = dict(pod.labels)
                labels["tier"] = "api" if labels.get("tier") == "web" else "web"
                relabelled = _pod(pod.namespace, pod.name, c.share(labels), pod.addresses[0], pod.named_ports, pod.node)
                await _timed(service, inputs, functools.partial(inputs.set_pod, relabelled), label)

                pod = inputs.pods[rnd.choice(remote)]
                moved = attrs.evolve(pod, addresses=(ipaddress.IPv6Address(fresh + r),))
                await _timed(service, inputs, functools.partial(inputs.set_pod, moved), address)

                ns = inputs.namespaces[rnd.choice(c.namespaces[:-2]).name]
                ns_labels = dict(ns.labels)
                if r % 2:
                    ns_labels["team"] = f"t{(int(ns_labels['team'][1:]) + 1) % 20}"
                else:
                    ns_labels["env"] = "dev" if ns_labels["env"] == "prod" else "prod"
                await _timed(
                    service, inputs, functools.partial(inputs.set_namespace, Namespace(ns.name, ns_labels)), namespace
                )

            for r in range(policy_rounds):
                spec = {
                    "podSelector": {},
                    "ingress": [
                        {
                            "from": [
                                {
                                    "namespaceSelector": {"matchLabels": {"team": f"t{r % 20}"}},
                                    "podSelector": {"matchLabels": {"tier": TIERS[r % 4]}},
                                },
                                {"podSelector": {"matchLabels": {"app": f"app{r % 25}", "tier": TIERS[(r + 1) % 4]}}},
                            ],
                            "ports": [{"port": 9000 + r}, {"port": "http"}, {"port": "metrics"}],
                        }
                    ],
                }
                pol = NetworkPolicy.from_object({"metadata": {"namespace": "ns0001", "name": f"new{r}"}, "spec": spec})
                await _timed(service, inputs, functools.partial(inputs.set_policy, pol), new_policy)
                inputs.delete(Kind.NETWORK_POLICY, pol.key)
                await service.wait_applied(inputs.generation)

            if refusing is not None and isinstance(applier, NftApplier):
                c0 = cpu()
                await applier.counters()
                out["counters_cpu_ms"] = round((cpu() - c0) * 1000, 1)
                # a pod's change whose incremental transaction nft refuses: the table replaced whole
                pod = inputs.pods[rnd.choice(remote)]
                moved = attrs.evolve(pod, addresses=(ipaddress.IPv6Address(fresh + rounds),))
                gc.collect()
                steady, _ = rss_mib()
                reset_peak_rss()
                refusing.refuse, w0 = 1, time.perf_counter()
                inputs.set_pod(moved)
                await service.wait_applied(inputs.generation)
                wall = time.perf_counter() - w0
                after, peak = rss_mib()
                out["whole_apply"] = {
                    "steady_rss_mib": round(steady, 1),
                    "peak_over_steady_mib": round(peak - steady, 1),
                    "kept_after_mib": round(after - steady, 1),
                    "wall_s": round(wall, 2),
                }
            nursery.cancel_scope.cancel()
    finally:
        if backend is not None:
            backend.close()
    for name, fig in (("pod_label", label), ("pod_ip", address), ("ns_label", namespace), ("new_policy", new_policy)):
        out[name] = fig.summary()
    return out


def _row(backend: str, r: dict, mem: dict) -> str:
    cells = [f"{r['pods']:>7,}", f"{backend:>6}"]
    for key in ("pod_label", "pod_ip", "ns_label"):
        cells.append(f"{r[key]['cpu_ms']['median']:5.2f} / {r[key]['cpu_ms']['p99']:5.2f}")
    cells.append(f"{r['new_policy']['wall_ms']['median']:6.1f} / {r['new_policy']['wall_ms']['p99']:6.1f}")
    cells.append(f"{r['first_apply_s']:6.2f}")
    cells.append(f"{mem['engine_bytes_per_pod']:5d}")
    cells.append(f"{mem['whole_table_peak_mib']:6.1f}")
    whole = r.get("whole_apply")
    cells.append(f"{whole['peak_over_steady_mib']:6.1f} / {whole['kept_after_mib']:5.1f}" if whole else "")
    cells.append(f"{r['counters_cpu_ms']:6.1f}" if "counters_cpu_ms" in r else "")
    return " | ".join(cells)


async def run(args: argparse.Namespace) -> dict:
    out: dict = {"bench": "policy_scale", "rounds": args.rounds, "runs": []}
    backends = ["nft", "memory"] if args.backend == "both" else [args.backend]
    if "nft" in backends and os.geteuid() != 0:
        print("not root: no network namespace for nft; the in-memory applier only")
        backends = ["memory"]
    for n in args.pods:
        c = cluster(n)
        mem = memory(c)
        out["runs"].append({"pods": len(c.pods), **mem})
        for backend in backends:
            if backend == "nft":
                from flock.testing.netns import netns_pool

                with netns_pool("fl-bench-pscale-") as pool:
                    figures = await measure(c, args.rounds, args.policy_rounds, pool.create("node").path)
            else:
                figures = await measure(c, args.rounds, args.policy_rounds, None)
            figures["backend"] = backend
            out["runs"].append(figures)
            print(_row(backend, figures, mem), flush=True)
            c = cluster(n)  # the next run starts from the same cluster
    out["loadavg_1m"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=lambda s: [int(x) for x in s.split(",")], default=[3000, 30000, 150000])
    ap.add_argument("--rounds", type=int, default=300, help="changes of each kind")
    ap.add_argument("--policy-rounds", type=int, default=20)
    ap.add_argument("--backend", choices=["nft", "memory", "both"], default="both")
    args = ap.parse_args()
    print(
        "   pods | applier | CPU ms a change (median / p99): pod label | pod IP | ns label "
        "| new policy → applied ms (median / p99) | first apply s | engine B/pod | whole table MiB (Python) "
        "| whole apply RSS MiB over steady (peak / kept) | counters read ms"
    )
    out = trio.run(run, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
