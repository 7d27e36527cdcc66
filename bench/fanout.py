"""What a pod change costs the cluster: API server → agents bytes and events, today (every agent watches
every Pod) and with flock-controller's address groups (issue 35), measured in one run.

One fake API server (``python -m flock.apiserver --load``) holds a generated cluster
(flock.testing.scale: 150,000 pods of 5.6 KiB over 5,000 nodes, 2,000 namespaces, one NetworkPolicy
each, by default) and the Nodes; flock-controller runs as its own process (``python -m
flock.controller --kubeconfig``) and writes the address groups.  The 5,000 agents are **virtual
watches** the API server counts (flock.apiserver's ``/debug/flock/virtual-watches``: the events and
bytes each watcher would be sent, the same JSON lines a real watch writes), registered for both
designs at once:

- today: every Pod, every Namespace, every NetworkPolicy, by 5,000 watchers;
- groups: per node its pods (``spec.nodeName``), its NodeAddressGroups (``metadata.name``), the
  AddressGroups it names (``flock.fritzlab.net/group in (…)``, watched again — a whole new list —
  whenever its list changes), every Namespace and NetworkPolicy.

Then a driver changes remote pods at ``--rate`` a second for ``--seconds`` (flock.testing.scale's
Churn: status updates, label changes, re-creates), and the figures are read:

- ``today_bytes_per_s`` / ``new_bytes_per_s`` (and events): API server → all agents, per second;
- ``agent_start_bytes`` (groups) and ``agent_start_bytes_today``: what one agent's WatchLists read at its start;
- ``writes_per_s``: flock-controller's writes (AddressGroup and NodeAddressGroups) during the churn;
- ``component_rss_mib`` (peak), ``component_cpu`` (cores, during the churn), its first pass's time;
- ``enforce_p50_s`` / ``enforce_p99_s``: a remote pod relabelled into a group another node needs →
  the member in that node's policy inputs (a real agent's PeerFeed over HTTP, in this process; the
  ruleset's apply after that is the agent's own, ~10 ms: bench/policy_enforce.py);
- ``worst_case`` (``--worst-case``): a NetworkPolicy whose peer is ``namespaceSelector: {}`` — every
  pod in one group — its slices, the start bytes of a node that needs it, and the bytes/s under churn.

    python bench/fanout.py [--preset 3k|30k|150k] [--rate 100] [--seconds 30] [--worst-case] [--json]

Runs on loopback, no root needed.  Cleans up its processes and temporary directory on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import trio
from pods import cpu_seconds  # bench/pods.py
from scale import Api, ApiServerProcess, log, proc_memory, write_objects  # bench/scale.py
from stats import percentile  # bench/stats.py

from flock.apiserver import namespace_object, node_object
from flock.groups import GROUP_LABEL
from flock.policy import PolicyInputs
from flock.testing.benchkit import stop_process
from flock.testing.scale import Churn, ClusterShape, ScaleCluster, average_pod_size
from flock.watchers import PeerFeed, group_selector, open_kube_client

DEBUG = "/debug/flock/"
GROUPS = "/apis/flock.fritzlab.net/v1alpha1/addressgroups"
NODE_GROUPS = "/apis/flock.fritzlab.net/v1alpha1/nodeaddressgroups"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Controller:
    """``python -m flock.controller --kubeconfig`` with its /metrics on a port of its own."""

    def __init__(self, work: Path, kubeconfig: Path) -> None:
        self.port = free_port()
        self.log = work / "controller.log"
        argv = [sys.executable, "-m", "flock.controller", "--kubeconfig", str(kubeconfig)]
        argv += ["--identity", "bench-0", "--health-port", str(self.port), "--lease-namespace", "kube-system"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def metrics(self) -> dict[str, float]:
        import urllib.request

        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("flock_controller_group_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def wait_first_pass(self, limit: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            if self.proc.poll() is not None:
                raise RuntimeError(f"flock-controller exited: {self.log.read_text()[-3000:]}")
            if self.metrics().get("flock_controller_group_passes_total", 0) >= 1:
                return time.monotonic() - t0
            time.sleep(0.5)
        raise RuntimeError(f"flock-controller made no pass within {limit:g} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        stop_process(self.proc)


def needs_of(api: Api) -> dict[str, list[str]]:
    return {o["metadata"]["name"]: o.get("groups") or [] for o in api.ok("GET", NODE_GROUPS)["items"]}


def initial(api: Api, resource: str, **selectors: str) -> tuple[int, int]:
    query = urllib.parse.urlencode({"resource": resource, **selectors})
    got = api.ok("GET", f"{DEBUG}initial-bytes?{query}")
    return int(got["events"]), int(got["bytes"])


def register(api: Api, cluster: ScaleCluster, needs: dict[str, list[str]]) -> dict[str, int]:
    """Both designs' watches; returns node → the id of its AddressGroups watch."""
    nodes = cluster.shape.nodes
    shared = [{"resource": r, "count": nodes} for r in ("namespaces", "networkpolicies")]
    today = [{"resource": "pods", "count": nodes}]
    api.ok("POST", DEBUG + "virtual-watches", [*today, *shared])
    per_node: list[dict[str, Any]] = []
    names = [cluster.node_name(m) for m in range(nodes)]
    for name in names:
        per_node.append({"resource": "pods", "fieldSelector": f"spec.nodeName={name}"})
        per_node.append({"resource": "nodeaddressgroups", "fieldSelector": f"metadata.name={name}"})
    api.ok("POST", DEBUG + "virtual-watches", per_node)
    ids: dict[str, int] = {}
    batch = [
        {"resource": "addressgroups", "labelSelector": group_selector(frozenset(needs.get(n) or ["none"]))}
        for n in names
    ]
    got = api.ok("POST", DEBUG + "virtual-watches", batch)["ids"]
    ids.update(zip(names, got, strict=True))
    return ids


