"""Executing a CNI plugin the way a container runtime (libcni) does.

The plugin runs in the node's network namespace with the ``CNI_*``
environment and, on stdin, the plugin's entry of the network configuration
list with ``name`` and ``cniVersion`` injected (and ``prevResult`` for CHECK
and DEL), exactly as libcni builds it.  Like libcni ≥ 1.2, a list with
``cniVersions`` runs at the highest of those versions the lab speaks (all of
flock's), so the lab uses CNI 1.1.0 (STATUS, GC) with the default conflist.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.lab._nsio import in_netns
from flock.rpc.cniresult import SUPPORTED_VERSIONS


@attrs.frozen
class PluginOutcome:
    status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout) if self.stdout.strip() else {}


@attrs.frozen
class CniParams:
    """The CNI parameters of one container: what the runtime passes on every call for it."""

    container_id: str
    netns: str  # path of the pod's network namespace
    if_name: str
    cni_args: str

    @classmethod
    def for_pod(
        cls, container_id: str, netns: str, namespace: str, name: str, uid: str, if_name: str = "eth0"
    ) -> CniParams:
        # What containerd's CRI plugin passes (K8S_POD_* plus IgnoreUnknown).
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uid}"
        return cls(container_id, netns, if_name, args)


def load_conflist(conf_dir: Path) -> dict[str, Any]:
    """The first network configuration list in *conf_dir* by name, as runtimes pick it."""
    for name in sorted(os.listdir(conf_dir)):
        if name.endswith(".conflist"):
            return json.loads((conf_dir / name).read_text())
    raise FileNotFoundError(f"no *.conflist in {conf_dir}")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def list_version(conflist: Mapping[str, Any]) -> str:
    """The version libcni ≥ 1.2 runs a list at: the highest of ``cniVersions``
    it speaks, else ``cniVersion``."""
    offered = [v for v in conflist.get("cniVersions") or () if v in SUPPORTED_VERSIONS]
    return max(offered, key=_version_key) if offered else conflist["cniVersion"]


def plugin_config(
    conflist: Mapping[str, Any], plugin: Mapping[str, Any], prev_result: Mapping[str, Any] | None
) -> dict[str, Any]:
    conf = {**plugin, "name": conflist["name"], "cniVersion": list_version(conflist)}
    if prev_result is not None:
        conf["prevResult"] = dict(prev_result)
    return conf


def find_plugin(cni_path: str, plugin_type: str) -> str:
    for directory in cni_path.split(":"):
        candidate = os.path.join(directory, plugin_type)
        if os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(f"CNI plugin {plugin_type!r} not found in CNI_PATH={cni_path}")


async def exec_plugin(
    node_netns: str, cni_path: str, command: str, conf: Mapping[str, Any], att: CniParams
) -> PluginOutcome:
    """One plugin invocation in *node_netns*; a failing plugin is an outcome, not an exception."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": att.container_id,
        "CNI_NETNS": att.netns,
        "CNI_IFNAME": att.if_name,
        "CNI_ARGS": att.cni_args,
        "CNI_PATH": cni_path,
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    argv = in_netns(node_netns, [find_plugin(cni_path, conf["type"])])
    proc = await trio.run_process(
        argv, stdin=json.dumps(conf).encode(), env=env, capture_stdout=True, capture_stderr=True, check=False
    )
    return PluginOutcome(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


async def exec_conflist(
    node_netns: str,
    cni_path: str,
    conflist: Mapping[str, Any],
    command: str,
    att: CniParams,
    prev_result: Mapping[str, Any] | None = None,
) -> PluginOutcome:
    """Run *command* through every plugin of the list as libcni does: ADD in order,
    each getting the previous result; CHECK in order and DEL in reverse, with
    the cached result.  Stops at the first failure, as libcni does."""
    plugins = list(conflist["plugins"])
    if command == "DEL":
        plugins.reverse()
    outcome = PluginOutcome(0, "", "")
    for plugin in plugins:
        outcome = await exec_plugin(node_netns, cni_path, command, plugin_config(conflist, plugin, prev_result), att)
        if not outcome.ok:
            return outcome
        if command == "ADD":
            prev_result = outcome.json
    return outcome
