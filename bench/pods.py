"""A pod's whole CNI ADD and DEL as the runtime sees them: the bundled ``flock``
plugin → flock-agent (pod lookup, IPAM, SQLite pending/commit with
synchronous=FULL, netlink) versus Debian's ``ptp`` + ``host-local``, in one run.

Everything happens inside a "node" network namespace this script creates (it
re-executes itself there), with one fresh namespace per pod.  flock-agent runs
as a real process against the flock/testing API server (no BIRD).  For each
parallelism N, every round creates N pod namespaces, ADDs all N concurrently
(one plugin exec each), then DELs all N; each exec's wall time is one sample.
The agent's own time per request (from its /metrics) is reported beside it.

Prints a human summary, then the figures as a final JSON line.

    python bench/pods.py [--parallel 1,10] [--rounds 20,5]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from flock.shim_bundle import build_shim
from flock.testing import NODECONFIGS, PODS, ApiServer, nodeconfig_object, pod_object
from flock.testing.netns import netns_pool

PLUGIN_DIR = "/usr/lib/cni"
BIN = Path(sys.executable).parent
NODE = "bench"
V4_NET, V6_NET = "198.51.100.0/24", "2001:db8:1::/64"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(samples: list[float]) -> dict:
    return {"median": round(statistics.median(samples), 2), "p99": round(percentile(samples, 0.99), 2), "n": len(samples)}


def run(argv: list[str], command: str, cid: str, netns: str, config: dict, args: str = "") -> float:
    env = {"PATH": "/usr/bin:/bin", "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": netns,
           "CNI_IFNAME": "eth0", "CNI_PATH": PLUGIN_DIR, "CNI_ARGS": args}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, input=json.dumps(config).encode(), env=env, capture_output=True)
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} {command} {cid}: exit {proc.returncode}: {proc.stdout.decode()[:300]}")
    return elapsed


class Flock:
    name = "flock"

    def __init__(self, plugin: list[str], socket: Path) -> None:
        self.plugin, self.socket = plugin, socket

    def op(self, command: str, cid: str, netns: str) -> float:
        config = {"cniVersion": "1.1.0", "name": "flock-net", "type": "flock", "socket": str(self.socket)}
        return run(self.plugin, command, cid, netns, config, f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME={cid}")


class Ptp:
    name = "ptp"

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir

    def op(self, command: str, cid: str, netns: str) -> float:
        config = {"cniVersion": "1.0.0", "name": "bench", "type": "ptp", "ipMasq": False,
                  "ipam": {"type": "host-local", "dataDir": self.data_dir, "ranges": [[{"subnet": V6_NET}]]}}
        return run([f"{PLUGIN_DIR}/ptp"], command, cid, netns, config)


def measure(impl, pool, api: ApiServer, n: int, rounds: int, seq: list[int]) -> dict:
    add, delete = [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as threads:
        for _ in range(rounds):
            pods = []
            for _ in range(n):
                seq[0] += 1
                cid = f"{impl.name}-{seq[0]}"
                api.create(PODS, pod_object("bench", cid, NODE))
                pods.append((cid, pool.create("pod")))
            add += threads.map(lambda p: impl.op("ADD", p[0], p[1].path), pods)
            delete += threads.map(lambda p: impl.op("DEL", p[0], p[1].path), pods)
            for _cid, ns in pods:
                pool.delete(ns)
    return {"add_ms": summary(add), "del_ms": summary(delete)}


def agent_seconds(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out = {}
    for op in ("ADD", "DEL"):
        total = float(re.search(rf'flock_cni_request_duration_seconds_sum{{op="{op}"}} (\S+)', text).group(1))
        count = float(re.search(rf'flock_cni_request_duration_seconds_count{{op="{op}"}} (\S+)', text).group(1))
        out[f"agent_{op.lower()}_mean_ms"] = round(total / count * 1000, 2)
    return out


def wait_ready(agent: subprocess.Popen, log: Path) -> int:
    """The agent's health port once /readyz answers 200."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and agent.poll() is None:
        ports = [int(json.loads(line)["address"].rsplit(":", 1)[1])
                 for line in log.read_text().splitlines() if '"health server listening"' in line]
        if ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/readyz", timeout=5):
                    return ports[-1]
            except OSError:  # 503 (HTTPError) or not listening yet
                pass
        time.sleep(0.1)
    raise RuntimeError("flock-agent did not become ready:\n" + log.read_text()[-2000:])


def inside(parallel: list[int], rounds: list[int]) -> dict:
    results: dict = {}
    seq = [0]
    with tempfile.TemporaryDirectory(prefix="fl-bench-pods-") as tmp, netns_pool("fl-bench-") as pool, ApiServer() as api:
        work = Path(tmp)
        api.create(NODECONFIGS, nodeconfig_object(NODE, V6_NET))
        api.write_kubeconfig(work / "kubeconfig")
        plugin = [str(work / "flock")]
        build_shim(work / "flock")
        socket = work / "run" / "flock.sock"
        log = open(work / "agent.log", "wb")
        agent = subprocess.Popen(
            [str(BIN / "flock-agent"), "--node", NODE, "--socket", str(socket), "--state-dir", str(work / "state"),
             "--kubeconfig", str(work / "kubeconfig"), "--health-address", "127.0.0.1:0", "--no-bird", "--uplink", "uplink"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            port = wait_ready(agent, work / "agent.log")
            impls = [Flock(plugin, socket), Ptp(str(work / "host-local"))]
            for n, r in zip(parallel, rounds):
                for impl in impls:
                    fig = measure(impl, pool, api, n, r, seq)
                    results.setdefault(impl.name, {})[f"N={n}"] = fig
                    print(f"{impl.name:5} N={n:<3} ADD median {fig['add_ms']['median']:8.2f} ms  p99 {fig['add_ms']['p99']:8.2f} ms | "
                          f"DEL median {fig['del_ms']['median']:7.2f} ms  p99 {fig['del_ms']['p99']:7.2f} ms  ({fig['add_ms']['n']} pods)",
                          flush=True)
            results["flock"].update(agent_seconds(port))
            print(f"flock-agent's own time per request (all N): {results['flock']['agent_add_mean_ms']} ms ADD, "
                  f"{results['flock']['agent_del_mean_ms']} ms DEL (mean)", flush=True)
        finally:
            agent.terminate()
            agent.wait(timeout=10)
            log.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="1,10", help="comma-separated pod counts ADDed concurrently")
    ap.add_argument("--rounds", default="20,5", help="rounds per parallelism, same order")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    parallel = [int(x) for x in args.parallel.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    if len(parallel) != len(rounds):
        ap.error("--parallel and --rounds need the same number of entries")
    if args.inside:
        results = inside(parallel, rounds)
        print(json.dumps({"bench": "pods", "parallel": parallel, "rounds": rounds, "results": results}))
        return
    with netns_pool("fl-bench-") as pool:
        node, up = pool.create("node"), pool.create("up")
        pool.veth(node, "uplink", up, "eth0")
        node.ip("addr", "add", "192.0.2.1/24", "dev", "uplink")
        cmd = ["ip", "netns", "exec", node.name, sys.executable, os.path.abspath(__file__), "--inside",
               "--parallel", args.parallel, "--rounds", args.rounds]
        proc = subprocess.run(cmd)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
