"""What a change of the fabric's ECMP set does to flows already going (issue 34), on a three-node lab
with the internet (``flock-lab up --nodes 3 --internet``):

An eTP Local Service (UDP, one pod per node that has one, so the pod that answers names the node the
fabric chose) gets FLOWS flows from the internet, each a UDP socket of its own source port.  Then the
fabric's set for the address changes — a node joins (a pod added on node3), a node leaves (that pod
unready) — and every flow sends again.  A flow answered by another pod than before went to another
node: for TCP that node has no connection-tracking entry and the connection is lost.

- ``moved_needed``: flows that had to move (onto the node that joined; off the node that left);
- ``moved_collateral``: flows between two nodes that are in the set before and after — the fabric's
  kernel hashes into equal regions (hash-threshold), so a set of N+1 shifts every region's boundary.

    python bench/lab_ecmp.py [--flows 300]
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import trio

from flock.apiserver import SERVICES
from flock.lab import LabPlan, PortSpec, api_client, down, fabric_routes, pod_add, pod_ready, socket_in, up

ADDRESS = "2001:db8:ee::60"
PORT = 53
UDP = (PortSpec(5353, "UDP"),)


async def forwarding(plan: LabPlan) -> set[str]:
    for route in await fabric_routes(plan.fabric_dir / "bird.ctl"):
        if str(route.prefix) == f"{ADDRESS}/128":
            return {p.source for p in route.forwarding}
    return set()


async def until_forwarding(plan: LabPlan, nodes: set[str]) -> None:
    with trio.fail_after(20):
        while await forwarding(plan) != nodes:  # noqa: ASYNC110  BIRD's routes: nothing to wait on
            await trio.sleep(0.05)
    await trio.sleep(0.5)  # the fabric's kernel has the route BIRD has by now


async def ask(socks: list[trio.socket.SocketType]) -> list[str]:
    """Each flow's answerer ("" when none answered within a second)."""
    out = [""] * len(socks)

    async def one(i: int) -> None:
        token = secrets.token_bytes(8)
        with trio.move_on_after(1.0):
            await socks[i].send(token)
            answer = await socks[i].recv(4096)
            out[i] = answer[len(token) + 1 :].decode().splitlines()[0]

    async with trio.open_nursery() as nursery:
        for i in range(len(socks)):
            nursery.start_soon(one, i)
    return out


def node_of(pod: str) -> str:
    return "node" + pod.rsplit("-", 1)[1] if pod else ""


def compare(before: list[str], after: list[str], kept: set[str]) -> dict[str, Any]:
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    collateral = [m for m in moved if node_of(m[0]) in kept and node_of(m[1]) in kept]
    return {
        "flows": len(before),
        "moved": len(moved),
        "moved_needed": len(moved) - len(collateral),
        "moved_collateral": len(collateral),
        "unanswered": sum(1 for a in after if not a),
    }


async def run(flows: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="flab-e-", dir="/run"))  # short: unix socket paths
    try:
        plan = LabPlan.make(directory, 3, internet=True)
        await up(plan)
        for i in (1, 2):
            await pod_add(plan, f"node{i}", f"shop/e-{i}", labels={"app": "e"}, ports=UDP)
        svc = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "e",
                "namespace": "shop",
                "annotations": {"flock.fritzlab.net/loadBalancerIPs": ADDRESS},
            },
            "spec": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Local",
                "ipFamilyPolicy": "SingleStack",
                "ipFamilies": ["IPv6"],
                "selector": {"app": "e"},
                "ports": [{"name": "dns", "port": PORT, "targetPort": 5353, "protocol": "UDP"}],
            },
        }
        await api_client(plan).create(SERVICES, svc)
        await until_forwarding(plan, {"node1", "node2"})
        assert plan.internet_netns is not None
        socks = []
        for _ in range(flows):
            raw = await trio.to_thread.run_sync(socket_in, plan.internet_netns, socket.AF_INET6, socket.SOCK_DGRAM)
            sock = trio.socket.from_stdlib_socket(raw)
            await sock.connect((ADDRESS, PORT))
            socks.append(sock)
        before = await ask(socks)
        await pod_add(plan, "node3", "shop/e-3", labels={"app": "e"}, ports=UDP)
        await until_forwarding(plan, {"node1", "node2", "node3"})
        joined = await ask(socks)
        await pod_ready(plan, "shop/e-3", False)
        await until_forwarding(plan, {"node1", "node2"})
        left = await ask(socks)
        print(
            json.dumps(
                {
                    "bench": "lab_ecmp",
                    "spread_before": {n: before.count(n) for n in sorted(set(before))},
                    "node3_joins": compare(before, joined, {"node1", "node2"}),
                    "node3_leaves": compare(joined, left, {"node1", "node2"}),
                },
                separators=(",", ":"),
            ),
            flush=True,
        )
        for sock in socks:
            sock.close()
    finally:
        await down(directory)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flows", type=int, default=300)
    trio.run(run, ap.parse_args().flows)
