"""LoadBalancer Services from outside (issue 34), on a three-node flock-lab with its internet:

- allocation: a LoadBalancer Service created → flock-controller wrote its addresses (watches) →
  the fabric's BIRD forwards its IPv6 address to every node (the agents announce it);
- readiness: the only endpoint on node2 of an eTP Local Service turned unready (as a readiness probe
  would) → node2 out of the fabric's ECMP set; and back;
- cordon: ``spec.unschedulable`` set on node1 → node1 out of the ECMP set (the graceful-shutdown
  community, local preference 0) → its path withdrawn (``--bgp-leave-seconds=2``);
- streams: 50 connections a second from the internet across a rolling restart (eTP Cluster and
  Local: every pod replaced on another node) and across a cordon-and-drain of node1, each counted
  answered / refused / lost.

The fabric's table is read every 20 ms with birdc, so times carry up to ~20 ms plus a birdc round
trip of observation delay.

    python bench/lab_loadbalancer.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from labkit import emit, stats_ms

from flock.apiserver import NODES, SERVICES
from flock.lab import LabPlan, api_client, down, pod_add, pod_del, pod_ready, up
from flock.lab._plan import INTERNET
from flock.lab._pods import load_pods
from flock.lab._ports import PortSpec
from flock.lab._probe import Endpoint, endpoint_for
from flock.lab._routes import fabric_routes
from flock.lab._stream import stream_between

POLL_S = 0.02
HTTP = PortSpec(80, "TCP")
WEB = [PortSpec.parse("http=8080/TCP")]


@contextlib.asynccontextmanager
async def internet_lab() -> AsyncIterator[LabPlan]:
    directory = Path(tempfile.mkdtemp(prefix="flab-lb-", dir="/run"))
    plan = LabPlan.make(directory, 3, internet=True)
    try:
        await up(plan)
        yield plan
    finally:
        with trio.CancelScope(shield=True):
            await down(directory)
        shutil.rmtree(directory, ignore_errors=True)


async def forwarding(plan: LabPlan, prefix: str) -> set[str]:
    for route in await fabric_routes(plan.fabric_dir / "bird.ctl"):
        if str(route.prefix) == prefix:
            return {p.source for p in route.forwarding}
    return set()


async def announcing(plan: LabPlan, prefix: str) -> set[str]:
    """Every node with a path to *prefix* in the fabric's table (forwarded over or not)."""
    for route in await fabric_routes(plan.fabric_dir / "bird.ctl"):
        if str(route.prefix) == prefix:
            return {p.source for p in route.paths}
    return set()


async def until_forwarding(plan: LabPlan, prefix: str, nodes: set[str], limit: float = 30.0) -> float:
    start = time.perf_counter()
    with trio.fail_after(limit):
        while await forwarding(plan, prefix) != nodes:  # noqa: ASYNC110  BIRD's routes: nothing to wait on
            await trio.sleep(POLL_S)
    return time.perf_counter() - start


def lb(name: str, app: str, etp: str = "Cluster") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "type": "LoadBalancer",
            "externalTrafficPolicy": etp,
            "ipFamilyPolicy": "RequireDualStack",
            "ipFamilies": ["IPv6", "IPv4"],
            "selector": {"app": app},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


