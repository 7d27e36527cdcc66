"""The service proxy at 10 and at 10,000 Services × 10 endpoints (issue 33: cost in proportion to the change).

One run, per size, in namespaces the bench makes itself (flock.testing.policy_net's node, a client
pod, a backend pod; the host is never touched), the real :class:`ServiceProxy` loop with the real
libnftables backend in the node namespace:

- start → programmed: the proxy started with every Service and EndpointSlice listed, on a node without
  the table (a first start: the skeleton, then 500 Services a transaction), until the last
  transaction returns;
- endpoint change → in the kernel: ``inputs.set`` of one Service's EndpointSlice with one endpoint
  turned unready (or ready again), until the proxy's transaction returns (p50, p99);
- first connection: a new TCP connection from the client pod to a ClusterIP (connect and the first
  byte of the backend's answer), many times; the probed Service's 10 endpoints are 10 addresses of
  the backend pod, every other Service's endpoints are addresses nobody answers on.  Every size's
  node stays up until the end, and the sizes' clients take turns in batches of 25 connections, so
  the machine's drift falls on each size alike;
- RSS added: a fresh interpreter (``--rss-child N``) reads VmRSS after its imports, then after the
  inputs (values made from JSON objects through ``from_object``, as the watcher makes them) and
  then the engine are built, each after ``gc.collect()`` and glibc's ``malloc_trim(0)``.

ClusterIPs in fd00:10:96::/108, endpoints in 2001:db8::/32, IPv6 only (the dual-stack paths cost
per Service what the IPv6 one does, twice).

    sudo .venv/bin/python bench/services.py --sizes 10,10000 --flips 300 --connections 400
    # figures, then one JSON line; --json: the JSON line only
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import ipaddress
import json
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import attrs
import trio
from stats import summary

from flock.policy._backend import LibNftables, _malloc_trim
from flock.services import EndpointSlice, NodeView, Service, ServiceInputs, ServiceProxy, ServicesConfig
from flock.services._engine import ServicesEngine
from flock.services._inputs import ENDPOINT_SLICES, SERVICES
from flock.testing import services as objects
from flock.testing.netns import netns_pool
from flock.testing.policy_net import PolicyNode

ENDPOINTS = 10
PROBED = 0  # the Service the client connects to: its endpoints are the backend's addresses
CLIENT6, BACKEND6 = "2001:db8:10::c", "2001:db8:20::1"
BACKEND_PORT = 8080
POD_CIDRS = (ipaddress.ip_network("2001:db8:10::/64"), ipaddress.ip_network("2001:db8:20::/64"))

# Accepts TCP connections on [::]:8080 and answers each with one byte.
SERVER = textwrap.dedent(
    """
    import socket
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", int(__import__("sys").argv[1])))
    s.listen(128)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        c.sendall(b"x")
        c.close()
    """
)

# For each line "n" on stdin: n new connections to addr:port, each timed from connect() to the first
# byte; one JSON line of seconds per batch (the benchmark alternates batches between the sizes' clients).
CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    addr, port = sys.argv[1], int(sys.argv[2])
    for line in sys.stdin:
        out = []
        for _ in range(int(line)):
            began = time.perf_counter()
            with socket.create_connection((addr, port), timeout=5) as c:
                if c.recv(1) != b"x":
                    raise SystemExit("no answer")
            out.append(time.perf_counter() - began)
            time.sleep(0.002)
        print(json.dumps(out), flush=True)
    """
)


def cluster_ip(i: int) -> str:
    return f"fd00:10:96::{i + 1:x}"


def endpoint_address(i: int, j: int) -> str:
    if i == PROBED:
        return f"2001:db8:20::{j + 1:x}"
    return f"2001:db8:{1 + i // 65536:x}:{i % 65536:x}::{j + 1:x}"


def service_object(i: int) -> dict:
    return objects.service(f"svc{i}", [cluster_ip(i)], [objects.port("http", 80, target=BACKEND_PORT)])


def slice_object(i: int, unready: int | None = None) -> dict:
    endpoints = [
        objects.endpoint(endpoint_address(i, j), "node-b", ready=j != unready, pod=f"svc{i}-{j}")
        for j in range(ENDPOINTS)
    ]
    return objects.endpoint_slice(f"svc{i}", endpoints, [objects.slice_port("http", BACKEND_PORT)])


