"""One flock-agent in a big cluster: the real agent process against the fake API
server holding N realistic pods (flock.testing.scale: 5.6 KiB of JSON each on
average, managedFields included) over M nodes, with namespaces and one
NetworkPolicy each.

Everything runs in a "node" network namespace this script makes (it
re-executes itself there): the API server (``python -m flock.apiserver
--load``, its own process, on 127.0.0.1; the objects are written as JSON lines
when its ``--load`` reads them, else as one JSON list), then flock-agent for
node-00000 (what the ``flock-agent`` console script runs, ``--no-bird``),
whose ~30 pods are Pending in the API until this script ADDs them through the
bundled CNI plugin (``/usr/bin/python3 -IS``, as flock-install-cni installs
it) and writes their status as a kubelet does.  Figures:

- objects: generation time and the pods' mean JSON size; the API server's
  load time and RSS, and how long it takes to serve the lists the agent makes
  (all pods, this node's, namespaces, policies) to a plain HTTP client;
- start → ready: agent start until /readyz answers 200 (``--ready-timeout``);
  RSS at ready, steady (after the ADDs, settled) and peak (VmHWM); idle CPU;
- ADD: each local pod's CNI ADD (plugin exec to result), median/p90/max, here
  and in a small cluster (``--small``, default 3,000 pods) in the same run;
  DEL likewise;
- churn: a driver changes remote pods at ``--rate`` a second for
  ``--churn-seconds`` (status updates, label changes, re-creates: see
  flock.testing.scale.Churn); the agent's CPU (utime+stime) in that window as
  % of one core and ms per change (also minus its idle CPU), and whether it
  kept up: how long after the last change its
  ``flock_policy_applied_resource_version`` reached the last change's version;
- policy: a new NetworkPolicy selecting a local pod that none selected: from
  the POST to the gauge reaching its resourceVersion, and to ``nft list chain
  inet flock in-<veth>`` jumping to its chain; ``--policy-rounds`` rounds;
- restart → ready with the local pods attached (``--no-restart`` skips it).

The agent's start has ``--ready-timeout`` seconds (default 600); when it is
not ready by then, what /readyz says and the agent's memory are reported and
the later phases are skipped.  ``--source DIR`` runs the API server, the agent
and the plugin from another checkout of flock (e.g. ``git archive HEAD | tar
-x -C DIR``: the "before" of a change), the generator from this one.

    python bench/scale.py --preset 3k|30k|150k [--pods N --nodes M --namespaces K --policies P]
        [--churn-seconds 20] [--rate 100] [--small 3000] [--source DIR] [--json]

Cleans up on any exit, Ctrl-C included: processes, namespaces, the temporary
directory (``--keep`` keeps that one, with the logs).  Needs root.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pods import cpu_seconds  # bench/pods.py
from stats import percentile  # bench/stats.py

from flock.policy import Direction, policy_chain
from flock.testing.benchkit import stop_process
from flock.testing.netns import NETNS_DIR, Netns, NetnsPool
from flock.testing.scale import Churn, ClusterShape, ScaleCluster, average_pod_size
from flock.testing.shimrun import Outcome, run_plugin

HOST = "127.0.0.1"
MERGE = "application/merge-patch+json"
SETTLE_S = 3.0
IDLE_S = 5.0
CATCH_UP_S = 120.0
POLICY_LIMIT_S = 60.0
POLL_S = 0.01


class Interrupted(Exception):
    """SIGTERM: unwind and clean up, as for Ctrl-C."""


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of *pid*, MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss" if key == "VmRSS" else "peak"] = round(int(value.split()[0]) / 1024, 1)
    return out


def ms_stats(samples: list[float]) -> dict[str, Any]:
    values = [s * 1000 for s in samples]
    if not values:
        return {"n": 0}
    return {
        "median": round(statistics.median(values), 1),
        "p90": round(percentile(values, 0.9), 1),
        "max": round(max(values), 1),
        "n": len(values),
    }


def source_env(source: str | None) -> dict[str, str]:
    """The environment that makes a child import flock from *source* (None: this installation)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if source is not None:
        env["PYTHONPATH"] = os.path.abspath(source)
        found = subprocess.run(
            [sys.executable, "-c", "import flock; print(flock.__file__)"], capture_output=True, text=True, env=env
        ).stdout.strip()
        if not found.startswith(os.path.abspath(source)):
            raise SystemExit(f"--source {source}: python imports flock from {found or '?'}")
    return env


