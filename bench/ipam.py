"""IPAM and store throughput.

Allocations per second for IPv6 in a /64 (random identifiers and an ip-algo
layout), and for an IPv4 /16 filled to 99%: the rate over the first 1% and
over the last 1% (98%→99%), so a rescan-from-the-start allocator would show
as a collapse.  A naive rescanning allocator runs on the same last 1% as the
baseline.  Then churn at 99% full (release a random address, allocate), and
the store's put+commit rate (one transaction each).

    .venv/bin/python bench/ipam.py            # prints figures, then one JSON line

Each figure is the best of ``--repeat`` runs (different seeds).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import random
import tempfile
import time

from flock.ipam import Allocator, PodIdentity, PodRequest, parse_layout
from flock.model import Allocation, NodeConfig
from flock.store import SyncStore

NODE = NodeConfig.from_object(
    {
        "metadata": {"name": "bench"},
        "spec": {"cidr6": "2001:db8:0:1::/64", "cidr4": "198.18.0.0/16"},
    }
)
# 198.18.0.0/15 is the benchmarking range (RFC 2544); nothing here touches a network.
CIDR4 = ipaddress.IPv4Network("198.18.0.0/16")


def identity(i: int) -> PodIdentity:
    return PodIdentity(namespace=f"ns{i % 10}", app=f"app{i % 100}", image="nginx:1", pod=f"pod-{i}", node="bench")


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds else float("inf")


def bench_v6(count: int, layout: str | None, seed: int) -> float:
    alloc = Allocator(random.Random(seed))
    request = PodRequest(cidr6=NODE.cidr6, cidr4=None, layout=parse_layout(layout) if layout else None)
    idents = [identity(i) for i in range(count)]
    start = time.perf_counter()
    for i in range(count):
        alloc.allocate(f"c{i}", request, idents[i])
    return rate(count, time.perf_counter() - start)


def bench_v4_fill(seed: int) -> dict:
    alloc = Allocator(random.Random(seed))
    request = PodRequest(cidr6=None, cidr4=CIDR4)
    ident = identity(0)
    usable = CIDR4.num_addresses - 3
    one_pct = usable // 100
    target = usable * 99 // 100
    marks = {}
    start = time.perf_counter()
    for i in range(target):
        if i == one_pct:
            marks["first"] = time.perf_counter() - start
        if i == target - one_pct:
            marks["before_last"] = time.perf_counter()
        alloc.allocate(f"c{i}", request, ident)
    total = time.perf_counter() - start
    last = time.perf_counter() - marks["before_last"]

    # churn at 99%: free a random held address, allocate again
    rng = random.Random(seed)
    live = list(range(target))
    churn = 5000
    start = time.perf_counter()
    for j in range(churn):
        k = rng.randrange(len(live))
        alloc.release(f"c{live[k]}")
        live[k] = target + j
        alloc.allocate(f"c{target + j}", request, ident)
    churn_rate = rate(churn, time.perf_counter() - start)
    return {
        "usable": usable,
        "filled": target,
        "first_1pct_per_s": rate(one_pct, marks["first"]),
        "last_1pct_per_s": rate(one_pct, last),
        "whole_fill_per_s": rate(target, total),
        "churn_at_99pct_per_s": churn_rate,
        "one_pct": one_pct,
    }


def bench_v4_naive_last_pct() -> float:
    """Baseline: lowest free by scanning from the start every time."""
    usable = CIDR4.num_addresses - 3
    one_pct = usable // 100
    first = int(CIDR4.network_address) + 2
    taken = set(range(first, first + usable * 99 // 100 - one_pct))
    start = time.perf_counter()
    for _ in range(one_pct):
        addr = first
        while addr in taken:
            addr += 1
        taken.add(addr)
    return rate(one_pct, time.perf_counter() - start)


def bench_store(count: int) -> float:
    with tempfile.TemporaryDirectory() as state_dir:
        store = SyncStore.open(state_dir)
        start = time.perf_counter()
        for i in range(count):
            cid = f"c{i:08d}"
            store.put(
                Allocation(
                    cid,
                    "prod",
                    f"pod-{i}",
                    f"uid-{i}",
                    "eth0",
                    f"/var/run/netns/{cid}",
                    ip6=ipaddress.IPv6Address(int(NODE.cidr6.network_address) + i + 1),
                    created=float(i),
                )
            )
            store.commit(cid, now=float(i))
        seconds = time.perf_counter() - start
        store.close()
    return rate(count, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--v6-count", type=int, default=100_000)
    parser.add_argument("--store-count", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per figure (noise on a shared machine)")
    args = parser.parse_args()
    seeds = range(args.seed, args.seed + args.repeat)
    fills = [bench_v4_fill(seed) for seed in seeds]

    out = {
        "v6_random_64_per_s": max(bench_v6(args.v6_count, None, seed) for seed in seeds),
        "v6_ip_algo_64_per_s": max(bench_v6(args.v6_count, "namespace:16,app:16,random:32", seed) for seed in seeds),
        "v4_16": {key: max(f[key] for f in fills) for key in fills[0]},
        "v4_16_naive_rescan_last_1pct_per_s": bench_v4_naive_last_pct(),
        "store_put_commit_per_s": max(bench_store(args.store_count) for _ in seeds),
        "v6_count": args.v6_count,
        "store_count": args.store_count,
        "repeat": args.repeat,
    }
    v4 = out["v4_16"]
    print(f"IPv6 /64 random      {out['v6_random_64_per_s']:>12,.0f} allocations/s")
    print(f"IPv6 /64 ip-algo     {out['v6_ip_algo_64_per_s']:>12,.0f} allocations/s")
    print(f"IPv4 /16 first 1%    {v4['first_1pct_per_s']:>12,.0f} allocations/s")
    print(
        f"IPv4 /16 last 1%     {v4['last_1pct_per_s']:>12,.0f} allocations/s  (naive rescan: {out['v4_16_naive_rescan_last_1pct_per_s']:,.0f})"
    )
    print(f"IPv4 /16 churn @99%  {v4['churn_at_99pct_per_s']:>12,.0f} release+allocate/s")
    print(f"store put+commit     {out['store_put_commit_per_s']:>12,.0f} rows/s")
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