def totals(api: Api) -> dict[str, dict[str, int]]:
    watches = api.ok("GET", DEBUG + "virtual-watches?watches=true")["watches"]
    out = {"today": {"events": 0, "bytes": 0}, "groups": {"events": 0, "bytes": 0}}
    for w in watches:
        count = int(w.get("count", 1))
        design = "today" if count > 1 and w["resource"] == "pods" else None
        if w["resource"] in ("namespaces", "networkpolicies"):
            for d in out.values():  # both designs watch them the same way
                d["events"] += int(w["events"]) * count
                d["bytes"] += int(w["bytes"]) * count
            continue
        design = design or "groups"
        out[design]["events"] += int(w["events"]) * count
        out[design]["bytes"] += int(w["bytes"]) * count
    return out


class Rewatcher:
    """Follows every node's NodeAddressGroups and re-watches its virtual AddressGroups watch when the
    list changes (a real agent's informer starts a new WatchList: counted whole)."""

    def __init__(self, api_port: int, ids: dict[str, int], needs: dict[str, list[str]]) -> None:
        self.api = Api(api_port)
        self.ids, self.needs = ids, {n: sorted(g) for n, g in needs.items()}
        self.rewatches = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for name, groups in needs_of(self.api).items():
                groups = sorted(groups)
                if name in self.ids and self.needs.get(name) != groups:
                    self.needs[name] = groups
                    body = {"labelSelector": group_selector(frozenset(groups or ["none"])), "initialEvents": "all"}
                    self.api.ok("POST", f"{DEBUG}virtual-watches/{self.ids[name]}/rewatch", body)
                    self.rewatches += 1
            self.stop.wait(1.0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.api.close()


def drive(api: Api, changes: Churn, seconds: float, rate: float, stop: threading.Event) -> dict[str, Any]:
    """*changes* at *rate* a second for *seconds* (one Churn for the whole run: it knows each pod's generation)."""
    kinds: dict[str, int] = {}
    errors = 0
    t0 = time.perf_counter()
    n = 0
    while not stop.is_set() and n < int(seconds * rate):
        wait = t0 + n / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        change = changes.next()
        kinds[change.kind] = kinds.get(change.kind, 0) + 1
        for method, path, body, content_type in change.requests():
            status, _ = api.call(method, path, body, content_type)
            errors += status >= 300
        n += 1
    window = time.perf_counter() - t0
    return {"changes": n, "kinds": kinds, "errors": errors, "seconds": round(window, 2), "rate": round(n / window, 1)}


MERGE = "application/merge-patch+json"


def enforce_target(api: Api, needs: dict[str, list[str]], nodes: list[str]) -> tuple[str, str, str, list[str]] | None:
    """(node, namespace, app, movers): a node with a group picking one app in one namespace, and pods of
    that namespace on other nodes that the node does not know through any of its groups yet."""
    for node in nodes:
        groups = needs.get(node) or []
        if not groups:
            continue
        selector = urllib.parse.quote(group_selector(frozenset(groups)))
        slices = api.ok("GET", f"{GROUPS}?labelSelector={selector}")["items"]
        known = {f"{m['namespace']}/{m['name']}" for s in slices for m in s.get("members") or []}
        for g in slices:
            sel = g.get("selection") or {}
            labels = (sel.get("podSelector") or {}).get("matchLabels") or {}
            if not sel.get("namespace") or list(labels) != ["app"] or "namespaceSelector" in sel:
                continue
            namespace, app = sel["namespace"], labels["app"]
            pods = api.ok("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            movers = [
                p["metadata"]["name"]
                for p in pods
                if (p["metadata"].get("labels") or {}).get("app") != app
                and p["spec"].get("nodeName") != node
                and (p.get("status") or {}).get("podIPs")
                and f"{namespace}/{p['metadata']['name']}" not in known
            ]
            if len(movers) >= 5:
                return node, namespace, app, movers
    return None


async def until(inputs: PolicyInputs, key: str, *, present: bool) -> None:
    """Until pod *key* is (or is not) in *inputs*: woken by each change, no polling."""
    while (key in inputs.pods) != present:
        await inputs.wait_generation(inputs.generation)


async def enforce_samples(
    kubeconfig: Path, api_port: int, node: str, target: tuple[str, str], movers: list[str], samples: int
) -> tuple[list[float], dict[str, Any]]:
    """A real agent's PeerFeed for *node* over HTTP; pods of another node relabelled into a group it
    needs, one at a time: seconds from the PATCH's answer to the member in its inputs."""
    api = Api(api_port)
    inputs = PolicyInputs()
    feed = PeerFeed(inputs, node)
    out: list[float] = []
    info: dict[str, Any] = {}
    async with open_kube_client(kubeconfig) as kube, trio.open_nursery() as nursery:
        nursery.start_soon(feed.run, kube)
        feed.local_listed({})
        with trio.fail_after(120):
            while not feed.listed:
                await inputs.wait_generation(inputs.generation)
        namespace, app = target
        info = {"node": node, "namespace": namespace, "app": app, "candidates": len(movers)}
        rnd = random.Random(5)
        for k in range(samples):
            # a pod this node does not know yet (one it knows through another group would not move)
            unknown = [m for m in movers if f"{namespace}/{m}" not in inputs.pods]
            if not unknown:
                break
            name = rnd.choice(unknown)
            key = f"{namespace}/{name}"
            path = f"/api/v1/namespaces/{namespace}/pods/{name}"
            status, before = await trio.to_thread.run_sync(api.call, "GET", path)
            if status == 404:  # re-created by the churn meanwhile (a new name): another one
                movers.remove(name)
                continue
            old = (before["metadata"].get("labels") or {}).get("app")
            patch = {"metadata": {"labels": {"app": app}}}
            status, _ = await trio.to_thread.run_sync(api.call, "PATCH", path, patch, MERGE)
            if status >= 300:
                movers.remove(name)
                continue
            t0 = trio.current_time()
            with trio.move_on_after(30):
                await until(inputs, key, present=True)
            if key in inputs.pods:
                out.append(trio.current_time() - t0)
            elif (await trio.to_thread.run_sync(api.call, "GET", path))[0] == 404:
                movers.remove(name)  # re-created by the churn before it got in: no sample
                continue
            else:
                out.append(30.0)  # never arrived: counted as the wait's bound
            back = {"metadata": {"labels": {"app": old}}}
            await trio.to_thread.run_sync(api.call, "PATCH", path, back, MERGE)  # (gone meanwhile: it left too)
            with trio.move_on_after(30):
                await until(inputs, key, present=False)
            await trio.sleep(0.05 + k % 3 * 0.1)
        nursery.cancel_scope.cancel()
    api.close()
    return out, info


def worst_case(api: Api, controller: Controller, cluster: ScaleCluster, rate: float, seconds: float) -> dict[str, Any]:
    """A NetworkPolicy letting in every pod of the cluster (``namespaceSelector: {}``) for one app."""
    ns = cluster.namespace_name(0)
    app = cluster.app_of(next(i for i in range(cluster.shape.pods) if cluster.app_of(i).namespace == 0)).name
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": "from-everyone"},
        "spec": {"podSelector": {"matchLabels": {"app": app}}, "ingress": [{"from": [{"namespaceSelector": {}}]}]},
    }
    before = needs_of(api)
    writes0 = controller.metrics().get("flock_controller_group_writes_total", 0)
    t0 = time.monotonic()
    api.ok("POST", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", policy)
    group = None
    while time.monotonic() - t0 < 600 and group is None:
        now = needs_of(api)
        new = {g for n, gs in now.items() for g in gs} - {g for gs in before.values() for g in gs}
        for g in new:
            items = api.ok("GET", f"{GROUPS}?labelSelector={urllib.parse.quote(f'{GROUP_LABEL}={g}')}")["items"]
            if items and "namespaceSelector" in (items[0].get("selection") or {}):
                group = g
        time.sleep(0.5)
    if group is None:
        return {"error": "the group did not appear"}
    settle = time.monotonic() - t0
    slices = api.ok("GET", f"{GROUPS}?labelSelector={urllib.parse.quote(f'{GROUP_LABEL}={group}')}")["items"]
    nodes = [n for n, gs in needs_of(api).items() if group in gs]
    _, size = initial(api, "addressgroups", labelSelector=f"{GROUP_LABEL}={group}")
    writes1 = controller.metrics().get("flock_controller_group_writes_total", 0)
    return {
        "group": group,
        "members": sum(len(s.get("members") or []) for s in slices),
        "slices": len(slices),
        "nodes_needing_it": len(nodes),
        "written_s": round(settle, 1),
        "writes_to_write_it": int(writes1 - writes0),
        "start_bytes_of_the_group": size,
        "start_mib_of_the_group": round(size / 2**20, 2),
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    shape = ClusterShape.preset(args.preset)
    cluster = ScaleCluster(shape)
    results: dict[str, Any] = {"shape": {"pods": shape.pods, "nodes": shape.nodes, "namespaces": shape.namespaces,
                                         "policies": shape.policies}}  # fmt: skip
    results["pod_json_bytes_mean"] = round(average_pod_size(cluster)["mean"])
    log(f"writing {shape.pods} pods …")
    files = write_objects(shape, work, lines=True)
    server = ApiServerProcess(work, files, dict(os.environ), bookmark_interval=1.0)
    controller: Controller | None = None
    try:
        results["apiserver_load_s"] = round(server.wait_serving(args.load_timeout), 1)
        api = Api(server.port)
        api.ok("POST", "/api/v1/namespaces", namespace_object("kube-system"))
        for m in range(shape.nodes):
            api.ok("POST", "/api/v1/nodes", node_object(cluster.node_name(m)))
        kubeconfig = work / "kubeconfig"
        log("flock-controller: first pass …")
        controller = Controller(work, kubeconfig)
        cpu_start = cpu_seconds(controller.proc.pid)
        results["component_first_pass_s"] = round(controller.wait_first_pass(args.load_timeout), 1)
        results["component_first_pass_cpu_s"] = round(cpu_seconds(controller.proc.pid) - cpu_start, 1)
        m0 = controller.metrics()
        results["first_pass_writes"] = int(m0.get("flock_controller_group_writes_total", 0))
        results["component_rss_after_first_pass_mib"] = proc_memory(controller.proc.pid).get("rss")
        needs = needs_of(api)
        results["groups"] = len({g for gs in needs.values() for g in gs})
        results["groups_per_node_mean"] = round(statistics.mean(len(g) for g in needs.values()), 1) if needs else 0
        results["group_members"] = int(m0.get("flock_controller_group_members", 0))
        # one agent's start, both designs: today's is every node's; with groups, over a sample of nodes (the
        # largest is the figure: the agent that reads the most)
        shared_start = sum(initial(api, r)[1] for r in ("namespaces", "networkpolicies"))
        results["agent_start_bytes_today"] = initial(api, "pods")[1] + shared_start
        step = max(1, shape.nodes // 200)
        starts: dict[str, int] = {}
        for m in range(1, shape.nodes, step):  # (node 0's pods are Pending: the generator's local node)
            name = cluster.node_name(m)
            starts[name] = shared_start + sum(
                (
                    initial(api, "pods", fieldSelector=f"spec.nodeName={name}")[1],
                    initial(api, "nodeaddressgroups", fieldSelector=f"metadata.name={name}")[1],
                    initial(api, "addressgroups", labelSelector=group_selector(frozenset(needs.get(name) or ["none"])))[
                        1
                    ],
                )
            )
        results["agent_start_bytes"] = max(starts.values())
        results["agent_start_bytes_median"] = round(statistics.median(starts.values()))
        results["agent_start_nodes_sampled"] = len(starts)
        # the node whose inputs the enforce samples watch, and the pods relabelled into one of its groups
        found = enforce_target(api, needs, sorted(starts, key=lambda n: -len(needs.get(n) or ())))
        ids = register(api, cluster, needs)
        churn = Churn(cluster)
        rewatcher = Rewatcher(server.port, ids, needs)
        stop = threading.Event()
        t_before = totals(api)
        w0 = controller.metrics().get("flock_controller_group_writes_total", 0)
        cpu0, t0 = cpu_seconds(controller.proc.pid), time.perf_counter()
        box: dict[str, Any] = {}
        driver = threading.Thread(
            target=lambda: box.update(drive(Api(server.port), churn, args.seconds, args.rate, stop)), daemon=True
        )
        log(f"churn: {args.rate:g} changes/s for {args.seconds:g} s, and the enforce samples …")
        driver.start()
        if found is None:
            samples, info = [], {"skipped": "no node with a group of one app in one namespace and pods to move in"}
        else:
            node, namespace, app, movers = found
            samples, info = trio.run(
                enforce_samples, kubeconfig, server.port, node, (namespace, app), movers, args.samples
            )
        driver.join()
        window = time.perf_counter() - t0
        time.sleep(2.0)  # the controller's last pass, the agents' last events
        cpu1 = cpu_seconds(controller.proc.pid)
        w1 = controller.metrics().get("flock_controller_group_writes_total", 0)
        t_after = totals(api)
        rewatcher.close()
        results["churn"] = box
        log(json.dumps(results))
        results["rewatches"] = rewatcher.rewatches
        span = window + 2.0
        today_bytes = t_after["today"]["bytes"] - t_before["today"]["bytes"]
        new_bytes = t_after["groups"]["bytes"] - t_before["groups"]["bytes"]
        results["today_bytes_per_s"] = round(today_bytes / span)
        results["new_bytes_per_s"] = round(new_bytes / span)
        results["today_events_per_s"] = round((t_after["today"]["events"] - t_before["today"]["events"]) / span)
        results["new_events_per_s"] = round((t_after["groups"]["events"] - t_before["groups"]["events"]) / span)
        results["ratio_new_to_today"] = round(new_bytes / today_bytes, 4) if today_bytes else None
        results["writes_per_s"] = round((w1 - w0) / span, 1)
        results["component_cpu"] = round((cpu1 - cpu0) / span, 3)
        mem = proc_memory(controller.proc.pid)
        results["component_rss_mib"] = mem.get("rss")
        results["component_peak_rss_mib"] = mem.get("peak")
        results["enforce"] = info
        if samples:
            results["enforce_p50_s"] = round(statistics.median(samples), 3)
            results["enforce_p99_s"] = round(percentile(samples, 0.99), 3)
            results["enforce_max_s"] = round(max(samples), 3)
            results["enforce_n"] = len(samples)
        if args.worst_case:
            log("worst case: a policy letting in every pod, then the churn again …")
            worst = results["worst_case"] = worst_case(api, controller, cluster, args.rate, args.seconds)
            needs = needs_of(api)
            rewatcher = Rewatcher(server.port, ids, {n: [] for n in needs})  # every node's list: re-read whole
            time.sleep(3.0)  # the re-watches of the nodes that need the new group
            t_before = totals(api)
            w0 = controller.metrics().get("flock_controller_group_writes_total", 0)
            t0 = time.perf_counter()
            again = drive(Api(server.port), churn, args.seconds, args.rate, threading.Event())
            time.sleep(2.0)
            span = time.perf_counter() - t0
            t_after = totals(api)
            rewatcher.close()
            w1 = controller.metrics().get("flock_controller_group_writes_total", 0)
            worst["churn_rate"] = again["rate"]
            worst["new_bytes_per_s"] = round((t_after["groups"]["bytes"] - t_before["groups"]["bytes"]) / span)
            worst["today_bytes_per_s"] = round((t_after["today"]["bytes"] - t_before["today"]["bytes"]) / span)
            worst["writes_per_s"] = round((w1 - w0) / span, 1)
        api.close()
    finally:
        if controller is not None:
            controller.stop()
        server.stop()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=("3k", "30k", "150k"), default="150k")
    ap.add_argument("--rate", type=float, default=100.0, help="remote pod changes a second")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the churn runs")
    ap.add_argument("--samples", type=int, default=40, help="remote relabels timed to another node's inputs")
    ap.add_argument("--worst-case", action="store_true", help="also a policy whose peer is namespaceSelector: {}")
    ap.add_argument("--load-timeout", type=float, default=1800.0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    ap.add_argument("--json", action="store_true", help="print only the figures, as one JSON object")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fl-fanout-"))
    os.chdir(work)
    try:
        results = measure(args, work)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    else:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