async def v6_of(plan: LabPlan, name: str) -> str:
    api = api_client(plan)
    with trio.fail_after(30):
        while True:
            got = await api.get(SERVICES, name, "shop")
            for ingress in ((got.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
                if ":" in ingress["ip"]:
                    return str(ingress["ip"])
            await trio.sleep(POLL_S)


async def add(plan: LabPlan, node: str, key: str, app: str) -> None:
    await pod_add(plan, node, key, labels={"app": app}, ports=WEB)


async def streamed(plan: LabPlan, address: str, change: Any) -> dict[str, Any]:
    src = endpoint_for(plan, INTERNET, load_pods(plan), source=True)
    done = trio.Event()
    out: list[Any] = []

    async def run() -> None:
        out.append(await stream_between(src, Endpoint(address, None, (address,)), HTTP, 6, rate=50, until=done))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.sleep(1)
        await change()
        await trio.sleep(3)
        done.set()
    result = out[0].to_json()
    return {k: result[k] for k in ("started", "answered", "refused", "lost")}


async def main(rounds: int) -> None:
    async with internet_lab() as plan:
        api = api_client(plan)
        nodes = [n.name for n in plan.nodes]
        every = set(nodes)
        for i, node in enumerate(nodes, 1):
            await add(plan, node, f"shop/web-{i}", "web")

        # allocation → the fabric forwards to every node
        allocation, announce = [], []
        for r in range(rounds):
            name = f"alloc-{r}"
            start = time.perf_counter()
            await api.create(SERVICES, lb(name, "web"))
            address = await v6_of(plan, name)
            allocation.append(time.perf_counter() - start)
            announce.append(allocation[-1] + await until_forwarding(plan, f"{address}/128", every))
            await api.delete(SERVICES, name, "shop")
            await until_forwarding(plan, f"{address}/128", set())  # withdrawn before the next round reuses it
        emit({"what": "LoadBalancer Service created → addresses written (flock-controller)", **stats_ms(allocation)})
        emit({"what": "LoadBalancer Service created → the fabric forwards to every node", **stats_ms(announce)})

        # eTP Local readiness flip
        await add(plan, "node1", "shop/loc-1", "loc")
        await add(plan, "node2", "shop/loc-2", "loc")
        await api.create(SERVICES, lb("loc", "loc", "Local"))
        prefix = f"{await v6_of(plan, 'loc')}/128"
        await until_forwarding(plan, prefix, {"node1", "node2"})
        off, on = [], []
        for _ in range(rounds):
            await pod_ready(plan, "shop/loc-2", False)
            off.append(await until_forwarding(plan, prefix, {"node1"}))
            await pod_ready(plan, "shop/loc-2", True)
            on.append(await until_forwarding(plan, prefix, {"node1", "node2"}))
        emit({"what": "eTP Local: endpoint unready → node off the fabric's ECMP set", **stats_ms(off)})
        emit({"what": "eTP Local: endpoint ready again → node back in the ECMP set", **stats_ms(on)})

        # cordon: out of the ECMP set at once (graceful shutdown), withdrawn after --bgp-leave-seconds
        await api.create(SERVICES, lb("cordon", "web"))
        prefix = f"{await v6_of(plan, 'cordon')}/128"
        await until_forwarding(plan, prefix, every)
        out_of_ecmp, withdrawn = [], []
        for _ in range(rounds):
            node = await api.get(NODES, "node1")
            node.setdefault("spec", {})["unschedulable"] = True
            await api.update(NODES, node)
            start = time.perf_counter()
            await until_forwarding(plan, prefix, every - {"node1"})
            out_of_ecmp.append(time.perf_counter() - start)
            with trio.fail_after(30):
                while "node1" in await announcing(plan, prefix):  # noqa: ASYNC110  BIRD's routes
                    await trio.sleep(POLL_S)
            withdrawn.append(time.perf_counter() - start)
            node = await api.get(NODES, "node1")
            node["spec"]["unschedulable"] = False
            await api.update(NODES, node)
            await until_forwarding(plan, prefix, every)
        emit({"what": "cordon → node out of the ECMP set (graceful shutdown community)", **stats_ms(out_of_ecmp)})
        emit({"what": "cordon → node's path withdrawn (--bgp-leave-seconds=2)", **stats_ms(withdrawn)})

        # streams across a rolling restart (Cluster, Local) and a drain
        for etp in ("Cluster", "Local"):
            app = f"roll-{etp.lower()}"
            for i, node in enumerate(nodes, 1):
                await add(plan, node, f"shop/{app}-{i}", app)
            await api.create(SERVICES, lb(app, app, etp))
            address = await v6_of(plan, app)
            await until_forwarding(plan, f"{address}/128", every)

            async def roll(app: str = app) -> None:
                for i in range(1, len(nodes) + 1):
                    await add(plan, nodes[i % len(nodes)], f"shop/{app}-r{i}", app)
                    await pod_del(plan, f"shop/{app}-{i}", 2)

            emit(
                {
                    "what": f"rolling restart under 50 conn/s from the internet, eTP {etp}",
                    **await streamed(plan, address, roll),
                }
            )

        async def drain() -> None:
            node = await api.get(NODES, "node1")
            node.setdefault("spec", {})["unschedulable"] = True
            await api.update(NODES, node)
            await trio.sleep(2.5)
            await pod_del(plan, "shop/web-1", 2)

        address = prefix.split("/")[0]
        emit(
            {
                "what": "node1 cordoned and drained under 50 conn/s from the internet (eTP Cluster)",
                **await streamed(plan, address, drain),
            }
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    trio.run(main, p.parse_args().rounds)
