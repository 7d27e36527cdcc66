"""A pod's whole CNI ADD and DEL as the runtime sees them: the bundled ``flock``
plugin → flock-agent (pod lookup, IPAM, SQLite pending/commit, netlink)
versus Debian's ``ptp`` + ``host-local``, in one run.  The plugin is built
as flock-install-cni installs it: the host's ``/usr/bin/python3 -IS``.

Everything happens inside a "node" network namespace this script creates (it
re-executes itself there), with one fresh namespace per pod.  flock-agent runs
as a real process against the flock/testing API server (no BIRD).  For each
parallelism N, every round creates N pod namespaces, ADDs all N concurrently
(one plugin exec each), then DELs all N; each exec's wall time is one sample.
The agent's own time per request (from its /metrics), its CPU time per pod
(ADD + DEL, from /proc; all threads, and its main Trio thread alone) and its
resident memory when idle are reported beside it.  Run it from outside the
checkout (``cd /tmp``): with ``--before``, ``python -c`` would otherwise import
the flock of the current directory.

``--before DIR`` also runs the flock-agent of another checkout of flock (e.g.
``git archive <old commit> | tar -x -C DIR``) side by side, on its own node
and pod block, with the same plugin; the implementations take turns round by
round, so load from elsewhere on the machine hits them alike.

Prints a human summary, then the figures as a final JSON line.

    python bench/pods.py [--parallel 1,10] [--rounds 20,5] [--before DIR] [--no-baseline]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from stats import parallel_rounds, rerun_in_node_namespace, summary  # bench/stats.py

from flock.apiserver import NETWORKPOLICIES, NODECONFIGS, PODS, ApiServer, nodeconfig_object, pod_object
from flock.shim_bundle import build_shim
from flock.testing.netns import netns_pool

PLUGIN_DIR = "/usr/lib/cni"
BIN = Path(sys.executable).parent
PTP_NET = "2001:db8:3::/64"


def run(argv: list[str], command: str, cid: str, netns: str, config: dict, args: str = "") -> float:
    env = {
        "PATH": "/usr/bin:/bin",
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": PLUGIN_DIR,
        "CNI_ARGS": args,
    }
    t0 = time.perf_counter()
    proc = subprocess.run(argv, input=json.dumps(config).encode(), env=env, capture_output=True)
    elapsed = (time.perf_counter() - t0) * 1000
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} {command} {cid}: exit {proc.returncode}: {proc.stdout.decode()[:300]}")
    return elapsed


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """utime + stime of *pid* (all its threads, living and gone) from /proc; of one of its
    threads with *thread* (the main thread: *pid* itself)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Flock:
    """One flock-agent process (from *source*: a checkout, None = this one) and the plugin."""

    def __init__(self, name: str, node: str, cidr6: str, source: str | None, plugin: list[str], work: Path) -> None:
        self.name, self.node, self.cidr6, self.source, self.plugin = name, node, cidr6, source, plugin
        self.work = work / f"agent-{name}"
        self.socket = self.work / "run" / "flock.sock"
        self.agent: subprocess.Popen | None = None
        self.port = 0

    def agent_argv(self) -> tuple[list[str], dict[str, str] | None]:
        """The agent's command line and environment (None: this one's)."""
        if self.source is None:
            return [str(BIN / "flock-agent")], None
        # PYTHONPATH comes before the venv's editable install of this checkout.
        env = {**os.environ, "PYTHONPATH": os.path.abspath(self.source)}
        check = subprocess.run(
            [sys.executable, "-c", "import flock; print(flock.__file__)"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.strip()
        if not check.startswith(os.path.abspath(self.source)):
            raise RuntimeError(f"--before {self.source}: imported flock from {check}")
        return [sys.executable, "-c", "import sys; from flock.agent import main; sys.exit(main())"], env

    def start(self, api: ApiServer, kubeconfig: Path) -> None:
        self.work.mkdir(parents=True)
        api.create(NODECONFIGS, nodeconfig_object(self.node, self.cidr6))
        self.log_path = self.work / "agent.log"
        argv, env = self.agent_argv()
        # The agent holds its own copy of the log's descriptor.
        with open(self.log_path, "wb") as log:
            self.agent = subprocess.Popen(
                [
                    *argv,
                    "--node",
                    self.node,
                    "--socket",
                    str(self.socket),
                    "--state-dir",
                    str(self.work / "state"),
                    "--kubeconfig",
                    str(kubeconfig),
                    "--health-address",
                    "127.0.0.1:0",
                    "--no-bird",
                    "--uplink",
                    "uplink",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def ready(self) -> None:
        self.port = wait_ready(self.agent, self.log_path)
        self.rss_idle_mib = rss_mib(self.agent.pid)
        self.mark = self.totals()

    def totals(self) -> tuple[dict, float, float]:
        """The agent's /metrics totals, its CPU seconds, and those of its main (Trio) thread."""
        pid = self.agent.pid
        return agent_totals(self.port), cpu_seconds(pid), cpu_seconds(pid, pid)

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.terminate()
            self.agent.wait(timeout=10)

    def op(self, command: str, cid: str, netns: str) -> float:
        config = {"cniVersion": "1.1.0", "name": "flock-net", "type": "flock", "socket": str(self.socket)}
        return run(self.plugin, command, cid, netns, config, f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME={cid}")

    def phase(self, pods: int) -> dict:
        """The agent's own mean time per ADD and DEL, and its CPU per pod,
        since the last call (or since ready)."""
        (before, cpu_before, main_before), now = self.mark, self.totals()
        self.mark = now
        out = {}
        for op in ("ADD", "DEL"):
            seconds, count = now[0][op][0] - before[op][0], now[0][op][1] - before[op][1]
            out[f"agent_{op.lower()}_mean_ms"] = round(seconds / count * 1000, 2)
        out["agent_cpu_ms_per_pod"] = round((now[1] - cpu_before) / pods * 1000, 2)
        # The Trio thread (RPC, handler, watchers, policy); the rest is the worker threads (netlink, SQLite, nft).
        out["agent_main_thread_cpu_ms_per_pod"] = round((now[2] - main_before) / pods * 1000, 2)
        for op in ("ADD", "DEL"):
            stages = {}
            for key, (seconds, count) in now[0].items():
                if key.startswith(op + ":"):
                    old_seconds, old_count = before.get(key, (0.0, 0.0))
                    if count > old_count:
                        stages[key.split(":", 1)[1]] = round((seconds - old_seconds) / (count - old_count) * 1000, 3)
            out[f"agent_{op.lower()}_stages_mean_ms"] = stages
        return out

    def rss(self) -> dict:
        return {"at_start": self.rss_idle_mib, "after": rss_mib(self.agent.pid)}


class Ptp:
    name = "ptp"
    node = "ptp"

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir

    def op(self, command: str, cid: str, netns: str) -> float:
        config = {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "ptp",
            "ipMasq": False,
            "ipam": {"type": "host-local", "dataDir": self.data_dir, "ranges": [[{"subnet": PTP_NET}]]},
        }
        return run([f"{PLUGIN_DIR}/ptp"], command, cid, netns, config)


def one_round(impl, pool, api: ApiServer, threads, n: int, seq: list[int], samples: dict) -> None:
    pods = []
    for _ in range(n):
        seq[0] += 1
        cid = f"{impl.name}-{seq[0]}"
        api.create(PODS, pod_object("bench", cid, impl.node))
        pods.append((cid, pool.create("pod")))
    samples["add"] += threads.map(lambda p: impl.op("ADD", p[0], p[1].path), pods)
    samples["del"] += threads.map(lambda p: impl.op("DEL", p[0], p[1].path), pods)
    for _cid, ns in pods:
        pool.delete(ns)


def measure(impls: list, pool, api: ApiServer, n: int, rounds: int, seq: list[int]) -> dict:
    """Each implementation runs one round in turn, *rounds* times."""
    samples = {impl.name: {"add": [], "del": []} for impl in impls}
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as threads:
        for _ in range(rounds):
            for impl in impls:
                one_round(impl, pool, api, threads, n, seq, samples[impl.name])
    return {name: {"add_ms": summary(s["add"]), "del_ms": summary(s["del"])} for name, s in samples.items()}


def agent_totals(port: int) -> dict[str, tuple[float, float]]:
    """op → (seconds, requests) the agent's /metrics has counted so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out = {}
    for op in ("ADD", "DEL"):
        total = re.search(rf'flock_cni_request_duration_seconds_sum{{op="{op}"}} (\S+)', text)
        count = re.search(rf'flock_cni_request_duration_seconds_count{{op="{op}"}} (\S+)', text)
        out[op] = (float(total.group(1)), float(count.group(1))) if total and count else (0.0, 0.0)
    # Per stage (flock_cni_stage_duration_seconds): "ADD:netlink" → (seconds, occurrences).
    stage_line = r'flock_cni_stage_duration_seconds_(sum|count){{op="(\w+)",stage="(\w+)"}} (\S+)'
    for kind, op, stage, value in re.findall(stage_line.format(), text):
        seconds, count = out.get(f"{op}:{stage}", (0.0, 0.0))
        out[f"{op}:{stage}"] = (float(value), count) if kind == "sum" else (seconds, float(value))
    return out


def wait_ready(agent: subprocess.Popen, log: Path) -> int:
    """The agent's health port once /readyz answers 200."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and agent.poll() is None:
        ports = [
            int(json.loads(line)["address"].rsplit(":", 1)[1])
            for line in log.read_text().splitlines()
            if '"health server listening"' in line
        ]
        if ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/readyz", timeout=5):
                    return ports[-1]
            except OSError:  # 503 (HTTPError) or not listening yet
                pass
        time.sleep(0.1)
    raise RuntimeError("flock-agent did not become ready:\n" + log.read_text()[-2000:])


# --policy: every bench pod is selected by a NetworkPolicy, so each ADD waits for its chains and set memberships.
BENCH_POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"namespace": "bench", "name": "bench-ingress"},
    "spec": {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}], "ports": [{"port": 80}]}]},
}


