"""Shared parts of the lab benchmarks (bench/lab_*.py): a lab of its own in a
temporary directory, pods attached without the timing of their set-up, and
percentiles.  Not a benchmark itself.

A sibling module like stats.py (the scripts run as ``python bench/x.py``, so
bench/ is on the path) using only :mod:`flock.lab`'s public API: its two
runtime drivers exist for the benchmarks alone."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import trio

from flock.apiserver import PODS, pod_object
from flock.lab import (
    CniParams,
    LabPlan,
    PluginOutcome,
    api_client,
    exec_conflist,
    load_conflist,
    load_procs,
    netns_path,
)
from flock.testing.benchkit import lab, stats_ms  # noqa: F401  (the lab benches import them from here)

CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller
# kubelet's cgroup v1 layout, with deploy/daemonset.yaml's CPU request for flock-agent:
# kubepods gets the node's allocatable CPUs as shares (2 here), a pod its requests (50m → 51);
# the container runtime, which execs the CNI plugins, runs in system.slice (the default 1024).
KUBEPODS_SHARES = 2048
AGENT_POD_SHARES = 51
SYSTEM_SLICE_SHARES = 1024


@contextlib.contextmanager
def kubelet_cgroups(plan: LabPlan) -> Iterator[None]:
    """Place the lab as a kubelet-run node has it, for CPU: every lab process
    (the keeper and what it runs: flock-agent, bird, the API server) in a pod
    cgroup under "kubepods", and this process (the runtime: it execs the
    plugins) in "system.slice".  Flat (the default), the agent is one task
    among the 50 plugin interpreters of a burst; under a kubelet its pod's
    cgroup gets its share whatever the number of plugin processes.  cgroup v1
    only (what this machine has); undone on exit."""
    if not (CPU_CGROUP / "cpu.shares").exists():
        raise RuntimeError(f"--kubelet-cgroups needs cgroup v1's cpu controller at {CPU_CGROUP}")
    top = CPU_CGROUP / f"flock-bench-{os.getpid()}"
    pod, system = top / "kubepods" / "flock-agent", top / "system.slice"
    made = [top, top / "kubepods", pod, system]
    for group, shares in zip(made, (1024, KUBEPODS_SHARES, AGENT_POD_SHARES, SYSTEM_SLICE_SHARES), strict=True):
        group.mkdir()
        (group / "cpu.shares").write_text(str(shares))
    try:
        procs = load_procs(plan.dir)
        pids = [procs["keeper"]["pid"], *(p["pid"] for p in procs.get("processes", {}).values())]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # one that just exited
                (pod / "cgroup.procs").write_text(str(pid))
        (system / "cgroup.procs").write_text(str(os.getpid()))
        yield
    finally:
        for group in reversed(made):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    (CPU_CGROUP / "cgroup.procs").write_text(pid)
            group.rmdir()


async def ip(*args: str) -> None:
    await trio.run_process(["ip", *args], capture_stdout=True, capture_stderr=True)


@contextlib.asynccontextmanager
async def pod_netns(name: str) -> AsyncIterator[str]:
    await ip("netns", "add", name)
    try:
        yield netns_path(name)
    finally:
        await ip("netns", "del", name)


async def timed(coro_fn, *args) -> tuple[PluginOutcome, float]:
    t0 = time.perf_counter()
    outcome = await coro_fn(*args)
    return outcome, time.perf_counter() - t0


class _Runtime:
    """Execs the plugins of *conflist* from *cni_path* in the node's namespace
    as a runtime does (DEL gets the cached result); pods without a Pod object."""

    name = ""
    tag = ""  # prefix of its pods' names: runtimes of one run never share a namespace name

    def __init__(self, plan: LabPlan, cni_path: str, conflist: Mapping[str, Any], node_index: int = 0) -> None:
        self.plan, self.node = plan, plan.nodes[node_index]
        self.cni_path, self.conflist = cni_path, conflist
        self.results: dict[str, dict[str, Any]] = {}

    async def prepare(self, namespace: str, name: str, annotations: Mapping[str, str]) -> CniParams:
        """What the runtime would pass (untimed)."""
        cid = secrets.token_hex(32)
        return CniParams.for_pod(
            cid, netns_path(f"{self.plan.pod_netns_prefix}{name}"), namespace, name, "uid-" + cid[:8]
        )

    async def add(self, att: CniParams) -> PluginOutcome:
        out = await exec_conflist(self.node.netns, self.cni_path, self.conflist, "ADD", att)
        if out.ok:
            self.results[att.container_id] = out.json
        return out

    async def delete(self, att: CniParams) -> PluginOutcome:
        return await exec_conflist(
            self.node.netns, self.cni_path, self.conflist, "DEL", att, self.results.pop(att.container_id, None)
        )


class FlockRuntime(_Runtime):
    """Attaches pods of one lab node through the installed shim, as a runtime does."""

    name, tag = "flock", "f"

    def __init__(self, plan: LabPlan, node_index: int = 0) -> None:
        node = plan.nodes[node_index]
        super().__init__(plan, str(node.cni_bin), load_conflist(node.cni_conf), node_index)

    async def prepare(self, namespace: str, name: str, annotations: Mapping[str, str]) -> CniParams:
        """The Pod object and what the runtime would pass (untimed)."""
        obj = await api_client(self.plan).create(
            PODS, pod_object(namespace, name, self.node.name, annotations=annotations)
        )
        cid = secrets.token_hex(32)
        return CniParams.for_pod(
            cid, netns_path(f"{self.plan.pod_netns_prefix}{name}"), namespace, name, obj["metadata"]["uid"]
        )


class PtpRuntime(_Runtime):
    """Debian's ptp + host-local on the same node namespace, exec'd the same way."""

    name, tag = "ptp+host-local", "p"

    def __init__(self, plan: LabPlan, data_dir: Path, dual: bool, node_index: int = 0) -> None:
        ranges = [[{"subnet": "203.0.113.0/24"}]] + ([[{"subnet": "2001:db8:beef::/64"}]] if dual else [])
        ipam = {"type": "host-local", "ranges": ranges, "dataDir": str(data_dir)}
        conflist = {
            "cniVersion": "1.0.0",
            "name": "ptp-bench",
            "plugins": [{"type": "ptp", "ipMasq": False, "ipam": ipam}],
        }
        super().__init__(plan, "/usr/lib/cni", conflist, node_index)


class FloorRuntime(_Runtime):
    """What any CNI plugin run by the host's ``python3 -IS`` costs at least:
    a plugin that is that interpreter doing nothing (it reads its stdin and
    prints an empty result), exec'd the same way.  No agent, no kernel work:
    the floor under flock's shim on this machine and in this harness."""

    name, tag = "python3 -IS floor", "z"
    PLUGIN = (
        '#!/usr/bin/python3 -IS\nimport sys\nsys.stdin.buffer.read()\nsys.stdout.write(\'{"cniVersion": "1.0.0"}\')\n'
    )

    def __init__(self, plan: LabPlan, bin_dir: Path, node_index: int = 0) -> None:
        plugin = bin_dir / "pyfloor"
        plugin.write_text(self.PLUGIN)
        plugin.chmod(0o755)
        conflist = {"cniVersion": "1.0.0", "name": "floor", "plugins": [{"type": "pyfloor"}]}
        super().__init__(plan, str(bin_dir), conflist, node_index)


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, separators=(",", ":")), flush=True)
