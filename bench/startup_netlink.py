"""The netlink reads of an agent's start-up, on a node namespace with --pods pod veths.

A namespace of its own stands for the node: --pods flock veths (peers in a
second namespace), each with fe80::1 and a flock /128 route, and the two
node-block blackholes — what a node with that many pods has.  Timed (wall and
process CPU, best of --rounds), with nothing to change: what a restart pays
when the kernel already matches the store.

``--before DIR`` also times the flock checkout in DIR (a child process with
PYTHONPATH=DIR), in turn with this one.

    python bench/startup_netlink.py [--pods 250] [--rounds 5] [--before DIR]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import subprocess
import sys
import time

import trio

NODE_BLOCKS = (ipaddress.ip_network("2001:db8:0:1::/64"), ipaddress.ip_network("198.51.100.0/26"))


def make_node(pods: int) -> tuple[str, str]:
    node, peers = f"fl-sn-{secrets.token_hex(3)}", f"fl-sp-{secrets.token_hex(3)}"
    for ns in (node, peers):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    from flock.netlink import host_ifname

    lines = []
    for i in range(pods):
        name = host_ifname(f"c{i}")
        lines += [
            f"link add {name} type veth peer name p{i} netns {peers}",
            f"link set {name} alias flock:c{i}",
            f"link set {name} up",
            f"addr add fe80::1/64 dev {name} nodad",
            f"route add 2001:db8:0:1::{i + 1:x}/128 dev {name} proto 70",
        ]
    lines += [f"route add blackhole {net} proto 70" for net in NODE_BLOCKS]
    subprocess.run(["ip", "-n", node, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)
    return node, peers


async def measure(node: str, pods: int, rounds: int) -> dict[str, dict[str, float]]:
    from flock.netlink import NetlinkWorker

    worker = NetlinkWorker(host_netns=f"/run/netns/{node}")
    explained = [f"c{i}" for i in range(pods)]
    reads = {
        "cleanup": lambda: worker.cleanup(explained),
        "ensure_blackholes": lambda: worker.ensure_blackholes(NODE_BLOCKS),
        "node_addresses": worker.node_addresses,
        "ensure_anycast (no anycast pod)": lambda: worker.ensure_anycast([]),
    }
    out = {}
    for name, call in reads.items():
        walls, cpus = [], []
        for _ in range(rounds):
            t, c = time.perf_counter(), time.process_time()
            await call()
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        out[name] = {"wall_ms": round(min(walls) * 1000, 1), "cpu_ms": round(min(cpus) * 1000, 1)}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=250)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", metavar="DIR")
    p.add_argument("--node", help=argparse.SUPPRESS)  # the child's: measure in this namespace
    args = p.parse_args()
    if args.node:
        print(json.dumps(trio.run(measure, args.node, args.pods, args.rounds)))
        return
    node, peers = make_node(args.pods)
    try:
        doc = {}
        sources = {"this": None, **({"before": os.path.abspath(args.before)} if args.before else {})}
        for label, source in sources.items():
            env = {**os.environ, **({"PYTHONPATH": source} if source else {})}
            argv = [sys.executable, "-P", __file__, "--node", node, "--pods", str(args.pods)]
            child = subprocess.run(
                [*argv, "--rounds", str(args.rounds)], env=env, capture_output=True, text=True, check=True, cwd="/"
            )
            doc[label] = json.loads(child.stdout)
        for name in doc["this"]:
            print(name, {label: figures[name] for label, figures in doc.items()}, flush=True)
        print(json.dumps({"pods": args.pods, **doc}, separators=(",", ":")))
    finally:
        for ns in (node, peers):
            subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    main()
