"""Shared parts of the lab benchmarks (bench/lab_*.py): a lab of its own in a
temporary directory, pods attached without the timing of their set-up, and
percentiles.  Not a benchmark itself.

A sibling module like stats.py (the scripts run as ``python bench/x.py``, so
bench/ is on the path) using only :mod:`flock.lab`'s public API: its two
runtime drivers exist for the benchmarks alone."""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import trio
from stats import summary  # bench/stats.py

from flock.lab import CniParams, LabPlan, PluginOutcome, api_client, down, exec_conflist, load_conflist, netns_path, up
from flock.testing import PODS, pod_object


def stats_ms(samples: list[float]) -> dict[str, Any]:
    return summary(samples, scale=1000, digits=1)


@contextlib.asynccontextmanager
async def lab(nodes: int, agent_program: list[str] | None = None) -> AsyncIterator[LabPlan]:
    directory = Path(tempfile.mkdtemp(prefix="flab-b-"))  # short: unix socket paths
    plan = LabPlan.make(directory, nodes)
    try:
        await up(plan, agent_program=agent_program)
        yield plan
    finally:
        with trio.move_on_after(60, shield=True):
            await down(directory)
        shutil.rmtree(directory, ignore_errors=True)


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


class FlockRuntime:
    """Attaches pods of one lab node through the installed shim, as a runtime does."""

    name = "flock"

    def __init__(self, plan: LabPlan, node_index: int = 0) -> None:
        self.plan, self.node = plan, plan.nodes[node_index]
        self.conflist = load_conflist(self.node.cni_conf)
        self.results: dict[str, dict[str, Any]] = {}

    async def prepare(self, namespace: str, name: str, annotations: Mapping[str, str]) -> CniParams:
        """The Pod object and what the runtime would pass (untimed)."""
        obj = await api_client(self.plan).create(
            PODS, pod_object(namespace, name, self.node.name, annotations=annotations)
        )
        cid = secrets.token_hex(32)
        return CniParams.for_pod(
            cid, netns_path(f"{self.plan.pod_netns_prefix}{name}"), namespace, name, obj["metadata"]["uid"]
        )

    async def add(self, att: CniParams) -> PluginOutcome:
        out = await exec_conflist(self.node.netns, str(self.node.cni_bin), self.conflist, "ADD", att)
        if out.ok:
            self.results[att.container_id] = out.json
        return out

    async def delete(self, att: CniParams) -> PluginOutcome:
        return await exec_conflist(
            self.node.netns, str(self.node.cni_bin), self.conflist, "DEL", att, self.results.pop(att.container_id, None)
        )


class PtpRuntime:
    """Debian's ptp + host-local on the same node namespace, exec'd the same way."""

    name = "ptp+host-local"

    def __init__(self, plan: LabPlan, data_dir: Path, dual: bool, node_index: int = 0) -> None:
        self.plan, self.node = plan, plan.nodes[node_index]
        ranges = [[{"subnet": "203.0.113.0/24"}]] + ([[{"subnet": "2001:db8:beef::/64"}]] if dual else [])
        self.conflist = {
            "cniVersion": "1.0.0",
            "name": "ptp-bench",
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": False,
                    "ipam": {"type": "host-local", "ranges": ranges, "dataDir": str(data_dir)},
                }
            ],
        }
        self.results: dict[str, dict[str, Any]] = {}

    async def prepare(self, namespace: str, name: str, annotations: Mapping[str, str]) -> CniParams:
        cid = secrets.token_hex(32)
        return CniParams.for_pod(
            cid, netns_path(f"{self.plan.pod_netns_prefix}{name}"), namespace, name, "uid-" + cid[:8]
        )

    async def add(self, att: CniParams) -> PluginOutcome:
        out = await exec_conflist(self.node.netns, "/usr/lib/cni", self.conflist, "ADD", att)
        if out.ok:
            self.results[att.container_id] = out.json
        return out

    async def delete(self, att: CniParams) -> PluginOutcome:
        return await exec_conflist(
            self.node.netns, "/usr/lib/cni", self.conflist, "DEL", att, self.results.pop(att.container_id, None)
        )


class FloorRuntime:
    """What any CNI plugin run by the host's ``python3 -IS`` costs at least:
    a plugin that is that interpreter doing nothing (it reads its stdin and
    prints an empty result), exec'd the same way.  No agent, no kernel work:
    the floor under flock's shim on this machine and in this harness."""

    name = "python3 -IS floor"
    PLUGIN = (
        '#!/usr/bin/python3 -IS\nimport sys\nsys.stdin.buffer.read()\nsys.stdout.write(\'{"cniVersion": "1.0.0"}\')\n'
    )

    def __init__(self, plan: LabPlan, bin_dir: Path, node_index: int = 0) -> None:
        self.plan, self.node, self.bin_dir = plan, plan.nodes[node_index], bin_dir
        plugin = bin_dir / "pyfloor"
        plugin.write_text(self.PLUGIN)
        plugin.chmod(0o755)
        self.conflist = {"cniVersion": "1.0.0", "name": "floor", "plugins": [{"type": "pyfloor"}]}

    async def prepare(self, namespace: str, name: str, annotations: Mapping[str, str]) -> CniParams:
        cid = secrets.token_hex(32)
        return CniParams.for_pod(
            cid, netns_path(f"{self.plan.pod_netns_prefix}{name}"), namespace, name, "uid-" + cid[:8]
        )

    async def add(self, att: CniParams) -> PluginOutcome:
        return await exec_conflist(self.node.netns, str(self.bin_dir), self.conflist, "ADD", att)

    async def delete(self, att: CniParams) -> PluginOutcome:
        return await exec_conflist(self.node.netns, str(self.bin_dir), self.conflist, "DEL", att)


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, separators=(",", ":")), flush=True)