# ---- the API server ---------------------------------------------------------------


def _write_part(shape: ClusterShape, path: str, part: int, parts: int, lines: bool) -> int:
    """One objects file: part 0 has the Namespaces, NodeConfigs and NetworkPolicies; each
    part a share of the pods.  Written one object at a time (a worker process), as JSON
    lines (*lines*) or one JSON list."""
    cluster = ScaleCluster(shape)
    count = 0
    with open(path, "w") as f:
        f.write("" if lines else "[")

        def emit(obj: dict[str, Any]) -> None:
            nonlocal count
            data = json.dumps(obj, separators=(",", ":"))
            f.write(data + "\n" if lines else ("," if count else "") + data)
            count += 1

        if part == 0:
            for k in range(shape.namespaces):
                emit(cluster.namespace(k))
            for m in range(shape.nodes):
                emit(cluster.nodeconfig(m))
            for j in range(shape.policies):
                emit(cluster.network_policy(j))
        for i in range(part, shape.pods, parts):
            emit(cluster.pod(i))
        f.write("" if lines else "]")
    return count


def apiserver_module(env: dict[str, str]) -> str:
    """The API server's module in *env*'s flock: ``flock.apiserver``, or ``flock.testing.apiserver``
    in a --source from before it had a package of its own."""
    found = subprocess.run([sys.executable, "-c", "import flock.apiserver"], capture_output=True, env=env)
    return "flock.apiserver" if found.returncode == 0 else "flock.testing.apiserver"


def loads_json_lines(env: dict[str, str]) -> bool:
    """Whether this API server's ``--load`` reads JSON lines (streamed: it never holds the
    whole file decoded), else it gets one JSON list."""
    usage = subprocess.run(
        [sys.executable, "-m", apiserver_module(env), "--help"], capture_output=True, text=True, env=env
    ).stdout
    return "json-lines" in usage.lower().replace(" ", "-")


def write_objects(shape: ClusterShape, directory: Path, lines: bool) -> list[Path]:
    parts = max(1, min(os.cpu_count() or 1, 8))
    paths = [directory / f"objects-{p}.json{'l' if lines else ''}" for p in range(parts)]
    with concurrent.futures.ProcessPoolExecutor(parts) as pool:
        args = ([shape] * parts, map(str, paths), range(parts), [parts] * parts, [lines] * parts)
        list(pool.map(_write_part, *args))
    return paths


class Api:
    """A plain HTTP/1.1 client of the fake API server (keep-alive; one per thread)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn = http.client.HTTPConnection(HOST, port, timeout=300)

    def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            try:
                self._conn.request(method, path, data, {"Content-Type": content_type} if data else {})
                reply = self._conn.getresponse()
                raw = reply.read()
                return reply.status, json.loads(raw) if raw else {}
            except (http.client.HTTPException, ConnectionError):
                self._conn.close()  # the server closed an idle connection: once more on a new one
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        status, reply = self.call(method, path, body, content_type)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {reply.get('message', reply)}")
        return reply

    def resource_version(self) -> int:
        """The server's newest resourceVersion (any list answers with it; this one is short)."""
        path = "/apis/flock.fritzlab.net/v1alpha1/nodeconfigs?fieldSelector=metadata.name%3Dnone"
        return int(self.ok("GET", path)["metadata"]["resourceVersion"])

    def time_list(self, path: str) -> dict[str, Any]:
        """A list as a plain client reads it: seconds to the first byte and to the last, MiB."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=600)
        try:
            t0 = time.perf_counter()
            conn.request("GET", path)
            reply = conn.getresponse()
            first = reply.read(1)
            t1 = time.perf_counter()
            size = len(first)
            while chunk := reply.read(1 << 20):
                size += len(chunk)
            t2 = time.perf_counter()
        finally:
            conn.close()
        return {"first_byte_s": round(t1 - t0, 3), "total_s": round(t2 - t0, 3), "mib": round(size / 2**20, 1)}

    def close(self) -> None:
        self._conn.close()


class ApiServerProcess:
    """``python -m flock.apiserver --load …`` on 127.0.0.1, any free port."""

    def __init__(self, work: Path, files: list[Path], env: dict[str, str], bookmark_interval: float) -> None:
        self.work = work
        self.out, self.log = work / "apiserver.out", work / "apiserver.log"
        argv = [sys.executable, "-m", apiserver_module(env), "--host", HOST, "--port", "0"]
        argv += ["--kubeconfig-out", str(work / "kubeconfig"), "--bookmark-interval", str(bookmark_interval)]
        for f in files:
            argv += ["--load", str(f)]
        with open(self.out, "wb") as out, open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        self.started = time.perf_counter()

    def wait_serving(self, limit: float) -> float:
        """Seconds from start until it printed its URL (it loads every object first)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the API server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            line = self.out.read_text().partition("\n")[0]
            if line.endswith("}"):
                self.url = json.loads(line)["url"]
                self.port = int(self.url.rsplit(":", 1)[1])
                return time.perf_counter() - self.started
            time.sleep(0.1)
        raise RuntimeError(f"the API server did not serve within {limit:g} s")

    def stop(self) -> None:
        stop_process(self.proc)