def fill(inputs: ServiceInputs, n: int) -> None:
    """Every Service and EndpointSlice listed, as the watcher lists them (one JSON object at a time)."""
    services: dict[str, Service] = {}
    slices: dict[str, EndpointSlice] = {}
    for i in range(n):
        svc = Service.from_object(service_object(i))
        eps = EndpointSlice.from_object(slice_object(i))
        services[svc.key], slices[eps.key] = svc, eps
    inputs.replace(SERVICES, services)
    inputs.replace(ENDPOINT_SLICES, slices)


@attrs.define(eq=False)
class TimedBackend:
    """The real backend, noting when each transaction returned."""

    inner: LibNftables
    returned: trio.Event = attrs.field(factory=trio.Event)
    at: float = 0.0
    lines: int = 0
    total_lines: int = 0
    transactions: int = 0

    async def run(self, script: str | bytes) -> str:
        out = await self.inner.run(script)
        self.at = time.perf_counter()
        self.lines = (script if isinstance(script, str) else script.decode()).count("\n")
        self.total_lines += self.lines
        self.transactions += 1
        self.returned.set()
        return out

    async def counters(self, table: str) -> dict[str, tuple[int, int]]:
        return await self.inner.counters(table)

    async def has_table(self, table: str) -> bool:
        return await self.inner.has_table(table)

    def expect(self) -> trio.Event:
        self.returned = trio.Event()
        return self.returned