def inside(
    parallel: list[int], rounds: list[int], before: str | None, policy: bool = False, baseline: bool = True
) -> dict:
    results: dict = {}
    seq = [0]
    with (
        tempfile.TemporaryDirectory(prefix="fl-bench-pods-") as tmp,
        netns_pool("fl-bench-") as pool,
        ApiServer() as api,
    ):
        work = Path(tmp)
        api.write_kubeconfig(work / "kubeconfig")
        plugin = [str(work / "flock")]
        build_shim(work / "flock", python="/usr/bin/python3 -IS")  # as flock-install-cni writes it
        flocks = [Flock("flock", "bench", "2001:db8:1::/64", None, plugin, work)]
        if before is not None:
            flocks.append(Flock("flock-before", "bench-before", "2001:db8:2::/64", before, plugin, work))
        try:
            for f in flocks:
                f.start(api, work / "kubeconfig")
            for f in flocks:
                f.ready()
            if policy:
                api.create(NETWORKPOLICIES, BENCH_POLICY)
                time.sleep(1)  # the agents apply it (nothing to enforce yet: no bench pod exists)
            impls = [*flocks, Ptp(str(work / "host-local"))] if baseline else [*flocks]
            for n, r in zip(parallel, rounds, strict=True):
                figures = measure(impls, pool, api, n, r, seq)
                for f in flocks:
                    figures[f.name].update(f.phase(n * r))
                for impl in impls:
                    fig = figures[impl.name]
                    results.setdefault(impl.name, {})[f"N={n}"] = fig
                    print(
                        f"{impl.name:12} N={n:<3} ADD median {fig['add_ms']['median']:8.2f} ms  p99 {fig['add_ms']['p99']:8.2f} ms | "
                        f"DEL median {fig['del_ms']['median']:7.2f} ms  p99 {fig['del_ms']['p99']:7.2f} ms  ({fig['add_ms']['n']} pods)",
                        flush=True,
                    )
                    if "agent_cpu_ms_per_pod" in fig:
                        print(
                            f"{'':12} agent's own time per request (mean): ADD {fig['agent_add_mean_ms']} ms, DEL "
                            f"{fig['agent_del_mean_ms']} ms; agent CPU {fig['agent_cpu_ms_per_pod']} ms per pod (ADD + DEL), "
                            f"of which the main (Trio) thread {fig['agent_main_thread_cpu_ms_per_pod']} ms",
                            flush=True,
                        )
                        for op in ("add", "del"):
                            stages = fig.get(f"agent_{op}_stages_mean_ms") or {}
                            print(
                                f"{'':12} {op.upper()} stages (mean ms): "
                                + ", ".join(f"{k} {v}" for k, v in stages.items()),
                                flush=True,
                            )
            for f in flocks:
                results[f.name]["agent_rss_idle_mib"] = rss = f.rss()
                print(
                    f"{f.name}-agent RSS when idle: {rss['at_start']} MiB at start, {rss['after']} MiB after the run",
                    flush=True,
                )
        finally:
            for f in flocks:
                f.stop()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="1,10", help="comma-separated pod counts ADDed concurrently")
    ap.add_argument("--rounds", default="20,5", help="rounds per parallelism, same order")
    ap.add_argument(
        "--before", metavar="DIR", help="also run the flock-agent of the flock checkout in DIR, side by side"
    )
    ap.add_argument("--policy", action="store_true", help="a NetworkPolicy selects every bench pod")
    ap.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="flock only, no ptp (its rounds leave the agents idle, and their idle CPU lands in the per-pod figure)",
    )
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    parallel, rounds = parallel_rounds(ap, args)
    if args.inside:
        results = inside(parallel, rounds, args.before, args.policy, args.baseline)
        print(
            json.dumps(
                {
                    "bench": "pods",
                    "parallel": parallel,
                    "rounds": rounds,
                    "before": args.before,
                    "policy": args.policy,
                    "results": results,
                }
            )
        )
        return
    extra = ["--parallel", args.parallel, "--rounds", args.rounds]
    if args.before:
        extra += ["--before", os.path.abspath(args.before)]
    if args.policy:
        extra.append("--policy")
    if not args.baseline:
        extra.append("--no-baseline")
    returncode = rerun_in_node_namespace(__file__, extra)
    sys.exit(returncode)


if __name__ == "__main__":
    main()