# ---- the agent ----------------------------------------------------------------------


class Agent:
    """One flock-agent process for *node* (from *env*'s flock), with its health port from its log."""

    def __init__(
        self, work: Path, node: str, kubeconfig: Path, env: dict[str, str], name: str, peers: str = "pods"
    ) -> None:
        self.work, self.node, self.kubeconfig, self.env = work, node, kubeconfig, env
        self.socket = work / "run" / "flock.sock"
        self.log = work / f"{name}.log"
        self.port: int | None = None
        # What the flock-agent console script runs (lazy library packages), from *env*'s flock.
        argv = [sys.executable, "-c", "from flock._entry import agent; agent()"]
        argv += ["--node", node, "--socket", str(self.socket), "--state-dir", str(work / "state")]
        argv += ["--kubeconfig", str(kubeconfig), "--health-address", f"{HOST}:0", "--no-bird", "--uplink", "uplink"]
        argv += ["--log-format", "json"]
        if peers != "pods":
            argv += ["--policy-peers", peers]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.started = time.perf_counter()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _health_port(self) -> int | None:
        if self.port is None:
            with open(self.log, errors="replace") as f:
                for line in f:
                    if '"health server listening"' in line:
                        self.port = int(json.loads(line)["address"].rsplit(":", 1)[1])
                        break
        return self.port

    def get(self, path: str) -> tuple[int, str]:
        port = self._health_port()
        if port is None:
            return 0, "health server not listening yet"
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        try:
            conn.request("GET", path)
            reply = conn.getresponse()
            return reply.status, reply.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)
        finally:
            conn.close()

    def wait_ready(self, limit: float) -> tuple[bool, float, str]:
        """(ready, seconds since start, what /readyz said last)."""
        deadline = self.started + limit
        said = ""
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                return False, time.perf_counter() - self.started, f"exited {self.proc.returncode}: {self.tail()}"
            status, said = self.get("/readyz")
            if status == 200:
                return True, time.perf_counter() - self.started, said
            time.sleep(0.05)
        return False, time.perf_counter() - self.started, said

    def applied_version(self) -> int | None:
        status, text = self.get("/metrics")
        match = re.search(r"^flock_policy_applied_resource_version (\S+)$", text, re.M) if status == 200 else None
        return int(float(match.group(1))) if match else None

    def wait_applied(self, target: int, limit: float) -> float | None:
        """Seconds until the applied version is ≥ *target* (None: not within *limit*)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit:
            version = self.applied_version()
            if version is not None and version >= target:
                return time.perf_counter() - t0
            time.sleep(POLL_S)
        return None

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int | None:
        return stop_process(self.proc, 20)


# ---- pods through the CNI plugin ------------------------------------------------------


class LocalPods:
    """The local node's Pending pods, ADDed through the plugin (and the kubelet's status
    write after), DELed at the end."""

    def __init__(self, cluster: ScaleCluster, api: Api, agent: Agent, plugin: list[str], pool: NetnsPool) -> None:
        self.cluster, self.api, self.agent, self.plugin, self.pool = cluster, api, agent, plugin, pool
        self.attached: dict[int, tuple[str, Netns, dict[str, Any], str]] = {}  # i → cid, netns, result, cni args

    def _cni(self, command: str, cid: str, netns: Netns, args: str, result: Any = None) -> Outcome:
        conf: dict[str, Any] = {"cniVersion": "1.1.0", "name": "flock-net", "type": "flock"}
        conf["socket"] = str(self.agent.socket)
        if result is not None:
            conf["prevResult"] = result
        env = {"CNI_CONTAINERID": cid, "CNI_NETNS": netns.path, "CNI_IFNAME": "eth0", "CNI_PATH": "/usr/lib/cni"}
        return run_plugin(self.plugin, command, conf, self.agent.work, CNI_ARGS=args, **env)

    def add(self, i: int) -> float:
        """Seconds the ADD took (the plugin's exec); raises RuntimeError when it failed."""
        pod = self.cluster.pod(i)
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        uid = self.api.ok("GET", f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]["uid"]
        netns = self.pool.create("pod")
        cid = secrets.token_hex(32)
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}"
        t0 = time.perf_counter()
        try:
            out = self._cni("ADD", cid, netns, args)
        except subprocess.TimeoutExpired:
            out = Outcome(-1, "plugin timed out", "")
        elapsed = time.perf_counter() - t0
        if out.status != 0:
            self.pool.delete(netns)
            raise RuntimeError(f"ADD {ns}/{name} after {elapsed:.1f} s: exit {out.status}: {out.stdout[:300]}")
        result = out.json
        self.attached[i] = (cid, netns, result, args)
        ips = [ip["address"].split("/")[0] for ip in result.get("ips", [])]
        status = self.cluster.running_status(i, ips)
        self.api.ok("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status}, MERGE)
        return elapsed

    def host_veth(self, i: int) -> str:
        result = self.attached[i][2]
        return next(iface["name"] for iface in result["interfaces"] if not iface.get("sandbox"))

    def delete_all(self) -> list[float]:
        times = []
        for i, (cid, netns, result, args) in list(self.attached.items()):
            t0 = time.perf_counter()
            out = self._cni("DEL", cid, netns, args, result)
            times.append(time.perf_counter() - t0)
            if out.status != 0:
                log(f"DEL of pod {i}: exit {out.status}: {out.stdout[:300]}")
            self.pool.delete(netns)
            del self.attached[i]
        return times


# ---- phases -----------------------------------------------------------------------


def churn(api: Api, agent: Agent, cluster: ScaleCluster, seconds: float, rate: float) -> dict[str, Any]:
    """Change remote pods at *rate* a second for *seconds*; the agent's CPU and lag."""
    changes = Churn(cluster)
    total = int(seconds * rate)
    kinds: dict[str, int] = {}
    errors = requests = 0
    last_rv = 0
    cpu0, t0 = cpu_seconds(agent.pid), time.perf_counter()
    for n in range(total):
        wait = t0 + n / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        change = changes.next()
        kinds[change.kind] = kinds.get(change.kind, 0) + 1
        for method, path, body, content_type in change.requests():
            requests += 1
            status, reply = api.call(method, path, body, content_type)
            if status >= 300:
                errors += 1
            else:
                last_rv = max(last_rv, int(reply.get("metadata", {}).get("resourceVersion", 0)))
    t1 = time.perf_counter()
    cpu1 = cpu_seconds(agent.pid)
    caught_up = agent.wait_applied(last_rv, CATCH_UP_S)
    t2 = time.perf_counter()
    cpu2 = cpu_seconds(agent.pid)
    window = t1 - t0
    return {
        "changes": total,
        "kinds": kinds,
        "api_writes": requests,
        "api_errors": errors,
        "seconds": round(window, 2),
        "achieved_rate": round(total / window, 1),
        "agent_cpu_pct": round((cpu1 - cpu0) / window * 100, 1),
        "agent_cpu_ms_per_change": round((cpu1 - cpu0) / total * 1000, 2),
        # Until the agent had applied the last change: CPU spent on the churn's backlog too.
        "agent_cpu_ms_per_change_to_caught_up": round((cpu2 - cpu0) / total * 1000, 2),
        "caught_up_after_s": None if caught_up is None else round(caught_up, 2),
        "kept_up": caught_up is not None and caught_up < 1.0,
        "catch_up_cpu_s": round(cpu2 - cpu1, 2),
        "catch_up_wall_s": round(t2 - t1, 2),
    }


def policy_rounds(api: Api, agent: Agent, cluster: ScaleCluster, pods: LocalPods, rounds: int) -> list[dict[str, Any]]:
    """New NetworkPolicies, each selecting a local pod no other policy selects yet."""
    selected = set()
    for j in range(cluster.shape.policies):
        spec = cluster.network_policy(j)
        selected.add((spec["metadata"]["namespace"], spec["spec"]["podSelector"]["matchLabels"]["app"]))
    candidates = []
    for i in pods.attached:
        app = cluster.app_of(i)
        key = (cluster.namespace_name(app.namespace), app.name)
        if key not in selected:
            selected.add(key)  # one pod per app: each round isolates a new one
            candidates.append(i)
    out = []
    for r, i in enumerate(candidates[:rounds]):
        policy = cluster.selecting_policy(i, f"scale-bench-{r}")
        ns, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
        chain = f"in-{pods.host_veth(i)}"
        jump = "jump " + policy_chain(f"{ns}/{name}", Direction.INGRESS)
        t0 = time.perf_counter()
        rv = int(
            api.ok("POST", f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies", policy)["metadata"][
                "resourceVersion"
            ]
        )
        gauge = nft = None
        while time.perf_counter() - t0 < POLICY_LIMIT_S and (gauge is None or nft is None):
            if gauge is None and (agent.applied_version() or 0) >= rv:
                gauge = time.perf_counter() - t0
            if nft is None:
                listed = subprocess.run(
                    ["nft", "list", "chain", "inet", "flock", chain], capture_output=True, text=True
                )
                if jump in listed.stdout:
                    nft = time.perf_counter() - t0
            time.sleep(POLL_S)
        out.append(
            {
                "policy": f"{ns}/{name}",
                "gauge_s": None if gauge is None else round(gauge, 3),
                "nft_s": None if nft is None else round(nft, 3),
            }
        )
    return out


def worst(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else max(v for v in values if v is not None)


def measure(
    shape: ClusterShape, args: argparse.Namespace, work: Path, pool: NetnsPool, plugin: list[str], full: bool
) -> dict[str, Any]:
    """One cluster: load it, start the agent, run the phases (*full*: all; else start, ADD, DEL)."""
    env = source_env(args.source)
    cluster = ScaleCluster(shape)
    out: dict[str, Any] = {
        "shape": {"pods": shape.pods, "nodes": shape.nodes, "namespaces": shape.namespaces, "policies": shape.policies}
    }
    sizes = average_pod_size(cluster, 300)
    out["pod_json_kib"] = {k: round(v / 1024, 2) if k != "n" else v for k, v in sizes.items()}
    log(f"[{shape.name}] generating {shape.pods} pods ({out['pod_json_kib']['mean']} KiB on average) …")
    t0 = time.perf_counter()
    lines = loads_json_lines(env)
    files = write_objects(shape, work, lines)
    out["generate_s"] = round(time.perf_counter() - t0, 1)
    out["objects_format"] = "JSON lines" if lines else "JSON list"
    out["objects_mib"] = round(sum(f.stat().st_size for f in files) / 2**20, 1)
    server = ApiServerProcess(work, files, env, args.bookmark_interval)
    agent: Agent | None = None
    api: Api | None = None
    controller: subprocess.Popen[bytes] | None = None
    try:
        log(f"[{shape.name}] API server loading {out['objects_mib']} MiB of objects …")
        load_s = server.wait_serving(args.load_timeout)
        for f in files:
            f.unlink()
        api = Api(server.port)
        node = cluster.local_node_name
        out["apiserver"] = {
            "load_s": round(load_s, 1),
            "rss_mib": proc_memory(server.proc.pid)["rss"],
            # What the agent's lists cost the server, read by a plain client beforehand.
            "list_all_pods": api.time_list("/api/v1/pods"),
            "list_node_pods": api.time_list(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            "list_namespaces": api.time_list("/api/v1/namespaces"),
            "list_networkpolicies": api.time_list("/apis/networking.k8s.io/v1/networkpolicies"),
        }
        log(f"[{shape.name}] API server: {json.dumps(out['apiserver'])}")
        if args.policy_peers == "groups":
            # flock-controller writes the address groups (issue 35): every Node (its NodeAddressGroups), then
            # its first pass, before the agent starts — as in a cluster where it runs already.
            api.ok(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}},
            )
            for m in range(shape.nodes):
                api.ok(
                    "POST",
                    "/api/v1/nodes",
                    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": cluster.node_name(m)}},
                )
            with open(work / "controller.log", "wb") as controller_log:
                controller = subprocess.Popen(
                    [sys.executable, "-m", "flock.controller", "--kubeconfig", str(work / "kubeconfig")],
                    stdout=controller_log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            t0 = time.perf_counter()
            nag = f"/apis/flock.fritzlab.net/v1alpha1/nodeaddressgroups/{node}"
            while api.call("GET", nag)[0] == 404:
                if controller.poll() is not None or time.perf_counter() - t0 > args.load_timeout:
                    raise RuntimeError(f"flock-controller wrote no NodeAddressGroups {node}")
                time.sleep(0.5)
            out["controller_first_pass_s"] = round(time.perf_counter() - t0, 1)
        agent_dir = work / f"agent-{shape.name}"
        agent_dir.mkdir()
        agent = Agent(agent_dir, node, work / "kubeconfig", env, "agent", args.policy_peers)
        ready, seconds, said = agent.wait_ready(args.ready_timeout)
        mem = proc_memory(agent.pid) if agent.proc.poll() is None else {}
        out["start"] = {
            "ready": ready,
            "ready_s": round(seconds, 2),
            "rss_mib": mem.get("rss"),
            "peak_mib": mem.get("peak"),
        }
        log(f"[{shape.name}] agent start → ready: {json.dumps(out['start'])}")
        if not ready:
            out["start"]["readyz"] = said[-1000:]
            out["start"]["log_tail"] = agent.tail()
            log(f"[{shape.name}] not ready after {seconds:.0f} s: {said[-500:]}")
            return out
        applied = agent.wait_applied(api.resource_version(), CATCH_UP_S)
        out["start"]["policy_applied_after_ready_s"] = None if applied is None else round(applied, 2)
        cpu0, t0 = cpu_seconds(agent.pid), time.perf_counter()
        time.sleep(IDLE_S)
        idle = (cpu_seconds(agent.pid) - cpu0) / (time.perf_counter() - t0)
        out["idle_cpu_pct"] = round(idle * 100, 2)

        pods = LocalPods(cluster, api, agent, plugin, pool)
        adds, failed = [], []
        for i in cluster.local_pods()[: args.adds]:
            try:
                adds.append(pods.add(i))
            except RuntimeError as exc:
                failed.append(str(exc))
        out["add_ms"] = ms_stats(adds)
        if failed:
            out["add_failures"] = failed
            log(f"[{shape.name}] {len(failed)} ADDs failed: {failed[0]}")
        log(f"[{shape.name}] {len(adds)} ADDs: {json.dumps(out['add_ms'])}")
        agent.wait_applied(api.resource_version(), CATCH_UP_S)
        time.sleep(SETTLE_S)
        out["steady"] = proc_memory(agent.pid)
        log(f"[{shape.name}] agent memory, steady: {json.dumps(out['steady'])}")

        if full and args.churn_seconds > 0:
            log(f"[{shape.name}] churn: {args.rate:g} remote changes/s for {args.churn_seconds:g} s …")
            out["churn"] = churn(api, agent, cluster, args.churn_seconds, args.rate)
            c = out["churn"]
            c["agent_cpu_ms_per_change_minus_idle"] = round(
                (c["agent_cpu_pct"] / 100 - idle) * c["seconds"] / c["changes"] * 1000, 2
            )
            log(f"[{shape.name}] churn: {json.dumps(c)}")
            out["after_churn"] = proc_memory(agent.pid)
        if full and args.policy_rounds > 0:
            rounds = policy_rounds(api, agent, cluster, pods, args.policy_rounds)
            out["policy"] = {
                "rounds": rounds,
                "worst_gauge_s": worst([r["gauge_s"] for r in rounds]),
                "worst_nft_s": worst([r["nft_s"] for r in rounds]),
            }
            log(f"[{shape.name}] new NetworkPolicy → enforced: {json.dumps(out['policy'])}")
        out["end"] = proc_memory(agent.pid)
        if full and args.restart:
            agent.stop()
            agent = Agent(agent_dir, node, work / "kubeconfig", env, "agent-restart")
            pods.agent = agent
            ready, seconds, said = agent.wait_ready(args.ready_timeout)
            out["restart"] = {"ready": ready, "ready_s": round(seconds, 2), "attached_pods": len(pods.attached)}
            if ready:
                agent.wait_applied(api.resource_version(), CATCH_UP_S)
                time.sleep(SETTLE_S)
                out["restart"].update(proc_memory(agent.pid))
            else:
                out["restart"]["readyz"] = said[-1000:]
            log(f"[{shape.name}] restart → ready: {json.dumps(out['restart'])}")
        if agent.proc.poll() is None:
            out["del_ms"] = ms_stats(pods.delete_all())
        return out
    finally:
        if agent is not None:
            agent.stop()
        if controller is not None:
            controller.terminate()
            controller.wait(timeout=15)
        if api is not None:
            api.close()
        server.stop()


# ---- outside and inside the node namespace ----------------------------------------------


def shapes(args: argparse.Namespace) -> list[tuple[ClusterShape, bool]]:
    main = ClusterShape.preset(args.preset)
    changes = {
        k: getattr(args, k) for k in ("pods", "nodes", "namespaces", "policies", "seed") if getattr(args, k) is not None
    }
    main = ClusterShape(
        **{**{k: getattr(main, k) for k in ("pods", "nodes", "namespaces", "policies", "seed")}, **changes}
    )
    out = []
    if args.small and args.small < main.pods:
        ratio = args.small / main.pods
        small = ClusterShape(
            args.small,
            max(1, round(main.nodes * ratio)),
            max(1, round(main.namespaces * ratio)),
            round(main.policies * ratio),
            main.seed,
        )
        out.append((small, False))
    out.append((main, True))
    return out


def inside(args: argparse.Namespace) -> dict[str, Any]:
    def interrupted(signum: int, frame: object) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    results: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="fl-scale-"))
    os.chdir(work)  # children's `python -m` / `-c` put the cwd first on sys.path: never a checkout
    pool = NetnsPool(args.netns_prefix)
    try:
        plugin = [str(work / "flock")]
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from flock.shim_bundle import build_shim; "
                "build_shim(Path(sys.argv[1]), python='/usr/bin/python3 -IS')",
                plugin[0],
            ],
            check=True,
            env=source_env(args.source),
        )
        for shape, full in shapes(args):
            cluster_dir = work / shape.name
            cluster_dir.mkdir()
            results[shape.name] = measure(shape, args, cluster_dir, pool, plugin, full)
    finally:
        pool.close()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return results