@contextlib.contextmanager
def measured(n: int, flips: int, seed: int) -> Iterator[tuple[dict, subprocess.Popen]]:
    """A node with *n* Services programmed and measured (start, endpoint changes), and a client in its
    pod connecting to the probed ClusterIP on demand; both stay until the context exits."""
    rng = random.Random(seed)
    with netns_pool("fl-bsvc-") as pool:
        node = PolicyNode(pool)
        client = node.add_pod("default/client", CLIENT6, "192.0.2.12")
        backend = node.add_pod("default/backend", BACKEND6, "192.0.2.20")
        for j in range(1, ENDPOINTS):
            backend.netns.ip("-6", "addr", "add", f"2001:db8:20::{j + 1:x}/128", "dev", "eth0", "nodad")
            node.node.ip("-6", "route", "add", f"2001:db8:20::{j + 1:x}/128", "dev", backend.veth)
        server = subprocess.Popen(
            ["ip", "netns", "exec", backend.netns.name, sys.executable, "-c", SERVER, str(BACKEND_PORT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        connector = None
        try:
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                raise SystemExit("the backend did not start")
            result = trio.run(_measure, n, flips, rng, node)
            # The table stays in the kernel after the proxy stops (as it does across an agent restart).
            connector = subprocess.Popen(
                ["ip", "netns", "exec", client.netns.name, sys.executable, "-c", CLIENT, cluster_ip(PROBED), "80"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            yield result, connector
        finally:
            if connector is not None:
                connector.kill()
                connector.wait()
            server.kill()
            server.wait()
            node.close()


def first_connections(connectors: list[subprocess.Popen], connections: int, batch: int = 25) -> list[list[float]]:
    """Batches of new connections, each size's client in turn, so that the machine's drift (load, clock,
    caches) falls on every size alike; the first batch of each is a warm-up."""
    samples: list[list[float]] = [[] for _ in connectors]
    for round_ in range(connections // batch + 1):
        for i, connector in enumerate(connectors):
            assert connector.stdin is not None and connector.stdout is not None
            connector.stdin.write(f"{batch}\n")
            connector.stdin.flush()
            answers = json.loads(connector.stdout.readline())
            if round_:
                samples[i] += answers
    return samples


async def _measure(n: int, flips: int, rng: random.Random, node: PolicyNode) -> dict:
    inputs = ServiceInputs()
    fill(inputs, n)
    backend = TimedBackend(LibNftables(node.node.path))
    view = NodeView("bench-node", (ipaddress.ip_address(node.node_ip6),))

    async def node_view() -> NodeView:
        return view

    async def no_kube_proxy() -> list[str]:
        return []

    programmed = trio.Event()
    proxy = ServiceProxy(
        inputs,
        backend,
        node_view,
        lambda: ServicesConfig(pod_cidrs=POD_CIDRS),
        no_kube_proxy,
        lambda _: None,
        on_health=lambda _: programmed.set(),  # the first apply after the load (health checks are handed then)
    )
    out: dict = {"services": n, "endpoints": n * ENDPOINTS}
    async with trio.open_nursery() as nursery:
        began = time.perf_counter()
        nursery.start_soon(proxy.run)
        await programmed.wait()  # every step of the first load in the kernel
        out["start_to_programmed_s"] = round(backend.at - began, 3)  # when the last transaction returned
        out["full_table_lines"] = backend.total_lines
        out["load_transactions"] = backend.transactions
        samples, lines = [], []
        unready: dict[int, int | None] = {}
        others = [i for i in range(n) if i != PROBED] or [PROBED]
        for _ in range(flips):
            i = rng.choice(others)
            turn = None if unready.get(i) is not None else rng.randrange(ENDPOINTS)
            unready[i] = turn
            eps = EndpointSlice.from_object(slice_object(i, turn))  # decoded before the clock starts
            done = backend.expect()
            began = time.perf_counter()
            inputs.set(ENDPOINT_SLICES, eps.key, eps)
            await done.wait()
            samples.append(backend.at - began)
            lines.append(backend.lines)
            await trio.sleep(0.005)
        out["endpoint_change_ms"] = summary(samples, scale=1000)
        out["endpoint_change_lines"] = {"min": min(lines), "max": max(lines)}
        nursery.cancel_scope.cancel()
    backend.inner.close()
    return out


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def settle(trim: Callable[[int], int] | None) -> int:
    gc.collect()
    if trim is not None:
        trim(0)
    return rss_kib()


def rss_child(n: int) -> dict:
    """In a fresh interpreter: VmRSS added by the inputs and by the engine for *n* Services."""
    trim = _malloc_trim()
    # what a first compile touches once whatever the size (imports, caches) is not the state's
    warm = ServiceInputs()
    fill(warm, 2)
    ServicesEngine(NodeView("bench-node"), ServicesConfig(pod_cidrs=POD_CIDRS)).update(
        warm.services, warm.slices, warm.services, warm.slices
    )
    del warm
    base = settle(trim)
    inputs = ServiceInputs()
    fill(inputs, n)
    with_inputs = settle(trim)
    engine = ServicesEngine(NodeView("bench-node"), ServicesConfig(pod_cidrs=POD_CIDRS))
    engine.load(inputs.services, inputs.slices)  # as the proxy starts
    with_engine = settle(trim)
    assert len(engine.counted) >= n
    return {
        "services": n,
        "inputs_mib": round((with_inputs - base) / 1024, 1),
        "engine_mib": round((with_engine - with_inputs) / 1024, 1),
        "added_mib": round((with_engine - base) / 1024, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,10000", help="numbers of Services, comma-separated runs")
    ap.add_argument("--flips", type=int, default=300, help="endpoint changes timed per size")
    ap.add_argument("--connections", type=int, default=400, help="first connections timed per size")
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child is not None:
        print(json.dumps(rss_child(args.rss_child)))
        return
    results = []
    with contextlib.ExitStack() as stack:
        connectors = []
        for n in (int(x) for x in args.sizes.split(",")):
            r, connector = stack.enter_context(measured(n, args.flips, args.seed))
            child = subprocess.run(
                [sys.executable, __file__, "--rss-child", str(n)], capture_output=True, text=True, check=True
            )
            r["rss"] = json.loads(child.stdout)
            results.append(r)
            connectors.append(connector)
        for r, samples in zip(results, first_connections(connectors, args.connections), strict=True):
            r["first_connection_ms"] = summary(samples, scale=1000, digits=3)
    if not args.json:
        for r in results:
            print(
                f"{r['services']:>6} Services × {ENDPOINTS}: start → programmed {r['start_to_programmed_s']:.2f} s "
                f"({r['full_table_lines']} lines, {r['load_transactions']} transactions); "
                f"endpoint change → kernel {r['endpoint_change_ms']['median']:.2f} / "
                f"{r['endpoint_change_ms']['p99']:.2f} ms ({r['endpoint_change_lines']['min']}–"
                f"{r['endpoint_change_lines']['max']} lines); first connection "
                f"{r['first_connection_ms']['median']:.3f} / {r['first_connection_ms']['p99']:.3f} ms; "
                f"RSS added {r['rss']['added_mib']} MiB (inputs {r['rss']['inputs_mib']}, engine "
                f"{r['rss']['engine_mib']}) (median / p99)",
                flush=True,
            )
    doc = {"bench": "services", "flips": args.flips, "connections": args.connections, "results": results}
    if len(results) >= 2:
        small, large = results[0], results[-1]
        doc["first_connection_ratio"] = round(
            large["first_connection_ms"]["median"] / small["first_connection_ms"]["median"], 3
        )
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
