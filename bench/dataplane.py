"""Per-pod dataplane setup and teardown latency: flock's netlink worker versus
Debian's reference plugins ``ptp`` + ``host-local``, in the same run.

Everything happens inside a "node" network namespace this script creates (it
re-executes itself there with ``ip netns exec``), with one fresh namespace per
pod.  For each family (IPv4 only, dual stack) and each parallelism N, every
round creates N pod namespaces, sets all N up concurrently, then tears all N
down concurrently; each operation's latency is one sample.

- flock: ``NetlinkWorker.setup`` / ``teardown`` called in process (the
  dataplane alone: the shim exec + RPC is issue 2's figure, IPAM issue 3's).
- ptp: ``/usr/lib/cni/ptp`` exec'd as a runtime does, CNI_* environment and
  the network configuration on stdin, host-local IPAM in a temporary dataDir.

Prints a human summary, then the figures as a final JSON line.

    python bench/dataplane.py [--parallel 1,10] [--rounds 20,5]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import tempfile
import time

import trio
from stats import parallel_rounds, rerun_in_node_namespace, summary  # bench/stats.py

from flock.model import Allocation
from flock.netlink import NetlinkWorker
from flock.testing.netns import netns_pool

PLUGIN_DIR = "/usr/lib/cni"
V4_NET = ipaddress.ip_network("198.51.100.0/24")
V6_NET = ipaddress.ip_network("2001:db8:1::/64")


class Flock:
    name = "flock"

    def __init__(self, worker: NetlinkWorker) -> None:
        self.worker = worker

    async def add(self, cid: str, netns: str, k: int, dual: bool) -> None:
        ip4 = V4_NET.network_address + k
        ip6 = V6_NET.network_address + k if dual else None
        await self.worker.setup(Allocation(cid, "bench", cid, cid, "eth0", netns, ip6=ip6, ip4=ip4))

    async def delete(self, cid: str, netns: str) -> None:
        await self.worker.teardown(cid, netns, "eth0")


class Ptp:
    name = "ptp"

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.results: dict[str, dict] = {}

    def config(self, dual: bool, prev: dict | None = None) -> bytes:
        ranges = [[{"subnet": str(V4_NET)}]] + ([[{"subnet": str(V6_NET)}]] if dual else [])
        conf = {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "ptp",
            "ipMasq": False,
            "ipam": {"type": "host-local", "dataDir": self.data_dir, "ranges": ranges},
        }
        if prev is not None:
            conf["prevResult"] = prev
        return json.dumps(conf).encode()

    async def _exec(self, command: str, cid: str, netns: str, stdin: bytes) -> bytes:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": PLUGIN_DIR,
            "CNI_ARGS": "",
        }
        proc = await trio.run_process([f"{PLUGIN_DIR}/ptp"], stdin=stdin, env=env, capture_stdout=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ptp {command} {cid}: exit {proc.returncode}: {proc.stdout.decode()[:300]}")
        return proc.stdout

    async def add(self, cid: str, netns: str, k: int, dual: bool) -> None:
        out = await self._exec("ADD", cid, netns, self.config(dual))
        self.results[cid] = (dual, json.loads(out))

    async def delete(self, cid: str, netns: str) -> None:
        dual, prev = self.results.pop(cid)
        await self._exec("DEL", cid, netns, self.config(dual, prev))


async def measure(impl, pool, n: int, rounds: int, dual: bool, seq: list[int]) -> dict:
    setup, teardown = [], []
    for _ in range(rounds):
        pods = [pool.create("pod") for _ in range(n)]
        ids = []
        for _pod in pods:
            seq[0] += 1
            ids.append(f"{impl.name}-{seq[0]}")

        async def timed(samples, fn, *args):
            t0 = time.perf_counter()
            await fn(*args)
            samples.append((time.perf_counter() - t0) * 1000)

        async with trio.open_nursery() as nursery:
            for i, pod in enumerate(pods):
                nursery.start_soon(timed, setup, impl.add, ids[i], pod.path, (seq[0] - n + i) % 250 + 2, dual)
        async with trio.open_nursery() as nursery:
            for i, pod in enumerate(pods):
                nursery.start_soon(timed, teardown, impl.delete, ids[i], pod.path)
        for pod in pods:
            pool.delete(pod)
    return {"setup_ms": summary(setup), "teardown_ms": summary(teardown)}


async def inside(parallel: list[int], rounds: list[int]) -> dict:
    worker = NetlinkWorker()
    await worker.prepare_node(uplink="uplink")
    results: dict = {}
    seq = [0]
    with netns_pool("fl-bench-") as pool, tempfile.TemporaryDirectory(prefix="fl-bench-ipam-") as data_dir:
        impls = [Flock(worker), Ptp(data_dir)]
        for family, dual in (("v4", False), ("dual", True)):
            for n, r in zip(parallel, rounds, strict=True):
                for impl in impls:
                    fig = await measure(impl, pool, n, r, dual, seq)
                    results.setdefault(impl.name, {}).setdefault(family, {})[f"N={n}"] = fig
                    print(
                        f"{impl.name:5} {family:4} N={n:<3} setup median {fig['setup_ms']['median']:8.2f} ms  "
                        f"p99 {fig['setup_ms']['p99']:8.2f} ms | teardown median {fig['teardown_ms']['median']:7.2f} ms  "
                        f"p99 {fig['teardown_ms']['p99']:7.2f} ms  ({fig['setup_ms']['n']} pods)",
                        flush=True,
                    )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="1,10", help="comma-separated pod counts set up concurrently")
    ap.add_argument("--rounds", default="20,5", help="rounds per parallelism, same order")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    parallel, rounds = parallel_rounds(ap, args)
    if args.inside:
        results = trio.run(inside, parallel, rounds)
        print(json.dumps({"bench": "dataplane", "parallel": parallel, "rounds": rounds, "results": results}))
        return
    sys.exit(rerun_in_node_namespace(__file__, ["--parallel", args.parallel, "--rounds", args.rounds]))


if __name__ == "__main__":
    main()