def summary_lines(results: dict[str, Any]) -> Iterator[str]:
    for name, r in results.items():
        a, s = r.get("apiserver", {}), r.get("start", {})
        yield (
            f"{name}: {r['shape']['pods']} pods / {r['shape']['nodes']} nodes / {r['shape']['namespaces']} namespaces / "
            f"{r['shape']['policies']} policies, pods {r['pod_json_kib']['mean']} KiB JSON on average"
        )
        if a:
            yield (
                f"  API server: load {a['load_s']} s, RSS {a['rss_mib']} MiB; list all pods {a['list_all_pods']['total_s']} s "
                f"({a['list_all_pods']['mib']} MiB), this node's {a['list_node_pods']['total_s']} s"
            )
        if s:
            yield (
                f"  agent start → ready: {s['ready_s']} s{'' if s['ready'] else ' (NOT READY)'}; RSS at ready {s['rss_mib']} MiB"
            )
        if "steady" in r:
            yield (
                f"  RSS steady {r['steady']['rss']} MiB, peak {r['end']['peak'] if 'end' in r else r['steady']['peak']} MiB; "
                f"idle CPU {r['idle_cpu_pct']} %"
            )
        if "add_ms" in r:
            add = r["add_ms"]
            failed = len(r.get("add_failures", ()))
            if add["n"]:
                yield f"  ADD median {add['median']} ms, p90 {add['p90']} ms, max {add['max']} ms ({add['n']} pods)"
            if failed:
                yield f"  {failed} ADDs FAILED: {r['add_failures'][0]}"
        if "churn" in r:
            c = r["churn"]
            yield (
                f"  churn {c['achieved_rate']}/s for {c['seconds']} s: agent CPU {c['agent_cpu_pct']} % of a core "
                f"({c['agent_cpu_ms_per_change']} ms a change); {c['agent_cpu_ms_per_change_to_caught_up']} ms a change "
                f"until caught up, {c['caught_up_after_s']} s after the last ({'kept up' if c['kept_up'] else 'FELL BEHIND'})"
            )
        if "policy" in r:
            p = r["policy"]
            yield f"  new NetworkPolicy → applied (gauge) worst {p['worst_gauge_s']} s, in nft worst {p['worst_nft_s']} s"
        if "restart" in r:
            rs = r["restart"]
            yield f"  restart → ready {rs['ready_s']} s with {rs['attached_pods']} pods attached; RSS {rs.get('rss')} MiB"


