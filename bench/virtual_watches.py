"""Virtual watches at 5,000 agents: how fast the fake API server counts what they would be sent.

Issue 35's design (each agent watches its own pods, its own NodeAddressGroups and the
AddressGroups it names) and today's (every agent watches every pod: one entry, count 5,000) are
registered on one in-process store (no HTTP: the counting is what is measured), then pods are
relabelled, address groups rewritten and (issue 35) nodes given other groups, their agents
re-watching (counted as the ADDED events of the groups gained).  Prints, per design, the bytes the agents would have
been sent, and the events/s the store sustains (writes with the counting) and the counting alone
(the same changes replayed through ``VirtualWatches.count``).

    .venv/bin/python bench/virtual_watches.py [--nodes 5000] [--pods-per-node 4] [--groups 200]
        [--groups-per-node 20] [--writes 2000]

Prints its figures as a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from flock.apiserver import ADDRESSGROUPS, NODEADDRESSGROUPS, PODS, ObjectStore, VirtualWatch, pod_object

GROUP_LABEL = "flock.fritzlab.net/group"


def address_group(group: str, members: int) -> dict[str, Any]:
    return {
        "kind": "AddressGroup",
        "metadata": {"name": f"{group}-0", "labels": {GROUP_LABEL: group}},
        "group": group,
        "members": [
            {"namespace": "app", "name": f"{group}-{i}", "node": f"node-{i}", "ips": [f"2001:db8::{i:x}", "10.0.0.1"]}
            for i in range(members)
        ],
    }


def cluster(args: argparse.Namespace) -> ObjectStore:
    store = ObjectStore(history_limit=args.writes * 2 + 10)
    store.bulk_create(
        PODS,
        (
            pod_object("app", f"p-{n}-{i}", f"node-{n}", labels={"app": f"a{(n + i) % args.groups}"})
            for n in range(args.nodes)
            for i in range(args.pods_per_node)
        ),
    )
    for g in range(args.groups):
        store.create(ADDRESSGROUPS, address_group(f"g{g}", 20))
    return store


def groups_selector(groups: list[str]) -> str:
    return f"{GROUP_LABEL} in ({','.join(groups)})"


def needed(rng: random.Random, args: argparse.Namespace) -> list[str]:
    return [f"g{g}" for g in sorted(rng.sample(range(args.groups), args.groups_per_node))]


def register(store: ObjectStore, args: argparse.Namespace, design: str) -> dict[str, VirtualWatch]:
    """The agents' watches; returns each node's AddressGroups watch (issue 35's design)."""
    rng = random.Random(1)
    virtual = store.virtual_watches
    if design == "all-pods":
        virtual.add(PODS, count=args.nodes)
        return {}
    agents = {}
    for n in range(args.nodes):
        node = f"node-{n}"
        groups = needed(rng, args)
        store.create(NODEADDRESSGROUPS, {"kind": "NodeAddressGroups", "metadata": {"name": node}, "groups": groups})
        virtual.add(PODS, field_selector=f"spec.nodeName={node}")
        virtual.add(NODEADDRESSGROUPS, field_selector=f"metadata.name={node}")
        agents[node] = virtual.add(ADDRESSGROUPS, label_selector=groups_selector(groups))
    return agents


def write(store: ObjectStore, args: argparse.Namespace, salt: int, agents: dict[str, VirtualWatch]) -> float:
    """Relabel pods (9 in 10 writes), rewrite address groups, and (1 in 50, issue 35's design) give
    a node other groups, its agent re-watching; each pass's *salt* makes every write a change.
    Returns the seconds taken."""
    rng = random.Random(2)
    start = time.perf_counter()
    for i in range(args.writes):
        if agents and i % 50 == 25:
            node = f"node-{rng.randrange(args.nodes)}"
            groups = needed(rng, args)
            store.patch(NODEADDRESSGROUPS, node, {"groups": groups, "revision": salt * args.writes + i})
            agents[node].rewatch(label_selector=groups_selector(groups))
        elif i % 10:
            n, k = rng.randrange(args.nodes), rng.randrange(args.pods_per_node)
            store.patch(PODS, f"p-{n}-{k}", {"metadata": {"labels": {"rev": f"{salt}-{i}"}}}, "app")
        else:
            g = rng.randrange(args.groups)
            store.patch(ADDRESSGROUPS, f"g{g}-0", {"members": address_group(f"g{g}", 20 + salt * 7 + i % 7)["members"]})
    return time.perf_counter() - start


def run(args: argparse.Namespace, design: str) -> dict[str, Any]:
    store = cluster(args)
    write(store, args, 0, {})  # warm-up
    baseline = write(store, args, 1, {})  # the same writes without virtual watches
    agents = register(store, args, design)
    seconds = write(store, args, 2, agents)
    totals = store.virtual_watches.totals()
    changes = list(store._history)[-args.writes :]
    start = time.perf_counter()
    for change in changes:
        store.virtual_watches.count(change)
    counting = time.perf_counter() - start
    return {
        "design": design,
        "virtual_watches": sum(t["watches"] for t in totals.values()),
        "bytes": {plural: t["bytes"] for plural, t in totals.items()},
        "events": {plural: t["events"] for plural, t in totals.items()},
        "writes_per_s_without": round(args.writes / baseline),
        "writes_per_s_with": round(args.writes / seconds),
        "counted_events_per_s": round(len(changes) / counting),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=4)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--groups-per-node", type=int, default=20)
    parser.add_argument("--writes", type=int, default=2000)
    args = parser.parse_args()
    results = [run(args, design) for design in ("issue-35", "all-pods")]
    for r in results:
        print(
            f"{r['design']:>9}: {r['virtual_watches']} virtual watches; writes/s {r['writes_per_s_without']} without,"
            f" {r['writes_per_s_with']} with; counting alone {r['counted_events_per_s']} events/s;"
            f" bytes {r['bytes']}"
        )
    print(json.dumps({"nodes": args.nodes, "writes": args.writes, "results": results}))


if __name__ == "__main__":
    main()