def outside(args: argparse.Namespace, argv: list[str]) -> int:
    """Make the node namespace, run this script inside it, remove everything after."""
    if os.geteuid() != 0:
        raise SystemExit("bench/scale.py needs root (network namespaces, veths, nftables)")
    prefix = f"fl-scale-{secrets.token_hex(2)}-"
    with NetnsPool(prefix) as pool:
        node, up = pool.create("node"), pool.create("up")
        pool.veth(node, "uplink", up, "eth0")
        node.ip("addr", "add", "192.0.2.1/24", "dev", "uplink")
        cmd = ["ip", "netns", "exec", node.name, sys.executable, os.path.abspath(__file__), *argv]
        cmd += ["--inside", "--netns-prefix", prefix + "p-"]
        child = subprocess.Popen(cmd)
        # Ctrl-C reaches the child (same process group) and it cleans up; SIGTERM is passed on.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
        try:
            code = child.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
            # Whatever the child left running in our namespaces (only ours are in them), and pod namespaces.
            for ns in (node, up):
                pids = subprocess.run(["ip", "netns", "pids", ns.name], capture_output=True, text=True).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for name in os.listdir(NETNS_DIR):
                if name.startswith(prefix + "p-"):
                    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=("3k", "30k", "150k"), default="150k", help="cluster size (default 150k)")
    ap.add_argument("--pods", type=int, help="pods (default: the preset's)")
    ap.add_argument("--nodes", type=int, help="nodes (the preset's: 30 pods a node)")
    ap.add_argument("--namespaces", type=int, help="namespaces (the preset's: 75 pods a namespace)")
    ap.add_argument("--policies", type=int, help="NetworkPolicies (the preset's: one a namespace)")
    ap.add_argument("--seed", type=int, help="generator seed (default 1)")
    ap.add_argument("--small", type=int, default=3000, help="pods of the small cluster for ADD (0: none)")
    ap.add_argument("--adds", type=int, default=30, help="local pods to ADD (at most the node's)")
    ap.add_argument("--churn-seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=100.0, help="remote pod changes a second")
    ap.add_argument("--policy-rounds", type=int, default=3)
    ap.add_argument("--no-restart", dest="restart", action="store_false", help="skip restart → ready")
    ap.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for the agent to get ready")
    ap.add_argument("--load-timeout", type=float, default=1800.0, help="seconds for the API server to load")
    ap.add_argument("--bookmark-interval", type=float, default=0.2, help="the API server's (the lab's: 0.2 s)")
    ap.add_argument("--source", metavar="DIR", help="run the API server, agent and plugin from this checkout")
    ap.add_argument(
        "--policy-peers",
        choices=("pods", "groups"),
        default="pods",
        help="the agent's peers: every Pod, or flock-controller's address groups (started beside it)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    ap.add_argument("--json", action="store_true", help="print only the figures, as one JSON object")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--netns-prefix", default="fl-scale-p-", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.inside:
        sys.exit(outside(args, sys.argv[1:]))
    try:
        results = inside(args)
    except (KeyboardInterrupt, Interrupted):
        log("interrupted: cleaned up")
        sys.exit(130)
    doc = {"bench": "scale", "preset": args.preset, "source": args.source, "results": results}
    if args.json:
        print(json.dumps(doc))
    else:
        for line in summary_lines(results):
            print(line)
        print(json.dumps(doc))


if __name__ == "__main__":
    main()
